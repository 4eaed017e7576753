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
//! Two things stand between that and the device's speed, both found by
//! timing the phases of a cold and a warm load: the single pages a zip's
//! structure walk read from each member's local header stay cached, and
//! the kernel's readahead stops at each one and restarts with small pages
//! (a torch checkpoint read measurably slower with them than after
//! dropping them); and an npz member's CRC-32 is a pass over every byte
//! that ran after the reads. So the stray pages inside the ranges are
//! dropped first, and each object's check runs on another thread as soon
//! as its bytes are in (`python -m harness --only cold` compares with
//! `cat`).
//!
//! Bounded by memory: at most half of `MemAvailable` is asked for, so a
//! model larger than memory is not read twice (the tail beyond the budget
//! faults in as it is touched). Remote stores are left alone (their batch
//! planning lives in `zt-remote`), as are decoded payloads whose extents
//! only their decoder knows.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::catalog::Payload;
use crate::crc_many::crc32_each;
use crate::error::Result;
use crate::source::{store_key, LazyCheck, Source};
use crate::store::{PrivateMap, PrivateMaps, Store};

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

/// The most a read-ahead reads: half of the memory available (the kernel
/// makes `/proc/meminfo` afresh for every read of it, so a load asks only
/// once it has something to read), unless `given`.
fn budget_or_half_available(given: Option<u64>) -> u64 {
    given.unwrap_or_else(|| available_memory().map_or(u64::MAX, |m| m / 2))
}

impl Source {
    /// Read the stored bytes of the objects at `objects` (indexes, as
    /// [`Source::position`] gives) into the page cache in file order, up to
    /// half of the memory available. Returns the bytes read ahead. Costs a
    /// walk of the page tables when the bytes are already cached; never
    /// changes what a read returns.
    pub fn read_ahead(&self, objects: &[usize]) -> Result<u64> {
        self.read_ahead_within(objects, None, None)
    }

    /// [`Source::read_ahead`] for views of private mappings (a writable
    /// load): each mapped store's pages are faulted in through its mapping
    /// in `maps` (made here when missing), the one the arrays will view,
    /// not through the store's shared one, so no page is faulted twice.
    pub fn read_ahead_into(&self, objects: &[usize], maps: &PrivateMaps) -> Result<u64> {
        self.read_ahead_within(objects, None, Some(maps))
    }

    /// [`Source::read_ahead`] of every object.
    pub fn read_ahead_all(&self) -> Result<u64> {
        let all: Vec<usize> = (0..self.objects.len()).collect();
        self.read_ahead(&all)
    }

    /// The read-ahead of `objects` up to `budget` bytes (`None`: half of
    /// the memory available).
    pub(crate) fn read_ahead_within(
        &self,
        objects: &[usize],
        budget: Option<u64>,
        maps: Option<&PrivateMaps>,
    ) -> Result<u64> {
        let stores = plan(self, objects);
        let mut via = Vec::with_capacity(stores.len());
        for (store, _) in &stores {
            via.push(match maps {
                Some(maps) => maps.of(store)?,
                None => None,
            });
        }
        let checks = self.checks_in_file_order(&stores, objects);
        // A warm load reads nothing, so the checks of everything within the
        // budget run now, together. Without a budget given there is none to
        // keep to (nothing is read), so no memory is asked about.
        if let Some((asked, reached)) = all_cached(&stores, budget.unwrap_or(u64::MAX)) {
            let batch: Vec<_> = checks
                .iter()
                .take_while(|(key, _)| *key <= reached)
                .map(|((at, _), c)| (*at, Arc::clone(c)))
                .collect();
            run_checks(&stores, &via, &batch);
            return Ok(asked);
        }
        let budget = budget_or_half_available(budget);
        if checks.is_empty() {
            return read_in(&stores, &via, budget, |_, _| {});
        }
        // The objects' checks (an npz member's CRC-32) run on another
        // thread as soon as the member's bytes are in, while the disk reads
        // the next window: a load then ends with the last member's check,
        // not a pass over every byte after the reads. Whatever has arrived
        // by the time the checking thread looks is checked together, on
        // every core (a warm load's members all arrive at once).
        let (stores_checked, via_checked) = (&stores, &via);
        std::thread::scope(|scope| {
            let (ready, arrived) = std::sync::mpsc::channel::<(usize, Arc<LazyCheck>)>();
            scope.spawn(move || {
                while let Ok(first) = arrived.recv() {
                    let batch: Vec<_> = std::iter::once(first).chain(arrived.try_iter()).collect();
                    run_checks(stores_checked, via_checked, &batch);
                }
            });
            let mut next = 0;
            read_in(&stores, &via, budget, |store, upto| {
                while let Some((key, check)) = checks.get(next) {
                    if *key > (store, upto) {
                        break;
                    }
                    let _ = ready.send((key.0, Arc::clone(check)));
                    next += 1;
                }
            })
            // `ready` drops here, so the checking thread ends once it has
            // run what it was sent; the scope waits for it.
        })
    }

    /// The lazy checks of `objects` whose bytes all lie in `stores` (the
    /// plan), each keyed by where its object's bytes end: (the index of
    /// its last store in the plan, the end offset there), sorted.
    fn checks_in_file_order(
        &self,
        stores: &[StoreRanges],
        objects: &[usize],
    ) -> Vec<((usize, u64), Arc<LazyCheck>)> {
        if self.checks.is_empty() {
            return Vec::new();
        }
        let mut keyed = Vec::new();
        for &i in objects {
            let Some(tensor) = self.tensor_at(i) else {
                continue;
            };
            let Some(check) = self.checks.get(&self.slot(i)) else {
                continue;
            };
            let mut last = None;
            for part in &tensor.object().parts {
                let Payload::Stored { store, offset, len } = &part.payload else {
                    last = None;
                    break;
                };
                let Some(at) = stores.iter().position(|(s, _)| Arc::ptr_eq(s, store)) else {
                    last = None;
                    break;
                };
                last = last.max(Some((at, offset + len)));
            }
            if let Some(key) = last {
                keyed.push((key, Arc::clone(check)));
            }
        }
        keyed.sort_by_key(|(key, _)| *key);
        keyed
    }
}

/// If every window [`read_in`] would read within `budget` looks cached
/// already ([`Store::looks_cached`]), so that it has nothing to read: the
/// bytes it would ask for, and how far it would get (the index of the
/// store in the plan, the offset there), as `arrived` would last say.
fn all_cached(stores: &[StoreRanges], budget: u64) -> Option<(u64, (usize, u64))> {
    let mut asked = 0u64;
    let mut reached = (0, 0);
    for (at_store, (store, ranges)) in stores.iter().enumerate() {
        for &(start, end) in ranges {
            let mut at = start;
            while at < end && asked < budget {
                let len = (end - at).min(WINDOW).min(budget - asked);
                if !store.looks_cached(at, len) {
                    return None;
                }
                asked += len;
                at += len;
                reached = (at_store, at);
            }
        }
    }
    Some((asked, reached))
}

/// Run the checks of `batch` (each with its store's index in the plan
/// `stores`): the CRC-32s of mapped bytes all at once
/// ([`crc32_each`]), each read through the store's private mapping in
/// `via` when it has one (so a writable load's views find its pages
/// already faulted in), else through the store's shared one; any other
/// check, and any CRC that does not match, by running the check itself,
/// whose outcome stands (the read that follows reports a failure, with the
/// tensor's name).
fn run_checks(
    stores: &[StoreRanges],
    via: &[Option<Arc<PrivateMap>>],
    batch: &[(usize, Arc<LazyCheck>)],
) {
    if batch.is_empty() {
        return;
    }
    let mut hashed = Vec::new();
    let mut ranges = Vec::new();
    for (at, check) in batch {
        let store = &stores[*at].0;
        let Some(range) = check.pending_crc32() else {
            continue;
        };
        let bytes = match via.get(*at).and_then(Option::as_deref) {
            Some(map) => map.unviewed(range.offset, range.len),
            None if store.is_mapped() => store.slice(range.offset, range.len).ok(),
            None => None,
        };
        if let Some(bytes) = bytes {
            hashed.push((check, range.crc));
            ranges.push(bytes);
        }
    }
    for ((check, expected), actual) in hashed.into_iter().zip(crc32_each(&ranges)) {
        if actual == expected {
            check.passed();
        }
    }
    for (_, check) in batch {
        let _ = check.run(false);
    }
}

/// Read the planned ranges into the page cache, store by store in file
/// order, in windows of at most [`WINDOW`], until `budget` bytes were
/// asked for; after each window `arrived(store, upto)` says that the
/// bytes of the store at that index in the plan are in up to `upto`.
/// Only the pages the cache lacks are read (a warm load populates nothing:
/// the arrays' own faults map the cached pages), each store's through
/// `via[i]` when it has a private mapping there, else through the store.
/// Before a store's ranges, the pages a structure walk read from the disk
/// one by one are dropped (see [`Store::take_cold_walk_pages`]): the
/// readahead that follows would stop at each of them.
fn read_in(
    stores: &[StoreRanges],
    via: &[Option<Arc<PrivateMap>>],
    budget: u64,
    mut arrived: impl FnMut(usize, u64),
) -> Result<u64> {
    let mut asked = 0u64;
    for (at_store, (store, ranges)) in stores.iter().enumerate() {
        let via = via.get(at_store).and_then(Option::as_deref);
        drop_stray_walk_pages(store, ranges);
        for &(start, end) in ranges {
            let mut at = start;
            while at < end {
                let len = (end - at).min(WINDOW).min(budget - asked);
                if len == 0 {
                    return Ok(asked);
                }
                populate_uncached(store, via, at, len)?;
                asked += len;
                at += len;
                arrived(at_store, at);
            }
        }
    }
    Ok(asked)
}

/// Read `[at, at + len)` of `store` into the page cache where it is not
/// cached yet, faulting the pages into `via` (a private mapping of the
/// store's file) when given, else into the store's own mapping.
fn populate_uncached(store: &Store, via: Option<&PrivateMap>, at: u64, len: u64) -> Result<()> {
    if store.looks_cached(at, len) {
        return Ok(());
    }
    for (start, end) in store.uncached_ranges(at, len, MERGE_GAP) {
        match via {
            Some(map) => map.populate(start, end.min(map.len())),
            None => store.populate(start, end - start)?,
        }
    }
    Ok(())
}

/// Drop the pages a structure walk read from the disk one by one (see
/// [`Store::take_cold_walk_pages`]) where they lie inside `ranges` (sorted
/// byte ranges a whole load is about to read in order): the kernel's
/// readahead would stop at each. Advice: a load never fails for it.
pub(crate) fn drop_stray_walk_pages(store: &Store, ranges: &[(u64, u64)]) {
    let stray = pages_within(&store.take_cold_walk_pages(), ranges);
    let _ = store.drop_cached(&stray);
}

/// The parts of the page ranges `pages` that overlap the byte ranges
/// `ranges` (both sorted), widened to whole pages.
fn pages_within(pages: &[(u64, u64)], ranges: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut r = 0;
    for &(ps, pe) in pages {
        while r < ranges.len() && ranges[r].1 <= ps {
            r += 1;
        }
        let mut k = r;
        while k < ranges.len() && ranges[k].0 < pe {
            let (start, end) = Store::page_envelope(ranges[k].0, ranges[k].1 - ranges[k].0);
            let (s, e) = (ps.max(start), pe.min(end));
            if s < e {
                out.push((s, e));
            }
            k += 1;
        }
    }
    out
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
        assert_eq!(
            src.read_ahead_within(&[0, 1], Some(1 << 19), None).unwrap(),
            1 << 19
        );
        // The 1 MiB gap is past MERGE_GAP: two ranges, 2 MiB asked.
        assert_eq!(src.read_ahead_all().unwrap(), 2 << 20);
        let t = src.tensor("t1").unwrap();
        assert!(t.data().unwrap().bytes().unwrap().iter().all(|&b| b == 7));
    }

    #[test]
    fn a_warm_read_ahead_without_a_budget_given_runs_every_check() {
        use crate::source::CountedCheck;
        let (f, _) = source(&[], 9 << 20);
        let store = Arc::new(Store::open(f.path()).unwrap());
        // Just written, so cached: nothing to read and no budget to keep.
        assert!(all_cached(&[(Arc::clone(&store), vec![(0, 9 << 20)])], u64::MAX).is_some());
        let at = [(2u64 << 20, 1u64 << 20), (0, 1 << 20), (8 << 20, 1 << 20)];
        let checks = CountedCheck::many(&[false, false, false]);
        let src = Source::of_checked_ranges(store, &at, &checks);
        assert_eq!(src.read_ahead(&[0, 1, 2]).unwrap(), 3 << 20);
        assert!(checks.iter().all(|c| c.runs() == 1));
    }

    #[test]
    fn read_ahead_runs_the_checks_of_what_it_read_and_keeps_their_outcome() {
        checks_run_within_the_budget_and_keep_their_outcome(false);
    }

    #[test]
    fn a_cold_read_ahead_runs_the_checks_as_the_bytes_arrive() {
        checks_run_within_the_budget_and_keep_their_outcome(true);
    }

    /// A warm read-ahead runs its checks together before returning; a cold
    /// one (`cold`: the file's pages dropped from the cache first, which a
    /// disk-backed temporary directory allows and tmpfs does not) runs each
    /// as its bytes come in. Either way, the same checks run, once.
    fn checks_run_within_the_budget_and_keep_their_outcome(cold: bool) {
        use crate::source::CountedCheck;
        use std::os::fd::AsRawFd;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![7u8; 9 << 20]).unwrap();
        f.flush().unwrap();
        if cold {
            f.as_file().sync_all().unwrap();
            // SAFETY: advice on a descriptor this test owns.
            unsafe {
                libc::posix_fadvise(f.as_file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED)
            };
        }
        let store = Arc::new(Store::open(f.path()).unwrap());
        assert_eq!(
            all_cached(&[(Arc::clone(&store), vec![(0, 9 << 20)])], u64::MAX).is_none(),
            cold,
            "cold: the temporary file's pages must leave the cache (not on tmpfs)"
        );
        // Listed out of file order: t0 lies after t1; t2 is past the budget.
        let at = [(2u64 << 20, 1u64 << 20), (0, 1 << 20), (8 << 20, 1 << 20)];
        let checks = CountedCheck::many(&[false, true, false]);
        let src = Source::of_checked_ranges(store, &at, &checks);
        let runs = |i: usize| checks[i].runs();

        // Keyed by where each object's bytes end, in file order.
        let keys: Vec<_> = src
            .checks_in_file_order(&plan(&src, &[0, 1, 2]), &[0, 1, 2])
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        assert_eq!(keys, vec![(0, 1 << 20), (0, 3 << 20), (0, 9 << 20)]);

        // The budget covers t1 and t0: their checks ran, t2's did not, and
        // a failing check does not fail the read-ahead.
        assert_eq!(
            src.read_ahead_within(&[0, 1, 2], Some(2 << 20), None)
                .unwrap(),
            2 << 20
        );
        assert_eq!((runs(0), runs(1), runs(2)), (1, 1, 0));
        // Reads find the outcomes: t1 is refused, t0 reads without a second
        // run, t2's check runs at its first read.
        let read = |name: &str| {
            src.tensor(name)
                .unwrap()
                .data()
                .unwrap()
                .bytes()
                .map(|b| b.len())
        };
        assert!(matches!(
            read("t1"),
            Err(crate::error::Error::Integrity { .. })
        ));
        assert_eq!(read("t0").unwrap(), 1 << 20);
        assert_eq!(read("t2").unwrap(), 1 << 20);
        assert_eq!((runs(0), runs(1), runs(2)), (1, 1, 1));
    }

    #[test]
    fn a_writable_read_ahead_hashes_crc_checks_through_the_private_mapping() {
        use crate::catalog::Crc32Range;
        use crate::source::CountedCheck;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let bytes: Vec<u8> = (0..3u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
        f.write_all(&bytes).unwrap();
        f.flush().unwrap();
        let store = Arc::new(Store::open(f.path()).unwrap());
        let at = [(0u64, 1u64 << 20), (1 << 20, 2 << 20)];
        let crc = |(o, l): (u64, u64)| crc32fast::hash(&bytes[o as usize..(o + l) as usize]);
        // t0's CRC is right; t1's is wrong (its check then runs, and fails).
        let checks = vec![
            CountedCheck::crc32(
                Crc32Range {
                    offset: at[0].0,
                    len: at[0].1,
                    crc: crc(at[0]),
                },
                false,
            ),
            CountedCheck::crc32(
                Crc32Range {
                    offset: at[1].0,
                    len: at[1].1,
                    crc: !crc(at[1]),
                },
                true,
            ),
        ];
        let src = Source::of_checked_ranges(store, &at, &checks);
        let maps = PrivateMaps::new();
        src.read_ahead_into(&[0, 1], &maps).unwrap();
        assert_eq!((checks[0].runs(), checks[1].runs()), (0, 1));
        let read = |name: &str| {
            src.tensor(name)
                .unwrap()
                .data()
                .unwrap()
                .bytes()
                .map(|b| b.len())
        };
        assert_eq!(read("t0").unwrap(), 1 << 20);
        assert!(matches!(
            read("t1"),
            Err(crate::error::Error::Integrity { .. })
        ));
    }

    #[test]
    fn stray_pages_are_dropped_only_where_a_range_reads() {
        let page = crate::store::page_size();
        let pages = [(0, page), (3 * page, 5 * page), (10 * page, 11 * page)];
        // One range over page 0's tail and page 1, one over pages 4..6.
        let ranges = [(page / 2, 2 * page), (4 * page + 1, 6 * page)];
        assert_eq!(
            pages_within(&pages, &ranges),
            vec![(0, page), (4 * page, 5 * page)]
        );
        assert!(pages_within(&pages, &[]).is_empty());
        assert!(pages_within(&[], &ranges).is_empty());
    }
}
