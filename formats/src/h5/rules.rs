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

/// Every `h5.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[SIGNATURE, STRUCTURE, DATASET, FILTER];
