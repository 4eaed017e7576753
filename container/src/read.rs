//! Opening a `.zt` file: footer, manifest, the validation summary of §3.6,
//! shard resolution, and the catalog the rest of zt reads through.

use crate::rules;
use crate::shard_check::{ShardDigest, ShardsOfObject};
use std::path::Path;
use std::sync::Arc;

use crate::container::{self, Footer};
use crate::encoding::{UnknownEncoding, ZstdSeekable, ZSTD_SEEKABLE};
use crate::manifest::{
    self, attributes_of, Manifest, ObjectDef, ObjectSink, PlainObject, ShardDef, StoredDigest,
};
use crate::name_order::NameOrder;
use crate::validate::{self, Views};
use zt_core::catalog::{Catalog, Check, Object, Part, Payload, Value};
use zt_core::error::{Context, Error, Result};
use zt_core::format::OpenInput;
use zt_core::limits::Limits;
use zt_core::store::Store;
use zt_core::Digests;

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

/// Open one shard of the shard table with the positional resolver (as
/// related files of the root, so a shard name cannot leave its directory),
/// and check its size and container frame (the cheap rungs of §7.3).
fn open_shard(s: &ShardDef, input: &OpenInput<'_>) -> Result<Arc<Store>> {
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
    Ok(store)
}

/// Build the catalog of a `.zt` root (or an empty one for a data shard).
///
/// Each object becomes its catalog entry as the manifest walk hands it
/// over (`CatalogSink`); the checks of [`validate_image`] run on the way
/// and their failures are kept, so the error reported is the one
/// `validate_image` followed by the shard and object checks would report:
/// the manifest's own (CBOR, then schema), the tensor count, blob bounds
/// in manifest order, overlaps (the root, then each shard), the shards,
/// then the first object in name order that breaks its rank limit or its
/// layout.
pub fn open(input: &OpenInput<'_>) -> Result<Catalog> {
    let (store, limits) = (input.store, input.limits);
    let footer = container::read_footer(store)?;
    if footer.is_data_shard() {
        return Ok(Catalog::default());
    }
    let bytes = container::read_manifest(store, &footer, limits)?;
    let mut sink = CatalogSink::new(input, &footer);
    let (_, attributes) = manifest::walk(&bytes, &store.ctx(), footer.manifest_offset, &mut sink)?;
    let built = sink.finish()?;
    Ok(Catalog {
        attributes: attributes_of(&attributes),
        ..built
    })
}

/// The object position of the manifest's own blob reference.
const MANIFEST: usize = usize::MAX;

/// Builds catalog entries from manifest objects as the walk parses them
/// (see [`open`]): one pass, no list of [`ObjectDef`]s.
struct CatalogSink<'a, 'i> {
    input: &'a OpenInput<'i>,
    ctx: Context,
    /// The tensor count is past the limit: nothing more is built.
    too_many: Option<Error>,
    /// Each shard's declared size and its store (`None` if it failed to
    /// open, with the first such failure in `shard_error`).
    shards: Vec<(ShardDef, Option<Arc<Store>>)>,
    shard_error: Option<Error>,
    /// The first blob out of bounds, in manifest order.
    blob_error: Option<Error>,
    /// The first object, by name, that breaks its rank limit or layout
    /// (its position in `objects`).
    object_error: Option<(usize, Error)>,
    /// Blob references per file (the root, then each shard), as
    /// `(offset, length, object)`; [`MANIFEST`] is the manifest itself.
    refs: Vec<Vec<(u64, u64, usize)>>,
    /// Objects in manifest order, which the catalog keeps (it lists them
    /// by name through `Catalog::order`), and their digests as the catalog
    /// lists them (`(object, part, digest, rule)`).
    objects: Vec<Object>,
    digests: Digests,
    /// The objects' name-order keys, taken as each arrives.
    names: NameOrder,
}

impl<'a, 'i> CatalogSink<'a, 'i> {
    fn new(input: &'a OpenInput<'i>, footer: &Footer) -> Self {
        CatalogSink {
            input,
            ctx: input.store.ctx(),
            too_many: None,
            shards: Vec::new(),
            shard_error: None,
            blob_error: None,
            object_error: None,
            refs: vec![vec![(
                footer.manifest_offset,
                footer.manifest_length,
                MANIFEST,
            )]],
            objects: Vec::new(),
            digests: Digests::new(),
            names: NameOrder::default(),
        }
    }

    /// Record the blob references of `o`, the object at `at`, checking
    /// each against the bounds of its file.
    fn note_blobs(&mut self, o: &ObjectDef, at: usize) {
        for p in &o.parts {
            self.note_blob(p.shard.as_deref(), p.offset, p.length, at, &p.name, &o.name);
        }
    }

    /// Record one blob reference (part `part` of object `object`, at
    /// `at`), checking it against the bounds of its file.
    fn note_blob(
        &mut self,
        shard: Option<&str>,
        offset: u64,
        length: u64,
        at: usize,
        part: &str,
        object: &str,
    ) {
        let (file, file_len) = match shard {
            None => (0, self.input.store.len()),
            Some(s) => {
                let i = self.shard_index(s);
                (1 + i, self.shards[i].0.size)
            }
        };
        if self.blob_error.is_none() {
            if let Err(e) = container::check_blob(&self.ctx, file_len, offset, length, part) {
                self.blob_error = Some(e.in_tensor(object));
            }
        }
        self.refs[file].push((offset, length, at));
    }

    /// Each object stored in a shard, with the lazy digest checks of the
    /// shards it is stored in (see [`crate::shard_check`]); one check per
    /// shard, shared by its objects, so a shard is hashed once.
    fn shard_checks(&self) -> Vec<(usize, Arc<dyn Check>)> {
        let digests: Vec<Option<Arc<ShardDigest>>> = self
            .shards
            .iter()
            .map(|(def, store)| {
                let store = Arc::clone(store.as_ref()?);
                ShardDigest::new(&def.name, store, &def.digest).map(Arc::new)
            })
            .collect();
        // (object, shard) for every reference into a shard; `refs[0]` is
        // the root's own.
        let mut uses: Vec<(usize, usize)> = Vec::new();
        for (shard, refs) in self.refs.iter().skip(1).enumerate() {
            if digests[shard].is_some() {
                uses.extend(refs.iter().map(|&(_, _, object)| (object, shard)));
            }
        }
        uses.sort_unstable();
        uses.dedup();
        uses.chunk_by(|a, b| a.0 == b.0)
            .map(|group| {
                let shards = group
                    .iter()
                    .filter_map(|&(_, shard)| digests[shard].clone())
                    .collect();
                (
                    group[0].0,
                    Arc::new(ShardsOfObject(shards)) as Arc<dyn Check>,
                )
            })
            .collect()
    }

    /// The position of shard `name` in the table (the manifest walk
    /// refused a shard outside it).
    fn shard_index(&self, name: &str) -> usize {
        self.shards
            .iter()
            .position(|(d, _)| d.name == name)
            .expect("a declared shard")
    }

    /// How each part of `o` reads, its parts sorted by name, and why the
    /// object reads structurally if it does; or why it cannot be read.
    fn views(&self, o: &mut ObjectDef) -> Result<(Views, Option<String>)> {
        self.input
            .limits
            .check_rank(&self.ctx, o.shape.len())
            .map_err(|e| e.with_rule(rules::SHAPE))?;
        // Parts in name order, as upstream lists them (its catalog is a
        // BTreeMap); the manifest's order is CBOR's canonical key order,
        // which puts shorter names first ("indptr" before "indices").
        // Sorted before validating, which finds parts by name, so the
        // views come out in the same order.
        o.parts.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        validate::interpret_or_structural(o, &self.ctx)
    }

    /// The catalog entry of `o`, the object at `at`, read through `views`.
    fn entry(&mut self, o: ObjectDef, at: usize, views: Views, invalid: Option<String>) -> Object {
        let mut parts = Vec::with_capacity(o.parts.len());
        for (pi, (p, view)) in o.parts.into_iter().zip(views).enumerate() {
            let file = match &p.shard {
                None => Arc::clone(self.input.store),
                // A shard that failed to open fails the whole open
                // (`shard_error`); the root stands in meanwhile.
                Some(s) => Arc::clone(
                    self.shards[self.shard_index(s)]
                        .1
                        .as_ref()
                        .unwrap_or(self.input.store),
                ),
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
                        ctx: self.ctx.clone().tensor(&o.name),
                        encoding: other.to_string(),
                    }),
                    decoded_len: p.decoded_size(),
                },
            };
            if let Some(d) = p.parsed_digest() {
                self.digests.push(at, pi, d, rules::DIGEST);
            }
            parts.push(Part {
                name: p.name,
                dtype: view.dtype,
                shape: view.shape,
                strides: None,
                payload,
            });
        }
        let mut attributes = attributes_of(&o.attributes);
        if let Some(reason) = invalid {
            // Why the object reads structurally: it breaks its profile. The
            // file stays readable; only this object lost its
            // interpretation.
            attributes.retain(|(k, _)| k != INVALID_ATTRIBUTE);
            attributes.push((INVALID_ATTRIBUTE.into(), Value::Str(reason)));
        }
        Object {
            name: o.name,
            shape: o.shape,
            layout: o.layout,
            parts,
            attributes,
        }
    }

    /// The catalog, listed in name order, or the first error by the
    /// precedence of [`open`].
    fn finish(self) -> Result<Catalog> {
        if let Some(e) = self.too_many {
            return Err(e);
        }
        if let Some(e) = self.blob_error {
            return Err(e);
        }
        let checks = self.shard_checks();
        let objects = self.objects;
        for mut refs in self.refs {
            let name = |at: usize| objects.get(at).map_or("", |o| o.name.as_str());
            container::check_disjoint_by(&self.ctx, &mut refs, name)?;
        }
        if let Some(e) = self.shard_error {
            return Err(e);
        }
        if let Some((_, e)) = self.object_error {
            return Err(e);
        }
        // Listed by name, as upstream lists them. The objects stay in
        // manifest order: moving 50k of them (6 MB) into name order and
        // renumbering and re-sorting their digests was 7% of an open (perf),
        // and left their allocations in an order that listing and dropping
        // them then visited at random.
        let order = self.names.finish(|i| objects[i].name.as_str());
        Ok(Catalog {
            objects,
            order: Some(order),
            // The walk refused any key that did not strictly ascend.
            names_unique: true,
            digests: self.digests,
            checks,
            extra_stores: {
                let mut v: Vec<_> = self
                    .shards
                    .into_iter()
                    .filter_map(|(d, s)| Some((d.name, s?)))
                    .collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v.into_iter().map(|(_, s)| s).collect()
            },
            ..Catalog::default()
        })
    }
}

impl ObjectSink for CatalogSink<'_, '_> {
    fn begin(&mut self, count: usize, shards: &[ShardDef]) {
        if let Err(e) = self.input.limits.check_tensors(&self.ctx, count as u64) {
            self.too_many = Some(e);
            return;
        }
        // Sized up front: growing a list of 50k objects moved each several
        // times.
        self.objects.reserve(count);
        self.names.reserve(count);
        self.digests.reserve(count);
        self.refs[0].reserve(count);
        for s in shards {
            let store = match open_shard(s, self.input) {
                Ok(store) => Some(store),
                Err(e) => {
                    self.shard_error.get_or_insert(e);
                    None
                }
            };
            self.shards.push((s.clone(), store));
            self.refs.push(Vec::new());
        }
    }

    /// The writer's plain dense object, built straight from the borrowed
    /// fields when it is valid (nearly every tensor), with no
    /// [`ObjectDef`] in between; anything else takes the general path,
    /// which reports what is wrong.
    fn plain(&mut self, o: PlainObject<'_>) {
        if self.too_many.is_some() {
            return;
        }
        if !validate::is_valid_plain_dense(&o)
            || self
                .input
                .limits
                .check_rank(&self.ctx, o.shape.len())
                .is_err()
        {
            return self.object(o.into_def());
        }
        let at = self.objects.len();
        self.names.note(o.name);
        self.note_blob(None, o.offset, o.length, at, o.part, o.name);
        if let Some(d) = o.digest.as_ref().and_then(StoredDigest::known) {
            self.digests.push(at, 0, d, rules::DIGEST);
        }
        let payload = Payload::Stored {
            store: Arc::clone(self.input.store),
            offset: o.offset,
            len: o.length,
        };
        self.objects
            .push(Object::dense(o.name, o.dtype, o.shape, payload));
    }

    fn object(&mut self, mut o: ObjectDef) {
        if self.too_many.is_some() {
            return;
        }
        let at = self.objects.len();
        self.names.note(&o.name);
        self.note_blobs(&o, at);
        let object = match self.views(&mut o) {
            Ok((views, invalid)) => self.entry(o, at, views, invalid),
            Err(e) => {
                let first = self
                    .object_error
                    .as_ref()
                    .is_none_or(|(first, _)| o.name < self.objects[*first].name);
                if first {
                    self.object_error = Some((at, e.in_tensor(&o.name)));
                }
                // Kept under its name only, for the overlap check's
                // messages: the open fails on `object_error` anyway.
                Object {
                    name: o.name,
                    shape: o.shape,
                    layout: o.layout,
                    parts: Vec::new(),
                    attributes: Vec::new(),
                }
            }
        };
        self.objects.push(object);
    }
}

/// A context for errors about `path`.
pub fn ctx_of(path: &Path) -> Context {
    Context::file(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::Footer;
    use std::sync::OnceLock;
    use zt_core::dtype::DType;

    /// A 64 KiB file of zeros, one for every case (error messages name it).
    fn heap() -> &'static Arc<Store> {
        static HEAP: OnceLock<(tempfile::TempDir, Arc<Store>)> = OnceLock::new();
        &HEAP
            .get_or_init(|| {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("heap.zt");
                std::fs::write(&path, vec![0u8; 65536]).unwrap();
                let store = Arc::new(Store::open(&path).unwrap());
                (dir, store)
            })
            .1
    }

    /// What a catalog sink ends with, as text (the catalog or the error),
    /// after `objects` arrive as plain objects or, when `general`, as the
    /// [`ObjectDef`]s the general walk would have given.
    fn outcome(objects: &[PlainObject<'_>], limits: &Limits, general: bool) -> String {
        let input = OpenInput::new(heap(), limits);
        let footer = Footer {
            manifest_offset: 61440,
            manifest_length: 512,
            manifest_hash: 0,
            version: 2,
        };
        let mut sink = CatalogSink::new(&input, &footer);
        sink.begin(objects.len(), &[]);
        for o in objects {
            if general {
                sink.object(o.clone().into_def());
            } else {
                sink.plain(o.clone());
            }
        }
        format!("{:?}", sink.finish())
    }

    fn plain<'a>(name: &'a str, shape: &[u64], offset: u64, length: u64) -> PlainObject<'a> {
        PlainObject {
            name,
            shape: shape.to_vec(),
            layout: "dense",
            part: "data",
            dtype: DType::F32,
            offset,
            length,
            digest: None,
        }
    }

    #[test]
    fn a_plain_object_builds_the_entry_the_general_path_builds() {
        let digest = StoredDigest::parse("xxh3:0123456789abcdef").unwrap();
        let b = PlainObject {
            digest: Some(digest),
            ..plain("b", &[4], 4096, 16)
        };
        let a = PlainObject {
            dtype: DType::F16,
            ..plain("a", &[2, 3], 8192, 12)
        };
        let unknown_layout = PlainObject {
            layout: "zt.someday/1",
            ..plain("c", &[3], 12288, 12)
        };
        let sizes_wrong = plain("d", &[4], 16384, 15);
        let part_not_data = PlainObject {
            part: "w",
            ..plain("e", &[4], 20480, 16)
        };
        let out_of_bounds = plain("f", &[4], 65536, 16);
        let overlapping = plain("g", &[8], 4096, 32);
        let rank_3 = plain("h", &[1, 1, 4], 24576, 16);
        let limits = Limits::default();
        let cases: [&[PlainObject<'_>]; 7] = [
            &[b.clone(), a.clone(), unknown_layout],
            &[a.clone(), sizes_wrong],
            &[a.clone(), part_not_data],
            &[b.clone(), out_of_bounds],
            &[b.clone(), overlapping],
            &[rank_3.clone(), a.clone()],
            &[b.clone(), a.clone(), rank_3.clone()],
        ];
        for objects in cases {
            let plain_path = outcome(objects, &limits, false);
            assert_eq!(plain_path, outcome(objects, &limits, true));
        }
        let ok = outcome(&[b.clone(), a.clone()], &limits, false);
        // "b" is listed second, by name; it and its digest stay where the
        // manifest put them.
        assert!(
            ok.starts_with("Ok(")
                && ok.contains("order: Some([1, 0])")
                && ok.contains("digests: Digests { xxh3: [(0, 0, 81985529216486895)]"),
            "{ok}"
        );
        assert!(
            outcome(&[a.clone(), plain("d", &[4], 16384, 15)], &limits, false).starts_with("Err(")
        );

        let rank_2 = Limits {
            rank: 2,
            ..Limits::default()
        };
        let refused = outcome(&[b.clone(), rank_3.clone()], &rank_2, false);
        assert_eq!(refused, outcome(&[b, rank_3], &rank_2, true));
        assert!(
            refused.starts_with("Err(") && refused.contains("rank"),
            "{refused}"
        );
    }
}
