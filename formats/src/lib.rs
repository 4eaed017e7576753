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
//! let source = zt::Source::open(&path)?;
//! assert_eq!(source.format(), "safetensors");
//! let w = source.tensor("w")?;
//! assert_eq!(w.shape(), &[2, 2]);
//! let part = w.data()?;
//! assert!(part.caps().map);                  // aligned and mapped: zero-copy
//! assert_eq!(part.map()?, &weights[..]);     // a view of the mapping
//! # Ok(()) }
//! ```
//!
//! Adding a format is one module in [`formats`] implementing [`Format`] and
//! one line in [`format::registry`].

#![deny(missing_docs)]

pub mod buffer;
pub mod catalog;
pub mod dtype;
pub mod error;
pub mod format;
pub mod formats;
pub mod limits;
pub mod source;
pub mod store;
pub mod write;
pub mod zip;
pub mod zt;

/// The README's Rust example, compiled and run as a doctest.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use catalog::{
    Attributes, Catalog, Decode, Digest, DigestAlgorithm, Object, Part, Payload, Value,
};
pub use dtype::DType;
pub use error::{Context, Error, Result};
pub use format::{detect, registry, Format, OpenInput, Probe};
pub use limits::Limits;
pub use source::{Caps, Location, OpenOptions, PartRef, Source, Tensor};
pub use store::Store;
pub use write::{
    convert, partial_path, writer_for, writers, Align, FormatWriter, TensorIn, WriteOptions,
};
