//! Writing a stored (uncompressed) archive the way numpy's `_savez` does,
//! optionally with each member's data aligned the way `torch.save` pads
//! its records. Apart from the reader (`super`) because the two share only
//! the format's constants.

use super::*;

/// One stored member to write: its name and its bytes in pieces (the npy
/// header, then the array data), with their CRC-32.
pub struct Member<'a> {
    /// Name in the archive.
    pub name: String,
    /// The bytes, concatenated in order.
    pub parts: [&'a [u8]; 2],
    /// CRC-32 of the concatenated bytes.
    pub crc: u32,
}

impl Member<'_> {
    fn size(&self) -> u64 {
        self.parts.iter().map(|p| p.len() as u64).sum()
    }
}

/// The general-purpose flags of a member named `name`: UTF-8 names marked.
fn flags(name: &str) -> u16 {
    if name.is_ascii() {
        0
    } else {
        FLAG_UTF8
    }
}

/// Write an uncompressed archive as numpy's `_savez` does: each local
/// header with `0xFFFFFFFF` sizes and a zip64 extra field (`force_zip64`),
/// the central directory with zip64 fields only where a value needs them,
/// and a zip64 end record only when the count, size or offset needs it.
pub fn write_stored<W: Write>(w: &mut W, members: &[Member<'_>]) -> io::Result<()> {
    write_stored_aligned(w, members, 1)
}

/// The extra block `torch.save` pads local headers with (`'F' 'B'`, then
/// a length and that many `'Z'`s) so each record's data is aligned.
const PAD_EXTRA: u16 = u16::from_le_bytes(*b"FB");

/// [`write_stored`], with each member's data starting at a multiple of
/// `align` bytes (a power of two; 1 for no padding), as `torch.save`
/// aligns its records to 64 bytes so that they can be mapped in place.
pub fn write_stored_aligned<W: Write>(
    w: &mut W,
    members: &[Member<'_>],
    align: u64,
) -> io::Result<()> {
    let mut zip = StoredZip::new(w, align);
    for m in members {
        zip.add(m)?;
    }
    zip.finish()
}

/// A stored archive written one member at a time, so a writer needs one
/// member's bytes at a time (a conversion streams its tensors through it);
/// what [`write_stored_aligned`] writes, byte for byte.
pub struct StoredZip<'w, W: Write> {
    w: &'w mut W,
    align: u64,
    /// Where the next local header starts.
    offset: u64,
    /// What the central directory records of each member written.
    written: Vec<Entry>,
}

/// A member as the central directory records it.
struct Entry {
    name: String,
    size: u64,
    crc: u32,
    offset: u64,
}

impl<'w, W: Write> StoredZip<'w, W> {
    /// An archive written to `w`, each member's data aligned to `align`.
    pub fn new(w: &'w mut W, align: u64) -> Self {
        StoredZip {
            w,
            align,
            offset: 0,
            written: Vec::new(),
        }
    }

    /// Write `m`'s local header and bytes.
    pub fn add(&mut self, m: &Member<'_>) -> io::Result<()> {
        let size = m.size();
        let mut local = Vec::with_capacity(LOCAL_LEN as usize + m.name.len() + 20);
        put32(&mut local, LOCAL_SIG);
        put16(&mut local, ZIP64_VERSION);
        put16(&mut local, flags(&m.name));
        put16(&mut local, 0); // stored
        put16(&mut local, 0); // time 00:00:00
        put16(&mut local, DOS_DATE);
        put32(&mut local, m.crc);
        put32(&mut local, 0xFFFF_FFFF);
        put32(&mut local, 0xFFFF_FFFF);
        // The data would start after the fixed header, the name and the
        // 20-byte zip64 block; a padding block (4 bytes + pad) moves it to
        // the next multiple of `align`.
        let unpadded = self.offset + LOCAL_LEN + m.name.len() as u64 + 20;
        let align = self.align;
        let pad = if align > 1 {
            4 + (align - (unpadded + 4) % align) % align
        } else {
            0
        };
        put16(&mut local, m.name.len() as u16);
        put16(&mut local, 20 + pad as u16);
        local.extend_from_slice(m.name.as_bytes());
        put16(&mut local, ZIP64_EXTRA);
        put16(&mut local, 16);
        put64(&mut local, size);
        put64(&mut local, size);
        if pad > 0 {
            put16(&mut local, PAD_EXTRA);
            put16(&mut local, (pad - 4) as u16);
            local.resize(local.len() + (pad - 4) as usize, b'Z');
        }
        self.w.write_all(&local)?;
        for part in m.parts {
            self.w.write_all(part)?;
        }
        self.written.push(Entry {
            name: m.name.clone(),
            size,
            crc: m.crc,
            offset: self.offset,
        });
        self.offset += local.len() as u64 + size;
        Ok(())
    }

    /// Write the central directory and the end records.
    pub fn finish(self) -> io::Result<()> {
        let w = self.w;
        let dir_offset = self.offset;
        let mut dir_size = 0u64;
        for e in &self.written {
            let entry = central_record(&e.name, e.size, e.crc, e.offset);
            w.write_all(&entry)?;
            dir_size += entry.len() as u64;
        }
        let count = self.written.len() as u64;
        let needs_zip64 =
            count > FILECOUNT_LIMIT || dir_offset > ZIP64_LIMIT || dir_size > ZIP64_LIMIT;
        let mut end = Vec::with_capacity(98);
        if needs_zip64 {
            let record_pos = dir_offset + dir_size;
            put32(&mut end, EOCD64_SIG);
            put64(&mut end, EOCD64_LEN - 12);
            put16(&mut end, ZIP64_VERSION);
            put16(&mut end, ZIP64_VERSION);
            put32(&mut end, 0);
            put32(&mut end, 0);
            put64(&mut end, count);
            put64(&mut end, count);
            put64(&mut end, dir_size);
            put64(&mut end, dir_offset);
            put32(&mut end, LOCATOR_SIG);
            put32(&mut end, 0);
            put64(&mut end, record_pos);
            put32(&mut end, 1);
        }
        put32(&mut end, EOCD_SIG);
        put16(&mut end, 0);
        put16(&mut end, 0);
        put16(&mut end, count.min(FILECOUNT_LIMIT) as u16);
        put16(&mut end, count.min(FILECOUNT_LIMIT) as u16);
        put32(&mut end, dir_size.min(0xFFFF_FFFF) as u32);
        put32(&mut end, dir_offset.min(0xFFFF_FFFF) as u32);
        put16(&mut end, 0);
        w.write_all(&end)
    }
}

/// A central directory record as `ZipFile._write_end_record` builds it.
pub(super) fn central_record(name: &str, size: u64, crc: u32, local_offset: u64) -> Vec<u8> {
    let mut zip64 = Vec::new();
    let mut size32 = size as u32;
    if size > ZIP64_LIMIT {
        zip64.extend([size, size]);
        size32 = 0xFFFF_FFFF;
    }
    let mut offset32 = local_offset as u32;
    if local_offset > ZIP64_LIMIT {
        zip64.push(local_offset);
        offset32 = 0xFFFF_FFFF;
    }
    let extra_len = if zip64.is_empty() {
        0
    } else {
        4 + 8 * zip64.len()
    };
    let mut r = Vec::with_capacity(CENTRAL_LEN + name.len() + extra_len);
    put32(&mut r, CENTRAL_SIG);
    put16(&mut r, MADE_BY);
    put16(&mut r, ZIP64_VERSION);
    put16(&mut r, flags(name));
    put16(&mut r, 0); // stored
    put16(&mut r, 0);
    put16(&mut r, DOS_DATE);
    put32(&mut r, crc);
    put32(&mut r, size32);
    put32(&mut r, size32);
    put16(&mut r, name.len() as u16);
    put16(&mut r, extra_len as u16);
    put16(&mut r, 0); // comment
    put16(&mut r, 0); // disk
    put16(&mut r, 0); // internal attributes
    put32(&mut r, EXTERNAL_ATTR);
    put32(&mut r, offset32);
    r.extend_from_slice(name.as_bytes());
    if !zip64.is_empty() {
        put16(&mut r, ZIP64_EXTRA);
        put16(&mut r, (8 * zip64.len()) as u16);
        for v in zip64 {
            put64(&mut r, v);
        }
    }
    r
}

fn put16(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn put32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}

fn put64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}
