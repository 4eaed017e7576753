//! The streaming walk: one pass of the pull parser ([`Pull`]) over the
//! manifest's bytes, deterministic CBOR and the schema checked together,
//! each object handed to an [`ObjectSink`] as soon as it is checked, no
//! CBOR tree built (only attribute values and the shard table, which
//! [`super::tree`] checks). The checks of one value (a name, text, an
//! unsigned integer, a value of the wrong type as a typed `Mismatch`) are
//! here, on a [`Token`], and the tree validators are built on them.

use zt_core::dtype::num_elements;
use zt_core::error::{Context, Error, Result};

use super::schema::{
    check_name, is_valid_name, owned_text, storage_dtype, Manifest, ObjectDef, PartDef, Parts,
    PlainObject, ShardDef, StoredDigest, MAX_RANK,
};
use super::tree::{check_attributes, parse_shards};
use crate::cbor::{self, Cbor, CborError, DecodeLimits, KeyOrder, Pull, Token};
use crate::rules;

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

fn walk_root(
    p: &mut Pull<'_>,
    ctx: &Context,
    sink: &mut impl ObjectSink,
) -> Walk<(Vec<ShardDef>, Option<Cbor>)> {
    let bad = |reason: String| Stop::from(Error::header(ctx.clone(), rules::SCHEMA, reason));
    let n = walk_map(p, 0, ctx, "manifest")?;
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
    let n = walk_map(p, 1, ctx, "\"objects\"")?;
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
pub(super) fn kind_mismatch(
    ctx: &Context,
    what: impl Into<String>,
    found: &str,
    expected: &str,
) -> Error {
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
pub(super) fn key_name<'a>(key: Token<'a>, ctx: &Context, what: &str) -> Result<&'a str> {
    match key {
        Token::Text(t) => {
            check_name(t, ctx, what)?;
            Ok(t)
        }
        other => Err(kind_mismatch(ctx, what, other.kind(), "text")),
    }
}

pub(super) fn text_token<'a>(tok: Token<'a>, ctx: &Context, what: &str) -> Result<&'a str> {
    match tok {
        Token::Text(t) => Ok(t),
        other => Err(kind_mismatch(ctx, what, other.kind(), "text")),
    }
}

pub(super) fn uint_token(tok: Token<'_>, ctx: &Context, what: &str) -> Result<u64> {
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

/// The entry count of the map at `depth`, or the mismatch naming `what`.
fn walk_map(p: &mut Pull<'_>, depth: usize, ctx: &Context, what: &str) -> Walk<usize> {
    match p.token(depth)? {
        Token::Map(n) => Ok(n),
        other => Err(Stop::from(kind_mismatch(ctx, what, other.kind(), "a map"))),
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
pub(super) fn plain_dense_object<'a>(p: &mut Pull<'a>, name: &'a str) -> Option<PlainObject<'a>> {
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
    let n = walk_map(p, 2, ctx, "object")?;
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

/// The shard table (a handful of entries), read as a tree.
fn walk_shards(p: &mut Pull<'_>, ctx: &Context) -> Walk<Vec<ShardDef>> {
    let table = p.item(1)?;
    Ok(parse_shards(&table, ctx)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::from_cbor;
    use std::borrow::Cow;
    use zt_core::dtype::DType;
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
