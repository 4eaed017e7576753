//! The rules `.npy` (`npy.*`) and `.npz` (`npz.*`) refusals cite.

use zt_core::Rule;

/// No `\x93NUMPY` magic.
pub const MAGIC: Rule = Rule::new("npy.Magic");
/// A format version zt does not read.
pub const VERSION: Rule = Rule::new("npy.Version");
/// The header dict is malformed (syntax, keys, value types).
pub const HEADER: Rule = Rule::new("npy.Header");
/// The data is shorter than the header's shape and dtype need.
pub const SIZE: Rule = Rule::new("npy.Size");
/// An `.npz` member zt cannot read (encrypted, a compression method
/// other than stored or deflate, a name it refuses).
pub const NPZ_MEMBER: Rule = Rule::new("npz.Member");
/// A deflated member fails to inflate, or to match its CRC-32.
pub const NPZ_INFLATE: Rule = Rule::new("npz.Inflate");
/// A stored member's bytes do not match its CRC-32 (checked at the
/// member's first read, and by `verify`).
pub const NPZ_CRC: Rule = Rule::new("npz.Crc");

/// Every `npy.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[MAGIC, VERSION, HEADER, SIZE];

/// Every `npz.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const NPZ_RULES: &[Rule] = &[NPZ_MEMBER, NPZ_INFLATE, NPZ_CRC];
