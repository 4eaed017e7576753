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

pub(super) fn root_cbor(
    objects: &[ObjectOut],
    attributes: Option<Cbor>,
    ctx: &Context,
) -> Result<Cbor> {
    let objs = objects
        .iter()
        .map(|o| Ok((o.name.clone(), object_cbor(o, ctx)?)))
        .collect::<Result<Vec<_>>>()?;
    let mut root = vec![("objects", Cbor::map(objs))];
    if let Some(a) = attributes {
        root.push(("attributes", a));
    }
    Ok(Cbor::map(root))
}

/// Write the manifest and footer at the end of the heap, feeding them to
/// the whole-file digest `hash` when kept. Returns the file size and the
/// manifest's bytes.
pub(super) fn finish_file(
    file: &File,
    heap: &mut Heap,
    root: Cbor,
    options: &Options,
    path: &Path,
    hash: Option<&mut FileHash>,
) -> Result<(u64, Vec<u8>)> {
    let bytes = cbor::encode(&root);
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
