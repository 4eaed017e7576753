//! Owned copies of many parts at once: what `load_file(copy=True)` of every
//! format reads through.
//!
//! One tensor after another on one core, a copy out of the page cache runs
//! at the speed one core faults in fresh destination pages and copies into
//! them (numpy's `arr.copy()` of a view does the same). Here every
//! destination is allocated first (fallibly, huge-page advised: see
//! [`crate::buffer`]), then the raw bytes of all parts are copied in file
//! order by up to [`std::thread::available_parallelism`] threads, each
//! claiming the next [`CHUNK`] of the file, so the faults and the copying
//! are spread over the cores while the reads still move forward through
//! the file. The bytes are `pread` straight into the destinations, with no
//! buffer in between: a positional store's (`map=False`) descriptor, and a
//! mapped store's file reopened for the copy ([`Store::reopen`]: the same
//! inode, so the same bytes), which skips building and walking the
//! mapping's page tables (measured faster than copying out of the mapping:
//! harness/copy_bench.py) and makes a file that shrank an error, not
//! `SIGBUS`. A mapped file whose path now names another file is copied out
//! of the mapping. Loads under [`THREAD_BYTES`] per extra thread stay on
//! the calling thread.
//!
//! A part whose lazy check is a CRC-32 over a range holding it (an npz
//! member's: `Check::crc32`) is hashed piece by piece on the copying
//! threads as each piece lands, so its check costs no second pass over the
//! bytes (`python -m harness --only cold` measures the copy against
//! `cat`). No copy is returned before every check has passed.
//!
//! Only raw parts take this path: stored bytes of a local file in C order.
//! Decoded parts (compressed, big-endian, typed fields), strided ones and
//! remote ones are read as [`PartRef::bytes`] reads them, one after another.

use std::fs::File;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::catalog::{Crc32Range, Payload};
use crate::error::{Error, Result};
use crate::part::PartRef;
use crate::rule::Rule;
use crate::store::Store;

/// The unit a copying thread claims: this many bytes of one part, or a run
/// of consecutive small parts adding up to about this many.
pub const CHUNK: usize = 8 << 20;

/// Each thread beyond the first needs this many bytes to copy, so a small
/// load (where starting a thread costs more than it saves) runs on the
/// calling thread alone.
pub const THREAD_BYTES: u64 = 32 << 20;

/// The threads a copy of `total` bytes uses on this machine.
pub fn threads_for(total: u64) -> usize {
    threads_for_pieces(total, THREAD_BYTES)
}

/// The threads a pass over `total` bytes uses on this machine when each
/// thread beyond the first needs at least `piece` bytes to be worth it.
pub fn threads_for_pieces(total: u64, piece: u64) -> usize {
    let warranted = usize::try_from(total / piece.max(1)).unwrap_or(usize::MAX);
    if warranted <= 1 {
        return 1;
    }
    cores().min(warranted)
}

/// The cores this process may run on, asked once: the standard library
/// reads the affinity mask and the cgroup's CPU quota files under `/proc`
/// and `/sys` for every answer, which a warm load would otherwise pay on
/// each pass it sizes.
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Every part's C-order elements ([`PartRef::bytes`]) in memory of its own,
/// writable and independent of the source: raw parts copied in parallel as
/// the module docs describe, the rest decoded or materialized one by one.
/// Allocation failure is [`Error::Memory`] naming the tensor; on any error
/// nothing is returned.
pub fn owned_bytes_of(parts: &[PartRef<'_>]) -> Result<Vec<Vec<u8>>> {
    let total = parts
        .iter()
        .filter_map(raw_range)
        .map(|(_, _, len)| len)
        .sum();
    copy_parts(parts, threads_for(total), CHUNK)
}

/// The store and `(offset, len)` of a part that is copied verbatim.
fn raw_range<'a>(p: &PartRef<'a>) -> Option<(&'a Store, u64, u64)> {
    match p.payload() {
        Payload::Stored { store, offset, len } if !store.is_remote() && p.is_contiguous() => {
            Some((store.as_ref(), *offset, *len))
        }
        _ => None,
    }
}

/// A piece of one copy: `buf.len()` bytes of `store` from `offset` (read
/// with `file` when it has one: see [`Store::reopen`]), for the tensor
/// `name` (which its errors name).
struct Piece<'s, 'b> {
    name: &'s str,
    /// Where the CRC-32 of the bytes goes once copied (see [`Target::crc`]).
    crc: Option<usize>,
    store: &'s Store,
    file: Option<&'s File>,
    offset: u64,
    buf: &'b mut [MaybeUninit<u8>],
}

/// [`owned_bytes_of`] with the thread count and claim size given (tests
/// pick small claims to exercise many of them).
pub(crate) fn copy_parts(
    parts: &[PartRef<'_>],
    threads: usize,
    chunk: usize,
) -> Result<Vec<Vec<u8>>> {
    // Every destination up front, so a load that cannot fit fails before
    // any copying starts.
    let mut out: Vec<Vec<u8>> = Vec::with_capacity(parts.len());
    let mut raw_len = vec![None; parts.len()];
    for (i, p) in parts.iter().enumerate() {
        match raw_range(p) {
            Some((_, _, len)) => {
                out.push(crate::buffer::try_with_capacity(&p.ctx(), "a copy", len)?);
                raw_len[i] = Some(len as usize);
            }
            None => out.push(Vec::new()),
        }
    }
    let targets = parts
        .iter()
        .zip(out.iter_mut())
        .enumerate()
        .filter_map(|(part, (p, dst))| {
            let (store, offset, len) = raw_range(p)?;
            Some(Target {
                part,
                crc: crc32_of(p).is_some(),
                name: &p.object.name,
                store,
                offset,
                buf: &mut dst.spare_capacity_mut()[..len as usize],
            })
        })
        .collect();
    let copied_crcs = copy_raw(targets, threads, chunk)?;
    // A part whose check is a CRC-32 was hashed as it was copied, piece by
    // piece while each was fresh, on the copying threads: what is left is
    // the few bytes of its range outside the part (an npy header). A match
    // passes the check; a mismatch leaves it to run in full below, which
    // reports it.
    for (part, copied) in copied_crcs {
        if crc_matches(&parts[part], copied)? {
            if let Some(check) = parts[part].lazy_check() {
                check.passed();
            }
        }
    }
    for (dst, len) in out.iter_mut().zip(&raw_len) {
        if let Some(len) = *len {
            // SAFETY: `copy_raw` returned Ok, so every byte of the first
            // `len` of this destination's capacity (which is at least `len`)
            // was written by `Store::read_into_uninit`.
            unsafe { dst.set_len(len) };
        }
    }
    for (i, p) in parts.iter().enumerate() {
        if raw_len[i].is_none() {
            out[i] = crate::buffer::try_own(&p.ctx(), "a copy", p.bytes()?)?;
        }
    }
    // The other lazy checks run after the copy, over the bytes it just
    // brought into the page cache, and before any copy is returned: fresh
    // memory that nobody sees until then. Run first, on a cold file, they
    // read it through the mapping's faults and the copy read it again.
    guard_all(parts)?;
    Ok(out)
}

/// Every part's C-order elements ([`PartRef::bytes`]) written into memory
/// the caller already has (`dests[i]` for `parts[i]`, each exactly that
/// many bytes): what `load_into` a model's own tensors reads through. Raw
/// parts are `pread` (or copied out of the mapping) straight into their
/// destinations, in file order on the threads [`threads_for`] their size
/// warrants, as [`owned_bytes_of`] copies them; decoded, strided and remote
/// parts are read one by one, then copied. Every size is checked and every
/// lazy check run before a byte is written; on a read error later,
/// destinations already written keep their new bytes.
pub fn copy_into(parts: &[PartRef<'_>], dests: &mut [&mut [u8]]) -> Result<()> {
    copy_into_with(parts, dests, None, CHUNK)
}

/// [`copy_into`] with the thread count (`None`: [`threads_for`]) and claim
/// size given.
pub(crate) fn copy_into_with(
    parts: &[PartRef<'_>],
    dests: &mut [&mut [u8]],
    threads: Option<usize>,
    chunk: usize,
) -> Result<()> {
    if parts.len() != dests.len() {
        return Err(Error::unsupported(
            Default::default(),
            Rule::ACCESS_DESTINATION,
            format!("{} destinations for {} tensors", dests.len(), parts.len()),
        ));
    }
    for (p, dst) in parts.iter().zip(dests.iter()) {
        let want = elements_len(p)?;
        if dst.len() as u64 != want {
            return Err(Error::unsupported(
                p.ctx(),
                Rule::ACCESS_DESTINATION,
                format!(
                    "the destination holds {} bytes, the tensor's elements {want}",
                    dst.len()
                ),
            ));
        }
    }
    guard_all(parts)?;
    let mut targets = Vec::new();
    let mut rest = Vec::new();
    for (p, dst) in parts.iter().zip(dests.iter_mut()) {
        match raw_range(p) {
            Some((store, offset, _)) => targets.push(Target {
                part: targets.len() + rest.len(),
                crc: false,
                name: &p.object.name,
                store,
                offset,
                buf: as_uninit(dst),
            }),
            None => rest.push((p, dst)),
        }
    }
    let total = targets.iter().map(|t| t.buf.len() as u64).sum();
    copy_raw(
        targets,
        threads.unwrap_or_else(|| threads_for(total)),
        chunk,
    )?;
    for (p, dst) in rest {
        dst.copy_from_slice(&p.bytes()?);
    }
    Ok(())
}

/// The length of a part's C-order elements, known without reading them:
/// the stored length of a raw part, the materialized length of a strided
/// one, the declared decoded length of an encoded one.
fn elements_len(p: &PartRef<'_>) -> Result<u64> {
    if p.is_contiguous() {
        return Ok(p.nbytes());
    }
    let size = p.dtype().size().unwrap_or(1) as usize;
    crate::part::materialized_len(&p.ctx(), p.shape(), size)
}

/// The CRC-32 range of a raw part's lazy check, when the check is one, has
/// not run, and covers the part's bytes (see `Check::crc32`).
fn crc32_of(p: &PartRef<'_>) -> Option<Crc32Range> {
    let (_, offset, len) = raw_range(p)?;
    let range = p.lazy_check()?.pending_crc32()?;
    let covers = range.offset <= offset && offset + len <= range.offset.saturating_add(range.len);
    covers.then_some(range)
}

/// Whether the CRC-32 of the part's check range matches, given `copied`,
/// the hash of the part's own bytes as they were copied: the bytes of the
/// range before and after the part are read and hashed around it.
fn crc_matches(p: &PartRef<'_>, copied: crc32fast::Hasher) -> Result<bool> {
    let (Some(range), Some((store, offset, len))) = (crc32_of(p), raw_range(p)) else {
        return Ok(false);
    };
    let end = offset + len;
    let mut whole = crc32fast::Hasher::new();
    whole.update(&store.read(range.offset, offset - range.offset)?);
    whole.combine(&copied);
    whole.update(&store.read(end, range.offset + range.len - end)?);
    Ok(whole.finalize() == range.crc)
}

/// Run every lazy check (an npz member's CRC): bytes that fail one are
/// never handed out (`copy_into` runs them before writing a byte of the
/// caller's memory).
fn guard_all(parts: &[PartRef<'_>]) -> Result<()> {
    parts.iter().try_for_each(PartRef::guard)
}

/// Initialised memory seen as memory to be written.
fn as_uninit(buf: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and the only writer
    // of the result (`Store::read_into_uninit`) writes initialised bytes, so
    // `buf` never holds uninitialised memory afterwards.
    unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) }
}

/// One destination of a raw copy: `buf.len()` bytes of `store` from
/// `offset`, for the tensor `name` (which its errors name).
struct Target<'s, 'b> {
    /// The index of its part in the caller's list.
    part: usize,
    /// Hash the bytes as they are copied (the part's check is a CRC-32
    /// over a range that holds them: see [`crc32_of`]).
    crc: bool,
    name: &'s str,
    store: &'s Store,
    offset: u64,
    buf: &'b mut [MaybeUninit<u8>],
}

/// Before the copy reads each store's ranges in order, drop the pages its
/// structure walk left cached among them (see
/// [`crate::readahead::drop_stray_walk_pages`]). `targets` are sorted by
/// file and offset, so each store's come together, in offset order.
fn drop_stray_walk_pages(targets: &[Target<'_, '_>]) {
    for same_store in targets.chunk_by(|a, b| std::ptr::eq(a.store, b.store)) {
        let ranges: Vec<(u64, u64)> = same_store
            .iter()
            .map(|t| (t.offset, t.offset + t.buf.len() as u64))
            .collect();
        crate::readahead::drop_stray_walk_pages(same_store[0].store, &ranges);
    }
}

/// Copy every target's range into its buffer, in file order, on `threads`
/// threads. Returns, for each target with `crc` set, its part and the
/// CRC-32 state of its bytes (hashed piece by piece as each was copied,
/// by the thread that copied it, then combined in order).
fn copy_raw(
    mut targets: Vec<Target<'_, '_>>,
    threads: usize,
    chunk: usize,
) -> Result<Vec<(usize, crc32fast::Hasher)>> {
    let chunk = chunk.max(1);
    targets.sort_by(|a, b| (a.store.path(), a.offset).cmp(&(b.store.path(), b.offset)));
    drop_stray_walk_pages(&targets);
    // Each mapped store's file reopened once for the whole copy.
    let mut files: Vec<(*const Store, Option<File>)> = Vec::new();
    for t in &targets {
        if !files.iter().any(|(s, _)| std::ptr::eq(*s, t.store)) {
            files.push((t.store as *const Store, t.store.reopen()));
        }
    }
    let file_of = |store: &Store| {
        files
            .iter()
            .find(|(s, _)| std::ptr::eq(*s, store))
            .and_then(|(_, f)| f.as_ref())
    };
    // Claims of about `chunk` bytes: large parts split, small ones grouped.
    let mut claims: Vec<Vec<Piece<'_, '_>>> = Vec::new();
    let (mut claim, mut size) = (Vec::new(), 0usize);
    // Each hashed target's part and the slots of its pieces' hashes.
    let mut hashed: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    let mut slots = 0usize;
    for Target {
        part,
        crc,
        name,
        store,
        offset,
        buf,
    } in targets
    {
        let first_slot = slots;
        let mut at = offset;
        let mut rest = buf;
        while !rest.is_empty() {
            let n = crate::store::read_piece_len(at, rest.len() as u64, chunk as u64) as usize;
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            claim.push(Piece {
                name,
                crc: crc.then(|| {
                    slots += 1;
                    slots - 1
                }),
                store,
                file: file_of(store),
                offset: at,
                buf: piece,
            });
            at += n as u64;
            size += n;
            if size >= chunk {
                claims.push(std::mem::take(&mut claim));
                size = 0;
            }
        }
        if crc {
            hashed.push((part, first_slot..slots));
        }
    }
    let piece_crcs: Vec<OnceLock<crc32fast::Hasher>> =
        (0..slots).map(|_| OnceLock::new()).collect();
    if !claim.is_empty() {
        claims.push(claim);
    }
    let threads = threads.clamp(1, claims.len().max(1));
    let queue = Mutex::new(claims.into_iter().enumerate());
    let stop = AtomicBool::new(false);
    // The error of the earliest claim that failed (file order), so the one
    // reported does not depend on which thread got there first.
    let failed: Mutex<Option<(usize, Error)>> = Mutex::new(None);
    let work = || {
        while !stop.load(Ordering::Relaxed) {
            let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
            let Some((index, claim)) = next else { return };
            for piece in claim {
                if let Err(e) =
                    piece
                        .store
                        .read_into_uninit(piece.file, piece.offset, &mut *piece.buf)
                {
                    let e = e.in_tensor(piece.name);
                    stop.store(true, Ordering::Relaxed);
                    let mut slot = failed.lock().unwrap_or_else(|e| e.into_inner());
                    if slot.as_ref().is_none_or(|(first, _)| index < *first) {
                        *slot = Some((index, e));
                    }
                    return;
                }
                if let Some(slot) = piece.crc {
                    // SAFETY: `read_into_uninit` returned Ok, so every byte
                    // of the piece was written; `MaybeUninit<u8>` has the
                    // layout of `u8`.
                    let bytes =
                        unsafe { &*(&*piece.buf as *const [MaybeUninit<u8>] as *const [u8]) };
                    let mut hasher = crc32fast::Hasher::new();
                    hasher.update(bytes);
                    let _ = piece_crcs[slot].set(hasher);
                }
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            // A thread that cannot be started leaves its share to the others.
            let _ = std::thread::Builder::new()
                .name("zt-copy".into())
                .spawn_scoped(s, work);
        }
        work();
    });
    if let Some((_, e)) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let mut piece_crcs: Vec<Option<crc32fast::Hasher>> =
        piece_crcs.into_iter().map(OnceLock::into_inner).collect();
    Ok(hashed
        .into_iter()
        .map(|(part, pieces)| {
            let mut whole = crc32fast::Hasher::new();
            for piece in &mut piece_crcs[pieces] {
                // Every piece was copied (no error), so every slot is set.
                whole.combine(&piece.take().unwrap_or_default());
            }
            (part, whole)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Crc32Range;
    use crate::source::{CountedCheck, Source};
    use std::io::Write;
    use std::sync::Arc;

    /// A file of `len` patterned bytes and a source whose u8 tensors are
    /// `ranges` of it, mapped or positional.
    fn source(len: usize, ranges: &[(u64, u64)], map: bool) -> (tempfile::NamedTempFile, Source) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        f.write_all(&bytes).unwrap();
        f.flush().unwrap();
        let store = Arc::new(if map {
            Store::open(f.path()).unwrap()
        } else {
            Store::open_positional(f.path()).unwrap()
        });
        let src = Source::of_ranges(store, ranges);
        (f, src)
    }

    fn parts(src: &Source) -> Vec<PartRef<'_>> {
        (0..src.len())
            .map(|i| src.tensor_at(i).unwrap().data().unwrap())
            .collect()
    }

    #[test]
    fn every_split_copies_the_file_exactly() {
        // Out of file order, one empty, one straddling many claims.
        let ranges = [(5000, 3000), (0, 17), (17, 0), (100, 4000), (8000, 1)];
        for map in [true, false] {
            let (f, src) = source(9000, &ranges, map);
            let file = std::fs::read(f.path()).unwrap();
            for (threads, chunk) in [(1, CHUNK), (1, 64), (2, 64), (4, 333), (3, 1)] {
                let got = copy_parts(&parts(&src), threads, chunk).unwrap();
                for (&(o, l), bytes) in ranges.iter().zip(&got) {
                    assert_eq!(bytes[..], file[o as usize..(o + l) as usize]);
                }
            }
        }
    }

    #[test]
    fn a_file_that_shrank_is_an_error_not_garbage() {
        let (f, src) = source(4096, &[(0, 1000), (1000, 3000)], false);
        f.as_file().set_len(2000).unwrap();
        for threads in [1, 2] {
            let e = copy_parts(&parts(&src), threads, 256).unwrap_err();
            assert!(matches!(e, Error::Truncated { .. }), "{e}");
            // The first tensor past the new end, named, whichever thread saw it.
            assert!(e.to_string().contains("tensor \"t1\""), "{e}");
        }
    }

    #[test]
    fn a_mapped_file_is_read_positionally_and_shrinking_is_an_error() {
        let (f, src) = source(4096, &[(0, 1000), (1000, 3000)], true);
        let store = match src.tensor_at(0).unwrap().data().unwrap().payload() {
            Payload::Stored { store, .. } => store.clone(),
            Payload::Decoded { .. } => unreachable!(),
        };
        assert!(store.reopen().is_some());
        // Through the mapping this would be SIGBUS; with pread, an error.
        f.as_file().set_len(2000).unwrap();
        let e = copy_parts(&parts(&src), 2, 256).unwrap_err();
        assert!(matches!(e, Error::Truncated { .. }), "{e}");
    }

    #[test]
    fn a_renamed_over_file_is_copied_from_the_file_opened() {
        let (f, src) = source(5000, &[(0, 5000)], true);
        let want = std::fs::read(f.path()).unwrap();
        // Another file now has the path: its bytes must not be read.
        let other = tempfile::NamedTempFile::new_in(f.path().parent().unwrap()).unwrap();
        std::fs::write(other.path(), vec![0u8; 5000]).unwrap();
        std::fs::rename(other.path(), f.path()).unwrap();
        let store = match src.tensor_at(0).unwrap().data().unwrap().payload() {
            Payload::Stored { store, .. } => store.clone(),
            Payload::Decoded { .. } => unreachable!(),
        };
        // The store's own descriptor, duplicated: the file it opened.
        assert!(store.reopen().is_some());
        assert_eq!(copy_parts(&parts(&src), 2, 333).unwrap()[0], want);
    }

    #[test]
    fn copy_into_fills_every_destination_exactly() {
        let ranges = [(5000, 3000), (0, 17), (17, 0), (100, 4000), (8000, 1)];
        for map in [true, false] {
            let (f, src) = source(9000, &ranges, map);
            let file = std::fs::read(f.path()).unwrap();
            for (threads, chunk) in [(1, CHUNK), (2, 64), (4, 333), (3, 1)] {
                let mut dests: Vec<Vec<u8>> = ranges
                    .iter()
                    .map(|&(_, l)| vec![0xAA; l as usize])
                    .collect();
                let mut views: Vec<&mut [u8]> = dests.iter_mut().map(Vec::as_mut_slice).collect();
                copy_into_with(&parts(&src), &mut views, Some(threads), chunk).unwrap();
                for (&(o, l), bytes) in ranges.iter().zip(&dests) {
                    assert_eq!(bytes[..], file[o as usize..(o + l) as usize]);
                }
            }
        }
    }

    #[test]
    fn a_destination_of_the_wrong_size_is_refused_before_anything_is_written() {
        let (_f, src) = source(4096, &[(0, 1000), (1000, 3000)], true);
        let (mut first, mut second) = (vec![0xAA; 1000], vec![0xAA; 2999]);
        let mut views = [first.as_mut_slice(), second.as_mut_slice()];
        let e = copy_into(&parts(&src), &mut views).unwrap_err();
        assert_eq!(e.rule(), Some(Rule::ACCESS_DESTINATION), "{e}");
        assert!(e.to_string().contains("tensor \"t1\""), "{e}");
        assert!(e.to_string().contains("holds 2999 bytes"), "{e}");
        assert!(first.iter().all(|&b| b == 0xAA), "nothing is written");
        // One destination short of the tensors is refused too.
        let e = copy_into(&parts(&src), &mut [first.as_mut_slice()]).unwrap_err();
        assert_eq!(e.rule(), Some(Rule::ACCESS_DESTINATION), "{e}");
    }

    #[test]
    fn small_loads_stay_on_one_thread() {
        assert_eq!(threads_for(0), 1);
        assert_eq!(threads_for(THREAD_BYTES - 1), 1);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(threads_for(2 * THREAD_BYTES), cores.min(2));
    }

    /// A source over `ranges` of a patterned file, each tensor carrying a
    /// counted check (failing where `fails` says), and those checks.
    fn checked(
        ranges: &[(u64, u64)],
        fails: &[bool],
    ) -> (tempfile::NamedTempFile, Source, Vec<Arc<CountedCheck>>) {
        let (f, _) = source(9000, &[], true);
        let store = Arc::new(Store::open(f.path()).unwrap());
        let checks = CountedCheck::many(fails);
        let src = Source::of_checked_ranges(store, ranges, &checks);
        (f, src, checks)
    }

    #[test]
    fn a_copy_runs_every_check_once_and_returns_nothing_when_one_fails() {
        // Out of file order, one empty, one straddling many claims.
        let ranges = [(5000, 3000), (0, 17), (17, 0), (100, 4000)];
        for (threads, chunk) in [(1, CHUNK), (2, 64), (3, 1)] {
            let (f, src, counted) = checked(&ranges, &[false; 4]);
            let file = std::fs::read(f.path()).unwrap();
            let got = copy_parts(&parts(&src), threads, chunk).unwrap();
            for (&(o, l), bytes) in ranges.iter().zip(&got) {
                assert_eq!(bytes[..], file[o as usize..(o + l) as usize]);
            }
            assert!(counted.iter().all(|c| c.runs() == 1));

            let (_f, src, counted) = checked(&ranges, &[false, false, false, true]);
            let e = copy_parts(&parts(&src), threads, chunk).unwrap_err();
            assert!(matches!(e, Error::Integrity { .. }), "{e}");
            assert!(e.to_string().contains("tensor \"t3\""), "{e}");
            assert!(counted.iter().all(|c| c.runs() == 1));

            // Into the caller's memory, a failing check is run before a
            // byte is written.
            let mut dests: Vec<Vec<u8>> = ranges
                .iter()
                .map(|&(_, l)| vec![0xAA; l as usize])
                .collect();
            let mut views: Vec<&mut [u8]> = dests.iter_mut().map(|d| d.as_mut_slice()).collect();
            let e = copy_into_with(&parts(&src), &mut views, Some(threads), chunk).unwrap_err();
            assert!(matches!(e, Error::Integrity { .. }), "{e}");
            assert!(
                dests.iter().flatten().all(|&b| b == 0xAA),
                "nothing is written"
            );
        }
    }

    #[test]
    fn a_crc32_check_is_settled_by_the_bytes_copied() {
        let (f, _) = source(9000, &[], true);
        let file = std::fs::read(f.path()).unwrap();
        let crc = |o: usize, l: usize| crc32fast::hash(&file[o..o + l]);
        let store = Arc::new(Store::open(f.path()).unwrap());
        // t0's check covers 10 bytes before and 20 after it; t1's is its
        // own bytes with a wrong CRC; t2 is empty, its range around it.
        let ranges = [(100, 5000), (6000, 2000), (8500, 0)];
        let checks = vec![
            CountedCheck::crc32(
                Crc32Range {
                    offset: 90,
                    len: 5030,
                    crc: crc(90, 5030),
                },
                false,
            ),
            CountedCheck::crc32(
                Crc32Range {
                    offset: 6000,
                    len: 2000,
                    crc: !crc(6000, 2000),
                },
                true,
            ),
            CountedCheck::crc32(
                Crc32Range {
                    offset: 8490,
                    len: 20,
                    crc: crc(8490, 20),
                },
                false,
            ),
        ];
        for (threads, chunk) in [(1, CHUNK), (2, 64), (3, 333)] {
            let src = Source::of_checked_ranges(store.clone(), &ranges, &checks);
            let runs_before: Vec<usize> = checks.iter().map(|c| c.runs()).collect();
            let runs = |i: usize| checks[i].runs() - runs_before[i];
            // A mismatch runs the check in full, whose failure is reported;
            // the matches never run it.
            let e = copy_parts(&parts(&src), threads, chunk).unwrap_err();
            assert!(matches!(e, Error::Integrity { .. }), "{e}");
            assert!(e.to_string().contains("tensor \"t1\""), "{e}");
            assert_eq!((runs(0), runs(1), runs(2)), (0, 1, 0));
            // Their outcome is kept: reads pass without running them.
            for name in ["t0", "t2"] {
                src.tensor(name).unwrap().data().unwrap().bytes().unwrap();
            }
            assert_eq!((runs(0), runs(2)), (0, 0));
            // Copied alone, t0 and t2 come back whole.
            let src = Source::of_checked_ranges(store.clone(), &[(100, 5000)], &checks[..1]);
            let got = copy_parts(&parts(&src), threads, chunk).unwrap();
            assert_eq!(got[0][..], file[100..5100]);
        }
    }
}
