//! A tensor from chunks: each chunk a box of the global tensor (its first
//! element's index and its extent per dimension) whose bytes are a payload
//! of their own, copied to its place in the global C-order buffer on read.
//! What a distributed checkpoint's sharded tensor is (the `dcp` plugin's
//! chunks, the per-rank files of a DTensor merged by their placements).
//!
//! The caller checks that the chunks tile the global shape (none overlaps
//! another, together they cover every element) and that each payload holds
//! what its extent and strides reach; reading only copies.

use std::sync::Arc;

use crate::catalog::{Decode, Payload};
use crate::dtype::{c_strides, num_elements};
use crate::error::{Context, Error, Result};
use crate::limits::Limits;
use crate::rule::Rule;

/// One chunk of a tensor.
#[derive(Debug, Clone)]
pub struct Piece {
    /// Its first element's index in each dimension of the global tensor.
    pub offsets: Vec<u64>,
    /// Its extent in each dimension.
    pub sizes: Vec<u64>,
    /// Its element strides over its bytes; `None` is C order.
    pub strides: Option<Vec<i64>>,
    /// Its bytes.
    pub payload: Payload,
}

/// A tensor of several chunks: each chunk's elements copied to its place
/// in the global C-order buffer.
#[derive(Debug)]
pub struct Assemble {
    /// The tensor, for errors.
    pub ctx: Context,
    /// The global shape.
    pub size: Vec<u64>,
    /// Bytes per element.
    pub elem: u64,
    /// The chunks, tiling `size`.
    pub pieces: Vec<Piece>,
    /// The rule a chunk shorter than its extent cites.
    pub rule: Rule,
    /// What [`Decode::describe`] says (`"dcp chunks"`).
    pub describe: &'static str,
}

impl Assemble {
    /// A payload of the assembled tensor (`decoded_len` its C-order bytes).
    pub fn payload(self, decoded_len: u64) -> Payload {
        Payload::Decoded {
            decoder: Arc::new(self),
            decoded_len,
        }
    }
}

impl Decode for Assemble {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let numel = num_elements(&self.size).unwrap_or(u64::MAX);
        self.decode_range(0, numel.saturating_mul(self.elem), limits)
    }

    fn describe(&self) -> &'static str {
        self.describe
    }

    /// A range reads only the chunks it meets, and of a stored C-order
    /// chunk only the run of its bytes the range covers, so a range costs
    /// about itself (from object storage too, where reading a whole chunk
    /// for every piece of a cast fetched each chunk several times). A chunk
    /// that is itself decoded is decoded whole for every range that meets
    /// it.
    fn seeks(&self) -> bool {
        self.pieces
            .iter()
            .all(|p| matches!(p.payload, Payload::Stored { .. }))
    }

    /// Only the chunks the range meets are read, and only the range is
    /// allocated: a slice of a large sharded tensor costs the slice.
    fn decode_range(&self, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
        limits.check_decoded(&self.ctx, len)?;
        // Every byte is written (the chunks tile the tensor, checked at
        // open); zeroed pages cost nothing until then.
        let mut out = crate::buffer::try_zeroed(&self.ctx, "an assembled tensor", len)?;
        let window = (start, start.saturating_add(len));
        for p in &self.pieces {
            if p.sizes.contains(&0) {
                continue;
            }
            let (first, last) = span(&self.size, p);
            if last * self.elem <= window.0 || first * self.elem >= window.1 {
                continue;
            }
            // The chunk's bytes the window needs: `bytes` holds the chunk's
            // bytes from `base` on.
            let (bytes, base) = match &p.payload {
                Payload::Stored { store, offset, len } => {
                    let (lo, hi) = match p.strides {
                        None => self.covered(p, window).unwrap_or((0, *len)),
                        Some(_) => (0, *len),
                    };
                    let hi = hi.min(*len);
                    let lo = lo.min(hi);
                    (store.read(offset + lo, hi - lo)?, lo)
                }
                Payload::Decoded { decoder, .. } => {
                    (std::borrow::Cow::Owned(decoder.decode(limits)?), 0)
                }
            };
            self.place(&mut out, window.0, p, &bytes, base)?;
            if let Payload::Stored { store, offset, .. } = &p.payload {
                release_chunk_pages(store, offset + base, bytes.len() as u64);
            }
            drop(bytes);
        }
        Ok(out)
    }
}

/// Drop from this process's mapping the pages that hold only this chunk's
/// bytes, once they are copied: an assembled tensor is a copy, and the
/// chunk's mapped pages would otherwise stay resident until the source is
/// closed, so converting a checkpoint of many-chunk tensors held the whole
/// model's pages (peak RSS: `python -m harness --only checkpoints`,
/// results/checkpoints.md).
/// Advice only: a later read faults the same bytes back in from the file.
/// Pages shared with a neighbouring chunk (the range's first and last,
/// unless aligned) are kept.
fn release_chunk_pages(store: &crate::store::Store, offset: u64, len: u64) {
    if !store.is_mapped() {
        return;
    }
    let page = crate::store::page_size();
    let start = offset.div_ceil(page) * page;
    let end = (offset + len) / page * page;
    if start < end {
        let _ = store.evict_pages(start, end);
    }
}

/// The first element of a chunk and one past its last, as indexes into the
/// global C-order buffer of shape `size` (the chunk lies within them).
fn span(size: &[u64], chunk: &Piece) -> (u64, u64) {
    let strides = c_strides(size);
    let at = |index: &mut dyn Iterator<Item = u64>| -> u64 {
        index.zip(&strides).map(|(i, &s)| i * s as u64).sum()
    };
    let first = at(&mut chunk.offsets.iter().copied());
    let last = at(&mut chunk
        .offsets
        .iter()
        .zip(&chunk.sizes)
        .map(|(o, s)| o + s - 1));
    (first, last + 1)
}

impl Assemble {
    /// The bytes `[lo, hi)` of a C-order chunk whose elements fall in the
    /// global byte range `window`. A box's elements in its own C order land
    /// at increasing global indexes, so those in the window are one run of
    /// its own, found by binary search over its element indexes. `None`
    /// when the sizes overflow (the caller then reads the whole chunk).
    fn covered(&self, p: &Piece, window: (u64, u64)) -> Option<(u64, u64)> {
        let n = num_elements(&p.sizes)?;
        let global = c_strides(&self.size);
        let local = c_strides(&p.sizes);
        // The global index of the chunk's element `l` (its C-order index).
        let at = |l: u64| -> u64 {
            let mut rest = l;
            let mut g = 0u64;
            for d in 0..p.sizes.len() {
                let s = local[d].max(1) as u64;
                let i = rest / s;
                rest %= s;
                g += (p.offsets[d] + i) * global[d].max(0) as u64;
            }
            g
        };
        // The first chunk element whose global index is at least `target`.
        let first_from = |target: u64| -> u64 {
            let (mut lo, mut hi) = (0u64, n);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if at(mid) < target {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        let first = first_from(window.0 / self.elem);
        let end = first_from(window.1.div_ceil(self.elem));
        Some((first.checked_mul(self.elem)?, end.checked_mul(self.elem)?))
    }

    /// Copy one chunk's elements (C order, or its own strides over `bytes`)
    /// that fall in `out`, the bytes from `out_start` of the global C-order
    /// buffer, to their place there. `bytes` holds the chunk's bytes from
    /// its byte `base` on (all of them when `base` is 0).
    fn place(
        &self,
        out: &mut [u8],
        out_start: u64,
        p: &Piece,
        bytes: &[u8],
        base: u64,
    ) -> Result<()> {
        let (size, elem) = (&self.size, self.elem);
        let rank = size.len();
        let sizes = &p.sizes;
        let offsets = &p.offsets;
        let out_end = out_start + out.len() as u64;
        // The chunk's own element strides over its bytes (non-negative: the
        // reader checked every element they reach against its storage, with
        // checked arithmetic, so no offset below overflows either).
        let unsigned =
            |s: Vec<i64>| -> Vec<u64> { s.into_iter().map(|x| x.max(0) as u64).collect() };
        let src_strides = unsigned(match &p.strides {
            Some(s) => s.clone(),
            None => c_strides(sizes),
        });
        let dst_strides = unsigned(c_strides(size));
        // Copy `n` bytes from byte `src` of the chunk to byte `dst` of the
        // global buffer, the part of them inside the window.
        let mut copy = |src: u64, dst: u64, n: u64| -> Result<()> {
            let (a, b) = (dst.max(out_start), (dst + n).min(out_end));
            if a >= b {
                return Ok(());
            }
            let (from, to) = (src + (a - dst), src + (b - dst));
            let from = from
                .checked_sub(base)
                .zip(to.checked_sub(base))
                .and_then(|(f, t)| bytes.get(f as usize..t as usize));
            let from = from.ok_or_else(|| {
                Error::decode(
                    self.ctx.clone(),
                    self.rule,
                    "a chunk's bytes are shorter than its shape needs",
                )
            })?;
            out[(a - out_start) as usize..(b - out_start) as usize].copy_from_slice(from);
            Ok(())
        };
        // The last dimension is copied as one run when the chunk's elements
        // are adjacent along it.
        let (inner, inner_run) = match rank {
            0 => (1u64, true),
            _ => (sizes[rank - 1], src_strides[rank - 1] == 1),
        };
        let outer_dims = rank.saturating_sub(1);
        let mut index = vec![0u64; outer_dims];
        loop {
            let mut src = 0u64;
            let mut dst = 0u64;
            for d in 0..outer_dims {
                src += index[d] * src_strides[d];
                dst += (offsets[d] + index[d]) * dst_strides[d];
            }
            if rank > 0 {
                dst += offsets[rank - 1];
            }
            if inner_run {
                copy(src * elem, dst * elem, inner * elem)?;
            } else {
                let step = src_strides[rank - 1];
                for k in 0..inner {
                    copy((src + k * step) * elem, (dst + k) * elem, elem)?;
                }
            }
            // Odometer over the outer dimensions.
            let mut d = outer_dims;
            loop {
                if d == 0 {
                    return Ok(());
                }
                d -= 1;
                index[d] += 1;
                if index[d] < sizes[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    /// A 6 x 10 tensor of u16 (element i holds i) split into boxes at
    /// (`row`, `col`), each box's elements stored in its own C order, one
    /// box after another in one store.
    fn tensor(row: u64, col: u64) -> Assemble {
        let (rows, cols) = (6u64, 10u64);
        let mut stored = Vec::new();
        let mut boxes = Vec::new();
        for (r0, r1) in [(0, row), (row, rows)] {
            for (c0, c1) in [(0, col), (col, cols)] {
                let at = stored.len() as u64;
                for r in r0..r1 {
                    for c in c0..c1 {
                        stored.extend_from_slice(&((r * cols + c) as u16).to_le_bytes());
                    }
                }
                boxes.push((vec![r0, c0], vec![r1 - r0, c1 - c0], at));
            }
        }
        let len = stored.len() as u64;
        let store = Arc::new(Store::from_bytes("mem", stored));
        let pieces = boxes
            .into_iter()
            .map(|(offsets, sizes, at)| Piece {
                payload: Payload::Stored {
                    store: Arc::clone(&store),
                    offset: at,
                    len: sizes.iter().product::<u64>() * 2,
                },
                offsets,
                sizes,
                strides: None,
            })
            .collect();
        assert_eq!(len, rows * cols * 2);
        Assemble {
            ctx: Context::default(),
            size: vec![rows, cols],
            elem: 2,
            pieces,
            rule: Rule::DECODED_LENGTH,
            describe: "test chunks",
        }
    }

    #[test]
    fn every_range_reads_what_the_whole_tensor_holds_there() {
        let limits = Limits::default();
        // Row splits (each box one run of the global buffer), column splits
        // (each box a run per row), both, and empty boxes.
        for (row, col) in [(3, 10), (6, 4), (2, 7), (0, 5), (6, 10)] {
            let t = tensor(row, col);
            let whole = t.decode(&limits).unwrap();
            let want: Vec<u8> = (0..60u16).flat_map(|i| i.to_le_bytes()).collect();
            assert_eq!(whole, want, "split at {row}, {col}");
            for start in 0..120u64 {
                for len in [1u64, 2, 3, 7, 20, 41, 120 - start] {
                    let len = len.min(120 - start);
                    let got = t.decode_range(start, len, &limits).unwrap();
                    let want = &whole[start as usize..(start + len) as usize];
                    assert_eq!(got, want, "split {row},{col}: {start}+{len}");
                }
            }
        }
    }

    #[test]
    fn a_range_covers_only_the_bytes_of_a_chunk_it_needs() {
        // Rows 0..3 of a 6 x 10 tensor split at column 4: the left box is
        // 6 x 4. Global elements [12, 25) are rows 1 and 2 from column 2:
        // the left box's elements at (1, 2), (1, 3), (2, 0) .. (2, 3).
        let t = tensor(6, 4);
        let left = &t.pieces[0];
        let (lo, hi) = t.covered(left, (24, 50)).unwrap();
        assert_eq!((lo / 2, hi / 2), (6, 12));
        // A window past the box's last element covers none of it.
        let (lo, hi) = t.covered(left, (118, 120)).unwrap();
        assert_eq!(lo, hi);
    }
}
