//! What a model's configuration says about its quantization: the
//! `quantization_config` of a Hugging Face `config.json` (or that object
//! alone, passed in), or MLX's `quantization` (`group_size`, `bits`,
//! `mode`, per-layer entries: `mlx::params`). Read only for what changes
//! the math (the FP8 block size, the MLX group size and bits); the tensors themselves say which scheme a
//! weight is in, and a scheme the configuration names that zt does not
//! dequantize is refused rather than left quantized.

use serde_json::Value;
use zt_core::error::{Context, Error, Result};

use super::rules;

/// The file name of the configuration read beside a checkpoint.
pub const CONFIG_FILE: &str = "config.json";

/// The most of `config.json` read: real ones are kilobytes.
pub const CONFIG_BYTES: u64 = 16 << 20;

/// The quantization a configuration declares.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Declared {
    /// None (or no configuration): schemes are told from the tensors.
    #[default]
    Nothing,
    /// `quant_method: "fp8"`: block-scaled FP8, blocks `[rows, cols]`.
    Fp8 {
        /// `weight_block_size`.
        block: [u64; 2],
    },
    /// `quant_method: "mxfp4"`: gpt-oss's expert blocks and scales.
    Mxfp4,
    /// `quant_method: "compressed-tensors"` in `nvfp4-pack-quantized`.
    Nvfp4,
    /// `quant_method: "compressed-tensors"` in `float-quantized` only: FP8
    /// weights with a `weight_scale` per tensor or per row.
    FloatQuantized,
    /// MLX's `quantization` (mlx-lm also copies it to
    /// `quantization_config`, with no `quant_method`).
    Mlx(super::mlx::MlxConfig),
}

/// A configuration's JSON text (a `config.json`, or a
/// `quantization_config` alone).
pub fn parse(ctx: &Context, text: &[u8]) -> Result<Value> {
    serde_json::from_slice(text).map_err(|e| {
        Error::header(
            ctx.clone(),
            rules::SCHEME,
            format!("the configuration is not JSON: {e}"),
        )
    })
}

/// The keys of a `config.json` that say how its weights are quantized:
/// transformers' `quantization_config` and MLX's `quantization`.
const QUANTIZATION_KEYS: [&str; 2] = ["quantization_config", "quantization"];

/// A model's `config.json` for its dequantized weights: `text` without the
/// keys that say how the weights are quantized, which they no longer are
/// (transformers would set up a quantized load for bf16 weights, mlx-lm
/// would unpack them), written as transformers writes a configuration
/// (keys sorted, indented by two spaces); `None` when it has none of them,
/// so it is copied as it is. Text that is no JSON object is refused.
pub fn without_quantization(ctx: &Context, text: &[u8]) -> Result<Option<Vec<u8>>> {
    let mut config = parse(ctx, text)?;
    let Some(object) = config.as_object_mut() else {
        return Err(refuse(ctx, "the configuration is not a JSON object"));
    };
    let removed = QUANTIZATION_KEYS
        .iter()
        .filter(|k| object.remove(**k).is_some())
        .count();
    if removed == 0 {
        return Ok(None);
    }
    let mut out = serde_json::to_vec_pretty(&config).map_err(|e| {
        Error::header(
            ctx.clone(),
            rules::SCHEME,
            format!("the configuration: {e}"),
        )
    })?;
    out.push(b'\n');
    Ok(Some(out))
}

fn refuse(ctx: &Context, reason: impl Into<String>) -> Error {
    Error::unsupported(ctx.clone(), rules::SCHEME, reason)
}

/// A positive integer field, as JSON has it.
fn positive(ctx: &Context, v: &Value, what: &str) -> Result<u64> {
    v.as_u64()
        .filter(|&n| n > 0)
        .ok_or_else(|| refuse(ctx, format!("{what} is {v}, not a positive integer")))
}

/// The quantization `config` declares: a whole `config.json` (its
/// `quantization_config`), or a `quantization_config` object itself.
pub fn declared(ctx: &Context, config: &Value) -> Result<Declared> {
    let Some(object) = config.as_object() else {
        return Err(refuse(ctx, "the configuration is not a JSON object"));
    };
    if let Some(q) = object.get("quantization").filter(|q| !q.is_null()) {
        return super::mlx::params::parse(ctx, q).map(Declared::Mlx);
    }
    let q = match object.get("quantization_config") {
        Some(q) if !q.is_null() => q,
        _ if object.contains_key("quant_method") => config,
        // MLX's `quantization` object passed alone.
        _ if super::mlx::params::looks_like_mlx(object) => {
            return super::mlx::params::parse(ctx, config).map(Declared::Mlx)
        }
        _ => return Ok(Declared::Nothing),
    };
    if q.as_object()
        .is_some_and(super::mlx::params::looks_like_mlx)
    {
        return super::mlx::params::parse(ctx, q).map(Declared::Mlx);
    }
    let Some(method) = q.get("quant_method") else {
        return Err(refuse(ctx, "quantization_config names no quant_method"));
    };
    match method.as_str() {
        Some("fp8") => {
            if let Some(fmt) = q.get("fmt").and_then(Value::as_str) {
                if fmt != "e4m3" {
                    return Err(refuse(
                        ctx,
                        format!("fp8 weights in {fmt:?}: zt dequantizes e4m3"),
                    ));
                }
            }
            let block = match q.get("weight_block_size") {
                Some(Value::Array(b)) if b.len() == 2 => [
                    positive(ctx, &b[0], "weight_block_size[0]")?,
                    positive(ctx, &b[1], "weight_block_size[1]")?,
                ],
                // `null`: per-tensor scales (transformers' FP8 without
                // blocks), told from the scales' shapes.
                None | Some(Value::Null) => [128, 128],
                Some(other) => {
                    return Err(refuse(
                        ctx,
                        format!(
                            "weight_block_size {other}: zt dequantizes fp8 with 2-D block scales"
                        ),
                    ))
                }
            };
            Ok(Declared::Fp8 { block })
        }
        Some("mxfp4") => Ok(Declared::Mxfp4),
        Some("compressed-tensors") => compressed_tensors(ctx, q),
        Some(other) => Err(refuse(
            ctx,
            format!("quant_method {other:?}: zt dequantizes fp8 (block-scaled), mxfp4, compressed-tensors nvfp4 and MLX's quantization"),
        )),
        None => Err(refuse(ctx, format!("quant_method is {method}, not text"))),
    }
}

/// compressed-tensors: every format it names (at the top, or per config
/// group) must be one zt dequantizes.
fn compressed_tensors(ctx: &Context, q: &Value) -> Result<Declared> {
    let mut formats: Vec<&Value> = q.get("format").into_iter().collect();
    if let Some(Value::Object(groups)) = q.get("config_groups") {
        formats.extend(groups.values().filter_map(|g| g.get("format")));
    }
    let mut fp8_only = true;
    for format in formats.into_iter().filter(|f| !f.is_null()) {
        match format.as_str() {
            Some("float-quantized") => {}
            Some("nvfp4-pack-quantized") => fp8_only = false,
            _ => {
                return Err(refuse(
                    ctx,
                    format!("compressed-tensors format {format}: zt dequantizes nvfp4-pack-quantized and float-quantized"),
                ))
            }
        }
    }
    Ok(if fp8_only {
        Declared::FloatQuantized
    } else {
        Declared::Nvfp4
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_changes_the_math() {
        let ctx = Context::default();
        let deepseek = json!({"quantization_config": {"activation_scheme": "dynamic",
            "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}});
        assert_eq!(
            declared(&ctx, &deepseek).unwrap(),
            Declared::Fp8 { block: [128, 128] }
        );
        let bare = json!({"quant_method": "fp8", "weight_block_size": [64, 32]});
        assert_eq!(
            declared(&ctx, &bare).unwrap(),
            Declared::Fp8 { block: [64, 32] }
        );
        let gpt_oss = json!({"quantization_config": {"quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn"]}});
        assert_eq!(declared(&ctx, &gpt_oss).unwrap(), Declared::Mxfp4);
        let nvfp4 = json!({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"format": "nvfp4-pack-quantized", "weights": {"num_bits": 4}}}});
        assert_eq!(declared(&ctx, &nvfp4).unwrap(), Declared::Nvfp4);
        let float = json!({"quant_method": "compressed-tensors", "format": "float-quantized"});
        assert_eq!(declared(&ctx, &float).unwrap(), Declared::FloatQuantized);
        let per_tensor = json!({"quant_method": "fp8", "weight_block_size": null});
        assert_eq!(
            declared(&ctx, &per_tensor).unwrap(),
            Declared::Fp8 { block: [128, 128] }
        );
        let int4 = json!({"quant_method": "compressed-tensors", "format": "pack-quantized"});
        assert_eq!(
            declared(&ctx, &int4).unwrap_err().rule(),
            Some(rules::SCHEME)
        );
        assert_eq!(
            declared(&ctx, &json!({"hidden_size": 8})).unwrap(),
            Declared::Nothing
        );
        // mlx-lm writes `quantization` and copies it as
        // `quantization_config`; either, or the object alone, is MLX's.
        let q = json!({"group_size": 32, "bits": 4, "mode": "affine"});
        for config in [
            json!({"quantization": q, "quantization_config": q}),
            json!({"quantization_config": q}),
            q.clone(),
        ] {
            assert!(
                matches!(declared(&ctx, &config).unwrap(), Declared::Mlx(_)),
                "{config}"
            );
        }
        let model = json!({"architectures": ["X"], "hidden_size": 8,
            "quantization_config": {"quant_method": "fp8"}, "quantization": {"bits": 4}});
        let text = serde_json::to_vec(&model).unwrap();
        let kept = without_quantization(&ctx, &text).unwrap().unwrap();
        assert_eq!(
            String::from_utf8(kept).unwrap(),
            "{\n  \"architectures\": [\n    \"X\"\n  ],\n  \"hidden_size\": 8\n}\n"
        );
        assert_eq!(without_quantization(&ctx, b"{\"a\": 1}").unwrap(), None);
        let err = without_quantization(&ctx, b"[1]").unwrap_err();
        assert_eq!(err.rule(), Some(rules::SCHEME));
        for bad in [
            json!({"quant_method": "awq"}),
            json!({"quant_method": 3}),
            json!({"quantization_config": {"bits": 4}}),
            json!({"quant_method": "fp8", "weight_block_size": [0, 128]}),
            json!({"quant_method": "fp8", "weight_block_size": [128]}),
            json!({"quant_method": "fp8", "fmt": "e5m2"}),
            json!([1, 2]),
        ] {
            let err = declared(&ctx, &bad).unwrap_err();
            assert_eq!(err.rule(), Some(rules::SCHEME), "{bad}");
        }
    }
}
