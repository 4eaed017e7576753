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

/// Every `pt.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[PICKLE, OBJECT, LEGACY, ARCHIVE, STORAGE, UNSUPPORTED];
