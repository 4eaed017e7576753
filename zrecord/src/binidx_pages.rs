//! A Megatron `.idx` in object storage read by pages (feature `remote`):
//! a pretraining corpus's index is GBs (an i32 length and an i64 pointer
//! per sequence, an i64 per document), so past a threshold it is not
//! fetched whole at open; each gather fetches the pages of its entries,
//! all of them together through zt-remote's budgeted, coalesced ranged
//! path, and the most recently used pages are kept for the next gathers.
//!
//! Pages are cut per array (lengths, pointers, document indices) from the
//! array's start, and [`PAGE`] is a multiple of every entry's width, so an
//! entry never straddles two pages. The object is the one opened (its
//! version pinned by [`zt_remote::RemoteObject`]), so pages fetched at
//! different times come from the same index. What an entry says is
//! checked by its reader ([`crate::binidx`]), as for a mapped index.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use zt_remote::fetch::ranges_of;
use zt_remote::RemoteObject;

pub(crate) use crate::binidx::Array;
use crate::error::Result;

/// Bytes per page of an array (the last page of an array may be shorter).
/// Small, because random gathers touch one entry per page: a page's bytes
/// past the entry are what a gather pays for extra, while a request's
/// cost is mostly its first byte (and neighbouring pages of a sequential
/// gather are coalesced into one request anyway). With 1 MiB pages a
/// random batch fetched most of a corpus's index again and again, slower
/// than fetching it whole once (see `results/binidx-remote.md`).
pub(crate) const PAGE: u64 = 64 << 10;
/// Pages kept between gathers (64 MiB; least recently used dropped
/// first); a gather that needs more holds them only while it runs.
const HELD: usize = 1024;

/// An index below this many bytes is fetched whole at open, as before
/// (one request, no page bookkeeping); `ZT_BINIDX_PAGED_ABOVE` (bytes)
/// sets another threshold. Random gathers over a cold paged index cost
/// about two index requests a record (`results/binidx-remote.md`), so
/// pages are worth it only where holding the index whole would cost each
/// rank GiBs of memory.
pub(crate) const PAGED_ABOVE: u64 = 1 << 30;

/// The index size past which it is read by pages: `ZT_BINIDX_PAGED_ABOVE`
/// if set (a byte count), else [`PAGED_ABOVE`].
pub(crate) fn paged_above() -> Result<u64> {
    match std::env::var("ZT_BINIDX_PAGED_ABOVE") {
        Err(_) => Ok(PAGED_ABOVE),
        Ok(text) => text.trim().parse().map_err(|_| {
            crate::error::Error::invalid(format!(
                "ZT_BINIDX_PAGED_ABOVE={text:?} is not a byte count"
            ))
        }),
    }
}

impl Array {
    /// Bytes per entry.
    pub(crate) fn width(self) -> u64 {
        match self {
            Array::Lengths => 4,
            Array::Pointers | Array::Documents => 8,
        }
    }
}

/// One page: its array and number.
pub(crate) type Key = (Array, u64);

/// The page holding entry `i` of `array`.
pub(crate) fn key(array: Array, i: u64) -> Key {
    (array, i * array.width() / PAGE)
}

/// The pages holding entries `first..end` of `array`.
pub(crate) fn keys(array: Array, first: u64, end: u64) -> impl Iterator<Item = Key> {
    let pages = if first < end {
        first * array.width() / PAGE..(end - 1) * array.width() / PAGE + 1
    } else {
        0..0
    };
    pages.map(move |p| (array, p))
}

/// The pages one gather reads, held while it runs.
pub(crate) struct Pinned {
    pages: HashMap<Key, Arc<Vec<u8>>>,
}

impl Pinned {
    /// Entry `i` of `array` (its page is among those loaded).
    pub(crate) fn entry(&self, array: Array, i: u64) -> &[u8] {
        let (w, (_, page)) = (array.width(), key(array, i));
        let at = (i * w - page * PAGE) as usize;
        &self.pages[&(array, page)][at..at + w as usize]
    }
}

#[derive(Default)]
struct Held {
    pages: HashMap<Key, (Arc<Vec<u8>>, u64)>,
    /// Increases per use: a page's last use, for dropping the oldest.
    clock: u64,
}

/// An index object read by pages.
pub(crate) struct Pages {
    object: Arc<RemoteObject>,
    /// Each array's `(offset, len)` in the object, by [`Array`].
    arrays: [(u64, u64); 3],
    held: Mutex<Held>,
}

impl Pages {
    /// The pages of `object`, whose arrays lie at `arrays` (checked
    /// against its size by the caller).
    pub(crate) fn new(object: Arc<RemoteObject>, arrays: [(u64, u64); 3]) -> Pages {
        Pages {
            object,
            arrays,
            held: Mutex::default(),
        }
    }

    /// `key`'s bytes in the object: `(offset, len)`.
    fn range(&self, (array, page): Key) -> (u64, u64) {
        let (at, len) = self.arrays[array as usize];
        let start = page * PAGE;
        (at + start, PAGE.min(len.saturating_sub(start)))
    }

    /// The pages `keys` name, those not held fetched now, together.
    pub(crate) fn load(&self, path: &Path, keys: impl IntoIterator<Item = Key>) -> Result<Pinned> {
        let mut pages = HashMap::new();
        let mut missing = Vec::new();
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            let held = &mut *held;
            let mut seen = HashSet::new();
            for key in keys {
                if !seen.insert(key) {
                    continue;
                }
                match held.pages.get_mut(&key) {
                    Some((page, used)) => {
                        held.clock += 1;
                        *used = held.clock;
                        pages.insert(key, Arc::clone(page));
                    }
                    None => missing.push(key),
                }
            }
        }
        if missing.is_empty() {
            return Ok(Pinned { pages });
        }
        missing.sort_unstable_by_key(|&k| self.range(k).0);
        let ranges = missing.iter().map(|&k| self.range(k)).collect();
        let got = zt_remote::runtime::block_on(ranges_of(vec![(Arc::clone(&self.object), ranges)]))
            .and_then(|r| r)
            .map_err(|e| crate::remote::error(path, e))?;
        let got = got.into_iter().next().unwrap_or_default();
        if got.len() != missing.len()
            || got
                .iter()
                .zip(&missing)
                .any(|(g, &k)| g.len() as u64 != self.range(k).1)
        {
            return Err(crate::error::Error::invalid(
                "a fetch returned other ranges than asked",
            ));
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        for (key, bytes) in missing.into_iter().zip(got) {
            let page = Arc::new(bytes);
            held.clock += 1;
            let used = held.clock;
            held.pages.insert(key, (Arc::clone(&page), used));
            pages.insert(key, page);
        }
        if held.pages.len() > HELD {
            let mut by_use: Vec<(u64, Key)> =
                held.pages.iter().map(|(k, (_, u))| (*u, *k)).collect();
            by_use.sort_unstable_by_key(|&(used, _)| used);
            let excess = by_use.len() - HELD;
            for (_, key) in &by_use[..excess] {
                held.pages.remove(key);
            }
        }
        Ok(Pinned { pages })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_never_straddle_pages() {
        // The last entry of a page and the first of the next.
        let per = PAGE / 8;
        assert_eq!(key(Array::Pointers, per - 1), (Array::Pointers, 0));
        assert_eq!(key(Array::Pointers, per), (Array::Pointers, 1));
        assert_eq!(key(Array::Lengths, 2 * per), (Array::Lengths, 1));
        let pages: Vec<_> = keys(Array::Lengths, per * 2 - 1, per * 2 + 1).collect();
        assert_eq!(pages, [(Array::Lengths, 0), (Array::Lengths, 1)]);
        assert_eq!(keys(Array::Documents, 5, 5).count(), 0);
    }
}
