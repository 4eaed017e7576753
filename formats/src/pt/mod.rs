//! PyTorch checkpoints (`torch.save`): `.pt`, `.pth`, `.bin`, `.ckpt`.
//!
//! Both containers torch has written are read: the zip archive of torch
//! ≥ 1.6 (`zip.rs`: `<root>/data.pkl` plus one record per storage) and the
//! legacy stream of five pickles followed by raw storages (`legacy.rs`).
//! The pickle runs on a restricted machine that executes nothing
//! (`pickle.rs`); torch's rebuild functions are recognised as data and every
//! other global stays an inert node (`rebuild.rs`). Tensors are found
//! anywhere in the unpickled object and named by their dotted path.
//!
//! A tensor is a view of its storage's bytes: tied weights and slices
//! share one range of the file, and non-contiguous tensors (transposes,
//! strided slices) keep their element strides, so `PartRef::bytes`
//! materializes C order only when asked. Stored records are zero-copy;
//! deflated ones are inflated on demand. `write.rs` writes zip checkpoints
//! that `torch.load(weights_only=True)` reads, without torch.

mod legacy;
pub mod pickle;
pub mod ranks;
pub mod rebuild;
pub mod rules;
mod write;
mod zip;

use std::sync::Arc;
use zt_core::Rule;

use rebuild::{Found, TensorRef};
use zt_core::catalog::{Catalog, Decode, Object, Payload, Value};
use zt_core::dtype::{c_strides, num_elements};
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::limits::Limits;
use zt_core::store::Store;

pub use rules::RULES;
pub(crate) use write::{check_savable, write_tensor_archive};
pub use write::{write, PtWriter};

/// The tensors of a zip checkpoint embedded at `[start, start + len)` of
/// `store`, as [`Pt`] would list that archive alone (a distributed
/// checkpoint's chunk: `torch.save` output inside a `.distcp` file).
pub fn open_embedded(store: &Arc<Store>, limits: &Limits, start: u64, len: u64) -> Result<Catalog> {
    zip::open_in(store, limits, start, len)
}

/// The PyTorch checkpoint plugin.
pub struct Pt;

/// The PyTorch plugin: zip checkpoints (before npz, which is a zip too)
/// and legacy ones, and `torch.save`-compatible state dicts.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "pt",
    readers: &[zt_core::Reader {
        format: &Pt,
        detect_rank: 40,
    }],
    writers: &[&PtWriter],
    rules: &[("pt", RULES)],
    checkpoints: &[
        zt_core::Checkpoint {
            name: "pytorch_model.bin.index.json",
            preference: 20,
        },
        zt_core::Checkpoint {
            name: "pytorch_model.bin",
            preference: 21,
        },
    ],
};

/// `PROTO 2`, `LONG1` of 10 bytes, then torch's magic 0x1950a86a20f9469cfc6c:
/// the first pickle of a legacy checkpoint.
const LEGACY_MAGIC: &[u8] = b"\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";

/// True if `head` starts with the legacy magic pickle at protocol 2-5
/// (protocol 4 and 5 put a `FRAME` before it).
fn is_legacy(head: &[u8]) -> bool {
    match head {
        [0x80, 2 | 3, rest @ ..] => rest.starts_with(LEGACY_MAGIC),
        [0x80, 4 | 5, 0x95, rest @ ..] => {
            rest.get(8..).is_some_and(|r| r.starts_with(LEGACY_MAGIC))
        }
        _ => false,
    }
}

impl Format for Pt {
    fn name(&self) -> &'static str {
        "pt"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["pt", "pth", "bin", "ckpt"]
    }

    /// The legacy magic pickle, or a zip whose first record or central
    /// directory names `<dir>/data.pkl`.
    fn sniff(&self, p: &Probe<'_>) -> bool {
        if is_legacy(p.head) {
            return true;
        }
        if !p.head.starts_with(b"PK\x03\x04") {
            return false;
        }
        let name_len = p
            .head
            .get(26..28)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
        let first = name_len.and_then(|n| p.head.get(30..30 + n));
        let is_pkl = |name: &[u8]| name == b"data.pkl" || name.ends_with(b"/data.pkl");
        first.is_some_and(is_pkl) || p.tail.windows(9).any(|w| w == b"/data.pkl")
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let head = input.store.read_upto(0, 32)?;
        if is_legacy(&head) {
            legacy::open(input)
        } else {
            zip::open(input)
        }
    }

    /// Fuzz target `pt`: zip archives (`data.pkl` + storages) and the legacy
    /// (pre-1.6) stream, which the reader tells apart itself; seeded by the
    /// test suite's fixtures.
    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(zt_core::FuzzTarget::new("pt", &["tests/data/pt"]))
    }
}

/// Where a storage's bytes are in the file.
#[derive(Debug, Clone)]
enum Record {
    /// Raw bytes at `[offset, offset + len)`.
    Stored { offset: u64, len: u64 },
    /// A deflated zip record.
    Deflated(crate::zip::Entry),
}

impl Record {
    fn len(&self) -> u64 {
        match self {
            Record::Stored { len, .. } => *len,
            Record::Deflated(e) => e.uncompressed,
        }
    }
}

/// The name a tensor saved at the root of the pickle gets: the file stem.
fn root_name(store: &Store) -> String {
    store
        .path()
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tensor".into())
}

/// Turn what the pickle search found into the catalog, resolving each
/// tensor's storage through `record`.
fn catalog(
    store: &Arc<Store>,
    found: Found,
    mut attributes: Vec<(String, Value)>,
    mut record: impl FnMut(&str) -> Result<Record>,
) -> Result<Catalog> {
    let ctx = store.ctx();
    let mut objects = Vec::with_capacity(found.tensors.len());
    for (name, t) in &found.tensors {
        let rec = record(&t.storage.key).map_err(|e| e.in_tensor(name))?;
        objects.push(object(store, &ctx, name, t, &rec).map_err(|e| e.in_tensor(name))?);
    }
    attributes.extend(found.attributes);
    Ok(Catalog {
        objects,
        attributes,
        ..Catalog::default()
    })
}

/// One tensor as a view of its storage record: the declared storage size
/// must match the record, and every element the strides reach must lie
/// inside the storage.
fn object(
    store: &Arc<Store>,
    ctx: &Context,
    name: &str,
    t: &TensorRef,
    rec: &Record,
) -> Result<Object> {
    let overflow = |what| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what,
    };
    let declared = t.storage.nbytes().ok_or_else(|| overflow("storage size"))?;
    if declared != rec.len() {
        return Err(Error::range(
            ctx.clone(),
            rules::STORAGE,
            format!(
                "storage {:?} declares {declared} bytes but its record holds {}",
                t.storage.key,
                rec.len()
            ),
        ));
    }
    // Legacy storage views are windows of the root storage.
    let (window_start, window_len) = t.storage.view.unwrap_or((0, declared));
    if window_start
        .checked_add(window_len)
        .is_none_or(|end| end > declared)
    {
        return Err(Error::range(
            ctx.clone(),
            rules::STORAGE,
            "storage view outside its storage",
        ));
    }
    let elem = t.dtype.size().ok_or_else(|| Error::UnsupportedDType {
        rule: Rule::DTYPE,
        ctx: ctx.clone(),
        dtype: t.dtype.name().into(),
    })?;
    let numel = num_elements(&t.shape).ok_or_else(|| overflow("element count"))?;
    let contiguous = is_c_contiguous(&t.shape, &t.stride);
    let (start, len) = if numel == 0 {
        (window_start, 0)
    } else {
        // The last element the strides reach, in elements from the offset.
        let last = t
            .shape
            .iter()
            .zip(&t.stride)
            .try_fold(0u64, |acc, (&d, &s)| {
                acc.checked_add((d - 1).checked_mul(s as u64)?)
            })
            .ok_or_else(|| overflow("stride extent"))?;
        let reach = t
            .offset
            .checked_add(last)
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_mul(elem))
            .ok_or_else(|| overflow("stride extent"))?;
        if reach > window_len {
            return Err(Error::range(
                ctx.clone(),
                rules::STORAGE,
                format!(
                    "offset {} and strides {:?} reach byte {reach} of a {window_len}-byte storage",
                    t.offset, t.stride
                ),
            ));
        }
        let len = if contiguous {
            numel * elem
        } else {
            (last + 1) * elem
        };
        (window_start + t.offset * elem, len)
    };
    let payload = match rec {
        Record::Stored { offset, .. } => Payload::Stored {
            store: Arc::clone(store),
            offset: offset + start,
            len,
        },
        Record::Deflated(entry) => Payload::Decoded {
            decoder: Arc::new(DeflatedSlice {
                store: Arc::clone(store),
                entry: entry.clone(),
                start,
                len,
            }),
            decoded_len: len,
        },
    };
    let mut object = Object::dense(name, t.dtype, t.shape.clone(), payload);
    if !contiguous {
        object.parts[0].strides = Some(t.stride.clone());
    }
    if let Some(d) = &t.dtensor {
        object.attributes = dtensor_attributes(d);
    }
    Ok(object)
}

/// A DTensor's local tensor's attributes: where it lies in the global
/// tensor (`dtensor.placements` as torch prints them, `"Shard(0)"`, one per
/// mesh dimension joined by `", "`; `dtensor.global_shape`;
/// `dtensor.mesh_shape`; `dtensor.coordinate` and `dtensor.rank` when the
/// mesh recorded them; `dtensor.rank_map`, the mesh's ranks in mesh order;
/// `dtensor.shard_order`, `[tensor dim, [mesh dims]]` pairs).
fn dtensor_attributes(d: &rebuild::DTensorMeta) -> Vec<(String, Value)> {
    let ints = |v: &[u64]| Value::List(v.iter().map(|&n| uint(n)).collect());
    let mut out = vec![
        (
            "dtensor.placements".to_string(),
            Value::Str(rebuild::placements_text(&d.placements)),
        ),
        ("dtensor.global_shape".to_string(), ints(&d.global_shape)),
        ("dtensor.mesh_shape".to_string(), ints(&d.mesh_shape)),
    ];
    if let Some(c) = &d.coordinate {
        out.push(("dtensor.coordinate".to_string(), ints(c)));
    }
    if let Some(r) = d.rank {
        out.push(("dtensor.rank".to_string(), uint(r)));
    }
    if let Some(m) = &d.rank_map {
        out.push(("dtensor.rank_map".to_string(), ints(m)));
    }
    if !d.shard_order.is_empty() {
        let entries = d
            .shard_order
            .iter()
            .map(|(dim, dims)| Value::List(vec![uint(*dim), ints(dims)]))
            .collect();
        out.push(("dtensor.shard_order".to_string(), Value::List(entries)));
    }
    out
}

/// An unsigned count as the smallest `Value` that holds it.
fn uint(n: u64) -> Value {
    i64::try_from(n).map_or(Value::UInt(n), Value::Int)
}

/// C order, ignoring the strides of dimensions of size 1 (torch leaves
/// them arbitrary).
fn is_c_contiguous(shape: &[u64], stride: &[i64]) -> bool {
    let c = c_strides(shape);
    shape
        .iter()
        .zip(stride.iter().zip(&c))
        .all(|(&d, (s, want))| d <= 1 || s == want)
}

/// A tensor's range of a deflated storage record: the record is inflated
/// (within the limits, CRC-checked) and the range cut out.
#[derive(Debug)]
struct DeflatedSlice {
    store: Arc<Store>,
    entry: crate::zip::Entry,
    start: u64,
    len: u64,
}

impl Decode for DeflatedSlice {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let ctx = self.store.ctx();
        let all = crate::zip::member_bytes(
            &self.store,
            &ctx,
            &self.entry,
            limits,
            ("decoded_bytes", limits.decoded_bytes),
        )?;
        let range = self.start as usize..(self.start + self.len) as usize;
        all.get(range)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| Error::range(ctx, rules::STORAGE, "tensor outside its inflated storage"))
    }

    fn describe(&self) -> &'static str {
        "deflate"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_magic_at_every_protocol() {
        let mut p2 = b"\x80\x02".to_vec();
        p2.extend_from_slice(LEGACY_MAGIC);
        assert!(is_legacy(&p2));
        let mut p4 = b"\x80\x04\x95\x0d\x00\x00\x00\x00\x00\x00\x00".to_vec();
        p4.extend_from_slice(LEGACY_MAGIC);
        assert!(is_legacy(&p4));
        assert!(!is_legacy(b"\x80\x02\x8a\x0a"));
    }

    #[test]
    fn contiguity_ignores_unit_dims() {
        assert!(is_c_contiguous(&[2, 3], &[3, 1]));
        assert!(is_c_contiguous(&[1, 3], &[99, 1]));
        assert!(!is_c_contiguous(&[2, 3], &[1, 2]));
        assert!(is_c_contiguous(&[], &[]));
    }
}
