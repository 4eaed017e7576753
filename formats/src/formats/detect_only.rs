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

/// PyTorch checkpoints: a zip whose entries include `<dir>/data.pkl`, or the
/// legacy pickle stream that starts with torch's magic number.
pub struct Pt;

/// `PROTO 2`, `LONG1` of 10 bytes, then torch's magic 0x1950a86a20f9469cfc6c.
const PT_LEGACY_MAGIC: &[u8] = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";

impl Format for Pt {
    fn name(&self) -> &'static str {
        "pt"
    }
    fn extensions(&self) -> &'static [&'static str] {
        &["pt", "pth", "bin", "ckpt"]
    }
    fn sniff(&self, p: &Probe<'_>) -> bool {
        if p.head.starts_with(PT_LEGACY_MAGIC) {
            return true;
        }
        if !p.head.starts_with(b"PK\x03\x04") {
            return false;
        }
        // torch writes `<dir>/data.pkl` as the first record; check the first
        // local header's name, then the central directory in the tail.
        let name_len = p
            .head
            .get(26..28)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
        let first = name_len.and_then(|n| p.head.get(30..30 + n));
        let is_pkl = |name: &[u8]| name == b"data.pkl" || name.ends_with(b"/data.pkl");
        first.is_some_and(is_pkl) || p.tail.windows(9).any(|w| w == b"/data.pkl")
    }
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        unreadable(input, "pt")
    }
}

/// GGUF: `GGUF`, a version of 1-3 in either byte order, and tensor / KV
/// counts that could fit in the file.
pub struct Gguf;

impl Format for Gguf {
    fn name(&self) -> &'static str {
        "gguf"
    }
    fn extensions(&self) -> &'static [&'static str] {
        &["gguf"]
    }
    fn sniff(&self, p: &Probe<'_>) -> bool {
        if !p.head.starts_with(b"GGUF") {
            return false;
        }
        let Some(v) = u32_le(p.head, 4) else {
            return false;
        };
        let big_endian = !(1..=3).contains(&v);
        let version = if big_endian { v.swap_bytes() } else { v };
        if !(1..=3).contains(&version) {
            return false;
        }
        if version == 1 {
            return true;
        }
        let read = |at| u64_le(p.head, at).map(|x| if big_endian { x.swap_bytes() } else { x });
        match (read(8), read(16)) {
            // Each tensor info and each KV pair takes at least 8 bytes.
            (Some(tensors), Some(kvs)) => tensors.saturating_add(kvs).saturating_mul(8) <= p.len,
            _ => false,
        }
    }
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        unreadable(input, "gguf")
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
