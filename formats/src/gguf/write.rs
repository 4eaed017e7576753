//! The GGUF writer: version 3, little-endian, laid out as gguf-py's
//! `GGUFWriter` lays files out (header, KV pairs, tensor infos, padding to
//! the alignment, then each tensor padded to the alignment), so a GGUF file
//! that gguf-py wrote comes back byte for byte.
//!
//! Metadata comes from the source's file attributes. Each key keeps the
//! GGUF type `GGUF.types` records for it when the value still fits that
//! type; other values get a type from their shape (bool, i32 or i64, u64,
//! f64, string, arrays of one element type; a map becomes dotted keys).
//! The `GGUF.*` attributes zt adds when reading are not written as keys.
//!
//! Tensors: dense tensors of the plain ggml types (F64 F32 F16 BF16 I64 I32
//! I16 I8) and `gguf.<type>/1` objects, whose block bytes are written
//! verbatim; MLX affine 4-bit group-32 weights (an MLX `config.json`
//! beside the source) as Q4_1 blocks, repacked without going through
//! floats (`quant::mlx::repack`). Anything else is refused with
//! [`Error::Write`] naming it.

use std::io::Write;
use std::path::Path;
use zt_core::Rule;

use zt_core::catalog::Value;
use zt_core::error::{Context, Error, Result};
use zt_core::inputs::{Bytes, InputMeta, Inputs, SourceInputs};
use zt_core::publish::publish_reading;
#[cfg(doc)]
use zt_core::write::WriterCaps;
use zt_core::write::{FormatWriter, WriteOptions};
use zt_core::{PartRef, Source};

use super::types::{self, GgmlType};
use super::{vt, ATTR_TYPES, DEFAULT_ALIGNMENT, MAGIC};

/// The GGUF [`FormatWriter`].
pub struct GgufWriter;

impl FormatWriter for GgufWriter {
    fn name(&self) -> &'static str {
        "gguf"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["gguf"]
    }

    /// GGUF's block types are written as they are stored, so this is no
    /// dense adapter. Written by conversion only ([`WriterCaps::DENSE`]:
    /// no options, no metadata from arrays).
    fn write(&self, source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
        write_synced(source, path, options.syncs())
    }

    /// Streams: each tensor read as it is written.
    fn reads_ahead(&self) -> bool {
        true
    }
}

/// One tensor as it will be written.
struct Planned<'a> {
    name: &'a str,
    /// GGUF order: innermost dimension first.
    dims: Vec<u64>,
    ty: &'static GgmlType,
    part: PartRef<'a>,
    len: u64,
}

/// Write every tensor and attribute of `source` as a GGUF v3 file at
/// `path` (built beside it, renamed into place). Returns the bytes written.
pub fn write(source: &Source, path: &Path) -> Result<u64> {
    write_synced(source, path, true)
}

/// [`write`], fsynced before its rename only when `durable`.
fn write_synced(source: &Source, path: &Path, durable: bool) -> Result<u64> {
    // MLX affine 4-bit weights (declared by the config.json beside the
    // source) are Q4_1 blocks: repacked, not refused as u32 tensors.
    let repacked = crate::quant::mlx::repack::to_q4_1(source)?;
    let source = repacked.as_ref().unwrap_or(source);
    let ctx = Context::file(path);
    let kvs = metadata(source, &ctx)?;
    let alignment = alignment(&kvs, &ctx)?;
    let tensors = plan(source, &ctx)?;

    let mut header = Vec::new();
    header.extend_from_slice(MAGIC);
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    header.extend_from_slice(&(kvs.len() as u64).to_le_bytes());
    for (key, t, value) in &kvs {
        put_str(&mut header, key.as_bytes());
        header.extend_from_slice(&t.code().to_le_bytes());
        put_value(&mut header, t, value);
    }
    let mut offset = 0u64;
    for t in &tensors {
        put_str(&mut header, t.name.as_bytes());
        header.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            header.extend_from_slice(&d.to_le_bytes());
        }
        header.extend_from_slice(&t.ty.id.to_le_bytes());
        header.extend_from_slice(&offset.to_le_bytes());
        offset = offset
            .checked_add(padded(t.len, alignment))
            .ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: ctx.clone(),
                what: "GGUF data size",
            })?;
    }
    let pad = padded(header.len() as u64, alignment) - header.len() as u64;
    header.resize(header.len() + pad as usize, 0);

    // One tensor's bytes at a time, read ahead a window at a time and each
    // one's mapped pages released once written, so a conversion holds a
    // tensor and a window, not the source.
    let inputs = SourceInputs::from_parts(
        source,
        tensors.iter().enumerate().map(|(object, t)| {
            let meta = InputMeta {
                name: t.name,
                dtype: t.part.dtype(),
                shape: t.part.shape(),
            };
            (object, meta, t.part, Bytes::Elements)
        }),
    );
    publish_reading(path, durable, |w| {
        let io = |e| Error::io(path, e);
        w.write_all(&header).map_err(io)?;
        for (i, t) in tensors.iter().enumerate() {
            let bytes = inputs.bytes(i)?;
            w.write_all(&bytes).map_err(io)?;
            drop(bytes);
            inputs.release(i);
            let pad = padded(t.len, alignment) - t.len;
            w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
        }
        Ok(())
    })
}

fn padded(n: u64, alignment: u64) -> u64 {
    n.div_ceil(alignment) * alignment
}

/// Check every tensor can be written and work out its GGUF description.
fn plan<'a>(source: &'a Source, ctx: &Context) -> Result<Vec<Planned<'a>>> {
    source
        .tensors()
        .map(|t| {
            let refuse = |reason: String| Error::Write {
                rule: Rule::WRITE_DTYPE,
                ctx: ctx.clone().tensor(t.name()),
                reason,
            };
            let part = t.data()?;
            let ty = if t.layout() == "dense" {
                types::by_dtype(part.dtype())
                    .ok_or_else(|| refuse(format!("GGUF has no {} type", part.dtype())))?
            } else {
                types::by_layout(t.layout()).ok_or_else(|| {
                    refuse(format!("layout {} has no GGUF equivalent", t.layout()))
                })?
            };
            let shape = t.shape();
            if shape.len() > 4 {
                return Err(refuse(format!(
                    "{} dimensions; GGUF readers (ggml) take at most 4",
                    shape.len()
                )));
            }
            let elements = zt_core::dtype::num_elements(shape).unwrap_or(u64::MAX);
            let row = shape.last().copied().unwrap_or(1);
            let len = ty
                .nbytes(elements)
                .filter(|_| row % ty.elems_per_block == 0)
                .ok_or_else(|| {
                    refuse(format!(
                        "shape {shape:?} is not whole rows of {} blocks",
                        ty.name
                    ))
                })?;
            if len != part.nbytes() {
                return Err(refuse(format!(
                    "shape {shape:?} of {} needs {len} bytes, the tensor has {}",
                    ty.name,
                    part.nbytes()
                )));
            }
            Ok(Planned {
                name: t.name(),
                dims: shape.iter().rev().copied().collect(),
                ty,
                part,
                len,
            })
        })
        .collect()
}

/// A GGUF value type: a scalar code, or an array of an element type.
#[derive(Debug, Clone, PartialEq)]
enum Ty {
    Scalar(u32),
    Array(Box<Ty>),
    /// An array of arrays, each with its own type.
    Arrays(Vec<Ty>),
}

impl Ty {
    fn code(&self) -> u32 {
        match self {
            Ty::Scalar(c) => *c,
            Ty::Array(_) | Ty::Arrays(_) => vt::ARRAY,
        }
    }

    fn is_array(&self) -> bool {
        matches!(self, Ty::Array(_) | Ty::Arrays(_))
    }

    /// The type `GGUF.types` describes, if the description is well formed.
    fn from_desc(desc: &Value) -> Option<Ty> {
        match desc {
            Value::Str(s) => match s.strip_prefix("array[").and_then(|r| r.strip_suffix(']')) {
                Some(inner) => Some(Ty::Array(Box::new(Ty::Scalar(vt::by_name(inner)?)))),
                None => Some(Ty::Scalar(vt::by_name(s)?)),
            },
            Value::List(items) => items
                .iter()
                .map(|d| Ty::from_desc(d).filter(Ty::is_array))
                .collect::<Option<Vec<_>>>()
                .map(Ty::Arrays),
            _ => None,
        }
    }

    /// Does `value` fit this type exactly (no value changes when written)?
    fn fits(&self, value: &Value) -> bool {
        match (self, value) {
            (Ty::Scalar(c), v) => scalar_fits(*c, v),
            (Ty::Array(elem), Value::List(items)) => items.iter().all(|v| elem.fits(v)),
            (Ty::Array(elem), Value::Bytes(b)) => **elem == Ty::Scalar(vt::U8) || b.is_empty(),
            (Ty::Arrays(tys), Value::List(items)) => {
                tys.len() == items.len() && tys.iter().zip(items).all(|(t, v)| t.fits(v))
            }
            _ => false,
        }
    }

    /// A type for a value with no recorded type.
    fn infer(value: &Value) -> Option<Ty> {
        Some(match value {
            Value::Bool(_) => Ty::Scalar(vt::BOOL),
            Value::Int(i) if i32::try_from(*i).is_ok() => Ty::Scalar(vt::I32),
            Value::Int(_) => Ty::Scalar(vt::I64),
            Value::UInt(_) => Ty::Scalar(vt::U64),
            Value::Float(_) => Ty::Scalar(vt::F64),
            Value::Str(_) => Ty::Scalar(vt::STRING),
            Value::Bytes(_) => Ty::Array(Box::new(Ty::Scalar(vt::U8))),
            Value::List(items) => {
                let tys = items.iter().map(Ty::infer).collect::<Option<Vec<_>>>()?;
                // An array of arrays holds arrays only.
                if tys.iter().any(Ty::is_array) {
                    return tys.iter().all(Ty::is_array).then_some(Ty::Arrays(tys));
                }
                // Integers widen to the widest any element needs.
                let elem = tys.iter().fold(None::<Ty>, |acc, t| match acc {
                    None => Some(t.clone()),
                    Some(a) if a == *t => Some(a),
                    Some(Ty::Scalar(vt::I32)) if *t == Ty::Scalar(vt::I64) => Some(t.clone()),
                    Some(Ty::Scalar(vt::I64)) if *t == Ty::Scalar(vt::I32) => acc,
                    _ => Some(Ty::Scalar(u32::MAX)),
                });
                let elem = elem.unwrap_or(Ty::Scalar(vt::I32));
                if elem == Ty::Scalar(u32::MAX) {
                    return None;
                }
                Ty::Array(Box::new(elem))
            }
            Value::Null | Value::Map(_) => return None,
        })
    }
}

fn scalar_fits(code: u32, v: &Value) -> bool {
    match (code, v) {
        (vt::BOOL, Value::Bool(_)) => true,
        (vt::U8, Value::Int(i)) => u8::try_from(*i).is_ok(),
        (vt::I8, Value::Int(i)) => i8::try_from(*i).is_ok(),
        (vt::U16, Value::Int(i)) => u16::try_from(*i).is_ok(),
        (vt::I16, Value::Int(i)) => i16::try_from(*i).is_ok(),
        (vt::U32, Value::Int(i)) => u32::try_from(*i).is_ok(),
        (vt::I32, Value::Int(i)) => i32::try_from(*i).is_ok(),
        (vt::U64, Value::Int(i)) => *i >= 0,
        (vt::U64, Value::UInt(_)) => true,
        (vt::I64, Value::Int(_)) => true,
        (vt::F32, Value::Float(f)) => f64::from(*f as f32).to_bits() == f.to_bits() || f.is_nan(),
        (vt::F64, Value::Float(_)) => true,
        (vt::STRING, Value::Str(_) | Value::Bytes(_)) => true,
        _ => false,
    }
}

/// The KV pairs to write: the source's attributes minus zt's own, maps
/// flattened to dotted keys, each with its type.
fn metadata(source: &Source, ctx: &Context) -> Result<Vec<(String, Ty, Value)>> {
    let recorded: Vec<(String, Value)> = source
        .attributes()
        .iter()
        .find(|(k, _)| k == ATTR_TYPES)
        .and_then(|(_, v)| match v {
            Value::Map(m) => Some(m.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let mut flat = Vec::new();
    for (key, value) in source.attributes() {
        if key.starts_with("GGUF.") {
            continue;
        }
        flatten(key.clone(), value, &mut flat);
    }
    let mut seen = std::collections::HashSet::new();
    flat.into_iter()
        .map(|(key, value)| {
            if !seen.insert(key.clone()) {
                return Err(Error::Write {
                    rule: Rule::WRITE_METADATA,
                    ctx: ctx.clone(),
                    reason: format!("metadata key {key:?} appears twice"),
                });
            }
            let kept = recorded
                .iter()
                .find(|(k, _)| *k == key)
                .and_then(|(_, d)| Ty::from_desc(d))
                .filter(|t| t.fits(&value));
            let ty = kept
                .or_else(|| Ty::infer(&value))
                .ok_or_else(|| Error::Write {
                    rule: Rule::WRITE_METADATA,
                    ctx: ctx.clone(),
                    reason: format!("metadata {key:?} = {value:?} has no GGUF type"),
                })?;
            Ok((key, ty, value))
        })
        .collect()
}

fn flatten(key: String, value: &Value, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Map(entries) => {
            for (k, v) in entries {
                flatten(format!("{key}.{k}"), v, out);
            }
        }
        other => out.push((key, other.clone())),
    }
}

/// `general.alignment` when the metadata sets it, else 32.
fn alignment(kvs: &[(String, Ty, Value)], ctx: &Context) -> Result<u64> {
    match kvs.iter().find(|(k, _, _)| k == "general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, Ty::Scalar(vt::U32), Value::Int(a))) if (*a as u64).is_power_of_two() => {
            Ok(*a as u64)
        }
        Some((_, _, v)) => Err(Error::Write {
            rule: Rule::WRITE_OPTIONS,
            ctx: ctx.clone(),
            reason: format!("general.alignment must be a u32 power of two, not {v:?}"),
        }),
    }
}

fn put_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s);
}

/// Append `value` as type `ty` (checked by `Ty::fits` or built by
/// `Ty::infer`, so every conversion here is exact).
fn put_value(out: &mut Vec<u8>, ty: &Ty, value: &Value) {
    match (ty, value) {
        (Ty::Scalar(code), v) => put_scalar(out, *code, v),
        (Ty::Array(elem), Value::Bytes(b)) => {
            out.extend_from_slice(&elem.code().to_le_bytes());
            out.extend_from_slice(&(b.len() as u64).to_le_bytes());
            out.extend_from_slice(b);
        }
        (Ty::Array(elem), Value::List(items)) => {
            out.extend_from_slice(&elem.code().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, elem, item);
            }
        }
        (Ty::Arrays(tys), Value::List(items)) => {
            out.extend_from_slice(&vt::ARRAY.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            // Each element is an array body: its own element type, count
            // and items (the outer array already said ARRAY).
            for (t, item) in tys.iter().zip(items) {
                put_value(out, t, item);
            }
        }
        _ => {}
    }
}

fn put_scalar(out: &mut Vec<u8>, code: u32, v: &Value) {
    let int = match v {
        Value::Int(i) => *i,
        Value::UInt(u) => *u as i64,
        Value::Bool(b) => i64::from(*b),
        _ => 0,
    };
    match code {
        vt::U8 | vt::I8 | vt::BOOL => out.push(int as u8),
        vt::U16 | vt::I16 => out.extend_from_slice(&(int as u16).to_le_bytes()),
        vt::U32 | vt::I32 => out.extend_from_slice(&(int as u32).to_le_bytes()),
        vt::U64 | vt::I64 => out.extend_from_slice(&(int as u64).to_le_bytes()),
        vt::F32 | vt::F64 => {
            let f = if let Value::Float(f) = v { *f } else { 0.0 };
            if code == vt::F32 {
                out.extend_from_slice(&(f as f32).to_le_bytes());
            } else {
                out.extend_from_slice(&f.to_le_bytes());
            }
        }
        vt::STRING => match v {
            Value::Str(s) => put_str(out, s.as_bytes()),
            Value::Bytes(b) => put_str(out, b),
            _ => put_str(out, b""),
        },
        _ => {}
    }
}
