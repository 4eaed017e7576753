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
