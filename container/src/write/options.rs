//! How a `.zt` writer places blobs and what it promises, and the options a
//! request carries for it ([`ZtOptions`]).

use std::any::Any;
use std::str::FromStr;

use crate::container::{CANONICAL_ALIGN, FLOOR};
use zt_core::error::{Context, Error, Result};
use zt_core::write::{FormatOption, FormatOptions, WriteOptions};
use zt_core::Rule;

/// Where a `.zt` writer places blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Canonical zTensor placement (64 KiB, byte-reproducible output).
    Canonical,
    /// Large tensors at 64 KiB, small ones at the 4 KiB floor.
    Auto,
    /// Every blob at a multiple of this power of two (at least 4096).
    Bytes(u64),
}

impl FromStr for Align {
    type Err = String;

    /// `"canonical"`, `"auto"`, or a number of bytes (the writer checks
    /// that it is a power of two of at least 4096). One parser for the
    /// CLI's `--align` and Python's `align=`.
    fn from_str(text: &str) -> std::result::Result<Align, String> {
        match text {
            "canonical" => Ok(Align::Canonical),
            "auto" => Ok(Align::Auto),
            n => n
                .parse()
                .map(Align::Bytes)
                .map_err(|_| format!("align {n:?}: expected canonical, auto or a number of bytes")),
        }
    }
}

/// The `.zt` option `align` ([`ZtOptions::align`]), by the name the CLI,
/// Python and the writer's caps give it.
pub const OPTION_ALIGN: &str = "align";
/// The `.zt` option `compression` ([`ZtOptions::compression`]).
pub const OPTION_COMPRESSION: &str = "compression";

/// The `.zt` writer's options as a request carries them: a typed value the
/// `.zt` plugin owns, in `WriteOptions::format` (set with
/// `WriteOptions::with_format`; the CLI's `--align`/`--compress` and
/// Python's `align=`/`compression=` build it for any destination). The
/// registry's `check_request` refuses each one set for a writer whose caps
/// do not list it (`write.Options`), as for any format's options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZtOptions {
    /// Blob placement; `None` is the writer's default (canonical).
    pub align: Option<Align>,
    /// zstd compression level; `None` is raw.
    pub compression: Option<i32>,
}

impl ZtOptions {
    /// The `.zt` options `options` carries (none set when it carries none).
    pub fn of(options: &WriteOptions) -> ZtOptions {
        options
            .format_options::<ZtOptions>()
            .copied()
            .unwrap_or_default()
    }
}

impl FormatOptions for ZtOptions {
    fn requested(&self) -> Vec<FormatOption> {
        let mut set = Vec::new();
        if self.align.is_some() {
            set.push(FormatOption {
                name: OPTION_ALIGN,
                what: "alignment",
                hint: "; use .zt",
            });
        }
        if self.compression.is_some() {
            set.push(FormatOption {
                name: OPTION_COMPRESSION,
                what: "compression",
                hint: "; use .zt",
            });
        }
        set
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

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
    /// (`defer_sync`: a sharded checkpoint's shards, synced together) or
    /// durability was declined (`no_sync`).
    pub fn from_write_options(o: &WriteOptions) -> Options {
        let zt = ZtOptions::of(o);
        let canonical =
            matches!(zt.align, None | Some(Align::Canonical)) && zt.compression.is_none();
        let align = match zt.align {
            Some(a) if !canonical => a,
            None if !canonical => Align::Auto,
            _ => Align::Canonical,
        };
        Options {
            canonical,
            align: if canonical { Align::Canonical } else { align },
            compression: zt.compression,
            publish: o.syncs(),
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
