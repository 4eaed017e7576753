//! Opening the related files of one opened file by names relative to its
//! directory, with the directory resolved once.
//!
//! A memmap directory of TensorDict holds a file per leaf (hundreds of
//! them); resolving the directory and the name with every symlink followed
//! for each of them asked for the working directory and read every path
//! component as a link, leaf after leaf. Here the directory is opened
//! once, as a descriptor, and each name is opened from it by `openat2` with
//! `RESOLVE_BENEATH`: the kernel refuses any resolution that leaves the
//! directory, symlinks included, in the one call that opens the file, so
//! the file checked is the file opened. Whatever that call does not accept
//! (an error, an absolute symlink that points back inside, a kernel or
//! sandbox without `openat2`) is left to the caller's path-based check,
//! which gives the verdict and the error it always gave; this is only the
//! fast way to the same answer.

use std::fs::File;
use std::path::Path;

/// `struct open_how` of `linux/openat2.h`, its first version (24 bytes):
/// libc's is non-exhaustive, so it cannot be built field by field.
#[cfg(target_os = "linux")]
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// A directory opened once, for opening names under it.
#[derive(Debug)]
pub(super) struct Beneath {
    #[cfg(target_os = "linux")]
    dir: std::os::fd::OwnedFd,
}

impl Beneath {
    /// Open `dir` as a path descriptor (no read permission needed); `None`
    /// where it cannot be (the caller then checks every name by path).
    pub(super) fn open(dir: &Path) -> Option<Beneath> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            let dir = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(dir)
                .ok()?;
            Some(Beneath { dir: dir.into() })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = dir;
            None
        }
    }

    /// `rel` (plain relative components, checked by the caller) opened
    /// read-only when it resolves inside the directory, symlinks followed,
    /// and is a regular file, with its length; `None` for anything else,
    /// which the caller's path-based check then decides (and words).
    pub(super) fn open_regular(&self, rel: &Path) -> Option<(File, u64)> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::{AsRawFd, FromRawFd};
            use std::os::unix::ffi::OsStrExt;
            let name = std::ffi::CString::new(rel.as_os_str().as_bytes()).ok()?;
            // O_NONBLOCK: a FIFO planted under a leaf's name must not block
            // the open; the type is checked below before anything is read.
            let how = OpenHow {
                flags: (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY)
                    as u64,
                mode: 0,
                resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS,
            };
            // SAFETY: `name` is NUL-terminated and `how` a valid open_how of
            // the size passed; the kernel reads both and writes nothing.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat2,
                    self.dir.as_raw_fd(),
                    name.as_ptr(),
                    &how as *const OpenHow,
                    std::mem::size_of::<OpenHow>(),
                )
            };
            if fd < 0 {
                return None; // EXDEV (leaves the directory), ENOSYS, EPERM, ENOENT ...
            }
            // SAFETY: the kernel just returned this descriptor to us alone.
            let file = unsafe { File::from_raw_fd(fd as libc::c_int) };
            let meta = file.metadata().ok()?;
            if !meta.file_type().is_file() {
                return None;
            }
            // A regular file: blocking again (F_SETFL with no flags clears
            // O_NONBLOCK, the only status flag the open set).
            // SAFETY: fcntl on a descriptor this function owns; no memory passed.
            if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) } < 0 {
                return None;
            }
            Some((file, meta.len()))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = rel;
            None
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn names_inside_open_and_every_way_out_is_left_to_the_path_check() {
        let outer = tempfile::tempdir().unwrap();
        let dir = outer.path().join("d");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("a.bin"), b"abc").unwrap();
        std::fs::write(dir.join("sub/b.bin"), b"hello").unwrap();
        std::fs::write(outer.path().join("secret"), b"no").unwrap();
        symlink("a.bin", dir.join("inside")).unwrap();
        symlink("../secret", dir.join("out")).unwrap();
        symlink(outer.path().join("secret"), dir.join("abs_out")).unwrap();
        symlink(dir.join("a.bin"), dir.join("abs_in")).unwrap();
        symlink("..", dir.join("up")).unwrap();
        let b = Beneath::open(&dir).unwrap();
        let read = |name: &str| {
            b.open_regular(Path::new(name)).map(|(f, len)| {
                let mut s = Vec::new();
                std::io::Read::read_to_end(&mut &f, &mut s).unwrap();
                assert_eq!(s.len() as u64, len);
                s
            })
        };
        assert_eq!(read("a.bin").unwrap(), b"abc");
        assert_eq!(read("sub/b.bin").unwrap(), b"hello");
        assert_eq!(read("./sub/b.bin").unwrap(), b"hello");
        assert_eq!(read("inside").unwrap(), b"abc");
        // Out of the directory, or not a regular file: never opened here.
        assert!(read("out").is_none());
        assert!(read("abs_out").is_none());
        assert!(read("up/secret").is_none());
        assert!(read("sub").is_none());
        assert!(read("missing").is_none());
        // An absolute link back inside is refused by RESOLVE_BENEATH too;
        // the caller's path check accepts it (see format.rs's tests).
        assert!(read("abs_in").is_none());
    }
}
