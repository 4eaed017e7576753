//! Opening a `.zt` file: footer, manifest, the validation summary of §3.6,
//! shard resolution, and the catalog the rest of zt reads through.

use crate::rules;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::container::{self, Footer};
use crate::encoding::{UnknownEncoding, ZstdSeekable, ZSTD_SEEKABLE};
use crate::manifest::{self, attributes_of, Manifest, ObjectDef};
use crate::validate;
use zt_core::catalog::{Catalog, Object, Part, Payload};
use zt_core::error::{Context, Error, Result};
use zt_core::format::OpenInput;
use zt_core::limits::Limits;
use zt_core::store::Store;

/// The object attribute a reader adds to an object of an object-local
/// profile that breaks the profile's rules (see
/// [`validate::interpret_or_structural`]): the reason, as text.
pub const INVALID_ATTRIBUTE: &str = "zt.invalid";

/// Read the footer and, unless the file is a data shard, the checked
/// manifest.
pub fn manifest_of(store: &Store, limits: &Limits) -> Result<(Footer, Option<Manifest>)> {
    let footer = container::read_footer(store)?;
    if footer.is_data_shard() {
        return Ok((footer, None));
    }
    let bytes = container::read_manifest(store, &footer, limits)?;
    let m = manifest::parse(&bytes, &store.ctx(), footer.manifest_offset)?;
    Ok((footer, Some(m)))
}

/// Check a file image the way upstream's `format::validate::image` does,
/// without opening any other file: the footer, the manifest, every blob
/// reference (a shard's by the size its table entry declares) and every
/// object against its layout. `Ok(None)` for a data shard, else the number
/// of objects. [`open`] does all of this and then resolves the shards.
pub fn validate_image(store: &Store, limits: &Limits) -> Result<Option<usize>> {
    let (footer, manifest) = manifest_of(store, limits)?;
    let Some(m) = manifest else {
        return Ok(None);
    };
    let ctx = store.ctx();
    limits.check_tensors(&ctx, m.objects.len() as u64)?;
    check_blobs(&m, &footer, store)?;
    for o in &m.objects {
        let in_object = |e: Error| e.in_tensor(&o.name);
        limits
            .check_rank(&ctx, o.shape.len())
            .map_err(|e| in_object(e.with_rule(rules::SHAPE)))?;
        validate::interpret_or_structural(o, &ctx).map_err(in_object)?;
    }
    Ok(Some(m.objects.len()))
}

/// The positional shard resolver (Appendix B): shard `n` of `<stem>.zt` is
/// the sibling `<stem>-<n>.zt`. This is its file name.
pub fn positional_name(root: &Path, shard: &str) -> String {
    let stem = root
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("{stem}-{shard}.zt")
}

/// Check every blob reference of `m` (§3.6 rules 3 and 4) against the root
/// store and the shard sizes the table declares.
pub fn check_blobs(m: &Manifest, footer: &Footer, root: &Store) -> Result<()> {
    let ctx = root.ctx();
    // One list of references per file: the root's first, then each shard's
    // in table order. Shards are a handful, found by a scan; no hashing on
    // the path every part takes.
    let parts: usize = m.objects.iter().map(|o| o.parts.len()).sum();
    let mut files: Vec<Vec<(u64, u64, &str)>> = vec![Vec::new(); 1 + m.shards.len()];
    files[0].reserve(parts + 1);
    files[0].push((footer.manifest_offset, footer.manifest_length, ""));
    for o in &m.objects {
        for p in &o.parts {
            let (file, file_len) = match &p.shard {
                None => (0, root.len()),
                Some(s) => {
                    // The manifest walk refused a shard outside the table.
                    let i = m
                        .shards
                        .iter()
                        .position(|d| d.name == *s)
                        .expect("a declared shard");
                    (1 + i, m.shards[i].size)
                }
            };
            container::check_blob(&ctx, file_len, p.offset, p.length, &p.name)
                .map_err(|e| e.in_tensor(&o.name))?;
            files[file].push((p.offset, p.length, o.name.as_str()));
        }
    }
    for refs in &mut files {
        container::check_disjoint(&ctx, refs)?;
    }
    Ok(())
}

/// Open the shards a manifest declares, with the positional resolver (as
/// related files of the root, so a shard name cannot leave its directory),
/// and check each one's size and container frame (the cheap rungs of §7.3).
fn open_shards(m: &Manifest, input: &OpenInput<'_>) -> Result<HashMap<String, Arc<Store>>> {
    let mut out = HashMap::new();
    for s in &m.shards {
        let name = positional_name(input.store.path(), &s.name);
        let store = input.open_related(&name, "shard")?;
        if store.len() != s.size {
            return Err(Error::Index {
                rule: rules::SHARD_IDENTITY,
                ctx: store.ctx(),
                reason: format!(
                    "shard {:?} is {} bytes, the root says {}",
                    s.name,
                    store.len(),
                    s.size
                ),
            });
        }
        container::read_footer(&store)?;
        out.insert(s.name.clone(), store);
    }
    Ok(out)
}

/// Build the catalog of a `.zt` root (or an empty one for a data shard).
pub fn open(input: &OpenInput<'_>) -> Result<Catalog> {
    let (store, limits) = (input.store, input.limits);
    let (footer, manifest) = manifest_of(store, limits)?;
    let Some(mut m) = manifest else {
        return Ok(Catalog::default());
    };
    let ctx = store.ctx();
    limits.check_tensors(&ctx, m.objects.len() as u64)?;
    check_blobs(&m, &footer, store)?;
    let shards = open_shards(&m, input)?;
    // The catalog lists objects by name; the manifest's names, shapes and
    // layouts move into it rather than being copied (at 50k tensors, the
    // copies were a tenth of the open time).
    let order = name_order(&m.objects);
    let mut catalog = Catalog {
        attributes: attributes_of(&m.attributes),
        extra_stores: {
            let mut v: Vec<_> = shards.iter().collect();
            v.sort_by(|a, b| a.0.cmp(b.0));
            v.into_iter().map(|(_, s)| Arc::clone(s)).collect()
        },
        // Sized up front: growing a list of 50k objects moved each several
        // times.
        objects: Vec::with_capacity(m.objects.len()),
        digests: Vec::with_capacity(m.objects.iter().map(|o| o.parts.len()).sum()),
        ..Catalog::default()
    };
    for (oi, at) in order.into_iter().enumerate() {
        let mut o = std::mem::take(&mut m.objects[at]);
        let in_object = |e: Error| e.in_tensor(&o.name);
        limits
            .check_rank(&ctx, o.shape.len())
            .map_err(|e| in_object(e.with_rule(rules::SHAPE)))?;
        // Parts in name order, as upstream lists them (its catalog is a
        // BTreeMap); the manifest's order is CBOR's canonical key order,
        // which puts shorter names first ("indptr" before "indices").
        // Sorted before validating, which finds parts by name, so the
        // views come out in the same order.
        o.parts.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let (views, invalid) = validate::interpret_or_structural(&o, &ctx).map_err(in_object)?;
        let mut parts = Vec::with_capacity(o.parts.len());
        for (pi, (p, view)) in std::mem::take(&mut o.parts)
            .into_iter()
            .zip(views)
            .enumerate()
        {
            let file = match &p.shard {
                None => Arc::clone(store),
                Some(s) => Arc::clone(&shards[s]),
            };
            let payload = match p.encoding.as_deref() {
                None => Payload::Stored {
                    store: file,
                    offset: p.offset,
                    len: p.length,
                },
                Some(ZSTD_SEEKABLE) => Payload::Decoded {
                    decoder: Arc::new(ZstdSeekable {
                        store: file,
                        offset: p.offset,
                        len: p.length,
                        decoded_len: p.decoded_size(),
                    }),
                    decoded_len: p.decoded_size(),
                },
                Some(other) => Payload::Decoded {
                    decoder: Arc::new(UnknownEncoding {
                        ctx: ctx.clone().tensor(&o.name),
                        encoding: other.to_string(),
                    }),
                    decoded_len: p.decoded_size(),
                },
            };
            if let Some(d) = p.parsed_digest() {
                catalog.digests.push((oi, pi, d, rules::DIGEST));
            }
            parts.push(Part {
                name: p.name,
                dtype: view.dtype,
                shape: view.shape,
                strides: None,
                payload,
            });
        }
        catalog.objects.push(Object {
            name: o.name,
            shape: o.shape,
            layout: o.layout,
            parts,
            attributes: {
                let mut a = attributes_of(&o.attributes);
                if let Some(reason) = invalid {
                    // Why the object reads structurally: it breaks its
                    // profile. The file stays readable; only this object
                    // lost its interpretation.
                    a.retain(|(k, _)| k != INVALID_ATTRIBUTE);
                    a.push((
                        INVALID_ATTRIBUTE.into(),
                        zt_core::catalog::Value::Str(reason),
                    ));
                }
                a
            },
        });
    }
    Ok(catalog)
}

/// The positions of `objects` in name order. The objects stay where they
/// are: sorting 50k of them moved each several times, where this moves a
/// position. A stable sort, though names are unique: CBOR's key order
/// (shorter first) leaves one sorted run per name length, which it merges
/// rather than re-sorts.
fn name_order(objects: &[ObjectDef]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..objects.len()).collect();
    order.sort_by(|&a, &b| objects[a].name.cmp(&objects[b].name));
    order
}

/// A context for errors about `path`.
pub fn ctx_of(path: &Path) -> Context {
    Context::file(path)
}
