//! The pages a structure walk read from the disk itself (see the
//! [`super`] docs): noted as the walk reads, taken by the whole load that
//! follows, which drops them before reading over them.
//!
//! Whether a mapped page was cached before the walk touched it is asked of
//! `mincore` once per 2 MiB region, at the walk's first read there, and
//! kept until the walk ends: a walk over many small members (a 20,000-member
//! npz reads two headers each) then makes a few calls, not one a read
//! (one a read more than doubled that npz's warm open).

use std::sync::Mutex;

/// The most page ranges kept noted (16 bytes each: 1 MiB), so a walk over
/// millions of members holds no unbounded record.
const MAX_RANGES: usize = 1 << 16;

/// The span one `mincore` call covers.
const REGION: u64 = 2 << 20;

#[derive(Debug, Default)]
pub(super) struct ColdPages {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Page ranges read from the disk by a walk, in the order noted.
    noted: Vec<(u64, u64)>,
    /// During a walk: for each region (by index) once probed, whether each
    /// of its pages was cached then (`mincore`'s bytes, bit 0).
    residency: Vec<Option<Box<[u8]>>>,
}

impl ColdPages {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Note `[start, end)` (whole pages) as read from the disk, joined to
    /// the last range noted when it follows it; past [`MAX_RANGES`]
    /// ranges, pages go unnoted (a slower load, never a wrong one).
    pub(super) fn note(&self, start: u64, end: u64) {
        note(&mut self.state().noted, start, end);
    }

    /// Note the pages of `[start, end)` (page-aligned) that were not cached
    /// when the walk first read in their region. `probe(region_start,
    /// region_len, out)` fills `out` with `mincore`'s bytes for a region,
    /// or returns false (then nothing in that region is noted).
    pub(super) fn note_uncached(
        &self,
        start: u64,
        end: u64,
        page: u64,
        file_len: u64,
        mut probe: impl FnMut(u64, u64, &mut [u8]) -> bool,
    ) {
        let mut state = self.state();
        let State { noted, residency } = &mut *state;
        if residency.is_empty() {
            *residency = vec![None; file_len.div_ceil(REGION) as usize];
        }
        let mut at = start;
        while at < end {
            let region_start = at / REGION * REGION;
            let region_end = (region_start + REGION).min(file_len);
            let cached = residency[(at / REGION) as usize].get_or_insert_with(|| {
                let mut bytes = vec![0u8; (region_end - region_start).div_ceil(page) as usize];
                if !probe(region_start, region_end - region_start, &mut bytes) {
                    bytes.fill(1); // unknown: treated as cached, never dropped
                }
                bytes.into_boxed_slice()
            });
            let stop = end.min(region_end.next_multiple_of(page));
            for p in (at..stop).step_by(page as usize) {
                if cached[((p - region_start) / page) as usize] & 1 == 0 {
                    note(noted, p, p + page);
                }
            }
            at = stop;
        }
    }

    /// The walk ended: what it learnt of the cache is stale from now on.
    pub(super) fn end_walk(&self) {
        self.state().residency = Vec::new();
    }

    /// The ranges noted, sorted and merged; the record is emptied.
    pub(super) fn take(&self) -> Vec<(u64, u64)> {
        let mut pages = std::mem::take(&mut self.state().noted);
        pages.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(pages.len());
        for (s, e) in pages {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        merged
    }
}

/// [`ColdPages::note`] on the record itself.
fn note(noted: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    if let Some(last) = noted.last_mut().filter(|last| last.1 == start) {
        last.1 = end;
    } else if noted.len() < MAX_RANGES {
        noted.push((start, end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residency_is_asked_once_a_region_and_only_uncached_pages_are_noted() {
        let page = 4096;
        let pages = ColdPages::default();
        let probes = std::cell::RefCell::new(Vec::new());
        // Every odd page of the file is cached.
        let probe = |start: u64, len: u64, out: &mut [u8]| {
            probes.borrow_mut().push((start, len));
            for (i, b) in out.iter_mut().enumerate() {
                *b = ((start / page + i as u64) % 2) as u8;
            }
            true
        };
        let file_len = REGION + 10 * page + 100;
        // Pages 0-3 of region 0, pages 2-3 again, then across into region 1,
        // whose last page is partial.
        pages.note_uncached(0, 4 * page, page, file_len, probe);
        pages.note_uncached(2 * page, 4 * page, page, file_len, probe);
        pages.note_uncached(REGION - page, REGION + 11 * page, page, file_len, probe);
        assert_eq!(
            *probes.borrow(),
            vec![(0, REGION), (REGION, 10 * page + 100)]
        );
        let even = |p: u64| (p * page, (p + 1) * page);
        let first = REGION / page;
        let mut want = vec![even(0), even(2)];
        want.extend((first..first + 11).step_by(2).map(even));
        assert_eq!(pages.take(), want);
        assert!(pages.take().is_empty(), "the record is emptied");
        // After the walk ends, a region is probed afresh.
        pages.end_walk();
        pages.note_uncached(0, page, page, file_len, probe);
        assert_eq!(probes.borrow().len(), 3);
        assert_eq!(pages.take(), vec![even(0)]);
        // A region whose probe fails notes nothing.
        pages.end_walk();
        pages.note_uncached(0, 4 * page, page, file_len, |_, _, _| false);
        assert!(pages.take().is_empty());
    }

    #[test]
    fn the_record_is_bounded() {
        let pages = ColdPages::default();
        for i in 0..(MAX_RANGES as u64 + 10) {
            pages.note(i * 8192, i * 8192 + 4096);
        }
        assert_eq!(pages.take().len(), MAX_RANGES);
        // Ranges that follow each other join.
        pages.note(0, 4096);
        pages.note(4096, 8192);
        assert_eq!(pages.take(), vec![(0, 8192)]);
    }
}
