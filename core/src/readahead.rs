//! Whole-load readahead: the I/O plan of a call that reads every tensor it
//! names (`load_file`, `convert`).
//!
//! A cold load is only as fast as the disk when the disk sees long reads in
//! file order with several in flight. A reader that takes tensors in name
//! order (or dict order, or whatever order the caller touches mapped views
//! in) jumps around the file, and each jump costs a synchronous read around
//! the fault. So before the tensors are handed out, the stored ranges they
//! cover are sorted by file and offset, merged across small gaps, and read
//! into the page cache in that order (`Store::populate`: faults taken in
//! order through the mapping, or `pread`s), which the kernel's readahead
//! turns into large reads ahead of the reader, as for `cat`. Later accesses,
//! in any order, find their pages cached.
//!
//! Measured (harness/cold_bench.py, 512 MiB, interleaved): `MADV_WILLNEED`
//! over the same ranges was slower than no advice at all (the kernel caps
//! one call at a readahead window and reads it in small pages, where the
//! fault path reads large folios); `MADV_SEQUENTIAL` before populating, and
//! `pread` into a scratch buffer, were slower than populating too.
//!
//! Bounded by memory: at most half of `MemAvailable` is asked for, so a
//! model larger than memory is not read twice (the tail beyond the budget
//! faults in as it is touched). Remote stores are left alone (their batch
//! planning lives in `zt-remote`), as are decoded payloads whose extents
//! only their decoder knows.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::Payload;
use crate::error::Result;
use crate::source::{store_key, Source};
use crate::store::Store;

/// Ranges closer than this are read as one (the gap is a few headers, or a
/// small tensor the load skips: cheaper to read than to split the request).
const MERGE_GAP: u64 = 256 << 10;

/// Each populate call covers at most this much, so the memory budget is
/// checked as the load goes.
const WINDOW: u64 = 64 << 20;

/// One store and the `[start, end)` ranges a load reads from it.
type StoreRanges = (Arc<Store>, Vec<(u64, u64)>);

/// The stored ranges of `objects`, per store, sorted and merged.
fn plan(source: &Source, objects: &[usize]) -> Vec<StoreRanges> {
    let mut by_store: BTreeMap<usize, StoreRanges> = BTreeMap::new();
    for &i in objects {
        let Some(object) = source.tensor_at(i).map(|t| t.object()) else {
            continue;
        };
        for part in &object.parts {
            if let Payload::Stored { store, offset, len } = &part.payload {
                if *len == 0 || store.is_remote() {
                    continue;
                }
                by_store
                    .entry(store_key(store))
                    .or_insert_with(|| (store.clone(), Vec::new()))
                    .1
                    .push((*offset, offset + len));
            }
        }
    }
    let mut stores: Vec<_> = by_store.into_values().collect();
    // Files in a stable order (the first shard first), not by address.
    stores.sort_by(|a, b| a.0.path().cmp(b.0.path()));
    for (_, ranges) in &mut stores {
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
        for &(s, e) in ranges.iter() {
            match merged.last_mut() {
                Some(last) if s <= last.1.saturating_add(MERGE_GAP) => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        *ranges = merged;
    }
    stores
}

/// `MemAvailable` from `/proc/meminfo`, in bytes (None where unreadable).
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl Source {
    /// Read the stored bytes of the objects at `objects` (indexes, as
    /// [`Source::position`] gives) into the page cache in file order, up to
    /// half of the memory available. Returns the bytes read ahead. Costs a
    /// walk of the page tables when the bytes are already cached; never
    /// changes what a read returns.
    pub fn read_ahead(&self, objects: &[usize]) -> Result<u64> {
        let budget = available_memory().map_or(u64::MAX, |m| m / 2);
        self.read_ahead_within(objects, budget)
    }

    /// [`Source::read_ahead`] of every object.
    pub fn read_ahead_all(&self) -> Result<u64> {
        let all: Vec<usize> = (0..self.objects.len()).collect();
        self.read_ahead(&all)
    }

    pub(crate) fn read_ahead_within(&self, objects: &[usize], budget: u64) -> Result<u64> {
        let mut asked = 0u64;
        for (store, ranges) in plan(self, objects) {
            for (start, end) in ranges {
                let mut at = start;
                while at < end {
                    let len = (end - at).min(WINDOW).min(budget - asked);
                    if len == 0 {
                        return Ok(asked);
                    }
                    store.populate(at, len)?;
                    asked += len;
                    at += len;
                }
            }
        }
        Ok(asked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn source(ranges: &[(u64, u64)], file_len: usize) -> (tempfile::NamedTempFile, Source) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; file_len]).unwrap();
        f.flush().unwrap();
        let store = Arc::new(Store::open(f.path()).unwrap());
        let src = Source::of_ranges(store, ranges);
        (f, src)
    }

    #[test]
    fn plan_sorts_by_offset_and_merges_small_gaps() {
        // Listed out of file order; t1 and t0 are 100 bytes apart, t2 is far.
        let (_f, src) = source(&[(1000, 100), (800, 100), (2 << 20, 10)], 3 << 20);
        let all = plan(&src, &[0, 1, 2]);
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].1, vec![(800, 1100), (2 << 20, (2 << 20) + 10)]);
        // Only the objects asked for.
        assert_eq!(plan(&src, &[2])[0].1, vec![(2 << 20, (2 << 20) + 10)]);
    }

    #[test]
    fn read_ahead_stops_at_the_budget_and_reads_nothing_wrong() {
        let (_f, src) = source(&[(0, 1 << 20), (2 << 20, 1 << 20)], 3 << 20);
        assert_eq!(src.read_ahead_within(&[0, 1], 1 << 19).unwrap(), 1 << 19);
        // The 1 MiB gap is past MERGE_GAP: two ranges, 2 MiB asked.
        assert_eq!(src.read_ahead_all().unwrap(), 2 << 20);
        let t = src.tensor("t1").unwrap();
        assert!(t.data().unwrap().bytes().unwrap().iter().all(|&b| b == 7));
    }
}
