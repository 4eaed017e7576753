//! The rules the `.zt` container's refusals cite: upstream ztensor's `Rule`
//! names under `zt.` (its conformance corpus rejects a file as
//! `reject:RULE`, and zt's tests require `zt.RULE` for it).

use zt_core::Rule;

/// Shorter than a header plus a footer (§2.1).
pub const FILE_TOO_SMALL: Rule = Rule::new("zt.FileTooSmall");
/// The first eight bytes are not the magic (§2.2).
pub const HEADER_MAGIC: Rule = Rule::new("zt.HeaderMagic");
/// The last eight bytes are not the magic (§2.2).
pub const FOOTER_MAGIC: Rule = Rule::new("zt.FooterMagic");
/// A footer version this build does not implement.
pub const VERSION: Rule = Rule::new("zt.Version");
/// The manifest blob falls outside the data region, or a data shard's
/// footer does not zero the manifest fields (§2.3, §7.2).
pub const MANIFEST_BOUNDS: Rule = Rule::new("zt.ManifestBounds");
/// The manifest length exceeds the 1 GiB cap (§3.1).
pub const MANIFEST_TOO_LARGE: Rule = Rule::new("zt.ManifestTooLarge");
/// The manifest does not hash to the footer's XXH3-64 (§2.3).
pub const MANIFEST_HASH: Rule = Rule::new("zt.ManifestHash");
/// The manifest is not well-formed CBOR.
pub const CBOR_SYNTAX: Rule = Rule::new("zt.CborSyntax");
/// CBOR that is not in deterministic encoding (§3.1).
pub const CBOR_DETERMINISM: Rule = Rule::new("zt.CborDeterminism");
/// A CBOR map repeats a key (§3.1).
pub const CBOR_DUPLICATE_KEY: Rule = Rule::new("zt.CborDuplicateKey");
/// CBOR nested past the depth limit.
pub const CBOR_DEPTH: Rule = Rule::new("zt.CborDepth");
/// The manifest is not the shape the schema describes (§3).
pub const SCHEMA: Rule = Rule::new("zt.Schema");
/// An object, part or attribute name violates §3.5.
pub const NAME: Rule = Rule::new("zt.Name");
/// A shape past the rank limit, or whose element product overflows (§3.3).
pub const SHAPE: Rule = Rule::new("zt.Shape");
/// A blob offset is not on the alignment floor (§2.4).
pub const BLOB_ALIGNMENT: Rule = Rule::new("zt.BlobAlignment");
/// A blob runs past the file's data region (§2.4).
pub const BLOB_BOUNDS: Rule = Rule::new("zt.BlobBounds");
/// Two blobs of one file partially overlap (§2.4).
pub const BLOB_OVERLAP: Rule = Rule::new("zt.BlobOverlap");
/// A part names a shard the table does not declare (§7.1).
pub const SHARD_REF: Rule = Rule::new("zt.ShardRef");
/// A shard name outside the character set of §7.1.
pub const SHARD_NAME: Rule = Rule::new("zt.ShardName");
/// Object metadata breaks its layout profile (§5.2).
pub const LAYOUT_RULE: Rule = Rule::new("zt.LayoutRule");
/// Data breaks its layout profile (CSR indptr, COO cells, bool bytes).
pub const LAYOUT_DATA: Rule = Rule::new("zt.LayoutData");
/// A dense part's decoded size is not shape × dtype width (§5.1).
pub const DENSE_SIZE: Rule = Rule::new("zt.DenseSize");
/// Stored bytes violate their encoding profile (zstd-seekable).
pub const ENCODING: Rule = Rule::new("zt.Encoding");
/// A digest is malformed, or the bytes do not hash to it (§3.4).
pub const DIGEST: Rule = Rule::new("zt.Digest");
/// A shard does not match the root's table (size, digest; §7.1, §7.3).
pub const SHARD_IDENTITY: Rule = Rule::new("zt.ShardIdentity");
/// Valid, but not something zt does: an unknown encoding, a content
/// digest of a part with none, a data shard asked for content.
pub const UNSUPPORTED: Rule = Rule::new("zt.Unsupported");
/// A write the `.zt` writer refuses: canonical form's constraints, an
/// append to a file without a manifest.
pub const WRITE: Rule = Rule::new("zt.Write");

/// Every `zt.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[
    FILE_TOO_SMALL,
    HEADER_MAGIC,
    FOOTER_MAGIC,
    VERSION,
    MANIFEST_BOUNDS,
    MANIFEST_TOO_LARGE,
    MANIFEST_HASH,
    CBOR_SYNTAX,
    CBOR_DETERMINISM,
    CBOR_DUPLICATE_KEY,
    CBOR_DEPTH,
    SCHEMA,
    NAME,
    SHAPE,
    BLOB_ALIGNMENT,
    BLOB_BOUNDS,
    BLOB_OVERLAP,
    SHARD_REF,
    SHARD_NAME,
    LAYOUT_RULE,
    LAYOUT_DATA,
    DENSE_SIZE,
    ENCODING,
    DIGEST,
    SHARD_IDENTITY,
    UNSUPPORTED,
    WRITE,
];
