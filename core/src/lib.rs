//! # zt-core: the tensor model and the plugin seam
//!
//! Everything zt's format plugins are written against, and nothing that
//! names one: errors and limits, dtypes, [`Store`] (one opened file),
//! [`Catalog`] (what a plugin's `open` produces), [`Source`] and its read
//! API ([`Tensor`], [`PartRef`]), the [`Format`] and [`FormatWriter`]
//! traits, the [`Registry`] that lists plugins, and [`publish`], the one
//! way writers put a file in place.
//!
//! Users reach this through the `zt` crate, which links the plugins and
//! provides `zt::registry()`, `zt::open()` and `zt::convert()`.

#![deny(missing_docs)]

pub mod assemble;
pub mod buffer;
pub mod cast;
pub mod catalog;
pub mod copy;
pub mod crc_many;
pub mod derive;
pub mod digests;
pub mod dtype;
pub mod error;
pub mod format;
pub mod inputs;
pub mod limits;
pub mod location;
mod name_index;
pub mod open;
pub mod part;
pub mod plugin;
pub mod publish;
pub mod readahead;
pub mod registry;
#[cfg(feature = "remote")]
pub mod remote;
pub mod rule;
pub mod selection;
pub mod shard;
pub mod source;
pub mod store;
pub mod transform;
pub mod write;

pub use catalog::{
    Attributes, Catalog, Check, Decode, Digest, DigestAlgorithm, Object, Part, Payload, Value,
};
pub use digests::Digests;
pub use dtype::DType;
pub use error::{Context, Error, RemoteKind, Result};
pub use format::{Format, OpenInput, Probe};
pub use limits::Limits;
pub use open::OpenOptions;
pub use part::{Caps, Location, PartRef, Tensor};
pub use plugin::{Checkpoint, FuzzGroup, FuzzTarget, Plugin, Reader, Seed};
pub use registry::Registry;
pub use rule::Rule;
pub use source::Source;
pub use store::{PrivateMap, PrivateMaps, Store};
pub use transform::{Rename, Transform};
pub use write::{
    FormatOption, FormatOptions, FormatWriter, MetadataCaps, TensorIn, WriteOptions, WriterCaps,
    WrittenFile,
};
