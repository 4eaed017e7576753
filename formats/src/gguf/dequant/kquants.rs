//! The K-quants, 256-element super-blocks: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
//! (gguf-py `quants.py` classes of the same names). Each sub-block's scale
//! (and min) is multiplied out once, then applied to its elements in the
//! order gguf-py applies them.

use super::f16_at;

/// Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of
/// 2-bit quants (element `128h + 32s + l` at bits `2s` of byte `32h + l`),
/// f16 d, f16 dmin; x = (d * sc) * q - (dmin * m).
#[inline(always)]
pub(super) fn q2_k(b: &[u8; 84], out: &mut [f32; 256]) {
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    let dl: [f32; 16] = std::array::from_fn(|i| d * f32::from(b[i] & 0x0f));
    let ml: [f32; 16] = std::array::from_fn(|i| dmin * f32::from(b[i] >> 4));
    for (g, o) in out.chunks_exact_mut(32).enumerate() {
        let (half, s) = (g / 4, g % 4);
        let qs = &b[16 + half * 32..16 + half * 32 + 32];
        for (l, (q, o)) in qs.iter().zip(o).enumerate() {
            let k = 2 * g + l / 16;
            *o = dl[k] * f32::from((q >> (2 * s)) & 3) - ml[k];
        }
    }
}

/// Q3_K: 32 bytes of high-bit mask, 64 bytes of 2-bit quants, 12 bytes of
/// packed 6-bit scales, f16 d; x = (d * (sc - 32)) * (q - 4 * !h).
#[inline(always)]
pub(super) fn q3_k(b: &[u8; 110], out: &mut [f32; 256]) {
    let (hmask, qs, scales) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    let dl: [f32; 16] = std::array::from_fn(|k| {
        let low = if k < 8 {
            scales[k] & 0x0f
        } else {
            scales[k - 8] >> 4
        };
        let high = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
        d * f32::from((low | (high << 4)) as i8 - 32)
    });
    for (g, o) in out.chunks_exact_mut(32).enumerate() {
        let (half, s4) = (g / 4, g % 4);
        let q2 = &qs[half * 32..half * 32 + 32];
        for (l, o) in o.iter_mut().enumerate() {
            let ql = ((q2[l] >> (2 * s4)) & 3) as i8;
            let missing = ((hmask[l] >> g) & 1) ^ 1;
            *o = dl[2 * g + l / 16] * f32::from(ql - (missing << 2) as i8);
        }
    }
}

/// The 8 six-bit scales and mins of Q4_K / Q5_K's 12 packed bytes.
#[inline]
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

/// The scales and mins of Q4_K / Q5_K, multiplied out: `d * sc`,
/// `dmin * m` per 32 elements.
#[inline]
fn scales_k4(b: &[u8]) -> ([f32; 8], [f32; 8]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, mn) = scale_min_k4(&b[4..16]);
    (
        sc.map(|s| d * f32::from(s)),
        mn.map(|m| dmin * f32::from(m)),
    )
}

/// Q4_K: f16 d, f16 dmin, 12 bytes of scales, 128 bytes of nibbles (each
/// 32 bytes hold 32 elements low, the next 32 high);
/// x = (d * sc) * q - (dmin * m).
#[inline(always)]
pub(super) fn q4_k(b: &[u8; 144], out: &mut [f32; 256]) {
    let (ds, dm) = scales_k4(b);
    for (c, o) in out.chunks_exact_mut(64).enumerate() {
        let qs = &b[16 + 32 * c..16 + 32 * c + 32];
        let (lo, hi) = o.split_at_mut(32);
        let (d1, m1, d2, m2) = (ds[2 * c], dm[2 * c], ds[2 * c + 1], dm[2 * c + 1]);
        for ((q, l), h) in qs.iter().zip(lo).zip(hi) {
            *l = d1 * f32::from(q & 0x0f) - m1;
            *h = d2 * f32::from(q >> 4) - m2;
        }
    }
}

/// Q5_K: as Q4_K with 32 bytes of fifth bits before the nibbles (element
/// `32g + l`'s at bit `g` of byte `l`).
#[inline(always)]
pub(super) fn q5_k(b: &[u8; 176], out: &mut [f32; 256]) {
    let (ds, dm) = scales_k4(b);
    let qh = &b[16..48];
    for (c, o) in out.chunks_exact_mut(64).enumerate() {
        let qs = &b[48 + 32 * c..48 + 32 * c + 32];
        let (lo, hi) = o.split_at_mut(32);
        let (g1, g2) = (2 * c, 2 * c + 1);
        for (l, ((q, lo), hi)) in qs.iter().zip(lo).zip(hi).enumerate() {
            let q1 = (q & 0x0f) | (((qh[l] >> g1) & 1) << 4);
            let q2 = (q >> 4) | (((qh[l] >> g2) & 1) << 4);
            *lo = ds[g1] * f32::from(q1) - dm[g1];
            *hi = ds[g2] * f32::from(q2) - dm[g2];
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 signed
/// scales, f16 d; x = (d * sc) * (q - 32).
#[inline(always)]
pub(super) fn q6_k(b: &[u8; 210], out: &mut [f32; 256]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    let ds: [f32; 16] = std::array::from_fn(|i| d * f32::from(scales[i] as i8));
    for (g, o) in out.chunks_exact_mut(32).enumerate() {
        // Group g of 32 elements: its low nibbles are the low (g / 2 even)
        // or high halves of 32 bytes at 64(g / 4) + 32(g % 2), its high
        // bits the pair at 2(g % 4) of 32 bytes at 32(g / 4).
        let (h, s, s4) = (g / 4, (g / 2) % 2, g % 4);
        let low_at = h * 64 + (g % 2) * 32;
        let high_at = h * 32;
        for (l, o) in o.iter_mut().enumerate() {
            let low = (ql[low_at + l] >> (4 * s)) & 0x0f;
            let high = (qh[high_at + l] >> (2 * s4)) & 3;
            *o = ds[2 * g + l / 16] * f32::from((low | (high << 4)) as i8 - 32);
        }
    }
}
