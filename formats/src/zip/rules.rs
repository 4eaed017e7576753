//! The rules zip archives (torch zip checkpoints, `.npz`) refusals cite (`zip.*`).

use zt_core::Rule;

/// The end-of-central-directory record is missing or malformed.
pub const DIRECTORY: Rule = Rule::new("zip.Directory");
/// A central-directory entry or local header is malformed or disagrees
/// with its twin.
pub const ENTRY: Rule = Rule::new("zip.Entry");
/// A member's bytes overlap another's or lie outside the archive.
pub const BOUNDS: Rule = Rule::new("zip.Bounds");
/// An archive feature zt does not read (encryption, spanning, zip64
/// forms, a compression method).
pub const UNSUPPORTED: Rule = Rule::new("zip.Unsupported");

/// Every `zip.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[DIRECTORY, ENTRY, BOUNDS, UNSUPPORTED];
