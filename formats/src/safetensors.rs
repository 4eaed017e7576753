//! safetensors: an 8-byte little-endian header length, a JSON header, then a
//! byte buffer the header's `data_offsets` tile exactly.
//!
//! Validation follows the reference crate (`Metadata::validate`): header at
//! most 100 MB, offsets contiguous from 0 with no gap or overlap, byte size
//! equal to `product(shape) x bits / 8` with checked arithmetic, and the
//! buffer ending exactly at end of file (which rules out polyglot files).
//! Stricter than the crate in one place: a duplicate tensor name is an error
//! even when the two entries agree (the README forbids duplicates).

use std::borrow::Cow;
use std::fmt;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use zt_core::Rule;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use zt_core::catalog::{Catalog, Object, Payload, Value};
use zt_core::dtype::{num_elements, DType};
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::inputs::{Inputs, SourceInputs};
use zt_core::limits::Limits;
use zt_core::publish::{direct, publish_reading, publish_with};
use zt_core::source::Source;
use zt_core::store::Store;
use zt_core::write::{
    string_metadata, FormatWriter, MetadataCaps, TensorIn, WriteOptions, WriterCaps,
};

/// The rules safetensors refusals cite (`safetensors.*`).
pub mod rules {
    use zt_core::Rule;

    /// The header is not UTF-8 JSON of the documented shape.
    pub const HEADER: Rule = Rule::new("safetensors.Header");
    /// `__metadata__` holds something other than strings.
    pub const METADATA: Rule = Rule::new("safetensors.Metadata");
    /// `data_offsets` that run backwards, overlap, leave gaps or pass the file.
    pub const OFFSETS: Rule = Rule::new("safetensors.Offsets");
    /// A tensor's byte length is not its shape times its dtype's width.
    pub const SIZE: Rule = Rule::new("safetensors.Size");

    /// Every `safetensors.*` rule: the registry's tests check that names are unique
    /// across plugins and carry the prefix.
    pub const RULES: &[Rule] = &[HEADER, METADATA, OFFSETS, SIZE];
}

pub use rules::RULES;

/// The safetensors plugin.
pub struct Safetensors;

/// The safetensors plugin: a length prefix and a JSON header, no magic.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "safetensors",
    readers: &[zt_core::Reader {
        format: &Safetensors,
        detect_rank: 60,
    }],
    writers: &[&SafetensorsWriter],
    rules: &[("safetensors", RULES), ("quant", crate::quant::RULES)],
    checkpoints: &[
        zt_core::Checkpoint {
            name: "model.safetensors.index.json",
            preference: 10,
        },
        zt_core::Checkpoint {
            name: "model.safetensors",
            preference: 11,
        },
    ],
};

/// safetensors' own cap on the header length.
pub const MAX_HEADER: u64 = 100_000_000;

/// Map a safetensors dtype string to a zt dtype.
pub fn dtype_from_str(s: &str) -> Option<DType> {
    Some(match s {
        "F64" => DType::F64,
        "F32" => DType::F32,
        "F16" => DType::F16,
        "BF16" => DType::BF16,
        "I64" => DType::I64,
        "I32" => DType::I32,
        "I16" => DType::I16,
        "I8" => DType::I8,
        "U64" => DType::U64,
        "U32" => DType::U32,
        "U16" => DType::U16,
        "U8" => DType::U8,
        "BOOL" => DType::Bool,
        "F8_E4M3" => DType::F8E4M3Fn,
        "F8_E5M2" => DType::F8E5M2,
        "F8_E4M3FNUZ" => DType::F8E4M3Fnuz,
        "F8_E5M2FNUZ" => DType::F8E5M2Fnuz,
        "F8_E8M0" => DType::F8E8M0,
        "F4" => DType::F4E2M1,
        "F6_E2M3" => DType::F6E2M3,
        "F6_E3M2" => DType::F6E3M2,
        "C64" => DType::Complex64,
        _ => return None,
    })
}

/// The safetensors spelling of a zt dtype, if the format has one.
pub fn dtype_to_str(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F64 => "F64",
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::I64 => "I64",
        DType::I32 => "I32",
        DType::I16 => "I16",
        DType::I8 => "I8",
        DType::U64 => "U64",
        DType::U32 => "U32",
        DType::U16 => "U16",
        DType::U8 => "U8",
        DType::Bool => "BOOL",
        DType::F8E4M3Fn => "F8_E4M3",
        DType::F8E5M2 => "F8_E5M2",
        DType::F8E4M3Fnuz => "F8_E4M3FNUZ",
        DType::F8E5M2Fnuz => "F8_E5M2FNUZ",
        DType::F8E8M0 => "F8_E8M0",
        DType::F4E2M1 => "F4",
        DType::F6E2M3 => "F6_E2M3",
        DType::F6E3M2 => "F6_E3M2",
        DType::Complex64 => "C64",
        DType::Complex128 | DType::I4 | DType::U4 => return None,
    })
}

/// The position of a dtype in the reference crate's `Dtype` enum, which is
/// declared in increasing alignment order; its writer lays tensors out by
/// this, descending, then by name.
fn writer_rank(d: DType) -> usize {
    const ENUM: [&str; 22] = [
        "BOOL",
        "F4",
        "F6_E2M3",
        "F6_E3M2",
        "U8",
        "I8",
        "F8_E5M2",
        "F8_E4M3",
        "F8_E8M0",
        "F8_E4M3FNUZ",
        "F8_E5M2FNUZ",
        "I16",
        "U16",
        "F16",
        "BF16",
        "I32",
        "U32",
        "F32",
        "C64",
        "F64",
        "I64",
        "U64",
    ];
    dtype_to_str(d)
        .and_then(|s| ENUM.iter().position(|e| *e == s))
        .unwrap_or(0)
}

/// One tensor entry as the header declares it.
#[derive(Deserialize)]
struct Info<'a> {
    #[serde(borrow)]
    dtype: Cow<'a, str>,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// The parsed header: `__metadata__` and the tensor entries in file order.
/// Parsed straight into typed entries (no intermediate JSON tree) because
/// open latency on files with many tensors is dominated by allocation.
/// Duplicate names are kept here and refused by `Source`.
#[derive(Default)]
struct Header<'a> {
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    entries: Vec<(String, Info<'a>)>,
}

impl<'de: 'a, 'a> Deserialize<'de> for Header<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Header<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Header<'a>, A::Error> {
                let mut header = Header::default();
                while let Some(name) = map.next_key::<String>()? {
                    if name == "__metadata__" {
                        if header.metadata.is_some() {
                            return Err(serde::de::Error::custom("duplicate __metadata__"));
                        }
                        header.metadata = Some(map.next_value()?);
                    } else {
                        let info = map.next_value::<Info>().map_err(|e| {
                            serde::de::Error::custom(format_args!("tensor {name:?}: {e}"))
                        })?;
                        header.entries.push((name, info));
                    }
                }
                Ok(header)
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

impl Format for Safetensors {
    fn name(&self) -> &'static str {
        "safetensors"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["safetensors"]
    }

    fn sniff(&self, probe: &Probe<'_>) -> bool {
        let Some(len_bytes) = probe.head.get(..8) else {
            return false;
        };
        let n = u64::from_le_bytes(len_bytes.try_into().unwrap_or([0; 8]));
        // A header length past the end of the file is still recognised, so
        // a truncated download gets "truncated", not "unknown format".
        if !(2..=MAX_HEADER).contains(&n) {
            return false;
        }
        // The header must open a JSON object (leading whitespace allowed, as
        // the reference parser allows it).
        let header = &probe.head[8..];
        header
            .iter()
            .take(n as usize)
            .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
            .is_some_and(|&b| b == b'{')
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        open_in(input.store, input.limits, 0)
    }

    /// Fuzz target `safetensors`: JSON header, offsets, dtypes (seeds written
    /// by the `safetensors` package).
    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(zt_core::FuzzTarget::new(
            "safetensors",
            &["fuzz/seeds/safetensors"],
        ))
    }
}

/// The tensors of a safetensors file that starts at byte `start` of `store`
/// and runs to its end, as [`Safetensors`] would list that file alone (a
/// PyTorch distributed checkpoint saved as `SAFETENSORS` ends each `.distcp`
/// file with one, after its non-tensor entries): payloads point into `store`.
pub fn open_in(store: &Arc<Store>, limits: &Limits, start: u64) -> Result<Catalog> {
    let ctx = store.ctx();
    let len_bytes = store.read(start, 8).map_err(|_| Error::Truncated {
        rule: Rule::TRUNCATED,
        ctx: ctx.clone(),
        what: "safetensors header length",
        needed: 8,
        available: store.len().saturating_sub(start),
    })?;
    let n = u64::from_le_bytes(len_bytes[..8].try_into().expect("8 bytes"));
    limits.check_header(&ctx, n)?;
    // The reference crate's own cap applies even when `Limits` allow
    // more, so every file zt accepts is one the reference accepts.
    Limits::check(&ctx, "safetensors header_bytes", n, MAX_HEADER)?;
    // `start + 8` fits: the read above ended inside the file.
    let data_start = (start + 8).checked_add(n).ok_or_else(|| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "header end",
    })?;
    if data_start > store.len() {
        return Err(Error::Truncated {
            rule: Rule::TRUNCATED,
            ctx: ctx.at(start + 8),
            what: "safetensors header",
            needed: n,
            available: store.len() - start - 8,
        });
    }
    let header = store.read(start + 8, n)?;
    let text = std::str::from_utf8(&header).map_err(|e| {
        Error::header(
            ctx.clone().at(start + 8),
            rules::HEADER,
            format!("header is not UTF-8: {e}"),
        )
    })?;
    let Header { metadata, entries } = serde_json::from_str(text).map_err(|e| {
        Error::header(
            ctx.clone().at(start + 8),
            rules::HEADER,
            format!("bad JSON header: {e}"),
        )
    })?;
    limits.check_tensors(&ctx, entries.len() as u64)?;
    let attributes = match metadata {
        Some(map) => parse_metadata(map).map_err(|e| e.in_file(store.path()))?,
        None => Vec::new(),
    };

    let mut tensors = Vec::with_capacity(entries.len());
    for (name, info) in entries {
        let (dtype, begin, end) =
            check_entry(&info, limits).map_err(|e| e.in_file(store.path()).in_tensor(&name))?;
        tensors.push((name, dtype, info.shape, begin, end));
    }

    // The offsets must tile the buffer: sorted, each starting where the
    // previous ended, the last ending at end of file.
    tensors.sort_unstable_by_key(|t| (t.3, t.4));
    let mut cursor = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        if t.3 != cursor {
            // Two entries with one name and one range sort next to each
            // other; name that rather than the overlap it causes.
            if i > 0 && tensors[i - 1].0 == t.0 {
                return Err(Error::DuplicateName {
                    ctx: ctx.clone().tensor(&t.0),
                });
            }
            let what = if t.3 < cursor {
                "overlaps the previous tensor"
            } else {
                "leaves a gap after the previous tensor"
            };
            return Err(Error::range(
                ctx.clone().tensor(&t.0).at(data_start + t.3),
                rules::OFFSETS,
                format!("data_offsets [{}, {}] {what}", t.3, t.4),
            ));
        }
        cursor = t.4;
    }
    let expected = data_start
        .checked_add(cursor)
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "buffer end",
        })?;
    if expected != store.len() {
        return Err(Error::range(
            ctx.clone(),
            rules::OFFSETS,
            format!(
                "tensors end at byte {expected} but the file has {} bytes",
                store.len()
            ),
        ));
    }

    let objects = tensors
        .into_iter()
        .map(|(name, dtype, shape, begin, end)| {
            let payload = Payload::Stored {
                store: Arc::clone(store),
                offset: data_start + begin,
                len: end - begin,
            };
            Object::dense(name, dtype, shape, payload)
        })
        .collect();
    Ok(Catalog {
        objects,
        attributes,
        ..Catalog::default()
    })
}

/// Check one entry's dtype, rank and byte size; returns the dtype and the
/// data offsets. Errors carry no context: the caller adds file and tensor.
fn check_entry(info: &Info<'_>, limits: &Limits) -> Result<(DType, u64, u64)> {
    let ctx = Context::default();
    let dtype = dtype_from_str(&info.dtype).ok_or_else(|| Error::UnsupportedDType {
        rule: Rule::DTYPE,
        ctx: ctx.clone(),
        dtype: info.dtype.to_string(),
    })?;
    limits.check_rank(&ctx, info.shape.len())?;
    let (begin, end) = info.data_offsets;
    if end < begin {
        return Err(Error::range(
            ctx,
            rules::OFFSETS,
            format!("data_offsets [{begin}, {end}] end before they begin"),
        ));
    }
    let elements = num_elements(&info.shape).ok_or_else(|| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "element count",
    })?;
    let bits = elements
        .checked_mul(dtype.bits())
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "bit size",
        })?;
    if bits % 8 != 0 {
        return Err(Error::range(
            ctx,
            rules::SIZE,
            format!("{elements} x {dtype} is not a whole number of bytes"),
        ));
    }
    if bits / 8 != end - begin {
        return Err(Error::range(
            ctx,
            rules::SIZE,
            format!(
                "shape {:?} of {dtype} needs {} bytes, data_offsets span {}",
                info.shape,
                bits / 8,
                end - begin
            ),
        ));
    }
    Ok((dtype, begin, end))
}

/// safetensors' `__metadata__` is a string-to-string map and nothing else.
fn parse_metadata(map: serde_json::Map<String, serde_json::Value>) -> Result<Vec<(String, Value)>> {
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => Ok((k, Value::Str(s))),
            other => Err(Error::header(
                Context::default(),
                rules::METADATA,
                format!("__metadata__[{k:?}] is {other}, not a string"),
            )),
        })
        .collect()
}

/// Write tensors as safetensors, laid out as the reference writer lays them
/// out (its dtype order descending, then name; header padded with spaces to
/// a multiple of 8) so every tensor is aligned for its dtype. The file is
/// built beside `path` and renamed into place. No `__metadata__` is written
/// when `metadata` is empty; see [`write_with`] to write an empty one.
pub fn write(path: &Path, tensors: &[TensorIn<'_>], metadata: &[(String, String)]) -> Result<u64> {
    write_with(path, tensors, (!metadata.is_empty()).then_some(metadata))
}

/// [`write()`], with `metadata: None` for no `__metadata__` at all and
/// `Some(&[])` for an empty one (as the reference writes `metadata={}`).
pub fn write_with(
    path: &Path,
    tensors: &[TensorIn<'_>],
    metadata: Option<&[(String, String)]>,
) -> Result<u64> {
    write_synced(path, tensors, metadata, true)
}

/// [`write_with`], fsyncing the file before its rename only when `durable`
/// (`WriteOptions::defer_sync` turns it off: the caller syncs).
fn write_synced(
    path: &Path,
    tensors: &[TensorIn<'_>],
    metadata: Option<&[(String, String)]>,
    durable: bool,
) -> Result<u64> {
    let (header, order) = prepare_inputs(&Context::file(path), tensors, metadata)?;
    publish_with(path, durable, |w| {
        w.write_all(&header)?;
        for &i in &order {
            w.write_all(tensors[i].data)?;
        }
        Ok(())
    })
}

/// Every tensor of `source` written as [`write_with`] writes them, one
/// tensor's bytes in memory at a time ([`SourceInputs`]: read ahead a
/// window at a time in the order written, each tensor borrowed from the
/// mapping or decoded (a cast), written, dropped, and its mapped pages
/// released, sparing pages another tensor shares; fetched ahead of the
/// writes on a thread of their own, `zt_core::inputs::fetch_ahead`), so a
/// conversion's resident memory stays near its largest tensor whatever the
/// file's size.
/// A tensor of another layout is refused naming it.
/// A file of at least `DIRECT_MIN_BYTES` is written with direct I/O
/// (`zt_core::publish::direct`: no copy into the page cache, which was
/// most of a large conversion's CPU), smaller ones buffered.
fn write_source(
    source: &Source,
    path: &Path,
    metadata: Option<&[(String, String)]>,
    durable: bool,
) -> Result<u64> {
    write_source_from(source, path, metadata, durable, direct::DIRECT_MIN_BYTES)
}

/// [`write_source`], direct I/O from `direct_min` bytes of file (tests
/// reach the direct path with small files).
fn write_source_from(
    source: &Source,
    path: &Path,
    metadata: Option<&[(String, String)]>,
    durable: bool,
    direct_min: u64,
) -> Result<u64> {
    let ctx = Context::file(path);
    let inputs = SourceInputs::new(source, path)?;
    let metas = (0..inputs.len())
        .map(|i| {
            let t = inputs.meta(i);
            Ok(Meta {
                name: t.name,
                dtype: t.dtype,
                shape: t.shape,
                len: t.nbytes(&ctx)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let (header, order) = prepare(&ctx, &metas, metadata)?;
    inputs.will_fetch_in(&order);
    let body = |w: &mut dyn Write| {
        let io = |e| Error::io(path, e);
        w.write_all(&header).map_err(io)?;
        zt_core::inputs::fetch_ahead(&inputs, &order, &ctx, |_, bytes| {
            w.write_all(bytes).map_err(io)
        })
    };
    let total = metas.iter().map(|m| m.len).sum::<u64>() + header.len() as u64;
    if total >= direct_min {
        direct::publish_direct(path, durable, |w| body(w))
    } else {
        publish_reading(path, durable, |w| body(w))
    }
}

/// The whole file [`write_with`] would write, in memory (what
/// `safetensors.*.save` returns).
pub fn to_bytes(
    tensors: &[TensorIn<'_>],
    metadata: Option<&[(String, String)]>,
) -> Result<Vec<u8>> {
    let (header, order) = prepare_inputs(&Context::default(), tensors, metadata)?;
    let total = order.iter().map(|&i| tensors[i].data.len()).sum::<usize>() + header.len();
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&header);
    for &i in &order {
        out.extend_from_slice(tensors[i].data);
    }
    Ok(out)
}

/// What the header says of one tensor.
struct Meta<'a> {
    name: &'a str,
    dtype: DType,
    shape: &'a [u64],
    /// Its bytes.
    len: u64,
}

/// [`prepare`] for tensors in memory, each checked against its shape.
fn prepare_inputs(
    ctx: &Context,
    tensors: &[TensorIn<'_>],
    metadata: Option<&[(String, String)]>,
) -> Result<(Vec<u8>, Vec<usize>)> {
    // Sizes checked in order up to the first tensor `prepare` refuses, so
    // the error reported is the first tensor's, as before.
    for t in tensors {
        if t.name == "__metadata__" || dtype_to_str(t.dtype).is_none() {
            break;
        }
        t.check(ctx)?;
    }
    let mut metas = Vec::with_capacity(tensors.len());
    for t in tensors {
        metas.push(Meta {
            name: t.name,
            dtype: t.dtype,
            shape: t.shape,
            len: t.data.len() as u64,
        });
    }
    prepare(ctx, &metas, metadata)
}

/// Check the tensors, order them as the reference writer does (indexes
/// into `tensors`), and build the length prefix and header.
fn prepare(
    ctx: &Context,
    tensors: &[Meta<'_>],
    metadata: Option<&[(String, String)]>,
) -> Result<(Vec<u8>, Vec<usize>)> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    for t in tensors {
        if t.name == "__metadata__" {
            return Err(Error::Write {
                rule: Rule::WRITE_NAME,
                ctx: ctx.clone().tensor(t.name),
                reason: "the name __metadata__ is reserved".into(),
            });
        }
        if dtype_to_str(t.dtype).is_none() {
            return Err(Error::Write {
                rule: Rule::WRITE_DTYPE,
                ctx: ctx.clone().tensor(t.name),
                reason: format!("safetensors has no {} dtype", t.dtype),
            });
        }
    }
    // The reference writer sorts by its `Dtype` enum descending (the enum
    // is declared in increasing alignment order), then by name.
    order.sort_by(|&a, &b| {
        let (a, b) = (&tensors[a], &tensors[b]);
        writer_rank(b.dtype)
            .cmp(&writer_rank(a.dtype))
            .then_with(|| a.name.cmp(b.name))
    });
    for pair in order.windows(2) {
        if tensors[pair[0]].name == tensors[pair[1]].name {
            return Err(Error::DuplicateName {
                ctx: ctx.clone().tensor(tensors[pair[0]].name),
            });
        }
    }

    // Written by hand, byte for byte what the reference writer's serde
    // derive produces: `__metadata__` first (in the caller's order; the
    // reference iterates a HashMap, so with two or more keys its own order
    // varies from run to run), then each tensor's fields in declaration
    // order `dtype, shape, data_offsets` (a `serde_json::Map` would sort
    // them), no whitespace, and spaces to a multiple of 8.
    let quote = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let mut json = String::from("{");
    if let Some(metadata) = metadata {
        json.push_str("\"__metadata__\":{");
        for (i, (k, v)) in metadata.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&quote(k));
            json.push(':');
            json.push_str(&quote(v));
        }
        json.push('}');
    }
    let mut offset = 0u64;
    for (i, t) in order.iter().map(|&i| &tensors[i]).enumerate() {
        if i > 0 || metadata.is_some() {
            json.push(',');
        }
        let end = offset + t.len;
        let shape: Vec<String> = t.shape.iter().map(u64::to_string).collect();
        json.push_str(&format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{offset},{end}]}}",
            quote(t.name),
            dtype_to_str(t.dtype).expect("checked above"),
            shape.join(",")
        ));
        offset = end;
    }
    json.push('}');
    while json.len() % 8 != 0 {
        json.push(' ');
    }
    let mut header = Vec::with_capacity(8 + json.len());
    header.extend_from_slice(&(json.len() as u64).to_le_bytes());
    header.extend_from_slice(json.as_bytes());
    Ok((header, order))
}

/// The safetensors [`FormatWriter`]: dense tensors, and file attributes
/// that are all strings as `__metadata__`.
pub struct SafetensorsWriter;

impl FormatWriter for SafetensorsWriter {
    /// Hugging Face's sharded layout: `model.safetensors` in a model directory,
    /// shards `STEM-00001-of-00003.EXT` and `NAME.index.json`.
    fn shard_layout(&self) -> Option<zt_core::shard::ShardLayout> {
        Some(zt_core::shard::ShardLayout {
            checkpoint_name: "model.safetensors",
            tie: zt_core::shard::Tie::Index,
            durable: true,
        })
    }

    fn name(&self) -> &'static str {
        "safetensors"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["safetensors"]
    }

    fn caps(&self) -> WriterCaps {
        WriterCaps {
            metadata: MetadataCaps::Strings,
            options: &[],
            arrays: true,
        }
    }

    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        let metadata = metadata.map(|m| string_metadata(path, m)).transpose()?;
        write_synced(path, tensors, metadata.as_deref(), options.syncs())
    }

    fn reads_ahead(&self) -> bool {
        true
    }

    /// A conversion: one tensor's bytes in memory at a time
    /// (`write_source`), the attributes that are strings carried.
    fn write(&self, source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
        let metadata = zt_core::write::carried_attributes(source, self.caps().metadata);
        let metadata = metadata.map(|m| string_metadata(path, &m)).transpose()?;
        write_source(source, path, metadata.as_deref(), options.syncs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tensors` (name, dtype, shape) with deterministic bytes.
    fn tensors(specs: &[(&str, DType, Vec<u64>)]) -> Vec<(String, DType, Vec<u64>, Vec<u8>)> {
        specs
            .iter()
            .enumerate()
            .map(|(k, (name, dtype, shape))| {
                let len = num_elements(shape).unwrap() as usize * dtype.size().unwrap() as usize;
                let bytes = (0..len).map(|i| (i * 7 + k * 13) as u8).collect();
                (name.to_string(), *dtype, shape.clone(), bytes)
            })
            .collect()
    }

    /// The file `to_bytes` lays out for `specs`, written, opened as a
    /// source and converted through the direct path and the buffered one:
    /// both are that file, byte for byte.
    fn check(dir: &Path, specs: &[(&str, DType, Vec<u64>)], metadata: Option<&[(String, String)]>) {
        let owned = tensors(specs);
        let ins: Vec<TensorIn<'_>> = owned
            .iter()
            .map(|(name, dtype, shape, data)| TensorIn {
                name,
                dtype: *dtype,
                shape,
                data,
            })
            .collect();
        let want = to_bytes(&ins, metadata).unwrap();
        let src = dir.join("src.safetensors");
        std::fs::write(&src, &want).unwrap();
        let store = Arc::new(Store::open(&src).unwrap());
        let catalog = open_in(&store, &Limits::default(), 0).unwrap();
        let source =
            Source::from_catalog("safetensors", store, catalog, Limits::default()).unwrap();
        for (direct_min, durable) in [(0, true), (0, false), (u64::MAX, false)] {
            let dst = dir.join("dst.safetensors");
            let n = write_source_from(&source, &dst, metadata, durable, direct_min).unwrap();
            let got = std::fs::read(&dst).unwrap();
            assert_eq!(n, want.len() as u64);
            assert!(
                got == want,
                "{} bytes, direct from {direct_min}",
                want.len()
            );
            std::fs::remove_file(&dst).unwrap();
        }
        // No partial left beside the output.
        let names: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("src.safetensors")]);
    }

    /// Files whose data ends around a block and the staging buffer, with
    /// empty tensors and headers of several lengths, are written exactly
    /// as the in-memory writer lays them out.
    #[test]
    fn direct_writes_are_byte_identical_at_every_edge() {
        let dir = tempfile::tempdir().unwrap();
        let stage = direct::STAGE_BYTES as u64;
        let block = direct::ALIGN as u64;
        check(dir.path(), &[], None);
        check(dir.path(), &[("e", DType::F32, vec![0, 4])], None);
        for total in [
            block - 1,
            block,
            block + 1,
            stage - 1,
            stage,
            stage + 1,
            2 * stage + block,
        ] {
            // One byte tensor of `total - 64` bytes after a 64-byte f32 one,
            // so the data (not the file) ends at the edge; header lengths
            // vary with the names.
            for name in ["a", "a_much_longer_tensor_name_that_moves_the_header"] {
                check(
                    dir.path(),
                    &[
                        (name, DType::U8, vec![total - 64]),
                        ("w", DType::F32, vec![4, 4]),
                        ("empty", DType::BF16, vec![0]),
                    ],
                    None,
                );
            }
        }
        let metadata = [("format".to_string(), "pt".to_string())];
        check(
            dir.path(),
            &[("x", DType::F16, vec![stage / 2 + 3])],
            Some(&metadata),
        );
    }
}
