//! File helpers: non-blocking `flock` (the lock loaderx takes, so the two
//! implementations exclude each other; shared with every zt crate through
//! `zt-fsutil`) and a vectored positional write.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

pub use zt_fsutil::try_lock;

/// Most iovecs handed to one `pwritev` (Linux's IOV_MAX is 1024).
const IOV_BATCH: usize = 512;

/// Write every byte of `bufs`, in order, starting at `offset`.
pub fn write_all_vectored_at(file: &File, bufs: &[&[u8]], mut offset: u64) -> io::Result<()> {
    let mut idx = 0;
    let mut skip = 0usize;
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(IOV_BATCH.min(bufs.len()));
    while idx < bufs.len() {
        if bufs[idx].len() == skip {
            idx += 1;
            skip = 0;
            continue;
        }
        if bufs.len() - idx == 1 {
            // One buffer left: the plain call handles short writes itself.
            return file.write_all_at(&bufs[idx][skip..], offset);
        }
        iov.clear();
        for (k, b) in bufs[idx..].iter().take(IOV_BATCH).enumerate() {
            let b = if k == 0 { &b[skip..] } else { b };
            iov.push(libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            });
        }
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: every iovec points into a live borrowed slice.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                off,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        let mut rem = n as usize;
        offset += rem as u64;
        while rem > 0 {
            let avail = bufs[idx].len() - skip;
            if rem >= avail {
                rem -= avail;
                idx += 1;
                skip = 0;
            } else {
                skip += rem;
                rem = 0;
            }
        }
    }
    Ok(())
}
