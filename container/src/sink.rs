//! Positional, buffered writing of a blob heap: small pieces are gathered
//! into one buffer, large ones go to the kernel straight from the caller's
//! memory (through a buffer they would be copied twice), and gaps of a page
//! or more are skipped, leaving holes that read as zeros: canonical
//! placement pads 10 KiB tensors to 64 KiB, and writing those zeros made 6x
//! the payload in dirty pages for the kernel to flush.
//!
//! [`FileHash`] is the digest of the whole file as it is written, for a
//! shard whose root's table records it (spec §7.1): the file is never
//! read back to hash it.

use std::fs::File;
use std::os::unix::fs::FileExt;

use zt_core::catalog::Digest;

/// Zeros to hash a gap from.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The XXH3-64 digest of a whole file written front to back: every byte
/// fed in file order as it is written, a gap (a hole, or padding) as the
/// zeros it reads as. Boxed: `Xxh3` is 64-byte aligned, and a writer held
/// inline by a Python object (whose allocator aligns to 16) would
/// otherwise sit misaligned. Cloned to set a state aside (a streamed part
/// that may be cut back off the file).
#[derive(Clone)]
pub(crate) struct FileHash {
    state: Box<xxhash_rust::xxh3::Xxh3>,
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
            state: Box::new(xxhash_rust::xxh3::Xxh3::new()),
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

/// Pieces at least this long bypass the buffer.
const DIRECT: usize = 256 << 10;
/// The buffer is written out when it reaches this size.
const BUFFER: usize = 1 << 20;
/// Gaps shorter than this are written as zeros (a hole costs a syscall).
const HOLE: u64 = 4096;
/// A durable write starts the device on every this many bytes written (see
/// [`Sink::write_back_early`]).
const WRITEBACK_STEP: u64 = 8 << 20;

pub(crate) struct Sink<'f> {
    file: &'f File,
    /// Bytes not yet written, which belong at `start`.
    buf: Vec<u8>,
    start: u64,
    /// The whole-file digest, fed as bytes are put, when asked for.
    hash: Option<FileHash>,
    /// With early writeback: the offset up to which writeback was started.
    written_back: Option<u64>,
}

impl<'f> Sink<'f> {
    /// Write into `file` from offset `at` on, feeding `hash` (the digest
    /// of what precedes `at`) with every byte put, when given.
    pub(crate) fn new(file: &'f File, at: u64, hash: Option<FileHash>) -> Self {
        Sink {
            file,
            buf: Vec::with_capacity(BUFFER),
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
        self.start + self.buf.len() as u64
    }

    /// Append `bytes` at the current position.
    pub(crate) fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if let Some(h) = &mut self.hash {
            h.update_at(self.start + self.buf.len() as u64, bytes);
        }
        if bytes.len() >= DIRECT {
            self.flush()?;
            self.file.write_all_at(bytes, self.start)?;
            self.start += bytes.len() as u64;
            self.maybe_write_back();
            return Ok(());
        }
        self.buf.extend_from_slice(bytes);
        if self.buf.len() >= BUFFER {
            self.flush()?;
        }
        Ok(())
    }

    /// Move forward to `offset` (never backwards), zero-filled.
    pub(crate) fn skip_to(&mut self, offset: u64) -> std::io::Result<()> {
        let gap = offset
            .checked_sub(self.position())
            .expect("the heap only moves forward");
        if gap < HOLE {
            self.buf.resize(self.buf.len() + gap as usize, 0);
            return Ok(());
        }
        self.flush()?;
        self.start = offset;
        Ok(())
    }

    /// Write out what is buffered.
    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.file.write_all_at(&self.buf, self.start)?;
            self.start += self.buf.len() as u64;
            self.buf.clear();
            self.maybe_write_back();
        }
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
        sink.skip_to(100).unwrap(); // small gap: zeros in the buffer
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
