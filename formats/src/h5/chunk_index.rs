//! Chunk indexes: where each chunk of a chunked dataset is stored. Layout
//! version 3 uses a v1 B-tree; layout version 4 adds single chunk,
//! implicit, fixed array (`FAHD`/`FADB`), extensible array
//! (`EAHD`/`EAIB`/`EASB`/`EADB`) and v2 B-tree indexes. Each is read in
//! full into a list of [`ChunkEntry`], within the work budget, when a
//! tensor is read (never when the file is opened).

use zt_core::dtype::num_elements;
use zt_core::error::{Error, Result};
use zt_core::limits::Limits;
use zt_core::Rule;

use super::btree1::{self, ChunkEntry};
use super::btree2;
use super::messages::ChunkIndex;
use super::reader::{Cursor, Reader};

/// What locating chunks needs to know about the dataset.
#[derive(Debug, Clone)]
pub struct Grid {
    /// Current dimensions.
    pub dims: Vec<u64>,
    /// Maximum dimensions (`u64::MAX` for unlimited); equal to `dims`
    /// when the dataspace stores none.
    pub max: Vec<u64>,
    /// Chunk dimensions.
    pub chunk: Vec<u64>,
    /// Bytes of one unfiltered chunk.
    pub chunk_bytes: u64,
    /// True if the dataset has a filter pipeline.
    pub filtered: bool,
}

impl Grid {
    /// Chunks along each dimension for extents `dims` (`None` if unlimited).
    fn counts(&self, dims: &[u64]) -> Vec<Option<u64>> {
        dims.iter()
            .zip(&self.chunk)
            .map(|(&d, &c)| (d != u64::MAX).then(|| d.div_ceil(c)))
            .collect()
    }

    /// Element offsets of the chunk at grid coordinates `scaled`.
    fn offsets(&self, scaled: &[u64]) -> Option<Vec<u64>> {
        scaled
            .iter()
            .zip(&self.chunk)
            .map(|(&s, &c)| s.checked_mul(c))
            .collect()
    }

    /// True if `offsets` is a multiple of the chunk dimensions.
    fn aligned(&self, offsets: &[u64]) -> bool {
        offsets.iter().zip(&self.chunk).all(|(o, c)| o % c == 0)
    }

    /// True if a chunk starting at `offsets` overlaps the current extent.
    fn inside(&self, offsets: &[u64]) -> bool {
        offsets.len() == self.dims.len() && offsets.iter().zip(&self.dims).all(|(o, d)| o < d)
    }
}

/// Grid coordinates of linear index `i` over `counts` (row-major); the
/// first count may be unbounded.
fn unravel(mut i: u64, counts: &[Option<u64>]) -> Vec<u64> {
    let mut out = vec![0u64; counts.len()];
    for k in (1..counts.len()).rev() {
        let n = counts[k].unwrap_or(u64::MAX).max(1);
        out[k] = i % n;
        i /= n;
    }
    // The first dimension takes the rest (it may be unlimited).
    if let Some(first) = out.first_mut() {
        *first = i;
    }
    out
}

/// Every stored chunk of the dataset, as element offsets and addresses.
pub fn entries(
    r: &Reader<'_>,
    index: &ChunkIndex,
    addr: u64,
    grid: &Grid,
) -> Result<Vec<ChunkEntry>> {
    let rank = grid.dims.len();
    let mut out = match index {
        ChunkIndex::BTreeV1 => btree1::chunks(r, addr, rank)?,
        ChunkIndex::Single { filtered } => {
            let (size, mask) = filtered.unwrap_or((grid.chunk_bytes, 0));
            vec![ChunkEntry {
                offsets: vec![0; rank],
                size,
                mask,
                addr,
            }]
        }
        ChunkIndex::Implicit => implicit(r, addr, grid)?,
        ChunkIndex::FixedArray => {
            let counts = grid.counts(&grid.max);
            fixed_array(r, addr, grid)?
                .into_iter()
                .filter_map(|(i, e)| Some((grid.offsets(&unravel(i, &counts))?, e)))
                .map(|(offsets, (size, mask, addr))| ChunkEntry {
                    offsets,
                    size,
                    mask,
                    addr,
                })
                .collect()
        }
        ChunkIndex::ExtensibleArray => {
            // The unlimited dimension is moved first ("swizzled").
            let unlim = grid.max.iter().position(|&m| m == u64::MAX).unwrap_or(0);
            let mut counts = grid.counts(&grid.max);
            let u = counts.remove(unlim);
            counts.insert(0, u);
            counts[0] = None;
            extensible_array(r, addr, grid)?
                .into_iter()
                .filter_map(|(i, e)| {
                    let mut scaled = unravel(i, &counts);
                    let first = scaled.remove(0);
                    scaled.insert(unlim, first);
                    Some((grid.offsets(&scaled)?, e))
                })
                .map(|(offsets, (size, mask, addr))| ChunkEntry {
                    offsets,
                    size,
                    mask,
                    addr,
                })
                .collect()
        }
        ChunkIndex::BTreeV2 => btree2_chunks(r, addr, grid)?,
    };
    out.retain(|e| grid.inside(&e.offsets));
    // Each grid position is decoded once: a hostile index that lists a
    // chunk many times (or at positions between grid points) cannot
    // multiply the work beyond the dataset's own size.
    if let Some(e) = out.iter().find(|e| !grid.aligned(&e.offsets)) {
        let c = r.cursor(&[], e.addr, "chunk index");
        return Err(c.bad(format!("chunk at {:?} is not on the chunk grid", e.offsets)));
    }
    out.sort_unstable_by(|a, b| a.offsets.cmp(&b.offsets));
    out.dedup_by(|a, b| a.offsets == b.offsets);
    Ok(out)
}

fn implicit(r: &Reader<'_>, addr: u64, grid: &Grid) -> Result<Vec<ChunkEntry>> {
    let here = grid.counts(&grid.dims);
    let max = grid.counts(&grid.max);
    let n =
        num_elements(&here.iter().map(|c| c.unwrap_or(0)).collect::<Vec<_>>()).unwrap_or(u64::MAX);
    r.tick(n)?;
    let mut out = Vec::new();
    for i in 0..n {
        let scaled = unravel(i, &here);
        // Chunks are laid out over the maximum grid.
        let mut linear = 0u64;
        for (k, &s) in scaled.iter().enumerate() {
            let m = max[k].unwrap_or(u64::MAX);
            linear = linear.saturating_mul(m).saturating_add(s);
        }
        let at = linear
            .checked_mul(grid.chunk_bytes)
            .and_then(|o| o.checked_add(addr))
            .ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: Default::default(),
                what: "implicit chunk address",
            })?;
        if let Some(offsets) = grid.offsets(&scaled) {
            out.push(ChunkEntry {
                offsets,
                size: grid.chunk_bytes,
                mask: 0,
                addr: at,
            });
        }
    }
    Ok(out)
}

type Element = (u64, u32, u64);

/// Decode one index element: an address, plus stored size and filter
/// mask when the dataset is filtered. `None` for a chunk never written.
fn element(c: &mut Cursor<'_>, grid: &Grid, size_len: usize) -> Result<Option<Element>> {
    let addr = c.addr()?;
    let (size, mask) = if grid.filtered {
        (c.uint(size_len)?, c.u32()?)
    } else {
        (grid.chunk_bytes, 0)
    };
    Ok(addr.map(|a| (size, mask, a)))
}

/// Bytes of the stored-size field of a filtered element of `elem_size` bytes.
fn size_len(c: &Cursor<'_>, grid: &Grid, elem_size: usize, so: usize) -> Result<usize> {
    if !grid.filtered {
        if elem_size != so {
            return Err(c.bad(format!("element size {elem_size}, expected {so}")));
        }
        return Ok(0);
    }
    match elem_size.checked_sub(so + 4) {
        Some(n) if (1..=8).contains(&n) => Ok(n),
        _ => Err(c.bad(format!("filtered element size {elem_size}"))),
    }
}

/// The bits of a page-initialised bitmap (most significant bit first).
fn bit(bitmap: &[u8], i: u64) -> bool {
    bitmap
        .get((i / 8) as usize)
        .is_some_and(|b| b & (0x80 >> (i % 8)) != 0)
}

fn fixed_array(r: &Reader<'_>, addr: u64, grid: &Grid) -> Result<Vec<(u64, Element)>> {
    let so = r.geo.offset_size;
    let head = r.block(
        addr,
        8 + r.geo.length_size as u64 + so as u64 + 4,
        "fixed array header",
    )?;
    let mut c = r.cursor(&head, addr, "fixed array header");
    c.sig(b"FAHD")?;
    c.skip(2)?; // version, client id
    let elem_size = usize::from(c.u8()?);
    let page_bits = c.u8()?;
    let n = c.length()?;
    let block = c.addr()?;
    c.checksum(0)?;
    let size_len = size_len(&c, grid, elem_size, so)?;
    Limits::check(&c.ctx(), "entries", n, r.limits.entries)?;
    r.tick(n)?;
    let Some(block) = block else {
        return Ok(Vec::new());
    };
    if page_bits >= 64 {
        return Err(c.bad(format!("page bits {page_bits}")));
    }
    let page = 1u64 << page_bits;
    let esz = elem_size as u64;
    let prefix = 4 + 1 + 1 + so as u64;
    let mut out = Vec::new();
    if n <= page {
        let len = prefix + n * esz + 4;
        let buf = r.block(block, len, "fixed array data block")?;
        let mut c = r.cursor(&buf, block, "fixed array data block");
        c.sig(b"FADB")?;
        c.skip(prefix as usize - 4)?;
        for i in 0..n {
            if let Some(e) = element(&mut c, grid, size_len)? {
                out.push((i, e));
            }
        }
        c.checksum(0)?;
        return Ok(out);
    }
    let pages = n.div_ceil(page);
    let bitmap_len = pages.div_ceil(8);
    let head_len = prefix + bitmap_len + 4;
    let buf = r.block(block, head_len, "fixed array data block")?;
    let mut c = r.cursor(&buf, block, "fixed array data block");
    c.sig(b"FADB")?;
    c.skip(prefix as usize - 4)?;
    let bitmap = c.take(bitmap_len as usize)?.to_vec();
    c.checksum(0)?;
    let mut at = block + head_len;
    for p in 0..pages {
        let count = page.min(n - p * page);
        let len = count * esz + 4;
        if bit(&bitmap, p) {
            let buf = r.block(at, len, "fixed array page")?;
            let mut c = r.cursor(&buf, at, "fixed array page");
            for k in 0..count {
                if let Some(e) = element(&mut c, grid, size_len)? {
                    out.push((p * page + k, e));
                }
            }
            c.checksum(0)?;
        }
        at = at
            .checked_add(len)
            .ok_or_else(|| c.bad("page address overflows"))?;
    }
    Ok(out)
}

struct SuperInfo {
    ndblks: u64,
    dblk_nelmts: u64,
    start_idx: u64,
    start_dblk: u64,
}

fn extensible_array(r: &Reader<'_>, addr: u64, grid: &Grid) -> Result<Vec<(u64, Element)>> {
    let (so, sl) = (r.geo.offset_size, r.geo.length_size);
    let head = r.block(
        addr,
        12 + 6 * sl as u64 + so as u64 + 4,
        "extensible array header",
    )?;
    let mut c = r.cursor(&head, addr, "extensible array header");
    c.sig(b"EAHD")?;
    c.skip(2)?; // version, client id
    let elem_size = usize::from(c.u8()?);
    let max_bits = u32::from(c.u8()?);
    let iblock_elmts = u64::from(c.u8()?);
    let dblk_min = u64::from(c.u8()?);
    let sblk_min_ptrs = u64::from(c.u8()?);
    let page_bits = u32::from(c.u8()?);
    c.skip(4 * sl)?; // super/data block counts and sizes
    let max_index = c.length()?;
    c.length()?; // elements realized
    let iblock = c.addr()?;
    c.checksum(0)?;
    let size_len = size_len(&c, grid, elem_size, so)?;
    Limits::check(&c.ctx(), "entries", max_index, r.limits.entries)?;
    r.tick(max_index)?;
    let pow2 = |v: u64| v.is_power_of_two();
    if !(1..=64).contains(&max_bits) || !pow2(dblk_min) || !pow2(sblk_min_ptrs) || page_bits >= 64 {
        return Err(c.bad("block parameters are not powers of two"));
    }
    let Some(iblock) = iblock else {
        return Ok(Vec::new());
    };
    let nsblks = 1 + u64::from(max_bits).saturating_sub(u64::from(dblk_min.trailing_zeros()));
    let mut info = Vec::new();
    let (mut start_idx, mut start_dblk) = (0u64, 0u64);
    for u in 0..nsblks {
        let ndblks = 1u64 << (u / 2).min(63);
        let dblk_nelmts = (1u64 << u.div_ceil(2).min(63)).saturating_mul(dblk_min);
        info.push(SuperInfo {
            ndblks,
            dblk_nelmts,
            start_idx,
            start_dblk,
        });
        start_idx = start_idx.saturating_add(ndblks.saturating_mul(dblk_nelmts));
        start_dblk = start_dblk.saturating_add(ndblks);
    }
    let iblock_sblks = (2 * sblk_min_ptrs.trailing_zeros() as u64).min(nsblks);
    let ndblk_addrs = 2 * (sblk_min_ptrs - 1);
    let nsblk_addrs = nsblks - iblock_sblks;
    let esz = elem_size as u64;
    let arr_off = max_bits.div_ceil(8) as usize;

    let len = 4 + 2 + so as u64 + iblock_elmts * esz + (ndblk_addrs + nsblk_addrs) * so as u64 + 4;
    let buf = r.block(iblock, len, "extensible array index block")?;
    let mut c = r.cursor(&buf, iblock, "extensible array index block");
    c.sig(b"EAIB")?;
    c.skip(2 + so)?;
    let mut out = Vec::new();
    for i in 0..iblock_elmts {
        if let Some(e) = element(&mut c, grid, size_len)? {
            if i < max_index {
                out.push((i, e));
            }
        }
    }
    let dblocks = (0..ndblk_addrs)
        .map(|_| c.addr())
        .collect::<Result<Vec<_>>>()?;
    let sblocks = (0..nsblk_addrs)
        .map(|_| c.addr())
        .collect::<Result<Vec<_>>>()?;
    c.checksum(0)?;

    let read_dblock = |at: u64,
                       first: u64,
                       nelmts: u64,
                       out: &mut Vec<(u64, Element)>,
                       pages: Option<(&[u8], u64)>|
     -> Result<()> {
        r.tick(1)?;
        let page = 1u64 << page_bits;
        let prefix = 4 + 2 + so as u64 + arr_off as u64;
        let Some((bitmap, base)) = pages.filter(|_| nelmts > page) else {
            let len = nelmts.saturating_mul(esz).saturating_add(prefix + 4);
            let buf = r.block(at, len, "extensible array data block")?;
            let mut c = r.cursor(&buf, at, "extensible array data block");
            c.sig(b"EADB")?;
            c.skip(prefix as usize - 4)?;
            for k in 0..nelmts {
                if let Some(e) = element(&mut c, grid, size_len)? {
                    if first.saturating_add(k) < max_index {
                        out.push((first.saturating_add(k), e));
                    }
                }
            }
            return c.checksum(0);
        };
        let mut page_at = at.saturating_add(prefix + 4);
        for p in 0..nelmts / page {
            let len = page.saturating_mul(esz).saturating_add(4);
            if bit(bitmap, base.saturating_add(p)) {
                let buf = r.block(page_at, len, "extensible array page")?;
                let mut c = r.cursor(&buf, page_at, "extensible array page");
                for k in 0..page {
                    if let Some(e) = element(&mut c, grid, size_len)? {
                        let i = first.saturating_add(p * page + k);
                        if i < max_index {
                            out.push((i, e));
                        }
                    }
                }
                c.checksum(0)?;
            }
            page_at = page_at.saturating_add(len);
        }
        Ok(())
    };

    for (u, s) in info.iter().enumerate() {
        let first = iblock_elmts.saturating_add(s.start_idx);
        if first >= max_index {
            break;
        }
        if (u as u64) < iblock_sblks {
            for d in 0..s.ndblks {
                let slot = (s.start_dblk + d) as usize;
                if let Some(Some(at)) = dblocks.get(slot) {
                    let start = first.saturating_add(d.saturating_mul(s.dblk_nelmts));
                    read_dblock(*at, start, s.dblk_nelmts, &mut out, None)?;
                }
            }
            continue;
        }
        let Some(Some(sb)) = sblocks.get(u - iblock_sblks as usize) else {
            continue;
        };
        r.tick(1)?;
        let page = 1u64 << page_bits;
        let paged = s.dblk_nelmts > page;
        let npages = if paged { s.dblk_nelmts / page } else { 0 };
        // The library sizes the bitmap as whole bytes per data block but
        // numbers the bits in one run (data block d, page p: d * npages + p),
        // as files written by HDF5 2.0 show.
        let bitmap_len = s.ndblks.saturating_mul(npages.div_ceil(8));
        let len = (4 + 2 + so as u64 + arr_off as u64 + 4)
            .saturating_add(bitmap_len)
            .saturating_add(s.ndblks.saturating_mul(so as u64));
        let buf = r.block(*sb, len, "extensible array secondary block")?;
        let mut c = r.cursor(&buf, *sb, "extensible array secondary block");
        c.sig(b"EASB")?;
        c.skip(2 + so + arr_off)?;
        let bitmap = c.take(bitmap_len as usize)?.to_vec();
        let addrs = (0..s.ndblks)
            .map(|_| c.addr())
            .collect::<Result<Vec<_>>>()?;
        c.checksum(0)?;
        for (d, at) in addrs.iter().enumerate() {
            let d = d as u64;
            if let Some(at) = at {
                let pages = paged.then(|| (bitmap.as_slice(), d * npages));
                let start = first.saturating_add(d.saturating_mul(s.dblk_nelmts));
                read_dblock(*at, start, s.dblk_nelmts, &mut out, pages)?;
            }
        }
    }
    Ok(out)
}

fn btree2_chunks(r: &Reader<'_>, addr: u64, grid: &Grid) -> Result<Vec<ChunkEntry>> {
    let rank = grid.dims.len();
    let so = r.geo.offset_size;
    let (ty, records) = btree2::records(r, addr, &[10, 11])?;
    let mut out = Vec::with_capacity(records.len());
    for rec in records {
        let mut c = r.cursor(&rec, 0, "chunk B-tree record");
        let Some(at) = c.addr()? else { continue };
        let (size, mask) = if ty == 11 {
            let size_len = rec
                .len()
                .checked_sub(so + 4 + 8 * rank)
                .filter(|n| (1..=8).contains(n))
                .ok_or_else(|| c.bad(format!("record of {} bytes", rec.len())))?;
            (c.uint(size_len)?, c.u32()?)
        } else {
            (grid.chunk_bytes, 0)
        };
        let scaled = (0..rank).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
        if let Some(offsets) = grid.offsets(&scaled) {
            out.push(ChunkEntry {
                offsets,
                size,
                mask,
                addr: at,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unravel_row_major() {
        assert_eq!(unravel(5, &[Some(2), Some(3)]), vec![1, 2]);
        assert_eq!(unravel(7, &[None, Some(3)]), vec![2, 1]);
    }
}
