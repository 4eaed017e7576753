//! The `.zt` plugin: a thin adapter from the [`Format`] registry to the
//! zTensor v2 reader in [`zt_container`], and the [`ZtWriter`] for conversion.

use std::path::Path;

use zt_container::cbor::Cbor;
use zt_container::container::MAGIC;
use zt_container::manifest::from_value;
use zt_container::write::{write_objects, ObjectIn, Options};
use zt_core::catalog::Catalog;
use zt_core::catalog::Value;
use zt_core::error::Result;
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::source::Source;
use zt_core::write::{Align, FormatWriter, TensorIn, WriteOptions};

/// zTensor v2 files.
pub struct Zt;

/// The zTensor v2 magic.
pub const ZT_MAGIC: &[u8; 8] = MAGIC;

impl Format for Zt {
    fn name(&self) -> &'static str {
        "zt"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["zt"]
    }

    /// The magic at both ends. A `.zt` file with the magic at only one end
    /// (or too short for a footer) is still claimed, so that opening it
    /// reports what is wrong with it instead of "unknown format"; every
    /// footer rule is checked by `open` with a precise error.
    fn sniff(&self, p: &Probe<'_>) -> bool {
        let head = p.head.starts_with(ZT_MAGIC);
        let tail = p.len >= 48 && p.tail.ends_with(ZT_MAGIC);
        (head && tail) || (p.extension == "zt" && (head || tail))
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        zt_container::read::open(input)
    }
}

/// Writes `.zt`: canonical by default, or placed by `WriteOptions::align`
/// and compressed with `zt.zstd-seekable/1` when `compression` is set.
pub struct ZtWriter;

impl FormatWriter for ZtWriter {
    /// zTensor's sharded layout (spec §7, the positional resolver of
    /// Appendix B): shards `STEM-00001.zt`, each an ordinary `.zt` with its
    /// own manifest and digests, and a root at the checkpoint's name whose
    /// shard table records each shard's size and digest and whose objects
    /// point into them.
    fn shard_layout(&self) -> Option<zt_core::shard::ShardLayout> {
        Some(zt_core::shard::ShardLayout {
            checkpoint_name: "model.zt",
            tie: zt_core::shard::Tie::Root(zt_container::root::write_root),
            durable: false,
        })
    }

    fn name(&self) -> &'static str {
        "zt"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["zt"]
    }

    fn write(&self, source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
        zt_container::write::convert(source, path, options)
    }

    /// Dense objects of one `data` part each, canonical unless `align` or
    /// `compression` is given (an explicit `align`, even `"canonical"`,
    /// places blobs without the rest of the canonical form, as
    /// `zt.Writer(canonical=False, align=...)` does), with `metadata` as
    /// the file attributes in the order given.
    fn writes_arrays(&self) -> bool {
        true
    }

    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        let canonical = options.align.is_none() && options.compression.is_none();
        let opts = Options {
            canonical,
            align: options.align.unwrap_or(if canonical {
                Align::Canonical
            } else {
                Align::Auto
            }),
            compression: options.compression,
            ..Options::default()
        };
        let objects = tensors
            .iter()
            .map(|t| ObjectIn::dense(t.name, t.dtype, t.shape, t.data))
            .collect();
        let attributes = metadata.map(|m| {
            Cbor::Map(
                m.iter()
                    .map(|(k, v)| (Cbor::Text(k.clone().into()), from_value(v)))
                    .collect(),
            )
        });
        write_objects(path, objects, attributes, &opts)
    }
}
