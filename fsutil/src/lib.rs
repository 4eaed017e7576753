//! # zt-fsutil: the file helpers every zt crate shares
//!
//! Lock files that say whether their owner is alive (a file whose `flock`
//! nobody holds belongs to a process that died and may be reclaimed), file
//! creation that never follows or reuses a planted name, and unguessable
//! names. Used by the core's publish, the object-storage spool, upload
//! journal and cache, and zrecord's store locks. Also the one CPU prefetch
//! hint the readers share ([`prefetch`]).

#![deny(missing_docs)]

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// How a lock is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lock {
    /// Many holders (readers).
    Shared,
    /// One holder.
    Exclusive,
}

/// `flock` on `file`; without `wait`, `Ok(false)` when another open file
/// description holds a conflicting lock.
pub fn lock(file: &File, kind: Lock, wait: bool) -> io::Result<bool> {
    let op = match kind {
        Lock::Shared => libc::LOCK_SH,
        Lock::Exclusive => libc::LOCK_EX,
    } | if wait { 0 } else { libc::LOCK_NB };
    loop {
        // SAFETY: flock on an open descriptor has no memory effects.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if !wait => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Try to take a shared or exclusive lock without waiting.
pub fn try_lock(file: &File, exclusive: bool) -> io::Result<bool> {
    let kind = if exclusive {
        Lock::Exclusive
    } else {
        Lock::Shared
    };
    lock(file, kind, false)
}

/// Open `path` read-only if it is a regular file (through symlinks, as
/// `open` follows them). Anything else is refused before a byte is read:
/// opening a FIFO for reading would block until a writer appears (forever,
/// for a model path), and a device or directory is no tensor file. The
/// open is non-blocking for that reason; the file is made blocking again
/// once it is known to be regular.
pub fn open_regular(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", file_kind(&kind)),
        ));
    }
    // SAFETY: fcntl on a descriptor this function owns; no memory passed.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0
        || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// What a file that is not a regular file is, in words ("a FIFO").
pub fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// Create a new file at `path` for reading and writing: `O_EXCL` (an
/// existing file or symlink there is an error, never opened) and
/// `O_NOFOLLOW`, close-on-exec.
pub fn create_new(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// [`create_new`], then lock it exclusively: the file lives as long as its
/// creator holds it open.
pub fn create_locked(path: &Path) -> io::Result<File> {
    let file = create_new(path)?;
    lock(&file, Lock::Exclusive, true)?;
    Ok(file)
}

/// Open (creating it if needed, never through a symlink) the lock file at
/// `path`.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// True if the file at `path` exists and nobody holds its lock (its owner
/// died). A file that cannot be opened, or whose lock is held, is not stale.
pub fn is_stale(path: &Path) -> bool {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    match opened {
        Ok(f) => try_lock(&f, true).unwrap_or(false),
        Err(_) => false,
    }
}

/// 64 unguessable bits for file names: the standard library's per-process
/// random hash keys, mixed with a counter and the time. (Names only need to
/// be unpredictable; `O_EXCL` makes a collision harmless.)
pub fn random_u64() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish()
}

/// Ask the CPU to bring the cache line at `item` in: a hint on x86-64,
/// nothing on other architectures. For walks whose next addresses are known
/// ahead but lie out of memory order.
#[inline(always)]
pub fn prefetch<T>(item: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing and never faults,
    // whatever the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(item.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_live_a_free_one_stale() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let held = create_locked(&path).unwrap();
        assert!(!is_stale(&path));
        drop(held);
        assert!(is_stale(&path));
        assert!(!is_stale(&dir.path().join("missing")));
    }

    #[test]
    fn create_new_refuses_planted_names() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(create_new(&link).is_err());
        assert!(create_new(&target).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_ne!(random_u64(), random_u64());
    }
}
