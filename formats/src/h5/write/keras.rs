//! Keras 3's weights layout: the name checks of `layout="keras"`, and
//! the sharded form `save_weights(..., max_shard_size=)` writes
//! (keras 3.15.1 `saving_lib.ShardedH5IOStore`): shards
//! `NAME_00000.weights.h5`, `NAME_00001.weights.h5`, ... filled in the
//! variables' order until the next one would pass the size, and
//! `NAME.weights.json` = `{"metadata": {"total_size": bytes}, "weight_map":
//! {"/layers/dense/vars": ["NAME_00000.weights.h5"], ...}}`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value as Json};
use zt_core::catalog::{Attributes, Value};
use zt_core::error::{Context, Error, Result};
use zt_core::inputs::{Inputs, Subset};
use zt_core::publish::{publish, sync_dir, sync_files, Staging};

use super::{file, Layout};
use crate::h5::rules;

/// A Keras variable's path: groups, then `vars`, then its index
/// (`layers/dense/vars/0`, `optimizer/vars/3`, `vars/0`).
pub fn check_name(ctx: &Context, name: &str) -> Result<()> {
    let mut parts = name.rsplit('/');
    let index = parts.next().unwrap_or_default();
    let vars = parts.next();
    if vars == Some("vars") && !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(());
    }
    Err(Error::Write {
        rule: rules::KERAS,
        ctx: ctx.clone().tensor(name),
        reason: "a Keras weights file names each variable by its object path, \
                 `.../vars/N` (`layers/dense/vars/0`), as zt reads them from one"
            .into(),
    })
}

/// The index's path and the shards' stem, as Keras derives them from the
/// path `save_weights` is given (a name not ending in `.json` gets it).
fn names(path: &Path) -> (PathBuf, String) {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = match name.rsplit_once('.') {
        Some((stem, _)) => stem,
        None => &name,
    };
    let base = stem.replace(".weights", "");
    let index = if name.ends_with(".json") {
        path.to_path_buf()
    } else {
        path.with_file_name(format!("{stem}.json"))
    };
    (index, base)
}

/// Keras's split: in order, a new shard when the running size would pass
/// `max`; a single variable larger than `max` is refused, as Keras
/// refuses it.
fn split(ctx: &Context, tensors: &dyn Inputs, max: u64) -> Result<Vec<Vec<usize>>> {
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut current = 0u64;
    for i in 0..tensors.len() {
        let t = tensors.meta(i);
        let size = t.nbytes(ctx)?;
        if size > max {
            return Err(Error::Write {
                rule: rules::KERAS,
                ctx: ctx.clone().tensor(t.name),
                reason: format!(
                    "{size} bytes, more than the shard size {max} (Keras refuses it too)"
                ),
            });
        }
        current += size;
        if current > max {
            shards.push(Vec::new());
            current = size;
        }
        shards.last_mut().expect("one shard").push(i);
    }
    Ok(shards)
}

/// Write the sharded checkpoint: shards built in a staging directory,
/// moved beside the index, the index published last (so an index never
/// names a shard not in place). Returns the bytes written.
pub fn publish_sharded(
    tensors: &dyn Inputs,
    metadata: &[(String, Value)],
    attributes: &[&Attributes],
    path: &Path,
    max: u64,
    durable: bool,
) -> Result<u64> {
    let ctx = Context::file(path);
    let (index, base) = names(path);
    let mut total = 0u64;
    for i in 0..tensors.len() {
        let t = tensors.meta(i);
        total += t.nbytes(&ctx)?;
        check_name(&ctx, t.name)?;
    }
    let shards = split(&ctx, tensors, max)?;
    let staging = Staging::create(&index)?;
    let dir = zt_core::location::parent_dir(&index);
    let mut files = Vec::with_capacity(shards.len());
    let mut staged = Vec::with_capacity(shards.len());
    let mut bytes = 0;
    // Each group's shards, by shard number (named only once placed).
    let mut weight_map: Vec<(String, Vec<usize>)> = Vec::new();
    for (i, members) in shards.iter().enumerate() {
        let file_name = format!("{base}_{i:05}.weights.h5");
        let shard = Subset::new(tensors, members);
        let at = staging.path().join(&file_name);
        // The file attributes go in the first shard, with its groups.
        let meta = if i == 0 { metadata } else { &[] };
        let attrs: Vec<&Attributes> = members
            .iter()
            .filter_map(|&m| attributes.get(m).copied())
            .collect();
        bytes += file::publish(&shard, meta, &attrs, &at, Layout::Keras, false)
            .map_err(|e| zt_core::shard::relabel(e, staging.path(), &dir))?;
        for &m in members {
            let t = tensors.meta(m);
            let group = format!("/{}", t.name.rsplit_once('/').map_or("", |(g, _)| g));
            match weight_map.iter_mut().find(|(g, _)| *g == group) {
                Some((_, shards)) if shards.contains(&i) => {}
                Some((_, shards)) => shards.push(i),
                None => weight_map.push((group, vec![i])),
            }
        }
        staged.push(at);
        files.push(file_name);
    }
    if durable {
        sync_files(&staged)?;
    }
    // An overwrite must not replace a shard the old index names before the
    // new index is in force (a crash between would leave the old index
    // naming new shards): the new shards go in under names no file has,
    // an index naming them is published (the commit point), and only then
    // does each take its standard name (a hard link) and a second index
    // name those. Where a link or that index fails, the checkpoint stays,
    // complete, under the other names.
    let overwrite = files
        .iter()
        .any(|f| std::fs::symlink_metadata(dir.join(f)).is_ok());
    let placed: Vec<String> = if overwrite {
        let generation = generation();
        files.iter().map(|f| alternate(f, generation)).collect()
    } else {
        files.clone()
    };
    for (from, name) in staged.iter().zip(&placed) {
        let to = dir.join(name);
        std::fs::rename(from, &to).map_err(|e| Error::io(&to, e))?;
    }
    if durable {
        sync_dir(&dir)?;
    }
    drop(staging);
    let index_text = |names: &[String]| {
        let mut map = Map::new();
        for (group, shards) in &weight_map {
            let files: Vec<&str> = shards.iter().map(|&i| names[i].as_str()).collect();
            map.insert(group.clone(), json!(files));
        }
        let doc =
            json!({"metadata": {"total_size": total as f64}, "weight_map": Json::Object(map)});
        // json.dumps(..., indent=4), as Keras writes it.
        let mut text = Vec::new();
        let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
        let mut ser = serde_json::Serializer::with_formatter(&mut text, fmt);
        serde::Serialize::serialize(&doc, &mut ser).expect("JSON of plain values");
        text
    };
    let mut index_bytes = publish(&index, |w| w.write_all(&index_text(&placed)))?;
    let mut published = placed.clone();
    if overwrite && link_standard_names(&dir, &placed, &files, durable) {
        if let Ok(n) = publish(&index, |w| w.write_all(&index_text(&files))) {
            index_bytes = n;
            published = files;
        }
    }
    bytes += index_bytes;
    // Only now, with the new index in force, are the earlier write's
    // shards (and the alternates, once the standard names hold them)
    // unread: removing them sooner would break the old checkpoint if the
    // write stopped before its index.
    remove_stale_shards(&dir, &base, &published, durable);
    Ok(bytes)
}

/// A number no earlier write used (a process-random hash of the time),
/// for [`alternate`] names.
fn generation() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish() as u32
}

/// `NAME_00001.weights.h5` as `NAME_00001.GGGGGGGG.weights.h5`: the
/// generation in hex, a name no earlier shard has.
fn alternate(file: &str, generation: u32) -> String {
    let stem = file.strip_suffix(".weights.h5").unwrap_or(file);
    format!("{stem}.{generation:08x}.weights.h5")
}

/// Give each shard placed under an alternate name its standard name too
/// (a hard link; the index in force names the alternates, so the files
/// the standard names held are unread). False if any step failed.
fn link_standard_names(dir: &Path, placed: &[String], standard: &[String], durable: bool) -> bool {
    for (alt, name) in placed.iter().zip(standard) {
        let to = dir.join(name);
        match std::fs::remove_file(&to) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return false,
        }
        if std::fs::hard_link(dir.join(alt), &to).is_err() {
            return false;
        }
    }
    !durable || sync_dir(dir).is_ok()
}

/// True if `file` is named as Keras names a shard of the checkpoint
/// `base`: `BASE_` + its index, zero-padded to at least 5 digits, +
/// `.weights.h5` (`f"{base}_{i:05}.weights.h5"`), or as an overwrite
/// places one first ([`alternate`]: `.GGGGGGGG` before `.weights.h5`).
fn is_shard_of(base: &str, file: &str) -> bool {
    let Some(index) = file
        .strip_prefix(base)
        .and_then(|r| r.strip_prefix('_'))
        .and_then(|r| r.strip_suffix(".weights.h5"))
    else {
        return false;
    };
    let hex8 = |g: &str| g.len() == 8 && g.bytes().all(|b| b.is_ascii_hexdigit());
    let index = match index.rsplit_once('.') {
        Some((i, g)) if hex8(g) => i,
        _ => index,
    };
    let padded = index.len() == 5 || (index.len() > 5 && !index.starts_with('0'));
    padded && index.bytes().all(|b| b.is_ascii_digit())
}

/// Remove the shards of `base` in `dir` that the published index does
/// not name (an overwrite with fewer shards than before leaves
/// `NAME_00002.weights.h5` otherwise), and nothing else. Best effort: the
/// new checkpoint is complete already, and a file left behind is removed
/// by the next write.
fn remove_stale_shards(dir: &Path, base: &str, published: &[String], durable: bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut removed = false;
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if is_shard_of(base, &file) && !published.contains(&file) {
            removed |= std::fs::remove_file(entry.path()).is_ok();
        }
    }
    if removed && durable {
        let _ = sync_dir(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zt_core::dtype::DType;
    use zt_core::write::TensorIn;

    #[test]
    fn names_follow_keras() {
        let (i, b) = names(Path::new("/d/m.weights.json"));
        assert_eq!((i, b.as_str()), (PathBuf::from("/d/m.weights.json"), "m"));
        let (i, b) = names(Path::new("/d/m.weights.h5"));
        assert_eq!((i, b.as_str()), (PathBuf::from("/d/m.weights.json"), "m"));
    }

    #[test]
    fn shard_names_of_a_checkpoint_only() {
        for yes in [
            "m_00000.weights.h5",
            "m_00012.weights.h5",
            "m_123456.weights.h5",
            "m_00003.0badf00d.weights.h5",
        ] {
            assert!(is_shard_of("m", yes), "{yes}");
        }
        for no in [
            "m.weights.h5",
            "m.weights.json",
            "m_0001.weights.h5",
            "m_012345.weights.h5",
            "m_x_00000.weights.h5",
            "mm_00000.weights.h5",
            "m_00000.weights.h5.tmp",
            "m_0000a.weights.h5",
            "m_00000.h5",
            "m_00000.xyz.weights.h5",
            "m_00000.0badf00.weights.h5",
        ] {
            assert!(!is_shard_of("m", no), "{no}");
        }
        // Another checkpoint whose name starts like this one's.
        assert!(!is_shard_of("m", "m_00001_00000.weights.h5"));
        assert!(is_shard_of("m_00001", "m_00001_00000.weights.h5"));
    }

    #[test]
    fn alternates_are_shard_names_no_standard_one_has() {
        let a = alternate("m_00002.weights.h5", 0xbadf00d);
        assert_eq!(a, "m_00002.0badf00d.weights.h5");
        assert!(is_shard_of("m", &a));
    }

    #[test]
    fn an_overwrite_ends_under_the_standard_names_with_the_new_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.weights.json");
        let data = [[1u8; 40], [2u8; 40]];
        let names = ["layers/a/vars/0", "layers/b/vars/0", "layers/c/vars/0"];
        let write = |which: usize| {
            let ts: Vec<TensorIn<'_>> = names
                .iter()
                .map(|&name| TensorIn {
                    name,
                    dtype: DType::U8,
                    shape: &[40],
                    data: &data[which],
                })
                .collect();
            // 40 bytes a shard: one variable each, three shards.
            publish_sharded(&ts.as_slice(), &[], &[], &path, 40, false).unwrap();
        };
        write(0);
        write(1);
        let mut files: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let want = [
            "m.weights.json",
            "m_00000.weights.h5",
            "m_00001.weights.h5",
            "m_00002.weights.h5",
        ];
        assert_eq!(files, want);
        let index = std::fs::read_to_string(&path).unwrap();
        assert!(index.contains("\"m_00002.weights.h5\""), "{index}");
        for f in &want[1..] {
            let bytes = std::fs::read(dir.path().join(f)).unwrap();
            assert!(bytes.windows(40).any(|w| w == [2u8; 40]), "{f}");
            assert!(!bytes.windows(40).any(|w| w == [1u8; 40]), "{f}");
        }
    }

    #[test]
    fn split_as_keras_splits() {
        static SHAPES: [[u64; 1]; 7] = [[48], [12], [12], [12], [12], [12], [64]];
        let data = [0u8; 64];
        let t = |shape: &'static [u64]| TensorIn {
            name: "vars/0",
            dtype: DType::U8,
            shape,
            data: &data[..shape[0] as usize],
        };
        let ts: Vec<TensorIn<'_>> = SHAPES[..6].iter().map(|s| t(s)).collect();
        let s = split(&Context::default(), &ts.as_slice(), 107).unwrap();
        assert_eq!(s, vec![vec![0, 1, 2, 3, 4], vec![5]]);
        let big = [t(&SHAPES[6])];
        assert!(split(&Context::default(), &big.as_slice(), 63).is_err());
    }

    #[test]
    fn keras_names() {
        let ctx = Context::default();
        for ok in ["vars/0", "layers/dense/vars/12", "optimizer/vars/3"] {
            check_name(&ctx, ok).unwrap();
        }
        for bad in ["dense/kernel", "vars", "layers/vars/x", "vars/"] {
            assert_eq!(
                check_name(&ctx, bad).unwrap_err().rule(),
                Some(rules::KERAS)
            );
        }
    }
}
