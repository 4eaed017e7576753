//! Dequantization of ggml block types to f32, bit for bit as
//! `gguf.quants.dequantize` (gguf-py) computes it: the same operations in
//! the same order, each rounded to f32 (no fused multiply-add).
//!
//! Supported: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K; dense F32, F16 and BF16 tensors convert too.

use crate::gguf::rules;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::Rule;
use zt_core::Tensor;

use super::types::{self, GgmlType};

/// IEEE binary16 bits to f32 (exact: every f16 is an f32; NaN payloads
/// keep their bits, as numpy's conversion keeps them).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h >> 10) & 0x1f;
    let man = u32::from(h) & 0x3ff;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: shift the mantissa up until its leading one is the
            // implicit bit, lowering the exponent as we go.
            let shift = man.leading_zeros() - 21;
            let man = (man << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (man << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// One block type's kernel: a block's bytes in, its elements out.
type Kernel = fn(&[u8], &mut [f32]);

fn kernel(ty: &GgmlType) -> Option<Kernel> {
    Some(match ty.name {
        "Q4_0" => q4_0,
        "Q4_1" => q4_1,
        "Q5_0" => q5_0,
        "Q5_1" => q5_1,
        "Q8_0" => q8_0,
        "Q2_K" => q2_k,
        "Q3_K" => q3_k,
        "Q4_K" => q4_k,
        "Q5_K" => q5_k,
        "Q6_K" => q6_k,
        _ => return None,
    })
}

/// Dequantize whole blocks of type `ty`.
pub fn dequantize_blocks(ty: &GgmlType, blocks: &[u8]) -> Result<Vec<f32>> {
    let ctx = Context::default();
    let Some(kernel) = kernel(ty) else {
        return Err(Error::Unsupported {
            rule: rules::DEQUANT,
            ctx,
            reason: format!("dequantizing {} is not implemented", ty.name),
        });
    };
    let bb = ty.block_bytes as usize;
    if blocks.len() % bb != 0 {
        return Err(Error::range(
            ctx,
            rules::DEQUANT,
            format!(
                "{} bytes are not whole {} blocks of {bb}",
                blocks.len(),
                ty.name
            ),
        ));
    }
    let epb = ty.elems_per_block as usize;
    let mut out = f32_buffer(&ctx, (blocks.len() / bb) as u64 * epb as u64)?;
    out.resize(blocks.len() / bb * epb, 0.0);
    for (block, dst) in blocks.chunks_exact(bb).zip(out.chunks_exact_mut(epb)) {
        kernel(block, dst);
    }
    Ok(out)
}

/// A tensor's elements as f32 in C order, within the default limits: see
/// [`dequantize_with`].
pub fn dequantize(tensor: &Tensor<'_>) -> Result<Vec<f32>> {
    dequantize_with(tensor, &Limits::default())
}

/// A tensor's elements as f32 in C order: a `gguf.<type>/1` object of a
/// supported block type, or a dense f32 / f16 / bf16 tensor. The output
/// (4 bytes per element) is checked against `limits.decoded_bytes` first.
pub fn dequantize_with(tensor: &Tensor<'_>, limits: &Limits) -> Result<Vec<f32>> {
    let part = tensor.data()?;
    let ctx = part.ctx();
    let elements = zt_core::dtype::num_elements(tensor.shape()).ok_or_else(|| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "element count",
    })?;
    let out_bytes = elements.checked_mul(4).ok_or_else(|| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "dequantized size",
    })?;
    limits.check_decoded(&ctx, out_bytes)?;
    let bytes = part.bytes()?;
    let out = if tensor.layout() == "dense" {
        let mut out = f32_buffer(&ctx, elements)?;
        dense_to_f32(part.dtype(), &bytes, &mut out).ok_or_else(|| Error::Unsupported {
            rule: rules::DEQUANT,
            ctx: ctx.clone(),
            reason: format!("dequantizing a dense {} tensor", part.dtype()),
        })?;
        out
    } else {
        let ty = types::by_layout(tensor.layout()).ok_or_else(|| Error::Unsupported {
            rule: rules::DEQUANT,
            ctx: ctx.clone(),
            reason: format!("layout {} is not a ggml block type", tensor.layout()),
        })?;
        dequantize_blocks(ty, &bytes).map_err(|e| {
            let e = e.in_tensor(tensor.name());
            match &ctx.file {
                Some(file) => e.in_file(file),
                None => e,
            }
        })?
    };
    if out.len() as u64 != elements {
        return Err(Error::range(
            ctx,
            rules::DEQUANT,
            format!("{} values for {elements} elements", out.len()),
        ));
    }
    Ok(out)
}

/// Whole rows of a `gguf.<type>/1` tensor as f32: the tensor seen as
/// `[rows, row]`, `row` its last dimension (ggml's blocks run along that
/// axis, so each row is whole blocks of its own), and the rows `rows` in
/// the order given: `rows.len() * row` values, in C order. Reads only those
/// rows' blocks (a run of consecutive rows as one read,
/// [`zt_core::PartRef::read_selection`]) and checks the output against
/// `limits.decoded_bytes` before reading. What slicing a quantized tensor
/// (`safe_open(...).get_slice`) reads through.
pub fn dequantize_rows_with(
    tensor: &Tensor<'_>,
    rows: &[u64],
    limits: &Limits,
) -> Result<Vec<f32>> {
    let part = tensor.data()?;
    let ctx = part.ctx();
    let ty = types::by_layout(tensor.layout()).ok_or_else(|| Error::Unsupported {
        rule: rules::DEQUANT,
        ctx: ctx.clone(),
        reason: format!("layout {} is not a ggml block type", tensor.layout()),
    })?;
    let kernel = kernel(ty).ok_or_else(|| Error::Unsupported {
        rule: rules::DEQUANT,
        ctx: ctx.clone(),
        reason: format!("dequantizing {} is not implemented", ty.name),
    })?;
    let overflow = |what| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what,
    };
    let shape = tensor.shape();
    let Some((&row, lead)) = shape.split_last() else {
        return Err(Error::range(
            ctx.clone(),
            rules::DEQUANT,
            "a rank-0 tensor has no rows",
        ));
    };
    let n_rows = zt_core::dtype::num_elements(lead).ok_or_else(|| overflow("row count"))?;
    if row % ty.elems_per_block != 0 {
        return Err(Error::range(
            ctx.clone(),
            rules::DEQUANT,
            format!(
                "rows of {row} elements are not whole {} blocks of {}",
                ty.name, ty.elems_per_block
            ),
        ));
    }
    let row_bytes = row / ty.elems_per_block * ty.block_bytes;
    if n_rows.checked_mul(row_bytes) != Some(part.nbytes()) {
        return Err(Error::range(
            ctx.clone(),
            rules::DEQUANT,
            format!(
                "{} bytes are not {n_rows} rows of {row_bytes}",
                part.nbytes()
            ),
        ));
    }
    if let Some(&bad) = rows.iter().find(|&&r| r >= n_rows) {
        return Err(Error::range(
            ctx.clone(),
            rules::DEQUANT,
            format!("row {bad} of {n_rows}"),
        ));
    }
    let values = (rows.len() as u64)
        .checked_mul(row)
        .ok_or_else(|| overflow("dequantized size"))?;
    limits.check_decoded(
        &ctx,
        values
            .checked_mul(4)
            .ok_or_else(|| overflow("dequantized size"))?,
    )?;
    let mut out = f32_buffer(&ctx, values)?;
    out.resize(values as usize, 0.0);
    let (bb, epb) = (ty.block_bytes as usize, ty.elems_per_block as usize);
    let mut done = 0;
    for run in rows.chunk_by(|a, b| a.checked_add(1) == Some(*b)) {
        let sel = zt_core::part::Sel {
            start: run[0] * row_bytes,
            count: run.len() as u64 * row_bytes,
            step: 1,
        };
        let bytes = part.read_selection(&[sel])?;
        let dst = &mut out[done..done + run.len() * row as usize];
        for (block, d) in bytes.chunks_exact(bb).zip(dst.chunks_exact_mut(epb)) {
            kernel(block, d);
        }
        done += dst.len();
    }
    Ok(out)
}

/// An empty f32 buffer with room for `n` values, or [`Error::Memory`].
fn f32_buffer(ctx: &Context, n: u64) -> Result<Vec<f32>> {
    let fail = || Error::Memory {
        ctx: ctx.clone(),
        what: "dequantized values",
        bytes: n.saturating_mul(4),
    };
    let n = usize::try_from(n).map_err(|_| fail())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| fail())?;
    Ok(v)
}

fn dense_to_f32(dtype: DType, b: &[u8], out: &mut Vec<f32>) -> Option<()> {
    match dtype {
        DType::F32 => out.extend(
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        ),
        DType::F16 => out.extend(b.chunks_exact(2).map(|c| f16_at(c, 0))),
        DType::BF16 => out.extend(
            b.chunks_exact(2)
                .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16)),
        ),
        _ => return None,
    }
    Some(())
}

/// The 4-bit quant of element `j` of a 32-element block whose 16 bytes of
/// nibbles hold elements 0-15 low and 16-31 high.
fn nibble(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    }
}

/// Q4_0: f16 d, 16 bytes of nibbles; x = d * (q - 8).
fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(&b[2..18], j) as i8 - 8);
    }
}

/// Q4_1: f16 d, f16 m, nibbles; x = d * q + m.
fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(&b[4..20], j)) + m;
    }
}

/// The fifth bit of element `j` from a little-endian u32 of high bits.
fn high_bit(qh: &[u8], j: usize) -> u8 {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    ((qh >> j) & 1) as u8
}

/// Q5_0: f16 d, u32 high bits, nibbles; x = d * (q - 16).
fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, o) in out.iter_mut().enumerate() {
        let q = nibble(&b[6..22], j) | (high_bit(&b[2..6], j) << 4);
        *o = d * f32::from(q as i8 - 16);
    }
}

/// Q5_1: f16 d, f16 m, u32 high bits, nibbles; x = d * q + m.
fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, o) in out.iter_mut().enumerate() {
        let q = nibble(&b[8..24], j) | (high_bit(&b[4..8], j) << 4);
        *o = d * f32::from(q) + m;
    }
}

/// Q8_0: f16 d, 32 signed bytes; x = q * d.
fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, o) in out.iter_mut().enumerate() {
        *o = f32::from(b[2 + j] as i8) * d;
    }
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of
/// 2-bit quants, f16 d, f16 dmin; x = (d * sc) * q - (dmin * m).
fn q2_k(b: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (e, o) in out.iter_mut().enumerate() {
        let (half, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let q = (qs[half * 32 + l] >> (2 * s)) & 3;
        let sc = scales[e / 16];
        let dl = d * f32::from(sc & 0x0f);
        let ml = dmin * f32::from(sc >> 4);
        *o = dl * f32::from(q) - ml;
    }
}

/// Q3_K: 32 bytes of high-bit mask, 64 bytes of 2-bit quants, 12 bytes of
/// packed 6-bit scales, f16 d; x = (d * (sc - 32)) * (q - 4 * !h).
fn q3_k(b: &[u8], out: &mut [f32]) {
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    let mut dl = [0f32; 16];
    for (k, v) in dl.iter_mut().enumerate() {
        let low = if k < 8 {
            scales[k] & 0x0f
        } else {
            scales[k - 8] >> 4
        };
        let high = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
        let sc = (low | (high << 4)) as i8 - 32;
        *v = d * f32::from(sc);
    }
    for (e, o) in out.iter_mut().enumerate() {
        let (s, l) = (e / 32, e % 32);
        let (half, s4) = (s / 4, s % 4);
        let ql = (qs[half * 32 + l] >> (2 * s4)) & 3;
        let qh = ((hmask[l] >> s) & 1) ^ 1;
        let q = ql as i8 - (qh << 2) as i8;
        *o = dl[e / 16] * f32::from(q);
    }
}

/// The 8 six-bit scales and mins of Q4_K / Q5_K's 12 packed bytes.
fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (d, m, md) = (&s[0..4], &s[4..8], &s[8..12]);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = d[j] & 0x3f;
        sc[j + 4] = (md[j] & 0x0f) | ((d[j] >> 2) & 0x30);
        mn[j] = m[j] & 0x3f;
        mn[j + 4] = (md[j] >> 4) | ((m[j] >> 2) & 0x30);
    }
    (sc, mn)
}

/// The low four bits of element `e` of a K-quant super-block whose 128
/// bytes hold 32-element groups as alternating low / high nibbles.
fn nibble_k(qs: &[u8], e: usize) -> u8 {
    let (chunk, s, l) = (e / 64, (e / 32) % 2, e % 32);
    (qs[chunk * 32 + l] >> (4 * s)) & 0x0f
}

/// Q4_K: f16 d, f16 dmin, 12 bytes of scales, 128 bytes of nibbles;
/// x = (d * sc) * q - (dmin * m).
fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = scale_min_k4(&b[4..16]);
    let ds: [f32; 8] = sc.map(|s| d * f32::from(s));
    let dm: [f32; 8] = mn.map(|m| dmin * f32::from(m));
    let qs = &b[16..144];
    for (e, o) in out.iter_mut().enumerate() {
        *o = ds[e / 32] * f32::from(nibble_k(qs, e)) - dm[e / 32];
    }
}

/// Q5_K: as Q4_K plus 32 bytes of fifth bits.
fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = scale_min_k4(&b[4..16]);
    let ds: [f32; 8] = sc.map(|s| d * f32::from(s));
    let dm: [f32; 8] = mn.map(|m| dmin * f32::from(m));
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for (e, o) in out.iter_mut().enumerate() {
        let h = (qh[e % 32] >> (e / 32)) & 1;
        let q = nibble_k(qs, e) | (h << 4);
        *o = ds[e / 32] * f32::from(q) - dm[e / 32];
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 signed
/// scales, f16 d; x = (d * sc) * (q - 32).
fn q6_k(b: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    let mut ds = [0f32; 16];
    for (i, v) in ds.iter_mut().enumerate() {
        *v = d * f32::from(scales[i] as i8);
    }
    for (e, o) in out.iter_mut().enumerate() {
        let (h, s, m) = (e / 128, (e / 64) % 2, e % 64);
        let low = (ql[h * 64 + m] >> (4 * s)) & 0x0f;
        let (s4, l) = ((e / 32) % 4, e % 32);
        let high = (qh[h * 32 + l] >> (2 * s4)) & 3;
        let q = (low | (high << 4)) as i8 - 32;
        *o = ds[e / 16] * f32::from(q);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_conversion() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
    }

    #[test]
    fn q8_0_block() {
        let mut block = vec![0x00, 0x40]; // d = 2.0
        block.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let ty = types::by_id(8).unwrap();
        let out = dequantize_blocks(ty, &block).unwrap();
        assert_eq!(out[0], -32.0);
        assert_eq!(out[31], 30.0);
        assert!(dequantize_blocks(ty, &block[..33]).is_err());
        assert!(dequantize_blocks(types::by_id(16).unwrap(), &[0; 66]).is_err());
    }
}
