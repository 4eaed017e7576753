//! The zTensor v2 container (`.zt`): zt's own format, byte-compatible with
//! upstream `ztensor` 2.x (spec "Draft 4", footer version 2).
//!
//! | module | job |
//! |---|---|
//! | [`cbor`] | strict deterministic-CBOR codec |
//! | [`container`] | magic, footer, manifest bounds and hash, blob rules |
//! | [`manifest`] | the L1 schema: objects, parts, shards, attributes |
//! | [`validate`] | logical types and layout profiles |
//! | [`encoding`] | `zt.zstd-seekable/1` |
//! | [`read`] | open a file into a catalog (shards resolved positionally) |
//! | [`root`] | the root of a sharded checkpoint: shard table, objects pointing into the shards |
//! | [`mod@write`] | [`write::Writer`]: canonical, aligned, compressed, publish, append |
//! | [`sharded`] | [`sharded::ShardedWriter`]: a `Writer` that rolls over to a new shard at a size, publishing shards + root at finish |
//! | [`verify`] | digests, shard digests, content digest, canonical check |

mod ahead;
pub mod cbor;
pub mod container;
mod dedup;
pub mod encoding;
mod hash_ahead;
pub mod manifest;
mod name_order;
mod prehash;
pub mod read;
pub mod root;
pub mod rules;
mod scout;
mod shard_check;
pub mod sharded;
mod sink;
pub mod validate;
pub mod verify;
pub mod write;
mod xxh3;
