//! `Source`: one or more opened files read as one set of named tensors, and
//! the read API (`Tensor`, `PartRef`) callers use without ever matching on
//! the format.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::catalog::{Attributes, Catalog, Digest, Object, Part, Payload, Value};
use crate::dtype::{c_strides, num_elements, DType};
use crate::error::{Context, Error, Result};
use crate::format::{detect_store, OpenInput};
use crate::limits::Limits;
use crate::store::Store;

/// How to open files.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Bounds every plugin obeys.
    pub limits: Limits,
    /// Memory-map files (the default); `false` uses positional reads.
    pub map: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            limits: Limits::default(),
            map: true,
        }
    }
}

impl OpenOptions {
    /// Open one file, or a Hugging Face shard index (`*.index.json`).
    pub fn open(&self, path: impl AsRef<Path>) -> Result<Source> {
        let path = path.as_ref();
        if is_shard_index(path) {
            return self.open_index(path);
        }
        let store = Arc::new(self.open_store(path)?);
        let format = detect_store(&store)?;
        let input = OpenInput {
            store: &store,
            limits: &self.limits,
        };
        let catalog = format.open(&input).map_err(|e| e.in_file(path))?;
        Source::from_catalog(format.name(), store, catalog, self.limits.clone())
    }

    /// Open several files as one source; a name found in two files is an error.
    pub fn open_all<P: AsRef<Path>>(&self, paths: &[P]) -> Result<Source> {
        let sources = paths
            .iter()
            .map(|p| self.open(p.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        Source::merge(sources)
    }

    fn open_store(&self, path: &Path) -> Result<Store> {
        if self.map {
            Store::open(path)
        } else {
            Store::open_positional(path)
        }
    }

    /// Open every shard a `model.safetensors.index.json` names and check
    /// that each tensor is in the shard the index says.
    fn open_index(&self, index_path: &Path) -> Result<Source> {
        let ctx = Context::file(index_path);
        let text = std::fs::read(index_path).map_err(|e| Error::io(index_path, e))?;
        self.limits.check_header(&ctx, text.len() as u64)?;
        let json: serde_json::Value = serde_json::from_slice(&text).map_err(|e| Error::Index {
            ctx: ctx.clone(),
            reason: format!("not JSON: {e}"),
        })?;
        let weight_map = json
            .get("weight_map")
            .and_then(|w| w.as_object())
            .ok_or_else(|| Error::Index {
                ctx: ctx.clone(),
                reason: "no \"weight_map\" object".into(),
            })?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        let mut shard_files: Vec<&str> = Vec::new();
        for (name, file) in weight_map {
            let file = file.as_str().ok_or_else(|| Error::Index {
                ctx: ctx.clone().tensor(name),
                reason: "shard file name is not a string".into(),
            })?;
            if !shard_files.contains(&file) {
                shard_files.push(file);
            }
        }
        let mut sources = Vec::with_capacity(shard_files.len());
        for file in &shard_files {
            let rel = Path::new(file);
            let escapes =
                rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_)));
            if escapes {
                return Err(Error::Index {
                    ctx: ctx.clone(),
                    reason: format!("shard path {file:?} leaves the index's directory"),
                });
            }
            let source = self.open(dir.join(rel))?;
            for t in source.tensors() {
                match weight_map.get(t.name()).and_then(|v| v.as_str()) {
                    Some(f) if f == *file => {}
                    Some(f) => {
                        return Err(Error::Index {
                            ctx: ctx.clone().tensor(t.name()),
                            reason: format!("index says {f:?}, found in {file:?}"),
                        })
                    }
                    None => {
                        return Err(Error::Index {
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

/// Zero-copy and I/O capabilities of one part, each computed by the same
/// predicate the matching operation uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// `map()` succeeds: raw bytes in a mapped file, aligned for the dtype.
    pub map: bool,
    /// `locate()` succeeds: raw bytes at a known file range.
    pub locate: bool,
    /// `evict()` can drop at least one page that no other tensor shares.
    pub evict: bool,
    /// The format stores a digest that `verify` can check.
    pub verify: bool,
    /// Largest power of two dividing the file offset (capped at 1 MiB);
    /// 1 when the bytes are not a file range.
    pub alignment: u64,
}

/// Where a part's raw bytes are, for callers that do their own I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub path: PathBuf,
    /// Absolute byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub nbytes: u64,
}

/// Opened tensor files, read as one set of named tensors.
///
/// `Source` is `Send + Sync`; share it behind an `Arc` across threads.
#[derive(Debug)]
pub struct Source {
    format: &'static str,
    files: Vec<PathBuf>,
    objects: Vec<Object>,
    index: HashMap<String, usize>,
    attributes: Attributes,
    limits: Limits,
    /// Sorted raw ranges per store (keyed by the store's address), so
    /// `evict` can tell whether a page is shared with a neighbour.
    occupancy: HashMap<usize, Vec<(u64, u64)>>,
    /// Stored digests by (object index, part index).
    digests: HashMap<(usize, usize), Digest>,
}

fn store_key(store: &Arc<Store>) -> usize {
    Arc::as_ptr(store) as usize
}

impl Source {
    /// Open one file (or shard index) with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Source> {
        OpenOptions::default().open(path)
    }

    /// Open several files as one source.
    pub fn open_all<P: AsRef<Path>>(paths: &[P]) -> Result<Source> {
        OpenOptions::default().open_all(paths)
    }

    /// Options for opening (limits, mapping).
    pub fn options() -> OpenOptions {
        OpenOptions::default()
    }

    /// Build a source from a plugin's catalog, validating every part against
    /// the limits and against its payload (so no plugin can hand out a view
    /// that reaches outside its bytes).
    pub fn from_catalog(
        format: &'static str,
        store: Arc<Store>,
        catalog: Catalog,
        limits: Limits,
    ) -> Result<Source> {
        let ctx = store.ctx();
        limits.check_tensors(&ctx, catalog.objects.len() as u64)?;
        let mut index = HashMap::with_capacity(catalog.objects.len());
        let mut occupancy: HashMap<usize, Vec<(u64, u64)>> = HashMap::new();
        let mut decoded_total: u64 = 0;
        for (i, object) in catalog.objects.iter().enumerate() {
            // Context is built only on failure: open latency on files with
            // many tensors is dominated by per-tensor allocations.
            let name_it = |e: Error| e.in_file(store.path()).in_tensor(&object.name);
            if index.insert(object.name.clone(), i).is_some() {
                return Err(name_it(Error::DuplicateName {
                    ctx: Context::default(),
                }));
            }
            limits
                .check_rank(&Context::default(), object.shape.len())
                .map_err(name_it)?;
            for part in &object.parts {
                validate_part(part, &limits).map_err(name_it)?;
                match &part.payload {
                    Payload::Stored { store, offset, len } => {
                        store
                            .check_range(*offset, *len, "tensor data")
                            .map_err(name_it)?;
                        occupancy
                            .entry(store_key(store))
                            .or_default()
                            .push((*offset, offset + len));
                    }
                    Payload::Decoded { decoded_len, .. } => {
                        decoded_total = decoded_total.saturating_add(*decoded_len);
                    }
                }
            }
        }
        Limits::check(
            &ctx,
            "total_decoded_bytes",
            decoded_total,
            limits.total_decoded_bytes,
        )?;
        for ranges in occupancy.values_mut() {
            ranges.sort_unstable();
        }
        let mut files = vec![store.path().to_path_buf()];
        files.extend(catalog.extra_stores.iter().map(|s| s.path().to_path_buf()));
        let digests = catalog
            .digests
            .iter()
            .filter(|(o, p, _)| {
                catalog
                    .objects
                    .get(*o)
                    .is_some_and(|obj| *p < obj.parts.len())
            })
            .map(|&(o, p, d)| ((o, p), d))
            .collect();
        Ok(Source {
            format,
            files,
            objects: catalog.objects,
            index,
            attributes: catalog.attributes,
            limits,
            occupancy,
            digests,
        })
    }

    /// Read several sources as one; a name in two of them is an error.
    pub fn merge(sources: Vec<Source>) -> Result<Source> {
        let mut iter = sources.into_iter();
        let Some(mut merged) = iter.next() else {
            return Err(Error::Unsupported {
                ctx: Context::default(),
                reason: "no files to open".into(),
            });
        };
        for source in iter {
            if source.format != merged.format {
                merged.format = "mixed";
            }
            let base = merged.objects.len();
            merged.digests.extend(
                source
                    .digests
                    .into_iter()
                    .map(|((o, p), d)| ((o + base, p), d)),
            );
            for object in source.objects {
                if merged.index.contains_key(&object.name) {
                    return Err(Error::DuplicateName {
                        ctx: Context::file(&source.files[0]).tensor(&object.name),
                    });
                }
                merged
                    .index
                    .insert(object.name.clone(), merged.objects.len());
                merged.objects.push(object);
            }
            for (key, ranges) in source.occupancy {
                let entry = merged.occupancy.entry(key).or_default();
                entry.extend(ranges);
                entry.sort_unstable();
            }
            merged.files.extend(source.files);
            merged.attributes.extend(source.attributes);
        }
        Ok(merged)
    }

    /// The detected format (`"safetensors"`, `"npz"`, ... or `"mixed"`).
    pub fn format(&self) -> &'static str {
        self.format
    }

    /// The files this source reads.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// File-level attributes.
    pub fn attributes(&self) -> &Attributes {
        &self.attributes
    }

    /// The limits the source was opened with.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// True if the source holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Tensor names in file order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.objects.iter().map(|o| o.name.as_str())
    }

    /// Every tensor, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = Tensor<'_>> {
        self.objects.iter().map(move |object| Tensor {
            source: self,
            object,
        })
    }

    /// The tensor at `index` in file order.
    pub fn tensor_at(&self, index: usize) -> Option<Tensor<'_>> {
        self.objects.get(index).map(|object| Tensor {
            source: self,
            object,
        })
    }

    /// Position of a tensor in file order.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// A tensor by name.
    pub fn get(&self, name: &str) -> Option<Tensor<'_>> {
        self.position(name).and_then(|i| self.tensor_at(i))
    }

    /// A tensor by name, or [`Error::NoSuchTensor`].
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>> {
        self.get(name).ok_or_else(|| Error::NoSuchTensor {
            ctx: self.files.first().map(Context::file).unwrap_or_default(),
            name: name.to_string(),
        })
    }

    /// Total payload bytes of every part.
    pub fn total_bytes(&self) -> u64 {
        self.objects
            .iter()
            .flat_map(|o| &o.parts)
            .map(|p| p.payload.len())
            .sum()
    }

    /// The page-aligned range of `[offset, offset+len)` that no other part
    /// touches, or `None` if every page is shared.
    fn exclusive_pages(&self, store: &Arc<Store>, offset: u64, len: u64) -> Option<(u64, u64)> {
        let page = crate::store::page_size();
        let (mut start, mut end) = Store::page_envelope(offset, len);
        end = end.min(store.len().div_ceil(page) * page);
        let ranges = self.occupancy.get(&store_key(store))?;
        let me = (offset, offset + len);
        // A neighbour is any other range that intersects our envelope.
        for &(s, e) in ranges {
            if (s, e) == me || e <= start || s >= end {
                continue;
            }
            if s < offset {
                start = start.max(e.div_ceil(page) * page);
            } else {
                end = end.min(s / page * page);
            }
        }
        (start < end).then_some((start, end))
    }
}

/// Check a part against its payload: rank, element count, byte size, and
/// (for strided parts) that every element lies inside the payload.
fn validate_part(part: &Part, limits: &Limits) -> Result<()> {
    let ctx = &Context::default();
    limits.check_rank(ctx, part.shape.len())?;
    let elements = num_elements(&part.shape).ok_or(Error::Overflow {
        ctx: ctx.clone(),
        what: "element count",
    })?;
    let len = part.payload.len();
    if let Payload::Decoded { decoded_len, .. } = part.payload {
        limits.check_decoded(ctx, decoded_len)?;
    }
    match &part.strides {
        None => {
            let need = part.dtype.nbytes(elements).ok_or(Error::Overflow {
                ctx: ctx.clone(),
                what: "byte size",
            })?;
            if need != len {
                return Err(Error::range(
                    ctx.clone(),
                    format!(
                        "part {:?}: {} x {} needs {need} bytes, payload has {len}",
                        part.name, part.dtype, elements
                    ),
                ));
            }
        }
        Some(strides) => {
            let size = part.dtype.size().ok_or_else(|| Error::Unsupported {
                ctx: ctx.clone(),
                reason: format!("strided views of sub-byte dtype {}", part.dtype),
            })?;
            if strides.len() != part.shape.len() || strides.iter().any(|&s| s < 0) {
                return Err(Error::range(ctx.clone(), "strides do not match the shape"));
            }
            if elements > 0 {
                let mut last: u64 = 0;
                for (&d, &s) in part.shape.iter().zip(strides) {
                    let step = (d - 1).checked_mul(s as u64).ok_or(Error::Overflow {
                        ctx: ctx.clone(),
                        what: "stride extent",
                    })?;
                    last = last.checked_add(step).ok_or(Error::Overflow {
                        ctx: ctx.clone(),
                        what: "stride extent",
                    })?;
                }
                let need = last
                    .checked_add(1)
                    .and_then(|n| n.checked_mul(size))
                    .ok_or(Error::Overflow {
                        ctx: ctx.clone(),
                        what: "stride extent",
                    })?;
                if need > len {
                    return Err(Error::range(
                        ctx.clone(),
                        format!("strides reach byte {need}, payload has {len}"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A tensor of a [`Source`].
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    source: &'a Source,
    object: &'a Object,
}

impl<'a> Tensor<'a> {
    /// Name.
    pub fn name(&self) -> &'a str {
        &self.object.name
    }

    /// Logical shape.
    pub fn shape(&self) -> &'a [u64] {
        &self.object.shape
    }

    /// Layout (`"dense"` or a profile id).
    pub fn layout(&self) -> &'a str {
        &self.object.layout
    }

    /// Per-tensor attributes.
    pub fn attributes(&self) -> &'a Attributes {
        &self.object.attributes
    }

    /// The underlying catalog object.
    pub fn object(&self) -> &'a Object {
        self.object
    }

    /// Every part.
    pub fn parts(&self) -> impl Iterator<Item = PartRef<'a>> + 'a {
        let (source, object) = (self.source, self.object);
        object.parts.iter().map(move |part| PartRef {
            source,
            object,
            part,
        })
    }

    /// A part by name.
    pub fn part(&self, name: &str) -> Option<PartRef<'a>> {
        self.parts().find(|p| p.name() == name)
    }

    /// The single part of a one-part tensor (every dense tensor); an error
    /// naming the parts otherwise.
    pub fn data(&self) -> Result<PartRef<'a>> {
        match self.object.parts.as_slice() {
            [part] => Ok(PartRef {
                source: self.source,
                object: self.object,
                part,
            }),
            parts => Err(Error::Unsupported {
                ctx: self.ctx(),
                reason: format!(
                    "layout {} has parts {:?}; pick one",
                    self.object.layout,
                    parts.iter().map(|p| p.name.as_ref()).collect::<Vec<_>>()
                ),
            }),
        }
    }

    /// Total payload bytes over all parts.
    pub fn nbytes(&self) -> u64 {
        self.object.parts.iter().map(|p| p.payload.len()).sum()
    }

    fn ctx(&self) -> Context {
        self.source
            .files
            .first()
            .map(Context::file)
            .unwrap_or_default()
            .tensor(&self.object.name)
    }
}

/// One part of a tensor, with the byte accessors.
#[derive(Debug, Clone, Copy)]
pub struct PartRef<'a> {
    source: &'a Source,
    object: &'a Object,
    part: &'a Part,
}

impl<'a> PartRef<'a> {
    /// Part name.
    pub fn name(&self) -> &'a str {
        &self.part.name
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.part.dtype
    }

    /// Shape in elements.
    pub fn shape(&self) -> &'a [u64] {
        &self.part.shape
    }

    /// Element strides over the stored bytes (C order when the part is contiguous).
    pub fn strides(&self) -> Vec<i64> {
        self.part
            .strides
            .clone()
            .unwrap_or_else(|| c_strides(&self.part.shape))
    }

    /// True if the stored bytes are in C order (no materialization needed).
    pub fn is_contiguous(&self) -> bool {
        match &self.part.strides {
            None => true,
            Some(s) => {
                let c = c_strides(&self.part.shape);
                self.part
                    .shape
                    .iter()
                    .zip(s.iter().zip(&c))
                    .all(|(&d, (a, b))| d <= 1 || a == b)
            }
        }
    }

    /// Where the bytes are.
    pub fn payload(&self) -> &'a Payload {
        &self.part.payload
    }

    /// Payload length in bytes.
    pub fn nbytes(&self) -> u64 {
        self.part.payload.len()
    }

    fn ctx(&self) -> Context {
        let file = match &self.part.payload {
            Payload::Stored { store, .. } => Context::file(store.path()),
            Payload::Decoded { .. } => self
                .source
                .files
                .first()
                .map(Context::file)
                .unwrap_or_default(),
        };
        file.tensor(&self.object.name)
    }

    /// Capabilities of this part.
    pub fn caps(&self) -> Caps {
        match &self.part.payload {
            Payload::Stored { store, offset, len } => Caps {
                map: self.mappable(),
                locate: true,
                evict: store.is_mapped()
                    && self.source.exclusive_pages(store, *offset, *len).is_some(),
                verify: self.digest().is_some(),
                alignment: 1 << offset.trailing_zeros().min(20),
            },
            Payload::Decoded { .. } => Caps {
                map: false,
                locate: false,
                evict: false,
                verify: self.digest().is_some(),
                alignment: 1,
            },
        }
    }

    fn mappable(&self) -> bool {
        match &self.part.payload {
            Payload::Stored { store, offset, .. } => {
                store.is_mapped() && offset % self.part.dtype.alignment() == 0
            }
            Payload::Decoded { .. } => false,
        }
    }

    /// The stored bytes as a zero-copy view of the mapping, whatever their
    /// alignment, for consumers that handle unaligned elements (numpy does;
    /// an npz member's data often starts at an odd offset). Fails for
    /// decoded payloads and unmapped stores.
    pub fn map_unaligned(&self) -> Result<&'a [u8]> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } if store.is_mapped() => store
                .slice(*offset, *len)
                .map_err(|e| e.in_tensor(&self.object.name)),
            _ => self.map(),
        }
    }

    /// The stored bytes as a zero-copy view of the mapping. Fails for
    /// decoded payloads, unmapped stores, and bytes not aligned for the dtype.
    pub fn map(&self) -> Result<&'a [u8]> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } if self.mappable() => store
                .slice(*offset, *len)
                .map_err(|e| e.in_tensor(&self.object.name)),
            Payload::Stored { store, offset, .. } if store.is_mapped() => Err(Error::Unsupported {
                ctx: self.ctx().at(*offset),
                reason: format!(
                    "offset is not aligned for {} (needs {})",
                    self.part.dtype,
                    self.part.dtype.alignment()
                ),
            }),
            Payload::Stored { offset, .. } => Err(Error::Unsupported {
                ctx: self.ctx().at(*offset),
                reason: "the file is not memory-mapped".into(),
            }),
            Payload::Decoded { decoder, .. } => Err(Error::Unsupported {
                ctx: self.ctx(),
                reason: format!("stored {}; decode with bytes()", decoder.describe()),
            }),
        }
    }

    /// The stored bytes in storage order (strides apply): borrowed from the
    /// mapping when possible, decoded otherwise.
    pub fn storage_bytes(&self) -> Result<Cow<'a, [u8]>> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } => store
                .read(*offset, *len)
                .map_err(|e| e.in_tensor(&self.object.name)),
            Payload::Decoded {
                decoder,
                decoded_len,
            } => {
                self.source
                    .limits
                    .check_decoded(&self.ctx(), *decoded_len)?;
                let bytes = decoder
                    .decode(&self.source.limits)
                    .map_err(|e| e.in_tensor(&self.object.name))?;
                if bytes.len() as u64 != *decoded_len {
                    return Err(Error::Decode {
                        ctx: self.ctx(),
                        reason: format!("decoded {} bytes, expected {decoded_len}", bytes.len()),
                    });
                }
                Ok(Cow::Owned(bytes))
            }
        }
    }

    /// Bytes `[start, start + len)` of the stored (decoded) stream, for
    /// reading a slice of a tensor: borrowed from the mapping when raw, and
    /// for seekable encodings only the frames the range touches are decoded.
    pub fn storage_range(&self, start: u64, len: u64) -> Result<Cow<'a, [u8]>> {
        let total = self.part.payload.len();
        let end = start
            .checked_add(len)
            .filter(|&e| e <= total)
            .ok_or_else(|| {
                Error::range(
                    self.ctx(),
                    format!("range {start}+{len} is outside the part's {total} bytes"),
                )
            })?;
        match &self.part.payload {
            Payload::Stored { store, offset, .. } => store
                .read(offset + start, end - start)
                .map_err(|e| e.in_tensor(&self.object.name)),
            Payload::Decoded { decoder, .. } => {
                self.source.limits.check_decoded(&self.ctx(), len)?;
                let bytes = decoder
                    .decode_range(start, len, &self.source.limits)
                    .map_err(|e| e.in_tensor(&self.object.name))?;
                if bytes.len() as u64 != len {
                    return Err(Error::Decode {
                        ctx: self.ctx(),
                        reason: format!("range decoded to {} bytes, expected {len}", bytes.len()),
                    });
                }
                Ok(Cow::Owned(bytes))
            }
        }
    }

    /// The elements in C order: borrowed when the stored bytes already are,
    /// materialized from strides or decoded otherwise.
    pub fn bytes(&self) -> Result<Cow<'a, [u8]>> {
        let storage = self.storage_bytes()?;
        if self.is_contiguous() {
            return Ok(storage);
        }
        let size = self.part.dtype.size().unwrap_or(1) as usize;
        Ok(Cow::Owned(materialize(
            &storage,
            &self.part.shape,
            &self.strides(),
            size,
        )))
    }

    /// The digest the file stores for this part's decoded bytes, if any.
    pub fn digest(&self) -> Option<&'a Digest> {
        let objects = &self.source.objects;
        // Both references point into the source's own vectors.
        let o = (self.object as *const Object as usize - objects.as_ptr() as usize)
            / std::mem::size_of::<Object>().max(1);
        let parts = &self.object.parts;
        let p = (self.part as *const Part as usize - parts.as_ptr() as usize)
            / std::mem::size_of::<Part>().max(1);
        self.source.digests.get(&(o, p))
    }

    /// Check the stored digest against the decoded bytes: `Ok(true)` when it
    /// matches, `Ok(false)` when the part has no digest, and
    /// [`Error::Integrity`] when it does not match.
    pub fn verify(&self) -> Result<bool> {
        let Some(want) = self.digest() else {
            return Ok(false);
        };
        let bytes = self.storage_bytes()?;
        let got = want.algorithm().digest(&bytes);
        if got != *want {
            return Err(Error::Integrity {
                ctx: self.ctx(),
                reason: format!(
                    "part {:?} digest is {got}, the file says {want}",
                    self.name()
                ),
            });
        }
        Ok(true)
    }

    /// The file range of raw stored bytes, for caller-driven I/O.
    pub fn locate(&self) -> Option<Location> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } => Some(Location {
                path: store.path().to_path_buf(),
                offset: *offset,
                nbytes: *len,
            }),
            Payload::Decoded { .. } => None,
        }
    }

    /// Ask the kernel to read this part's pages ahead.
    pub fn prefetch(&self) -> Result<()> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } => store.prefetch(*offset, *len),
            Payload::Decoded { .. } => Ok(()),
        }
    }

    /// Drop this part's pages from the process's mapping, except pages that
    /// another tensor shares. Returns the bytes dropped.
    pub fn evict(&self) -> Result<u64> {
        match &self.part.payload {
            Payload::Stored { store, offset, len } if store.is_mapped() => {
                match self.source.exclusive_pages(store, *offset, *len) {
                    Some((start, end)) => {
                        store.evict_pages(start, end)?;
                        Ok(end - start)
                    }
                    None => Ok(0),
                }
            }
            _ => Ok(0),
        }
    }
}

/// Gather a strided array into C order. `strides` are in elements and were
/// validated against `storage` when the source was built.
pub fn materialize(storage: &[u8], shape: &[u64], strides: &[i64], size: usize) -> Vec<u8> {
    let n = num_elements(shape).unwrap_or(0) as usize;
    let mut out = crate::buffer::with_capacity(n * size);
    if n == 0 {
        return out;
    }
    let rank = shape.len();
    let mut idx = vec![0u64; rank];
    // Copy the innermost dimension as one run when it is contiguous.
    let inner = rank.checked_sub(1);
    let inner_run = inner
        .filter(|&i| strides[i] == 1)
        .map(|i| shape[i])
        .unwrap_or(1);
    let outer_rank = if inner_run > 1 { rank - 1 } else { rank };
    loop {
        let base: u64 = idx[..outer_rank]
            .iter()
            .zip(strides)
            .map(|(&i, &s)| i * s as u64)
            .sum();
        let start = base as usize * size;
        out.extend_from_slice(&storage[start..start + inner_run as usize * size]);
        // Advance the multi-index over the outer dimensions.
        let mut d = outer_rank;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn materialize_fortran() {
        // A 2x3 array stored column-major: [[0,1,2],[3,4,5]] -> 0,3,1,4,2,5
        let storage: Vec<u8> = vec![0, 3, 1, 4, 2, 5];
        let out = materialize(&storage, &[2, 3], &[1, 2], 1);
        assert_eq!(out, vec![0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn materialize_rank0_and_rows() {
        assert_eq!(materialize(&[9], &[], &[], 1), vec![9]);
        // Every other row of a 4x2 array.
        let storage: Vec<u8> = (0..8).collect();
        assert_eq!(materialize(&storage, &[2, 2], &[4, 1], 1), vec![0, 1, 4, 5]);
    }
}
