//! Casting floating tensors between `f64`, `f32`, `f16` and `bf16` as torch
//! casts them (`tensor.to(dtype)`), bit for bit: every narrowing rounds to
//! nearest, ties to even; a value past the target's range becomes infinity;
//! subnormals are kept (no flush to zero); a NaN stays a NaN (torch's own:
//! `0x7FC0` for bf16, the sign and `0x7E00` for f16). From `f64` to a
//! 16-bit type torch rounds through `f32` (its `Half` and `BFloat16` are
//! built from a `float`), so zt does too.
//!
//! [`Cast`] is the decoder a conversion's `dtype` puts in place of a part's
//! payload: it reads the original bytes in pieces of [`PIECE`] (by `pread`
//! from a mapped local file, so no page of the source stays mapped into the
//! process) and converts each into the output, so a cast never holds more
//! than the output and one piece.

use std::os::unix::fs::FileExt;

use crate::catalog::{Decode, Payload};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::limits::Limits;

/// How many source bytes a [`Cast`] reads at a time.
pub const PIECE: u64 = 8 << 20;

/// The floating types a cast reads and writes.
pub fn castable(dtype: DType) -> bool {
    matches!(dtype, DType::F64 | DType::F32 | DType::F16 | DType::BF16)
}

/// `bf16` bits to `f32` (exact).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `f32` to `bf16` bits, as torch's `round_to_nearest_even`: ties to even,
/// overflow to infinity, a NaN to `0x7FC0`.
pub fn f32_to_bf16(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7FC0;
    }
    let bits = x.to_bits();
    let bias = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(bias) >> 16) as u16
}

/// `f16` bits to `f32` (exact: subnormals become normal `f32`s).
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits & 0x8000) as u32) << 16;
    let exp = ((bits >> 10) & 0x1F) as u32;
    let mant = (bits & 0x3FF) as u32;
    let magnitude = match exp {
        0 => {
            // 0 or a subnormal: mant * 2^-24, exact in f32.
            let v = mant as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        0x1F => 0x7F80_0000 | (mant << 13),
        _ => ((exp + 112) << 23) | (mant << 13),
    };
    f32::from_bits(sign | magnitude)
}

/// `f32` to `f16` bits, IEEE round to nearest, ties to even (as torch's
/// `fp16_ieee_from_fp32_value`): overflow to infinity, subnormal results
/// kept, a NaN to the sign and `0x7E00`.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return sign | 0x7E00;
    }
    let exp = (abs >> 23) as i32;
    let mant = abs & 0x7F_FFFF;
    let e = exp - 112; // the f16 biased exponent
    if e >= 31 {
        return sign | 0x7C00; // infinity, or past f16's range
    }
    if e <= 0 {
        // An f16 subnormal (or zero): units of 2^-24, `shift` bits dropped.
        let shift = (14 - e) as u32;
        if shift > 24 || exp == 0 {
            return sign; // under half the smallest subnormal
        }
        let m = mant | 0x80_0000;
        let mut k = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        if rem > half || (rem == half && k & 1 == 1) {
            k += 1;
        }
        return sign | k as u16;
    }
    let mut k = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1FFF;
    if rem > 0x1000 || (rem == 0x1000 && k & 1 == 1) {
        k += 1; // may carry into the exponent, up to infinity
    }
    sign | k as u16
}

/// Convert `src` (elements of `from`) into `dst` (elements of `to`); both
/// hold the same number of elements. `from` and `to` are [`castable`].
pub fn cast_slice(from: DType, to: DType, src: &[u8], dst: &mut [u8]) {
    let (fs, ts) = (width(from), width(to));
    debug_assert_eq!(src.len() / fs, dst.len() / ts);
    if from == to {
        dst.copy_from_slice(src);
        return;
    }
    if to == DType::F64 {
        for (s, d) in src.chunks_exact(fs).zip(dst.chunks_exact_mut(8)) {
            d.copy_from_slice(&(read_f32(from, s) as f64).to_le_bytes());
        }
        return;
    }
    for (s, d) in src.chunks_exact(fs).zip(dst.chunks_exact_mut(ts)) {
        let x = read_f32(from, s);
        match to {
            DType::F32 => d.copy_from_slice(&x.to_le_bytes()),
            DType::F16 => d.copy_from_slice(&f32_to_f16(x).to_le_bytes()),
            DType::BF16 => d.copy_from_slice(&f32_to_bf16(x).to_le_bytes()),
            _ => unreachable!("castable"),
        }
    }
}

/// One element as `f32`: exact from the 16-bit types, rounded to nearest
/// (ties to even, NaN kept) from `f64`.
fn read_f32(from: DType, s: &[u8]) -> f32 {
    match from {
        DType::F64 => f64::from_le_bytes(s.try_into().expect("8 bytes")) as f32,
        DType::F32 => f32::from_le_bytes(s.try_into().expect("4 bytes")),
        DType::F16 => f16_to_f32(u16::from_le_bytes(s.try_into().expect("2 bytes"))),
        DType::BF16 => bf16_to_f32(u16::from_le_bytes(s.try_into().expect("2 bytes"))),
        _ => unreachable!("castable"),
    }
}

fn width(dtype: DType) -> usize {
    dtype.size().expect("castable types have a size") as usize
}

/// A part's elements cast from `from` to `to`, read from `payload` (the
/// part's own) in pieces.
#[derive(Debug)]
pub struct Cast {
    /// The original part's payload.
    pub payload: Payload,
    /// Its element type.
    pub from: DType,
    /// The element type produced.
    pub to: DType,
}

impl Cast {
    /// How many elements the payload holds.
    pub fn elements(&self) -> u64 {
        self.payload.len() / width(self.from) as u64
    }

    /// The decoded length: the elements at the new width.
    pub fn decoded_len(&self) -> u64 {
        self.elements() * width(self.to) as u64
    }

    /// Elements `[first, first + count)` cast.
    fn cast_elements(&self, first: u64, count: u64, limits: &Limits) -> Result<Vec<u8>> {
        let (fs, ts) = (width(self.from) as u64, width(self.to) as u64);
        let ctx = match &self.payload {
            Payload::Stored { store, offset, .. } => store.ctx().at(offset + first * fs),
            Payload::Decoded { .. } => Default::default(),
        };
        let mut out = crate::buffer::try_zeroed(&ctx, "a cast tensor", count * ts)?;
        let per_piece = (PIECE / fs).max(1);
        match &self.payload {
            Payload::Stored { store, offset, .. } => {
                // A mapped local file is read by `pread` on its own
                // descriptor: the mapping's pages are never touched, so the
                // process's resident set does not grow with the source.
                let file = store.reopen();
                let mut buf = crate::buffer::try_zeroed(
                    &ctx,
                    "a cast's read buffer",
                    count.min(per_piece) * fs,
                )?;
                let mut at = 0u64;
                while at < count {
                    let n = (count - at).min(per_piece);
                    let piece = &mut buf[..(n * fs) as usize];
                    let from = offset + (first + at) * fs;
                    match &file {
                        Some(file) => file.read_exact_at(piece, from).map_err(|e| Error::Io {
                            ctx: store.ctx().at(from),
                            source: e,
                        })?,
                        None => store.read_into(from, piece)?,
                    }
                    let dst = &mut out[(at * ts) as usize..((at + n) * ts) as usize];
                    cast_slice(self.from, self.to, piece, dst);
                    at += n;
                }
            }
            Payload::Decoded { decoder, .. } => {
                // A decoder that seeks (a tensor assembled from stored
                // chunks) is taken a piece at a time, so the cast holds one
                // piece of the original, not all of it; another is decoded
                // once.
                let step = if decoder.seeks() { per_piece } else { count };
                let mut at = 0u64;
                while at < count {
                    let n = (count - at).min(step.max(1));
                    let src = if first + at == 0 && n == self.elements() {
                        decoder.decode(limits)?
                    } else {
                        decoder.decode_range((first + at) * fs, n * fs, limits)?
                    };
                    if src.len() as u64 != n * fs {
                        return Err(Error::Decode {
                            rule: crate::rule::Rule::DECODED_LENGTH,
                            ctx,
                            reason: format!("decoded {} bytes, expected {}", src.len(), n * fs),
                        });
                    }
                    let dst = &mut out[(at * ts) as usize..((at + n) * ts) as usize];
                    cast_slice(self.from, self.to, &src, dst);
                    at += n;
                }
            }
        }
        Ok(out)
    }
}

impl Decode for Cast {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        self.cast_elements(0, self.elements(), limits)
    }

    fn describe(&self) -> &'static str {
        "cast"
    }

    /// A stored original is read a piece at a time; a decoded one as its
    /// decoder seeks.
    fn seeks(&self) -> bool {
        match &self.payload {
            Payload::Stored { .. } => true,
            Payload::Decoded { decoder, .. } => decoder.seeks(),
        }
    }

    /// Only the elements the range covers, when it starts and ends on
    /// element boundaries (element runs do).
    fn decode_range(&self, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
        let ts = width(self.to) as u64;
        if start % ts == 0 && len % ts == 0 {
            return self.cast_elements(start / ts, len / ts, limits);
        }
        let first = start / ts;
        let last = start.saturating_add(len).div_ceil(ts).min(self.elements());
        let bytes = self.cast_elements(first, last.saturating_sub(first), limits)?;
        let skip = (start - first * ts) as usize;
        let end = (skip + len as usize).min(bytes.len());
        Ok(bytes[skip.min(end)..end].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nearest f16 to `x` by search over every finite f16, ties to the
    /// even one; infinity past the largest finite value plus half an ulp
    /// (65520): an implementation independent of [`f32_to_f16`].
    fn reference_f16(x: f32, finite: &[(f64, u16)]) -> u16 {
        let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
        let a = (x as f64).abs();
        if a >= 65520.0 {
            return sign | 0x7C00;
        }
        let i = finite.partition_point(|&(v, _)| v <= a);
        let (lo, lo_bits) = finite[i - 1];
        let Some(&(hi, hi_bits)) = finite.get(i) else {
            return sign | lo_bits;
        };
        let bits = if a - lo < hi - a || (a - lo == hi - a && lo_bits & 1 == 0) {
            lo_bits
        } else {
            hi_bits
        };
        sign | bits
    }

    fn finite_f16() -> Vec<(f64, u16)> {
        (0u16..0x7C00).map(|b| (f16_to_f32(b) as f64, b)).collect()
    }

    #[test]
    fn f16_decodes_every_pattern() {
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x03FF), 1023.0 * 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
        assert_eq!(f16_to_f32(0x3C00), 1.0);
        assert_eq!(f16_to_f32(0x7BFF), 65504.0);
        assert_eq!(f16_to_f32(0x7C00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xFC00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7E00).is_nan());
        assert_eq!(f16_to_f32(0x8000).to_bits(), 0x8000_0000);
        // Every non-NaN pattern round-trips.
        for b in 0u16..=0xFFFF {
            let x = f16_to_f32(b);
            if x.is_nan() {
                assert_eq!(f32_to_f16(x), (b & 0x8000) | 0x7E00);
            } else {
                assert_eq!(f32_to_f16(x), b, "{b:#06x}");
            }
        }
    }

    #[test]
    fn f16_rounds_like_a_search_for_the_nearest() {
        let finite = finite_f16();
        // Every exponent and sign, mantissas subsampled by an odd stride
        // (so every residue of the dropped bits occurs), plus each f16's
        // neighbourhood: the value, the midpoints above and below, and one
        // f32 ulp either side of each.
        let mut checked = 0u64;
        let mut bits: u64 = 0;
        while bits <= u32::MAX as u64 {
            let x = f32::from_bits(bits as u32);
            if !x.is_nan() {
                assert_eq!(f32_to_f16(x), reference_f16(x, &finite), "{:#010x}", bits);
                checked += 1;
            }
            bits += 4099;
        }
        for &(v, _) in &finite {
            let v = v as f32;
            let up = f16_to_f32(f32_to_f16(v) + 1) as f64;
            let mid = ((v as f64 + up) / 2.0) as f32;
            for base in [v, mid, -v, -mid] {
                for d in [-1i32, 0, 1] {
                    let x = f32::from_bits((base.to_bits() as i64 + d as i64) as u32);
                    if !x.is_nan() {
                        assert_eq!(f32_to_f16(x), reference_f16(x, &finite), "{x:e}");
                    }
                }
            }
        }
        assert!(checked > 1_000_000);
    }

    #[test]
    fn f16_edge_cases() {
        assert_eq!(f32_to_f16(65504.0), 0x7BFF);
        assert_eq!(f32_to_f16(65519.99), 0x7BFF);
        assert_eq!(f32_to_f16(65520.0), 0x7C00); // the tie rounds to even: infinity
        assert_eq!(f32_to_f16(f32::MAX), 0x7C00);
        assert_eq!(f32_to_f16(-f32::MAX), 0xFC00);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7C00);
        assert_eq!(f32_to_f16(2f32.powi(-24)), 0x0001);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000); // tie to even (zero)
        assert_eq!(f32_to_f16(1.5 * 2f32.powi(-24)), 0x0002); // tie to even (2)
        assert_eq!(f32_to_f16(f32::from_bits(0x3300_0001)), 0x0001); // just past the tie
        assert_eq!(f32_to_f16(f32::from_bits(1)), 0x0000); // an f32 subnormal
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        // 1 + 2^-11 is the tie between 1 and the next f16: even is 1.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3C00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02);
        assert_eq!(f32_to_f16(f32::NAN), 0x7E00);
        assert_eq!(f32_to_f16(-f32::NAN), 0xFE00);
        assert_eq!(f32_to_f16(f32::from_bits(0x7F80_0001)), 0x7E00); // a signalling NaN
    }

    fn a_sign(x: f32) -> f64 {
        if x.is_sign_negative() {
            -1.0
        } else {
            1.0
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3F80);
        // 1 + 2^-8 is the tie between 1 and 1 + 2^-7: even is 1.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80);
        // The tie above an odd mantissa rounds up to the even one.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3F80_7FFF)), 0x3F80);
        assert_eq!(f32_to_bf16(f32::MAX), 0x7F80); // overflow to infinity
        assert_eq!(f32_to_bf16(-f32::MAX), 0xFF80);
        assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
        assert_eq!(f32_to_bf16(f32::NEG_INFINITY), 0xFF80);
        assert_eq!(f32_to_bf16(f32::NAN), 0x7FC0);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7F80_0001)), 0x7FC0); // not infinity
        assert_eq!(f32_to_bf16(f32::from_bits(0xFFFF_FFFF)), 0x7FC0);
        // Subnormals are kept, and round like any other value.
        assert_eq!(f32_to_bf16(f32::from_bits(0x0001_0000)), 0x0001);
        assert_eq!(f32_to_bf16(f32::from_bits(0x0000_8000)), 0x0000); // tie to even
        assert_eq!(f32_to_bf16(f32::from_bits(0x0001_8000)), 0x0002); // tie to even
        assert_eq!(f32_to_bf16(f32::from_bits(0x0000_8001)), 0x0001);
        assert_eq!(f32_to_bf16(f32::from_bits(0x8000_0001)), 0x8000);
        assert_eq!(f32_to_bf16(-0.0), 0x8000);
        // Every non-NaN f32 is the nearest bf16, by the exact arithmetic of
        // f64 (subsampled).
        let mut bits: u64 = 0;
        while bits <= u32::MAX as u64 {
            let x = f32::from_bits(bits as u32);
            bits += 65_521;
            if x.is_nan() {
                continue;
            }
            let b = f32_to_bf16(x);
            let truncated = (x.to_bits() >> 16) as u16;
            let (lo, hi) = (bf16_to_f32(truncated) as f64, (x.to_bits() >> 16) + 1);
            // Past the largest finite bf16 the next value is 2^128, which
            // rounds to infinity (the tie included: its mantissa is even).
            let hi = if (hi << 16) & 0x7F80_0000 == 0x7F80_0000 {
                2f64.powi(128).copysign(a_sign(x))
            } else {
                f32::from_bits(hi << 16) as f64
            };
            let a = x as f64;
            let expect = if (a - lo).abs() < (hi - a).abs()
                || ((a - lo).abs() == (hi - a).abs() && truncated & 1 == 0)
            {
                truncated
            } else {
                truncated + 1
            };
            assert_eq!(b, expect, "{:#010x}", x.to_bits());
        }
    }

    #[test]
    fn slices_cast_between_every_pair() {
        let values = [1.0f64, -2.5, 65504.0, 1e-40, f64::INFINITY, 3.0e38, 1e300];
        let src: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut f32s = vec![0u8; values.len() * 4];
        cast_slice(DType::F64, DType::F32, &src, &mut f32s);
        let back: Vec<f32> = f32s
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back[..4], [1.0, -2.5, 65504.0, 1e-40f64 as f32]);
        assert_eq!(back[6], f32::INFINITY); // 1e300 overflows f32
                                            // f64 -> bf16 goes through f32, as torch's does.
        let mut bf = vec![0u8; values.len() * 2];
        cast_slice(DType::F64, DType::BF16, &src, &mut bf);
        let mut via = vec![0u8; values.len() * 2];
        cast_slice(DType::F32, DType::BF16, &f32s, &mut via);
        assert_eq!(bf, via);
        // Widening is exact and narrows back to the same bits.
        for to in [DType::F32, DType::F64] {
            let mut wide = vec![0u8; values.len() * width(to)];
            cast_slice(DType::BF16, to, &bf, &mut wide);
            let mut again = vec![0u8; bf.len()];
            cast_slice(to, DType::BF16, &wide, &mut again);
            assert_eq!(again, bf);
        }
        let mut h = vec![0u8; values.len() * 2];
        cast_slice(DType::F32, DType::F16, &f32s, &mut h);
        let mut h2 = vec![0u8; values.len() * 2];
        cast_slice(DType::F16, DType::BF16, &h, &mut h2);
        let mut h3 = vec![0u8; values.len() * 2];
        cast_slice(DType::BF16, DType::F16, &h2, &mut h3);
        assert_eq!(u16::from_le_bytes([h[0], h[1]]), 0x3C00);
        assert_eq!(u16::from_le_bytes([h[4], h[5]]), 0x7BFF);
        assert_eq!(u16::from_le_bytes([h3[0], h3[1]]), 0x3C00);
    }
}
