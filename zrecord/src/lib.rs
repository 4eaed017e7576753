//! Dense and Ragged record stores in loaderx's on-disk format.
//!
//! A store is a directory: `meta.zr` (a 4096-byte header page and a table
//! of 16-byte RecordLocs), `data_0.zr … data_{S-1}.zr` (record `i` in shard
//! `i % S`) and, for dictionary stores, `dict.zr`; see [`layout`] for the
//! bytes. Two loaderx releases wrote two [`Layout`]s of it, which differ only
//! in the schema's encoding and in the width of a Ragged record's shape
//! prefix ([`schema`]): loaderx 2.8 (the current release, JSON, u32; the
//! default here) and loaderx 2.3 (MsgPack, u64). Neither loaderx release
//! opens the other's stores; [`Reader`] opens both (told from the bytes), and
//! [`Writer`] builds either, byte for byte the store that release builds.
//!
//! What differs from loaderx is the engine: builds are published atomically
//! ([`Writer::close`] renames a finished build onto the destination; a
//! dropped or killed writer publishes nothing), appends and gathers run in
//! parallel, the RecordLoc table and shards are memory-mapped, adjacent
//! records are copied in one go, and Ragged gathers return values, offsets
//! and shapes from one pass.
//!
//! ```
//! use zrecord::{CreateOptions, Codec, Reader, Schema, Writer};
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("tokens");
//! let schema = Schema::dense("<i4", &[4]).unwrap();
//! let options = CreateOptions { codec: Codec::Zstd, ..CreateOptions::default() };
//! let mut writer = Writer::create(&path, &schema, &options)?;
//! let rows: Vec<u8> = (0..40i32).flat_map(|x| x.to_le_bytes()).collect();
//! writer.append_dense(&rows)?;
//! writer.close()?;
//!
//! let reader = Reader::open(&path, true)?;
//! let mut out = vec![0u8; 2 * 16];
//! reader.gather_dense(&[9, 0], &mut out)?;
//! assert_eq!(&out[..16], &rows[9 * 16..10 * 16]);
//! # Ok::<(), zrecord::Error>(())
//! ```

#![deny(missing_docs)]

pub mod binidx;
#[cfg(feature = "remote")]
mod binidx_pages;
pub mod codec;
pub mod dataset;
pub mod error;
mod fsio;
pub mod json;
pub mod layout;
pub mod mds;
mod msgpack;
#[cfg(feature = "remote")]
mod ranged;
pub mod reader;
pub mod remote;
#[cfg(feature = "remote")]
mod remote_cache;
pub mod samples;
pub mod schema;
mod workers;
pub mod writer;

pub use codec::{train_dict, Codec, DictTier, DICT_TIERS};
pub use dataset::{concat, open_manifest, open_many, write_manifest, Manifest};
pub use error::{Error, RemoteKind, Result};
pub use reader::{RaggedBatch, Reader};
pub use samples::train_store_dict;
pub use schema::{Geometry, Layout, Schema};
pub use writer::{CreateOptions, Writer};
