//! Header message bodies: dataspace, datatype, fill value, link, link info,
//! data layout, filter pipeline, attribute, attribute info, symbol table.
//! Each parser reads one body through a bounds-checked [`Cursor`] and
//! keeps what the reader needs.

use zt_core::dtype::DType;
use zt_core::error::Result;
use zt_core::Rule;

use super::reader::{enc_size, Cursor};

/// Message type numbers (`H5Oprivate.h`).
pub mod kind {
    /// Dataspace.
    pub const DATASPACE: u16 = 0x0001;
    /// Link info (new-style groups).
    pub const LINK_INFO: u16 = 0x0002;
    /// Datatype.
    pub const DATATYPE: u16 = 0x0003;
    /// Fill value, old style.
    pub const FILL_OLD: u16 = 0x0004;
    /// Fill value.
    pub const FILL: u16 = 0x0005;
    /// Link.
    pub const LINK: u16 = 0x0006;
    /// External data files.
    pub const EXTERNAL: u16 = 0x0007;
    /// Data layout.
    pub const LAYOUT: u16 = 0x0008;
    /// Filter pipeline.
    pub const FILTERS: u16 = 0x000B;
    /// Attribute.
    pub const ATTRIBUTE: u16 = 0x000C;
    /// Symbol table (old-style groups).
    pub const SYMBOL_TABLE: u16 = 0x0011;
    /// Attribute info (dense attribute storage).
    pub const ATTRIBUTE_INFO: u16 = 0x0015;
}

/// A dataspace: dimensions (empty for a scalar) and maximum dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataspace {
    /// Current dimensions.
    pub dims: Vec<u64>,
    /// Maximum dimensions (`u64::MAX` for unlimited), when stored.
    pub max: Option<Vec<u64>>,
    /// The null dataspace (no elements at all).
    pub null: bool,
}

/// Parse a dataspace message; `max_rank` bounds the rank before anything
/// is allocated.
pub fn dataspace(c: &mut Cursor<'_>, max_rank: usize) -> Result<Dataspace> {
    let version = c.u8()?;
    let rank = usize::from(c.u8()?);
    let flags = c.u8()?;
    let null = match version {
        1 => {
            c.skip(5)?;
            false
        }
        2 => match c.u8()? {
            0 | 1 => false,
            2 => true,
            t => return Err(c.bad(format!("unknown dataspace type {t}"))),
        },
        v => return Err(c.bad(format!("unknown dataspace version {v}"))),
    };
    if rank > max_rank {
        return Err(zt_core::error::Error::Limit {
            rule: Rule::LIMIT,
            ctx: c.ctx(),
            limit: "rank",
            value: rank as u64,
            max: max_rank as u64,
        });
    }
    let dims = (0..rank).map(|_| c.length()).collect::<Result<Vec<_>>>()?;
    let max = if flags & 1 != 0 {
        Some((0..rank).map(|_| c.length()).collect::<Result<Vec<_>>>()?)
    } else {
        None
    };
    Ok(Dataspace { dims, max, null })
}

/// A datatype as far as zt cares: a number it can serve, a string (for
/// attributes), or something it reports as skipped.
#[derive(Debug, Clone, PartialEq)]
pub enum Type {
    /// Integers, IEEE floats, h5py's bool enum, complex compounds.
    Number {
        /// The element type.
        dtype: DType,
        /// Stored big-endian (swapped on read).
        big_endian: bool,
    },
    /// A string: fixed-size (`size` bytes) or variable-length (a global
    /// heap reference of `size` bytes).
    String {
        /// Bytes per element in the dataset or attribute.
        size: u32,
        /// Variable-length (global heap) rather than fixed.
        vlen: bool,
    },
    /// Raw bytes of `size` per element (opaque class): what h5py writes
    /// for a numpy void dtype, so for ml_dtypes' types; a tensor when the
    /// dataset says what they are (a `dtype` attribute, as Keras marks
    /// bfloat16).
    Opaque {
        /// Bytes per element.
        size: u32,
    },
    /// Anything else, with its size and a description.
    Other {
        /// Bytes per element.
        size: u32,
        /// What it is, for the skipped-datasets listing.
        what: String,
    },
}

impl Type {
    /// Bytes per element as stored.
    pub fn size(&self) -> u64 {
        match self {
            Type::Number { dtype, .. } => dtype.size().unwrap_or(1),
            Type::String { size, .. } | Type::Other { size, .. } | Type::Opaque { size } => {
                u64::from(*size)
            }
        }
    }
}

/// Parse a datatype; `depth` bounds nesting (compound, enum, array, vlen).
pub fn datatype(c: &mut Cursor<'_>, depth: usize) -> Result<Type> {
    if depth == 0 {
        return Err(c.bad("datatypes nest too deeply"));
    }
    let b0 = c.u8()?;
    let (class, version) = (b0 & 0x0f, b0 >> 4);
    let bits = [c.u8()?, c.u8()?, c.u8()?];
    let size = c.u32()?;
    let other = |what: &str| Type::Other {
        size,
        what: what.to_string(),
    };
    Ok(match class {
        0 => fixed_point(c, bits, size)?,
        1 => float(c, bits, size)?,
        2 => {
            c.skip(2)?;
            other("time")
        }
        3 => Type::String { size, vlen: false },
        4 => {
            c.skip(4)?;
            other("bitfield")
        }
        5 => {
            let tag = usize::from(bits[0]);
            c.skip(tag.div_ceil(8) * 8)?;
            Type::Opaque { size }
        }
        6 => compound(c, version, bits, size, depth)?,
        7 => other("reference"),
        8 => enumeration(c, version, bits, size, depth)?,
        9 => {
            let base = datatype(c, depth - 1)?;
            if bits[0] & 0x0f == 1 {
                Type::String { size, vlen: true }
            } else {
                let _ = base;
                other("variable-length sequence")
            }
        }
        10 => {
            array(c, version, depth)?;
            other("array")
        }
        11 => complex(c, size, depth)?,
        k => return Err(c.bad(format!("unknown datatype class {k}"))),
    })
}

fn fixed_point(c: &mut Cursor<'_>, bits: [u8; 3], size: u32) -> Result<Type> {
    let (offset, precision) = (c.u16()?, c.u16()?);
    let signed = bits[0] & 0x08 != 0;
    let dtype = match (size, signed) {
        (1, true) => DType::I8,
        (2, true) => DType::I16,
        (4, true) => DType::I32,
        (8, true) => DType::I64,
        (1, false) => DType::U8,
        (2, false) => DType::U16,
        (4, false) => DType::U32,
        (8, false) => DType::U64,
        _ => {
            return Ok(Type::Other {
                size,
                what: format!("{size}-byte integer"),
            })
        }
    };
    if offset != 0 || u32::from(precision) != size * 8 {
        return Ok(Type::Other {
            size,
            what: format!("integer with {precision} bits at bit {offset}"),
        });
    }
    Ok(Type::Number {
        dtype,
        big_endian: bits[0] & 1 != 0,
    })
}

fn float(c: &mut Cursor<'_>, bits: [u8; 3], size: u32) -> Result<Type> {
    let offset = c.u16()?;
    let precision = c.u16()?;
    let (exp_at, exp_bits, mant_at, mant_bits) = (c.u8()?, c.u8()?, c.u8()?, c.u8()?);
    let bias = c.u32()?;
    let sign_at = bits[1];
    // Bit 6 with bit 0 is VAX order; anything but IEEE layouts is skipped.
    let layout = (
        size, offset, precision, sign_at, exp_at, exp_bits, mant_at, mant_bits, bias,
    );
    let dtype = match layout {
        (2, 0, 16, 15, 10, 5, 0, 10, 15) => Some(DType::F16),
        (2, 0, 16, 15, 7, 8, 0, 7, 127) => Some(DType::BF16),
        (4, 0, 32, 31, 23, 8, 0, 23, 127) => Some(DType::F32),
        (8, 0, 64, 63, 52, 11, 0, 52, 1023) => Some(DType::F64),
        _ => None,
    };
    Ok(match dtype {
        Some(dtype) if bits[0] & 0x40 == 0 => Type::Number {
            dtype,
            big_endian: bits[0] & 1 != 0,
        },
        _ => Type::Other {
            size,
            what: format!("{size}-byte non-IEEE float"),
        },
    })
}

/// A member name: null-terminated, padded to 8 bytes before version 3.
fn member_name(c: &mut Cursor<'_>, version: u8) -> Result<String> {
    let rest = &c.buf()[c.pos()..];
    let len = rest
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| c.bad("member name is not terminated"))?;
    let name = String::from_utf8_lossy(&rest[..len]).into_owned();
    let taken = if version >= 3 {
        len + 1
    } else {
        (len + 1).div_ceil(8) * 8
    };
    c.skip(taken)?;
    Ok(name)
}

fn compound(
    c: &mut Cursor<'_>,
    version: u8,
    bits: [u8; 3],
    size: u32,
    depth: usize,
) -> Result<Type> {
    let n = usize::from(bits[0]) | usize::from(bits[1]) << 8;
    let mut members = Vec::new();
    for _ in 0..n {
        let name = member_name(c, version)?;
        let offset = match version {
            1 => {
                let offset = c.u32()?;
                c.skip(1 + 3 + 4 + 4 + 16)?; // dimensionality, reserved, permutation, reserved, sizes
                u64::from(offset)
            }
            2 => u64::from(c.u32()?),
            // Version 3 and later (HDF5 2.0 writes 5): the offset in as
            // few bytes as the compound's size needs.
            _ if version >= 3 => c.uint(enc_size(u64::from(size)).min(4))?,
            v => return Err(c.bad(format!("unknown compound datatype version {v}"))),
        };
        let ty = datatype(c, depth - 1)?;
        if members.len() < 2 {
            members.push((name, offset, ty));
        }
    }
    // h5py's complex numbers: {r, i} of one IEEE float type, packed.
    if let [(
        r,
        0,
        Type::Number {
            dtype: a,
            big_endian,
        },
    ), (i, off, Type::Number { dtype: b, .. })] = members.as_slice()
    {
        let complex = match a {
            DType::F32 => Some(DType::Complex64),
            DType::F64 => Some(DType::Complex128),
            _ => None,
        };
        let half = a.size().unwrap_or(0);
        if let Some(dtype) = complex {
            if n == 2
                && r == "r"
                && i == "i"
                && a == b
                && *off == half
                && u64::from(size) == 2 * half
            {
                return Ok(Type::Number {
                    dtype,
                    big_endian: *big_endian,
                });
            }
        }
    }
    Ok(Type::Other {
        size,
        what: format!("compound of {n} members"),
    })
}

/// HDF5 2.0's native complex class: a base float type for both parts.
fn complex(c: &mut Cursor<'_>, size: u32, depth: usize) -> Result<Type> {
    let base = datatype(c, depth - 1)?;
    Ok(match base {
        Type::Number {
            dtype: DType::F32,
            big_endian,
        } if size == 8 => Type::Number {
            dtype: DType::Complex64,
            big_endian,
        },
        Type::Number {
            dtype: DType::F64,
            big_endian,
        } if size == 16 => Type::Number {
            dtype: DType::Complex128,
            big_endian,
        },
        _ => Type::Other {
            size,
            what: "complex of a non-IEEE float".into(),
        },
    })
}

fn enumeration(
    c: &mut Cursor<'_>,
    version: u8,
    bits: [u8; 3],
    size: u32,
    depth: usize,
) -> Result<Type> {
    let n = usize::from(bits[0]) | usize::from(bits[1]) << 8;
    let base = datatype(c, depth - 1)?;
    let names = (0..n)
        .map(|_| member_name(c, version))
        .collect::<Result<Vec<_>>>()?;
    let width = base.size() as usize;
    let values = c.take(
        n.checked_mul(width)
            .ok_or_else(|| c.bad("enum too large"))?,
    )?;
    // h5py's bool: an int8 enum {FALSE: 0, TRUE: 1}.
    if let Type::Number {
        dtype: DType::I8, ..
    } = base
    {
        if names == ["FALSE", "TRUE"] && values == [0, 1] {
            return Ok(Type::Number {
                dtype: DType::Bool,
                big_endian: false,
            });
        }
    }
    // Other enums read as their base integers, as h5py returns them.
    Ok(match base {
        Type::Number { dtype, big_endian } if dtype.kind() != zt_core::dtype::Kind::Float => {
            Type::Number { dtype, big_endian }
        }
        _ => Type::Other {
            size,
            what: "enum".into(),
        },
    })
}

fn array(c: &mut Cursor<'_>, version: u8, depth: usize) -> Result<()> {
    let rank = usize::from(c.u8()?);
    if version < 3 {
        c.skip(3)?;
    }
    c.skip(rank * 4)?;
    if version < 3 {
        c.skip(rank * 4)?; // permutation
    }
    datatype(c, depth - 1).map(|_| ())
}

/// Parse a fill value message (new or old style); `None` means no value
/// is stored (zero bytes are used), as libhdf5 reads it.
pub fn fill_value(c: &mut Cursor<'_>, kind_: u16) -> Result<Option<Vec<u8>>> {
    if kind_ == kind::FILL_OLD {
        // The old message is only a size and the value; size 0: none.
        let size = c.u32()?;
        return fill_bytes(c, u64::from(size));
    }
    match c.u8()? {
        // Versions 1 and 2: space allocation time, fill write time, then
        // "defined". Version 1 always carries a size, which its writers
        // set to -1 (0xFFFFFFFF) for no value; libhdf5 reads the size only
        // when defined, as a signed number, and keeps no value for 0 or
        // less.
        1 | 2 => {
            c.skip(2)?;
            let defined = c.u8()? != 0;
            if !defined || c.remaining() < 4 {
                return Ok(None);
            }
            let size = c.u32()? as i32;
            fill_bytes(c, u64::try_from(size).unwrap_or(0))
        }
        // Version 3: flags; bit 5 says a size and value follow.
        3 => {
            let flags = c.u8()?;
            if flags & 0x20 == 0 || c.remaining() < 4 {
                return Ok(None);
            }
            let size = c.u32()?;
            fill_bytes(c, u64::from(size))
        }
        v => Err(c.bad(format!("unknown fill value version {v}"))),
    }
}

/// The `size` bytes of a fill value (`None` for 0), which must lie in the
/// message.
fn fill_bytes(c: &mut Cursor<'_>, size: u64) -> Result<Option<Vec<u8>>> {
    if size == 0 {
        return Ok(None);
    }
    let size = usize::try_from(size).map_err(|_| c.bad("fill value size"))?;
    Ok(Some(c.take(size)?.to_vec()))
}

/// Where a link points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An object header in this file.
    Hard(u64),
    /// A path in this file, not followed.
    Soft(String),
    /// An object in another file, never followed.
    External {
        /// The other file.
        file: String,
        /// The object's path there.
        path: String,
    },
    /// A user-defined link type.
    Other(u8),
}

/// Parse a link message into its name and target.
pub fn link(c: &mut Cursor<'_>) -> Result<(String, Target)> {
    let version = c.u8()?;
    if version != 1 {
        return Err(c.bad(format!("unknown link message version {version}")));
    }
    let flags = c.u8()?;
    let link_type = if flags & 0x08 != 0 { c.u8()? } else { 0 };
    if flags & 0x04 != 0 {
        c.skip(8)?;
    }
    if flags & 0x10 != 0 {
        c.skip(1)?;
    }
    let name_len = c.uint(1 << (flags & 3))?;
    let name_len = usize::try_from(name_len).map_err(|_| c.bad("name length"))?;
    let name = String::from_utf8_lossy(c.take(name_len)?).into_owned();
    let target = match link_type {
        0 => Target::Hard(c.addr()?.ok_or_else(|| c.bad("hard link to no address"))?),
        1 => {
            let n = usize::from(c.u16()?);
            Target::Soft(String::from_utf8_lossy(c.take(n)?).into_owned())
        }
        64 => {
            let n = usize::from(c.u16()?);
            let body = c.take(n)?;
            let mut parts = body.get(1..).unwrap_or(&[]).split(|&b| b == 0);
            let file = String::from_utf8_lossy(parts.next().unwrap_or(&[])).into_owned();
            let path = String::from_utf8_lossy(parts.next().unwrap_or(&[])).into_owned();
            Target::External { file, path }
        }
        t => Target::Other(t),
    };
    Ok((name, target))
}

/// Dense storage of links or attributes: a fractal heap and the v2
/// B-tree that indexes it by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseInfo {
    /// Fractal heap address (`None`: the storage is compact).
    pub heap: Option<u64>,
    /// Name-index v2 B-tree address.
    pub name_index: Option<u64>,
}

/// Parse a link info or attribute info message.
pub fn dense_info(c: &mut Cursor<'_>, kind_: u16) -> Result<DenseInfo> {
    let version = c.u8()?;
    if version != 0 {
        return Err(c.bad(format!("unknown link/attribute info version {version}")));
    }
    let flags = c.u8()?;
    if flags & 1 != 0 {
        c.skip(if kind_ == kind::LINK_INFO { 8 } else { 2 })?;
    }
    let heap = c.addr()?;
    let name_index = c.addr()?;
    Ok(DenseInfo { heap, name_index })
}

/// Which index locates a chunked dataset's chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkIndex {
    /// Version-1 B-tree (layout version 3, h5py's default).
    BTreeV1,
    /// One chunk; its filtered size and mask when filtered.
    Single {
        /// Stored size and filter mask of a filtered chunk.
        filtered: Option<(u64, u32)>,
    },
    /// Chunks back to back in grid order, unfiltered.
    Implicit,
    /// Fixed array.
    FixedArray,
    /// Extensible array.
    ExtensibleArray,
    /// Version-2 B-tree.
    BTreeV2,
}

/// A dataset's storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Raw data inside the layout message.
    Compact {
        /// The bytes.
        data: Vec<u8>,
    },
    /// One range of the file (`None`: never written, all fill value).
    Contiguous {
        /// Relative address.
        addr: Option<u64>,
        /// Bytes.
        size: u64,
    },
    /// Chunks found through an index.
    Chunked {
        /// Chunk dimensions in elements (the element-size dimension dropped).
        chunk: Vec<u64>,
        /// The index.
        index: ChunkIndex,
        /// The index's address (`None`: no chunk written).
        addr: Option<u64>,
    },
    /// Virtual datasets (mappings onto other datasets), not read.
    Virtual,
}

/// Parse a data layout message (versions 1 to 4).
pub fn layout(c: &mut Cursor<'_>, max_rank: usize) -> Result<Layout> {
    let version = c.u8()?;
    match version {
        1 | 2 => layout_v1(c, max_rank),
        // HDF5 2.0 writes version 5, encoded as version 4.
        3..=5 => layout_v3(c, version, max_rank),
        v => Err(c.bad(format!("unknown layout version {v}"))),
    }
}

fn chunk_dims(c: &mut Cursor<'_>, n: usize, width: usize, max_rank: usize) -> Result<Vec<u64>> {
    if n < 1 || n > max_rank + 1 {
        return Err(c.bad(format!("chunk dimensionality {n}")));
    }
    let mut dims = (0..n).map(|_| c.uint(width)).collect::<Result<Vec<_>>>()?;
    dims.pop(); // the element size
    if dims.contains(&0) {
        return Err(c.bad("a chunk dimension is zero"));
    }
    Ok(dims)
}

/// Versions 1 and 2 (HDF5 1.4 and 1.6): dimensionality n, class, 5
/// reserved bytes, the address (not for compact data), then n 4-byte
/// dimension sizes, the last of them the element size; compact data
/// follows as a 4-byte size and the bytes.
fn layout_v1(c: &mut Cursor<'_>, max_rank: usize) -> Result<Layout> {
    let n = usize::from(c.u8()?);
    let class = c.u8()?;
    c.skip(5)?;
    let addr = if class == 0 { None } else { c.addr()? };
    match class {
        0 => {
            c.skip(n * 4)?;
            let size = c.u32()? as usize;
            Ok(Layout::Compact {
                data: c.take(size)?.to_vec(),
            })
        }
        1 => {
            let dims = (0..n).map(|_| c.u32()).collect::<Result<Vec<_>>>()?;
            let size = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(u64::from(d)))
                .ok_or_else(|| c.bad("contiguous size overflows"))?;
            Ok(Layout::Contiguous { addr, size })
        }
        // The element size is the last of the n dimensions (which
        // `chunk_dims` drops): libhdf5 writes and reads no separate
        // element-size field for versions 1 and 2, although the
        // specification's table lists one.
        2 => {
            let chunk = chunk_dims(c, n, 4, max_rank)?;
            Ok(Layout::Chunked {
                chunk,
                index: ChunkIndex::BTreeV1,
                addr,
            })
        }
        k => Err(c.bad(format!("unknown layout class {k}"))),
    }
}

fn layout_v3(c: &mut Cursor<'_>, version: u8, max_rank: usize) -> Result<Layout> {
    let class = c.u8()?;
    match class {
        0 => {
            let size = usize::from(c.u16()?);
            Ok(Layout::Compact {
                data: c.take(size)?.to_vec(),
            })
        }
        1 => {
            let addr = c.addr()?;
            let size = c.length()?;
            Ok(Layout::Contiguous { addr, size })
        }
        2 if version == 3 => {
            let n = usize::from(c.u8()?);
            let addr = c.addr()?;
            let chunk = chunk_dims(c, n, 4, max_rank)?;
            Ok(Layout::Chunked {
                chunk,
                index: ChunkIndex::BTreeV1,
                addr,
            })
        }
        2 => {
            let flags = c.u8()?;
            let n = usize::from(c.u8()?);
            let width = usize::from(c.u8()?);
            if !(1..=8).contains(&width) {
                return Err(c.bad(format!("chunk dimension width {width}")));
            }
            let chunk = chunk_dims(c, n, width, max_rank)?;
            let index = match c.u8()? {
                1 => {
                    let filtered = if flags & 0x02 != 0 {
                        Some((c.length()?, c.u32()?))
                    } else {
                        None
                    };
                    ChunkIndex::Single { filtered }
                }
                2 => ChunkIndex::Implicit,
                3 => {
                    c.skip(1)?;
                    ChunkIndex::FixedArray
                }
                4 => {
                    c.skip(5)?;
                    ChunkIndex::ExtensibleArray
                }
                5 => {
                    c.skip(6)?;
                    ChunkIndex::BTreeV2
                }
                t => return Err(c.bad(format!("unknown chunk index type {t}"))),
            };
            let addr = c.addr()?;
            Ok(Layout::Chunked { chunk, index, addr })
        }
        3 => Ok(Layout::Virtual),
        k => Err(c.bad(format!("unknown layout class {k}"))),
    }
}

/// One filter of a pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    /// Filter id (1 deflate, 2 shuffle, 3 fletcher32, 32000 LZF, ...).
    pub id: u16,
    /// Flags (bit 0: optional).
    pub flags: u16,
    /// Client data values.
    pub params: Vec<u32>,
}

/// Parse a filter pipeline message (versions 1 and 2).
pub fn filters(c: &mut Cursor<'_>) -> Result<Vec<Filter>> {
    let version = c.u8()?;
    let n = usize::from(c.u8()?);
    match version {
        1 => c.skip(6)?,
        2 => {}
        v => return Err(c.bad(format!("unknown filter pipeline version {v}"))),
    }
    let mut out = Vec::with_capacity(n.min(32));
    for _ in 0..n {
        let id = c.u16()?;
        let name_len = if version == 1 || id >= 256 {
            usize::from(c.u16()?)
        } else {
            0
        };
        let flags = c.u16()?;
        let nparams = usize::from(c.u16()?);
        let name_len = if version == 1 {
            name_len.div_ceil(8) * 8
        } else {
            name_len
        };
        c.skip(name_len)?;
        let params = (0..nparams).map(|_| c.u32()).collect::<Result<Vec<_>>>()?;
        if version == 1 && nparams % 2 == 1 {
            c.skip(4)?;
        }
        out.push(Filter { id, flags, params });
    }
    Ok(out)
}

/// An attribute: its name, type, space and raw data bytes.
#[derive(Debug, Clone)]
pub struct Attribute {
    /// The name.
    pub name: String,
    /// Element type (`None` when shared, which zt does not resolve).
    pub ty: Option<Type>,
    /// Its dataspace (`None` when shared).
    pub space: Option<Dataspace>,
    /// The data, as stored.
    pub data: Vec<u8>,
}

/// Parse an attribute message (versions 1 to 3).
pub fn attribute(c: &mut Cursor<'_>, max_rank: usize, depth: usize) -> Result<Attribute> {
    let version = c.u8()?;
    let flags = c.u8()?;
    let name_len = usize::from(c.u16()?);
    let type_len = usize::from(c.u16()?);
    let space_len = usize::from(c.u16()?);
    if version == 3 {
        c.skip(1)?; // name encoding
    }
    let pad = |n: usize| if version == 1 { n.div_ceil(8) * 8 } else { n };
    let raw_name = c.take(pad(name_len))?;
    let name_bytes = &raw_name[..name_len.min(raw_name.len())];
    let name_end = name_bytes.iter().position(|&b| b == 0).unwrap_or(name_len);
    let name = String::from_utf8_lossy(&name_bytes[..name_end]).into_owned();
    let type_bytes = c.take(pad(type_len))?;
    let space_bytes = c.take(pad(space_len))?;
    let shared = version >= 2 && flags & 0x03 != 0;
    let (ty, space) = if shared {
        (None, None)
    } else {
        let mut tc = Cursor::new(type_bytes, c.offset(), geo_of(c), "attribute datatype");
        let mut sc = Cursor::new(space_bytes, c.offset(), geo_of(c), "attribute dataspace");
        (
            Some(datatype(&mut tc, depth)?),
            Some(dataspace(&mut sc, max_rank)?),
        )
    };
    let data = c.buf()[c.pos()..].to_vec();
    Ok(Attribute {
        name,
        ty,
        space,
        data,
    })
}

/// The name of the attribute message `body` as far as it can be read,
/// to list an attribute whose type or space zt cannot parse.
pub fn attribute_name(body: &[u8]) -> Option<String> {
    let version = *body.first()?;
    let len = usize::from(u16::from_le_bytes([*body.get(2)?, *body.get(3)?]));
    let start: usize = if version == 3 { 9 } else { 8 };
    let raw = body.get(start..start.checked_add(len)?)?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    Some(String::from_utf8_lossy(&raw[..end]).into_owned())
}

fn geo_of(c: &Cursor<'_>) -> super::reader::Geometry {
    c.geometry()
}

/// Parse a symbol table message: (v1 B-tree, local heap).
pub fn symbol_table(c: &mut Cursor<'_>) -> Result<(u64, u64)> {
    let btree = c.addr()?.ok_or_else(|| c.bad("undefined B-tree address"))?;
    let heap = c
        .addr()?
        .ok_or_else(|| c.bad("undefined local heap address"))?;
    Ok((btree, heap))
}
