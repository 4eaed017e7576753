//! Version-1 B-trees (`TREE`): the index of old-style groups (type 0,
//! leaves point at symbol table nodes) and of chunked datasets with layout
//! version 3 (type 1, leaves point at chunks). Walked iteratively with a
//! visited set, levels that must strictly descend, and the work budget.

use std::collections::HashSet;

use zt_core::error::Result;

use super::reader::Reader;

/// One chunk found in a chunk B-tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkEntry {
    /// Element offsets of the chunk's first element, one per dimension.
    pub offsets: Vec<u64>,
    /// Bytes stored (after filters).
    pub size: u64,
    /// Filters skipped for this chunk (bit i: filter i).
    pub mask: u32,
    /// Relative address of the stored chunk.
    pub addr: u64,
}

/// Visit every leaf entry of the tree at `root`: `key` is the key before
/// the child, `child` the child's address.
fn walk(
    r: &Reader<'_>,
    root: u64,
    node_type: u8,
    key_size: usize,
    mut leaf: impl FnMut(&[u8], u64) -> Result<()>,
) -> Result<()> {
    let so = r.geo.offset_size;
    let mut seen = HashSet::new();
    let mut stack = vec![(root, None::<u8>)];
    while let Some((addr, expect_level)) = stack.pop() {
        r.tick(1)?;
        let head_len = 8 + 2 * so as u64;
        let head = r.block(addr, head_len, "v1 B-tree node")?;
        let mut c = r.cursor(&head, addr, "v1 B-tree node");
        if !seen.insert(addr) {
            return Err(c.bad("nodes form a cycle"));
        }
        c.sig(b"TREE")?;
        let ty = c.u8()?;
        if ty != node_type {
            return Err(c.mismatch("node type", ty, node_type));
        }
        let level = c.u8()?;
        if expect_level.is_some_and(|l| l != level) {
            return Err(c.bad(format!(
                "child at level {level}, expected {}",
                expect_level.unwrap_or(0)
            )));
        }
        let n = usize::from(c.u16()?);
        r.tick(n as u64)?;
        let body_len = (n as u64 + 1) * key_size as u64 + n as u64 * so as u64;
        let body_at = addr + head_len;
        let body = r.block(body_at, body_len, "v1 B-tree node")?;
        let mut c = r.cursor(&body, body_at, "v1 B-tree node");
        let mut children = Vec::with_capacity(n);
        for _ in 0..n {
            let key = c.take(key_size)?;
            let child = c.addr()?.ok_or_else(|| c.bad("undefined child address"))?;
            if level == 0 {
                leaf(key, child)?;
            } else {
                children.push(child);
            }
        }
        if level > 0 {
            stack.extend(children.into_iter().rev().map(|ch| (ch, Some(level - 1))));
        }
    }
    Ok(())
}

/// Addresses of the symbol table nodes of an old-style group.
pub fn group_nodes(r: &Reader<'_>, root: u64) -> Result<Vec<u64>> {
    let mut out = Vec::new();
    walk(r, root, 0, r.geo.length_size, |_, child| {
        out.push(child);
        Ok(())
    })?;
    Ok(out)
}

/// Every chunk of a chunked dataset of rank `rank`.
pub fn chunks(r: &Reader<'_>, root: u64, rank: usize) -> Result<Vec<ChunkEntry>> {
    let key_size = 8 + 8 * (rank + 1);
    let mut out = Vec::new();
    walk(r, root, 1, key_size, |key, addr| {
        let mut c = r.cursor(key, 0, "chunk B-tree key");
        let size = u64::from(c.u32()?);
        let mask = c.u32()?;
        let offsets = (0..rank).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
        out.push(ChunkEntry {
            offsets,
            size,
            mask,
            addr,
        });
        Ok(())
    })?;
    Ok(out)
}
