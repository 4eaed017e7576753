//! The named rules a refusal cites: what check a file (or a write request)
//! failed, as data a caller and a test can match without reading message
//! text.
//!
//! Every error that refuses an input ([`crate::Error::Header`], `Range`,
//! `Decode`, `Unsupported`, `Index`, `Write`, `Integrity`, and the
//! structured `Truncated`, `Overflow`, `Limit`, `UnsupportedDType`) carries
//! one; [`crate::Error::rule`] reads it. The variant stays the category (it
//! decides the message's prefix and whether the input is at fault); the
//! rule says which check, once per distinct reason, not once per call site.
//!
//! A rule's [`Rule::name`] is `"<plugin>.<Check>"` and stable: the `.zt`
//! container's rules are upstream ztensor's `Rule` names (its conformance
//! corpus asserts them, and so do zt's tests against that corpus), under
//! `zt.`; the other plugins name their own checks (`safetensors.Offsets`,
//! `gguf.Metadata`); rules every plugin shares live under `core.`, `index.`,
//! `access.` and `write.`. A plugin adds a rule by adding a variant here,
//! with its name and a line saying what it checks. The enum is
//! `#[non_exhaustive]`, so a match on one rule stays source-compatible when
//! the next is added.

use std::fmt;

macro_rules! rules {
    ($( $(#[$doc:meta])+ $rule:ident = $name:literal, )*) => {
        /// A named check an input failed (see the module documentation).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum Rule {
            $( $(#[$doc])+ $rule, )*
        }

        impl Rule {
            /// Every rule, in declaration order.
            pub const ALL: &'static [Rule] = &[$(Rule::$rule),*];

            /// The rule's stable name, `"<plugin>.<Check>"`.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Rule::$rule => $name, )*
                }
            }
        }
    };
}

rules! {
    // --- Shared by every plugin: the structured variants' own rules. ---
    /// The file ends before a structure it declares.
    Truncated = "core.Truncated",
    /// Arithmetic on declared sizes overflowed.
    Overflow = "core.Overflow",
    /// A configured limit would be exceeded.
    Limit = "core.Limit",
    /// A dtype the format or zt does not know.
    DType = "core.DType",
    /// Two tensors share a name.
    DuplicateName = "core.DuplicateName",
    /// No registered format recognises the file.
    UnknownFormat = "core.UnknownFormat",
    /// Compressed or encoded data decoded to the wrong length.
    DecodedLength = "core.DecodedLength",
    /// A byte range asked of a tensor lies outside it.
    ReadRange = "core.ReadRange",
    /// A part's payload disagrees with its shape, dtype or strides.
    PartSize = "core.PartSize",
    /// A plugin's data check of a part failed.
    Check = "core.Check",
    /// A related-file location (a shard, external data) that is not a
    /// plain relative path inside the file's directory.
    Location = "core.Location",

    // --- Sharded checkpoints (`*.index.json`, model directories). ---
    /// The index is not JSON of the documented shape.
    IndexSchema = "index.Schema",
    /// A shard path leaves the index's directory or is itself an index.
    IndexShardPath = "index.ShardPath",
    /// The index and its shards disagree (a tensor's shard, a shard's size).
    IndexMismatch = "index.Mismatch",
    /// A directory holds no checkpoint, or several, to choose from.
    IndexCheckpoint = "index.Checkpoint",

    // --- Serving a tensor the way it was asked for. ---
    /// A zero-copy map of bytes the file does not hold as-is (encoded,
    /// unaligned, or a store that is not memory-mapped).
    AccessMap = "access.Map",
    /// A strided or typed view the part's dtype or order cannot give.
    AccessView = "access.View",
    /// A page operation on a range that is not page-aligned.
    AccessPages = "access.Pages",
    /// A selection (slice) that does not fit the tensor.
    AccessSelection = "access.Selection",
    /// A tensor of several parts asked for as one array.
    AccessPart = "access.Part",
    /// Nothing to open (an empty list of files).
    AccessInput = "access.Input",

    // --- Writing. ---
    /// The destination path cannot take the output.
    WriteDestination = "write.Destination",
    /// Options that do not combine, or that the format lacks.
    WriteOptions = "write.Options",
    /// Metadata the format cannot carry.
    WriteMetadata = "write.Metadata",
    /// A dtype or layout the format cannot store.
    WriteDType = "write.DType",
    /// A tensor or member name the format refuses.
    WriteName = "write.Name",
    /// A tensor the format cannot describe (no parts, wrong count).
    WriteObject = "write.Object",
    /// A writer used out of order (finished, or a stream still open).
    WriteState = "write.State",
    /// A command line that does not say what to write.
    WriteUsage = "write.Usage",
    /// No writer for the format or extension asked for.
    WriteFormat = "write.Format",
    /// A tensor's bytes are not its shape times its dtype's width.
    WriteSize = "write.Size",

    // --- The `.zt` container: upstream ztensor's rules, by spec section. ---
    /// Shorter than a header plus a footer (§2.1).
    ZtFileTooSmall = "zt.FileTooSmall",
    /// The first eight bytes are not the magic (§2.2).
    ZtHeaderMagic = "zt.HeaderMagic",
    /// The last eight bytes are not the magic (§2.2).
    ZtFooterMagic = "zt.FooterMagic",
    /// A footer version this build does not implement.
    ZtVersion = "zt.Version",
    /// The manifest blob falls outside the data region, or a data shard's
    /// footer does not zero the manifest fields (§2.3, §7.2).
    ZtManifestBounds = "zt.ManifestBounds",
    /// The manifest length exceeds the 1 GiB cap (§3.1).
    ZtManifestTooLarge = "zt.ManifestTooLarge",
    /// The manifest does not hash to the footer's XXH3-64 (§2.3).
    ZtManifestHash = "zt.ManifestHash",
    /// The manifest is not well-formed CBOR.
    ZtCborSyntax = "zt.CborSyntax",
    /// CBOR that is not in deterministic encoding (§3.1).
    ZtCborDeterminism = "zt.CborDeterminism",
    /// A CBOR map repeats a key (§3.1).
    ZtCborDuplicateKey = "zt.CborDuplicateKey",
    /// CBOR nested past the depth limit.
    ZtCborDepth = "zt.CborDepth",
    /// The manifest is not the shape the schema describes (§3).
    ZtSchema = "zt.Schema",
    /// An object, part or attribute name violates §3.5.
    ZtName = "zt.Name",
    /// A shape past the rank limit, or whose element product overflows (§3.3).
    ZtShape = "zt.Shape",
    /// A blob offset is not on the alignment floor (§2.4).
    ZtBlobAlignment = "zt.BlobAlignment",
    /// A blob runs past the file's data region (§2.4).
    ZtBlobBounds = "zt.BlobBounds",
    /// Two blobs of one file partially overlap (§2.4).
    ZtBlobOverlap = "zt.BlobOverlap",
    /// A part names a shard the table does not declare (§7.1).
    ZtShardRef = "zt.ShardRef",
    /// A shard name outside the character set of §7.1.
    ZtShardName = "zt.ShardName",
    /// Object metadata breaks its layout profile (§5.2).
    ZtLayoutRule = "zt.LayoutRule",
    /// Data breaks its layout profile (CSR indptr, COO cells, bool bytes).
    ZtLayoutData = "zt.LayoutData",
    /// A dense part's decoded size is not shape × dtype width (§5.1).
    ZtDenseSize = "zt.DenseSize",
    /// Stored bytes violate their encoding profile (zstd-seekable).
    ZtEncoding = "zt.Encoding",
    /// A digest is malformed, or the bytes do not hash to it (§3.4).
    ZtDigest = "zt.Digest",
    /// A shard does not match the root's table (size, digest; §7.1, §7.3).
    ZtShardIdentity = "zt.ShardIdentity",
    /// Valid, but not something zt does: an unknown encoding, a content
    /// digest of a part with none, a data shard asked for content.
    ZtUnsupported = "zt.Unsupported",
    /// A write the `.zt` writer refuses: canonical form's constraints, an
    /// append to a file without a manifest.
    ZtWrite = "zt.Write",

    // --- safetensors. ---
    /// The header is not UTF-8 JSON of the documented shape.
    SafetensorsHeader = "safetensors.Header",
    /// `__metadata__` holds something other than strings.
    SafetensorsMetadata = "safetensors.Metadata",
    /// `data_offsets` that run backwards, overlap, leave gaps or pass the file.
    SafetensorsOffsets = "safetensors.Offsets",
    /// A tensor's byte length is not its shape times its dtype's width.
    SafetensorsSize = "safetensors.Size",

    // --- .npy / .npz. ---
    /// No `\x93NUMPY` magic.
    NpyMagic = "npy.Magic",
    /// A format version zt does not read.
    NpyVersion = "npy.Version",
    /// The header dict is malformed (syntax, keys, value types).
    NpyHeader = "npy.Header",
    /// The data is shorter than the header's shape and dtype need.
    NpySize = "npy.Size",
    /// An `.npz` member zt cannot read (encrypted, a compression method
    /// other than stored or deflate, a name it refuses).
    NpzMember = "npz.Member",
    /// A deflated member fails to inflate, or to match its CRC-32.
    NpzInflate = "npz.Inflate",

    // --- zip archives (torch zip checkpoints, .npz). ---
    /// The end-of-central-directory record is missing or malformed.
    ZipDirectory = "zip.Directory",
    /// A central-directory entry or local header is malformed or disagrees
    /// with its twin.
    ZipEntry = "zip.Entry",
    /// A member's bytes overlap another's or lie outside the archive.
    ZipBounds = "zip.Bounds",
    /// An archive feature zt does not read (encryption, spanning, zip64
    /// forms, a compression method).
    ZipUnsupported = "zip.Unsupported",

    // --- GGUF. ---
    /// No `GGUF` magic.
    GgufMagic = "gguf.Magic",
    /// A GGUF version zt does not read.
    GgufVersion = "gguf.Version",
    /// A metadata key or value is malformed (UTF-8, types, a repeated key,
    /// `general.alignment`).
    GgufMetadata = "gguf.Metadata",
    /// A tensor info is malformed (dimensions, type).
    GgufTensorInfo = "gguf.TensorInfo",
    /// Tensor data misaligned, overlapping or outside the file.
    GgufPlacement = "gguf.Placement",
    /// A ggml block type zt does not dequantize.
    GgufDequant = "gguf.Dequant",

    // --- ONNX. ---
    /// The protobuf wire format is malformed.
    OnnxProtobuf = "onnx.Protobuf",
    /// A TensorProto is malformed (dimensions, field types).
    OnnxTensor = "onnx.Tensor",
    /// A tensor's data is not the size its shape and dtype need.
    OnnxSize = "onnx.Size",
    /// A sparse tensor is malformed (shape, index type, coordinates).
    OnnxSparse = "onnx.Sparse",
    /// External data references that are malformed or out of bounds.
    OnnxExternal = "onnx.External",
    /// An ONNX feature zt does not read (segmented tensors).
    OnnxUnsupported = "onnx.Unsupported",

    // --- PyTorch checkpoints. ---
    /// The pickle program is malformed (opcodes, stack, memo).
    PtPickle = "pt.Pickle",
    /// A pickled object that is not what torch writes there.
    PtObject = "pt.Object",
    /// The legacy (pre-zip) framing is malformed.
    PtLegacy = "pt.Legacy",
    /// A zip checkpoint's records are not torch's layout (no `data.pkl`, a
    /// storage record missing, a bad `byteorder`).
    PtArchive = "pt.Archive",
    /// A storage's bytes do not cover the tensors that view it.
    PtStorage = "pt.Storage",
    /// An object or checkpoint form zt does not read.
    PtUnsupported = "pt.Unsupported",

    // --- HDF5. ---
    /// No HDF5 signature.
    H5Signature = "h5.Signature",
    /// A superblock, object header or message is malformed.
    H5Structure = "h5.Structure",
    /// A dataset's layout, datatype or dataspace zt cannot serve.
    H5Dataset = "h5.Dataset",
    /// A filter pipeline zt does not run, or one that fails to decode.
    H5Filter = "h5.Filter",
}

impl Rule {
    /// The plugin (or shared group) the rule belongs to: the name up to its
    /// dot (`"zt"`, `"safetensors"`, `"core"`).
    pub fn plugin(self) -> &'static str {
        let name = self.name();
        &name[..name.find('.').unwrap_or(name.len())]
    }

    /// The rule named `name`, if any.
    pub fn from_name(name: &str) -> Option<Rule> {
        Rule::ALL.iter().copied().find(|r| r.name() == name)
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::Rule;

    #[test]
    fn names_are_unique_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for &r in Rule::ALL {
            assert!(seen.insert(r.name()), "{} named twice", r.name());
            assert_eq!(Rule::from_name(r.name()), Some(r));
            assert!(r.name().contains('.'), "{r} has no plugin");
            assert_eq!(r.to_string(), r.name());
        }
        assert_eq!(Rule::ZtBlobOverlap.plugin(), "zt");
        assert_eq!(Rule::from_name("zt.NoSuchRule"), None);
    }
}
