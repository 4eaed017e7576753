//! Plumbing every HDF5 structure shares: the file's address geometry, a
//! bounds-checked little-endian cursor over one metadata block, the work
//! budget that bounds every walk, and the Jenkins lookup3 checksum that
//! version-2 structures carry.

use crate::h5::rules;
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use zt_core::Rule;

use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

/// How addresses and lengths are encoded in one file, and where its
/// addresses count from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Absolute file offset that relative addresses start from.
    pub base: u64,
    /// Bytes per address (2, 4 or 8).
    pub offset_size: usize,
    /// Bytes per length (2, 4 or 8).
    pub length_size: usize,
}

/// Reading context for one walk over one file: the store, its geometry,
/// the limits, and a budget of structures visited (nodes, messages,
/// records) that no hostile file can exceed.
pub struct Reader<'a> {
    /// The file.
    pub store: &'a Store,
    /// Its geometry.
    pub geo: Geometry,
    /// Bounds to respect.
    pub limits: &'a Limits,
    work: Cell<u64>,
    /// Object-header bytes read so far (see [`Reader::spend_bytes`]).
    read: Cell<u64>,
}

impl<'a> Reader<'a> {
    /// A reader with a fresh work budget of `limits.entries`.
    pub fn new(store: &'a Store, geo: Geometry, limits: &'a Limits) -> Self {
        Reader {
            store,
            geo,
            limits,
            work: Cell::new(0),
            read: Cell::new(0),
        }
    }

    /// Count `len` object-header bytes read. A walk reads each object
    /// header about once, so the budget is twice the file plus
    /// `header_bytes`: overlapping continuation blocks (which share bytes)
    /// cannot make a small file cost gigabytes, and no honest file comes
    /// near it.
    pub fn spend_bytes(&self, at: u64, len: u64) -> Result<()> {
        let used = self.read.get().saturating_add(len);
        self.read.set(used);
        let budget = self
            .store
            .len()
            .saturating_mul(2)
            .saturating_add(self.limits.header_bytes);
        if used > budget {
            return Err(Error::Limit {
                rule: Rule::LIMIT,
                ctx: Context::default().at(at),
                limit: "header_bytes",
                value: used,
                max: budget,
            });
        }
        Ok(())
    }

    /// Spend `n` units of the work budget; fails with [`Error::Limit`] on
    /// `entries` once a file makes us visit more structures than allowed.
    pub fn tick(&self, n: u64) -> Result<()> {
        let used = self.work.get().saturating_add(n);
        self.work.set(used);
        Limits::check(&Context::default(), "entries", used, self.limits.entries)
    }

    /// Absolute file offset of relative address `addr`.
    pub fn abs(&self, addr: u64) -> Result<u64> {
        self.geo
            .base
            .checked_add(addr)
            .ok_or_else(|| Error::Overflow {
                rule: Rule::OVERFLOW,
                ctx: Context::default().at(addr),
                what: "HDF5 address",
            })
    }

    /// The metadata block of `len` bytes at relative address `addr`,
    /// checked against the file and the header limit.
    pub fn block(&self, addr: u64, len: u64, what: &'static str) -> Result<Cow<'a, [u8]>> {
        let at = self.abs(addr)?;
        self.limits.check_header(&Context::default().at(at), len)?;
        self.store.read(at, len).map_err(|e| retag(e, what))
    }

    /// Up to `max` bytes at relative address `addr` (fewer at the end of
    /// the file), for structures whose size is only known once parsed.
    pub fn block_upto(&self, addr: u64, max: u64, what: &'static str) -> Result<Cow<'a, [u8]>> {
        let at = self.abs(addr)?;
        if at >= self.store.len() {
            return Err(Error::Truncated {
                rule: Rule::TRUNCATED,
                ctx: Context::default().at(at),
                what,
                needed: 1,
                available: 0,
            });
        }
        let len = max.min(self.store.len() - at).min(self.limits.header_bytes);
        self.store.read(at, len).map_err(|e| retag(e, what))
    }

    /// A cursor over `buf`, which was read from relative address `addr`.
    pub fn cursor<'b>(&self, buf: &'b [u8], addr: u64, what: &'static str) -> Cursor<'b> {
        Cursor::new(buf, self.geo.base.saturating_add(addr), self.geo, what)
    }
}

/// Name the structure in a store's range error, keep everything else.
fn retag(e: Error, what: &'static str) -> Error {
    match e {
        Error::Truncated {
            ctx,
            needed,
            available,
            ..
        } => Error::Truncated {
            rule: Rule::TRUNCATED,
            ctx,
            what,
            needed,
            available,
        },
        Error::Overflow { ctx, .. } => Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx,
            what,
        },
        other => other,
    }
}

/// A little-endian cursor over one block; every read is bounds-checked and
/// a short block is [`Error::Truncated`] naming the structure.
#[derive(Debug, Clone)]
pub struct Cursor<'b> {
    buf: &'b [u8],
    pos: usize,
    /// Absolute file offset of `buf[0]`, for error context.
    at: u64,
    geo: Geometry,
    what: &'static str,
}

impl<'b> Cursor<'b> {
    /// A cursor at the start of `buf`, which lies at absolute offset `at`.
    pub fn new(buf: &'b [u8], at: u64, geo: Geometry, what: &'static str) -> Self {
        Cursor {
            buf,
            pos: 0,
            at,
            geo,
            what,
        }
    }

    /// The address geometry this cursor decodes with.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Bytes consumed so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The whole underlying block.
    pub fn buf(&self) -> &'b [u8] {
        self.buf
    }

    /// Absolute file offset of the current position.
    pub fn offset(&self) -> u64 {
        self.at.saturating_add(self.pos as u64)
    }

    /// Context pointing at the current position.
    pub fn ctx(&self) -> Context {
        Context::default().at(self.offset())
    }

    /// A malformed-header error at the current position.
    pub fn bad(&self, reason: impl Into<String>) -> Error {
        Error::header(
            self.ctx(),
            rules::STRUCTURE,
            format!("{}: {}", self.what, reason.into()),
        )
    }

    /// A field of this structure that holds `found` where the format has
    /// `expected` (a typed [`Mismatch`](zt_core::error::Mismatch)).
    pub fn mismatch(
        &self,
        what: &str,
        found: impl fmt::Display,
        expected: impl fmt::Display,
    ) -> Error {
        Error::mismatch(
            self.ctx(),
            rules::STRUCTURE,
            format!("{}: {what}", self.what),
            found.to_string(),
            expected.to_string(),
        )
    }

    /// Move to `pos` within the block.
    pub fn seek(&mut self, pos: usize) -> Result<()> {
        if pos > self.buf.len() {
            return Err(self.short(pos - self.pos.min(pos)));
        }
        self.pos = pos;
        Ok(())
    }

    fn short(&self, needed: usize) -> Error {
        Error::Truncated {
            rule: Rule::TRUNCATED,
            ctx: self.ctx(),
            what: self.what,
            needed: needed as u64,
            available: self.remaining() as u64,
        }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'b [u8]> {
        if n > self.remaining() {
            return Err(self.short(n));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    /// Skip `n` bytes.
    pub fn skip(&mut self, n: usize) -> Result<()> {
        self.take(n).map(|_| ())
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> Result<u16> {
        Ok(self.uint(2)? as u16)
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(self.uint(4)? as u32)
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64> {
        self.uint(8)
    }

    /// A little-endian unsigned integer of `n` bytes (0 to 8).
    pub fn uint(&mut self, n: usize) -> Result<u64> {
        if n > 8 {
            return Err(self.bad(format!("{n}-byte integer field")));
        }
        let b = self.take(n)?;
        Ok(b.iter()
            .rev()
            .fold(0u64, |acc, &x| (acc << 8) | u64::from(x)))
    }

    /// An address; `None` for the undefined address (all bits set).
    pub fn addr(&mut self) -> Result<Option<u64>> {
        let n = self.geo.offset_size;
        let v = self.uint(n)?;
        let undefined = if n >= 8 {
            u64::MAX
        } else {
            (1u64 << (8 * n)) - 1
        };
        Ok((v != undefined).then_some(v))
    }

    /// A length field.
    pub fn length(&mut self) -> Result<u64> {
        self.uint(self.geo.length_size)
    }

    /// Check a 4-byte signature.
    pub fn sig(&mut self, sig: &[u8; 4]) -> Result<()> {
        let at = self.ctx();
        let got = self.take(4)?;
        if got != sig {
            return Err(Error::mismatch(
                at,
                rules::STRUCTURE,
                format!("{}: signature", self.what),
                format!("{:?}", String::from_utf8_lossy(got)),
                format!("{:?}", String::from_utf8_lossy(sig)),
            ));
        }
        Ok(())
    }

    /// Check the lookup3 checksum stored in the 4 bytes that follow
    /// `buf[start..self.pos]`, and move past it.
    pub fn checksum(&mut self, start: usize) -> Result<()> {
        let end = self.pos;
        let stored = self.u32()?;
        let actual = lookup3(&self.buf[start..end]);
        if stored != actual {
            return Err(Error::header(
                Context::default().at(self.at.saturating_add(end as u64)),
                rules::STRUCTURE,
                format!(
                    "{}: checksum {actual:#010x} does not match the stored {stored:#010x}",
                    self.what
                ),
            ));
        }
        Ok(())
    }
}

/// Bytes needed to store `v` (at least 1), HDF5's `H5VM_limit_enc_size`.
pub fn enc_size(v: u64) -> usize {
    (63 - v.max(1).leading_zeros() as usize) / 8 + 1
}

/// Bob Jenkins' lookup3 `hashlittle` with an initial value of 0, the
/// checksum of every version-2 HDF5 metadata structure.
pub fn lookup3(data: &[u8]) -> u32 {
    fn rot(x: u32, k: u32) -> u32 {
        x.rotate_left(k)
    }
    let len = data.len();
    let init = 0xdead_beefu32.wrapping_add(len as u32);
    let (mut a, mut b, mut c) = (init, init, init);
    let word = |k: &[u8]| -> u32 {
        k.iter().enumerate().fold(0u32, |acc, (i, &x)| {
            acc.wrapping_add(u32::from(x) << (8 * i))
        })
    };
    let mut k = data;
    while k.len() > 12 {
        a = a.wrapping_add(word(&k[0..4]));
        b = b.wrapping_add(word(&k[4..8]));
        c = c.wrapping_add(word(&k[8..12]));
        a = a.wrapping_sub(c);
        a ^= rot(c, 4);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= rot(a, 6);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= rot(b, 8);
        b = b.wrapping_add(a);
        a = a.wrapping_sub(c);
        a ^= rot(c, 16);
        c = c.wrapping_add(b);
        b = b.wrapping_sub(a);
        b ^= rot(a, 19);
        a = a.wrapping_add(c);
        c = c.wrapping_sub(b);
        c ^= rot(b, 4);
        b = b.wrapping_add(a);
        k = &k[12..];
    }
    if k.is_empty() {
        return c;
    }
    a = a.wrapping_add(word(&k[..k.len().min(4)]));
    if k.len() > 4 {
        b = b.wrapping_add(word(&k[4..k.len().min(8)]));
    }
    if k.len() > 8 {
        c = c.wrapping_add(word(&k[8..]));
    }
    c ^= b;
    c = c.wrapping_sub(rot(b, 14));
    a ^= c;
    a = a.wrapping_sub(rot(c, 11));
    b ^= a;
    b = b.wrapping_sub(rot(a, 25));
    c ^= b;
    c = c.wrapping_sub(rot(b, 16));
    a ^= c;
    a = a.wrapping_sub(rot(c, 4));
    b ^= a;
    b = b.wrapping_sub(rot(a, 14));
    c ^= b;
    c = c.wrapping_sub(rot(b, 24));
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use zt_core::error::Mismatch;

    #[test]
    fn lookup3_known_values() {
        // Values from Bob Jenkins' lookup3.c self-test (hashlittle, init 0).
        assert_eq!(lookup3(b""), 0xdeadbeef);
        assert_eq!(lookup3(b"Four score and seven years ago"), 0x17770551);
    }

    #[test]
    fn enc_sizes() {
        assert_eq!(enc_size(0), 1);
        assert_eq!(enc_size(255), 1);
        assert_eq!(enc_size(256), 2);
        assert_eq!(enc_size(u64::MAX), 8);
    }

    #[test]
    fn cursor_bounds() {
        let geo = Geometry {
            base: 0,
            offset_size: 4,
            length_size: 4,
        };
        let mut c = Cursor::new(&[1, 0, 0xff, 0xff, 0xff, 0xff], 0, geo, "t");
        assert_eq!(c.u16().unwrap(), 1);
        assert_eq!(c.addr().unwrap(), None);
        assert!(matches!(c.u8(), Err(Error::Truncated { .. })));
    }

    #[test]
    fn another_signature_is_a_typed_mismatch() {
        let geo = Geometry {
            base: 0,
            offset_size: 8,
            length_size: 8,
        };
        let e = Cursor::new(b"SNOD", 64, geo, "v1 B-tree node")
            .sig(b"TREE")
            .unwrap_err();
        let want = Mismatch::new("v1 B-tree node: signature", "\"SNOD\"", "\"TREE\"");
        assert_eq!(e.as_mismatch(), Some(&want));
        assert_eq!(e.rule(), Some(rules::STRUCTURE));
        assert!(
            e.to_string()
                .ends_with("signature is \"SNOD\", not \"TREE\""),
            "{e}"
        );
    }
}
