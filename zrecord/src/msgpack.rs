//! The MsgPack of loaderx 2.3's schema: written as Python's `msgpack.dumps`
//! writes it (the smallest integer and string forms), read by a small strict
//! reader that accepts only what a schema can hold and never reads past the
//! end of its input.

use crate::schema::{Value, MAX_NDIM};

pub(crate) fn write_str(out: &mut Vec<u8>, s: &str) {
    let n = s.len();
    if n < 32 {
        out.push(0xa0 | n as u8);
    } else if n < 256 {
        out.extend_from_slice(&[0xd9, n as u8]);
    } else if n < 65536 {
        out.push(0xda);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(0xdb);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
    out.extend_from_slice(s.as_bytes());
}

pub(crate) fn write_uint(out: &mut Vec<u8>, v: u64) {
    if v < 128 {
        out.push(v as u8);
    } else if v < 256 {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v < 65536 {
        out.push(0xcd);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v < (1 << 32) {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

pub(crate) fn write_array_len(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x90 | n as u8);
    } else {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    }
}

/// A cursor over MsgPack bytes that never reads past the end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        let end = self.at.checked_add(n).ok_or("length overflow")?;
        let s = self.b.get(self.at..end).ok_or("truncated MsgPack")?;
        self.at = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, &'static str> {
        Ok(self.take(1)?[0])
    }

    fn be(&mut self, n: usize) -> Result<u64, &'static str> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |a, &b| (a << 8) | u64::from(b)))
    }

    fn str_len(&mut self, tag: u8) -> Result<Option<usize>, &'static str> {
        Ok(Some(match tag {
            0xa0..=0xbf => (tag & 0x1f) as usize,
            0xd9 => self.be(1)? as usize,
            0xda => self.be(2)? as usize,
            0xdb => self.be(4)? as usize,
            _ => return Ok(None),
        }))
    }

    fn string(&mut self, tag: u8) -> Result<Option<String>, &'static str> {
        let Some(n) = self.str_len(tag)? else {
            return Ok(None);
        };
        let s = std::str::from_utf8(self.take(n)?).map_err(|_| "string is not UTF-8")?;
        Ok(Some(s.to_string()))
    }

    fn uint(&mut self, tag: u8) -> Result<Option<u64>, &'static str> {
        Ok(Some(match tag {
            0x00..=0x7f => u64::from(tag),
            0xcc => self.be(1)?,
            0xcd => self.be(2)?,
            0xce => self.be(4)?,
            0xcf => self.be(8)?,
            // Signed forms holding a non-negative value are still integers.
            0xd0..=0xd3 => {
                let n = 1usize << (tag - 0xd0);
                let raw = self.be(n)?;
                let shift = 64 - 8 * n as u32;
                let v = ((raw << shift) as i64) >> shift;
                if v < 0 {
                    return Err("negative integer");
                }
                v as u64
            }
            0xe0..=0xff => return Err("negative integer"),
            _ => return Ok(None),
        }))
    }

    fn value(&mut self) -> Result<Value, &'static str> {
        let tag = self.byte()?;
        if let Some(s) = self.string(tag)? {
            return Ok(Value::Str(s));
        }
        if let Some(v) = self.uint(tag)? {
            return Ok(Value::UInt(v));
        }
        let n = match tag {
            0x90..=0x9f => (tag & 0x0f) as usize,
            0xdc => self.be(2)? as usize,
            0xdd => self.be(4)? as usize,
            _ => return Err("unsupported MsgPack value in schema"),
        };
        // Every element takes at least one byte: refuse counts the remaining
        // bytes cannot hold before allocating for them.
        if n > self.b.len() - self.at || n > MAX_NDIM {
            return Err("array too long");
        }
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            let tag = self.byte()?;
            let v = self
                .uint(tag)?
                .ok_or("array element is not a non-negative integer")?;
            items.push(Value::UInt(v));
        }
        Ok(Value::Array(items))
    }
}

/// The fields of a MsgPack map, in order (a repeated key is kept twice).
pub(crate) fn decode_map(bytes: &[u8]) -> Result<Vec<(String, Value)>, &'static str> {
    let mut c = Cursor { b: bytes, at: 0 };
    let tag = c.byte()?;
    let n = match tag {
        0x80..=0x8f => (tag & 0x0f) as usize,
        0xde => c.be(2)? as usize,
        0xdf => c.be(4)? as usize,
        _ => return Err("schema is not a MsgPack map"),
    };
    if n > 16 {
        return Err("schema map has too many fields");
    }
    let mut fields = Vec::with_capacity(n);
    for _ in 0..n {
        let tag = c.byte()?;
        let key = c.string(tag)?.ok_or("schema key is not a string")?;
        fields.push((key, c.value()?));
    }
    if c.at != bytes.len() {
        return Err("trailing bytes after the schema map");
    }
    Ok(fields)
}
