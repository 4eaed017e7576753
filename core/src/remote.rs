//! Object storage as a backing of [`Store`] (the `remote` feature): opening
//! `s3://` and `https://` objects, the local cache, and publishing written
//! files by upload. Plugins never see the difference: they read through
//! `Store::read` either way.

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use zt_remote as client;
use zt_remote::{ErrorKind, RemoteConfig, RemoteObject};

use crate::error::{Context, Error, RemoteKind, Result};
use crate::store::Store;

/// Translate an object-storage error into zt's, naming the URL.
pub fn error(e: zt_remote::Error) -> Error {
    let ctx = Context::file(&e.url);
    let kind = match e.kind {
        ErrorKind::NotFound => return Error::NotFound { ctx },
        ErrorKind::Memory { bytes } => {
            return Error::Memory {
                ctx,
                what: "a read from object storage",
                bytes,
            }
        }
        kind => kind,
    };
    Error::Remote {
        ctx,
        kind,
        detail: e.detail,
    }
}

/// The configuration storage options describe (environment and profile
/// files are read when a store is built).
pub fn config(storage_options: &[(String, String)]) -> Result<RemoteConfig> {
    RemoteConfig::from_options(storage_options).map_err(error)
}

/// Open the object at `url`: through the local cache (then mapped) when
/// the options name one, else read by ranged GETs.
pub fn open_store(url: &Path, storage_options: &[(String, String)]) -> Result<Store> {
    let text = url.to_str().ok_or_else(|| Error::Remote {
        ctx: Context::file(url),
        kind: RemoteKind::Config,
        detail: "the URL is not UTF-8".into(),
    })?;
    let config = Arc::new(config(storage_options)?);
    let object = RemoteObject::open(text, Arc::clone(&config)).map_err(error)?;
    match &config.cache_dir {
        Some(dir) => {
            let local =
                zt_remote::cache::cached_copy(&object, dir, config.cache_bytes).map_err(error)?;
            Store::open_as(&local, url)
        }
        None => Ok(Store::remote(url.to_path_buf(), Arc::new(object))),
    }
}

/// A file being written locally for an object URL: built in a private
/// spool, then uploaded (multipart: nothing is visible at the URL before
/// the upload completes). Dropping it without [`Staged::upload`] removes
/// the spool and uploads nothing.
#[derive(Debug)]
pub struct Staged {
    _spool: zt_remote::Spool,
    local: PathBuf,
    dest: PathBuf,
    config: RemoteConfig,
}

impl Staged {
    /// Stage a file for `dest` (an `s3://` URL).
    pub fn new(dest: &Path, storage_options: &[(String, String)]) -> Result<Staged> {
        let config = config(storage_options)?;
        // A part size the server would refuse only at the upload's
        // completion is refused here, before the file is even built.
        if let Some(url) = dest.to_str() {
            let target = zt_remote::ObjectUrl::parse(url).map_err(error)?;
            zt_remote::upload::check_part_size(&target, 0, &config).map_err(error)?;
        }
        let spool = zt_remote::Spool::create(&config).map_err(error)?;
        // The spool file keeps the object's name, so writers that pick a
        // format by extension see the right one.
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "object".into());
        Ok(Staged {
            local: spool.path_for(&name),
            _spool: spool,
            dest: dest.to_path_buf(),
            config,
        })
    }

    /// Where to write the file.
    pub fn local(&self) -> &Path {
        &self.local
    }

    /// Upload the written file to the URL; returns the bytes uploaded.
    pub fn upload(self) -> Result<u64> {
        let url = self.dest.to_str().ok_or_else(|| Error::Remote {
            ctx: Context::file(&self.dest),
            kind: RemoteKind::Config,
            detail: "the URL is not UTF-8".into(),
        })?;
        zt_remote::upload_file(&self.local, url, &self.config).map_err(error)
    }
}

/// Write a file for the URL `dest` through `write` (which writes a local
/// file at the path it is given, published there as every writer does),
/// then upload it: nothing appears at `dest` unless the whole file was
/// written and the upload completed. Returns what `write` returned.
pub fn write_then_upload(
    dest: &Path,
    storage_options: &[(String, String)],
    write: impl FnOnce(&Path) -> Result<u64>,
) -> Result<u64> {
    let staged = Staged::new(dest, storage_options)?;
    let written = write(staged.local()).map_err(|e| e.relabel(staged.local(), dest))?;
    staged.upload()?;
    Ok(written)
}

/// The names of the "directories" directly under the prefix `url` (a
/// zarr group's members), sorted.
pub fn list_prefixes(url: &Path, storage_options: &[(String, String)]) -> Result<Vec<String>> {
    let text = url.to_str().ok_or_else(|| Error::Remote {
        ctx: Context::file(url),
        kind: RemoteKind::Config,
        detail: "the URL is not UTF-8".into(),
    })?;
    zt_remote::list::list_prefixes(text, &config(storage_options)?).map_err(error)
}
