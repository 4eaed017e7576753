//! A strict codec for the deterministic CBOR subset the zTensor manifest
//! uses (RFC 8949 §4.2.1 "Core Deterministic Encoding").
//!
//! The decoder rejects everything a deterministic encoder cannot produce:
//! non-shortest heads, indefinite lengths, unsorted or duplicate map keys
//! (compared on their encoded bytes), tags, simple values other than
//! false/true/null, floats wider than their value needs and NaNs other than
//! `f9 7e00`. Every declared length is checked against the bytes left before
//! anything is allocated, and nesting is bounded, so no input can make the
//! decoder allocate or recurse without bound.

use crate::rules;
use std::borrow::Cow;
use std::cmp::Ordering;
use zt_core::Rule;

/// One CBOR data item of the permitted subset.
#[derive(Debug, Clone, PartialEq)]
pub enum Cbor {
    /// Major type 0: an unsigned integer.
    UInt(u64),
    /// Major type 1: the negative integer `-1 - n`.
    NInt(u64),
    /// Major type 2: a byte string.
    Bytes(Vec<u8>),
    /// Major type 3: a text string. The manifest's own vocabulary (keys,
    /// dtypes, layouts, encodings) decodes to borrowed statics: a file with
    /// 50k tensors otherwise allocates and frees half a million of them.
    Text(Cow<'static, str>),
    /// Major type 4: an array.
    Array(Vec<Cbor>),
    /// Major type 5: a map, in encoded-key order.
    Map(Vec<(Cbor, Cbor)>),
    /// `false` / `true`.
    Bool(bool),
    /// `null`.
    Null,
    /// A half, single or double float (stored widened).
    Float(f64),
}

impl Cbor {
    /// Text key lookup in a map (the manifest's maps are all text-keyed).
    pub fn get(&self, key: &str) -> Option<&Cbor> {
        match self {
            Cbor::Map(entries) => entries.iter().find_map(|(k, v)| match k {
                Cbor::Text(t) if t == key => Some(v),
                _ => None,
            }),
            _ => None,
        }
    }

    /// A short name of the item's type, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Cbor::UInt(_) => "unsigned integer",
            Cbor::NInt(_) => "negative integer",
            Cbor::Bytes(_) => "byte string",
            Cbor::Text(_) => "text string",
            Cbor::Array(_) => "array",
            Cbor::Map(_) => "map",
            Cbor::Bool(_) => "bool",
            Cbor::Null => "null",
            Cbor::Float(_) => "float",
        }
    }

    /// A text-keyed map from `(key, value)` pairs, sorted for encoding.
    pub fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Cbor)>) -> Cbor {
        Cbor::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Cbor::Text(Cow::Owned(k.into())), v))
                .collect(),
        )
    }

    /// An integer from an `i64`.
    pub fn int(v: i64) -> Cbor {
        if v >= 0 {
            Cbor::UInt(v as u64)
        } else {
            Cbor::NInt(!(v as u64))
        }
    }
}

/// Why a manifest is not deterministic CBOR, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CborError {
    /// Byte offset in the encoded item.
    pub at: usize,
    /// The rule broken (one of the `zt.Cbor*` rules).
    pub rule: Rule,
    /// What the bytes do that the rule forbids.
    pub reason: String,
}

/// Results of the codec. The error is boxed: a pull parser returns a
/// result per token, and a small one is cheaper to hand back.
pub type Res<T> = std::result::Result<T, Box<CborError>>;

/// Bounds the decoder enforces.
#[derive(Debug, Clone, Copy)]
pub struct DecodeLimits {
    /// Deepest nesting of arrays and maps, the outermost counting as 1.
    pub depth: usize,
}

/// The spec's nesting bound, measured from the manifest root.
pub const MAX_DEPTH: usize = 32;

/// Decode exactly one item that fills `bytes` completely.
pub fn decode(bytes: &[u8], limits: DecodeLimits) -> Res<Cbor> {
    let mut p = Pull::new(bytes, limits);
    let item = p.item(0)?;
    p.finish()?;
    Ok(item)
}

/// Check that `bytes` is exactly one item of the permitted subset, building
/// nothing.
pub fn check(bytes: &[u8], limits: DecodeLimits) -> Res<()> {
    let mut p = Pull::new(bytes, limits);
    p.skip(0)?;
    p.finish()
}

/// Text the manifest repeats for every tensor, as a static (`None` for
/// anything else, which callers copy or borrow).
pub fn interned(s: &str) -> Option<&'static str> {
    // A `match`, not a scan of a list: it runs for every key and value
    // the manifest holds.
    macro_rules! vocabulary {
        ($($word:literal),* $(,)?) => {
            match s {
                $($word => Some($word),)*
                _ => None,
            }
        };
    }
    vocabulary!(
        // Keys of the root, objects and parts (spec §4).
        "objects",
        "attributes",
        "shards",
        "shape",
        "layout",
        "parts",
        "dtype",
        "type",
        "blob",
        "shard",
        "encoding",
        "decoded_length",
        "digest",
        "size",
        "name",
        // Layouts, encodings and the common part names.
        "dense",
        "zt.zstd-seekable/1",
        "data",
        "values",
        "indices",
        "indptr",
        "scales",
        "zero_points",
        // Storage dtypes and logical types.
        "bool",
        "i8",
        "i16",
        "i32",
        "i64",
        "u8",
        "u16",
        "u32",
        "u64",
        "f16",
        "bf16",
        "f32",
        "f64",
        "complex64",
        "complex128",
        "f8_e4m3fn",
        "f8_e5m2",
    )
}

/// One head of the permitted subset, as a pull parser hands it out. Strings
/// borrow the input; arrays and maps give their item count, and their items
/// follow as the next tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Token<'a> {
    /// Major type 0.
    UInt(u64),
    /// Major type 1: `-1 - n`.
    NInt(u64),
    /// Major type 2.
    Bytes(&'a [u8]),
    /// Major type 3 (checked UTF-8).
    Text(&'a str),
    /// Major type 4 with this many items.
    Array(usize),
    /// Major type 5 with this many key/value pairs.
    Map(usize),
    /// `false` / `true`.
    Bool(bool),
    /// `null`.
    Null,
    /// A float of the narrowest exact width.
    Float(f64),
}

impl Token<'_> {
    /// A short name of the token's type, for error messages (as [`Cbor::kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            Token::UInt(_) => "unsigned integer",
            Token::NInt(_) => "negative integer",
            Token::Bytes(_) => "byte string",
            Token::Text(_) => "text string",
            Token::Array(_) => "array",
            Token::Map(_) => "map",
            Token::Bool(_) => "bool",
            Token::Null => "null",
            Token::Float(_) => "float",
        }
    }
}

/// Map keys seen so far in one map: each must sort strictly after the one
/// before it, on its encoded bytes (§4.2.1), so duplicates are refused too.
#[derive(Debug, Default)]
pub struct KeyOrder {
    prev: Option<(usize, usize)>,
}

/// A pull parser over one encoded item: every head, count, string and
/// float is checked as it is read (the same rules as [`decode`]), so a
/// reader can walk the manifest and keep only what it needs, borrowing
/// strings from the input rather than building a tree. Depth is the
/// number of arrays and maps around a token; a container at depth `d`
/// needs `d + 1 <= limits.depth`. Cloning one saves its place: a reader
/// can try a guess on the clone and keep the original if it was wrong.
#[derive(Clone)]
pub struct Pull<'a> {
    buf: &'a [u8],
    pos: usize,
    limits: DecodeLimits,
}

impl<'a> Pull<'a> {
    /// A parser at the start of `buf`.
    pub fn new(buf: &'a [u8], limits: DecodeLimits) -> Self {
        Pull {
            buf,
            pos: 0,
            limits,
        }
    }

    /// The offset of the next token.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Refuse bytes after the top-level item.
    pub fn finish(&self) -> Res<()> {
        if self.pos != self.buf.len() {
            return Err(self.err(
                rules::CBOR_SYNTAX,
                format!(
                    "{} trailing bytes after the top-level item",
                    self.buf.len() - self.pos
                ),
            ));
        }
        Ok(())
    }

    fn err(&self, rule: Rule, reason: impl Into<String>) -> Box<CborError> {
        Box::new(CborError {
            at: self.pos,
            rule,
            reason: reason.into(),
        })
    }

    #[inline]
    fn take(&mut self, n: usize) -> Res<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                self.err(rules::CBOR_SYNTAX, format!("truncated: {n} bytes declared"))
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// Read an initial byte and its argument, enforcing shortest form.
    /// Inline, as is its common case, an argument in the initial byte
    /// (keys, short text, small maps and arrays): it runs for every token.
    #[inline]
    fn head(&mut self) -> Res<(u8, u8, u64)> {
        let Some(&ib) = self.buf.get(self.pos) else {
            return Err(self.err(rules::CBOR_SYNTAX, "truncated: 1 bytes declared"));
        };
        let (major, ai) = (ib >> 5, ib & 0x1f);
        if ai < 24 {
            self.pos += 1;
            return Ok((major, ai, u64::from(ai)));
        }
        self.long_head(major, ai)
    }

    /// [`Pull::head`] for an argument in the bytes after the initial one.
    fn long_head(&mut self, major: u8, ai: u8) -> Res<(u8, u8, u64)> {
        let start = self.pos;
        self.pos += 1;
        let (value, min) = match ai {
            24 => (u64::from(self.take(1)?[0]), 24),
            25 => {
                let b = self.take(2)?;
                (u64::from(u16::from_be_bytes([b[0], b[1]])), 0x100)
            }
            26 => {
                let b = self.take(4)?;
                (
                    u64::from(u32::from_be_bytes(b.try_into().expect("4 bytes"))),
                    0x1_0000,
                )
            }
            27 => {
                let b = self.take(8)?;
                (
                    u64::from_be_bytes(b.try_into().expect("8 bytes")),
                    0x1_0000_0000,
                )
            }
            31 => {
                self.pos = start;
                return Err(self.err(rules::CBOR_SYNTAX, "indefinite length or break"));
            }
            _ => {
                self.pos = start;
                return Err(self.err(
                    rules::CBOR_SYNTAX,
                    format!("reserved additional information {ai}"),
                ));
            }
        };
        // Floats (major 7, ai 25-27) are checked for width separately.
        if major != 7 && value < min {
            self.pos = start;
            return Err(self.err(
                rules::CBOR_DETERMINISM,
                "non-shortest integer or length head",
            ));
        }
        Ok((major, ai, value))
    }

    /// A declared count of items, each at least one byte: refuse counts the
    /// remaining bytes cannot hold before anyone allocates for them.
    #[inline]
    fn count(&self, n: u64, min_bytes_each: u64) -> Res<usize> {
        let left = (self.buf.len() - self.pos) as u64;
        match n.checked_mul(min_bytes_each) {
            Some(need) if need <= left => Ok(n as usize),
            _ => Err(self.err(
                rules::CBOR_SYNTAX,
                format!("{n} items declared, {left} bytes left"),
            )),
        }
    }

    /// Take `bytes` if the input continues with exactly them; else take
    /// nothing. For a reader that knows the encoded form it expects (a map
    /// head, a key): equal bytes are a valid encoding because the expected
    /// ones are. The caller answers for nesting depth.
    /// (A fixed-size array, so the comparison is a few loads, not a call.)
    #[inline]
    pub fn literal<const N: usize>(&mut self, bytes: &[u8; N]) -> bool {
        let matches = self.buf[self.pos..].first_chunk::<N>() == Some(bytes);
        if matches {
            self.pos += N;
        }
        matches
    }

    /// A text string of at most 23 ASCII bytes (its length in the initial
    /// byte) at the cursor, taken; `None`, taking nothing, for anything
    /// else. Every key of the manifest and most of its values are such
    /// strings, so this is the path they take, inline.
    #[inline]
    pub fn short_ascii_text(&mut self) -> Option<&'a str> {
        let ib = *self.buf.get(self.pos)?;
        if !(0x60..0x78).contains(&ib) {
            return None;
        }
        let start = self.pos + 1;
        let raw = self.buf.get(start..start + usize::from(ib - 0x60))?;
        if !raw.iter().all(|&b| b < 0x80) {
            return None;
        }
        self.pos = start + raw.len();
        // SAFETY: ASCII bytes are valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(raw) })
    }

    /// The next token, found at nesting `depth`.
    pub fn token(&mut self, depth: usize) -> Res<Token<'a>> {
        if let Some(text) = self.short_ascii_text() {
            return Ok(Token::Text(text));
        }
        let start = self.pos;
        let (major, ai, v) = self.head()?;
        match major {
            0 => Ok(Token::UInt(v)),
            1 => Ok(Token::NInt(v)),
            2 => {
                let n = self.count(v, 1)?;
                Ok(Token::Bytes(self.take(n)?))
            }
            3 => {
                let n = self.count(v, 1)?;
                let at = self.pos;
                let raw = self.take(n)?;
                if raw.iter().all(|&b| b < 0x80) {
                    // The manifest's strings are nearly all short ASCII
                    // (keys, names, dtypes, digests), where the general
                    // check was a tenth of a 50k-tensor open; a plain loop,
                    // as the library's word-at-a-time check costs more
                    // than it saves on a few bytes.
                    // SAFETY: ASCII bytes are valid UTF-8.
                    return Ok(Token::Text(unsafe { std::str::from_utf8_unchecked(raw) }));
                }
                match std::str::from_utf8(raw) {
                    Ok(s) => Ok(Token::Text(s)),
                    Err(_) => Err(Box::new(CborError {
                        at,
                        rule: rules::CBOR_SYNTAX,
                        reason: "text string is not UTF-8".into(),
                    })),
                }
            }
            4 => {
                self.enter(depth, start)?;
                Ok(Token::Array(self.count(v, 1)?))
            }
            5 => {
                self.enter(depth, start)?;
                Ok(Token::Map(self.count(v, 2)?))
            }
            6 => {
                self.pos = start;
                Err(self.err(rules::CBOR_SYNTAX, "tags are not allowed"))
            }
            _ => self.simple(ai, v, start),
        }
    }

    /// A map key at `depth` (the map's depth + 1), whole (a key that is an
    /// array or map is read to its end), checked to sort after the map's
    /// previous key.
    pub fn key(&mut self, depth: usize, order: &mut KeyOrder) -> Res<Token<'a>> {
        let start = self.pos;
        let key = match self.short_ascii_text() {
            Some(text) => Token::Text(text),
            None => {
                let key = self.token(depth)?;
                self.skip_items(key, depth)?;
                key
            }
        };
        let span = (start, self.pos);
        if let Some((ps, pe)) = order.prev {
            match self.buf[ps..pe].cmp(&self.buf[span.0..span.1]) {
                Ordering::Less => {}
                Ordering::Equal => {
                    return Err(Box::new(CborError {
                        at: start,
                        rule: rules::CBOR_DUPLICATE_KEY,
                        reason: "duplicate map key".into(),
                    }))
                }
                Ordering::Greater => {
                    return Err(Box::new(CborError {
                        at: start,
                        rule: rules::CBOR_DETERMINISM,
                        reason: "map keys not in bytewise order".into(),
                    }))
                }
            }
        }
        order.prev = Some(span);
        Ok(key)
    }

    /// Skip (checking) the items of a container whose head `tok` was just
    /// read at `depth`; nothing for any other token.
    pub fn skip_items(&mut self, tok: Token<'a>, depth: usize) -> Res<()> {
        match tok {
            Token::Array(n) => {
                for _ in 0..n {
                    self.skip(depth + 1)?;
                }
            }
            Token::Map(n) => {
                let mut order = KeyOrder::default();
                for _ in 0..n {
                    self.key(depth + 1, &mut order)?;
                    self.skip(depth + 1)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Skip (checking) one whole item at `depth`.
    pub fn skip(&mut self, depth: usize) -> Res<()> {
        let tok = self.token(depth)?;
        self.skip_items(tok, depth)
    }

    /// The rest of an item whose head `tok` was read at `depth`, as a tree.
    pub fn finish_item(&mut self, tok: Token<'a>, depth: usize) -> Res<Cbor> {
        Ok(match tok {
            Token::UInt(v) => Cbor::UInt(v),
            Token::NInt(v) => Cbor::NInt(v),
            Token::Bytes(b) => Cbor::Bytes(b.to_vec()),
            Token::Text(s) => Cbor::Text(match interned(s) {
                Some(w) => Cow::Borrowed(w),
                None => Cow::Owned(s.to_string()),
            }),
            Token::Array(n) => {
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.item(depth + 1)?);
                }
                Cbor::Array(items)
            }
            Token::Map(n) => {
                let mut order = KeyOrder::default();
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let start = self.pos;
                    self.key(depth + 1, &mut order)?;
                    let end = self.pos;
                    // Re-read the (already checked) key as a tree.
                    self.pos = start;
                    let key = self.item(depth + 1)?;
                    debug_assert_eq!(self.pos, end);
                    entries.push((key, self.item(depth + 1)?));
                }
                Cbor::Map(entries)
            }
            Token::Bool(b) => Cbor::Bool(b),
            Token::Null => Cbor::Null,
            Token::Float(f) => Cbor::Float(f),
        })
    }

    /// One whole item at `depth`, as a tree (for attribute values, which
    /// zt keeps).
    pub fn item(&mut self, depth: usize) -> Res<Cbor> {
        let tok = self.token(depth)?;
        self.finish_item(tok, depth)
    }

    #[inline]
    fn enter(&mut self, depth: usize, start: usize) -> Res<()> {
        if depth + 1 > self.limits.depth {
            self.pos = start;
            return Err(self.err(
                rules::CBOR_DEPTH,
                format!("nesting deeper than {} levels", self.limits.depth),
            ));
        }
        Ok(())
    }

    fn simple(&mut self, ai: u8, v: u64, start: usize) -> Res<Token<'a>> {
        let fail = |d: &mut Self, rule: Rule, why: &str| {
            d.pos = start;
            Err(d.err(rule, why.to_string()))
        };
        match ai {
            20 => Ok(Token::Bool(false)),
            21 => Ok(Token::Bool(true)),
            22 => Ok(Token::Null),
            25 => {
                let f = f16_to_f64(v as u16);
                if f.is_nan() && v != 0x7e00 {
                    return fail(self, rules::CBOR_DETERMINISM, "NaN other than f9 7e00");
                }
                Ok(Token::Float(f))
            }
            26 => {
                let f = f64::from(f32::from_bits(v as u32));
                if f.is_nan() {
                    return fail(self, rules::CBOR_DETERMINISM, "NaN other than f9 7e00");
                }
                if f64_to_f16(f).is_some() {
                    return fail(
                        self,
                        rules::CBOR_DETERMINISM,
                        "single float whose value fits a half",
                    );
                }
                Ok(Token::Float(f))
            }
            27 => {
                let f = f64::from_bits(v);
                if f.is_nan() {
                    return fail(self, rules::CBOR_DETERMINISM, "NaN other than f9 7e00");
                }
                if fits_f32(f) {
                    return fail(
                        self,
                        rules::CBOR_DETERMINISM,
                        "double float whose value fits a narrower float",
                    );
                }
                Ok(Token::Float(f))
            }
            _ => fail(
                self,
                rules::CBOR_SYNTAX,
                "simple value other than false, true, null or a float",
            ),
        }
    }
}

/// IEEE half bits to f64.
pub fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = (h >> 10) & 0x1f;
    let mant = f64::from(h & 0x3ff);
    match exp {
        0 => sign * mant * 2f64.powi(-24),
        31 if mant == 0.0 => sign * f64::INFINITY,
        31 => f64::NAN,
        e => sign * (1.0 + mant / 1024.0) * 2f64.powi(i32::from(e) - 15),
    }
}

/// The half bits that represent `v` exactly, if any (NaN excluded).
pub fn f64_to_f16(v: f64) -> Option<u16> {
    if v.is_nan() {
        return None;
    }
    let bits = v.to_bits();
    let sign = ((bits >> 48) & 0x8000) as u16;
    if v == 0.0 {
        return Some(sign);
    }
    if v.is_infinite() {
        return Some(sign | 0x7c00);
    }
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        return None; // f64 subnormals are far below the half range
    }
    let e = exp - 1023;
    let mant = bits & ((1u64 << 52) - 1);
    if (-14..=15).contains(&e) {
        if mant & ((1u64 << 42) - 1) != 0 {
            return None;
        }
        return Some(sign | (((e + 15) as u16) << 10) | (mant >> 42) as u16);
    }
    if (-24..-14).contains(&e) {
        let sig = mant | (1u64 << 52);
        let shift = (28 - e) as u32; // value = sig * 2^(e-52) = m * 2^-24
        if sig & ((1u64 << shift) - 1) != 0 {
            return None;
        }
        return Some(sign | (sig >> shift) as u16);
    }
    None
}

fn fits_f32(v: f64) -> bool {
    f64::from(v as f32) == v
}

/// Encode `item` deterministically: shortest heads, map keys sorted by their
/// encoded bytes, floats in the narrowest exact width.
pub fn encode(item: &Cbor) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(item, &mut out);
    out
}

/// Append the head of an item of major type `major` with argument `v`
/// (a length, a count, or an unsigned integer's value).
pub(crate) fn head(out: &mut Vec<u8>, major: u8, v: u64) {
    let m = major << 5;
    if v < 24 {
        out.push(m | v as u8);
    } else if v <= 0xff {
        out.extend_from_slice(&[m | 24, v as u8]);
    } else if v <= 0xffff {
        out.push(m | 25);
        out.extend_from_slice(&(v as u16).to_be_bytes());
    } else if v <= 0xffff_ffff {
        out.push(m | 26);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Append a text string (major type 3).
pub(crate) fn encode_text(s: &str, out: &mut Vec<u8>) {
    head(out, 3, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// The order deterministic encoding puts text keys in: by their encoded
/// bytes, which for text strings is by length, then bytewise (a longer
/// string's head is never smaller, and equal-length heads are equal).
pub(crate) fn text_key_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

/// Append the deterministic encoding of `item` to `out`.
pub fn encode_into(item: &Cbor, out: &mut Vec<u8>) {
    match item {
        Cbor::UInt(v) => head(out, 0, *v),
        Cbor::NInt(v) => head(out, 1, *v),
        Cbor::Bytes(b) => {
            head(out, 2, b.len() as u64);
            out.extend_from_slice(b);
        }
        Cbor::Text(s) => {
            head(out, 3, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
        Cbor::Array(items) => {
            head(out, 4, items.len() as u64);
            for i in items {
                encode_into(i, out);
            }
        }
        Cbor::Map(entries) => {
            let mut encoded: Vec<(Vec<u8>, &Cbor)> =
                entries.iter().map(|(k, v)| (encode(k), v)).collect();
            encoded.sort_by(|a, b| a.0.cmp(&b.0));
            head(out, 5, encoded.len() as u64);
            for (k, v) in encoded {
                out.extend_from_slice(&k);
                encode_into(v, out);
            }
        }
        Cbor::Bool(false) => out.push(0xf4),
        Cbor::Bool(true) => out.push(0xf5),
        Cbor::Null => out.push(0xf6),
        Cbor::Float(f) => {
            if f.is_nan() {
                out.extend_from_slice(&[0xf9, 0x7e, 0x00]);
            } else if let Some(h) = f64_to_f16(*f) {
                out.push(0xf9);
                out.extend_from_slice(&h.to_be_bytes());
            } else if fits_f32(*f) {
                out.push(0xfa);
                out.extend_from_slice(&(*f as f32).to_bits().to_be_bytes());
            } else {
                out.push(0xfb);
                out.extend_from_slice(&f.to_bits().to_be_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: DecodeLimits = DecodeLimits { depth: MAX_DEPTH };

    fn rejects(bytes: &[u8]) -> String {
        decode(bytes, L).expect_err("must reject").reason
    }

    #[test]
    fn round_trips() {
        let item = Cbor::map([
            ("b", Cbor::Array(vec![Cbor::UInt(65536), Cbor::NInt(0)])),
            ("aa", Cbor::Float(0.1)),
            ("c", Cbor::Float(1.5)),
            ("d", Cbor::Float(f64::NAN)),
            ("e", Cbor::Float(100000.0)),
            ("f", Cbor::Bytes(vec![1, 2])),
            ("g", Cbor::Null),
            ("h", Cbor::Bool(true)),
        ]);
        let bytes = encode(&item);
        // "b" (1 char) sorts before "aa" (2 chars): encoded-byte order.
        assert_eq!(&bytes[1..3], b"\x61b");
        let back = decode(&bytes, L).unwrap();
        assert_eq!(encode(&back), bytes);
    }

    #[test]
    fn half_floats() {
        for (v, bits) in [
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (5.960_464_477_539_063e-8, 0x0001),
        ] {
            assert_eq!(f64_to_f16(v), Some(bits));
            assert_eq!(f16_to_f64(bits), v);
        }
        assert_eq!(f64_to_f16(0.1), None);
        assert_eq!(f64_to_f16(65520.0), None);
    }

    #[test]
    fn rejections() {
        assert!(rejects(&[0x18, 0x05]).contains("non-shortest"));
        assert!(rejects(&[0x19, 0x00, 0x20]).contains("non-shortest"));
        assert!(rejects(&[0x9f, 0xff]).contains("indefinite"));
        assert!(rejects(&[0xa2, 0x61, 0x62, 0x00, 0x61, 0x61, 0x00]).contains("order"));
        assert!(rejects(&[0xa2, 0x61, 0x61, 0x00, 0x61, 0x61, 0x00]).contains("duplicate"));
        assert!(rejects(&[0xc1, 0x00]).contains("tags"));
        assert!(rejects(&[0xf9, 0x7e, 0x01]).contains("NaN"));
        assert!(rejects(&[0xfa, 0x3f, 0x80, 0, 0]).contains("half"));
        assert!(rejects(&[0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0]).contains("narrower"));
        assert!(rejects(&[0xf7]).contains("simple"));
        assert!(rejects(&[0x62, 0xff, 0xfe]).contains("UTF-8"));
        // ASCII takes a shortcut past the UTF-8 check; other text does not.
        assert!(rejects(&[0x63, 0x61, 0xc3, 0x28]).contains("UTF-8"));
        assert!(rejects(&[0x61, 0x80]).contains("UTF-8"));
        assert_eq!(
            decode(&[0x62, 0xc3, 0xa9], L).unwrap(),
            Cbor::Text("é".into())
        );
        assert_eq!(
            decode(&[0x61, 0x7f], L).unwrap(),
            Cbor::Text("\u{7f}".into())
        );
        assert!(
            rejects(&[0x9b, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]).contains("declared")
        );
        assert!(rejects(&[0x00, 0x00]).contains("trailing"));
        let deep: Vec<u8> = std::iter::repeat_n(0x81u8, 33).chain([0x00]).collect();
        assert!(rejects(&deep).contains("nesting"));
        let ok: Vec<u8> = std::iter::repeat_n(0x81u8, 32).chain([0x00]).collect();
        assert!(decode(&ok, L).is_ok());
    }

    #[test]
    fn the_pull_parser_checks_what_the_tree_decoder_checks() {
        // Every rejection above, and a few valid items, through `check`
        // (which builds nothing): same verdict, same offset, same reason.
        let cases: &[&[u8]] = &[
            &[0x18, 0x05],
            &[0x9f, 0xff],
            &[0xa2, 0x61, 0x62, 0x00, 0x61, 0x61, 0x00],
            &[0xa2, 0x61, 0x61, 0x00, 0x61, 0x61, 0x00],
            &[0xa1, 0x81, 0x18, 0x01, 0x00],
            &[0xc1, 0x00],
            &[0xf9, 0x7e, 0x01],
            &[0x62, 0xff, 0xfe],
            &[0x00, 0x00],
            &[0x82, 0x01],
            &[0xa2, 0x61, 0x61, 0x00, 0x61, 0x62, 0x00],
            &[0xa1, 0x82, 0x01, 0x02, 0x63, 0x61, 0x62, 0x63],
            &[0x83, 0xf9, 0x3c, 0x00, 0x42, 0x01, 0x02, 0xf6],
        ];
        for bytes in cases {
            let tree = decode(bytes, L).map(|_| ());
            assert_eq!(check(bytes, L), tree, "{bytes:02x?}");
        }
        let deep: Vec<u8> = std::iter::repeat_n(0x81u8, 33).chain([0x00]).collect();
        assert_eq!(check(&deep, L), decode(&deep, L).map(|_| ()));
    }

    #[test]
    fn the_pull_parser_borrows_text_and_counts_containers() {
        let bytes = encode(&Cbor::map([("k", Cbor::Array(vec![Cbor::UInt(7)]))]));
        let mut p = Pull::new(&bytes, L);
        assert_eq!(p.token(0).unwrap(), Token::Map(1));
        let key = p.key(1, &mut KeyOrder::default()).unwrap();
        let Token::Text(k) = key else {
            panic!("{key:?}")
        };
        // Borrowed from the input, not copied.
        assert!(bytes.as_ptr_range().contains(&k.as_ptr()));
        assert_eq!(p.token(1).unwrap(), Token::Array(1));
        assert_eq!(p.token(2).unwrap(), Token::UInt(7));
        p.finish().unwrap();
    }
}
