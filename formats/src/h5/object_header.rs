//! Object headers, version 1 (8-byte aligned messages after a 16-byte
//! prefix) and version 2 (`OHDR`, checksummed), with their continuation
//! blocks (`OCHK` in version 2). Every message is copied out with its
//! type, flags and absolute offset; the walk is bounded by the work budget
//! and a continuation chain that loops is an error.

use std::collections::HashSet;

use zt_core::error::Result;

use super::reader::{Cursor, Reader};

/// Message type: continuation (another block of messages).
pub const CONTINUATION: u16 = 0x0010;

/// One header message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Message type (`0x0001` dataspace, `0x0003` datatype, ...).
    pub kind: u16,
    /// Message flags (bit 1: shared).
    pub flags: u8,
    /// The message body.
    pub data: Vec<u8>,
    /// Absolute file offset of the body, for error context.
    pub at: u64,
}

impl Message {
    /// True if the body is a reference to a message stored elsewhere.
    pub fn is_shared(&self) -> bool {
        self.flags & 0x02 != 0
    }
}

/// The messages of the object header at relative address `addr`, in file
/// order, continuation blocks followed (NIL and continuation messages are
/// dropped).
pub fn read(r: &Reader<'_>, addr: u64) -> Result<Vec<Message>> {
    r.spend_bytes(addr, 16)?;
    let head = r.block_upto(addr, 16, "object header")?;
    let mut out = Vec::new();
    let mut pending = Vec::new();
    if head.starts_with(b"OHDR") {
        let creation_order = read_v2_first(r, addr, &mut out, &mut pending)?;
        follow(r, addr, pending, &mut out, |r, at, len, out, pending| {
            read_v2_block(r, at, len, creation_order, out, pending)
        })?;
    } else {
        read_v1_first(r, addr, &mut out, &mut pending)?;
        follow(r, addr, pending, &mut out, |r, at, len, out, pending| {
            r.spend_bytes(at, len)?;
            let buf = r.block(at, len, "object header continuation")?;
            let c = r.cursor(&buf, at, "object header continuation");
            v1_messages(r, c, out, pending)
        })?;
    }
    Ok(out)
}

type Block = (u64, u64);

/// Follow continuation blocks breadth-first; a block seen twice is a cycle.
fn follow(
    r: &Reader<'_>,
    first: u64,
    mut pending: Vec<Block>,
    out: &mut Vec<Message>,
    read_block: impl Fn(&Reader<'_>, u64, u64, &mut Vec<Message>, &mut Vec<Block>) -> Result<()>,
) -> Result<()> {
    let mut seen = HashSet::from([first]);
    while let Some((at, len)) = pending.pop() {
        r.tick(1)?;
        if !seen.insert(at) {
            let abs = r.abs(at)?;
            let c = Cursor::new(&[], abs, r.geo, "object header continuation");
            return Err(c.bad("continuation blocks form a cycle"));
        }
        let mut next = Vec::new();
        read_block(r, at, len, out, &mut next)?;
        // Keep file order: later blocks are visited after this one's.
        next.reverse();
        pending.extend(next);
    }
    Ok(())
}

fn read_v1_first(
    r: &Reader<'_>,
    addr: u64,
    out: &mut Vec<Message>,
    pending: &mut Vec<Block>,
) -> Result<()> {
    r.spend_bytes(addr, 16)?;
    let prefix = r.block(addr, 16, "object header")?;
    let mut c = r.cursor(&prefix, addr, "object header");
    let version = c.u8()?;
    if version != 1 {
        return Err(c.bad(format!("unknown object header version {version}")));
    }
    c.skip(3)?; // reserved, message count
    c.skip(4)?; // reference count
    let size = c.u32()?;
    let start = addr
        .checked_add(16)
        .ok_or_else(|| c.bad("address overflow"))?;
    r.spend_bytes(start, u64::from(size))?;
    let buf = r.block(start, u64::from(size), "object header")?;
    let c = r.cursor(&buf, start, "object header");
    v1_messages(r, c, out, pending)?;
    pending.reverse();
    Ok(())
}

/// Version-1 messages: type u16, size u16, flags u8, 3 reserved, body.
fn v1_messages(
    r: &Reader<'_>,
    mut c: Cursor<'_>,
    out: &mut Vec<Message>,
    pending: &mut Vec<Block>,
) -> Result<()> {
    while c.remaining() >= 8 {
        r.tick(1)?;
        let kind = c.u16()?;
        let size = c.u16()?;
        let flags = c.u8()?;
        c.skip(3)?;
        let at = c.offset();
        let data = c.take(usize::from(size))?;
        push(r, kind, flags, data, at, out, pending)?;
    }
    Ok(())
}

fn push(
    r: &Reader<'_>,
    kind: u16,
    flags: u8,
    data: &[u8],
    at: u64,
    out: &mut Vec<Message>,
    pending: &mut Vec<Block>,
) -> Result<()> {
    match kind {
        0 => {}
        CONTINUATION => {
            let mut c = Cursor::new(data, at, r.geo, "continuation message");
            let addr = c.addr()?.ok_or_else(|| c.bad("undefined address"))?;
            let len = c.length()?;
            pending.push((addr, len));
        }
        _ => out.push(Message {
            kind,
            flags,
            data: data.to_vec(),
            at,
        }),
    }
    Ok(())
}

/// Parse the `OHDR` prefix and first chunk; returns whether messages
/// carry a creation-order field.
fn read_v2_first(
    r: &Reader<'_>,
    addr: u64,
    out: &mut Vec<Message>,
    pending: &mut Vec<Block>,
) -> Result<bool> {
    // Prefix: signature, version, flags, up to 16 bytes of times, 4 of
    // attribute phase change values, up to 8 of chunk size.
    r.spend_bytes(addr, 4 + 2 + 16 + 4 + 8)?;
    let prefix = r.block_upto(addr, 4 + 2 + 16 + 4 + 8, "object header")?;
    let mut c = r.cursor(&prefix, addr, "object header");
    c.sig(b"OHDR")?;
    let version = c.u8()?;
    if version != 2 {
        return Err(c.bad(format!("unknown object header version {version}")));
    }
    let flags = c.u8()?;
    if flags & 0x20 != 0 {
        c.skip(16)?;
    }
    if flags & 0x10 != 0 {
        c.skip(4)?;
    }
    let size = c.uint(1 << (flags & 3))?;
    let prefix_len = c.pos() as u64;
    let total = prefix_len
        .checked_add(size)
        .and_then(|n| n.checked_add(4))
        .ok_or_else(|| c.bad("chunk size overflows"))?;
    r.spend_bytes(addr, total)?;
    let buf = r.block(addr, total, "object header")?;
    let mut c = r.cursor(&buf, addr, "object header");
    c.seek(buf.len() - 4)?;
    c.checksum(0)?;
    let body = &buf[prefix_len as usize..buf.len() - 4];
    let creation_order = flags & 0x04 != 0;
    let c = Cursor::new(body, r.abs(addr)? + prefix_len, r.geo, "object header");
    v2_messages(r, c, creation_order, out, pending)?;
    pending.reverse();
    Ok(creation_order)
}

fn read_v2_block(
    r: &Reader<'_>,
    at: u64,
    len: u64,
    creation_order: bool,
    out: &mut Vec<Message>,
    pending: &mut Vec<Block>,
) -> Result<()> {
    r.spend_bytes(at, len)?;
    let buf = r.block(at, len, "object header continuation")?;
    let mut c = r.cursor(&buf, at, "object header continuation");
    c.sig(b"OCHK")?;
    if buf.len() < 8 {
        return Err(c.bad("block shorter than its signature and checksum"));
    }
    c.seek(buf.len() - 4)?;
    c.checksum(0)?;
    let body = &buf[4..buf.len() - 4];
    let c = Cursor::new(body, r.abs(at)? + 4, r.geo, "object header continuation");
    v2_messages(r, c, creation_order, out, pending)
}

/// Version-2 messages: type u8, size u16, flags u8, optional creation
/// order u16, body. A tail too short for a message header is a gap.
fn v2_messages(
    r: &Reader<'_>,
    mut c: Cursor<'_>,
    creation_order: bool,
    out: &mut Vec<Message>,
    pending: &mut Vec<Block>,
) -> Result<()> {
    let header = if creation_order { 6 } else { 4 };
    while c.remaining() >= header {
        r.tick(1)?;
        let kind = u16::from(c.u8()?);
        let size = c.u16()?;
        let flags = c.u8()?;
        if creation_order {
            c.skip(2)?;
        }
        let at = c.offset();
        let data = c.take(usize::from(size))?;
        push(r, kind, flags, data, at, out, pending)?;
    }
    Ok(())
}
