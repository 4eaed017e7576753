//! The `.zt` plugin: a thin adapter from the [`Format`] registry to the
//! zTensor v2 reader in [`crate::zt`], and the [`ZtWriter`] for conversion.

use std::path::Path;

use crate::catalog::Catalog;
use crate::error::Result;
use crate::format::{Format, OpenInput, Probe};
use crate::source::Source;
use crate::write::{FormatWriter, WriteOptions};
use crate::zt::container::MAGIC;

/// zTensor v2 files.
pub struct Zt;

/// The zTensor v2 magic.
pub const ZT_MAGIC: &[u8; 8] = MAGIC;

fn u32_le(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_le(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

impl Format for Zt {
    fn name(&self) -> &'static str {
        "zt"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["zt"]
    }

    /// The magic at both ends and a footer whose manifest range lies inside
    /// the file.
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
        crate::zt::read::open(input.store, input.limits)
    }
}

/// Writes `.zt`: canonical by default, or placed by `WriteOptions::align`
/// and compressed with `zt.zstd-seekable/1` when `compression` is set.
pub struct ZtWriter;

impl FormatWriter for ZtWriter {
    fn name(&self) -> &'static str {
        "zt"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["zt"]
    }

    fn write(&self, source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
        crate::zt::write::convert(source, path, options)
    }
}
