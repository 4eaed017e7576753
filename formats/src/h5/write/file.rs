//! One HDF5 file: where everything goes, then the bytes in one pass.
//!
//! ```text
//! 0      superblock (48 bytes), zeros to 64
//! 64     each dataset's elements, in the order given, each at a multiple
//!        of 64 (so every element type is aligned and the reader maps it)
//! ...    object headers (the root's first), then the global heap
//!        collections holding string attributes
//! ```
//!
//! Everything is placed from shapes and names before a byte is written,
//! so the file is written front to back, each tensor's bytes straight
//! from the caller's memory: memory is the metadata, never the data.

use std::io::Write;
use std::path::Path;

use zt_core::catalog::{Attributes, Value};
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::inputs::{InputMeta, Inputs};
use zt_core::Rule;

use super::encode::{self, Bytes, Datatype, GlobalHeap, Message, Space, CONSTANT, UNDEF};
use super::tree::{Group, Node};
use super::Layout;
use crate::h5::rules;

/// Where each dataset's elements start.
const DATA_ALIGN: u64 = 64;
/// HDF5's largest rank.
const MAX_RANK: usize = 32;

/// The ml_dtypes name a dtype h5py has no type for is stored under (the
/// dataset attribute `dtype`, as Keras marks its bfloat16 variables).
pub fn ml_dtypes_name(dtype: DType) -> Option<&'static str> {
    Some(match dtype {
        DType::BF16 => "bfloat16",
        DType::F8E4M3Fn => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
        DType::F8E4M3Fnuz => "float8_e4m3fnuz",
        DType::F8E5M2Fnuz => "float8_e5m2fnuz",
        DType::F8E8M0 => "float8_e8m0fnu",
        _ => return None,
    })
}

/// The dtype an ml_dtypes name stands for ([`ml_dtypes_name`] read back).
pub fn ml_dtype_named(name: &str) -> Option<DType> {
    DType::ALL
        .into_iter()
        .find(|&d| ml_dtypes_name(d) == Some(name))
}

/// The HDF5 type of `dtype`, and the `dtype` attribute it carries when
/// HDF5 holds its bytes opaquely.
fn datatype(
    ctx: &Context,
    t: InputMeta<'_>,
    layout: Layout,
) -> Result<(Datatype, Option<&'static str>)> {
    let int = |size, signed| Datatype::Int { size, signed };
    Ok(match t.dtype {
        DType::F64 => (encode::F64, None),
        DType::F32 => (encode::F32, None),
        DType::F16 => (encode::F16, None),
        // HDF5's own float type with bfloat16's fields: libhdf5 converts
        // it to any float, h5py reads it as float32 (every value exact).
        // Keras marks an opaque 2-byte dataset instead.
        DType::BF16 if layout == Layout::Plain => (encode::BF16, None),
        DType::I8 => (int(1, true), None),
        DType::I16 => (int(2, true), None),
        DType::I32 => (int(4, true), None),
        DType::I64 => (int(8, true), None),
        DType::U8 => (int(1, false), None),
        DType::U16 => (int(2, false), None),
        DType::U32 => (int(4, false), None),
        DType::U64 => (int(8, false), None),
        DType::Bool => (Datatype::Bool, None),
        DType::Complex64 => (Datatype::Complex { half: 4 }, None),
        DType::Complex128 => (Datatype::Complex { half: 8 }, None),
        // No HDF5 float conversion knows their NaN and infinity rules:
        // raw bytes (h5py reads `|V1`, to `.view(ml_dtypes.X)`), named.
        d => match (ml_dtypes_name(d), d.size()) {
            (Some(name), Some(size)) => (Datatype::Opaque { size: size as u32 }, Some(name)),
            _ => {
                return Err(Error::Write {
                    rule: Rule::WRITE_DTYPE,
                    ctx: ctx.clone().tensor(t.name),
                    reason: format!(
                        "HDF5 has no type for {d}: its elements are packed below a byte"
                    ),
                })
            }
        },
    })
}

/// A dataset as placed: its shape, type, marker attribute, carried
/// attributes and data.
struct Placed<'t> {
    shape: &'t [u64],
    ty: Datatype,
    marker: Option<&'static str>,
    attributes: &'t [(String, Value)],
    addr: u64,
    len: u64,
}

/// Whether a carried dataset attribute is written: not a `dtype` that
/// marks an opaque encoding (the source's marker says how *its* bytes
/// were stored; this file's own marker, if it needs one, is written from
/// the dtype), and not a `dtype` where this file writes its marker.
fn carried(name: &str, value: &Value, marker: Option<&str>) -> bool {
    if name != "dtype" {
        return true;
    }
    let marks = matches!(value, Value::Str(s) if ml_dtype_named(s).is_some());
    !marks && marker.is_none()
}

/// A node of the tree in pre-order, the root first; a group with its
/// members' names and positions in that order.
enum Flat<'g, 't> {
    Group(&'g Group<'t>, Vec<(&'t str, usize)>),
    Dataset(usize),
}

/// Append `group` and everything below it; returns its position.
fn flatten<'g, 't>(group: &'g Group<'t>, out: &mut Vec<Flat<'g, 't>>) -> usize {
    let at = out.len();
    out.push(Flat::Group(group, Vec::new()));
    let mut members = Vec::with_capacity(group.members.len());
    for (name, node) in &group.members {
        let i = match node {
            Node::Group(g) => flatten(g, out),
            Node::Dataset(d) => {
                out.push(Flat::Dataset(*d));
                out.len() - 1
            }
        };
        members.push((*name, i));
    }
    out[at] = Flat::Group(group, members);
    at
}

/// Everything but the tensors' bytes, placed.
pub struct Plan<'t> {
    tensors: &'t dyn Inputs,
    /// Each tensor's data address (`UNDEF` for no bytes).
    addrs: Vec<u64>,
    /// Object headers then heap collections, from `meta_at`.
    meta: Vec<u8>,
    meta_at: u64,
    superblock: Vec<u8>,
}

/// Place `tensors` and `metadata` as one file; `attributes[i]` (where
/// given) are tensor `i`'s dataset attributes.
pub fn plan<'t>(
    ctx: &Context,
    tensors: &'t dyn Inputs,
    metadata: &'t [(String, Value)],
    attributes: &[&'t Attributes],
    layout: Layout,
) -> Result<Plan<'t>> {
    let mut root = Group::default();
    let mut placed = Vec::with_capacity(tensors.len());
    let mut at = DATA_ALIGN;
    for i in 0..tensors.len() {
        let t = tensors.meta(i);
        let len = t.nbytes(ctx)?;
        if t.shape.len() > MAX_RANK {
            return Err(Error::Write {
                rule: rules::NAME,
                ctx: ctx.clone().tensor(t.name),
                reason: format!("rank {} past HDF5's {MAX_RANK}", t.shape.len()),
            });
        }
        if layout == Layout::Keras {
            super::keras::check_name(ctx, t.name)?;
        }
        root.insert(ctx, t.name, i)?;
        let (ty, marker) = datatype(ctx, t, layout)?;
        let addr = if len == 0 {
            UNDEF
        } else {
            at = at.next_multiple_of(DATA_ALIGN);
            let addr = at;
            at += len;
            addr
        };
        placed.push(Placed {
            shape: t.shape,
            ty,
            marker,
            attributes: attributes.get(i).map_or(&[], |a| a.as_slice()),
            addr,
            len,
        });
    }
    for (key, value) in metadata {
        root.attribute(ctx, key, value)?;
    }
    let meta_at = at.next_multiple_of(8);
    let mut nodes = Vec::new();
    flatten(&root, &mut nodes);
    // Pass one sizes every header (addresses are fixed-width fields);
    // pass two writes them with the addresses the sizes give.
    let mut node_addrs = vec![0u64; nodes.len()];
    let (headers, heap) = encode_all(ctx, &nodes, &node_addrs, &[], &placed)?;
    let mut a = meta_at;
    for (addr, h) in node_addrs.iter_mut().zip(&headers) {
        *addr = a;
        a += h.len() as u64;
    }
    let mut heap_addrs = Vec::new();
    for len in heap.lens() {
        heap_addrs.push(a);
        a += len;
    }
    let (headers, heap) = encode_all(ctx, &nodes, &node_addrs, &heap_addrs, &placed)?;
    let mut meta = Vec::with_capacity((a - meta_at) as usize);
    for h in &headers {
        meta.extend_from_slice(h);
    }
    heap.encode(&mut meta);
    debug_assert_eq!(meta_at + meta.len() as u64, a);
    Ok(Plan {
        tensors,
        addrs: placed.iter().map(|p| p.addr).collect(),
        meta,
        meta_at,
        superblock: encode::superblock(a, meta_at),
    })
}

/// Every node's object header, and the heap their strings are in.
fn encode_all(
    ctx: &Context,
    nodes: &[Flat<'_, '_>],
    addrs: &[u64],
    heap_addrs: &[u64],
    placed: &[Placed<'_>],
) -> Result<(Vec<Vec<u8>>, GlobalHeap)> {
    let mut heap = GlobalHeap::default();
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        let mut msgs = Vec::new();
        match n {
            Flat::Group(g, members) => {
                msgs.push(encode::link_info());
                msgs.push(encode::group_info());
                for &(name, i) in members {
                    msgs.push(encode::link(name, addrs[i]));
                }
                for (name, value) in &g.attributes {
                    msgs.push(attribute(ctx, name, value, &mut heap, heap_addrs)?);
                }
            }
            Flat::Dataset(i) => {
                let p = &placed[*i];
                let space = if p.shape.is_empty() {
                    Space::Scalar
                } else {
                    Space::Simple(p.shape)
                };
                msgs.push(Message {
                    kind: encode::kind::DATASPACE,
                    flags: 0,
                    body: space.bytes(),
                });
                msgs.push(Message {
                    kind: encode::kind::DATATYPE,
                    flags: CONSTANT,
                    body: p.ty.bytes(),
                });
                msgs.push(encode::fill_value());
                msgs.push(encode::contiguous(p.addr, p.len));
                if let Some(name) = p.marker {
                    let v = Value::Str(name.to_string());
                    msgs.push(attribute(ctx, "dtype", &v, &mut heap, heap_addrs)?);
                }
                for (name, value) in p.attributes {
                    if carried(name, value, p.marker) {
                        msgs.push(attribute(ctx, name, value, &mut heap, heap_addrs)?);
                    }
                }
            }
        }
        out.push(encode::object_header(&msgs));
    }
    Ok((out, heap))
}

/// A file or dataset attribute as an attribute message.
fn attribute(
    ctx: &Context,
    name: &str,
    value: &Value,
    heap: &mut GlobalHeap,
    heap_addrs: &[u64],
) -> Result<Message> {
    let refuse = |why: String| Error::Write {
        rule: rules::ATTRIBUTE,
        ctx: ctx.clone(),
        reason: format!("metadata {name:?}: {why}"),
    };
    let mut data = Bytes::default();
    let mut string = |s: &str, data: &mut Bytes| {
        let id = heap.add(s.as_bytes());
        let at = heap_addrs.get(id.collection).copied().unwrap_or(0);
        encode::vlen_ref(s.len(), at, id.index, data);
    };
    let (ty, space) = match value {
        Value::Null => (encode::I8, Space::Null),
        Value::Bool(b) => {
            data.u8(u8::from(*b));
            (Datatype::Bool, Space::Scalar)
        }
        Value::Int(i) => {
            data.raw(&i.to_le_bytes());
            (encode::I64, Space::Scalar)
        }
        Value::UInt(u) => {
            data.u64(*u);
            (encode::U64, Space::Scalar)
        }
        Value::Float(f) => {
            data.raw(&f.to_le_bytes());
            (encode::F64, Space::Scalar)
        }
        Value::Str(s) => {
            string(s, &mut data);
            (Datatype::VlenString, Space::Scalar)
        }
        Value::Bytes(b) => {
            data.raw(b);
            (
                Datatype::Int {
                    size: 1,
                    signed: false,
                },
                Space::Simple(&[]),
            )
        }
        // A map, or a list HDF5 has no array type for: its JSON text.
        Value::Map(_) | Value::List(_) if json_text(value).is_some() => {
            let text = json_text(value).expect("checked");
            string(&text, &mut data);
            (Datatype::VlenString, Space::Scalar)
        }
        Value::List(items) => {
            let ty = list_type(items).expect("json_text took the others");
            for v in items {
                match (ty, v) {
                    (Datatype::VlenString, Value::Str(s)) => string(s, &mut data),
                    (Datatype::Bool, Value::Bool(b)) => {
                        data.u8(u8::from(*b));
                    }
                    (Datatype::Int { signed: true, .. }, Value::Int(i)) => {
                        data.raw(&i.to_le_bytes());
                    }
                    (Datatype::Int { signed: false, .. }, Value::Int(i)) => {
                        data.u64(*i as u64);
                    }
                    (Datatype::Int { .. }, Value::UInt(u)) => {
                        data.u64(*u);
                    }
                    (_, Value::Int(i)) => {
                        data.raw(&(*i as f64).to_le_bytes());
                    }
                    (_, Value::UInt(u)) => {
                        data.raw(&(*u as f64).to_le_bytes());
                    }
                    (_, Value::Float(f)) => {
                        data.raw(&f.to_le_bytes());
                    }
                    _ => unreachable!("list_type checked every item"),
                }
            }
            (ty, Space::Simple(&[]))
        }
        Value::Map(_) => unreachable!("json_text takes every map"),
    };
    // A simple space's one dimension: the element count.
    let count = [match value {
        Value::Bytes(b) => b.len() as u64,
        Value::List(items) => items.len() as u64,
        _ => 0,
    }];
    let space = match space {
        Space::Simple(_) => Space::Simple(&count),
        s => s,
    };
    let msg = encode::attribute(name, ty, &space, &data.0);
    if msg.body.len() > encode::MAX_MESSAGE || name.len() >= u16::MAX as usize {
        return Err(refuse(format!(
            "{} bytes; an attribute message holds at most {} (dense attribute storage is \
             not written)",
            msg.body.len(),
            encode::MAX_MESSAGE
        )));
    }
    Ok(msg)
}

/// The JSON text a map or a list of no one kind is stored as (no HDF5
/// attribute type holds them); `None` for any other value.
fn json_text(value: &Value) -> Option<String> {
    match value {
        Value::Map(_) => Some(value.to_json().to_string()),
        Value::List(items) if list_type(items).is_none() => Some(value.to_json().to_string()),
        _ => None,
    }
}

/// The one type every item of a list fits, if any.
fn list_type(items: &[Value]) -> Option<Datatype> {
    let all = |f: fn(&Value) -> bool| items.iter().all(f);
    Some(if items.is_empty() {
        encode::F64
    } else if all(|v| matches!(v, Value::Str(_))) {
        Datatype::VlenString
    } else if all(|v| matches!(v, Value::Bool(_))) {
        Datatype::Bool
    } else if all(|v| matches!(v, Value::Int(_))) {
        encode::I64
    } else if all(|v| matches!(v, Value::UInt(_)) || matches!(v, Value::Int(i) if *i >= 0)) {
        encode::U64
    } else if all(|v| matches!(v, Value::Int(_) | Value::UInt(_) | Value::Float(_))) {
        encode::F64
    } else {
        return None;
    })
}

/// Write the planned file through `w` (a file at `path`, named in errors),
/// each tensor fetched as it is reached and released once written.
pub fn write(plan: &Plan<'_>, w: &mut impl Write, path: &Path) -> Result<()> {
    const ZEROS: [u8; DATA_ALIGN as usize] = [0; DATA_ALIGN as usize];
    let mut at = 0u64;
    let pad_to = |w: &mut dyn Write, at: &mut u64, to: u64| -> std::io::Result<()> {
        while *at < to {
            let n = (to - *at).min(ZEROS.len() as u64);
            w.write_all(&ZEROS[..n as usize])?;
            *at += n;
        }
        Ok(())
    };
    let io = |e| Error::io(path, e);
    let ctx = Context::file(path);
    w.write_all(&plan.superblock).map_err(io)?;
    at += plan.superblock.len() as u64;
    for (i, &addr) in plan.addrs.iter().enumerate() {
        if addr == UNDEF {
            continue;
        }
        pad_to(w, &mut at, addr).map_err(io)?;
        let data = plan.tensors.fetch(i, &ctx)?;
        w.write_all(&data).map_err(io)?;
        at += data.len() as u64;
        drop(data);
        plan.tensors.release(i);
    }
    pad_to(w, &mut at, plan.meta_at).map_err(io)?;
    w.write_all(&plan.meta).map_err(io)
}

/// Publish one HDF5 file at `path` (`attributes` as in [`plan`]).
pub fn publish(
    tensors: &dyn Inputs,
    metadata: &[(String, Value)],
    attributes: &[&Attributes],
    path: &Path,
    layout: Layout,
    durable: bool,
) -> Result<u64> {
    let ctx = Context::file(path);
    let plan = plan(&ctx, tensors, metadata, attributes, layout)?;
    zt_core::publish::publish_reading(path, durable, |w| write(&plan, w, path))
}
