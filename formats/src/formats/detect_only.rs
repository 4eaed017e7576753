//! Formats zt recognises by structure but cannot read yet (their readers
//! arrive in later issues). `open` says so with [`Error::Unreadable`], so
//! `zt.detect` can already name them.

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::format::{Format, OpenInput, Probe};

fn unreadable(input: &OpenInput<'_>, format: &'static str) -> Result<Catalog> {
    Err(Error::Unreadable {
        ctx: input.ctx(),
        format,
    })
}

fn u32_le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// zTensor v2: the magic at both ends and a footer whose manifest range
/// lies inside the file.
pub struct Zt;

/// The zTensor v2 magic.
pub const ZT_MAGIC: &[u8; 8] = b"\x89ZT2\r\n\x1a\n";

impl Format for Zt {
    fn name(&self) -> &'static str {
        "zt"
    }
    fn extensions(&self) -> &'static [&'static str] {
        &["zt"]
    }
    fn sniff(&self, p: &Probe<'_>) -> bool {
        if p.len < 48 || !p.head.starts_with(ZT_MAGIC) || !p.tail.ends_with(ZT_MAGIC) {
            return false;
        }
        let f = &p.tail[p.tail.len() - 40..];
        let (Some(off), Some(len), Some(version)) = (u64_le(f, 0), u64_le(f, 8), u32_le(f, 24))
        else {
            return false;
        };
        version == 2 && off.checked_add(len).is_some_and(|end| end <= p.len - 40)
    }
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        unreadable(input, "zt")
    }
}

/// HDF5: the signature at 0 or at a userblock boundary (512, 1024, ...),
/// followed by a superblock version 0-3.
pub struct Hdf5;

const HDF5_SIGNATURE: &[u8; 8] = b"\x89HDF\r\n\x1a\n";

impl Format for Hdf5 {
    fn name(&self) -> &'static str {
        "h5"
    }
    fn extensions(&self) -> &'static [&'static str] {
        &["h5", "hdf5", "keras"]
    }
    fn sniff(&self, p: &Probe<'_>) -> bool {
        let mut at = 0usize;
        loop {
            match p.head.get(at..at + 9) {
                Some(b) if &b[..8] == HDF5_SIGNATURE => return b[8] <= 3,
                Some(_) => {}
                None => return false,
            }
            at = if at == 0 { 512 } else { at * 2 };
        }
    }
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        unreadable(input, "h5")
    }
}

/// ONNX: a protobuf `ModelProto`. Protobuf has no magic, so the top-level
/// fields at the head of the file must all be `ModelProto` fields with their
/// right wire types and lengths that fit, starting with `ir_version`.
pub struct Onnx;

/// `ModelProto` field numbers and wire types (0 varint, 2 length-delimited).
fn model_proto_wire_type(field: u64) -> Option<u8> {
    match field {
        1 | 5 => Some(0),                                     // ir_version, model_version
        2 | 3 | 4 | 6 | 7 | 8 | 14 | 20 | 25 | 26 => Some(2), // strings, graph, opsets, ...
        _ => None,
    }
}

fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

impl Format for Onnx {
    fn name(&self) -> &'static str {
        "onnx"
    }
    fn extensions(&self) -> &'static [&'static str] {
        &["onnx"]
    }
    fn sniff(&self, p: &Probe<'_>) -> bool {
        let (mut at, mut fields, mut saw_ir_version) = (0usize, 0, false);
        while at < p.head.len() && fields < 64 {
            let Some(tag) = varint(p.head, &mut at) else {
                return false;
            };
            let (field, wire) = (tag >> 3, (tag & 7) as u8);
            if model_proto_wire_type(field) != Some(wire) {
                return false;
            }
            let Some(value) = varint(p.head, &mut at) else {
                return false;
            };
            if field == 1 {
                saw_ir_version = (1..=64).contains(&value);
            }
            if fields == 0 && field != 1 && p.extension != "onnx" {
                return false;
            }
            if wire == 2 {
                match (at as u64).checked_add(value) {
                    Some(end) if end <= p.len => at = end as usize,
                    _ => return false,
                }
            }
            fields += 1;
        }
        fields > 0 && (saw_ir_version || p.extension == "onnx")
    }
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        unreadable(input, "onnx")
    }
}
