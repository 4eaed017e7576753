//! The three heaps: local heaps (`HEAP`, names of old-style group
//! members), global heap collections (`GCOL`, variable-length strings) and
//! fractal heaps (`FRHP`, links and attributes of dense groups).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use zt_core::error::Result;

use super::reader::Reader;

/// A local heap's data segment.
pub fn local(r: &Reader<'_>, addr: u64) -> Result<Vec<u8>> {
    let head_len = 8 + 2 * r.geo.length_size as u64 + r.geo.offset_size as u64;
    let head = r.block(addr, head_len, "local heap")?;
    let mut c = r.cursor(&head, addr, "local heap");
    c.sig(b"HEAP")?;
    let version = c.u8()?;
    if version != 0 {
        return Err(c.bad(format!("unknown version {version}")));
    }
    c.skip(3)?;
    let size = c.length()?;
    c.length()?; // free list
    let data = c.addr()?.ok_or_else(|| c.bad("undefined data segment"))?;
    Ok(r.block(data, size, "local heap data")?.into_owned())
}

/// The null-terminated string at `offset` of a local heap.
pub fn local_name(r: &Reader<'_>, heap: &[u8], offset: u64, at: u64) -> Result<String> {
    let c = r.cursor(heap, at, "local heap name");
    let start = usize::try_from(offset)
        .ok()
        .filter(|&s| s < heap.len())
        .ok_or_else(|| c.bad(format!("name offset {offset} outside the heap")))?;
    let rest = &heap[start..];
    let len = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| c.bad("name is not terminated"))?;
    Ok(String::from_utf8_lossy(&rest[..len]).into_owned())
}

/// Global heap collections read so far, each parsed once.
#[derive(Default)]
pub struct GlobalHeaps {
    collections: HashMap<u64, HashMap<u16, Vec<u8>>>,
}

impl GlobalHeaps {
    /// Object `index` of the collection at `addr`.
    pub fn object(&mut self, r: &Reader<'_>, addr: u64, index: u32) -> Result<&[u8]> {
        let objects = match self.collections.entry(addr) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(read_collection(r, addr)?),
        };
        let found = u16::try_from(index).ok().and_then(|i| objects.get(&i));
        match found {
            Some(bytes) => Ok(bytes),
            None => {
                let c = r.cursor(&[], addr, "global heap");
                Err(c.bad(format!("no object {index} in the collection")))
            }
        }
    }
}

fn read_collection(r: &Reader<'_>, addr: u64) -> Result<HashMap<u16, Vec<u8>>> {
    let sl = r.geo.length_size;
    let head = r.block(addr, 8 + sl as u64, "global heap")?;
    let mut c = r.cursor(&head, addr, "global heap");
    c.sig(b"GCOL")?;
    let version = c.u8()?;
    if version != 1 {
        return Err(c.bad(format!("unknown version {version}")));
    }
    c.skip(3)?;
    let size = c.length()?;
    let buf = r.block(addr, size, "global heap")?;
    let mut c = r.cursor(&buf, addr, "global heap");
    c.skip(8 + sl)?;
    let mut out = HashMap::new();
    while c.remaining() >= 8 + sl {
        r.tick(1)?;
        let index = c.u16()?;
        c.skip(6)?; // reference count, reserved
        let len = c.length()?;
        if index == 0 {
            break; // free space runs to the end of the collection
        }
        let len = usize::try_from(len).map_err(|_| c.bad("object size"))?;
        let data = c.take(len)?;
        out.insert(index, data.to_vec());
        let pad = len.div_ceil(8) * 8 - len;
        c.skip(pad.min(c.remaining()))?;
    }
    Ok(out)
}

/// A fractal heap: where each direct block sits in the heap's address
/// space, and how heap IDs are encoded.
#[derive(Debug)]
pub struct FractalHeap {
    /// (heap offset, relative file address, size) of every direct block,
    /// sorted by heap offset.
    blocks: Vec<(u64, u64, u64)>,
    offset_bytes: usize,
    length_bytes: usize,
}

struct Shape {
    width: u64,
    start: u64,
    max_direct_rows: u64,
    offset_bytes: usize,
    checksummed: bool,
}

impl Shape {
    fn row_size(&self, row: u64) -> Option<u64> {
        if row < 2 {
            Some(self.start)
        } else {
            1u64.checked_shl(u32::try_from(row - 1).ok()?)
                .and_then(|f| f.checked_mul(self.start))
        }
    }
}

impl FractalHeap {
    /// Read the heap header at `addr` and locate every direct block.
    pub fn open(r: &Reader<'_>, addr: u64) -> Result<FractalHeap> {
        let (so, sl) = (r.geo.offset_size as u64, r.geo.length_size as u64);
        // Fixed fields, twelve lengths and three addresses.
        let len = 4 + 1 + 2 + 2 + 1 + 4 + 12 * sl + 3 * so + 2 + 2 + 2 + 2;
        let head = r.block(addr, len + 4, "fractal heap header")?;
        let mut c = r.cursor(&head, addr, "fractal heap header");
        c.sig(b"FRHP")?;
        let version = c.u8()?;
        if version != 0 {
            return Err(c.bad(format!("unknown version {version}")));
        }
        c.u16()?; // heap ID length
        let filters_len = c.u16()?;
        let flags = c.u8()?;
        let max_managed = u64::from(c.u32()?);
        c.length()?; // next huge ID
        c.addr()?; // huge object B-tree
        c.length()?; // free space
        c.addr()?; // free space manager
        c.skip(4 * sl as usize)?; // managed space, allocated, iterator offset, object count
        c.skip(4 * sl as usize)?; // huge and tiny sizes and counts
        let width = u64::from(c.u16()?);
        let start = c.length()?;
        let max_direct = c.length()?;
        let max_heap_bits = c.u16()?;
        c.u16()?; // starting rows
        let root = c.addr()?;
        let rows = u64::from(c.u16()?);
        if filters_len != 0 {
            return Err(c.bad("filtered fractal heaps are not read"));
        }
        c.checksum(0)?;
        let pow2 = |v: u64| v != 0 && v.is_power_of_two();
        if !pow2(width)
            || !pow2(start)
            || !pow2(max_direct)
            || max_direct < start
            || max_heap_bits > 64
            || max_heap_bits == 0
        {
            return Err(c.bad(format!(
                "table width {width}, block sizes {start}..{max_direct}, heap bits {max_heap_bits}"
            )));
        }
        let shape = Shape {
            width,
            start,
            max_direct_rows: u64::from(max_direct.trailing_zeros() - start.trailing_zeros()) + 2,
            offset_bytes: usize::from(max_heap_bits).div_ceil(8),
            checksummed: flags & 0x02 != 0,
        };
        let bits = 64 - max_direct.min(max_managed).leading_zeros() as usize;
        let mut heap = FractalHeap {
            blocks: Vec::new(),
            offset_bytes: shape.offset_bytes,
            length_bytes: bits.div_ceil(8),
        };
        match root {
            None => {}
            Some(root) if rows == 0 => heap.blocks.push((0, root, start)),
            Some(root) => {
                let mut seen = HashSet::new();
                heap.indirect(r, &shape, root, rows, 0, &mut seen)?;
            }
        }
        heap.blocks.sort_unstable();
        let _ = shape.checksummed;
        Ok(heap)
    }

    fn indirect(
        &mut self,
        r: &Reader<'_>,
        shape: &Shape,
        addr: u64,
        rows: u64,
        offset: u64,
        seen: &mut HashSet<u64>,
    ) -> Result<()> {
        r.tick(1)?;
        let so = r.geo.offset_size as u64;
        let entries = rows.saturating_mul(shape.width);
        r.tick(entries)?;
        let len = (5 + so + shape.offset_bytes as u64)
            .saturating_add(entries.saturating_mul(so))
            .saturating_add(4);
        let buf = r.block(addr, len, "fractal heap indirect block")?;
        let mut c = r.cursor(&buf, addr, "fractal heap indirect block");
        if !seen.insert(addr) {
            return Err(c.bad("indirect blocks form a cycle"));
        }
        c.sig(b"FHIB")?;
        c.skip(1 + so as usize)?;
        let block_offset = c.uint(shape.offset_bytes)?;
        if block_offset != offset {
            return Err(c.bad(format!("block offset {block_offset}, expected {offset}")));
        }
        let mut at = offset;
        let mut children = Vec::new();
        for i in 0..entries {
            let row = i / shape.width;
            let size = shape
                .row_size(row)
                .ok_or_else(|| c.bad("block size overflows"))?;
            let child = c.addr()?;
            if let Some(child) = child {
                if row < shape.max_direct_rows {
                    self.blocks.push((at, child, size));
                } else {
                    // An indirect child of `size` bytes has enough rows to
                    // span it: log2(size) - log2(start * width) + 1.
                    let span = shape.start.saturating_mul(shape.width).max(1);
                    let child_rows = u64::from(size.trailing_zeros())
                        .saturating_sub(u64::from(span.trailing_zeros()))
                        + 1;
                    children.push((child, child_rows, at));
                }
            }
            at = at
                .checked_add(size)
                .ok_or_else(|| c.bad("heap offset overflows"))?;
        }
        c.checksum(0)?;
        for (child, child_rows, child_offset) in children {
            if child_rows >= rows {
                return Err(c.bad("an indirect child is no smaller than its parent"));
            }
            self.indirect(r, shape, child, child_rows, child_offset, seen)?;
        }
        Ok(())
    }

    /// The object a heap ID names.
    pub fn get(&self, r: &Reader<'_>, id: &[u8]) -> Result<Vec<u8>> {
        let c0 = r.cursor(id, 0, "fractal heap ID");
        let first = *id.first().ok_or_else(|| c0.bad("empty heap ID"))?;
        match (first >> 4) & 3 {
            0 => {
                let mut c = r.cursor(id, 0, "fractal heap ID");
                c.skip(1)?;
                let offset = c.uint(self.offset_bytes)?;
                let len = c.uint(self.length_bytes)?;
                self.managed(r, offset, len)
            }
            2 => {
                // Tiny: the object is inside the ID itself.
                let (len, start) = if id.len() > 18 {
                    let hi = usize::from(first & 0x0f) << 8;
                    (hi + usize::from(*id.get(1).unwrap_or(&0)) + 1, 2)
                } else {
                    (usize::from(first & 0x0f) + 1, 1)
                };
                id.get(start..start + len)
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| c0.bad("tiny object longer than its ID"))
            }
            1 => Err(c0.bad("huge fractal heap objects are not read")),
            t => Err(c0.bad(format!("unknown heap ID type {t}"))),
        }
    }

    fn managed(&self, r: &Reader<'_>, offset: u64, len: u64) -> Result<Vec<u8>> {
        let i = self.blocks.partition_point(|&(o, _, _)| o <= offset);
        let found = i
            .checked_sub(1)
            .map(|i| self.blocks[i])
            .filter(|&(o, _, size)| offset - o < size && len <= size - (offset - o));
        match found {
            Some((o, addr, _)) => {
                let at = addr
                    .checked_add(offset - o)
                    .ok_or_else(|| r.cursor(&[], addr, "fractal heap").bad("address overflows"))?;
                Ok(r.block(at, len, "fractal heap object")?.into_owned())
            }
            None => Err(r.cursor(&[], 0, "fractal heap").bad(format!(
                "object at heap offset {offset} ({len} bytes) is in no block"
            ))),
        }
    }
}
