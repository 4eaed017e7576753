//! The one way every writer publishes a file: build it in a partial file
//! beside the destination, then rename it into place, so that an error, a
//! panic or a killed process never leaves a half-written destination.
//!
//! A partial file is `.NAME.PID.RANDOM.partial` in the destination's
//! directory (same filesystem, so the rename is atomic). It is created with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`, so a file or symlink planted at a guessable
//! name is never opened or followed, and it is locked (`flock`) for as long
//! as its writer lives. A partial whose lock is free belongs to a writer
//! that died; the next write to the same destination removes it
//! ([`remove_stale`]), and `zt clean` does so on request.

use crate::rule::Rule;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Context, Error, Result};
use crate::location::parent_dir;

pub mod direct;

/// A file being built beside its destination. Dropping it without
/// [`Partial::commit`] removes it; the destination is never touched.
///
/// Where the filesystem can (`O_TMPFILE`: ext4, xfs, btrfs, tmpfs), the
/// file has no name until it is complete, so a writer killed midway
/// (`kill -9`, OOM) leaves nothing behind; elsewhere it is a hidden
/// partial (see the module's docs), which the next write removes.
#[derive(Debug)]
pub struct Partial {
    file: Option<File>,
    /// Its hidden name, for a named partial (`None` for an unnamed one,
    /// and once committed).
    tmp: Option<PathBuf>,
    dest: PathBuf,
}

/// The destination's file name, or an error naming the destination.
fn file_name(dest: &Path) -> Result<String> {
    dest.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Write {
            rule: Rule::WRITE_DESTINATION,
            ctx: Context::file(dest),
            reason: "destination has no file name".into(),
        })
}

/// Refuse a destination that exists and is not a regular file (through
/// a symlink, as a write to it would land there): the rename that
/// publishes would replace a device node (`/dev/null`), a FIFO or a
/// socket with a regular file, and cannot replace a directory.
fn refuse_non_regular(dest: &Path) -> Result<()> {
    match std::fs::metadata(dest) {
        Ok(m) if !m.is_file() => Err(Error::Write {
            rule: Rule::WRITE_DESTINATION,
            ctx: Context::file(dest),
            reason: format!(
                "the destination is {}, not a regular file: zt writes a new file and \
                 renames it into place, which would replace it",
                zt_fsutil::file_kind(&m.file_type())
            ),
        }),
        _ => Ok(()),
    }
}

/// The longest file name most filesystems take (Linux's `NAME_MAX`).
const NAME_MAX: usize = 255;

/// The destination's name as its partials carry it: whole, or cut (on a
/// character boundary) so that `.STEM.PID.RANDOM.partial` fits in
/// [`NAME_MAX`] bytes with any PID; a destination with a name near the
/// limit, which the filesystem takes, must not fail for its partial's.
fn partial_stem(name: &str) -> &str {
    // '.' + '.' + PID (at most 10 digits) + '.' + 16 hex digits + ".partial".
    const OVERHEAD: usize = 2 + 10 + 1 + 16 + ".partial".len();
    let mut end = name.len().min(NAME_MAX - OVERHEAD);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// The partial files of `dest` in its directory, live or stale.
pub fn partials_of(dest: &Path) -> Result<Vec<PathBuf>> {
    let name = file_name(dest)?;
    let dir = parent_dir(dest);
    let prefix = format!(".{}.", partial_stem(&name));
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(&dir, e)),
    };
    for entry in entries.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        if let Some(rest) = file
            .strip_prefix(&prefix)
            .and_then(|r| r.strip_suffix(".partial"))
        {
            // PID.RANDOM: two dot-free fields of digits and hex digits.
            let mut fields = rest.split('.');
            let pid = fields
                .next()
                .is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
            let random = fields
                .next()
                .is_some_and(|r| r.bytes().all(|b| b.is_ascii_hexdigit()));
            if pid && random && fields.next().is_none() {
                out.push(dir.join(entry.file_name()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Remove the partial files (and staging directories) of `dest` whose
/// writer is gone (their lock is free). Returns what was removed. A live
/// writer's partial is left alone.
pub fn remove_stale(dest: &Path) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for path in partials_of(dest)? {
        if !zt_fsutil::is_stale(&path) {
            continue;
        }
        let gone = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path).is_ok(),
            Ok(_) => std::fs::remove_file(&path).is_ok(),
            Err(_) => false,
        };
        if gone {
            removed.push(path);
        }
    }
    Ok(removed)
}

/// A directory being built beside its destination (the shards of a
/// checkpoint, or a whole model directory): `.NAME.PID.RANDOM.partial`,
/// made by `mkdir` (which never reuses or follows what is there), locked
/// (`flock` on the directory itself) while its builder lives, removed
/// with its contents on drop. Its files are published by renaming them
/// (or it) into place; a stale one is removed by the next write, like a
/// stale [`Partial`].
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    _lock: File,
}

impl Staging {
    /// Create and lock a staging directory for `dest`, removing stale
    /// partials of `dest` first.
    pub fn create(dest: &Path) -> Result<Staging> {
        let name = file_name(dest)?;
        let parent = parent_dir(dest);
        refuse_non_regular(dest)?;
        remove_stale(dest)?;
        loop {
            let dir = partial_name(&parent, &name);
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let lock = File::open(&dir).and_then(|f| {
                        zt_fsutil::lock(&f, zt_fsutil::Lock::Exclusive, true).map(|_| f)
                    });
                    return match lock {
                        Ok(lock) => Ok(Staging { dir, _lock: lock }),
                        Err(e) => {
                            let _ = std::fs::remove_dir_all(&dir);
                            Err(Error::io(&dir, e))
                        }
                    };
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&dir, e)),
            }
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // After a directory publish the path is the destination's old
        // name, now absent: nothing to remove.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Partial {
    /// Create a partial file for `dest`: refuse a destination whose
    /// directory is not a directory, remove stale partials of `dest`, then
    /// create a fresh one, unnamed where the filesystem can.
    pub fn create(dest: &Path) -> Result<Partial> {
        Partial::create_as(dest, true)
    }

    /// [`Partial::create`]; with `unnamed` false, always a named (and
    /// locked) partial.
    fn create_as(dest: &Path, unnamed: bool) -> Result<Partial> {
        let name = file_name(dest)?;
        let dir = parent_dir(dest);
        match std::fs::metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::Write {
                    rule: Rule::WRITE_DESTINATION,
                    ctx: Context::file(dest),
                    reason: format!("{} is not a directory", dir.display()),
                })
            }
            Err(e) => return Err(Error::io(&dir, e)),
        }
        refuse_non_regular(dest)?;
        remove_stale(dest)?;
        if unnamed {
            if let Some(file) = unnamed::create(&dir) {
                unnamed::building(dest, &file);
                return Ok(Partial {
                    file: Some(file),
                    tmp: None,
                    dest: dest.to_path_buf(),
                });
            }
        }
        loop {
            let tmp = partial_name(&dir, &name);
            match zt_fsutil::create_locked(&tmp) {
                Ok(file) => {
                    return Ok(Partial {
                        file: Some(file),
                        tmp: Some(tmp),
                        dest: dest.to_path_buf(),
                    })
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(&tmp, e)),
            }
        }
    }

    /// The open partial file (read and write).
    pub fn file(&self) -> &File {
        self.file.as_ref().expect("open until commit")
    }

    /// The hidden name of a named partial; `None` for an unnamed one.
    pub fn path(&self) -> Option<&Path> {
        self.tmp.as_deref()
    }

    /// The destination it will be renamed to.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Rename the partial file over the destination (an unnamed one is
    /// first given a hidden name beside it: a file cannot be linked over
    /// another). With `durable`, the file's data is flushed to disk before
    /// the rename and the directory entry after it, so a power loss leaves
    /// the old file or the whole new one, never an empty or partial one.
    pub fn commit(mut self, durable: bool) -> Result<()> {
        let file = self.file.take().expect("open until commit");
        if durable {
            file.sync_data().map_err(|e| Error::io(&self.dest, e))?;
        }
        let named = match self.tmp.take() {
            Some(tmp) => tmp,
            None => unnamed::link(&file, &self.dest)?,
        };
        if let Err(e) = std::fs::rename(&named, &self.dest) {
            let _ = std::fs::remove_file(&named);
            return Err(Error::io(&self.dest, e));
        }
        // The lock goes with the descriptor; the file is now the destination.
        unnamed::done(&file);
        drop(file);
        if durable {
            sync_dir(&parent_dir(&self.dest))?;
        }
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(file) = &self.file {
            unnamed::done(file);
        }
        if let Some(tmp) = &self.tmp {
            let _ = std::fs::remove_file(tmp);
        }
    }
}

/// A fresh hidden name for a partial of the file `name` in `dir`.
fn partial_name(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(
        ".{}.{}.{:016x}.partial",
        partial_stem(name),
        std::process::id(),
        zt_fsutil::random_u64()
    ))
}

/// Unnamed partials: files made by `O_TMPFILE` in the destination's
/// directory, named only when complete, and the registry of those this
/// process is building (a progress display finds a named partial by
/// listing the directory; these it finds here).
mod unnamed {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, RawFd};
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::OpenOptionsExt;
    use std::sync::{Mutex, OnceLock};

    /// This process's unnamed partials: destination and descriptor.
    static BUILDING: Mutex<Vec<(PathBuf, RawFd)>> = Mutex::new(Vec::new());

    /// An unnamed file in `dir`, or `None` where the filesystem (or the
    /// kernel) has no `O_TMPFILE`, or no `/proc` to name it through at
    /// commit.
    pub(super) fn create(dir: &Path) -> Option<File> {
        static PROC_FD: OnceLock<bool> = OnceLock::new();
        if !*PROC_FD.get_or_init(|| Path::new("/proc/self/fd").is_dir()) {
            return None;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o666)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
            .open(dir)
            .ok()
    }

    /// Give the complete unnamed `file` a fresh hidden name beside `dest`
    /// (`linkat` through `/proc/self/fd`, which needs no privilege), to be
    /// renamed over `dest`.
    pub(super) fn link(file: &File, dest: &Path) -> Result<PathBuf> {
        let name = file_name(dest)?;
        let dir = parent_dir(dest);
        let from = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .expect("no NUL in a number");
        loop {
            let to = partial_name(&dir, &name);
            let to_c = std::ffi::CString::new(to.as_os_str().as_bytes())
                .map_err(|e| Error::io(dest, std::io::Error::other(e)))?;
            // SAFETY: two NUL-terminated paths; no memory is kept.
            let rc = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to_c.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            if rc == 0 {
                return Ok(to);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(Error::io(dest, e));
            }
        }
    }

    /// Note that this process is building `dest` in the unnamed `file`.
    pub(super) fn building(dest: &Path, file: &File) {
        let mut list = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        list.push((dest.to_path_buf(), file.as_raw_fd()));
    }

    /// `file` is committed or dropped: forget it (before it is closed, so
    /// its descriptor is never looked up after it is reused).
    pub(super) fn done(file: &File) {
        let mut list = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|(_, fd)| *fd != file.as_raw_fd());
    }

    /// The sizes of this process's unnamed partials whose destination
    /// `wanted` picks.
    pub(super) fn sizes(wanted: impl Fn(&Path) -> bool) -> Vec<u64> {
        let list = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
        list.iter()
            .filter(|(dest, _)| wanted(dest))
            .filter_map(|&(_, fd)| {
                // SAFETY: the descriptor is open while it is listed (it is
                // removed under this lock before it is closed), and
                // ManuallyDrop never closes it.
                let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
                file.metadata().ok().map(|m| m.len())
            })
            .collect()
    }
}

/// The size of the partial this process is building for `dest` without a
/// name (see [`Partial`]), if it is building one: what a progress display
/// watches, with [`partials_of`] for a named partial.
pub fn unnamed_partial_len(dest: &Path) -> Option<u64> {
    unnamed::sizes(|d| d == dest).first().copied()
}

/// The bytes of every unnamed partial this process is building in `dir`
/// (the shards of a checkpoint in its staging directory).
pub fn unnamed_partials_len_in(dir: &Path) -> u64 {
    unnamed::sizes(|d| d.parent() == Some(dir)).iter().sum()
}

/// Write the file for `dest` through `write`, which writes a local file at
/// the path it is given (publishing it there, as every writer does). For a
/// local `dest` that path is `dest` itself; for an object URL it is a file
/// in a private spool, uploaded when complete (multipart: nothing is
/// visible at `dest` before the upload completes). Returns what `write`
/// returns.
pub fn to_location(
    dest: &Path,
    storage_options: &[(String, String)],
    write: impl FnOnce(&Path) -> Result<u64>,
) -> Result<u64> {
    if !crate::location::is_url(dest) {
        return write(dest);
    }
    #[cfg(feature = "remote")]
    return crate::remote::write_then_upload(dest, storage_options, write);
    #[cfg(not(feature = "remote"))]
    {
        let _ = (storage_options, write);
        Err(Error::Remote {
            ctx: Context::file(dest),
            kind: crate::error::RemoteKind::Unsupported,
            detail: "this build of zt has no object-storage support (the `remote` feature)".into(),
        })
    }
}

/// Flush a directory's entries (a rename into it) to disk.
pub fn sync_dir(dir: &Path) -> Result<()> {
    let d = File::open(dir).map_err(|e| Error::io(dir, e))?;
    d.sync_all().map_err(|e| Error::io(dir, e))
}

/// Flush the data of every file in `paths` to disk, the files in
/// parallel (the device sees all their writes at once, not one file's
/// after another's).
pub fn sync_files(paths: &[PathBuf]) -> Result<()> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = paths
            .iter()
            .map(|p| {
                s.spawn(move || {
                    File::open(p)
                        .and_then(|f| f.sync_data())
                        .map_err(|e| Error::io(p, e))
                })
            })
            .collect();
        // Every job is joined (the scope waits for the rest on an error).
        jobs.into_iter()
            .try_for_each(|j| j.join().expect("fsync does not panic"))
    })
}

/// Start writing a complete file's dirty pages to disk without waiting
/// (Linux `sync_file_range(SYNC_FILE_RANGE_WRITE)`), so the device works
/// while the next file is built; a later [`sync_files`] waits for it.
/// Best effort: elsewhere, or on error, the later sync does all the work.
pub fn start_writeback(path: &Path) {
    if let Ok(f) = File::open(path) {
        start_writeback_range(&f, 0, 0);
    }
}

/// Start writing `len` bytes of `file` from `offset` (`len` 0: to the end)
/// to disk without waiting, as [`start_writeback`] does for a whole file:
/// a writer that will fsync calls it on what it has written so far, so the
/// device writes while the rest is built and the fsync at the end waits
/// only for the tail. Best effort, as [`start_writeback`].
pub fn start_writeback_range(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: a valid descriptor and a byte range; no memory passed.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// A file built front to back starts the device on every this many bytes
/// written ([`WriteBehind`], and the `.zt` writer's own sink).
pub const WRITEBACK_STEP: u64 = 8 << 20;

/// A new file written front to back that starts writeback of every
/// [`WRITEBACK_STEP`] bytes as they reach it ([`start_writeback_range`]):
/// the device works while the rest is built, and the fsync that makes the
/// file durable waits for the last step, not the whole file (measured by
/// `python -m harness --only write`). A file that will not be
/// fsynced starts none ([`WriteBehind::lazy`]): the page cache absorbs the
/// write, as it does for every writer that does not sync.
pub struct WriteBehind<'f> {
    file: &'f File,
    /// Bytes written so far, and the offset up to which writeback started.
    written: u64,
    started: u64,
    /// Whether writeback is started by steps at all.
    early: bool,
}

impl<'f> WriteBehind<'f> {
    /// Write into `file` from its start.
    pub fn new(file: &'f File) -> Self {
        WriteBehind {
            file,
            written: 0,
            started: 0,
            early: true,
        }
    }

    /// [`WriteBehind::new`] for a file that is not fsynced when complete
    /// (`durable=False`): plain writes, no writeback started.
    pub fn lazy(file: &'f File) -> Self {
        WriteBehind {
            early: false,
            ..WriteBehind::new(file)
        }
    }
}

impl Write for WriteBehind<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = (&mut &*self.file).write(buf)?;
        self.written += n as u64;
        if self.early && self.written - self.started >= WRITEBACK_STEP {
            start_writeback_range(self.file, self.started, self.written - self.started);
            self.started = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What a buffered writer's body writes through: a 1 MiB buffer over the
/// partial file ([`WriteBehind`]).
pub type Body<'f> = BufWriter<WriteBehind<'f>>;

/// Write a file through `body` (buffered) into a partial beside `path`,
/// then commit it (durably) over `path`. Returns the bytes written. On any
/// error the partial is removed and `path` is left as it was.
pub fn publish(
    path: &Path,
    body: impl FnOnce(&mut Body<'_>) -> std::io::Result<()>,
) -> Result<u64> {
    publish_with(path, true, body)
}

/// [`publish`], fsyncing the file and its directory only when `durable`
/// (a caller that syncs many files together passes false).
pub fn publish_with(
    path: &Path,
    durable: bool,
    body: impl FnOnce(&mut Body<'_>) -> std::io::Result<()>,
) -> Result<u64> {
    let partial = Partial::create(path)?;
    let behind = if durable {
        WriteBehind::new(partial.file())
    } else {
        WriteBehind::lazy(partial.file())
    };
    let mut w = BufWriter::with_capacity(1 << 20, behind);
    body(&mut w).map_err(|e| Error::io(path, e))?;
    w.flush().map_err(|e| Error::io(path, e))?;
    drop(w);
    let written = partial
        .file()
        .metadata()
        .map_err(|e| Error::io(path, e))?
        .len();
    partial.commit(durable)?;
    Ok(written)
}

/// [`publish_with`] for a body that reads as it writes (a conversion
/// fetching each tensor from its source): the body fails with zt's own
/// errors (a write's `std::io::Error` wrapped by [`Error::io`] at `path`),
/// and its error comes back as itself, the partial file removed.
pub fn publish_reading(
    path: &Path,
    durable: bool,
    body: impl FnOnce(&mut Body<'_>) -> Result<()>,
) -> Result<u64> {
    let mut failed = None;
    let written = publish_with(path, durable, |w| {
        body(w).map_err(|e| {
            failed = Some(e);
            std::io::Error::other("the body failed")
        })
    });
    match failed {
        Some(e) => Err(e),
        None => written,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn write_behind_writes_every_byte_and_starts_writeback_by_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        let piece: Vec<u8> = (0..1_000_003).map(|i| (i % 251) as u8).collect();
        let mut w = WriteBehind::new(&file);
        let mut want = Vec::new();
        while (want.len() as u64) < 2 * WRITEBACK_STEP + WRITEBACK_STEP / 2 {
            w.write_all(&piece).unwrap();
            want.extend_from_slice(&piece);
        }
        // Two steps started, each at what had reached the file.
        assert_eq!(w.written, want.len() as u64);
        assert!(w.started >= 2 * WRITEBACK_STEP && w.started <= w.written);
        // A file that will not be fsynced starts none.
        let other = File::create(dir.path().join("lazy")).unwrap();
        let mut lazy = WriteBehind::lazy(&other);
        lazy.write_all(&want).unwrap();
        assert_eq!((lazy.written, lazy.started), (want.len() as u64, 0));
        assert!(w.written - w.started < WRITEBACK_STEP);
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }

    #[test]
    fn failed_body_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("x.bin");
        let err = publish(&dest, |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("boom"))
        });
        assert!(err.is_err());
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn success_replaces_destination() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("x.bin");
        std::fs::write(&dest, b"old").unwrap();
        assert_eq!(publish(&dest, |w| w.write_all(b"new!")).unwrap(), 4);
        assert_eq!(std::fs::read(&dest).unwrap(), b"new!");
        assert_eq!(names(dir.path()), ["x.bin"]);
    }

    #[test]
    fn planted_symlink_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let dest = dir.path().join("x.bin");
        // An attacker cannot know the random suffix; plant the old
        // predictable name and a would-be collision anyway.
        let old_style = dir
            .path()
            .join(format!(".x.bin.{}.partial", std::process::id()));
        std::os::unix::fs::symlink(&victim, &old_style).unwrap();
        publish(&dest, |w| w.write_all(b"data")).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&dest).unwrap(), b"data");
    }

    #[test]
    fn stale_partials_are_removed_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("m.safetensors");
        // A stale partial: right name pattern, nobody holds its lock.
        let stale = dir
            .path()
            .join(".m.safetensors.999999.00000000deadbeef.partial");
        std::fs::write(&stale, vec![0u8; 100]).unwrap();
        let live = Partial::create_as(&dest, false).unwrap();
        assert!(
            !stale.exists(),
            "a stale partial is removed by the next write"
        );
        assert_eq!(partials_of(&dest).unwrap(), [live.path().unwrap()]);
        // A second writer to the same destination leaves the live one.
        let second = Partial::create_as(&dest, false).unwrap();
        assert!(live.path().unwrap().exists());
        assert_eq!(partials_of(&dest).unwrap().len(), 2);
        drop(second);
        drop(live);
        assert!(names(dir.path()).is_empty());
    }

    #[test]
    fn a_destination_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        for (dest, kind) in [
            (Path::new("/dev/null"), "a character device"),
            (fifo.as_path(), "a FIFO"),
            (sub.as_path(), "a directory"),
            (link.as_path(), "a character device"),
        ] {
            let err = publish(dest, |w| w.write_all(b"x")).unwrap_err();
            assert_eq!(err.rule(), Some(Rule::WRITE_DESTINATION), "{err}");
            assert!(err.to_string().contains(kind), "{err}");
            assert!(Staging::create(dest).is_err());
        }
        let meta = std::fs::metadata("/dev/null").unwrap();
        assert!(std::os::unix::fs::FileTypeExt::is_char_device(
            &meta.file_type()
        ));
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(
            &std::fs::symlink_metadata(&fifo).unwrap().file_type()
        ));
    }

    #[test]
    fn an_unnamed_partial_is_invisible_until_committed() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("m.safetensors");
        let partial = Partial::create(&dest).unwrap();
        if partial.path().is_some() {
            eprintln!("this filesystem has no O_TMPFILE: a named partial was made");
            return;
        }
        partial.file().write_all(&[7u8; 5000]).unwrap();
        // Nothing in the directory a killed writer could leave.
        assert!(names(dir.path()).is_empty());
        assert_eq!(unnamed_partial_len(&dest), Some(5000));
        assert_eq!(unnamed_partials_len_in(dir.path()), 5000);
        partial.commit(true).unwrap();
        assert_eq!(names(dir.path()), ["m.safetensors"]);
        assert_eq!(std::fs::read(&dest).unwrap(), [7u8; 5000]);
        assert_eq!(unnamed_partial_len(&dest), None);
        // Dropped: gone, and forgotten.
        let partial = Partial::create(&dest).unwrap();
        partial.file().write_all(b"half").unwrap();
        drop(partial);
        assert_eq!(names(dir.path()), ["m.safetensors"]);
        assert_eq!(std::fs::read(&dest).unwrap(), [7u8; 5000]);
        assert_eq!(unnamed_partials_len_in(dir.path()), 0);
    }

    #[test]
    fn a_name_at_the_filesystems_limit_is_written() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a".repeat(NAME_MAX), "é".repeat(NAME_MAX / 2)] {
            let dest = dir.path().join(&name);
            let live = Partial::create_as(&dest, false).unwrap();
            let partial = live.path().unwrap().file_name().unwrap().len();
            assert!(partial <= NAME_MAX, "{partial}");
            assert_eq!(partials_of(&dest).unwrap(), [live.path().unwrap()]);
            drop(live);
            publish(&dest, |w| w.write_all(b"x")).unwrap();
            assert_eq!(std::fs::read(&dest).unwrap(), b"x");
            let staging = Staging::create(&dest).unwrap();
            assert!(staging.path().exists());
        }
    }

    #[test]
    fn destination_directory_must_be_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let err = Partial::create(&file.join("x.bin")).unwrap_err();
        assert!(matches!(err, Error::Write { .. }), "{err:?}");
    }
}
