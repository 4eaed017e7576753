//! The JSON of loaderx 2.8's schema: written as Python's `json.dumps`
//! writes it, read by a small strict parser that accepts what Python's
//! `json.loads` accepts (RFC 8259 plus `NaN`/`Infinity`), keeps every value
//! a schema can hold and records what the others were. Nesting is bounded,
//! so no input can exhaust the stack.

use crate::schema::Value;

/// Deepest nesting of arrays and objects accepted (a schema needs 2).
const MAX_DEPTH: usize = 32;

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
}

type Parsed<T> = Result<T, &'static str>;

impl Parser<'_> {
    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    fn eat(&mut self, c: u8) -> Parsed<()> {
        if self.peek() == Some(c) {
            self.at += 1;
            Ok(())
        } else {
            Err(match c {
                b':' => "expected ':' after an object key",
                b'"' => "expected a string",
                _ => "unexpected character",
            })
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        if self.b[self.at..].starts_with(word) {
            self.at += word.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Parsed<Value> {
        self.skip_ws();
        let v = match self.peek().ok_or("truncated JSON")? {
            b'"' => Value::Str(self.string()?),
            b'{' => {
                self.object(depth + 1)?;
                Value::Other("an object")
            }
            b'[' => Value::Array(self.array(depth + 1)?),
            b'-' | b'0'..=b'9' => self.number()?,
            _ if self.literal(b"true") || self.literal(b"false") => Value::Other("a boolean"),
            _ if self.literal(b"null") => Value::Other("null"),
            _ if self.literal(b"NaN") || self.literal(b"Infinity") => Value::Other("a float"),
            _ => return Err("unexpected character"),
        };
        self.skip_ws();
        Ok(v)
    }

    fn object(&mut self, depth: usize) -> Parsed<Vec<(String, Value)>> {
        if depth > MAX_DEPTH {
            return Err("JSON nested too deep");
        }
        self.eat(b'{')?;
        let mut fields = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(fields);
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err("object keys must be strings");
            }
            let key = self.string()?;
            self.skip_ws();
            self.eat(b':')?;
            let value = self.value(depth)?;
            fields.push((key, value));
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(fields);
                }
                _ => return Err("expected ',' or '}' in an object"),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Parsed<Vec<Value>> {
        if depth > MAX_DEPTH {
            return Err("JSON nested too deep");
        }
        self.eat(b'[')?;
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(items);
        }
        loop {
            let v = self.value(depth)?;
            items.push(match v {
                Value::Array(_) => Value::Other("an array"),
                v => v,
            });
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(items);
                }
                _ => return Err("expected ',' or ']' in an array"),
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
    fn number(&mut self) -> Parsed<Value> {
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
            if self.literal(b"Infinity") {
                return Ok(Value::Other("a float"));
            }
        }
        let int_start = self.at;
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err("malformed number"),
        }
        let int_end = self.at;
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return Err("malformed number");
            }
            float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if self.digits() == 0 {
                return Err("malformed number");
            }
            float = true;
        }
        if float {
            return Ok(Value::Other("a float"));
        }
        let text = std::str::from_utf8(&self.b[int_start..int_end]).expect("ASCII digits");
        Ok(match (negative, text.parse::<u64>()) {
            (true, _) if text == "0" => Value::UInt(0),
            (true, _) => Value::Other("a negative integer"),
            (false, Ok(v)) => Value::UInt(v),
            (false, Err(_)) => Value::Other("an integer of 2^64 or more"),
        })
    }

    fn hex4(&mut self) -> Parsed<u32> {
        let s = self
            .b
            .get(self.at..self.at + 4)
            .ok_or("truncated \\u escape")?;
        let s = std::str::from_utf8(s).map_err(|_| "malformed \\u escape")?;
        if !s.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err("malformed \\u escape");
        }
        self.at += 4;
        Ok(u32::from_str_radix(s, 16).expect("hex digits"))
    }

    fn string(&mut self) -> Parsed<String> {
        self.eat(b'"')?;
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
            match self.peek().ok_or("unterminated string")? {
                b'"' => {
                    self.at += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.at += 1;
                    let c = self.peek().ok_or("unterminated string")?;
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
                                    return Err("unpaired surrogate in a string");
                                }
                                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                            } else {
                                hi
                            };
                            char::from_u32(code).ok_or("unpaired surrogate in a string")?
                        }
                        _ => return Err("invalid escape in a string"),
                    });
                }
                _ => return Err("control character in a string"),
            }
        }
    }
}

/// The fields of a JSON object, in order (a repeated key is kept twice).
pub(crate) fn decode_object(bytes: &[u8]) -> Result<Vec<(String, Value)>, &'static str> {
    std::str::from_utf8(bytes).map_err(|_| "schema is not UTF-8")?;
    let mut p = Parser { b: bytes, at: 0 };
    p.skip_ws();
    if p.peek() != Some(b'{') {
        // Valid JSON that is not an object is refused all the same.
        p.value(0)?;
        if p.at == bytes.len() {
            return Err("schema is not a JSON object");
        }
        return Err("unexpected character");
    }
    let fields = p.object(1)?;
    p.skip_ws();
    if p.at != bytes.len() {
        return Err("trailing bytes after the schema object");
    }
    Ok(fields)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
