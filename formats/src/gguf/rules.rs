//! The rules GGUF refusals cite (`gguf.*`).

use zt_core::Rule;

/// No `GGUF` magic.
pub const MAGIC: Rule = Rule::new("gguf.Magic");
/// A GGUF version zt does not read.
pub const VERSION: Rule = Rule::new("gguf.Version");
/// A metadata key or value is malformed (UTF-8, types, a repeated key,
/// `general.alignment`).
pub const METADATA: Rule = Rule::new("gguf.Metadata");
/// A tensor info is malformed (dimensions, type).
pub const TENSOR_INFO: Rule = Rule::new("gguf.TensorInfo");
/// Tensor data misaligned, overlapping or outside the file.
pub const PLACEMENT: Rule = Rule::new("gguf.Placement");
/// A ggml block type zt does not dequantize.
pub const DEQUANT: Rule = Rule::new("gguf.Dequant");

/// Every `gguf.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[MAGIC, VERSION, METADATA, TENSOR_INFO, PLACEMENT, DEQUANT];
