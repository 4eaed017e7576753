//! compressed-tensors NVFP4 (`nvfp4-pack-quantized`): `X.weight_packed`
//! (u8, two e2m1 codes a byte, low nibble first, `[rows, cols / 2]`),
//! `X.weight_scale` (float8_e4m3fn, one per 16 values, `[rows, cols / 16]`)
//! and `X.weight_global_scale` (f32, `[1]` or `[]`), listed as `X.weight`
//! `[rows, cols]` the way `NVFP4PackedCompressor.decompress` computes it:
//! the block scale divided by the global scale in f32 (a division, not a
//! multiplied reciprocal, which rounds differently), times the code's
//! value in f32, rounded once to the output type. The activations' scales
//! beside it (`X.input_global_scale`, `X.input_scale`) scale a quantized
//! layer's inputs at inference: meaningless for the dequantized weight,
//! they are consumed with it (not listed).

use std::sync::Arc;

use zt_core::error::{Error, Result};
use zt_core::{DType, Limits, Object, Payload, Source};

use super::fp8::{dense_part, e4m3fn};
use super::io::{self, output_width};
use super::mxfp4::E2M1;
use super::units::{ByUnits, Units};
use super::{rules, Group};

const PACKED: &str = ".weight_packed";
const SCALE: &str = ".weight_scale";
const GLOBAL: &str = ".weight_global_scale";

/// Values per block scale.
const GROUP: u64 = 16;

#[derive(Debug)]
struct Nvfp4 {
    packed: Payload,
    scale: Payload,
    global: Payload,
    rows: u64,
    cols: u64,
    to: DType,
}

impl Units for Nvfp4 {
    const DESCRIBE: &'static str = "nvfp4-dequant";

    fn count(&self) -> u64 {
        self.rows
    }

    fn unit_bytes(&self) -> u64 {
        self.cols * output_width(self.to).unwrap_or(4)
    }

    fn fill(&self, first: u64, out: &mut [u8], limits: &Limits) -> Result<()> {
        let row_out = self.unit_bytes();
        let count = out.len() as u64 / row_out;
        let half = self.cols / 2;
        let codes = io::read(&self.packed, first * half, count * half, limits)?;
        let per_row = self.cols / GROUP;
        let scales = io::read(&self.scale, first * per_row, count * per_row, limits)?;
        let g = io::read(&self.global, 0, 4, limits)?;
        let global = f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
        let (cols, to) = (self.cols as usize, self.to);
        io::rows_in_parallel(out, row_out as usize, |at, o| {
            let mut values = vec![0f32; cols];
            for (i, row_out) in o.chunks_exact_mut(row_out as usize).enumerate() {
                let r = at + i;
                let codes = &codes[r * cols / 2..(r + 1) * cols / 2];
                let scales = &scales[r * cols / GROUP as usize..];
                for ((v, c), &s) in values
                    .chunks_exact_mut(GROUP as usize)
                    .zip(codes.chunks_exact(GROUP as usize / 2))
                    .zip(scales)
                {
                    let s = e4m3fn(s) / global;
                    for (pair, &q) in v.chunks_exact_mut(2).zip(c) {
                        pair[0] = E2M1[usize::from(q & 0x0f)] * s;
                        pair[1] = E2M1[usize::from(q >> 4)] * s;
                    }
                }
                io::store(to, &values, row_out);
            }
        });
        Ok(())
    }
}

/// Every `X.weight_packed` of `source` with its scale and global scale,
/// each a group whose object, named `X.weight`, decodes to `to`.
pub(super) fn plan(source: &Source, to: DType) -> Result<Vec<Group>> {
    let file = || io::first_file(source);
    let mut groups = Vec::new();
    for (at, packed) in source.tensors().enumerate() {
        let Some(base) = packed.name().strip_suffix(PACKED) else {
            continue;
        };
        let pctx = file().tensor(packed.name());
        let find = |suffix: &str| {
            let name = format!("{base}{suffix}");
            match source.position(&name) {
                Some(p) => Ok(p),
                None => Err(Error::header(
                    pctx.clone(),
                    rules::MISSING,
                    format!("NVFP4 packed weight without its {name:?}"),
                )),
            }
        };
        let (at_scale, at_global) = (find(SCALE)?, find(GLOBAL)?);
        let scale = source.tensor_at(at_scale).expect("a listed position");
        let global = source.tensor_at(at_global).expect("a listed position");
        let (sctx, gctx) = (file().tensor(scale.name()), file().tensor(global.name()));
        let ppart = dense_part(&packed, &pctx)?;
        let spart = dense_part(&scale, &sctx)?;
        let gpart = dense_part(&global, &gctx)?;
        for (part, want, ctx) in [
            (ppart, DType::U8, &pctx),
            (spart, DType::F8E4M3Fn, &sctx),
            (gpart, DType::F32, &gctx),
        ] {
            if part.dtype != want {
                return Err(Error::header(
                    ctx.clone(),
                    rules::DTYPE,
                    format!("an NVFP4 tensor in {}, not {want}", part.dtype),
                ));
            }
        }
        let &[rows, half] = packed.shape() else {
            return Err(Error::header(
                pctx,
                rules::SCALE_SHAPE,
                format!(
                    "an NVFP4 packed weight of shape {:?}, not 2-D",
                    packed.shape()
                ),
            ));
        };
        let cols = half.checked_mul(2).ok_or_else(|| Error::Overflow {
            rule: zt_core::Rule::OVERFLOW,
            ctx: pctx.clone(),
            what: "column count",
        })?;
        if cols % GROUP != 0 || scale.shape() != [rows, cols / GROUP] {
            return Err(Error::header(
                sctx,
                rules::SCALE_SHAPE,
                format!(
                    "NVFP4 scales of shape {:?} for a [{rows}, {cols}] weight: one per {GROUP} values",
                    scale.shape()
                ),
            ));
        }
        // `[1]` as compressed-tensors writes it, `[]` as other writers do:
        // one value either way.
        if !matches!(global.shape(), [] | [1]) {
            return Err(Error::header(
                gctx,
                rules::SCALE_SHAPE,
                format!(
                    "an NVFP4 global scale of shape {:?}, not [1] or []",
                    global.shape()
                ),
            ));
        }
        let decoded_len = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(output_width(to).unwrap_or(4)))
            .ok_or_else(|| Error::Overflow {
                rule: zt_core::Rule::OVERFLOW,
                ctx: pctx.clone(),
                what: "dequantized size",
            })?;
        let decoder = Nvfp4 {
            packed: ppart.payload.clone(),
            scale: spart.payload.clone(),
            global: gpart.payload.clone(),
            rows,
            cols,
            to,
        };
        let object = Object::dense(
            format!("{base}.weight"),
            to,
            vec![rows, cols],
            Payload::Decoded {
                decoder: Arc::new(ByUnits(decoder)),
                decoded_len,
            },
        );
        let mut reads = vec![at, at_scale, at_global];
        reads.extend(io::activation_scales(source, base));
        groups.push(Group { at, reads, object });
    }
    Ok(groups)
}
