//! The `blosc` codec (v3 `blosc`, v2 compressor id `blosc`): a Blosc 1
//! frame (16-byte header, then blocks) decoded by c-blosc 1.21 (the
//! `blosc-src` crate, with its lz4 and zstd codecs). The header names the
//! uncompressed size; it is checked against the chunk's expected size
//! before anything is allocated, and the frame's own length against the
//! stored chunk's, so c-blosc never reads or writes past either buffer.

use std::os::raw::{c_int, c_void};

use super::rules::{CHUNK, CODEC};
use zt_core::error::{Context, Error, Result};

/// Blosc 1's header length.
const HEADER: usize = 16;
/// Header flag: the blocks are stored uncompressed (no codec used).
const MEMCPYED: u8 = 0x02;

/// The codec a frame's header names (flags bits 5 to 7), as zarr names it.
fn codec_name(flags: u8) -> &'static str {
    match flags >> 5 {
        0 => "blosclz",
        1 => "lz4",
        2 => "snappy",
        3 => "zlib",
        4 => "zstd",
        _ => "unknown",
    }
}

/// The bytes a Blosc frame holds, refused past `cap` bytes.
pub fn decode(data: &[u8], cap: u64, ctx: &Context) -> Result<Vec<u8>> {
    if data.len() < HEADER {
        return Err(Error::decode(
            ctx.clone(),
            CHUNK,
            format!(
                "blosc chunk of {} bytes is shorter than its 16-byte header",
                data.len()
            ),
        ));
    }
    let flags = data[2];
    let codec = codec_name(flags);
    if flags & MEMCPYED == 0 && !matches!(codec, "blosclz" | "lz4" | "zstd") {
        return Err(Error::unsupported(
            ctx.clone(),
            CODEC,
            format!("blosc with cname {codec:?} (zt reads blosclz, lz4, lz4hc and zstd)"),
        ));
    }
    let mut nbytes: usize = 0;
    // SAFETY: `data` is a live slice of `data.len()` bytes (at least the
    // header, which is all c-blosc reads here); `nbytes` is a live usize.
    let valid = unsafe {
        blosc_src::blosc_cbuffer_validate(data.as_ptr().cast::<c_void>(), data.len(), &mut nbytes)
    };
    if valid != 0 {
        let stored = u32::from_le_bytes(data[12..16].try_into().expect("4 bytes"));
        return Err(Error::decode(
            ctx.clone(),
            CHUNK,
            format!(
                "blosc header says {stored} compressed bytes, the chunk holds {}",
                data.len()
            ),
        ));
    }
    if nbytes as u64 > cap {
        return Err(Error::decode(
            ctx.clone(),
            CHUNK,
            format!("blosc frame decompresses to {nbytes} bytes, past the chunk's {cap} bytes"),
        ));
    }
    if nbytes == 0 {
        return Ok(Vec::new());
    }
    let mut out: Vec<u8> = Vec::with_capacity(nbytes);
    // SAFETY: the frame's compressed length equals `data.len()` (validated
    // above), so c-blosc reads within `data`; it writes at most `nbytes`
    // bytes into `out`, whose capacity is `nbytes`. One internal thread:
    // no thread pool outlives the call.
    let got = unsafe {
        blosc_src::blosc_decompress_ctx(
            data.as_ptr().cast::<c_void>(),
            out.as_mut_ptr().cast::<c_void>(),
            nbytes,
            1 as c_int,
        )
    };
    if got < 0 || got as usize != nbytes {
        return Err(Error::decode(
            ctx.clone(),
            CHUNK,
            format!("blosc ({codec}) frame does not decode (c-blosc returned {got})"),
        ));
    }
    // SAFETY: c-blosc wrote all `nbytes` bytes (it returned that count).
    unsafe { out.set_len(nbytes) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> Context {
        Context::default()
    }

    #[test]
    fn short_and_lying_frames_are_chunk_errors() {
        let e = decode(&[2, 1, 0x21, 4], 16, &ctx()).unwrap_err();
        assert_eq!(e.rule(), Some(CHUNK));
        // A header claiming 64 compressed bytes in a 20-byte chunk.
        let mut frame = vec![2u8, 1, 0x21, 4];
        frame.extend_from_slice(&16u32.to_le_bytes());
        frame.extend_from_slice(&16u32.to_le_bytes());
        frame.extend_from_slice(&64u32.to_le_bytes());
        frame.extend_from_slice(&[0; 4]);
        let e = decode(&frame, 16, &ctx()).unwrap_err();
        assert_eq!(e.rule(), Some(CHUNK));
        assert!(e.to_string().contains("64 compressed bytes"), "{e}");
    }

    #[test]
    fn a_frame_larger_than_the_chunk_is_refused_before_allocating() {
        // memcpyed frame claiming 1 GiB of output, the chunk 16 bytes.
        let mut frame = vec![2u8, 1, MEMCPYED, 1];
        frame.extend_from_slice(&(1u32 << 30).to_le_bytes());
        frame.extend_from_slice(&(1u32 << 16).to_le_bytes());
        frame.extend_from_slice(&16u32.to_le_bytes());
        let e = decode(&frame, 16, &ctx()).unwrap_err();
        assert_eq!(e.rule(), Some(CHUNK));
        assert!(e.to_string().contains("past the chunk's 16 bytes"), "{e}");
    }

    /// The `zarr_blosc` fuzz seeds (numcodecs' frames, fuzz/make_seeds.py)
    /// reach c-blosc's decoders: each decodes to its stated size, but zlib's.
    #[test]
    fn the_fuzz_seeds_decode() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/zarr_blosc");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let frame = std::fs::read(&path).unwrap();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let stated = u32::from_le_bytes(frame[4..8].try_into().unwrap()) as usize;
            match decode(&frame, 1 << 20, &ctx()) {
                Ok(out) => assert!(!name.starts_with("zlib") && out.len() == stated, "{name}"),
                Err(e) => assert!(
                    name.starts_with("zlib") && e.rule() == Some(CODEC),
                    "{name}: {e}"
                ),
            }
            seen += 1;
        }
        assert!(seen >= 19, "{seen} seeds");
    }

    #[test]
    fn codecs_not_built_are_refused_by_name() {
        let mut frame = vec![2u8, 1, 3 << 5, 4];
        frame.extend_from_slice(&[0; 12]);
        let e = decode(&frame, 16, &ctx()).unwrap_err();
        assert_eq!(e.rule(), Some(CODEC));
        assert!(e.to_string().contains("zlib"), "{e}");
    }
}
