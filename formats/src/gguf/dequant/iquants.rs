//! The i-quants: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
//! (codebook indices into the lattice grids of [`super::grids`], with sign
//! bits), IQ4_NL and IQ4_XS (a non-linear 16-entry codebook). The math is
//! gguf-py 0.19 `quants.py`'s, operation for operation: for the signed
//! grids `(db * grid) * sign` with `sign` = ±1.0, for IQ1
//! `dl * (grid + delta)`. Every value's bits agree with gguf-py's except a
//! NaN's sign under a negative sign (LLVM may turn the multiply by -1.0
//! into a negation, which flips it; numpy's multiply keeps it): NaN where
//! gguf-py has NaN, as the tests compare.

use super::f16_at;
use super::grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};

/// ±1.0 for bit `j` of `signs` (set means negative).
#[inline]
fn sign(signs: u8, j: usize) -> f32 {
    if (signs >> j) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// Element `j` of an 8-byte grid row.
#[inline]
fn byte8(row: u64, j: usize) -> u8 {
    (row >> (8 * j)) as u8
}

/// Eight elements `(db * grid[j]) * sign_j` of one 8-wide grid row.
#[inline]
fn put8(out: &mut [f32], db: f32, row: u64, signs: u8) {
    for (j, o) in out[..8].iter_mut().enumerate() {
        *o = db * f32::from(byte8(row, j)) * sign(signs, j);
    }
}

/// Four elements of one 4-wide grid row (IQ3), signs from bit `first`.
#[inline]
fn put4(out: &mut [f32], db: f32, row: u32, signs: u8, first: usize) {
    for (j, o) in out[..4].iter_mut().enumerate() {
        *o = db * f32::from((row >> (8 * j)) as u8) * sign(signs, first + j);
    }
}

#[inline]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// IQ2_XXS: f16 d, then per 32 elements two u32s: four grid indices
/// (bytes of the first), and in the second four 7-bit sign indices into
/// [`KSIGNS`] and a 4-bit scale on top; db = d * (0.5 + s) * 0.25.
#[inline(always)]
pub(super) fn iq2_xxs(b: &[u8; 66], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for (ib, o) in out.chunks_exact_mut(32).enumerate() {
        let at = 2 + 8 * ib;
        let aux1 = u32_at(b, at + 4);
        let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS[((aux1 >> (7 * l)) & 0x7f) as usize];
            put8(o, db, IQ2XXS_GRID[usize::from(b[at + l])], signs);
        }
    }
}

/// IQ2_XS: f16 d, 32 u16s (9-bit grid index, 7-bit sign index), 8 bytes
/// of 4-bit scales, one per 16 elements; db = d * (0.5 + s) * 0.25.
#[inline(always)]
pub(super) fn iq2_xs(b: &[u8; 74], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    for (k, o) in out.chunks_exact_mut(16).enumerate() {
        let s = (b[66 + k / 2] >> (4 * (k % 2))) & 0x0f;
        let db = d * (0.5 + f32::from(s)) * 0.25;
        for (g, o) in o.chunks_exact_mut(8).enumerate() {
            let q = u16_at(b, 2 + 2 * (2 * k + g));
            let signs = KSIGNS[usize::from(q >> 9)];
            put8(o, db, IQ2XS_GRID[usize::from(q & 511)], signs);
        }
    }
}

/// IQ2_S: f16 d, 32 low bytes of grid indices, 32 sign bytes, 8 bytes of
/// index high bits (2 each), 8 bytes of 4-bit scales (one per 16).
#[inline(always)]
pub(super) fn iq2_s(b: &[u8; 82], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let (qs, signs, qh, scales) = (&b[2..34], &b[34..66], &b[66..74], &b[74..82]);
    for (k, o) in out.chunks_exact_mut(16).enumerate() {
        let s = (scales[k / 2] >> (4 * (k % 2))) & 0x0f;
        let db = d * (0.5 + f32::from(s)) * 0.25;
        for (g, o) in o.chunks_exact_mut(8).enumerate() {
            let i = 2 * k + g;
            let high = (qh[i / 4] >> (2 * (i % 4))) & 3;
            let index = usize::from(qs[i]) | (usize::from(high) << 8);
            put8(o, db, IQ2S_GRID[index], signs[i]);
        }
    }
}

/// IQ3_XXS: f16 d, 64 bytes of grid indices (4 elements each), then per
/// 32 elements a u32 of four 7-bit sign indices and a 4-bit scale;
/// db = d * (0.5 + s) * 0.5.
#[inline(always)]
pub(super) fn iq3_xxs(b: &[u8; 98], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    for (ib, o) in out.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(b, 66 + 4 * ib);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS[((aux >> (7 * l)) & 0x7f) as usize];
            let q = &qs[8 * ib + 2 * l..];
            put4(o, db, IQ3XXS_GRID[usize::from(q[0])], signs, 0);
            put4(&mut o[4..], db, IQ3XXS_GRID[usize::from(q[1])], signs, 4);
        }
    }
}

/// IQ3_S: f16 d, 64 low bytes of grid indices, 8 bytes of index ninth
/// bits, 32 sign bytes, 4 bytes of 4-bit scales (one per 32);
/// db = d * (1 + 2s).
#[inline(always)]
pub(super) fn iq3_s(b: &[u8; 110], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let (qs, qh, signs, scales) = (&b[2..66], &b[66..74], &b[74..106], &b[106..110]);
    for (ib, o) in out.chunks_exact_mut(32).enumerate() {
        let s = (scales[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let db = d * f32::from(1 + 2 * s);
        for (k, o) in o.chunks_exact_mut(4).enumerate() {
            let i = 8 * ib + k;
            let high = (qh[i / 8] >> (i % 8)) & 1;
            let index = usize::from(qs[i]) | (usize::from(high) << 8);
            put4(o, db, IQ3S_GRID[index], signs[i / 2], 4 * (i % 2));
        }
    }
}

/// IQ1's delta: ±1/8, negative when the flag is set.
#[inline]
fn delta(negative: bool) -> f32 {
    if negative {
        -0.125
    } else {
        0.125
    }
}

/// Eight elements `dl * (grid[j] + delta)` of an IQ1 grid row (`i8`s).
#[inline]
fn put_iq1(out: &mut [f32], dl: f32, row: u64, delta: f32) {
    for (j, o) in out[..8].iter_mut().enumerate() {
        *o = dl * (f32::from(byte8(row, j) as i8) + delta);
    }
}

/// IQ1_S: f16 d, 32 low bytes of grid indices, then per 32 elements a u16:
/// four 3-bit index highs, a 3-bit scale, the delta's sign on top;
/// dl = d * (2s + 1).
#[inline(always)]
pub(super) fn iq1_s(b: &[u8; 50], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    for (ib, o) in out.chunks_exact_mut(32).enumerate() {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = delta(qh & 0x8000 != 0);
        for (l, o) in o.chunks_exact_mut(8).enumerate() {
            let index = usize::from(qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            put_iq1(o, dl, IQ1S_GRID[index], delta);
        }
    }
}

/// IQ1_M: 32 low bytes of grid indices, 16 bytes of nibbles (3 index bits
/// and the delta's sign per 8 elements), 4 u16s of 3-bit scales (one per
/// 16 elements) whose top nibbles together are the f16 d; dl = d * (2s + 1).
#[inline(always)]
pub(super) fn iq1_m(b: &[u8; 56], out: &mut [f32; 256]) {
    let (qs, qh) = (&b[0..32], &b[32..48]);
    let sc: [u16; 4] = std::array::from_fn(|i| u16_at(b, 48 + 2 * i));
    let d_bits = ((sc[0] & 0xf000) >> 12)
        | ((sc[1] & 0xf000) >> 8)
        | ((sc[2] & 0xf000) >> 4)
        | (sc[3] & 0xf000);
    let d = super::f16_to_f32(d_bits);
    for (k, o) in out.chunks_exact_mut(16).enumerate() {
        let s = (sc[k / 4] >> (3 * (k % 4))) & 7;
        let dl = d * f32::from(2 * s + 1);
        for (g, o) in o.chunks_exact_mut(8).enumerate() {
            let i = 2 * k + g;
            let nibble = (qh[i / 2] >> (4 * (i % 2))) & 0x0f;
            let index = usize::from(qs[i]) | (usize::from(nibble & 7) << 8);
            put_iq1(o, dl, IQ1S_GRID[index], delta(nibble & 8 != 0));
        }
    }
}

/// The IQ4 codebook (`kvalues_iq4nl`).
const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL: f16 d, 16 bytes of codebook nibbles (elements 0-15 low, 16-31
/// high); x = d * kvalues[q].
#[inline(always)]
pub(super) fn iq4_nl(b: &[u8; 18], out: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let (lo, hi) = out.split_at_mut(16);
    for ((q, l), h) in b[2..].iter().zip(lo).zip(hi) {
        *l = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
        *h = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

/// IQ4_XS: f16 d, a u16 of scale high bits (2 per 32 elements), 4 bytes of
/// scale low nibbles, 128 bytes of codebook nibbles (16 bytes per 32
/// elements, low halves first); x = (d * (s - 32)) * kvalues[q].
#[inline(always)]
pub(super) fn iq4_xs(b: &[u8; 136], out: &mut [f32; 256]) {
    let d = f16_at(b, 0);
    let scales_h = u16_at(b, 2);
    for (ib, o) in out.chunks_exact_mut(32).enumerate() {
        let low = (b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let dl = d * f32::from((low | (high << 4)) as i8 - 32);
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        let (lo, hi) = o.split_at_mut(16);
        for ((q, l), h) in qs.iter().zip(lo).zip(hi) {
            *l = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0x0f)]);
            *h = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}
