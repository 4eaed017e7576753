//! Model directories as Hugging Face lays them out: one checkpoint (a
//! shard index and its shards, or a single weights file) beside
//! configuration and tokenizer files. [`checkpoint_in`] finds the
//! checkpoint; [`companions`] lists the other files, which a directory
//! conversion copies unchanged.

use std::path::{Path, PathBuf};
use zt_core::Rule;

use crate::{registry, Context, Error, Result};

/// The file to open for the checkpoint in `dir`: the first present of the
/// checkpoint names the plugins declare, most preferred first
/// (`model.safetensors.index.json`, `model.safetensors`,
/// `pytorch_model.bin.index.json`, `pytorch_model.bin`, `model.zt`: what
/// `from_pretrained` prefers, safetensors over PyTorch), else the one
/// `*.index.json` there.
pub fn checkpoint_in(dir: &Path) -> Result<PathBuf> {
    let candidates = registry().checkpoint_names();
    for name in &candidates {
        let path = dir.join(name);
        if path.is_file() {
            return Ok(path);
        }
    }
    let indexes: Vec<PathBuf> = files_of(dir)?
        .into_iter()
        .filter(|(name, _)| name.ends_with(".index.json"))
        .map(|(_, p)| p)
        .collect();
    match indexes.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(Error::Index {
            rule: Rule::INDEX_CHECKPOINT,
            ctx: Context::file(dir),
            reason: format!("no checkpoint here (looked for {})", candidates.join(", ")),
        }),
        _ => Err(Error::Index {
            rule: Rule::INDEX_CHECKPOINT,
            ctx: Context::file(dir),
            reason: format!("{} shard indexes here; name the one to read", indexes.len()),
        }),
    }
}

/// The regular files of `dir` that are no tensor file and no shard index
/// (configuration, tokenizer, README), as `(name, path)`: what a model
/// directory carries beside its weights. Symlinks to files count (a Hugging
/// Face cache snapshot is made of them); subdirectories do not.
pub fn companions(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let weights: Vec<&str> = registry()
        .formats()
        .iter()
        .flat_map(|f| f.extensions().iter().copied())
        .chain(["bin", "ckpt", "msgpack", "h5", "pth", "pt"])
        .collect();
    Ok(files_of(dir)?
        .into_iter()
        .filter(|(name, _)| {
            let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
            !name.ends_with(".index.json")
                && !name.starts_with('.')
                && !ext.is_some_and(|e| weights.contains(&e.as_str()))
        })
        .collect())
}

/// Every regular file (or symlink to one) directly in `dir`, sorted.
fn files_of(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        if path.is_file() {
            out.push((entry.file_name().to_string_lossy().into_owned(), path));
        }
    }
    out.sort();
    Ok(out)
}
