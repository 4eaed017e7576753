//! DeepSeek-V3/R1 and Kimi K2 FP8: `X.weight` in float8_e4m3fn beside
//! `X.weight_scale_inv` (f32), one scale per block of `[128, 128]` (or the
//! configuration's `weight_block_size`) on a ceil grid, so edge blocks are
//! partial. Each value is `f32(weight) * scale`, one f32 multiply, rounded
//! once to the output type: DeepSeek's `weight_dequant` and transformers'
//! `Fp8Dequantize` compute exactly that.

use std::sync::Arc;

use zt_core::error::{Context, Error, Result};
use zt_core::{DType, Decode, Limits, Object, Payload, Source, Tensor};

use super::io::{self, output_width};
use super::{rules, Group};

/// The suffix of a scale tensor's name.
const SCALE_SUFFIX: &str = "_scale_inv";

/// float8_e4m3fn as f32, by code: bias 7, no infinities, `S.1111.111` NaN.
static E4M3FN: [f32; 256] = e4m3fn_table();

/// float8_e4m3fn code `c` as f32.
pub(super) fn e4m3fn(c: u8) -> f32 {
    E4M3FN[usize::from(c)]
}

const fn e4m3fn_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut code = 0;
    while code < 256 {
        let exp = ((code >> 3) & 0x0f) as u32;
        let man = (code & 7) as u32;
        let magnitude = if exp == 0x0f && man == 7 {
            0x7fc0_0000
        } else if exp == 0 {
            // man * 2^-9: exact in f32 as a normal number (or zero).
            if man == 0 {
                0
            } else {
                let shift = man.leading_zeros() - 28; // its leading one to bit 3
                let m = (man << shift) & 7;
                ((127 - 6 - shift) << 23) | (m << 20)
            }
        } else {
            ((exp + 127 - 7) << 23) | (man << 20)
        };
        let sign = if code & 0x80 != 0 { 0x8000_0000u32 } else { 0 };
        t[code] = f32::from_bits(sign | magnitude);
        code += 1;
    }
    t
}

/// A block-scaled FP8 weight's geometry: `lead` matrices of `rows x cols`,
/// blocks of `block`, scales `lead x srows x scols`.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    rows: u64,
    cols: u64,
    block: [u64; 2],
    srows: u64,
    scols: u64,
}

impl Geometry {
    /// The scale row of flat weight row `r` (over every matrix).
    fn scale_row(&self, r: u64) -> u64 {
        (r / self.rows) * self.srows + (r % self.rows) / self.block[0]
    }
}

/// The decoder of one dequantized weight.
#[derive(Debug)]
struct Fp8Blocks {
    weight: Payload,
    scale: Payload,
    scale_dtype: DType,
    geometry: Geometry,
    /// Every row of every matrix.
    flat_rows: u64,
    to: DType,
}

impl Fp8Blocks {
    fn width(&self) -> u64 {
        output_width(self.to).unwrap_or(4)
    }

    /// Flat rows `[first, first + count)`, dequantized.
    fn rows(&self, first: u64, count: u64, limits: &Limits) -> Result<Vec<u8>> {
        let g = self.geometry;
        let row_out = g.cols * self.width();
        let ctx = Context::default();
        limits.check_decoded(&ctx, count * row_out)?;
        let mut out = zt_core::buffer::try_zeroed(&ctx, "a dequantized tensor", count * row_out)?;
        if count == 0 {
            return Ok(out);
        }
        let codes = io::read(&self.weight, first * g.cols, count * g.cols, limits)?;
        let (s0, s1) = (g.scale_row(first), g.scale_row(first + count - 1) + 1);
        let scale_width = self.scale_dtype.size().unwrap_or(4);
        let raw = io::read(
            &self.scale,
            s0 * g.scols * scale_width,
            (s1 - s0) * g.scols * scale_width,
            limits,
        )?;
        let scales: Vec<f32> = match self.scale_dtype {
            DType::BF16 => raw
                .chunks_exact(2)
                .map(|b| zt_core::cast::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            _ => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        };
        let (cols, bc, to) = (g.cols as usize, g.block[1] as usize, self.to);
        io::rows_in_parallel(&mut out, row_out as usize, |at, o| {
            let mut values = vec![0f32; cols];
            for (i, row_out) in o.chunks_exact_mut(row_out as usize).enumerate() {
                let r = first + (at + i) as u64;
                let srow = (g.scale_row(r) - s0) as usize * g.scols as usize;
                let local = (r - first) as usize * cols;
                let codes = &codes[local..local + cols];
                for ((v, c), s) in values
                    .chunks_mut(bc)
                    .zip(codes.chunks(bc))
                    .zip(&scales[srow..])
                {
                    for (v, &c) in v.iter_mut().zip(c) {
                        *v = e4m3fn(c) * s;
                    }
                }
                io::store(to, &values, row_out);
            }
        });
        Ok(out)
    }
}

impl Decode for Fp8Blocks {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        self.rows(0, self.flat_rows, limits)
    }

    fn describe(&self) -> &'static str {
        "fp8-block-dequant"
    }

    fn seeks(&self) -> bool {
        true
    }

    /// The rows the range covers, dequantized, then cut to it.
    fn decode_range(&self, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
        let row = self.geometry.cols * self.width();
        io::cut_to_range(start, len, row, |first, n| self.rows(first, n, limits))
    }
}

/// The one dense C-order part of a tensor of the scheme, or `quant.DType`.
pub(super) fn dense_part<'a>(t: &Tensor<'a>, ctx: &Context) -> Result<&'a zt_core::Part> {
    let object = t.object();
    match object.parts.as_slice() {
        [part] if object.layout == "dense" && part.strides.is_none() => Ok(part),
        _ => Err(Error::header(
            ctx.clone(),
            rules::DTYPE,
            format!("a {} tensor, not one dense C-order array", object.layout),
        )),
    }
}

/// Every `X.weight` + `X.weight_scale_inv` pair of `source`, each a group
/// whose object, named `X.weight`, decodes to `to`. `declared_block` is the
/// configuration's block size; `strict`: the configuration declares FP8, so
/// an FP8 weight without a scale is refused, not left as it is.
pub(super) fn plan(
    source: &Source,
    declared_block: Option<[u64; 2]>,
    strict: bool,
    to: DType,
) -> Result<Vec<Group>> {
    let block = declared_block.unwrap_or([128, 128]);
    let file = || {
        source
            .files()
            .first()
            .map(Context::file)
            .unwrap_or_default()
    };
    let mut groups = Vec::new();
    let mut scaled = std::collections::HashSet::new();
    for (at_scale, scale) in source.tensors().enumerate() {
        let Some(weight_name) = scale.name().strip_suffix(SCALE_SUFFIX) else {
            continue;
        };
        let ctx = file().tensor(scale.name());
        let Some(at) = source.position(weight_name) else {
            return Err(Error::header(
                ctx,
                rules::MISSING,
                format!("a block scale without its weight {weight_name:?}"),
            ));
        };
        let weight = source.tensor_at(at).expect("a listed position");
        let wctx = file().tensor(weight_name);
        let wpart = dense_part(&weight, &wctx)?;
        let spart = dense_part(&scale, &ctx)?;
        if wpart.dtype != DType::F8E4M3Fn {
            return Err(Error::header(
                wctx,
                rules::DTYPE,
                format!(
                    "a weight with a block scale in {}, not f8_e4m3fn",
                    wpart.dtype
                ),
            ));
        }
        if !matches!(spart.dtype, DType::F32 | DType::BF16) {
            return Err(Error::header(
                ctx,
                rules::DTYPE,
                format!("a block scale in {}, not f32 or bf16", spart.dtype),
            ));
        }
        let shape = weight.shape();
        let Some((&[rows, cols], lead)) = shape.split_last_chunk::<2>().map(|(l, r)| (r, l)) else {
            return Err(Error::header(
                wctx,
                rules::SCALE_SHAPE,
                format!("a block-scaled weight of shape {shape:?} (rank under 2)"),
            ));
        };
        let (srows, scols) = (rows.div_ceil(block[0]), cols.div_ceil(block[1]));
        let expected: Vec<u64> = lead.iter().copied().chain([srows, scols]).collect();
        if scale.shape() != expected.as_slice() {
            return Err(Error::header(
                ctx,
                rules::SCALE_SHAPE,
                format!(
                    "scale shape {:?} for a weight of shape {shape:?}: blocks of {block:?} need {expected:?}",
                    scale.shape()
                ),
            ));
        }
        let flat_rows = zt_core::dtype::num_elements(lead)
            .and_then(|l| l.checked_mul(rows))
            .ok_or_else(|| Error::Overflow {
                rule: zt_core::Rule::OVERFLOW,
                ctx: wctx.clone(),
                what: "row count",
            })?;
        let width = output_width(to).unwrap_or(4);
        let decoded_len = flat_rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(width))
            .ok_or_else(|| Error::Overflow {
                rule: zt_core::Rule::OVERFLOW,
                ctx: wctx.clone(),
                what: "dequantized size",
            })?;
        let decoder = Fp8Blocks {
            weight: wpart.payload.clone(),
            scale: spart.payload.clone(),
            scale_dtype: spart.dtype,
            geometry: Geometry {
                rows,
                cols,
                block,
                srows,
                scols,
            },
            flat_rows,
            to,
        };
        let object = Object::dense(
            weight_name,
            to,
            shape.to_vec(),
            Payload::Decoded {
                decoder: Arc::new(decoder),
                decoded_len,
            },
        );
        scaled.insert(at);
        groups.push(Group {
            at,
            reads: vec![at, at_scale],
            object,
        });
    }
    if strict {
        for (at, t) in source.tensors().enumerate() {
            let fp8 = t
                .object()
                .parts
                .first()
                .is_some_and(|p| p.dtype == DType::F8E4M3Fn);
            if fp8 && !scaled.contains(&at) {
                return Err(Error::header(
                    file().tensor(t.name()),
                    rules::MISSING,
                    format!("an fp8 weight without its {SCALE_SUFFIX} block scale"),
                ));
            }
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3fn_codes() {
        assert_eq!(E4M3FN[0x00], 0.0);
        assert_eq!(E4M3FN[0x80].to_bits(), 0x8000_0000);
        assert_eq!(E4M3FN[0x38], 1.0);
        assert_eq!(E4M3FN[0x7e], 448.0);
        assert_eq!(E4M3FN[0xfe], -448.0);
        assert_eq!(E4M3FN[0x01], 2f32.powi(-9));
        assert_eq!(E4M3FN[0x07], 7.0 * 2f32.powi(-9));
        assert_eq!(E4M3FN[0x08], 2f32.powi(-6));
        assert!(E4M3FN[0x7f].is_nan() && E4M3FN[0xff].is_nan());
        // Every code but the NaNs in order of magnitude.
        for c in 1..0x7e {
            assert!(E4M3FN[c] < E4M3FN[c + 1], "{c:#x}");
        }
    }
}
