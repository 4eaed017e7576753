//! The one table of ggml tensor types: id, name, block geometry, and the zt
//! dtype of the plain (one element per block) types.
//!
//! Sources: `GGML_QUANT_SIZES` in llama.cpp `gguf-py/gguf/constants.py`
//! (gguf 0.19.0) and the `static_assert`s in ggml `src/ggml-common.h`
//! (Q2_0 = 42 appears only in newer `ggml.h`). Ids 4, 5 (Q4_2, Q4_3) and
//! 31-33, 36-38 (repacked in-memory variants) were removed from files and
//! are absent on purpose. The list drifts between ggml releases: an id not
//! in this table makes that one tensor unreadable, never the whole file.

use zt_core::dtype::DType;

/// One ggml tensor type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    /// The id stored in a GGUF tensor info.
    pub id: u32,
    /// ggml's name, upper case (`"Q4_K"`).
    pub name: &'static str,
    /// The zt layout of its objects: `"dense"` for plain types,
    /// `"gguf.<lowercase name>/1"` for block types.
    pub layout: &'static str,
    /// Elements per block (1 for plain types).
    pub elems_per_block: u64,
    /// Bytes per block.
    pub block_bytes: u64,
    /// The zt dtype of a plain type (served as a dense tensor); `None` for
    /// block types, which are objects of raw block bytes.
    pub dtype: Option<DType>,
}

impl GgmlType {
    /// True for block (quantized) types, served as `gguf.<type>/1` objects.
    pub fn is_quantized(&self) -> bool {
        self.dtype.is_none()
    }

    /// Bytes that `elements` elements take, `None` when `elements` is not a
    /// whole number of blocks or the size overflows.
    pub fn nbytes(&self, elements: u64) -> Option<u64> {
        if elements % self.elems_per_block != 0 {
            return None;
        }
        (elements / self.elems_per_block).checked_mul(self.block_bytes)
    }
}

macro_rules! ggml_types {
    ($( $id:literal $name:literal $layout:literal $blck:literal $bytes:literal $dtype:expr ;)*) => {
        /// Every ggml type zt knows, by id.
        pub const TYPES: &[GgmlType] = &[
            $( GgmlType { id: $id, name: $name, layout: $layout, elems_per_block: $blck, block_bytes: $bytes, dtype: $dtype }, )*
        ];
    };
}

ggml_types! {
    0  "F32"     "dense"          1   4   Some(DType::F32);
    1  "F16"     "dense"          1   2   Some(DType::F16);
    2  "Q4_0"    "gguf.q4_0/1"    32  18  None;
    3  "Q4_1"    "gguf.q4_1/1"    32  20  None;
    6  "Q5_0"    "gguf.q5_0/1"    32  22  None;
    7  "Q5_1"    "gguf.q5_1/1"    32  24  None;
    8  "Q8_0"    "gguf.q8_0/1"    32  34  None;
    9  "Q8_1"    "gguf.q8_1/1"    32  40  None;
    10 "Q2_K"    "gguf.q2_k/1"    256 84  None;
    11 "Q3_K"    "gguf.q3_k/1"    256 110 None;
    12 "Q4_K"    "gguf.q4_k/1"    256 144 None;
    13 "Q5_K"    "gguf.q5_k/1"    256 176 None;
    14 "Q6_K"    "gguf.q6_k/1"    256 210 None;
    15 "Q8_K"    "gguf.q8_k/1"    256 292 None;
    16 "IQ2_XXS" "gguf.iq2_xxs/1" 256 66  None;
    17 "IQ2_XS"  "gguf.iq2_xs/1"  256 74  None;
    18 "IQ3_XXS" "gguf.iq3_xxs/1" 256 98  None;
    19 "IQ1_S"   "gguf.iq1_s/1"   256 50  None;
    20 "IQ4_NL"  "gguf.iq4_nl/1"  32  18  None;
    21 "IQ3_S"   "gguf.iq3_s/1"   256 110 None;
    22 "IQ2_S"   "gguf.iq2_s/1"   256 82  None;
    23 "IQ4_XS"  "gguf.iq4_xs/1"  256 136 None;
    24 "I8"      "dense"          1   1   Some(DType::I8);
    25 "I16"     "dense"          1   2   Some(DType::I16);
    26 "I32"     "dense"          1   4   Some(DType::I32);
    27 "I64"     "dense"          1   8   Some(DType::I64);
    28 "F64"     "dense"          1   8   Some(DType::F64);
    29 "IQ1_M"   "gguf.iq1_m/1"   256 56  None;
    30 "BF16"    "dense"          1   2   Some(DType::BF16);
    34 "TQ1_0"   "gguf.tq1_0/1"   256 54  None;
    35 "TQ2_0"   "gguf.tq2_0/1"   256 66  None;
    39 "MXFP4"   "gguf.mxfp4/1"   32  17  None;
    40 "NVFP4"   "gguf.nvfp4/1"   64  36  None;
    41 "Q1_0"    "gguf.q1_0/1"    128 18  None;
    42 "Q2_0"    "gguf.q2_0/1"    64  18  None;
}

/// The type with this id, if zt knows it.
pub fn by_id(id: u32) -> Option<&'static GgmlType> {
    TYPES.iter().find(|t| t.id == id)
}

/// The block type whose objects have this layout (`"gguf.q4_0/1"`).
pub fn by_layout(layout: &str) -> Option<&'static GgmlType> {
    TYPES
        .iter()
        .find(|t| t.is_quantized() && t.layout == layout)
}

/// The plain type that stores this zt dtype.
pub fn by_dtype(dtype: DType) -> Option<&'static GgmlType> {
    TYPES.iter().find(|t| t.dtype == Some(dtype))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for (i, t) in TYPES.iter().enumerate() {
            assert!(TYPES[i + 1..].iter().all(|u| u.id != t.id), "{}", t.name);
            assert_eq!(by_id(t.id), Some(t));
            match t.dtype {
                Some(d) => {
                    assert_eq!(t.elems_per_block, 1);
                    assert_eq!(Some(t.block_bytes), d.size());
                    assert_eq!(t.layout, "dense");
                }
                None => {
                    assert_eq!(t.layout, format!("gguf.{}/1", t.name.to_lowercase()));
                    assert_eq!(by_layout(t.layout), Some(t));
                }
            }
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 43] {
            assert_eq!(by_id(removed), None);
        }
        assert_eq!(by_id(12).unwrap().nbytes(512), Some(288));
        assert_eq!(by_id(12).unwrap().nbytes(100), None);
    }
}
