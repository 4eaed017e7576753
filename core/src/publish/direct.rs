//! A large new file written front to back with direct I/O (`O_DIRECT`),
//! for a writer whose output is far larger than what it holds.
//!
//! A buffered `write` copies every byte into the page cache, whose fresh
//! pages the kernel must first allocate and zero: on a small machine that
//! copy is most of a conversion's CPU (the profile behind issue 41: the FP8
//! to bf16 conversion spent most of its cycles there, far more than in the
//! dequantization). With `O_DIRECT` the device reads the bytes from the
//! writer's own memory; the CPU only copies them once into an aligned
//! staging buffer, reused for the whole file. (Writing into a
//! `MAP_SHARED` mapping of the file instead faults in and zeroes the same
//! fresh page-cache pages, and measured no better than buffered writes.)
//! `python -m harness.quant_st_bench --only convert` measures the
//! conversion.
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
use std::sync::mpsc;

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

// SAFETY: a `Stage` owns its allocation exclusively, as a `Vec<u8>` does;
// it is handed whole to the thread that writes it and back.
unsafe impl Send for Stage {}

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
    let file = partial.file();
    let written = std::thread::scope(|s| {
        let mut w =
            DirectWriter::writing_behind(s, file, durable).map_err(|e| Error::io(path, e))?;
        body(&mut w)?;
        w.finish().map_err(|e| Error::io(path, e))
    })?;
    partial.commit(durable)?;
    Ok(written)
}

/// Stages a [`DirectWriter`] may use when writing behind: one being filled
/// while the others are written, so the device always has the next write.
const STAGES: usize = 3;

/// A [`DirectWriter`]'s full stages written by a thread of their own.
struct Behind {
    /// A full stage and its file offset, to write.
    jobs: mpsc::Sender<(Stage, u64)>,
    /// Each stage written (or the error), and whether writes are still
    /// direct.
    done: mpsc::Receiver<io::Result<(Stage, bool)>>,
    /// Stages sent and not yet back.
    in_flight: usize,
    /// Stages that may still be allocated.
    spare: usize,
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
    /// The thread writing full stages, if writing behind.
    behind: Option<Behind>,
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
            behind: None,
        })
    }

    /// [`DirectWriter::new`] whose full stages are written by a thread of
    /// `scope`'s while the caller fills the next (`STAGES` in all), so
    /// the device is never idle waiting for the copy or the caller's
    /// other work. [`DirectWriter::finish`] waits for them.
    pub fn writing_behind<'scope, 'env: 'scope>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        file: &'env File,
        durable: bool,
    ) -> io::Result<DirectWriter<'env>> {
        let mut w = DirectWriter::new(file, durable)?;
        let (jobs, todo) = mpsc::channel::<(Stage, u64)>();
        let (report, done) = mpsc::channel();
        let mut direct = w.direct;
        scope.spawn(move || {
            for (mut stage, at) in todo {
                let wrote = put(file, direct, stage.bytes(), at).map(|still| {
                    direct = still;
                    if durable && !still {
                        start_writeback_range(file, at, STAGE_BYTES as u64);
                    }
                    (stage, still)
                });
                if report.send(wrote).is_err() {
                    return;
                }
            }
        });
        w.behind = Some(Behind {
            jobs,
            done,
            in_flight: 0,
            spare: STAGES - 1,
        });
        Ok(w)
    }

    /// One written stage back from the writing thread, its error returned.
    fn stage_back(&mut self) -> io::Result<Stage> {
        let behind = self.behind.as_mut().expect("writing behind");
        let back = behind
            .done
            .recv()
            .map_err(|_| io::Error::other("the writing thread stopped"))?;
        behind.in_flight -= 1;
        let (stage, still) = back?;
        self.direct &= still;
        Ok(stage)
    }

    /// The full stage handed to the writing thread, an empty one in its
    /// place (a spare, else the first written back).
    fn hand_over(&mut self) -> io::Result<()> {
        let behind = self.behind.as_mut().expect("writing behind");
        let next = if behind.spare > 0 {
            behind.spare -= 1;
            Stage::new(STAGE_BYTES)?
        } else {
            self.stage_back()?
        };
        let full = std::mem::replace(&mut self.stage, next);
        let behind = self.behind.as_mut().expect("writing behind");
        behind
            .jobs
            .send((full, self.at))
            .map_err(|_| io::Error::other("the writing thread stopped"))?;
        behind.in_flight += 1;
        Ok(())
    }

    /// Whether writes go to the device directly (so far: a refused direct
    /// write turns it off).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Write the rest and leave the file's description as it was opened
    /// (no `O_DIRECT`). The file's length.
    pub fn finish(mut self) -> io::Result<u64> {
        // Every stage written behind is back (or its error returned), so
        // the tail below is the only write left and the thread stops.
        while self.behind.as_ref().is_some_and(|b| b.in_flight > 0) {
            self.stage_back()?;
        }
        self.behind = None;
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
            if self.behind.is_some() {
                self.hand_over()?;
            } else {
                self.put_stage(0, STAGE_BYTES)?;
            }
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

    /// How a test writes.
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Mode {
        Direct,
        Buffered,
        /// Direct, full stages written by a thread of their own.
        Behind,
    }

    /// `pieces` written through a writer into a fresh file under `dir`;
    /// the file's bytes and whether it stayed direct.
    fn write_pieces(dir: &std::path::Path, pieces: &[Vec<u8>], mode: Mode) -> (Vec<u8>, bool) {
        let path = dir.join(format!("out-{mode:?}"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let (len, still) = std::thread::scope(|s| {
            let mut w = match mode {
                Mode::Direct => DirectWriter::new(&file, true).unwrap(),
                Mode::Buffered => DirectWriter::buffered(&file, true).unwrap(),
                Mode::Behind => DirectWriter::writing_behind(s, &file, true).unwrap(),
            };
            for p in pieces {
                w.write_all(p).unwrap();
            }
            let still = w.is_direct();
            (w.finish().unwrap(), still)
        });
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
            for mode in [Mode::Direct, Mode::Buffered, Mode::Behind] {
                let (got, still) = write_pieces(dir.path(), &pieces, mode);
                assert_eq!(got.len(), len, "length {len}, {mode:?}");
                assert!(got == whole, "bytes of length {len}, {mode:?}");
                assert_eq!(still, mode != Mode::Buffered && direct_here, "length {len}");
            }
        }
    }

    /// A write the writing thread fails is the writer's error, by the
    /// time it finishes at the latest; a body that fails publishes
    /// nothing and leaves no partial.
    #[test]
    fn errors_come_back_and_publish_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro");
        std::fs::write(&path, b"").unwrap();
        let read_only = File::open(&path).unwrap();
        let failed = std::thread::scope(|s| {
            let mut w = DirectWriter::writing_behind(s, &read_only, false).unwrap();
            let stage = vec![1u8; STAGE_BYTES];
            (0..STAGES + 1)
                .try_for_each(|_| w.write_all(&stage))
                .and_then(|()| w.finish().map(drop))
        });
        assert!(failed.is_err());
        let dest = dir.path().join("out.safetensors");
        let err = publish_direct(&dest, true, |w| {
            w.write_all(&[7u8; 3 * STAGE_BYTES]).unwrap();
            Err(Error::Write {
                rule: crate::Rule::WRITE_SIZE,
                ctx: crate::Context::file(&dest),
                reason: "the body failed".into(),
            })
        })
        .unwrap_err();
        assert!(err.to_string().contains("the body failed"), "{err}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("ro")]);
        let n = publish_direct(&dest, false, |w| {
            w.write_all(b"whole").map_err(|e| Error::io(&dest, e))
        })
        .unwrap();
        assert_eq!((n, std::fs::read(&dest).unwrap()), (5, b"whole".to_vec()));
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
