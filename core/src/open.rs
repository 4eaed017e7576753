//! Opening files: [`OpenOptions`] (limits, mapping), and the opener that
//! detects each file's format through a [`Registry`], opens Hugging Face
//! shard indexes (`*.index.json`) and merges what it opened.

use crate::rule::Rule;
use std::path::{Component, Path, PathBuf};
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

    /// The names of the "directories" directly under the object-storage
    /// prefix `url` (common prefixes), sorted: for stores that find their
    /// members by listing (a zarr group without consolidated metadata).
    pub fn list_prefixes(&self, url: &Path) -> Result<Vec<String>> {
        list_url_prefixes(url, &self.storage_options)
    }
}

#[cfg(feature = "remote")]
fn list_url_prefixes(url: &Path, storage_options: &[(String, String)]) -> Result<Vec<String>> {
    crate::remote::list_prefixes(url, storage_options)
}

#[cfg(not(feature = "remote"))]
fn list_url_prefixes(url: &Path, storage_options: &[(String, String)]) -> Result<Vec<String>> {
    // Without the client no URL opens: the same refusal as opening one.
    open_url(url, storage_options).map(|_| Vec::new())
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
        if let Some(file) = self.directory_checkpoint(path)? {
            return self.open(&file);
        }
        if is_shard_index(path) {
            return self.open_index(path);
        }
        match self.open_file(path) {
            Err(e) if is_missing_object(&e, path) => self.open(&self.under_prefix(path, e)?),
            other => other,
        }
    }

    /// The file [`Opener::open`] reads to open `path`, for detection: a
    /// directory's (or an `s3://` prefix's) checkpoint file, a shard
    /// index's first shard, else `path` itself.
    pub fn resolve(&self, path: &Path) -> Result<PathBuf> {
        let file = self
            .directory_checkpoint(path)?
            .unwrap_or_else(|| path.to_path_buf());
        if is_shard_index(&file) {
            let ctx = Context::file(&file);
            let json = self.read_index(&file)?;
            let shards = shard_files(&ctx, &json)?;
            let first = shards.first().ok_or_else(|| Error::Index {
                rule: Rule::INDEX_SCHEMA,
                ctx: ctx.clone(),
                reason: "the index names no shard".into(),
            })?;
            return shard_location(&ctx, &file, first);
        }
        if location::is_url(&file) {
            if let Err(e) = self.options.open_store_positional(&file) {
                return if is_missing_object(&e, &file) {
                    self.under_prefix(&file, e)
                } else {
                    Err(e)
                };
            }
        }
        Ok(file)
    }

    /// The checkpoint file of a local directory, or of an object URL
    /// ending with `/` (a key prefix); `None` for anything else.
    fn directory_checkpoint(&self, path: &Path) -> Result<Option<PathBuf>> {
        if location::is_url(path) {
            if path.to_string_lossy().ends_with('/') && has_key(path) {
                return self.checkpoint_under(path).map(Some);
            }
            return Ok(None);
        }
        if path.is_dir() {
            return self.checkpoint_in(path).map(Some);
        }
        Ok(None)
    }

    /// An object URL that names no object, opened as a key prefix holding
    /// a checkpoint (`s3://b/ckpt` for `s3://b/ckpt/.metadata`); `missing`
    /// (the object's own error) when it holds none either.
    fn under_prefix(&self, url: &Path, missing: Error) -> Result<PathBuf> {
        let prefix = PathBuf::from(format!("{}/", url.to_string_lossy()));
        self.checkpoint_under(&prefix).map_err(|_| missing)
    }

    /// The first checkpoint name present under an object-storage key
    /// prefix (ending with `/`), probed in order of preference, so no
    /// listing is needed.
    fn checkpoint_under(&self, prefix: &Path) -> Result<PathBuf> {
        let names = self.registry.checkpoint_names();
        for name in &names {
            let candidate = PathBuf::from(format!("{}{name}", prefix.to_string_lossy()));
            match self.options.open_store_positional(&candidate) {
                Ok(_) => return Ok(candidate),
                Err(e) if is_missing_object(&e, &candidate) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Index {
            rule: Rule::INDEX_CHECKPOINT,
            ctx: Context::file(prefix),
            reason: format!("no checkpoint here (looked for {})", names.join(", ")),
        })
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
        let json = self.read_index(index_path)?;
        let shard_files = shard_files(&ctx, &json)?;
        let weight_map = weight_map(&ctx, &json)?;
        let mut sources = Vec::with_capacity(shard_files.len());
        for file in &shard_files {
            let shard = shard_location(&ctx, index_path, file)?;
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
            merged.attributes = vec![("metadata".into(), Value::from_json(meta))];
        }
        merged.files.insert(0, index_path.to_path_buf());
        merged.versions.insert(0, None);
        Ok(merged)
    }
}

impl Opener<'_> {
    /// A shard index's JSON, its size checked before a byte is read (an
    /// index is a header).
    fn read_index(&self, index_path: &Path) -> Result<serde_json::Value> {
        let ctx = Context::file(index_path);
        let file = self.options.open_store_positional(index_path)?;
        self.options.limits.check_header(&ctx, file.len())?;
        let text = file.read(0, file.len())?;
        serde_json::from_slice(&text).map_err(|e| Error::Index {
            rule: Rule::INDEX_SCHEMA,
            ctx,
            reason: format!("not JSON: {e}"),
        })
    }
}

/// An index's `weight_map`.
fn weight_map<'j>(
    ctx: &Context,
    json: &'j serde_json::Value,
) -> Result<&'j serde_json::Map<String, serde_json::Value>> {
    json.get("weight_map")
        .and_then(|w| w.as_object())
        .ok_or_else(|| Error::Index {
            rule: Rule::INDEX_SCHEMA,
            ctx: ctx.clone(),
            reason: "no \"weight_map\" object".into(),
        })
}

/// Each shard an index names, once, in the order it first names it (a set
/// beside the list: searching the list made an index of many shards
/// quadratic to open).
fn shard_files<'j>(ctx: &Context, json: &'j serde_json::Value) -> Result<Vec<&'j str>> {
    let mut shard_files: Vec<&str> = Vec::new();
    let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
    for (name, file) in weight_map(ctx, json)? {
        let file = file.as_str().ok_or_else(|| Error::Index {
            rule: Rule::INDEX_SCHEMA,
            ctx: ctx.clone().tensor(name),
            reason: "shard file name is not a string".into(),
        })?;
        if seen.insert(file) {
            shard_files.push(file);
        }
    }
    Ok(shard_files)
}

/// Where the shard `file` an index names lies: beside the index, by plain
/// relative components only, and not itself an index.
fn shard_location(ctx: &Context, index_path: &Path, file: &str) -> Result<PathBuf> {
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
    // A shard that is itself an index would let two indexes name each
    // other (or one name itself) and recurse without end.
    if is_shard_index(&shard) {
        return Err(Error::Index {
            rule: Rule::INDEX_SHARD_PATH,
            ctx: ctx.clone(),
            reason: format!("shard {file:?} is itself an index"),
        });
    }
    Ok(shard)
}

/// An object URL names a key (or key prefix) after its bucket or host: a
/// bucket's root (`s3://bucket/`) is left to the object client, which
/// refuses it.
fn has_key(url: &Path) -> bool {
    let text = url.to_string_lossy();
    let rest = text.split_once("://").map_or("", |(_, r)| r);
    rest.split_once('/')
        .is_some_and(|(_, key)| !key.trim_matches('/').is_empty())
}

/// `error` says that the object at the URL `path` itself does not exist
/// (not a file it refers to).
fn is_missing_object(error: &Error, path: &Path) -> bool {
    location::is_url(path)
        && matches!(error, Error::NotFound { ctx } if ctx.file.as_deref() == Some(path))
}

fn is_shard_index(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".index.json"))
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

    #[test]
    fn a_url_is_a_key_prefix_only_past_its_bucket() {
        for (url, key) in [
            ("s3://b/ckpt/", true),
            ("s3://b/a/b/", true),
            ("s3://b/", false),
            ("s3://b//", false),
            ("https://host/", false),
            ("https://host/dir/", true),
        ] {
            assert_eq!(has_key(Path::new(url)), key, "{url}");
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
