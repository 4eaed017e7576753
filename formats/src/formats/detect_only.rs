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
