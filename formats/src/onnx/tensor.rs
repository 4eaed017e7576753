//! `TensorProto`: parse one tensor message into its dtype, shape and payload.
//!
//! Where the elements are, in the order `onnx.numpy_helper.to_array` looks:
//! external data (`data_location = EXTERNAL`), then `raw_data` (a zero-copy
//! range of the file), then the typed repeated field for the dtype
//! (`float_data`, `int32_data`, ...), which is decoded on demand by
//! [`TypedField`] from the message bytes, never at open.

use crate::onnx::rules;
use std::sync::Arc;
use zt_core::Rule;

use super::external::Externals;
use super::wire::{count_packed_varints, Field, Reader, Wire};
use zt_core::catalog::{Decode, Payload, Value};
use zt_core::dtype::{num_elements, DType};
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

/// `TensorProto` field numbers.
mod field {
    pub const DIMS: u64 = 1;
    pub const DATA_TYPE: u64 = 2;
    pub const SEGMENT: u64 = 3;
    pub const FLOAT_DATA: u64 = 4;
    pub const INT32_DATA: u64 = 5;
    pub const STRING_DATA: u64 = 6;
    pub const INT64_DATA: u64 = 7;
    pub const NAME: u64 = 8;
    pub const RAW_DATA: u64 = 9;
    pub const DOUBLE_DATA: u64 = 10;
    pub const UINT64_DATA: u64 = 11;
    pub const DOC_STRING: u64 = 12;
    pub const EXTERNAL_DATA: u64 = 13;
    pub const DATA_LOCATION: u64 = 14;
}

/// `TensorProto.DataType` value for strings.
const STRING: u64 = 8;

/// The zt dtype of an ONNX `TensorProto.DataType`, or why there is none.
pub fn dtype_of(data_type: u64) -> std::result::Result<DType, String> {
    Ok(match data_type {
        1 => DType::F32,
        2 => DType::U8,
        3 => DType::I8,
        4 => DType::U16,
        5 => DType::I16,
        6 => DType::I32,
        7 => DType::I64,
        9 => DType::Bool,
        10 => DType::F16,
        11 => DType::F64,
        12 => DType::U32,
        13 => DType::U64,
        14 => DType::Complex64,
        15 => DType::Complex128,
        16 => DType::BF16,
        17 => DType::F8E4M3Fn,
        18 => DType::F8E4M3Fnuz,
        19 => DType::F8E5M2,
        20 => DType::F8E5M2Fnuz,
        23 => DType::F4E2M1,
        24 => DType::F8E8M0,
        27 => DType::F6E2M3,
        28 => DType::F6E3M2,
        0 => return Err("onnx UNDEFINED (data_type 0)".into()),
        STRING => return Err("onnx STRING: string tensors are not read by zt".into()),
        21 => DType::U4,
        22 => DType::I4,
        25 => return Err("onnx UINT2: zt has no 2-bit integer dtype".into()),
        26 => return Err("onnx INT2: zt has no 2-bit integer dtype".into()),
        other => return Err(format!("onnx data_type {other}")),
    })
}

/// How the entries of a typed repeated field become stored bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Conv {
    /// `float_data`: 4-byte floats, copied.
    F32,
    /// `double_data`: 8-byte doubles, copied.
    F64,
    /// A varint field kept as its low `n` bytes, little-endian (int64 and
    /// uint64 keep 8; int32 4; 16-bit types 2; 8-bit, bool, fp8 and packed
    /// fp4 pairs 1).
    Low(u8),
    /// fp6 in `int32_data`: one 6-bit code per entry, packed LSB-first as
    /// in `raw_data`.
    Six,
}

/// The typed field that holds `dtype`'s elements, its conversion, and how
/// many entries `elements` elements take there.
fn typed_field(dtype: DType, elements: u64) -> Option<(u64, Conv, u64)> {
    use field::*;
    let twice = elements.checked_mul(2)?;
    Some(match dtype {
        DType::F32 => (FLOAT_DATA, Conv::F32, elements),
        DType::Complex64 => (FLOAT_DATA, Conv::F32, twice),
        DType::F64 => (DOUBLE_DATA, Conv::F64, elements),
        DType::Complex128 => (DOUBLE_DATA, Conv::F64, twice),
        DType::I64 => (INT64_DATA, Conv::Low(8), elements),
        DType::U64 => (UINT64_DATA, Conv::Low(8), elements),
        DType::U32 => (UINT64_DATA, Conv::Low(4), elements),
        DType::I32 => (INT32_DATA, Conv::Low(4), elements),
        DType::I16 | DType::U16 | DType::F16 | DType::BF16 => (INT32_DATA, Conv::Low(2), elements),
        // Two 4-bit elements per entry, already packed into its low byte.
        DType::F4E2M1 | DType::I4 | DType::U4 => (INT32_DATA, Conv::Low(1), elements.div_ceil(2)),
        DType::F6E2M3 | DType::F6E3M2 => (INT32_DATA, Conv::Six, elements),
        _ => (INT32_DATA, Conv::Low(1), elements),
    })
}

/// Everything `TensorProto` says about one tensor, with byte positions
/// rather than bytes.
#[derive(Debug, Default)]
pub struct TensorInfo {
    /// `name`.
    pub name: String,
    /// `dims`, checked non-negative.
    pub dims: Vec<u64>,
    /// `data_type`.
    pub data_type: u64,
    /// `raw_data`: file offset and length.
    raw: Option<(u64, u64)>,
    /// Entries seen per typed field (indexed by field number, 4..=11).
    counts: [u64; 12],
    /// `external_data` entries.
    external: Vec<(String, String)>,
    /// `data_location`.
    location: u64,
    /// `segment` present.
    segment: bool,
    /// `doc_string`.
    pub doc_string: Option<String>,
    /// The message's own range in the file (typed fields are decoded from it).
    msg: (u64, u64),
    /// File offset of the message, for errors.
    at: u64,
}

impl TensorInfo {
    /// Parse a `TensorProto` message.
    pub fn parse(field: &Field<'_>, limits: &Limits) -> Result<TensorInfo> {
        let (bytes, offset) = field.bytes()?;
        let mut info = TensorInfo {
            msg: (offset, bytes.len() as u64),
            at: offset,
            ..TensorInfo::default()
        };
        let mut r = Reader::new(bytes, offset);
        while let Some(f) = r.next_field()? {
            info.take(&f, limits)?;
        }
        Ok(info)
    }

    fn take(&mut self, f: &Field<'_>, limits: &Limits) -> Result<()> {
        use field::*;
        match f.number {
            DIMS => f.for_each_varint(|d| {
                let ctx = Context::default().at(f.at);
                limits.check_rank(&ctx, self.dims.len() + 1)?;
                if d as i64 >= 0 {
                    self.dims.push(d);
                    Ok(())
                } else {
                    Err(Error::header(
                        ctx,
                        rules::TENSOR,
                        format!("negative dimension {}", d as i64),
                    ))
                }
            })?,
            DATA_TYPE => self.data_type = f.varint()?,
            SEGMENT => self.segment = true,
            NAME => self.name = f.string(limits.string_bytes)?,
            DOC_STRING => self.doc_string = Some(f.lossy_string(limits.string_bytes)?),
            RAW_DATA => {
                let (b, off) = f.bytes()?;
                self.raw = Some((off, b.len() as u64));
            }
            DATA_LOCATION => self.location = f.varint()?,
            EXTERNAL_DATA => {
                let ctx = Context::default().at(f.at);
                Limits::check(
                    &ctx,
                    "entries",
                    self.external.len() as u64 + 1,
                    limits.entries,
                )?;
                self.external.push(string_entry(f, limits)?);
            }
            FLOAT_DATA | DOUBLE_DATA => {
                let width = if f.number == FLOAT_DATA { 4 } else { 8 };
                let n = match f.value {
                    Wire::Fixed32(_) if width == 4 => 1,
                    Wire::Fixed64(_) if width == 8 => 1,
                    Wire::Bytes(b, off) if b.len() % width == 0 => {
                        let _ = off;
                        (b.len() / width) as u64
                    }
                    _ => {
                        return Err(f.wrong_wire_for(
                            rules::TENSOR,
                            &format!("packed or single {width}-byte values"),
                        ))
                    }
                };
                self.counts[f.number as usize] += n;
            }
            INT32_DATA | INT64_DATA | UINT64_DATA => {
                let n = match f.value {
                    Wire::Varint(_) => 1,
                    Wire::Bytes(b, off) => count_packed_varints(b, off)?,
                    _ => return Err(f.wrong_wire_for(rules::TENSOR, "varints")),
                };
                self.counts[f.number as usize] += n;
            }
            STRING_DATA => self.counts[STRING_DATA as usize] += 1,
            _ => {}
        }
        Ok(())
    }

    /// True when `data_location` says the bytes are in an external file.
    pub fn is_external(&self) -> bool {
        self.location == 1
    }

    /// True for a STRING tensor, which zt lists as skipped instead of reading.
    pub fn is_string(&self) -> bool {
        self.data_type == STRING
    }

    /// `ctx` naming this tensor's message.
    fn ctx(&self) -> Context {
        Context::default().at(self.at)
    }

    /// Attributes every tensor object carries: the ONNX dims and doc string.
    pub fn attributes(&self) -> Vec<(String, Value)> {
        let dims = self.dims.iter().map(|&d| Value::Int(d as i64)).collect();
        let mut attrs = vec![("dims".to_string(), Value::List(dims))];
        if let Some(doc) = &self.doc_string {
            attrs.push(("doc_string".into(), Value::Str(doc.clone())));
        }
        attrs
    }

    /// The dtype and payload of this tensor's elements.
    pub fn payload(
        &self,
        store: &Arc<Store>,
        ext: &mut Externals<'_>,
        limits: &Limits,
    ) -> Result<(DType, Payload)> {
        let ctx = self.ctx();
        if self.segment {
            return Err(Error::Unsupported {
                rule: rules::UNSUPPORTED,
                ctx,
                reason: "segmented tensors (TensorProto.segment) are not supported".into(),
            });
        }
        let dtype = dtype_of(self.data_type).map_err(|dtype| Error::UnsupportedDType {
            rule: Rule::DTYPE,
            ctx: ctx.clone(),
            dtype,
        })?;
        let overflow = || Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "tensor byte size",
        };
        let elements = num_elements(&self.dims).ok_or_else(overflow)?;
        let nbytes = dtype.nbytes(elements).ok_or_else(overflow)?;
        if self.location == 1 {
            let (store, offset) = ext.resolve(&self.external, nbytes, &ctx)?;
            return Ok((
                dtype,
                Payload::Stored {
                    store,
                    offset,
                    len: nbytes,
                },
            ));
        }
        if let Some((offset, len)) = self.raw {
            if len != nbytes {
                return Err(Error::range(
                    ctx.at(offset),
                    rules::SIZE,
                    format!("raw_data holds {len} bytes; {elements} x {dtype} needs {nbytes}"),
                ));
            }
            let store = Arc::clone(store);
            return Ok((dtype, Payload::Stored { store, offset, len }));
        }
        let (number, conv, entries) = typed_field(dtype, elements).ok_or_else(overflow)?;
        let found = self.counts[number as usize];
        if found != entries {
            return Err(Error::range(
                ctx,
                rules::SIZE,
                format!(
                    "{} x {dtype} needs {entries} entries in field {number}, the tensor has {found}",
                    elements
                ),
            ));
        }
        limits.check_decoded(&ctx, nbytes)?;
        let decoder = TypedField {
            store: Arc::clone(store),
            msg: self.msg,
            number,
            conv,
            len: nbytes,
        };
        Ok((
            dtype,
            Payload::Decoded {
                decoder: Arc::new(decoder),
                decoded_len: nbytes,
            },
        ))
    }
}

/// A `StringStringEntryProto` (`key` 1, `value` 2).
pub fn string_entry(f: &Field<'_>, limits: &Limits) -> Result<(String, String)> {
    let mut r = f.message()?;
    let (mut key, mut value) = (String::new(), String::new());
    while let Some(e) = r.next_field()? {
        match e.number {
            1 => key = e.lossy_string(limits.string_bytes)?,
            2 => value = e.lossy_string(limits.string_bytes)?,
            _ => {}
        }
    }
    Ok((key, value))
}

/// Elements held in a typed repeated field of a `TensorProto`, decoded on
/// demand by re-reading the message from the file.
#[derive(Debug)]
struct TypedField {
    store: Arc<Store>,
    /// The `TensorProto` message's file range.
    msg: (u64, u64),
    /// The field to read.
    number: u64,
    conv: Conv,
    /// Bytes the elements take once stored.
    len: u64,
}

impl TypedField {
    fn push(&self, out: &mut Vec<u8>, six: &mut SixPacker, f: &Field<'_>) -> Result<()> {
        match (self.conv, f.value) {
            (Conv::F32, Wire::Fixed32(v)) => out.extend_from_slice(&v.to_le_bytes()),
            (Conv::F64, Wire::Fixed64(v)) => out.extend_from_slice(&v.to_le_bytes()),
            (Conv::F32 | Conv::F64, Wire::Bytes(b, _)) => out.extend_from_slice(b),
            (Conv::Low(n), _) => {
                f.for_each_varint(|v| {
                    out.extend_from_slice(&v.to_le_bytes()[..n as usize]);
                    Ok(())
                })?;
            }
            (Conv::Six, _) => f.for_each_varint(|v| {
                six.push(out, v as u8 & 0x3f);
                Ok(())
            })?,
            _ => {
                return Err(Error::Decode {
                    rule: rules::PROTOBUF,
                    ctx: Context::default().at(f.at),
                    reason: format!("field {} changed wire type", f.number),
                })
            }
        }
        // Entries were counted at open; a store that changed since is caught here.
        if out.len() as u64 > self.len {
            return Err(Error::Decode {
                rule: rules::SIZE,
                ctx: Context::default().at(f.at),
                reason: format!("field {} holds more than {} bytes", f.number, self.len),
            });
        }
        Ok(())
    }
}

impl Decode for TypedField {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let (offset, len) = self.msg;
        limits.check_decoded(&self.store.ctx().at(offset), self.len)?;
        let bytes = self.store.read(offset, len)?;
        let mut out = Vec::with_capacity(self.len as usize);
        let mut six = SixPacker::default();
        let mut r = Reader::new(&bytes, offset);
        while let Some(f) = r.next_field()? {
            if f.number == self.number {
                self.push(&mut out, &mut six, &f)?;
            }
        }
        six.finish(&mut out);
        Ok(out)
    }

    fn describe(&self) -> &'static str {
        "protobuf typed field"
    }
}

/// Packs 6-bit codes LSB-first into bytes (ONNX's `raw_data` layout for
/// FLOAT6E2M3 / FLOAT6E3M2).
#[derive(Debug, Default)]
struct SixPacker {
    acc: u32,
    bits: u32,
}

impl SixPacker {
    fn push(&mut self, out: &mut Vec<u8>, code: u8) {
        self.acc |= u32::from(code) << self.bits;
        self.bits += 6;
        while self.bits >= 8 {
            out.push(self.acc as u8);
            self.acc >>= 8;
            self.bits -= 8;
        }
    }

    fn finish(self, out: &mut Vec<u8>) {
        if self.bits > 0 {
            out.push(self.acc as u8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_bit_packing_matches_onnx() {
        // byte0 = x0 | ((x1 & 0x3) << 6); byte1 = (x1 >> 2) | ((x2 & 0xF) << 4);
        // byte2 = (x2 >> 4) | (x3 << 2)
        let (x0, x1, x2, x3) = (0x21u8, 0x3f, 0x15, 0x2a);
        let mut out = Vec::new();
        let mut p = SixPacker::default();
        for x in [x0, x1, x2, x3, 0x01] {
            p.push(&mut out, x);
        }
        p.finish(&mut out);
        assert_eq!(
            out,
            vec![
                x0 | ((x1 & 3) << 6),
                (x1 >> 2) | ((x2 & 0xf) << 4),
                (x2 >> 4) | (x3 << 2),
                1
            ]
        );
        assert_eq!(out.len() as u64, DType::F6E2M3.nbytes(5).unwrap());
    }

    #[test]
    fn every_dtype_has_a_field() {
        for code in 0..40 {
            if let Ok(d) = dtype_of(code) {
                let (_, _, n) = typed_field(d, 3).unwrap();
                assert!(n >= 2);
            }
        }
        assert!(dtype_of(STRING).is_err());
    }
}
