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
