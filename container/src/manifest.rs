//! The L1 manifest: parsing the deterministic-CBOR map into objects, parts
//! and shards, with the schema rules of §3 (names, shapes, blob arrays,
//! shard references, attribute values). Unknown keys are ignored at every
//! level, as the spec requires.

use crate::rules;
use smallvec::SmallVec;
use std::borrow::Cow;

use crate::cbor::{self, Cbor, CborError, DecodeLimits, KeyOrder, Pull, Token};
use zt_core::catalog::{Digest, Value};
use zt_core::dtype::{num_elements, DType};
use zt_core::error::{Context, Error, Result};

/// Longest name (object, part, attribute key), in bytes.
pub const MAX_NAME: usize = 1024;
/// Highest rank.
pub const MAX_RANK: usize = 64;
/// Longest shard name.
pub const MAX_SHARD_NAME: usize = 64;

/// A parsed root manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Objects in manifest (encoded-key) order.
    pub objects: Vec<ObjectDef>,
    /// The shard table, in manifest order.
    pub shards: Vec<ShardDef>,
    /// File attributes (a text-keyed map), if present.
    pub attributes: Option<Cbor>,
}

/// One object of the manifest (the default is an empty one, allocating
/// nothing, to take an object's place when it is moved out).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ObjectDef {
    /// Object name.
    pub name: String,
    /// Logical shape.
    pub shape: Vec<u64>,
    /// `"dense"` or a profile id.
    pub layout: Cow<'static, str>,
    /// Parts in manifest order.
    pub parts: Parts,
    /// Per-object attributes, if present.
    pub attributes: Option<Cbor>,
}

/// An object's parts, the first held inline: most objects have one, and a
/// list allocated for each of 50k objects, freed once the catalog is built,
/// left the heap in holes that every later allocation and free paid for.
pub type Parts = SmallVec<[PartDef; 1]>;

/// One part of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct PartDef {
    /// Part name.
    pub name: Cow<'static, str>,
    /// Storage type (one of the twelve primitives).
    pub dtype: DType,
    /// Logical type name, if any (`"bool"`, `"f4_e2m1"`, ...).
    pub logical: Option<Cow<'static, str>>,
    /// Blob offset.
    pub offset: u64,
    /// Blob length (encoded length for encoded parts).
    pub length: u64,
    /// Shard name; `None` is the containing file.
    pub shard: Option<String>,
    /// Encoding profile id; `None` is raw.
    pub encoding: Option<Cow<'static, str>>,
    /// Decoded length (present iff `encoding` is).
    pub decoded_length: Option<u64>,
    /// The digest as stored (`"xxh3:..."`), if any.
    pub digest: Option<StoredDigest>,
}

impl PartDef {
    /// Decoded size: the blob length when raw, else `decoded_length`.
    pub fn decoded_size(&self) -> u64 {
        self.decoded_length.unwrap_or(self.length)
    }

    /// The parsed digest, when the algorithm is a registered one.
    pub fn parsed_digest(&self) -> Option<Digest> {
        self.digest.as_ref().and_then(StoredDigest::known)
    }
}

/// A part's digest as the manifest stores it: parsed once, when the
/// manifest is checked, if its algorithm is a registered one (its text is
/// then exactly what `Display` writes back, lowercase hex of the
/// algorithm's length), else kept as text, accepted and left unverified.
/// At 50k parts a `String` each, parsed again for the catalog, was a
/// tenth of the open.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredDigest {
    /// `xxh3:` or `sha256:`.
    Known(Digest),
    /// `"<algorithm>:<lowercase hex>"` of an algorithm zt does not know.
    Other(String),
}

impl StoredDigest {
    /// Check `d`'s syntax (see [`check_digest_syntax`]) and keep it.
    pub fn parse(d: &str) -> std::result::Result<StoredDigest, &'static str> {
        // The writer's own digest, on every part it writes: read directly.
        if let Some(value) = d.strip_prefix("xxh3:").and_then(xxh3_value) {
            return Ok(StoredDigest::Known(Digest::Xxh3(value)));
        }
        let Some((algo, hex)) = d.split_once(':') else {
            return Err("no ':' between algorithm and value");
        };
        if algo.is_empty() || hex.is_empty() {
            return Err("empty algorithm or value");
        }
        // Each digit's value, checked and decoded in one pass (a part's
        // digest is parsed at every open).
        let mut digits = [0u8; 64];
        for (out, &b) in digits.iter_mut().zip(hex.as_bytes()) {
            *out = hex_value(b).ok_or("value is not lowercase hex")?;
        }
        if hex.len() > digits.len() && !hex.bytes().all(|b| hex_value(b).is_some()) {
            return Err("value is not lowercase hex");
        }
        // The registered algorithms at their exact lengths, from the digits
        // just decoded; anything else goes to `Digest::parse`, for its
        // refusals and for algorithms zt does not know.
        match (algo, hex.len()) {
            ("xxh3", 16) => Ok(StoredDigest::Known(Digest::Xxh3(
                digits[..16].iter().fold(0, |v, &x| v << 4 | u64::from(x)),
            ))),
            ("sha256", 64) => {
                let mut out = [0u8; 32];
                for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
                    *o = pair[0] << 4 | pair[1];
                }
                Ok(StoredDigest::Known(Digest::Sha256(out)))
            }
            _ => match Digest::parse(d) {
                Ok(known) => Ok(StoredDigest::Known(known)),
                Err(Some(why)) => Err(why),
                Err(None) => Ok(StoredDigest::Other(d.to_string())),
            },
        }
    }

    /// The digest, when zt can check it.
    pub fn known(&self) -> Option<Digest> {
        match self {
            StoredDigest::Known(d) => Some(*d),
            StoredDigest::Other(_) => None,
        }
    }
}

/// The value of an XXH3-64 digest's text, exactly 16 lowercase hex
/// digits; `None` for anything else.
/// Without a branch per digit: the digits of a hash are random, so a
/// branch on each was mispredicted often enough to make this 7% of a
/// 50k-tensor open.
fn xxh3_value(hex: &str) -> Option<u64> {
    let digits: &[u8; 16] = hex.as_bytes().try_into().ok()?;
    let (mut value, mut invalid) = (0u64, 0u8);
    for &b in digits {
        let v = HEX_VALUES[usize::from(b)];
        value = value << 4 | u64::from(v & 0x0f);
        invalid |= v;
    }
    (invalid & NOT_HEX == 0).then_some(value)
}

/// Marks a byte that is not a lowercase hex digit in [`HEX_VALUES`].
const NOT_HEX: u8 = 0x80;

/// Each byte's value as a lowercase hex digit, or [`NOT_HEX`].
const HEX_VALUES: [u8; 256] = {
    let mut t = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// The value of one lowercase hex digit, or `None` for any other byte.
fn hex_value(b: u8) -> Option<u8> {
    let v = HEX_VALUES[usize::from(b)];
    (v != NOT_HEX).then_some(v)
}

impl std::fmt::Display for StoredDigest {
    /// The text as stored.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoredDigest::Known(d) => d.fmt(f),
            StoredDigest::Other(text) => f.write_str(text),
        }
    }
}

/// One shard table entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardDef {
    /// The shard's label.
    pub name: String,
    /// Exact file size.
    pub size: u64,
    /// Whole-file digest string.
    pub digest: String,
}

/// Why a walk of the manifest stopped: the bytes break deterministic CBOR,
/// or they are CBOR that breaks the schema. Boxed, so the result every
/// step of the walk returns stays small.
enum Stop {
    Cbor(Box<CborError>),
    Schema(Box<Error>),
}

impl From<Box<CborError>> for Stop {
    fn from(e: Box<CborError>) -> Self {
        Stop::Cbor(e)
    }
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Schema(Box::new(e))
    }
}

type Walk<T> = std::result::Result<T, Stop>;

const LIMITS: DecodeLimits = DecodeLimits {
    depth: cbor::MAX_DEPTH,
};

/// What a walk of the manifest hands its objects to, in manifest order,
/// each as soon as it is parsed and schema-checked: a reader builds its
/// own catalog entry from it rather than keeping a list of [`ObjectDef`]s
/// to convert afterwards (at 50k tensors that list, moved and freed, was a
/// fifth of a `.zt` open).
pub trait ObjectSink {
    /// Called once, before the first object, with the number of objects
    /// the map declares (bounded by the bytes left, so safe to reserve)
    /// and the shard table, which deterministic key order puts first.
    fn begin(&mut self, count: usize, shards: &[ShardDef]);
    /// One object.
    fn object(&mut self, object: ObjectDef);
    /// One object of the writer's plain shape ([`PlainObject`]), its text
    /// still borrowed from the manifest. A sink that can build its entry
    /// from the borrowed fields overrides this; by default it becomes an
    /// [`ObjectDef`] like any other.
    fn plain(&mut self, object: PlainObject<'_>) {
        self.object(object.into_def());
    }
}

/// An object of the shape the writer gives nearly every tensor (see
/// [`plain_dense_object`]), every value checked as [`walk_object`] checks
/// it, its text borrowed from the manifest bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct PlainObject<'a> {
    pub name: &'a str,
    pub shape: Vec<u64>,
    pub layout: &'a str,
    /// The one part: its name, storage type, blob and digest (a raw part
    /// in this file with no logical type).
    pub part: &'a str,
    pub dtype: DType,
    pub offset: u64,
    pub length: u64,
    pub digest: Option<StoredDigest>,
}

impl PlainObject<'_> {
    /// The object as the general walk would have given it.
    pub fn into_def(self) -> ObjectDef {
        ObjectDef {
            name: self.name.to_string(),
            shape: self.shape,
            layout: owned_text(self.layout),
            parts: smallvec::smallvec![PartDef {
                name: owned_text(self.part),
                dtype: self.dtype,
                logical: None,
                offset: self.offset,
                length: self.length,
                shard: None,
                encoding: None,
                decoded_length: None,
                digest: self.digest,
            }],
            attributes: None,
        }
    }
}

/// The plain sink: every object kept, in manifest order.
impl ObjectSink for Vec<ObjectDef> {
    fn begin(&mut self, count: usize, _shards: &[ShardDef]) {
        self.reserve(count);
    }

    fn object(&mut self, object: ObjectDef) {
        self.push(object);
    }
}

/// Parse and check a manifest. `base` is the manifest's file offset, used
/// to place errors.
pub fn parse(bytes: &[u8], ctx: &Context, base: u64) -> Result<Manifest> {
    let mut objects = Vec::new();
    let (shards, attributes) = walk(bytes, ctx, base, &mut objects)?;
    Ok(Manifest {
        objects,
        shards,
        attributes,
    })
}

/// Parse and check a manifest, handing each object to `sink`; returns the
/// shard table and the file attributes. `base` is the manifest's file
/// offset, used to place errors.
///
/// One pass of a pull parser over the bytes: CBOR rules and the schema are
/// checked together and only the manifest's own structs are built (no CBOR
/// tree: at 50k tensors the tree was most of the open time). A CBOR
/// violation anywhere outranks a schema error, as when the whole item was
/// decoded first: a schema error triggers a check of the remaining bytes.
/// On any error the sink has seen only part of the objects.
pub fn walk(
    bytes: &[u8],
    ctx: &Context,
    base: u64,
    sink: &mut impl ObjectSink,
) -> Result<(Vec<ShardDef>, Option<Cbor>)> {
    let cbor_error = |e: Box<CborError>| {
        Error::header(
            ctx.clone().at(base + e.at as u64),
            e.rule,
            format!("manifest is not deterministic CBOR: {}", e.reason),
        )
    };
    let mut p = Pull::new(bytes, LIMITS);
    match walk_root(&mut p, ctx, sink).and_then(|m| p.finish().map(|()| m).map_err(Stop::from)) {
        Ok(m) => Ok(m),
        Err(Stop::Cbor(e)) => Err(cbor_error(e)),
        Err(Stop::Schema(e)) => {
            cbor::check(bytes, LIMITS).map_err(cbor_error)?;
            Err(*e)
        }
    }
}

/// Check the schema of an already decoded manifest (it is re-encoded, which
/// a decoded item survives byte for byte, and walked as [`parse`] walks).
pub fn from_cbor(root: &Cbor, ctx: &Context) -> Result<Manifest> {
    parse(&cbor::encode(root), ctx, 0)
}

fn walk_root(
    p: &mut Pull<'_>,
    ctx: &Context,
    sink: &mut impl ObjectSink,
) -> Walk<(Vec<ShardDef>, Option<Cbor>)> {
    let bad = |reason: String| Stop::from(Error::header(ctx.clone(), rules::SCHEMA, reason));
    let n = match p.token(0)? {
        Token::Map(n) => n,
        other => {
            return Err(Stop::from(kind_mismatch(
                ctx,
                "manifest",
                other.kind(),
                "a map",
            )))
        }
    };
    let mut shards = Vec::new();
    let mut attributes = None;
    let mut objects = false;
    let mut order = KeyOrder::default();
    // Deterministic key order puts "shards" before "objects" before
    // "attributes", so the shard table is known when parts name shards.
    for _ in 0..n {
        match p.key(1, &mut order)? {
            Token::Text("shards") => shards = walk_shards(p, ctx)?,
            Token::Text("objects") => {
                walk_objects(p, &shards, ctx, sink)?;
                objects = true;
            }
            Token::Text("attributes") => attributes = Some(walk_attributes(p, 1, ctx)?),
            _ => p.skip(1)?,
        }
    }
    if !objects {
        return Err(bad("manifest has no \"objects\" map".into()));
    }
    Ok((shards, attributes))
}

/// An attributes value at `depth`, kept as a tree (attributes are few and
/// zt hands them out).
fn walk_attributes(p: &mut Pull<'_>, depth: usize, ctx: &Context) -> Walk<Cbor> {
    let a = p.item(depth)?;
    check_attributes(&a, ctx)?;
    Ok(a)
}

fn walk_objects(
    p: &mut Pull<'_>,
    shards: &[ShardDef],
    ctx: &Context,
    sink: &mut impl ObjectSink,
) -> Walk<()> {
    let n = match p.token(1)? {
        Token::Map(n) => n,
        other => {
            return Err(Stop::from(kind_mismatch(
                ctx,
                "\"objects\"",
                other.kind(),
                "a map",
            )))
        }
    };
    sink.begin(n, shards);
    let mut order = KeyOrder::default();
    for _ in 0..n {
        let key = p.key(2, &mut order)?;
        let name = key_name(key, ctx, "object name")?;
        match plain_dense_object(p, name) {
            Some(obj) => sink.plain(obj),
            None => sink.object(walk_object(p, name, shards, ctx).map_err(|e| match e {
                Stop::Schema(e) => Stop::from((*e).in_tensor(name)),
                cbor => cbor,
            })?),
        }
    }
    Ok(())
}

/// `what` is a CBOR item of kind `found` ([`Token::kind`]) where the
/// schema has `expected`: a typed [`Mismatch`](zt_core::error::Mismatch).
fn kind_mismatch(ctx: &Context, what: impl Into<String>, found: &str, expected: &str) -> Error {
    let article = if found.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    Error::mismatch(
        ctx.clone(),
        rules::SCHEMA,
        what,
        format!("{article} {found}"),
        expected,
    )
}

/// A map key that must be a name (§3.5).
fn key_name<'a>(key: Token<'a>, ctx: &Context, what: &str) -> Result<&'a str> {
    match key {
        Token::Text(t) => {
            check_name(t, ctx, what)?;
            Ok(t)
        }
        other => Err(kind_mismatch(ctx, what, other.kind(), "text")),
    }
}

/// A text value: the manifest's vocabulary as a static, anything else copied.
fn owned_text(t: &str) -> Cow<'static, str> {
    match cbor::interned(t) {
        Some(w) => Cow::Borrowed(w),
        None => Cow::Owned(t.to_string()),
    }
}

fn text_token<'a>(tok: Token<'a>, ctx: &Context, what: &str) -> Result<&'a str> {
    match tok {
        Token::Text(t) => Ok(t),
        other => Err(kind_mismatch(ctx, what, other.kind(), "text")),
    }
}

fn uint_token(tok: Token<'_>, ctx: &Context, what: &str) -> Result<u64> {
    match tok {
        Token::UInt(u) => Ok(u),
        other => Err(kind_mismatch(
            ctx,
            what,
            other.kind(),
            "an unsigned integer",
        )),
    }
}

/// A text value at `depth` (a container is a schema error, read past first
/// only so the CBOR check of [`parse`] can run).
fn walk_text<'a>(p: &mut Pull<'a>, depth: usize, ctx: &Context, what: &str) -> Walk<&'a str> {
    let tok = p.token(depth)?;
    Ok(text_token(tok, ctx, what)?)
}

fn walk_uint(p: &mut Pull<'_>, depth: usize, ctx: &Context, what: &str) -> Walk<u64> {
    let tok = p.token(depth)?;
    Ok(uint_token(tok, ctx, what)?)
}

/// An array of unsigned integers at `depth` (shape, blob).
fn walk_uints(
    p: &mut Pull<'_>,
    n: usize,
    depth: usize,
    ctx: &Context,
    what: &str,
) -> Walk<Vec<u64>> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(walk_uint(p, depth + 1, ctx, what)?);
    }
    Ok(v)
}

/// Canonical CBOR of the keys of the commonest object, in the one order
/// deterministic encoding allows (shorter keys first, then bytewise).
mod plain {
    /// An object map of three entries, its first key `"parts"`.
    pub const OBJECT: &[u8; 7] = b"\xa3\x65parts";
    /// A parts map of one entry.
    pub const ONE_PART: &[u8; 1] = b"\xa1";
    /// A part map of two entries (no digest) or three, its first key
    /// `"blob"` and that an array of two.
    pub const PART_2: &[u8; 7] = b"\xa2\x64blob\x82";
    pub const PART_3: &[u8; 7] = b"\xa3\x64blob\x82";
    pub const DTYPE: &[u8; 6] = b"\x65dtype";
    pub const DIGEST: &[u8; 7] = b"\x66digest";
    pub const SHAPE: &[u8; 6] = b"\x65shape";
    pub const LAYOUT: &[u8; 7] = b"\x66layout";
}

// The plain object's containers nest at most to depth 6 (its blob array).
const _: () = assert!(LIMITS.depth > 6);

/// The object at the cursor, if it is the shape the writer gives nearly
/// every tensor: `{"parts": {P: {"blob": [o, l], "dtype": D, "digest"?:
/// H}}, "shape": [..], "layout": L}`: one raw part in this file, no
/// attributes. Its keys are matched as the bytes canonical CBOR encodes
/// them to, in their one legal order, so neither the key order check nor
/// a dispatch on each key runs; every value gets the checks
/// [`walk_object`] gives it. Anything else (another key, another order, a
/// value of another kind, any error) gives `None` with the cursor where it
/// was, and the general walk reads the object and reports what is wrong.
/// At 50k tensors the general walk was half of a `.zt` open.
fn plain_dense_object<'a>(p: &mut Pull<'a>, name: &'a str) -> Option<PlainObject<'a>> {
    let mut q = p.clone();
    let uint = |q: &mut Pull<'_>, depth| match q.token(depth) {
        Ok(Token::UInt(u)) => Some(u),
        _ => None,
    };
    if !(q.literal(plain::OBJECT) && q.literal(plain::ONE_PART)) {
        return None;
    }
    let part = q.short_ascii_text()?;
    if !is_valid_name(part) {
        return None;
    }
    let with_digest = if q.literal(plain::PART_3) {
        true
    } else if q.literal(plain::PART_2) {
        false
    } else {
        return None;
    };
    let (offset, length) = (uint(&mut q, 6)?, uint(&mut q, 6)?);
    if !q.literal(plain::DTYPE) {
        return None;
    }
    let dtype = storage_dtype(plain_text(&mut q, 5)?)?;
    let digest = if with_digest {
        if !q.literal(plain::DIGEST) {
            return None;
        }
        Some(StoredDigest::parse(plain_text(&mut q, 5)?).ok()?)
    } else {
        None
    };
    if !q.literal(plain::SHAPE) {
        return None;
    }
    let Ok(Token::Array(rank)) = q.token(3) else {
        return None;
    };
    if rank > MAX_RANK {
        return None;
    }
    let mut shape = Vec::with_capacity(rank);
    for _ in 0..rank {
        shape.push(uint(&mut q, 4)?);
    }
    num_elements(&shape)?;
    if !q.literal(plain::LAYOUT) {
        return None;
    }
    let layout = plain_text(&mut q, 3)?;
    *p = q;
    Some(PlainObject {
        name,
        shape,
        layout,
        part,
        dtype,
        offset,
        length,
        digest,
    })
}

/// A text value at `depth`, for [`plain_dense_object`].
fn plain_text<'a>(q: &mut Pull<'a>, depth: usize) -> Option<&'a str> {
    match q.token(depth) {
        Ok(Token::Text(t)) => Some(t),
        _ => None,
    }
}

fn walk_object(
    p: &mut Pull<'_>,
    name: &str,
    shards: &[ShardDef],
    ctx: &Context,
) -> Walk<ObjectDef> {
    let bad = |reason: String| Stop::from(Error::header(ctx.clone(), rules::SCHEMA, reason));
    let n = match p.token(2)? {
        Token::Map(n) => n,
        other => {
            return Err(Stop::from(kind_mismatch(
                ctx,
                "object",
                other.kind(),
                "a map",
            )))
        }
    };
    let (mut shape, mut layout, mut attributes, mut parts) = (None, None, None, None);
    let mut order = KeyOrder::default();
    for _ in 0..n {
        match p.key(3, &mut order)? {
            Token::Text("shape") => match p.token(3)? {
                Token::Array(dims) => {
                    if dims > MAX_RANK {
                        return Err(Stop::from(Error::Limit {
                            rule: rules::SHAPE,
                            ctx: ctx.clone(),
                            limit: "zt rank",
                            value: dims as u64,
                            max: MAX_RANK as u64,
                        }));
                    }
                    shape = Some(walk_uints(p, dims, 3, ctx, "shape dimension")?);
                }
                other => {
                    return Err(Stop::from(kind_mismatch(
                        ctx,
                        "shape",
                        other.kind(),
                        "an array",
                    )))
                }
            },
            Token::Text("layout") => layout = Some(owned_text(walk_text(p, 3, ctx, "layout")?)),
            Token::Text("attributes") => attributes = Some(walk_attributes(p, 3, ctx)?),
            Token::Text("parts") => match p.token(3)? {
                Token::Map(0) => return Err(bad("object has no parts".into())),
                Token::Map(np) => {
                    let mut v = Parts::with_capacity(np);
                    let mut porder = KeyOrder::default();
                    for _ in 0..np {
                        let key = p.key(4, &mut porder)?;
                        let pname = key_name(key, ctx, "part name")?;
                        v.push(walk_part(p, pname, shards, ctx)?);
                    }
                    parts = Some(v);
                }
                other => {
                    return Err(Stop::from(kind_mismatch(
                        ctx,
                        "parts",
                        other.kind(),
                        "a map",
                    )))
                }
            },
            _ => p.skip(3)?,
        }
    }
    let Some(shape) = shape else {
        return Err(bad("object has no shape".into()));
    };
    if num_elements(&shape).is_none() {
        return Err(Stop::from(Error::Overflow {
            rule: rules::SHAPE,
            ctx: ctx.clone(),
            what: "element count of the shape",
        }));
    }
    let Some(layout) = layout else {
        return Err(bad("object has no layout".into()));
    };
    let Some(parts) = parts else {
        return Err(bad("object has no parts".into()));
    };
    Ok(ObjectDef {
        name: name.to_string(),
        shape,
        layout,
        parts,
        attributes,
    })
}

/// One of the twelve storage types (logical types are not storage types).
pub fn storage_dtype(name: &str) -> Option<DType> {
    DType::from_name(name).filter(|d| !d.is_logical())
}

fn walk_part(p: &mut Pull<'_>, name: &str, shards: &[ShardDef], ctx: &Context) -> Walk<PartDef> {
    let bad_part = |reason: String| {
        Error::header(
            ctx.clone(),
            rules::SCHEMA,
            format!("part {name:?}: {reason}"),
        )
    };
    let bad = |reason: String| Stop::from(bad_part(reason));
    let n = match p.token(4)? {
        Token::Map(n) => n,
        other => {
            return Err(Stop::from(kind_mismatch(
                ctx,
                format!("part {name:?}"),
                other.kind(),
                "a map",
            )))
        }
    };
    let (mut dtype, mut logical, mut blob, mut shard) = (None, None, None, None);
    let (mut encoding, mut decoded_length, mut digest) = (None, None, None);
    let mut order = KeyOrder::default();
    for _ in 0..n {
        match p.key(5, &mut order)? {
            Token::Text("dtype") => {
                let d = walk_text(p, 5, ctx, "dtype")?;
                dtype = Some(storage_dtype(d).ok_or_else(|| Error::UnsupportedDType {
                    rule: rules::SCHEMA,
                    ctx: ctx.clone(),
                    dtype: d.to_string(),
                })?);
            }
            Token::Text("type") => logical = Some(owned_text(walk_text(p, 5, ctx, "type")?)),
            Token::Text("blob") => match p.token(5)? {
                Token::Array(2) => {
                    let offset = walk_uint(p, 6, ctx, "blob offset")?;
                    let length = walk_uint(p, 6, ctx, "blob length")?;
                    blob = Some((offset, length));
                }
                Token::Array(k) => return Err(bad(format!("blob has {k} elements, not 2"))),
                other => {
                    return Err(Stop::from(kind_mismatch(
                        ctx,
                        format!("part {name:?}: blob"),
                        other.kind(),
                        "an array",
                    )))
                }
            },
            Token::Text("shard") => {
                let s = walk_text(p, 5, ctx, "shard")?;
                if !shards.iter().any(|d| d.name == s) {
                    return Err(Stop::from(
                        bad_part(format!("shard {s:?} is not in the shard table"))
                            .with_rule(rules::SHARD_REF),
                    ));
                }
                shard = Some(s.to_string());
            }
            Token::Text("encoding") => {
                encoding = Some(owned_text(walk_text(p, 5, ctx, "encoding")?));
            }
            Token::Text("decoded_length") => {
                decoded_length = Some(walk_uint(p, 5, ctx, "decoded_length")?);
            }
            Token::Text("digest") => {
                let d = walk_text(p, 5, ctx, "digest")?;
                let stored =
                    StoredDigest::parse(d).map_err(|why| bad(format!("digest {d:?}: {why}")))?;
                digest = Some(stored);
            }
            _ => p.skip(5)?,
        }
    }
    let Some(dtype) = dtype else {
        return Err(bad("no dtype".into()));
    };
    let Some((offset, length)) = blob else {
        return Err(bad("no blob".into()));
    };
    if encoding.is_some() != decoded_length.is_some() {
        return Err(bad(
            "decoded_length must be present exactly when encoding is".into(),
        ));
    }
    Ok(PartDef {
        name: owned_text(name),
        dtype,
        logical,
        offset,
        length,
        shard,
        encoding,
        decoded_length,
        digest,
    })
}

fn text_name<'a>(k: &'a Cbor, ctx: &Context, what: &str) -> Result<&'a str> {
    match k {
        Cbor::Text(t) => {
            check_name(t, ctx, what)?;
            Ok(t)
        }
        other => Err(kind_mismatch(ctx, what, other.kind(), "text")),
    }
}

/// The name rule of §3.5: non-empty, at most 1024 bytes, no U+0000.
pub fn check_name(name: &str, ctx: &Context, what: &str) -> Result<()> {
    if !is_valid_name(name) {
        return Err(Error::header(
            ctx.clone(),
            rules::NAME,
            format!("{what} {name:?} breaks the name rules (1..=1024 bytes, no U+0000)"),
        ));
    }
    Ok(())
}

/// Whether `name` keeps the name rules (§3.5): 1 to [`MAX_NAME`] bytes, no
/// U+0000.
fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && !name.contains('\0')
}

/// An attributes field: a map with text keys obeying the name rules.
/// Values may be any permitted CBOR item (tags were refused by the codec).
pub fn check_attributes(a: &Cbor, ctx: &Context) -> Result<()> {
    let Cbor::Map(entries) = a else {
        return Err(kind_mismatch(ctx, "attributes", a.kind(), "a map"));
    };
    for (k, _) in entries {
        text_name(k, ctx, "attribute key")?;
    }
    Ok(())
}

fn uint(v: &Cbor, ctx: &Context, what: &str) -> Result<u64> {
    match v {
        Cbor::UInt(u) => Ok(*u),
        other => Err(kind_mismatch(
            ctx,
            what,
            other.kind(),
            "an unsigned integer",
        )),
    }
}

fn text<'a>(v: &'a Cbor, ctx: &Context, what: &str) -> Result<&'a str> {
    match v {
        Cbor::Text(t) => Ok(t),
        other => Err(kind_mismatch(ctx, what, other.kind(), "text")),
    }
}

/// `"<algorithm>:<lowercase hex>"`; registered algorithms must have their
/// exact length. Unknown algorithms are accepted (and left unverified).
pub fn check_digest_syntax(d: &str) -> std::result::Result<(), &'static str> {
    StoredDigest::parse(d).map(|_| ())
}

/// The shard-name rule of §7.1.
pub fn valid_shard_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_SHARD_NAME
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The shard table (a handful of entries), read as a tree.
fn walk_shards(p: &mut Pull<'_>, ctx: &Context) -> Walk<Vec<ShardDef>> {
    let table = p.item(1)?;
    Ok(parse_shards(&table, ctx)?)
}

fn parse_shards(s: &Cbor, ctx: &Context) -> Result<Vec<ShardDef>> {
    let bad = |reason: String| Error::header(ctx.clone(), rules::SCHEMA, reason);
    let Cbor::Map(entries) = s else {
        return Err(kind_mismatch(ctx, "shards", s.kind(), "a map"));
    };
    let mut out = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let name = match k {
            Cbor::Text(t) if valid_shard_name(t) => t.clone(),
            Cbor::Text(t) => {
                return Err(bad(format!(
                    "shard name {t:?} is not [A-Za-z0-9._-]{{1,64}} without a leading dot"
                ))
                .with_rule(rules::SHARD_NAME))
            }
            other => return Err(kind_mismatch(ctx, "shard name", other.kind(), "text")),
        };
        let size = match v.get("size") {
            Some(x) => uint(x, ctx, "shard size")?,
            None => return Err(bad(format!("shard {name:?} has no size"))),
        };
        let digest = match v.get("digest") {
            Some(x) => text(x, ctx, "shard digest")?.to_string(),
            None => return Err(bad(format!("shard {name:?} has no digest"))),
        };
        check_digest_syntax(&digest).map_err(|why| bad(format!("shard {name:?} digest: {why}")))?;
        out.push(ShardDef {
            name: name.into_owned(),
            size,
            digest,
        });
    }
    Ok(out)
}

/// A CBOR attribute value as a catalog [`Value`]. Negative integers below
/// `i64::MIN` become floats; map keys that are not text are written in
/// CBOR diagnostic-ish form so nothing is dropped.
pub fn to_value(c: &Cbor) -> Value {
    match c {
        Cbor::UInt(u) => i64::try_from(*u).map(Value::Int).unwrap_or(Value::UInt(*u)),
        Cbor::NInt(n) => i64::try_from(*n)
            .map(|n| Value::Int(-1 - n))
            .unwrap_or(Value::Float(-1.0 - *n as f64)),
        Cbor::Bytes(b) => Value::Bytes(b.clone()),
        Cbor::Text(t) => Value::Str(t.to_string()),
        Cbor::Array(a) => Value::List(a.iter().map(to_value).collect()),
        Cbor::Map(m) => Value::Map(
            m.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Cbor::Text(t) => t.to_string(),
                        other => format!("{:?}", to_value(other).to_json()),
                    };
                    (key, to_value(v))
                })
                .collect(),
        ),
        Cbor::Bool(b) => Value::Bool(*b),
        Cbor::Null => Value::Null,
        Cbor::Float(f) => Value::Float(*f),
    }
}

/// A catalog [`Value`] as CBOR (for writing attributes).
pub fn from_value(v: &Value) -> Cbor {
    match v {
        Value::Null => Cbor::Null,
        Value::Bool(b) => Cbor::Bool(*b),
        Value::Int(i) => Cbor::int(*i),
        Value::UInt(u) => Cbor::UInt(*u),
        Value::Float(f) => Cbor::Float(*f),
        Value::Str(s) => Cbor::Text(s.clone().into()),
        Value::Bytes(b) => Cbor::Bytes(b.clone()),
        Value::List(l) => Cbor::Array(l.iter().map(from_value).collect()),
        Value::Map(m) => Cbor::map(m.iter().map(|(k, v)| (k.clone(), from_value(v)))),
    }
}

/// Attributes (`Cbor` map) as catalog attributes.
pub fn attributes_of(a: &Option<Cbor>) -> zt_core::catalog::Attributes {
    match a {
        Some(Cbor::Map(m)) => m
            .iter()
            .filter_map(|(k, v)| match k {
                Cbor::Text(t) => Some((t.to_string(), to_value(v))),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zt_core::error::Mismatch;

    fn dense(shape: Option<u64>, extra: Vec<(&str, Cbor)>) -> Cbor {
        let part = Cbor::map([
            ("dtype", Cbor::Text("f32".into())),
            ("blob", Cbor::Array(vec![Cbor::UInt(64), Cbor::UInt(16)])),
        ]);
        let mut fields = vec![
            ("layout", Cbor::Text("dense".into())),
            ("parts", Cbor::map([("data", part)])),
        ];
        if let Some(n) = shape {
            fields.push(("shape", Cbor::Array(vec![Cbor::UInt(n)])));
        }
        fields.extend(extra);
        Cbor::map(fields)
    }

    #[test]
    fn a_stored_digest_is_what_digest_parse_reads_and_writes_back() {
        let sha = format!("sha256:{}", "0123456789abcdef".repeat(4));
        for d in [
            "xxh3:0123456789abcdef",
            "xxh3:ffffffffffffffff",
            sha.as_str(),
        ] {
            let stored = StoredDigest::parse(d).unwrap();
            assert_eq!(stored.known(), Some(Digest::parse(d).unwrap()));
            assert_eq!(stored.to_string(), d);
        }
        let other = StoredDigest::parse("blake3:00ff").unwrap();
        assert_eq!(
            (other.known(), other.to_string()),
            (None, "blake3:00ff".into())
        );
        for (bad, why) in [
            ("xxh3:0123", "xxh3 takes 16 lowercase hex digits"),
            ("xxh3:0123456789ABCDEF", "value is not lowercase hex"),
            ("sha256:00", "sha256 takes 64 lowercase hex digits"),
            ("xxh3", "no ':' between algorithm and value"),
            (":00", "empty algorithm or value"),
        ] {
            assert_eq!(StoredDigest::parse(bad), Err(why), "{bad}");
        }
    }

    #[test]
    fn the_walk_builds_the_manifest_with_the_vocabulary_borrowed() {
        let root = Cbor::map([("objects", Cbor::map([("w", dense(Some(4), vec![]))]))]);
        let m = parse(&cbor::encode(&root), &Context::default(), 0).unwrap();
        let [o] = &m.objects[..] else { panic!("{m:?}") };
        assert_eq!((o.name.as_str(), &o.shape[..]), ("w", &[4u64][..]));
        assert!(matches!(o.layout, Cow::Borrowed("dense")));
        let p = &o.parts[0];
        assert!(matches!(p.name, Cow::Borrowed("data")));
        assert_eq!((p.dtype, p.offset, p.length), (DType::F32, 64, 16));
        assert_eq!(from_cbor(&root, &Context::default()).unwrap(), m);
    }

    #[test]
    fn a_value_of_the_wrong_type_is_a_typed_mismatch() {
        let shape_map = dense(None, vec![("shape", Cbor::map([("n", Cbor::UInt(4))]))]);
        let root = Cbor::map([("objects", Cbor::map([("w", shape_map)]))]);
        let e = parse(&cbor::encode(&root), &Context::default(), 0).unwrap_err();
        let want = Mismatch::new("shape", "a map", "an array");
        assert_eq!(e.as_mismatch(), Some(&want));
        assert_eq!(e.rule(), Some(rules::SCHEMA));
        assert!(
            e.to_string().ends_with("shape is a map, not an array"),
            "{e}"
        );
        let e = from_cbor(&Cbor::UInt(1), &Context::default()).unwrap_err();
        assert_eq!(
            e.detail(),
            "malformed header: manifest is an unsigned integer, not a map"
        );
    }

    #[test]
    fn a_cbor_violation_anywhere_outranks_an_earlier_schema_error() {
        // Object "a" has no shape (a schema error met first); object "b"
        // holds, under a key zt ignores, a non-shortest integer head.
        let root = Cbor::map([(
            "objects",
            Cbor::map([
                ("a", dense(None, vec![])),
                ("b", dense(Some(4), vec![("zz", Cbor::UInt(0x17))])),
            ]),
        )]);
        let good = cbor::encode(&root);
        let at = good.windows(4).position(|w| w == b"\x62zz\x17").unwrap() + 3;
        let schema_only = parse(&good, &Context::default(), 0).unwrap_err();
        assert!(
            matches!(&schema_only, Error::Header { ctx, .. } if ctx.tensor.as_deref() == Some("a")),
            "{schema_only:?}"
        );
        let mut bad = good.clone();
        bad.splice(at..at + 1, [0x18, 0x17]);
        let e = parse(&bad, &Context::default(), 1000).unwrap_err();
        assert!(
            matches!(&e, Error::Header { ctx, .. } if ctx.offset == Some(1000 + at as u64) && ctx.tensor.is_none()),
            "{e:?}"
        );
    }

    /// One object's encoding read by [`plain_dense_object`] and by
    /// [`walk_object`]: the fast path either declines, taking nothing, or
    /// gives what the general walk gives and stops where it stops.
    fn plain_path_agrees(object: &Cbor) -> bool {
        plain_path_agrees_on(&cbor::encode(object))
    }

    fn plain_path_agrees_on(bytes: &[u8]) -> bool {
        let shards = [ShardDef {
            name: "s1".into(),
            size: 1 << 20,
            digest: String::new(),
        }];
        let mut general = Pull::new(bytes, LIMITS);
        let expected = walk_object(&mut general, "w", &shards, &Context::default()).ok();
        let mut fast = Pull::new(bytes, LIMITS);
        match plain_dense_object(&mut fast, "w") {
            None => {
                assert_eq!(fast.pos(), 0, "declined after taking bytes: {bytes:x?}");
                false
            }
            Some(got) => {
                assert_eq!(Some(got.into_def()), expected, "{bytes:x?}");
                assert_eq!(fast.pos(), general.pos());
                true
            }
        }
    }

    #[test]
    fn the_plain_object_path_reads_what_the_general_walk_reads_or_declines() {
        let digest = ("digest", Cbor::Text("xxh3:0123456789abcdef".into()));
        let plain = |part_extra: Vec<(&str, Cbor)>, shape: Vec<Cbor>, extra: Vec<(&str, Cbor)>| {
            let mut part = vec![
                ("dtype", Cbor::Text("f32".into())),
                ("blob", Cbor::Array(vec![Cbor::UInt(4096), Cbor::UInt(16)])),
            ];
            part.extend(part_extra);
            let mut fields = vec![
                ("layout", Cbor::Text("dense".into())),
                ("parts", Cbor::map([("data", Cbor::map(part))])),
                ("shape", Cbor::Array(shape)),
            ];
            fields.extend(extra);
            Cbor::map(fields)
        };
        let four = || vec![Cbor::UInt(4)];
        // What the writer writes: taken by the fast path, with or without
        // a digest, at any rank (a scalar's shape is empty).
        assert!(plain_path_agrees(&plain(
            vec![digest.clone()],
            four(),
            vec![]
        )));
        assert!(plain_path_agrees(&plain(vec![], four(), vec![])));
        assert!(plain_path_agrees(&plain(vec![], vec![], vec![])));
        let big = vec![Cbor::UInt(1 << 40), Cbor::UInt(3)];
        assert!(plain_path_agrees(&plain(vec![digest.clone()], big, vec![])));
        let other_digest = ("digest", Cbor::Text("blake3:00ff".into()));
        assert!(plain_path_agrees(&plain(
            vec![other_digest],
            four(),
            vec![]
        )));
        // Anything else goes to the general walk, valid or not.
        let declined = [
            plain(vec![("type", Cbor::Text("bool".into()))], four(), vec![]),
            plain(vec![("shard", Cbor::Text("s1".into()))], four(), vec![]),
            plain(
                vec![digest.clone()],
                four(),
                vec![("attributes", Cbor::map([("k", Cbor::UInt(1))]))],
            ),
            plain(
                vec![("digest", Cbor::Text("xxh3:0123".into()))],
                four(),
                vec![],
            ),
            plain(vec![("dtype", Cbor::Text("bool".into()))], four(), vec![]),
            plain(vec![], vec![Cbor::UInt(4); MAX_RANK + 1], vec![]),
            plain(vec![], vec![Cbor::UInt(u64::MAX), Cbor::UInt(2)], vec![]),
            plain(vec![], vec![Cbor::Text("4".into())], vec![]),
            dense(Some(4), vec![("zz", Cbor::UInt(0))]),
            Cbor::map([(
                "parts",
                Cbor::map([("", Cbor::map([("dtype", Cbor::Text("f32".into()))]))]),
            )]),
        ];
        for object in &declined {
            assert!(!plain_path_agrees(object), "{object:?}");
        }
        // A part name against the name rules, in an otherwise plain object.
        let bytes = cbor::encode(&plain(vec![digest], four(), vec![]));
        let at = bytes.windows(5).position(|w| w == b"\x64data").unwrap();
        let mut unnamed = bytes.clone();
        unnamed.splice(at..at + 5, [0x60]);
        assert!(!plain_path_agrees_on(&unnamed));
        // Bytes cut short anywhere: declined, and the general walk reports.
        for end in 0..bytes.len() {
            let mut p = Pull::new(&bytes[..end], LIMITS);
            assert!(plain_dense_object(&mut p, "w").is_none(), "{end}");
            assert_eq!(p.pos(), 0);
        }
    }
}
