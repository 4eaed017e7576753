//! # zt: every tensor file format through one memory-mapped API
//!
//! Open a file in any supported format, list its tensors, and read their
//! bytes zero-copy where the file allows (uncompressed, little-endian,
//! aligned for the element type) or decoded on demand where it does not.
//! Each part says which through [`Caps`].
//!
//! ```
//! # fn main() -> zt::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! use zt::{DType, TensorIn};
//! let path = dir.path().join("model.safetensors");
//! let weights: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
//! zt::formats::safetensors::write(
//!     &path,
//!     &[TensorIn { name: "w", dtype: DType::F32, shape: &[2, 2], data: &weights }],
//!     &[],
//! )?;
//!
//! let source = zt::open(&path)?;
//! assert_eq!(source.format(), "safetensors");
//! let w = source.tensor("w")?;
//! assert_eq!(w.shape(), &[2, 2]);
//! let part = w.data()?;
//! assert!(part.caps().map);                  // aligned and mapped: zero-copy
//! assert_eq!(part.map()?, &weights[..]);     // a view of the mapping
//! # Ok(()) }
//! ```
//!
//! The crate is a facade over three: `zt-core` (the tensor model, stores,
//! sources and the plugin traits; it names no format), `zt-formats` (one
//! plugin per format) and `zt-container` (the `.zt` container). Adding a
//! format is one module in [`formats`] (its code and its rules) and its lines
//! in `registry.rs`.

#![deny(missing_docs)]

use std::path::Path;

pub use zt_container as container;
pub use zt_core::rule::{self, Rule};
pub use zt_core::{
    buffer, cast, catalog, copy, dtype, error, format, inputs, limits, location, open as options,
    part, plugin, publish, source, store, transform, write,
};
pub use zt_formats as formats;
pub use zt_formats::zip;
/// The `.zt` plugin's writer options (`--align`, `--compress`; Python's
/// `align=`, `compression=`), carried as `WriteOptions::with_format(ZtOptions
/// { .. })`.
pub use zt_formats::ztensor::{Align, ZtOptions};

/// Object storage (the `remote` feature): opening, caching, uploading, and
/// the client itself (`remote::client`).
#[cfg(feature = "remote")]
pub use zt_core::remote;

pub use zt_core::{
    Attributes, Caps, Catalog, Checkpoint, Context, DType, Decode, Digest, DigestAlgorithm, Error,
    Format, FormatWriter, FuzzGroup, FuzzTarget, Limits, Location, MetadataCaps, Object, OpenInput,
    OpenOptions, Part, PartRef, Payload, Plugin, Probe, Reader, Registry, RemoteKind, Result,
    Source, Store, Tensor, TensorIn, Transform, Value, WriteOptions, WriterCaps,
};

pub mod model_dir;
mod registry;
pub use registry::{plugins, registry, rules};
pub use zt_core::shard;

/// The README's Rust example, compiled and run as a doctest.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// Open one file (or a Hugging Face `*.index.json` shard index) with
/// default options.
pub fn open(location: impl AsRef<Path>) -> Result<Source> {
    open_with(location, &OpenOptions::default())
}

/// Open one file (or shard index) with `options`.
pub fn open_with(location: impl AsRef<Path>, options: &OpenOptions) -> Result<Source> {
    registry().open(location.as_ref(), options)
}

/// Open several files as one source; a name found in two files is an error.
pub fn open_all<P: AsRef<Path>>(locations: &[P]) -> Result<Source> {
    open_all_with(locations, &OpenOptions::default())
}

/// Open several files as one source with `options`. Per-rank DTensor
/// files repeat their tensors' names: given here they are refused
/// (`pt.RankFiles`) with a message that points at [`open_ranks`].
pub fn open_all_with<P: AsRef<Path>>(locations: &[P], options: &OpenOptions) -> Result<Source> {
    registry()
        .open_all(locations, options)
        .map_err(|e| zt_formats::pt::ranks::explain_duplicate(e, options))
}

/// Open the per-rank `torch.save` files of a DTensor run (FSDP2, tensor
/// parallel: `model_world_size_W_rank_R.pt`), given in rank order, as one
/// source of global tensors merged by their placements; see
/// [`formats::pt::ranks`].
pub fn open_ranks<P: AsRef<Path>>(locations: &[P]) -> Result<Source> {
    open_ranks_with(locations, &OpenOptions::default())
}

/// [`open_ranks`] with `options`.
pub fn open_ranks_with<P: AsRef<Path>>(locations: &[P], options: &OpenOptions) -> Result<Source> {
    zt_formats::pt::ranks::open_ranks(locations, options)
}

/// [`open_ranks_with`], every replica's bytes compared with the copy taken
/// when `verify_replicas` (`pt.RankReplica` if any differs; it reads every
/// replica: `zt_formats::pt::ranks::open_ranks_verifying`).
pub fn open_ranks_verifying<P: AsRef<Path>>(
    locations: &[P],
    options: &OpenOptions,
    verify_replicas: bool,
) -> Result<Source> {
    zt_formats::pt::ranks::open_ranks_verifying(locations, options, verify_replicas)
}

/// Recognise the format of the file at `location` by its structure.
pub fn detect(location: impl AsRef<Path>) -> Result<&'static str> {
    registry().detect(location.as_ref(), &OpenOptions::default())
}

/// Open `location` (every structural rule) and verify it: every stored
/// digest recomputed, the data rules of logical types and sparse layouts;
/// `deep` also hashes a `.zt` root's shard files. See
/// [`container::verify::verify`].
pub fn verify(location: impl AsRef<Path>, deep: bool) -> Result<container::verify::Verification> {
    container::verify::verify(&open(location)?, deep)
}

/// The writer whose extension `path` has.
pub fn writer_for(path: &Path) -> Result<&'static dyn FormatWriter> {
    registry().writer_for(path)
}

/// Every format zt can write.
pub fn writers() -> &'static [&'static dyn FormatWriter] {
    registry().writers()
}

/// Write every tensor of `source` to `path`, in the format its extension names.
pub fn convert(source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
    registry().convert(source, path, options)
}

/// Write every tensor of `source` to `path` in shards of at most
/// `max_shard_size` bytes, as the format of its extension shards a
/// checkpoint (Hugging Face's index for safetensors and PyTorch, a root
/// for `.zt`); see [`shard`].
pub fn convert_sharded(
    source: &Source,
    path: &Path,
    max_shard_size: u64,
    options: &WriteOptions,
) -> Result<shard::Written> {
    registry().convert_sharded(source, path, max_shard_size, options)
}

/// Write `source` as a model directory `dir` in `format`, with `extra`
/// files copied in; see [`Registry::convert_dir`].
pub fn convert_dir(
    source: &Source,
    dir: &Path,
    format: &str,
    max_shard_size: u64,
    extra: &[(String, std::path::PathBuf)],
    options: &WriteOptions,
) -> Result<shard::Written> {
    registry().convert_dir(source, dir, format, max_shard_size, extra, options)
}
