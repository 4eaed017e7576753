//! A large new file written front to back with direct I/O (`O_DIRECT`),
//! for a writer whose output is far larger than what it holds.
//!
//! A buffered `write` copies every byte into the page cache, whose fresh
//! pages the kernel must first allocate and zero: on a small machine that
//! copy is most of a conversion's CPU (the profile behind issue 41: the FP8
//! to bf16 conversion spent most of its cycles there, far more than in the
//! dequantization). With `O_DIRECT` the device reads the bytes from the
//! writer's own memory; the CPU only copies them once into an aligned
//! staging buffer, reused for the whole file. `python -m
//! harness.quant_st_bench` measures the conversion; the probe comparing
//! buffered, direct and `MAP_SHARED` writes is described in
//! results/quant-safetensors.md.
//!
//! Direct I/O needs the buffer's address, the file offset and the length
//! aligned to the device's block: every full staging buffer is, and so is
//! the aligned part of the last one; the few bytes after it are written
//! buffered once `O_DIRECT` is turned off again, so the file is exactly the
//! bytes given, with no padding to truncate. A filesystem that refuses
//! `O_DIRECT` (at `fcntl`, or at the first write it cannot align) gets the
//! same bytes buffered, writeback started by steps when the file will be
//! fsynced, as [`super::WriteBehind`] does.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;

use std::path::Path;

use super::{start_writeback_range, Partial, WRITEBACK_STEP};
use crate::error::{Error, Result};

/// The alignment of every direct write's memory, offset and length: a
/// page, a multiple of every common device's logical block.
pub const ALIGN: usize = 4096;

/// The staging buffer: a multiple of [`ALIGN`], large enough that the
/// device streams, small beside any tensor worth writing this way.
pub const STAGE_BYTES: usize = 8 << 20;

/// Files smaller than this are written buffered: the page cache absorbs
/// them and keeps them warm for a reader; direct I/O pays off only when
/// the copy into it dominates.
pub const DIRECT_MIN_BYTES: u64 = 64 << 20;

/// A page-aligned heap buffer of [`STAGE_BYTES`], allocated once per file.
struct Stage {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl Stage {
    fn layout(len: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(len, ALIGN).expect("a page-aligned power of two")
    }

    fn new(len: usize) -> io::Result<Stage> {
        // SAFETY: the layout has a non-zero size. Zeroed, so the buffer is
        // initialised memory a `&mut [u8]` may cover; zeroing 8 MiB once
        // per file is nothing beside the file.
        let ptr = unsafe { std::alloc::alloc_zeroed(Self::layout(len)) };
        let ptr = std::ptr::NonNull::new(ptr).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                "the direct-write staging buffer",
            )
        })?;
        Ok(Stage { ptr, len })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes owned by this value, borrowed
        // mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

/// Turn `O_DIRECT` on or off for `file`'s open description. Whether the
/// filesystem accepted it.
fn set_direct(file: &File, on: bool) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        // SAFETY: a valid descriptor; F_GETFL/F_SETFL take no memory.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 {
                return false;
            }
            let flags = if on {
                flags | libc::O_DIRECT
            } else {
                flags & !libc::O_DIRECT
            };
            libc::fcntl(fd, libc::F_SETFL, flags) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, on);
        false
    }
}

/// Whether `O_DIRECT` can be turned on for `file` (it is left off): what
/// [`DirectWriter::new`] asks of the filesystem.
pub fn accepts_direct(file: &File) -> bool {
    set_direct(file, true) && set_direct(file, false)
}

/// [`super::publish_reading`] through a [`DirectWriter`]: the body writes
/// the file from its start into a partial beside `path`, which is then
/// committed (fsynced first when `durable`) over `path`. The file's length.
/// On any error the partial is removed and `path` is left as it was.
pub fn publish_direct(
    path: &Path,
    durable: bool,
    body: impl FnOnce(&mut DirectWriter<'_>) -> Result<()>,
) -> Result<u64> {
    let partial = Partial::create(path)?;
    let mut w = DirectWriter::new(partial.file(), durable).map_err(|e| Error::io(path, e))?;
    body(&mut w)?;
    let written = w.finish().map_err(|e| Error::io(path, e))?;
    partial.commit(durable)?;
    Ok(written)
}

/// Writes a new file from its start: bytes staged and written a staging
/// buffer at a time with `O_DIRECT` where the filesystem takes it, else
/// buffered. [`DirectWriter::finish`] writes the rest and must be called;
/// a writer dropped without it leaves the file short (its partial is then
/// discarded by its owner).
pub struct DirectWriter<'f> {
    file: &'f File,
    stage: Stage,
    /// Bytes staged, not yet written.
    filled: usize,
    /// The file offset of the stage's first byte (everything before it is
    /// written).
    at: u64,
    direct: bool,
    /// Buffered writes start writeback by steps (a file to be fsynced).
    early: bool,
    /// The offset up to which writeback was started.
    started: u64,
}

impl<'f> DirectWriter<'f> {
    /// Write `file` (empty, written from offset 0) directly where its
    /// filesystem accepts `O_DIRECT`, else buffered; `durable`: the file
    /// will be fsynced, so buffered writes start writeback as they go.
    pub fn new(file: &'f File, durable: bool) -> io::Result<Self> {
        let mut w = DirectWriter::buffered(file, durable)?;
        w.direct = set_direct(file, true);
        Ok(w)
    }

    /// [`DirectWriter::new`] that never asks for `O_DIRECT`: what a
    /// filesystem that refuses it gets.
    pub fn buffered(file: &'f File, durable: bool) -> io::Result<Self> {
        Ok(DirectWriter {
            file,
            stage: Stage::new(STAGE_BYTES)?,
            filled: 0,
            at: 0,
            direct: false,
            early: durable,
            started: 0,
        })
    }

    /// Whether writes go to the device directly (so far: a refused direct
    /// write turns it off).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Write the rest and leave the file's description as it was opened
    /// (no `O_DIRECT`). The file's length.
    pub fn finish(mut self) -> io::Result<u64> {
        let mut done = 0;
        if self.direct {
            let aligned = self.filled & !(ALIGN - 1);
            if aligned > 0 {
                self.put_stage(0, aligned)?;
            }
            done = aligned;
        }
        if self.direct && !set_direct(self.file, false) {
            return Err(io::Error::other("could not turn O_DIRECT off for the tail"));
        }
        self.direct = false;
        self.put_stage(done, self.filled)?;
        let len = self.at + self.filled as u64;
        if self.early && len > self.started {
            start_writeback_range(self.file, self.started, len - self.started);
        }
        Ok(len)
    }

    /// Stage bytes `[from, to)` written at their offset.
    fn put_stage(&mut self, from: usize, to: usize) -> io::Result<()> {
        let at = self.at + from as u64;
        let (file, direct) = (self.file, self.direct);
        let stage = self.stage.bytes();
        let direct = put(file, direct, &stage[from..to], at)?;
        self.direct = direct;
        self.wrote_to(at + (to - from) as u64);
        Ok(())
    }

    /// Writeback started by steps, for buffered writes to a durable file.
    fn wrote_to(&mut self, end: u64) {
        if self.early && !self.direct && end - self.started >= WRITEBACK_STEP {
            start_writeback_range(self.file, self.started, end - self.started);
            self.started = end;
        }
    }
}

/// `bytes` written at `at`, directly while `direct`: a direct write the
/// filesystem refuses (`EINVAL`: an alignment it needs beyond [`ALIGN`], or
/// a short write that left the offset unaligned) turns `O_DIRECT` off and
/// is written buffered. Whether writes are still direct.
fn put(file: &File, mut direct: bool, bytes: &[u8], at: u64) -> io::Result<bool> {
    let mut done = 0;
    while done < bytes.len() {
        match file.write_at(&bytes[done..], at + done as u64) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                if !set_direct(file, false) {
                    return Err(e);
                }
                direct = false;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(direct)
}

impl Write for DirectWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Buffered, a large write goes straight to the kernel from the
        // caller's memory once the stage is empty (as `BufWriter` does).
        if !self.direct && self.filled == 0 && buf.len() >= STAGE_BYTES {
            let at = self.at;
            put(self.file, false, buf, at)?;
            self.at += buf.len() as u64;
            self.wrote_to(self.at);
            return Ok(buf.len());
        }
        let n = buf.len().min(STAGE_BYTES - self.filled);
        let filled = self.filled;
        self.stage.bytes()[filled..filled + n].copy_from_slice(&buf[..n]);
        self.filled += n;
        if self.filled == STAGE_BYTES {
            self.put_stage(0, STAGE_BYTES)?;
            self.at += STAGE_BYTES as u64;
            self.filled = 0;
        }
        Ok(n)
    }

    /// Nothing: only [`DirectWriter::finish`] may write a partial stage,
    /// since a direct write must be whole blocks.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic bytes, different at every offset modulo 251.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i % 251) as u8 ^ seed.wrapping_mul(31))
            .collect()
    }

    /// `pieces` written through a writer (direct or not) into a fresh file
    /// under `dir`; the file's bytes and whether it stayed direct.
    fn write_pieces(dir: &std::path::Path, pieces: &[Vec<u8>], direct: bool) -> (Vec<u8>, bool) {
        let path = dir.join(format!("out-{direct}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let mut w = if direct {
            DirectWriter::new(&file, true).unwrap()
        } else {
            DirectWriter::buffered(&file, true).unwrap()
        };
        for p in pieces {
            w.write_all(p).unwrap();
        }
        let still = w.is_direct();
        let len = w.finish().unwrap();
        assert_eq!(len, pieces.iter().map(Vec::len).sum::<usize>() as u64);
        file.sync_all().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        (bytes, still)
    }

    /// Every length around the edges that matter (a block, the stage) and
    /// an empty file, in pieces of awkward sizes: the file is exactly the
    /// bytes given, direct or buffered.
    #[test]
    fn every_edge_length_is_written_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let direct_here = {
            let f = File::create(dir.path().join("probe")).unwrap();
            accepts_direct(&f)
        };
        let mut lengths = vec![0, 1, 7, 8];
        for base in [ALIGN, 2 * ALIGN, STAGE_BYTES, 2 * STAGE_BYTES] {
            lengths.extend([base - 1, base, base + 1]);
        }
        lengths.push(STAGE_BYTES + ALIGN + 24);
        for (k, &len) in lengths.iter().enumerate() {
            let whole = pattern(len, k as u8);
            // A header-like first piece of 8 + a multiple of 8, then the
            // rest in pieces straddling the stage's edges.
            let mut pieces = Vec::new();
            let mut at = 0;
            let sizes = [16, ALIGN - 3, STAGE_BYTES + 5, 1, STAGE_BYTES];
            let mut s = 0;
            while at < len {
                let n = sizes[s % sizes.len()].min(len - at);
                pieces.push(whole[at..at + n].to_vec());
                at += n;
                s += 1;
            }
            pieces.push(Vec::new());
            for direct in [true, false] {
                let (got, still) = write_pieces(dir.path(), &pieces, direct);
                assert_eq!(got.len(), len, "length {len}, direct {direct}");
                assert!(got == whole, "bytes of length {len}, direct {direct}");
                assert_eq!(still, direct && direct_here, "length {len}");
            }
        }
    }

    /// A descriptor whose file refuses `O_DIRECT` (procfs) is reported so,
    /// and a writer over it writes buffered.
    #[test]
    fn a_filesystem_refusing_direct_io_is_written_buffered() {
        let Ok(status) = File::open("/proc/self/status") else {
            return; // no procfs: nothing refuses here
        };
        assert!(!accepts_direct(&status));
        let w = DirectWriter::new(&status, false).unwrap();
        assert!(!w.is_direct());
    }

    /// A direct writer finishing leaves the description without
    /// `O_DIRECT`, so the owner's later writes and fsync are ordinary.
    #[cfg(target_os = "linux")]
    #[test]
    fn finishing_turns_direct_io_off() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let mut w = DirectWriter::new(&file, false).unwrap();
        w.write_all(&pattern(3 * ALIGN + 5, 1)).unwrap();
        assert_eq!(w.finish().unwrap(), 3 * ALIGN as u64 + 5);
        // SAFETY: a valid descriptor.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        assert_eq!(flags & libc::O_DIRECT, 0);
        file.write_all_at(b"tail", 3 * ALIGN as u64 + 5).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 3 * ALIGN as u64 + 9);
    }
}
