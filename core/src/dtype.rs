//! Element types: the twelve storage types of zTensor v2 plus the logical
//! types that ride on them (bool, fp8 variants, packed fp4/fp6, complex).
//!
//! Names follow zTensor (`f32`, `bf16`, `f8_e4m3fn`, ...). Each format plugin
//! maps its own spelling onto these.

use std::fmt;

/// An element type.
///
/// Deliberately exhaustive: a plugin that maps dtypes matches every variant,
/// so adding a dtype makes the compiler point at each mapping to update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// IEEE 754 binary64.
    F64,
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 64-bit integer.
    I64,
    /// Signed 32-bit integer.
    I32,
    /// Signed 16-bit integer.
    I16,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 64-bit integer.
    U64,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 8-bit integer.
    U8,
    /// Boolean stored as one byte, 0 or 1 (logical over u8).
    Bool,
    /// OCP FP8 E4M3 (finite, NaN only) (logical over u8).
    F8E4M3Fn,
    /// OCP FP8 E5M2 (logical over u8).
    F8E5M2,
    /// FP8 E4M3 with unsigned zero / NaN at -0 (logical over u8).
    F8E4M3Fnuz,
    /// FP8 E5M2 with unsigned zero / NaN at -0 (logical over u8).
    F8E5M2Fnuz,
    /// OCP MX shared exponent E8M0 (logical over u8).
    F8E8M0,
    /// OCP FP4 E2M1, two per byte, low nibble first (logical over u8).
    F4E2M1,
    /// OCP FP6 E2M3, packed 6 bits per element (logical over u8).
    F6E2M3,
    /// OCP FP6 E3M2, packed 6 bits per element (logical over u8).
    F6E3M2,
    /// Complex of two f32 (logical over f32).
    Complex64,
    /// Complex of two f64 (logical over f64).
    Complex128,
    /// Signed 4-bit integer, two per byte, low nibble first (logical over u8;
    /// ONNX INT4).
    I4,
    /// Unsigned 4-bit integer, two per byte, low nibble first (logical over
    /// u8; ONNX UINT4).
    U4,
}

/// The families a dtype belongs to, for consumers that build their own
/// type descriptors (numpy typestr, DLPack codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// IEEE floats (f16, f32, f64).
    Float,
    /// Signed integers.
    Int,
    /// Unsigned integers.
    UInt,
    /// Booleans.
    Bool,
    /// Complex numbers.
    Complex,
    /// Machine-learning float types without a numpy builtin (bf16, fp8, fp4, fp6).
    MlFloat,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 25] = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U16,
        DType::U8,
        DType::Bool,
        DType::F8E4M3Fn,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::F8E8M0,
        DType::F4E2M1,
        DType::F6E2M3,
        DType::F6E3M2,
        DType::Complex64,
        DType::Complex128,
        DType::I4,
        DType::U4,
    ];

    /// The zTensor name (`"f32"`, `"bf16"`, `"f8_e4m3fn"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F64 => "f64",
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::U64 => "u64",
            DType::U32 => "u32",
            DType::U16 => "u16",
            DType::U8 => "u8",
            DType::Bool => "bool",
            DType::F8E4M3Fn => "f8_e4m3fn",
            DType::F8E5M2 => "f8_e5m2",
            DType::F8E4M3Fnuz => "f8_e4m3fnuz",
            DType::F8E5M2Fnuz => "f8_e5m2fnuz",
            DType::F8E8M0 => "f8_e8m0",
            DType::F4E2M1 => "f4_e2m1",
            DType::F6E2M3 => "f6_e2m3",
            DType::F6E3M2 => "f6_e3m2",
            DType::Complex64 => "complex64",
            DType::Complex128 => "complex128",
            DType::I4 => "i4",
            DType::U4 => "u4",
        }
    }

    /// Parse a zTensor name.
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Bits per element (4 and 6 for the packed types).
    pub fn bits(self) -> u64 {
        match self {
            DType::F64 | DType::I64 | DType::U64 | DType::Complex64 => 64,
            DType::Complex128 => 128,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::F4E2M1 | DType::I4 | DType::U4 => 4,
            DType::F6E2M3 | DType::F6E3M2 => 6,
            _ => 8,
        }
    }

    /// Bytes per element, or `None` for sub-byte packed types.
    pub fn size(self) -> Option<u64> {
        let bits = self.bits();
        (bits % 8 == 0).then_some(bits / 8)
    }

    /// The alignment a zero-copy view needs: the size of the storage scalar
    /// (a complex64 is two f32, so 4).
    pub fn alignment(self) -> u64 {
        self.storage().size().unwrap_or(1)
    }

    /// The zTensor storage type a logical type is carried in.
    pub fn storage(self) -> DType {
        match self {
            DType::Bool
            | DType::F8E4M3Fn
            | DType::F8E5M2
            | DType::F8E4M3Fnuz
            | DType::F8E5M2Fnuz
            | DType::F8E8M0
            | DType::F4E2M1
            | DType::F6E2M3
            | DType::F6E3M2
            | DType::I4
            | DType::U4 => DType::U8,
            DType::Complex64 => DType::F32,
            DType::Complex128 => DType::F64,
            other => other,
        }
    }

    /// True for the logical types (those whose [`storage`](Self::storage) differs).
    pub fn is_logical(self) -> bool {
        self.storage() != self
    }

    /// The family this dtype belongs to.
    pub fn kind(self) -> Kind {
        match self {
            DType::F64 | DType::F32 | DType::F16 => Kind::Float,
            DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::I4 => Kind::Int,
            DType::U64 | DType::U32 | DType::U16 | DType::U8 | DType::U4 => Kind::UInt,
            DType::Bool => Kind::Bool,
            DType::Complex64 | DType::Complex128 => Kind::Complex,
            _ => Kind::MlFloat,
        }
    }

    /// Bytes that `elements` elements occupy (packed types round up to a
    /// whole byte). `None` on overflow.
    pub fn nbytes(self, elements: u64) -> Option<u64> {
        let bits = elements.checked_mul(self.bits())?;
        Some(bits.div_ceil(8))
    }

    /// The width byte-swapping must use for a big-endian source: the storage
    /// scalar size (complex numbers swap each half).
    pub fn swap_width(self) -> u64 {
        self.alignment()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Number of elements of `shape`, `None` on overflow. Rank 0 has one element.
pub fn num_elements(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
}

/// Row-major (C order) strides in elements for `shape`.
pub fn c_strides(shape: &[u64]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (i, &d) in shape.iter().enumerate().rev() {
        strides[i] = acc;
        acc = acc.saturating_mul(d.max(1) as i64);
    }
    strides
}

/// Column-major (Fortran order) strides in elements for `shape`.
pub fn f_strides(shape: &[u64]) -> Vec<i64> {
    let mut strides = vec![0i64; shape.len()];
    let mut acc: i64 = 1;
    for (i, &d) in shape.iter().enumerate() {
        strides[i] = acc;
        acc = acc.saturating_mul(d.max(1) as i64);
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_name("float32"), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::F4E2M1.nbytes(3), Some(2));
        assert_eq!(DType::I4.nbytes(3), Some(2));
        assert_eq!(DType::U4.storage(), DType::U8);
        assert_eq!(DType::F6E2M3.nbytes(4), Some(3));
        assert_eq!(DType::Complex64.nbytes(2), Some(16));
        assert_eq!(DType::Complex64.alignment(), 4);
        assert_eq!(DType::U64.nbytes(u64::MAX), None);
        assert_eq!(num_elements(&[]), Some(1));
        assert_eq!(num_elements(&[3, 0, 5]), Some(0));
        assert_eq!(num_elements(&[u64::MAX, 2]), None);
    }

    #[test]
    fn strides() {
        assert_eq!(c_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(f_strides(&[2, 3, 4]), vec![1, 2, 6]);
        assert!(c_strides(&[]).is_empty());
    }
}
