//! Dequantization of ggml block types to f32, bit for bit as
//! `gguf.quants.dequantize` (gguf-py 0.19) computes it: the same operations
//! in the same order, each rounded to f32 (no fused multiply-add).
//!
//! Every block type gguf-py dequantizes, one module per family: `legacy`
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), `kquants` (Q2_K...Q6_K), `iquants`
//! (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS,
//! with the lattice tables in `grids`), `ternary` (TQ1_0, TQ2_0) and `fp4`
//! (MXFP4, NVFP4); dense F32, F16 and BF16 tensors convert too. Types the
//! table lists that gguf-py does not dequantize (Q8_1, Q8_K, Q1_0; Q2_0,
//! of newer ggml, is not even a gguf-py type)
//! are refused with `gguf.Dequant`: there is no reference to match.
//!
//! Each kernel is written per block over fixed-size arrays (so the bounds
//! are known and the inner loops vectorize) and runs over a run of blocks;
//! a large output is cut into contiguous runs, one per core it warrants
//! ([`THREAD_OUTPUT`]), on scoped threads.

mod fp4;
mod grids;
mod iquants;
mod kquants;
mod legacy;
mod ternary;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::gguf::rules;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::Rule;
use zt_core::Tensor;

use super::types::{self, GgmlType};

/// IEEE binary16 bits to f32 (exact: every f16 is an f32; NaN payloads
/// keep their bits, as numpy's conversion keeps them).
#[inline]
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

#[inline]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// One block type's kernel over a run of whole blocks: `blocks` holds `n`
/// blocks, `out` their `n * elems_per_block` values.
type Kernel = fn(&[u8], &mut [f32]);

/// A [`Kernel`] from a per-block function of `$bb` bytes and `$epb` values.
///
/// The same portable loop is compiled twice: for the baseline x86-64 the
/// workspace targets (SSE2) and for AVX2, chosen at run time where the CPU
/// has it, so the compiler vectorizes each block at the wider width. The
/// per-block functions are `#[inline(always)]` so that they are compiled
/// into each copy. No FMA is enabled: gguf-py rounds every product and sum
/// to f32 on its own, and so must these.
macro_rules! blockwise {
    ($f:path, $bb:literal, $epb:literal) => {{
        #[inline(always)]
        fn each_block(blocks: &[u8], out: &mut [f32]) {
            let blocks = blocks.chunks_exact($bb);
            debug_assert_eq!(blocks.len(), out.len() / $epb);
            for (b, o) in blocks.zip(out.chunks_exact_mut($epb)) {
                // Always whole: chunks_exact hands out exactly $bb / $epb.
                if let (Ok(b), Ok(o)) = (b.try_into(), o.try_into()) {
                    $f(b, o);
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2")]
        fn with_avx2(blocks: &[u8], out: &mut [f32]) {
            each_block(blocks, out)
        }
        |blocks: &[u8], out: &mut [f32]| {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                return unsafe { with_avx2(blocks, out) };
            }
            each_block(blocks, out)
        }
    }};
}

/// The kernel of a block type, `None` for those zt does not dequantize.
/// Block geometry here must match [`types::TYPES`] (a test checks).
fn kernel(ty: &GgmlType) -> Option<Kernel> {
    let k: Kernel = match ty.name {
        "Q4_0" => blockwise!(legacy::q4_0, 18, 32),
        "Q4_1" => blockwise!(legacy::q4_1, 20, 32),
        "Q5_0" => blockwise!(legacy::q5_0, 22, 32),
        "Q5_1" => blockwise!(legacy::q5_1, 24, 32),
        "Q8_0" => blockwise!(legacy::q8_0, 34, 32),
        "Q2_K" => blockwise!(kquants::q2_k, 84, 256),
        "Q3_K" => blockwise!(kquants::q3_k, 110, 256),
        "Q4_K" => blockwise!(kquants::q4_k, 144, 256),
        "Q5_K" => blockwise!(kquants::q5_k, 176, 256),
        "Q6_K" => blockwise!(kquants::q6_k, 210, 256),
        "IQ2_XXS" => blockwise!(iquants::iq2_xxs, 66, 256),
        "IQ2_XS" => blockwise!(iquants::iq2_xs, 74, 256),
        "IQ2_S" => blockwise!(iquants::iq2_s, 82, 256),
        "IQ3_XXS" => blockwise!(iquants::iq3_xxs, 98, 256),
        "IQ3_S" => blockwise!(iquants::iq3_s, 110, 256),
        "IQ1_S" => blockwise!(iquants::iq1_s, 50, 256),
        "IQ1_M" => blockwise!(iquants::iq1_m, 56, 256),
        "IQ4_NL" => blockwise!(iquants::iq4_nl, 18, 32),
        "IQ4_XS" => blockwise!(iquants::iq4_xs, 136, 256),
        "TQ1_0" => blockwise!(ternary::tq1_0, 54, 256),
        "TQ2_0" => blockwise!(ternary::tq2_0, 66, 256),
        "MXFP4" => blockwise!(fp4::mxfp4, 17, 32),
        "NVFP4" => blockwise!(fp4::nvfp4, 36, 64),
        _ => return None,
    };
    Some(k)
}

/// Bytes of output each thread beyond the first needs: below this a
/// thread costs more to start than it saves.
const THREAD_OUTPUT: u64 = 4 << 20;

/// A run of blocks and the output it fills, waiting for a thread.
type Run<'a> = (&'a [u8], &'a mut [f32]);

/// Run `kernel` over whole blocks (`out.len() / epb` of them, `bb` bytes
/// each), cut into contiguous runs, one per core the output size warrants.
/// Every thread, the caller's included, takes the next run not yet taken,
/// so a thread the OS refuses to start only leaves more runs to the rest.
fn run(kernel: Kernel, bb: usize, epb: usize, blocks: &[u8], out: &mut [f32]) {
    let n = out.len() / epb;
    let threads = zt_core::copy::threads_for_pieces(out.len() as u64 * 4, THREAD_OUTPUT);
    if threads <= 1 || n < 2 {
        kernel(blocks, out);
        return;
    }
    let per = n.div_ceil(threads);
    let runs: Vec<Mutex<Option<Run<'_>>>> = blocks
        .chunks(per * bb)
        .zip(out.chunks_mut(per * epb))
        .map(|r| Mutex::new(Some(r)))
        .collect();
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(slot) = runs.get(next.fetch_add(1, Ordering::Relaxed)) {
            let taken = slot.lock().map(|mut r| r.take());
            if let Ok(Some((b, o))) = taken {
                kernel(b, o);
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..runs.len() {
            // A refused thread is no error: its run is taken by another.
            let _ = std::thread::Builder::new().spawn_scoped(s, work);
        }
        work();
    });
}

fn not_implemented(ctx: Context, ty: &GgmlType) -> Error {
    Error::Unsupported {
        rule: rules::DEQUANT,
        ctx,
        reason: format!(
            "dequantizing {} is not implemented (gguf-py 0.19 defines no dequantization for it)",
            ty.name
        ),
    }
}

/// Dequantize whole blocks of type `ty`.
pub fn dequantize_blocks(ty: &GgmlType, blocks: &[u8]) -> Result<Vec<f32>> {
    let ctx = Context::default();
    let Some(kernel) = kernel(ty) else {
        return Err(not_implemented(ctx, ty));
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
    run(kernel, bb, epb, blocks, &mut out);
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
    let width = if tensor.layout() == "dense" {
        part.dtype().size().unwrap_or(0)
    } else {
        0
    };
    let out = if width > 0 {
        if elements.checked_mul(width) != Some(bytes.len() as u64) {
            return Err(Error::range(
                ctx,
                rules::DEQUANT,
                format!("{} bytes for {elements} elements", bytes.len()),
            ));
        }
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
        // The blocks must be the shape's, checked before any output is
        // allocated for them.
        if ty.nbytes(elements) != Some(bytes.len() as u64) {
            return Err(Error::range(
                ctx.clone(),
                rules::DEQUANT,
                format!(
                    "{} bytes are not the {} blocks of {elements} elements",
                    bytes.len(),
                    ty.name
                ),
            ));
        }
        dequantize_blocks(ty, &bytes).map_err(|e| {
            let e = e.in_tensor(tensor.name());
            match &ctx.file {
                Some(file) => e.in_file(file),
                None => e,
            }
        })?
    };
    debug_assert_eq!(out.len() as u64, elements);
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
    let kernel = kernel(ty).ok_or_else(|| not_implemented(ctx.clone(), ty))?;
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
        self::run(kernel, bb, epb, &bytes, dst);
        done += dst.len();
    }
    Ok(out)
}

/// `n` f32s for a kernel to write, or [`Error::Memory`] (zeroed lazily by
/// the allocator, so the kernel's writes are the first touch).
fn f32_buffer(ctx: &Context, n: u64) -> Result<Vec<f32>> {
    zt_core::buffer::try_zeroed_f32(ctx, "dequantized values", n)
}

/// A dense float tensor's bytes (little-endian, `out.len()` elements) to
/// f32: exact, as numpy's `astype(np.float32)`. `None` for other dtypes.
fn dense_to_f32(dtype: DType, b: &[u8], out: &mut [f32]) -> Option<()> {
    match dtype {
        DType::F32 => {
            for (c, o) in b.chunks_exact(4).zip(out) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (c, o) in b.chunks_exact(2).zip(out) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        DType::BF16 => {
            for (c, o) in b.chunks_exact(2).zip(out) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
            }
        }
        _ => return None,
    }
    Some(())
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
        assert!(dequantize_blocks(types::by_id(15).unwrap(), &[0; 292]).is_err());
    }

    /// Every kernel's block geometry is the type table's: `n` blocks of
    /// random bytes give `n * elems_per_block` values, each block's the same
    /// alone as in a run (so no kernel reads past its block), and a run
    /// split over threads gives what one thread gives.
    #[test]
    fn kernels_match_the_type_table() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut byte = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        };
        let mut covered = 0;
        for ty in types::TYPES.iter().filter(|t| t.is_quantized()) {
            let Some(k) = kernel(ty) else {
                assert!(
                    ["Q8_1", "Q8_K", "Q1_0", "Q2_0"].contains(&ty.name),
                    "{}",
                    ty.name
                );
                continue;
            };
            covered += 1;
            let (bb, epb) = (ty.block_bytes as usize, ty.elems_per_block as usize);
            let n = 5;
            let blocks: Vec<u8> = (0..n * bb).map(|_| byte()).collect();
            let whole = dequantize_blocks(ty, &blocks).unwrap();
            assert_eq!(whole.len(), n * epb, "{}", ty.name);
            for i in 0..n {
                let mut one = vec![0f32; epb];
                k(&blocks[i * bb..(i + 1) * bb], &mut one);
                let want = &whole[i * epb..(i + 1) * epb];
                assert!(
                    one.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{}",
                    ty.name
                );
            }
            assert!(dequantize_blocks(ty, &blocks[..bb * n - 1]).is_err());
            // Enough blocks for several threads.
            let many: Vec<u8> = blocks.iter().copied().cycle().take(bb * 40_000).collect();
            let mut alone = vec![0f32; 40_000 * epb];
            k(&many, &mut alone);
            let split = dequantize_blocks(ty, &many).unwrap();
            assert!(alone
                .iter()
                .zip(&split)
                .all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        assert_eq!(covered, 23);
    }

    /// The tables every i-quant decoder indexes, checked for what ggml
    /// builds them from (their values, against gguf-py's, are checked by
    /// `tests/test_gguf_quants.py`).
    #[test]
    fn grids_are_well_formed() {
        use grids::*;
        for (i, s) in KSIGNS.iter().enumerate() {
            // Seven sign bits, the eighth their parity (an even count).
            assert_eq!(*s, i as u8 | (((i as u8).count_ones() as u8 & 1) << 7));
        }
        let rows8 = |grid: &[u64], allowed: &[u8]| {
            let mut seen = std::collections::HashSet::new();
            for row in grid {
                assert!(row.to_le_bytes().iter().all(|b| allowed.contains(b)));
                assert!(seen.insert(*row), "{row:#x} twice");
            }
        };
        rows8(&IQ2XXS_GRID, &[0x08, 0x19, 0x2b]);
        rows8(&IQ2XS_GRID, &[0x08, 0x19, 0x2b]);
        rows8(&IQ2S_GRID, &[0x08, 0x19, 0x2b]);
        rows8(&IQ1S_GRID, &[0xff, 0x00, 0x01]);
        let rows4 = |grid: &[u32], allowed: &[u8]| {
            let mut seen = std::collections::HashSet::new();
            for row in grid {
                assert!(row.to_le_bytes().iter().all(|b| allowed.contains(b)));
                assert!(seen.insert(*row), "{row:#x} twice");
            }
        };
        rows4(
            &IQ3XXS_GRID,
            &[0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e],
        );
        rows4(
            &IQ3S_GRID,
            &[0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f],
        );
    }
}
