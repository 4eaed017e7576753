//! Version-2 B-trees (`BTHD`, `BTIN`, `BTLF`): the name indexes of dense
//! groups and attributes (record types 5 and 8) and the chunk index of
//! datasets with two or more unlimited dimensions (types 10 and 11).
//! zt reads every record, so no search order is needed; the declared
//! record count is checked against `Limits::entries` before any node is
//! read, and every node is checksummed and visited at most once.

use std::collections::HashSet;
use zt_core::Rule;

use zt_core::error::{Error, Result};
use zt_core::limits::Limits;

use super::reader::{enc_size, Reader};

/// Per-depth node capacities, as `H5B2__hdr_init` computes them.
struct NodeInfo {
    max_nrec: u64,
    cum_max_nrec: u64,
}

/// Every record of the tree at `addr`, whose record type must be `ty`
/// (one of the accepted types), as raw bytes.
pub fn records(r: &Reader<'_>, addr: u64, types: &[u8]) -> Result<(u8, Vec<Vec<u8>>)> {
    let so = r.geo.offset_size;
    let head = r.block(
        addr,
        4 + 1 + 1 + 4 + 2 + 2 + 1 + 1 + so as u64 + 2 + r.geo.length_size as u64 + 4,
        "v2 B-tree header",
    )?;
    let mut c = r.cursor(&head, addr, "v2 B-tree header");
    c.sig(b"BTHD")?;
    let version = c.u8()?;
    if version != 0 {
        return Err(c.bad(format!("unknown version {version}")));
    }
    let ty = c.u8()?;
    if !types.contains(&ty) {
        return Err(c.mismatch("record type", ty, format_args!("one of {types:?}")));
    }
    let node_size = u64::from(c.u32()?);
    let rec_size = u64::from(c.u16()?);
    let depth = usize::from(c.u16()?);
    c.skip(2)?; // split and merge percents
    let root = c.addr()?;
    let root_nrec = u64::from(c.u16()?);
    let total = c.length()?;
    c.checksum(0)?;
    Limits::check(&c.ctx(), "entries", total, r.limits.entries)?;
    r.tick(total)?;
    let Some(root) = root else {
        return Ok((ty, Vec::new()));
    };
    if depth > r.limits.depth {
        return Err(Error::Limit {
            rule: Rule::LIMIT,
            ctx: c.ctx(),
            limit: "depth",
            value: depth as u64,
            max: r.limits.depth as u64,
        });
    }
    if rec_size == 0 || node_size < 10 + rec_size {
        return Err(c.bad(format!("node size {node_size} and record size {rec_size}")));
    }
    r.limits.check_header(&c.ctx(), node_size)?;
    let info = node_info(node_size, rec_size, depth, so as u64);
    let max_nrec_size = enc_size(info[0].max_nrec);

    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![(root, root_nrec, depth)];
    while let Some((node, nrec, d)) = stack.pop() {
        r.tick(1)?;
        let buf = r.block(node, node_size, "v2 B-tree node")?;
        let mut c = r.cursor(&buf, node, "v2 B-tree node");
        if !seen.insert(node) {
            return Err(c.bad("nodes form a cycle"));
        }
        if nrec > info[d].max_nrec {
            return Err(c.bad(format!(
                "{nrec} records in a node that holds {}",
                info[d].max_nrec
            )));
        }
        c.sig(if d == 0 { b"BTLF" } else { b"BTIN" })?;
        c.skip(1)?; // version
        let node_ty = c.u8()?;
        if node_ty != ty {
            return Err(c.mismatch("record type", node_ty, format_args!("{ty}, the tree's")));
        }
        for _ in 0..nrec {
            out.push(c.take(rec_size as usize)?.to_vec());
        }
        if d > 0 {
            let total_size = if d > 1 {
                enc_size(info[d - 1].cum_max_nrec)
            } else {
                0
            };
            let mut children = Vec::new();
            for _ in 0..=nrec {
                let child = c.addr()?.ok_or_else(|| c.bad("undefined child address"))?;
                let child_nrec = c.uint(max_nrec_size)?;
                c.uint(total_size)?;
                children.push((child, child_nrec, d - 1));
            }
            c.checksum(0)?;
            stack.extend(children.into_iter().rev());
        } else {
            c.checksum(0)?;
        }
        if out.len() as u64 > total {
            return Err(c.bad(format!("more records than the {total} the header declares")));
        }
    }
    Ok((ty, out))
}

fn node_info(node_size: u64, rec_size: u64, depth: usize, so: u64) -> Vec<NodeInfo> {
    let leaf = (node_size - 10) / rec_size;
    let mut info = vec![NodeInfo {
        max_nrec: leaf,
        cum_max_nrec: leaf,
    }];
    let max_nrec_size = enc_size(leaf) as u64;
    for d in 1..=depth {
        let prev = &info[d - 1];
        let ptr = so
            + max_nrec_size
            + if d > 1 {
                enc_size(prev.cum_max_nrec) as u64
            } else {
                0
            };
        let max_nrec = node_size.saturating_sub(10 + ptr) / (rec_size + ptr);
        let cum = max_nrec
            .saturating_add(1)
            .saturating_mul(prev.cum_max_nrec)
            .saturating_add(max_nrec);
        info.push(NodeInfo {
            max_nrec,
            cum_max_nrec: cum,
        });
    }
    info
}
