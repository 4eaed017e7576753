//! The on-disk layout of `meta.zr`, byte for byte, as loaderx 2.3 and 2.8
//! both write it.
//!
//! ```text
//! 0..8       length        u64   published record count
//! 8..10      schema_length u16   1..=2040
//! 10         data_shards   u8    1..=255
//! 11         codec         u8    0 raw, 1 zstd, 2 zstd_dict
//! 12..16     reserved      [u8; 4], zero
//! 16..2056   255 x u64 tails: committed end of data_s.zr; slots >= S are zero
//! 2056..4096 schema (schema_length bytes, the rest zero): loaderx 2.8's JSON
//!            or loaderx 2.3's MsgPack (crate::schema)
//! 4096+16*i  RecordLoc[i] = { offset u64, phys_length u32, logic_length u32 }
//! ```
//!
//! Nothing else in the page differs between the releases (checked against
//! stores built by loaderx 2.3.8 and 2.8.19 from the same records: the
//! header, tails and RecordLocs are identical, only the schema bytes and
//! their length differ).
//!
//! loaderx writes these `extern struct`s in host byte order; every platform
//! it ships for is little-endian, so zrecord reads and writes little-endian
//! explicitly and the files are identical.

use std::path::Path;

use crate::codec::Codec;
use crate::error::{Error, Result};

/// Size of the static page at the start of `meta.zr`.
pub const PAGE: usize = 4096;
/// Size of the fixed header at the start of the page.
pub const HEADER: usize = 16;
/// Most data shards a store can have (and the number of tail slots).
pub const MAX_SHARDS: usize = 255;
/// Where the tail slots start.
pub const TAILS_AT: usize = HEADER;
/// Where the schema starts.
pub const SCHEMA_AT: usize = TAILS_AT + MAX_SHARDS * 8;
/// Most bytes the schema may take.
pub const MAX_SCHEMA: usize = PAGE - SCHEMA_AT;
/// Size of one RecordLoc.
pub const LOC: usize = 16;
/// The largest record (logical bytes), as in loaderx.
pub const MAX_RECORD: u64 = 1 << 31;

/// The decoded static page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Published record count.
    pub length: u64,
    /// Number of data shards, 1..=255.
    pub data_shards: u8,
    /// The store's codec.
    pub codec: Codec,
    /// Committed end of each active shard (`data_shards` entries).
    pub tails: Vec<u64>,
    /// The schema bytes (JSON or MsgPack; see [`crate::schema`]).
    pub schema: Vec<u8>,
}

/// Where record `index`'s bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLoc {
    /// Offset in its shard file.
    pub offset: u64,
    /// Bytes stored (the codec frame).
    pub phys: u32,
    /// Bytes the record decodes to.
    pub logic: u32,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

impl Header {
    /// Encode the 4096-byte page.
    pub fn encode(&self) -> Vec<u8> {
        let mut page = vec![0u8; PAGE];
        page[0..8].copy_from_slice(&self.length.to_le_bytes());
        page[8..10].copy_from_slice(&(self.schema.len() as u16).to_le_bytes());
        page[10] = self.data_shards;
        page[11] = self.codec as u8;
        for (s, tail) in self.tails.iter().enumerate() {
            let at = TAILS_AT + 8 * s;
            page[at..at + 8].copy_from_slice(&tail.to_le_bytes());
        }
        page[SCHEMA_AT..SCHEMA_AT + self.schema.len()].copy_from_slice(&self.schema);
        page
    }

    /// Decode and check the page as loaderx's `Storage.open` does: the page
    /// is complete, the codec known, the schema length in 1..=2040, at least
    /// one shard, reserved bytes zero and inactive tails zero. `meta_len`
    /// is the length of `meta.zr`, which must hold a RecordLoc per record.
    pub fn decode(page: &[u8], meta_len: u64, path: &Path) -> Result<Header> {
        let p = || path.to_path_buf();
        if page.len() < PAGE || meta_len < PAGE as u64 {
            return Err(Error::ShortPage {
                path: p(),
                len: meta_len.min(page.len() as u64),
            });
        }
        let length = u64_at(page, 0);
        let schema_len = u16::from_le_bytes([page[8], page[9]]);
        let data_shards = page[10];
        let codec = Codec::from_tag(page[11]).ok_or_else(|| Error::UnknownCodec {
            path: p(),
            tag: page[11],
        })?;
        if schema_len == 0 || schema_len as usize > MAX_SCHEMA {
            return Err(Error::SchemaLength {
                path: p(),
                len: schema_len,
            });
        }
        if data_shards == 0 {
            return Err(Error::NoShards { path: p() });
        }
        if let Some(index) = (0..4).find(|&i| page[12 + i] != 0) {
            return Err(Error::Reserved {
                path: p(),
                index,
                value: page[12 + index],
            });
        }
        let tails: Vec<u64> = (0..MAX_SHARDS)
            .map(|s| u64_at(page, TAILS_AT + 8 * s))
            .collect();
        if let Some(slot) = (data_shards as usize..MAX_SHARDS).find(|&s| tails[s] != 0) {
            return Err(Error::InactiveTail {
                path: p(),
                slot,
                tail: tails[slot],
            });
        }
        let need = loc_table_end(length);
        if need.is_none_or(|need| meta_len < need) {
            return Err(Error::ShortLocTable {
                path: p(),
                len: meta_len,
                records: length,
                need: need.unwrap_or(u64::MAX),
            });
        }
        Ok(Header {
            length,
            data_shards,
            codec,
            tails: tails[..data_shards as usize].to_vec(),
            schema: page[SCHEMA_AT..SCHEMA_AT + schema_len as usize].to_vec(),
        })
    }
}

/// The end of the RecordLoc table for `length` records, if it fits a u64.
pub fn loc_table_end(length: u64) -> Option<u64> {
    length.checked_mul(LOC as u64)?.checked_add(PAGE as u64)
}

impl RecordLoc {
    /// Decode a 16-byte RecordLoc.
    pub fn decode(b: &[u8]) -> RecordLoc {
        RecordLoc {
            offset: u64_at(b, 0),
            phys: u32_at(b, 8),
            logic: u32_at(b, 12),
        }
    }

    /// Encode into 16 bytes.
    pub fn encode_into(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..12].copy_from_slice(&self.phys.to_le_bytes());
        out[12..16].copy_from_slice(&self.logic.to_le_bytes());
    }

    /// loaderx's per-read checks: a nonzero logical length within the
    /// record limit, a nonzero stored length, raw records stored as is, and
    /// the frame inside the shard's committed tail. Returns the frame's end.
    pub fn check(&self, codec: Codec, tail: u64) -> std::result::Result<u64, &'static str> {
        if self.logic == 0 || u64::from(self.logic) > MAX_RECORD {
            return Err("logical length outside 1..=2^31");
        }
        if self.phys == 0 {
            return Err("zero stored length");
        }
        if codec == Codec::Raw && self.phys != self.logic {
            return Err("raw record whose stored and logical lengths differ");
        }
        match self.offset.checked_add(u64::from(self.phys)) {
            Some(end) if end <= tail => Ok(end),
            _ => Err("record passes its shard's committed tail"),
        }
    }
}
