//! External data in a safetensors file, as `onnx-safetensors` lays it out
//! (`save_model(model, path, external_data="x.safetensors")`): a plain
//! safetensors file holding the model's initializers under their names,
//! each `TensorProto` pointing into it with `location` the file,
//! `offset` its bytes' absolute file offset (8 + header length + its
//! `data_offsets[0]`) and `length`. The ONNX spec lets a location be any
//! file; safetensors' readers (`safe_open`) read the same file as weights.
//!
//! Safetensors packs tensors back to back (its readers refuse a gap
//! between one tensor's end and the next one's start), so the tensors are
//! not aligned one by one; the header is padded with spaces so the data
//! starts on a page boundary.

use std::collections::HashSet;

use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};

use crate::onnx::rules;
use crate::safetensors::dtype_to_str;

/// Where the data starts: 8 + header, padded to this.
const DATA_ALIGN: u64 = 4096;

/// Whether `location` names a safetensors data file (onnx-safetensors
/// requires the extension too).
pub fn is_safetensors(location: &str) -> bool {
    location.ends_with(".safetensors")
}

/// A tensor's header entry.
pub struct Entry {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub len: u64,
}

/// Safetensors' dtype name and shape for an ONNX tensor of `dtype` and
/// `dims`, as onnx-safetensors stores it: the types safetensors names as
/// themselves; any other byte-sized type as `U8` of the same shape; a type
/// packed below a byte (or complex128) as `U8` of its byte count.
pub fn entry(name: &str, dtype: DType, dims: &[u64], len: u64) -> Entry {
    let standard = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::F8E5M2,
        DType::F8E4M3Fn,
        DType::F8E8M0,
        DType::Complex64,
    ];
    let (dtype, shape) = match dtype_to_str(dtype) {
        Some(s) if standard.contains(&dtype) => (s, dims.to_vec()),
        _ if dtype.size() == Some(1) => ("U8", dims.to_vec()),
        _ => ("U8", vec![len]),
    };
    Entry {
        name: name.to_string(),
        dtype,
        shape,
        len,
    }
}

/// The file's first bytes: the header's length, then its JSON, padded
/// with spaces so the data starts at a multiple of [`DATA_ALIGN`].
/// `entries` in data order, back to back from the data's start. A name
/// given twice (or none: a safetensors file names every tensor) is
/// refused, as onnx-safetensors refuses duplicate initializer names.
pub fn header(ctx: &Context, entries: &[Entry]) -> Result<Vec<u8>> {
    let mut seen = HashSet::with_capacity(entries.len());
    let mut map = serde_json::Map::with_capacity(entries.len());
    let mut at = 0u64;
    for e in entries {
        if e.name.is_empty() || e.name == "__metadata__" || !seen.insert(e.name.as_str()) {
            return Err(Error::write(
                ctx.clone().tensor(&e.name),
                rules::SAFETENSORS,
                "a safetensors data file holds each initializer under its own name: \
                 this one is unnamed, reserved or given twice",
            ));
        }
        map.insert(
            e.name.clone(),
            serde_json::json!({
                "dtype": e.dtype,
                "shape": e.shape,
                "data_offsets": [at, at + e.len],
            }),
        );
        at += e.len;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(map)).expect("plain JSON");
    let padded = (8 + json.len() as u64).next_multiple_of(DATA_ALIGN) - 8;
    json.resize(padded as usize, b' ');
    let mut out = Vec::with_capacity(8 + json.len());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_packs_back_to_back_and_pads_to_a_page() {
        let e = [
            entry("a", DType::F32, &[2, 3], 24),
            entry("b", DType::I4, &[5], 3),
            entry("c", DType::F8E4M3Fnuz, &[4], 4),
        ];
        let h = header(&Context::default(), &e).unwrap();
        assert_eq!(h.len() % 4096, 0);
        let n = u64::from_le_bytes(h[..8].try_into().unwrap()) as usize;
        let v: serde_json::Value = serde_json::from_slice(&h[8..8 + n]).unwrap();
        assert_eq!(v["a"]["data_offsets"], serde_json::json!([0, 24]));
        assert_eq!(v["b"]["dtype"], "U8");
        assert_eq!(v["b"]["shape"], serde_json::json!([3]));
        assert_eq!(v["c"]["shape"], serde_json::json!([4]));
        assert_eq!(v["c"]["data_offsets"], serde_json::json!([27, 31]));
    }

    #[test]
    fn duplicate_and_missing_names_are_refused() {
        let ctx = Context::default();
        for names in [["x", "x"], ["", "y"]] {
            let e: Vec<Entry> = names.iter().map(|n| entry(n, DType::U8, &[1], 1)).collect();
            assert_eq!(
                header(&ctx, &e).unwrap_err().rule(),
                Some(rules::SAFETENSORS)
            );
        }
    }
}
