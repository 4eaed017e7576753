//! The record schema: loaderx's MsgPack map `{"dtype": str, "ndim": int}`
//! plus `"item_shape": [int, ...]` for Dense, encoded byte for byte as
//! Python's `msgpack.dumps` does (keys in that order, the smallest integer
//! and string forms), and decoded by a small strict reader that accepts
//! only what a schema can hold.

use std::path::Path;

use crate::error::{Error, Result};
use crate::layout::MAX_SCHEMA;

/// NumPy's dimension limit (numpy 2): ranks at or above it are refused.
pub const MAX_NDIM: usize = 64;

/// Fixed-shape rows or free per-record shapes of a fixed rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Geometry {
    /// Every record is one row of `item_shape`.
    Dense {
        /// The shape of one record.
        item_shape: Vec<u64>,
    },
    /// Every record has `ndim` free dimensions, stored as a u64 prefix.
    Ragged {
        /// The rank of every record (>= 1).
        ndim: usize,
    },
}

/// A store's schema: the element type and the geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// NumPy's `dtype.str` (`"<f4"`, `"|u1"`, ...).
    pub dtype: String,
    /// Bytes per element, derived from `dtype`.
    pub itemsize: usize,
    /// Dense or Ragged.
    pub geometry: Geometry,
}

/// Bytes per element of a NumPy `dtype.str`, or `None` for what a store
/// cannot hold: object, structured-looking or zero-size types.
pub fn itemsize(dtype: &str) -> Option<usize> {
    let b = dtype.as_bytes();
    if b.len() < 3 || !matches!(b[0], b'<' | b'>' | b'|' | b'=') {
        return None;
    }
    let kind = b[1];
    if !b"biufcmMSUV".contains(&kind) {
        return None;
    }
    let rest = &dtype[2..];
    let digits = match rest.find('[') {
        Some(i) if matches!(kind, b'm' | b'M') && rest.ends_with(']') => &rest[..i],
        Some(_) => return None,
        None => rest,
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) || digits.len() > 9 {
        return None;
    }
    let n: usize = digits.parse().ok()?;
    let size = if kind == b'U' { n.checked_mul(4)? } else { n };
    (size > 0).then_some(size)
}

impl Schema {
    /// A Dense schema.
    pub fn dense(dtype: &str, item_shape: &[u64]) -> Result<Schema> {
        Self::new(
            dtype,
            Geometry::Dense {
                item_shape: item_shape.to_vec(),
            },
        )
    }

    /// A Ragged schema.
    pub fn ragged(dtype: &str, ndim: usize) -> Result<Schema> {
        Self::new(dtype, Geometry::Ragged { ndim })
    }

    fn new(dtype: &str, geometry: Geometry) -> Result<Schema> {
        let bad = |reason: String| Error::Schema {
            path: Default::default(),
            reason,
        };
        let itemsize =
            itemsize(dtype).ok_or_else(|| bad(format!("unsupported dtype {dtype:?}")))?;
        match &geometry {
            Geometry::Dense { item_shape } if item_shape.len() >= MAX_NDIM => {
                return Err(bad(format!("item_shape rank must be below {MAX_NDIM}")))
            }
            Geometry::Ragged { ndim } if *ndim == 0 || *ndim > MAX_NDIM => {
                return Err(bad(format!("ragged ndim must be in 1..={MAX_NDIM}")))
            }
            _ => {}
        }
        let schema = Schema {
            dtype: dtype.to_string(),
            itemsize,
            geometry,
        };
        if let Geometry::Dense { .. } = schema.geometry {
            let row = schema.row_bytes();
            if row.is_none_or(|r| r == 0 || r > crate::layout::MAX_RECORD) {
                return Err(bad("dense record width is outside 1..=2^31 bytes".into()));
            }
        }
        if schema.encode().len() > MAX_SCHEMA {
            return Err(bad(format!(
                "encoded schema exceeds the {MAX_SCHEMA} byte metadata limit"
            )));
        }
        Ok(schema)
    }

    /// The rank of a record.
    pub fn ndim(&self) -> usize {
        match &self.geometry {
            Geometry::Dense { item_shape } => item_shape.len(),
            Geometry::Ragged { ndim } => *ndim,
        }
    }

    /// Bytes of one Dense row (`None` for Ragged or on overflow).
    pub fn row_bytes(&self) -> Option<u64> {
        match &self.geometry {
            Geometry::Dense { item_shape } => item_shape
                .iter()
                .try_fold(self.itemsize as u64, |acc, &d| acc.checked_mul(d)),
            Geometry::Ragged { .. } => None,
        }
    }

    /// Encode as `msgpack.dumps` would.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        let dense = matches!(self.geometry, Geometry::Dense { .. });
        out.push(if dense { 0x83 } else { 0x82 });
        write_str(&mut out, "dtype");
        write_str(&mut out, &self.dtype);
        write_str(&mut out, "ndim");
        write_uint(&mut out, self.ndim() as u64);
        if let Geometry::Dense { item_shape } = &self.geometry {
            write_str(&mut out, "item_shape");
            write_array_len(&mut out, item_shape.len());
            for &d in item_shape {
                write_uint(&mut out, d);
            }
        }
        out
    }

    /// Decode a schema, requiring exactly the fields of its geometry (as
    /// loaderx's `_decode_schema`): `dense` says which the caller expects.
    pub fn decode(bytes: &[u8], dense: bool, path: &Path) -> Result<Schema> {
        let bad = |reason: String| Error::Schema {
            path: path.to_path_buf(),
            reason,
        };
        let fields = decode_map(bytes).map_err(|r| bad(r.to_string()))?;
        let expected: &[&str] = if dense {
            &["dtype", "item_shape", "ndim"]
        } else {
            &["dtype", "ndim"]
        };
        let mut names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        if names != expected || names.len() != fields.len() {
            let geometry = if dense { "dense" } else { "ragged" };
            return Err(bad(format!(
                "invalid {geometry} schema fields, expected {expected:?}"
            )));
        }
        let get = |name: &str| &fields.iter().find(|(k, _)| k == name).expect("checked").1;
        let Value::Str(dtype) = get("dtype") else {
            return Err(bad("schema dtype must be a string".into()));
        };
        let Value::UInt(ndim) = *get("ndim") else {
            return Err(bad("ndim must be an integer".into()));
        };
        let schema = if dense {
            let Value::Array(item_shape) = get("item_shape") else {
                return Err(bad("item_shape must be an iterable of integers".into()));
            };
            if item_shape.len() as u64 != ndim {
                return Err(bad("dense schema ndim does not match item_shape".into()));
            }
            Schema::dense(dtype, item_shape)
        } else {
            let ndim = usize::try_from(ndim).unwrap_or(usize::MAX);
            Schema::ragged(dtype, ndim)
        };
        schema.map_err(|e| match e {
            Error::Schema { reason, .. } => bad(reason),
            other => other,
        })
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
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

fn write_uint(out: &mut Vec<u8>, v: u64) {
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

fn write_array_len(out: &mut Vec<u8>, n: usize) {
    if n < 16 {
        out.push(0x90 | n as u8);
    } else {
        out.push(0xdc);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    }
}

/// A schema value: the only MsgPack shapes a schema uses.
enum Value {
    Str(String),
    UInt(u64),
    Array(Vec<u64>),
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
            items.push(
                self.uint(tag)?
                    .ok_or("array element is not a non-negative integer")?,
            );
        }
        Ok(Value::Array(items))
    }
}

fn decode_map(bytes: &[u8]) -> Result<Vec<(String, Value)>, &'static str> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_python_msgpack() {
        // msgpack.dumps({"dtype": "<f4", "ndim": 3, "item_shape": [3, 224, 70000]})
        let want = "83a56474797065a33c6634a46e64696d03aa6974656d5f73686170659303cce0ce00011170";
        let s = Schema::dense("<f4", &[3, 224, 70000]).unwrap();
        let hex: String = s.encode().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, want);
        let back = Schema::decode(&s.encode(), true, Path::new("")).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn itemsizes() {
        assert_eq!(itemsize("<U5"), Some(20));
        assert_eq!(itemsize("|u1"), Some(1));
        assert_eq!(itemsize("<M8[ns]"), Some(8));
        assert_eq!(itemsize("|O"), None);
        assert_eq!(itemsize("|V0"), None);
    }
}
