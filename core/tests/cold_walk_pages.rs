//! A structure walk notes the pages it reads from the disk itself, and a
//! whole load drops them again (`Store::take_cold_walk_pages`,
//! `Store::drop_cached`): they need a file whose pages really leave the
//! page cache, so the file lives under the target directory (a real disk;
//! `/tmp` may be tmpfs, where pages never leave).

use std::io::Write;
use std::os::fd::AsRawFd;

use zt_core::store::{page_size, Store};

/// Which of the file's first `pages` pages are in the page cache.
fn cached(path: &std::path::Path, pages: usize) -> Vec<bool> {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only shared mapping of a file this test owns, used only
    // for its address.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let mut vec = vec![0u8; pages];
    // SAFETY: the mapping is at least `pages` pages long; `vec` has a byte
    // for each.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            pages * page_size() as usize,
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0);
    vec.iter().map(|b| b & 1 == 1).collect()
}

/// Write `pages` pages (each page's bytes its index) and drop them from
/// the page cache.
fn cold_file(pages: usize) -> tempfile::NamedTempFile {
    let page = page_size() as usize;
    let mut f = tempfile::NamedTempFile::new_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for i in 0..pages {
        f.write_all(&vec![i as u8; page]).unwrap();
    }
    f.as_file().sync_all().unwrap();
    // SAFETY: advice on a descriptor the test owns.
    unsafe { libc::posix_fadvise(f.as_file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert!(
        cached(f.path(), pages).iter().all(|c| !c),
        "the page cache kept the file's pages after POSIX_FADV_DONTNEED"
    );
    f
}

#[test]
fn a_walk_notes_the_pages_it_reads_from_the_disk_and_a_load_drops_them() {
    let f = cold_file(128);
    walk_notes_and_drops(f.path(), Store::open(f.path()).unwrap());
}

#[test]
fn a_positional_walk_notes_and_drops_them_too() {
    let f = cold_file(128);
    walk_notes_and_drops(f.path(), Store::open_positional(f.path()).unwrap());
}

/// The walk over `store`, whose file `path` is cold: see the tests above.
fn walk_notes_and_drops(path: &std::path::Path, store: Store) {
    let page = page_size();
    let read = |offset: u64, len: u64| {
        store
            .read(offset, len)
            .unwrap()
            .iter()
            .map(|&b| b as u64)
            .sum::<u64>()
    };

    store.begin_walk();
    // Two headers, one of them straddling pages 20 and 21.
    assert_eq!(read(10 * page + 5, 30), 10 * 30);
    assert_eq!(read(21 * page - 10, 20), 20 * 10 + 21 * 10);
    // A long read (a pickle, a manifest) keeps normal readahead and is
    // not noted.
    read(64 * page, 64 * page);
    store.end_walk();
    let noted = store.take_cold_walk_pages();
    assert_eq!(noted, vec![(10 * page, 11 * page), (20 * page, 22 * page)]);
    assert!(
        store.take_cold_walk_pages().is_empty(),
        "the record is emptied"
    );

    // A walk over pages already cached notes nothing.
    store.begin_walk();
    read(10 * page + 5, 30);
    store.end_walk();
    assert!(store.take_cold_walk_pages().is_empty());
    // Reads outside a walk note nothing.
    read(5 * page, 10);
    assert!(store.take_cold_walk_pages().is_empty());

    // Dropping page 10 leaves pages 20 and 21 (and the long read's) cached,
    // and the bytes read back are the file's.
    let before = cached(path, 128);
    assert!(before[10] && before[20] && before[21]);
    store.drop_cached(&[(10 * page, 11 * page)]).unwrap();
    let after = cached(path, 128);
    assert!(!after[10] && after[20] && after[21]);
    assert_eq!(read(10 * page, page), 10 * page);
}
