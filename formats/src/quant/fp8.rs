//! DeepSeek-V3/R1 and Kimi K2 FP8: `X.weight` in float8_e4m3fn beside
//! `X.weight_scale_inv` (f32), one scale per block of `[128, 128]` (or the
//! configuration's `weight_block_size`) on a ceil grid, so edge blocks are
//! partial. Each value is `f32(weight) * scale`, one f32 multiply, rounded
//! once to the output type: DeepSeek's `weight_dequant` and transformers'
//! `Fp8Dequantize` compute exactly that.

use std::sync::Arc;

use zt_core::error::{Context, Error, Result};
use zt_core::{DType, Limits, Object, Payload, Source, Tensor};

use super::io::{self, output_width};
use super::units::{ByUnits, Units};
use super::{rules, Group};

/// The suffix of a scale tensor's name (DeepSeek, Kimi, transformers'
/// fine-grained FP8).
const SCALE_SUFFIX: &str = "_scale_inv";

/// The suffix compressed-tensors' `float-quantized` and vLLM/FBGEMM FP8
/// checkpoints give the same multiplier (`weight * weight_scale`, as
/// compressed-tensors' `dequantize` computes it).
const MULTIPLIER_SUFFIX: &str = "_scale";

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
    /// `rows x cols` under one scale: a single block as large as the
    /// matrix (a block of at least one value, so an empty weight has one
    /// scale row too).
    fn whole(rows: u64, cols: u64) -> Self {
        Geometry {
            rows,
            cols,
            block: [rows.max(1), cols.max(1)],
            srows: 1,
            scols: 1,
        }
    }

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
}

impl Units for Fp8Blocks {
    const DESCRIBE: &'static str = "fp8-block-dequant";
    /// Every value of every row is stored (`Run::fill`).
    const OVERWRITES: bool = true;

    fn count(&self) -> u64 {
        self.flat_rows
    }

    fn unit_bytes(&self) -> u64 {
        self.geometry.cols * self.width()
    }

    /// Flat rows from `first`, dequantized.
    fn fill(&self, first: u64, out: &mut [u8], limits: &Limits) -> Result<()> {
        let g = self.geometry;
        let row_out = self.unit_bytes();
        let count = out.len() as u64 / row_out;
        let codes = io::read(&self.weight, first * g.cols, count * g.cols, limits)?;
        let (s0, s1) = (g.scale_row(first), g.scale_row(first + count - 1) + 1);
        let scale_width = self.scale_dtype.size().unwrap_or(4);
        let raw = io::read(
            &self.scale,
            s0 * g.scols * scale_width,
            (s1 - s0) * g.scols * scale_width,
            limits,
        )?;
        let scales = io::floats(self.scale_dtype, &raw);
        let run = Run {
            codes: &codes,
            scales: &scales,
            geometry: g,
            first,
            s0,
            to: self.to,
        };
        match self.width() {
            2 => io::rows_in_parallel(out, row_out as usize, |at, o| run.fill::<2>(at, o)),
            8 => io::rows_in_parallel(out, row_out as usize, |at, o| run.fill::<8>(at, o)),
            _ => io::rows_in_parallel(out, row_out as usize, |at, o| run.fill::<4>(at, o)),
        }
        // The codes' buffer, for the next tensor's (a conversion recycles).
        zt_core::buffer::recycle(codes);
        Ok(())
    }
}

/// The smallest block (values) dequantized through per-block tables: a
/// table costs 256 products, so a block must have several times that.
const TABLE_FROM: u64 = 1024;

/// One scale's 256 products, each as the output type's `W` bytes.
type Table<const W: usize> = [[u8; W]; 256];

/// The rows one `rows` call dequantizes: their codes, the scale rows they
/// meet (from scale row `s0`), and where they start.
struct Run<'a> {
    codes: &'a [u8],
    scales: &'a [f32],
    geometry: Geometry,
    first: u64,
    s0: u64,
    to: DType,
}

impl Run<'_> {
    /// Rows `at..` of the run into `out` (whole rows of `cols * W`).
    ///
    /// Within one row of blocks every value is `f32(code) * scale` rounded
    /// to the output, a function of the code for each block's scale: so
    /// the 256 results are computed once per block and scale row (the same
    /// multiply and rounding, bit for bit) and each value is a table
    /// lookup, which costs far less than the multiply and rounding it
    /// replaces once a block has more than 256 values.
    fn fill<const W: usize>(&self, at: usize, out: &mut [u8]) {
        let g = self.geometry;
        let (cols, bc, scols) = (g.cols as usize, g.block[1] as usize, g.scols as usize);
        // Blocks too small to pay for their tables (a configuration's own
        // block size) are computed value by value.
        let tabled = g.block[0].saturating_mul(g.block[1]) >= TABLE_FROM;
        let mut tables: Vec<Table<W>> = vec![[[0u8; W]; 256]; if tabled { scols } else { 0 }];
        let mut built = None;
        for (i, row_out) in out.chunks_exact_mut(cols * W).enumerate() {
            let r = self.first + (at + i) as u64;
            let srow = g.scale_row(r) - self.s0;
            let local = (r - self.first) as usize * cols;
            let codes = &self.codes[local..local + cols];
            if !tabled {
                let scales = &self.scales[srow as usize * scols..];
                for ((o, c), &s) in row_out.chunks_mut(bc * W).zip(codes.chunks(bc)).zip(scales) {
                    for (o, &c) in o.chunks_exact_mut(W).zip(c) {
                        io::store(self.to, &[e4m3fn(c) * s], o);
                    }
                }
                continue;
            }
            if built != Some(srow) {
                let from = srow as usize * scols;
                for (t, &s) in tables.iter_mut().zip(&self.scales[from..from + scols]) {
                    table(self.to, s, t);
                }
                built = Some(srow);
            }
            for ((o, c), t) in row_out
                .chunks_mut(bc * W)
                .zip(codes.chunks(bc))
                .zip(&tables)
            {
                for (o, &c) in o.chunks_exact_mut(W).zip(c) {
                    o.copy_from_slice(&t[usize::from(c)]);
                }
            }
        }
    }
}

/// Every code's `f32(code) * scale`, rounded once to `to`, into `t`.
fn table<const W: usize>(to: DType, scale: f32, t: &mut Table<W>) {
    let values: [f32; 256] = std::array::from_fn(|c| E4M3FN[c] * scale);
    for (v, o) in values.iter().zip(t.iter_mut()) {
        io::store(to, std::slice::from_ref(v), o);
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

/// The geometry of an FP8 weight of `shape` under a scale of `scale`'s
/// shape: blocks of `block` on a ceil grid (`[..., ceil(rows / b0),
/// ceil(cols / b1)]`), one scale for the tensor (`[]` or `[1]`), or one per
/// row (`[..., rows, 1]`, compressed-tensors' channel strategy); else why
/// not.
fn geometry(
    shape: &[u64],
    scale: &[u64],
    block: [u64; 2],
) -> std::result::Result<Geometry, String> {
    let Some((&[rows, cols], lead)) = shape.split_last_chunk::<2>().map(|(l, r)| (r, l)) else {
        return match scale {
            // A vector (or a scalar) under one scale: one row.
            [] | [1] => Ok(Geometry::whole(1, shape.last().copied().unwrap_or(1))),
            _ => Err(format!(
                "scale shape {scale:?} for a weight of shape {shape:?}: a weight under 2-D blocks has rank 2 or more"
            )),
        };
    };
    let (srows, scols) = (rows.div_ceil(block[0]), cols.div_ceil(block[1]));
    let blocks: Vec<u64> = lead.iter().copied().chain([srows, scols]).collect();
    let channels: Vec<u64> = lead.iter().copied().chain([rows, 1]).collect();
    if scale == blocks.as_slice() {
        Ok(Geometry {
            rows,
            cols,
            // A block past the matrix covers it and no more: the same grid
            // and scales, and the kernels' block strides stay within a row
            // (a configuration's `weight_block_size` near 2^64 overflowed
            // them: fuzz/regressions/quant_config-fp8-block-past-usize).
            block: [block[0].min(rows.max(1)), block[1].min(cols.max(1))],
            srows,
            scols,
        })
    } else if matches!(scale, [] | [1]) {
        let flat = zt_core::dtype::num_elements(lead)
            .and_then(|l| l.checked_mul(rows))
            .ok_or_else(|| format!("a weight of shape {shape:?} past 2^64 rows"))?;
        Ok(Geometry::whole(flat, cols))
    } else if scale == channels.as_slice() {
        Ok(Geometry {
            rows,
            cols,
            block: [1, cols.max(1)],
            srows: rows,
            scols: 1,
        })
    } else {
        Err(format!(
            "scale shape {scale:?} for a weight of shape {shape:?}: blocks of {block:?} need {blocks:?} (or [] / [1] for one scale, {channels:?} for one a row)"
        ))
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
    let file = || io::first_file(source);
    let mut groups = Vec::new();
    let mut scaled = std::collections::HashSet::new();
    for (at_scale, scale) in source.tensors().enumerate() {
        let ctx = file().tensor(scale.name());
        let (weight_name, at) = if let Some(w) = scale.name().strip_suffix(SCALE_SUFFIX) {
            let Some(at) = source.position(w) else {
                return Err(Error::header(
                    ctx,
                    rules::MISSING,
                    format!("a block scale without its weight {w:?}"),
                ));
            };
            (w, at)
        } else if let Some(w) = scale.name().strip_suffix(MULTIPLIER_SUFFIX) {
            // `weight_scale` is also NVFP4's and int schemes' block scale:
            // an FP8 scale only beside an FP8 weight.
            let fp8 = |at: &usize| {
                let t = source.tensor_at(*at).expect("a listed position");
                t.object().parts.first().map(|p| p.dtype) == Some(DType::F8E4M3Fn)
            };
            match source.position(w).filter(fp8) {
                Some(at) => (w, at),
                None => continue,
            }
        } else {
            continue;
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
        if !matches!(spart.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::header(
                ctx,
                rules::DTYPE,
                format!("a block scale in {}, not f32, bf16 or f16", spart.dtype),
            ));
        }
        let shape = weight.shape();
        let geometry = geometry(shape, scale.shape(), block)
            .map_err(|reason| Error::header(ctx.clone(), rules::SCALE_SHAPE, reason))?;
        let flat_rows = zt_core::dtype::num_elements(shape)
            .map(|n| n / geometry.cols.max(1))
            .ok_or_else(|| Error::Overflow {
                rule: zt_core::Rule::OVERFLOW,
                ctx: wctx.clone(),
                what: "row count",
            })?;
        let cols = geometry.cols;
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
            geometry,
            flat_rows,
            to,
        };
        let object = Object::dense(
            weight_name,
            to,
            shape.to_vec(),
            Payload::Decoded {
                decoder: Arc::new(ByUnits(decoder)),
                decoded_len,
            },
        );
        scaled.insert(at);
        let base = weight_name.strip_suffix(".weight").unwrap_or(weight_name);
        let mut reads = vec![at, at_scale];
        reads.extend(io::activation_scales(source, base));
        groups.push(Group { at, reads, object });
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

    /// The per-block tables give each value `f32(code) * scale` rounded
    /// once, exactly as computing it value by value does: every code
    /// (NaNs and both zeros included) under scales that round differently
    /// in each output type, over two matrices with partial edge blocks,
    /// from a run that starts inside a block. Blocks too small for tables
    /// too; every byte of the output is written (`OVERWRITES`: the output
    /// starts as garbage, as a recycled buffer's old bytes).
    #[test]
    fn tables_equal_the_products() {
        for block in [[128u64, 128], [3, 5]] {
            products_of(block);
        }
    }

    fn products_of(block: [u64; 2]) {
        let (lead, rows, cols) = (2u64, 300u64, 260u64);
        let (srows, scols) = (rows.div_ceil(block[0]), cols.div_ceil(block[1]));
        let geometry = Geometry {
            rows,
            cols,
            block,
            srows,
            scols,
        };
        let codes: Vec<u8> = (0..lead * rows * cols)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
            .collect();
        let scales: Vec<f32> = (0..lead * srows * scols)
            .map(|i| f32::from_bits(0x3a83_126f + (i as u32) * 0x1_2345))
            .collect();
        let first = 37;
        let count = lead * rows - first;
        let s0 = geometry.scale_row(first);
        let local = &codes[(first * cols) as usize..];
        let scales_from = &scales[(s0 * scols) as usize..];
        for to in [DType::BF16, DType::F16, DType::F32, DType::F64] {
            let w = output_width(to).unwrap() as usize;
            let mut want = vec![0u8; count as usize * cols as usize * w];
            for (k, o) in want.chunks_exact_mut(w).enumerate() {
                let r = first + k as u64 / cols;
                let c = k as u64 % cols;
                let s = scales[(geometry.scale_row(r) * scols + c / block[1]) as usize];
                io::store(to, &[e4m3fn(codes[(r * cols + c) as usize]) * s], o);
            }
            let run = Run {
                codes: local,
                scales: scales_from,
                geometry,
                first,
                s0,
                to,
            };
            let mut got = vec![0xa5u8; want.len()];
            match w {
                2 => run.fill::<2>(0, &mut got),
                4 => run.fill::<4>(0, &mut got),
                _ => run.fill::<8>(0, &mut got),
            }
            assert!(got == want, "{to}, blocks {block:?}");
        }
    }

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
