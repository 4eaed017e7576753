//! The filters zt undoes on chunks: deflate (1), shuffle (2), fletcher32
//! (3, checked) and h5py's LZF (32000, decoded here). No stage may
//! produce more than the chunk can hold, so a chunk that inflates past
//! its declared size fails instead of allocating.

use crate::h5::rules;
use std::io::Read;

use zt_core::error::{Context, Error, Result};

use super::messages::Filter;

/// Deflate (zlib).
pub const DEFLATE: u16 = 1;
/// Byte shuffle.
pub const SHUFFLE: u16 = 2;
/// Fletcher-32 checksum.
pub const FLETCHER32: u16 = 3;
/// h5py's LZF.
pub const LZF: u16 = 32000;

/// A short name for a filter id, for listings and errors.
pub fn name(id: u16) -> &'static str {
    match id {
        DEFLATE => "deflate",
        SHUFFLE => "shuffle",
        FLETCHER32 => "fletcher32",
        4 => "szip",
        5 => "nbit",
        6 => "scaleoffset",
        LZF => "lzf",
        32001 => "blosc",
        32004 => "lz4",
        32008 => "bitshuffle",
        32015 => "zstd",
        _ => "unknown",
    }
}

/// Fail on the first filter zt cannot undo, naming its id.
pub fn check_supported(filters: &[Filter]) -> std::result::Result<(), String> {
    match filters
        .iter()
        .find(|f| !matches!(f.id, DEFLATE | SHUFFLE | FLETCHER32 | LZF))
    {
        Some(f) => Err(format!(
            "filter id {} ({}) is not supported; zt reads deflate (1), shuffle (2), fletcher32 (3) and lzf (32000)",
            f.id,
            name(f.id)
        )),
        None => Ok(()),
    }
}

/// Undo `filters` (in reverse order, skipping those `mask` marks) on one
/// stored chunk that must decode to exactly `expect` bytes.
pub fn undo(
    filters: &[Filter],
    mask: u32,
    stored: &[u8],
    expect: usize,
    ctx: &Context,
) -> Result<Vec<u8>> {
    let cap = expect.saturating_add(4 * filters.len());
    let mut owned: Option<Vec<u8>> = None;
    for (i, f) in filters.iter().enumerate().rev() {
        if i < 32 && mask & (1 << i) != 0 {
            continue;
        }
        let data = owned.as_deref().unwrap_or(stored);
        owned = Some(match f.id {
            DEFLATE => inflate(data, cap, ctx)?,
            SHUFFLE => unshuffle(data, f.params.first().copied().unwrap_or(1) as usize),
            FLETCHER32 => fletcher32(data, ctx)?.to_vec(),
            LZF => {
                let declared = f.params.get(2).copied().unwrap_or(0) as usize;
                let limit = if declared == 0 {
                    cap
                } else {
                    declared.min(cap)
                };
                lzf(data, limit, ctx)?
            }
            id => {
                return Err(Error::Unsupported {
                    rule: rules::FILTER,
                    ctx: ctx.clone(),
                    reason: format!("filter id {id} ({}) is not supported", name(id)),
                })
            }
        });
    }
    let data = owned.unwrap_or_else(|| stored.to_vec());
    if data.len() != expect {
        return Err(Error::Decode {
            rule: rules::FILTER,
            ctx: ctx.clone(),
            reason: format!("chunk decodes to {} bytes, expected {expect}", data.len()),
        });
    }
    Ok(data)
}

fn decode_err(ctx: &Context, reason: impl Into<String>) -> Error {
    Error::Decode {
        rule: rules::FILTER,
        ctx: ctx.clone(),
        reason: reason.into(),
    }
}

/// Inflate a zlib stream, refusing to produce more than `cap` bytes.
fn inflate(data: &[u8], cap: usize, ctx: &Context) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(cap.min(data.len().saturating_mul(8)).min(64 << 20));
    let decoder = flate2::read::ZlibDecoder::new(data);
    decoder
        .take(cap as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| decode_err(ctx, format!("deflate: {e}")))?;
    if out.len() > cap {
        return Err(decode_err(
            ctx,
            format!("chunk inflates past its declared size of {cap} bytes"),
        ));
    }
    Ok(out)
}

/// Undo HDF5's shuffle: byte j of element i was stored at `j * n + i`;
/// a tail shorter than one element is stored as is.
pub fn unshuffle(data: &[u8], size: usize) -> Vec<u8> {
    if size <= 1 || data.len() < size {
        return data.to_vec();
    }
    let n = data.len() / size;
    let mut out = vec![0u8; data.len()];
    let planes: Vec<&[u8]> = data[..n * size].chunks_exact(n).collect();
    // Write each element whole (sequential stores, `size` read streams).
    for (i, element) in out[..n * size].chunks_exact_mut(size).enumerate() {
        for (b, plane) in element.iter_mut().zip(&planes) {
            *b = plane[i];
        }
    }
    out[n * size..].copy_from_slice(&data[n * size..]);
    out
}

/// HDF5's Fletcher-32 over 16-bit big-endian words (`H5_checksum_fletcher32`).
pub fn fletcher32_sum(data: &[u8]) -> u32 {
    let (mut s1, mut s2) = (0u32, 0u32);
    let fold = |s: u32| (s & 0xffff) + (s >> 16);
    let n = data.len() / 2;
    let odd = (data.len() % 2 == 1).then(|| data[data.len() - 1]);
    // Sums fold every 360 words, exactly where the library folds them.
    let mut w = 0;
    while w < n {
        let end = (w + 360).min(n);
        for k in w..end {
            s1 += (u32::from(data[2 * k]) << 8) | u32::from(data[2 * k + 1]);
            s2 += s1;
        }
        s1 = fold(s1);
        s2 = fold(s2);
        w = end;
    }
    if let Some(last) = odd {
        s1 += u32::from(last) << 8;
        s2 += s1;
        s1 = fold(s1);
        s2 = fold(s2);
    }
    s1 = fold(s1);
    s2 = fold(s2);
    (s2 << 16) | s1
}

/// Check the trailing Fletcher-32 checksum; the data without it.
fn fletcher32<'d>(data: &'d [u8], ctx: &Context) -> Result<&'d [u8]> {
    if data.len() < 4 {
        return Err(decode_err(
            ctx,
            "fletcher32: chunk shorter than its checksum",
        ));
    }
    let body = data.len() - 4;
    let stored = u32::from_le_bytes([data[body], data[body + 1], data[body + 2], data[body + 3]]);
    let sum = fletcher32_sum(&data[..body]);
    // HDF5 1.6.0-1.6.2 wrote the bytes of each half swapped; the library
    // still accepts that order.
    let legacy = ((sum & 0x00ff_00ff) << 8) | ((sum >> 8) & 0x00ff_00ff);
    if stored != sum && stored != legacy {
        return Err(decode_err(
            ctx,
            format!("fletcher32 checksum {sum:#010x} does not match the stored {stored:#010x}"),
        ));
    }
    Ok(&data[..body])
}

/// Decode an LZF block (liblzf's format, as h5py's filter writes it),
/// producing at most `cap` bytes.
pub fn lzf(input: &[u8], cap: usize, ctx: &Context) -> Result<Vec<u8>> {
    let mut out: Vec<u8> =
        Vec::with_capacity(cap.min(input.len().saturating_mul(16)).min(64 << 20));
    let mut i = 0;
    let overrun = || {
        decode_err(
            ctx,
            format!("lzf: chunk decodes past its declared size of {cap} bytes"),
        )
    };
    while i < input.len() {
        let ctrl = usize::from(input[i]);
        i += 1;
        if ctrl < 32 {
            let n = ctrl + 1;
            let lit = input
                .get(i..i + n)
                .ok_or_else(|| decode_err(ctx, "lzf: literal run past the end of the input"))?;
            if out.len() + n > cap {
                return Err(overrun());
            }
            out.extend_from_slice(lit);
            i += n;
        } else {
            let mut len = ctrl >> 5;
            if len == 7 {
                len += usize::from(
                    *input
                        .get(i)
                        .ok_or_else(|| decode_err(ctx, "lzf: truncated"))?,
                );
                i += 1;
            }
            len += 2;
            let low = usize::from(
                *input
                    .get(i)
                    .ok_or_else(|| decode_err(ctx, "lzf: truncated"))?,
            );
            i += 1;
            let back = ((ctrl & 0x1f) << 8) + low + 1;
            if back > out.len() {
                return Err(decode_err(ctx, "lzf: back reference before the start"));
            }
            if out.len() + len > cap {
                return Err(overrun());
            }
            let from = out.len() - back;
            for k in 0..len {
                let b = out[from + k];
                out.push(b);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shuffle_round_trip() {
        let data: Vec<u8> = (0..11).collect();
        // Shuffle by hand: 2 elements of 4 bytes... plus a 3-byte tail.
        let n = 2;
        let mut shuffled = vec![0u8; 11];
        for i in 0..n {
            for j in 0..4 {
                shuffled[j * n + i] = data[i * 4 + j];
            }
        }
        shuffled[8..].copy_from_slice(&data[8..]);
        assert_eq!(unshuffle(&shuffled, 4), data);
    }

    #[test]
    fn lzf_literal_and_backref() {
        // "abcabcabc": literal "abc", then a back reference of 6 bytes at distance 3.
        let input = [2, b'a', b'b', b'c', (4 << 5), 2];
        let out = lzf(&input, 64, &Context::default()).unwrap();
        assert_eq!(out, b"abcabcabc");
        assert!(matches!(
            lzf(&input, 5, &Context::default()),
            Err(Error::Decode { .. })
        ));
        assert!(matches!(
            lzf(&[0x20, 5], 64, &Context::default()),
            Err(Error::Decode { .. })
        ));
    }

    #[test]
    fn fletcher_detects_change() {
        let mut chunk = b"hello world!".to_vec();
        let sum = fletcher32_sum(&chunk);
        chunk.extend_from_slice(&sum.to_le_bytes());
        assert_eq!(
            fletcher32(&chunk, &Context::default()).unwrap(),
            b"hello world!"
        );
        chunk[0] ^= 1;
        assert!(matches!(
            fletcher32(&chunk, &Context::default()),
            Err(Error::Decode { .. })
        ));
    }
}
