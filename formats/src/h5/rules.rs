//! The rules HDF5 refusals cite (`h5.*`).

use zt_core::Rule;

/// No HDF5 signature.
pub const SIGNATURE: Rule = Rule::new("h5.Signature");
/// A superblock, object header or message is malformed.
pub const STRUCTURE: Rule = Rule::new("h5.Structure");
/// A dataset's layout, datatype or dataspace zt cannot serve.
pub const DATASET: Rule = Rule::new("h5.Dataset");
/// A filter pipeline zt does not run, or one that fails to decode.
pub const FILTER: Rule = Rule::new("h5.Filter");

/// A tensor name or attribute key HDF5 cannot hold as a path (writing).
pub const NAME: Rule = Rule::new("h5.Name");
/// Metadata HDF5 attributes cannot hold (writing).
pub const ATTRIBUTE: Rule = Rule::new("h5.Attribute");
/// A tensor Keras's weights layout cannot hold (writing `layout="keras"`).
pub const KERAS: Rule = Rule::new("h5.Keras");

/// A `.keras` zip without its weights member, with a member twice, or
/// with a JSON member that is not JSON.
pub const KERAS_ARCHIVE: Rule = Rule::new("h5.KerasArchive");

/// Every `h5.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[
    SIGNATURE,
    STRUCTURE,
    DATASET,
    FILTER,
    NAME,
    ATTRIBUTE,
    KERAS,
    KERAS_ARCHIVE,
];
