//! Attribute values: numbers (scalars and arrays), fixed-length strings
//! and variable-length strings from the global heap, as catalog
//! [`Value`]s. Anything else is reported as skipped, with the reason.

use zt_core::catalog::Value;
use zt_core::dtype::{num_elements, DType};
use zt_core::error::{Error, Result};

use super::heap::GlobalHeaps;
use super::messages::{Attribute, Type};
use super::reader::{Cursor, Reader};

/// The value of `a`, or the reason it is skipped. Only a spent work
/// budget is an error: a malformed attribute is reported, not fatal.
pub fn value(
    r: &Reader<'_>,
    heaps: &mut GlobalHeaps,
    a: &Attribute,
) -> Result<std::result::Result<Value, String>> {
    match decode(r, heaps, a) {
        Ok(v) => Ok(v),
        Err(
            e @ Error::Limit {
                limit: "entries", ..
            },
        ) => Err(e),
        Err(e) => Ok(Err(e.to_string())),
    }
}

fn decode(
    r: &Reader<'_>,
    heaps: &mut GlobalHeaps,
    a: &Attribute,
) -> Result<std::result::Result<Value, String>> {
    let (Some(ty), Some(space)) = (&a.ty, &a.space) else {
        return Ok(Err("shared datatype or dataspace".into()));
    };
    if space.null {
        return Ok(Ok(Value::Null));
    }
    let n = num_elements(&space.dims).unwrap_or(u64::MAX);
    r.tick(n)?;
    let size = ty.size();
    let need = n.saturating_mul(size);
    let c = Cursor::new(&a.data, 0, r.geo, "attribute data");
    if (a.data.len() as u64) < need {
        return Err(c.bad(format!(
            "{} bytes of data for {n} elements of {size} bytes",
            a.data.len()
        )));
    }
    let size = size as usize;
    let mut values = Vec::with_capacity(n.min(1 << 16) as usize);
    for i in 0..n as usize {
        let b = &a.data[i * size..(i + 1) * size];
        let v = match ty {
            Type::Number { dtype, big_endian } => number(*dtype, *big_endian, b),
            Type::String { vlen: false, .. } => {
                let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
                Value::Str(String::from_utf8_lossy(&b[..end]).into_owned())
            }
            Type::String { vlen: true, .. } => vlen_string(r, heaps, b)?,
            Type::Other { what, .. } => return Ok(Err(what.clone())),
            Type::Opaque { .. } => return Ok(Err("opaque".into())),
        };
        values.push(v);
    }
    Ok(Ok(if space.dims.is_empty() {
        values.pop().unwrap_or(Value::Null)
    } else {
        Value::List(values)
    }))
}

fn vlen_string(r: &Reader<'_>, heaps: &mut GlobalHeaps, b: &[u8]) -> Result<Value> {
    let mut c = Cursor::new(b, 0, r.geo, "variable-length string");
    let len = u64::from(c.u32()?);
    let addr = c.addr()?;
    let index = c.u32()?;
    zt_core::limits::Limits::check(&c.ctx(), "string_bytes", len, r.limits.string_bytes)?;
    let Some(addr) = addr else {
        return Ok(Value::Str(String::new()));
    };
    if len == 0 {
        return Ok(Value::Str(String::new()));
    }
    let obj = heaps.object(r, addr, index)?;
    let bytes = obj.get(..len as usize).ok_or_else(|| {
        c.bad(format!(
            "string of {len} bytes in a heap object of {}",
            obj.len()
        ))
    })?;
    Ok(Value::Str(String::from_utf8_lossy(bytes).into_owned()))
}

/// Decode one number of `dtype` from `b` (its exact size).
fn number(dtype: DType, big_endian: bool, b: &[u8]) -> Value {
    let uint = |b: &[u8]| -> u64 {
        let fold = |acc: u64, &x: &u8| (acc << 8) | u64::from(x);
        if big_endian {
            b.iter().fold(0, fold)
        } else {
            b.iter().rev().fold(0, fold)
        }
    };
    let bits = 8 * b.len() as u32;
    let signed = |v: u64| ((v << (64 - bits)) as i64) >> (64 - bits);
    match dtype {
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => Value::Int(signed(uint(b))),
        DType::U64 => {
            let v = uint(b);
            i64::try_from(v).map_or(Value::UInt(v), Value::Int)
        }
        DType::U8 | DType::U16 | DType::U32 => Value::Int(uint(b) as i64),
        DType::Bool => Value::Bool(uint(b) != 0),
        DType::F16 => Value::Float(f16_to_f64(uint(b) as u16)),
        DType::BF16 => Value::Float(f64::from(f32::from_bits((uint(b) as u32) << 16))),
        DType::F32 => Value::Float(f64::from(f32::from_bits(uint(b) as u32))),
        DType::F64 => Value::Float(f64::from_bits(uint(b))),
        DType::Complex64 | DType::Complex128 => {
            let half = b.len() / 2;
            let part = if half == 4 { DType::F32 } else { DType::F64 };
            Value::List(vec![
                number(part, big_endian, &b[..half]),
                number(part, big_endian, &b[half..]),
            ])
        }
        _ => Value::Bytes(b.to_vec()),
    }
}

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_both_orders() {
        assert_eq!(number(DType::I16, false, &[0xfe, 0xff]), Value::Int(-2));
        assert_eq!(number(DType::I16, true, &[0xff, 0xfe]), Value::Int(-2));
        assert_eq!(number(DType::U64, false, &[0xff; 8]), Value::UInt(u64::MAX));
        assert_eq!(number(DType::F16, false, &[0x00, 0x3c]), Value::Float(1.0));
        assert_eq!(
            number(DType::F32, true, &1.5f32.to_be_bytes()),
            Value::Float(1.5)
        );
    }
}
