//! The root of a sharded `.zt` checkpoint (spec §7): a file holding only a
//! manifest whose shard table names each shard with its size and
//! whole-file digest, and whose objects point into the shards' blobs. Each
//! shard is an ordinary `.zt` (its own manifest and per-part digests), so
//! every shard can be opened, verified and evicted on its own; the root
//! copies their object entries and adds the `shard` label. Upstream
//! ztensor opens the result with its positional resolver (`STEM-LABEL.zt`
//! beside the root) and `verify_shards` hashes each shard against the
//! table.

use std::io::Write;
use std::path::{Path, PathBuf};
use zt_core::Rule;

use crate::cbor::{self, Cbor};
use crate::container::{Footer, FLOOR, MAGIC, VERSION};
use crate::manifest::ObjectDef;
use crate::read::manifest_of;
use crate::write::attributes_cbor;
use zt_core::catalog::{Attributes, Digest};
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::store::Store;

/// Write the root at `root` for the complete shard files `shards`, named
/// by `labels` in its table, with the checkpoint's `attributes` (fsynced
/// before its rename when `durable`). Shard
/// digests are XXH3-64 of the whole file (spec §7.1 allows any registered
/// algorithm; XXH3 costs a tenth of SHA-256 on the read-back). Returns the
/// root's size.
pub fn write_root(
    root: &Path,
    shards: &[PathBuf],
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
    shards: &[PathBuf],
    labels: &[String],
    attributes: Option<Cbor>,
    durable: bool,
) -> Result<u64> {
    // Each shard is read back once to hash it, in parallel: the bytes were
    // just written and are in the page cache.
    let described: Vec<Result<(u64, Digest, Vec<ObjectDef>)>> = std::thread::scope(|s| {
        let jobs: Vec<_> = shards
            .iter()
            .map(|path| s.spawn(move || describe(path)))
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("hashing a shard does not panic"))
            .collect()
    });
    let mut objects = Vec::new();
    let mut table = Vec::new();
    for (d, label) in described.into_iter().zip(labels) {
        let (size, digest, objs) = d?;
        table.push((
            label.clone(),
            Cbor::map([
                ("size", Cbor::UInt(size)),
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

/// A shard's size, whole-file digest and objects.
fn describe(path: &Path) -> Result<(u64, Digest, Vec<ObjectDef>)> {
    let store = Store::open(path)?;
    let (_, m) = manifest_of(&store, &Limits::default())?;
    let m = m.ok_or_else(|| Error::Write {
        rule: Rule::ZtWrite,
        ctx: Context::file(path),
        reason: "a shard written for a root must have a manifest".into(),
    })?;
    let digest = Digest::Xxh3(xxhash_rust::xxh3::xxh3_64(store.slice(0, store.len())?));
    Ok((store.len(), digest, m.objects))
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
            m.push(("digest", Cbor::Text(d.into())));
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
