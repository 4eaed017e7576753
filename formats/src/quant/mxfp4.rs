//! gpt-oss MXFP4 experts: `P_blocks` (u8, two e2m1 codes a byte, low
//! nibble first, `[experts, rows, groups, B]`) beside `P_scales` (u8 e8m0
//! exponents, `[experts, rows, groups]`), listed as `P` the way
//! transformers' `convert_moe_packed_tensors` returns it: each code's value
//! times `2^(scale - 127)` as `torch.ldexp` computes it (exact, or infinite
//! where it overflows; zero stays zero), rounded once, the
//! `[experts, rows, groups * 2B]` result transposed to
//! `[experts, groups * 2B, rows]`, the parameter's layout.

use std::sync::Arc;

use zt_core::error::{Error, Result};
use zt_core::{DType, Limits, Object, Payload, Source};

use super::fp8::dense_part;
use super::io::{self, output_width};
use super::units::{ByUnits, Units};
use super::{rules, Group};

const BLOCKS: &str = "_blocks";
const SCALES: &str = "_scales";

/// e2m1 values by 4-bit code (transformers' `FP4_VALUES`).
pub(super) static E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// `v * 2^(e - 127)` as `torch.ldexp` computes it: exact unless it
/// overflows to infinity (so zero stays zero even at e = 255, where the
/// power itself is past f32). Every power but 2^128 is an f32 (2^-127 a
/// subnormal), and an e2m1 value times it is exact or infinite; 2^128 is
/// taken as 2^127 twice.
pub(super) fn ldexp(v: f32, e: u8) -> f32 {
    match e {
        0 => v * f32::from_bits(1 << 22),
        255 => v * f32::from_bits(254 << 23) * 2.0,
        _ => v * f32::from_bits(u32::from(e) << 23),
    }
}

/// One expert-packed tensor's geometry.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    experts: u64,
    rows: u64,
    groups: u64,
    /// Bytes per group (two codes each).
    bytes: u64,
}

impl Geometry {
    /// Values per row of the packed side: the transposed output's rows.
    fn cols(&self) -> u64 {
        self.groups * self.bytes * 2
    }
}

#[derive(Debug)]
struct Mxfp4Experts {
    blocks: Payload,
    scales: Payload,
    geometry: Geometry,
    to: DType,
}

impl Units for Mxfp4Experts {
    const DESCRIBE: &'static str = "mxfp4-dequant";

    fn count(&self) -> u64 {
        self.geometry.experts
    }

    fn unit_bytes(&self) -> u64 {
        let g = self.geometry;
        g.rows * g.cols() * output_width(self.to).unwrap_or(4)
    }

    /// Experts from `first`, dequantized and transposed.
    fn fill(&self, first: u64, out: &mut [u8], limits: &Limits) -> Result<()> {
        let g = self.geometry;
        let per = self.unit_bytes();
        let count = out.len() as u64 / per;
        let packed = g.rows * g.groups * g.bytes;
        let codes = io::read(&self.blocks, first * packed, count * packed, limits)?;
        let nscales = g.rows * g.groups;
        let scales = io::read(&self.scales, first * nscales, count * nscales, limits)?;
        let (rows, groups, bytes) = (g.rows as usize, g.groups as usize, g.bytes as usize);
        let (to, width) = (self.to, output_width(self.to).unwrap_or(4) as usize);
        // Groups per tile: about TILE values of the packed side.
        // (Groups of no bytes make an empty output, which calls nothing.)
        let per_tile = (TILE / (2 * bytes).max(1)).max(1);
        let tile_cols = per_tile * 2 * bytes;
        io::rows_in_parallel(out, per as usize, |at, o| {
            // A tile of TILE packed rows by `tile_cols` values, decoded
            // straight into its transposed place (value k of row j at
            // `k * TILE + j`), then written a run of `n` rows at a time:
            // every read and write stays within a tile that fits in cache,
            // not an expert-sized f32 copy walked a column at a time.
            let mut tile = vec![0f32; tile_cols * TILE];
            for (i, expert_out) in o.chunks_exact_mut(per as usize).enumerate() {
                let e = at + i;
                let codes = &codes[e * rows * groups * bytes..(e + 1) * rows * groups * bytes];
                let scales = &scales[e * rows * groups..(e + 1) * rows * groups];
                for r0 in (0..rows).step_by(TILE) {
                    let n = TILE.min(rows - r0);
                    for g0 in (0..groups).step_by(per_tile) {
                        let gk = per_tile.min(groups - g0);
                        for j in 0..n {
                            let r = r0 + j;
                            let row_codes =
                                &codes[(r * groups + g0) * bytes..(r * groups + g0 + gk) * bytes];
                            let row_scales = &scales[r * groups + g0..r * groups + g0 + gk];
                            for (gi, (c, &s)) in
                                row_codes.chunks_exact(bytes).zip(row_scales).enumerate()
                            {
                                let lut: [f32; 16] = std::array::from_fn(|q| ldexp(E2M1[q], s));
                                for (q, &b) in c.iter().enumerate() {
                                    let k = gi * 2 * bytes + 2 * q;
                                    tile[k * TILE + j] = lut[usize::from(b & 0x0f)];
                                    tile[(k + 1) * TILE + j] = lut[usize::from(b >> 4)];
                                }
                            }
                        }
                        let k0 = g0 * 2 * bytes;
                        for k in 0..gk * 2 * bytes {
                            let at = ((k0 + k) * rows + r0) * width;
                            io::store(
                                to,
                                &tile[k * TILE..k * TILE + n],
                                &mut expert_out[at..at + n * width],
                            );
                        }
                    }
                }
            }
        });
        Ok(())
    }
}

/// Rows of the packed side transposed together (and about as many values
/// of each row): a tile of f32 that stays in the first-level cache.
const TILE: usize = 64;

/// Every `P_blocks` + `P_scales` pair of `source`, each a group whose
/// object, named `P`, decodes to `to`; `strict`: the configuration
/// declares MXFP4, so a `_blocks` tensor without its scales is refused.
pub(super) fn plan(source: &Source, strict: bool, to: DType) -> Result<Vec<Group>> {
    let file = || io::first_file(source);
    let mut groups = Vec::new();
    for (at_scales, scales) in source.tensors().enumerate() {
        let Some(base) = scales.name().strip_suffix(SCALES) else {
            continue;
        };
        let blocks_name = format!("{base}{BLOCKS}");
        let Some(at) = source.position(&blocks_name) else {
            // `_scales` alone is a common name outside MXFP4 (MLX's scales
            // are `.scales`), so only a declared scheme insists.
            if strict {
                return Err(Error::header(
                    file().tensor(scales.name()),
                    rules::MISSING,
                    format!("MXFP4 scales without their blocks {blocks_name:?}"),
                ));
            }
            continue;
        };
        let blocks = source.tensor_at(at).expect("a listed position");
        let (bctx, sctx) = (file().tensor(&blocks_name), file().tensor(scales.name()));
        let bpart = dense_part(&blocks, &bctx)?;
        let spart = dense_part(&scales, &sctx)?;
        if bpart.dtype != DType::U8 {
            return Err(Error::header(
                bctx,
                rules::DTYPE,
                format!("MXFP4 blocks in {}, not u8", bpart.dtype),
            ));
        }
        if !matches!(spart.dtype, DType::U8 | DType::F8E8M0) {
            return Err(Error::header(
                sctx,
                rules::DTYPE,
                format!("MXFP4 scales in {}, not u8 (e8m0)", spart.dtype),
            ));
        }
        let &[experts, rows, ngroups, bytes] = blocks.shape() else {
            return Err(Error::header(
                bctx,
                rules::SCALE_SHAPE,
                format!(
                    "MXFP4 expert blocks of shape {:?}, not [experts, rows, groups, bytes]",
                    blocks.shape()
                ),
            ));
        };
        if scales.shape() != [experts, rows, ngroups] || bytes == 0 {
            return Err(Error::header(
                sctx,
                rules::SCALE_SHAPE,
                format!(
                    "MXFP4 scales of shape {:?} for blocks of shape {:?}: one per block",
                    scales.shape(),
                    blocks.shape()
                ),
            ));
        }
        let geometry = Geometry {
            experts,
            rows,
            groups: ngroups,
            bytes,
        };
        let overflow = || Error::Overflow {
            rule: zt_core::Rule::OVERFLOW,
            ctx: bctx.clone(),
            what: "dequantized size",
        };
        let cols = ngroups
            .checked_mul(bytes)
            .and_then(|n| n.checked_mul(2))
            .ok_or_else(overflow)?;
        let decoded_len = experts
            .checked_mul(rows)
            .and_then(|n| n.checked_mul(cols))
            .and_then(|n| n.checked_mul(output_width(to).unwrap_or(4)))
            .ok_or_else(overflow)?;
        let decoder = Mxfp4Experts {
            blocks: bpart.payload.clone(),
            scales: spart.payload.clone(),
            geometry,
            to,
        };
        let object = Object::dense(
            base,
            to,
            vec![experts, cols, rows],
            Payload::Decoded {
                decoder: Arc::new(ByUnits(decoder)),
                decoded_len,
            },
        );
        groups.push(Group {
            at,
            reads: vec![at, at_scales],
            object,
        });
    }
    if strict {
        for t in source.tensors() {
            if let Some(base) = t.name().strip_suffix(BLOCKS) {
                if source.position(&format!("{base}{SCALES}")).is_none() {
                    return Err(Error::header(
                        file().tensor(t.name()),
                        rules::MISSING,
                        format!("MXFP4 blocks without their scales {base}{SCALES:?}"),
                    ));
                }
            }
        }
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldexp_is_exact_or_infinite() {
        assert_eq!(ldexp(1.5, 127), 1.5);
        assert_eq!(ldexp(0.5, 0), f32::from_bits(1 << 21)); // 2^-128
        assert_eq!(ldexp(-6.0, 1), -6.0 * 2f32.powi(-126));
        assert_eq!(ldexp(0.5, 255), 2f32.powi(127));
        assert_eq!(ldexp(1.0, 255), f32::INFINITY);
        assert_eq!(ldexp(-6.0, 254), f32::NEG_INFINITY);
        assert_eq!(ldexp(0.0, 255), 0.0);
        assert_eq!(ldexp(-0.0, 255).to_bits(), 0x8000_0000);
    }
}
