//! PyTorch distributed checkpoints (`torch.distributed.checkpoint`, "DCP"),
//! read only: a directory of `.metadata` and `__<rank>_<n>.distcp` files.
//!
//! The reader opens `.metadata` (a directory holding one opens as it: the
//! plugin declares `.metadata` as its checkpoint name, which the opener
//! looks for in a directory), runs it on the restricted pickle machine with
//! exactly DCP's globals allowed (`metadata.rs`), and lists each tensor of
//! `state_dict_metadata` by its fully qualified name with its global shape
//! and dtype. Each chunk of a tensor is a whole `torch.save` archive at
//! `[offset, offset + length)` of a `.distcp` file (the default
//! `SerializationFormat.TORCH_SAVE`), read by the PyTorch plugin's own zip
//! reader on that range (`pt::open_embedded`), so its tensor bytes are
//! found exactly as in a `.pt` file. A tensor held in one chunk is that
//! chunk's bytes (zero-copy where they lie raw); a tensor of several chunks
//! is assembled into the global C-order buffer on read (the core's
//! `assemble::Assemble`), after open has checked that its chunks tile the
//! global shape exactly.
//!
//! Non-tensor entries (`BytesStorageMetadata`: a step, a string) are only
//! named, in the `dcp.bytes_entries` attribute: their bytes are pickles and
//! zt unpickles nothing it does not need.
//!
//! `SAFETENSORS`-format checkpoints (`FileSystemWriter(serialization_format=
//! SerializationFormat.SAFETENSORS)`) are read too, which torch's own reader
//! cannot: each `.distcp` ends with a safetensors file holding the file's
//! chunks by name, and `storage_data` gives its start as every chunk's
//! offset; it is read by the safetensors plugin's reader on that range.
//!
//! Chunks stored through torch's zstd extension (`transform_descriptors`
//! `["stream.zstd/1"]`, `FileSystemWriter(_extensions=[ZStandard()])`) are
//! read lazily: each chunk decompressed when its tensor is read, bounded,
//! and its archive read by the same pt reader on an in-memory store
//! (`transform.rs`). Other transforms are refused with `dcp.Unsupported`.

mod metadata;
pub mod rules;
mod transform;
pub mod write;

use std::collections::HashMap;
use std::sync::Arc;

use metadata::{Chunk, Metadata, StorageInfo, TensorMeta};
use zt_core::assemble::{Assemble, Piece};
use zt_core::catalog::{Catalog, Object, Value};
use zt_core::dtype::num_elements;
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::limits::Limits;
use zt_core::store::Store;
use zt_core::Rule;

pub use rules::RULES;
pub use write::DcpWriter;

/// The DCP reader.
pub struct Dcp;

/// The DCP plugin: one reader, one writer (`write.rs`), and `.metadata` as the file a
/// checkpoint directory is opened through.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "dcp",
    // `.metadata` starts with a protocol-4 or -5 pickle naming DCP's metadata
    // module: a prefix of its own, as specific as a magic number, and no
    // other reader's structure overlaps it.
    readers: &[zt_core::Reader {
        format: &Dcp,
        detect_rank: 35,
    }],
    writers: &[&DcpWriter],
    rules: &[("dcp", RULES)],
    // After every single-file checkpoint name: a directory holding both a
    // model file and a `.metadata` opens as the model file.
    checkpoints: &[zt_core::Checkpoint {
        name: ".metadata",
        preference: 35,
    }],
};

/// `SHORT_BINUNICODE` of length 37 and the module every metadata class is
/// in: what torch's `pickle.dump(metadata, file)` writes first, after
/// `PROTO` and a `FRAME` (protocol 4, Python's default until 3.14; 5 after).
const HEAD_GLOBAL: &[u8] = b"\x8c\x25torch.distributed.checkpoint.metadata";

/// How far into the file that module name may start (`PROTO`, `FRAME`).
const HEAD_WINDOW: usize = 64;

impl Format for Dcp {
    fn name(&self) -> &'static str {
        "dcp"
    }

    fn extensions(&self) -> &'static [&'static str] {
        // `.metadata` has no extension (Path sees a hidden file); the
        // `.distcp` files are named so a model directory's copy skips them.
        &["distcp"]
    }

    /// A protocol-4 or -5 pickle whose head names DCP's metadata module.
    fn sniff(&self, p: &Probe<'_>) -> bool {
        let head = &p.head[..p.head.len().min(HEAD_WINDOW + HEAD_GLOBAL.len())];
        (head.starts_with(b"\x80\x04") || head.starts_with(b"\x80\x05"))
            && head.windows(HEAD_GLOBAL.len()).any(|w| w == HEAD_GLOBAL)
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let store = input.store;
        let ctx = input.ctx();
        let limits = input.limits;
        // One pickle, bounded as a PyTorch checkpoint's `data.pkl` is.
        Limits::check(&ctx, "pickle_bytes", store.len(), limits.pickle_bytes)
            .map_err(|e| e.with_rule(rules::LIMIT))?;
        let bytes = store.read(0, store.len())?;
        let meta = metadata::parse(&bytes, &ctx, limits)?;
        build(input, &meta)
    }
}

/// The `.distcp` files opened so far, by `relative_path`, and the
/// safetensors blocks read in them, by file and offset.
struct Files<'a, 'i> {
    input: &'a OpenInput<'i>,
    open: HashMap<String, Arc<Store>>,
    blocks: HashMap<(String, u64), Arc<Block>>,
}

/// A safetensors block's tensors, by name.
struct Block {
    catalog: Catalog,
    by_name: HashMap<String, usize>,
}

impl Files<'_, '_> {
    /// The safetensors block at `offset` of `store` (a `SAFETENSORS`-format
    /// `.distcp` ends with one holding all the file's chunks), read once,
    /// by the safetensors plugin's own reader.
    fn block(&mut self, store: &Arc<Store>, path: &str, offset: u64) -> Result<Arc<Block>> {
        let key = (path.to_owned(), offset);
        if let Some(b) = self.blocks.get(&key) {
            return Ok(Arc::clone(b));
        }
        let catalog = crate::safetensors::open_in(store, self.input.limits, offset)?;
        let by_name = catalog
            .objects
            .iter()
            .enumerate()
            .map(|(i, o)| (o.name.clone(), i))
            .collect();
        let block = Arc::new(Block { catalog, by_name });
        self.blocks.insert(key, Arc::clone(&block));
        Ok(block)
    }

    /// The file `relative_path` names, opened once, confined to the
    /// checkpoint's directory.
    fn get(&mut self, path: &str) -> Result<Arc<Store>> {
        if let Some(s) = self.open.get(path) {
            return Ok(Arc::clone(s));
        }
        let ctx = self.input.ctx();
        let store = self
            .input
            .open_related(path, "chunk file")
            .map_err(|e| match e {
                // The core's confinement rule, refined: this is where a
                // DCP `relative_path` is refused.
                e if e.rule() == Some(Rule::LOCATION) => e.with_rule(rules::PATH),
                Error::NotFound { .. } => missing(&ctx, path),
                Error::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    missing(&ctx, path)
                }
                e => e,
            })?;
        self.open.insert(path.to_owned(), Arc::clone(&store));
        Ok(store)
    }
}

fn missing(ctx: &Context, path: &str) -> Error {
    Error::header(
        ctx.clone(),
        rules::FILE,
        format!("chunk file {path:?} named in storage_data is missing"),
    )
}

/// The catalog: one dense object per tensor entry.
fn build(input: &OpenInput<'_>, meta: &Metadata) -> Result<Catalog> {
    let mut files = Files {
        input,
        open: HashMap::new(),
        blocks: HashMap::new(),
    };
    let mut objects = Vec::with_capacity(meta.tensors.len());
    for batch in meta.tensors.chunks(PREFETCH_TENSORS) {
        prefetch_structures(&mut files, meta, batch);
        for t in batch {
            objects.push(tensor(&mut files, meta, t).map_err(|e| e.in_tensor(&t.fqn))?);
        }
    }
    let mut attributes = vec![(
        "dcp.bytes_entries".to_string(),
        Value::List(meta.bytes_entries.iter().cloned().map(Value::Str).collect()),
    )];
    if let Some(v) = &meta.version {
        attributes.push(("dcp.version".into(), Value::Str(v.clone())));
    }
    attributes.push((
        "dcp.globals".into(),
        Value::List(meta.globals.iter().cloned().map(Value::Str).collect()),
    ));
    let mut extra: Vec<(String, Arc<Store>)> = files.open.into_iter().collect();
    extra.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Catalog {
        objects,
        attributes,
        extra_stores: extra.into_iter().map(|(_, s)| s).collect(),
        ..Catalog::default()
    })
}

/// Tensors whose chunks' archive structures are fetched together.
const PREFETCH_TENSORS: usize = 128;
/// Bytes at each end of a chunk that a walk of its `torch.save` archive
/// reads: the first member's header and `data.pkl`, then the data
/// record's header, at the start; the last members, the central directory
/// and the end records at the end.
const STRUCTURE_BYTES: u64 = 8 << 10;

/// Over object storage, bring the ends of every chunk of `tensors` into
/// their files' caches, one planned batch of concurrent requests per file:
/// each chunk is a `torch.save` archive whose walk makes a few small reads
/// at its start and end, and made one after another they cost a request
/// each (several per chunk, thousands for a model). Advice only: a file
/// that cannot be opened or read here fails where the chunk is read, with
/// that chunk's error.
fn prefetch_structures(files: &mut Files, meta: &Metadata, tensors: &[TensorMeta]) {
    let mut ranges: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    for t in tensors {
        for chunk in &t.chunks {
            let key = (t.fqn.clone(), Some(chunk.offsets.clone()));
            let Some(info) = meta.storage.get(&key) else {
                continue;
            };
            let Some(end) = info.offset.checked_add(info.length) else {
                continue;
            };
            let ends = ranges.entry(info.relative_path.as_str()).or_default();
            let n = STRUCTURE_BYTES.min(info.length);
            ends.push((info.offset, n));
            ends.push((end - n, n));
        }
    }
    for (path, mut ends) in ranges {
        let Ok(store) = files.get(path) else {
            continue;
        };
        if store.is_remote() {
            ends.sort_unstable();
            let _ = store.prefetch_ranges(&ends);
        }
    }
}

/// One tensor: its chunks checked against its global shape and each other,
/// each located in its file and read (a `torch.save` archive, or an entry
/// of the file's safetensors block).
fn tensor(files: &mut Files, meta: &Metadata, t: &TensorMeta) -> Result<Object> {
    let ctx = files.input.ctx().tensor(&t.fqn);
    let limits = files.input.limits;
    limits
        .check_rank(&ctx, t.size.len())
        .map_err(|e| e.with_rule(rules::LIMIT))?;
    let elem = t.dtype.size().ok_or_else(|| Error::UnsupportedDType {
        rule: rules::UNSUPPORTED,
        ctx: ctx.clone(),
        dtype: t.dtype.name().into(),
    })?;
    // A global size past u64 is past every limit.
    let overflow = |what| Error::Overflow {
        rule: rules::LIMIT,
        ctx: ctx.clone(),
        what,
    };
    let numel = num_elements(&t.size).ok_or_else(|| overflow("element count"))?;
    let nbytes = numel
        .checked_mul(elem)
        .ok_or_else(|| overflow("tensor bytes"))?;
    check_tiling(&ctx, t, numel, limits)?;

    let mut pieces = Vec::new();
    for chunk in &t.chunks {
        // A chunk with no elements holds nothing to read (torch writes them
        // for empty shards, offset at the dimension's end).
        if chunk.sizes.contains(&0) {
            continue;
        }
        let key = (t.fqn.clone(), Some(chunk.offsets.clone()));
        let info = meta.storage.get(&key).ok_or_else(|| {
            Error::header(
                ctx.clone(),
                rules::STORAGE,
                format!("no storage_data entry for the chunk at {:?}", chunk.offsets),
            )
        })?;
        pieces.push(piece(files, &ctx, t, chunk, info)?);
    }

    let mut object = match pieces.as_slice() {
        // One chunk holding the whole tensor: its own bytes, zero-copy
        // where they lie raw.
        [one] if one.sizes == t.size => {
            let mut o = Object::dense(&t.fqn, t.dtype, t.size.clone(), one.payload.clone());
            o.parts[0].strides = one.strides.clone();
            o
        }
        _ => {
            limits
                .check_decoded(&ctx, nbytes)
                .map_err(|e| e.with_rule(rules::LIMIT))?;
            Object::dense(
                &t.fqn,
                t.dtype,
                t.size.clone(),
                Assemble {
                    ctx: ctx.clone(),
                    size: t.size.clone(),
                    elem,
                    pieces,
                    rule: rules::CHUNK,
                    describe: "dcp chunks",
                }
                .payload(nbytes),
            )
        }
    };
    object
        .attributes
        .push(("dcp.chunks".into(), Value::UInt(t.chunks.len() as u64)));
    Ok(object)
}

/// Each chunk inside the global shape (rank, bounds), then the chunks
/// tiling it exactly: no two share an element and together they hold every
/// element.
///
/// The chunks' edges cut each dimension into intervals, and the tensor into
/// the grid of their products; every chunk is a box of whole cells, so the
/// chunks tile the tensor exactly when each cell is covered once. DCP's
/// chunks (one per shard of a DTensor's placements) are such a grid
/// already, so there are as many cells as chunks; a layout whose grid
/// exceeds `Limits::entries` cells is refused (`dcp.Limit`) rather than
/// checked pair by pair, which hostile layouts make quadratic.
fn check_tiling(ctx: &Context, t: &TensorMeta, numel: u64, limits: &Limits) -> Result<()> {
    let shape_err = |why: String| Error::header(ctx.clone(), rules::CHUNK_SHAPE, why);
    let rank = t.size.len();
    let mut boxes: Vec<&Chunk> = Vec::new();
    for c in &t.chunks {
        if c.offsets.len() != rank || c.sizes.len() != rank {
            return Err(shape_err(format!(
                "a chunk of rank {}/{} in a tensor of rank {rank}",
                c.offsets.len(),
                c.sizes.len(),
            )));
        }
        for (d, ((&o, &s), &n)) in c.offsets.iter().zip(&c.sizes).zip(&t.size).enumerate() {
            if o.checked_add(s).is_none_or(|end| end > n) {
                return Err(shape_err(format!(
                    "the chunk at {:?} of sizes {:?} reaches past dimension {d} of {:?}",
                    c.offsets, c.sizes, t.size
                )));
            }
        }
        // Chunks with no elements (torch writes them for empty shards) cover
        // nothing.
        if !c.sizes.contains(&0) {
            boxes.push(c);
        }
    }
    let overlap = |c: &Chunk| {
        Error::header(
            ctx.clone(),
            rules::CHUNKS,
            format!(
                "the chunk at {:?} of sizes {:?} overlaps another",
                c.offsets, c.sizes
            ),
        )
    };
    let missing = |covered: u64| {
        Error::header(
            ctx.clone(),
            rules::CHUNKS,
            format!(
                "the chunks cover {covered} of the tensor's {numel} elements (some are missing)"
            ),
        )
    };
    if numel == 0 {
        // In bounds, no chunk of an empty tensor holds an element.
        return Ok(());
    }
    // The edges along each dimension, sorted.
    let cuts: Vec<Vec<u64>> = (0..rank)
        .map(|d| {
            let mut v: Vec<u64> = boxes
                .iter()
                .flat_map(|c| [c.offsets[d], c.offsets[d] + c.sizes[d]])
                .chain([0, t.size[d]])
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let cells = cuts
        .iter()
        .try_fold(1u64, |n, c| n.checked_mul(c.len() as u64 - 1))
        .unwrap_or(u64::MAX);
    Limits::check(ctx, "entries", cells, limits.entries).map_err(|e| e.with_rule(rules::LIMIT))?;
    let mut seen = vec![0u64; cells.div_ceil(64) as usize];
    let mut covered = 0u64;
    // Row-major strides of the grid.
    let mut stride = vec![1u64; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        stride[d] = stride[d + 1] * (cuts[d + 1].len() as u64 - 1);
    }
    for c in &boxes {
        // The chunk's cells: [lo, hi) along each dimension (its edges are
        // among the cuts, so the searches hit).
        let span: Vec<(u64, u64)> = (0..rank)
            .map(|d| {
                let at = |x: u64| cuts[d].binary_search(&x).unwrap_or(0) as u64;
                (at(c.offsets[d]), at(c.offsets[d] + c.sizes[d]))
            })
            .collect();
        let mut index: Vec<u64> = span.iter().map(|s| s.0).collect();
        'cells: loop {
            let cell: u64 = index.iter().zip(&stride).map(|(i, s)| i * s).sum();
            let (word, bit) = ((cell / 64) as usize, cell % 64);
            if seen[word] & (1 << bit) != 0 {
                return Err(overlap(c));
            }
            seen[word] |= 1 << bit;
            covered += 1;
            // Odometer over the chunk's cells (a scalar has one).
            let mut d = rank;
            loop {
                if d == 0 {
                    break 'cells;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < span[d].1 {
                    break;
                }
                index[d] = span[d].0;
            }
        }
    }
    if covered != cells {
        let elements: u64 = boxes
            .iter()
            .map(|c| num_elements(&c.sizes).unwrap_or(0))
            .fold(0, u64::saturating_add);
        return Err(missing(elements));
    }
    Ok(())
}

/// Locate one chunk's bytes and read its one tensor.
fn piece(
    files: &mut Files,
    ctx: &Context,
    t: &TensorMeta,
    chunk: &Chunk,
    info: &StorageInfo,
) -> Result<Piece> {
    let zstd = transform::is_zstd(ctx, &info.transforms)?;
    let store = files.get(&info.relative_path)?;
    if info
        .offset
        .checked_add(info.length)
        .is_none_or(|end| end > store.len())
    {
        return Err(Error::range(
            ctx.clone().at(info.offset),
            rules::CHUNK_RANGE,
            format!(
                "chunk at {:?}: bytes [{}, +{}) lie past the end of {:?} ({} bytes)",
                chunk.offsets,
                info.offset,
                info.length,
                info.relative_path,
                store.len()
            ),
        ));
    }
    if zstd {
        let elem = t.dtype.size().unwrap_or(1);
        return transform::ZstdChunk::open(
            ctx,
            store,
            info,
            chunk,
            t.dtype,
            elem,
            files.input.limits,
        );
    }
    let at = ctx.clone().at(info.offset);
    let wrong = |why: String| wrong(&at, &chunk.offsets, &info.relative_path, why);
    // `TORCH_SAVE` (the default) puts a `torch.save` archive here;
    // `SAFETENSORS` puts nothing here of the chunk's own: `offset` is where
    // the file's safetensors block starts and `length` the chunk's bytes.
    let head = store.read_upto(info.offset, 4.min(info.length))?;
    let (dtype, shape, strides, payload) = if head.as_ref() == b"PK\x03\x04" {
        let catalog =
            crate::pt::open_embedded(&store, files.input.limits, info.offset, info.length)?;
        let [object] = catalog.objects.as_slice() else {
            return Err(wrong(format!(
                "its archive holds {} tensors, not one",
                catalog.objects.len()
            )));
        };
        let [part] = object.parts.as_slice() else {
            return Err(wrong("its tensor is not dense".into()));
        };
        let part = part.clone();
        (part.dtype, part.shape, part.strides, part.payload)
    } else {
        let block = files.block(&store, &info.relative_path, info.offset)?;
        let Some(&i) = block.by_name.get(&t.fqn) else {
            return Err(wrong(
                "its safetensors block has no entry of this name".into(),
            ));
        };
        let part = block.catalog.objects[i].parts[0].clone();
        if part.payload.len() != info.length {
            return Err(wrong(format!(
                "its safetensors entry holds {} bytes, storage_data says {}",
                part.payload.len(),
                info.length
            )));
        }
        (part.dtype, part.shape, part.strides, part.payload)
    };
    check_chunk_tensor(
        &at,
        &chunk.offsets,
        &info.relative_path,
        (dtype, &shape),
        (t.dtype, &chunk.sizes),
    )?;
    Ok(Piece {
        offsets: chunk.offsets.clone(),
        sizes: chunk.sizes.clone(),
        strides,
        payload,
    })
}

/// A chunk whose bytes are not what `.metadata` declares (`ctx` at the
/// chunk's offset in its file).
fn wrong(ctx: &Context, offsets: &[u64], path: &str, why: String) -> Error {
    Error::header(
        ctx.clone(),
        rules::CHUNK,
        format!("chunk at {offsets:?} in {path:?}: {why}"),
    )
}

/// The one tensor a chunk's bytes hold, `(dtype, shape)`, against what
/// `.metadata` declares for the chunk.
fn check_chunk_tensor(
    ctx: &Context,
    offsets: &[u64],
    path: &str,
    (dtype, shape): (zt_core::dtype::DType, &[u64]),
    (want, sizes): (zt_core::dtype::DType, &[u64]),
) -> Result<()> {
    if dtype != want {
        return Err(wrong(
            ctx,
            offsets,
            path,
            format!(
                "its tensor is {}, the metadata says {}",
                dtype.name(),
                want.name()
            ),
        ));
    }
    if shape != sizes {
        return Err(wrong(
            ctx,
            offsets,
            path,
            format!("its tensor has shape {shape:?}, the metadata says {sizes:?}"),
        ));
    }
    Ok(())
}
