//! The L1 manifest: parsing the deterministic-CBOR map into objects, parts
//! and shards, with the schema rules of §3 (names, shapes, blob arrays,
//! shard references, attribute values). Unknown keys are ignored at every
//! level, as the spec requires.

use crate::cbor::{self, Cbor, DecodeLimits};
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

/// One object of the manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectDef {
    /// Object name.
    pub name: String,
    /// Logical shape.
    pub shape: Vec<u64>,
    /// `"dense"` or a profile id.
    pub layout: String,
    /// Parts in manifest order.
    pub parts: Vec<PartDef>,
    /// Per-object attributes, if present.
    pub attributes: Option<Cbor>,
}

/// One part of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct PartDef {
    /// Part name.
    pub name: String,
    /// Storage type (one of the twelve primitives).
    pub dtype: DType,
    /// Logical type name, if any (`"bool"`, `"f4_e2m1"`, ...).
    pub logical: Option<String>,
    /// Blob offset.
    pub offset: u64,
    /// Blob length (encoded length for encoded parts).
    pub length: u64,
    /// Shard name; `None` is the containing file.
    pub shard: Option<String>,
    /// Encoding profile id; `None` is raw.
    pub encoding: Option<String>,
    /// Decoded length (present iff `encoding` is).
    pub decoded_length: Option<u64>,
    /// The digest string as stored (`"xxh3:..."`), if any.
    pub digest: Option<String>,
}

impl PartDef {
    /// Decoded size: the blob length when raw, else `decoded_length`.
    pub fn decoded_size(&self) -> u64 {
        self.decoded_length.unwrap_or(self.length)
    }

    /// The parsed digest, when the algorithm is a registered one.
    pub fn parsed_digest(&self) -> Option<Digest> {
        self.digest.as_deref().and_then(|d| Digest::parse(d).ok())
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

/// Parse and check a manifest. `base` is the manifest's file offset, used
/// to place errors.
pub fn parse(bytes: &[u8], ctx: &Context, base: u64) -> Result<Manifest> {
    let root = cbor::decode(
        bytes,
        DecodeLimits {
            depth: cbor::MAX_DEPTH,
        },
    )
    .map_err(|e| {
        Error::header(
            ctx.clone().at(base + e.at as u64),
            format!("manifest is not deterministic CBOR: {}", e.reason),
        )
    })?;
    from_cbor(&root, ctx)
}

/// Check the schema of an already decoded manifest.
pub fn from_cbor(root: &Cbor, ctx: &Context) -> Result<Manifest> {
    let bad = |reason: String| Error::header(ctx.clone(), reason);
    let Cbor::Map(_) = root else {
        return Err(bad(format!("manifest is a {}, not a map", root.kind())));
    };
    let shards = match root.get("shards") {
        None => Vec::new(),
        Some(s) => parse_shards(s, ctx)?,
    };
    let attributes = root
        .get("attributes")
        .map(|a| check_attributes(a, ctx).map(|()| a.clone()))
        .transpose()?;
    let Some(objects) = root.get("objects") else {
        return Err(bad("manifest has no \"objects\" map".into()));
    };
    let Cbor::Map(entries) = objects else {
        return Err(bad(format!(
            "\"objects\" is a {}, not a map",
            objects.kind()
        )));
    };
    let mut out = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let name = text_name(k, ctx, "object name")?;
        let obj = parse_object(name, v, &shards, ctx).map_err(|e| e.in_tensor(name))?;
        out.push(obj);
    }
    Ok(Manifest {
        objects: out,
        shards,
        attributes,
    })
}

fn text_name<'a>(k: &'a Cbor, ctx: &Context, what: &str) -> Result<&'a str> {
    match k {
        Cbor::Text(t) => {
            check_name(t, ctx, what)?;
            Ok(t)
        }
        other => Err(Error::header(
            ctx.clone(),
            format!("{what} is a {}, not text", other.kind()),
        )),
    }
}

/// The name rule of §3.5: non-empty, at most 1024 bytes, no U+0000.
pub fn check_name(name: &str, ctx: &Context, what: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME || name.contains('\0') {
        return Err(Error::header(
            ctx.clone(),
            format!("{what} {name:?} breaks the name rules (1..=1024 bytes, no U+0000)"),
        ));
    }
    Ok(())
}

/// An attributes field: a map with text keys obeying the name rules.
/// Values may be any permitted CBOR item (tags were refused by the codec).
pub fn check_attributes(a: &Cbor, ctx: &Context) -> Result<()> {
    let Cbor::Map(entries) = a else {
        return Err(Error::header(
            ctx.clone(),
            format!("attributes is a {}, not a map", a.kind()),
        ));
    };
    for (k, _) in entries {
        text_name(k, ctx, "attribute key")?;
    }
    Ok(())
}

fn uint(v: &Cbor, ctx: &Context, what: &str) -> Result<u64> {
    match v {
        Cbor::UInt(u) => Ok(*u),
        other => Err(Error::header(
            ctx.clone(),
            format!("{what} is a {}, not an unsigned integer", other.kind()),
        )),
    }
}

fn text<'a>(v: &'a Cbor, ctx: &Context, what: &str) -> Result<&'a str> {
    match v {
        Cbor::Text(t) => Ok(t),
        other => Err(Error::header(
            ctx.clone(),
            format!("{what} is a {}, not text", other.kind()),
        )),
    }
}

fn parse_object(name: &str, v: &Cbor, shards: &[ShardDef], ctx: &Context) -> Result<ObjectDef> {
    let bad = |reason: String| Error::header(ctx.clone(), reason);
    let Cbor::Map(_) = v else {
        return Err(bad(format!("object is a {}, not a map", v.kind())));
    };
    let shape = match v.get("shape") {
        Some(Cbor::Array(dims)) => {
            if dims.len() > MAX_RANK {
                return Err(Error::Limit {
                    ctx: ctx.clone(),
                    limit: "zt rank",
                    value: dims.len() as u64,
                    max: MAX_RANK as u64,
                });
            }
            dims.iter()
                .map(|d| uint(d, ctx, "shape dimension"))
                .collect::<Result<Vec<u64>>>()?
        }
        Some(other) => return Err(bad(format!("shape is a {}, not an array", other.kind()))),
        None => return Err(bad("object has no shape".into())),
    };
    if num_elements(&shape).is_none() {
        return Err(Error::Overflow {
            ctx: ctx.clone(),
            what: "element count of the shape",
        });
    }
    let layout = match v.get("layout") {
        Some(l) => text(l, ctx, "layout")?.to_string(),
        None => return Err(bad("object has no layout".into())),
    };
    let attributes = v
        .get("attributes")
        .map(|a| check_attributes(a, ctx).map(|()| a.clone()))
        .transpose()?;
    let parts = match v.get("parts") {
        Some(Cbor::Map(entries)) if !entries.is_empty() => entries
            .iter()
            .map(|(k, p)| {
                let pname = text_name(k, ctx, "part name")?;
                parse_part(pname, p, shards, ctx)
            })
            .collect::<Result<Vec<_>>>()?,
        Some(Cbor::Map(_)) => return Err(bad("object has no parts".into())),
        Some(other) => return Err(bad(format!("parts is a {}, not a map", other.kind()))),
        None => return Err(bad("object has no parts".into())),
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

fn parse_part(name: &str, p: &Cbor, shards: &[ShardDef], ctx: &Context) -> Result<PartDef> {
    let bad = |reason: String| Error::header(ctx.clone(), format!("part {name:?}: {reason}"));
    let Cbor::Map(_) = p else {
        return Err(bad(format!("is a {}, not a map", p.kind())));
    };
    let dtype_name = match p.get("dtype") {
        Some(d) => text(d, ctx, "dtype")?,
        None => return Err(bad("no dtype".into())),
    };
    let dtype = storage_dtype(dtype_name).ok_or_else(|| Error::UnsupportedDType {
        ctx: ctx.clone(),
        dtype: dtype_name.to_string(),
    })?;
    let logical = p
        .get("type")
        .map(|t| text(t, ctx, "type").map(str::to_string))
        .transpose()?;
    let (offset, length) = match p.get("blob") {
        Some(Cbor::Array(a)) if a.len() == 2 => (
            uint(&a[0], ctx, "blob offset")?,
            uint(&a[1], ctx, "blob length")?,
        ),
        Some(Cbor::Array(a)) => return Err(bad(format!("blob has {} elements, not 2", a.len()))),
        Some(other) => return Err(bad(format!("blob is a {}, not an array", other.kind()))),
        None => return Err(bad("no blob".into())),
    };
    let shard = p
        .get("shard")
        .map(|s| text(s, ctx, "shard").map(str::to_string))
        .transpose()?;
    if let Some(s) = &shard {
        if !shards.iter().any(|d| &d.name == s) {
            return Err(bad(format!("shard {s:?} is not in the shard table")));
        }
    }
    let encoding = p
        .get("encoding")
        .map(|e| text(e, ctx, "encoding").map(str::to_string))
        .transpose()?;
    let decoded_length = p
        .get("decoded_length")
        .map(|d| uint(d, ctx, "decoded_length"))
        .transpose()?;
    if encoding.is_some() != decoded_length.is_some() {
        return Err(bad(
            "decoded_length must be present exactly when encoding is".into(),
        ));
    }
    let digest = p
        .get("digest")
        .map(|d| text(d, ctx, "digest").map(str::to_string))
        .transpose()?;
    if let Some(d) = &digest {
        check_digest_syntax(d).map_err(|why| bad(format!("digest {d:?}: {why}")))?;
    }
    Ok(PartDef {
        name: name.to_string(),
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

/// `"<algorithm>:<lowercase hex>"`; registered algorithms must have their
/// exact length. Unknown algorithms are accepted (and left unverified).
pub fn check_digest_syntax(d: &str) -> std::result::Result<(), &'static str> {
    let Some((algo, hex)) = d.split_once(':') else {
        return Err("no ':' between algorithm and value");
    };
    if algo.is_empty() || hex.is_empty() {
        return Err("empty algorithm or value");
    }
    if !hex
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err("value is not lowercase hex");
    }
    match Digest::parse(d) {
        Ok(_) => Ok(()),
        Err(Some(why)) => Err(why),
        Err(None) => Ok(()),
    }
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

fn parse_shards(s: &Cbor, ctx: &Context) -> Result<Vec<ShardDef>> {
    let bad = |reason: String| Error::header(ctx.clone(), reason);
    let Cbor::Map(entries) = s else {
        return Err(bad(format!("shards is a {}, not a map", s.kind())));
    };
    let mut out = Vec::with_capacity(entries.len());
    for (k, v) in entries {
        let name = match k {
            Cbor::Text(t) if valid_shard_name(t) => t.clone(),
            Cbor::Text(t) => {
                return Err(bad(format!(
                    "shard name {t:?} is not [A-Za-z0-9._-]{{1,64}} without a leading dot"
                )))
            }
            other => return Err(bad(format!("shard name is a {}, not text", other.kind()))),
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
