//! Opening files: [`OpenOptions`] (limits, mapping), and the opener that
//! detects each file's format through a [`Registry`], opens Hugging Face
//! shard indexes (`*.index.json`) and merges what it opened.

use crate::rule::Rule;
use std::path::{Component, Path};
use std::sync::Arc;

use crate::catalog::Value;
use crate::error::{Context, Error, Result};
use crate::format::OpenInput;
use crate::limits::Limits;
use crate::location;
use crate::registry::Registry;
use crate::source::Source;
use crate::store::Store;

/// How to open files.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Bounds every plugin obeys.
    pub limits: Limits,
    /// Memory-map files (the default); `false` uses positional reads.
    pub map: bool,
    /// How `s3://` and `https://` locations are reached: storage options
    /// by `object_store`'s key names (`endpoint`, `region`, ...) and zt's
    /// (`part_size`, `concurrency`, `cache`, ...), over the standard AWS
    /// environment and profile files. See `zt_remote::config`.
    pub storage_options: Vec<(String, String)>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            limits: Limits::default(),
            map: true,
            storage_options: Vec::new(),
        }
    }
}

impl OpenOptions {
    /// Open the bytes at `location` the way these options say: mapped or
    /// positional for a local path, ranged GETs (or the local cache) for
    /// an object URL.
    pub fn open_store(&self, location: &Path) -> Result<Store> {
        if location::is_url(location) {
            return open_url(location, &self.storage_options);
        }
        if self.map {
            Store::open(location)
        } else {
            Store::open_positional(location)
        }
    }

    /// Open the bytes at `location` for positional reads only (no mapping),
    /// for small files read once (indexes, detection).
    pub fn open_store_positional(&self, location: &Path) -> Result<Store> {
        OpenOptions {
            map: false,
            ..self.clone()
        }
        .open_store(location)
    }
}

#[cfg(feature = "remote")]
fn open_url(url: &Path, storage_options: &[(String, String)]) -> Result<Store> {
    crate::remote::open_store(url, storage_options)
}

#[cfg(not(feature = "remote"))]
fn open_url(url: &Path, _storage_options: &[(String, String)]) -> Result<Store> {
    Err(Error::Remote {
        ctx: Context::file(url),
        kind: crate::error::RemoteKind::Unsupported,
        detail: "this build of zt has no object-storage support (the `remote` feature)".into(),
    })
}

/// Opens files with a set of options, recognising formats through a registry.
pub(crate) struct Opener<'a> {
    pub registry: &'a Registry,
    pub options: &'a OpenOptions,
}

impl Opener<'_> {
    /// Open one file, a Hugging Face shard index (`*.index.json`), or a
    /// local directory, as the checkpoint file it holds.
    pub fn open(&self, path: &Path) -> Result<Source> {
        if !location::is_url(path) && path.is_dir() {
            return self.open(&self.checkpoint_in(path)?);
        }
        if is_shard_index(path) {
            return self.open_index(path);
        }
        self.open_file(path)
    }

    /// The file a directory is opened through: the first present of the
    /// checkpoint names the plugins declare, most preferred first (a model
    /// directory's `model.safetensors`, a distributed checkpoint's
    /// `.metadata`). The plugins name the files, so the core names no
    /// format; the file found is a regular file, so this never recurses.
    fn checkpoint_in(&self, dir: &Path) -> Result<std::path::PathBuf> {
        let names = self.registry.checkpoint_names();
        names
            .iter()
            .map(|name| dir.join(name))
            .find(|p| p.is_file())
            .ok_or_else(|| Error::Index {
                rule: Rule::INDEX_CHECKPOINT,
                ctx: Context::file(dir),
                reason: format!("no checkpoint here (looked for {})", names.join(", ")),
            })
    }

    /// Open several files as one source; a name found in two files is an error.
    pub fn open_all<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Source> {
        let sources = paths
            .iter()
            .map(|p| self.open(p.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Source::merge(sources)
    }

    /// Open one tensor file (not an index).
    fn open_file(&self, path: &Path) -> Result<Source> {
        let store = Arc::new(self.options.open_store(path)?);
        // Detection and the format's structure walk read small scattered
        // pieces: fault in only those (see `Store::begin_walk`).
        store.begin_walk();
        let format = self.registry.detect_store(&store)?;
        let input = OpenInput::with_options(&store, self.options);
        let catalog = format.open(&input);
        input.end_walks();
        let catalog = catalog.map_err(|e| e.in_file(path))?;
        Source::from_catalog(format.name(), store, catalog, self.options.limits.clone())
    }

    /// Open every shard a `model.safetensors.index.json` names and check
    /// that each tensor is in the shard the index says.
    fn open_index(&self, index_path: &Path) -> Result<Source> {
        let ctx = Context::file(index_path);
        // The size is checked before a byte is read: an index is a header.
        let file = self.options.open_store_positional(index_path)?;
        self.options.limits.check_header(&ctx, file.len())?;
        let text = file.read(0, file.len())?;
        let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| Error::Index {
            rule: Rule::INDEX_SCHEMA,
            ctx: ctx.clone(),
            reason: format!("not JSON: {e}"),
        })?;
        let weight_map = json
            .get("weight_map")
            .and_then(|w| w.as_object())
            .ok_or_else(|| Error::Index {
                rule: Rule::INDEX_SCHEMA,
                ctx: ctx.clone(),
                reason: "no \"weight_map\" object".into(),
            })?;
        // Each shard once, in the order the index first names it (a set
        // beside the list: searching the list was quadratic, 40 s for an
        // index naming 80k shards).
        let mut shard_files: Vec<&str> = Vec::new();
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for (name, file) in weight_map {
            let file = file.as_str().ok_or_else(|| Error::Index {
                rule: Rule::INDEX_SCHEMA,
                ctx: ctx.clone().tensor(name),
                reason: "shard file name is not a string".into(),
            })?;
            if seen.insert(file) {
                shard_files.push(file);
            }
        }
        let mut sources = Vec::with_capacity(shard_files.len());
        for file in &shard_files {
            let rel = Path::new(file);
            let escapes = rel.is_absolute()
                || location::is_url(rel)
                || rel.components().any(|c| !matches!(c, Component::Normal(_)));
            if escapes {
                return Err(Error::Index {
                    rule: Rule::INDEX_SHARD_PATH,
                    ctx: ctx.clone(),
                    reason: format!("shard path {file:?} leaves the index's directory"),
                });
            }
            let shard = location::sibling(index_path, file);
            // A shard that is itself an index would let two indexes name
            // each other (or one name itself) and recurse without end.
            if is_shard_index(&shard) {
                return Err(Error::Index {
                    rule: Rule::INDEX_SHARD_PATH,
                    ctx: ctx.clone(),
                    reason: format!("shard {file:?} is itself an index"),
                });
            }
            let source = self.open_file(&shard)?;
            for t in source.tensors() {
                match weight_map.get(t.name()).and_then(|v| v.as_str()) {
                    Some(f) if f == *file => {}
                    Some(f) => {
                        return Err(Error::Index {
                            rule: Rule::INDEX_MISMATCH,
                            ctx: ctx.clone().tensor(t.name()),
                            reason: format!("index says {f:?}, found in {file:?}"),
                        })
                    }
                    None => {
                        return Err(Error::Index {
                            rule: Rule::INDEX_MISMATCH,
                            ctx: ctx.clone().tensor(t.name()),
                            reason: format!("found in {file:?} but not in the index"),
                        })
                    }
                }
            }
            sources.push(source);
        }
        let mut merged = Source::merge(sources)?;
        for name in weight_map.keys() {
            if merged.get(name).is_none() {
                return Err(Error::Index {
                    rule: Rule::INDEX_MISMATCH,
                    ctx: ctx.clone().tensor(name),
                    reason: format!(
                        "the index names it in {:?} but that shard lacks it",
                        weight_map[name]
                    ),
                });
            }
        }
        if let Some(meta) = json.get("metadata") {
            merged.attributes = vec![("metadata".into(), json_to_value(meta))];
        }
        merged.files.insert(0, index_path.to_path_buf());
        Ok(merged)
    }
}

fn is_shard_index(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".index.json"))
}

fn json_to_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::Null,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => n
            .as_i64()
            .map(Value::Int)
            .or_else(|| n.as_u64().map(Value::UInt))
            .unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or(f64::NAN))),
        J::String(s) => Value::Str(s.clone()),
        J::Array(a) => Value::List(a.iter().map(json_to_value).collect()),
        J::Object(o) => Value::Map(
            o.iter()
                .map(|(k, v)| (k.clone(), json_to_value(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, Object, Payload};
    use crate::dtype::DType;
    use crate::format::{Format, Probe};
    use std::sync::Mutex;

    /// The stores a [`Walker`] saw, and whether each was walking then.
    static SEEN: Mutex<Vec<(Arc<Store>, bool)>> = Mutex::new(Vec::new());

    /// A format whose file names a related file holding its one tensor.
    struct Walker;

    impl Format for Walker {
        fn name(&self) -> &'static str {
            "walker"
        }
        fn extensions(&self) -> &'static [&'static str] {
            &["walk"]
        }
        fn sniff(&self, probe: &Probe<'_>) -> bool {
            probe.head.starts_with(b"walk:")
        }
        fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
            let head = input.store.read(0, input.store.len())?;
            let name = std::str::from_utf8(&head[5..]).unwrap().trim();
            let data = input.open_related(name, "data")?;
            let mut seen = SEEN.lock().unwrap();
            seen.push((Arc::clone(input.store), input.store.is_walking()));
            seen.push((Arc::clone(&data), data.is_walking()));
            let len = data.len();
            Ok(Catalog {
                objects: vec![Object::dense(
                    "t",
                    DType::U8,
                    vec![len],
                    Payload::Stored {
                        store: data,
                        offset: 0,
                        len,
                    },
                )],
                ..Catalog::default()
            })
        }
    }

    static WALKER: Walker = Walker;
    static FORMATS: [&dyn Format; 1] = [&WALKER];

    #[test]
    fn a_format_walks_its_files_page_by_page_and_the_source_reads_them_normally() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.walk"), b"walk:model.data").unwrap();
        std::fs::write(dir.path().join("model.data"), [9u8; 4096]).unwrap();
        let registry = Registry::new(&FORMATS, &[]);
        for map in [true, false] {
            SEEN.lock().unwrap().clear();
            let options = OpenOptions {
                map,
                ..OpenOptions::default()
            };
            let source = registry
                .open(&dir.path().join("model.walk"), &options)
                .unwrap();
            assert_eq!(source.len(), 1);
            let seen = SEEN.lock().unwrap();
            assert_eq!(seen.len(), 2);
            // During the format's open both files are in a structure walk
            // (mapped or positional: a walk notes its cold pages either
            // way); once the source exists, neither is.
            for (store, walking) in seen.iter() {
                assert!(*walking, "{}", store.path().display());
                assert!(!store.is_walking(), "{}", store.path().display());
            }
        }
    }
}
