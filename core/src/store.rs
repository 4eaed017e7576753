//! `Store`: one opened file, memory-mapped read-only, read with positional
//! reads when mapping is not wanted (network filesystems, files that may be
//! truncated under us), or (the `remote` feature) an object of an
//! S3-compatible store or HTTP server read by ranged GETs.
//!
//! All byte access goes through bounds-checked methods, so a plugin that
//! computes a bad range gets an error, never an out-of-bounds read.
//!
//! What a store asks of the page cache (walk advice, dropping, populating,
//! prefetching, evicting) is `store/page_cache.rs`'s: this file is the bounded
//! byte access.

use crate::rule::Rule;
use std::borrow::Cow;
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use memmap2::Mmap;

use crate::error::{Context, Error, Result};

mod cold_pages;
mod page_cache;
mod private_map;

pub use private_map::{PrivateMap, PrivateMaps};

/// How a store reaches its bytes.
#[derive(Debug)]
enum Backing {
    /// The whole file mapped read-only and shared.
    Mapped(Mmap),
    /// Positional reads (`pread`) on demand.
    Positional(File),
    /// Ranged GETs of an object, pinned to its version.
    #[cfg(feature = "remote")]
    Remote(std::sync::Arc<zt_remote::RemoteObject>),
    /// Bytes a format decoded into memory for its own reader to walk (a
    /// DCP chunk's decompressed `torch.save` archive): see
    /// [`Store::from_bytes`].
    Memory(Memory),
}

/// A memory store's bytes; its `Debug` says how many, not what they are.
struct Memory(Vec<u8>);

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Memory({} bytes)", self.0.len())
    }
}

/// One opened file.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    len: u64,
    backing: Backing,
    /// A format is walking the structure (see [`Store::begin_walk`]).
    walking: AtomicBool,
    /// The walk's page-at-a-time advice is in force: given at the walk's
    /// first read, not at its start, since most related files a walk opens
    /// (a memmap directory's leaves) are never read by it.
    walk_advised: AtomicBool,
    /// Page ranges a walk read that were not cached before it (see
    /// [`Store::take_cold_walk_pages`]).
    cold_pages: cold_pages::ColdPages,
    /// A mapped file's descriptor, kept for the store's life: a copy
    /// `pread`s the very file the mapping shows ([`Store::reopen`]), and a
    /// writable load maps the same file again copy-on-write
    /// ([`Store::map_private`]), whatever was renamed over its path since.
    file: Option<File>,
}

/// During a structure walk, a read at least this long is a header or a
/// table read front to back (a safetensors header, a pickle, an ONNX
/// protobuf): its range keeps the kernel's normal readahead.
const WALK_SEQUENTIAL: u64 = 256 << 10;

/// The operating system's page size, read once.
pub fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if v > 0 {
            v as u64
        } else {
            4096
        }
    })
}

/// The length of the next `pread` of a long read in file order from
/// `at`, with `left` bytes to go: `chunk`, or what is left, except that a
/// piece that would end exactly on a page boundary takes half a page more.
/// Cold, page-aligned pieces read slower than the same pieces ending
/// inside a page, with one thread or two and whatever the piece size: the
/// kernel's readahead keeps the next window in flight only when a read
/// ends inside a page. Safetensors' tensors start at unaligned offsets and
/// never met it; `.zt`'s start on page boundaries (`python -m harness
/// --only cold` measures the copy against `cat`).
pub fn read_piece_len(at: u64, left: u64, chunk: u64) -> u64 {
    if left <= chunk {
        return left;
    }
    let page = page_size();
    if (at + chunk) % page == 0 {
        (chunk + page / 2).min(left)
    } else {
        chunk
    }
}

/// How many bytes of `buf` a `pread` from `offset` fills from the page
/// cache alone (`preadv2` with `RWF_NOWAIT`, which reads no further than
/// the cache holds); `None` where the kernel or filesystem cannot tell
/// (any failure but `EAGAIN`, "not cached").
fn cached_prefix(file: &File, offset: u64, buf: &mut [u8]) -> Option<usize> {
    use std::os::fd::AsRawFd;
    let mut done = 0usize;
    while done < buf.len() {
        let iov = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: buf.len() - done,
        };
        // SAFETY: one iovec over the unfilled tail of `buf`, which this
        // function borrows mutably; the kernel writes at most its length.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                &iov,
                1,
                (offset + done as u64) as libc::off_t,
                libc::RWF_NOWAIT,
            )
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => break, // the end of the file: the read that follows says so
            _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN) => break,
            _ => return None,
        }
    }
    Some(done)
}

/// A failed `mmap` of the whole file: `ENOMEM` (the mapping does not fit
/// the process's address-space limit) is a [`Error::Memory`], which Python
/// raises as `MemoryError`, like any other allocation zt cannot get; every
/// other failure is the operating system's.
fn map_failed(file: &File, local: &Path, location: &Path, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc::ENOMEM) {
        return Error::Memory {
            ctx: Context::file(location),
            what: "a memory map of the file (zt.open(path, map=False) reads without one)",
            bytes: file.metadata().map(|m| m.len()).unwrap_or(0),
        };
    }
    Error::io(local, e)
}

impl Store {
    /// Open and memory-map `path` read-only.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref();
        Store::open_as(path, path)
    }

    /// Map the local file `local` but name it `location` (a cached copy of
    /// an object is named by its URL, so related files resolve beside the
    /// object and errors name it).
    pub fn open_as(local: &Path, location: &Path) -> Result<Store> {
        let file = zt_fsutil::open_regular(local).map_err(|e| Error::io(local, e))?;
        // SAFETY: the map is read-only. Another process truncating the file
        // while it is mapped would raise SIGBUS on access; that is the same
        // contract every mmap-based reader (safetensors, numpy.memmap) has,
        // and `open_positional` exists for files that may change.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| map_failed(&file, local, location, e))?;
        // The length is the mapping's: a file that changed size between a
        // stat and the map must not let a range check pass that the map
        // cannot serve.
        let len = map.len() as u64;
        Ok(Store {
            path: location.to_path_buf(),
            len,
            backing: Backing::Mapped(map),
            walking: AtomicBool::new(false),
            walk_advised: AtomicBool::new(false),
            cold_pages: Default::default(),
            file: Some(file),
        })
    }

    /// A store over `file`, a regular file already opened (and checked to
    /// be one) by the caller, `len` bytes long when it was checked: mapped
    /// when `map`, else read positionally; named `location`. What
    /// [`crate::OpenInput::open_related`] opens a related file with, so the
    /// file its confinement check accepted is the file read.
    pub(crate) fn from_open_file(
        file: File,
        len: u64,
        location: &Path,
        map: bool,
    ) -> Result<Store> {
        let (backing, file) = if map {
            let map_len = usize::try_from(len).map_err(|_| Error::Memory {
                ctx: Context::file(location),
                what: "a memory map of the file (zt.open(path, map=False) reads without one)",
                bytes: len,
            })?;
            // SAFETY: as `open_as`'s (a read-only map of a regular file); the
            // length is the one just read from the descriptor, so the map
            // makes no `fstat` of its own.
            let map = unsafe { memmap2::MmapOptions::new().len(map_len).map(&file) }
                .map_err(|e| map_failed(&file, location, location, e))?;
            (Backing::Mapped(map), Some(file))
        } else {
            (Backing::Positional(file), None)
        };
        Ok(Store {
            path: location.to_path_buf(),
            len,
            backing,
            walking: AtomicBool::new(false),
            walk_advised: AtomicBool::new(false),
            cold_pages: Default::default(),
            file,
        })
    }

    /// A store over a remote object, named by its URL.
    #[cfg(feature = "remote")]
    pub fn remote(url: PathBuf, object: std::sync::Arc<zt_remote::RemoteObject>) -> Store {
        Store {
            path: url,
            len: object.len(),
            backing: Backing::Remote(object),
            walking: AtomicBool::new(false),
            walk_advised: AtomicBool::new(false),
            cold_pages: Default::default(),
            file: None,
        }
    }

    /// A store over bytes already in memory, named `name` (what errors
    /// say of it). For data a format decodes and then reads with another
    /// format's reader, which takes a store: the bytes are read as a file's
    /// are, bounds-checked, and never handed out as a mapped view
    /// ([`Store::is_mapped`] is false), so no tensor of a source points
    /// into them. Page-cache advice does nothing.
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Store {
        Store {
            path: name.into(),
            len: bytes.len() as u64,
            backing: Backing::Memory(Memory(bytes)),
            walking: AtomicBool::new(false),
            walk_advised: AtomicBool::new(false),
            cold_pages: Default::default(),
            file: None,
        }
    }

    /// The bytes of a store made by [`Store::from_bytes`], given back;
    /// `None` for any other store.
    pub fn into_bytes(self) -> Option<Vec<u8>> {
        match self.backing {
            Backing::Memory(Memory(bytes)) => Some(bytes),
            _ => None,
        }
    }

    /// Open `path` for positional reads only (no mapping).
    pub fn open_positional(path: impl AsRef<Path>) -> Result<Store> {
        let path = path.as_ref();
        let file = zt_fsutil::open_regular(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(Store {
            path: path.to_path_buf(),
            len,
            backing: Backing::Positional(file),
            walking: AtomicBool::new(false),
            walk_advised: AtomicBool::new(false),
            cold_pages: Default::default(),
            file: None,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for an empty file.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if the store is memory-mapped (zero-copy views are possible).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mapped(_))
    }

    /// True if the store is an object read over the network.
    pub fn is_remote(&self) -> bool {
        #[cfg(feature = "remote")]
        if matches!(self.backing, Backing::Remote(_)) {
            return true;
        }
        false
    }

    /// What names the version of the file this store reads, for callers
    /// that must know two processes read the same bytes (ranks sharing a
    /// load): a remote object's pinned version (its ETag, else size and
    /// last-modified), a local file's length (its modification time would
    /// tell copies of one model on two machines apart), or `None` for
    /// bytes in memory.
    pub fn version(&self) -> Option<String> {
        #[cfg(feature = "remote")]
        if let Backing::Remote(object) = &self.backing {
            return Some(object.version_key());
        }
        match self.backing {
            Backing::Mapped(_) | Backing::Positional(_) => Some(self.len.to_string()),
            _ => None,
        }
    }

    /// Address and length of the whole mapping, for callers that check
    /// where a zero-copy view points (tests, diagnostics).
    pub fn mapping(&self) -> Option<(usize, usize)> {
        match &self.backing {
            Backing::Mapped(map) => Some((map.as_ptr() as usize, map.len())),
            _ => None,
        }
    }

    /// Fill `buf` from `offset` of a positional store's `file`. During a
    /// walk a short read first asks for what is cached (`RWF_NOWAIT`, which
    /// stops at the first page the cache lacks), and notes the pages from
    /// there on as cold: `mincore` needs a mapping, this needs none.
    fn pread_exact(&self, file: &File, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = buf.len() as u64;
        let mut cached = 0usize;
        let walking = len > 0 && self.walking.load(Ordering::Relaxed);
        if walking {
            self.advise_walk();
        }
        if walking && len < WALK_SEQUENTIAL {
            if let Some(prefix) = cached_prefix(file, offset, buf) {
                cached = prefix;
                if cached < buf.len() {
                    let (start, end) =
                        Self::page_envelope(offset + cached as u64, len - cached as u64);
                    self.cold_pages.note(start, end);
                }
            }
        }
        file.read_exact_at(&mut buf[cached..], offset + cached as u64)
            .map_err(|e| self.read_failed(file, offset + cached as u64, len - cached as u64, e))
    }

    /// A context naming this store's file.
    pub fn ctx(&self) -> Context {
        Context::file(&self.path)
    }

    /// A positional read that failed. A short read means the file shrank
    /// after it was opened (the range was checked against its length then):
    /// a [`Error::Truncated`] saying so, where a mapped store would have
    /// died of `SIGBUS`.
    fn read_failed(&self, file: &File, offset: u64, len: u64, e: std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return Error::Truncated {
                ctx: self.ctx().at(offset),
                rule: Rule::TRUNCATED,
                what: "a read of a file that shrank after it was opened",
                needed: offset.saturating_add(len),
                available: file.metadata().map(|m| m.len()).unwrap_or(0),
            };
        }
        Error::Io {
            ctx: self.ctx().at(offset),
            source: e,
        }
    }

    /// Check that `[offset, offset + len)` lies inside the file.
    pub fn check_range(&self, offset: u64, len: u64, what: &'static str) -> Result<()> {
        let end = offset.checked_add(len).ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: self.ctx().at(offset),
            what,
        })?;
        if end > self.len {
            return Err(Error::Truncated {
                rule: Rule::TRUNCATED,
                ctx: self.ctx().at(offset),
                what,
                needed: len,
                available: self.len.saturating_sub(offset),
            });
        }
        Ok(())
    }

    /// A zero-copy view of `[offset, offset + len)`; fails if the store is
    /// not mapped or the range is outside the file.
    pub fn slice(&self, offset: u64, len: u64) -> Result<&[u8]> {
        self.check_range(offset, len, "byte range")?;
        match &self.backing {
            Backing::Mapped(map) => {
                self.walk_read(offset, len);
                Ok(&map[offset as usize..(offset + len) as usize])
            }
            _ => Err(Error::Unsupported {
                rule: Rule::ACCESS_MAP,
                ctx: self.ctx().at(offset),
                reason: "the store is not memory-mapped (positional or remote reads)".into(),
            }),
        }
    }

    /// The bytes of `[offset, offset + len)`: borrowed from the mapping, or
    /// read into an owned buffer for a positional store.
    pub fn read(&self, offset: u64, len: u64) -> Result<Cow<'_, [u8]>> {
        self.check_range(offset, len, "byte range")?;
        match &self.backing {
            Backing::Mapped(map) => {
                self.walk_read(offset, len);
                Ok(Cow::Borrowed(
                    &map[offset as usize..(offset + len) as usize],
                ))
            }
            Backing::Positional(file) => {
                let mut buf = crate::buffer::try_zeroed(&self.ctx().at(offset), "a read", len)?;
                self.pread_exact(file, offset, &mut buf)?;
                Ok(Cow::Owned(buf))
            }
            #[cfg(feature = "remote")]
            Backing::Remote(object) => object
                .read(offset, len)
                .map(Cow::Owned)
                .map_err(crate::remote::error),
            Backing::Memory(Memory(bytes)) => Ok(Cow::Borrowed(
                &bytes[offset as usize..(offset + len) as usize],
            )),
        }
    }

    /// Fill `buf` with the bytes from `offset`: one copy out of the
    /// mapping, one `pread`, or parallel ranged GETs straight into `buf`.
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64, "byte range")?;
        match &self.backing {
            Backing::Mapped(map) => {
                self.walk_read(offset, buf.len() as u64);
                buf.copy_from_slice(&map[offset as usize..offset as usize + buf.len()]);
                Ok(())
            }
            Backing::Positional(file) => self.pread_exact(file, offset, buf),
            #[cfg(feature = "remote")]
            Backing::Remote(object) => object.read_into(offset, buf).map_err(crate::remote::error),
            Backing::Memory(Memory(bytes)) => {
                buf.copy_from_slice(&bytes[offset as usize..offset as usize + buf.len()]);
                Ok(())
            }
        }
    }

    /// A descriptor for positional reads of a mapped store's file: a
    /// duplicate of the one the store holds, so its reads return what the
    /// mapping shows even after another file was renamed over the path.
    /// Copying a large range with `pread` skips setting up and walking the
    /// mapping's page tables, and a file that shrank is then an error
    /// rather than `SIGBUS`. `None` for other stores or no descriptor to
    /// spare.
    pub fn reopen(&self) -> Option<File> {
        self.file.as_ref()?.try_clone().ok()
    }

    /// [`Store::read_into`] for memory not yet initialised (a fresh
    /// destination, so it is never zeroed or faulted in before the copy):
    /// one copy out of the mapping, or `pread`s straight into `buf` (from
    /// `file`, when given: this store's [`Store::reopen`]). On success every
    /// byte of `buf` is initialised; on error some may not be.
    pub fn read_into_uninit(
        &self,
        file: Option<&File>,
        offset: u64,
        buf: &mut [MaybeUninit<u8>],
    ) -> Result<()> {
        let len = buf.len();
        self.check_range(offset, len as u64, "byte range")?;
        if let Some(file) = file {
            return self.pread_uninit(file, offset, buf);
        }
        match &self.backing {
            Backing::Mapped(map) => {
                let src = &map[offset as usize..offset as usize + len];
                // SAFETY: `src` and `buf` are both `len` bytes long and do not
                // overlap (one is a read-only file mapping, the other a
                // `&mut` borrow); writing initialised bytes into
                // `MaybeUninit<u8>` is always valid.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), buf.as_mut_ptr().cast::<u8>(), len)
                };
                Ok(())
            }
            Backing::Positional(file) => self.pread_uninit(file, offset, buf),
            Backing::Memory(Memory(bytes)) => {
                let src = &bytes[offset as usize..offset as usize + len];
                // SAFETY: `src` and `buf` are both `len` bytes long and do not
                // overlap (`src` is this store's own buffer, `buf` a `&mut`
                // borrow); writing initialised bytes into `MaybeUninit<u8>`
                // is always valid.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), buf.as_mut_ptr().cast::<u8>(), len)
                };
                Ok(())
            }
            #[cfg(feature = "remote")]
            Backing::Remote(_) => {
                buf.fill(MaybeUninit::new(0));
                // SAFETY: every element was just initialised, and
                // `MaybeUninit<u8>` has the layout of `u8`.
                let init = unsafe { &mut *(buf as *mut [MaybeUninit<u8>] as *mut [u8]) };
                self.read_into(offset, init)
            }
        }
    }

    /// `pread`s of `file` from `offset` until `buf` is full.
    fn pread_uninit(&self, file: &File, offset: u64, buf: &mut [MaybeUninit<u8>]) -> Result<()> {
        use std::os::fd::AsRawFd;
        let len = buf.len();
        let mut done = 0usize;
        while done < len {
            let at = offset + done as u64;
            // SAFETY: the kernel writes at most `len - done` bytes into
            // `buf[done..]`, memory this call borrows mutably; reading into
            // uninitialised memory is what `pread` is for.
            let n = unsafe {
                libc::pread(
                    file.as_raw_fd(),
                    buf.as_mut_ptr().add(done).cast::<libc::c_void>(),
                    len - done,
                    at as libc::off_t,
                )
            };
            match n {
                0 => {
                    let eof = std::io::ErrorKind::UnexpectedEof.into();
                    return Err(self.read_failed(file, at, (len - done) as u64, eof));
                }
                n if n > 0 => done += n as usize,
                _ => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        return Err(self.read_failed(file, at, (len - done) as u64, e));
                    }
                }
            }
        }
        Ok(())
    }

    /// The bytes of several ranges: borrowed from the mapping, read one by
    /// one positionally, or for a remote object planned together (large
    /// ranges split into parallel parts, small neighbours coalesced into
    /// one request).
    pub fn read_many(&self, ranges: &[(u64, u64)]) -> Result<Vec<Cow<'_, [u8]>>> {
        for &(offset, len) in ranges {
            self.check_range(offset, len, "byte range")?;
        }
        match &self.backing {
            #[cfg(feature = "remote")]
            Backing::Remote(object) => Ok(object
                .read_ranges(ranges)
                .map_err(crate::remote::error)?
                .into_iter()
                .map(Cow::Owned)
                .collect()),
            _ => ranges.iter().map(|&(o, l)| self.read(o, l)).collect(),
        }
    }

    /// Up to `max` bytes from `offset` (fewer at the end of the file).
    pub fn read_upto(&self, offset: u64, max: u64) -> Result<Cow<'_, [u8]>> {
        let len = max.min(self.len.saturating_sub(offset));
        self.read(offset.min(self.len), len)
    }

    /// The page-aligned envelope `[start, end)` that contains the range.
    pub fn page_envelope(offset: u64, len: u64) -> (u64, u64) {
        let page = page_size();
        let start = offset / page * page;
        let end = offset
            .saturating_add(len)
            .div_ceil(page)
            .saturating_mul(page);
        (start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_opened() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("model.safetensors");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening a FIFO for reading blocks until a writer comes: refused
        // before that, as are devices and directories.
        for (path, kind) in [
            (fifo.as_path(), "a FIFO"),
            (Path::new("/dev/zero"), "a character device"),
            (dir.path(), "a directory"),
        ] {
            for store in [Store::open(path), Store::open_positional(path)] {
                let err = store.unwrap_err();
                assert!(err.to_string().contains(kind), "{err}");
            }
        }
    }
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
        f
    }

    #[test]
    fn long_reads_never_split_on_a_page_boundary() {
        let page = page_size();
        let chunk = 8 << 20;
        // From a page boundary, the piece takes half a page more ...
        assert_eq!(read_piece_len(0, 20 << 20, chunk), chunk + page / 2);
        assert_eq!(read_piece_len(chunk + page / 2, 20 << 20, chunk), chunk);
        // ... and no more than is left.
        assert_eq!(read_piece_len(0, chunk + 1, chunk), chunk + 1);
        // Unaligned starts and short tails are read as they come.
        assert_eq!(read_piece_len(2304, 20 << 20, chunk), chunk);
        assert_eq!(read_piece_len(0, chunk, chunk), chunk);
        assert_eq!(read_piece_len(0, 10, chunk), 10);
        // Every split of a long aligned read falls inside a page.
        let (mut at, end) = (3 * page, 3 * page + (50 << 20));
        while at < end {
            at += read_piece_len(at, end - at, chunk);
            assert!(at == end || at % page != 0, "split at {at}");
        }
    }

    #[test]
    fn mapped_and_positional_agree() {
        let f = file_with(b"hello world");
        for store in [
            Store::open(f.path()).unwrap(),
            Store::open_positional(f.path()).unwrap(),
        ] {
            assert_eq!(store.len(), 11);
            assert_eq!(&*store.read(6, 5).unwrap(), b"world");
            assert!(matches!(store.read(6, 6), Err(Error::Truncated { .. })));
            assert!(matches!(
                store.read(u64::MAX, 2),
                Err(Error::Overflow { .. })
            ));
        }
        let positional = Store::open_positional(f.path()).unwrap();
        assert!(matches!(
            positional.slice(0, 1),
            Err(Error::Unsupported { .. })
        ));
    }

    #[test]
    fn empty_file_maps() {
        let f = file_with(b"");
        let store = Store::open(f.path()).unwrap();
        assert!(store.is_empty());
        assert_eq!(store.read(0, 0).unwrap().len(), 0);
    }

    #[test]
    fn missing_file_is_not_found() {
        assert!(matches!(
            Store::open("/nonexistent/zt/file"),
            Err(Error::NotFound { .. })
        ));
    }

    #[test]
    fn advice_is_accepted() {
        let f = file_with(&vec![7u8; 3 * page_size() as usize]);
        let store = Store::open(f.path()).unwrap();
        store.prefetch(10, 100).unwrap();
        store.evict_pages(0, page_size()).unwrap();
        assert_eq!(store.read(0, 1).unwrap()[0], 7);
        assert!(store.evict_pages(1, page_size()).is_err());
        assert_eq!(Store::page_envelope(1, 1), (0, page_size()));
    }

    /// The `VmFlags` of every mapping of this process that overlaps
    /// `[start, start + len)`, from `/proc/self/smaps` ("rr" is
    /// `MADV_RANDOM`).
    fn vm_flags(start: usize, len: usize) -> Vec<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut out = Vec::new();
        let mut overlaps = false;
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if let Some((a, b)) = first.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                {
                    overlaps = a < start + len && start < b;
                    continue;
                }
            }
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                if overlaps {
                    out.push(flags.trim().to_string());
                }
            }
        }
        out
    }

    fn random(flags: &[String]) -> Vec<bool> {
        flags
            .iter()
            .map(|f| f.split_whitespace().any(|x| x == "rr"))
            .collect()
    }

    #[test]
    fn a_walk_reads_pages_not_windows_and_long_reads_read_ahead() {
        let page = page_size() as usize;
        let bytes: Vec<u8> = (0..(WALK_SEQUENTIAL as usize * 4))
            .map(|i| i as u8)
            .collect();
        let f = file_with(&bytes);
        let store = Store::open(f.path()).unwrap();
        let (addr, len) = store.mapping().unwrap();
        assert_eq!(random(&vm_flags(addr, len)), [false]);

        store.begin_walk();
        // No advice until the walk reads (a leaf it only opens needs none).
        assert_eq!(random(&vm_flags(addr, len)), [false]);
        // A short read gets the page-at-a-time advice; a long one (a
        // header read front to back) gets normal readahead over its range.
        assert_eq!(store.read(5, 10).unwrap()[..], bytes[5..15]);
        assert_eq!(random(&vm_flags(addr, len)), [true]);
        let long = WALK_SEQUENTIAL as usize;
        assert_eq!(
            store.read(2 * page as u64, long as u64).unwrap()[..],
            bytes[2 * page..2 * page + long]
        );
        assert_eq!(random(&vm_flags(addr, 2 * page)), [true]);
        assert_eq!(random(&vm_flags(addr + 2 * page, long)), [false]);
        assert_eq!(
            random(&vm_flags(addr + 2 * page + long, len - 2 * page - long)),
            [true]
        );

        store.end_walk();
        assert!(random(&vm_flags(addr, len)).iter().all(|r| !r));
        // A walk that never read leaves the mapping as it was.
        store.begin_walk();
        store.end_walk();
        assert_eq!(random(&vm_flags(addr, len)), [false]);
        // A positional store has no mapping to advise; the calls are no-ops.
        let positional = Store::open_positional(f.path()).unwrap();
        positional.begin_walk();
        assert_eq!(positional.read(5, 10).unwrap()[..], bytes[5..15]);
        positional.end_walk();
    }

    #[test]
    fn a_memory_store_reads_as_a_file_and_gives_its_bytes_back() {
        let bytes: Vec<u8> = (0..100u8).collect();
        let store = Store::from_bytes("chunk (decoded)", bytes.clone());
        assert_eq!(store.len(), 100);
        assert!(!store.is_mapped() && !store.is_remote());
        assert_eq!(store.path(), Path::new("chunk (decoded)"));
        assert_eq!(store.read(10, 5).unwrap()[..], bytes[10..15]);
        let mut buf = [0u8; 4];
        store.read_into(96, &mut buf).unwrap();
        assert_eq!(buf, [96, 97, 98, 99]);
        let mut uninit = [MaybeUninit::<u8>::uninit(); 3];
        store.read_into_uninit(None, 1, &mut uninit).unwrap();
        // SAFETY: read_into_uninit succeeded, so every byte is initialised.
        assert_eq!(uninit.map(|b| unsafe { b.assume_init() }), [1, 2, 3]);
        // Bounds are checked as for a file; no view of the bytes is lent.
        assert!(store.read(99, 2).is_err());
        assert!(store.slice(0, 1).is_err());
        store.begin_walk();
        store.populate(0, 100).unwrap();
        store.end_walk();
        // Debug says how many bytes, not what they are.
        assert!(format!("{store:?}").contains("Memory(100 bytes)"));
        assert_eq!(store.into_bytes().unwrap(), bytes);
    }
}
