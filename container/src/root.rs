//! The root of a sharded `.zt` checkpoint (spec §7): a file holding only a
//! manifest whose shard table names each shard with its size and
//! whole-file digest, and whose objects point into the shards' blobs. Each
//! shard is an ordinary `.zt` (its own manifest and per-part digests), so
//! every shard can be opened, verified and evicted on its own; the root
//! copies their object entries and adds the `shard` label. Upstream
//! ztensor opens the result with its positional resolver (`STEM-LABEL.zt`
//! beside the root) and `verify_shards` hashes each shard against the
//! table. The root is written from what each shard's writer kept while
//! writing it (digest and manifest); no shard is read back.

use crate::rules;
use std::io::Write;
use std::path::Path;

use crate::cbor::{self, Cbor};
use crate::container::{Footer, FLOOR, MAGIC, VERSION};
use crate::manifest::{self, ObjectDef};
use crate::write::attributes_cbor;
use zt_core::catalog::{Attributes, Digest};
use zt_core::error::{Context, Error, Result};
use zt_core::write::WrittenFile;

/// Write the root at `root` for the complete shard files `shards` (as
/// their writer described them: [`crate::write::write_shard`],
/// [`crate::write::Writer::finish_shard`]), named by `labels` in its
/// table, with the checkpoint's `attributes` (fsynced before its rename
/// when `durable`). Shard digests are XXH3-64 of the whole file (spec
/// §7.1 allows any registered algorithm), computed by the shard's writer
/// over the bytes as it wrote them, and the objects come from the
/// manifest it wrote: no shard is read back. Returns the root's size.
pub fn write_root(
    root: &Path,
    shards: &[WrittenFile],
    labels: &[String],
    attributes: &Attributes,
    durable: bool,
) -> Result<u64> {
    write_root_cbor(root, shards, labels, attributes_cbor(attributes), durable)
}

/// [`write_root`] with the attributes as the CBOR map the root records
/// (what `zt.Writer.set_attributes` gives), or none.
pub fn write_root_cbor(
    root: &Path,
    shards: &[WrittenFile],
    labels: &[String],
    attributes: Option<Cbor>,
    durable: bool,
) -> Result<u64> {
    let mut objects = Vec::new();
    let mut table = Vec::new();
    for (shard, label) in shards.iter().zip(labels) {
        let (digest, objs) = describe(shard)?;
        table.push((
            label.clone(),
            Cbor::map([
                ("size", Cbor::UInt(shard.bytes)),
                ("digest", Cbor::Text(digest.to_string().into())),
            ]),
        ));
        for o in objs {
            objects.push((o.name.clone(), object_cbor(o, label)));
        }
    }
    let mut entries = vec![
        ("objects", Cbor::map(objects)),
        ("shards", Cbor::map(table)),
    ];
    if let Some(a) = attributes {
        entries.push(("attributes", a));
    }
    let bytes = cbor::encode(&Cbor::map(entries));
    let footer = Footer {
        manifest_offset: FLOOR,
        manifest_length: bytes.len() as u64,
        manifest_hash: xxhash_rust::xxh3::xxh3_64(&bytes),
        version: VERSION,
    };
    zt_core::publish::publish_with(root, durable, |w| {
        w.write_all(MAGIC)?;
        w.write_all(&vec![0u8; FLOOR as usize - MAGIC.len()])?;
        w.write_all(&bytes)?;
        w.write_all(&footer.encode())
    })
}

/// A shard's whole-file digest and objects, from what its writer kept.
fn describe(shard: &WrittenFile) -> Result<(Digest, Vec<ObjectDef>)> {
    let ctx = Context::file(&shard.path);
    let (Some(digest), Some(manifest)) = (shard.digest, &shard.manifest) else {
        return Err(Error::Write {
            rule: rules::WRITE,
            ctx,
            reason: "a shard written for a root must come with its digest and manifest".into(),
        });
    };
    // The manifest's offset only places errors, and this one was just
    // written by zt: any error here is zt's own.
    let m = manifest::parse(manifest, &ctx, 0)?;
    Ok((digest, m.objects))
}

/// A shard's object entry as the root lists it: the same, each part
/// pointing into the shard.
fn object_cbor(o: ObjectDef, shard: &str) -> Cbor {
    let parts = o.parts.into_iter().map(|p| {
        let mut m = vec![
            (
                "blob",
                Cbor::Array(vec![Cbor::UInt(p.offset), Cbor::UInt(p.length)]),
            ),
            ("dtype", Cbor::Text(p.dtype.name().to_string().into())),
            ("shard", Cbor::Text(shard.to_string().into())),
        ];
        if let Some(d) = p.digest {
            m.push(("digest", Cbor::Text(d.to_string().into())));
        }
        if let Some(t) = p.logical {
            m.push(("type", Cbor::Text(t)));
        }
        if let Some(e) = p.encoding {
            m.push(("encoding", Cbor::Text(e)));
        }
        if let Some(n) = p.decoded_length {
            m.push(("decoded_length", Cbor::UInt(n)));
        }
        (p.name, Cbor::map(m))
    });
    let mut m = vec![
        (
            "shape",
            Cbor::Array(o.shape.iter().map(|&d| Cbor::UInt(d)).collect()),
        ),
        ("layout", Cbor::Text(o.layout)),
        ("parts", Cbor::map(parts)),
    ];
    if let Some(a) = o.attributes {
        m.push(("attributes", a));
    }
    Cbor::map(m)
}
