//! The `.npy` header: the preamble (magic, version, header length), the
//! Python dict literal that follows it, and the `descr` dtype strings.
//!
//! numpy reads the header with `ast.literal_eval`; we accept the subset of
//! Python literal syntax that numpy writers produce (strings, ints, booleans,
//! tuples, lists, one dict) through a small tokenizer, and refuse everything
//! else, so a header can never make us evaluate or allocate without bound.

use crate::npy::rules;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::Rule;

/// `\x93NUMPY`, then a major and a minor version byte.
pub const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// numpy pads `magic + length + header` to a multiple of this (`ARRAY_ALIGN`).
const ARRAY_ALIGN: usize = 64;

/// Spare spaces numpy appends so a growing axis can be rewritten in place
/// (`GROWTH_AXIS_MAX_DIGITS`).
const GROWTH_AXIS_MAX_DIGITS: usize = 21;

/// The bytes before the header dict: magic, version, header length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    /// Major version, 1 to 3.
    pub major: u8,
    /// Bytes of magic, version and length field (10 for v1, 12 for v2/v3).
    pub prefix_len: u64,
}

/// Check the first 8 bytes (magic and version) and say how long the whole
/// preamble is. `bytes` must hold at least 8 bytes.
pub fn preamble(ctx: &Context, bytes: &[u8]) -> Result<Preamble> {
    if bytes.len() < 8 || &bytes[..6] != MAGIC {
        return Err(Error::header(
            ctx.clone(),
            rules::MAGIC,
            "no \\x93NUMPY magic",
        ));
    }
    let (major, minor) = (bytes[6], bytes[7]);
    if !(1..=3).contains(&major) || minor != 0 {
        return Err(Error::header(
            ctx.clone(),
            rules::VERSION,
            format!("unsupported .npy format version {major}.{minor}"),
        ));
    }
    Ok(Preamble {
        major,
        prefix_len: if major == 1 { 10 } else { 12 },
    })
}

/// The header length stored after the version: u16 LE for v1, u32 LE for
/// v2/v3. `bytes` is the whole preamble.
pub fn header_len(p: &Preamble, bytes: &[u8]) -> u64 {
    match p.major {
        1 => u64::from(u16::from_le_bytes([bytes[8], bytes[9]])),
        _ => u64::from(u32::from_le_bytes([
            bytes[8], bytes[9], bytes[10], bytes[11],
        ])),
    }
}

/// What the header dict declares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Element type.
    pub dtype: DType,
    /// The data is big-endian and must be swapped (never for 1-byte types).
    pub swap: bool,
    /// The data is in Fortran (column-major) order.
    pub fortran_order: bool,
    /// Shape; `()` is a scalar.
    pub shape: Vec<u64>,
    /// A dtype zt has no element type for but numpy reads without
    /// unpickling (structured, subarray, `S`/`U`/`V` strings, datetimes):
    /// then `dtype` is `U8` and the data is `itemsize` bytes per element.
    pub record: Option<Record>,
}

/// A numpy dtype read as its bytes: the descr as a Python literal (what
/// `numpy.lib.format.descr_to_dtype` takes after `ast.literal_eval`) and
/// the bytes of one element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The descr, written back as a Python literal.
    pub descr: String,
    /// Bytes per element.
    pub itemsize: u64,
}

/// Map a numpy `descr` string to a dtype and whether its bytes need
/// swapping. `None` for every descr zt does not read (objects, strings,
/// datetimes, `f16`/`c32` long doubles, ...).
pub fn parse_descr(descr: &str) -> Option<(DType, bool)> {
    // `=` is native order and `|` "not applicable"; numpy files are written
    // on little-endian machines, so both mean little-endian here. A missing
    // byte-order character is accepted as numpy's `dtype()` accepts it.
    let (big, code) = match descr.as_bytes().first()? {
        b'<' | b'=' | b'|' => (false, &descr[1..]),
        b'>' => (true, &descr[1..]),
        _ => (false, descr),
    };
    let dtype = match code {
        "b1" => DType::Bool,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        "c8" => DType::Complex64,
        "c16" => DType::Complex128,
        _ => return None,
    };
    Some((dtype, big && dtype.swap_width() > 1))
}

/// The `descr` numpy writes for a dtype, or `None` when numpy has no
/// builtin type for it (bf16, fp8, fp4, fp6).
pub fn descr_for(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::Bool => "|b1",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::F16 => "<f2",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::Complex64 => "<c8",
        DType::Complex128 => "<c16",
        _ => return None,
    })
}

/// Parse the header dict. `raw` is the header as stored (latin-1 for v1/v2,
/// UTF-8 for v3).
pub fn parse(ctx: &Context, raw: &[u8], major: u8, limits: &Limits) -> Result<Header> {
    let text = match major {
        // latin-1 maps each byte to the code point of the same value.
        1 | 2 => raw.iter().map(|&b| char::from(b)).collect::<String>(),
        _ => String::from_utf8(raw.to_vec())
            .map_err(|_| Error::header(ctx.clone(), rules::HEADER, "v3 header is not UTF-8"))?,
    };
    let mut parser = Parser {
        ctx,
        text: &text,
        pos: 0,
        depth: 0,
        max_depth: limits.depth,
        // Python 2 wrote `3L`; numpy strips the suffix for v1 and v2 only.
        allow_long: major <= 2,
    };
    let value = parser.value()?;
    parser.skip_space();
    if parser.pos != text.len() {
        return Err(parser.error("characters after the header dict"));
    }
    let Lit::Dict(items) = value else {
        return Err(Error::header(
            ctx.clone(),
            rules::HEADER,
            "header is not a dict",
        ));
    };
    header_from_dict(ctx, items, limits)
}

/// Check the dict has exactly the three keys and turn their values into a
/// [`Header`].
fn header_from_dict(ctx: &Context, items: Vec<(Lit, Lit)>, limits: &Limits) -> Result<Header> {
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    for (key, value) in items {
        let slot = match &key {
            Lit::Str(k) if k == "descr" => &mut descr,
            Lit::Str(k) if k == "fortran_order" => &mut fortran,
            Lit::Str(k) if k == "shape" => &mut shape,
            other => {
                return Err(Error::header(
                    ctx.clone(),
                    rules::HEADER,
                    format!("unexpected key {}", other.describe()),
                ))
            }
        };
        if slot.replace(value).is_some() {
            return Err(Error::header(
                ctx.clone(),
                rules::HEADER,
                format!("key {} appears twice", key.describe()),
            ));
        }
    }
    let missing = |k: &str| Error::header(ctx.clone(), rules::HEADER, format!("no {k:?} key"));
    let descr = descr.ok_or_else(|| missing("descr"))?;
    let fortran = fortran.ok_or_else(|| missing("fortran_order"))?;
    let shape = shape.ok_or_else(|| missing("shape"))?;

    let plain = match &descr {
        Lit::Str(s) => parse_descr(s),
        Lit::List(_) | Lit::Tuple(_) => None,
        other => {
            return Err(Error::header(
                ctx.clone(),
                rules::HEADER,
                format!("descr is {}, not a string", other.describe()),
            ))
        }
    };
    // Anything else numpy reads without unpickling (a list is a structured
    // dtype, a tuple a subarray; strings, bytes, voids and datetimes) is
    // read as its bytes, for Python to view through the same numpy dtype.
    // Object fields are pickles: refused.
    let (dtype, swap, record) = match plain {
        Some((dtype, swap)) => (dtype, swap, None),
        None => {
            let itemsize = descr_itemsize(&descr, ctx, 0)?;
            let record = Record {
                descr: descr.repr(),
                itemsize,
            };
            (DType::U8, false, Some(record))
        }
    };
    let Lit::Bool(fortran_order) = fortran else {
        return Err(Error::header(
            ctx.clone(),
            rules::HEADER,
            format!("fortran_order is {}, not a bool", fortran.describe()),
        ));
    };
    let Lit::Tuple(dims) = shape else {
        return Err(Error::header(
            ctx.clone(),
            rules::HEADER,
            format!("shape is {}, not a tuple", shape.describe()),
        ));
    };
    limits.check_rank(ctx, dims.len())?;
    let shape = dims
        .into_iter()
        .map(|d| match d {
            Lit::Int(n) => Ok(n),
            other => Err(Error::header(
                ctx.clone(),
                rules::HEADER,
                format!("shape holds {}, not an int", other.describe()),
            )),
        })
        .collect::<Result<Vec<u64>>>()?;
    Ok(Header {
        dtype,
        swap,
        fortran_order,
        shape,
        record,
    })
}

/// The bytes one element of a numpy descr takes, as numpy lays it out: a
/// typestr's size (`U` counts 4-byte code points), a list's fields one after
/// another (numpy writes padding as explicit `('', '|Vn')` fields), a
/// subarray's base times its shape. An object (`O`) anywhere is a pickle:
/// [`Error::UnsupportedDType`].
fn descr_itemsize(descr: &Lit, ctx: &Context, depth: usize) -> Result<u64> {
    let unsupported = |why: String| Error::UnsupportedDType {
        rule: Rule::DTYPE,
        ctx: ctx.clone(),
        dtype: why,
    };
    let overflow = || Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "npy dtype size",
    };
    // The parser bounded the nesting of the text already; this bounds the
    // recursion over it the same way.
    if depth > 64 {
        return Err(unsupported("a descr nested too deeply".into()));
    }
    let times_shape = |size: u64, shape: &Lit| -> Result<u64> {
        let dims = match shape {
            Lit::Int(n) => vec![*n],
            Lit::Tuple(items) => items
                .iter()
                .map(|d| match d {
                    Lit::Int(n) => Ok(*n),
                    other => Err(unsupported(format!(
                        "subarray shape holds {}",
                        other.describe()
                    ))),
                })
                .collect::<Result<_>>()?,
            other => {
                return Err(unsupported(format!(
                    "subarray shape is {}",
                    other.describe()
                )))
            }
        };
        dims.iter()
            .try_fold(size, |acc, &d| acc.checked_mul(d))
            .ok_or_else(overflow)
    };
    match descr {
        Lit::Str(s) => typestr_size(s).ok_or_else(|| {
            unsupported(
                if s.trim_start_matches(['<', '>', '|', '=']).starts_with('O') {
                    format!("{s:?}: object arrays are pickles, which zt never loads")
                } else {
                    format!("{s:?}")
                },
            )
        }),
        // `(base, shape)`: a subarray dtype.
        Lit::Tuple(items) if items.len() == 2 => {
            times_shape(descr_itemsize(&items[0], ctx, depth + 1)?, &items[1])
        }
        Lit::List(fields) => {
            let mut total = 0u64;
            for field in fields {
                let Lit::Tuple(f) = field else {
                    return Err(unsupported(format!(
                        "structured field is {}",
                        field.describe()
                    )));
                };
                let size = match f.as_slice() {
                    [name, base] | [name, base, _] => {
                        // A name is a string, or a (title, name) pair.
                        let named = match name {
                            Lit::Str(_) => true,
                            Lit::Tuple(t) => {
                                t.len() == 2 && t.iter().all(|x| matches!(x, Lit::Str(_)))
                            }
                            _ => false,
                        };
                        if !named {
                            return Err(unsupported(format!("field name is {}", name.describe())));
                        }
                        let size = descr_itemsize(base, ctx, depth + 1)?;
                        match f.get(2) {
                            Some(shape) => times_shape(size, shape)?,
                            None => size,
                        }
                    }
                    _ => {
                        return Err(unsupported(format!(
                            "structured field is {}",
                            field.describe()
                        )))
                    }
                };
                total = total.checked_add(size).ok_or_else(overflow)?;
            }
            Ok(total)
        }
        other => Err(unsupported(format!("descr {}", other.describe()))),
    }
}

/// The size of a numpy typestr (`dtype.str`: byte order, kind, size, and a
/// unit for datetimes), for the kinds numpy reads without unpickling.
fn typestr_size(s: &str) -> Option<u64> {
    let code = s.strip_prefix(['<', '>', '|', '=']).unwrap_or(s);
    let kind = code.chars().next()?;
    let rest = &code[kind.len_utf8()..];
    let (digits, unit) = match rest.find('[') {
        Some(i) => (&rest[..i], Some(&rest[i..])),
        None => (rest, None),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 18 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let unit_ok = |u: Option<&str>| match u {
        None => true,
        Some(u) => {
            u.len() > 2
                && u.ends_with(']')
                && u[1..u.len() - 1].bytes().all(|b| b.is_ascii_alphanumeric())
        }
    };
    match kind {
        'b' if n == 1 && unit.is_none() => Some(1),
        'i' | 'u' if matches!(n, 1 | 2 | 4 | 8) && unit.is_none() => Some(n),
        'f' if matches!(n, 2 | 4 | 8 | 12 | 16) && unit.is_none() => Some(n),
        'c' if matches!(n, 8 | 16 | 24 | 32) && unit.is_none() => Some(n),
        'S' | 'a' | 'V' if unit.is_none() => Some(n),
        'U' if unit.is_none() => n.checked_mul(4),
        'M' | 'm' if n == 8 && unit_ok(unit) => Some(8),
        _ => None,
    }
}

/// A Python literal from the supported subset.
#[derive(Debug, Clone, PartialEq)]
enum Lit {
    Str(String),
    Int(u64),
    Bool(bool),
    None,
    Tuple(Vec<Lit>),
    List(Vec<Lit>),
    Dict(Vec<(Lit, Lit)>),
}

impl Lit {
    /// The value as a Python literal, for `ast.literal_eval` (the parser
    /// admits no escapes, so a string needs none either).
    fn repr(&self) -> String {
        let join = |v: &[Lit]| v.iter().map(Lit::repr).collect::<Vec<_>>().join(", ");
        match self {
            Lit::Str(s) if s.contains('\'') => format!("\"{s}\""),
            Lit::Str(s) => format!("'{s}'"),
            Lit::Int(n) => n.to_string(),
            Lit::Bool(true) => "True".into(),
            Lit::Bool(false) => "False".into(),
            Lit::None => "None".into(),
            Lit::Tuple(v) if v.len() == 1 => format!("({},)", v[0].repr()),
            Lit::Tuple(v) => format!("({})", join(v)),
            Lit::List(v) => format!("[{}]", join(v)),
            Lit::Dict(v) => {
                let items: Vec<String> = v
                    .iter()
                    .map(|(k, x)| format!("{}: {}", k.repr(), x.repr()))
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
        }
    }

    /// A short description for error messages (never the whole value).
    fn describe(&self) -> String {
        match self {
            Lit::Str(s) if s.len() <= 40 => format!("{s:?}"),
            Lit::Str(_) => "a long string".into(),
            Lit::Int(n) => n.to_string(),
            Lit::Bool(true) => "True".into(),
            Lit::Bool(false) => "False".into(),
            Lit::None => "None".into(),
            Lit::Tuple(v) => format!("a tuple of {}", v.len()),
            Lit::List(v) => format!("a list of {}", v.len()),
            Lit::Dict(v) => format!("a dict of {}", v.len()),
        }
    }
}

/// A recursive-descent parser over the header text. Every construct it
/// does not know is an [`Error::Header`].
struct Parser<'a> {
    ctx: &'a Context,
    text: &'a str,
    pos: usize,
    depth: usize,
    max_depth: usize,
    allow_long: bool,
}

impl Parser<'_> {
    fn error(&self, what: &str) -> Error {
        Error::header(
            self.ctx.clone(),
            rules::HEADER,
            format!("{what} at header byte {}", self.pos),
        )
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    /// Python ignores whitespace and newlines inside brackets.
    fn skip_space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r' | b'\x0c')) {
            self.pos += 1;
        }
    }

    fn value(&mut self) -> Result<Lit> {
        self.skip_space();
        match self.peek() {
            Some(q @ (b'\'' | b'"')) => self.string(q),
            Some(b'0'..=b'9') => self.int(),
            Some(b'(') => self.nested(|p| p.tuple()),
            Some(b'[') => self.nested(|p| p.seq(b']').map(Lit::List)),
            Some(b'{') => self.nested(|p| p.dict()),
            Some(c) if c.is_ascii_alphabetic() => self.name(),
            Some(_) => Err(self.error("unexpected character")),
            None => Err(self.error("unexpected end of header")),
        }
    }

    /// Enter a bracket, bounded by `Limits::depth` so a header of nested
    /// brackets cannot exhaust the stack.
    fn nested(&mut self, f: impl FnOnce(&mut Self) -> Result<Lit>) -> Result<Lit> {
        self.depth += 1;
        Limits::check(self.ctx, "depth", self.depth as u64, self.max_depth as u64)?;
        self.pos += 1; // the opening bracket
        let v = f(self)?;
        self.depth -= 1;
        Ok(v)
    }

    fn string(&mut self, quote: u8) -> Result<Lit> {
        let start = self.pos + 1;
        let rest = &self.text.as_bytes()[start..];
        for (i, &b) in rest.iter().enumerate() {
            match b {
                b'\\' => return Err(self.error("escape sequences are not supported")),
                b'\n' | b'\r' => return Err(self.error("unterminated string")),
                _ if b == quote => {
                    self.pos = start + i + 1;
                    // Quotes are ASCII, so these are char boundaries.
                    return Ok(Lit::Str(self.text[start..start + i].to_string()));
                }
                _ => {}
            }
        }
        Err(self.error("unterminated string"))
    }

    fn int(&mut self) -> Result<Lit> {
        let start = self.pos;
        let mut n: u64 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            n = n
                .checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(d - b'0')))
                .ok_or_else(|| self.error("integer too large"))?;
            self.pos += 1;
        }
        if self.text.as_bytes()[start] == b'0' && self.pos - start > 1 {
            return Err(self.error("integer with a leading zero"));
        }
        if self.allow_long && matches!(self.peek(), Some(b'L' | b'l')) {
            self.pos += 1;
        }
        if matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_' || c == b'.') {
            return Err(self.error("not an integer"));
        }
        Ok(Lit::Int(n))
    }

    fn name(&mut self) -> Result<Lit> {
        let start = self.pos;
        while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'_') {
            self.pos += 1;
        }
        match &self.text[start..self.pos] {
            "True" => Ok(Lit::Bool(true)),
            "False" => Ok(Lit::Bool(false)),
            "None" => Ok(Lit::None),
            _ => {
                self.pos = start;
                Err(self.error("unexpected name"))
            }
        }
    }

    /// After `(`: `()` is empty, `(x)` is just `x`, `(x,)` and `(x, y)` are
    /// tuples.
    fn tuple(&mut self) -> Result<Lit> {
        self.skip_space();
        if self.peek() == Some(b')') {
            self.pos += 1;
            return Ok(Lit::Tuple(Vec::new()));
        }
        let first = self.value()?;
        self.skip_space();
        match self.peek() {
            Some(b')') => {
                self.pos += 1;
                Ok(first)
            }
            Some(b',') => {
                self.pos += 1;
                let mut items = vec![first];
                items.extend(self.seq(b')')?);
                Ok(Lit::Tuple(items))
            }
            _ => Err(self.error("expected ',' or ')'")),
        }
    }

    /// Comma-separated values up to `close`, a trailing comma allowed.
    fn seq(&mut self, close: u8) -> Result<Vec<Lit>> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            if self.peek() == Some(close) {
                self.pos += 1;
                return Ok(items);
            }
            items.push(self.value()?);
            self.skip_space();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(c) if c == close => {}
                _ => return Err(self.error("expected ',' or a closing bracket")),
            }
        }
    }

    fn dict(&mut self) -> Result<Lit> {
        let mut items = Vec::new();
        loop {
            self.skip_space();
            if self.peek() == Some(b'}') {
                self.pos += 1;
                return Ok(Lit::Dict(items));
            }
            let key = self.value()?;
            self.skip_space();
            if self.peek() != Some(b':') {
                return Err(self.error("expected ':'"));
            }
            self.pos += 1;
            let value = self.value()?;
            items.push((key, value));
            self.skip_space();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {}
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }
}

/// Python's `repr` of a shape tuple: `()`, `(3,)`, `(2, 3)`.
fn shape_repr(shape: &[u64]) -> String {
    match shape {
        [] => "()".into(),
        [n] => format!("({n},)"),
        _ => {
            let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
            format!("({})", dims.join(", "))
        }
    }
}

/// The preamble and header exactly as numpy 2.x's `np.save` writes them for
/// a C-order little-endian array: sorted keys, growth-axis spare spaces,
/// padded with spaces and a final `\n` to a multiple of 64 bytes, version
/// 1.0 unless the header needs the 4-byte length of 2.0.
pub fn encode(descr: &str, shape: &[u64]) -> Vec<u8> {
    let mut dict = format!(
        "{{'descr': '{descr}', 'fortran_order': False, 'shape': {}, }}",
        shape_repr(shape)
    );
    if let Some(first) = shape.first() {
        let digits = first.to_string().len();
        dict.extend(std::iter::repeat_n(' ', GROWTH_AXIS_MAX_DIGITS - digits));
    }
    // numpy counts the final newline into the header before padding.
    let hlen = dict.len() + 1;
    let v1_pad = ARRAY_ALIGN - (10 + hlen) % ARRAY_ALIGN;
    let (major, pad) = if hlen + v1_pad <= usize::from(u16::MAX) {
        (1u8, v1_pad)
    } else {
        (2u8, ARRAY_ALIGN - (12 + hlen) % ARRAY_ALIGN)
    };
    let mut out = Vec::with_capacity(12 + hlen + pad);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[major, 0]);
    let stored_len = hlen + pad;
    if major == 1 {
        out.extend_from_slice(&(stored_len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(stored_len as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.extend(std::iter::repeat_n(b' ', pad));
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(text: &str, major: u8) -> Result<Header> {
        parse(
            &Context::default(),
            text.as_bytes(),
            major,
            &Limits::default(),
        )
    }

    #[test]
    fn numpy_header_bytes() {
        // np.save of np.zeros((2, 3), np.float32) with numpy 2.x.
        let h = encode("<f4", &[2, 3]);
        assert_eq!(h.len(), 128);
        assert_eq!(&h[..10], b"\x93NUMPY\x01\x00v\x00");
        let text = std::str::from_utf8(&h[10..]).unwrap();
        assert!(text.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"));
        assert!(text.ends_with(" \n"));
        assert_eq!(encode("<f8", &[]).len() % 64, 0);
        assert_eq!(encode("|u1", &[12345678901234567890]).len() % 64, 0);
    }

    #[test]
    fn encode_parses_back() {
        for shape in [vec![], vec![3], vec![0, 4], vec![2, 3, 4]] {
            let h = encode("<i8", &shape);
            let p = preamble(&Context::default(), &h).unwrap();
            assert_eq!(header_len(&p, &h) + p.prefix_len, h.len() as u64);
            let hdr = parse(
                &Context::default(),
                &h[p.prefix_len as usize..],
                1,
                &Limits::default(),
            )
            .unwrap();
            assert_eq!(hdr.shape, shape);
            assert_eq!(hdr.dtype, DType::I64);
        }
    }

    #[test]
    fn version_two_when_needed() {
        // 10000 dims of 9 characters each push the header past 65535 bytes.
        let shape = vec![1234567u64; 10000];
        let h = encode("<f4", &shape);
        assert_eq!(&h[6..8], &[2, 0]);
        assert_eq!(h.len() % 64, 0);
    }

    #[test]
    fn literal_subset() {
        let ok = [
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
            "{\"shape\": (), \"fortran_order\": True, \"descr\": \"<f4\"}",
            "{ 'descr' : '<f4' ,\n 'fortran_order' : False , 'shape' : ( 2 , 3 , ) }  \n",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ((3), 4)}",
        ];
        for text in ok {
            parse_str(text, 1).unwrap_or_else(|e| panic!("{text}: {e}"));
        }
        let long = "{'descr': '<f4', 'fortran_order': False, 'shape': (3L, 4L), }";
        assert_eq!(parse_str(long, 2).unwrap().shape, vec![3, 4]);
        assert!(matches!(parse_str(long, 3), Err(Error::Header { .. })));
    }

    #[test]
    fn literal_errors() {
        let bad = [
            "",
            "[1, 2]",
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1.5,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ('a',)}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}",
            "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ()} x",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (01,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
            "{'descr': '<\\x66', 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f4, 'fortran_order': False, 'shape': ()}",
            "{'descr': 3, 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f4' 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': false, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ()",
        ];
        for text in bad {
            assert!(
                matches!(parse_str(text, 1), Err(Error::Header { .. })),
                "{text:?} gave {:?}",
                parse_str(text, 1)
            );
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!(
            "{{'descr': '<f4', 'fortran_order': False, 'shape': {}3{}}}",
            "(".repeat(100),
            ")".repeat(100)
        );
        assert!(matches!(parse_str(&deep, 1), Err(Error::Limit { .. })));
    }

    #[test]
    fn descrs() {
        assert_eq!(parse_descr("<f4"), Some((DType::F32, false)));
        assert_eq!(parse_descr(">f4"), Some((DType::F32, true)));
        assert_eq!(parse_descr(">u1"), Some((DType::U8, false)));
        assert_eq!(parse_descr(">c8"), Some((DType::Complex64, true)));
        assert_eq!(parse_descr("=i2"), Some((DType::I16, false)));
        assert_eq!(parse_descr("|b1"), Some((DType::Bool, false)));
        assert_eq!(parse_descr("f8"), Some((DType::F64, false)));
        for bad in [
            "|O", "<U10", "|S5", "<M8[ns]", "<f16", "<c32", "<f4 ", "", "<", "|V8",
        ] {
            assert_eq!(parse_descr(bad), None, "{bad}");
        }
        for d in DType::ALL {
            if let Some(s) = descr_for(d) {
                assert_eq!(parse_descr(s), Some((d, false)));
            }
        }
        assert_eq!(descr_for(DType::BF16), None);
    }

    #[test]
    fn unsupported_descrs() {
        let cases = [
            "{'descr': '|O', 'fortran_order': False, 'shape': (2,)}",
            "{'descr': [('a', '<i4'), ('b', '|O')], 'fortran_order': False, 'shape': (2,)}",
            "{'descr': ('|O', (2,)), 'fortran_order': False, 'shape': (2,)}",
            "{'descr': '<f4 ', 'fortran_order': False, 'shape': (2,)}",
            "{'descr': [('a', '<i3')], 'fortran_order': False, 'shape': (2,)}",
            "{'descr': [(1, '<i4')], 'fortran_order': False, 'shape': (2,)}",
        ];
        for text in cases {
            assert!(
                matches!(parse_str(text, 1), Err(Error::UnsupportedDType { .. })),
                "{text}"
            );
        }
    }

    #[test]
    fn records_are_read_as_bytes() {
        let cases = [
            (
                "[('a', '<i4'), ('b', '<f8', (2,))]",
                20,
                "[('a', '<i4'), ('b', '<f8', (2,))]",
            ),
            ("('<f4', (2, 3))", 24, "('<f4', (2, 3))"),
            ("'<U5'", 20, "'<U5'"),
            ("'|S3'", 3, "'|S3'"),
            ("'<M8[ns]'", 8, "'<M8[ns]'"),
            (
                "[(('t', 'n'), '>i2'), ('', '|V6'), ('s', [('x', '|u1')], 3)]",
                11,
                "[(('t', 'n'), '>i2'), ('', '|V6'), ('s', [('x', '|u1')], 3)]",
            ),
        ];
        for (descr, size, repr) in cases {
            let text = format!("{{'descr': {descr}, 'fortran_order': False, 'shape': (2,)}}");
            let h = parse_str(&text, 1).unwrap();
            assert_eq!(h.dtype, DType::U8);
            let r = h.record.expect("a record");
            assert_eq!((r.itemsize, r.descr.as_str()), (size, repr), "{descr}");
        }
    }

    #[test]
    fn latin1_and_utf8() {
        // A latin-1 byte in a v1 string is a code point, not invalid UTF-8.
        let mut raw = b"{'descr': '<f4', 'fortran_order': False, 'shape': (), }".to_vec();
        raw.extend_from_slice(b"  \xa0\n");
        assert!(matches!(
            parse(&Context::default(), &raw, 1, &Limits::default()),
            Err(Error::Header { .. })
        ));
        assert!(matches!(
            parse(&Context::default(), &raw, 3, &Limits::default()),
            Err(Error::Header { .. })
        ));
        let descr = "{'descr': '<f4\u{e9}', 'fortran_order': False, 'shape': ()}";
        assert!(matches!(
            parse_str(descr, 3),
            Err(Error::UnsupportedDType { .. })
        ));
    }
}
