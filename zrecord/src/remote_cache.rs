//! `cache="dir"` for record stores in object storage: the store's objects
//! (`meta.zr`, the shards, the dictionary) are kept whole in zt-remote's
//! object cache (`zt_remote::cache`: entries keyed by URL and ETag, so a
//! replaced object is a new entry and a stale one is never served; one
//! download per entry across processes, under its lock, so the ranks of a
//! machine share one copy; least recently used entries evicted past
//! `cache_bytes`), and the store is opened locally through a view: a
//! directory of symbolic links named as the store's files, pointing at
//! the entries, under `dir/stores/`. Every gather, every epoch and every
//! rank then reads mapped local files.
//!
//! A store larger than `cache_bytes` is not cached (it is read by ranges,
//! as without `cache`); nor is one whose entries another process evicted
//! between the download and the open.

use std::path::{Path, PathBuf};

use zt_remote::RemoteObject;

/// The directory, under `dir`, holding the views of cached stores.
const VIEWS: &str = "stores";

/// A local directory opening as the store at `url`, whose objects are
/// `objects` (file name, object), each fetched into the cache at `dir`
/// first, and whose `empty` shards are empty files; `None` when the
/// store's bytes exceed `max_bytes`.
pub(crate) fn view(
    url: &str,
    objects: &[(String, &RemoteObject)],
    empty: &[String],
    dir: &Path,
    max_bytes: u64,
) -> zt_remote::Result<Option<PathBuf>> {
    let total: u64 = objects.iter().map(|(_, o)| o.len()).sum();
    if total > max_bytes {
        return Ok(None);
    }
    let mut key = xxhash_rust::xxh3::Xxh3::new();
    key.update(url.as_bytes());
    for name in empty {
        key.update(b"\0");
        key.update(name.as_bytes());
    }
    let mut entries = Vec::with_capacity(objects.len());
    for (name, object) in objects {
        key.update(b"\0");
        key.update(name.as_bytes());
        key.update(b"\0");
        key.update(object.version_key().as_bytes());
        entries.push((name, zt_remote::cache::cached_copy(object, dir, max_bytes)?));
    }
    let views = dir.join(VIEWS);
    let view = views.join(format!("{:016x}", key.digest()));
    if view.is_dir() {
        return Ok(Some(view));
    }
    let io = |p: &Path, e| zt_remote::Error::io(p.display(), e);
    std::fs::create_dir_all(&views).map_err(|e| io(&views, e))?;
    // Built beside and renamed into place: another rank opening the same
    // store sees a whole view or none.
    let partial = views.join(format!(
        ".{:016x}.{}.{:016x}",
        key.digest(),
        std::process::id(),
        zt_fsutil::random_u64()
    ));
    std::fs::create_dir(&partial).map_err(|e| io(&partial, e))?;
    for (name, entry) in &entries {
        let link = partial.join(name);
        std::os::unix::fs::symlink(entry, &link).map_err(|e| io(&link, e))?;
    }
    for name in empty {
        let file = partial.join(name);
        std::fs::File::create(&file).map_err(|e| io(&file, e))?;
    }
    if std::fs::rename(&partial, &view).is_err() {
        // Another process put the same view in place first.
        let _ = std::fs::remove_dir_all(&partial);
    }
    Ok(Some(view))
}
