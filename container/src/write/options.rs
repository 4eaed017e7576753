//! How a `.zt` writer places blobs and what it promises.

use crate::container::{CANONICAL_ALIGN, FLOOR};
use zt_core::error::{Context, Error, Result};
use zt_core::write::{Align, WriteOptions};
use zt_core::Rule;

/// Blobs at least this long go to 64 KiB boundaries under `align="auto"`.
///
/// At 1 MiB the worst-case extra padding of 64 KiB over 4 KiB placement is
/// under 6% of the blob; below it, small tensors pack at the 4 KiB floor
/// (measured: 50,000 tensors of 10 KiB take 1.20x their payload with auto,
/// 6.4x with 64 KiB placement).
pub const AUTO_THRESHOLD: u64 = 1 << 20;

/// Default zstd level for `zt.zstd-seekable/1`.
pub const DEFAULT_LEVEL: i32 = 3;

/// How a writer places blobs and what it promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Canonical form (§6.3): sorted NFC names, raw parts, 64 KiB placement.
    pub canonical: bool,
    /// Placement when not canonical (`Align::Canonical` means 64 KiB).
    pub align: Align,
    /// Make the published file durable: fsync it before the rename and its
    /// directory after. (Every new file is built beside its destination
    /// and renamed into place on `finish`, with or without this.)
    pub publish: bool,
    /// Amend an existing file (§2.5) instead of creating one.
    pub append: bool,
    /// zstd level for every part (`None`: raw, unless a part asks).
    pub compression: Option<i32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            canonical: true,
            align: Align::Canonical,
            publish: false,
            append: false,
            compression: None,
        }
    }
}

impl Options {
    /// The options `convert` and `save_file` use for `WriteOptions`:
    /// canonical unless an alignment other than canonical or compression is
    /// asked for (then `auto` unless a number is given); durable
    /// (`publish`: fsync of the file before its rename, of the directory
    /// after), as every zt writer's output is, unless the caller syncs
    /// (`defer_sync`: a sharded checkpoint's shards, synced together).
    pub fn from_write_options(o: &WriteOptions) -> Options {
        let canonical = matches!(o.align, None | Some(Align::Canonical)) && o.compression.is_none();
        let align = match o.align {
            Some(a) if !canonical => a,
            None if !canonical => Align::Auto,
            _ => Align::Canonical,
        };
        Options {
            canonical,
            align: if canonical { Align::Canonical } else { align },
            compression: o.compression,
            publish: !o.defer_sync,
            ..Options::default()
        }
    }

    pub(super) fn check(&self, ctx: &Context) -> Result<()> {
        let bad = |reason: &str| Error::Write {
            rule: Rule::WRITE_OPTIONS,
            ctx: ctx.clone(),
            reason: reason.into(),
        };
        if let Align::Bytes(n) = self.align {
            if n < FLOOR || !n.is_power_of_two() {
                return Err(bad("align must be a power of two of at least 4096"));
            }
            if self.canonical && n != CANONICAL_ALIGN {
                return Err(bad("canonical form places blobs at 65536; pass canonical=False for another alignment"));
            }
        }
        if self.canonical && self.align == Align::Auto {
            return Err(bad("align=\"auto\" is not canonical; pass canonical=False"));
        }
        if self.canonical && self.compression.is_some() {
            return Err(bad(
                "canonical form stores raw parts; pass canonical=False to compress",
            ));
        }
        if self.canonical && self.append {
            return Err(bad(
                "an appended file is not canonical; pass canonical=False",
            ));
        }
        if self.publish && self.append {
            return Err(bad(
                "append amends the file in place; it cannot also publish",
            ));
        }
        Ok(())
    }

    /// The alignment for a blob of `len` bytes.
    pub(super) fn align_for(&self, len: u64) -> u64 {
        match self.align {
            Align::Canonical => CANONICAL_ALIGN,
            Align::Bytes(n) => n,
            Align::Auto if len >= AUTO_THRESHOLD => CANONICAL_ALIGN,
            Align::Auto => FLOOR,
        }
    }

    /// The alignment of the manifest blob.
    pub(super) fn manifest_align(&self) -> u64 {
        match self.align {
            Align::Auto => FLOOR,
            _ => self.align_for(0),
        }
    }
}

pub(super) fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}
