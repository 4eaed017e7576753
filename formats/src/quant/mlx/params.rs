//! MLX's quantization configuration: the `quantization` object mlx-lm
//! writes into `config.json` (and copies as `quantization_config`):
//! `group_size`, `bits`, `mode`, and per-layer entries keyed by the module
//! path (`"model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8}`,
//! or `false` for a layer left unquantized). Only what MLX defines is
//! accepted (`mx.quantize`'s table of modes, mlx 0.32): anything else is
//! `quant.Scheme`, so no weight is decoded with a guessed layout.

use std::collections::BTreeMap;

use serde_json::{Map, Value};
use zt_core::error::{Context, Error, Result};

use crate::quant::rules;

/// How a group of values is coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `w = scale * q + bias`, `q` an unsigned `bits`-bit code.
    Affine,
    /// e2m1 codes, one e8m0 scale per 32.
    Mxfp4,
    /// e4m3 codes, one e8m0 scale per 32.
    Mxfp8,
    /// e2m1 codes, one e4m3 scale per 16.
    Nvfp4,
}

impl Mode {
    fn named(name: &str) -> Option<Mode> {
        Some(match name {
            "affine" => Mode::Affine,
            "mxfp4" => Mode::Mxfp4,
            "mxfp8" => Mode::Mxfp8,
            "nvfp4" => Mode::Nvfp4,
            _ => return None,
        })
    }

    /// MLX's name for the mode.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Affine => "affine",
            Mode::Mxfp4 => "mxfp4",
            Mode::Mxfp8 => "mxfp8",
            Mode::Nvfp4 => "nvfp4",
        }
    }

    /// The `(group_size, bits)` MLX takes when the configuration omits them.
    fn defaults(self) -> (u64, u32) {
        match self {
            Mode::Affine => (64, 4),
            Mode::Mxfp4 => (32, 4),
            Mode::Mxfp8 => (32, 8),
            Mode::Nvfp4 => (16, 4),
        }
    }

    /// Whether MLX defines this group size and bit width for the mode.
    fn defines(self, group: u64, bits: u32) -> bool {
        match self {
            Mode::Affine => matches!(group, 32 | 64 | 128) && matches!(bits, 1..=6 | 8),
            _ => (group, bits) == self.defaults(),
        }
    }
}

/// One layer's quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub mode: Mode,
    /// Values per scale (and bias).
    pub group: u64,
    /// Bits per code.
    pub bits: u32,
}

/// A whole model's: the default and the per-layer entries (`None`: the
/// layer is not quantized).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MlxConfig {
    pub default: Params,
    pub layers: BTreeMap<String, Option<Params>>,
}

impl MlxConfig {
    /// The quantization of the module at `path` (a weight's name without
    /// `.weight`); `None` if the configuration leaves it unquantized.
    pub fn for_layer(&self, path: &str) -> Option<Params> {
        match self.layers.get(path) {
            Some(layer) => *layer,
            None => Some(self.default),
        }
    }
}

fn refuse(ctx: &Context, reason: String) -> Error {
    Error::unsupported(ctx.clone(), rules::SCHEME, reason)
}

/// The keys of a quantization object that are its own fields, not layers.
const FIELDS: [&str; 3] = ["group_size", "bits", "mode"];

/// Whether a `quantization_config` without a `quant_method` is MLX's
/// (mlx-lm copies `quantization` there; both fields are always written).
pub fn looks_like_mlx(q: &Map<String, Value>) -> bool {
    !q.contains_key("quant_method") && q.contains_key("group_size") && q.contains_key("bits")
}

/// One set of fields, the missing ones from `base` (a layer's) or the
/// mode's defaults (the model's).
fn params(
    ctx: &Context,
    what: &str,
    q: &Map<String, Value>,
    base: Option<Params>,
) -> Result<Params> {
    let mode = match q.get("mode") {
        None | Some(Value::Null) => base.map_or(Mode::Affine, |b| b.mode),
        Some(Value::String(name)) => Mode::named(name).ok_or_else(|| {
            refuse(
                ctx,
                format!("{what}: MLX mode {name:?}: zt dequantizes affine, mxfp4, mxfp8 and nvfp4"),
            )
        })?,
        Some(other) => return Err(refuse(ctx, format!("{what}: mode is {other}, not text"))),
    };
    let (group, bits) = match base.filter(|b| b.mode == mode) {
        Some(b) => (b.group, b.bits),
        None => mode.defaults(),
    };
    let number = |key: &str, default: u64| match q.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| refuse(ctx, format!("{what}: {key} is {v}, not an integer"))),
    };
    let group = number("group_size", group)?;
    let bits = number("bits", u64::from(bits))?;
    let bits = u32::try_from(bits).unwrap_or(u32::MAX);
    if !mode.defines(group, bits) {
        return Err(refuse(
            ctx,
            format!(
                "{what}: MLX {} with group size {group} and {bits} bits, which MLX does not define \
                 (affine: group 32, 64 or 128, bits 1-6 or 8; mxfp4 32/4; mxfp8 32/8; nvfp4 16/4)",
                mode.name()
            ),
        ));
    }
    Ok(Params { mode, group, bits })
}

/// An MLX `quantization` object.
pub fn parse(ctx: &Context, q: &Value) -> Result<MlxConfig> {
    let Some(q) = q.as_object() else {
        return Err(refuse(
            ctx,
            format!("MLX quantization is {q}, not an object"),
        ));
    };
    let default = params(ctx, "quantization", q, None)?;
    let mut layers = BTreeMap::new();
    for (key, value) in q.iter().filter(|(k, _)| !FIELDS.contains(&k.as_str())) {
        let layer = match value {
            Value::Bool(false) => None,
            Value::Bool(true) => Some(default),
            Value::Object(fields) => Some(params(ctx, key, fields, Some(default))?),
            // Not a layer (a field of another tool's): nothing MLX reads.
            _ => continue,
        };
        layers.insert(key.clone(), layer);
    }
    Ok(MlxConfig { default, layers })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mlx_lm_configurations() {
        let ctx = Context::default();
        let c = parse(
            &ctx,
            &json!({"group_size": 32, "bits": 4, "mode": "affine",
                "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
                "model.embed_tokens": false, "lm_head": true, "quant_method": "mlx"}),
        )
        .unwrap();
        let four = Params {
            mode: Mode::Affine,
            group: 32,
            bits: 4,
        };
        assert_eq!(c.default, four);
        assert_eq!(c.for_layer("model.layers.1.mlp.down_proj"), Some(four));
        assert_eq!(
            c.for_layer("model.layers.0.mlp.down_proj"),
            Some(Params {
                group: 64,
                bits: 8,
                ..four
            })
        );
        assert_eq!(c.for_layer("model.embed_tokens"), None);
        assert_eq!(c.for_layer("lm_head"), Some(four));
        let nv = parse(&ctx, &json!({"group_size": 16, "bits": 4, "mode": "nvfp4"})).unwrap();
        assert_eq!(nv.default.mode, Mode::Nvfp4);
        // Defaults as mx.quantize's.
        let bare = parse(&ctx, &json!({"mode": "mxfp4"})).unwrap();
        assert_eq!((bare.default.group, bare.default.bits), (32, 4));
        let affine = parse(&ctx, &json!({})).unwrap();
        assert_eq!((affine.default.group, affine.default.bits), (64, 4));
    }

    #[test]
    fn what_mlx_does_not_define_is_refused() {
        let ctx = Context::default();
        for bad in [
            json!({"group_size": 16, "bits": 4}),
            json!({"group_size": 32, "bits": 7}),
            json!({"group_size": 64, "bits": 0}),
            json!({"group_size": 32, "bits": 4, "mode": "mxfp4x"}),
            json!({"group_size": 64, "bits": 4, "mode": "mxfp4"}),
            json!({"group_size": 16, "bits": 8, "mode": "nvfp4"}),
            json!({"group_size": "32", "bits": 4}),
            json!({"group_size": 32, "bits": 4, "x.proj": {"bits": 9}}),
            json!([32, 4]),
        ] {
            let err = parse(&ctx, &bad).unwrap_err();
            assert_eq!(err.rule(), Some(rules::SCHEME), "{bad}");
        }
    }
}
