//! A minimal protobuf wire-format reader over a borrowed buffer.
//!
//! Why our own and not generated code (prost, protobuf-codegen): generated
//! messages copy every `bytes` field into an owned buffer, so a `raw_data`
//! field would lose its place in the file. This reader hands back each
//! length-delimited field as a slice *and* its absolute file offset, so a
//! tensor's bytes become a zero-copy range of the mapping.
//!
//! Every varint is bounded to ten bytes, every length is checked against the
//! bytes that remain in the enclosing message before it is used, and the
//! callers bound nesting depth (see `Limits::depth`).

use crate::onnx::rules;
use zt_core::error::{Context, Error, Result};
use zt_core::Rule;

/// The value of one field, by wire type.
#[derive(Debug, Clone, Copy)]
pub enum Wire<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1 (little-endian 8 bytes).
    Fixed64(u64),
    /// Wire type 2: the bytes and their absolute offset in the file.
    Bytes(&'a [u8], u64),
    /// Wire type 5 (little-endian 4 bytes).
    Fixed32(u32),
}

impl Wire<'_> {
    /// The wire type in words, for messages: "a varint", "a fixed64",
    /// "length-delimited", "a fixed32".
    pub fn kind(&self) -> &'static str {
        match self {
            Wire::Varint(_) => "a varint",
            Wire::Fixed64(_) => "a fixed64",
            Wire::Bytes(..) => "length-delimited",
            Wire::Fixed32(_) => "a fixed32",
        }
    }
}

/// One field: its number and value, and the file offset of its tag (for
/// error messages).
#[derive(Debug, Clone, Copy)]
pub struct Field<'a> {
    /// Field number.
    pub number: u64,
    /// The value.
    pub value: Wire<'a>,
    /// File offset of the tag.
    pub at: u64,
}

/// Iterates the fields of one message.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// File offset of `buf[0]`.
    base: u64,
}

impl<'a> Reader<'a> {
    /// A reader over `buf`, which starts at file offset `base`.
    pub fn new(buf: &'a [u8], base: u64) -> Self {
        Reader { buf, pos: 0, base }
    }

    /// The file offset of the next byte to read.
    pub fn position(&self) -> u64 {
        self.offset()
    }

    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn truncated(&self, what: &'static str, needed: u64) -> Error {
        Error::Truncated {
            rule: Rule::TRUNCATED,
            ctx: Context::default().at(self.offset()),
            what,
            needed,
            available: (self.buf.len() - self.pos) as u64,
        }
    }

    /// Read one base-128 varint (at most ten bytes).
    pub fn varint(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&byte) = self.buf.get(self.pos + i) else {
                return Err(self.truncated("protobuf varint", i as u64 + 1));
            };
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.pos += i + 1;
                return Ok(value);
            }
        }
        Err(Error::header(
            Context::default().at(self.offset()),
            rules::PROTOBUF,
            "protobuf varint longer than ten bytes",
        ))
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        let available = (self.buf.len() - self.pos) as u64;
        if n > available {
            return Err(self.truncated(what, n));
        }
        let out = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    /// The next field, or `None` at the end of the message.
    pub fn next_field(&mut self) -> Result<Option<Field<'a>>> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let at = self.offset();
        let tag = self.varint()?;
        let number = tag >> 3;
        if number == 0 {
            return Err(Error::header(
                Context::default().at(at),
                rules::PROTOBUF,
                "protobuf field number 0",
            ));
        }
        let value = match tag & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                let b = self.take(8, "protobuf fixed64")?;
                Wire::Fixed64(u64::from_le_bytes(b.try_into().expect("8 bytes")))
            }
            2 => {
                let len = self.varint()?;
                let offset = self.offset();
                Wire::Bytes(self.take(len, "protobuf length-delimited field")?, offset)
            }
            5 => {
                let b = self.take(4, "protobuf fixed32")?;
                Wire::Fixed32(u32::from_le_bytes(b.try_into().expect("4 bytes")))
            }
            wire => {
                // Groups (3, 4) are deprecated and never used by ONNX; 6 and
                // 7 do not exist.
                return Err(Error::header(
                    Context::default().at(at),
                    rules::PROTOBUF,
                    format!("protobuf wire type {wire} in field {number}"),
                ));
            }
        };
        Ok(Some(Field { number, value, at }))
    }
}

impl<'a> Field<'a> {
    /// This field is of another wire type than `want`, under `rule` (a
    /// typed [`Mismatch`](zt_core::error::Mismatch)).
    pub fn wrong_wire_for(&self, rule: Rule, want: &str) -> Error {
        Error::mismatch(
            Context::default().at(self.at),
            rule,
            format!("protobuf field {}", self.number),
            self.value.kind(),
            want,
        )
    }

    fn wrong_wire(&self, want: &str) -> Error {
        self.wrong_wire_for(rules::PROTOBUF, want)
    }

    /// The value of a varint field.
    pub fn varint(&self) -> Result<u64> {
        match self.value {
            Wire::Varint(v) => Ok(v),
            _ => Err(self.wrong_wire("a varint")),
        }
    }

    /// The bytes of a length-delimited field and their file offset.
    pub fn bytes(&self) -> Result<(&'a [u8], u64)> {
        match self.value {
            Wire::Bytes(b, offset) => Ok((b, offset)),
            _ => Err(self.wrong_wire("length-delimited")),
        }
    }

    /// A reader over an embedded message.
    pub fn message(&self) -> Result<Reader<'a>> {
        let (b, offset) = self.bytes()?;
        Ok(Reader::new(b, offset))
    }

    /// A UTF-8 string field, at most `max` bytes.
    pub fn string(&self, max: u64) -> Result<String> {
        let (b, offset) = self.bytes()?;
        let ctx = Context::default().at(offset);
        zt_core::limits::Limits::check(&ctx, "string_bytes", b.len() as u64, max)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::header(ctx, rules::PROTOBUF, "protobuf string is not UTF-8"))
    }

    /// A string field decoded leniently (documentation, producer names):
    /// invalid UTF-8 is replaced rather than refused.
    pub fn lossy_string(&self, max: u64) -> Result<String> {
        let (b, offset) = self.bytes()?;
        let ctx = Context::default().at(offset);
        zt_core::limits::Limits::check(&ctx, "string_bytes", b.len() as u64, max)?;
        Ok(String::from_utf8_lossy(b).into_owned())
    }

    /// Call `f` for each element of a repeated varint field, packed (one
    /// length-delimited chunk) or not (one field per element).
    pub fn for_each_varint(&self, mut f: impl FnMut(u64) -> Result<()>) -> Result<()> {
        match self.value {
            Wire::Varint(v) => f(v),
            Wire::Bytes(b, offset) => {
                let mut r = Reader::new(b, offset);
                while r.pos < b.len() {
                    f(r.varint()?)?;
                }
                Ok(())
            }
            _ => Err(self.wrong_wire("a varint or packed varints")),
        }
    }
}

/// Number of varints in a packed chunk: one per byte without the
/// continuation bit. A chunk that ends inside a varint is truncated.
pub fn count_packed_varints(b: &[u8], offset: u64) -> Result<u64> {
    if b.last().is_some_and(|&last| last & 0x80 != 0) {
        return Err(Error::Truncated {
            rule: Rule::TRUNCATED,
            ctx: Context::default().at(offset + b.len() as u64),
            what: "protobuf varint",
            needed: 1,
            available: 0,
        });
    }
    Ok(b.iter().filter(|&&x| x & 0x80 == 0).count() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use zt_core::error::Mismatch;

    #[test]
    fn varints_and_fields() {
        // field 1 varint 300, field 2 bytes "hi", field 3 fixed32 7
        let buf = [0x08, 0xac, 0x02, 0x12, 2, b'h', b'i', 0x1d, 7, 0, 0, 0];
        let mut r = Reader::new(&buf, 100);
        let f = r.next_field().unwrap().unwrap();
        assert_eq!((f.number, f.varint().unwrap()), (1, 300));
        let f = r.next_field().unwrap().unwrap();
        assert_eq!(f.bytes().unwrap(), (&b"hi"[..], 105));
        let f = r.next_field().unwrap().unwrap();
        assert!(matches!(f.value, Wire::Fixed32(7)));
        assert!(r.next_field().unwrap().is_none());
    }

    #[test]
    fn a_field_of_another_wire_type_is_a_typed_mismatch() {
        // field 2 as bytes "hi", read as a varint.
        let mut r = Reader::new(&[0x12, 2, b'h', b'i'], 100);
        let e = r.next_field().unwrap().unwrap().varint().unwrap_err();
        let want = Mismatch::new("protobuf field 2", "length-delimited", "a varint");
        assert_eq!(e.as_mismatch(), Some(&want));
        assert_eq!(e.rule(), Some(rules::PROTOBUF));
        assert_eq!(
            e.to_string(),
            "offset 100: malformed header: protobuf field 2 is length-delimited, not a varint"
        );
    }

    #[test]
    fn hostile_lengths() {
        // A length of 5 with 2 bytes left.
        let mut r = Reader::new(&[0x12, 5, 1, 2], 0);
        assert!(matches!(r.next_field(), Err(Error::Truncated { .. })));
        // A varint that never ends.
        let mut r = Reader::new(&[0x08, 0xff, 0xff], 0);
        assert!(matches!(r.next_field(), Err(Error::Truncated { .. })));
        // Eleven continuation bytes.
        let mut r = Reader::new(&[0xff; 11], 0);
        assert!(matches!(r.varint(), Err(Error::Header { .. })));
        // A group.
        let mut r = Reader::new(&[0x0b], 0);
        assert!(matches!(r.next_field(), Err(Error::Header { .. })));
        assert_eq!(count_packed_varints(&[1, 0x80, 1], 0).unwrap(), 2);
        assert!(count_packed_varints(&[1, 0x80], 0).is_err());
    }
}
