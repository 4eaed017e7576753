//! The record schema in bytes 2056..4096 of `meta.zr`, in either of the two
//! encodings loaderx has written, and the [`Layout`] each one implies.
//!
//! * loaderx 2.8 (the current release, [`Layout::Loaderx28`], the default):
//!   UTF-8 JSON as Python's `json.dumps` writes it, `{"dtype": "int32",
//!   "item_shape": [12]}` for Dense and `{"dtype": "int32", "ndim": 2}` for
//!   Ragged. The dtype is NumPy's `dtype.name` from loaderx 2.8's table of
//!   twenty types ([`LOADERX28_DTYPES`]); a Ragged record's shape prefix is
//!   `ndim` little-endian **u32** dimensions.
//! * loaderx 2.3 ([`Layout::Loaderx23`]): a MsgPack map as Python's
//!   `msgpack.dumps` writes it, `{"dtype": "<i4", "ndim": 1, "item_shape":
//!   [12]}` (Ragged without `item_shape`); the dtype is NumPy's `dtype.str`;
//!   a Ragged record's shape prefix is `ndim` little-endian **u64**
//!   dimensions.
//!
//! Everything else in a store (header fields, tails, RecordLocs, Dense
//! shards, zstd frames, `dict.zr`) is byte-identical between the two
//! releases. loaderx 2.8 cannot open a 2.3 store and loaderx 2.3 cannot open
//! a 2.8 store; zt reads both (the encoding is told from the first schema
//! byte) and writes either.

use std::path::Path;

use crate::error::{Error, Result};
use crate::json;
use crate::layout::MAX_SCHEMA;
use crate::msgpack;

/// NumPy's dimension limit (numpy 2): ranks at or above it are refused.
pub const MAX_NDIM: usize = 64;

/// Which loaderx release's store format a store follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Layout {
    /// loaderx 2.8.x (2.8.19 is the reference): JSON schema, dtype names,
    /// u32 Ragged dimensions. What zt writes unless told otherwise.
    #[default]
    Loaderx28,
    /// loaderx 2.3.x (2.3.8 is the reference): MsgPack schema, `dtype.str`,
    /// u64 Ragged dimensions.
    Loaderx23,
}

impl Layout {
    /// The name zt's APIs use: `"loaderx-2.8"` or `"loaderx-2.3"`.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Loaderx28 => "loaderx-2.8",
            Layout::Loaderx23 => "loaderx-2.3",
        }
    }

    /// The layout for its [`Layout::name`].
    pub fn from_name(name: &str) -> Option<Layout> {
        match name {
            "loaderx-2.8" => Some(Layout::Loaderx28),
            "loaderx-2.3" => Some(Layout::Loaderx23),
            _ => None,
        }
    }

    /// Bytes per dimension in a Ragged record's shape prefix.
    pub fn dim_bytes(self) -> usize {
        match self {
            Layout::Loaderx28 => 4,
            Layout::Loaderx23 => 8,
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// loaderx 2.8's dtypes (`loaderx/dtypes.py`): NumPy's `dtype.name` and the
/// little-endian `dtype.str` of each. The ml_dtypes types are given as the
/// void of their size (`|V2`, `|V1`: what NumPy's array interface takes; their
/// own `dtype.str` varies between ml_dtypes releases), so only their name
/// says what they are.
pub const LOADERX28_DTYPES: [(&str, &str); 20] = [
    ("bool", "|b1"),
    ("int8", "|i1"),
    ("int16", "<i2"),
    ("int32", "<i4"),
    ("int64", "<i8"),
    ("uint8", "|u1"),
    ("uint16", "<u2"),
    ("uint32", "<u4"),
    ("uint64", "<u8"),
    ("float16", "<f2"),
    ("float32", "<f4"),
    ("float64", "<f8"),
    ("bfloat16", "|V2"),
    ("float8_e4m3fn", "|V1"),
    ("float8_e4m3fnuz", "|V1"),
    ("float8_e5m2", "|V1"),
    ("float8_e5m2fnuz", "|V1"),
    ("float8_e8m0fnu", "|V1"),
    ("complex64", "<c8"),
    ("complex128", "<c16"),
];

/// The `dtype.str` of a loaderx 2.8 dtype name.
fn typestr_of_name(name: &str) -> Option<&'static str> {
    LOADERX28_DTYPES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, t)| t)
}

/// The loaderx 2.8 name of a `dtype.str` (none for the void-typed ml_dtypes
/// types, whose `dtype.str` does not say which one they are).
fn name_of_typestr(typestr: &str) -> Option<&'static str> {
    if typestr.as_bytes().get(1) == Some(&b'V') {
        return None;
    }
    LOADERX28_DTYPES
        .iter()
        .find(|(_, t)| *t == typestr)
        .map(|&(n, _)| n)
}

/// Fixed-shape rows or free per-record shapes of a fixed rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Geometry {
    /// Every record is one row of `item_shape`.
    Dense {
        /// The shape of one record.
        item_shape: Vec<u64>,
    },
    /// Every record has `ndim` free dimensions, stored as a shape prefix
    /// ([`Layout::dim_bytes`] bytes each).
    Ragged {
        /// The rank of every record (>= 1).
        ndim: usize,
    },
}

/// A store's schema: the element type, the geometry and the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    /// NumPy's `dtype.str` (`"<f4"`, `"|u1"`; `"|V2"` for bfloat16).
    pub dtype: String,
    /// The dtype as the schema spells it: loaderx 2.8's `dtype.name`
    /// (`"int32"`, `"bfloat16"`) or loaderx 2.3's `dtype.str` (`"<i4"`).
    /// `numpy.dtype(dtype_name)` is the store's dtype (with `ml_dtypes`
    /// imported for its types).
    pub dtype_name: String,
    /// Bytes per element, derived from `dtype`.
    pub itemsize: usize,
    /// Dense or Ragged.
    pub geometry: Geometry,
    /// The loaderx release whose format the store follows.
    pub layout: Layout,
}

/// The datetime units NumPy takes in `M8[...]` / `m8[...]`.
const DATETIME_UNITS: [&str; 13] = [
    "Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns", "ps", "fs", "as",
];

/// Bytes per element of a NumPy `dtype.str`, or `None` for what a store
/// cannot hold: object, structured-looking or zero-size types, and any
/// string `numpy.dtype` refuses (`"<f3"`, `"<i16"`, `"<M8[xyz]"`), so a
/// schema the Python side could not turn into a dtype is a schema error
/// here, not a `TypeError` there.
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
    let (digits, unit) = match rest.find('[') {
        Some(i) if matches!(kind, b'm' | b'M') && rest.ends_with(']') => {
            (&rest[..i], Some(&rest[i + 1..rest.len() - 1]))
        }
        Some(_) => return None,
        None => (rest, None),
    };
    if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) || digits.len() > 9 {
        return None;
    }
    let n: usize = digits.parse().ok()?;
    // The sizes NumPy has a type of each fixed-size kind for (`f16` is the
    // 128-bit long double of x86-64 and aarch64 Linux).
    let fixed: &[usize] = match kind {
        b'b' => &[1],
        b'i' | b'u' => &[1, 2, 4, 8],
        b'f' => &[2, 4, 8, 16],
        b'c' => &[8, 16, 32],
        b'm' | b'M' => &[8],
        _ => &[],
    };
    if !fixed.is_empty() && !fixed.contains(&n) {
        return None;
    }
    // A datetime unit: `[unit]` or `[Nunit]`, N at most 9 digits (NumPy's
    // multiplier is 32-bit; 9 digits always fit).
    if let Some(unit) = unit {
        let count = unit.bytes().take_while(u8::is_ascii_digit).count();
        let (multiple, name) = unit.split_at(count);
        if multiple.len() > 9 || !DATETIME_UNITS.contains(&name) {
            return None;
        }
    }
    let size = if kind == b'U' { n.checked_mul(4)? } else { n };
    (size > 0).then_some(size)
}

/// A value decoded from either schema encoding.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Str(String),
    UInt(u64),
    Array(Vec<Value>),
    /// Anything a schema field cannot be (negative, fractional, boolean,
    /// null, nested object, integer past u64): what it was, for messages.
    Other(&'static str),
}

/// The fields each geometry's schema holds in `layout`, sorted.
fn expected_fields(layout: Layout, dense: bool) -> &'static [&'static str] {
    match (layout, dense) {
        (Layout::Loaderx28, true) => &["dtype", "item_shape"],
        (Layout::Loaderx28, false) => &["dtype", "ndim"],
        (Layout::Loaderx23, true) => &["dtype", "item_shape", "ndim"],
        (Layout::Loaderx23, false) => &["dtype", "ndim"],
    }
}

impl Schema {
    /// A Dense schema in the default layout (loaderx 2.8). `dtype` is a
    /// NumPy `dtype.str` (`"<i4"`) or a loaderx 2.8 name (`"int32"`).
    pub fn dense(dtype: &str, item_shape: &[u64]) -> Result<Schema> {
        Self::new(
            Layout::default(),
            dtype,
            Geometry::Dense {
                item_shape: item_shape.to_vec(),
            },
        )
    }

    /// A Ragged schema in the default layout (loaderx 2.8).
    pub fn ragged(dtype: &str, ndim: usize) -> Result<Schema> {
        Self::new(Layout::default(), dtype, Geometry::Ragged { ndim })
    }

    /// A schema in `layout`. `dtype` is a NumPy `dtype.str` or a loaderx 2.8
    /// dtype name; it is written the way that layout's loaderx writes it.
    /// A loaderx 2.8 store holds only the twenty native-order types of
    /// [`LOADERX28_DTYPES`] ([`Error::DtypeNotInLayout`] otherwise: a
    /// loaderx 2.3 store holds any fixed-size NumPy type).
    pub fn new(layout: Layout, dtype: &str, geometry: Geometry) -> Result<Schema> {
        let (typestr, name) = match (layout, typestr_of_name(dtype)) {
            (Layout::Loaderx28, Some(t)) => (t.to_string(), dtype.to_string()),
            (Layout::Loaderx28, None) => match name_of_typestr(dtype) {
                Some(n) => (dtype.to_string(), n.to_string()),
                None => {
                    return Err(Error::DtypeNotInLayout {
                        dtype: dtype.to_string(),
                        layout,
                    })
                }
            },
            (Layout::Loaderx23, Some(t)) => (t.to_string(), t.to_string()),
            (Layout::Loaderx23, None) => (dtype.to_string(), dtype.to_string()),
        };
        Self::build(layout, typestr, name, geometry, Path::new(""))
    }

    /// Check and assemble; `path` names the store in errors (empty when
    /// building a schema for a writer).
    fn build(
        layout: Layout,
        typestr: String,
        dtype_name: String,
        geometry: Geometry,
        path: &Path,
    ) -> Result<Schema> {
        let bad = |reason: String| Error::Schema {
            path: path.to_path_buf(),
            reason,
        };
        let itemsize =
            itemsize(&typestr).ok_or_else(|| bad(format!("unsupported dtype {dtype_name:?}")))?;
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
            dtype: typestr,
            dtype_name,
            itemsize,
            geometry,
            layout,
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

    /// Bytes of a Ragged record's shape prefix (0 for Dense).
    pub fn shape_prefix_bytes(&self) -> usize {
        match self.geometry {
            Geometry::Dense { .. } => 0,
            Geometry::Ragged { ndim } => ndim * self.layout.dim_bytes(),
        }
    }

    /// The schema bytes as this layout's loaderx writes them.
    pub fn encode(&self) -> Vec<u8> {
        match self.layout {
            Layout::Loaderx28 => self.encode_json(),
            Layout::Loaderx23 => self.encode_msgpack(),
        }
    }

    /// `json.dumps(schema).encode("utf-8")` as loaderx 2.8 calls it:
    /// default separators `", "` and `": "`, keys in insertion order.
    fn encode_json(&self) -> Vec<u8> {
        let mut out = String::with_capacity(64);
        out.push_str("{\"dtype\": ");
        json::write_str(&mut out, &self.dtype_name);
        match &self.geometry {
            Geometry::Dense { item_shape } => {
                out.push_str(", \"item_shape\": [");
                for (i, d) in item_shape.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&d.to_string());
                }
                out.push_str("]}");
            }
            Geometry::Ragged { ndim } => {
                out.push_str(", \"ndim\": ");
                out.push_str(&ndim.to_string());
                out.push('}');
            }
        }
        out.into_bytes()
    }

    /// `msgpack.dumps(schema)` as loaderx 2.3 calls it: keys `dtype`,
    /// `ndim` (and `item_shape`), the smallest integer and string forms.
    fn encode_msgpack(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64);
        let dense = matches!(self.geometry, Geometry::Dense { .. });
        out.push(if dense { 0x83 } else { 0x82 });
        msgpack::write_str(&mut out, "dtype");
        msgpack::write_str(&mut out, &self.dtype_name);
        msgpack::write_str(&mut out, "ndim");
        msgpack::write_uint(&mut out, self.ndim() as u64);
        if let Geometry::Dense { item_shape } = &self.geometry {
            msgpack::write_str(&mut out, "item_shape");
            msgpack::write_array_len(&mut out, item_shape.len());
            for &d in item_shape {
                msgpack::write_uint(&mut out, d);
            }
        }
        out
    }

    /// The layout whose encoding `bytes` use: a MsgPack map starts with
    /// 0x80..=0x8f, 0xde or 0xdf; JSON text (loaderx 2.8) with `{` or
    /// whitespace, which MsgPack encodes as small integers, never a map.
    pub fn detect(bytes: &[u8]) -> Layout {
        match bytes.first() {
            Some(0x80..=0x8f | 0xde | 0xdf) => Layout::Loaderx23,
            _ => Layout::Loaderx28,
        }
    }

    /// Decode a schema in either encoding (told apart by
    /// [`Schema::detect`]), requiring exactly the fields of its geometry as
    /// the matching loaderx does: `dense` says which the caller expects.
    pub fn decode(bytes: &[u8], dense: bool, path: &Path) -> Result<Schema> {
        let layout = Self::detect(bytes);
        let syntax = |reason| Error::SchemaSyntax {
            path: path.to_path_buf(),
            layout,
            reason,
        };
        let mut fields = match layout {
            Layout::Loaderx28 => json::decode_object(bytes).map_err(syntax)?,
            Layout::Loaderx23 => {
                let fields = msgpack::decode_map(bytes).map_err(syntax)?;
                // loaderx 2.3's reader refuses a repeated key too.
                let mut names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
                names.sort_unstable();
                names.dedup();
                if names.len() != fields.len() {
                    return Err(Self::fields_error(layout, dense, path, &fields));
                }
                fields
            }
        };
        // json.loads keeps the last of a repeated key.
        let mut seen = std::collections::HashSet::new();
        fields.reverse();
        fields.retain(|(k, _)| seen.insert(k.clone()));
        fields.reverse();
        let expected = expected_fields(layout, dense);
        let mut names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        names.sort_unstable();
        if names != expected {
            return Err(Self::fields_error(layout, dense, path, &fields));
        }
        let bad = |reason: String| Error::Schema {
            path: path.to_path_buf(),
            reason,
        };
        let get = |name: &str| &fields.iter().find(|(k, _)| k == name).expect("checked").1;
        let Value::Str(dtype) = get("dtype") else {
            return Err(bad("schema dtype must be a string".into()));
        };
        let typestr = match layout {
            // loaderx 2.8 reads its own names and, failing that, any string
            // NumPy takes as a dtype (2.3's `dtype.str` included).
            Layout::Loaderx28 => typestr_of_name(dtype)
                .map(str::to_string)
                .unwrap_or_else(|| dtype.clone()),
            Layout::Loaderx23 => dtype.clone(),
        };
        let uint = |name: &str, v: &Value| match v {
            Value::UInt(n) => Ok(*n),
            Value::Other(what) => Err(bad(format!("{name} must be an integer, not {what}"))),
            _ => Err(bad(format!("{name} must be an integer"))),
        };
        let geometry = if dense {
            let Value::Array(items) = get("item_shape") else {
                return Err(bad("item_shape must be an iterable of integers".into()));
            };
            let item_shape = items
                .iter()
                .map(|v| uint("item_shape dimensions", v))
                .collect::<Result<Vec<u64>>>()?;
            if layout == Layout::Loaderx23 && uint("ndim", get("ndim"))? != item_shape.len() as u64
            {
                return Err(bad("dense schema ndim does not match item_shape".into()));
            }
            Geometry::Dense { item_shape }
        } else {
            let ndim = uint("ndim", get("ndim"))?;
            Geometry::Ragged {
                ndim: usize::try_from(ndim).unwrap_or(usize::MAX),
            }
        };
        Self::build(layout, typestr, dtype.clone(), geometry, path)
    }

    fn fields_error(layout: Layout, dense: bool, path: &Path, fields: &[(String, Value)]) -> Error {
        Error::SchemaFields {
            path: path.to_path_buf(),
            layout,
            geometry: if dense { "dense" } else { "ragged" },
            expected: expected_fields(layout, dense),
            found: fields.iter().map(|(k, _)| k.clone()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn encodes_like_python_msgpack() {
        // msgpack.dumps({"dtype": "<f4", "ndim": 3, "item_shape": [3, 224, 70000]})
        let want = "83a56474797065a33c6634a46e64696d03aa6974656d5f73686170659303cce0ce00011170";
        let s = Schema::new(
            Layout::Loaderx23,
            "<f4",
            Geometry::Dense {
                item_shape: vec![3, 224, 70000],
            },
        )
        .unwrap();
        assert_eq!(hex(&s.encode()), want);
        let back = Schema::decode(&s.encode(), true, Path::new("")).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn encodes_like_python_json() {
        // json.dumps({"dtype": np.dtype(np.float32).name, "item_shape": [3, 224, 70000]})
        let s = Schema::dense("<f4", &[3, 224, 70000]).unwrap();
        assert_eq!(
            s.encode(),
            br#"{"dtype": "float32", "item_shape": [3, 224, 70000]}"#
        );
        assert_eq!(Schema::decode(&s.encode(), true, Path::new("")).unwrap(), s);
        let s = Schema::dense("bfloat16", &[]).unwrap();
        assert_eq!(s.encode(), br#"{"dtype": "bfloat16", "item_shape": []}"#);
        assert_eq!((s.dtype.as_str(), s.itemsize), ("|V2", 2));
        let s = Schema::ragged("|u1", 3).unwrap();
        assert_eq!(s.encode(), br#"{"dtype": "uint8", "ndim": 3}"#);
        assert_eq!(s.shape_prefix_bytes(), 12);
        assert_eq!(
            Schema::decode(&s.encode(), false, Path::new("")).unwrap(),
            s
        );
    }

    #[test]
    fn layouts_hold_their_own_dtypes() {
        // loaderx 2.8 refuses non-native, string and other types; 2.3 keeps them.
        for dtype in [">i4", "<U5", "|S3", "<M8[ns]", "<f16", "|V4"] {
            assert!(
                matches!(
                    Schema::dense(dtype, &[2]),
                    Err(Error::DtypeNotInLayout { .. })
                ),
                "{dtype}"
            );
            let s = Schema::new(
                Layout::Loaderx23,
                dtype,
                Geometry::Dense {
                    item_shape: vec![2],
                },
            )
            .unwrap();
            assert_eq!(s.dtype_name, dtype);
        }
        // A loaderx 2.8 name in a 2.3 store is written as its dtype.str.
        let s = Schema::new(Layout::Loaderx23, "int64", Geometry::Ragged { ndim: 1 }).unwrap();
        assert_eq!((s.dtype_name.as_str(), s.shape_prefix_bytes()), ("<i8", 8));
    }

    #[test]
    fn json_schemas_decode_like_json_loads() {
        let p = Path::new("");
        // Whitespace, key order, escapes and a repeated key (the last wins).
        let s = Schema::decode(
            b" {\n\"item_shape\" : [ 2,3 ] ,\"dtype\":\"\\u0069nt32\", \"dtype\": \"int16\"}\t",
            true,
            p,
        )
        .unwrap();
        assert_eq!(
            (s.dtype.as_str(), s.row_bytes(), s.layout),
            ("<i2", Some(12), Layout::Loaderx28)
        );
        // A legacy dtype.str in a JSON schema (loaderx 2.8 accepts it).
        let s = Schema::decode(br#"{"dtype": "<f8", "ndim": 1}"#, false, p).unwrap();
        assert_eq!((s.dtype_name.as_str(), s.itemsize), ("<f8", 8));
        for (bytes, dense) in [
            (
                &br#"{"dtype": "int32", "ndim": 1, "item_shape": [1]}"#[..],
                true,
            ),
            (br#"{"dtype": "int32", "item_shape": [1]}"#, false),
            (br#"{"dtype": "int32"}"#, false),
        ] {
            let e = Schema::decode(bytes, dense, p).unwrap_err();
            assert!(matches!(e, Error::SchemaFields { .. }), "{e:?}");
        }
        for bytes in [
            &br#"{"dtype": 5, "ndim": 1}"#[..],
            br#"{"dtype": "int32", "ndim": 1.0}"#,
            br#"{"dtype": "int32", "ndim": true}"#,
            br#"{"dtype": "int32", "ndim": -1}"#,
            br#"{"dtype": "int32", "ndim": 0}"#,
            br#"{"dtype": "int32", "ndim": 99999999999999999999999}"#,
            br#"{"dtype": "object", "ndim": 1}"#,
        ] {
            let e = Schema::decode(bytes, false, p).unwrap_err();
            assert!(matches!(e, Error::Schema { .. }), "{e:?}");
        }
        for bytes in [
            &b""[..],
            b"{",
            b"[1]",
            br#"{"dtype": "int32", "ndim": 1} x"#,
            br#"{"dtype": "int32", "ndim": 01}"#,
            br#"{'dtype': 'int32'}"#,
            b"{\"dtype\": \"\xff\", \"ndim\": 1}",
        ] {
            let e = Schema::decode(bytes, false, p).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::SchemaSyntax {
                        layout: Layout::Loaderx28,
                        ..
                    }
                ),
                "{e:?}"
            );
        }
    }

    /// Every truncation and every single-byte change of valid schemas in
    /// both encodings decodes or fails with a schema error; none panics.
    #[test]
    fn damaged_schemas_fail_cleanly() {
        let p = Path::new("");
        let dense = Geometry::Dense {
            item_shape: vec![3, 224, 70000],
        };
        let schemas = [
            Schema::new(Layout::Loaderx28, "bfloat16", dense.clone()).unwrap(),
            Schema::new(Layout::Loaderx23, "<f4", dense).unwrap(),
            Schema::ragged("int64", 2).unwrap(),
        ];
        for s in &schemas {
            let good = s.encode();
            let dense = matches!(s.geometry, Geometry::Dense { .. });
            let mut cases: Vec<Vec<u8>> = (0..good.len()).map(|n| good[..n].to_vec()).collect();
            for at in 0..good.len() {
                for byte in [
                    0x00, 0x22, 0x2c, 0x5b, 0x5c, 0x7b, 0x7d, 0x80, 0x93, 0xc1, 0xff,
                ] {
                    let mut bad = good.clone();
                    bad[at] = byte;
                    cases.push(bad);
                }
            }
            for bytes in cases {
                match Schema::decode(&bytes, dense, p) {
                    Ok(_)
                    | Err(
                        Error::Schema { .. }
                        | Error::SchemaSyntax { .. }
                        | Error::SchemaFields { .. },
                    ) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
        }
    }

    #[test]
    fn itemsizes() {
        assert_eq!(itemsize("<U5"), Some(20));
        assert_eq!(itemsize("|u1"), Some(1));
        assert_eq!(itemsize("<M8[ns]"), Some(8));
        assert_eq!(itemsize("|O"), None);
        assert_eq!(itemsize("|V0"), None);
        // What numpy 2.4's `np.dtype` takes (checked against it).
        for (typestr, size) in [
            ("|b1", 1),
            ("<i8", 8),
            (">u2", 2),
            ("<f2", 2),
            ("<f16", 16),
            ("<c32", 32),
            ("<m8", 8),
            ("<M8[10ns]", 8),
            ("<M8[999999999ns]", 8),
            ("<m8[Y]", 8),
            ("<M8[as]", 8),
            ("|S3", 3),
            ("|V7", 7),
        ] {
            assert_eq!(itemsize(typestr), Some(size), "{typestr}");
        }
        // And what it refuses with TypeError: sizes no type of the kind has,
        // datetime sizes and units it does not know.
        for typestr in [
            "<f3",
            "<f1",
            "<f12",
            "<i3",
            "<i16",
            "<u5",
            "|b2",
            "<c4",
            "<c12",
            "<M4",
            "<m16",
            "<M8[]",
            "<M8[xyz]",
            "<M8[2]",
            "<M8[B]",
            "<M8[1000000000000ns]",
        ] {
            assert_eq!(itemsize(typestr), None, "{typestr}");
        }
    }

    /// A schema naming a dtype NumPy refuses (`"<f3"`) fails to decode as
    /// a schema error in both encodings: the Python layer would otherwise
    /// open the store and raise `TypeError` from `numpy.dtype`.
    #[test]
    fn dtypes_numpy_refuses_are_schema_errors() {
        let p = Path::new("");
        let mut msgpack =
            hex_decode("83a56474797065a33c6632a46e64696d01aa6974656d5f736861706591cc80");
        assert!(Schema::decode(&msgpack, true, p).is_ok());
        let at = msgpack.windows(3).position(|w| w == b"<f2").unwrap();
        msgpack[at + 2] = b'3';
        let e = Schema::decode(&msgpack, true, p).unwrap_err();
        assert!(matches!(e, Error::Schema { .. }), "{e:?}");
        let e = Schema::decode(br#"{"dtype": "<f3", "ndim": 1}"#, false, p).unwrap_err();
        assert!(matches!(e, Error::Schema { .. }), "{e:?}");
        let e = Schema::new(Layout::Loaderx23, "<i3", Geometry::Ragged { ndim: 1 }).unwrap_err();
        assert!(matches!(e, Error::Schema { .. }), "{e:?}");
    }

    fn hex_decode(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }
}
