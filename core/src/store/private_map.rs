//! Writable views without copies: a store's file mapped a second time,
//! private and writable (`MAP_PRIVATE`), from the descriptor the store
//! holds.
//!
//! A load whose arrays must be writable (safetensors' `load_file` contract)
//! cannot hand out views of the store's shared read-only mapping. A private
//! mapping of the same file reads as freely (its read faults map the page
//! cache's pages), and the first write to a page gives the process its own
//! copy of that page, never touching the file. It is made from the store's
//! own descriptor, so it shows the very file the store validated, even if
//! another was renamed over the path since; and a whole load populates it
//! instead of the shared mapping ([`crate::Source::read_ahead_into`]), so
//! each page is faulted once, in the mapping the arrays view.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{MmapMut, MmapOptions};

use super::Store;
use crate::catalog::Payload;
use crate::error::{Error, Result};
use crate::part::PartRef;

/// A store's file mapped private and writable; unmapped when dropped (every
/// array viewing it holds it).
#[derive(Debug)]
pub struct PrivateMap {
    map: MmapMut,
    /// The mapping's address, taken once from the exclusive borrow: the
    /// views write through it, never through a Rust reference.
    base: usize,
    /// A view was handed out ([`PrivateMaps::view`]): from then on its
    /// pages may be written, so zt no longer reads them.
    viewed: AtomicBool,
}

impl PrivateMap {
    /// The address of byte `offset` of the file in this mapping (callers
    /// pass an offset the store's range checks accepted).
    pub fn address(&self, offset: u64) -> usize {
        self.base + offset as usize
    }

    /// The mapping's length: the store's length.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// True for an empty mapping (never made: see [`Store::map_private`]).
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The bytes `[offset, offset + len)` as this mapping shows them, to be
    /// hashed through it (so their pages are faulted in here, where the
    /// views will find them); `None` once a view was handed out (its bytes
    /// may have been written) or for a range past the mapping.
    pub(crate) fn unviewed(&self, offset: u64, len: u64) -> Option<&[u8]> {
        if self.viewed.load(Ordering::Acquire) || offset.checked_add(len)? > self.len() {
            return None;
        }
        // SAFETY: the range lies inside the mapping (checked above), which
        // lives as long as `self`; no view of it exists yet, so nothing
        // writes it while it is read (the caller hashes it before any view
        // of the load is made).
        Some(unsafe { std::slice::from_raw_parts(self.address(offset) as *const u8, len as usize) })
    }

    /// Fault in the pages of `[start, end)` (page-aligned start, end within
    /// the mapping) as reads: the page cache's pages mapped, nothing copied.
    pub(crate) fn populate(&self, start: u64, end: u64) {
        super::page_cache::populate_mapping(self.base as *const u8, start, end);
    }
}

impl Store {
    /// The file mapped again, private and writable, from the descriptor
    /// this store holds, as long as the store (so every range the store's
    /// checks accept lies inside it). `None` for stores that are not a
    /// mapped local file, and for an empty one (nothing to map).
    pub fn map_private(&self) -> Result<Option<PrivateMap>> {
        let (true, Some(file)) = (self.is_mapped(), self.file.as_ref()) else {
            return Ok(None);
        };
        if self.len == 0 {
            return Ok(None);
        }
        // SAFETY: a private mapping: writes through it stay in this
        // process. Another process truncating the file would raise SIGBUS
        // on access, the contract of the store's own mapping.
        let mut map = unsafe { MmapOptions::new().len(self.len as usize).map_copy(file) }
            .map_err(|e| Error::io(&self.path, e))?;
        let base = map.as_mut_ptr() as usize;
        Ok(Some(PrivateMap {
            map,
            base,
            viewed: AtomicBool::new(false),
        }))
    }
}

/// The private mappings of the stores one load (or one `safe_open` handle)
/// views, made at most once per store and shared by every array of it.
#[derive(Debug, Default)]
pub struct PrivateMaps {
    /// By store address (the `Arc<Store>` kept, so the address stays its).
    maps: Mutex<HashMap<usize, StoreMap>>,
}

/// A store and its private mapping (`None`: it has none).
type StoreMap = (Arc<Store>, Option<Arc<PrivateMap>>);

impl PrivateMaps {
    /// No mappings yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `store`'s private mapping, made at the first call (`None` where the
    /// store has none: see [`Store::map_private`]).
    pub fn of(&self, store: &Arc<Store>) -> Result<Option<Arc<PrivateMap>>> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        let key = Arc::as_ptr(store) as usize;
        if let Some((_, map)) = maps.get(&key) {
            return Ok(map.clone());
        }
        let map = store.map_private()?.map(Arc::new);
        maps.insert(key, (Arc::clone(store), map.clone()));
        Ok(map)
    }

    /// Where `part`'s stored bytes lie in its store's private mapping: the
    /// mapping and the address of the first byte; `None` when they are not
    /// raw bytes of a mapped local file (decoded, remote, positional).
    /// Runs the part's lazy check first (an npz member's CRC-32), as every
    /// read of it does, since the view bypasses zt's reads.
    pub fn view(&self, part: &PartRef<'_>) -> Result<Option<(Arc<PrivateMap>, usize)>> {
        let Payload::Stored { store, offset, len } = part.payload() else {
            return Ok(None);
        };
        if !store.is_mapped() || *len == 0 {
            return Ok(None);
        }
        // The check and the bounds, as a read of the shared mapping has them.
        part.map_unaligned()?;
        Ok(self.of(store)?.map(|map| {
            map.viewed.store(true, Ordering::Release);
            let address = map.address(*offset);
            (map, address)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(bytes: &[u8], dir: &std::path::Path, name: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(bytes).unwrap();
        // Written back, so dropping its pages from the cache can succeed.
        f.sync_all().unwrap();
        path
    }

    fn read(map: &PrivateMap, offset: u64, len: usize) -> Vec<u8> {
        // SAFETY: the range lies inside the mapping (the tests' files).
        unsafe { std::slice::from_raw_parts(map.address(offset) as *const u8, len) }.to_vec()
    }

    #[test]
    fn the_private_map_is_the_file_the_store_opened_not_the_one_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(&[1u8; 10_000], dir.path(), "model.bin");
        let store = Arc::new(Store::open(&path).unwrap());
        // Another file renamed over the path after the open.
        let other = file_of(&[2u8; 20_000], dir.path(), "other.bin");
        std::fs::rename(&other, &path).unwrap();
        let maps = PrivateMaps::new();
        let map = maps.of(&store).unwrap().expect("a mapped store maps");
        assert_eq!(map.len(), 10_000);
        assert_eq!(read(&map, 9_000, 1_000), vec![1u8; 1_000]);
        // One mapping per store, however often asked.
        assert!(Arc::ptr_eq(&map, &maps.of(&store).unwrap().unwrap()));
    }

    #[test]
    fn writes_stay_in_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(&[5u8; 8192], dir.path(), "w.bin");
        let store = Store::open(&path).unwrap();
        let map = store.map_private().unwrap().unwrap();
        // SAFETY: inside the mapping, which is private and writable.
        unsafe { *(map.address(100) as *mut u8) = 9 };
        assert_eq!(read(&map, 99, 3), vec![5, 9, 5]);
        assert_eq!(store.slice(100, 1).unwrap(), &[5]);
        assert_eq!(std::fs::read(&path).unwrap()[100], 5);
    }

    #[test]
    fn checks_read_through_the_mapping_until_a_view_is_out() {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..(9u32 << 20) + 5)
            .map(|i| (i * 13 + i / 999) as u8)
            .collect();
        let path = file_of(&bytes, dir.path(), "crc.bin");
        let store = Arc::new(Store::open(&path).unwrap());
        let src = crate::Source::of_ranges(Arc::clone(&store), &[(100, 1000)]);
        let maps = PrivateMaps::new();
        let map = maps.of(&store).unwrap().unwrap();
        assert_eq!(map.unviewed(3, 9 << 20), Some(&bytes[3..(9 << 20) + 3]));
        assert_eq!(map.unviewed(0, 0), Some(&[][..]));
        assert_eq!(map.unviewed(1, bytes.len() as u64), None, "past the end");
        let part = src.tensor("t0").unwrap().data().unwrap();
        let (viewed, address) = maps.view(&part).unwrap().unwrap();
        assert!(Arc::ptr_eq(&viewed, &map) && address == map.address(100));
        assert_eq!(
            map.unviewed(3, 100),
            None,
            "its pages may have been written"
        );
    }

    #[test]
    fn stores_without_a_mapped_file_have_no_private_map() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(&[1u8; 100], dir.path(), "p.bin");
        assert!(Store::open_positional(&path)
            .unwrap()
            .map_private()
            .unwrap()
            .is_none());
        assert!(Store::from_bytes("m", vec![1; 10])
            .map_private()
            .unwrap()
            .is_none());
        let empty = file_of(&[], dir.path(), "e.bin");
        assert!(Store::open(&empty)
            .unwrap()
            .map_private()
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_cached_file_has_nothing_left_to_read_and_a_dropped_one_all() {
        let dir = tempfile::tempdir().unwrap();
        let page = super::super::page_size();
        let len = 64 * page;
        let path = file_of(&vec![3u8; len as usize], dir.path(), "c.bin");
        let store = Store::open(&path).unwrap();
        store.populate(0, len).unwrap();
        assert!(store.uncached_ranges(0, len, 0).is_empty());
        // Dropped from the page cache: all of it is left, page-aligned
        // (tmpfs keeps its pages in memory, never uncached).
        store.drop_cached(&[(0, len)]).unwrap();
        let left = store.uncached_ranges(10, len - 10, 0);
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statfs fills the zeroed struct for a NUL-terminated path.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statfs(c_path.as_ptr(), &mut fs) }, 0);
        if fs.f_type == libc::TMPFS_MAGIC {
            assert!(left.is_empty(), "{left:?}");
        } else {
            assert_eq!(left, vec![(0, len)]);
        }
        // Cached again, then two runs of pages dropped: two ranges, or one
        // where the gap between them is within `gap`.
        store.populate(0, len).unwrap();
        let p = |n: u64| n * page;
        store
            .drop_cached(&[(p(10), p(12)), (p(14), p(16))])
            .unwrap();
        if fs.f_type != libc::TMPFS_MAGIC {
            let two = vec![(p(10), p(12)), (p(14), p(16))];
            assert_eq!(store.uncached_ranges(0, len, 0), two);
            assert_eq!(store.uncached_ranges(0, len, p(2)), vec![(p(10), p(16))]);
            assert_eq!(store.uncached_ranges(p(11), p(2), 0), vec![(p(11), p(12))]);
        }
        // A large file partly cached: the ranges are halved until each is
        // whole, or small enough to map page by page, and the runs found
        // are exact wherever they lie.
        let big = 8 << 20;
        let path = file_of(&vec![4u8; big as usize], dir.path(), "big.bin");
        let store = Store::open(&path).unwrap();
        store.populate(0, big).unwrap();
        // (Whole 2 MiB regions: a large folio is dropped whole or not.)
        let mib = 1 << 20;
        let dropped = [(2 * mib, 4 * mib), (6 * mib, big)];
        store.drop_cached(&dropped).unwrap();
        // Against mincore over the whole mapping at once, page by page.
        let (address, mapped) = store.mapping().unwrap();
        let mut resident = vec![0u8; mapped.div_ceil(page as usize)];
        // SAFETY: the store's whole mapping, a byte per page.
        let rc =
            unsafe { libc::mincore(address as *mut libc::c_void, mapped, resident.as_mut_ptr()) };
        assert_eq!(rc, 0);
        let mut want: Vec<(u64, u64)> = Vec::new();
        for (i, _) in resident.iter().enumerate().filter(|(_, r)| **r & 1 == 0) {
            let at = i as u64 * page;
            match want.last_mut() {
                Some(last) if last.1 == at => last.1 = at + page,
                _ => want.push((at, at + page)),
            }
        }
        assert_eq!(store.uncached_ranges(0, big, 0), want);
        if fs.f_type != libc::TMPFS_MAGIC {
            // The drops took, so the comparison above saw runs to find.
            assert_eq!(want.first(), Some(&dropped[0]));
            assert!(want.len() == 2 && want[1].0 == dropped[1].0, "{want:?}");
        }
        // A positional store cannot tell: all of it, page-aligned.
        let positional = Store::open_positional(&path).unwrap();
        assert_eq!(positional.uncached_ranges(10, 100, 0), vec![(0, page)]);
        assert!(!positional.looks_cached(0, big));
    }

    #[test]
    fn a_range_looks_cached_until_a_probed_page_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let big: u64 = 8 << 20;
        let path = file_of(&vec![5u8; big as usize], dir.path(), "probe.bin");
        let store = Store::open(&path).unwrap();
        store.populate(0, big).unwrap();
        assert!(store.looks_cached(0, big));
        assert!(store.looks_cached(100, 1000));
        assert!(store.looks_cached(0, 0) && store.looks_cached(big, 10));
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statfs fills the zeroed struct for a NUL-terminated path.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statfs(c_path.as_ptr(), &mut fs) }, 0);
        if fs.f_type == libc::TMPFS_MAGIC {
            return; // tmpfs never drops its pages
        }
        // The last 2 MiB dropped (a large folio goes whole or not): the
        // last probe, which ends at the range's end, finds it.
        let mib = 1 << 20;
        store.drop_cached(&[(6 * mib, big)]).unwrap();
        assert!(!store.looks_cached(0, big));
        assert!(store.looks_cached(0, 6 * mib));
        // The first 2 MiB dropped instead: the first probe finds it.
        store.populate(0, big).unwrap();
        store.drop_cached(&[(0, 2 * mib)]).unwrap();
        assert!(!store.looks_cached(0, big));
        assert!(!store.looks_cached(mib, 10));
    }
}
