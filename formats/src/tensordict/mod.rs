//! TensorDict's on-disk forms (tensordict 0.15.3), read here and written
//! by [`mod@write`]: the memmap directory (`td.memmap(path)`) and the
//! consolidated file (`td.consolidate(filename=...)`).
//!
//! * Memmap directory: per nested level a directory with `meta.json` and
//!   one raw C-order `<key>.memmap` per leaf (`{"obs": {"device": "cpu",
//!   "shape": [3, 4], "dtype": "torch.float32", "is_nested": false},
//!   "next": {"type": "TensorDict"}, "s": {"type": "NonTensorData"},
//!   "shape": [3], ..., "_format_version": 1}`; version 0 lacks the last
//!   two keys). A nested level `next` is the subdirectory `next/`; a
//!   non-tensor `s` is `s/meta.json` holding its value; a leaf with no
//!   elements has no file. Opened from the root `meta.json` (a directory
//!   opens through it: the plugin's checkpoint name).
//! * `.tdz` archive (`td.save("x.tdz")`): a zip whose members are the
//!   memmap directory's files, leaves stored (uncompressed, aligned), read
//!   in place; a member named with `..`, `.` or an absolute path refuses
//!   the archive whole.
//! * Consolidated file: every leaf's bytes end to end, then a JSON, then
//!   the JSON's length as a little-endian u64. A leaf is `[dtype, shape,
//!   start, end, pad]` (its bytes `[start, end - pad)`), a nested level an
//!   object of its own under its key; `non_tensors` holds the values.
//!
//! Tensors are named by their path with dots (`next.reward`), read in
//! place (zero-copy where aligned). Non-tensor values are the attribute
//! `tensordict.non_tensors` (dotted names to values), the root's batch
//! size `tensordict.batch_size`. Refusals cite `tensordict.*` rules.

use std::sync::Arc;

pub mod write;

use serde_json::{Map, Value as Json};
use zt_core::catalog::{Catalog, Object, Payload, Value};
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::rule::Rule;
use zt_core::store::Store;
use zt_core::DType;

/// The rules a refusal of a TensorDict file cites.
pub mod rules {
    use zt_core::rule::Rule;
    /// `meta.json` or the consolidated JSON is not what tensordict writes.
    pub const META: Rule = Rule::new("tensordict.Meta");
    /// A leaf's bytes disagree with its dtype and shape, or lie outside
    /// its file.
    pub const LEAF: Rule = Rule::new("tensordict.Leaf");
    /// A key that would leave its directory, or nesting past the limit.
    pub const PATH: Rule = Rule::new("tensordict.Path");
    /// A `.tdz` archive whose members are not the directory's files: a
    /// name that leaves it, a name twice, a missing or compressed leaf.
    pub const ARCHIVE: Rule = Rule::new("tensordict.Archive");
    /// Every rule above.
    pub const RULES: &[Rule] = &[META, LEAF, PATH, ARCHIVE];
}
use rules::{ARCHIVE, LEAF, META, PATH, RULES};

/// The memmap directory's reader (its root `meta.json`).
pub struct MemmapDir;
/// The consolidated file's reader.
pub struct Consolidated;
/// The `.tdz` archive's reader (a stored zip mirroring the directory).
pub struct Archive;

/// The TensorDict plugin.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "tensordict",
    // Both are told from text tensordict writes (a `meta.json` naming its
    // classes; a JSON trailer with its own length after it), which no
    // other format's first or last bytes hold: before PyTorch (a
    // consolidated file is often named `.bin`).
    readers: &[
        zt_core::Reader {
            format: &MemmapDir,
            detect_rank: 25,
        },
        zt_core::Reader {
            format: &Consolidated,
            detect_rank: 26,
        },
        zt_core::Reader {
            format: &Archive,
            detect_rank: 24,
        },
    ],
    writers: &[&write::MemmapDirWriter, &write::ConsolidatedWriter],
    rules: &[("tensordict", RULES)],
    // After DCP's `.metadata`: a memmap directory opens through its root.
    checkpoints: &[zt_core::Checkpoint {
        name: "meta.json",
        preference: 38,
    }],
};

/// Fuzz target `tensordict`: both readers on every input, seeded by
/// [`seeds`] (a consolidated file and root `meta.json`s, made in Rust).
const FUZZ_TARGET: zt_core::FuzzTarget = zt_core::FuzzTarget {
    make_seeds: Some(seeds),
    ..zt_core::FuzzTarget::new("tensordict", &[])
};

/// The fuzz seeds: a consolidated file as tensordict 0.15.3 lays one out
/// (two leaves, one padded, a nested level, a non-tensor), and root
/// `meta.json`s of format versions 1 and 0 whose leaves need no file.
pub fn seeds() -> Vec<zt_core::Seed> {
    let mut consolidated: Vec<u8> = (0u8..48).collect(); // obs: f32 [3, 4]
    consolidated.extend([1, 0, 2, 0, 3, 0, 0, 0]); // reward: bf16 [3, 1] + 2 bytes pad
    let json = concat!(
        r#"{"cls": "TensorDict", "non_tensors": {"s": ["hello", [3], null]}, "#,
        r#""leaves": {"obs": ["torch.float32", [3, 4], 0, 48, 0]}, "#,
        r#""cls_metadata": {"batch_size": [3]}, "#,
        r#""next": {"cls": "TensorDict", "non_tensors": {}, "leaves": {"reward": ["torch.bfloat16", [3, 1], 48, 56, 2]}}}"#
    );
    consolidated.extend(json.as_bytes());
    consolidated.extend((json.len() as u64).to_le_bytes());
    let meta = |version: &str| {
        format!(
            r#"{{"e": {{"device": "cpu", "shape": [3, 0], "dtype": "torch.float32", "is_nested": false}}, "shape": [3], "device": "cpu", "_type": "<class 'tensordict._td.TensorDict'>"{version}}}"#
        )
        .into_bytes()
    };
    vec![
        ("consolidated.bin".to_string(), consolidated),
        (
            "meta-v1.tdmeta".to_string(),
            meta(r#", "_format_version": 1, "_class": "tensordict:TensorDict""#),
        ),
        ("meta-v0.tdmeta".to_string(), meta("")),
    ]
}

/// Nested levels deeper than this are refused (`tensordict.Path`).
const MAX_DEPTH: usize = 64;

/// Keys of a level's `meta.json` that describe the level, not an entry.
const LEVEL_KEYS: &[&str] = &[
    "shape",
    "device",
    "_type",
    "_format_version",
    "_class",
    "names",
    "_is_locked",
];

fn torch_dtype(name: &str) -> Option<DType> {
    crate::pt::rebuild::torch_dtype(name.strip_prefix("torch.")?)
}

fn parse_json(ctx: &Context, bytes: &[u8], what: &str) -> Result<Map<String, Json>> {
    match serde_json::from_slice::<Json>(bytes) {
        Ok(Json::Object(map)) => Ok(map),
        Ok(_) => Err(Error::header(
            ctx.clone(),
            META,
            format!("{what} is not a JSON object"),
        )),
        Err(e) => Err(Error::header(ctx.clone(), META, format!("{what}: {e}"))),
    }
}

fn shape_of(ctx: &Context, v: Option<&Json>, what: &str) -> Result<Vec<u64>> {
    let dims = v
        .and_then(Json::as_array)
        .ok_or_else(|| Error::header(ctx.clone(), META, format!("{what}: no shape list")))?;
    dims.iter()
        .map(|d| {
            d.as_u64().ok_or_else(|| {
                Error::header(
                    ctx.clone(),
                    META,
                    format!("{what}: shape {d} is not a size"),
                )
            })
        })
        .collect()
}

/// `dtype`'s bytes for `shape`, or a refusal.
fn leaf_bytes(ctx: &Context, dtype: DType, shape: &[u64], name: &str) -> Result<u64> {
    let size = dtype.size().ok_or_else(|| {
        Error::header(
            ctx.clone(),
            LEAF,
            format!("{name:?}: {dtype} is not a whole-byte type"),
        )
    })?;
    shape
        .iter()
        .try_fold(size, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::header(ctx.clone(), LEAF, format!("{name:?}: its size overflows")))
}

/// A key as one path component: no separator, no `.`/`..`, not empty.
fn check_key(ctx: &Context, key: &str) -> Result<()> {
    if key.is_empty() || key == "." || key == ".." || key.contains(['/', '\\', '\0']) {
        return Err(Error::header(
            ctx.clone(),
            PATH,
            format!("key {key:?} is not a file name"),
        ));
    }
    Ok(())
}

fn dotted(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

fn read_whole(input: &OpenInput<'_>, store: &Store) -> Result<Vec<u8>> {
    input
        .limits
        .check_header(&Context::file(store.path()), store.len())?;
    Ok(store.read(0, store.len())?.into_owned())
}

impl Format for MemmapDir {
    fn name(&self) -> &'static str {
        "tensordict"
    }

    /// None: its file is `meta.json`, told by content (a model directory's
    /// `config.json` must stay a companion file, not a weights file).
    fn extensions(&self) -> &'static [&'static str] {
        &[]
    }

    /// A JSON object naming tensordict's classes (looked for in the bytes
    /// as they are: a lossy UTF-8 copy of the 64 KiB probe was most of a
    /// warm safetensors open).
    fn sniff(&self, probe: &Probe<'_>) -> bool {
        probe.json_object_with(&[b"\"tensordict:", b"<class 'tensordict."])
    }

    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(FUZZ_TARGET)
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        open_tree(input, Files::Dir)
    }
}

/// Walk a memmap tree from its root `meta.json`: the opened file itself
/// for a directory, the member `meta.json` of an archive.
fn open_tree(input: &OpenInput<'_>, files: Files) -> Result<Catalog> {
    {
        let mut walk = Walk {
            input,
            files,
            objects: Vec::new(),
            non_tensors: Vec::new(),
            extra: Vec::new(),
        };
        let root = match &walk.files {
            Files::Dir => read_whole(input, input.store)?,
            Files::Archive(_) => walk.text("meta.json", "the root meta.json")?,
        };
        let root = parse_json(&input.ctx(), &root, "meta.json")?;
        walk.level(&root, "", "", 0)?;
        let mut attributes = vec![];
        if let Some(shape) = root.get("shape") {
            attributes.push(("tensordict.batch_size".to_string(), Value::from_json(shape)));
        }
        if !walk.non_tensors.is_empty() {
            attributes.push((
                "tensordict.non_tensors".into(),
                Value::Map(walk.non_tensors),
            ));
        }
        input
            .limits
            .check_tensors(&input.ctx(), walk.objects.len() as u64)?;
        Ok(Catalog {
            objects: walk.objects,
            attributes,
            extra_stores: walk.extra,
            ..Catalog::default()
        })
    }
}

/// Where a memmap tree's files are: a directory beside the root
/// `meta.json`, or the members of a `.tdz` archive.
enum Files {
    Dir,
    /// The archive's members by name (stored members only hold leaves).
    Archive(std::collections::HashMap<String, crate::zip::Entry>),
}

/// The walk over a memmap tree's levels.
struct Walk<'a, 'b> {
    input: &'b OpenInput<'a>,
    files: Files,
    objects: Vec<Object>,
    non_tensors: Vec<(String, Value)>,
    extra: Vec<Arc<Store>>,
}

impl Walk<'_, '_> {
    /// The bytes of the tree's small file `path` (a `meta.json`).
    fn text(&self, path: &str, what: &str) -> Result<Vec<u8>> {
        match &self.files {
            Files::Dir => read_whole(self.input, &*self.input.open_related(path, what)?),
            Files::Archive(members) => {
                let ctx = self.input.ctx();
                let entry = members.get(path).ok_or_else(|| {
                    Error::header(ctx.clone(), ARCHIVE, format!("no member {path:?} ({what})"))
                })?;
                self.input.limits.check_header(&ctx, entry.uncompressed)?;
                let bytes = crate::zip::member_bytes(
                    self.input.store,
                    &ctx,
                    entry,
                    self.input.limits,
                    ("header_bytes", self.input.limits.header_bytes),
                )?;
                Ok(bytes.into_owned())
            }
        }
    }

    /// Where leaf file `path`'s bytes are: `(store, offset, length)`.
    fn leaf_file(&mut self, path: &str) -> Result<(Arc<Store>, u64, u64)> {
        match &self.files {
            Files::Dir => {
                let store = self.input.open_related(path, "leaf file")?;
                self.extra.push(Arc::clone(&store));
                let len = store.len();
                Ok((store, 0, len))
            }
            Files::Archive(members) => {
                let ctx = self.input.ctx();
                let entry = members.get(path).ok_or_else(|| {
                    Error::header(
                        ctx.clone(),
                        ARCHIVE,
                        format!("no member {path:?} (leaf file)"),
                    )
                })?;
                if entry.method != 0 || entry.compressed != entry.uncompressed || entry.encrypted()
                {
                    return Err(Error::header(
                        ctx.at(entry.local_offset),
                        ARCHIVE,
                        format!(
                            "leaf member {path:?} is not stored uncompressed (method {})",
                            entry.method
                        ),
                    ));
                }
                Ok((
                    Arc::clone(self.input.store),
                    entry.data_start,
                    entry.uncompressed,
                ))
            }
        }
    }

    /// One level: `meta` is its `meta.json`, `dir` its directory relative
    /// to the root (`""` or ending in `/`), `prefix` its dotted name.
    fn level(
        &mut self,
        meta: &Map<String, Json>,
        dir: &str,
        prefix: &str,
        depth: usize,
    ) -> Result<()> {
        let ctx = self.input.ctx();
        if depth > MAX_DEPTH {
            return Err(Error::header(
                ctx,
                PATH,
                format!("nested deeper than {MAX_DEPTH} levels"),
            ));
        }
        for (key, entry) in meta {
            if LEVEL_KEYS.contains(&key.as_str()) {
                continue;
            }
            check_key(&ctx, key)?;
            let name = dotted(prefix, key);
            let Some(entry) = entry.as_object() else {
                return Err(Error::header(
                    ctx,
                    META,
                    format!("{name:?}: its entry is not an object"),
                ));
            };
            match entry.get("type").and_then(Json::as_str) {
                Some("TensorDict") => {
                    let sub = format!("{dir}{key}/");
                    let nested = parse_json(
                        &ctx,
                        &self.text(&format!("{sub}meta.json"), "nested meta.json")?,
                        &format!("{sub}meta.json"),
                    )?;
                    self.level(&nested, &sub, &name, depth + 1)?;
                }
                Some("NonTensorData") | Some("NonTensorStack") => {
                    let value = parse_json(
                        &ctx,
                        &self.text(&format!("{dir}{key}/meta.json"), "non-tensor meta.json")?,
                        "non-tensor meta.json",
                    )?;
                    let data = value
                        .get("data")
                        .map(Value::from_json)
                        .unwrap_or(Value::Null);
                    self.non_tensors.push((name, data));
                }
                Some(other) => {
                    return Err(Error::header(
                        ctx,
                        META,
                        format!("{name:?}: entry type {other:?} is not read"),
                    ))
                }
                None => self.leaf(entry, dir, key, name)?,
            }
        }
        Ok(())
    }

    fn leaf(
        &mut self,
        entry: &Map<String, Json>,
        dir: &str,
        key: &str,
        name: String,
    ) -> Result<()> {
        let ctx = self.input.ctx();
        if entry.get("is_nested").and_then(Json::as_bool) == Some(true) {
            return Err(Error::header(
                ctx,
                META,
                format!("{name:?}: nested (jagged) tensors are not read"),
            ));
        }
        let dtype_name = entry.get("dtype").and_then(Json::as_str).unwrap_or("");
        let dtype = torch_dtype(dtype_name).ok_or_else(|| {
            Error::header(ctx.clone(), META, format!("{name:?}: dtype {dtype_name:?}"))
        })?;
        let shape = shape_of(&ctx, entry.get("shape"), &name)?;
        self.input.limits.check_rank(&ctx, shape.len())?;
        let len = leaf_bytes(&ctx, dtype, &shape, &name)?;
        let payload = if len == 0 {
            // tensordict writes no file for a leaf without elements.
            Payload::Stored {
                store: Arc::clone(self.input.store),
                offset: 0,
                len: 0,
            }
        } else {
            let (store, offset, file_len) = self.leaf_file(&format!("{dir}{key}.memmap"))?;
            if file_len != len {
                return Err(Error::header(
                    Context::file(store.path()).at(offset),
                    LEAF,
                    format!("{name:?}: {file_len} bytes, its dtype and shape make {len}"),
                ));
            }
            Payload::Stored { store, offset, len }
        };
        self.objects
            .push(Object::dense(name, dtype, shape, payload));
        Ok(())
    }
}

impl Format for Archive {
    fn name(&self) -> &'static str {
        "tensordict-tdz"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["tdz"]
    }

    /// A zip named `.tdz` (tensordict's suffix for it).
    fn sniff(&self, probe: &Probe<'_>) -> bool {
        probe.extension == "tdz" && probe.head.starts_with(b"PK\x03\x04")
    }

    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(FUZZ_TARGET)
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let ctx = input.ctx();
        let entries = crate::zip::read_entries(input.store, &ctx, input.limits)?;
        let mut members = std::collections::HashMap::with_capacity(entries.len());
        for entry in entries {
            // Refused whole: a member that would leave the directory if
            // unpacked (`unzip archive.tdz` is how one is inspected).
            let name = entry.name.trim_end_matches('/');
            let escapes = entry.name.starts_with('/')
                || entry.name.contains('\\')
                || name
                    .split('/')
                    .any(|c| c.is_empty() || c == "." || c == "..");
            if escapes {
                return Err(Error::header(
                    ctx.at(entry.local_offset),
                    ARCHIVE,
                    format!("member {:?} is not a plain relative path", entry.name),
                ));
            }
            if entry.name.ends_with('/') {
                continue; // a directory entry
            }
            let at = entry.local_offset;
            if members.insert(entry.name.clone(), entry).is_some() {
                return Err(Error::header(
                    ctx.at(at),
                    ARCHIVE,
                    "a member name appears twice",
                ));
            }
        }
        open_tree(input, Files::Archive(members))
    }
}

/// Where a consolidated file's JSON is: `(offset, length)`, from the
/// trailer, or `None` when the trailer cannot name one.
fn trailer(len: u64, tail: &[u8]) -> Option<(u64, u64)> {
    let last: [u8; 8] = tail.get(tail.len().checked_sub(8)?..)?.try_into().ok()?;
    let json_len = u64::from_le_bytes(last);
    let start = len.checked_sub(8)?.checked_sub(json_len)?;
    Some((start, json_len))
}

impl Format for Consolidated {
    fn name(&self) -> &'static str {
        "tensordict-consolidated"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &[]
    }

    fn sniff(&self, probe: &Probe<'_>) -> bool {
        let Some((start, json_len)) = trailer(probe.len, probe.tail) else {
            return false;
        };
        // The JSON's first bytes, if the tail holds them.
        let tail_start = probe.len - probe.tail.len() as u64;
        let Some(at) = start.checked_sub(tail_start) else {
            return false;
        };
        let json = &probe.tail[at as usize..probe.tail.len() - 8];
        json_len >= 8 && json.starts_with(b"{\"cls\":")
    }

    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(FUZZ_TARGET)
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let ctx = input.ctx();
        let store = input.store;
        let tail = store.read(store.len().saturating_sub(8), store.len().min(8))?;
        let (start, json_len) = trailer(store.len(), &tail)
            .ok_or_else(|| Error::header(ctx.clone(), META, "no JSON length trailer"))?;
        input.limits.check_header(&ctx, json_len)?;
        let json = parse_json(&ctx, &store.read(start, json_len)?, "the consolidated JSON")?;
        let mut objects = Vec::new();
        let mut non_tensors = Vec::new();
        consolidated_level(input, &json, "", start, 0, &mut objects, &mut non_tensors)?;
        input.limits.check_tensors(&ctx, objects.len() as u64)?;
        let mut attributes = Vec::new();
        if let Some(size) = json.get("cls_metadata").and_then(|m| m.get("batch_size")) {
            attributes.push(("tensordict.batch_size".to_string(), Value::from_json(size)));
        }
        if !non_tensors.is_empty() {
            attributes.push(("tensordict.non_tensors".into(), Value::Map(non_tensors)));
        }
        Ok(Catalog {
            objects,
            attributes,
            ..Catalog::default()
        })
    }
}

/// Keys of a consolidated level that describe it, not an entry.
const CONSOLIDATED_KEYS: &[&str] = &["cls", "non_tensors", "leaves", "cls_metadata"];

fn consolidated_level(
    input: &OpenInput<'_>,
    level: &Map<String, Json>,
    prefix: &str,
    data_end: u64,
    depth: usize,
    objects: &mut Vec<Object>,
    non_tensors: &mut Vec<(String, Value)>,
) -> Result<()> {
    let ctx = input.ctx();
    if depth > MAX_DEPTH {
        return Err(Error::header(
            ctx,
            PATH,
            format!("nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    if let Some(values) = level.get("non_tensors").and_then(Json::as_object) {
        for (key, value) in values {
            non_tensors.push((dotted(prefix, key), Value::from_json(value)));
        }
    }
    let leaves = level.get("leaves").and_then(Json::as_object);
    for (key, leaf) in leaves.into_iter().flatten() {
        let name = dotted(prefix, key);
        let fields = leaf.as_array().filter(|f| f.len() == 5).ok_or_else(|| {
            Error::header(
                ctx.clone(),
                META,
                format!("{name:?}: a leaf is [dtype, shape, start, end, pad]"),
            )
        })?;
        let dtype_name = fields[0].as_str().unwrap_or("");
        let dtype = torch_dtype(dtype_name).ok_or_else(|| {
            Error::header(ctx.clone(), META, format!("{name:?}: dtype {dtype_name:?}"))
        })?;
        let shape = shape_of(&ctx, Some(&fields[1]), &name)?;
        input.limits.check_rank(&ctx, shape.len())?;
        let len = leaf_bytes(&ctx, dtype, &shape, &name)?;
        let (start, end, pad) = (fields[2].as_u64(), fields[3].as_u64(), fields[4].as_u64());
        let span = start
            .zip(end)
            .zip(pad)
            .and_then(|((s, e), p)| Some((s, e.checked_sub(p)?)))
            .filter(|&(s, stop)| s <= stop && stop <= data_end && stop - s == len);
        let Some((start, _)) = span else {
            return Err(Error::header(
                ctx,
                LEAF,
                format!(
                    "{name:?}: bytes {:?}..{:?} (pad {:?}) are not its {len} bytes before the JSON at {data_end}",
                    fields[2], fields[3], fields[4]
                ),
            ));
        };
        let payload = Payload::Stored {
            store: Arc::clone(input.store),
            offset: start,
            len,
        };
        objects.push(Object::dense(name, dtype, shape, payload));
    }
    for (key, nested) in level {
        if CONSOLIDATED_KEYS.contains(&key.as_str()) {
            continue;
        }
        let Some(nested) = nested.as_object() else {
            continue;
        };
        consolidated_level(
            input,
            nested,
            &dotted(prefix, key),
            data_end,
            depth + 1,
            objects,
            non_tensors,
        )?;
    }
    Ok(())
}

// The rule list is what `Plugin::rules` names; keep `Rule` used.
const _: &[Rule] = RULES;
