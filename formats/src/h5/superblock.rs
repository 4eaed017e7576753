//! The superblock: where the HDF5 data starts (after an optional
//! userblock), how wide addresses and lengths are, and where the root
//! group's object header is. Versions 0 and 1 (h5py's default) and 2 and 3
//! (`libver="latest"`, checksummed).

use crate::h5::rules;
use zt_core::error::{Context, Error, Result};
use zt_core::store::Store;

use super::reader::{Cursor, Geometry};

/// The 8-byte HDF5 signature.
pub const SIGNATURE: &[u8; 8] = b"\x89HDF\r\n\x1a\n";

/// What the superblock says.
#[derive(Debug, Clone, Copy)]
pub struct Superblock {
    /// Superblock version (0 to 3).
    pub version: u8,
    /// Address geometry; `base` is the superblock's own offset, as the
    /// HDF5 library treats it whatever the stored base address says.
    pub geo: Geometry,
    /// Relative address of the root group's object header.
    pub root: u64,
}

/// Offsets where a superblock may start: 0, then 512 doubling.
pub fn candidates(len: u64) -> impl Iterator<Item = u64> {
    std::iter::successors(Some(0u64), move |&at| {
        let next = if at == 0 { 512 } else { at.checked_mul(2)? };
        (next < len).then_some(next)
    })
}

/// Find the signature and parse the superblock after it.
pub fn read(store: &Store) -> Result<Superblock> {
    for at in candidates(store.len()) {
        let head = store.read_upto(at, 8)?;
        if head.as_ref() == SIGNATURE {
            return parse_at(store, at);
        }
    }
    Err(Error::header(
        Context::default(),
        rules::SIGNATURE,
        "no HDF5 signature at offset 0 or at any userblock boundary",
    ))
}

/// Parse the superblock at `at` (the signature's offset): the HDF5 file
/// inside a `.keras` zip starts at its member's data.
pub fn parse_at(store: &Store, at: u64) -> Result<Superblock> {
    let sig = store.read_upto(at, 8)?;
    if sig.as_ref() != SIGNATURE {
        return Err(Error::header(
            Context::default().at(at),
            rules::SIGNATURE,
            "no HDF5 signature where the HDF5 file should start",
        ));
    }
    // The largest superblock (v1 with 8-byte fields) is under 128 bytes.
    let buf = store.read_upto(at, 256)?;
    let provisional = Geometry {
        base: at,
        offset_size: 8,
        length_size: 8,
    };
    let mut c = Cursor::new(&buf, at, provisional, "superblock");
    c.skip(8)?;
    let version = c.u8()?;
    match version {
        0 | 1 => parse_v0(c, version, at),
        2 | 3 => parse_v2(c, version, at),
        v => Err(c.bad(format!("unknown superblock version {v}"))),
    }
}

fn sizes(c: &Cursor<'_>, offset_size: u8, length_size: u8, at: u64) -> Result<Geometry> {
    for (what, size) in [("offsets", offset_size), ("lengths", length_size)] {
        if ![2, 4, 8].contains(&size) {
            return Err(c.bad(format!("size of {what} is {size}; 2, 4 or 8 expected")));
        }
    }
    Ok(Geometry {
        base: at,
        offset_size: usize::from(offset_size),
        length_size: usize::from(length_size),
    })
}

fn parse_v0(mut c: Cursor<'_>, version: u8, at: u64) -> Result<Superblock> {
    c.skip(4)?; // free-space, root symbol table, reserved, shared header versions
    let (so, sl) = (c.u8()?, c.u8()?);
    let geo = sizes(&c, so, sl, at)?;
    c.skip(1)?; // reserved
    c.skip(4)?; // group leaf / internal node K
    c.skip(4)?; // file consistency flags
    if version == 1 {
        c.skip(4)?; // indexed storage K, reserved
    }
    let mut c = Cursor::new(&c.buf()[c.pos()..], c.offset(), geo, "superblock");
    let _base = c.addr()?;
    c.addr()?; // free-space info
    c.addr()?; // end of file
    c.addr()?; // driver info
               // The root group's symbol table entry.
    c.addr()?; // link name offset
    let root = c
        .addr()?
        .ok_or_else(|| c.bad("the root group has no object header"))?;
    Ok(Superblock { version, geo, root })
}

fn parse_v2(mut c: Cursor<'_>, version: u8, at: u64) -> Result<Superblock> {
    let (so, sl) = (c.u8()?, c.u8()?);
    let geo = sizes(&c, so, sl, at)?;
    c.skip(1)?; // consistency flags
    let start = 0;
    let mut c = Cursor::new(c.buf(), at, geo, "superblock");
    c.skip(12)?;
    c.addr()?; // base address
    c.addr()?; // superblock extension
    c.addr()?; // end of file
    let root = c
        .addr()?
        .ok_or_else(|| c.bad("the root group has no object header"))?;
    c.checksum(start)?;
    Ok(Superblock { version, geo, root })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userblock_candidates_double() {
        let v: Vec<u64> = candidates(5000).collect();
        assert_eq!(v, vec![0, 512, 1024, 2048, 4096]);
        assert_eq!(candidates(0).collect::<Vec<_>>(), vec![0]);
    }
}
