//! The `zt.zstd-seekable/1` encoding profile: independent zstd frames, each
//! with a content checksum, all of one decoded size except the last (at
//! most 16 MiB), followed by the standard skippable-frame seek table.
//!
//! Decoding never allocates more than the part's `decoded_length`, which is
//! checked against `Limits` first; each frame decodes into its own slot of
//! that buffer, so a frame that inflates past its declared size fails
//! instead of growing anything. Range reads decode only the frames the
//! range touches.

use crate::rules;
use std::sync::Arc;
use zt_core::Rule;

use zt_core::catalog::Decode;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

/// The profile id.
pub const ZSTD_SEEKABLE: &str = "zt.zstd-seekable/1";
/// Largest decoded frame the profile allows.
pub const MAX_FRAME: u64 = 16 << 20;
/// Decoded bytes per frame the writer uses.
pub const WRITE_FRAME: usize = 1 << 20;
/// zstd frame magic.
const ZSTD_MAGIC: u32 = 0xFD2F_B528;
/// Skippable frame magic used by the seek table.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
/// The seek table footer's magic.
const SEEKABLE_MAGIC: u32 = 0x8F92_EAB1;

/// One frame of a seekable stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Offset of the compressed frame within the blob.
    pub offset: u64,
    /// Compressed size.
    pub compressed: u64,
    /// Offset of the frame's content in the decoded stream.
    pub decoded_offset: u64,
    /// Decoded size.
    pub decoded: u64,
}

/// zstd's largest block (`Block_Maximum_Size`, RFC 8878 §3.1.1.2.4).
const ZSTD_BLOCK_MAX: u64 = 128 << 10;

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Parse and check the seek table at the end of `blob` against the part's
/// `decoded_len`.
pub fn seek_table(blob: &[u8], decoded_len: u64, ctx: &Context) -> Result<Vec<Frame>> {
    let bad = |reason: String| Error::Decode {
        rule: rules::ENCODING,
        ctx: ctx.clone(),
        reason: format!("{ZSTD_SEEKABLE}: {reason}"),
    };
    let n = blob.len();
    if n < 17 {
        return Err(bad("too short for a seek table".into()));
    }
    let frames = le32(blob, n - 9) as u64;
    let descriptor = blob[n - 5];
    if le32(blob, n - 4) != SEEKABLE_MAGIC {
        return Err(bad("no seek table footer magic".into()));
    }
    if descriptor & 0x7c != 0 {
        return Err(bad("reserved seek table descriptor bits are set".into()));
    }
    let entry = if descriptor & 0x80 != 0 { 12 } else { 8 };
    let table = frames
        .checked_mul(entry)
        .and_then(|t| t.checked_add(9))
        .filter(|t| t + 8 <= n as u64)
        .ok_or_else(|| bad(format!("{frames} frames do not fit the blob")))?;
    let table_start = n - table as usize - 8;
    if le32(blob, table_start) != SKIPPABLE_MAGIC || u64::from(le32(blob, table_start + 4)) != table
    {
        return Err(bad("seek table is not a well-formed skippable frame".into()));
    }
    let mut out = Vec::with_capacity(frames as usize);
    let (mut c_off, mut d_off) = (0u64, 0u64);
    for i in 0..frames as usize {
        let at = table_start + 8 + i * entry as usize;
        let (c, d) = (u64::from(le32(blob, at)), u64::from(le32(blob, at + 4)));
        if d > MAX_FRAME {
            return Err(bad(format!("frame {i} decodes to {d} bytes, over 16 MiB")));
        }
        // A zstd block takes at least 4 bytes (3 of header, 1 of RLE byte)
        // and yields at most 128 KiB, so a frame of `c` bytes yields at most
        // c / 4 * 128 KiB: a table of empty frames cannot claim gigabytes.
        if d > (c / 4) * ZSTD_BLOCK_MAX {
            return Err(bad(format!(
                "frame {i} of {c} bytes cannot decode to {d} bytes"
            )));
        }
        out.push(Frame {
            offset: c_off,
            compressed: c,
            decoded_offset: d_off,
            decoded: d,
        });
        c_off += c; // at most 2^32 frames of < 2^32 bytes: no overflow in u64
        d_off += d;
    }
    if c_off != table_start as u64 {
        return Err(bad(format!(
            "frames take {c_off} bytes, the seek table starts at {table_start}"
        )));
    }
    if d_off != decoded_len {
        return Err(bad(format!(
            "frames decode to {d_off} bytes, decoded_length is {decoded_len}"
        )));
    }
    if let Some(first) = out.first() {
        let ragged = out[..out.len() - 1]
            .iter()
            .any(|f| f.decoded != first.decoded)
            || out.last().is_some_and(|l| l.decoded > first.decoded);
        if ragged {
            return Err(bad("frames other than the last differ in size".into()));
        }
    }
    Ok(out)
}

/// Decode one frame into exactly `out`, checking it carries a checksum.
fn decode_frame(frame: &[u8], out: &mut [u8], ctx: &Context) -> Result<()> {
    let bad = |reason: String| Error::Decode {
        rule: rules::ENCODING,
        ctx: ctx.clone(),
        reason: format!("{ZSTD_SEEKABLE}: {reason}"),
    };
    if frame.len() < 5 || le32(frame, 0) != ZSTD_MAGIC {
        return Err(bad("frame is not a zstd frame".into()));
    }
    if frame[4] & 0x04 == 0 {
        return Err(bad("frame has no content checksum".into()));
    }
    let mut dctx = zstd::bulk::Decompressor::new().map_err(|e| bad(e.to_string()))?;
    let written = dctx
        .decompress_to_buffer(frame, out)
        .map_err(|e| bad(format!("zstd: {e}")))?;
    if written != out.len() {
        return Err(bad(format!(
            "frame decoded to {written} bytes, the seek table says {}",
            out.len()
        )));
    }
    Ok(())
}

/// Encode `data` as a seekable stream at `level`. Each frame is
/// compressed on its own, so a part of several frames is compressed on
/// every core (the same bytes as one after another: zstd's output depends
/// on the input and the parameters only).
pub fn encode(data: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    use rayon::prelude::*;
    use zstd::zstd_safe::CParameter;
    let compressor = || -> std::io::Result<zstd::bulk::Compressor<'static>> {
        let mut c = zstd::bulk::Compressor::new(level)?;
        c.set_parameter(CParameter::ChecksumFlag(true))?;
        Ok(c)
    };
    let frames: Vec<Vec<u8>> = if data.len() > WRITE_FRAME {
        data.par_chunks(WRITE_FRAME)
            .map_init(compressor, |c, chunk| {
                c.as_mut()
                    .map_err(|e| std::io::Error::new(e.kind(), e.to_string()))?
                    .compress(chunk)
            })
            .collect::<std::io::Result<_>>()?
    } else {
        let mut c = compressor()?;
        data.chunks(WRITE_FRAME)
            .map(|chunk| c.compress(chunk))
            .collect::<std::io::Result<_>>()?
    };
    let mut out = Vec::with_capacity(frames.iter().map(Vec::len).sum::<usize>() + 64);
    let mut entries = Vec::new();
    for (frame, chunk) in frames.iter().zip(data.chunks(WRITE_FRAME)) {
        entries.push((frame.len() as u32, chunk.len() as u32));
        out.extend_from_slice(frame);
    }
    let table_len = entries.len() as u32 * 8 + 9;
    out.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
    out.extend_from_slice(&table_len.to_le_bytes());
    for (c, d) in &entries {
        out.extend_from_slice(&c.to_le_bytes());
        out.extend_from_slice(&d.to_le_bytes());
    }
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    out.push(0);
    out.extend_from_slice(&SEEKABLE_MAGIC.to_le_bytes());
    Ok(out)
}

/// A part stored as `zt.zstd-seekable/1`.
#[derive(Debug)]
pub struct ZstdSeekable {
    /// The file holding the blob.
    pub store: Arc<Store>,
    /// Blob offset.
    pub offset: u64,
    /// Blob (encoded) length.
    pub len: u64,
    /// Decoded length.
    pub decoded_len: u64,
}

impl ZstdSeekable {
    fn ctx(&self) -> Context {
        self.store.ctx().at(self.offset)
    }
}

impl Decode for ZstdSeekable {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let ctx = self.ctx();
        limits.check_decoded(&ctx, self.decoded_len)?;
        let blob = self.store.read(self.offset, self.len)?;
        let frames = seek_table(&blob, self.decoded_len, &ctx)?;
        let mut out = zt_core::buffer::try_zeroed(&ctx, "a decoded part", self.decoded_len)?;
        for f in &frames {
            let src = &blob[f.offset as usize..(f.offset + f.compressed) as usize];
            let dst = &mut out[f.decoded_offset as usize..(f.decoded_offset + f.decoded) as usize];
            decode_frame(src, dst, &ctx)?;
        }
        Ok(out)
    }

    fn describe(&self) -> &'static str {
        ZSTD_SEEKABLE
    }

    /// Decode only the frames that `[start, start + len)` of the decoded
    /// stream touches, and return exactly those bytes.
    fn decode_range(&self, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
        let ctx = self.ctx();
        let end = start
            .checked_add(len)
            .filter(|&e| e <= self.decoded_len)
            .ok_or_else(|| {
                Error::range(
                    ctx.clone(),
                    Rule::READ_RANGE,
                    format!(
                        "range {start}+{len} is past the decoded length {}",
                        self.decoded_len
                    ),
                )
            })?;
        limits.check_decoded(&ctx, len)?;
        let blob = self.store.read(self.offset, self.len)?;
        let frames = seek_table(&blob, self.decoded_len, &ctx)?;
        let mut out = zt_core::buffer::try_with_capacity(&ctx, "a decoded range", len)?;
        let mut scratch = Vec::new();
        for f in frames
            .iter()
            .filter(|f| f.decoded_offset < end && f.decoded_offset + f.decoded > start)
        {
            scratch.resize(f.decoded as usize, 0);
            let src = &blob[f.offset as usize..(f.offset + f.compressed) as usize];
            decode_frame(src, &mut scratch, &ctx)?;
            let lo = start.max(f.decoded_offset) - f.decoded_offset;
            let hi = end.min(f.decoded_offset + f.decoded) - f.decoded_offset;
            out.extend_from_slice(&scratch[lo as usize..hi as usize]);
        }
        Ok(out)
    }
}

/// A part in an encoding zt does not know: structurally present, refused
/// when decoded (§5.3).
#[derive(Debug)]
pub struct UnknownEncoding {
    /// Where the part lives, for the error.
    pub ctx: Context,
    /// The profile id.
    pub encoding: String,
}

impl Decode for UnknownEncoding {
    fn decode(&self, _limits: &Limits) -> Result<Vec<u8>> {
        Err(Error::Unsupported {
            rule: rules::UNSUPPORTED,
            ctx: self.ctx.clone(),
            reason: format!("unknown encoding {:?}", self.encoding),
        })
    }

    fn describe(&self) -> &'static str {
        "unknown encoding"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_table() {
        let data: Vec<u8> = (0..(3 * WRITE_FRAME + 17))
            .map(|i| (i % 251) as u8)
            .collect();
        let enc = encode(&data, 3).unwrap();
        let frames = seek_table(&enc, data.len() as u64, &Context::default()).unwrap();
        assert_eq!(frames.len(), 4);
        assert_eq!(frames[3].decoded, 17);
        let mut out = vec![0u8; WRITE_FRAME];
        let f = frames[1];
        decode_frame(
            &enc[f.offset as usize..(f.offset + f.compressed) as usize],
            &mut out,
            &Context::default(),
        )
        .unwrap();
        assert_eq!(&out[..], &data[WRITE_FRAME..2 * WRITE_FRAME]);
        assert!(seek_table(&enc, data.len() as u64 + 1, &Context::default()).is_err());
    }

    /// Frames compressed on several threads are the bytes one compressor
    /// gives compressing them one after another.
    #[test]
    fn frames_compressed_in_parallel_are_the_serial_bytes() {
        let data: Vec<u8> = (0..(5 * WRITE_FRAME + 1000))
            .map(|i| ((i * 7919) % 253) as u8)
            .collect();
        let enc = encode(&data, 3).unwrap();
        let mut c = zstd::bulk::Compressor::new(3).unwrap();
        c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))
            .unwrap();
        let serial: Vec<u8> = data
            .chunks(WRITE_FRAME)
            .flat_map(|chunk| c.compress(chunk).unwrap())
            .collect();
        assert_eq!(&enc[..serial.len()], &serial[..]);
        assert_eq!(
            seek_table(&enc, data.len() as u64, &Context::default())
                .unwrap()
                .len(),
            6
        );
    }

    /// Zeros compress as far as zstd can (RLE blocks) and still pass the
    /// per-frame bound; a table of empty frames claiming gigabytes does not.
    #[test]
    fn empty_frames_cannot_claim_gigabytes() {
        let zeros = vec![0u8; 5 * WRITE_FRAME];
        let enc = encode(&zeros, 19).unwrap();
        assert!(seek_table(&enc, zeros.len() as u64, &Context::default()).is_ok());
        let frames = 1000u32;
        let mut blob = Vec::new();
        blob.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
        blob.extend_from_slice(&(frames * 8 + 9).to_le_bytes());
        for _ in 0..frames {
            blob.extend_from_slice(&0u32.to_le_bytes());
            blob.extend_from_slice(&(MAX_FRAME as u32).to_le_bytes());
        }
        blob.extend_from_slice(&frames.to_le_bytes());
        blob.push(0);
        blob.extend_from_slice(&SEEKABLE_MAGIC.to_le_bytes());
        let e = seek_table(&blob, u64::from(frames) * MAX_FRAME, &Context::default()).unwrap_err();
        assert!(e.to_string().contains("cannot decode to"), "{e}");
    }
}
