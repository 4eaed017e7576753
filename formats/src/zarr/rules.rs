//! The rules a refusal of a zarr store cites.

use zt_core::rule::Rule;

/// Metadata (`zarr.json`, `.zarray`, `.zgroup`, `.zmetadata`) is not what
/// the zarr v2/v3 specs define: not JSON, a field missing or of the wrong
/// type, a zero chunk dimension, a shape whose size overflows.
pub const META: Rule = Rule::new("zarr.Meta");
/// A data type, chunk grid, chunk key encoding or storage transformer zt
/// does not read (structured, string and datetime types; irregular grids).
pub const DATA_TYPE: Rule = Rule::new("zarr.DataType");
/// A codec zt does not read (`lz4`, `blosc` with snappy or zlib inside,
/// filters), or codecs in an order the spec does not allow.
pub const CODEC: Rule = Rule::new("zarr.Codec");
/// A key that would leave the store: an array path or a listed name with
/// `..`, `.`, an empty component, a root or a backslash.
pub const KEY: Rule = Rule::new("zarr.Key");
/// A chunk whose bytes do not decode to its chunk's size: shorter or
/// longer than its elements, a compressed stream that fails or inflates
/// past it.
pub const CHUNK: Rule = Rule::new("zarr.Chunk");
/// A `crc32c` codec's checksum does not match the bytes before it.
pub const CHECKSUM: Rule = Rule::new("zarr.Checksum");
/// A shard's index: shorter than the shard's inner chunks need, an inner
/// chunk's range past the shard's data or overlapping the index or
/// another chunk, an inner chunk shape that does not divide the shard.
pub const SHARD: Rule = Rule::new("zarr.Shard");
/// A group whose members cannot be listed (an object-storage prefix
/// without consolidated metadata).
pub const LISTING: Rule = Rule::new("zarr.Listing");
/// Every rule above.
pub const RULES: &[Rule] = &[META, DATA_TYPE, CODEC, KEY, CHUNK, CHECKSUM, SHARD, LISTING];
