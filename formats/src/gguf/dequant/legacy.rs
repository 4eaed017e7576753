//! The first ggml block types, 32 elements a block: Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0 (gguf-py `quants.py` classes of the same names).
//!
//! In every 4-bit layout the 16 bytes of nibbles hold elements 0-15 in
//! their low halves and 16-31 in their high halves.

use super::f16_at;

/// Q4_0: f16 d, 16 bytes of nibbles; x = d * (q - 8).
#[inline(always)]
pub(super) fn q4_0(b: &[u8; 18], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    // The codes first, then the products: two plain loops over one block,
    // which the compiler vectorizes within the block (written as one loop
    // it vectorized across blocks, gathering and scattering lanes).
    let codes = nibbles(b, 2);
    for (o, q) in out.iter_mut().zip(codes) {
        *o = d * f32::from(q as i8 - 8);
    }
}

/// The 32 4-bit codes of a block's 16 bytes at `at`: low halves are
/// elements 0-15, high halves 16-31.
#[inline(always)]
fn nibbles(b: &[u8], at: usize) -> [u8; 32] {
    let mut codes = [0u8; 32];
    let (lo, hi) = codes.split_at_mut(16);
    for ((q, l), h) in b[at..at + 16].iter().zip(lo).zip(hi) {
        *l = q & 0x0f;
        *h = q >> 4;
    }
    codes
}

/// Q4_1: f16 d, f16 m, nibbles; x = d * q + m.
#[inline(always)]
pub(super) fn q4_1(b: &[u8; 20], out: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let codes = nibbles(b, 4);
    for (o, q) in out.iter_mut().zip(codes) {
        *o = d * f32::from(q) + m;
    }
}

/// The 32 fifth bits of a Q5 block, a little-endian u32 at `at`.
#[inline]
fn high_bits(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Q5_0: f16 d, u32 of fifth bits, nibbles; x = d * (q - 16).
#[inline(always)]
pub(super) fn q5_0(b: &[u8; 22], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qh = high_bits(b, 2);
    let (lo, hi) = out.split_at_mut(16);
    for (j, ((q, l), h)) in b[6..].iter().zip(lo).zip(hi).enumerate() {
        // A mask test per lane (not a shift by the lane) vectorizes.
        let q1 = (q & 0x0f) | if qh & (1 << j) != 0 { 0x10 } else { 0 };
        let q2 = (q >> 4) | if qh & (1 << (j + 16)) != 0 { 0x10 } else { 0 };
        *l = d * f32::from(q1 as i8 - 16);
        *h = d * f32::from(q2 as i8 - 16);
    }
}

/// Q5_1: f16 d, f16 m, u32 of fifth bits, nibbles; x = d * q + m.
#[inline(always)]
pub(super) fn q5_1(b: &[u8; 24], out: &mut [f32; 32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    let qh = high_bits(b, 4);
    let (lo, hi) = out.split_at_mut(16);
    for (j, ((q, l), h)) in b[8..].iter().zip(lo).zip(hi).enumerate() {
        // A mask test per lane (not a shift by the lane) vectorizes.
        let q1 = (q & 0x0f) | if qh & (1 << j) != 0 { 0x10 } else { 0 };
        let q2 = (q >> 4) | if qh & (1 << (j + 16)) != 0 { 0x10 } else { 0 };
        *l = d * f32::from(q1) + m;
        *h = d * f32::from(q2) + m;
    }
}

/// Q8_0: f16 d, 32 signed bytes; x = q * d.
#[inline(always)]
pub(super) fn q8_0(b: &[u8; 34], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (q, o) in b[2..].iter().zip(out) {
        *o = f32::from(*q as i8) * d;
    }
}
