//! Quantized safetensors schemes dequantized into the tensors the
//! unquantized model has: a view of a source ([`dequantize`]) in which each
//! quantized weight and its scales become one tensor under the weight's
//! name, decoded on read (in f32, rounded once to the output dtype), and the
//! scale tensors are gone. Everything else is listed as it was.
//!
//! One module per scheme: `fp8` (DeepSeek/Kimi block-scaled FP8), `mxfp4`
//! (gpt-oss's expert blocks and scales), `nvfp4` (compressed-tensors'
//! `nvfp4-pack-quantized`), `gguf` (GGUF's block types, row by row),
//! `mlx` (MLX's affine, mxfp4, mxfp8 and nvfp4
//! modes, and the lossless repack between MLX affine 4-bit and GGUF Q4_1).
//! A scheme
//! is told from the tensors' names and dtypes; the model's configuration
//! (`config.json` beside the checkpoint, or passed in) gives what the
//! tensors cannot (the FP8 block size; whether a lone `_scales` or FP8
//! weight is an error), and a scheme it names that zt does
//! not dequantize is refused (`quant.Scheme`), so nothing is silently left
//! quantized.

pub mod config;
mod fp8;
mod gguf;
mod io;
pub mod mlx;
mod mxfp4;
mod nvfp4;
pub mod rules;
mod units;

use std::path::Path;

use serde_json::Value;
use zt_core::derive::Entry;
use zt_core::error::{Context, Error, Result};
use zt_core::{DType, Object, Source};

pub use config::Declared;
pub use rules::RULES;

/// How to dequantize.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The dequantized tensors' dtype: f32 (the default: the values as
    /// computed), or bf16 / f16 (rounded once), or f64.
    pub dtype: Option<DType>,
    /// The model's configuration (a `config.json`, or its
    /// `quantization_config` alone). `None`: the `config.json` beside the
    /// source's first file, when it is a local file that has one.
    pub config: Option<Value>,
}

/// One dequantized tensor: the object, the position it is listed at, and
/// every position it reads (listed no more).
#[derive(Debug)]
pub(crate) struct Group {
    at: usize,
    reads: Vec<usize>,
    object: Object,
}

/// The `config.json` beside `file`, if it is a local file that has one.
pub fn config_beside(file: &Path) -> Result<Option<Value>> {
    if zt_core::location::is_url(file) {
        return Ok(None);
    }
    let Some(path) = file.parent().map(|d| d.join(config::CONFIG_FILE)) else {
        return Ok(None);
    };
    let ctx = Context::file(&path);
    let text = match std::fs::metadata(&path) {
        Ok(meta) if meta.is_file() => {
            zt_core::Limits::check(&ctx, "config bytes", meta.len(), config::CONFIG_BYTES)?;
            std::fs::read(&path).map_err(|e| Error::Io {
                ctx: ctx.clone(),
                source: e,
            })?
        }
        _ => return Ok(None),
    };
    config::parse(&ctx, &text).map(Some)
}

/// `source` with every quantized weight it holds dequantized (see the
/// module docs). A scheme whose tensors disagree (a scale's shape, a
/// missing scale, a dtype the scheme does not use) is a `FormatError`
/// citing a `quant.*` rule, found here, before anything is read.
pub fn dequantize(source: &Source, options: &Options) -> Result<Source> {
    let file = source.files().first();
    let ctx = file.map(Context::file).unwrap_or_default();
    let to = options.dtype.unwrap_or(DType::F32);
    if io::output_width(to).is_none() {
        return Err(Error::unsupported(
            ctx,
            zt_core::Rule::WRITE_CAST,
            format!("dequantizing to {to}: zt dequantizes to f32, bf16, f16 or f64"),
        ));
    }
    let beside = match (&options.config, file) {
        (Some(_), _) | (None, None) => None,
        // A GGUF file carries its own quantization: a config.json that
        // happens to sit beside it says nothing of its blocks.
        (None, Some(_)) if source.format() == "gguf" => None,
        (None, Some(file)) => config_beside(file)?,
    };
    let declared = match options.config.as_ref().or(beside.as_ref()) {
        Some(config) => config::declared(&ctx, config)?,
        None => Declared::Nothing,
    };
    let block = match &declared {
        Declared::Fp8 { block } => Some(*block),
        _ => None,
    };
    let mut groups = fp8::plan(source, block, block.is_some(), to)?;
    groups.extend(mxfp4::plan(source, declared == Declared::Mxfp4, to)?);
    groups.extend(nvfp4::plan(source, to)?);
    groups.extend(gguf::plan(source, to)?);
    let mlx_config = match &declared {
        Declared::Mlx(c) => Some(c),
        _ => None,
    };
    groups.extend(mlx::plan(source, mlx_config, to)?);
    derive(source, &ctx, groups)
}

/// `source` with each group's object listed at its position and the
/// tensors it reads listed no more; everything else kept as it was. Two
/// groups reading one tensor are refused (`quant.Scheme`): which one it
/// belongs to cannot be told.
pub(crate) fn derive(source: &Source, ctx: &Context, groups: Vec<Group>) -> Result<Source> {
    if groups.is_empty() {
        return source.derive((0..source.len()).map(Entry::Kept).collect());
    }
    let mut anchor = vec![None; source.len()];
    let mut consumed = vec![false; source.len()];
    for (g, group) in groups.iter().enumerate() {
        anchor[group.at] = Some(g);
        for &r in &group.reads {
            // Two schemes claiming one tensor (names that fit both): which
            // one it is in cannot be told.
            if std::mem::replace(&mut consumed[r], true) {
                let name = source.tensor_at(r).map(|t| t.name().to_string());
                return Err(Error::header(
                    ctx.clone().tensor(name.unwrap_or_default()),
                    rules::SCHEME,
                    "a tensor two quantized weights read",
                ));
            }
        }
    }
    let mut groups: Vec<Option<Group>> = groups.into_iter().map(Some).collect();
    let mut entries = Vec::with_capacity(source.len());
    for position in 0..source.len() {
        match anchor[position] {
            Some(g) => {
                let group = groups[g].take().expect("one anchor per group");
                entries.push(Entry::New {
                    at: group.at,
                    object: group.object,
                    reads: group.reads,
                });
            }
            None if consumed[position] => {}
            None => entries.push(Entry::Kept(position)),
        }
    }
    source.derive(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use zt_core::{Catalog, Limits, Payload, Store};

    /// A source of `(name, dtype, shape, bytes)` tensors in one store.
    fn source(tensors: &[(&str, DType, Vec<u64>, Vec<u8>)]) -> Source {
        let mut bytes = Vec::new();
        let mut spans = Vec::new();
        for (_, _, _, b) in tensors {
            spans.push((bytes.len() as u64, b.len() as u64));
            bytes.extend_from_slice(b);
        }
        let store = Arc::new(Store::from_bytes("mem.safetensors", bytes));
        let objects = tensors
            .iter()
            .zip(spans)
            .map(|((name, dtype, shape, _), (offset, len))| {
                let payload = Payload::Stored {
                    store: Arc::clone(&store),
                    offset,
                    len,
                };
                Object::dense(*name, *dtype, shape.clone(), payload)
            })
            .collect();
        let catalog = Catalog {
            objects,
            ..Default::default()
        };
        Source::from_catalog("safetensors", store, catalog, Limits::default()).unwrap()
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn values(t: &zt_core::Tensor<'_>) -> Vec<f32> {
        let b = t.data().unwrap().bytes().unwrap();
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    /// A 2 x 3 x 5 weight in blocks of 2 x 2 (ragged both ways): every
    /// value its code's times its block's scale, listed in the weight's
    /// place, the scale gone, the other tensor kept.
    #[test]
    fn fp8_blocks_on_a_ceil_grid() {
        let (e, r, c) = (2u64, 3u64, 5u64);
        let codes: Vec<u8> = (0..e * r * c).map(|i| (i * 7 % 0x7e) as u8).collect();
        let (sr, sc) = (2u64, 3u64);
        let scales: Vec<f32> = (0..e * sr * sc).map(|i| 0.5 + i as f32).collect();
        let src = source(&[
            ("norm", DType::F32, vec![2], f32s(&[1.0, 2.0])),
            ("x.weight", DType::F8E4M3Fn, vec![e, r, c], codes.clone()),
            (
                "x.weight_scale_inv",
                DType::F32,
                vec![e, sr, sc],
                f32s(&scales),
            ),
        ]);
        let config = serde_json::json!({"quant_method": "fp8", "weight_block_size": [2, 2]});
        let options = Options {
            dtype: None,
            config: Some(config),
        };
        let out = dequantize(&src, &options).unwrap();
        assert_eq!(out.names().collect::<Vec<_>>(), ["norm", "x.weight"]);
        let w = out.tensor("x.weight").unwrap();
        assert_eq!(w.shape(), [e, r, c]);
        assert_eq!(w.data().unwrap().dtype(), DType::F32);
        let got = values(&w);
        for m in 0..e {
            for i in 0..r {
                for j in 0..c {
                    let at = ((m * r + i) * c + j) as usize;
                    let s = scales[((m * sr + i / 2) * sc + j / 2) as usize];
                    assert_eq!(got[at], fp8::e4m3fn(codes[at]) * s, "{m} {i} {j}");
                }
            }
        }
        // A range read (what a slice reads) is the whole tensor's bytes.
        let all = w.data().unwrap().bytes().unwrap().into_owned();
        let part = w.data().unwrap();
        let range = part.storage_range(13, 41).unwrap();
        assert_eq!(&range[..], &all[13..54]);
        // bf16: the f32 values rounded once.
        let options = Options {
            dtype: Some(DType::BF16),
            ..options
        };
        let bf = dequantize(&src, &options).unwrap();
        let b = bf
            .tensor("x.weight")
            .unwrap()
            .data()
            .unwrap()
            .bytes()
            .unwrap()
            .into_owned();
        let want: Vec<u8> = got
            .iter()
            .flat_map(|v| zt_core::cast::f32_to_bf16(*v).to_le_bytes())
            .collect();
        assert_eq!(b, want);
    }

    #[test]
    fn fp8_refusals_cite_their_rules() {
        let w = |shape: Vec<u64>| {
            let n = shape.iter().product::<u64>() as usize;
            ("w.weight", DType::F8E4M3Fn, shape, vec![0x38u8; n])
        };
        let s = |shape: Vec<u64>| {
            let n = shape.iter().product::<u64>() as usize;
            ("w.weight_scale_inv", DType::F32, shape, f32s(&vec![1.0; n]))
        };
        let refused = |tensors: &[(&str, DType, Vec<u64>, Vec<u8>)], config| {
            let options = Options {
                dtype: None,
                config,
            };
            dequantize(&source(tensors), &options).unwrap_err().rule()
        };
        // 300 columns need 3 blocks of 128.
        assert_eq!(
            refused(&[w(vec![4, 300]), s(vec![1, 2])], None),
            Some(rules::SCALE_SHAPE)
        );
        assert_eq!(refused(&[s(vec![1, 1])], None), Some(rules::MISSING));
        let fp8 = Some(serde_json::json!({"quant_method": "fp8"}));
        assert_eq!(refused(&[w(vec![4, 4])], fp8.clone()), Some(rules::MISSING));
        let bf16_weight = ("w.weight", DType::BF16, vec![2, 2], vec![0u8; 8]);
        assert_eq!(
            refused(&[bf16_weight, s(vec![1, 1])], None),
            Some(rules::DTYPE)
        );
        let unknown = Some(serde_json::json!({"quant_method": "bitnet"}));
        assert_eq!(refused(&[w(vec![4, 4])], unknown), Some(rules::SCHEME));
        // Without a configuration, an fp8 tensor with no scale is left as
        // it is.
        let plain = source(&[w(vec![2, 2])]);
        let out = dequantize(&plain, &Options::default()).unwrap();
        let t = out.tensor("w.weight").unwrap();
        assert_eq!(t.data().unwrap().dtype(), DType::F8E4M3Fn);
    }
}
