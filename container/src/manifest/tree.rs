//! The validators of decoded CBOR trees, built on the walk's checks of one
//! value ([`super::walk`](mod@super::walk), through `head`, a tree item's head as the pull
//! parser hands it out): attributes, which the walk keeps as trees and
//! writers build; the shard table, a handful of entries read as a tree; a
//! decoded manifest ([`from_cbor`]); and attribute values to and from the
//! catalog's [`Value`].

use zt_core::catalog::Value;
use zt_core::error::{Context, Error, Result};

use super::schema::{check_digest_syntax, valid_shard_name, Manifest, ShardDef};
use super::walk::{key_name, kind_mismatch, parse, text_token, uint_token};
use crate::cbor::{self, Cbor, Token};
use crate::rules;

/// A tree item's head, as the pull parser would hand it out (strings
/// borrowed, containers as their item counts), so a tree is checked by the
/// same code as a walk.
fn head(c: &Cbor) -> Token<'_> {
    match c {
        Cbor::UInt(u) => Token::UInt(*u),
        Cbor::NInt(n) => Token::NInt(*n),
        Cbor::Bytes(b) => Token::Bytes(b),
        Cbor::Text(t) => Token::Text(t),
        Cbor::Array(a) => Token::Array(a.len()),
        Cbor::Map(m) => Token::Map(m.len()),
        Cbor::Bool(b) => Token::Bool(*b),
        Cbor::Null => Token::Null,
        Cbor::Float(f) => Token::Float(*f),
    }
}

/// Check the schema of an already decoded manifest (it is re-encoded, which
/// a decoded item survives byte for byte, and walked as [`parse`] walks).
pub fn from_cbor(root: &Cbor, ctx: &Context) -> Result<Manifest> {
    parse(&cbor::encode(root), ctx, 0)
}

/// A map key that must be a name: the walk's check of a key, on the tree.
fn text_name<'a>(k: &'a Cbor, ctx: &Context, what: &str) -> Result<&'a str> {
    key_name(head(k), ctx, what)
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

/// An unsigned integer: the walk's check, on the tree.
fn uint(v: &Cbor, ctx: &Context, what: &str) -> Result<u64> {
    uint_token(head(v), ctx, what)
}

/// Text: the walk's check, on the tree.
fn text<'a>(v: &'a Cbor, ctx: &Context, what: &str) -> Result<&'a str> {
    text_token(head(v), ctx, what)
}

pub(super) fn parse_shards(s: &Cbor, ctx: &Context) -> Result<Vec<ShardDef>> {
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

    #[test]
    fn a_tree_of_the_wrong_type_is_the_walks_typed_mismatch() {
        let e = from_cbor(&Cbor::UInt(1), &Context::default()).unwrap_err();
        assert_eq!(
            e.detail(),
            "malformed header: manifest is an unsigned integer, not a map"
        );
        let e = check_attributes(&Cbor::map([("k", Cbor::Null)]), &Context::default());
        assert!(e.is_ok(), "{e:?}");
        let not_a_map = Cbor::Array(vec![]);
        let e = check_attributes(&not_a_map, &Context::default()).unwrap_err();
        let want = Mismatch::new("attributes", "an array", "a map");
        assert_eq!(e.as_mismatch(), Some(&want));
        let table = Cbor::map([("s1", Cbor::map([("size", Cbor::Text("1".into()))]))]);
        let e = parse_shards(&table, &Context::default()).unwrap_err();
        let want = Mismatch::new("shard size", "a text string", "an unsigned integer");
        assert_eq!(e.as_mismatch(), Some(&want));
    }
}
