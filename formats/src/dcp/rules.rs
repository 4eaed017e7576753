//! The rules PyTorch distributed checkpoint (DCP) refusals cite (`dcp.*`).

use zt_core::Rule;

/// `.metadata` is not the pickled `Metadata` torch writes (a field missing
/// or of the wrong kind, a persistent id, an unknown storage kind).
pub const METADATA: Rule = Rule::new("dcp.Metadata");
/// `.metadata` names a global outside the ones DCP's metadata pickles
/// (refused by name, never imported or called).
pub const GLOBAL: Rule = Rule::new("dcp.Global");
/// A chunk's offsets or sizes disagree with its tensor's global shape
/// (another rank, or a chunk reaching past the tensor).
pub const CHUNK_SHAPE: Rule = Rule::new("dcp.ChunkShape");
/// A tensor's chunks do not tile its global shape exactly (two overlap, or
/// elements are covered by none).
pub const CHUNKS: Rule = Rule::new("dcp.Chunks");
/// A chunk has no `storage_data` entry saying where its bytes are.
pub const STORAGE: Rule = Rule::new("dcp.Storage");
/// A chunk's byte range `[offset, offset + length)` lies past the end of
/// its `.distcp` file.
pub const CHUNK_RANGE: Rule = Rule::new("dcp.ChunkRange");
/// A `relative_path` that leaves the checkpoint's directory (absolute,
/// `..`, or a symlink out).
pub const PATH: Rule = Rule::new("dcp.Path");
/// A `.distcp` file `storage_data` names is missing.
pub const FILE: Rule = Rule::new("dcp.File");
/// A chunk's bytes (a `torch.save` archive, or an entry of a `SAFETENSORS`
/// file's block) do not hold one tensor of the dtype and sizes `.metadata`
/// declares for it.
pub const CHUNK: Rule = Rule::new("dcp.Chunk");
/// A size past [`zt_core::Limits`]: a tensor's rank or bytes, the number of
/// chunks.
pub const LIMIT: Rule = Rule::new("dcp.Limit");
/// A chunk stored through torch's zstd extension (`stream.zstd/1`) is not
/// one whole zstd frame filling its range: another magic, a corrupt or cut
/// frame, one decoding to another size than it declares, bytes after it,
/// or more decompressed bytes than a `torch.save` archive of the chunk
/// holds.
pub const ZSTD: Rule = Rule::new("dcp.Zstd");
/// What zt does not read: storage transforms other than one
/// `stream.zstd/1` (and that one over `SAFETENSORS` serialization, which
/// torch cannot read back either), a layout other than strided, a dtype
/// zt has no type for.
pub const UNSUPPORTED: Rule = Rule::new("dcp.Unsupported");

/// Every `dcp.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[
    METADATA,
    GLOBAL,
    CHUNK_SHAPE,
    CHUNKS,
    STORAGE,
    CHUNK_RANGE,
    PATH,
    FILE,
    CHUNK,
    LIMIT,
    ZSTD,
    UNSUPPORTED,
];
