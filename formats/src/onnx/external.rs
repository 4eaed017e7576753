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

use crate::onnx::rules;
use std::collections::HashMap;
use std::sync::Arc;
use zt_core::Rule;

use zt_core::error::{Context, Error, Result};
use zt_core::format::OpenInput;
use zt_core::store::Store;

/// The external files one model refers to, each opened once.
pub struct Externals<'i> {
    /// The model being opened: related files are opened through it, which
    /// applies the confinement rules.
    input: &'i OpenInput<'i>,
    /// Opened files by location, as the model spells it (plain components).
    opened: HashMap<String, Arc<Store>>,
    /// Opened files in first-use order (they become the source's extra files).
    pub stores: Vec<Arc<Store>>,
}

impl<'i> Externals<'i> {
    /// External files of the model `input` opens.
    pub fn new(input: &'i OpenInput<'i>) -> Self {
        Externals {
            input,
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
            Error::header(
                ctx.clone(),
                rules::EXTERNAL,
                "external data without a \"location\" entry",
            )
        })?;
        let number = |key: &str| -> Result<Option<u64>> {
            get(key)
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| {
                        Error::mismatch(
                            ctx.clone(),
                            rules::EXTERNAL,
                            format!("external data {key}"),
                            format!("{v:?}"),
                            "a number",
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
                    rule: Rule::TRUNCATED,
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
                rules::SIZE,
                format!("external data holds {length} bytes; the tensor needs {nbytes}"),
            ));
        }
        Ok((store, offset))
    }

    /// Open `location` (relative to the model's directory or key prefix;
    /// [`OpenInput::open_related`] checks that it stays inside).
    fn open(&mut self, location: &str, ctx: &Context) -> Result<Arc<Store>> {
        // "a.bin" and "./a.bin" name one file: key by the plain components.
        let key = location
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect::<Vec<_>>()
            .join("/");
        if let Some(store) = self.opened.get(&key) {
            return Ok(Arc::clone(store));
        }
        let store = self
            .input
            .open_related(location, "external data")
            .map_err(|e| match &ctx.tensor {
                Some(name) => e.in_tensor(name),
                None => e,
            })?;
        self.opened.insert(key, Arc::clone(&store));
        self.stores.push(Arc::clone(&store));
        Ok(store)
    }
}
