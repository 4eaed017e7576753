//! The L0 container: magic at both ends, the 40-byte footer, and the
//! manifest blob it points at (bounds, size cap and XXH3-64 checked before a
//! byte of it is parsed).

use crate::rules;
use std::borrow::Cow;

use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

/// The zTensor v2 magic, at offset 0 and at the end of the footer.
pub const MAGIC: &[u8; 8] = b"\x89ZT2\r\n\x1a\n";
/// Footer size in bytes.
pub const FOOTER_LEN: u64 = 40;
/// Smallest valid file: magic plus footer.
pub const MIN_FILE: u64 = 48;
/// The footer version this reader and writer speak.
pub const VERSION: u32 = 2;
/// Every blob offset is a multiple of this, and at least this.
pub const FLOOR: u64 = 4096;
/// Canonical placement.
pub const CANONICAL_ALIGN: u64 = 65536;
/// The spec's cap on a manifest, checked before reading it.
pub const MAX_MANIFEST: u64 = 1 << 30;

/// The decoded footer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    /// Absolute offset of the manifest blob (0 for a data shard).
    pub manifest_offset: u64,
    /// Manifest length (0 for a data shard).
    pub manifest_length: u64,
    /// XXH3-64 of the manifest bytes (0 for a data shard).
    pub manifest_hash: u64,
    /// Footer version (2).
    pub version: u32,
}

impl Footer {
    /// True for a data shard: a blob heap with no manifest.
    pub fn is_data_shard(&self) -> bool {
        self.manifest_length == 0
    }

    /// The 40 footer bytes.
    pub fn encode(&self) -> [u8; 40] {
        let mut f = [0u8; 40];
        f[0..8].copy_from_slice(&self.manifest_offset.to_le_bytes());
        f[8..16].copy_from_slice(&self.manifest_length.to_le_bytes());
        f[16..24].copy_from_slice(&self.manifest_hash.to_le_bytes());
        f[24..28].copy_from_slice(&self.version.to_le_bytes());
        f[32..40].copy_from_slice(MAGIC);
        f
    }
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Read and check the footer: size, both magics, version.
pub fn read_footer(store: &Store) -> Result<Footer> {
    let ctx = store.ctx();
    let len = store.len();
    if len < MIN_FILE {
        return Err(Error::Truncated {
            rule: rules::FILE_TOO_SMALL,
            ctx,
            what: "zTensor magic and footer",
            needed: MIN_FILE,
            available: len,
        });
    }
    if &store.read(0, 8)?[..] != MAGIC {
        return Err(Error::header(
            ctx.at(0),
            rules::HEADER_MAGIC,
            "bad leading magic",
        ));
    }
    let f = store.read(len - FOOTER_LEN, FOOTER_LEN)?;
    if &f[32..40] != MAGIC {
        return Err(Error::header(
            ctx.at(len - 8),
            rules::FOOTER_MAGIC,
            "bad trailing magic: the footer is not at the end of the file",
        ));
    }
    let footer = Footer {
        manifest_offset: le64(&f, 0),
        manifest_length: le64(&f, 8),
        manifest_hash: le64(&f, 16),
        version: u32::from_le_bytes(f[24..28].try_into().expect("4 bytes")),
    };
    if footer.version != VERSION {
        return Err(Error::header(
            ctx.at(len - 16),
            rules::VERSION,
            format!("footer version {} (this reader speaks 2)", footer.version),
        ));
    }
    // §2.2: a data shard zeroes all three manifest fields. A zero length
    // with a nonzero offset or hash is a manifest reference gone wrong, not
    // a shard (upstream's corpus case `reject/data-shard-nonzero-offset`).
    if footer.is_data_shard() && (footer.manifest_offset != 0 || footer.manifest_hash != 0) {
        return Err(Error::range(
            ctx.at(len - FOOTER_LEN),
            rules::MANIFEST_BOUNDS,
            format!(
                "the footer has manifest length 0 (a data shard) but offset {} and hash {:016x}; \
                 a data shard's footer zeroes all three",
                footer.manifest_offset, footer.manifest_hash
            ),
        ));
    }
    Ok(footer)
}

/// Check the manifest's bounds, size and hash, and return its bytes.
pub fn read_manifest<'s>(
    store: &'s Store,
    footer: &Footer,
    limits: &Limits,
) -> Result<Cow<'s, [u8]>> {
    let ctx = store.ctx().at(footer.manifest_offset);
    let n = footer.manifest_length;
    Limits::check(&ctx, "zt manifest_bytes", n, MAX_MANIFEST)
        .map_err(|e| e.with_rule(rules::MANIFEST_TOO_LARGE))?;
    limits.check_header(&ctx, n)?;
    check_blob(&ctx, store.len(), footer.manifest_offset, n, "manifest").map_err(|e| {
        // The manifest's own blob: out of bounds is ManifestBounds; a
        // misaligned one is BlobAlignment, as upstream words it.
        match e.rule() {
            Some(rules::BLOB_BOUNDS) => e.with_rule(rules::MANIFEST_BOUNDS),
            _ => e,
        }
    })?;
    let bytes = store.read(footer.manifest_offset, n)?;
    let hash = xxhash_rust::xxh3::xxh3_64(&bytes);
    if hash != footer.manifest_hash {
        return Err(Error::Integrity {
            rule: rules::MANIFEST_HASH,
            ctx,
            reason: format!(
                "manifest XXH3-64 is {hash:016x}, the footer says {:016x}",
                footer.manifest_hash
            ),
        });
    }
    Ok(bytes)
}

/// The blob rules of §2.4 for one reference into a file of `file_len` bytes:
/// offset a multiple of 4096 and at least 4096, end before the footer.
pub fn check_blob(ctx: &Context, file_len: u64, offset: u64, len: u64, what: &str) -> Result<()> {
    if offset % FLOOR != 0 || offset < FLOOR {
        return Err(Error::range(
            ctx.clone().at(offset),
            rules::BLOB_ALIGNMENT,
            format!("{what} blob offset {offset} is not a multiple of 4096 at or past 4096"),
        ));
    }
    let end = offset.checked_add(len).ok_or_else(|| Error::Overflow {
        rule: rules::BLOB_BOUNDS,
        ctx: ctx.clone().at(offset),
        what: "blob end",
    })?;
    let data_end = file_len.saturating_sub(FOOTER_LEN);
    if end > data_end {
        return Err(Error::range(
            ctx.clone().at(offset),
            rules::BLOB_BOUNDS,
            format!(
                "{what} blob [{offset}, {end}) runs past the data region, which ends at {data_end}"
            ),
        ));
    }
    Ok(())
}

/// Check that references into one file are pairwise identical or disjoint
/// (zero-length references are exempt). `refs` holds `(offset, len, name)`
/// where `name` is the tensor that holds the reference (empty for the manifest).
pub fn check_disjoint(ctx: &Context, refs: &mut [(u64, u64, &str)]) -> Result<()> {
    check_disjoint_by(ctx, refs, |name| name)
}

/// [`check_disjoint`] over references that name their tensor by a key
/// (`name` gives its name, empty for the manifest): the reader keeps
/// positions rather than a borrowed name per part.
pub fn check_disjoint_by<'n, K: Copy>(
    ctx: &Context,
    refs: &mut [(u64, u64, K)],
    name: impl Fn(K) -> &'n str,
) -> Result<()> {
    // A stable sort: references come in manifest order, CBOR's key order
    // (shorter names first), so blobs placed in name order arrive as a few
    // sorted runs, which it merges in one pass where an unstable sort
    // re-sorts them. Names break ties only between identical references.
    refs.sort_by(|a, b| {
        (a.0, a.1)
            .cmp(&(b.0, b.1))
            .then_with(|| name(a.2).cmp(name(b.2)))
    });
    // Names are looked up only for the error: each is a read through an
    // object, in offset order, which is not the order objects are kept in.
    let mut prev: Option<(u64, u64, K)> = None;
    for &(offset, len, key) in refs.iter() {
        if len == 0 {
            continue;
        }
        if let Some((po, pl, prev_key)) = prev {
            if (po, pl) == (offset, len) {
                continue;
            }
            // Sorted by offset, and po + pl cannot overflow: every blob was
            // checked to end inside the file.
            if po + pl > offset {
                let who = name(key);
                let name = if who.is_empty() { name(prev_key) } else { who };
                let mut c = ctx.clone().at(offset);
                if !name.is_empty() {
                    c = c.tensor(name);
                }
                return Err(Error::range(
                    c,
                    rules::BLOB_OVERLAP,
                    format!("blob [{offset}, +{len}) partially overlaps blob [{po}, +{pl})"),
                ));
            }
        }
        prev = Some((offset, len, key));
    }
    Ok(())
}
