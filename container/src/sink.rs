//! Positional, buffered writing of a blob heap: small pieces are gathered
//! into one buffer, large ones go to the kernel straight from the caller's
//! memory (through a buffer they would be copied twice), and gaps of a page
//! or more are skipped, leaving holes that read as zeros: canonical
//! placement pads 10 KiB tensors to 64 KiB, and writing those zeros made 6x
//! the payload in dirty pages for the kernel to flush.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Pieces at least this long bypass the buffer.
const DIRECT: usize = 256 << 10;
/// The buffer is written out when it reaches this size.
const BUFFER: usize = 1 << 20;
/// Gaps shorter than this are written as zeros (a hole costs a syscall).
const HOLE: u64 = 4096;

pub(crate) struct Sink<'f> {
    file: &'f File,
    /// Bytes not yet written, which belong at `start`.
    buf: Vec<u8>,
    start: u64,
}

impl<'f> Sink<'f> {
    /// Write into `file` from offset `at` on.
    pub(crate) fn new(file: &'f File, at: u64) -> Self {
        Sink {
            file,
            buf: Vec::with_capacity(BUFFER),
            start: at,
        }
    }

    /// The offset the next byte goes to.
    pub(crate) fn position(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Append `bytes` at the current position.
    pub(crate) fn put(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if bytes.len() >= DIRECT {
            self.flush()?;
            self.file.write_all_at(bytes, self.start)?;
            self.start += bytes.len() as u64;
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
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_land_at_their_offsets_and_gaps_read_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("heap");
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let big: Vec<u8> = (0..DIRECT + 5).map(|i| i as u8).collect();
        let mut sink = Sink::new(&file, 8);
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
    }
}
