//! zarr stores, v3 and v2 (as zarr-python 3.1 writes them), read.
//!
//! A store is a directory (or an object-storage prefix) of keys. v3: every
//! node has a `zarr.json` (`node_type` group or array); an array's chunks
//! are keys `c/1/2` under it (or `1.2` with the `v2` key encoding). v2: a
//! group has `.zgroup`, an array `.zarray` (`.zattrs` beside either), its
//! chunks `1.2` (or `1/2`). Consolidated metadata (v3: inline in the root
//! `zarr.json`; v2: `.zmetadata`) lists every node at once and is used when
//! present; otherwise a local store's directories are listed. Arrays are
//! listed in zarr-python's order (`order.rs`).
//!
//! A store opens through its root metadata file, the plugin's checkpoint
//! names, so a directory or `s3://` prefix opens as one. Every array of
//! the hierarchy is one dense tensor named by its path without a leading
//! `/` (an array at the root is named `""`), its dtype and shape as
//! zarr-python reports them, its bytes read from its chunks at read time
//! (`array::ZarrArray`): codecs `bytes` (either endian), `transpose`,
//! `sharding_indexed` (its index, then only the inner chunks a read
//! needs), `zstd`, `gzip`, `blosc` (c-blosc: blosclz, lz4, lz4hc, zstd),
//! `crc32c` (v2: `zlib`, `gzip`, `zstd`, `blosc` compressors, `order` C or
//! F); a chunk never written is the fill value.
//! An array held in one uncompressed little-endian chunk of a local store
//! is a view of that file. Refusals cite `zarr.*` rules.

use std::sync::Arc;

use serde_json::{Map, Value as Json};
use zt_core::catalog::{Attributes, Catalog, Object, Payload, Value};
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput, Probe};

mod array;
mod blosc;
mod crc32c;
mod keys;
mod meta;
mod order;
pub mod rules;

use array::ZarrArray;
use keys::{check_key, Keys};
use meta::{ArrayMeta, Serializer};
use order::Order;
use rules::{META, RULES};

/// The zarr reader (every root metadata file, v3 and v2).
pub struct Zarr;

/// The zarr plugin.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "zarr",
    // Told from JSON text naming `zarr_format`, which no other format's
    // first bytes hold: beside TensorDict's text readers.
    readers: &[zt_core::Reader {
        format: &Zarr,
        detect_rank: 27,
    }],
    writers: &[],
    rules: &[("zarr", RULES)],
    // A v3 store's root, then v2's consolidated metadata before the bare
    // group (zarr-python uses it when present), then a v2 root array.
    checkpoints: &[
        zt_core::Checkpoint {
            name: "zarr.json",
            preference: 39,
        },
        zt_core::Checkpoint {
            name: ".zmetadata",
            preference: 40,
        },
        zt_core::Checkpoint {
            name: ".zgroup",
            preference: 41,
        },
        zt_core::Checkpoint {
            name: ".zarray",
            preference: 42,
        },
    ],
};

/// Fuzz target `zarr`: root metadata files, seeded by [`seeds`].
const FUZZ_TARGET: zt_core::FuzzTarget = zt_core::FuzzTarget {
    make_seeds: Some(seeds),
    ..zt_core::FuzzTarget::new("zarr", &[])
};

/// The fuzz seeds: a v3 group with consolidated metadata (an array with
/// `bytes` + `zstd`, a sharded one with a crc32c index, a transposed one),
/// a v3 array, v2 consolidated metadata and a v2 array, as zarr-python
/// 3.1.6 writes their metadata. Their chunks are absent (the fill value),
/// since the target's input is the one file. Not `.json`: the seed
/// replay skips those.
pub fn seeds() -> Vec<zt_core::Seed> {
    let plain = r#"{"shape": [5, 7], "data_type": "float32", "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}}, "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": 1.5, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 0, "checksum": false}}], "attributes": {"units": "m"}, "zarr_format": 3, "node_type": "array", "storage_transformers": []}"#;
    let sharded = r#"{"shape": [10], "data_type": "int16", "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8]}}, "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}}, "fill_value": 0, "codecs": [{"name": "sharding_indexed", "configuration": {"chunk_shape": [4], "codecs": [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "gzip", "configuration": {"level": 1}}], "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}], "index_location": "end"}}], "attributes": {}, "zarr_format": 3, "node_type": "array", "storage_transformers": []}"#;
    let transposed = r#"{"shape": [3, 4], "data_type": "complex64", "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 2]}}, "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}}, "fill_value": [1.0, "NaN"], "codecs": [{"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}], "attributes": {}, "zarr_format": 3, "node_type": "array", "storage_transformers": []}"#;
    let group = format!(
        r#"{{"attributes": {{}}, "zarr_format": 3, "consolidated_metadata": {{"kind": "inline", "must_understand": false, "metadata": {{"g": {{"attributes": {{}}, "zarr_format": 3, "node_type": "group"}}, "g/a": {plain}, "s": {sharded}, "t": {transposed}}}}}, "node_type": "group"}}"#
    );
    let v2 = r#"{"shape": [5, 7], "chunks": [2, 3], "dtype": ">f8", "fill_value": "NaN", "order": "F", "filters": null, "dimension_separator": "/", "compressor": {"id": "zlib", "level": 1}, "zarr_format": 2}"#;
    let v2_consolidated = format!(
        r#"{{"metadata": {{".zgroup": {{"zarr_format": 2}}, ".zattrs": {{}}, "x/.zattrs": {{"a": 1}}, "x/.zarray": {v2}}}, "zarr_consolidated_format": 1}}"#
    );
    vec![
        ("group-v3.zarrmeta".to_string(), group.into_bytes()),
        ("array-v3.zarrmeta".to_string(), plain.as_bytes().to_vec()),
        (
            "zmetadata-v2.zarrmeta".to_string(),
            v2_consolidated.into_bytes(),
        ),
        ("zarray-v2.zarrmeta".to_string(), v2.as_bytes().to_vec()),
    ]
}

impl Format for Zarr {
    fn name(&self) -> &'static str {
        "zarr"
    }

    /// None: its files are `zarr.json`, `.zgroup`, ..., told by content.
    fn extensions(&self) -> &'static [&'static str] {
        &[]
    }

    /// A JSON object naming `zarr_format` (or v2's consolidated format).
    fn sniff(&self, probe: &Probe<'_>) -> bool {
        probe.json_object_with(&[b"\"zarr_format\"", b"\"zarr_consolidated_format\""])
    }

    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(FUZZ_TARGET)
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let ctx = input.ctx();
        input.limits.check_header(&ctx, input.store.len())?;
        let text = input.store.read(0, input.store.len())?;
        let root = parse_object(&ctx, &text)?;
        let keys = Arc::new(Keys::beside(input.store.path(), input.open_options())?);
        let mut walk = Walk {
            input,
            keys,
            objects: Vec::new(),
            extra: Vec::new(),
            order: Order::consolidated(&order::consolidated_keys(&text)),
        };
        let attributes = walk.root(&ctx, &root)?;
        let mut names: Vec<(usize, &str)> = walk
            .objects
            .iter()
            .enumerate()
            .map(|(i, o)| (i, o.name.as_str()))
            .collect();
        walk.order.sort(&mut names);
        let order = names.into_iter().map(|(i, _)| i).collect();
        Ok(Catalog {
            objects: walk.objects,
            order: Some(order),
            attributes,
            names_unique: true,
            extra_stores: walk.extra,
            ..Catalog::default()
        })
    }
}

/// The `blosc` codec alone: the bytes a Blosc frame holds, refused past
/// `cap` bytes (the chunk's expected size). The fuzz target `zarr_blosc`
/// runs it; stores reach it through their arrays' codecs.
pub fn decode_blosc(frame: &[u8], cap: u64) -> Result<Vec<u8>> {
    blosc::decode(frame, cap, &Context::default())
}

fn parse_object(ctx: &Context, bytes: &[u8]) -> Result<Map<String, Json>> {
    match serde_json::from_slice::<Json>(bytes) {
        Ok(Json::Object(map)) => Ok(map),
        Ok(_) => Err(Error::header(
            ctx.clone(),
            META,
            "metadata is not a JSON object",
        )),
        Err(e) => Err(Error::header(ctx.clone(), META, format!("metadata: {e}"))),
    }
}

fn attributes_of(v: Option<&Json>) -> Attributes {
    v.and_then(Json::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), Value::from_json(v)))
                .collect()
        })
        .unwrap_or_default()
}

/// The hierarchy's arrays, found from the root's metadata.
struct Walk<'a, 'i> {
    input: &'a OpenInput<'i>,
    keys: Arc<Keys>,
    objects: Vec<Object>,
    /// The chunk files arrays are views of.
    extra: Vec<Arc<zt_core::store::Store>>,
    /// How the arrays are listed: by the root's consolidated metadata,
    /// or (a bare v2 `.zgroup`'s `.zmetadata`, or none) set as found.
    order: Order,
}

impl Walk<'_, '_> {
    /// Every array under the root metadata `root`; the store's attributes.
    fn root(&mut self, ctx: &Context, root: &Map<String, Json>) -> Result<Attributes> {
        let mut attributes: Attributes = Vec::new();
        if let Some(Json::Object(nodes)) = root.get("metadata") {
            // v2 consolidated metadata: `.zmetadata`.
            attributes.push(("zarr.zarr_format".into(), Value::Int(2)));
            attributes.extend(attributes_of(nodes.get(".zattrs")));
            self.v2_consolidated(ctx, nodes)?;
            return Ok(attributes);
        }
        let format = root.get("zarr_format").and_then(Json::as_u64);
        attributes.push((
            "zarr.zarr_format".into(),
            Value::from_json(root.get("zarr_format").unwrap_or(&Json::Null)),
        ));
        match format {
            Some(3) => match root.get("node_type").and_then(Json::as_str) {
                Some("array") => self.v3_array(ctx, "", root)?,
                Some("group") => {
                    attributes.extend(attributes_of(root.get("attributes")));
                    let inline = root
                        .get("consolidated_metadata")
                        .and_then(|c| c.get("metadata"))
                        .and_then(Json::as_object);
                    match inline {
                        Some(nodes) => self.v3_consolidated(ctx, nodes)?,
                        None => {
                            self.order = Order::Listed;
                            self.v3_group(ctx, "", 0)?
                        }
                    }
                }
                other => {
                    return Err(Error::header(
                        ctx.clone(),
                        META,
                        format!("node_type {other:?}"),
                    ))
                }
            },
            Some(2) if root.contains_key("shape") => self.v2_array(ctx, "", root, None)?,
            Some(2) => {
                // A bare `.zgroup`: its consolidated metadata when present.
                let max = self.input.limits.header_bytes;
                match self.keys.read(ctx, ".zmetadata", max)? {
                    Some(text) => {
                        let zmeta = parse_object(ctx, &text)?;
                        let nodes =
                            zmeta
                                .get("metadata")
                                .and_then(Json::as_object)
                                .ok_or_else(|| {
                                    Error::header(
                                        ctx.clone(),
                                        META,
                                        ".zmetadata without a metadata object",
                                    )
                                })?;
                        attributes.extend(attributes_of(nodes.get(".zattrs")));
                        self.order = Order::consolidated(&order::consolidated_keys(&text));
                        self.v2_consolidated(ctx, nodes)?;
                    }
                    None => {
                        if let Some(text) = self.keys.read(ctx, ".zattrs", max)? {
                            attributes.extend(attributes_of(Some(&Json::Object(parse_object(
                                ctx, &text,
                            )?))));
                        }
                        self.order = Order::Listed;
                        self.v2_group(ctx, "", 0)?;
                    }
                }
            }
            _ => {
                return Err(Error::header(
                    ctx.clone(),
                    META,
                    format!("zarr_format {:?}", root.get("zarr_format")),
                ))
            }
        }
        Ok(attributes)
    }

    fn check_count(&self, ctx: &Context) -> Result<()> {
        self.input
            .limits
            .check_tensors(ctx, self.objects.len() as u64 + 1)
    }

    fn v3_consolidated(&mut self, ctx: &Context, nodes: &Map<String, Json>) -> Result<()> {
        for (path, node) in nodes {
            check_key(ctx, path)?;
            let node = node.as_object().ok_or_else(|| {
                Error::header(ctx.clone(), META, format!("node {path:?} is not an object"))
            })?;
            if node.get("node_type").and_then(Json::as_str) == Some("array") {
                self.v3_array(ctx, path, node)?;
            }
        }
        Ok(())
    }

    fn v2_consolidated(&mut self, ctx: &Context, nodes: &Map<String, Json>) -> Result<()> {
        for (key, node) in nodes {
            let Some(path) = key.strip_suffix(".zarray") else {
                continue;
            };
            let path = path.strip_suffix('/').unwrap_or(path);
            if !path.is_empty() {
                check_key(ctx, path)?;
            }
            let node = node.as_object().ok_or_else(|| {
                Error::header(ctx.clone(), META, format!("{key:?} is not an object"))
            })?;
            let attrs = nodes.get(&format!("{}.zattrs", prefix_of(path)));
            self.v2_array(ctx, path, node, Some(attributes_of(attrs)))?;
        }
        Ok(())
    }

    /// A v3 group's members by listing its directory.
    fn v3_group(&mut self, ctx: &Context, path: &str, depth: usize) -> Result<()> {
        self.check_depth(ctx, depth)?;
        for child in self.keys.children(ctx, path)? {
            let child = join(path, &child);
            check_key(ctx, &child)?;
            let Some(text) = self.keys.read(
                ctx,
                &format!("{child}/zarr.json"),
                self.input.limits.header_bytes,
            )?
            else {
                continue; // not a node
            };
            let node_ctx = Context::file(format!("{child}/zarr.json"));
            let node = parse_object(&node_ctx, &text)?;
            match node.get("node_type").and_then(Json::as_str) {
                Some("array") => self.v3_array(&node_ctx, &child, &node)?,
                Some("group") => self.v3_group(ctx, &child, depth + 1)?,
                other => {
                    return Err(Error::header(
                        node_ctx,
                        META,
                        format!("node_type {other:?}"),
                    ))
                }
            }
        }
        Ok(())
    }

    /// A v2 group's members by listing its directory.
    fn v2_group(&mut self, ctx: &Context, path: &str, depth: usize) -> Result<()> {
        self.check_depth(ctx, depth)?;
        let max = self.input.limits.header_bytes;
        for child in self.keys.children(ctx, path)? {
            let child = join(path, &child);
            check_key(ctx, &child)?;
            if let Some(text) = self.keys.read(ctx, &format!("{child}/.zarray"), max)? {
                let node_ctx = Context::file(format!("{child}/.zarray"));
                let node = parse_object(&node_ctx, &text)?;
                self.v2_array(&node_ctx, &child, &node, None)?;
            } else if self
                .keys
                .read(ctx, &format!("{child}/.zgroup"), max)?
                .is_some()
            {
                self.v2_group(ctx, &child, depth + 1)?;
            }
        }
        Ok(())
    }

    fn check_depth(&self, ctx: &Context, depth: usize) -> Result<()> {
        if depth > self.input.limits.depth {
            return Err(Error::header(
                ctx.clone(),
                rules::KEY,
                format!(
                    "groups nested past the depth limit of {}",
                    self.input.limits.depth
                ),
            ));
        }
        Ok(())
    }

    fn v3_array(&mut self, ctx: &Context, path: &str, node: &Map<String, Json>) -> Result<()> {
        self.check_count(ctx)?;
        let meta = meta::v3_array(&ctx.clone().tensor(path), node, self.input.limits.rank)
            .map_err(|e| e.in_tensor(path))?;
        let mut attributes = attributes_of(node.get("attributes"));
        if let Some(names) = node.get("dimension_names") {
            attributes.push(("zarr.dimension_names".into(), Value::from_json(names)));
        }
        self.push(ctx, path, meta, attributes)
    }

    fn v2_array(
        &mut self,
        ctx: &Context,
        path: &str,
        node: &Map<String, Json>,
        attrs: Option<Attributes>,
    ) -> Result<()> {
        self.check_count(ctx)?;
        let meta = meta::v2_array(&ctx.clone().tensor(path), node, self.input.limits.rank)
            .map_err(|e| e.in_tensor(path))?;
        let attributes = match attrs {
            Some(a) => a,
            None => match self.keys.read(
                ctx,
                &format!("{}.zattrs", prefix_of(path)),
                self.input.limits.header_bytes,
            )? {
                Some(text) => attributes_of(Some(&Json::Object(parse_object(ctx, &text)?))),
                None => Vec::new(),
            },
        };
        self.push(ctx, path, meta, attributes)
    }

    fn push(
        &mut self,
        ctx: &Context,
        path: &str,
        meta: ArrayMeta,
        attributes: Attributes,
    ) -> Result<()> {
        let array = ZarrArray {
            keys: Arc::clone(&self.keys),
            prefix: prefix_of(path),
            meta,
            ctx: ctx.clone().tensor(path),
        };
        let len = array.decoded_len().ok_or_else(|| {
            Error::header(
                ctx.clone().tensor(path),
                META,
                format!(
                    "shape {:?} of {} overflows",
                    array.meta.shape, array.meta.dtype
                ),
            )
        })?;
        let dtype = array.meta.dtype;
        let shape = array.meta.shape.clone();
        let payload = match self.in_place(&array, len)? {
            Some(payload) => payload,
            None => Payload::Decoded {
                decoder: Arc::new(array),
                decoded_len: len,
            },
        };
        let mut object = Object::dense(path, dtype, shape, payload);
        object.attributes = attributes;
        self.objects.push(object);
        Ok(())
    }

    /// The one chunk of a local array stored as its raw little-endian
    /// elements, as a view of its file (`None` for any other array, or
    /// when the chunk is absent or of another size: the decoder reads the
    /// fill value or reports it).
    fn in_place(&mut self, array: &ZarrArray, len: u64) -> Result<Option<Payload>> {
        let meta = &array.meta;
        let raw = matches!(meta.codecs.serializer, Serializer::Bytes { big } if !big || meta.dtype.size() == Some(1));
        if !self.keys.is_local()
            || !raw
            || meta.codecs.order.is_some()
            || !meta.codecs.compressors.is_empty()
            || meta.chunks != meta.shape
            || len == 0
        {
            return Ok(None);
        }
        let key = format!(
            "{}{}",
            array.prefix,
            meta.keys.key(&vec![0; meta.shape.len()])
        );
        if self.keys.get(&array.ctx, &key)?.is_none() {
            return Ok(None);
        }
        let store = self.input.open_related(&key, "chunk")?;
        if store.len() != len {
            return Ok(None);
        }
        self.extra.push(Arc::clone(&store));
        Ok(Some(Payload::Stored {
            store,
            offset: 0,
            len,
        }))
    }
}

/// The key prefix of the node at `path` (`a/b/`; `""` for the root).
fn prefix_of(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}/")
    }
}

fn join(path: &str, child: &str) -> String {
    if path.is_empty() {
        child.to_string()
    } else {
        format!("{path}/{child}")
    }
}
