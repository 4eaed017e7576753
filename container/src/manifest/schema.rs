//! The manifest's schema as types: objects, parts, shards and stored
//! digests (§3), the limits on names and ranks, and the rules of a name
//! (§3.5), a digest's syntax and a shard's name (§7.1) that the walk and
//! the writers apply alike.

use std::borrow::Cow;

use smallvec::SmallVec;
use zt_core::catalog::Digest;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};

use crate::cbor::{self, Cbor};
use crate::rules;

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

/// An object of the shape the writer gives nearly every tensor (see
/// the walk's `plain_dense_object`), every value checked as the general
/// walk checks it, its text borrowed from the manifest bytes.
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

/// A text value: the manifest's vocabulary as a static, anything else copied.
pub(super) fn owned_text(t: &str) -> Cow<'static, str> {
    match cbor::interned(t) {
        Some(w) => Cow::Borrowed(w),
        None => Cow::Owned(t.to_string()),
    }
}

/// One of the twelve storage types (logical types are not storage types).
pub fn storage_dtype(name: &str) -> Option<DType> {
    DType::from_name(name).filter(|d| !d.is_logical())
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
pub(super) fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && !name.contains('\0')
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
