//! What the benchmarks need from the operating system: the filesystem under
//! the bench directory (tmpfs is refused: it would measure RAM, not
//! storage), dropping a file from the page cache (`fsync`, then
//! `posix_fadvise(DONTNEED)`), checking with `mincore` how much of it is
//! still cached, and a record of the machine.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::stats::Res;

/// The filesystem `path` lives on, by `statfs` magic number.
pub fn filesystem(path: &Path) -> io::Result<&'static str> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statfs fills the zeroed struct; `c` is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type is i64 or u32 depending on the libc
    Ok(match st.f_type as i64 {
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794c_7630 => "overlayfs",
        0x2FC1_2FC1 => "zfs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        _ => "other",
    })
}

/// Create `dir` and refuse it when it is in memory (tmpfs, ramfs).
pub fn bench_dir(dir: &Path) -> Res<&'static str> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let fs = filesystem(dir)?;
    if matches!(fs, "tmpfs" | "ramfs") {
        return Err(format!(
            "{} is on {fs}: it would measure memory, not storage; pass --dir on a real disk",
            dir.display()
        )
        .into());
    }
    Ok(fs)
}

/// Write back and drop a file's pages from the page cache. Pages that a
/// process still maps stay, so close every `Source` on it first.
pub fn drop_cache(path: &Path) -> io::Result<()> {
    let file = File::open(path)?;
    file.sync_all()?;
    // SAFETY: a valid descriptor; offset 0, length 0 means the whole file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// `sync(2)`: write back every dirty page, so one case's writeback does
/// not land in the next case's timer.
pub fn sync_all() {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::sync() };
}

/// The fraction of a file's pages in the page cache (`mincore` over a
/// fresh mapping, which itself faults nothing in).
pub fn cached_fraction(path: &Path) -> io::Result<f64> {
    let file = File::open(path)?;
    let len = file.metadata()?.len() as usize;
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: a read-only shared mapping of a file we hold open; unmapped
    // below before `file` closes; mincore writes one byte per page of it.
    unsafe {
        let addr = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let page = libc::sysconf(libc::_SC_PAGESIZE) as usize;
        let mut vec = vec![0u8; len.div_ceil(page)];
        let rc = libc::mincore(addr, len, vec.as_mut_ptr());
        let err = io::Error::last_os_error();
        libc::munmap(addr, len);
        if rc != 0 {
            return Err(err);
        }
        let resident = vec.iter().filter(|&&b| b & 1 != 0).count();
        Ok(resident as f64 / vec.len() as f64)
    }
}

/// Bytes a directory tree (or file) occupies on disk (allocated blocks).
pub fn disk_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return Ok(meta.blocks() * 512);
    }
    let mut total = 0;
    for entry in std::fs::read_dir(path)? {
        total += disk_bytes(&entry?.path())?;
    }
    Ok(total)
}

/// Remove a file or a directory tree if it exists.
pub fn remove(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// One line describing the machine: CPU, cores, memory, kernel, the bench
/// directory's filesystem, the build.
pub fn machine(fs: &str) -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU".to_string(), |(_, v)| v.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or("?".to_string(), |kb| {
            format!("{:.1}", kb / (1u64 << 20) as f64)
        });
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    format!(
        "{cpu}, {cores} cores, {mem_gib} GiB, Linux {}, bench dir on {fs}, load average {load}; zt-bench {} ({profile} build)",
        kernel(),
        env!("CARGO_PKG_VERSION"),
    )
}

fn kernel() -> String {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated.
    unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        if libc::uname(&mut u) != 0 {
            return "?".into();
        }
        CStr::from_ptr(u.release.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}
