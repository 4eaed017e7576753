//! The rules refusals of quantized safetensors schemes cite (`quant.*`).
//! Listed under the safetensors plugin, whose checkpoints carry them, but
//! they hold for the same tensors read from any format.

use zt_core::Rule;

/// A `quantization_config` (or MLX `quantization`) that zt cannot read, or
/// that names a scheme zt does not dequantize.
pub const SCHEME: Rule = Rule::new("quant.Scheme");
/// A scale (or bias, or global scale) tensor whose shape does not match its
/// weight's blocks.
pub const SCALE_SHAPE: Rule = Rule::new("quant.ScaleShape");
/// A quantized weight without its scale, or a scale without its weight.
pub const MISSING: Rule = Rule::new("quant.Missing");
/// A tensor of a scheme stored in a dtype the scheme does not use, or laid
/// out as no C-order dense tensor.
pub const DTYPE: Rule = Rule::new("quant.DType");

/// A quantized weight asked to move to another scheme without going
/// through floats (MLX affine <-> GGUF Q4_1) whose layout has no lossless
/// equivalent there.
pub const REPACK: Rule = Rule::new("quant.Repack");

/// Every `quant.*` rule.
pub const RULES: &[Rule] = &[SCHEME, SCALE_SHAPE, MISSING, DTYPE, REPACK];
