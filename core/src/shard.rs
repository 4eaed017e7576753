//! Sharded checkpoints: splitting a model's tensors into files of at most
//! a given size exactly as Hugging Face does, naming the files, and
//! publishing the set so that a reader never finds an index (or root)
//! whose shards are missing or half-written.
//!
//! The split is `huggingface_hub`'s `split_state_dict_into_shards_factory`
//! (what `save_pretrained` and `split_torch_state_dict_into_shards` use):
//! tensors in the caller's order, a new shard when the next tensor would
//! tip the current one over the limit, a tensor larger than the limit
//! alone in a shard of its own (listed before the shard being filled),
//! tensors sharing storage with an earlier one in that one's shard.
//! Tensors are never split.
//!
//! How the shards are tied together is the format's: [`ShardLayout`],
//! which a [`crate::FormatWriter`] returns. Hugging Face's index
//! (`model-00001-of-00003.safetensors` + `model.safetensors.index.json`)
//! is built here; a format with a root file of its own (`.zt`) supplies
//! the function that writes it.

use crate::rule::Rule;
use std::path::{Path, PathBuf};

use crate::catalog::Attributes;
use crate::error::{Context, Error, Result};
use crate::location::{is_url, parent_dir, sibling};
use crate::publish::Staging;
use crate::write::WrittenFile;

/// Hugging Face's default shard size (`huggingface_hub`'s `MAX_SHARD_SIZE`).
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

/// Parse a shard size as Hugging Face writes one: a number of bytes
/// (`"1000000"`), or a number and a unit, decimal (`"5GB"`, `"500MB"`,
/// `"1.5TB"`; `KB MB GB TB`, as `huggingface_hub` reads them, any case)
/// or binary (`"4GiB"`; `KiB MiB GiB TiB`, as `transformers` reads them).
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let bad = || {
        format!("shard size {text:?}: expected bytes or a number with a unit (5GB, 500MB, 4GiB)")
    };
    if let Ok(n) = t.parse::<u64>() {
        return if n == 0 { Err(bad()) } else { Ok(n) };
    }
    const UNITS: [(&str, f64); 8] = [
        ("KIB", 1024.0),
        ("MIB", 1048576.0),
        ("GIB", 1073741824.0),
        ("TIB", 1099511627776.0),
        ("KB", 1e3),
        ("MB", 1e6),
        ("GB", 1e9),
        ("TB", 1e12),
    ];
    let upper = t.to_ascii_uppercase();
    for (unit, scale) in UNITS {
        if let Some(number) = upper.strip_suffix(unit) {
            let value: f64 = number.trim().parse().map_err(|_| bad())?;
            // `int(value * multiplier)`, as huggingface_hub computes it.
            let bytes = value * scale;
            if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
                return Err(bad());
            }
            return Ok(bytes as u64);
        }
    }
    Err(bad())
}

/// Refuse to write a tensor file under a name every reader takes for a
/// sharded checkpoint's index (`*.index.json`): `save_file(x,
/// "w.safetensors.index.json")` would write safetensors there, which
/// `open` then reads as an index and refuses.
pub fn refuse_index_name(dest: &Path) -> Result<()> {
    let name = dest.file_name().map(|n| n.to_string_lossy());
    if name.is_some_and(|n| n.ends_with(".index.json")) {
        return Err(Error::Write {
            rule: Rule::WRITE_DESTINATION,
            ctx: Context::file(dest),
            reason: "a name ending in .index.json is a sharded checkpoint's index; \
                     write the tensors to model.safetensors (with max_shard_size for shards \
                     and their index)"
                .into(),
        });
    }
    Ok(())
}

/// One tensor to place: its size in bytes and, for tensors that share
/// storage with others, an identifier of that storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item {
    /// Bytes the tensor adds to a shard.
    pub size: u64,
    /// Tensors with the same storage go into one shard, counted once.
    pub storage: Option<u64>,
}

/// Which tensors go into which shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Per shard, the indexes of its tensors (into the items given).
    pub shards: Vec<Vec<usize>>,
    /// `metadata.total_size` of the index: every tensor's size, a shared
    /// storage once.
    pub total_size: u64,
}

/// Split `items` (in order) into shards of at most `max` bytes, exactly as
/// `huggingface_hub.split_state_dict_into_shards_factory` does.
pub fn plan(items: &[Item], max: u64) -> Plan {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_size = 0u64;
    let mut total_size = 0u64;
    // Storage id -> the tensors that share it, the first one placed.
    let mut shared: Vec<(u64, Vec<usize>)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some(id) = item.storage {
            if let Some((_, keys)) = shared.iter_mut().find(|(s, _)| *s == id) {
                keys.push(i);
                continue;
            }
            shared.push((id, vec![i]));
        }
        if item.size > max {
            total_size += item.size;
            shards.push(vec![i]);
            continue;
        }
        if current_size + item.size > max {
            shards.push(std::mem::take(&mut current));
            current_size = 0;
        }
        current.push(i);
        current_size += item.size;
        total_size += item.size;
    }
    if !current.is_empty() {
        shards.push(current);
    }
    for (_, keys) in &shared {
        if let Some(shard) = shards.iter_mut().find(|s| s.contains(&keys[0])) {
            shard.extend(&keys[1..]);
        }
    }
    // huggingface_hub's first shard exists even for an empty state dict
    // (one file, no index).
    if shards.is_empty() {
        shards.push(Vec::new());
    }
    Plan { shards, total_size }
}

/// Writes the file that ties a format's shards together (its root), at
/// `root`, given the shard files (already complete, in order, as their
/// writer described them: the root is written from that, reading no
/// shard back), the labels the root names them by, and the checkpoint's
/// attributes; fsynced before its rename when `durable`. Returns the bytes
/// written.
pub type WriteRoot = fn(
    root: &Path,
    shards: &[WrittenFile],
    labels: &[String],
    attributes: &Attributes,
    durable: bool,
) -> Result<u64>;

/// How a format lays out a sharded checkpoint.
#[derive(Debug, Clone, Copy)]
pub struct ShardLayout {
    /// The checkpoint's file name in a model directory
    /// (`model.safetensors`, `pytorch_model.bin`, `model.zt`).
    pub checkpoint_name: &'static str,
    /// What ties the shards together.
    pub tie: Tie,
    /// The format's writer makes a file durable (fsync of the file before
    /// its rename and of the directory after: [`crate::publish`]), as
    /// every writer zt has does. A sharded checkpoint is then as durable:
    /// its shards are written without the fsync
    /// ([`crate::WriteOptions::defer_sync`]), each one's writeback started
    /// as it completes ([`crate::publish::start_writeback`]) and all
    /// synced together ([`crate::publish::sync_files`]: one wait for the
    /// device instead of one per shard) before the index or root is
    /// written; the index or root is synced before its rename, and the
    /// directory after the set is moved into it. In a model directory
    /// ([`write_dir`]) the copied files are synced too, and the directory
    /// before and after its rename. Without it nothing is synced: files
    /// and directory are renamed into place only.
    pub durable: bool,
}

/// What ties the shards of a checkpoint together.
#[derive(Debug, Clone, Copy)]
pub enum Tie {
    /// Hugging Face's: shards `STEM-00001-of-00003.EXT` and
    /// `NAME.index.json` (`metadata.total_size`, `weight_map`).
    Index,
    /// A root file at the checkpoint's own name, written by the function,
    /// naming shards `STEM-00001.EXT` by the labels `00001`, ...
    Root(WriteRoot),
}

impl ShardLayout {
    /// The file names of shard `i` of `n` of the checkpoint `name`.
    pub fn shard_name(&self, name: &str, i: usize, n: usize) -> String {
        self.file_of(name, &self.label(name, i, n))
    }

    /// How the index or root names shard `i` of `n`: the file name in an
    /// index (`model-00001-of-00003.safetensors`), the label in a root
    /// (`00001`, found at `model-00001.zt`).
    pub fn label(&self, name: &str, i: usize, n: usize) -> String {
        let (stem, ext) = split_name(name);
        match self.tie {
            Tie::Index => format!("{stem}-{:05}-of-{n:05}{ext}", i + 1),
            Tie::Root(_) => root_label(i),
        }
    }

    /// The file that ties the shards of the checkpoint `name` together:
    /// `NAME.index.json`, or the root at `NAME` itself.
    pub fn tie_name(&self, name: &str) -> String {
        match self.tie {
            Tie::Index => format!("{name}.index.json"),
            Tie::Root(_) => name.to_string(),
        }
    }

    /// The file a shard of the checkpoint `name` labelled `label` is in.
    pub fn file_of(&self, name: &str, label: &str) -> String {
        match self.tie {
            Tie::Index => label.to_string(),
            Tie::Root(_) => {
                let (stem, ext) = split_name(name);
                format!("{stem}-{label}{ext}")
            }
        }
    }

    /// The label of a shard published under a name no earlier checkpoint
    /// uses (see [`publish_staged`]): `label` with `.GGGGGGGG` (the
    /// generation, in hex) before the extension of an index's file name,
    /// or after a root's label (`model-00001.GGGGGGGG.zt`).
    pub fn alternate(&self, label: &str, generation: u32) -> String {
        match self.tie {
            Tie::Index => {
                let (stem, ext) = split_name(label);
                format!("{stem}.{generation:08x}{ext}")
            }
            Tie::Root(_) => format!("{label}.{generation:08x}"),
        }
    }

    /// True if `file` is named like a shard of the checkpoint `name` (of
    /// any count, under its standard or an alternate name): what an
    /// earlier save left and a new one replaces.
    pub fn is_shard_name(&self, name: &str, file: &str) -> bool {
        let (stem, ext) = split_name(name);
        let Some(middle) = file
            .strip_prefix(stem)
            .and_then(|r| r.strip_prefix('-'))
            .and_then(|r| r.strip_suffix(ext))
        else {
            return false;
        };
        let hex8 = |s: &str| s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit());
        let middle = match middle.rsplit_once('.') {
            Some((m, generation)) if hex8(generation) => m,
            _ => middle,
        };
        let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
        match self.tie {
            Tie::Index => middle
                .split_once("-of-")
                .is_some_and(|(a, b)| digits(a) && digits(b)),
            Tie::Root(_) => digits(middle),
        }
    }
}

/// The label a root gives shard `i`: `00001`, ...
pub fn root_label(i: usize) -> String {
    format!("{:05}", i + 1)
}

/// `("model", ".safetensors")` of `model.safetensors`.
fn split_name(name: &str) -> (&str, &str) {
    match name.rfind('.') {
        Some(dot) if dot > 0 => name.split_at(dot),
        _ => (name, ""),
    }
}

/// Hugging Face's index: `{"metadata": {"total_size": N}, "weight_map":
/// {tensor: file}}`, keys sorted and indented by two, as `save_pretrained`
/// writes it (`json.dumps(index, indent=2, sort_keys=True) + "\n"`).
pub fn index_json(total_size: u64, weight_map: &[(&str, &str)]) -> Vec<u8> {
    let map: std::collections::BTreeMap<&str, &str> = weight_map.iter().copied().collect();
    let index = serde_json::json!({
        "metadata": {"total_size": total_size},
        "weight_map": map,
    });
    let mut text = serde_json::to_string_pretty(&index).expect("JSON of strings");
    text.push('\n');
    text.into_bytes()
}

/// What a sharded write produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The files (or URLs) published, the index or root last.
    pub files: Vec<PathBuf>,
    /// Bytes written, every file together.
    pub bytes: u64,
}

/// The tensors of a checkpoint to write: their names and items (in order),
/// the checkpoint's attributes (for a root), and how to write a subset of
/// them (by index, in the order given) as one file of the format.
pub struct Tensors<'a> {
    /// Names, in order.
    pub names: &'a [&'a str],
    /// Sizes and storages, in the same order.
    pub items: &'a [Item],
    /// The checkpoint's attributes (a root records them).
    pub attributes: &'a Attributes,
    /// Write the tensors with these indexes to this local path (publishing
    /// it there, as every writer does; with `defer_sync` true, without
    /// the fsync: [`WriteOptions::defer_sync`](crate::WriteOptions)); returns
    /// the file as its writer describes it
    /// ([`crate::FormatWriter::write_shard`]).
    pub write: &'a WriteShard<'a>,
}

/// Writes the tensors with these indexes to this path, without its fsync
/// when the flag is set; returns the file as its writer describes it.
pub type WriteShard<'a> = dyn Fn(&[usize], &Path, bool) -> Result<WrittenFile> + Sync + 'a;

/// Write a checkpoint at `dest` (a file path or an `s3://` URL) in shards
/// of at most `max` bytes. One shard is one plain file at `dest`, as
/// Hugging Face saves it; more are built in a staging directory beside
/// `dest` and moved into place only when all are complete, the index (or
/// root) last, after which earlier shards of `dest` that the new set does
/// not reuse are removed.
pub fn write(
    dest: &Path,
    layout: &ShardLayout,
    tensors: &Tensors<'_>,
    max: u64,
    storage_options: &[(String, String)],
) -> Result<Written> {
    let plan = plan(tensors.items, max);
    if plan.shards.len() == 1 {
        let bytes = crate::publish::to_location(dest, storage_options, |local| {
            Ok((tensors.write)(&plan.shards[0], local, false)?.bytes)
        })?;
        return Ok(Written {
            files: vec![dest.to_path_buf()],
            bytes,
        });
    }
    let name = file_name(dest)?;
    build_and_publish(dest, storage_options, |dir| {
        let shards =
            build_shards(dir, &name, layout, tensors, &plan).map_err(|e| relabel(e, dir, dest))?;
        let write_tie = |at: &Path, labels: &[String]| {
            write_tie(layout, tensors, &plan, &shards.written, at, labels)
        };
        let (files, tie_bytes) = if is_url(dest) {
            let n = shards.files.len();
            let labels: Vec<String> = (0..n).map(|i| layout.label(&name, i, n)).collect();
            let tie = layout.tie_name(&name);
            let tie_bytes =
                write_tie(&dir.join(&tie), &labels).map_err(|e| relabel(e, dir, dest))?;
            let mut files = shards.files.clone();
            files.push(tie.clone());
            upload_children(dir, &files, &tie, &prefix_of(dest), storage_options)?;
            (files, tie_bytes)
        } else {
            let staged: Vec<PathBuf> = shards.files.iter().map(|f| dir.join(f)).collect();
            let published = publish_staged(&staged, dest, layout, layout.durable, &write_tie)?;
            (published.files, published.tie_bytes)
        };
        Ok(Written {
            files: files.iter().map(|f| sibling(dest, f)).collect(),
            bytes: shards.bytes + tie_bytes,
        })
    })
}

/// Write a model directory at `dest_dir` (a path or an `s3://` prefix):
/// the checkpoint (`layout.checkpoint_name`, sharded at `max`, with its
/// index or root) and copies of `extra` files (`(name, source path)`:
/// configuration, tokenizer). Locally the directory is built beside
/// `dest_dir` and renamed into place when complete, so a failed or killed
/// conversion leaves nothing there; an existing destination must be an
/// empty directory. Remotely every file is uploaded, the index last.
pub fn write_dir(
    dest_dir: &Path,
    layout: &ShardLayout,
    tensors: &Tensors<'_>,
    max: u64,
    extra: &[(String, PathBuf)],
    storage_options: &[(String, String)],
) -> Result<Written> {
    let plan = plan(tensors.items, max);
    let name = layout.checkpoint_name;
    let remote = is_url(dest_dir);
    if !remote {
        refuse_occupied(dest_dir)?;
    }
    build_and_publish(dest_dir, storage_options, |dir| {
        let mut files = Vec::new();
        let mut bytes = 0;
        for (extra_name, src) in extra {
            bytes += copy_into(src, &dir.join(extra_name))?;
            files.push(extra_name.clone());
        }
        let (checkpoint, n) = if plan.shards.len() == 1 {
            let n = (tensors.write)(&plan.shards[0], &dir.join(name), false)
                .map_err(|e| relabel(e, dir, &dest_dir.join(name)))?
                .bytes;
            (vec![name.to_string()], n)
        } else {
            build(dir, name, layout, tensors, &plan, &dest_dir.join(name))?
        };
        files.extend(checkpoint);
        bytes += n;
        if remote {
            // The checkpoint's index (or its one file) is the last file.
            let index = files.last().cloned().unwrap_or_default();
            upload_children(dir, &files, &index, dest_dir, storage_options)?;
        } else {
            rename_dir(dir, dest_dir)?;
        }
        Ok(Written {
            files: files.iter().map(|f| dest_dir.join(f)).collect(),
            bytes,
        })
    })
}

/// Build in a staging directory for `dest` (beside it, or a private spool
/// for a URL) and run `body` on it; the directory is removed afterwards
/// whatever happened (after a successful local directory publish it is
/// the destination, and nothing is left to remove).
fn build_and_publish(
    dest: &Path,
    storage_options: &[(String, String)],
    body: impl FnOnce(&Path) -> Result<Written>,
) -> Result<Written> {
    if is_url(dest) {
        return spool_then(dest, storage_options, body);
    }
    let staging = Staging::create(dest)?;
    let out = body(staging.path());
    drop(staging);
    out
}

/// `write` (which writes `writer`'s output at the local path it is given,
/// published there as every writer does) published at `dest`: a local
/// path, or a URL, where a file is uploaded whole once written and a
/// directory output ([`crate::FormatWriter::directory_index`]) file by file, its
/// index last ([`write_dir_then_upload`]). Returns what `write` returned.
pub fn to_destination(
    writer: &dyn crate::write::FormatWriter,
    dest: &Path,
    storage_options: &[(String, String)],
    write: impl FnOnce(&Path) -> Result<u64>,
) -> Result<u64> {
    match writer.directory_index() {
        Some(index) if is_url(dest) => write_dir_then_upload(dest, index, storage_options, write),
        _ => crate::publish::to_location(dest, storage_options, write),
    }
}

/// A directory output for the URL prefix `dest`: built by `write` (which
/// publishes a directory at the path it is given) in a private spool, then
/// every file in it uploaded under `dest` at its relative path, `index`
/// (the file naming the others) last, so a reader never finds the index
/// before what it names. Files an earlier checkpoint left under the prefix
/// stay (object storage has no rename); the new index names only its own.
/// An earlier index is withdrawn before any file it may name is replaced
/// (`upload_children`), so a failure partway leaves either the earlier
/// checkpoint whole or no index at all, never one naming a mix.
/// Returns what `write` returned.
pub fn write_dir_then_upload(
    dest: &Path,
    index: &str,
    storage_options: &[(String, String)],
    write: impl FnOnce(&Path) -> Result<u64>,
) -> Result<u64> {
    let written = build_and_publish(dest, storage_options, |spool| {
        let out = spool.join("out");
        let bytes = write(&out).map_err(|e| relabel(e, &out, dest))?;
        let mut files = relative_files(&out)?;
        files.sort();
        upload_children(&out, &files, index, dest, storage_options)?;
        Ok(Written {
            files: files.iter().map(|f| dest.join(f)).collect(),
            bytes,
        })
    })?;
    Ok(written.bytes)
}

/// Every file under `dir`, as `/`-separated paths relative to it.
fn relative_files(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).map_err(|e| Error::io(&at, e))? {
            let entry = entry.map_err(|e| Error::io(&at, e))?;
            let path = entry.path();
            if entry.file_type().map_err(|e| Error::io(&path, e))?.is_dir() {
                pending.push(path);
            } else if let Ok(rel) = path.strip_prefix(dir) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    Ok(out)
}

/// Upload the staged `files` (paths relative to `staged`) under the URL
/// prefix `base`, `index` last. Object storage has no rename, so a file
/// of an earlier checkpoint under the prefix is overwritten in place: the
/// files no earlier object holds go first (an earlier checkpoint still
/// reads if one of them fails), then, when any other is to be replaced,
/// the earlier index is deleted (a failure from there on leaves no index
/// rather than one naming replaced files), then the replacements, then
/// the new index. What the prefix holds is one listing; where it cannot
/// be listed every file counts as a replacement.
///
/// A failure withdraws what this call had put (`zt_remote::leftovers`,
/// as a zrecord store's publish does), so a failed checkpoint leaves none
/// of its files; what cannot be deleted is journaled for the destination
/// (the prefix and `index`). Those are deleted once a later write's index
/// has landed, not before: until then an earlier index may still name an
/// object of the same name and content, which has the journaled ETag. The
/// names that write has just put are spared (their journaled ETag is the
/// new file's when the content is the same).
#[cfg(feature = "remote")]
fn upload_children(
    staged: &Path,
    files: &[String],
    index: &str,
    base: &Path,
    storage_options: &[(String, String)],
) -> Result<()> {
    use zt_remote::leftovers::{self, Destination, Leftover};
    let config = crate::remote::config(storage_options)?;
    let prefix = base.to_string_lossy().trim_end_matches('/').to_string();
    let url = |f: &str| format!("{prefix}/{f}");
    let dest = Destination::new(&prefix, index);
    let existing = existing_under(&prefix, files, &config);
    let present = |f: &str| existing.as_ref().is_none_or(|e| e.contains_key(f));
    // A file's version before this write (`None`: absent; unlisted, the
    // version is unknown and it counts as present).
    let before = |f: &str| match &existing {
        Some(e) => e.get(f).cloned(),
        None => Some(None),
    };
    let (replaced, fresh): (Vec<&String>, Vec<&String>) = files
        .iter()
        .filter(|f| *f != index)
        .partition(|f| present(f));
    let mut sent: Vec<Leftover> = Vec::with_capacity(files.len());
    // The error of the step at `f`, after withdrawing what was sent.
    let failed = |sent: &[Leftover], f: &str, e: zt_remote::Error| {
        let mut err = crate::remote::error(e);
        let left = leftovers::withdraw(&config, &dest, sent, &url(f), before(f));
        if let (Some(left), Error::Remote { detail, .. }) = (left, &mut err) {
            detail.push_str(&left);
        }
        err
    };
    let send = |sent: &mut Vec<Leftover>, f: &str| match zt_remote::upload_file_versioned(
        &staged.join(f),
        &url(f),
        &config,
    ) {
        Ok((_, etag)) => {
            sent.push(Leftover { url: url(f), etag });
            Ok(())
        }
        Err(e) => Err(failed(sent, f, e)),
    };
    for f in fresh {
        send(&mut sent, f)?;
    }
    if !replaced.is_empty() && present(index) {
        zt_remote::delete_object(&url(index), &config).map_err(|e| failed(&sent, index, e))?;
    }
    for f in replaced {
        send(&mut sent, f)?;
    }
    if files.iter().any(|f| f == index) {
        send(&mut sent, index)?;
    }
    // The write is whole; clearing an earlier failure's leftovers is not
    // part of it (what cannot be deleted now stays journaled).
    let ours: std::collections::HashSet<&str> = files.iter().map(String::as_str).collect();
    let _ = leftovers::clear(&config, &dest, |_, name| ours.contains(name));
    Ok(())
}

/// The prefix a checkpoint file at the URL `dest` is written under (its
/// shards and index are its siblings).
fn prefix_of(dest: &Path) -> PathBuf {
    dest.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// The objects under the prefix `prefix_url` by name (relative,
/// `/`-separated) with their ETags: one delimited listing when `files`
/// are all directly under it (a sharded file's siblings), the whole tree
/// when some are nested; `None` when it cannot be listed.
#[cfg(feature = "remote")]
fn existing_under(
    prefix_url: &str,
    files: &[String],
    config: &zt_remote::RemoteConfig,
) -> Option<std::collections::HashMap<String, Option<String>>> {
    let listed = if files.iter().any(|f| f.contains('/')) {
        zt_remote::list::list_tree(prefix_url, config)
    } else {
        zt_remote::list::list(prefix_url, config)
    };
    Some(listed.ok()?.into_iter().map(|l| (l.name, l.etag)).collect())
}

#[cfg(not(feature = "remote"))]
fn upload_children(
    _: &Path,
    _: &[String],
    _: &str,
    base: &Path,
    _: &[(String, String)],
) -> Result<()> {
    Err(no_remote(base))
}

#[cfg(feature = "remote")]
fn spool_then(
    dest: &Path,
    storage_options: &[(String, String)],
    body: impl FnOnce(&Path) -> Result<Written>,
) -> Result<Written> {
    let config = crate::remote::config(storage_options)?;
    let spool = zt_remote::Spool::create(&config).map_err(crate::remote::error)?;
    let dir = spool.path_for("checkpoint");
    std::fs::create_dir(&dir).map_err(|e| Error::io(&dir, e))?;
    let _ = dest;
    body(&dir)
}

#[cfg(not(feature = "remote"))]
fn spool_then(
    dest: &Path,
    _storage_options: &[(String, String)],
    _body: impl FnOnce(&Path) -> Result<Written>,
) -> Result<Written> {
    Err(no_remote(dest))
}

#[cfg(not(feature = "remote"))]
fn no_remote(dest: &Path) -> Error {
    Error::Remote {
        ctx: Context::file(dest),
        kind: crate::error::RemoteKind::Unsupported,
        detail: "this build of zt has no object-storage support (the `remote` feature)".into(),
    }
}

/// Write the shards of `plan` and what ties them into `dir` (under their
/// standard names), for the checkpoint `name` that will be published as
/// `dest` (errors name the files there, not in `dir`). Returns the file
/// names in publish order (the index or root last) and the bytes written.
fn build(
    dir: &Path,
    name: &str,
    layout: &ShardLayout,
    tensors: &Tensors<'_>,
    plan: &Plan,
    dest: &Path,
) -> Result<(Vec<String>, u64)> {
    let built = || {
        let shards = build_shards(dir, name, layout, tensors, plan)?;
        let n = shards.files.len();
        let labels: Vec<String> = (0..n).map(|i| layout.label(name, i, n)).collect();
        let tie = layout.tie_name(name);
        let tie_bytes = write_tie(
            layout,
            tensors,
            plan,
            &shards.written,
            &dir.join(&tie),
            &labels,
        )?;
        let mut files = shards.files;
        files.push(tie);
        Ok((files, shards.bytes + tie_bytes))
    };
    built().map_err(|e| relabel(e, dir, dest))
}

/// The shards of a checkpoint, complete in a staging directory.
struct Shards {
    /// Their file names there (the standard names), in order.
    files: Vec<String>,
    /// Each as its writer described it (what a root is written from).
    written: Vec<WrittenFile>,
    /// Bytes, all shards together.
    bytes: u64,
}

/// Write the shards of `plan` into `dir` under their standard names;
/// where the format's writer is durable, all of them are on disk when
/// this returns (synced together, not one by one).
fn build_shards(
    dir: &Path,
    name: &str,
    layout: &ShardLayout,
    tensors: &Tensors<'_>,
    plan: &Plan,
) -> Result<Shards> {
    let n = plan.shards.len();
    let files: Vec<String> = (0..n).map(|i| layout.shard_name(name, i, n)).collect();
    let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
    let mut bytes = 0;
    let mut written = Vec::with_capacity(n);
    for (shard, path) in plan.shards.iter().zip(&paths) {
        let file = (tensors.write)(shard, path, layout.durable)?;
        bytes += file.bytes;
        written.push(file);
        if layout.durable {
            // The device writes this shard while the next one is built.
            crate::publish::start_writeback(path);
        }
    }
    if layout.durable {
        crate::publish::sync_files(&paths)?;
    }
    Ok(Shards {
        files,
        written,
        bytes,
    })
}

/// Write what ties the shards of `plan` together at `at`, naming shard
/// `i` by `labels[i]` (see [`ShardLayout::label`]): Hugging Face's index,
/// or the format's root. Returns the bytes written.
fn write_tie(
    layout: &ShardLayout,
    tensors: &Tensors<'_>,
    plan: &Plan,
    written: &[WrittenFile],
    at: &Path,
    labels: &[String],
) -> Result<u64> {
    match layout.tie {
        Tie::Index => {
            let mut weight_map = Vec::with_capacity(tensors.names.len());
            for (shard, label) in plan.shards.iter().zip(labels) {
                weight_map.extend(shard.iter().map(|&i| (tensors.names[i], label.as_str())));
            }
            let json = index_json(plan.total_size, &weight_map);
            crate::publish::publish_with(at, layout.durable, |w| {
                std::io::Write::write_all(w, &json)
            })
        }
        Tie::Root(write_root) => {
            write_root(at, written, labels, tensors.attributes, layout.durable)
        }
    }
}

/// An error about a file in the staging directory `staged` as one about
/// the file it becomes beside `dest` (a partial `.NAME.PID.RANDOM.partial`
/// is reported as `NAME`): the user knows the destination, not the hidden
/// directory it is built in.
pub fn relabel(e: Error, staged: &Path, dest: &Path) -> Error {
    let Some(file) = e.context().file.clone() else {
        return e;
    };
    let Ok(rest) = file.strip_prefix(staged) else {
        return e;
    };
    let mut name = rest.to_string_lossy().into_owned();
    if let Some(inner) = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(".partial"))
    {
        // NAME.PID.RANDOM: drop the last two fields.
        let mut fields = inner.rsplitn(3, '.');
        if let (Some(_random), Some(_pid), Some(stem)) =
            (fields.next(), fields.next(), fields.next())
        {
            name = stem.to_string();
        }
    }
    let shown = if name.is_empty() {
        dest.to_path_buf()
    } else {
        sibling(dest, &name)
    };
    e.relabel(&file, &shown)
}

fn file_name(dest: &Path) -> Result<String> {
    dest.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Write {
            rule: Rule::WRITE_DESTINATION,
            ctx: Context::file(dest),
            reason: "destination has no file name".into(),
        })
}

/// Writes what ties a checkpoint's shards together at the path given,
/// naming shard `i` by the `i`th label (see [`ShardLayout::label`]);
/// returns the bytes written. It publishes the file there as every writer
/// does (a partial renamed over the path), durably where the layout is.
pub type WriteTie<'a> = dyn Fn(&Path, &[String]) -> Result<u64> + 'a;

/// What [`publish_staged`] published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The files beside `dest`, the shards in order, then the index or
    /// root.
    pub files: Vec<String>,
    /// Bytes of the index or root.
    pub tie_bytes: u64,
}

/// Publish the complete shards `staged` (files in a staging directory
/// beside `dest`, in order) as the checkpoint `dest`, tied by
/// `write_tie`, so that a reader finds the old checkpoint or the new one
/// whole at every moment, whatever step a crash or a failed rename stops
/// at. The index (or root) is the single commit point:
///
/// 1. Where no file has a new shard's standard name, the shards are moved
///    in under those names, then the index is written over the old one.
/// 2. Otherwise (an overwrite: the old index names files the new shards
///    would replace) the shards are moved in under alternate names no
///    file has (`model-00001-of-00003.GGGGGGGG.safetensors`, see
///    [`ShardLayout::alternate`]) and an index naming them replaces the
///    old one: the new checkpoint is published, the old shards untouched
///    until then. Each shard is then hard-linked to its standard name,
///    and a second index naming those replaces the first. Where a link
///    cannot be made (a filesystem without hard links) or the second
///    index cannot be written, the checkpoint stays, complete, under its
///    alternate names.
///
/// Then earlier shards of `dest` that the published set does not name
/// are removed (as `save_pretrained` cleans its folder), alternate names
/// included. With `durable`, the directory is synced before each index,
/// so a power loss cannot leave an index naming entries not yet on disk.
pub fn publish_staged(
    staged: &[PathBuf],
    dest: &Path,
    layout: &ShardLayout,
    durable: bool,
    write_tie: &WriteTie<'_>,
) -> Result<Published> {
    publish_staged_observed(staged, dest, layout, durable, write_tie, &mut || {})
}

/// [`publish_staged`], calling `step` after every change it makes to the
/// destination's directory (the tests check every intermediate state).
fn publish_staged_observed(
    staged: &[PathBuf],
    dest: &Path,
    layout: &ShardLayout,
    durable: bool,
    write_tie: &WriteTie<'_>,
    step: &mut dyn FnMut(),
) -> Result<Published> {
    let name = file_name(dest)?;
    let dir = parent_dir(dest);
    let tie = dir.join(layout.tie_name(&name));
    let n = staged.len();
    let standard: Vec<String> = (0..n).map(|i| layout.label(&name, i, n)).collect();
    let files_of = |labels: &[String]| -> Vec<String> {
        labels.iter().map(|l| layout.file_of(&name, l)).collect()
    };
    let standard_files = files_of(&standard);
    let overwrite = standard_files
        .iter()
        .any(|f| std::fs::symlink_metadata(dir.join(f)).is_ok());
    let labels = if overwrite {
        let generation = zt_fsutil::random_u64() as u32;
        standard
            .iter()
            .map(|l| layout.alternate(l, generation))
            .collect()
    } else {
        standard.clone()
    };
    let mut files = files_of(&labels);
    for (from, file) in staged.iter().zip(&files) {
        let to = dir.join(file);
        std::fs::rename(from, &to).map_err(|e| Error::io(&to, e))?;
        step();
    }
    if durable {
        crate::publish::sync_dir(&dir)?;
    }
    let mut tie_bytes = write_tie(&tie, &labels)?;
    step();
    if overwrite && link_standard_names(&dir, &files, &standard_files, durable, step) {
        if let Ok(bytes) = write_tie(&tie, &standard) {
            step();
            tie_bytes = bytes;
            files = standard_files;
        }
    }
    files.push(layout.tie_name(&name));
    remove_replaced(&dir, layout, &name, &files);
    Ok(Published { files, tie_bytes })
}

/// Give each shard published under an alternate name its standard name
/// too, by a hard link (the index in force names the alternates, so the
/// files the standard names held are no longer read). False if any step
/// failed: the standard names are then not all the new shards'.
fn link_standard_names(
    dir: &Path,
    alternates: &[String],
    standard: &[String],
    durable: bool,
    step: &mut dyn FnMut(),
) -> bool {
    for (alternate, name) in alternates.iter().zip(standard) {
        let to = dir.join(name);
        match std::fs::remove_file(&to) {
            Ok(()) => step(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return false,
        }
        if std::fs::hard_link(dir.join(alternate), &to).is_err() {
            return false;
        }
        step();
    }
    !durable || crate::publish::sync_dir(dir).is_ok()
}

/// Remove earlier shards of the checkpoint `name` in `dir` that the new
/// set of `files` does not include (a save in 4 shards after one in 5
/// would otherwise leave `model-00005-of-00005`), as `save_pretrained`
/// cleans its folder. Best effort: the new checkpoint is complete already.
fn remove_replaced(dir: &Path, layout: &ShardLayout, name: &str, files: &[String]) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if layout.is_shard_name(name, &file) && !files.contains(&file) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Refuse a destination directory that exists and is not empty: a model
/// directory is replaced only where nothing would be lost.
pub fn refuse_occupied(dest_dir: &Path) -> Result<()> {
    match std::fs::symlink_metadata(dest_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(dest_dir, e)),
        Ok(m) if m.is_dir() => {
            let mut entries = std::fs::read_dir(dest_dir).map_err(|e| Error::io(dest_dir, e))?;
            if entries.next().is_some() {
                return Err(Error::Write {
                    rule: Rule::WRITE_DESTINATION,
                    ctx: Context::file(dest_dir),
                    reason: "the destination directory exists and is not empty".into(),
                });
            }
            Ok(())
        }
        Ok(_) => Err(Error::Write {
            rule: Rule::WRITE_DESTINATION,
            ctx: Context::file(dest_dir),
            reason: "the destination exists and is not a directory".into(),
        }),
    }
}

/// Rename the complete staging directory to `dest_dir` (which is absent
/// or an empty directory, which the rename replaces), durably.
pub fn rename_dir(staged: &Path, dest_dir: &Path) -> Result<()> {
    crate::publish::sync_dir(staged)?;
    std::fs::rename(staged, dest_dir).map_err(|e| Error::io(dest_dir, e))?;
    crate::publish::sync_dir(&parent_dir(dest_dir))
}

/// Copy a file (following a symlink, as a Hugging Face cache's snapshot
/// holds them) into the staging directory, durably. Returns its size.
fn copy_into(src: &Path, to: &Path) -> Result<u64> {
    let n = std::fs::copy(src, to).map_err(|e| Error::io(src, e))?;
    std::fs::File::open(to)
        .and_then(|f| f.sync_data())
        .map_err(|e| Error::io(to, e))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(sizes: &[u64]) -> Vec<Item> {
        sizes
            .iter()
            .map(|&size| Item {
                size,
                storage: None,
            })
            .collect()
    }

    #[test]
    fn sizes_parse_as_hugging_face_reads_them() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("500MB"), Ok(500_000_000));
        assert_eq!(parse_size("1.5kb"), Ok(1500));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size(" 1000 "), Ok(1000));
        for bad in ["", "0", "GB", "5XB", "-1GB", "five"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_split_is_huggingface_hubs() {
        // huggingface_hub's docstring: limit 10, sizes [6, 6, 2, 6, 2, 2]
        // give [6], [6+2], [6+2+2].
        let p = plan(&items(&[6, 6, 2, 6, 2, 2]), 10);
        assert_eq!(p.shards, [vec![0], vec![1, 2], vec![3, 4, 5]]);
        assert_eq!(p.total_size, 24);
        // A tensor over the limit gets its own shard, listed before the
        // shard still being filled.
        let p = plan(&items(&[2, 12, 3, 7]), 10);
        assert_eq!(p.shards, [vec![1], vec![0, 2], vec![3]]);
        // Shared storage: counted once, placed with its first tensor.
        let mut it = items(&[4, 4, 4, 4]);
        it[0].storage = Some(7);
        it[3].storage = Some(7);
        let p = plan(&it, 8);
        assert_eq!(p.shards, [vec![0, 1, 3], vec![2]]);
        assert_eq!(p.total_size, 12);
        assert_eq!(plan(&[], 10).shards, [Vec::<usize>::new()]);
    }

    #[test]
    fn names_follow_each_layout() {
        let hf = ShardLayout {
            checkpoint_name: "model.safetensors",
            tie: Tie::Index,
            durable: true,
        };
        assert_eq!(
            hf.shard_name("model.safetensors", 0, 3),
            "model-00001-of-00003.safetensors"
        );
        assert!(hf.is_shard_name("model.safetensors", "model-00002-of-00005.safetensors"));
        assert!(!hf.is_shard_name("model.safetensors", "model.safetensors"));
        assert!(!hf.is_shard_name("model.safetensors", "model-2-of-5.safetensors"));
        fn no_root(
            _: &Path,
            _: &[WrittenFile],
            _: &[String],
            _: &Attributes,
            _: bool,
        ) -> Result<u64> {
            Ok(0)
        }
        let root = ShardLayout {
            checkpoint_name: "model.zt",
            tie: Tie::Root(no_root),
            durable: false,
        };
        assert_eq!(root.shard_name("llama.zt", 4, 5), "llama-00005.zt");
        assert!(root.is_shard_name("llama.zt", "llama-00003.zt"));
        assert!(!root.is_shard_name("llama.zt", "llama-00003-of-00005.zt"));
    }

    /// A checkpoint for the publish tests: shards holding their
    /// generation's text, and a tie listing the generation, then the file
    /// of each shard.
    fn save(layout: &ShardLayout, dest: &Path, generation: &str, n: usize, step: &mut dyn FnMut()) {
        let name = file_name(dest).unwrap();
        let staging = Staging::create(dest).unwrap();
        let staged: Vec<PathBuf> = (0..n)
            .map(|i| {
                let p = staging.path().join(format!("s{i}"));
                std::fs::write(&p, generation).unwrap();
                p
            })
            .collect();
        let write_tie = |at: &Path, labels: &[String]| {
            let mut text = format!("{generation}\n");
            for l in labels {
                text += &format!("{}\n", layout.file_of(&name, l));
            }
            crate::publish::publish_with(at, false, |w| {
                std::io::Write::write_all(w, text.as_bytes())
            })
        };
        let published =
            publish_staged_observed(&staged, dest, layout, false, &write_tie, step).unwrap();
        assert_eq!(published.files.last(), Some(&layout.tie_name(&name)));
    }

    /// The checkpoint a reader finds at `dest`: its generation, and every
    /// file its tie names, each of which must hold that generation.
    fn read_back(layout: &ShardLayout, dest: &Path) -> (String, Vec<String>) {
        let dir = parent_dir(dest);
        let tie =
            std::fs::read_to_string(dir.join(layout.tie_name(&file_name(dest).unwrap()))).unwrap();
        let mut lines = tie.lines();
        let generation = lines.next().unwrap().to_string();
        let files: Vec<String> = lines.map(str::to_string).collect();
        for f in &files {
            let held = std::fs::read_to_string(dir.join(f))
                .unwrap_or_else(|e| panic!("{f} named by generation {generation}: {e}"));
            assert_eq!(
                held, generation,
                "{f} is torn: the {generation} tie names it"
            );
        }
        (generation, files)
    }

    fn layouts() -> [ShardLayout; 2] {
        fn root(_: &Path, _: &[WrittenFile], _: &[String], _: &Attributes, _: bool) -> Result<u64> {
            unreachable!("the tests write their own tie")
        }
        [
            ShardLayout {
                checkpoint_name: "model.safetensors",
                tie: Tie::Index,
                durable: false,
            },
            ShardLayout {
                checkpoint_name: "model.zt",
                tie: Tie::Root(root),
                durable: false,
            },
        ]
    }

    #[test]
    fn an_overwrite_is_old_or_new_at_every_step() {
        for layout in layouts() {
            for (old_n, new_n) in [(3, 3), (2, 3), (3, 2), (1, 1)] {
                let dir = tempfile::tempdir().unwrap();
                let dest = dir.path().join(layout.checkpoint_name);
                save(&layout, &dest, "old", old_n, &mut || {});
                let (_, old_files) = read_back(&layout, &dest);
                let mut seen = Vec::new();
                save(&layout, &dest, "new", new_n, &mut || {
                    // A crash here leaves this state: one whole checkpoint.
                    seen.push(read_back(&layout, &dest).0);
                });
                assert_eq!(seen.first().map(String::as_str), Some("old"));
                assert_eq!(seen.last().map(String::as_str), Some("new"));
                let (_, files) = read_back(&layout, &dest);
                let name = layout.checkpoint_name;
                let standard: Vec<String> = (0..new_n)
                    .map(|i| layout.shard_name(name, i, new_n))
                    .collect();
                assert_eq!(files, standard, "{name} {old_n} -> {new_n}");
                // Nothing else is left: no alternate names, no old shards.
                let mut left: Vec<String> = std::fs::read_dir(dir.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                left.sort();
                let mut want = standard.clone();
                want.push(layout.tie_name(name));
                want.sort();
                assert_eq!(left, want, "{name} {old_n} -> {new_n} (was {old_files:?})");
            }
        }
    }

    #[test]
    fn alternate_names_are_shard_names() {
        for layout in layouts() {
            let name = layout.checkpoint_name;
            let label = layout.label(name, 1, 3);
            let alternate = layout.file_of(name, &layout.alternate(&label, 0xdead_beef));
            assert!(alternate.contains(".deadbeef"), "{alternate}");
            assert!(layout.is_shard_name(name, &alternate), "{alternate}");
            assert_ne!(alternate, layout.shard_name(name, 1, 3));
        }
    }

    #[test]
    fn the_index_is_sorted_and_indented_like_save_pretrained() {
        let json = index_json(12, &[("b", "m-2"), ("a", "m-1")]);
        assert_eq!(
            String::from_utf8(json).unwrap(),
            "{\n  \"metadata\": {\n    \"total_size\": 12\n  },\n  \"weight_map\": {\n    \"a\": \"m-1\",\n    \"b\": \"m-2\"\n  }\n}\n"
        );
    }
}
