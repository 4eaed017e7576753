//! The tensor model every plugin produces: named objects made of parts,
//! each part a dtype, a shape and a payload that says where its bytes are.
//!
//! A plugin's `open` builds a [`Catalog`] from metadata only; no tensor
//! bytes are touched until a caller asks for them.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use crate::digests::Digests;
use crate::dtype::DType;
use crate::error::Result;
use crate::limits::Limits;
use crate::rule::Rule;
use crate::store::Store;

/// A metadata value: the union of what the formats can say (JSON in
/// safetensors, typed KV in GGUF, CBOR in `.zt`, HDF5 attributes).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// No value.
    Null,
    /// A boolean.
    Bool(bool),
    /// A signed integer.
    Int(i64),
    /// An unsigned integer too large for `i64`.
    UInt(u64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// Raw bytes.
    Bytes(Vec<u8>),
    /// A list.
    List(Vec<Value>),
    /// A map with string keys, in file order.
    Map(Vec<(String, Value)>),
}

impl Value {
    /// A JSON value as an attribute value (integers as `Int`, or `UInt`
    /// past `i64`; other numbers as `Float`).
    pub fn from_json(v: &serde_json::Value) -> Value {
        use serde_json::Value as J;
        match v {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => n
                .as_i64()
                .map(Value::Int)
                .or_else(|| n.as_u64().map(Value::UInt))
                .unwrap_or_else(|| Value::Float(n.as_f64().unwrap_or(f64::NAN))),
            J::String(s) => Value::Str(s.clone()),
            J::Array(a) => Value::List(a.iter().map(Value::from_json).collect()),
            J::Object(o) => Value::Map(
                o.iter()
                    .map(|(k, v)| (k.clone(), Value::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Convert to JSON (bytes become a list of numbers).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value as J;
        match self {
            Value::Null => J::Null,
            Value::Bool(b) => J::Bool(*b),
            Value::Int(i) => J::from(*i),
            Value::UInt(u) => J::from(*u),
            Value::Float(f) => serde_json::Number::from_f64(*f)
                .map(J::Number)
                .unwrap_or(J::Null),
            Value::Str(s) => J::String(s.clone()),
            Value::Bytes(b) => J::Array(b.iter().map(|&x| J::from(x)).collect()),
            Value::List(l) => J::Array(l.iter().map(Value::to_json).collect()),
            Value::Map(m) => J::Object(m.iter().map(|(k, v)| (k.clone(), v.to_json())).collect()),
        }
    }
}

/// Attributes of a file or an object, in file order.
pub type Attributes = Vec<(String, Value)>;

/// Something that can produce a part's bytes when they are not a plain
/// little-endian range of a file: compressed zip entries, big-endian data,
/// typed protobuf fields, chunked HDF5 datasets.
///
/// Implementations hold the `Arc<Store>`s they read from, so a decoder stays
/// valid however sources are merged.
pub trait Decode: Send + Sync + fmt::Debug {
    /// Produce exactly `decoded_len` bytes, never allocating more than
    /// `limits` allow.
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>>;
    /// A short description for listings (`"deflate"`, `"byteswap"`).
    fn describe(&self) -> &'static str;
    /// Bytes `[start, start + len)` of the decoded stream. The default
    /// decodes everything and slices; decoders that can seek (zstd
    /// seekable frames) decode only what the range needs. The caller has
    /// checked the range against the decoded length.
    fn decode_range(&self, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
        let all = self.decode(limits)?;
        let end = start.saturating_add(len).min(all.len() as u64) as usize;
        Ok(all[(start as usize).min(end)..end].to_vec())
    }
    /// Whether [`Decode::decode_range`] costs about the range rather than
    /// the whole stream, so a caller may take the stream a piece at a time
    /// (a cast does, holding one piece of the original instead of all of
    /// it). The default, which decodes everything per range, does not.
    fn seeks(&self) -> bool {
        false
    }
}

/// Big-endian scalars at a file range, swapped to little-endian on read.
/// Shared by every format that can store big-endian data (npy, GGUF, HDF5).
#[derive(Debug)]
pub struct ByteSwapped {
    /// The file.
    pub store: Arc<Store>,
    /// Absolute byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Swap unit: the scalar width (a complex number swaps each half).
    pub width: usize,
}

impl Decode for ByteSwapped {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let ctx = self.store.ctx().at(self.offset);
        limits.check_decoded(&ctx, self.len)?;
        let read = self.store.read(self.offset, self.len)?;
        let mut out = crate::buffer::try_own(&ctx, "a byte-swapped copy", read)?;
        crate::buffer::swap_units(&mut out, self.width);
        Ok(out)
    }

    fn describe(&self) -> &'static str {
        "byteswap"
    }

    /// Only the range's bytes: a range starting on a scalar boundary (as
    /// element runs do) swaps on its own.
    fn decode_range(&self, start: u64, len: u64, limits: &Limits) -> Result<Vec<u8>> {
        let width = self.width.max(1) as u64;
        if start % width != 0 || len % width != 0 {
            let all = self.decode(limits)?;
            let end = start.saturating_add(len).min(all.len() as u64) as usize;
            return Ok(all[(start as usize).min(end)..end].to_vec());
        }
        let ctx = self.store.ctx().at(self.offset + start);
        limits.check_decoded(&ctx, len)?;
        let read = self.store.read(self.offset + start, len)?;
        let mut out = crate::buffer::try_own(&ctx, "a byte-swapped copy", read)?;
        crate::buffer::swap_units(&mut out, self.width);
        Ok(out)
    }
}

/// Where a part's bytes are.
#[derive(Debug, Clone)]
pub enum Payload {
    /// Raw little-endian bytes `[offset, offset + len)` of a file.
    Stored {
        /// The file.
        store: Arc<Store>,
        /// Absolute byte offset in the file.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Bytes produced on demand.
    Decoded {
        /// How to produce them.
        decoder: Arc<dyn Decode>,
        /// How many bytes the decoder yields.
        decoded_len: u64,
    },
}

impl Payload {
    /// Length of the payload's bytes (decoded length for decoded payloads).
    pub fn len(&self) -> u64 {
        match self {
            Payload::Stored { len, .. } => *len,
            Payload::Decoded { decoded_len, .. } => *decoded_len,
        }
    }

    /// True if the payload holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One typed array inside an object. A dense tensor has a single part
/// named `"data"`; quantized and sparse layouts have several.
#[derive(Debug, Clone)]
pub struct Part {
    /// Part name (`"data"`, `"scales"`, `"values"`, ...).
    pub name: Cow<'static, str>,
    /// Element type.
    pub dtype: DType,
    /// Shape in elements, row-major order of dimensions.
    pub shape: Vec<u64>,
    /// Element strides over the payload bytes; `None` means C-contiguous.
    /// Strides are non-negative; they describe how the stored bytes map to
    /// the logical array (Fortran order, PyTorch views).
    pub strides: Option<Vec<i64>>,
    /// Where the bytes are.
    pub payload: Payload,
}

/// A named tensor: a shape, a layout that says how its parts combine, the
/// parts, and attributes. The default, an empty object, allocates nothing:
/// it takes an object's place when the object is moved out.
#[derive(Debug, Clone, Default)]
pub struct Object {
    /// Tensor name.
    pub name: String,
    /// Logical shape.
    pub shape: Vec<u64>,
    /// `"dense"` or a profile id (`"gguf.q4_0/1"`, `"zt.sparse_csr/1"`).
    pub layout: Cow<'static, str>,
    /// The parts, in file order.
    pub parts: Vec<Part>,
    /// Per-object attributes.
    pub attributes: Attributes,
}

impl Object {
    /// A dense object with one part `"data"`.
    pub fn dense(
        name: impl Into<String>,
        dtype: DType,
        shape: Vec<u64>,
        payload: Payload,
    ) -> Object {
        Object {
            name: name.into(),
            shape: shape.clone(),
            layout: "dense".into(),
            parts: vec![Part {
                name: "data".into(),
                dtype,
                shape,
                strides: None,
                payload,
            }],
            attributes: Vec::new(),
        }
    }
}

/// What one plugin found in one file: the objects and file-level attributes.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Objects, listed in this order unless `order` gives another.
    pub objects: Vec<Object>,
    /// The order to list `objects` in, as indexes into it, when that is
    /// not their own order: a plugin that lists by name (the `.zt`
    /// container) need not move its objects into name order. Every other
    /// index in the catalog (`digests`, `checks`) is into `objects`.
    pub order: Option<Vec<usize>>,
    /// The plugin has made sure no two objects share a name (the `.zt`
    /// container: its manifest's keys strictly ascend), so the source
    /// indexes the names at the first lookup by name, not at open.
    pub names_unique: bool,
    /// File-level attributes (safetensors `__metadata__`, GGUF KV, ...).
    pub attributes: Attributes,
    /// Extra stores the plugin opened besides the primary one (external
    /// data files, shards), so the source lists them as its files.
    pub extra_stores: Vec<Arc<Store>>,
    /// Digests the format stores, by (object index, part index) into
    /// `objects`: what `PartRef::verify` checks and `Caps::verify`
    /// reports; a mismatch cites the rule recorded with each (the
    /// format's: the `.zt` container's `zt.Digest`).
    pub digests: Digests,
    /// Checksums the format keeps over an object's stored bytes (a zip
    /// member's CRC-32), as `(object index, check)`: run once, at the first
    /// read of any of the object's parts (so open stays metadata-only), and
    /// every later read of a failed object fails too.
    pub checks: Vec<(usize, Arc<dyn Check>)>,
}

/// A checksum over stored bytes, run lazily by the source (see
/// [`Catalog::checks`]).
pub trait Check: fmt::Debug + Send + Sync {
    /// `Err` when the bytes do not match (or cannot be read): the plugin's
    /// rule and what it found, which the source reports as
    /// [`crate::Error::Integrity`] naming the part.
    fn check(&self) -> std::result::Result<(), CheckFailed>;

    /// Whether reads run the check (else only `verify` does): a check that
    /// would fetch the bytes a second time over the network can opt out.
    fn on_read(&self) -> bool {
        true
    }

    /// The check as the CRC-32 of one range of the object's store, where
    /// it is one (a zip member's): a copy of that range can then hash the
    /// bytes as it copies them instead of reading them again. A match
    /// passes the check; a mismatch runs [`Check::check`], whose outcome
    /// (and message) stands.
    fn crc32(&self) -> Option<Crc32Range> {
        None
    }
}

/// The range of a store a CRC-32 check covers, and the CRC-32 (IEEE, as
/// zip records it) its bytes must have (see [`Check::crc32`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc32Range {
    /// Where the range starts.
    pub offset: u64,
    /// Its length.
    pub len: u64,
    /// The CRC-32 of its bytes.
    pub crc: u32,
}

/// Why a [`Check`] failed: the rule it cites (the plugin's, such as
/// `npz.Crc`) and what it found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckFailed {
    /// The check that failed.
    pub rule: Rule,
    /// What it found.
    pub reason: String,
}

/// A registered digest algorithm (zTensor §3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestAlgorithm {
    /// XXH3-64, seed 0.
    Xxh3,
    /// SHA-256.
    Sha256,
}

impl DigestAlgorithm {
    /// The algorithm's name in a digest string.
    pub fn name(self) -> &'static str {
        match self {
            DigestAlgorithm::Xxh3 => "xxh3",
            DigestAlgorithm::Sha256 => "sha256",
        }
    }

    /// Digest `bytes` in one call.
    pub fn digest(self, bytes: &[u8]) -> Digest {
        match self {
            DigestAlgorithm::Xxh3 => Digest::Xxh3(xxhash_rust::xxh3::xxh3_64(bytes)),
            DigestAlgorithm::Sha256 => {
                use sha2::Digest as _;
                Digest::Sha256(sha2::Sha256::digest(bytes).into())
            }
        }
    }
}

/// A content digest over a part's decoded bytes (or a whole file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Digest {
    /// XXH3-64.
    Xxh3(u64),
    /// SHA-256.
    Sha256([u8; 32]),
}

impl Digest {
    /// Parse `"xxh3:<16 hex>"` or `"sha256:<64 hex>"` (lowercase).
    /// `Err(None)` for an algorithm zt does not know, `Err(Some(reason))`
    /// for a malformed value of a known one.
    pub fn parse(s: &str) -> std::result::Result<Digest, Option<&'static str>> {
        let (algo, hex) = s.split_once(':').ok_or(Some("no ':'"))?;
        let lower = hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        match algo {
            "xxh3" if hex.len() == 16 && lower => u64::from_str_radix(hex, 16)
                .map(Digest::Xxh3)
                .map_err(|_| Some("bad hex")),
            "xxh3" => Err(Some("xxh3 takes 16 lowercase hex digits")),
            "sha256" if hex.len() == 64 && lower => {
                let mut out = [0u8; 32];
                for (i, o) in out.iter_mut().enumerate() {
                    *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                        .map_err(|_| Some("bad hex"))?;
                }
                Ok(Digest::Sha256(out))
            }
            "sha256" => Err(Some("sha256 takes 64 lowercase hex digits")),
            _ => Err(None),
        }
    }

    /// The algorithm.
    pub fn algorithm(&self) -> DigestAlgorithm {
        match self {
            Digest::Xxh3(_) => DigestAlgorithm::Xxh3,
            Digest::Sha256(_) => DigestAlgorithm::Sha256,
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Digest::Xxh3(v) => write!(f, "xxh3:{v:016x}"),
            Digest::Sha256(b) => {
                f.write_str("sha256:")?;
                b.iter().try_for_each(|x| write!(f, "{x:02x}"))
            }
        }
    }
}
