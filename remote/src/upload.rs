//! Uploads: a file built locally (in a [`Spool`]) is sent by multipart
//! upload, so nothing is visible at the destination until the upload
//! completes: the remote twin of build-beside-and-rename.
//!
//! An error aborts the upload. A killed process cannot, and an abort may
//! fail too (the server gone, the network down), so every multipart upload
//! is recorded in a journal file (`zt-uploads/` in the spool directory)
//! locked for as long as its uploader lives, and kept when its abort
//! failed; the next upload, or [`abort_orphans`] (`zt clean`), aborts the
//! uploads of journals whose lock is free, so no orphaned parts stay behind
//! on the server.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use object_store::multipart::{MultipartStore, PartId};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::config::{spool_dir, RemoteConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{backend_for, block_on, block_on_store, stats, Stats};
use crate::url::{ObjectUrl, Scheme};
use crate::watch;

/// A private directory for building files that will be uploaded, removed
/// with everything in it when dropped. A spool left by a killed process
/// (its lock free) is removed by the next [`Spool::create`].
#[derive(Debug)]
pub struct Spool {
    dir: PathBuf,
    _lock: File,
}

const SPOOL_PREFIX: &str = "zt-spool-";

impl Spool {
    /// A fresh spool under the configured spool directory.
    pub fn create(config: &RemoteConfig) -> Result<Spool> {
        let base = spool_dir(config);
        remove_stale_spools(&base);
        loop {
            let dir = base.join(format!(
                "{SPOOL_PREFIX}{}-{:016x}",
                std::process::id(),
                zt_fsutil::random_u64()
            ));
            match std::fs::create_dir(&dir) {
                Ok(()) => {
                    let lock = zt_fsutil::create_locked(&dir.join(".lock"))
                        .map_err(|e| Error::io(dir.display(), e))?;
                    return Ok(Spool { dir, _lock: lock });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(dir.display(), e)),
            }
        }
    }

    /// The local path for a file named `name` (the object's last key
    /// component, so writers that choose a format by extension see it).
    pub fn path_for(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Remove spools under `base` whose owner died. Returns what was removed.
pub fn remove_stale_spools(base: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(base) else {
        return removed;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(SPOOL_PREFIX) {
            continue;
        }
        let dir = entry.path();
        if zt_fsutil::is_stale(&dir.join(".lock")) && std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(dir);
        }
    }
    removed
}

/// Where upload journals live: the multipart ones (`.upload`) and the
/// leftover objects of failed writes (`leftovers.rs`).
pub(crate) fn journal_dir(config: &RemoteConfig) -> PathBuf {
    spool_dir(config).join("zt-uploads")
}

/// A new journal file `PID-RANDOM.EXTENSION` in [`journal_dir`], locked
/// while the returned file is open (a free lock marks a journal as no live
/// writer's).
pub(crate) fn create_journal(config: &RemoteConfig, extension: &str) -> Result<(PathBuf, File)> {
    let dir = journal_dir(config);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
    let path = dir.join(format!(
        "{}-{:016x}.{extension}",
        std::process::id(),
        zt_fsutil::random_u64()
    ));
    let file = zt_fsutil::create_locked(&path).map_err(|e| Error::io(path.display(), e))?;
    Ok((path, file))
}

/// A multipart upload in progress, recorded (and locked) in the journal.
struct Journal {
    path: PathBuf,
    _file: File,
    kept: bool,
}

impl Journal {
    fn record(config: &RemoteConfig, url: &str, id: &str) -> Result<Journal> {
        let (path, mut file) = create_journal(config, "upload")?;
        writeln!(file, "{url}\n{id}").map_err(|e| Error::io(path.display(), e))?;
        Ok(Journal {
            path,
            _file: file,
            kept: false,
        })
    }
}

impl Journal {
    /// Close the journal but keep its entry: the upload is still open on
    /// the server, and the next upload ([`abort_orphans`]) aborts it (the
    /// lock, released with the file, marks it as no live uploader's).
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Abort the multipart uploads of processes that died mid-upload (their
/// journal's lock is free). Returns the URLs whose uploads were aborted;
/// a journal whose abort fails (another endpoint, no network) is kept.
pub fn abort_orphans(config: &RemoteConfig) -> Vec<String> {
    let mut aborted = Vec::new();
    let Ok(entries) = std::fs::read_dir(journal_dir(config)) else {
        return aborted;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "upload") || !zt_fsutil::is_stale(&path) {
            continue;
        }
        let mut text = String::new();
        if File::open(&path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .is_err()
        {
            continue;
        }
        let mut lines = text.lines();
        let (Some(url), Some(id)) = (lines.next(), lines.next()) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        let Ok(parsed) = ObjectUrl::parse(url) else {
            continue;
        };
        let Some(store) = backend_for(&parsed, config)
            .ok()
            .and_then(|b| b.multipart())
        else {
            continue;
        };
        Stats::count(&stats().puts, 1);
        let done = block_on_store(url, store.abort_multipart(&parsed.path(), &id.to_string()));
        match done {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
                aborted.push(url.to_string());
            }
            Err(e) if e.kind == ErrorKind::NotFound => {
                let _ = std::fs::remove_file(&path);
                aborted.push(url.to_string());
            }
            Err(_) => {}
        }
    }
    aborted
}

/// The smallest part S3 and GCS's XML multipart API accept, every part but
/// the last: a smaller one is refused only at completion (`EntityTooSmall`),
/// after every byte went up.
pub const MIN_PART_SIZE: u64 = 5 << 20;

/// The most parts of one multipart upload: S3's and GCS's part numbers run
/// to 10,000; an Azure block blob holds at most 50,000 blocks.
fn max_parts(scheme: Scheme) -> u64 {
    match scheme {
        Scheme::Azure => 50_000,
        _ => 10_000,
    }
}

/// Refuse a `part_size` the backend of `target` would reject only once the
/// data is up: below [`MIN_PART_SIZE`] on S3 and GCS (Azure's blocks have
/// no minimum), or one that cuts `size` bytes into more parts than an
/// upload may have. Checked for any upload to S3 or GCS, however small
/// (a small file goes up in one PUT): the first write reports it, not
/// the first large one.
pub fn check_part_size(target: &ObjectUrl, size: u64, config: &RemoteConfig) -> Result<()> {
    let part = config.part_size;
    let minimum = matches!(target.scheme, Scheme::S3 | Scheme::Gcs);
    if minimum && part < MIN_PART_SIZE {
        return Err(Error::new(
            ErrorKind::Config,
            &target.text,
            format!(
                "part_size {part} is below the 5 MiB ({MIN_PART_SIZE} bytes) minimum part of a multipart upload to {} (every part but the last); set part_size to at least {MIN_PART_SIZE} for writing",
                if target.scheme == Scheme::S3 { "S3" } else { "Google Cloud Storage" }
            ),
        ));
    }
    let parts = size.div_ceil(part);
    if size > part && parts > max_parts(target.scheme) {
        let need = size.div_ceil(max_parts(target.scheme));
        return Err(Error::new(
            ErrorKind::Config,
            &target.text,
            format!(
                "{size} bytes in parts of {part} is {parts} parts, past the {} an upload may have; set part_size to at least {need}",
                max_parts(target.scheme)
            ),
        ));
    }
    Ok(())
}

/// Upload the local file `local` to `url` (S3, GCS or Azure; not plain
/// HTTP): one PUT when it fits
/// in a part, else a multipart upload of `part_size` parts, `concurrency`
/// in flight, completed only when every part is in; any error aborts it.
/// Returns the bytes uploaded.
pub fn upload_file(local: &Path, url: &str, config: &RemoteConfig) -> Result<u64> {
    upload_file_versioned(local, url, config).map(|(size, _)| size)
}

/// [`upload_file`], also returning the ETag the server gave the object
/// (what a caller that may have to delete it later records, so that only
/// this version is deleted).
pub fn upload_file_versioned(
    local: &Path,
    url: &str,
    config: &RemoteConfig,
) -> Result<(u64, Option<String>)> {
    let target = ObjectUrl::parse(url)?;
    if target.key.is_empty() || target.key.ends_with('/') {
        return Err(Error::new(
            ErrorKind::Config,
            url,
            "names a bucket or prefix, not an object",
        ));
    }
    let backend = backend_for(&target, config)?;
    let Some(multipart) = backend.multipart() else {
        return Err(Error::new(
            ErrorKind::Unsupported,
            url,
            "writing needs object storage (s3://, gs://, az://); plain HTTP servers are read-only",
        ));
    };
    let store = backend.store();
    debug_assert_ne!(target.scheme, Scheme::Http);
    abort_orphans(config);
    let file = Arc::new(File::open(local).map_err(|e| Error::io(local.display(), e))?);
    let size = file
        .metadata()
        .map_err(|e| Error::io(local.display(), e))?
        .len();
    check_part_size(&target, size, config)?;
    let path = target.path();
    if size <= config.part_size {
        let mut data = vec![0u8; size as usize];
        file.read_exact_at(&mut data, 0)
            .map_err(|e| Error::io(local.display(), e))?;
        Stats::count(&stats().puts, 1);
        Stats::count(&stats().bytes_out, size);
        let put = block_on_store(
            url,
            store.put_opts(&path, PutPayload::from(data), Default::default()),
        )?;
        return Ok((size, put.e_tag));
    }
    Stats::count(&stats().puts, 1);
    let id = block_on_store(url, multipart.create_multipart(&path))?;
    let journal = Journal::record(config, url, &id)?;
    let result = send_parts(&multipart, &path, &id, &file, size, config, url);
    let outcome = match result {
        Ok(parts) => {
            Stats::count(&stats().puts, 1);
            block_on_store(url, multipart.complete_multipart(&path, &id, parts))
                .map(|put| (size, put.e_tag))
        }
        Err(e) => Err(e),
    };
    let Err(mut e) = outcome else {
        drop(journal);
        return outcome;
    };
    Stats::count(&stats().puts, 1);
    match block_on_store(url, multipart.abort_multipart(&path, &id)) {
        Ok(()) => drop(journal),
        Err(gone) if gone.kind == ErrorKind::NotFound => drop(journal),
        Err(abort) => {
            // The upload is still open on the server: its id stays in the
            // journal for the next upload to abort.
            journal.keep();
            e.detail = format!(
                "{}; aborting the upload failed too ({}): it is kept in the journal and aborted by the next upload or `zt clean`",
                e.detail, abort.detail
            );
        }
    }
    Err(e)
}

/// Delete the object at `url` (S3, GCS or Azure). An object already gone
/// is no error: what the caller wants is its absence. Used to withdraw a
/// directory checkpoint's index before files it names are replaced, so a
/// failure partway leaves no index naming a mix of old and new files.
pub fn delete_object(url: &str, config: &RemoteConfig) -> Result<()> {
    let target = ObjectUrl::parse(url)?;
    if target.key.is_empty() || target.key.ends_with('/') || target.scheme == Scheme::Http {
        return Err(Error::new(
            ErrorKind::Config,
            url,
            "deleting needs an object on object storage (s3://, gs://, az://)",
        ));
    }
    let store = backend_for(&target, config)?.store();
    Stats::count(&stats().puts, 1);
    match block_on_store(url, store.delete(&target.path())) {
        Err(e) if e.kind == ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Send every part of `file`; the part ids in order.
fn send_parts(
    multipart: &Arc<dyn MultipartStore>,
    path: &object_store::path::Path,
    id: &String,
    file: &Arc<File>,
    size: u64,
    config: &RemoteConfig,
    url: &str,
) -> Result<Vec<PartId>> {
    let part = config.part_size;
    let count = size.div_ceil(part) as usize;
    let work = futures::stream::iter(0..count)
        .map(|i| {
            let (multipart, file) = (Arc::clone(multipart), Arc::clone(file));
            async move {
                let start = i as u64 * part;
                let len = part.min(size - start) as usize;
                let data = tokio::task::spawn_blocking(move || {
                    let mut buf = vec![0u8; len];
                    file.read_exact_at(&mut buf, start).map(|_| buf)
                })
                .await
                .map_err(|e| Error::new(ErrorKind::Io, url, e.to_string()))?
                .map_err(|e| Error::new(ErrorKind::Io, url, e.to_string()))?;
                Stats::count(&stats().puts, 1);
                Stats::count(&stats().bytes_out, len as u64);
                watch::scoped(async {
                    multipart
                        .put_part(path, id, i, PutPayload::from(data))
                        .await
                        .map_err(|e| Error::from_store(url, e))
                })
                .await
            }
        })
        .buffered(config.concurrency)
        .try_collect::<Vec<PartId>>();
    block_on(work)?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(part: u64) -> RemoteConfig {
        RemoteConfig::from_options(&[("part_size", part.to_string())]).unwrap()
    }

    #[test]
    fn part_sizes_the_server_would_refuse_at_completion_are_refused_first() {
        let s3 = ObjectUrl::parse("s3://b/k").unwrap();
        let gs = ObjectUrl::parse("gs://b/k").unwrap();
        let az = ObjectUrl::parse("az://c/k").unwrap();
        // Below 5 MiB: S3 and GCS refuse, whatever the size; Azure's
        // blocks have no minimum.
        for url in [&s3, &gs] {
            let e = check_part_size(url, 0, &config(MIN_PART_SIZE - 1)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Config);
            assert!(e.detail.contains("5 MiB"), "{}", e.detail);
            check_part_size(url, 1 << 30, &config(MIN_PART_SIZE)).unwrap();
        }
        check_part_size(&az, 1 << 30, &config(64 << 10)).unwrap();
        // Too many parts: 10,000 on S3 and GCS, 50,000 blocks on Azure.
        let size = 10_001 * MIN_PART_SIZE;
        let e = check_part_size(&s3, size, &config(MIN_PART_SIZE)).unwrap_err();
        assert!(
            e.detail.contains("10000 an upload may have"),
            "{}",
            e.detail
        );
        check_part_size(&s3, size, &config(MIN_PART_SIZE + (1 << 10))).unwrap();
        check_part_size(&az, size, &config(MIN_PART_SIZE)).unwrap();
        check_part_size(&az, 50_001 << 16, &config(64 << 10)).unwrap_err();
    }
}
