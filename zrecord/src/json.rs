//! JSON read as Python's `json.loads` reads it, and written as
//! `json.dumps` writes it: the one JSON reader of the record stores and the
//! loader (a schema in `meta.zr`, a saved loader state).
//!
//! [`decode`] is a small strict parser that accepts what `json.loads`
//! accepts (RFC 8259 plus `NaN`/`Infinity`), keeps integers of any size as
//! their decimal text and every other value as `json.loads` types it
//! ([`Value`]), and fails with where and why ([`Error`], [`ErrorKind`]).
//! Nesting is bounded by the caller, so no input can exhaust the stack.
//! `decode_object` is the schema's view of it.

use std::fmt;

use crate::schema::Value as SchemaValue;

/// Deepest nesting of arrays and objects accepted in a schema (it needs 2).
const SCHEMA_MAX_DEPTH: usize = 32;

/// One JSON value, typed as Python's `json.loads` types it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `null` (Python's `None`).
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer of any size, as its decimal text (an optional `-`, then
    /// digits, no leading zero): Python's `int`.
    Int(String),
    /// A number with a fraction or an exponent, or `NaN`, `Infinity`,
    /// `-Infinity`: Python's `float` (so `1e400` is infinite).
    Float(f64),
    /// A string.
    Str(String),
    /// An array (Python's `list`).
    Array(Vec<Value>),
    /// An object's members in order, a repeated key kept twice (Python's
    /// `dict` keeps the last).
    Object(Vec<(String, Value)>),
}

impl Value {
    /// The name of the Python type `json.loads` gives this value: `int`,
    /// `float`, `str`, `bool`, `NoneType`, `list` or `dict`.
    pub fn python_type(&self) -> &'static str {
        match self {
            Value::Null => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Array(_) => "list",
            Value::Object(_) => "dict",
        }
    }
}

/// Why a text is not JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The bytes are not UTF-8.
    NotUtf8,
    /// The text ends where a value should start.
    Truncated,
    /// A character that starts no value.
    UnexpectedCharacter,
    /// No `:` after an object key.
    ExpectedColon,
    /// An object key that is not a string.
    KeyNotString,
    /// Neither `,` nor `}` after an object member.
    ExpectedCommaOrBrace,
    /// Neither `,` nor `]` after an array item.
    ExpectedCommaOrBracket,
    /// Arrays and objects nested deeper than the caller allows.
    TooDeep,
    /// A number not of JSON's form (`01`, `1.`, `1e`, `-`), reported at its
    /// first byte.
    MalformedNumber,
    /// A string with no closing quote.
    UnterminatedString,
    /// A `\u` escape cut short by the end of the text.
    TruncatedEscape,
    /// A `\u` escape whose four characters are not hex digits.
    MalformedEscape,
    /// A `\u` escape of half a surrogate pair.
    UnpairedSurrogate,
    /// A backslash before a character JSON does not escape.
    InvalidEscape,
    /// A control character (below U+0020) inside a string.
    ControlCharacter,
    /// More than whitespace after the value.
    TrailingBytes,
}

impl ErrorKind {
    /// What went wrong, in words.
    pub fn message(self) -> &'static str {
        match self {
            ErrorKind::NotUtf8 => "not UTF-8",
            ErrorKind::Truncated => "truncated JSON",
            ErrorKind::UnexpectedCharacter => "unexpected character",
            ErrorKind::ExpectedColon => "expected ':' after an object key",
            ErrorKind::KeyNotString => "object keys must be strings",
            ErrorKind::ExpectedCommaOrBrace => "expected ',' or '}' in an object",
            ErrorKind::ExpectedCommaOrBracket => "expected ',' or ']' in an array",
            ErrorKind::TooDeep => "JSON nested too deep",
            ErrorKind::MalformedNumber => "malformed number",
            ErrorKind::UnterminatedString => "unterminated string",
            ErrorKind::TruncatedEscape => "truncated \\u escape",
            ErrorKind::MalformedEscape => "malformed \\u escape",
            ErrorKind::UnpairedSurrogate => "unpaired surrogate in a string",
            ErrorKind::InvalidEscape => "invalid escape in a string",
            ErrorKind::ControlCharacter => "control character in a string",
            ErrorKind::TrailingBytes => "trailing bytes after the value",
        }
    }
}

/// A text that is not JSON: why, and the byte offset where it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error {
    /// Why.
    pub kind: ErrorKind,
    /// The offset of the byte at which it was found.
    pub at: usize,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} at byte {}", self.kind.message(), self.at)
    }
}

impl std::error::Error for Error {}

/// Append `s` as a JSON string the way `json.dumps` (ensure_ascii) does.
pub(crate) fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            ' '..='~' => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
}

struct Parser<'a> {
    b: &'a [u8],
    at: usize,
    max_depth: usize,
}

type Parsed<T> = Result<T, Error>;

impl Parser<'_> {
    fn fail<T>(&self, kind: ErrorKind) -> Parsed<T> {
        Err(Error { kind, at: self.at })
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.b[self.at..].starts_with(word) {
            self.at += word.len();
            true
        } else {
            false
        }
    }

    /// A value and the whitespace after it; `depth` arrays and objects
    /// enclose it.
    fn value(&mut self, depth: usize) -> Parsed<Value> {
        self.skip_ws();
        let Some(c) = self.peek() else {
            return self.fail(ErrorKind::Truncated);
        };
        let v = match c {
            b'"' => Value::Str(self.string()?),
            b'{' => Value::Object(self.object(depth + 1)?),
            b'[' => Value::Array(self.array(depth + 1)?),
            b'-' | b'0'..=b'9' => self.number()?,
            _ if self.literal(b"true") => Value::Bool(true),
            _ if self.literal(b"false") => Value::Bool(false),
            _ if self.literal(b"null") => Value::Null,
            _ if self.literal(b"NaN") => Value::Float(f64::NAN),
            _ if self.literal(b"Infinity") => Value::Float(f64::INFINITY),
            _ => return self.fail(ErrorKind::UnexpectedCharacter),
        };
        self.skip_ws();
        Ok(v)
    }

    fn object(&mut self, depth: usize) -> Parsed<Vec<(String, Value)>> {
        if depth > self.max_depth {
            return self.fail(ErrorKind::TooDeep);
        }
        self.at += 1; // '{'
        let mut fields = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(fields);
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return self.fail(ErrorKind::KeyNotString);
            }
            let key = self.string()?;
            self.skip_ws();
            if self.peek() != Some(b':') {
                return self.fail(ErrorKind::ExpectedColon);
            }
            self.at += 1;
            let value = self.value(depth)?;
            fields.push((key, value));
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(fields);
                }
                _ => return self.fail(ErrorKind::ExpectedCommaOrBrace),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Parsed<Vec<Value>> {
        if depth > self.max_depth {
            return self.fail(ErrorKind::TooDeep);
        }
        self.at += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(items);
        }
        loop {
            items.push(self.value(depth)?);
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(items);
                }
                _ => return self.fail(ErrorKind::ExpectedCommaOrBracket),
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        self.at - start
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, or `-Infinity`.
    /// A malformed number, reported at its first byte.
    fn malformed_number<T>(&mut self, start: usize) -> Parsed<T> {
        self.at = start;
        self.fail(ErrorKind::MalformedNumber)
    }

    fn number(&mut self) -> Parsed<Value> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
            if self.literal(b"Infinity") {
                return Ok(Value::Float(f64::NEG_INFINITY));
            }
        }
        match self.peek() {
            Some(b'0') => {
                self.at += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return self.malformed_number(start);
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.malformed_number(start),
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return self.malformed_number(start);
            }
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return self.malformed_number(start);
            }
            float = true;
        }
        let text = std::str::from_utf8(&self.b[start..self.at]).expect("ASCII");
        Ok(if float {
            // Rust reads every such text (overflowing to infinity, as
            // Python's float() does).
            Value::Float(text.parse().expect("a JSON number"))
        } else {
            Value::Int(text.to_string())
        })
    }

    fn hex4(&mut self) -> Parsed<u32> {
        let Some(s) = self.b.get(self.at..self.at + 4) else {
            return self.fail(ErrorKind::TruncatedEscape);
        };
        if !s.iter().all(u8::is_ascii_hexdigit) {
            return self.fail(ErrorKind::MalformedEscape);
        }
        let s = std::str::from_utf8(s).expect("hex digits");
        self.at += 4;
        Ok(u32::from_str_radix(s, 16).expect("hex digits"))
    }

    fn string(&mut self) -> Parsed<String> {
        self.at += 1; // '"'
        let mut out = String::new();
        loop {
            let start = self.at;
            while let Some(&c) = self.b.get(self.at) {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.at += 1;
            }
            // The input was checked to be UTF-8 as a whole, and the run ends
            // at an ASCII byte, so it is a whole number of characters.
            out.push_str(std::str::from_utf8(&self.b[start..self.at]).expect("UTF-8"));
            match self.peek() {
                None => return self.fail(ErrorKind::UnterminatedString),
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    let Some(c) = self.peek() else {
                        return self.fail(ErrorKind::UnterminatedString);
                    };
                    self.at += 1;
                    out.push(match c {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let hi = self.hex4()?;
                            let code = if (0xd800..0xdc00).contains(&hi) && self.literal(b"\\u") {
                                let lo = self.hex4()?;
                                if !(0xdc00..0xe000).contains(&lo) {
                                    return self.fail(ErrorKind::UnpairedSurrogate);
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else {
                                hi
                            };
                            match char::from_u32(code) {
                                Some(c) => c,
                                None => return self.fail(ErrorKind::UnpairedSurrogate),
                            }
                        }
                        _ => {
                            self.at -= 1;
                            return self.fail(ErrorKind::InvalidEscape);
                        }
                    });
                }
                Some(_) => return self.fail(ErrorKind::ControlCharacter),
            }
        }
    }
}

/// Read one JSON document: a value with nothing but whitespace around it,
/// arrays and objects nested at most `max_depth` deep (the outermost one
/// counted; 0 admits only scalars).
pub fn decode(bytes: &[u8], max_depth: usize) -> Result<Value, Error> {
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(Error {
            kind: ErrorKind::NotUtf8,
            at: e.valid_up_to(),
        });
    }
    let mut p = Parser {
        b: bytes,
        at: 0,
        max_depth,
    };
    let value = p.value(0)?;
    if p.at != bytes.len() {
        return p.fail(ErrorKind::TrailingBytes);
    }
    Ok(value)
}

/// A member's value as a schema holds it: strings, integers below 2^64 and
/// arrays of them; anything else named for messages.
fn schema_value(value: Value, nested: bool) -> SchemaValue {
    match value {
        Value::Str(s) => SchemaValue::Str(s),
        Value::Int(text) => match text.strip_prefix('-') {
            Some("0") => SchemaValue::UInt(0),
            Some(_) => SchemaValue::Other("a negative integer"),
            None => match text.parse::<u64>() {
                Ok(v) => SchemaValue::UInt(v),
                Err(_) => SchemaValue::Other("an integer of 2^64 or more"),
            },
        },
        Value::Array(_) if nested => SchemaValue::Other("an array"),
        Value::Array(items) => {
            SchemaValue::Array(items.into_iter().map(|v| schema_value(v, true)).collect())
        }
        Value::Object(_) => SchemaValue::Other("an object"),
        Value::Bool(_) => SchemaValue::Other("a boolean"),
        Value::Null => SchemaValue::Other("null"),
        Value::Float(_) => SchemaValue::Other("a float"),
    }
}

/// The fields of a schema's JSON object, in order (a repeated key is kept
/// twice), or why it is not one.
pub(crate) fn decode_object(bytes: &[u8]) -> Result<Vec<(String, SchemaValue)>, &'static str> {
    let object = bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        == Some(&b'{');
    match decode(bytes, SCHEMA_MAX_DEPTH) {
        Ok(Value::Object(fields)) => Ok(fields
            .into_iter()
            .map(|(k, v)| (k, schema_value(v, false)))
            .collect()),
        // Valid JSON that is not an object is refused all the same.
        Ok(_) => Err("schema is not a JSON object"),
        Err(e) => Err(match e.kind {
            ErrorKind::NotUtf8 => "schema is not UTF-8",
            ErrorKind::TrailingBytes if object => "trailing bytes after the schema object",
            ErrorKind::TrailingBytes => "unexpected character",
            kind => kind.message(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Value;

    #[test]
    fn strings_round_trip_like_json_dumps() {
        let mut out = String::new();
        write_str(&mut out, "a\"\\\n\u{1}é😀");
        assert_eq!(out, r#""a\"\\\n\u0001\u00e9\ud83d\ude00""#);
        let doc = format!("{{\"k\": {out}}}");
        let fields = decode_object(doc.as_bytes()).unwrap();
        assert_eq!(fields[0].1, Value::Str("a\"\\\n\u{1}é😀".into()));
    }

    #[test]
    fn values_a_schema_cannot_hold_are_named() {
        let fields = decode_object(
            br#"{"a": -3, "b": 1e2, "c": [1, [2], {}], "d": null, "e": -0, "f": 18446744073709551616, "g": -Infinity}"#,
        )
        .unwrap();
        let got: Vec<&Value> = fields.iter().map(|(_, v)| v).collect();
        assert_eq!(got[0], &Value::Other("a negative integer"));
        assert_eq!(got[1], &Value::Other("a float"));
        assert_eq!(
            got[2],
            &Value::Array(vec![
                Value::UInt(1),
                Value::Other("an array"),
                Value::Other("an object")
            ])
        );
        assert_eq!(got[3], &Value::Other("null"));
        assert_eq!(got[4], &Value::UInt(0));
        assert_eq!(got[5], &Value::Other("an integer of 2^64 or more"));
        assert_eq!(got[6], &Value::Other("a float"));
    }

    #[test]
    fn deep_nesting_is_refused_not_recursed() {
        let doc = format!("{{\"a\": {}{}}}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(decode_object(doc.as_bytes()), Err("JSON nested too deep"));
        assert!(decode_object(b"{\"a\": \"\\ud800\"}").is_err());
        assert!(decode_object(b"{\"a\": 1,}").is_err());
        assert!(decode_object(b"\xef\xbb\xbf{}").is_err());
    }

    #[test]
    fn values_are_typed_as_json_loads_types_them() {
        use super::Value as Json;
        let doc = br#" {"a": -18446744073709551617, "b": [true, null, 1.5e0, NaN], "c": {"d": "e"}, "a": 0} "#;
        let Ok(Json::Object(members)) = decode(doc, 3) else {
            panic!("an object")
        };
        assert_eq!(members[0].1, Json::Int("-18446744073709551617".into()));
        let Json::Array(items) = &members[1].1 else {
            panic!("an array")
        };
        assert_eq!(items[..3], [Json::Bool(true), Json::Null, Json::Float(1.5)]);
        assert!(matches!(items[3], Json::Float(f) if f.is_nan()));
        assert_eq!(members[2].1.python_type(), "dict");
        assert_eq!(members.len(), 4);
        let err = |doc: &[u8], depth| decode(doc, depth).unwrap_err();
        assert_eq!(
            err(doc, 1),
            Error {
                kind: ErrorKind::TooDeep,
                at: 35
            }
        );
        assert_eq!(err(b"[01]", 2).kind, ErrorKind::MalformedNumber);
        assert_eq!(
            err(b"[1] x", 2).to_string(),
            "trailing bytes after the value at byte 4"
        );
        assert_eq!(
            err(b"\"\\q\"", 0),
            Error {
                kind: ErrorKind::InvalidEscape,
                at: 2
            }
        );
        assert_eq!(
            err(b"\"\xff\"", 0),
            Error {
                kind: ErrorKind::NotUtf8,
                at: 1
            }
        );
    }
}
