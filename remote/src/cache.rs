//! A local cache of whole objects, so a model read again is served by the
//! ordinary mmap path (zero-copy again) instead of the network.
//!
//! An object is cached as `KEY.obj`, KEY a digest of its URL and its
//! version (ETag, or size and last-modified stamp), so a replaced object is
//! a new entry and a stale one is never served. A download lands in a
//! sparse `KEY.PID.RANDOM.partial` (parts written in parallel through a
//! writable mapping) and is renamed into place when complete. `KEY.lock`
//! serialises downloads of one object across processes; `.cache.lock`
//! serialises eviction, which removes the least recently used entries
//! (by modification time, touched on every hit) until the directory fits
//! its bound. Removing a file another process has mapped is safe: its
//! mapping stays valid until it is dropped.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::object::RemoteObject;

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::io(path.display(), e)
}

/// The cache file of `object` in `dir`.
pub fn entry_path(object: &RemoteObject, dir: &Path) -> PathBuf {
    let url = xxhash_rust::xxh3::xxh3_64(object.url().as_bytes());
    let version = xxhash_rust::xxh3::xxh3_64(object.version_key().as_bytes());
    dir.join(format!("{url:016x}-{version:016x}.obj"))
}

fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// The local copy of `object` in `dir`, downloading it first if the cache
/// does not hold this version; then evict down to `max_bytes`.
pub fn cached_copy(object: &RemoteObject, dir: &Path, max_bytes: u64) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let entry = entry_path(object, dir);
    let fresh = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.len() == object.len());
    if fresh(&entry) {
        touch(&entry);
        return Ok(entry);
    }
    let lock_path = entry.with_extension("lock");
    let lock = zt_fsutil::open_lock_file(&lock_path).map_err(|e| io(&lock_path, e))?;
    zt_fsutil::lock(&lock, zt_fsutil::Lock::Exclusive, true).map_err(|e| io(&lock_path, e))?;
    // Another process may have finished the download while we waited.
    if !fresh(&entry) {
        download(object, &entry)?;
    }
    drop(lock);
    let _ = std::fs::remove_file(&lock_path);
    evict(dir, max_bytes, &entry)?;
    Ok(entry)
}

fn download(object: &RemoteObject, entry: &Path) -> Result<()> {
    let tmp = entry.with_extension(format!(
        "{}.{:016x}.partial",
        std::process::id(),
        zt_fsutil::random_u64()
    ));
    let file = zt_fsutil::create_new(&tmp).map_err(|e| io(&tmp, e))?;
    let guard = RemoveOnDrop(tmp.clone());
    file.set_len(object.len()).map_err(|e| io(&tmp, e))?;
    if !object.is_empty() {
        // SAFETY: the file is private to this process (created O_EXCL under
        // a random name) and is not resized while mapped.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.map_err(|e| io(&tmp, e))?;
        object.read_into(0, &mut map[..])?;
        map.flush().map_err(|e| io(&tmp, e))?;
    }
    std::fs::rename(&tmp, entry).map_err(|e| io(entry, e))?;
    std::mem::forget(guard);
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Remove least recently used entries until the cache fits `max_bytes`
/// (never `keep`, the entry just served). Partial downloads of dead
/// processes are removed too.
pub fn evict(dir: &Path, max_bytes: u64, keep: &Path) -> Result<()> {
    let lock_path = dir.join(".cache.lock");
    let lock = zt_fsutil::open_lock_file(&lock_path).map_err(|e| io(&lock_path, e))?;
    zt_fsutil::lock(&lock, zt_fsutil::Lock::Exclusive, true).map_err(|e| io(&lock_path, e))?;
    let mut entries = Vec::new();
    let mut total = 0u64;
    for e in std::fs::read_dir(dir).map_err(|e| io(dir, e))?.flatten() {
        let path = e.path();
        let Ok(meta) = e.metadata() else { continue };
        match path.extension().and_then(|x| x.to_str()) {
            Some("obj") => {
                total += meta.len();
                let when = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                entries.push((when, meta.len(), path));
            }
            Some("partial") => {
                // A partial download whose process is gone: its pid field.
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let pid = name.split('.').nth(1).and_then(|p| p.parse::<i32>().ok());
                // SAFETY: kill with signal 0 only checks that the pid exists.
                if pid.is_some_and(|p| unsafe { libc::kill(p, 0) } != 0) {
                    let _ = std::fs::remove_file(&path);
                }
            }
            _ => {}
        }
    }
    entries.sort();
    for (_, len, path) in entries {
        if total <= max_bytes {
            break;
        }
        if path == keep {
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
    Ok(())
}
