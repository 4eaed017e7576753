//! The store's keys: a local directory or an object-storage prefix, read
//! at read time (a chunk is a file or object of its own, opened only when
//! read). Every key is checked to be plain relative components before it
//! is joined, and on disk resolved with symlinks followed and kept under
//! the store's root, so no name from metadata or a listing reaches outside.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use zt_core::error::{Context, Error, Result};
use zt_core::location;
use zt_core::open::OpenOptions;
use zt_core::store::Store;

use super::rules::{KEY, LISTING};

/// Where a store's keys live.
#[derive(Debug)]
pub struct Keys {
    /// The root: a directory, or a URL prefix ending with `/`.
    root: PathBuf,
    /// The root resolved (local stores only), what every key must stay in.
    canonical: Option<PathBuf>,
    /// How remote objects are opened.
    options: OpenOptions,
}

/// `key` as plain relative components separated by `/`: none empty, `.`
/// or `..` or longer than a file name may be, no backslash or NUL, no
/// leading `/`.
pub fn check_key(ctx: &Context, key: &str) -> Result<()> {
    let bad = key.is_empty()
        || key.contains(['\\', '\0'])
        || key
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c.len() > 255);
    if bad {
        return Err(Error::header(
            ctx.clone(),
            KEY,
            format!("key {key:?} would leave the store"),
        ));
    }
    Ok(())
}

impl Keys {
    /// The keys beside the metadata file `file` (the store's root
    /// metadata: `zarr.json`, `.zgroup`, `.zarray`, `.zmetadata`).
    pub fn beside(file: &Path, options: OpenOptions) -> Result<Keys> {
        if location::is_url(file) {
            let text = file.to_string_lossy();
            let root = match text.rfind('/') {
                Some(i) => text[..=i].to_string(),
                None => text.to_string(),
            };
            return Ok(Keys {
                root: PathBuf::from(root),
                canonical: None,
                options,
            });
        }
        let root = location::parent_dir(file);
        let canonical = root.canonicalize().map_err(|e| Error::io(&root, e))?;
        Ok(Keys {
            root,
            canonical: Some(canonical),
            options,
        })
    }

    /// Whether the store is a local directory (which can be listed).
    pub fn is_local(&self) -> bool {
        self.canonical.is_some()
    }

    /// Where `key` is.
    fn location(&self, key: &str) -> PathBuf {
        if self.is_local() {
            self.root.join(key)
        } else {
            PathBuf::from(format!("{}{key}", self.root.to_string_lossy()))
        }
    }

    /// The object at `key`, `None` when there is none (a chunk never
    /// written).
    pub fn get(&self, ctx: &Context, key: &str) -> Result<Option<Arc<Store>>> {
        check_key(ctx, key)?;
        let path = self.location(key);
        let Some(canonical) = &self.canonical else {
            return match self.options.open_store_positional(&path) {
                Ok(store) => Ok(Some(Arc::new(store))),
                Err(Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            };
        };
        let resolved = match path.canonicalize() {
            Ok(p) => p,
            // Missing, or a file where the key needs a directory: no such
            // key, as zarr-python reads it.
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                return Ok(None)
            }
            Err(e) => return Err(Error::io(&path, e)),
        };
        if !resolved.starts_with(canonical) {
            return Err(Error::header(
                ctx.clone(),
                KEY,
                format!("key {key:?} resolves (through a symlink) outside the store"),
            ));
        }
        if !resolved.is_file() {
            return Ok(None);
        }
        // Chunks are read whole or by ranges, once each: positional reads,
        // no mapping per chunk.
        Store::open_positional(&resolved).map(|s| Some(Arc::new(s)))
    }

    /// The bytes at `key` in full (metadata), its size checked against
    /// `max` first; `None` when there is no such key.
    pub fn read(&self, ctx: &Context, key: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let Some(store) = self.get(ctx, key)? else {
            return Ok(None);
        };
        zt_core::Limits::check(
            &Context::file(store.path()),
            "header_bytes",
            store.len(),
            max,
        )?;
        Ok(Some(store.read(0, store.len())?.into_owned()))
    }

    /// The subdirectories of the group at `prefix` (`""`: the root), by
    /// name, sorted; symlinks are not followed (a member is a directory
    /// of the store). Over object storage, the common prefixes of one
    /// delimited listing (one request per group, not per chunk).
    pub fn children(&self, ctx: &Context, prefix: &str) -> Result<Vec<String>> {
        if !self.is_local() {
            let url = PathBuf::from(format!("{}{prefix}", self.root.to_string_lossy()));
            return self.options.list_prefixes(&url).map_err(|e| match e {
                Error::Remote {
                    kind: zt_core::error::RemoteKind::Unsupported,
                    detail,
                    ..
                } => Error::unsupported(
                    ctx.clone(),
                    LISTING,
                    format!("a group here cannot be listed ({detail}); zt reads it through consolidated metadata (zarr.consolidate_metadata), which this store lacks"),
                ),
                e => e,
            });
        }
        let dir = if prefix.is_empty() {
            self.root.clone()
        } else {
            self.root.join(prefix)
        };
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let is_dir = entry.file_type().map_err(|e| Error::io(&dir, e))?.is_dir();
            if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }
}
