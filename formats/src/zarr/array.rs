//! An array's elements from its chunks: [`ZarrArray`], the `Decode` of a
//! zarr array's one part. Only the chunks a read meets are fetched (a
//! range of the array reads the rows of chunks it spans); a chunk never
//! written is the fill value; a shard's index is read first and then only
//! the inner chunks the read meets, each by its own byte range.
//!
//! The output is allocated once (filled with the fill value) and every
//! chunk decodes into the box of it that the chunk covers. Chunks of a
//! local store (and a shard's inner chunks) decode on the CPU pool
//! (rayon) at once: boxes of distinct chunks never overlap, so each
//! writes its own bytes ([`Out`]); memory beyond the output is one
//! decoded chunk per worker. A remote store's chunks are fetched one
//! after another as before, each a request of the store's own.

use std::borrow::Cow;
use std::io::Read;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use rayon::prelude::*;

use zt_core::catalog::Decode;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

use super::crc32c::crc32c;
use super::keys::Keys;
use super::meta::{ArrayMeta, Codecs, Compressor, Serializer, Sharding};
use super::rules::{CHECKSUM, CHUNK, SHARD};

/// One zarr array, read chunk by chunk.
#[derive(Debug)]
pub struct ZarrArray {
    /// The store.
    pub keys: Arc<Keys>,
    /// The array's key prefix (`a/b/`, `""` for an array at the root).
    pub prefix: String,
    /// Its metadata.
    pub meta: ArrayMeta,
    /// Names the array's metadata, for errors without a chunk.
    pub ctx: Context,
}

/// Bytes of one stored object: a chunk's file, or a shard decompressed
/// whole.
enum Blob {
    Store(Arc<Store>),
    Memory(Vec<u8>),
}

impl Blob {
    fn len(&self) -> u64 {
        match self {
            Blob::Store(s) => s.len(),
            Blob::Memory(m) => m.len() as u64,
        }
    }

    fn read(&self, offset: u64, len: u64) -> Result<Cow<'_, [u8]>> {
        match self {
            Blob::Store(s) => s.read(offset, len),
            Blob::Memory(m) => Ok(Cow::Borrowed(&m[offset as usize..(offset + len) as usize])),
        }
    }
}

/// The box of the array a read fills, and its C-order buffer, written
/// by many chunks at once.
struct Out<'a> {
    ptr: *mut u8,
    len: usize,
    buf: PhantomData<&'a mut [u8]>,
    origin: Vec<u64>,
    shape: Vec<u64>,
    size: usize,
    /// The byte-swap unit of a big-endian element: its size, or half of
    /// it for a complex number.
    swap: usize,
    /// Whether chunks decode on the CPU pool (a local store).
    parallel: bool,
}

// SAFETY: `Out` is the exclusive borrow of one buffer (`buf`) for the
// read. Chunks of a regular grid cover disjoint boxes of the array, as
// do a shard's inner chunks inside its box, and a read visits each chunk
// once, so no byte is written by two threads; `Out::put` checks every
// write against the buffer's bounds.
unsafe impl Sync for Out<'_> {}

impl<'a> Out<'a> {
    fn new(
        buf: &'a mut [u8],
        origin: Vec<u64>,
        shape: Vec<u64>,
        size: usize,
        swap: usize,
        parallel: bool,
    ) -> Out<'a> {
        Out {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            buf: PhantomData,
            origin,
            shape,
            size,
            swap,
            parallel,
        }
    }

    /// `src` at byte `at` of the buffer: bytes of the one chunk whose box
    /// holds them.
    fn put(&self, at: usize, src: &[u8]) {
        let end = at.checked_add(src.len());
        assert!(
            end.is_some_and(|e| e <= self.len),
            "a chunk's box outside the read"
        );
        // SAFETY: in bounds (checked above); no other chunk writes these
        // bytes (see `Sync` above) and nothing reads them until the read
        // ends.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(at), src.len()) }
    }
}

fn elements(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
}

fn c_strides(shape: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}

/// Every index of the box `lo..hi` (per dimension), each handed to `f`
/// once: on the CPU pool when `parallel` (the failure of the first index
/// in C order is the one reported, so an error does not depend on
/// scheduling), else in C order. The count of indices is at most the
/// elements of the read, whose buffer exists; one that overflows is
/// refused rather than read as no chunks.
fn for_each_chunk(
    lo: &[u64],
    hi: &[u64],
    parallel: bool,
    ctx: &Context,
    f: impl Fn(&[u64]) -> Result<()> + Sync,
) -> Result<()> {
    let extent: Vec<u64> = lo
        .iter()
        .zip(hi)
        .map(|(l, h)| h.saturating_sub(*l))
        .collect();
    let count = elements(&extent)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| overflow(ctx))?;
    let index = |mut k: usize| {
        let mut ix = vec![0u64; lo.len()];
        for d in (0..lo.len()).rev() {
            let e = extent[d] as usize;
            ix[d] = lo[d] + (k % e) as u64;
            k /= e;
        }
        ix
    };
    if parallel && count > 1 {
        match (0..count)
            .into_par_iter()
            .filter_map(|k| f(&index(k)).err())
            .find_first(|_| true)
        {
            Some(e) => Err(e),
            None => Ok(()),
        }
    } else {
        (0..count).try_for_each(|k| f(&index(k)))
    }
}

/// Every index of the box `lo..hi` (per dimension) but the last
/// dimension's, in C order, handed to `f`.
fn for_each_row(lo: &[u64], hi: &[u64], mut f: impl FnMut(&[u64]) -> Result<()>) -> Result<()> {
    let n = lo.len();
    if n == 0 || lo.iter().zip(hi).any(|(l, h)| l >= h) {
        return if n == 0 { f(&[]) } else { Ok(()) };
    }
    let mut ix = lo.to_vec();
    loop {
        f(&ix)?;
        let mut d = n - 1;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            ix[d] += 1;
            if ix[d] < hi[d] {
                break;
            }
            ix[d] = lo[d];
        }
    }
}

impl ZarrArray {
    /// Bytes of the whole array, C order.
    pub fn decoded_len(&self) -> Option<u64> {
        elements(&self.meta.shape)?.checked_mul(self.meta.dtype.size()?)
    }

    fn size(&self) -> usize {
        self.meta.dtype.size().unwrap_or(1) as usize
    }

    /// Rows `rows` of dimension 0 (every element of a rank-0 array),
    /// C order.
    fn read_rows(&self, rows: Range<u64>, limits: &Limits) -> Result<Vec<u8>> {
        let meta = &self.meta;
        let mut shape = meta.shape.clone();
        let mut origin = vec![0u64; shape.len()];
        if let Some(first) = shape.first_mut() {
            *first = rows.end - rows.start;
            origin[0] = rows.start;
        }
        let size = self.size();
        let len = elements(&shape)
            .and_then(|n| n.checked_mul(size as u64))
            .ok_or_else(|| overflow(&self.ctx))?;
        limits.check_decoded(&self.ctx, len)?;
        let mut buf = if meta.fill.iter().all(|&b| b == 0) {
            zt_core::buffer::try_zeroed(&self.ctx, "a zarr array", len)?
        } else {
            let mut b = zt_core::buffer::try_with_capacity(&self.ctx, "a zarr array", len)?;
            while b.len() < len as usize {
                b.extend_from_slice(&meta.fill);
            }
            b
        };
        if len == 0 {
            return Ok(buf);
        }
        // The grid's chunks the box meets.
        let lo: Vec<u64> = origin
            .iter()
            .zip(&meta.chunks)
            .map(|(o, c)| o / c)
            .collect();
        let hi: Vec<u64> = origin
            .iter()
            .zip(&shape)
            .zip(&meta.chunks)
            .map(|((o, s), c)| (o + s).div_ceil(*c))
            .collect();
        let swap = match meta.dtype {
            zt_core::DType::Complex64 | zt_core::DType::Complex128 => size / 2,
            _ => size,
        };
        let out = Out::new(&mut buf, origin, shape, size, swap, self.keys.is_local());
        let visit = |index: &[u64]| -> Result<()> {
            let key = format!("{}{}", self.prefix, meta.keys.key(index));
            let Some(store) = self.keys.get(&self.ctx, &key)? else {
                return Ok(()); // never written: the fill value
            };
            let chunk_origin: Vec<u64> =
                index.iter().zip(&meta.chunks).map(|(i, c)| i * c).collect();
            let ctx = Context::file(store.path());
            decode_chunk(
                Blob::Store(store),
                &meta.codecs,
                &chunk_origin,
                &meta.chunks,
                &out,
                limits,
                &ctx,
            )
        };
        for_each_chunk(&lo, &hi, out.parallel, &self.ctx, visit)?;
        Ok(buf)
    }
}

/// One chunk (or shard) of the grid, decoded into the part of `out` it
/// covers.
fn decode_chunk(
    blob: Blob,
    codecs: &Codecs,
    origin: &[u64],
    shape: &[u64],
    out: &Out<'_>,
    limits: &Limits,
    ctx: &Context,
) -> Result<()> {
    match &codecs.serializer {
        Serializer::Bytes { big } => {
            let raw = blob.read(0, blob.len())?;
            let elems = elements(shape).ok_or_else(|| overflow(ctx))?;
            let want = elems
                .checked_mul(out.size as u64)
                .ok_or_else(|| overflow(ctx))?;
            limits.check_decoded(ctx, want)?;
            let mut data = undo_compressors(raw, &codecs.compressors, want, limits, ctx)?;
            if data.len() as u64 != want {
                return Err(Error::decode(
                    ctx.clone(),
                    CHUNK,
                    format!(
                        "chunk holds {} bytes, its {shape:?} elements take {want}",
                        data.len()
                    ),
                ));
            }
            if *big && out.size > 1 {
                let mut owned = data.into_owned();
                zt_core::buffer::swap_units(&mut owned, out.swap);
                data = Cow::Owned(owned);
            }
            copy_chunk(&data, origin, shape, codecs.order.as_deref(), out);
            Ok(())
        }
        Serializer::Shard(sharding) => {
            let blob = if codecs.compressors.is_empty() {
                blob
            } else {
                let raw = blob.read(0, blob.len())?;
                Blob::Memory(
                    undo_compressors(raw, &codecs.compressors, limits.decoded_bytes, limits, ctx)?
                        .into_owned(),
                )
            };
            read_shard(&blob, sharding, origin, shape, out, limits, ctx)
        }
    }
}

/// The inner chunks of the shard at `origin` that `out` meets.
fn read_shard(
    blob: &Blob,
    s: &Sharding,
    origin: &[u64],
    shape: &[u64],
    out: &Out<'_>,
    limits: &Limits,
    ctx: &Context,
) -> Result<()> {
    let per: Vec<u64> = shape.iter().zip(&s.chunks).map(|(a, b)| a / b).collect();
    let count = elements(&per).ok_or_else(|| overflow(ctx))?;
    let index_len = count
        .checked_mul(16)
        .and_then(|n| n.checked_add(if s.index_crc { 4 } else { 0 }))
        .ok_or_else(|| overflow(ctx))?;
    limits.check_decoded(ctx, index_len)?;
    if blob.len() < index_len {
        return Err(Error::range(
            ctx.clone(),
            SHARD,
            format!(
                "shard of {} bytes is shorter than its index of {index_len}",
                blob.len()
            ),
        ));
    }
    let index_at = if s.index_at_end {
        blob.len() - index_len
    } else {
        0
    };
    let index = blob.read(index_at, index_len)?;
    let pairs = if s.index_crc {
        let (body, tail) = index.split_at(index.len() - 4);
        let stored = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
        let computed = crc32c(body);
        if stored != computed {
            return Err(Error::decode(
                ctx.clone(),
                CHECKSUM,
                format!("shard index CRC-32C {computed:#010x}, stored {stored:#010x}"),
            ));
        }
        body
    } else {
        &index[..]
    };
    let word = |i: usize| {
        let b: [u8; 8] = pairs[i * 8..i * 8 + 8].try_into().expect("8 bytes");
        if s.index_big {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        }
    };
    let data = if s.index_at_end {
        0..index_at
    } else {
        index_len..blob.len()
    };
    // Every inner chunk's range inside the shard's data and none over
    // another (zarr never writes overlapping chunks; a lying index could
    // alias one chunk's bytes as another's).
    let mut ranges = Vec::new();
    for i in 0..count as usize {
        let (offset, nbytes) = (word(2 * i), word(2 * i + 1));
        if offset == u64::MAX && nbytes == u64::MAX {
            continue;
        }
        match offset.checked_add(nbytes) {
            Some(end) if offset >= data.start && end <= data.end => ranges.push((offset, end)),
            _ => {
                return Err(Error::range(
                    ctx.clone(),
                    SHARD,
                    format!(
                    "inner chunk {i}: bytes {offset}+{nbytes} outside the shard's data {data:?}"
                ),
                ))
            }
        }
    }
    ranges.sort_unstable();
    if let Some(w) = ranges.windows(2).find(|w| w[1].0 < w[0].1) {
        return Err(Error::range(
            ctx.clone(),
            SHARD,
            format!("inner chunks at bytes {:?} and {:?} overlap", w[0], w[1]),
        ));
    }
    // The inner chunks `out` meets, by their index in the shard.
    let lo: Vec<u64> = (0..shape.len())
        .map(|d| out.origin[d].max(origin[d]).saturating_sub(origin[d]) / s.chunks[d])
        .collect();
    let hi: Vec<u64> = (0..shape.len())
        .map(|d| {
            let end = (out.origin[d] + out.shape[d]).min(origin[d] + shape[d]);
            end.saturating_sub(origin[d]).div_ceil(s.chunks[d])
        })
        .collect();
    if lo.iter().zip(&hi).any(|(l, h)| l >= h) {
        return Ok(());
    }
    let strides = c_strides(&per);
    for_each_chunk(&lo, &hi, out.parallel, ctx, |index| {
        let linear: u64 = index.iter().zip(&strides).map(|(i, st)| i * st).sum();
        let (offset, nbytes) = (word(2 * linear as usize), word(2 * linear as usize + 1));
        if offset == u64::MAX && nbytes == u64::MAX {
            return Ok(()); // empty: the fill value
        }
        let bytes = blob.read(offset, nbytes)?;
        let inner_origin: Vec<u64> = index
            .iter()
            .zip(&s.chunks)
            .zip(origin)
            .map(|((i, c), o)| o + i * c)
            .collect();
        decode_chunk(
            Blob::Memory(bytes.into_owned()),
            &s.codecs,
            &inner_origin,
            &s.chunks,
            out,
            limits,
            ctx,
        )
    })
}

/// Undo the bytes-to-bytes codecs, last first; the first of them (the
/// last undone) yields at most `cap` bytes, the others at most the limit.
fn undo_compressors<'a>(
    raw: Cow<'a, [u8]>,
    compressors: &[Compressor],
    cap: u64,
    limits: &Limits,
    ctx: &Context,
) -> Result<Cow<'a, [u8]>> {
    let mut data = raw;
    for (i, c) in compressors.iter().enumerate().rev() {
        let cap = if i == 0 { cap } else { limits.decoded_bytes };
        data = match c {
            Compressor::Crc32c => {
                if data.len() < 4 {
                    return Err(Error::decode(
                        ctx.clone(),
                        CHUNK,
                        "chunk shorter than its CRC-32C",
                    ));
                }
                let split = data.len() - 4;
                let stored = u32::from_le_bytes(data[split..].try_into().expect("4 bytes"));
                let computed = crc32c(&data[..split]);
                if stored != computed {
                    return Err(Error::decode(
                        ctx.clone(),
                        CHECKSUM,
                        format!("chunk CRC-32C {computed:#010x}, stored {stored:#010x}"),
                    ));
                }
                match data {
                    Cow::Borrowed(b) => Cow::Borrowed(&b[..split]),
                    Cow::Owned(mut v) => {
                        v.truncate(split);
                        Cow::Owned(v)
                    }
                }
            }
            Compressor::Zstd => Cow::Owned(bounded(
                zstd::stream::read::Decoder::new(&data[..]).map_err(|e| fail(ctx, "zstd", e))?,
                cap,
                "zstd",
                ctx,
            )?),
            Compressor::Gzip => Cow::Owned(bounded(
                flate2::read::MultiGzDecoder::new(&data[..]),
                cap,
                "gzip",
                ctx,
            )?),
            Compressor::Zlib => Cow::Owned(bounded(
                flate2::read::ZlibDecoder::new(&data[..]),
                cap,
                "zlib",
                ctx,
            )?),
            Compressor::Blosc => Cow::Owned(super::blosc::decode(&data, cap, ctx)?),
        };
    }
    Ok(data)
}

fn overflow(ctx: &Context) -> Error {
    Error::Overflow {
        ctx: ctx.clone(),
        rule: zt_core::Rule::OVERFLOW,
        what: "a zarr chunk's size",
    }
}

fn fail(ctx: &Context, what: &str, e: impl std::fmt::Display) -> Error {
    Error::decode(ctx.clone(), CHUNK, format!("{what}: {e}"))
}

/// Everything `reader` yields, refused past `cap` bytes.
fn bounded(reader: impl Read, cap: u64, what: &str, ctx: &Context) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    reader
        .take(cap.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| fail(ctx, what, e))?;
    if out.len() as u64 > cap {
        return Err(Error::decode(
            ctx.clone(),
            CHUNK,
            format!("{what} stream decompresses past the chunk's {cap} bytes"),
        ));
    }
    Ok(out)
}

/// Copy the decoded chunk `data` (its elements in stored order: C order
/// of the chunk, or of its axes permuted by `order`) into the part of
/// `out` it covers.
fn copy_chunk(data: &[u8], origin: &[u64], shape: &[u64], order: Option<&[usize]>, out: &Out<'_>) {
    let n = shape.len();
    let size = out.size as u64;
    // Element strides of the chunk's own dimensions in `data`.
    let strides = match order {
        None => c_strides(shape),
        Some(order) => {
            let stored: Vec<u64> = order.iter().map(|&o| shape[o]).collect();
            let st = c_strides(&stored);
            let mut strides = vec![0u64; n];
            for (i, &o) in order.iter().enumerate() {
                strides[o] = st[i];
            }
            strides
        }
    };
    if n == 0 {
        out.put(0, &data[..out.size]);
        return;
    }
    let lo: Vec<u64> = (0..n).map(|d| origin[d].max(out.origin[d])).collect();
    let hi: Vec<u64> = (0..n)
        .map(|d| (origin[d] + shape[d]).min(out.origin[d] + out.shape[d]))
        .collect();
    let out_strides = c_strides(&out.shape);
    let run = hi[n - 1].saturating_sub(lo[n - 1]);
    let _ = for_each_row(&lo, &hi, |row| {
        let src: u64 = (0..n).map(|d| (row[d] - origin[d]) * strides[d]).sum();
        let dst: u64 = (0..n)
            .map(|d| (row[d] - out.origin[d]) * out_strides[d])
            .sum();
        let (src, dst) = ((src * size) as usize, (dst * size) as usize);
        if strides[n - 1] == 1 {
            let len = (run * size) as usize;
            out.put(dst, &data[src..src + len]);
        } else {
            let step = (strides[n - 1] * size) as usize;
            let size = size as usize;
            for k in 0..run as usize {
                let s = src + k * step;
                let d = dst + k * size;
                out.put(d, &data[s..s + size]);
            }
        }
        Ok(())
    });
}

impl Decode for ZarrArray {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let rows = self.meta.shape.first().copied().unwrap_or(1);
        self.read_rows(0..rows, limits)
    }

    fn describe(&self) -> &'static str {
        "zarr"
    }

    /// The rows of dimension 0 the range spans, so only their chunks are
    /// read.
    fn decode_range(&self, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
        let total = self.decoded_len().unwrap_or(0);
        let rows = self.meta.shape.first().copied().unwrap_or(1);
        let row_bytes = total.checked_div(rows).unwrap_or(0);
        if self.meta.shape.is_empty() || row_bytes == 0 {
            let all = self.decode(limits)?;
            let end = start.saturating_add(len).min(all.len() as u64) as usize;
            return Ok(all[(start as usize).min(end)..end].to_vec());
        }
        let first = start / row_bytes;
        let last = start.saturating_add(len).div_ceil(row_bytes).min(rows);
        let block = self.read_rows(first..last, limits)?;
        let skip = (start - first * row_bytes) as usize;
        Ok(block[skip..skip + len as usize].to_vec())
    }

    fn seeks(&self) -> bool {
        true
    }
}
