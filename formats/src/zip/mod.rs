//! The small part of zip that `.npz` and PyTorch checkpoints need: reading
//! the central directory (zip64 included), locating each member's data,
//! inflating deflated members within the limits, and writing a stored
//! archive the way numpy's `_savez` does (optionally with each member's
//! data aligned, the way `torch.save` pads its records).
//!
//! Every count, offset and length is checked against the file and the
//! [`Limits`] before anything is allocated for it, and members may not
//! overlap each other or the central directory (overlapping members are
//! how non-recursive zip bombs multiply their output).

use std::io::{self, Read, Write};
use zt_core::Rule;

use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

/// The rules zip archives (torch zip checkpoints, `.npz`) refusals cite (`zip.*`).
pub mod rules;
mod write;

pub use rules::RULES;

/// The zip reader npz and PyTorch share: no format of its own, only the
/// rules its refusals cite (`zip.*`), listed as a plugin so the registry
/// sees them.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "zip",
    readers: &[],
    writers: &[],
    rules: &[("zip", RULES)],
    checkpoints: &[],
};
pub use write::{write_stored, write_stored_aligned, Member, StoredZip};

const LOCAL_SIG: u32 = 0x0403_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD64_SIG: u32 = 0x0606_4b50;
const LOCATOR_SIG: u32 = 0x0706_4b50;

const LOCAL_LEN: u64 = 30;
const CENTRAL_LEN: usize = 46;
const EOCD_LEN: u64 = 22;
const EOCD64_LEN: u64 = 56;
const LOCATOR_LEN: u64 = 20;
/// The end record plus the longest comment it can carry.
const EOCD_SEARCH: u64 = EOCD_LEN + 0xFFFF;
/// The suffix searched first: archives rarely carry a comment, and over the
/// network a walk that reads 64 KiB from the end of every archive (every
/// chunk of a `TORCH_SAVE` DCP checkpoint is one) costs that many bytes
/// each, where its structure takes a few hundred.
const EOCD_FIRST: u64 = 4 << 10;

/// The zip64 extended-information extra field.
const ZIP64_EXTRA: u16 = 0x0001;
/// General-purpose flag: the member is encrypted.
const FLAG_ENCRYPTED: u16 = 0x0001;
/// General-purpose flag: strong encryption.
const FLAG_STRONG_ENCRYPTION: u16 = 0x0040;
/// General-purpose flag: the name is UTF-8 (otherwise code page 437).
const FLAG_UTF8: u16 = 0x0800;

/// Python's `zipfile` switches to zip64 fields past this (`ZIP64_LIMIT`).
const ZIP64_LIMIT: u64 = (1 << 31) - 1;
/// ... and past this many members (`ZIP_FILECOUNT_LIMIT`).
const FILECOUNT_LIMIT: u64 = 0xFFFF;
/// Version 4.5: zip64.
const ZIP64_VERSION: u16 = 45;
/// Version made by: 4.5 on Unix (3), as CPython on Linux writes it.
const MADE_BY: u16 = (3 << 8) | ZIP64_VERSION;
/// `-rw-------` in the high half, as `ZipFile.open(..., "w")` sets it.
const EXTERNAL_ATTR: u32 = 0o600 << 16;
/// MS-DOS date of 1980-01-01, the earliest; a fixed timestamp keeps written
/// files reproducible.
const DOS_DATE: u16 = (1 << 5) | 1;

/// One member of the archive, as the central directory and its local
/// header describe it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The name, decoded (UTF-8 or code page 437 per the flags).
    pub name: String,
    /// General-purpose flags.
    pub flags: u16,
    /// Compression method (0 stored, 8 deflate).
    pub method: u16,
    /// CRC-32 of the uncompressed bytes.
    pub crc: u32,
    /// Compressed size.
    pub compressed: u64,
    /// Uncompressed size.
    pub uncompressed: u64,
    /// Offset of the local header.
    pub local_offset: u64,
    /// Offset of the member's (compressed) data, after the local header.
    pub data_start: u64,
}

impl Entry {
    /// True if the member is encrypted (we never decrypt).
    pub fn encrypted(&self) -> bool {
        self.flags & (FLAG_ENCRYPTED | FLAG_STRONG_ENCRYPTION) != 0
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Where the central directory is and how many entries it declares.
#[derive(Debug)]
struct Directory {
    count: u64,
    offset: u64,
    size: u64,
    /// Where the directory must end: the zip64 end record or the end record.
    limit: u64,
}

/// Read every entry of the archive in `store`, with data offsets resolved
/// from the local headers and overlaps refused.
pub fn read_entries(store: &Store, ctx: &Context, limits: &Limits) -> Result<Vec<Entry>> {
    read_entries_in(store, ctx, limits, 0, store.len())
}

/// [`read_entries`] for an archive embedded at `[start, start + len)` of
/// `store` (a PyTorch distributed checkpoint holds one `torch.save` archive
/// per chunk in one file): the archive's own offsets count from `start`,
/// and the entries returned carry offsets into `store`, so
/// [`member_bytes`] reads them unchanged. Nothing outside the range is read.
pub fn read_entries_in(
    store: &Store,
    ctx: &Context,
    limits: &Limits,
    start: u64,
    len: u64,
) -> Result<Vec<Entry>> {
    store.check_range(start, len, "embedded zip archive")?;
    let dir = find_directory(store, ctx, start, len)?;
    Limits::check(ctx, "entries", dir.count, limits.entries)?;
    limits.check_header(ctx, dir.size)?;
    let end = dir
        .offset
        .checked_add(dir.size)
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "central directory end",
        })?;
    if end > dir.limit {
        return Err(Error::range(
            ctx.clone().at(dir.offset),
            rules::DIRECTORY,
            format!(
                "central directory [{}, {end}) runs past its end record at {}",
                dir.offset, dir.limit
            ),
        ));
    }
    // Each entry takes at least 46 bytes; a count the directory cannot hold
    // is refused before anything is allocated for it.
    if dir.count.saturating_mul(CENTRAL_LEN as u64) > dir.size {
        return Err(Error::header(
            ctx.clone().at(dir.offset),
            rules::DIRECTORY,
            format!(
                "a central directory of {} bytes cannot hold {} entries",
                dir.size, dir.count
            ),
        ));
    }
    // Within the range: `end <= dir.limit < len` was checked above.
    let dir_start = start + dir.offset;
    let bytes = store.read(dir_start, dir.size)?;
    let mut entries = Vec::with_capacity(dir.count as usize);
    let mut at = 0usize;
    for _ in 0..dir.count {
        let (mut entry, next) = central_entry(ctx, &bytes, at, dir_start, limits)?;
        entry.local_offset =
            start
                .checked_add(entry.local_offset)
                .ok_or_else(|| Error::Overflow {
                    rule: Rule::OVERFLOW,
                    ctx: ctx.clone(),
                    what: "zip member offset",
                })?;
        entries.push(entry);
        at = next;
    }
    if at as u64 != dir.size {
        return Err(Error::header(
            ctx.clone().at(dir_start + at as u64),
            rules::DIRECTORY,
            format!(
                "{} entries end at byte {at} of a {}-byte central directory",
                dir.count, dir.size
            ),
        ));
    }
    // Every local header is read next: over the network, fetch them all
    // in one batch rather than one request per member.
    let headers: Vec<(u64, u64)> = entries
        .iter()
        .map(|e| (e.local_offset, LOCAL_HEADER_READ))
        .collect();
    store.prefetch_ranges(&headers)?;
    for entry in &mut entries {
        entry.data_start = local_data_start(store, ctx, entry, dir_start)?;
    }
    check_overlaps(ctx, &entries)?;
    Ok(entries)
}

/// Find the end of central directory record (searching back over a
/// possible comment) and, when a zip64 locator precedes it, the zip64 end
/// record, in the archive at `[start, start + len)` of `store`; the
/// offsets returned count from `start`.
fn find_directory(store: &Store, ctx: &Context, start: u64, len: u64) -> Result<Directory> {
    if len < EOCD_LEN {
        return Err(Error::Truncated {
            rule: Rule::TRUNCATED,
            ctx: ctx.clone(),
            what: "zip end of central directory",
            needed: EOCD_LEN,
            available: len,
        });
    }
    // The last signature whose record and comment fit in the file: looked
    // for in a short suffix first, then in the whole window a comment
    // allows. Both end at the file's end, so a record found in the suffix is
    // the last one the whole window holds too.
    let mut found = None;
    for window in [EOCD_FIRST, EOCD_SEARCH] {
        let tail_start = len.saturating_sub(window);
        let tail = store.read(start + tail_start, len - tail_start)?;
        let last = (0..=tail.len() - EOCD_LEN as usize).rev().find(|&i| {
            u32_at(&tail, i) == EOCD_SIG
                && i + EOCD_LEN as usize + usize::from(u16_at(&tail, i + 20)) <= tail.len()
        });
        if let Some(i) = last {
            found = Some((tail, tail_start, i));
            break;
        }
        if tail_start == 0 {
            break; // the suffix was the whole archive
        }
    }
    let Some((tail, tail_start, i)) = found else {
        return Err(Error::header(
            ctx.clone(),
            rules::DIRECTORY,
            "no zip end of central directory record",
        ));
    };
    let eocd = &tail[i..i + EOCD_LEN as usize];
    let eocd_pos = tail_start + i as u64;
    if u16_at(eocd, 4) != 0 || u16_at(eocd, 6) != 0 {
        return Err(Error::Unsupported {
            rule: rules::UNSUPPORTED,
            ctx: ctx.clone().at(start + eocd_pos),
            reason: "multi-disk zip archives".into(),
        });
    }
    if eocd_pos >= LOCATOR_LEN {
        let locator = store.read(start + eocd_pos - LOCATOR_LEN, LOCATOR_LEN)?;
        if u32_at(&locator, 0) == LOCATOR_SIG {
            return zip64_directory(store, ctx, &locator, start, eocd_pos - LOCATOR_LEN);
        }
    }
    Ok(Directory {
        count: u64::from(u16_at(eocd, 10)),
        size: u64::from(u32_at(eocd, 12)),
        offset: u64::from(u32_at(eocd, 16)),
        limit: eocd_pos,
    })
}

/// Read the zip64 end record the locator at `locator_pos` points to.
fn zip64_directory(
    store: &Store,
    ctx: &Context,
    locator: &[u8],
    start: u64,
    locator_pos: u64,
) -> Result<Directory> {
    let record_pos = u64_at(locator, 8);
    if u32_at(locator, 4) != 0 || u32_at(locator, 16) > 1 {
        return Err(Error::Unsupported {
            rule: rules::UNSUPPORTED,
            ctx: ctx.clone().at(start.saturating_add(locator_pos)),
            reason: "multi-disk zip64 archives".into(),
        });
    }
    if record_pos
        .checked_add(EOCD64_LEN)
        .is_none_or(|end| end > locator_pos)
    {
        return Err(Error::range(
            ctx.clone().at(start.saturating_add(locator_pos)),
            rules::DIRECTORY,
            format!("zip64 end record offset {record_pos} is not before its locator"),
        ));
    }
    let record = store.read(start + record_pos, EOCD64_LEN)?;
    if u32_at(&record, 0) != EOCD64_SIG {
        return Err(Error::header(
            ctx.clone().at(start.saturating_add(record_pos)),
            rules::DIRECTORY,
            "no zip64 end of central directory record where the locator points",
        ));
    }
    if u32_at(&record, 16) != 0 || u32_at(&record, 20) != 0 {
        return Err(Error::Unsupported {
            rule: rules::UNSUPPORTED,
            ctx: ctx.clone().at(start.saturating_add(record_pos)),
            reason: "multi-disk zip64 archives".into(),
        });
    }
    Ok(Directory {
        count: u64_at(&record, 32),
        size: u64_at(&record, 40),
        offset: u64_at(&record, 48),
        limit: record_pos,
    })
}

/// Parse the central directory entry at `at`; returns it and the offset of
/// the next one.
fn central_entry(
    ctx: &Context,
    dir: &[u8],
    at: usize,
    dir_offset: u64,
    limits: &Limits,
) -> Result<(Entry, usize)> {
    let ectx = ctx.clone().at(dir_offset + at as u64);
    let fixed = dir
        .get(at..at + CENTRAL_LEN)
        .ok_or_else(|| Error::Truncated {
            rule: Rule::TRUNCATED,
            ctx: ectx.clone(),
            what: "zip central directory entry",
            needed: CENTRAL_LEN as u64,
            available: (dir.len() - at) as u64,
        })?;
    if u32_at(fixed, 0) != CENTRAL_SIG {
        return Err(Error::header(
            ectx,
            rules::ENTRY,
            "bad central directory entry signature",
        ));
    }
    let name_len = usize::from(u16_at(fixed, 28));
    let extra_len = usize::from(u16_at(fixed, 30));
    let comment_len = usize::from(u16_at(fixed, 32));
    Limits::check(&ectx, "string_bytes", name_len as u64, limits.string_bytes)?;
    let name_at = at + CENTRAL_LEN;
    let next = name_at + name_len + extra_len + comment_len;
    if next > dir.len() {
        return Err(Error::Truncated {
            rule: Rule::TRUNCATED,
            ctx: ectx,
            what: "zip central directory entry",
            needed: (next - at) as u64,
            available: (dir.len() - at) as u64,
        });
    }
    let flags = u16_at(fixed, 8);
    let raw_name = &dir[name_at..name_at + name_len];
    let name = decode_name(&ectx, raw_name, flags)?;
    let extra = &dir[name_at + name_len..name_at + name_len + extra_len];
    let mut entry = Entry {
        name,
        flags,
        method: u16_at(fixed, 10),
        crc: u32_at(fixed, 16),
        compressed: u64::from(u32_at(fixed, 20)),
        uncompressed: u64::from(u32_at(fixed, 24)),
        local_offset: u64::from(u32_at(fixed, 42)),
        data_start: 0,
    };
    apply_zip64_extra(&ectx, &mut entry, extra, u16_at(fixed, 34))?;
    Ok((entry, next))
}

/// Replace the 32-bit fields saturated at `0xFFFFFFFF` with their 64-bit
/// values from the zip64 extra field, which holds only those, in the order
/// uncompressed size, compressed size, local header offset, disk.
fn apply_zip64_extra(ctx: &Context, entry: &mut Entry, extra: &[u8], disk: u16) -> Result<()> {
    let mut wanted: Vec<&mut u64> = [
        &mut entry.uncompressed,
        &mut entry.compressed,
        &mut entry.local_offset,
    ]
    .into_iter()
    .filter(|v| **v == 0xFFFF_FFFF)
    .collect();
    let disk_in_extra = disk == 0xFFFF;
    if disk != 0 && !disk_in_extra {
        return Err(Error::Unsupported {
            rule: rules::UNSUPPORTED,
            ctx: ctx.clone(),
            reason: "multi-disk zip archives".into(),
        });
    }
    if wanted.is_empty() {
        return Ok(());
    }
    let data = find_extra(ctx, extra, ZIP64_EXTRA)?.ok_or_else(|| {
        Error::header(
            ctx.clone(),
            rules::ENTRY,
            format!(
                "member {:?} has saturated sizes but no zip64 extra field",
                entry.name
            ),
        )
    })?;
    if data.len() < wanted.len() * 8 {
        return Err(Error::header(
            ctx.clone(),
            rules::ENTRY,
            format!("member {:?} has a short zip64 extra field", entry.name),
        ));
    }
    for (i, slot) in wanted.iter_mut().enumerate() {
        **slot = u64_at(data, i * 8);
    }
    Ok(())
}

/// The data of the extra block with `id`, if present.
fn find_extra<'a>(ctx: &Context, mut extra: &'a [u8], id: u16) -> Result<Option<&'a [u8]>> {
    while !extra.is_empty() {
        if extra.len() < 4 {
            return Err(Error::header(
                ctx.clone(),
                rules::ENTRY,
                "truncated zip extra field",
            ));
        }
        let (block_id, size) = (u16_at(extra, 0), usize::from(u16_at(extra, 2)));
        let data = extra.get(4..4 + size).ok_or_else(|| {
            Error::header(
                ctx.clone(),
                rules::ENTRY,
                "zip extra block runs past its field",
            )
        })?;
        if block_id == id {
            return Ok(Some(data));
        }
        extra = &extra[4 + size..];
    }
    Ok(None)
}

/// Code page 437, bytes 0x80-0xFF, as Python's `zipfile` decodes names
/// without the UTF-8 flag.
const CP437_HIGH: &str = "ÇüéâäàåçêëèïîìÄÅÉæÆôöòûùÿÖÜ¢£¥₧ƒáíóúñÑªº¿⌐¬½¼¡«»░▒▓│┤╡╢╖╕╣║╗╝╜╛┐└┴┬├─┼╞╟╚╔╩╦╠═╬╧╨╤╥╙╘╒╓╫╪┘┌█▄▌▐▀αßΓπΣσµτΦΘΩδ∞φε∩≡±≥≤⌠⌡÷≈°∙·√ⁿ²■\u{a0}";

fn decode_name(ctx: &Context, raw: &[u8], flags: u16) -> Result<String> {
    if flags & FLAG_UTF8 != 0 {
        return String::from_utf8(raw.to_vec())
            .map_err(|_| Error::header(ctx.clone(), rules::ENTRY, "member name is not UTF-8"));
    }
    Ok(raw
        .iter()
        .map(|&b| match b {
            0..=0x7F => char::from(b),
            _ => CP437_HIGH
                .chars()
                .nth(usize::from(b - 0x80))
                .expect("128 chars"),
        })
        .collect())
}

/// Bytes of a local header fetched ahead: the fixed part, the name and the
/// extra field of every member numpy or torch writes fit.
const LOCAL_HEADER_READ: u64 = 1024;

/// Read the member's local header and return where its data starts. The
/// local extra field may differ from the central one (numpy's local headers
/// carry a zip64 field the central directory omits), so the offset comes
/// from here. The header and data must lie before the central directory.
fn local_data_start(store: &Store, ctx: &Context, entry: &Entry, dir_offset: u64) -> Result<u64> {
    let ectx = ctx.clone().at(entry.local_offset);
    let fits = |end: Option<u64>, what: &str| match end {
        Some(end) if end <= dir_offset => Ok(end),
        _ => Err(Error::range(
            ectx.clone(),
            rules::BOUNDS,
            format!(
                "member {:?}: {what} runs into the central directory at {dir_offset}",
                entry.name
            ),
        )),
    };
    fits(entry.local_offset.checked_add(LOCAL_LEN), "local header")?;
    let local = store.read(entry.local_offset, LOCAL_LEN)?;
    if u32_at(&local, 0) != LOCAL_SIG {
        return Err(Error::header(
            ectx,
            rules::ENTRY,
            format!("member {:?}: bad local header signature", entry.name),
        ));
    }
    let name_len = u64::from(u16_at(&local, 26));
    let extra_len = u64::from(u16_at(&local, 28));
    let name_start = entry.local_offset + LOCAL_LEN;
    let data_start = fits(name_start.checked_add(name_len + extra_len), "local header")?;
    let local_name = store.read(name_start, name_len)?;
    let local_name = decode_name(&ectx, &local_name, u16_at(&local, 6))?;
    if local_name != entry.name {
        // Python's zipfile refuses this too: the two names must agree.
        return Err(Error::header(
            ectx,
            rules::ENTRY,
            format!(
                "member {:?}: the local header names it {local_name:?}",
                entry.name
            ),
        ));
    }
    fits(data_start.checked_add(entry.compressed), "data")?;
    Ok(data_start)
}

/// Refuse members whose byte ranges (local header through data) overlap.
fn check_overlaps(ctx: &Context, entries: &[Entry]) -> Result<()> {
    let mut spans: Vec<(u64, u64, &str)> = entries
        .iter()
        .map(|e| (e.local_offset, e.data_start + e.compressed, e.name.as_str()))
        .collect();
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
        if start < end {
            return Err(Error::range(
                ctx.clone().at(start),
                rules::BOUNDS,
                format!("zip members {a:?} and {b:?} overlap"),
            ));
        }
    }
    Ok(())
}

/// The bytes of `entry`: the stored range itself (borrowed when the
/// store is mapped), or the deflated data inflated to exactly its declared
/// size, never past [`Limits::decoded_bytes`], with its CRC-32 checked.
/// `max` bounds the result further (callers pass a tighter limit for
/// metadata members such as a pickle).
pub fn member_bytes<'s>(
    store: &'s Store,
    ctx: &Context,
    entry: &Entry,
    limits: &Limits,
    max: (&'static str, u64),
) -> Result<std::borrow::Cow<'s, [u8]>> {
    let ectx = ctx.clone().at(entry.local_offset);
    if entry.encrypted() {
        return Err(Error::Unsupported {
            rule: rules::UNSUPPORTED,
            ctx: ectx,
            reason: format!("member {:?} is encrypted", entry.name),
        });
    }
    Limits::check(&ectx, max.0, entry.uncompressed, max.1)?;
    match entry.method {
        0 => {
            if entry.compressed != entry.uncompressed {
                return Err(Error::header(
                    ectx,
                    rules::ENTRY,
                    format!(
                        "stored member {:?} declares {} compressed and {} uncompressed bytes",
                        entry.name, entry.compressed, entry.uncompressed
                    ),
                ));
            }
            store.read(entry.data_start, entry.compressed)
        }
        8 => {
            limits.check_decoded(&ectx, entry.uncompressed)?;
            let raw = store.read(entry.data_start, entry.compressed)?;
            let out = inflate_exact(&ectx, &entry.name, &raw, entry.uncompressed)?;
            let actual = crc32fast::hash(&out);
            if actual != entry.crc {
                return Err(Error::Decode {
                    rule: rules::ENTRY,
                    ctx: ectx,
                    reason: format!(
                        "member {:?}: CRC-32 {actual:#010x} does not match the directory's {:#010x}",
                        entry.name, entry.crc
                    ),
                });
            }
            Ok(std::borrow::Cow::Owned(out))
        }
        method => Err(Error::Unsupported {
            rule: rules::UNSUPPORTED,
            ctx: ectx,
            reason: format!(
                "member {:?} uses zip compression method {method}; only stored (0) and deflate (8) are read",
                entry.name
            ),
        }),
    }
}

/// Why [`read_exact_growing`] stopped before `len` bytes.
#[derive(Debug)]
pub enum ShortRead {
    /// The stream ended after this many bytes.
    Ended(usize),
    /// The stream failed.
    Io(io::Error),
    /// The buffer could not grow to this many bytes (out of memory).
    Memory(usize),
}

/// Read exactly `len` bytes from `src` into a buffer that grows with what
/// the stream really yields: `first` bytes (capped at `len`), then doubling,
/// never past `len`. A stream that declares a huge size but yields little
/// therefore costs little; the caller checks for bytes past `len`.
pub fn read_exact_growing(
    src: &mut dyn Read,
    len: usize,
    first: usize,
) -> std::result::Result<Vec<u8>, ShortRead> {
    let mut out: Vec<u8> = Vec::new();
    let mut filled = 0;
    while filled < len {
        if filled == out.len() {
            let grow = if out.is_empty() {
                first.max(1)
            } else {
                out.len()
            };
            let grow = grow.min(len - out.len());
            if out.try_reserve_exact(grow).is_err() {
                return Err(ShortRead::Memory(filled + grow));
            }
            out.resize(filled + grow, 0);
        }
        match src.read(&mut out[filled..]) {
            Ok(0) => return Err(ShortRead::Ended(filled)),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ShortRead::Io(e)),
        }
    }
    Ok(out)
}

/// Inflate `raw` to exactly `len` bytes (see [`read_exact_growing`]); one
/// that inflates past `len` is refused without allocating for it.
fn inflate_exact(ctx: &Context, name: &str, raw: &[u8], len: u64) -> Result<Vec<u8>> {
    let fail = |reason: String| Error::Decode {
        rule: rules::ENTRY,
        ctx: ctx.clone(),
        reason: format!("member {name:?}: {reason}"),
    };
    let len = usize::try_from(len).map_err(|_| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "decoded size",
    })?;
    let mut inflater = flate2::read::DeflateDecoder::new(raw);
    let first = raw.len().saturating_mul(4).max(1 << 16);
    let out = read_exact_growing(&mut inflater, len, first).map_err(|short| match short {
        ShortRead::Ended(filled) => {
            fail(format!("deflate stream ends after {filled} of {len} bytes"))
        }
        ShortRead::Io(e) => fail(format!("deflate: {e}")),
        ShortRead::Memory(bytes) => Error::Memory {
            ctx: ctx.clone().tensor(name),
            what: "an inflated member",
            bytes: bytes as u64,
        },
    })?;
    let mut probe = [0u8; 1];
    loop {
        match inflater.read(&mut probe) {
            Ok(0) => return Ok(out),
            Ok(_) => return Err(fail(format!("inflates past its declared {len} bytes"))),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(fail(format!("deflate: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::write::central_record;
    use super::*;

    #[test]
    fn cp437_table() {
        assert_eq!(CP437_HIGH.chars().count(), 128);
        let ctx = Context::default();
        assert_eq!(decode_name(&ctx, b"a\x80\xff", 0).unwrap(), "aÇ\u{a0}");
        assert_eq!(decode_name(&ctx, "é".as_bytes(), FLAG_UTF8).unwrap(), "é");
        assert!(decode_name(&ctx, b"\xff", FLAG_UTF8).is_err());
    }

    #[test]
    fn central_record_switches_to_zip64() {
        assert_eq!(central_record("a.npy", 4, 0, 0).len(), CENTRAL_LEN + 5);
        let big = central_record("a.npy", 4, 0, 1 << 32);
        assert_eq!(big.len(), CENTRAL_LEN + 5 + 12);
        assert_eq!(u32_at(&big, 42), 0xFFFF_FFFF);
        let mut entry = Entry {
            name: "a.npy".into(),
            flags: 0,
            method: 0,
            crc: 0,
            compressed: 4,
            uncompressed: 4,
            local_offset: 0xFFFF_FFFF,
            data_start: 0,
        };
        let ctx = Context::default();
        apply_zip64_extra(&ctx, &mut entry, &big[CENTRAL_LEN + 5..], 0).unwrap();
        assert_eq!(entry.local_offset, 1 << 32);
    }
}
