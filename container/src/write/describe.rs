//! The manifest a writer emits: parts and objects as CBOR, the root map,
//! and the manifest and footer at the end of the heap.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use zt_core::Rule;

use super::heap::Heap;
use super::options::Options;
use crate::cbor::{self, Cbor};
use crate::container::{self, Footer, VERSION};
use crate::encoding::ZSTD_SEEKABLE;
use crate::sink::FileHash;
use crate::validate::logical_name;
use zt_core::catalog::Digest;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};

/// A part as it will be described in the manifest.
#[derive(Debug, Clone)]
pub(super) struct PartOut {
    pub(super) name: String,
    pub(super) dtype: DType,
    pub(super) offset: u64,
    pub(super) length: u64,
    pub(super) encoded: Option<u64>,
    pub(super) digest: Digest,
}

#[derive(Debug, Clone)]
pub(super) struct ObjectOut {
    pub(super) name: String,
    pub(super) shape: Vec<u64>,
    pub(super) layout: String,
    pub(super) attributes: Option<Cbor>,
    pub(super) parts: Vec<PartOut>,
}

pub(super) fn storage_and_type(d: DType, ctx: &Context) -> Result<(DType, Option<&'static str>)> {
    match logical_name(d) {
        Some(name) => Ok((d.storage(), Some(name))),
        None if !d.is_logical() => Ok((d, None)),
        None => Err(Error::Write {
            rule: Rule::WRITE_DTYPE,
            ctx: ctx.clone(),
            reason: format!("{d} has no registered zTensor logical type"),
        }),
    }
}

pub(super) fn part_cbor(p: &PartOut, ctx: &Context) -> Result<Cbor> {
    let (storage, logical) = storage_and_type(p.dtype, ctx)?;
    let mut m = vec![
        (
            "blob",
            Cbor::Array(vec![Cbor::UInt(p.offset), Cbor::UInt(p.length)]),
        ),
        ("dtype", Cbor::Text(storage.name().into())),
        ("digest", Cbor::Text(p.digest.to_string().into())),
    ];
    if let Some(t) = logical {
        m.push(("type", Cbor::Text(t.into())));
    }
    if let Some(decoded) = p.encoded {
        m.push(("encoding", Cbor::Text(ZSTD_SEEKABLE.into())));
        m.push(("decoded_length", Cbor::UInt(decoded)));
    }
    Ok(Cbor::map(m))
}

pub(super) fn object_cbor(o: &ObjectOut, ctx: &Context) -> Result<Cbor> {
    let parts = o
        .parts
        .iter()
        .map(|p| Ok((p.name.clone(), part_cbor(p, ctx)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut m = vec![
        (
            "shape",
            Cbor::Array(o.shape.iter().map(|&d| Cbor::UInt(d)).collect()),
        ),
        ("layout", Cbor::Text(o.layout.clone().into())),
        ("parts", Cbor::map(parts)),
    ];
    if let Some(a) = &o.attributes {
        m.push(("attributes", a.clone()));
    }
    Ok(Cbor::map(m))
}

/// The manifest of a file holding `objects`: the deterministic CBOR of
/// the root map `{"objects": {name: object, ...}, "attributes"?: ...}`,
/// encoded straight from the objects, with each map's keys written in the
/// order deterministic encoding requires (no tree is built: for 50k small
/// tensors, building, encoding and dropping one was a tenth of the save).
/// The bytes are those of `cbor::encode` over the same tree ([`object_cbor`]).
pub(super) fn manifest(
    objects: &[ObjectOut],
    attributes: Option<&Cbor>,
    ctx: &Context,
) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64 + objects.len() * 96);
    cbor::head(&mut out, MAP, 1 + attributes.is_some() as u64);
    cbor::encode_text("objects", &mut out);
    cbor::head(&mut out, MAP, objects.len() as u64);
    for o in in_key_order(objects, |o| &o.name) {
        cbor::encode_text(&o.name, &mut out);
        encode_object(o, ctx, &mut out)?;
    }
    if let Some(a) = attributes {
        cbor::encode_text("attributes", &mut out);
        cbor::encode_into(a, &mut out);
    }
    Ok(out)
}

/// CBOR's major type for maps.
const MAP: u8 = 5;
/// ... for arrays.
const ARRAY: u8 = 4;
/// ... for unsigned integers.
const UINT: u8 = 0;

/// `items` in the order of their names as deterministic CBOR map keys
/// (names are unique: the writer checked).
fn in_key_order<T>(items: &[T], name: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut order: Vec<&T> = items.iter().collect();
    let by_key = |a: &&T, b: &&T| cbor::text_key_order(name(a), name(b));
    if !order.is_sorted_by(|a, b| by_key(a, b).is_le()) {
        order.sort_unstable_by(by_key);
    }
    order
}

/// An object map: keys `parts`, `shape`, `layout`, `attributes`, in
/// encoded order ([`object_cbor`]'s entries).
fn encode_object(o: &ObjectOut, ctx: &Context, out: &mut Vec<u8>) -> Result<()> {
    cbor::head(out, MAP, 3 + o.attributes.is_some() as u64);
    cbor::encode_text("parts", out);
    cbor::head(out, MAP, o.parts.len() as u64);
    for p in in_key_order(&o.parts, |p| &p.name) {
        cbor::encode_text(&p.name, out);
        encode_part(p, ctx, out)?;
    }
    cbor::encode_text("shape", out);
    cbor::head(out, ARRAY, o.shape.len() as u64);
    for &d in &o.shape {
        cbor::head(out, UINT, d);
    }
    cbor::encode_text("layout", out);
    cbor::encode_text(&o.layout, out);
    if let Some(a) = &o.attributes {
        cbor::encode_text("attributes", out);
        cbor::encode_into(a, out);
    }
    Ok(())
}

/// A part map: keys `blob`, `type`, `dtype`, `digest`, `encoding`,
/// `decoded_length`, in encoded order ([`part_cbor`]'s entries).
fn encode_part(p: &PartOut, ctx: &Context, out: &mut Vec<u8>) -> Result<()> {
    let (storage, logical) = storage_and_type(p.dtype, ctx)?;
    let entries = 3 + logical.is_some() as u64 + 2 * p.encoded.is_some() as u64;
    cbor::head(out, MAP, entries);
    cbor::encode_text("blob", out);
    cbor::head(out, ARRAY, 2);
    cbor::head(out, UINT, p.offset);
    cbor::head(out, UINT, p.length);
    if let Some(t) = logical {
        cbor::encode_text("type", out);
        cbor::encode_text(t, out);
    }
    cbor::encode_text("dtype", out);
    cbor::encode_text(storage.name(), out);
    cbor::encode_text("digest", out);
    cbor::encode_text(&p.digest.to_string(), out);
    if let Some(decoded) = p.encoded {
        cbor::encode_text("encoding", out);
        cbor::encode_text(ZSTD_SEEKABLE, out);
        cbor::encode_text("decoded_length", out);
        cbor::head(out, UINT, decoded);
    }
    Ok(())
}

/// Write the manifest (its `bytes`) and footer at the end of the heap, feeding them to
/// the whole-file digest `hash` when kept. Returns the file size and the
/// manifest's bytes.
pub(super) fn finish_file(
    file: &File,
    heap: &mut Heap,
    bytes: Vec<u8>,
    options: &Options,
    path: &Path,
    hash: Option<&mut FileHash>,
) -> Result<(u64, Vec<u8>)> {
    let offset = heap.place(bytes.len() as u64, options.manifest_align());
    let footer = Footer {
        manifest_offset: offset,
        manifest_length: bytes.len() as u64,
        manifest_hash: xxhash_rust::xxh3::xxh3_64(&bytes),
        version: VERSION,
    };
    let io = |e| Error::io(path, e);
    let footer = footer.encode();
    file.write_all_at(&bytes, offset).map_err(io)?;
    file.write_all_at(&footer, heap.cursor).map_err(io)?;
    if let Some(h) = hash {
        h.update_at(offset, &bytes);
        h.update_at(heap.cursor, &footer);
    }
    let total = heap.cursor + container::FOOTER_LEN;
    // Padding between blobs is left as holes, which read as zeros.
    file.set_len(total).map_err(io)?;
    Ok((total, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(
        name: &str,
        dtype: DType,
        offset: u64,
        encoded: Option<u64>,
        digest: Digest,
    ) -> PartOut {
        PartOut {
            name: name.into(),
            dtype,
            offset,
            length: 96,
            encoded,
            digest,
        }
    }

    #[test]
    fn the_manifest_is_the_encoding_of_the_root_tree() {
        // Names of every encoded-head size and out of key order (a longer
        // name sorts after a shorter one whatever its bytes), several
        // parts, logical and encoded parts, both digests, attributes on an
        // object and on the file: the direct encoding is byte for byte
        // what encoding the tree gives.
        let long = "z".repeat(300);
        let names = [
            "b",
            "aa",
            "tensor.23.chars.long.xx",
            "tensor.24.chars.long.xxx",
            long.as_str(),
            "a",
        ];
        let objects: Vec<ObjectOut> = names
            .iter()
            .enumerate()
            .map(|(i, name)| ObjectOut {
                name: name.to_string(),
                shape: vec![i as u64, 24, 1 << 20],
                layout: if i % 2 == 0 { "dense" } else { "sparse_csr" }.into(),
                attributes: (i == 2)
                    .then(|| Cbor::map([("note", Cbor::Text("x".into())), ("k", Cbor::UInt(3))])),
                parts: vec![
                    part(
                        "values",
                        DType::F32,
                        64 << i,
                        None,
                        Digest::Xxh3(0x0123_4567_89ab_cdef ^ i as u64),
                    ),
                    part(
                        "data",
                        DType::F8E4M3Fn,
                        1 << 40,
                        Some(1 << 33),
                        Digest::Xxh3(i as u64),
                    ),
                    part(
                        "indptr",
                        DType::Bool,
                        7,
                        Some(5),
                        Digest::Sha256([i as u8; 32]),
                    ),
                ][..1 + i % 3]
                    .to_vec(),
            })
            .collect();
        let ctx = Context::file(Path::new("m.zt"));
        for attributes in [None, Some(Cbor::map([("format", Cbor::Text("pt".into()))]))] {
            let tree = {
                let objs = objects
                    .iter()
                    .map(|o| (o.name.clone(), object_cbor(o, &ctx).unwrap()))
                    .collect::<Vec<_>>();
                let mut root = vec![("objects", Cbor::map(objs))];
                if let Some(a) = attributes.clone() {
                    root.push(("attributes", a));
                }
                Cbor::map(root)
            };
            assert_eq!(
                manifest(&objects, attributes.as_ref(), &ctx).unwrap(),
                cbor::encode(&tree)
            );
        }
    }
}
