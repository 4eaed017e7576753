//! The one lossless move between schemes: MLX affine, 4 bits, group 32,
//! f16 scales and biases, is GGUF's Q4_1 (`d * q + m`, d and m f16, 32
//! codes a block), so a weight moves between the two by reordering
//! nibbles, never through floats.
//!
//! MLX packs a group's codes low nibble first (element `2k` in byte `k`'s
//! low nibble, `2k + 1` in its high one); a Q4_1 block holds `d`, `m`, then
//! 16 bytes whose low nibbles are elements 0..15 and high nibbles 16..31.
//!
//! `to_q4_1`: a source whose MLX weights (by the `config.json` beside it)
//! are `gguf.q4_1/1` objects under the weight's name, scales and biases
//! consumed, which the GGUF writer writes as they are; a quantized weight
//! of any other bits, group size, mode or scale dtype is refused
//! (`quant.Repack`), never dequantized behind the caller's back.
//! `from_q4_1`: the reverse, every Q4_1 tensor of a GGUF source as MLX's
//! `X.weight`, `X.scales`, `X.biases`.

use std::sync::Arc;

use zt_core::catalog::{Part, Value};
use zt_core::derive::Entry;
use zt_core::error::{Context, Error, Result};
use zt_core::{DType, Limits, Object, Payload, Source};

use super::{find, Found, Mode};
use crate::quant::units::{ByUnits, Units};
use crate::quant::{self, config, io, rules, Group};

/// Q4_1's layout as the GGUF plugin lists it, its ggml type id, block.
const Q4_1_LAYOUT: &str = "gguf.q4_1/1";
const Q4_1_ID: i64 = 3;
const BLOCK: usize = 20;
const GROUP: usize = 32;

/// MLX group (16 code bytes, low nibble first) to Q4_1's 16 bytes.
fn mlx_to_q4_1(codes: &[u8], out: &mut [u8]) {
    let q = |i: usize| (codes[i / 2] >> (4 * (i & 1))) & 0x0f;
    for (j, o) in out.iter_mut().enumerate() {
        *o = q(j) | (q(j + 16) << 4);
    }
}

/// Q4_1's 16 code bytes back to MLX's.
fn q4_1_to_mlx(qs: &[u8], out: &mut [u8]) {
    let q = |i: usize| {
        if i < 16 {
            qs[i] & 0x0f
        } else {
            qs[i - 16] >> 4
        }
    };
    for (k, o) in out.iter_mut().enumerate() {
        *o = q(2 * k) | (q(2 * k + 1) << 4);
    }
}

/// Whether `found` is the one MLX layout Q4_1 holds.
fn is_q4_1(found: &Found) -> bool {
    found.params.mode == Mode::Affine
        && found.params.bits == 4
        && found.params.group == GROUP as u64
        && found.scale_dtype == DType::F16
}

/// One MLX weight's rows as Q4_1 blocks.
#[derive(Debug)]
struct ToQ4_1 {
    found: Found,
}

impl Units for ToQ4_1 {
    const DESCRIBE: &'static str = "mlx-to-q4_1";
    const WHAT: &'static str = "Q4_1 blocks";

    fn count(&self) -> u64 {
        self.found.rows
    }

    fn unit_bytes(&self) -> u64 {
        self.found.groups_per_row() * BLOCK as u64
    }

    fn fill(&self, first: u64, out: &mut [u8], limits: &Limits) -> Result<()> {
        let f = &self.found;
        let count = out.len() as u64 / self.unit_bytes();
        let groups = count * f.groups_per_row();
        let packed = f.packed_row_bytes();
        let codes = io::read(&f.weight, first * packed, count * packed, limits)?;
        let at = first * f.groups_per_row() * 2;
        let d = io::read(&f.scales, at, groups * 2, limits)?;
        let biases = f.biases.as_ref().expect("affine has biases");
        let m = io::read(biases, at, groups * 2, limits)?;
        for (g, block) in out.chunks_exact_mut(BLOCK).enumerate() {
            block[0..2].copy_from_slice(&d[2 * g..2 * g + 2]);
            block[2..4].copy_from_slice(&m[2 * g..2 * g + 2]);
            mlx_to_q4_1(&codes[16 * g..16 * g + 16], &mut block[4..]);
        }
        Ok(())
    }
}

/// `source` with its MLX weights as Q4_1 objects, if the `config.json`
/// beside its first file declares MLX quantization; else `None` (nothing
/// to repack).
pub fn to_q4_1(source: &Source) -> Result<Option<Source>> {
    // Only a source with MLX's scale tensors reads the configuration: a
    // GGUF copy beside some other model's config.json is none of this.
    let Some(file) = source.files().first() else {
        return Ok(None);
    };
    if !source.names().any(|n| n.ends_with(".scales")) {
        return Ok(None);
    }
    match crate::quant::config_beside(file)? {
        Some(value) => to_q4_1_with(source, &value),
        None => Ok(None),
    }
}

/// [`to_q4_1`] with the model's configuration given (a `config.json`'s
/// JSON, or MLX's `quantization` alone).
pub fn to_q4_1_with(source: &Source, config: &serde_json::Value) -> Result<Option<Source>> {
    let ctx = io::first_file(source);
    let config::Declared::Mlx(mlx) = config::declared(&ctx, config)? else {
        return Ok(None);
    };
    let found = find(source, Some(&mlx))?;
    if found.is_empty() {
        return Ok(None);
    }
    let mut groups = Vec::with_capacity(found.len());
    for f in found {
        if !is_q4_1(&f) {
            return Err(Error::unsupported(
                ctx.tensor(format!("{}.weight", f.base)),
                rules::REPACK,
                format!(
                    "MLX {} {}-bit, group {}, {} scales has no lossless GGUF type (Q4_1 is affine \
                     4-bit, group 32, f16 scales); convert with dequantize=True for floats",
                    f.params.mode.name(),
                    f.params.bits,
                    f.params.group,
                    f.scale_dtype
                ),
            ));
        }
        let (at, reads) = (f.at_weight, f.reads());
        let len = f.rows * f.groups_per_row() * BLOCK as u64;
        let object = Object {
            name: format!("{}.weight", f.base),
            shape: f.shape.clone(),
            layout: Q4_1_LAYOUT.into(),
            parts: vec![Part {
                name: "data".into(),
                dtype: DType::U8,
                shape: vec![len],
                strides: None,
                payload: Payload::Decoded {
                    decoder: Arc::new(ByUnits(ToQ4_1 { found: f })),
                    decoded_len: len,
                },
            }],
            attributes: vec![
                ("ggml_type".into(), Value::Int(Q4_1_ID)),
                ("elems_per_block".into(), Value::Int(GROUP as i64)),
                ("block_bytes".into(), Value::Int(BLOCK as i64)),
            ],
        };
        groups.push(Group { at, reads, object });
    }
    quant::derive(source, &ctx, groups).map(Some)
}

/// Which of MLX's three tensors a reverse decoder produces.
#[derive(Debug, Clone, Copy)]
enum Piece {
    Weight,
    Scales,
    Biases,
}

/// One Q4_1 tensor's blocks as one of MLX's tensors.
#[derive(Debug)]
struct FromQ4_1 {
    blocks: Payload,
    /// Blocks per row.
    per_row: u64,
    rows: u64,
    piece: Piece,
}

impl FromQ4_1 {
    /// Output bytes per block.
    fn per_block(&self) -> u64 {
        match self.piece {
            Piece::Weight => 16,
            Piece::Scales | Piece::Biases => 2,
        }
    }
}

impl Units for FromQ4_1 {
    const DESCRIBE: &'static str = "q4_1-to-mlx";
    const WHAT: &'static str = "an MLX tensor";

    fn count(&self) -> u64 {
        self.rows
    }

    fn unit_bytes(&self) -> u64 {
        self.per_row * self.per_block()
    }

    fn fill(&self, first: u64, out: &mut [u8], limits: &Limits) -> Result<()> {
        let count = out.len() as u64 / self.unit_bytes();
        let row_in = self.per_row * BLOCK as u64;
        let blocks = io::read(&self.blocks, first * row_in, count * row_in, limits)?;
        let per = self.per_block() as usize;
        for (b, o) in blocks.chunks_exact(BLOCK).zip(out.chunks_exact_mut(per)) {
            match self.piece {
                Piece::Weight => q4_1_to_mlx(&b[4..], o),
                Piece::Scales => o.copy_from_slice(&b[0..2]),
                Piece::Biases => o.copy_from_slice(&b[2..4]),
            }
        }
        Ok(())
    }
}

/// The MLX object of `piece` for the Q4_1 tensor `t`.
fn mlx_object(file: &Context, t: &zt_core::Tensor<'_>, piece: Piece) -> Result<Object> {
    let ctx = file.clone().tensor(t.name());
    let part = match t.object().parts.as_slice() {
        [part] if part.strides.is_none() && part.dtype == DType::U8 => part,
        _ => {
            return Err(Error::header(
                ctx,
                rules::DTYPE,
                "Q4_1 blocks that are not one byte array",
            ))
        }
    };
    let shape = t.shape();
    let (&cols, lead) = shape.split_last().unwrap_or((&0, &[]));
    let rows = zt_core::dtype::num_elements(lead).unwrap_or(0);
    let per_row = cols / GROUP as u64;
    if shape.is_empty()
        || cols % GROUP as u64 != 0
        || rows * per_row * BLOCK as u64 != part.payload.len()
    {
        return Err(Error::header(
            ctx,
            rules::SCALE_SHAPE,
            format!(
                "Q4_1 blocks of {} bytes for shape {shape:?}",
                part.payload.len()
            ),
        ));
    }
    let base = t.name().strip_suffix(".weight").unwrap_or(t.name());
    let (name, dtype, last) = match piece {
        Piece::Weight => (format!("{base}.weight"), DType::U32, per_row * 4),
        Piece::Scales => (format!("{base}.scales"), DType::F16, per_row),
        Piece::Biases => (format!("{base}.biases"), DType::F16, per_row),
    };
    let mut out_shape = lead.to_vec();
    out_shape.push(last);
    let decoder = FromQ4_1 {
        blocks: part.payload.clone(),
        per_row,
        rows,
        piece,
    };
    let decoded_len = rows * decoder.unit_bytes();
    Ok(Object::dense(
        name,
        dtype,
        out_shape,
        Payload::Decoded {
            decoder: Arc::new(ByUnits(decoder)),
            decoded_len,
        },
    ))
}

/// `source` with every Q4_1 tensor as MLX's `X.weight` (u32), `X.scales`
/// and `X.biases` (f16), the config MLX needs being
/// `{"quantization": {"group_size": 32, "bits": 4}}`. Another block type
/// (which MLX cannot hold) is refused (`quant.Repack`); dense tensors are
/// kept. Listed: the weights in their tensors' places, then every scale,
/// then every bias.
pub fn from_q4_1(source: &Source) -> Result<Source> {
    let file = source
        .files()
        .first()
        .map(Context::file)
        .unwrap_or_default();
    let mut quantized = Vec::new();
    let mut entries = Vec::with_capacity(source.len());
    for (at, t) in source.tensors().enumerate() {
        match t.layout() {
            "dense" => entries.push(Entry::Kept(at)),
            Q4_1_LAYOUT => {
                let object = mlx_object(&file, &t, Piece::Weight)?;
                entries.push(Entry::New {
                    at,
                    object,
                    reads: vec![at],
                });
                quantized.push(at);
            }
            other => {
                return Err(Error::unsupported(
                    file.clone().tensor(t.name()),
                    rules::REPACK,
                    format!(
                        "a {other} tensor: MLX's layout holds GGUF's Q4_1 losslessly, no other block type"
                    ),
                ))
            }
        }
    }
    let weights = source.derive(entries)?;
    let side = |piece: Piece| -> Result<Source> {
        let picked = source.select(&quantized);
        let entries = (0..picked.len())
            .map(|at| {
                let t = picked.tensor_at(at).expect("a listed position");
                Ok(Entry::New {
                    at,
                    object: mlx_object(&file, &t, piece)?,
                    reads: vec![at],
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // The file's attributes stay with the weights' source alone.
        picked.derive(entries).map(Source::without_attributes)
    };
    Source::merge(vec![weights, side(Piece::Scales)?, side(Piece::Biases)?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibble_orders_round_trip() {
        let mlx: Vec<u8> = (0..16u8).map(|k| (2 * k) | ((2 * k + 1) << 4)).collect();
        let mut q = [0u8; 16];
        mlx_to_q4_1(&mlx, &mut q);
        // Q4_1: low nibble element j, high nibble element j + 16 (here
        // element i's code is i mod 16).
        for (j, &b) in q.iter().enumerate() {
            assert_eq!(b & 0x0f, j as u8);
            assert_eq!(b >> 4, j as u8);
        }
        let mut back = [0u8; 16];
        q4_1_to_mlx(&q, &mut back);
        assert_eq!(back.as_slice(), mlx.as_slice());
        for seed in 0..=255u8 {
            let codes: Vec<u8> = (0..16u8)
                .map(|i| i.wrapping_mul(seed).wrapping_add(seed))
                .collect();
            mlx_to_q4_1(&codes, &mut q);
            q4_1_to_mlx(&q, &mut back);
            assert_eq!(back.as_slice(), codes.as_slice());
        }
    }
}
