//! What every scheme's decoder shares: reading a range of an original
//! tensor's bytes, writing f32 results in the output dtype (rounded once,
//! as torch's `.to(dtype)` rounds), and cutting a large output into runs of
//! rows on the cores its size warrants.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use zt_core::cast::{f32_to_bf16, f32_to_f16};
use zt_core::error::{Context, Error, Result};
use zt_core::{DType, Limits, Payload};

/// Bytes `[start, start + len)` of an original tensor's payload. A stored
/// one is read by `pread` on the store's own descriptor where it has one,
/// so the mapping's pages are not made resident by a conversion.
pub fn read(payload: &Payload, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
    match payload {
        Payload::Stored { store, offset, .. } => {
            let at = offset + start;
            let ctx = store.ctx().at(at);
            // Every byte is read into it (or the read fails): a recycled
            // buffer need not be zeroed first.
            let mut buf = zt_core::buffer::try_for_overwrite(&ctx, "quantized blocks", len)?;
            match store.reopen() {
                Some(file) => file.read_exact_at(&mut buf, at).map_err(|e| Error::Io {
                    ctx: store.ctx().at(at),
                    source: e,
                })?,
                None => store.read_into(at, &mut buf)?,
            }
            Ok(buf)
        }
        Payload::Decoded {
            decoder,
            decoded_len,
        } => {
            let bytes = if start == 0 && len == *decoded_len {
                decoder.decode(limits)?
            } else {
                decoder.decode_range(start, len, limits)?
            };
            if bytes.len() as u64 != len {
                return Err(Error::Decode {
                    rule: zt_core::Rule::DECODED_LENGTH,
                    ctx: Context::default(),
                    reason: format!("decoded {} bytes, expected {len}", bytes.len()),
                });
            }
            Ok(bytes)
        }
    }
}

/// The context of `source`'s first file (a scheme's errors name the
/// tensor in it), or none for a source without files.
pub fn first_file(source: &zt_core::Source) -> Context {
    source
        .files()
        .first()
        .map(Context::file)
        .unwrap_or_default()
}

/// The activation scales of layer `base` (`base.input_scale`,
/// `base.input_global_scale`): what a quantized checkpoint stores to
/// quantize the layer's inputs at inference (compressed-tensors' static
/// FP8 and NVFP4, vLLM's FP8). A dequantized layer has no quantized
/// inputs, so they go with its weight; their positions in `source`.
pub fn activation_scales(source: &zt_core::Source, base: &str) -> Vec<usize> {
    ["input_scale", "input_global_scale"]
        .iter()
        .filter_map(|s| source.position(&format!("{base}.{s}")))
        .collect()
}

/// Scales or biases of `dtype` (little-endian) as f32: f16 and bf16
/// widened exactly, f32 as stored. The schemes' planning admits no other
/// scale dtype; any other gives no values.
pub fn floats(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| zt_core::cast::f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| zt_core::cast::bf16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => Vec::new(),
    }
}

/// The output types: f32 as computed, or rounded once to bf16 / f16
/// (nearest, ties to even; NaN as torch writes it), or widened to f64.
pub fn output_width(to: DType) -> Option<u64> {
    match to {
        DType::F32 => Some(4),
        DType::BF16 | DType::F16 => Some(2),
        DType::F64 => Some(8),
        _ => None,
    }
}

/// `values` written as `to` into `out` (`values.len()` elements of it).
pub fn store(to: DType, values: &[f32], out: &mut [u8]) {
    match to {
        DType::BF16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
            }
        }
        DType::F16 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&f32_to_f16(*v).to_le_bytes());
            }
        }
        DType::F64 => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(8)) {
                o.copy_from_slice(&f64::from(*v).to_le_bytes());
            }
        }
        _ => {
            for (v, o) in values.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// Output bytes each thread beyond the first needs: below this a thread
/// costs more to start than it saves.
const THREAD_OUTPUT: u64 = 4 << 20;

/// A run of rows waiting for a thread: its first row and its output.
type Run<'a> = (usize, &'a mut [u8]);

/// `out` (whole rows of `row_bytes`) filled by `fill(first_row, rows_out)`
/// over contiguous runs of rows, one per core the output warrants; every
/// thread, the caller's included, takes the next run not yet taken, so a
/// thread the OS refuses only leaves more runs to the rest.
pub fn rows_in_parallel(out: &mut [u8], row_bytes: usize, fill: impl Fn(usize, &mut [u8]) + Sync) {
    // Nothing to fill (a dimension of zero): `fill` would cut rows of
    // zero bytes.
    if row_bytes == 0 || out.is_empty() {
        return;
    }
    let rows = out.len() / row_bytes;
    let threads = zt_core::copy::threads_for_pieces(out.len() as u64, THREAD_OUTPUT);
    if threads <= 1 || rows < 2 {
        fill(0, out);
        return;
    }
    let per = rows.div_ceil(threads);
    let runs: Vec<Mutex<Option<Run<'_>>>> = out
        .chunks_mut(per * row_bytes)
        .enumerate()
        .map(|(i, o)| Mutex::new(Some((i * per, o))))
        .collect();
    let next = AtomicUsize::new(0);
    let work = || {
        while let Some(slot) = runs.get(next.fetch_add(1, Ordering::Relaxed)) {
            let taken = slot.lock().map(|mut r| r.take());
            if let Ok(Some((first, o))) = taken {
                fill(first, o);
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..runs.len() {
            // A refused thread is no error: its run is taken by another.
            let _ = std::thread::Builder::new().spawn_scoped(s, work);
        }
        work();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_once_per_output_type() {
        let v = [1.0f32 + f32::EPSILON, f32::NAN, -0.0, 65520.0];
        let mut out = [0u8; 8];
        store(DType::BF16, &v, &mut out);
        assert_eq!(out, [0x80, 0x3f, 0xc0, 0x7f, 0x00, 0x80, 0x80, 0x47]);
        store(DType::F16, &v, &mut out);
        assert_eq!(out, [0x00, 0x3c, 0x00, 0x7e, 0x00, 0x80, 0x00, 0x7c]);
    }

    #[test]
    fn empty_outputs_call_nothing() {
        rows_in_parallel(&mut [], 0, |_, _| panic!("no rows"));
        rows_in_parallel(&mut [], 8, |_, _| panic!("no rows"));
    }

    #[test]
    fn every_row_is_filled_once() {
        let mut out = vec![0u8; 3 << 20];
        rows_in_parallel(&mut out, 1 << 10, |first, o| {
            for (i, row) in o.chunks_mut(1 << 10).enumerate() {
                row.fill(((first + i) % 251) as u8 + 1);
            }
        });
        for (i, row) in out.chunks(1 << 10).enumerate() {
            assert!(row.iter().all(|&b| b == (i % 251) as u8 + 1));
        }
    }
}
