//! MLX's codes: each row of the `U32` weight is a little-endian bit
//! stream, element `i` at bits `[i * bits, (i + 1) * bits)` (for 3, 5 and 6
//! bits a code may straddle two words). Every group holds a multiple of 8
//! codes, so 8 codes are `bits` whole bytes: one 64-bit load each.
//! Values are computed in f32: `scale * q + bias` (a product and a sum,
//! no fused multiply-add, as MLX's f32 kernel computes) or `code * scale`.

use zt_core::DType;

use super::super::fp8::e4m3fn;
use super::super::io;
use super::super::mxfp4::E2M1;

/// The codes of `bytes` (`out.len() / 8 * BITS` of them) into `out`.
#[inline(always)]
fn unpack<const BITS: usize>(bytes: &[u8], out: &mut [u32]) {
    let mask = (1u64 << BITS) - 1;
    for (chunk, o) in bytes.chunks_exact(BITS).zip(out.chunks_exact_mut(8)) {
        let mut word = [0u8; 8];
        word[..BITS].copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        for (k, q) in o.iter_mut().enumerate() {
            *q = ((x >> (k * BITS)) & mask) as u32;
        }
    }
}

/// The value of a code, given the group's scale (and bias).
pub trait Code: Copy + Sync {
    /// Bits per code.
    const BITS: usize;
    fn value(self, q: u32, scale: f32, bias: f32) -> f32;
}

/// `scale * q + bias`.
#[derive(Clone, Copy)]
pub struct Affine<const BITS: usize>;

impl<const BITS: usize> Code for Affine<BITS> {
    const BITS: usize = BITS;
    #[inline(always)]
    fn value(self, q: u32, scale: f32, bias: f32) -> f32 {
        scale * q as f32 + bias
    }
}

/// An e2m1 code times the scale (mxfp4, nvfp4).
#[derive(Clone, Copy)]
pub struct Fp4;

impl Code for Fp4 {
    const BITS: usize = 4;
    #[inline(always)]
    fn value(self, q: u32, scale: f32, _: f32) -> f32 {
        E2M1[q as usize & 15] * scale
    }
}

/// An e4m3fn code times the scale (mxfp8).
#[derive(Clone, Copy)]
pub struct Fp8;

impl Code for Fp8 {
    const BITS: usize = 8;
    #[inline(always)]
    fn value(self, q: u32, scale: f32, _: f32) -> f32 {
        e4m3fn(q as u8) * scale
    }
}

/// One row: `codes` (the row's packed bytes), one scale and bias per group
/// of `group` values, into `out` (the row's values).
pub fn row<C: Code>(
    code: C,
    codes: &[u8],
    scales: &[f32],
    biases: &[f32],
    group: usize,
    out: &mut [f32],
) {
    let group_bytes = group * C::BITS / 8;
    let mut q = vec![0u32; group];
    for (g, (c, o)) in codes
        .chunks_exact(group_bytes)
        .zip(out.chunks_exact_mut(group))
        .enumerate()
    {
        match C::BITS {
            1 => unpack::<1>(c, &mut q),
            2 => unpack::<2>(c, &mut q),
            3 => unpack::<3>(c, &mut q),
            4 => unpack::<4>(c, &mut q),
            5 => unpack::<5>(c, &mut q),
            6 => unpack::<6>(c, &mut q),
            _ => unpack::<8>(c, &mut q),
        }
        let (s, b) = (scales[g], biases.get(g).copied().unwrap_or(0.0));
        for (v, &q) in o.iter_mut().zip(&q) {
            *v = code.value(q, s, b);
        }
    }
}

/// One row's inputs: its packed codes, its groups' scales and biases (none
/// but affine's), values per group.
pub struct Row<'a> {
    pub codes: &'a [u8],
    pub scales: &'a [f32],
    pub biases: &'a [f32],
    pub group: usize,
}

/// [`row`] then [`io::store`] for codes of at most 4 bits, through one
/// table per group: the group's `2^bits` possible values computed as
/// `value` computes each and written as `to` once, then each code's bytes
/// copied. The same bytes, with a conversion per possible value instead of
/// per value (a group has at least twice as many values as codes).
pub fn row_table<C: Code>(code: C, row: &Row<'_>, to: DType, out: &mut [u8]) {
    match io::output_width(to) {
        Some(2) => table_of::<C, 2>(code, row, to, out),
        Some(8) => table_of::<C, 8>(code, row, to, out),
        _ => table_of::<C, 4>(code, row, to, out),
    }
}

fn table_of<C: Code, const W: usize>(code: C, row: &Row<'_>, to: DType, out: &mut [u8]) {
    let n = 1usize << C::BITS;
    let mut q = vec![0u32; row.group];
    let mut values = [0f32; 16];
    let mut table = [[0u8; W]; 16];
    let group_bytes = row.group * C::BITS / 8;
    for (g, (c, o)) in row
        .codes
        .chunks_exact(group_bytes)
        .zip(out.chunks_exact_mut(row.group * W))
        .enumerate()
    {
        let (s, b) = (row.scales[g], row.biases.get(g).copied().unwrap_or(0.0));
        for (k, v) in values[..n].iter_mut().enumerate() {
            *v = code.value(k as u32, s, b);
        }
        io::store(to, &values[..n], table.as_flattened_mut());
        match C::BITS {
            1 => unpack::<1>(c, &mut q),
            2 => unpack::<2>(c, &mut q),
            3 => unpack::<3>(c, &mut q),
            _ => unpack::<4>(c, &mut q),
        }
        for (o, &q) in o.chunks_exact_mut(W).zip(&q) {
            o.copy_from_slice(&table[q as usize & 15]);
        }
    }
}

/// An e8m0 scale as MLX reads it: `2^(e - 127)` as an f32, so 0 is 2^-127
/// (a subnormal) and 255 is infinity (a zero code there is NaN).
pub fn e8m0(e: u8) -> f32 {
    match e {
        0 => f32::from_bits(1 << 22),
        255 => f32::INFINITY,
        _ => f32::from_bits(u32::from(e) << 23),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every width against codes packed one bit at a time.
    #[test]
    fn bit_streams_of_every_width() {
        for bits in [1usize, 2, 3, 4, 5, 6, 8] {
            let codes: Vec<u32> = (0..64u32).map(|i| (i * 37 + 11) % (1 << bits)).collect();
            let mut packed = vec![0u8; 64 * bits / 8];
            for (i, &c) in codes.iter().enumerate() {
                for b in 0..bits {
                    if c >> b & 1 == 1 {
                        packed[(i * bits + b) / 8] |= 1 << ((i * bits + b) % 8);
                    }
                }
            }
            let mut out = vec![0f32; 64];
            let scales = [2.0, 0.5];
            let biases = [-1.0, 3.0];
            macro_rules! go {
                ($b:literal) => {
                    row(Affine::<$b>, &packed, &scales, &biases, 32, &mut out)
                };
            }
            match bits {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                4 => go!(4),
                5 => go!(5),
                6 => go!(6),
                _ => go!(8),
            }
            for (i, &c) in codes.iter().enumerate() {
                let want = scales[i / 32] * c as f32 + biases[i / 32];
                assert_eq!(out[i], want, "{bits} bits, element {i}");
            }
        }
    }

    /// The table path writes the bytes the value path and `io::store`
    /// write, for every output type, NaN and infinite scales included.
    #[test]
    fn tables_write_what_values_do() {
        let codes: Vec<u8> = (0..64u32).map(|i| (i * 29 + 3) as u8).collect();
        let scales = [0.37, f32::NAN, -2.5e-3, f32::INFINITY];
        let biases = [1.0e-3, -0.5, 65504.0, 0.0];
        let row = Row {
            codes: &codes,
            scales: &scales,
            biases: &biases,
            group: 32,
        };
        for to in [DType::F32, DType::BF16, DType::F16, DType::F64] {
            let width = io::output_width(to).unwrap() as usize;
            let mut values = vec![0f32; 128];
            let (mut want, mut got) = (vec![0u8; 128 * width], vec![0u8; 128 * width]);
            row_fp4_and_affine(&row, &mut values, to, &mut want, &mut got);
            assert_eq!(got, want, "{to}");
        }
    }

    fn row_fp4_and_affine(
        row: &Row<'_>,
        values: &mut [f32],
        to: DType,
        want: &mut [u8],
        got: &mut [u8],
    ) {
        row_once(Affine::<4>, row, values, to, want, got);
        let n = row.codes.len() * 2;
        let fp4 = Row {
            biases: &[],
            ..*row
        };
        row_once(Fp4, &fp4, &mut values[..n], to, want, got);
        let three = Row {
            codes: &row.codes[..24],
            scales: &row.scales[..2],
            ..*row
        };
        row_once(Affine::<3>, &three, &mut values[..64], to, want, got);
    }

    fn row_once<C: Code>(
        code: C,
        r: &Row<'_>,
        values: &mut [f32],
        to: DType,
        want: &mut [u8],
        got: &mut [u8],
    ) {
        let w = io::output_width(to).unwrap() as usize;
        let n = values.len();
        row(code, r.codes, r.scales, r.biases, r.group, values);
        io::store(to, values, &mut want[..n * w]);
        row_table(code, r, to, &mut got[..n * w]);
        assert_eq!(&got[..n * w], &want[..n * w]);
    }

    #[test]
    fn e8m0_as_mlx_reads_it() {
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(0), 2f32.powi(-127));
        assert_eq!(e8m0(254), 2f32.powi(127));
        assert!(e8m0(255).is_infinite());
        assert!((0.0 * e8m0(255)).is_nan());
    }
}
