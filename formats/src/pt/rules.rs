//! The rules PyTorch checkpoints refusals cite (`pt.*`).

use zt_core::Rule;

/// The pickle program is malformed (opcodes, stack, memo).
pub const PICKLE: Rule = Rule::new("pt.Pickle");
/// A pickled object that is not what torch writes there.
pub const OBJECT: Rule = Rule::new("pt.Object");
/// The legacy (pre-zip) framing is malformed.
pub const LEGACY: Rule = Rule::new("pt.Legacy");
/// A zip checkpoint's records are not torch's layout (no `data.pkl`, a
/// storage record missing, a bad `byteorder`).
pub const ARCHIVE: Rule = Rule::new("pt.Archive");
/// A storage's bytes do not cover the tensors that view it.
pub const STORAGE: Rule = Rule::new("pt.Storage");
/// An object or checkpoint form zt does not read.
pub const UNSUPPORTED: Rule = Rule::new("pt.Unsupported");

/// Per-rank files (`open_ranks`): a rank of the mesh has no file (the
/// list is shorter than the mesh or than a file name's `world_size_W`, or
/// the file names skip a rank).
pub const RANK_MISSING: Rule = Rule::new("pt.RankMissing");
/// Per-rank files: a file is not at its rank's position (its name's
/// `rank_R`, or the rank or mesh coordinate its DTensors record, disagrees
/// with its place in the list).
pub const RANK_ORDER: Rule = Rule::new("pt.RankOrder");
/// Per-rank files: the device meshes disagree (with each other, with the
/// number of files, or with the placements).
pub const RANK_MESH: Rule = Rule::new("pt.RankMesh");
/// Per-rank files: a DTensor's shards do not assemble to its global shape
/// (a local shape that is not its shard's, global shapes or dtypes that
/// differ between ranks, a tensor some rank lacks).
pub const RANK_SHARDS: Rule = Rule::new("pt.RankShards");
/// Per-rank files: a replicated tensor differs between ranks (a plain
/// tensor's dtype or shape; with `verify_replicas`, any replica's bytes).
pub const RANK_REPLICA: Rule = Rule::new("pt.RankReplica");
/// Per-rank files: a placement zt does not merge (`Partial`,
/// `_StridedShard`, a shard order other than the mesh's).
pub const RANK_PLACEMENT: Rule = Rule::new("pt.RankPlacement");
/// Per-rank DTensor files opened as one source by name (`open_all`, a
/// list given to `open` or `convert`), where every rank holds a shard of
/// the same tensor: they merge by placements (`open_ranks`).
pub const RANK_FILES: Rule = Rule::new("pt.RankFiles");

/// Every `pt.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[
    PICKLE,
    OBJECT,
    LEGACY,
    ARCHIVE,
    STORAGE,
    UNSUPPORTED,
    RANK_MISSING,
    RANK_ORDER,
    RANK_MESH,
    RANK_SHARDS,
    RANK_REPLICA,
    RANK_PLACEMENT,
    RANK_FILES,
];
