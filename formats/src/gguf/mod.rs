//! GGUF (ggml / llama.cpp): a typed key-value header, tensor infos, then
//! tensor data at `general.alignment`-aligned offsets.
//!
//! Read as `gguf.GGUFReader` (gguf-py) reads it, with ggml's own checks
//! where they are stricter and safe to apply:
//! - versions 2 and 3, little- or big-endian (a byte-swapped version is how
//!   both gguf-py and ggml recognise a big-endian file); version 1 is refused;
//! - every metadata value type, nested arrays included, becomes a file
//!   attribute ([`Value`]) in file order; a string that is not UTF-8 becomes
//!   [`Value::Bytes`] so nothing is lost. Besides the file's own keys, three
//!   attributes describe the file: `GGUF.version`, `GGUF.endian`, and
//!   `GGUF.types` (each key's GGUF value type, which [`Value`] cannot hold:
//!   `"u32"`, `"string"`, `"array[f32]"`, or for an array of arrays a list of
//!   its elements' types). Keys starting with `GGUF.` are refused in files
//!   (gguf-py reserves them too);
//! - shapes are reversed (GGUF stores the innermost dimension first), so a
//!   tensor has the shape numpy gives `GGUFReader`'s data;
//! - plain types (F64 F32 F16 BF16 I64 I32 I16 I8) are dense tensors, served
//!   zero-copy. In big-endian files the types gguf-py byte-swaps (F16 F32
//!   F64 I16 I32 I64) are swapped on demand; BF16 and block data are kept
//!   as stored, as gguf-py writes and reads them;
//! - every block type of [`types::TYPES`] is an object with layout
//!   `gguf.<type>/1`, one part `data` (u8, shape `[nbytes]`) holding the
//!   blocks verbatim, and attributes `ggml_type`, `elems_per_block`,
//!   `block_bytes`. [`dequantize`] turns every type gguf-py dequantizes
//!   into f32, bit for bit as gguf-py;
//! - a type id zt does not know fails only that tensor: its object has
//!   layout `gguf.unknown/1`, attribute `ggml_type`, and a part whose read
//!   fails with [`Error::UnsupportedDType`]. Its byte size is unknown, so it
//!   takes no part in the overlap check and cannot be written back.
//!
//! Checks, all before allocating: counts and string lengths against the
//! bytes left and against [`Limits`] (`string_bytes`; `entries` bounds each
//! array and the metadata of the whole file; `depth` bounds nesting;
//! `header_bytes` the whole header), duplicate keys and names, bools other
//! than 0/1, `general.alignment` a u32 power of two (default 32), offsets
//! multiples of the alignment, `ne[0]` a multiple of the block size, tensor
//! ranges inside the file and not overlapping. Unlike ggml, gaps between
//! tensors, names of 64 bytes or more and more than 4 dimensions are
//! accepted, as gguf-py accepts them.

mod dequant;
pub mod rules;
pub mod types;
mod write;

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use zt_core::Rule;

use zt_core::catalog::{Attributes, ByteSwapped, Catalog, Decode, Object, Part, Payload, Value};
use zt_core::dtype::{num_elements, DType};
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::limits::Limits;
use zt_core::store::Store;

pub use dequant::{
    dequantize, dequantize_blocks, dequantize_rows_with, dequantize_with, f16_to_f32,
};
pub use rules::RULES;
pub use types::GgmlType;
pub use write::{write, GgufWriter};

/// The GGUF plugin.
pub struct Gguf;

/// The GGUF plugin (written by conversion only).
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "gguf",
    readers: &[zt_core::Reader {
        format: &Gguf,
        detect_rank: 20,
    }],
    writers: &[&GgufWriter],
    rules: &[("gguf", RULES)],
    checkpoints: &[],
};

/// `GGUF` as the first four bytes.
pub const MAGIC: &[u8; 4] = b"GGUF";

/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// File attributes zt adds (never written back as keys).
pub const ATTR_VERSION: &str = "GGUF.version";
/// `"little"` or `"big"`.
pub const ATTR_ENDIAN: &str = "GGUF.endian";
/// Each key's GGUF value type.
pub const ATTR_TYPES: &str = "GGUF.types";
/// The layout of a tensor whose ggml type id zt does not know.
pub const UNKNOWN_LAYOUT: &str = "gguf.unknown/1";

/// GGUF metadata value types (`gguf_metadata_value_type`).
mod vt {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;

    /// The name zt uses for a value type in `GGUF.types`.
    pub fn name(t: u32) -> Option<&'static str> {
        Some(match t {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            BOOL => "bool",
            STRING => "string",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
            _ => return None,
        })
    }

    /// The value type with this name.
    pub fn by_name(type_name: &str) -> Option<u32> {
        (0..=F64).find(|&t| name(t) == Some(type_name))
    }

    /// Fewest bytes one value of the type takes (an array: type + count).
    pub fn min_size(t: u32) -> u64 {
        match t {
            U8 | I8 | BOOL => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | STRING => 8,
            _ => 12,
        }
    }
}

fn u32_at(b: &[u8], at: usize, swap: bool) -> Option<u32> {
    let v = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
    Some(if swap { v.swap_bytes() } else { v })
}

fn u64_at(b: &[u8], at: usize, swap: bool) -> Option<u64> {
    let v = u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?);
    Some(if swap { v.swap_bytes() } else { v })
}

/// A version read little-endian whose low half is zero is a big-endian
/// file (gguf-py's and ggml's test). Returns (version, big-endian).
fn version_of(raw: u32) -> (u32, bool) {
    if raw & 0xFFFF == 0 {
        (raw.swap_bytes(), true)
    } else {
        (raw, false)
    }
}

impl Format for Gguf {
    fn name(&self) -> &'static str {
        "gguf"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["gguf"]
    }

    /// `GGUF`, a version of 1-3 in either byte order, and tensor / KV
    /// counts that could fit in the file (version 1 is recognised so that
    /// opening it says "unsupported version", not "unknown format").
    fn sniff(&self, p: &Probe<'_>) -> bool {
        if !p.head.starts_with(MAGIC) {
            return false;
        }
        let Some(raw) = u32_at(p.head, 4, false) else {
            return false;
        };
        let (version, swap) = version_of(raw);
        if !(1..=3).contains(&version) {
            return false;
        }
        if version == 1 {
            return true;
        }
        match (u64_at(p.head, 8, swap), u64_at(p.head, 16, swap)) {
            // Each tensor info and each KV pair takes at least 8 bytes.
            (Some(tensors), Some(kvs)) => tensors.saturating_add(kvs).saturating_mul(8) <= p.len,
            _ => false,
        }
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        open(input.store, input.limits)
    }

    /// Fuzz target `gguf`: metadata values (arrays of arrays), tensor infos,
    /// alignment, both byte orders, dequantization (seeds written by
    /// `gguf-py`).
    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(zt_core::FuzzTarget::new("gguf", &["fuzz/seeds/gguf"]))
    }
}

/// Sequential reads of the header, bounded by the file and by
/// `Limits::header_bytes`. A mapped store is borrowed whole; a positional
/// store is read in growing chunks, so opening a large file reads only
/// its header.
struct Reader<'a> {
    store: &'a Store,
    buf: Cow<'a, [u8]>,
    pos: u64,
    /// min(file length, header_bytes): nothing past it is ever read.
    limit: u64,
    header_bytes: u64,
    swap: bool,
}

impl<'a> Reader<'a> {
    fn new(store: &'a Store, limits: &Limits) -> Result<Self> {
        let limit = store.len().min(limits.header_bytes);
        let first = if store.is_mapped() {
            limit
        } else {
            limit.min(1 << 20)
        };
        Ok(Reader {
            store,
            buf: store.read(0, first)?,
            pos: 0,
            limit,
            header_bytes: limits.header_bytes,
            swap: false,
        })
    }

    fn ctx(&self) -> Context {
        self.store.ctx().at(self.pos)
    }

    /// Make `n` bytes from `pos` available, or say why they cannot be.
    fn need(&mut self, n: u64, what: &'static str) -> Result<()> {
        let end = self.pos.checked_add(n).ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: self.ctx(),
            what,
        })?;
        if end > self.store.len() {
            return Err(Error::Truncated {
                rule: Rule::TRUNCATED,
                ctx: self.ctx(),
                what,
                needed: n,
                available: self.store.len() - self.pos,
            });
        }
        if end > self.limit {
            return Err(Error::Limit {
                rule: Rule::LIMIT,
                ctx: self.ctx(),
                limit: "header_bytes",
                value: end,
                max: self.header_bytes,
            });
        }
        if end > self.buf.len() as u64 {
            let grow = end.max(self.buf.len() as u64 * 2).min(self.limit);
            self.buf = Cow::Owned(self.store.read(0, grow)?.into_owned());
        }
        Ok(())
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&[u8]> {
        self.need(n, what)?;
        let start = self.pos as usize;
        self.pos += n;
        Ok(&self.buf[start..start + n as usize])
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let swap = self.swap;
        let mut a: [u8; N] = self.take(N as u64, what)?.try_into().expect("N bytes");
        if swap {
            a.reverse();
        }
        Ok(a)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A GGUF string: u64 length, then that many bytes.
    fn string(&mut self, limits: &Limits, what: &'static str) -> Result<&[u8]> {
        let at = self.ctx();
        let len = self.u64(what)?;
        Limits::check(&at, "string_bytes", len, limits.string_bytes)?;
        self.take(len, what)
    }

    /// A string that must be UTF-8 (keys, tensor names).
    fn utf8(&mut self, limits: &Limits, what: &'static str) -> Result<String> {
        let at = self.ctx();
        let bytes = self.string(limits, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| Error::header(at, rules::METADATA, format!("{what} is not UTF-8")))
    }
}

/// Parsing state for metadata: the limits and the running entry count.
struct Meta<'l> {
    limits: &'l Limits,
    entries: u64,
}

impl Meta<'_> {
    /// Read one value of type `t`; returns it and its type descriptor.
    fn value(&mut self, r: &mut Reader<'_>, t: u32, depth: usize) -> Result<(Value, Value)> {
        let at = r.ctx();
        let scalar = |v: Value| Ok((v, Value::Str(vt::name(t).unwrap_or("?").into())));
        match t {
            vt::U8 => scalar(Value::Int(r.u8("GGUF value")?.into())),
            vt::I8 => scalar(Value::Int((r.u8("GGUF value")? as i8).into())),
            vt::U16 => scalar(Value::Int(
                u16::from_le_bytes(r.array("GGUF value")?).into(),
            )),
            vt::I16 => scalar(Value::Int(
                i16::from_le_bytes(r.array("GGUF value")?).into(),
            )),
            vt::U32 => scalar(Value::Int(r.u32("GGUF value")?.into())),
            vt::I32 => scalar(Value::Int(
                i32::from_le_bytes(r.array("GGUF value")?).into(),
            )),
            vt::F32 => scalar(Value::Float(
                f32::from_le_bytes(r.array("GGUF value")?).into(),
            )),
            vt::U64 => {
                let v = r.u64("GGUF value")?;
                scalar(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
            }
            vt::I64 => scalar(Value::Int(i64::from_le_bytes(r.array("GGUF value")?))),
            vt::F64 => scalar(Value::Float(f64::from_le_bytes(r.array("GGUF value")?))),
            vt::BOOL => match r.u8("GGUF value")? {
                0 => scalar(Value::Bool(false)),
                1 => scalar(Value::Bool(true)),
                b => Err(Error::header(
                    at,
                    rules::METADATA,
                    format!("bool value {b} is neither 0 nor 1"),
                )),
            },
            vt::STRING => {
                let bytes = r.string(self.limits, "GGUF string")?;
                let v = match std::str::from_utf8(bytes) {
                    Ok(s) => Value::Str(s.to_owned()),
                    Err(_) => Value::Bytes(bytes.to_vec()),
                };
                scalar(v)
            }
            vt::ARRAY => self.array(r, depth),
            other => Err(Error::header(
                at,
                rules::METADATA,
                format!("unknown metadata value type {other}"),
            )),
        }
    }

    fn array(&mut self, r: &mut Reader<'_>, depth: usize) -> Result<(Value, Value)> {
        let at = r.ctx();
        Limits::check(&at, "depth", depth as u64 + 1, self.limits.depth as u64)?;
        let elem = r.u32("GGUF array type")?;
        if elem != vt::ARRAY && vt::name(elem).is_none() {
            return Err(Error::header(
                at,
                rules::METADATA,
                format!("unknown array element type {elem}"),
            ));
        }
        let count = r.u64("GGUF array length")?;
        Limits::check(&at, "entries", count, self.limits.entries)?;
        self.entries = self.entries.saturating_add(count);
        Limits::check(&at, "entries", self.entries, self.limits.entries)?;
        // Every element takes at least min_size bytes: check they can be
        // there before allocating for them.
        let least = count
            .checked_mul(vt::min_size(elem))
            .ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: at.clone(),
                what: "GGUF array size",
            })?;
        r.need(least, "GGUF array")?;
        let mut items = Vec::with_capacity(count as usize);
        if elem == vt::ARRAY {
            let mut descs = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let (v, d) = self.value(r, elem, depth + 1)?;
                items.push(v);
                descs.push(d);
            }
            return Ok((Value::List(items), Value::List(descs)));
        }
        for _ in 0..count {
            items.push(self.value(r, elem, depth + 1)?.0);
        }
        let desc = format!("array[{}]", vt::name(elem).unwrap_or("?"));
        Ok((Value::List(items), Value::Str(desc)))
    }
}

/// One tensor info as declared.
struct Info {
    name: String,
    /// Row-major (reversed) shape.
    shape: Vec<u64>,
    type_id: u32,
    offset: u64,
    at: u64,
}

/// Parse the header and build the catalog.
fn open(store: &Arc<Store>, limits: &Limits) -> Result<Catalog> {
    let mut r = Reader::new(store, limits)?;
    if r.take(4, "GGUF magic")? != MAGIC {
        return Err(Error::header(store.ctx(), rules::MAGIC, "no GGUF magic"));
    }
    let (version, swap) = version_of(r.u32("GGUF version")?);
    r.swap = swap;
    if !(2..=3).contains(&version) {
        return Err(Error::Unsupported {
            rule: rules::VERSION,
            ctx: store.ctx().at(4),
            reason: format!("GGUF version {version} (zt reads versions 2 and 3)"),
        });
    }
    let at = r.ctx();
    let tensor_count = r.u64("GGUF tensor count")?;
    let kv_count = r.u64("GGUF metadata count")?;
    limits.check_tensors(&at, tensor_count)?;
    Limits::check(&at, "entries", kv_count, limits.entries)?;
    // A KV pair takes at least 13 bytes, a tensor info at least 24.
    let least = kv_count
        .checked_mul(13)
        .and_then(|k| tensor_count.checked_mul(24).and_then(|t| t.checked_add(k)))
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: at.clone(),
            what: "GGUF header size",
        })?;
    r.need(least, "GGUF header")?;

    let (mut attributes, types, alignment) = read_metadata(&mut r, kv_count, limits)?;
    let infos = read_infos(&mut r, tensor_count, limits)?;
    let data_start = r
        .pos
        .div_ceil(alignment)
        .checked_mul(alignment)
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: r.ctx(),
            what: "GGUF data start",
        })?;
    let objects = build_objects(store, infos, data_start, alignment, swap)?;

    attributes.push((ATTR_VERSION.into(), Value::Int(version.into())));
    let endian = if swap { "big" } else { "little" };
    attributes.push((ATTR_ENDIAN.into(), Value::Str(endian.into())));
    attributes.push((ATTR_TYPES.into(), Value::Map(types)));
    Ok(Catalog {
        objects,
        attributes,
        ..Catalog::default()
    })
}

/// Read the KV pairs: the attributes, each key's type descriptor, and the
/// data alignment.
fn read_metadata(
    r: &mut Reader<'_>,
    kv_count: u64,
    limits: &Limits,
) -> Result<(Attributes, Attributes, u64)> {
    let mut meta = Meta {
        limits,
        entries: kv_count,
    };
    let mut attributes = Vec::with_capacity(kv_count as usize);
    let mut types = Vec::with_capacity(kv_count as usize);
    let mut keys = HashSet::with_capacity(kv_count as usize);
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..kv_count {
        let at = r.ctx();
        let key = r.utf8(limits, "GGUF key")?;
        if key.is_empty() || key.starts_with("GGUF.") {
            return Err(Error::header(
                at,
                rules::METADATA,
                format!("invalid key {key:?}"),
            ));
        }
        if !keys.insert(key.clone()) {
            return Err(Error::header(
                at,
                rules::METADATA,
                format!("duplicate key {key:?}"),
            ));
        }
        let t = r.u32("GGUF value type")?;
        let (value, desc) = meta.value(r, t, 0)?;
        if key == "general.alignment" {
            alignment = match (&value, t) {
                (Value::Int(a), vt::U32) if *a > 0 && (*a as u64).is_power_of_two() => *a as u64,
                _ => {
                    return Err(Error::header(
                        at,
                        rules::METADATA,
                        format!("general.alignment must be a u32 power of two, not {value:?}"),
                    ))
                }
            };
        }
        attributes.push((key.clone(), value));
        types.push((key, desc));
    }
    Ok((attributes, types, alignment))
}

/// Read the tensor infos, checking names, ranks and dimensions.
fn read_infos(r: &mut Reader<'_>, count: u64, limits: &Limits) -> Result<Vec<Info>> {
    let mut infos = Vec::with_capacity(count as usize);
    let mut names = HashSet::with_capacity(count as usize);
    for _ in 0..count {
        let at = r.pos;
        let name = r.utf8(limits, "GGUF tensor name")?;
        let ctx = r.store.ctx().tensor(&name).at(at);
        if !names.insert(name.clone()) {
            return Err(Error::DuplicateName { ctx });
        }
        let rank = r.u32("GGUF tensor rank")?;
        limits.check_rank(&ctx, rank as usize)?;
        let mut shape = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            let d = r.u64("GGUF tensor dimension")?;
            if d > i64::MAX as u64 {
                return Err(Error::header(
                    ctx,
                    rules::TENSOR_INFO,
                    format!("dimension {d} exceeds INT64_MAX"),
                ));
            }
            shape.push(d);
        }
        shape.reverse();
        let type_id = r.u32("GGUF tensor type")?;
        let offset = r.u64("GGUF tensor offset")?;
        infos.push(Info {
            name,
            shape,
            type_id,
            offset,
            at,
        });
    }
    Ok(infos)
}

/// Turn tensor infos into objects, checking every known tensor's range:
/// aligned, whole blocks, inside the file, overlapping no other.
fn build_objects(
    store: &Arc<Store>,
    infos: Vec<Info>,
    data_start: u64,
    alignment: u64,
    swap: bool,
) -> Result<Vec<Object>> {
    let mut objects = Vec::with_capacity(infos.len());
    let mut ranges: Vec<(u64, u64, usize)> = Vec::with_capacity(infos.len());
    for info in infos {
        let ctx = store.ctx().tensor(&info.name).at(info.at);
        if info.offset % alignment != 0 {
            return Err(Error::range(
                ctx,
                rules::PLACEMENT,
                format!(
                    "offset {} is not a multiple of the alignment {alignment}",
                    info.offset
                ),
            ));
        }
        let start = data_start
            .checked_add(info.offset)
            .ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: ctx.clone(),
                what: "tensor offset",
            })?;
        let elements = num_elements(&info.shape).ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "element count",
        })?;
        let Some(ty) = types::by_id(info.type_id) else {
            store
                .check_range(start, 0, "GGUF tensor data")
                .map_err(|e| e.in_tensor(&info.name))?;
            objects.push(unknown_object(info));
            continue;
        };
        let row = info.shape.last().copied().unwrap_or(1);
        if row % ty.elems_per_block != 0 {
            return Err(Error::range(
                ctx,
                rules::TENSOR_INFO,
                format!(
                    "rows of {row} elements are not whole {} blocks of {}",
                    ty.name, ty.elems_per_block
                ),
            ));
        }
        let len = ty.nbytes(elements).ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "tensor byte size",
        })?;
        store
            .check_range(start, len, "GGUF tensor data")
            .map_err(|e| e.in_tensor(&info.name))?;
        ranges.push((start, start + len, objects.len()));
        objects.push(known_object(store, info, ty, start, len, swap));
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let ((_, end, _), (start, next_end, i)) = (pair[0], pair[1]);
        if start < end {
            return Err(Error::range(
                store.ctx().tensor(&objects[i].name).at(start),
                rules::PLACEMENT,
                format!(
                    "data [{start}, {next_end}) overlaps the previous tensor, which ends at {end}"
                ),
            ));
        }
    }
    Ok(objects)
}

/// The object of a tensor of a known type.
fn known_object(
    store: &Arc<Store>,
    info: Info,
    ty: &'static GgmlType,
    offset: u64,
    len: u64,
    swap: bool,
) -> Object {
    let stored = Payload::Stored {
        store: Arc::clone(store),
        offset,
        len,
    };
    let Some(dtype) = ty.dtype else {
        return Object {
            name: info.name,
            shape: info.shape,
            layout: ty.layout.into(),
            parts: vec![Part {
                name: "data".into(),
                dtype: DType::U8,
                shape: vec![len],
                strides: None,
                payload: stored,
            }],
            attributes: vec![
                ("ggml_type".into(), Value::Int(ty.id.into())),
                (
                    "elems_per_block".into(),
                    Value::Int(ty.elems_per_block as i64),
                ),
                ("block_bytes".into(), Value::Int(ty.block_bytes as i64)),
            ],
        };
    };
    // gguf-py byte-swaps these in big-endian files; BF16 it writes as raw
    // bytes, which stay as they are.
    let width = dtype.size().unwrap_or(1) as usize;
    let payload = if swap && width > 1 && dtype != DType::BF16 {
        Payload::Decoded {
            decoder: Arc::new(ByteSwapped {
                store: Arc::clone(store),
                offset,
                len,
                width,
            }),
            decoded_len: len,
        }
    } else {
        stored
    };
    Object::dense(info.name, dtype, info.shape, payload)
}

/// The object of a tensor whose type id zt does not know: present, named,
/// and failing with a clear error when read.
fn unknown_object(info: Info) -> Object {
    Object {
        name: info.name,
        shape: info.shape,
        layout: UNKNOWN_LAYOUT.into(),
        parts: vec![Part {
            name: "data".into(),
            dtype: DType::U8,
            shape: vec![0],
            strides: None,
            payload: Payload::Decoded {
                decoder: Arc::new(UnknownType { id: info.type_id }),
                decoded_len: 0,
            },
        }],
        attributes: vec![("ggml_type".into(), Value::Int(info.type_id.into()))],
    }
}

/// The payload of a tensor of an unknown ggml type: reading it fails.
#[derive(Debug)]
struct UnknownType {
    id: u32,
}

impl Decode for UnknownType {
    fn decode(&self, _: &Limits) -> Result<Vec<u8>> {
        Err(Error::UnsupportedDType {
            rule: Rule::DTYPE,
            ctx: Context::default(),
            dtype: format!(
                "ggml type {} (unknown to zt; its size cannot be computed)",
                self.id
            ),
        })
    }

    fn describe(&self) -> &'static str {
        "unknown ggml type"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_in_both_orders() {
        assert_eq!(version_of(3), (3, false));
        assert_eq!(version_of(3u32.swap_bytes()), (3, true));
        assert_eq!(vt::by_name("u32"), Some(vt::U32));
        assert_eq!(vt::by_name("array"), None);
    }
}
