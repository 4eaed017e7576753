//! The 4-bit float types MXFP4 (OCP microscaling: e2m1 codes, one e8m0
//! exponent per 32) and NVFP4 (e2m1 codes, one unsigned e4m3 scale per 16),
//! as gguf-py `quants.py` decodes them: the e2m1 values doubled
//! (`kvalues`), so the scales are halved to match.

/// e2m1 values, doubled, by 4-bit code (`kvalues_mxfp4`).
const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of 2^(e - 127) (`ggml_e8m0_to_fp32_half`): exponents 0 and 1 land
/// in f32's subnormals.
#[inline]
fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// MXFP4: an e8m0 exponent, 16 bytes of codes (elements 0-15 low, 16-31
/// high); x = d * kvalues[q].
#[inline(always)]
pub(super) fn mxfp4(b: &[u8; 17], out: &mut [f32; 32]) {
    let d = e8m0_half(b[0]);
    let (lo, hi) = out.split_at_mut(16);
    for ((q, l), h) in b[1..].iter().zip(lo).zip(hi) {
        *l = d * f32::from(KVALUES[usize::from(q & 0x0f)]);
        *h = d * f32::from(KVALUES[usize::from(q >> 4)]);
    }
}

/// An unsigned e4m3 scale (bias 7, the top bit ignored) halved, as gguf-py's
/// `ue4m3_to_fp32`: codes 0x00 and 0x7f are zero. Every value is exact in
/// f32, so the order of its operations does not matter.
#[inline]
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let (exp, man) = (i32::from((x >> 3) & 0x0f), f32::from(x & 7));
    let raw = if exp == 0 {
        man * f32::from_bits(((127 - 9) as u32) << 23)
    } else {
        (1.0 + man / 8.0) * f32::from_bits(((exp - 7 + 127) as u32) << 23)
    };
    raw * 0.5
}

/// NVFP4: 4 ue4m3 scales, then per 16 elements 8 bytes of codes (8
/// elements low, 8 high); x = d * kvalues[q].
#[inline(always)]
pub(super) fn nvfp4(b: &[u8; 36], out: &mut [f32; 64]) {
    for (s, o) in out.chunks_exact_mut(16).enumerate() {
        let d = ue4m3_half(b[s]);
        let qs = &b[4 + 8 * s..4 + 8 * s + 8];
        let (lo, hi) = o.split_at_mut(8);
        for ((q, l), h) in qs.iter().zip(lo).zip(hi) {
            *l = d * f32::from(KVALUES[usize::from(q & 0x0f)]);
            *h = d * f32::from(KVALUES[usize::from(q >> 4)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales() {
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(0), f32::from_bits(1 << 21)); // 2^-128, subnormal
        assert_eq!(e8m0_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_half(255), 2f32.powi(127));
        assert_eq!(ue4m3_half(0x38), 0.5); // 1.0 * 2^0, halved
        assert_eq!(ue4m3_half(0x01), 2f32.powi(-10));
        assert_eq!(ue4m3_half(0xff), 240.0);
        assert_eq!(ue4m3_half(0x80), 0.0);
    }
}
