//! TensorDict's forms, written: the memmap directory (`format="tensordict"`,
//! what `TensorDict.load_memmap` reads) and the consolidated file
//! (`format="tensordict-consolidated"`, what `TensorDict.from_consolidated`
//! reads). A dotted name is a nested level (`next.reward` is `reward` in
//! the level `next`), as the reader names them; the batch size is `[]`,
//! which every tensor fits.
//!
//! Both lay out what tensordict 0.15.3 writes: a level's `meta.json` with
//! one entry per leaf (`{"device": "cpu", "shape": [...], "dtype":
//! "torch.float32", "is_nested": false}`) or nested level (`{"type":
//! "TensorDict"}`) then the level's own keys (format version 1), and a leaf
//! per `<key>.memmap` (none for a leaf with no elements); the consolidated
//! file's leaves end to end, each padded to 8 bytes when the leaves' dtypes
//! differ, then its JSON and the JSON's length.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use serde_json::{json, Map, Value as Json};
use zt_core::catalog::Value;
use zt_core::error::{Context, Error, Result};
use zt_core::inputs::{InputMeta, Inputs};
use zt_core::publish::{publish_reading, publish_with, Staging};
use zt_core::write::{FormatWriter, TensorIn, WriteOptions, WriterCaps};
use zt_core::Rule;

use super::rules::PATH;
use crate::pt::rebuild::torch_dtype_name;

/// The memmap directory's writer.
pub struct MemmapDirWriter;
/// The consolidated file's writer.
pub struct ConsolidatedWriter;

/// One level of the tree the dotted names make: its entries in the order
/// their first tensor came.
#[derive(Default)]
struct Level {
    entries: Vec<(String, Entry)>,
}

enum Entry {
    /// A tensor, by its index in the writer's inputs.
    Leaf(usize),
    Level(Level),
}

impl Level {
    fn insert(&mut self, ctx: &Context, path: &[&str], name: &str, tensor: usize) -> Result<()> {
        let clash = || Error::Write {
            rule: PATH,
            ctx: ctx.clone().tensor(name),
            reason: "a TensorDict key cannot be both a tensor and a nested level".into(),
        };
        let (key, rest) = path.split_first().expect("a name has a component");
        let at = self.entries.iter().position(|(k, _)| k == key);
        if rest.is_empty() {
            if at.is_some() {
                return Err(clash());
            }
            self.entries.push((key.to_string(), Entry::Leaf(tensor)));
            return Ok(());
        }
        let at = match at {
            Some(at) => at,
            None => {
                self.entries
                    .push((key.to_string(), Entry::Level(Level::default())));
                self.entries.len() - 1
            }
        };
        match &mut self.entries[at].1 {
            Entry::Level(level) => level.insert(ctx, rest, name, tensor),
            Entry::Leaf(_) => Err(clash()),
        }
    }
}

impl Level {
    /// The leaves' tensors in the order [`write_level`] writes them (each
    /// level's entries in order, a nested level's before the next entry).
    fn leaves(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for (_, entry) in &self.entries {
            match entry {
                Entry::Leaf(i) => out.push(*i),
                Entry::Level(nested) => out.extend(nested.leaves()),
            }
        }
        out
    }
}

/// Check `tensors` and build their tree.
fn tree(ctx: &Context, tensors: &dyn Inputs) -> Result<Level> {
    let mut root = Level::default();
    let mut seen = HashSet::with_capacity(tensors.len());
    for i in 0..tensors.len() {
        let t = tensors.meta(i);
        t.nbytes(ctx)?;
        if torch_dtype_name(t.dtype).is_none() {
            return Err(Error::Write {
                rule: Rule::WRITE_DTYPE,
                ctx: ctx.clone().tensor(t.name),
                reason: format!("TensorDict has no dtype for {}", t.dtype),
            });
        }
        if !seen.insert(t.name) {
            return Err(Error::DuplicateName {
                ctx: ctx.clone().tensor(t.name),
            });
        }
        let path: Vec<&str> = t.name.split('.').collect();
        if path
            .iter()
            .any(|k| k.is_empty() || *k == ".." || k.contains(['/', '\\', '\0']))
        {
            return Err(Error::Write {
                rule: PATH,
                ctx: ctx.clone().tensor(t.name),
                reason: "each dotted part of a name becomes a file or directory name: none may be empty, \"..\" or hold a path separator".into(),
            });
        }
        root.insert(ctx, &path, t.name, i)?;
    }
    Ok(root)
}

fn leaf_meta(t: InputMeta<'_>) -> Json {
    json!({
        "device": "cpu",
        "shape": t.shape,
        "dtype": format!("torch.{}", torch_dtype_name(t.dtype).expect("checked")),
        "is_nested": false,
    })
}

/// The keys tensordict 0.15.3 writes after a level's entries.
fn level_keys(meta: &mut Map<String, Json>) {
    meta.insert("shape".into(), json!([]));
    meta.insert("device".into(), json!("cpu"));
    meta.insert("_type".into(), json!("<class 'tensordict._td.TensorDict'>"));
    meta.insert("_format_version".into(), json!(1));
    meta.insert("_class".into(), json!("tensordict:TensorDict"));
}

fn caps() -> WriterCaps {
    WriterCaps::DENSE_ARRAYS
}

impl FormatWriter for MemmapDirWriter {
    fn name(&self) -> &'static str {
        "tensordict"
    }

    /// None: a memmap directory is named by `format="tensordict"`.
    fn extensions(&self) -> &'static [&'static str] {
        &[]
    }

    fn caps(&self) -> WriterCaps {
        caps()
    }

    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        self.write_inputs(&tensors, metadata, path, options)
    }

    /// Streams: each leaf fetched as its file is written.
    fn reads_ahead(&self) -> bool {
        true
    }

    /// The root level's `meta.json` names its leaves and nested levels.
    fn directory_index(&self) -> Option<&'static str> {
        Some("meta.json")
    }

    fn write_inputs(
        &self,
        tensors: &dyn Inputs,
        _metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        let ctx = Context::file(path);
        let root = tree(&ctx, tensors)?;
        tensors.will_fetch_in(&root.leaves());
        zt_core::shard::refuse_occupied(path)?;
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            std::fs::remove_dir(path).map_err(|e| Error::io(path, e))?;
        }
        let durable = options.syncs();
        let staging = Staging::create(path)?;
        let staged = staging.path().to_path_buf();
        let bytes = write_level(&root, tensors, &staged, durable)
            .map_err(|e| zt_core::shard::relabel(e, &staged, path))?;
        if durable {
            zt_core::shard::rename_dir(&staged, path)?;
        } else {
            std::fs::rename(&staged, path).map_err(|e| Error::io(path, e))?;
        }
        drop(staging);
        Ok(bytes)
    }
}

/// A level's files under `dir`: its leaves, its nested levels, then its
/// `meta.json`. Returns the bytes written.
fn write_level(level: &Level, tensors: &dyn Inputs, dir: &Path, durable: bool) -> Result<u64> {
    let mut meta = Map::new();
    let mut bytes = 0;
    for (key, entry) in &level.entries {
        match entry {
            Entry::Leaf(i) => {
                let t = tensors.meta(*i);
                let file = dir.join(format!("{key}.memmap"));
                let ctx = Context::file(&file);
                if t.nbytes(&ctx)? > 0 {
                    bytes += publish_reading(&file, durable, |w| {
                        let data = tensors.fetch(*i, &ctx)?;
                        w.write_all(&data).map_err(|e| Error::io(&file, e))
                    })?;
                    tensors.release(*i);
                }
                meta.insert(key.clone(), leaf_meta(t));
            }
            Entry::Level(nested) => {
                let sub = dir.join(key);
                std::fs::create_dir(&sub).map_err(|e| Error::io(&sub, e))?;
                bytes += write_level(nested, tensors, &sub, durable)?;
                meta.insert(key.clone(), json!({"type": "TensorDict"}));
            }
        }
    }
    level_keys(&mut meta);
    let text = serde_json::to_vec(&Json::Object(meta)).expect("JSON of plain values");
    bytes += publish_with(&dir.join("meta.json"), durable, |w| w.write_all(&text))?;
    Ok(bytes)
}

impl FormatWriter for ConsolidatedWriter {
    fn name(&self) -> &'static str {
        "tensordict-consolidated"
    }

    /// None: tensordict's own name for one, `td.bin`, must not be taken for
    /// a PyTorch file; named by `format="tensordict-consolidated"`.
    fn extensions(&self) -> &'static [&'static str] {
        &[]
    }

    fn caps(&self) -> WriterCaps {
        caps()
    }

    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        self.write_inputs(&tensors, metadata, path, options)
    }

    /// Streams: each leaf fetched as it is written.
    fn reads_ahead(&self) -> bool {
        true
    }

    fn write_inputs(
        &self,
        tensors: &dyn Inputs,
        _metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        let ctx = Context::file(path);
        let root = tree(&ctx, tensors)?;
        // tensordict pads each leaf to 8 bytes when the dtypes differ.
        let pad_leaves =
            (1..tensors.len()).any(|i| tensors.meta(i - 1).dtype != tensors.meta(i).dtype);
        let mut order = Vec::with_capacity(tensors.len());
        let mut at = 0u64;
        let json = consolidated_level(&root, tensors, &ctx, pad_leaves, &mut at, &mut order)?;
        let text = serde_json::to_vec(&json).expect("JSON of plain values");
        tensors.will_fetch_in(&order);
        publish_reading(path, options.syncs(), |w| {
            let io = |e| Error::io(path, e);
            for &i in &order {
                let data = tensors.fetch(i, &ctx)?;
                w.write_all(&data).map_err(io)?;
                let pad = padding(data.len() as u64, pad_leaves);
                w.write_all(&[0u8; 8][..pad as usize]).map_err(io)?;
                drop(data);
                tensors.release(i);
            }
            w.write_all(&text).map_err(io)?;
            w.write_all(&(text.len() as u64).to_le_bytes()).map_err(io)
        })
    }
}

fn padding(len: u64, pad_leaves: bool) -> u64 {
    if pad_leaves {
        (8 - len % 8) % 8
    } else {
        0
    }
}

/// A level's consolidated JSON, its leaves placed from `at` on (in the
/// order `order` collects them: each level's leaves, then its nested
/// levels', depth first).
fn consolidated_level(
    level: &Level,
    tensors: &dyn Inputs,
    ctx: &Context,
    pad_leaves: bool,
    at: &mut u64,
    order: &mut Vec<usize>,
) -> Result<Json> {
    let mut leaves = Map::new();
    for (key, entry) in &level.entries {
        if let Entry::Leaf(i) = entry {
            let t = tensors.meta(*i);
            let len = t.nbytes(ctx)?;
            let pad = padding(len, pad_leaves);
            let dtype = format!("torch.{}", torch_dtype_name(t.dtype).expect("checked"));
            leaves.insert(
                key.clone(),
                json!([dtype, t.shape, *at, *at + len + pad, pad]),
            );
            *at += len + pad;
            order.push(*i);
        }
    }
    let mut out = Map::new();
    out.insert("cls".into(), json!("TensorDict"));
    out.insert("non_tensors".into(), json!({}));
    out.insert("leaves".into(), Json::Object(leaves));
    out.insert(
        "cls_metadata".into(),
        json!({"device": null, "names": [], "batch_size": [], "is_locked": false}),
    );
    for (key, entry) in &level.entries {
        if let Entry::Level(nested) = entry {
            out.insert(
                key.clone(),
                consolidated_level(nested, tensors, ctx, pad_leaves, at, order)?,
            );
        }
    }
    Ok(Json::Object(out))
}
