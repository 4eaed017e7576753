//! Writing `.zt` files.
//!
//! Two paths produce identical bytes for identical input:
//!
//! * [`Writer`], incremental: `add`, `add_object`, `stream` (chunked, for
//!   tensors larger than memory), `set_attributes`, `ingest`, `finish`,
//!   `abandon`. Blobs go to the file as they arrive.
//! * [`write_objects`], the batch path behind `convert` and
//!   `zt.numpy.save_file`: every tensor is in memory (or mapped) at once, so
//!   the hashing runs just ahead of the writes on a thread of its own
//!   (`scout`; with compression, hashing and compression run on the pool,
//!   `ahead`), the file is written front to back in one pass, and
//!   duplicates are confirmed against the bytes in memory.
//!
//! Placement: canonical (64 KiB from 65536, the §6.3 rules, byte-identical
//! to upstream ztensor 2.1.2), a fixed power of two ≥ 4096, or `auto`:
//! blobs of at least [`AUTO_THRESHOLD`] bytes at 64 KiB (their pages are
//! their own at every page size, so per-tensor evict keeps working), smaller
//! ones at the 4 KiB floor (a 10 KiB tensor then costs 12 KiB, not 64 KiB).
//!
//! Byte-identical decoded parts always share one blob (the dedup key is the
//! XXH3-64 digest the manifest stores anyway, plus the length; the batch
//! writer's scout first rules out parts over 256 KiB whose length and first
//! 4 KiB match no earlier part; equality is confirmed on the bytes before
//! sharing).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use unicode_normalization::is_nfc;

use crate::ahead;
use crate::cbor::{self, Cbor};
use crate::container::{self, Footer, CANONICAL_ALIGN, FLOOR, MAGIC, VERSION};
use crate::encoding::{self, ZSTD_SEEKABLE};
use crate::manifest::{self, check_name};
use crate::scout::{self, Scouted, WRITE_PIECE};
use crate::sink::Sink;
use crate::validate::{self, logical_name};
use zt_core::catalog::{Digest, DigestAlgorithm, Value};
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::publish::Partial;
use zt_core::source::Source;
use zt_core::store::Store;
use zt_core::write::{Align, WriteOptions};

/// Blobs at least this long go to 64 KiB boundaries under `align="auto"`.
///
/// At 1 MiB the worst-case extra padding of 64 KiB over 4 KiB placement is
/// under 6% of the blob; below it, small tensors pack at the 4 KiB floor
/// (measured: 50,000 tensors of 10 KiB take 1.20x their payload with auto,
/// 6.4x with 64 KiB placement).
pub const AUTO_THRESHOLD: u64 = 1 << 20;

/// Default zstd level for `zt.zstd-seekable/1`.
pub const DEFAULT_LEVEL: i32 = 3;

/// How a writer places blobs and what it promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Canonical form (§6.3): sorted NFC names, raw parts, 64 KiB placement.
    pub canonical: bool,
    /// Placement when not canonical (`Align::Canonical` means 64 KiB).
    pub align: Align,
    /// Make the published file durable: fsync it before the rename and its
    /// directory after. (Every new file is built beside its destination
    /// and renamed into place on `finish`, with or without this.)
    pub publish: bool,
    /// Amend an existing file (§2.5) instead of creating one.
    pub append: bool,
    /// zstd level for every part (`None`: raw, unless a part asks).
    pub compression: Option<i32>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            canonical: true,
            align: Align::Canonical,
            publish: false,
            append: false,
            compression: None,
        }
    }
}

impl Options {
    /// The options `convert` and `save_file` use for `WriteOptions`:
    /// canonical unless an alignment other than canonical or compression is
    /// asked for (then `auto` unless a number is given).
    pub fn from_write_options(o: &WriteOptions) -> Options {
        let canonical = matches!(o.align, None | Some(Align::Canonical)) && o.compression.is_none();
        let align = match o.align {
            Some(a) if !canonical => a,
            None if !canonical => Align::Auto,
            _ => Align::Canonical,
        };
        Options {
            canonical,
            align: if canonical { Align::Canonical } else { align },
            compression: o.compression,
            ..Options::default()
        }
    }

    fn check(&self, ctx: &Context) -> Result<()> {
        let bad = |reason: &str| Error::Write {
            ctx: ctx.clone(),
            reason: reason.into(),
        };
        if let Align::Bytes(n) = self.align {
            if n < FLOOR || !n.is_power_of_two() {
                return Err(bad("align must be a power of two of at least 4096"));
            }
            if self.canonical && n != CANONICAL_ALIGN {
                return Err(bad("canonical form places blobs at 65536; pass canonical=False for another alignment"));
            }
        }
        if self.canonical && self.align == Align::Auto {
            return Err(bad("align=\"auto\" is not canonical; pass canonical=False"));
        }
        if self.canonical && self.compression.is_some() {
            return Err(bad(
                "canonical form stores raw parts; pass canonical=False to compress",
            ));
        }
        if self.canonical && self.append {
            return Err(bad(
                "an appended file is not canonical; pass canonical=False",
            ));
        }
        if self.publish && self.append {
            return Err(bad(
                "append amends the file in place; it cannot also publish",
            ));
        }
        Ok(())
    }

    /// The alignment for a blob of `len` bytes.
    fn align_for(&self, len: u64) -> u64 {
        match self.align {
            Align::Canonical => CANONICAL_ALIGN,
            Align::Bytes(n) => n,
            Align::Auto if len >= AUTO_THRESHOLD => CANONICAL_ALIGN,
            Align::Auto => FLOOR,
        }
    }

    /// The alignment of the manifest blob.
    fn manifest_align(&self) -> u64 {
        match self.align {
            Align::Auto => FLOOR,
            _ => self.align_for(0),
        }
    }
}

fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// One part handed to a writer.
#[derive(Debug, Clone)]
pub struct PartIn<'a> {
    /// Part name.
    pub name: String,
    /// Element type (a logical type is stored as its storage dtype + `type`).
    pub dtype: DType,
    /// The decoded bytes.
    pub data: std::borrow::Cow<'a, [u8]>,
    /// zstd level for `zt.zstd-seekable/1`, or `None` for the writer's default.
    pub compression: Option<i32>,
}

/// One object handed to a writer.
#[derive(Debug, Clone)]
pub struct ObjectIn<'a> {
    /// Object name.
    pub name: String,
    /// Logical shape.
    pub shape: Vec<u64>,
    /// `"dense"` or a profile id.
    pub layout: String,
    /// Per-object attributes (a text-keyed map).
    pub attributes: Option<Cbor>,
    /// The parts.
    pub parts: Vec<PartIn<'a>>,
}

impl<'a> ObjectIn<'a> {
    /// A dense object.
    pub fn dense(name: &str, dtype: DType, shape: &[u64], data: &'a [u8]) -> Self {
        ObjectIn {
            name: name.to_string(),
            shape: shape.to_vec(),
            layout: "dense".into(),
            attributes: None,
            parts: vec![PartIn {
                name: "data".into(),
                dtype,
                data: std::borrow::Cow::Borrowed(data),
                compression: None,
            }],
        }
    }
}

/// A part as it will be described in the manifest.
#[derive(Debug, Clone)]
struct PartOut {
    name: String,
    dtype: DType,
    offset: u64,
    length: u64,
    encoded: Option<u64>,
    digest: Digest,
}

#[derive(Debug, Clone)]
struct ObjectOut {
    name: String,
    shape: Vec<u64>,
    layout: String,
    attributes: Option<Cbor>,
    parts: Vec<PartOut>,
}

fn storage_and_type(d: DType, ctx: &Context) -> Result<(DType, Option<&'static str>)> {
    match logical_name(d) {
        Some(name) => Ok((d.storage(), Some(name))),
        None if !d.is_logical() => Ok((d, None)),
        None => Err(Error::Write {
            ctx: ctx.clone(),
            reason: format!("{d} has no registered zTensor logical type"),
        }),
    }
}

fn part_cbor(p: &PartOut, ctx: &Context) -> Result<Cbor> {
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

fn object_cbor(o: &ObjectOut, ctx: &Context) -> Result<Cbor> {
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

/// Check an object before anything of it is written: names, canonical
/// order and NFC, sizes against the layout.
fn check_object(
    o: &ObjectIn<'_>,
    canonical: bool,
    prev: Option<&str>,
    ctx: &Context,
) -> Result<()> {
    let octx = ctx.clone().tensor(&o.name);
    let bad = |reason: String| Error::Write {
        ctx: octx.clone(),
        reason,
    };
    check_name(&o.name, &octx, "object name").map_err(|e| bad(e.to_string()))?;
    if canonical {
        if let Some(p) = prev {
            if p >= o.name.as_str() {
                return Err(bad(format!(
                    "canonical form requires strictly ascending names: {:?} after {p:?}",
                    o.name
                )));
            }
        }
        if !is_nfc(&o.name) || o.parts.iter().any(|p| !is_nfc(&p.name)) {
            return Err(bad("canonical form requires NFC names".into()));
        }
    }
    if o.parts.is_empty() {
        return Err(bad("an object needs at least one part".into()));
    }
    if let Some(a) = &o.attributes {
        manifest::check_attributes(a, &octx).map_err(|e| bad(e.to_string()))?;
    }
    // Validate the object as a reader will, with stand-in blob references.
    let def = manifest::ObjectDef {
        name: o.name.clone(),
        shape: o.shape.clone(),
        layout: o.layout.clone().into(),
        attributes: o.attributes.clone(),
        parts: o
            .parts
            .iter()
            .map(|p| {
                check_name(&p.name, &octx, "part name").map_err(|e| bad(e.to_string()))?;
                let (storage, logical) = storage_and_type(p.dtype, &octx)?;
                Ok(manifest::PartDef {
                    name: p.name.clone().into(),
                    dtype: storage,
                    logical: logical.map(std::borrow::Cow::Borrowed),
                    offset: FLOOR,
                    length: p.data.len() as u64,
                    shard: None,
                    encoding: None,
                    decoded_length: None,
                    digest: None,
                })
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let mut names: Vec<&str> = o.parts.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(bad("two parts share a name".into()));
    }
    if manifest::MAX_RANK < o.shape.len() {
        return Err(bad(format!("rank {} is over 64", o.shape.len())));
    }
    validate::interpret(&def, &octx).map_err(|e| bad(e.to_string()))?;
    Ok(())
}

/// Where blobs go and which are shared: the placement state both write
/// paths use, so they agree byte for byte.
#[derive(Debug, Default)]
struct Heap {
    cursor: u64,
    /// (digest, decoded length, encoded?) -> (offset, stored length) of blobs written.
    seen: HashMap<(u64, u64, bool), Vec<(u64, u64)>>,
}

impl Heap {
    fn place(&mut self, len: u64, align: u64) -> u64 {
        let offset = align_up(self.cursor, align).max(align_up(FLOOR, align));
        self.cursor = offset + len;
        offset
    }
}

/// Sort parts by name, the order canonical placement assigns blobs in.
fn sort_parts(o: &mut ObjectIn<'_>) {
    o.parts.sort_by(|a, b| a.name.cmp(&b.name));
}

/// Where the batch writer put one part.
struct PartPlaced {
    digest: Digest,
    encoded: bool,
    offset: u64,
    stored: u64,
}

fn digest_key(d: &Digest) -> u64 {
    match d {
        Digest::Xxh3(v) => *v,
        Digest::Sha256(b) => u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
    }
}

/// Write the manifest and footer at the end of the heap.
fn finish_file(
    file: &File,
    heap: &mut Heap,
    root: Cbor,
    options: &Options,
    path: &Path,
) -> Result<u64> {
    let bytes = cbor::encode(&root);
    let offset = heap.place(bytes.len() as u64, options.manifest_align());
    let footer = Footer {
        manifest_offset: offset,
        manifest_length: bytes.len() as u64,
        manifest_hash: xxhash_rust::xxh3::xxh3_64(&bytes),
        version: VERSION,
    };
    let io = |e| Error::io(path, e);
    file.write_all_at(&bytes, offset).map_err(io)?;
    file.write_all_at(&footer.encode(), heap.cursor)
        .map_err(io)?;
    let total = heap.cursor + container::FOOTER_LEN;
    // Padding between blobs is left as holes, which read as zeros.
    file.set_len(total).map_err(io)?;
    Ok(total)
}

/// Write `objects` to `path` in one batch: hashing (and compression) off
/// the writing thread, duplicates confirmed in memory, one sequential
/// pass of writes. The file is built beside `path` and renamed
/// into place (fsynced when `options.publish`). Returns the file size.
pub fn write_objects(
    path: &Path,
    mut objects: Vec<ObjectIn<'_>>,
    attributes: Option<Cbor>,
    options: &Options,
) -> Result<u64> {
    let ctx = Context::file(path);
    options.check(&ctx)?;
    if options.append {
        let mut w = Writer::open(path, *options)?;
        for o in objects {
            w.add_object(o)?;
        }
        if let Some(a) = attributes {
            w.set_attributes(a)?;
        }
        return w.finish();
    }
    if options.canonical {
        objects.sort_by(|a, b| a.name.cmp(&b.name));
    }
    let mut prev: Option<&str> = None;
    for o in &mut objects {
        sort_parts(o);
    }
    for o in &objects {
        check_object(o, options.canonical, prev, &ctx)?;
        prev = Some(&o.name);
    }
    if options.canonical {
        for w in objects.windows(2) {
            if w[0].name == w[1].name {
                return Err(Error::DuplicateName {
                    ctx: ctx.clone().tensor(&w[0].name),
                });
            }
        }
    } else {
        let mut names: Vec<&str> = objects.iter().map(|o| o.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::DuplicateName {
                ctx: ctx.clone().tensor(w[0]),
            });
        }
    }
    if let Some(a) = &attributes {
        manifest::check_attributes(a, &ctx).map_err(|e| Error::Write {
            ctx: ctx.clone(),
            reason: e.to_string(),
        })?;
    }
    // Flatten parts in (object, part) order.
    let flat: Vec<(usize, usize)> = objects
        .iter()
        .enumerate()
        .flat_map(|(oi, o)| (0..o.parts.len()).map(move |pi| (oi, pi)))
        .collect();
    let part = |i: usize| {
        let (oi, pi) = flat[i];
        &objects[oi].parts[pi]
    };
    let partial = Partial::create(path)?;
    let file = partial.file();
    let io = |e| Error::io(path, e);
    file.write_all_at(MAGIC, 0).map_err(io)?;
    let mut blobs = Blobs {
        sink: Sink::new(file, MAGIC.len() as u64),
        heap: Heap {
            cursor: MAGIC.len() as u64,
            ..Heap::default()
        },
        options,
        placed: Vec::with_capacity(flat.len()),
    };
    // Blobs go out in offset order from this thread: scattered parallel
    // writes into a sparse file measured 7x slower for 26k small tensors,
    // and ext4 serialises writes to one file anyway.
    let compressed = options.compression.is_some()
        || objects
            .iter()
            .any(|o| o.parts.iter().any(|p| p.compression.is_some()));
    if compressed {
        write_encoded(flat.len(), &part, &mut blobs, path)?;
    } else {
        write_raw(flat.len(), &part, &mut blobs).map_err(io)?;
    }
    blobs.sink.flush().map_err(io)?;
    let Blobs {
        mut heap,
        placed: written,
        ..
    } = blobs;
    // `flat` lists parts in (object, part) order, so a running index
    // walks it in step with the nested loops below.
    let mut next = 0usize;
    let outs: Vec<ObjectOut> = objects
        .iter()
        .map(|o| ObjectOut {
            name: o.name.clone(),
            shape: o.shape.clone(),
            layout: o.layout.clone(),
            attributes: o.attributes.clone(),
            parts: o
                .parts
                .iter()
                .map(|p| {
                    let w = &written[next];
                    next += 1;
                    PartOut {
                        name: p.name.clone(),
                        dtype: p.dtype,
                        offset: w.offset,
                        length: w.stored,
                        encoded: w.encoded.then_some(p.data.len() as u64),
                        digest: w.digest,
                    }
                })
                .collect(),
        })
        .collect();
    let root = root_cbor(&outs, attributes, &ctx)?;
    let total = finish_file(file, &mut heap, root, options, path)?;
    partial.commit(options.publish)?;
    Ok(total)
}

/// Where the batch writer has put each part so far, and the sink it
/// writes the blobs through, front to back.
struct Blobs<'f, 'o> {
    sink: Sink<'f>,
    heap: Heap,
    options: &'o Options,
    /// One entry per part, in part order.
    placed: Vec<PartPlaced>,
}

impl Blobs<'_, '_> {
    /// Place a new blob of `len` bytes and move the sink to it.
    fn begin(&mut self, len: u64) -> std::io::Result<u64> {
        let offset = self.heap.place(len, self.options.align_for(len));
        self.sink.skip_to(offset)?;
        Ok(offset)
    }

    /// The next part is a new blob at `offset`.
    fn done(&mut self, digest: Digest, encoded: bool, offset: u64, stored: u64) {
        self.placed.push(PartPlaced {
            digest,
            encoded,
            offset,
            stored,
        });
    }

    /// The next part shares part `twin`'s blob.
    fn share(&mut self, twin: usize, digest: Digest) {
        let t = &self.placed[twin];
        let (encoded, offset, stored) = (t.encoded, t.offset, t.stored);
        self.done(digest, encoded, offset, stored);
    }
}

/// Raw parts: the scout hashes each part, and finds the ones that repeat
/// an earlier part, just ahead of the writes.
fn write_raw<'p, 'd: 'p, F>(n: usize, part: &F, blobs: &mut Blobs<'_, '_>) -> std::io::Result<()>
where
    F: Fn(usize) -> &'p PartIn<'d> + Sync,
{
    scout::scout(
        n,
        |i| &part(i).data[..],
        |messages| {
            // The streamed part being written, its offset and bytes written.
            let mut streaming: Option<(usize, u64, usize)> = None;
            for message in messages {
                match message {
                    Scouted::Whole(parts) => {
                        for w in parts {
                            if let Some(j) = w.twin {
                                blobs.share(j, w.digest);
                                continue;
                            }
                            let data = &part(w.part).data;
                            let offset = blobs.begin(data.len() as u64)?;
                            blobs.sink.put(data)?;
                            blobs.done(w.digest, false, offset, data.len() as u64);
                        }
                    }
                    Scouted::Chunk { part: i, end } => {
                        let data = &part(i).data;
                        let (offset, from) = match streaming {
                            Some((p, offset, written)) if p == i => (offset, written),
                            _ => (blobs.begin(data.len() as u64)?, 0),
                        };
                        // Write up to the last WRITE_PIECE boundary of the file
                        // that the hashed bytes reach; the rest waits for the
                        // next chunk, or goes out at the part's end.
                        let cut = if end == data.len() {
                            end
                        } else {
                            let boundary = (offset + end as u64) / WRITE_PIECE * WRITE_PIECE;
                            (boundary.saturating_sub(offset) as usize).max(from)
                        };
                        if cut > from {
                            blobs.sink.put(&data[from..cut])?;
                        }
                        streaming = Some((i, offset, cut));
                    }
                    Scouted::Streamed { part: i, digest } => {
                        let offset = match streaming.take() {
                            Some((p, offset, _)) if p == i => offset,
                            _ => {
                                return Err(std::io::Error::other("scout skipped a part's chunks"))
                            }
                        };
                        blobs.done(digest, false, offset, part(i).data.len() as u64);
                    }
                }
            }
            if blobs.placed.len() != n {
                return Err(std::io::Error::other("the hashing thread stopped early"));
            }
            Ok(())
        },
    )
}

/// Parts with compression: hashing and compression (the CPU work) run ahead
/// on the pool while this thread places and writes each part as its result
/// arrives.
fn write_encoded<'p, 'd: 'p, F>(
    n: usize,
    part: &F,
    blobs: &mut Blobs<'_, '_>,
    path: &Path,
) -> Result<()>
where
    F: Fn(usize) -> &'p PartIn<'d> + Sync,
{
    let default_level = blobs.options.compression;
    let prepare = |i: usize| -> Result<(Digest, Option<Vec<u8>>)> {
        let p = part(i);
        let digest = DigestAlgorithm::Xxh3.digest(&p.data);
        let encoded = match p.compression.or(default_level) {
            Some(level) => Some(encoding::encode(&p.data, level).map_err(|e| Error::io(path, e))?),
            None => None,
        };
        Ok((digest, encoded))
    };
    let io = |e| Error::io(path, e);
    ahead::run_ahead(n, prepare, |ready| {
        let mut first_of: HashMap<(u64, u64, bool), Vec<usize>> = HashMap::new();
        for i in 0..n {
            let (digest, encoded) = ready.take(i)?;
            let data = &part(i).data;
            let key = (digest_key(&digest), data.len() as u64, encoded.is_some());
            // Equality is confirmed on the bytes in memory before sharing.
            let twin = first_of.get(&key).and_then(|cands| {
                cands
                    .iter()
                    .copied()
                    .find(|&j| part(j).data[..] == data[..])
            });
            if let Some(j) = twin {
                blobs.share(j, digest);
                continue;
            }
            let bytes: &[u8] = encoded.as_deref().unwrap_or(data);
            let offset = blobs.begin(bytes.len() as u64).map_err(io)?;
            blobs.sink.put(bytes).map_err(io)?;
            first_of.entry(key).or_default().push(i);
            blobs.done(digest, encoded.is_some(), offset, bytes.len() as u64);
        }
        Ok(())
    })
}

fn root_cbor(objects: &[ObjectOut], attributes: Option<Cbor>, ctx: &Context) -> Result<Cbor> {
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

/// The objects of a source as writer input: every part's decoded bytes
/// (borrowed from the mapping when raw), names and attributes kept.
pub fn objects_of(source: &Source) -> Result<Vec<ObjectIn<'_>>> {
    // Every part is read up front, together (one planned batch per remote
    // object): dense tensors in C order, other layouts as stored.
    let mut dense = Vec::new();
    let mut stored = Vec::new();
    for t in source.tensors() {
        let to = if t.layout() == "dense" {
            &mut dense
        } else {
            &mut stored
        };
        to.extend(t.parts());
    }
    let mut dense = zt_core::part::bytes_of(&dense)?.into_iter();
    let mut stored = zt_core::part::storage_bytes_of(&stored)?.into_iter();
    source
        .tensors()
        .map(|t| {
            let data = if t.layout() == "dense" {
                &mut dense
            } else {
                &mut stored
            };
            let parts = t
                .parts()
                .map(|p| PartIn {
                    name: p.name().to_string(),
                    dtype: p.dtype(),
                    data: data.next().expect("one read per part"),
                    compression: None,
                })
                .collect();
            let attributes = if t.attributes().is_empty() {
                None
            } else {
                Some(Cbor::map(
                    t.attributes()
                        .iter()
                        .map(|(k, v)| (k.clone(), manifest::from_value(v))),
                ))
            };
            Ok(ObjectIn {
                name: t.name().to_string(),
                shape: t.shape().to_vec(),
                layout: t.layout().to_string(),
                attributes,
                parts,
            })
        })
        .collect()
}

/// File attributes as CBOR (`None` when there are none).
pub fn attributes_cbor(attrs: &[(String, Value)]) -> Option<Cbor> {
    (!attrs.is_empty()).then(|| {
        Cbor::map(
            attrs
                .iter()
                .map(|(k, v)| (k.clone(), manifest::from_value(v))),
        )
    })
}

/// `zt convert` / `zt.convert` to `.zt`.
pub fn convert(source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
    let opts = Options::from_write_options(options);
    let objects = objects_of(source)?;
    write_objects(path, objects, attributes_cbor(source.attributes()), &opts)
}

/// The streaming XXH3 state (wrapped for `Debug`), boxed: `Xxh3` is
/// 64-byte aligned, and a `Writer` held inline by a Python object (whose
/// allocator aligns to 16) would otherwise sit misaligned.
struct Hasher(Box<xxhash_rust::xxh3::Xxh3>);

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Xxh3")
    }
}

/// An open stream: the object being written a chunk at a time.
#[derive(Debug)]
struct Stream {
    object: ObjectOut,
    /// (name, dtype, declared length) of the parts, in name order.
    parts: Vec<(String, DType, u64)>,
    /// Index of the part being written and bytes written into it.
    current: usize,
    written: u64,
    hasher: Hasher,
    /// Heap cursor before the current part was placed (for undoing a duplicate).
    part_start: (u64, u64),
}

/// An incremental `.zt` writer.
///
/// ```
/// # fn main() -> zt::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// use zt::container::write::{Options, Writer};
/// let path = dir.path().join("m.zt");
/// let mut w = Writer::create(&path, Options::default())?;
/// w.add("w", zt::DType::F32, &[2], &[0, 0, 128, 63, 0, 0, 0, 64])?;
/// w.finish()?;
/// assert_eq!(zt::open(&path)?.tensor("w")?.shape(), &[2]);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Writer {
    dest: PathBuf,
    /// What is being written; `None` once finished or discarded.
    target: Option<Target>,
    options: Options,
    heap: Heap,
    objects: Vec<ObjectOut>,
    /// The prior manifest (append mode), new objects merged into it.
    prior: Option<Cbor>,
    /// File length before an append (restored on abandon).
    prior_len: Option<u64>,
    attributes: Option<Cbor>,
    stream: Option<Stream>,
    names: std::collections::HashSet<String>,
    done: bool,
}

/// The file a [`Writer`] writes.
#[derive(Debug)]
enum Target {
    /// A new file, built beside its destination.
    New(Partial),
    /// An existing file amended in place (append, §2.5).
    Amend(File),
}

impl Target {
    fn file(&self) -> &File {
        match self {
            Target::New(partial) => partial.file(),
            Target::Amend(file) => file,
        }
    }
}

impl Writer {
    /// Start a new file (or amend one when `options.append`).
    pub fn create(path: impl AsRef<Path>, options: Options) -> Result<Writer> {
        let dest = path.as_ref().to_path_buf();
        options.check(&Context::file(&dest))?;
        if options.append {
            return Writer::open(&dest, options);
        }
        let partial = Partial::create(&dest)?;
        partial
            .file()
            .write_all_at(MAGIC, 0)
            .map_err(|e| Error::io(&dest, e))?;
        Ok(Writer {
            dest,
            target: Some(Target::New(partial)),
            options,
            heap: Heap {
                cursor: 8,
                ..Heap::default()
            },
            objects: Vec::new(),
            prior: None,
            prior_len: None,
            attributes: None,
            stream: None,
            names: Default::default(),
            done: false,
        })
    }

    /// Amend an existing `.zt` root (§2.5): new blobs, a new manifest and a
    /// new footer go past the current end; nothing existing is overwritten.
    pub fn open(path: impl AsRef<Path>, mut options: Options) -> Result<Writer> {
        let dest = path.as_ref().to_path_buf();
        options.append = true;
        options.canonical = false;
        let store = Store::open_positional(&dest)?;
        let (footer, m) = super::read::manifest_of(&store, &Limits::default())?;
        let m = m.ok_or_else(|| Error::Write {
            ctx: Context::file(&dest),
            reason: "a data shard has no manifest to amend".into(),
        })?;
        let bytes = container::read_manifest(&store, &footer, &Limits::default())?;
        let root = cbor::decode(
            &bytes,
            cbor::DecodeLimits {
                depth: cbor::MAX_DEPTH,
            },
        )
        .map_err(|e| Error::header(Context::file(&dest), e.reason))?;
        let len = store.len();
        drop(store);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dest)
            .map_err(|e| Error::io(&dest, e))?;
        Ok(Writer {
            dest,
            target: Some(Target::Amend(file)),
            options,
            heap: Heap {
                cursor: len,
                ..Heap::default()
            },
            objects: Vec::new(),
            attributes: m.attributes.clone(),
            names: m.objects.iter().map(|o| o.name.clone()).collect(),
            prior: Some(root),
            prior_len: Some(len),
            stream: None,
            done: false,
        })
    }

    fn ctx(&self) -> Context {
        Context::file(&self.dest)
    }

    fn file(&self) -> Result<&File> {
        self.target
            .as_ref()
            .map(Target::file)
            .ok_or_else(|| Error::Write {
                ctx: self.ctx(),
                reason: "the writer is finished".into(),
            })
    }

    fn check_idle(&self) -> Result<()> {
        if self.stream.is_some() {
            return Err(Error::Write {
                ctx: self.ctx(),
                reason: "a streamed object is still open; close it first".into(),
            });
        }
        self.file().map(|_| ())
    }

    fn check_new(&self, o: &ObjectIn<'_>) -> Result<()> {
        let prev = self.objects.last().map(|o| o.name.as_str());
        check_object(o, self.options.canonical, prev, &self.ctx())?;
        if self.names.contains(&o.name) {
            return Err(Error::DuplicateName {
                ctx: self.ctx().tensor(&o.name),
            });
        }
        Ok(())
    }

    /// Add a dense tensor.
    pub fn add(&mut self, name: &str, dtype: DType, shape: &[u64], data: &[u8]) -> Result<()> {
        self.add_object(ObjectIn::dense(name, dtype, shape, data))
    }

    /// Add an object with any parts and layout.
    pub fn add_object(&mut self, mut o: ObjectIn<'_>) -> Result<()> {
        self.check_idle()?;
        sort_parts(&mut o);
        self.check_new(&o)?;
        let mut parts = Vec::with_capacity(o.parts.len());
        for p in &o.parts {
            let level = p.compression.or(self.options.compression);
            if self.options.canonical && level.is_some() {
                return Err(Error::Write {
                    ctx: self.ctx().tensor(&o.name),
                    reason: "canonical form stores raw parts".into(),
                });
            }
            let digest = DigestAlgorithm::Xxh3.digest(&p.data);
            // Encoded parts are shared when their decoded bytes match: the
            // key is the decoded digest and length, confirmed on the
            // encoded bytes.
            let key = (digest_key(&digest), p.data.len() as u64, level.is_some());
            let (offset, length, encoded) = match level {
                None => {
                    let (off, len) = self.put_blob(&p.data, key)?;
                    (off, len, None)
                }
                Some(l) => {
                    let enc = encoding::encode(&p.data, l).map_err(|e| Error::io(&self.dest, e))?;
                    let (off, len) = self.put_blob(&enc, key)?;
                    (off, len, Some(p.data.len() as u64))
                }
            };
            parts.push(PartOut {
                name: p.name.clone(),
                dtype: p.dtype,
                offset,
                length,
                encoded,
                digest,
            });
        }
        self.names.insert(o.name.clone());
        self.objects.push(ObjectOut {
            name: o.name,
            shape: o.shape,
            layout: o.layout,
            attributes: o.attributes,
            parts,
        });
        Ok(())
    }

    /// Whether the file holds exactly `data` at `offset`. The incremental
    /// writer borrows each tensor only for the call that adds it, so an
    /// earlier blob can only be confirmed from the file (its pages were just
    /// written and are in the page cache). This runs only when digest and
    /// length already match, i.e. for real duplicates, and compares window
    /// by window so memory stays bounded whatever the tensor's size.
    fn same_as_written(&self, offset: u64, data: &[u8]) -> Result<bool> {
        const WINDOW: usize = 1 << 20;
        let file = self.file()?;
        let mut buf = vec![0u8; data.len().min(WINDOW)];
        for (i, want) in data.chunks(WINDOW).enumerate() {
            let got = &mut buf[..want.len()];
            file.read_exact_at(got, offset + (i * WINDOW) as u64)
                .map_err(|e| Error::io(&self.dest, e))?;
            if got != want {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether two regions of the file being written hold the same bytes
    /// (a streamed part against an earlier blob), window by window.
    fn same_regions(&self, a: u64, b: u64, len: u64) -> Result<bool> {
        const WINDOW: u64 = 1 << 20;
        let file = self.file()?;
        let mut x = vec![0u8; len.min(WINDOW) as usize];
        let mut y = x.clone();
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(WINDOW) as usize;
            let io = |e| Error::io(&self.dest, e);
            file.read_exact_at(&mut x[..n], a + done).map_err(io)?;
            file.read_exact_at(&mut y[..n], b + done).map_err(io)?;
            if x[..n] != y[..n] {
                return Ok(false);
            }
            done += n as u64;
        }
        Ok(true)
    }

    /// Write a blob's stored bytes (raw, or encoded for `key`'s decoded
    /// digest and length), or share an earlier blob with the same bytes.
    fn put_blob(&mut self, stored: &[u8], key: (u64, u64, bool)) -> Result<(u64, u64)> {
        let len = stored.len() as u64;
        for &(off, their_len) in self.heap.seen.get(&key).into_iter().flatten() {
            if their_len == len && self.same_as_written(off, stored)? {
                return Ok((off, len));
            }
        }
        let offset = self.heap.place(len, self.options.align_for(len));
        self.file()?
            .write_all_at(stored, offset)
            .map_err(|e| Error::io(&self.dest, e))?;
        self.heap.seen.entry(key).or_default().push((offset, len));
        Ok((offset, len))
    }

    /// Declare an object whose raw parts arrive later, a chunk at a time,
    /// in part-name order (`write_chunk`, then `close_stream`). Duplicates
    /// are still shared: a part found identical to an earlier blob is cut
    /// back off the end of the file.
    pub fn stream(
        &mut self,
        name: &str,
        shape: &[u64],
        layout: &str,
        attributes: Option<Cbor>,
        parts: &[(&str, DType, u64)],
    ) -> Result<()> {
        self.check_idle()?;
        if self.options.compression.is_some() {
            return Err(Error::Write {
                ctx: self.ctx().tensor(name),
                reason: "streamed parts are written raw".into(),
            });
        }
        // Validate with zero-filled stand-ins of the declared sizes (no
        // allocation: the check only reads lengths).
        let probe = ObjectIn {
            name: name.to_string(),
            shape: shape.to_vec(),
            layout: layout.to_string(),
            attributes: attributes.clone(),
            parts: Vec::new(),
        };
        let mut sorted: Vec<(String, DType, u64)> = parts
            .iter()
            .map(|&(n, d, l)| (n.to_string(), d, l))
            .collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        self.check_stream_decl(&probe, &sorted)?;
        let mut s = Stream {
            object: ObjectOut {
                name: probe.name,
                shape: probe.shape,
                layout: probe.layout,
                attributes,
                parts: Vec::new(),
            },
            parts: sorted,
            current: 0,
            written: 0,
            hasher: Hasher(Box::new(xxhash_rust::xxh3::Xxh3::new())),
            part_start: (0, 0),
        };
        self.begin_part(&mut s);
        self.stream = Some(s);
        self.settle_empty_parts()
    }

    fn check_stream_decl(
        &self,
        probe: &ObjectIn<'_>,
        parts: &[(String, DType, u64)],
    ) -> Result<()> {
        let def = manifest::ObjectDef {
            name: probe.name.clone(),
            shape: probe.shape.clone(),
            layout: probe.layout.clone().into(),
            attributes: probe.attributes.clone(),
            parts: parts
                .iter()
                .map(|(n, d, l)| {
                    let (storage, logical) = storage_and_type(*d, &self.ctx())?;
                    Ok(manifest::PartDef {
                        name: n.clone().into(),
                        dtype: storage,
                        logical: logical.map(std::borrow::Cow::Borrowed),
                        offset: FLOOR,
                        length: *l,
                        shard: None,
                        encoding: None,
                        decoded_length: None,
                        digest: None,
                    })
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let with_parts = ObjectIn {
            parts: parts
                .iter()
                .map(|(n, d, _)| PartIn {
                    name: n.clone(),
                    dtype: *d,
                    data: std::borrow::Cow::Borrowed(&[]),
                    compression: None,
                })
                .collect(),
            ..probe.clone()
        };
        // Names, order and NFC via check_object's rules; sizes via interpret.
        let prev = self.objects.last().map(|o| o.name.as_str());
        let ctx = self.ctx();
        let octx = ctx.clone().tensor(&probe.name);
        if parts.is_empty() {
            return Err(Error::Write {
                ctx: octx,
                reason: "an object needs at least one part".into(),
            });
        }
        // check_object validates sizes against the (empty) data, so run
        // only its name rules here and the size rules on `def`.
        if self.names.contains(&probe.name) {
            return Err(Error::DuplicateName { ctx: octx });
        }
        let mut named = with_parts.clone();
        named.layout = "zt.structural/0".into(); // unknown layout: names only
        check_object(&named, self.options.canonical, prev, &ctx)?;
        validate::interpret(&def, &octx).map_err(|e| Error::Write {
            ctx: octx.clone(),
            reason: e.to_string(),
        })?;
        Ok(())
    }

    fn begin_part(&mut self, s: &mut Stream) {
        let len = s.parts.get(s.current).map_or(0, |p| p.2);
        s.part_start = (self.heap.cursor, 0);
        let offset = self.heap.place(len, self.options.align_for(len));
        s.part_start.1 = offset;
        s.written = 0;
        s.hasher = Hasher(Box::new(xxhash_rust::xxh3::Xxh3::new()));
    }

    /// Finish every part of the open stream that is complete (zero-length
    /// parts complete immediately).
    fn settle_empty_parts(&mut self) -> Result<()> {
        loop {
            let Some(mut s) = self.stream.take() else {
                return Ok(());
            };
            let done = s.current < s.parts.len() && s.written == s.parts[s.current].2;
            if !done {
                self.stream = Some(s);
                return Ok(());
            }
            self.end_part(&mut s)?;
            s.current += 1;
            if s.current < s.parts.len() {
                self.begin_part(&mut s);
            }
            self.stream = Some(s);
        }
    }

    fn end_part(&mut self, s: &mut Stream) -> Result<()> {
        let (name, dtype, len) = s.parts[s.current].clone();
        let digest = Digest::Xxh3(s.hasher.0.digest());
        let offset = s.part_start.1;
        let key = (digest_key(&digest), len, false);
        let mut placed = (offset, len);
        if let Some(cands) = self.heap.seen.get(&key).cloned() {
            for (off, stored) in cands {
                if stored == len && self.same_regions(off, offset, len)? {
                    // Shared: undo this part's placement and cut its bytes.
                    self.heap.cursor = s.part_start.0;
                    self.file()?
                        .set_len(self.heap.cursor.max(8))
                        .map_err(|e| Error::io(&self.dest, e))?;
                    placed = (off, stored);
                    break;
                }
            }
        }
        if placed.0 == offset {
            self.heap.seen.entry(key).or_default().push(placed);
        }
        s.object.parts.push(PartOut {
            name,
            dtype,
            offset: placed.0,
            length: placed.1,
            encoded: None,
            digest,
        });
        Ok(())
    }

    /// Write the next bytes of the open stream.
    pub fn write_chunk(&mut self, mut chunk: &[u8]) -> Result<()> {
        while !chunk.is_empty() {
            let Some(s) = self.stream.as_mut() else {
                return Err(Error::Write {
                    ctx: self.ctx(),
                    reason: "no streamed object is open".into(),
                });
            };
            let Some(&(_, _, len)) = s.parts.get(s.current) else {
                let name = s.object.name.clone();
                return Err(Error::Write {
                    ctx: self.ctx().tensor(name),
                    reason: "more bytes than the parts declared".into(),
                });
            };
            let take = (len - s.written).min(chunk.len() as u64) as usize;
            let at = s.part_start.1 + s.written;
            s.hasher.0.update(&chunk[..take]);
            s.written += take as u64;
            let file = self.target.as_ref().expect("open while streaming").file();
            file.write_all_at(&chunk[..take], at)
                .map_err(|e| Error::io(&self.dest, e))?;
            chunk = &chunk[take..];
            self.settle_empty_parts()?;
        }
        Ok(())
    }

    /// Bytes written into the open stream's current part, and its name.
    pub fn stream_position(&self) -> Option<(&str, u64)> {
        let s = self.stream.as_ref()?;
        s.parts.get(s.current).map(|p| (p.0.as_str(), s.written))
    }

    /// Close the open stream; every declared byte must have arrived.
    pub fn close_stream(&mut self) -> Result<()> {
        let Some(s) = self.stream.take() else {
            return Err(Error::Write {
                ctx: self.ctx(),
                reason: "no streamed object is open".into(),
            });
        };
        if s.current < s.parts.len() {
            let (name, _, len) = &s.parts[s.current];
            return Err(Error::Write {
                ctx: self.ctx().tensor(&s.object.name),
                reason: format!("part {name:?} got {} of {len} bytes", s.written),
            });
        }
        self.names.insert(s.object.name.clone());
        self.objects.push(s.object);
        Ok(())
    }

    /// Set the file attributes (a text-keyed map).
    pub fn set_attributes(&mut self, attributes: Cbor) -> Result<()> {
        manifest::check_attributes(&attributes, &self.ctx()).map_err(|e| Error::Write {
            ctx: self.ctx(),
            reason: e.to_string(),
        })?;
        self.attributes = Some(attributes);
        Ok(())
    }

    /// Add every tensor of `source` (any readable format), in name order
    /// when canonical.
    pub fn ingest(&mut self, source: &Source) -> Result<()> {
        let mut objects = objects_of(source)?;
        if self.options.canonical {
            objects.sort_by(|a, b| a.name.cmp(&b.name));
        }
        for o in objects {
            self.add_object(o)?;
        }
        Ok(())
    }

    /// Write the manifest and footer; publish if asked. Returns the file size.
    pub fn finish(mut self) -> Result<u64> {
        self.check_idle()?;
        let ctx = self.ctx();
        let mut objs: Vec<(String, Cbor)> = self
            .objects
            .iter()
            .map(|o| Ok((o.name.clone(), object_cbor(o, &ctx)?)))
            .collect::<Result<Vec<_>>>()?;
        let root = match self.prior.take() {
            None => root_cbor(&self.objects, self.attributes.take(), &ctx)?,
            Some(Cbor::Map(mut entries)) => {
                for (k, v) in entries.iter_mut() {
                    if matches!(k, Cbor::Text(t) if t == "objects") {
                        if let Cbor::Map(existing) = v {
                            existing.extend(objs.drain(..).map(|(n, o)| (Cbor::Text(n.into()), o)));
                        }
                    }
                }
                entries.retain(|(k, _)| !matches!(k, Cbor::Text(t) if t == "attributes"));
                if let Some(a) = self.attributes.take() {
                    entries.push((Cbor::Text("attributes".into()), a));
                }
                Cbor::Map(entries)
            }
            Some(other) => other,
        };
        let target = self.target.take().expect("checked idle");
        let total = finish_file(
            target.file(),
            &mut self.heap,
            root,
            &self.options,
            &self.dest,
        )?;
        match target {
            Target::New(partial) => partial.commit(self.options.publish)?,
            Target::Amend(file) => file.sync_data().map_err(|e| Error::io(&self.dest, e))?,
        }
        self.done = true;
        Ok(total)
    }

    /// Give up: remove what was written (an amended file is cut back to
    /// its original length).
    pub fn abandon(mut self) {
        self.discard();
    }

    fn discard(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        // An amended file is cut back to its original length; a new file's
        // partial removes itself (the destination was never touched).
        if let (Some(Target::Amend(file)), Some(len)) = (self.target.take(), self.prior_len) {
            let _ = file.set_len(len);
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.discard();
    }
}
