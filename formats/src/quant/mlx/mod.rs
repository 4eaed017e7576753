//! MLX's quantized weights (`mx.quantize`, mlx-lm's checkpoints): `X.weight`
//! (u32, each row's codes a little-endian bit stream, `[..., cols * bits /
//! 32]`), `X.scales` (`[..., cols / group]`: f16, bf16 or f32 for affine,
//! u8 e8m0 for mxfp4/mxfp8, u8 e4m3 for nvfp4) and, for affine, `X.biases`
//! (as the scales), listed as `X.weight` `[..., cols]`. Bits, group size and
//! mode are not in the tensors: they come from the configuration's MLX
//! `quantization` (`params`), per layer where it says so.
//!
//! Values are computed in f32 (`scale * q + bias`, `code * scale`) and
//! rounded once to the output dtype. `mx.dequantize` on f16/bf16 scales
//! computes in that type and so rounds the product and the sum each; zt
//! matches MLX's f32 computation (its result on scales cast to f32), the
//! one rounding every other scheme here makes.
//!
//! `repack`: affine 4-bit, group 32, f16 scales is GGUF's Q4_1 (d = scale,
//! m = bias), moved between the two without going through floats.

mod kernel;
pub mod params;
pub mod repack;

use std::sync::Arc;

use zt_core::error::{Context, Error, Result};
use zt_core::{DType, Limits, Object, Payload, Source};

use super::fp8::{dense_part, e4m3fn};
use super::io::{self, output_width};
use super::units::{ByUnits, Units};
use super::{rules, Group};
use kernel::{Affine, Fp4, Fp8};
pub use params::{MlxConfig, Mode, Params};

const WEIGHT: &str = ".weight";
const SCALES: &str = ".scales";
const BIASES: &str = ".biases";

/// One MLX-quantized weight found in a source, its tensors checked
/// against each other and its configuration.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// The module path (`X`).
    pub base: String,
    pub at_weight: usize,
    pub at_scales: usize,
    pub at_biases: Option<usize>,
    pub params: Params,
    /// The weight's shape, its last dimension the values per row.
    pub shape: Vec<u64>,
    pub rows: u64,
    pub cols: u64,
    pub weight: Payload,
    pub scales: Payload,
    pub biases: Option<Payload>,
    /// The scales' (and biases') dtype.
    pub scale_dtype: DType,
}

impl Found {
    /// Every position it reads.
    pub fn reads(&self) -> Vec<usize> {
        let mut r = vec![self.at_weight, self.at_scales];
        r.extend(self.at_biases);
        r
    }

    pub fn groups_per_row(&self) -> u64 {
        self.cols / self.params.group
    }

    /// Packed bytes per row of the weight.
    pub fn packed_row_bytes(&self) -> u64 {
        self.cols * u64::from(self.params.bits) / 8
    }
}

/// Every `X.scales` of `source` with its `X.weight` (and `X.biases`),
/// checked: the dtypes MLX writes, shapes that agree with the layer's bits
/// and group size. `config` is the model's MLX quantization; without one a
/// u32 weight beside scales is refused (its bits cannot be told).
pub(crate) fn find(source: &Source, config: Option<&MlxConfig>) -> Result<Vec<Found>> {
    let file = || io::first_file(source);
    let mut found = Vec::new();
    for (at_scales, scale) in source.tensors().enumerate() {
        let Some(base) = scale.name().strip_suffix(SCALES) else {
            continue;
        };
        let sctx = file().tensor(scale.name());
        let weight_name = format!("{base}{WEIGHT}");
        let Some(at_weight) = source.position(&weight_name) else {
            // Without an MLX configuration a lone `X.scales` is a model's
            // own tensor of that name, left as it is.
            if config.is_none() {
                continue;
            }
            return Err(Error::header(
                sctx,
                rules::MISSING,
                format!("MLX scales without their weight {weight_name:?}"),
            ));
        };
        let weight = source.tensor_at(at_weight).expect("a listed position");
        let wctx = file().tensor(&weight_name);
        let wpart = dense_part(&weight, &wctx)?;
        if wpart.dtype != DType::U32 {
            // Not MLX's packing: another scheme's scales, or a model's own
            // tensor called `scales`, are none of this module's business.
            continue;
        }
        let Some(config) = config else {
            return Err(Error::unsupported(
                wctx,
                rules::SCHEME,
                "an MLX-quantized weight (u32 beside its scales), but no configuration \
                 (config.json's quantization) gives its bits and group size",
            ));
        };
        let Some(params) = config.for_layer(base) else {
            return Err(Error::unsupported(
                wctx,
                rules::SCHEME,
                format!("the configuration leaves {base:?} unquantized, but it has scales"),
            ));
        };
        let spart = dense_part(&scale, &sctx)?;
        let scale_ok = match params.mode {
            Mode::Affine => matches!(spart.dtype, DType::F16 | DType::BF16 | DType::F32),
            _ => spart.dtype == DType::U8,
        };
        if !scale_ok {
            return Err(Error::header(
                sctx,
                rules::DTYPE,
                format!("MLX {} scales in {}", params.mode.name(), spart.dtype),
            ));
        }
        let at_biases = source.position(&format!("{base}{BIASES}"));
        let affine = params.mode == Mode::Affine;
        let biases = match (at_biases, affine) {
            (None, true) => {
                return Err(Error::header(
                    wctx,
                    rules::MISSING,
                    format!("an MLX affine weight without its \"{base}{BIASES}\""),
                ))
            }
            (Some(at), false) => {
                let name = source.tensor_at(at).expect("a listed position");
                return Err(Error::header(
                    file().tensor(name.name()),
                    rules::SCHEME,
                    format!("MLX {} has no biases", params.mode.name()),
                ));
            }
            (Some(at), true) => {
                let t = source.tensor_at(at).expect("a listed position");
                let bctx = file().tensor(t.name());
                let part = dense_part(&t, &bctx)?;
                if part.dtype != spart.dtype {
                    return Err(Error::header(
                        bctx,
                        rules::DTYPE,
                        format!(
                            "MLX biases in {} beside scales in {}: MLX writes them alike",
                            part.dtype, spart.dtype
                        ),
                    ));
                }
                if t.shape() != scale.shape() {
                    return Err(Error::header(
                        bctx,
                        rules::SCALE_SHAPE,
                        format!(
                            "MLX biases of shape {:?} beside scales of shape {:?}",
                            t.shape(),
                            scale.shape()
                        ),
                    ));
                }
                Some(part.payload.clone())
            }
            (None, false) => None,
        };
        let shape = weight.shape();
        let Some((&packed, lead)) = shape.split_last().filter(|_| shape.len() >= 2) else {
            return Err(Error::header(
                wctx,
                rules::SCALE_SHAPE,
                format!("an MLX quantized weight of shape {shape:?}: MLX quantizes matrices"),
            ));
        };
        let bits = u64::from(params.bits);
        let cols = packed
            .checked_mul(32)
            .map(|b| b / bits)
            .filter(|c| c * bits == packed * 32);
        let want_scales = cols.filter(|c| c % params.group == 0).map(|c| {
            lead.iter()
                .copied()
                .chain([c / params.group])
                .collect::<Vec<u64>>()
        });
        let (Some(cols), Some(want)) = (cols, want_scales) else {
            return Err(Error::header(
                wctx,
                rules::SCALE_SHAPE,
                format!(
                    "an MLX weight of {packed} words a row is no whole number of groups of {} {bits}-bit values",
                    params.group
                ),
            ));
        };
        if scale.shape() != want.as_slice() {
            return Err(Error::header(
                sctx,
                rules::SCALE_SHAPE,
                format!(
                    "MLX scales of shape {:?} for a weight of {cols} values a row in groups of {}: want {want:?}",
                    scale.shape(),
                    params.group
                ),
            ));
        }
        let rows = zt_core::dtype::num_elements(lead).ok_or_else(|| Error::Overflow {
            rule: zt_core::Rule::OVERFLOW,
            ctx: wctx.clone(),
            what: "row count",
        })?;
        let mut out_shape = lead.to_vec();
        out_shape.push(cols);
        found.push(Found {
            base: base.to_string(),
            at_weight,
            at_scales,
            at_biases,
            params,
            shape: out_shape,
            rows,
            cols,
            weight: wpart.payload.clone(),
            scales: spart.payload.clone(),
            biases,
            scale_dtype: spart.dtype,
        });
    }
    Ok(found)
}

/// The decoder of one dequantized weight.
#[derive(Debug)]
struct Dequant {
    found: Found,
    to: DType,
}

impl Units for Dequant {
    const DESCRIBE: &'static str = "mlx-dequant";

    fn count(&self) -> u64 {
        self.found.rows
    }

    fn unit_bytes(&self) -> u64 {
        self.found.cols * output_width(self.to).unwrap_or(4)
    }

    /// Rows from `first`, dequantized.
    fn fill(&self, first: u64, out: &mut [u8], limits: &Limits) -> Result<()> {
        let f = &self.found;
        let row_out = self.unit_bytes();
        let count = out.len() as u64 / row_out;
        let packed = f.packed_row_bytes();
        let codes = io::read(&f.weight, first * packed, count * packed, limits)?;
        let per_row = f.groups_per_row();
        let width = f.scale_dtype.size().unwrap_or(1);
        let scale_bytes = io::read(
            &f.scales,
            first * per_row * width,
            count * per_row * width,
            limits,
        )?;
        let scales: Vec<f32> = match f.params.mode {
            Mode::Affine => io::floats(f.scale_dtype, &scale_bytes),
            Mode::Mxfp4 | Mode::Mxfp8 => scale_bytes.iter().map(|&e| kernel::e8m0(e)).collect(),
            Mode::Nvfp4 => scale_bytes.iter().map(|&e| e4m3fn(e)).collect(),
        };
        let biases = match &f.biases {
            Some(b) => io::floats(
                f.scale_dtype,
                &io::read(b, first * per_row * width, count * per_row * width, limits)?,
            ),
            None => Vec::new(),
        };
        let (cols, group, packed, per_row) = (
            f.cols as usize,
            f.params.group as usize,
            packed as usize,
            per_row as usize,
        );
        let (mode, bits, to) = (f.params.mode, f.params.bits, self.to);
        io::rows_in_parallel(out, row_out as usize, |at, o| {
            let mut values = vec![0f32; cols];
            for (i, row_out) in o.chunks_exact_mut(row_out as usize).enumerate() {
                let r = at + i;
                let codes = &codes[r * packed..(r + 1) * packed];
                let scales = &scales[r * per_row..(r + 1) * per_row];
                let biases = biases.get(r * per_row..(r + 1) * per_row).unwrap_or(&[]);
                if bits <= 4 {
                    // Codes of at most 4 bits: through per-group tables,
                    // straight to the output type.
                    let row = kernel::Row {
                        codes,
                        scales,
                        biases,
                        group,
                    };
                    match (mode, bits) {
                        (Mode::Affine, 1) => kernel::row_table(Affine::<1>, &row, to, row_out),
                        (Mode::Affine, 2) => kernel::row_table(Affine::<2>, &row, to, row_out),
                        (Mode::Affine, 3) => kernel::row_table(Affine::<3>, &row, to, row_out),
                        (Mode::Affine, _) => kernel::row_table(Affine::<4>, &row, to, row_out),
                        _ => kernel::row_table(Fp4, &row, to, row_out),
                    }
                    continue;
                }
                let v = &mut values;
                match (mode, bits) {
                    (Mode::Affine, 1) => kernel::row(Affine::<1>, codes, scales, biases, group, v),
                    (Mode::Affine, 2) => kernel::row(Affine::<2>, codes, scales, biases, group, v),
                    (Mode::Affine, 3) => kernel::row(Affine::<3>, codes, scales, biases, group, v),
                    (Mode::Affine, 4) => kernel::row(Affine::<4>, codes, scales, biases, group, v),
                    (Mode::Affine, 5) => kernel::row(Affine::<5>, codes, scales, biases, group, v),
                    (Mode::Affine, 6) => kernel::row(Affine::<6>, codes, scales, biases, group, v),
                    (Mode::Affine, _) => kernel::row(Affine::<8>, codes, scales, biases, group, v),
                    (Mode::Mxfp8, _) => kernel::row(Fp8, codes, scales, biases, group, v),
                    (Mode::Mxfp4 | Mode::Nvfp4, _) => {
                        kernel::row(Fp4, codes, scales, biases, group, v)
                    }
                }
                io::store(to, &values, row_out);
            }
        });
        Ok(())
    }
}

/// Every MLX-quantized weight of `source`, each a group whose object,
/// named `X.weight`, decodes to `to`.
pub(super) fn plan(source: &Source, config: Option<&MlxConfig>, to: DType) -> Result<Vec<Group>> {
    let mut groups = Vec::new();
    for found in find(source, config)? {
        let decoded_len = zt_core::dtype::num_elements(&found.shape)
            .and_then(|n| n.checked_mul(output_width(to).unwrap_or(4)))
            .ok_or_else(|| Error::Overflow {
                rule: zt_core::Rule::OVERFLOW,
                ctx: Context::default().tensor(format!("{}{WEIGHT}", found.base)),
                what: "dequantized size",
            })?;
        let (at, reads) = (found.at_weight, found.reads());
        let object = Object::dense(
            format!("{}{WEIGHT}", found.base),
            to,
            found.shape.clone(),
            Payload::Decoded {
                decoder: Arc::new(ByUnits(Dequant { found, to })),
                decoded_len,
            },
        );
        groups.push(Group { at, reads, object });
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, Options};
    use zt_core::{Catalog, Store};

    /// One store holding `(name, dtype, shape, bytes)` tensors.
    fn source(tensors: Vec<(&str, DType, Vec<u64>, Vec<u8>)>) -> Source {
        let bytes: Vec<u8> = tensors.iter().flat_map(|t| t.3.clone()).collect();
        let store = Arc::new(Store::from_bytes("mem.safetensors", bytes));
        let mut offset = 0;
        let objects = tensors
            .into_iter()
            .map(|(name, dtype, shape, b)| {
                let payload = Payload::Stored {
                    store: Arc::clone(&store),
                    offset,
                    len: b.len() as u64,
                };
                offset += b.len() as u64;
                Object::dense(name, dtype, shape, payload)
            })
            .collect();
        let catalog = Catalog {
            objects,
            ..Default::default()
        };
        Source::from_catalog("safetensors", store, catalog, Limits::default()).unwrap()
    }

    /// A 3-bit weight of 5 x 2 x 64 values (codes straddling words): every
    /// range of the dequantized bytes (what a piecewise conversion reads)
    /// is the whole tensor's bytes there, and the values are the formula's.
    #[test]
    fn ranges_are_the_whole_tensors_bytes() {
        let (lead, cols, group) = ([5u64, 2], 64u64, 32u64);
        let rows = (lead[0] * lead[1]) as usize;
        let packed: Vec<u8> = (0..rows * 24).map(|i| (i * 37 + 5) as u8).collect();
        let f16s = |v: Vec<f32>| -> Vec<u8> {
            v.into_iter()
                .flat_map(|x| zt_core::cast::f32_to_f16(x).to_le_bytes())
                .collect()
        };
        let groups = rows * 2;
        let scales: Vec<f32> = (0..groups).map(|g| 0.25 * (g as f32 + 1.0)).collect();
        let biases: Vec<f32> = (0..groups).map(|g| -(g as f32)).collect();
        let src = source(vec![
            ("x.weight", DType::U32, vec![5, 2, 6], packed.clone()),
            ("x.scales", DType::F16, vec![5, 2, 2], f16s(scales.clone())),
            ("x.biases", DType::F16, vec![5, 2, 2], f16s(biases.clone())),
        ]);
        let config = serde_json::json!({"quantization": {"group_size": group, "bits": 3}});
        let options = Options {
            dtype: None,
            config: Some(config),
        };
        let out = dequantize(&src, &options).unwrap();
        let w = out.tensor("x.weight").unwrap();
        assert_eq!(w.shape(), [5, 2, cols]);
        let all = w.data().unwrap().bytes().unwrap().into_owned();
        for (i, v) in all.chunks_exact(4).enumerate() {
            let bit = (i % 64) * 3 + (i / 64) * 192;
            let q = (u32::from(packed[bit / 8])
                | u32::from(packed.get(bit / 8 + 1).copied().unwrap_or(0)) << 8)
                >> (bit % 8)
                & 7;
            let want = scales[i / 32] * q as f32 + biases[i / 32];
            assert_eq!(f32::from_le_bytes(v.try_into().unwrap()), want, "value {i}");
        }
        let part = w.data().unwrap();
        for (start, len) in [
            (0, 4),
            (13, 41),
            (250, 700),
            (1000, all.len() as u64 - 1000),
        ] {
            let range = part.storage_range(start, len).unwrap();
            assert_eq!(&range[..], &all[start as usize..(start + len) as usize]);
        }
    }
}
