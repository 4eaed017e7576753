//! The `.zt` plugin: a thin adapter from the [`Format`] registry to the
//! zTensor v2 reader in [`zt_container`], and the [`ZtWriter`] for conversion.

use std::path::Path;
pub use zt_container::rules::RULES;

use zt_container::cbor::Cbor;
use zt_container::container::MAGIC;
use zt_container::manifest::from_value;
use zt_container::write::{write_objects, write_shard, ObjectIn, Options};
/// The `.zt` plugin's options: blob placement and compression, a typed
/// value a request carries (`WriteOptions::with_format`), and their names.
pub use zt_container::write::{Align, ZtOptions, OPTION_ALIGN, OPTION_COMPRESSION};
use zt_core::catalog::Catalog;
use zt_core::catalog::Value;
use zt_core::error::Result;
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::source::Source;
use zt_core::write::{FormatWriter, MetadataCaps, TensorIn, WriteOptions, WriterCaps, WrittenFile};

/// zTensor v2 files.
pub struct Zt;

/// The `.zt` plugin: the container's reader and writer and its rules
/// (upstream ztensor's names, under `zt.`).
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "zt",
    readers: &[zt_core::Reader {
        format: &Zt,
        detect_rank: 10,
    }],
    writers: &[&ZtWriter],
    rules: &[("zt", RULES)],
    checkpoints: &[zt_core::Checkpoint {
        name: "model.zt",
        preference: 30,
    }],
};

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

    /// Fuzz target `zt_file`: whole files: footer, manifest, layouts, zstd seek
    /// tables, sparse and chunked parts (seeds written by upstream `ztensor`).
    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(zt_core::FuzzTarget::new("zt_file", &["fuzz/seeds/zt"]))
    }
}

/// Writes `.zt`: canonical by default, or placed by [`ZtOptions::align`]
/// and compressed with `zt.zstd-seekable/1` when
/// [`ZtOptions::compression`] is set (the request's `.zt` options,
/// `WriteOptions::format`).
/// Durable as every zt writer is (fsync of the file before its rename and
/// of the directory after, `zt_core::publish`), unless
/// `WriteOptions::defer_sync` leaves the syncing to the caller.
pub struct ZtWriter;

impl FormatWriter for ZtWriter {
    /// zTensor's sharded layout (spec §7, the positional resolver of
    /// Appendix B): shards `STEM-00001.zt`, each an ordinary `.zt` with its
    /// own manifest and digests, and a root at the checkpoint's name whose
    /// shard table records each shard's size and digest and whose objects
    /// point into them. The shards are synced together before the root
    /// is written, as a safetensors checkpoint's are before its index.
    ///
    /// The split is `zt_core::shard::plan`'s (huggingface_hub's) over the
    /// tensors in the order given (a conversion: the source's order); each
    /// shard is then the `.zt` file of its tensors, so in canonical form
    /// its objects are in name order, as every canonical file's are.
    fn shard_layout(&self) -> Option<zt_core::shard::ShardLayout> {
        Some(zt_core::shard::ShardLayout {
            checkpoint_name: "model.zt",
            tie: zt_core::shard::Tie::Root(zt_container::root::write_root),
            durable: true,
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

    /// A conversion reads its source ahead a window at a time as it writes
    /// each object (`zt_container::write::convert`; with compression, all
    /// of it first).
    fn reads_ahead(&self) -> bool {
        true
    }

    /// [`ZtWriter::write`], with the whole-file digest kept while writing
    /// and the manifest, for the root.
    fn write_shard(
        &self,
        source: &Source,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<WrittenFile> {
        zt_container::write::convert_shard(source, path, options)
    }

    fn caps(&self) -> WriterCaps {
        WriterCaps {
            metadata: MetadataCaps::Any,
            options: &[OPTION_ALIGN, OPTION_COMPRESSION],
            arrays: true,
        }
    }

    /// Dense objects of one `data` part each, canonical unless `align` or
    /// `compression` is given (an explicit `align`, even `"canonical"`,
    /// places blobs without the rest of the canonical form, as
    /// `zt.Writer(canonical=False, align=...)` does), with `metadata` as
    /// the file attributes in the order given.
    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        let (objects, attributes, opts) = arrays_in(tensors, metadata, options);
        write_objects(path, objects, attributes, &opts)
    }

    fn write_arrays_shard(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<WrittenFile> {
        let (objects, attributes, opts) = arrays_in(tensors, metadata, options);
        write_shard(path, objects, attributes, &opts)
    }
}

/// In-memory tensors as the container writer takes them: one dense object
/// each, `metadata` as the file attributes, and the options.
fn arrays_in<'a>(
    tensors: &[TensorIn<'a>],
    metadata: Option<&[(String, Value)]>,
    options: &WriteOptions,
) -> (Vec<ObjectIn<'a>>, Option<Cbor>, Options) {
    let zt = ZtOptions::of(options);
    let canonical = zt.align.is_none() && zt.compression.is_none();
    let opts = Options {
        canonical,
        align: zt.align.unwrap_or(if canonical {
            Align::Canonical
        } else {
            Align::Auto
        }),
        compression: zt.compression,
        publish: options.syncs(),
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
    (objects, attributes, opts)
}
