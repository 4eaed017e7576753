//! External data: tensors whose bytes live in other files beside the model.
//!
//! The threat model is onnx's `docs/ExternalDataSecurity.md`: a model must
//! not make its reader open files outside the model's directory. A
//! `location` must be a relative path of plain components (no root, no
//! `..`); it is then resolved with every symlink followed and must still lie
//! under the (likewise resolved) model directory, and be a regular file.
//! The resolved path is what gets opened, so a symlink that points out of
//! the directory is refused rather than followed. (A hard link cannot be
//! told from a regular file; like onnx, zt accepts it.)

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::error::{Context, Error, Result};
use crate::store::Store;

/// The external files one model refers to, each opened once.
#[derive(Debug)]
pub struct Externals {
    /// The model file's directory as given.
    dir: PathBuf,
    /// The directory, resolved (on first use).
    canonical_dir: Option<PathBuf>,
    /// Map external files like the model (or read them positionally).
    map: bool,
    /// Opened files by resolved path.
    opened: HashMap<PathBuf, Arc<Store>>,
    /// Opened files in first-use order (they become the source's extra files).
    pub stores: Vec<Arc<Store>>,
}

impl Externals {
    /// External files of the model at `model`.
    pub fn new(model: &Path, map: bool) -> Self {
        let dir = match model.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Externals {
            dir,
            canonical_dir: None,
            map,
            opened: HashMap::new(),
            stores: Vec::new(),
        }
    }

    /// The store and offset holding `nbytes` bytes of a tensor whose
    /// `external_data` entries are `entries`.
    pub fn resolve(
        &mut self,
        entries: &[(String, String)],
        nbytes: u64,
        ctx: &Context,
    ) -> Result<(Arc<Store>, u64)> {
        let get = |key: &str| {
            entries
                .iter()
                .rev()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
        };
        let location = get("location").ok_or_else(|| {
            Error::header(ctx.clone(), "external data without a \"location\" entry")
        })?;
        let number = |key: &str| -> Result<Option<u64>> {
            get(key)
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| {
                        Error::header(
                            ctx.clone(),
                            format!("external data {key} {v:?} is not a number"),
                        )
                    })
                })
                .transpose()
        };
        let offset = number("offset")?.unwrap_or(0);
        let length = number("length")?;
        let store = self.open(location, ctx)?;
        let ctx = ctx.clone().at(offset);
        // Like onnx: no `length` means "to the end of the file".
        let length = match length {
            Some(n) => n,
            None => store
                .len()
                .checked_sub(offset)
                .ok_or_else(|| Error::Truncated {
                    ctx: ctx.clone(),
                    what: "external data",
                    needed: offset,
                    available: store.len(),
                })?,
        };
        store
            .check_range(offset, length, "external data")
            .map_err(|e| e.in_file(store.path()))?;
        if length != nbytes {
            return Err(Error::range(
                ctx,
                format!("external data holds {length} bytes; the tensor needs {nbytes}"),
            ));
        }
        Ok((store, offset))
    }

    /// Open `location` (relative to the model directory) after checking
    /// that it stays inside it.
    fn open(&mut self, location: &str, ctx: &Context) -> Result<Arc<Store>> {
        let escape = |why: &str| {
            Error::header(
                ctx.clone(),
                format!("external data location {location:?} {why}"),
            )
        };
        let rel = Path::new(location);
        if location.is_empty() || location.contains('\0') {
            return Err(escape("is empty or not a path"));
        }
        if rel.is_absolute() {
            return Err(escape("is absolute"));
        }
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(escape("leaves the model directory"));
        }
        if self.canonical_dir.is_none() {
            let dir = self
                .dir
                .canonicalize()
                .map_err(|e| Error::io(&self.dir, e))?;
            self.canonical_dir = Some(dir);
        }
        let dir = self.canonical_dir.as_deref().expect("set above");
        let joined = self.dir.join(rel);
        let resolved = joined.canonicalize().map_err(|e| Error::io(&joined, e))?;
        if !resolved.starts_with(dir) {
            return Err(escape(
                "resolves (through a symlink) outside the model directory",
            ));
        }
        if let Some(store) = self.opened.get(&resolved) {
            return Ok(Arc::clone(store));
        }
        let meta = std::fs::metadata(&resolved).map_err(|e| Error::io(&resolved, e))?;
        if !meta.is_file() {
            return Err(escape("is not a regular file"));
        }
        let store = Arc::new(if self.map {
            Store::open(&resolved)?
        } else {
            Store::open_positional(&resolved)?
        });
        self.opened.insert(resolved, Arc::clone(&store));
        self.stores.push(Arc::clone(&store));
        Ok(store)
    }
}
