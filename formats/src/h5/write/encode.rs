//! HDF5 structures as bytes, in the "latest" file format libhdf5 writes
//! with `libver="latest"` (superblock version 2, version 2 object headers,
//! new-style groups holding their links as link messages): the smallest
//! set of structures a file of groups, contiguous datasets and attributes
//! needs, each checksummed with lookup3 as the reader checks it.

use super::super::reader::lookup3;

/// The undefined address (all bits set).
pub const UNDEF: u64 = u64::MAX;

/// Bytes built little-endian.
#[derive(Default)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    /// Zeros up to the next multiple of `to`.
    pub fn pad(&mut self, to: usize) -> &mut Self {
        let n = self.0.len().next_multiple_of(to);
        self.0.resize(n, 0);
        self
    }
}

/// The element types zt writes, as HDF5 datatypes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datatype {
    /// Two's complement or unsigned integer of `size` bytes.
    Int { size: u32, signed: bool },
    /// An IEEE-layout float: (size, sign bit, exponent at, exponent bits,
    /// mantissa bits, bias); bfloat16 is one too.
    Float {
        size: u32,
        sign: u8,
        exp_at: u8,
        exp_bits: u8,
        mant_bits: u8,
        bias: u32,
    },
    /// h5py's bool: an int8 enum `{FALSE: 0, TRUE: 1}`.
    Bool,
    /// h5py's complex: a compound `{r, i}` of two floats of `half` bytes.
    Complex { half: u32 },
    /// Raw bytes of `size` per element, no tag (what h5py writes for a
    /// numpy void dtype, and so for ml_dtypes' types).
    Opaque { size: u32 },
    /// A variable-length UTF-8 string (h5py's `str`).
    VlenString,
}

pub const F16: Datatype = Datatype::Float {
    size: 2,
    sign: 15,
    exp_at: 10,
    exp_bits: 5,
    mant_bits: 10,
    bias: 15,
};
pub const BF16: Datatype = Datatype::Float {
    size: 2,
    sign: 15,
    exp_at: 7,
    exp_bits: 8,
    mant_bits: 7,
    bias: 127,
};
pub const F32: Datatype = Datatype::Float {
    size: 4,
    sign: 31,
    exp_at: 23,
    exp_bits: 8,
    mant_bits: 23,
    bias: 127,
};
pub const F64: Datatype = Datatype::Float {
    size: 8,
    sign: 63,
    exp_at: 52,
    exp_bits: 11,
    mant_bits: 52,
    bias: 1023,
};
pub const I8: Datatype = Datatype::Int {
    size: 1,
    signed: true,
};
pub const I64: Datatype = Datatype::Int {
    size: 8,
    signed: true,
};
pub const U64: Datatype = Datatype::Int {
    size: 8,
    signed: false,
};

impl Datatype {
    /// The datatype message's body.
    pub fn encode(self, b: &mut Bytes) {
        match self {
            Datatype::Int { size, signed } => {
                b.u8(0x10).u8(if signed { 0x08 } else { 0 }).u8(0).u8(0);
                b.u32(size).u16(0).u16(size as u16 * 8);
            }
            Datatype::Float {
                size,
                sign,
                exp_at,
                exp_bits,
                mant_bits,
                bias,
            } => {
                // Byte order little-endian, mantissa normalized with an
                // implied leading bit (0x20), as libhdf5's IEEE types.
                b.u8(0x11).u8(0x20).u8(sign).u8(0).u32(size);
                b.u16(0).u16(size as u16 * 8);
                b.u8(exp_at).u8(exp_bits).u8(0).u8(mant_bits).u32(bias);
            }
            Datatype::Bool => {
                // Enum version 1: 2 members; base type; names padded to 8;
                // values.
                b.u8(0x18).u8(2).u8(0).u8(0).u32(1);
                I8.encode(b);
                b.raw(b"FALSE\0\0\0").raw(b"TRUE\0\0\0\0").u8(0).u8(1);
            }
            Datatype::Complex { half } => {
                let part = if half == 4 { F32 } else { F64 };
                // Compound version 2: names padded to 8, 4-byte offsets.
                b.u8(0x26).u8(2).u8(0).u8(0).u32(2 * half);
                b.raw(b"r\0\0\0\0\0\0\0").u32(0);
                part.encode(b);
                b.raw(b"i\0\0\0\0\0\0\0").u32(half);
                part.encode(b);
            }
            Datatype::Opaque { size } => {
                b.u8(0x15).u8(0).u8(0).u8(0).u32(size);
            }
            Datatype::VlenString => {
                // Vlen version 1, type string, null-terminated padding,
                // UTF-8; base type a 1-byte unsigned integer.
                b.u8(0x19).u8(0x01).u8(0x01).u8(0).u32(16);
                Datatype::Int {
                    size: 1,
                    signed: false,
                }
                .encode(b);
            }
        }
    }

    pub fn bytes(self) -> Vec<u8> {
        let mut b = Bytes::default();
        self.encode(&mut b);
        b.0
    }
}

/// A dataspace message body (version 2): scalar (`None`), simple, or
/// null (no elements at all, h5py's `Empty`).
pub enum Space<'a> {
    Scalar,
    Simple(&'a [u64]),
    Null,
}

impl Space<'_> {
    pub fn bytes(&self) -> Vec<u8> {
        let mut b = Bytes::default();
        match self {
            Space::Scalar => {
                b.u8(2).u8(0).u8(0).u8(0);
            }
            Space::Simple(dims) => {
                b.u8(2).u8(dims.len() as u8).u8(0).u8(1);
                for &d in dims.iter() {
                    b.u64(d);
                }
            }
            Space::Null => {
                b.u8(2).u8(0).u8(0).u8(2);
            }
        }
        b.0
    }
}

/// Header message types.
pub mod kind {
    pub const DATASPACE: u8 = 0x01;
    pub const LINK_INFO: u8 = 0x02;
    pub const DATATYPE: u8 = 0x03;
    pub const FILL: u8 = 0x05;
    pub const LINK: u8 = 0x06;
    pub const LAYOUT: u8 = 0x08;
    pub const GROUP_INFO: u8 = 0x0A;
    pub const ATTRIBUTE: u8 = 0x0C;
}

/// Message flag: the message is constant (libhdf5 marks datatypes, fill
/// values and group info so).
pub const CONSTANT: u8 = 0x01;

/// One header message.
pub struct Message {
    pub kind: u8,
    pub flags: u8,
    pub body: Vec<u8>,
}

/// The largest body a message can have (its size is 16 bits).
pub const MAX_MESSAGE: usize = u16::MAX as usize;

/// A version 2 object header (`OHDR`) of `messages`, in one chunk, with
/// its checksum. Every body must be at most [`MAX_MESSAGE`] bytes (the
/// caller checks).
pub fn object_header(messages: &[Message]) -> Vec<u8> {
    let mut body = Bytes::default();
    for m in messages {
        debug_assert!(m.body.len() <= MAX_MESSAGE);
        body.u8(m.kind).u16(m.body.len() as u16).u8(m.flags);
        body.raw(&m.body);
    }
    let len = body.0.len() as u64;
    let (code, width) = match len {
        0..=0xff => (0u8, 1),
        0x100..=0xffff => (1, 2),
        0x1_0000..=0xffff_ffff => (2, 4),
        _ => (3, 8),
    };
    let mut b = Bytes::default();
    b.raw(b"OHDR").u8(2).u8(code);
    b.raw(&len.to_le_bytes()[..width]);
    b.raw(&body.0);
    let sum = lookup3(&b.0);
    b.u32(sum);
    b.0
}

/// Superblock version 2 (48 bytes): 8-byte offsets and lengths, base 0,
/// no extension.
pub fn superblock(eof: u64, root: u64) -> Vec<u8> {
    let mut b = Bytes::default();
    b.raw(crate::h5::superblock::SIGNATURE)
        .u8(2)
        .u8(8)
        .u8(8)
        .u8(0)
        .u64(0)
        .u64(UNDEF)
        .u64(eof)
        .u64(root);
    let sum = lookup3(&b.0);
    b.u32(sum);
    b.0
}

/// A new-style group's link info (compact storage, no creation order).
pub fn link_info() -> Message {
    let mut b = Bytes::default();
    b.u8(0).u8(0).u64(UNDEF).u64(UNDEF);
    Message {
        kind: kind::LINK_INFO,
        flags: 0,
        body: b.0,
    }
}

/// A new-style group's group info (defaults).
pub fn group_info() -> Message {
    Message {
        kind: kind::GROUP_INFO,
        flags: CONSTANT,
        body: vec![0, 0],
    }
}

/// A hard link named `name` to the object header at `addr`.
pub fn link(name: &str, addr: u64) -> Message {
    let mut b = Bytes::default();
    let wide = name.len() > 0xff;
    let utf8 = !name.is_ascii();
    let flags = u8::from(wide) | if utf8 { 0x10 } else { 0 };
    b.u8(1).u8(flags);
    if utf8 {
        b.u8(1);
    }
    if wide {
        b.u16(name.len() as u16);
    } else {
        b.u8(name.len() as u8);
    }
    b.raw(name.as_bytes()).u64(addr);
    Message {
        kind: kind::LINK,
        flags: 0,
        body: b.0,
    }
}

/// Fill value message version 3 as libhdf5 writes it for a new dataset
/// (allocation late, fill written if set, no value defined).
pub fn fill_value() -> Message {
    Message {
        kind: kind::FILL,
        flags: CONSTANT,
        body: vec![3, 0x0a],
    }
}

/// Contiguous layout (version 3): the data's address and size.
pub fn contiguous(addr: u64, size: u64) -> Message {
    let mut b = Bytes::default();
    b.u8(3).u8(1).u64(addr).u64(size);
    Message {
        kind: kind::LAYOUT,
        flags: 0,
        body: b.0,
    }
}

/// An attribute message (version 3) named `name`, of `ty` over `space`,
/// holding `data`.
pub fn attribute(name: &str, ty: Datatype, space: &Space<'_>, data: &[u8]) -> Message {
    let ty = ty.bytes();
    let space = space.bytes();
    let mut b = Bytes::default();
    b.u8(3).u8(0);
    b.u16(name.len() as u16 + 1)
        .u16(ty.len() as u16)
        .u16(space.len() as u16);
    b.u8(u8::from(!name.is_ascii()));
    b.raw(name.as_bytes()).u8(0).raw(&ty).raw(&space).raw(data);
    Message {
        kind: kind::ATTRIBUTE,
        flags: 0,
        body: b.0,
    }
}

/// The smallest global heap collection libhdf5 makes.
const MIN_COLLECTION: u64 = 4096;
/// Objects one collection can index (16-bit indices, 0 is free space).
const MAX_OBJECTS: usize = u16::MAX as usize;

/// Global heap collections (`GCOL`) holding variable-length strings, laid
/// out from an address the caller gives once the rest is placed.
#[derive(Default)]
pub struct GlobalHeap {
    /// Each collection's objects.
    collections: Vec<Vec<Vec<u8>>>,
}

/// Where a string lies: its collection and index, for the heap ID.
#[derive(Debug, Clone, Copy)]
pub struct HeapId {
    pub collection: usize,
    pub index: u16,
}

impl GlobalHeap {
    /// Add a string; returns where it will be.
    pub fn add(&mut self, s: &[u8]) -> HeapId {
        if self
            .collections
            .last()
            .is_none_or(|c| c.len() >= MAX_OBJECTS - 1)
        {
            self.collections.push(Vec::new());
        }
        let collection = self.collections.len() - 1;
        let c = &mut self.collections[collection];
        c.push(s.to_vec());
        HeapId {
            collection,
            index: c.len() as u16,
        }
    }

    fn collection_len(objects: &[Vec<u8>]) -> u64 {
        let used: u64 = 16
            + objects
                .iter()
                .map(|o| 16 + (o.len() as u64).next_multiple_of(8))
                .sum::<u64>();
        let mut len = used.max(MIN_COLLECTION);
        // What is left must hold a free-space object's header, or be none.
        if len - used > 0 && len - used < 16 {
            len += 16;
        }
        len
    }

    /// The collections' sizes, in order.
    pub fn lens(&self) -> Vec<u64> {
        self.collections
            .iter()
            .map(|c| Self::collection_len(c))
            .collect()
    }

    /// Total bytes.
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.lens().iter().sum()
    }

    /// Write the collections (the first at `addrs[0]`, ...).
    pub fn encode(&self, out: &mut Vec<u8>) {
        for objects in &self.collections {
            let len = Self::collection_len(objects);
            let mut b = Bytes::default();
            b.raw(b"GCOL").u8(1).u8(0).u8(0).u8(0).u64(len);
            for (i, o) in objects.iter().enumerate() {
                b.u16(i as u16 + 1).u16(1).u32(0).u64(o.len() as u64);
                b.raw(o).pad(8);
            }
            let free = len - b.0.len() as u64;
            if free >= 16 {
                // Object 0, free space: its size covers its own header.
                b.u16(0).u16(0).u32(0).u64(free);
            }
            b.0.resize(len as usize, 0);
            out.extend_from_slice(&b.0);
        }
    }
}

/// A variable-length string's stored form: length, collection address,
/// index.
pub fn vlen_ref(len: usize, collection: u64, index: u16, b: &mut Bytes) {
    b.u32(len as u32).u64(collection).u32(u32::from(index));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_heap_collections_fill_their_size() {
        let mut h = GlobalHeap::default();
        for s in ["a", "", "hello world", &"x".repeat(5000)] {
            h.add(s.as_bytes());
        }
        let mut out = Vec::new();
        h.encode(&mut out);
        assert_eq!(out.len() as u64, h.len());
        assert!(h.len() >= 5000 + 16);
    }
}
