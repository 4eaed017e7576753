//! The L1 manifest: parsing the deterministic-CBOR map into objects, parts
//! and shards, with the schema rules of §3 (names, shapes, blob arrays,
//! shard references, attribute values). Unknown keys are ignored at every
//! level, as the spec requires.
//!
//! | module | job |
//! |---|---|
//! | [`schema`] | the types (`Manifest`, `ObjectDef`, `PartDef`, `PlainObject`, `ShardDef`, `StoredDigest`), the limits, the name, digest and shard-name rules |
//! | [`walk`](mod@walk) | the streaming walk ([`parse`], [`walk()`], [`ObjectSink`]) and its checks of one value |
//! | [`tree`] | the validators of decoded trees, built on the walk's checks: [`from_cbor`], [`check_attributes`], the shard table; attribute values to and from the catalog |

pub mod schema;
pub mod tree;
pub mod walk;

pub use schema::{
    check_digest_syntax, check_name, storage_dtype, valid_shard_name, Manifest, ObjectDef, PartDef,
    Parts, PlainObject, ShardDef, StoredDigest, MAX_NAME, MAX_RANK, MAX_SHARD_NAME,
};
pub use tree::{attributes_of, check_attributes, from_cbor, from_value, to_value};
pub use walk::{parse, walk, ObjectSink};
