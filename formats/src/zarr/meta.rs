//! An array's metadata, v3 (`zarr.json`) and v2 (`.zarray`), read into one
//! description ([`ArrayMeta`]) that the reader ([`super::array`]) follows:
//! v2's `order: "F"` is a transpose, its dtype's byte order the `bytes`
//! codec's endian, its compressor a bytes-to-bytes codec.

use serde_json::{Map, Value as Json};
use zt_core::cast::f32_to_f16;
use zt_core::error::{Context, Error, Result};
use zt_core::DType;

use super::rules::{CODEC, DATA_TYPE, META};

/// One array, as the reader needs it.
#[derive(Debug, Clone)]
pub struct ArrayMeta {
    /// The array's shape.
    pub shape: Vec<u64>,
    /// The chunk grid's chunk shape (a shard's shape when sharded).
    pub chunks: Vec<u64>,
    /// Element type.
    pub dtype: DType,
    /// One element of the fill value, little-endian.
    pub fill: Vec<u8>,
    /// How a chunk's grid index becomes its key.
    pub keys: KeyEncoding,
    /// How a chunk's bytes become its elements.
    pub codecs: Codecs,
}

/// A chunk key encoding: v3's `default` (`c/1/2`, `c` for rank 0) or
/// `v2` (`1.2`, `0` for rank 0), with its separator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyEncoding {
    /// v2's encoding (no `c` prefix).
    pub v2: bool,
    /// `/` or `.`.
    pub separator: char,
}

impl KeyEncoding {
    /// The key of the chunk at grid index `index`, relative to the array.
    pub fn key(&self, index: &[u64]) -> String {
        let mut key = String::new();
        if !self.v2 {
            key.push('c');
        } else if index.is_empty() {
            key.push('0');
        }
        for (i, ix) in index.iter().enumerate() {
            if !self.v2 || i > 0 {
                key.push(self.separator);
            }
            key.push_str(&ix.to_string());
        }
        key
    }
}

/// A chunk's codecs, in decoding terms.
#[derive(Debug, Clone)]
pub struct Codecs {
    /// `transpose`'s order (v2's `F` is the reversed axes): stored
    /// dimension `i` is the chunk's dimension `order[i]`.
    pub order: Option<Vec<usize>>,
    /// The array-to-bytes codec.
    pub serializer: Serializer,
    /// Bytes-to-bytes codecs, in encoding order (undone last first).
    pub compressors: Vec<Compressor>,
}

/// The one array-to-bytes codec.
#[derive(Debug, Clone)]
pub enum Serializer {
    /// `bytes`: elements in C order, big-endian when `true`.
    Bytes {
        /// Stored big-endian.
        big: bool,
    },
    /// `sharding_indexed`.
    Shard(Box<Sharding>),
}

/// The `sharding_indexed` codec's configuration.
#[derive(Debug, Clone)]
pub struct Sharding {
    /// Inner chunk shape (divides the shard shape).
    pub chunks: Vec<u64>,
    /// The inner chunks' codecs.
    pub codecs: Codecs,
    /// The index's `bytes` codec is big-endian.
    pub index_big: bool,
    /// The index ends with a CRC-32C of itself.
    pub index_crc: bool,
    /// The index is at the shard's end (else its start).
    pub index_at_end: bool,
}

/// A bytes-to-bytes codec zt decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressor {
    /// Zstandard frames.
    Zstd,
    /// A gzip member.
    Gzip,
    /// A zlib stream (v2's `zlib`).
    Zlib,
    /// A 4-byte little-endian CRC-32C of the bytes before it.
    Crc32c,
    /// A Blosc 1 frame (blosclz, lz4, lz4hc or zstd inside; the frame's
    /// header says which, and how it is shuffled).
    Blosc,
}

fn meta(ctx: &Context, what: impl Into<String>) -> Error {
    Error::header(ctx.clone(), META, what)
}

fn sizes(ctx: &Context, v: Option<&Json>, what: &str) -> Result<Vec<u64>> {
    let list = v
        .and_then(Json::as_array)
        .ok_or_else(|| meta(ctx, format!("{what} is not a list")))?;
    list.iter()
        .map(|d| {
            d.as_u64()
                .ok_or_else(|| meta(ctx, format!("{what}: {d} is not a size")))
        })
        .collect()
}

/// The chunk shape, one positive size per dimension of `shape`.
fn chunk_shape(ctx: &Context, v: Option<&Json>, shape: &[u64]) -> Result<Vec<u64>> {
    let chunks = sizes(ctx, v, "the chunk shape")?;
    // A zero chunk size only where the array has no elements along it
    // (zarr-python writes `[0, 3]` chunks for a `[0, 3]` array): no chunk
    // is ever read there.
    let zero_where_empty = chunks.iter().zip(shape).all(|(&c, &s)| c > 0 || s == 0);
    if chunks.len() != shape.len() || !zero_where_empty {
        return Err(meta(
            ctx,
            format!("chunk shape {chunks:?} does not fit shape {shape:?} (one positive size per dimension)"),
        ));
    }
    Ok(chunks)
}

/// v3 `data_type` names zt has a type for.
fn v3_dtype(ctx: &Context, v: Option<&Json>) -> Result<DType> {
    let name = v
        .and_then(Json::as_str)
        .ok_or_else(|| Error::unsupported(ctx.clone(), DATA_TYPE, format!("data type {v:?}")))?;
    Ok(match name {
        "bool" => DType::Bool,
        "int8" => DType::I8,
        "int16" => DType::I16,
        "int32" => DType::I32,
        "int64" => DType::I64,
        "uint8" => DType::U8,
        "uint16" => DType::U16,
        "uint32" => DType::U32,
        "uint64" => DType::U64,
        "float16" => DType::F16,
        "float32" => DType::F32,
        "float64" => DType::F64,
        "bfloat16" => DType::BF16,
        "complex64" => DType::Complex64,
        "complex128" => DType::Complex128,
        other => {
            return Err(Error::unsupported(
                ctx.clone(),
                DATA_TYPE,
                format!("data type {other:?}"),
            ))
        }
    })
}

/// A v2 dtype string (`<f4`, `|b1`, `>c16`): a numpy `descr`, read as the
/// `.npy` reader reads one; `true` when its bytes are big-endian and wider
/// than one byte.
fn v2_dtype(ctx: &Context, v: Option<&Json>) -> Result<(DType, bool)> {
    v.and_then(Json::as_str)
        .and_then(crate::npy::parse_descr)
        .ok_or_else(|| Error::unsupported(ctx.clone(), DATA_TYPE, format!("dtype {v:?}")))
}

/// A float fill value as `f64`: a number, `"NaN"`, `"Infinity"`,
/// `"-Infinity"`; `None` for a hex bit pattern (handled by the caller).
fn float_of(v: &Json) -> Option<f64> {
    match v {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// One float of `width` bytes from a fill value, little-endian.
fn float_bytes(ctx: &Context, v: &Json, width: usize) -> Result<Vec<u8>> {
    if let Some(hex) = v.as_str().and_then(|s| s.strip_prefix("0x")) {
        let bits = u64::from_str_radix(hex, 16)
            .ok()
            .filter(|_| hex.len() == width * 2)
            .ok_or_else(|| meta(ctx, format!("fill value {v}: not {width} bytes of hex")))?;
        return Ok(bits.to_le_bytes()[..width].to_vec());
    }
    let x = float_of(v).ok_or_else(|| meta(ctx, format!("fill value {v} is not a float")))?;
    Ok(match width {
        8 => x.to_le_bytes().to_vec(),
        4 => (x as f32).to_le_bytes().to_vec(),
        // NaN as numpy's float16 NaN; other values through f32 (exact for
        // every fill value zarr writes as a short decimal).
        _ if x.is_nan() => 0x7E00u16.to_le_bytes().to_vec(),
        _ => f32_to_f16(x as f32).to_le_bytes().to_vec(),
    })
}

/// One element of `dtype` from a fill value (`null`: zeros, as zarr-python
/// reads a v2 array without one).
pub fn fill_bytes(ctx: &Context, dtype: DType, v: &Json) -> Result<Vec<u8>> {
    let width = dtype.size().unwrap_or(1) as usize;
    if v.is_null() {
        return Ok(vec![0; width]);
    }
    let bad = || meta(ctx, format!("fill value {v} does not fit {dtype}"));
    match dtype {
        DType::Bool => match v {
            Json::Bool(b) => Ok(vec![*b as u8]),
            Json::Number(n) if n.as_u64() == Some(0) || n.as_u64() == Some(1) => {
                Ok(vec![n.as_u64() == Some(1)]
                    .into_iter()
                    .map(u8::from)
                    .collect())
            }
            _ => Err(bad()),
        },
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => {
            let x = v
                .as_i64()
                .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
                .ok_or_else(bad)?;
            let bits = width as u32 * 8;
            if bits < 64 && (x < -(1i64 << (bits - 1)) || x >= 1i64 << (bits - 1)) {
                return Err(bad());
            }
            Ok(x.to_le_bytes()[..width].to_vec())
        }
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => {
            let x = v
                .as_u64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                        .map(|f| f as u64)
                })
                .ok_or_else(bad)?;
            if width < 8 && x >= 1u64 << (width * 8) {
                return Err(bad());
            }
            Ok(x.to_le_bytes()[..width].to_vec())
        }
        DType::F16 | DType::F32 | DType::F64 => float_bytes(ctx, v, width),
        DType::BF16 => {
            let f = float_bytes(ctx, v, 4)?;
            let x = f32::from_le_bytes(f.try_into().map_err(|_| bad())?);
            Ok(zt_core::cast::f32_to_bf16(x).to_le_bytes().to_vec())
        }
        DType::Complex64 | DType::Complex128 => {
            let half = width / 2;
            let pair = v.as_array().filter(|p| p.len() == 2).ok_or_else(bad)?;
            let mut out = float_bytes(ctx, &pair[0], half)?;
            out.extend(float_bytes(ctx, &pair[1], half)?);
            Ok(out)
        }
        _ => Err(bad()),
    }
}

fn name_and_config<'j>(
    ctx: &Context,
    codec: &'j Json,
) -> Result<(&'j str, Option<&'j Map<String, Json>>)> {
    match codec {
        Json::String(name) => Ok((name, None)),
        Json::Object(o) => {
            let name = o
                .get("name")
                .and_then(Json::as_str)
                .ok_or_else(|| meta(ctx, format!("codec without a name: {codec}")))?;
            Ok((name, o.get("configuration").and_then(Json::as_object)))
        }
        _ => Err(meta(ctx, format!("codec {codec} is not an object"))),
    }
}

fn endian_big(ctx: &Context, config: Option<&Map<String, Json>>) -> Result<bool> {
    match config.and_then(|c| c.get("endian")) {
        None | Some(Json::Null) => Ok(false),
        Some(Json::String(s)) if s == "little" => Ok(false),
        Some(Json::String(s)) if s == "big" => Ok(true),
        Some(other) => Err(meta(ctx, format!("bytes codec endian {other}"))),
    }
}

fn refuse_codec(ctx: &Context, name: &str) -> Error {
    Error::unsupported(
        ctx.clone(),
        CODEC,
        format!("codec {name:?} is not one zt reads (bytes, transpose, sharding_indexed, zstd, gzip, blosc, crc32c)"),
    )
}

/// A v3 `codecs` list for chunks of `rank` dimensions.
fn v3_codecs(ctx: &Context, list: Option<&Json>, rank: usize, depth: usize) -> Result<Codecs> {
    let list = list
        .and_then(Json::as_array)
        .ok_or_else(|| meta(ctx, "codecs is not a list"))?;
    let mut order: Option<Vec<usize>> = None;
    let mut serializer = None;
    let mut compressors = Vec::new();
    for codec in list {
        let (name, config) = name_and_config(ctx, codec)?;
        match (name, &serializer) {
            ("transpose", None) => {
                let perm = sizes(ctx, config.and_then(|c| c.get("order")), "transpose order")?;
                let mut seen = vec![false; rank];
                for &p in &perm {
                    match seen.get_mut(p as usize) {
                        Some(s) if !*s => *s = true,
                        _ => {
                            return Err(meta(
                                ctx,
                                format!(
                                    "transpose order {perm:?} is not a permutation of {rank} axes"
                                ),
                            ))
                        }
                    }
                }
                if perm.len() != rank {
                    return Err(meta(
                        ctx,
                        format!("transpose order {perm:?} is not a permutation of {rank} axes"),
                    ));
                }
                let perm: Vec<usize> = perm.into_iter().map(|p| p as usize).collect();
                // Two transposes compose: stored axis i is the chunk's
                // axis previous[perm[i]].
                order = Some(match order {
                    None => perm,
                    Some(prev) => perm.iter().map(|&p| prev[p]).collect(),
                });
            }
            ("bytes", None) => {
                serializer = Some(Serializer::Bytes {
                    big: endian_big(ctx, config)?,
                })
            }
            ("sharding_indexed", None) => {
                if depth > 0 {
                    return Err(Error::unsupported(
                        ctx.clone(),
                        CODEC,
                        "sharding_indexed inside a shard",
                    ));
                }
                if order.is_some() {
                    return Err(Error::unsupported(
                        ctx.clone(),
                        CODEC,
                        "transpose before sharding_indexed",
                    ));
                }
                let config =
                    config.ok_or_else(|| meta(ctx, "sharding_indexed without configuration"))?;
                serializer = Some(Serializer::Shard(Box::new(sharding(ctx, config, rank)?)));
            }
            ("transpose" | "bytes" | "sharding_indexed", Some(_)) => {
                return Err(Error::unsupported(
                    ctx.clone(),
                    CODEC,
                    format!("{name} after the array-to-bytes codec"),
                ))
            }
            ("zstd", Some(_)) => compressors.push(Compressor::Zstd),
            ("gzip", Some(_)) => compressors.push(Compressor::Gzip),
            ("crc32c", Some(_)) => compressors.push(Compressor::Crc32c),
            ("blosc", Some(_)) => compressors.push(Compressor::Blosc),
            (_, _) => return Err(refuse_codec(ctx, name)),
        }
    }
    let serializer = serializer.ok_or_else(|| meta(ctx, "no array-to-bytes codec"))?;
    Ok(Codecs {
        order,
        serializer,
        compressors,
    })
}

fn sharding(ctx: &Context, config: &Map<String, Json>, rank: usize) -> Result<Sharding> {
    let chunks = sizes(ctx, config.get("chunk_shape"), "the shard's chunk shape")?;
    if chunks.len() != rank || chunks.contains(&0) {
        return Err(Error::header(
            ctx.clone(),
            super::rules::SHARD,
            format!("inner chunk shape {chunks:?} for {rank} dimensions"),
        ));
    }
    let codecs = v3_codecs(ctx, config.get("codecs"), rank, 1)?;
    let index = config
        .get("index_codecs")
        .and_then(Json::as_array)
        .ok_or_else(|| meta(ctx, "sharding_indexed without index_codecs"))?;
    let mut index_big = None;
    let mut index_crc = false;
    for codec in index {
        match (name_and_config(ctx, codec)?, index_big, index_crc) {
            (("bytes", c), None, false) => index_big = Some(endian_big(ctx, c)?),
            (("crc32c", _), Some(_), false) => index_crc = true,
            ((name, _), _, _) => {
                return Err(Error::unsupported(
                    ctx.clone(),
                    CODEC,
                    format!("shard index codec {name:?} (zt reads bytes, then an optional crc32c)"),
                ))
            }
        }
    }
    let index_big = index_big.ok_or_else(|| meta(ctx, "shard index without a bytes codec"))?;
    let index_at_end = match config.get("index_location").and_then(Json::as_str) {
        None | Some("end") => true,
        Some("start") => false,
        Some(other) => return Err(meta(ctx, format!("index_location {other:?}"))),
    };
    Ok(Sharding {
        chunks,
        codecs,
        index_big,
        index_crc,
        index_at_end,
    })
}

/// A v3 array's `zarr.json`.
pub fn v3_array(ctx: &Context, m: &Map<String, Json>, max_rank: usize) -> Result<ArrayMeta> {
    let shape = sizes(ctx, m.get("shape"), "shape")?;
    if shape.len() > max_rank {
        return Err(meta(
            ctx,
            format!("rank {} past the limit of {max_rank}", shape.len()),
        ));
    }
    let dtype = v3_dtype(ctx, m.get("data_type"))?;
    let grid = m
        .get("chunk_grid")
        .and_then(Json::as_object)
        .ok_or_else(|| meta(ctx, "no chunk_grid"))?;
    if grid.get("name").and_then(Json::as_str) != Some("regular") {
        return Err(Error::unsupported(
            ctx.clone(),
            DATA_TYPE,
            format!("chunk grid {:?}", grid.get("name")),
        ));
    }
    let chunks = chunk_shape(
        ctx,
        grid.get("configuration").and_then(|c| c.get("chunk_shape")),
        &shape,
    )?;
    let cke = m
        .get("chunk_key_encoding")
        .and_then(Json::as_object)
        .ok_or_else(|| meta(ctx, "no chunk_key_encoding"))?;
    let v2 = match cke.get("name").and_then(Json::as_str) {
        Some("default") => false,
        Some("v2") => true,
        other => {
            return Err(Error::unsupported(
                ctx.clone(),
                DATA_TYPE,
                format!("chunk key encoding {other:?}"),
            ))
        }
    };
    let separator = separator(
        ctx,
        cke.get("configuration").and_then(|c| c.get("separator")),
        if v2 { '.' } else { '/' },
    )?;
    if let Some(t) = m.get("storage_transformers").and_then(Json::as_array) {
        if !t.is_empty() {
            return Err(Error::unsupported(
                ctx.clone(),
                DATA_TYPE,
                "storage transformers",
            ));
        }
    }
    let codecs = v3_codecs(ctx, m.get("codecs"), shape.len(), 0)?;
    if let Serializer::Shard(s) = &codecs.serializer {
        if chunks.iter().zip(&s.chunks).any(|(c, i)| c % i != 0) {
            return Err(Error::header(
                ctx.clone(),
                super::rules::SHARD,
                format!(
                    "inner chunk shape {:?} does not divide the shard shape {chunks:?}",
                    s.chunks
                ),
            ));
        }
    }
    let fill = fill_bytes(ctx, dtype, m.get("fill_value").unwrap_or(&Json::Null))?;
    Ok(ArrayMeta {
        shape,
        chunks,
        dtype,
        fill,
        keys: KeyEncoding { v2, separator },
        codecs,
    })
}

fn separator(ctx: &Context, v: Option<&Json>, default: char) -> Result<char> {
    match v {
        None | Some(Json::Null) => Ok(default),
        Some(Json::String(s)) if s == "/" => Ok('/'),
        Some(Json::String(s)) if s == "." => Ok('.'),
        Some(other) => Err(meta(ctx, format!("chunk key separator {other}"))),
    }
}

/// A v2 array's `.zarray`.
pub fn v2_array(ctx: &Context, m: &Map<String, Json>, max_rank: usize) -> Result<ArrayMeta> {
    let shape = sizes(ctx, m.get("shape"), "shape")?;
    if shape.len() > max_rank {
        return Err(meta(
            ctx,
            format!("rank {} past the limit of {max_rank}", shape.len()),
        ));
    }
    let chunks = chunk_shape(ctx, m.get("chunks"), &shape)?;
    let (dtype, big) = v2_dtype(ctx, m.get("dtype"))?;
    let order = match m.get("order").and_then(Json::as_str) {
        Some("C") | None => None,
        Some("F") => Some((0..shape.len()).rev().collect()),
        Some(other) => return Err(meta(ctx, format!("order {other:?}"))),
    };
    match m.get("filters") {
        None | Some(Json::Null) => {}
        Some(Json::Array(f)) if f.is_empty() => {}
        Some(f) => {
            let ids: Vec<&str> = f
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x.get("id").and_then(Json::as_str))
                .collect();
            return Err(Error::unsupported(
                ctx.clone(),
                CODEC,
                format!("filters {ids:?}"),
            ));
        }
    }
    let compressors = match m.get("compressor") {
        None | Some(Json::Null) => vec![],
        Some(c) => match c.get("id").and_then(Json::as_str) {
            Some("zstd") => vec![Compressor::Zstd],
            Some("zlib") => vec![Compressor::Zlib],
            Some("gzip") => vec![Compressor::Gzip],
            Some("crc32c") => vec![Compressor::Crc32c],
            Some("blosc") => vec![Compressor::Blosc],
            other => return Err(refuse_codec(ctx, other.unwrap_or("?"))),
        },
    };
    let separator = separator(ctx, m.get("dimension_separator"), '.')?;
    let fill = fill_bytes(ctx, dtype, m.get("fill_value").unwrap_or(&Json::Null))?;
    Ok(ArrayMeta {
        shape,
        chunks,
        dtype,
        fill,
        keys: KeyEncoding {
            v2: true,
            separator,
        },
        codecs: Codecs {
            order,
            serializer: Serializer::Bytes { big },
            compressors,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_keys_as_zarr_names_them() {
        let v3 = KeyEncoding {
            v2: false,
            separator: '/',
        };
        assert_eq!(v3.key(&[1, 2]), "c/1/2");
        assert_eq!(v3.key(&[]), "c");
        let v3dot = KeyEncoding {
            v2: false,
            separator: '.',
        };
        assert_eq!(v3dot.key(&[0, 3]), "c.0.3");
        let v2 = KeyEncoding {
            v2: true,
            separator: '.',
        };
        assert_eq!(v2.key(&[1, 2]), "1.2");
        assert_eq!(v2.key(&[]), "0");
        let v2slash = KeyEncoding {
            v2: true,
            separator: '/',
        };
        assert_eq!(v2slash.key(&[4, 0, 1]), "4/0/1");
    }
}
