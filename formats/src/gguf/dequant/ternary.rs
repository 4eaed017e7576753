//! The ternary types TQ1_0 and TQ2_0 (values -1, 0, 1 times an f16 scale;
//! gguf-py `quants.py` classes of the same names).

use super::f16_at;

/// TQ1_0: 48 bytes each holding five base-3 digits as a fixed-point
/// fraction (the digit `p` read as `((byte * 3^p mod 256) * 3) >> 8`), 4
/// bytes holding four digits, f16 d; x = d * (digit - 1). Elements: bytes
/// 0-31 give digit p to element 32p + l, bytes 32-47 to 160 + 16p + l,
/// bytes 48-51 to 240 + 4p + l.
#[inline(always)]
pub(super) fn tq1_0(b: &[u8; 54], out: &mut [f32; 256]) {
    let d = f16_at(b, 52);
    let digit = |byte: u8, pow: u8| -> f32 {
        let v = byte.wrapping_mul(pow);
        f32::from(((u16::from(v) * 3) >> 8) as i8 - 1)
    };
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let (head, rest) = out.split_at_mut(160);
    let (mid, tail) = rest.split_at_mut(80);
    for (p, pow) in POW3.into_iter().enumerate() {
        for (l, o) in head[32 * p..32 * p + 32].iter_mut().enumerate() {
            *o = d * digit(b[l], pow);
        }
        for (l, o) in mid[16 * p..16 * p + 16].iter_mut().enumerate() {
            *o = d * digit(b[32 + l], pow);
        }
    }
    for (p, pow) in POW3[..4].iter().enumerate() {
        for (l, o) in tail[4 * p..4 * p + 4].iter_mut().enumerate() {
            *o = d * digit(b[48 + l], *pow);
        }
    }
}

/// TQ2_0: 64 bytes of 2-bit codes (element 128c + 32s + l at bits 2s of
/// byte 32c + l), f16 d; x = d * (q - 1).
#[inline(always)]
pub(super) fn tq2_0(b: &[u8; 66], out: &mut [f32; 256]) {
    let d = f16_at(b, 64);
    for (g, o) in out.chunks_exact_mut(32).enumerate() {
        let (c, s) = (g / 4, g % 4);
        for (q, o) in b[32 * c..32 * c + 32].iter().zip(o) {
            *o = d * f32::from(((q >> (2 * s)) & 3) as i8 - 1);
        }
    }
}
