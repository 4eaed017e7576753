//! Positional, gathered writing of a blob heap: small pieces are not
//! copied but collected as a list of slices of the caller's memory and
//! written together by one `pwritev` (copying 10 KiB tensors into a buffer
//! first was 10% of a small-tensor write), large ones go to the kernel on
//! their own, and gaps of a page or more are skipped, leaving holes that
//! read as zeros: canonical placement pads 10 KiB tensors to 64 KiB, and
//! writing those zeros made 6x the payload in dirty pages for the kernel
//! to flush.
//!
//! [`FileHash`] is the digest of the whole file as it is written, for a
//! shard whose root's table records it (spec §7.1): the file is never
//! read back to hash it.

use std::fs::File;
use std::io::IoSlice;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

use zt_core::catalog::Digest;

/// Zeros to hash a gap from.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The XXH3-64 digest of a whole file written front to back: every byte
/// fed in file order as it is written, a gap (a hole, or padding) as the
/// zeros it reads as. Cloned to set a state aside (a streamed part that
/// may be cut back off the file).
#[derive(Clone)]
pub(crate) struct FileHash {
    state: crate::xxh3::Xxh3,
    /// The offset of the next byte to hash.
    at: u64,
}

impl std::fmt::Debug for FileHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileHash").field("at", &self.at).finish()
    }
}

impl FileHash {
    pub(crate) fn new() -> FileHash {
        FileHash {
            state: crate::xxh3::Xxh3::new(),
            at: 0,
        }
    }

    /// `bytes` written at `offset`, at or past every byte hashed so far
    /// (what lies between reads as zeros).
    pub(crate) fn update_at(&mut self, offset: u64, bytes: &[u8]) {
        let mut gap = offset
            .checked_sub(self.at)
            .expect("a file is hashed front to back");
        while gap > 0 {
            let n = gap.min(ZEROS.len() as u64) as usize;
            self.state.update(&ZEROS[..n]);
            gap -= n as u64;
        }
        self.state.update(bytes);
        self.at = offset + bytes.len() as u64;
    }

    /// The digest of a file of `len` bytes whose last bytes were hashed
    /// (nothing past them: the file ends where the hashing did).
    pub(crate) fn digest(&self, len: u64) -> Digest {
        assert_eq!(self.at, len, "the whole file was hashed");
        Digest::Xxh3(self.state.digest())
    }
}

/// Pieces at least this long are written on their own.
const DIRECT: usize = 256 << 10;
/// Gathered pieces are written out when they add up to this many bytes.
const BUFFER: usize = 1 << 20;
/// ... or when there are this many of them (Linux's `IOV_MAX`).
const MAX_PIECES: usize = 1024;
/// Gaps shorter than this are written as zeros (a hole costs a syscall).
const HOLE: u64 = 4096;
// A durable write starts the device on every `WRITEBACK_STEP` bytes
// written (see `Sink::write_back_early`), as every buffered writer does.
use zt_core::publish::WRITEBACK_STEP;

/// One gathered piece: the caller's bytes (or static zeros), or bytes the
/// sink copied because the caller could not keep them (`put_copy`).
enum Piece<'d> {
    Borrowed(&'d [u8]),
    Copied(Range<usize>),
}

/// Writes a heap front to back at increasing offsets. `'d` is how long the
/// bytes handed to [`Sink::put`] live: at least until the next flush.
pub(crate) struct Sink<'f, 'd> {
    file: &'f File,
    /// Bytes not yet written, in order, which belong at `start`.
    pieces: Vec<Piece<'d>>,
    /// Their total length.
    pending: usize,
    /// The bytes of the `Copied` pieces.
    copied: Vec<u8>,
    start: u64,
    /// The whole-file digest, fed as bytes are put, when asked for.
    hash: Option<FileHash>,
    /// With early writeback: the offset up to which writeback was started.
    written_back: Option<u64>,
}

impl<'f, 'd> Sink<'f, 'd> {
    /// Write into `file` from offset `at` on, feeding `hash` (the digest
    /// of what precedes `at`) with every byte put, when given.
    pub(crate) fn new(file: &'f File, at: u64, hash: Option<FileHash>) -> Self {
        Sink {
            file,
            pieces: Vec::with_capacity(MAX_PIECES),
            pending: 0,
            copied: Vec::new(),
            start: at,
            hash,
            written_back: None,
        }
    }

    /// Start the device writing what has been written every
    /// [`WRITEBACK_STEP`] bytes, for a file that is fsynced when complete:
    /// the fsync then waits for the last step, not the whole file, and the
    /// device works while the rest is copied in.
    pub(crate) fn write_back_early(mut self) -> Self {
        self.written_back = Some(self.start);
        self
    }

    /// The whole-file digest so far (of every byte put), if kept.
    pub(crate) fn take_hash(&mut self) -> Option<FileHash> {
        self.hash.take()
    }

    /// The offset the next byte goes to.
    pub(crate) fn position(&self) -> u64 {
        self.start + self.pending as u64
    }

    /// Append `bytes` at the current position; they are read when the
    /// gathered pieces are written, so they must live that long.
    pub(crate) fn put(&mut self, bytes: &'d [u8]) -> std::io::Result<()> {
        self.hash_at_position(bytes);
        if bytes.len() >= DIRECT {
            return self.write_alone(bytes);
        }
        self.gather(Piece::Borrowed(bytes), bytes.len())
    }

    /// Append a copy of `bytes`, which the caller is about to drop.
    pub(crate) fn put_copy(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash_at_position(bytes);
        if bytes.len() >= DIRECT {
            return self.write_alone(bytes);
        }
        let at = self.copied.len();
        self.copied.extend_from_slice(bytes);
        self.gather(Piece::Copied(at..self.copied.len()), bytes.len())
    }

    /// Write `bytes` on their own, after what is gathered.
    fn write_alone(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.flush()?;
        self.file.write_all_at(bytes, self.start)?;
        self.start += bytes.len() as u64;
        self.maybe_write_back();
        Ok(())
    }

    fn hash_at_position(&mut self, bytes: &[u8]) {
        let at = self.position();
        if let Some(h) = &mut self.hash {
            h.update_at(at, bytes);
        }
    }

    fn gather(&mut self, piece: Piece<'d>, len: usize) -> std::io::Result<()> {
        self.pieces.push(piece);
        self.pending += len;
        if self.pending >= BUFFER || self.pieces.len() >= MAX_PIECES {
            self.flush()?;
        }
        Ok(())
    }

    /// Move forward to `offset` (never backwards), zero-filled.
    pub(crate) fn skip_to(&mut self, offset: u64) -> std::io::Result<()> {
        let gap = offset
            .checked_sub(self.position())
            .expect("the heap only moves forward");
        if gap == 0 {
            return Ok(());
        }
        if gap < HOLE {
            return self.gather(Piece::Borrowed(&ZEROS[..gap as usize]), gap as usize);
        }
        self.flush()?;
        self.start = offset;
        Ok(())
    }

    /// Write out what is gathered.
    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        if self.pieces.is_empty() {
            return Ok(());
        }
        let copied = &self.copied;
        let mut slices: Vec<IoSlice<'_>> = self
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Borrowed(b) => IoSlice::new(b),
                Piece::Copied(r) => IoSlice::new(&copied[r.clone()]),
            })
            .collect();
        write_all_vectored_at(self.file, &mut slices, self.start)?;
        self.start += self.pending as u64;
        self.pieces.clear();
        self.copied.clear();
        self.pending = 0;
        self.maybe_write_back();
        Ok(())
    }

    /// Start writeback of what was written since the last step, once that
    /// is a step or more (holes skipped over are free to include).
    fn maybe_write_back(&mut self) {
        if let Some(from) = self.written_back {
            if self.start - from >= WRITEBACK_STEP {
                zt_core::publish::start_writeback_range(self.file, from, self.start - from);
                self.written_back = Some(self.start);
            }
        }
    }
}

/// Write every byte of `slices`, in order, at `offset` of `file`
/// (`pwritev`, repeated after a short write or an interruption).
fn write_all_vectored_at(
    file: &File,
    mut slices: &mut [IoSlice<'_>],
    mut offset: u64,
) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0); // skip leading empty slices
    while !slices.is_empty() {
        let count = slices.len().min(MAX_PIECES) as libc::c_int;
        let at = libc::off_t::try_from(offset)
            .map_err(|_| std::io::Error::other("file offset past off_t"))?;
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix; the
        // slices are valid for reads for the whole call.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                slices.as_ptr().cast::<libc::iovec>(),
                count,
                at,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        offset += n as u64;
        IoSlice::advance_slices(&mut slices, n as usize);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heap_file(dir: &tempfile::TempDir) -> (std::path::PathBuf, File) {
        let path = dir.path().join("heap");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        (path, file)
    }

    #[test]
    fn pieces_land_at_their_offsets_and_gaps_read_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = heap_file(&dir);
        let big: Vec<u8> = (0..DIRECT + 5).map(|i| i as u8).collect();
        let mut sink = Sink::new(&file, 8, Some(FileHash::new()));
        sink.put(b"abc").unwrap();
        sink.skip_to(100).unwrap(); // small gap: gathered zeros
        sink.put(&big).unwrap(); // direct, after flushing "abc" + zeros
        sink.skip_to(100 + big.len() as u64 + 10_000).unwrap(); // a hole
        sink.put(b"xyz").unwrap();
        let end = sink.position();
        sink.flush().unwrap();
        file.set_len(end).unwrap();
        let got = std::fs::read(&path).unwrap();
        let mut want = vec![0u8; end as usize];
        want[8..11].copy_from_slice(b"abc");
        want[100..100 + big.len()].copy_from_slice(&big);
        want[end as usize - 3..].copy_from_slice(b"xyz");
        assert_eq!(got, want);
        // The digest kept while writing is the file's: the first 8 bytes
        // (zeros here) and every gap hashed as the zeros they read as.
        let hash = sink.take_hash().unwrap();
        assert_eq!(
            hash.digest(end),
            Digest::Xxh3(xxhash_rust::xxh3::xxh3_64(&got))
        );
    }

    #[test]
    fn many_gathered_pieces_borrowed_and_copied_land_in_order() {
        // More pieces than one `pwritev` takes, some copied (their source
        // dropped at once), small gaps between some: the file is the pieces
        // at their offsets, and the digest is the file's.
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = heap_file(&dir);
        let borrowed: Vec<Vec<u8>> = (0..3 * MAX_PIECES)
            .map(|i| (0..i % 700).map(|j| (i * 31 + j) as u8).collect())
            .collect();
        let mut want = vec![0u8; 8];
        let mut sink = Sink::new(&file, 8, Some(FileHash::new()));
        for (i, piece) in borrowed.iter().enumerate() {
            if i % 5 == 0 {
                let gap = (i % 3 * 100) as u64;
                sink.skip_to(sink.position() + gap).unwrap();
                want.resize(want.len() + gap as usize, 0);
            }
            if i % 4 == 0 {
                let transient = piece.clone();
                sink.put_copy(&transient).unwrap();
            } else {
                sink.put(piece).unwrap();
            }
            want.extend_from_slice(piece);
        }
        let end = sink.position();
        sink.flush().unwrap();
        assert_eq!(end, want.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), want);
        assert_eq!(
            sink.take_hash().unwrap().digest(end),
            Digest::Xxh3(xxhash_rust::xxh3::xxh3_64(&want))
        );
    }

    #[test]
    fn early_writeback_starts_every_step_and_leaves_the_bytes_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (path, file) = heap_file(&dir);
        let piece: Vec<u8> = (0..BUFFER / 3).map(|i| (i % 251) as u8).collect();
        let mut sink = Sink::new(&file, 0, None).write_back_early();
        let mut want = Vec::new();
        // Two steps are started within three steps' bytes (the buffer holds
        // back at most one BUFFER), each at what had reached the file.
        while sink.written_back.unwrap() < 2 * WRITEBACK_STEP {
            assert!((want.len() as u64) < 3 * WRITEBACK_STEP, "no writeback");
            sink.put(&piece).unwrap();
            want.extend_from_slice(&piece);
            assert!(sink.written_back.unwrap() <= sink.start);
        }
        sink.flush().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }
}
