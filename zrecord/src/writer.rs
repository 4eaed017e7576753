//! Building a store: `create` beside the destination, parallel `append`,
//! atomic publish on `close`.
//!
//! The build lives in a hidden sibling directory `.NAME.zrbuild` whose
//! `meta.zr` carries the writer's exclusive lock for its whole life.
//! `close` writes the header page, truncates every file to its committed
//! length and renames the directory onto the destination, so a reader (zt or
//! loaderx) sees either no store or a complete one. Dropping an unclosed
//! writer removes the build, and a killed writer leaves only the hidden
//! sibling, which the next `create` of that destination clears.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rayon::prelude::*;

use crate::codec::{Codec, Encoder};
use crate::error::{Error, Result};
use crate::fsio::{try_lock, write_all_vectored_at};
use crate::layout::{loc_table_end, Header, RecordLoc, LOC, MAX_RECORD, MAX_SHARDS, PAGE};
use crate::schema::{Geometry, Layout, Schema};
use crate::workers;

/// Most records encoded and written per window (one RecordLoc write each).
const WINDOW_RECORDS: usize = 32768;
/// Most logical bytes per window: bounds the encoded bytes held at once.
const WINDOW_BYTES: u64 = 64 << 20;
/// Raw records at least this large (on average in a chunk) are written
/// with one iovec each instead of being packed into a chunk buffer: for
/// rows of a few KiB the kernel's gather beats the copy, while for
/// records of a few hundred bytes (ragged tokens with their shape prefix)
/// packing wins (`python -m harness --only zrecord` measures both).
const SCATTER_MIN_RECORD: u64 = 1 << 10;
/// A shard-local chunk closes at this many logical bytes.
const CHUNK_BYTES: u64 = 1 << 20;

/// How a store is created.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// The codec of every record.
    pub codec: Codec,
    /// Number of data shards, 1..=255.
    pub data_shards: usize,
    /// The zstd dictionary (required by, and only allowed with, `ZstdDict`).
    pub dict: Option<Vec<u8>>,
    /// zstd level; `None` is the codec's default (3 for both codecs).
    pub level: Option<i32>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            codec: Codec::Raw,
            data_shards: 4,
            dict: None,
            level: None,
        }
    }
}

/// The hidden sibling a store at `dest` is built in.
pub fn build_dir(dest: &Path) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.zrbuild"))
}

/// An append-only store under construction.
pub struct Writer {
    dest: PathBuf,
    build: PathBuf,
    meta: File,
    shards: Vec<File>,
    tails: Vec<u64>,
    length: u64,
    encoder: Encoder,
    schema: Schema,
    schema_bytes: Vec<u8>,
    published: bool,
    /// Chunk buffers kept between windows: fresh allocations of this size
    /// are page-faulted in on every append, which costs as much as the copy.
    pool: Mutex<Vec<Vec<u8>>>,
}

/// Most chunk buffers the pool keeps, and the largest it keeps.
const POOL_BUFFERS: usize = 64;
const POOL_BUFFER_BYTES: usize = 4 << 20;

/// A batch of records as the writer sees it: Dense rows of one source
/// buffer, or Ragged payloads each with its shape prefix.
enum Batch<'a> {
    Dense {
        src: &'a [u8],
        row: usize,
    },
    Ragged {
        payloads: &'a [&'a [u8]],
        prefixes: &'a [u8],
        prefix: usize,
    },
}

impl Batch<'_> {
    fn len(&self) -> usize {
        match self {
            Batch::Dense { src, row } => src.len() / row,
            Batch::Ragged { payloads, .. } => payloads.len(),
        }
    }

    /// The record's bytes, as prefix and payload.
    fn parts(&self, i: usize) -> [&[u8]; 2] {
        match self {
            Batch::Dense { src, row } => [&[], &src[i * row..(i + 1) * row]],
            Batch::Ragged {
                payloads,
                prefixes,
                prefix,
            } => [&prefixes[i * prefix..(i + 1) * prefix], payloads[i]],
        }
    }

    fn logic(&self, i: usize) -> u64 {
        let [a, b] = self.parts(i);
        (a.len() + b.len()) as u64
    }
}

/// Records of one shard encoded (or, for raw, referenced) together.
struct Chunk {
    shard: usize,
    positions: Vec<usize>,
    /// The encoded frames end to end; `None` for raw records written from
    /// the caller's buffers.
    data: Option<Vec<u8>>,
    phys: Vec<u32>,
    base: u64,
}

/// Take a chunk out of its slot (each slot is taken once).
fn take(slot: &Mutex<Option<Chunk>>) -> Option<Chunk> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).take()
}

/// The window's chunks in the order they are handed out: by rank within
/// their shard, then by shard. Records are striped over the shards, so this
/// is the order of the records they hold, and each shard's chunks come in
/// their own order, which is the order they are placed and written in.
fn logical_order(chunks: &[Chunk], shards: usize) -> Vec<usize> {
    let mut rank = vec![0usize; shards];
    let mut keyed: Vec<(usize, usize, usize)> = chunks
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let r = rank[c.shard];
            rank[c.shard] += 1;
            (r, c.shard, k)
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, _, k)| k).collect()
}

fn refuse_existing(dest: &Path) -> Result<()> {
    match fs::symlink_metadata(dest) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(dest, e)),
        Ok(m) if !m.is_dir() => Err(Error::AlreadyExists { path: dest.into() }),
        Ok(_) => {
            let meta = dest.join("meta.zr");
            if let Ok(file) = File::open(&meta) {
                // loaderx: a store another handle holds is busy, else it exists.
                let free = try_lock(&file, true).map_err(|e| Error::io(&meta, e))?;
                return Err(if free {
                    Error::AlreadyExists { path: dest.into() }
                } else {
                    Error::Busy { path: dest.into() }
                });
            }
            let mut entries = fs::read_dir(dest).map_err(|e| Error::io(dest, e))?;
            match entries.next() {
                None => Ok(()),
                Some(_) => Err(Error::AlreadyExists { path: dest.into() }),
            }
        }
    }
}

/// Create the build directory, clearing a stale one a killed writer left.
fn claim_build_dir(dest: &Path, build: &Path) -> Result<(File, PathBuf)> {
    let meta_path = build.join("meta.zr");
    for _ in 0..2 {
        match fs::create_dir(build) {
            Ok(()) => {
                let meta = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&meta_path)
                    .map_err(|e| Error::io(&meta_path, e))?;
                if !try_lock(&meta, true).map_err(|e| Error::io(&meta_path, e))? {
                    return Err(Error::Busy { path: dest.into() });
                }
                return Ok((meta, meta_path));
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                if let Ok(file) = File::open(&meta_path) {
                    if !try_lock(&file, true).map_err(|e| Error::io(&meta_path, e))? {
                        return Err(Error::Busy { path: dest.into() });
                    }
                }
                // Nobody holds it: a writer died here. Clear and retry.
                fs::remove_dir_all(build).map_err(|e| Error::io(build, e))?;
            }
            Err(e) => return Err(Error::io(build, e)),
        }
    }
    Err(Error::Busy { path: dest.into() })
}

impl Writer {
    /// Start a new store at `dest` (which must not exist, or be an empty
    /// directory). Missing parent directories are created.
    pub fn create(
        dest: impl AsRef<Path>,
        schema: &Schema,
        options: &CreateOptions,
    ) -> Result<Writer> {
        let dest = dest.as_ref().to_path_buf();
        if options.data_shards == 0 || options.data_shards > MAX_SHARDS {
            return Err(Error::invalid(format!(
                "data_shards must be between 1 and {MAX_SHARDS}"
            )));
        }
        let encoder = Encoder::new(options.codec, options.dict.as_deref(), options.level)?;
        refuse_existing(&dest)?;
        if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        let build = build_dir(&dest);
        let (meta, _) = claim_build_dir(&dest, &build)?;
        let mut writer = Writer {
            dest,
            build,
            meta,
            shards: Vec::new(),
            tails: vec![0; options.data_shards],
            length: 0,
            encoder,
            schema: schema.clone(),
            schema_bytes: schema.encode(),
            published: false,
            pool: Mutex::new(Vec::new()),
        };
        // From here on, Drop removes the build if anything fails.
        writer.populate(options)?;
        Ok(writer)
    }

    fn populate(&mut self, options: &CreateOptions) -> Result<()> {
        for s in 0..options.data_shards {
            let path = self.build.join(format!("data_{s}.zr"));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            self.shards.push(file);
        }
        if let Some(dict) = &options.dict {
            let path = self.build.join("dict.zr");
            fs::write(&path, dict).map_err(|e| Error::io(&path, e))?;
        }
        self.write_page()
    }

    fn write_page(&self) -> Result<()> {
        let page = Header {
            length: self.length,
            data_shards: self.tails.len() as u8,
            codec: self.encoder.codec(),
            tails: self.tails.clone(),
            schema: self.schema_bytes.clone(),
        }
        .encode();
        let path = self.build.join("meta.zr");
        self.meta
            .write_all_at(&page, 0)
            .map_err(|e| Error::io(path, e))
    }

    /// Records appended so far.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// True before the first append.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The schema the store is built with.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The destination path.
    pub fn path(&self) -> &Path {
        &self.dest
    }

    /// Append Dense rows: `src` holds whole rows of the schema's width.
    /// Returns the first new record's index.
    pub fn append_dense(&mut self, src: &[u8]) -> Result<u64> {
        let row = match self.schema.geometry {
            Geometry::Dense { .. } => self.schema.row_bytes().unwrap_or(0) as usize,
            Geometry::Ragged { .. } => {
                return Err(Error::invalid("append_dense on a ragged store"))
            }
        };
        if row == 0 || !src.len().is_multiple_of(row) {
            return Err(Error::invalid(format!(
                "{} bytes are not whole {row}-byte rows",
                src.len()
            )));
        }
        self.append(&Batch::Dense { src, row })
    }

    /// Append Ragged records: `payloads[i]` holds record i's elements in C
    /// order and `shapes[i*ndim..(i+1)*ndim]` its dimensions.
    pub fn append_ragged(&mut self, payloads: &[&[u8]], shapes: &[u64]) -> Result<u64> {
        let ndim = match self.schema.geometry {
            Geometry::Ragged { ndim } => ndim,
            Geometry::Dense { .. } => return Err(Error::invalid("append_ragged on a dense store")),
        };
        if Some(shapes.len()) != payloads.len().checked_mul(ndim) {
            return Err(Error::invalid(
                "shapes must hold ndim dimensions per record",
            ));
        }
        for (i, payload) in payloads.iter().enumerate() {
            // The layout stores only non-empty records (loaderx refuses them).
            if payload.is_empty() {
                return Err(Error::RecordSize { index: i, len: 0 });
            }
            let elements = shapes[i * ndim..(i + 1) * ndim]
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d));
            let expect = elements.and_then(|e| e.checked_mul(self.schema.itemsize as u64));
            if expect != Some(payload.len() as u64) {
                return Err(Error::invalid(format!(
                    "record {i}: shape does not match its bytes"
                )));
            }
        }
        // A record past the 2^31-byte limit is refused by `append` before
        // anything is written; within it, each dimension is at most the
        // record's byte count (every other one is at least 1, as the payload
        // is not empty), so it fits the u32 of a loaderx 2.8 prefix.
        let prefixes: Vec<u8> = match self.schema.layout {
            Layout::Loaderx28 => shapes
                .iter()
                .flat_map(|&d| (d as u32).to_le_bytes())
                .collect(),
            Layout::Loaderx23 => shapes.iter().flat_map(|d| d.to_le_bytes()).collect(),
        };
        self.append(&Batch::Ragged {
            payloads,
            prefixes: &prefixes,
            prefix: self.schema.shape_prefix_bytes(),
        })
    }

    fn append(&mut self, batch: &Batch<'_>) -> Result<u64> {
        let n = batch.len();
        if n == 0 {
            return Err(Error::invalid("append needs at least one record"));
        }
        // Validate the whole batch before writing anything.
        for i in 0..n {
            let len = batch.logic(i);
            if len == 0 || len > MAX_RECORD {
                return Err(Error::RecordSize { index: i, len });
            }
        }
        let first = self.length;
        let full = || Error::Full {
            path: self.dest.clone(),
        };
        let new_len = first.checked_add(n as u64).ok_or_else(full)?;
        loc_table_end(new_len).ok_or_else(full)?;
        // Tails advance only when every window has landed; bytes past the
        // committed tails are truncated away at close.
        let mut tails = self.tails.clone();
        let mut start = 0;
        while start < n {
            let mut end = start;
            let mut bytes = 0u64;
            while end < n
                && end - start < WINDOW_RECORDS
                && (end == start || bytes + batch.logic(end) <= WINDOW_BYTES)
            {
                bytes += batch.logic(end);
                end += 1;
            }
            self.write_window(batch, start..end, first, &mut tails)?;
            start = end;
        }
        self.tails = tails;
        self.length = new_len;
        Ok(first)
    }

    /// Plan shard-local chunks for positions `range` of the batch.
    fn plan(&self, batch: &Batch<'_>, range: std::ops::Range<usize>, first: u64) -> Vec<Chunk> {
        let s = self.tails.len();
        let mut chunks = Vec::new();
        for shard in 0..s {
            let lead = (first + range.start as u64) % s as u64;
            let mut p = range.start + (shard + s - lead as usize) % s;
            let mut chunk = Chunk {
                shard,
                positions: Vec::new(),
                data: None,
                phys: Vec::new(),
                base: 0,
            };
            let mut bytes = 0;
            while p < range.end {
                chunk.positions.push(p);
                bytes += batch.logic(p);
                if bytes >= CHUNK_BYTES {
                    chunks.push(std::mem::replace(
                        &mut chunk,
                        Chunk {
                            shard,
                            positions: Vec::new(),
                            data: None,
                            phys: Vec::new(),
                            base: 0,
                        },
                    ));
                    bytes = 0;
                }
                p += s;
            }
            if !chunk.positions.is_empty() {
                chunks.push(chunk);
            }
        }
        chunks
    }

    fn encode_chunk(&self, batch: &Batch<'_>, chunk: &mut Chunk) -> Result<()> {
        if self.encoder.codec() == Codec::Raw {
            chunk.phys = chunk
                .positions
                .iter()
                .map(|&p| batch.logic(p) as u32)
                .collect();
            let bytes: u64 = chunk.phys.iter().map(|&p| u64::from(p)).sum();
            // Large records go to the kernel straight from the caller's
            // buffers; small ones are packed first, since one iovec per
            // small record costs more than the copy.
            if bytes / chunk.positions.len() as u64 >= SCATTER_MIN_RECORD {
                return Ok(());
            }
            let mut out = self.take_buffer();
            out.reserve(bytes as usize);
            for &p in &chunk.positions {
                for part in batch.parts(p) {
                    out.extend_from_slice(part);
                }
            }
            chunk.data = Some(out);
            return Ok(());
        }
        let mut out = self.take_buffer();
        let mut scratch = Vec::new();
        for &p in &chunk.positions {
            let parts = batch.parts(p);
            let parts: &[&[u8]] = if parts[0].is_empty() {
                &parts[1..]
            } else {
                &parts
            };
            let n = self.encoder.encode(parts, &mut scratch, &mut out)?;
            let n = u32::try_from(n).map_err(|_| Error::RecordSize {
                index: p,
                len: n as u64,
            })?;
            chunk.phys.push(n);
        }
        chunk.data = Some(out);
        Ok(())
    }

    fn take_buffer(&self) -> Vec<u8> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        pool.pop().unwrap_or_default()
    }

    fn give_buffer(&self, mut buf: Vec<u8>) {
        if buf.capacity() <= POOL_BUFFER_BYTES {
            buf.clear();
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < POOL_BUFFERS {
                pool.push(buf);
            }
        }
    }

    fn write_chunk(&self, batch: &Batch<'_>, chunk: &Chunk) -> Result<()> {
        let file = &self.shards[chunk.shard];
        let io = |e| Error::io(self.build.join(format!("data_{}.zr", chunk.shard)), e);
        match &chunk.data {
            Some(data) => file.write_all_at(data, chunk.base).map_err(io),
            None => {
                let bufs: Vec<&[u8]> = chunk
                    .positions
                    .iter()
                    .flat_map(|&p| batch.parts(p))
                    .filter(|b| !b.is_empty())
                    .collect();
                write_all_vectored_at(file, &bufs, chunk.base).map_err(io)
            }
        }
    }

    fn write_window(
        &self,
        batch: &Batch<'_>,
        range: std::ops::Range<usize>,
        first: u64,
        tails: &mut [u64],
    ) -> Result<()> {
        let mut chunks = self.plan(batch, range.clone(), first);
        let mut locs = vec![0u8; range.len() * LOC];
        if self.encoder.codec() == Codec::Raw {
            // Raw sizes are known up front: offsets are planned first and
            // each chunk is packed and written in the same parallel pass.
            for c in &mut chunks {
                c.phys = c.positions.iter().map(|&p| batch.logic(p) as u32).collect();
                self.place(batch, c, range.start, &mut locs, tails)?;
            }
            // Raw chunks are copies into the page cache, not CPU work, and
            // the parallel iterator's halves of the window write disjoint
            // shards. Pulled one by one by the pool and the caller
            // (`workers::run`, shard after shard), raw writes waited: wall
            // time far above CPU time, likely on one shard's inode lock.
            chunks.par_iter_mut().try_for_each(|c| {
                self.encode_chunk(batch, c)?;
                let written = self.write_chunk(batch, c);
                if let Some(buf) = c.data.take() {
                    self.give_buffer(buf);
                }
                written
            })?;
        } else {
            self.write_encoded(batch, range.start, chunks, &mut locs, tails)?;
        }
        let at = PAGE as u64 + (first + range.start as u64) * LOC as u64;
        self.meta
            .write_all_at(&locs, at)
            .map_err(|e| Error::io(self.build.join("meta.zr"), e))
    }

    /// Give `chunk` the shard offset `tails[shard]`, write its records'
    /// RecordLocs into `locs` (the window's, which starts at batch position
    /// `start`) and advance the shard's tail past it.
    fn place(
        &self,
        batch: &Batch<'_>,
        chunk: &mut Chunk,
        start: usize,
        locs: &mut [u8],
        tails: &mut [u64],
    ) -> Result<()> {
        chunk.base = tails[chunk.shard];
        let mut offset = chunk.base;
        for (&p, &phys) in chunk.positions.iter().zip(&chunk.phys) {
            let loc = RecordLoc {
                offset,
                phys,
                logic: batch.logic(p) as u32,
            };
            let at = (p - start) * LOC;
            loc.encode_into(&mut locs[at..at + LOC]);
            offset = offset
                .checked_add(u64::from(phys))
                .ok_or_else(|| Error::Full {
                    path: self.dest.clone(),
                })?;
        }
        tails[chunk.shard] = offset;
        Ok(())
    }

    /// Encode the window's chunks in parallel and write each one as soon as
    /// its offset is known, that is once every earlier chunk of its shard
    /// is encoded. Holding the whole window's frames until all were encoded
    /// kept tens of MiB of output alive per window: fresh pages for every
    /// window of a new store, and frames gone from the CPU caches before
    /// the kernel copied them. Written this way, a chunk's buffer goes back
    /// to the pool for the next chunk while its frames are still cached.
    /// Offsets still follow logical order within each shard, so the store's
    /// bytes do not depend on thread timing (loaderx's can: two of its
    /// builds of one large batch ordered a shard's frames differently; zt's
    /// order is the one a single-threaded build gives). Chunks are handed out in
    /// that order (`logical_order`) to the pool and the calling thread
    /// (`workers::run`), so the chunk a shard waits for is the next started.
    fn write_encoded(
        &self,
        batch: &Batch<'_>,
        start: usize,
        chunks: Vec<Chunk>,
        locs: &mut [u8],
        tails: &mut [u64],
    ) -> Result<()> {
        // Each shard's chunks in logical order: `next[shard]` is the first,
        // `after[k]` the one after chunk k.
        let mut after = vec![None; chunks.len()];
        let mut next = vec![None; tails.len()];
        for (k, c) in chunks.iter().enumerate().rev() {
            after[k] = next[c.shard];
            next[c.shard] = Some(k);
        }
        struct Placing<'a> {
            /// Encoded chunks not yet placed.
            done: Vec<Option<Chunk>>,
            /// Per shard, the chunk whose turn it is (`None`: all placed).
            next: Vec<Option<usize>>,
            locs: &'a mut [u8],
            tails: &'a mut [u64],
        }
        let count = chunks.len();
        let order = logical_order(&chunks, tails.len());
        let slots: Vec<Mutex<Option<Chunk>>> =
            chunks.into_iter().map(|c| Mutex::new(Some(c))).collect();
        let state = Mutex::new(Placing {
            done: (0..count).map(|_| None).collect(),
            next,
            locs,
            tails,
        });
        workers::run(count, |j| {
            let k = order[j];
            let Some(mut chunk) = take(&slots[k]) else {
                return Ok(());
            };
            self.encode_chunk(batch, &mut chunk)?;
            let shard = chunk.shard;
            // Place this chunk and any later ones of its shard that were
            // waiting for it; write them outside the lock.
            let mut ready = Vec::new();
            {
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                st.done[k] = Some(chunk);
                while let Some(j) = st.next[shard] {
                    let Some(mut c) = st.done[j].take() else {
                        break;
                    };
                    let st = &mut *st;
                    self.place(batch, &mut c, start, st.locs, st.tails)?;
                    st.next[shard] = after[j];
                    ready.push(c);
                }
            }
            for mut c in ready {
                let written = self.write_chunk(batch, &c);
                if let Some(buf) = c.data.take() {
                    self.give_buffer(buf);
                }
                written?;
            }
            Ok(())
        })
    }

    /// Publish: truncate every file to its committed length, write the
    /// header page, and rename the build onto the destination.
    pub fn close(mut self) -> Result<()> {
        self.finish()?;
        self.published = true;
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        for (s, (file, &tail)) in self.shards.iter().zip(&self.tails).enumerate() {
            file.set_len(tail)
                .map_err(|e| Error::io(self.build.join(format!("data_{s}.zr")), e))?;
        }
        let meta_len = loc_table_end(self.length).ok_or_else(|| Error::Full {
            path: self.dest.clone(),
        })?;
        self.meta
            .set_len(meta_len)
            .map_err(|e| Error::io(self.build.join("meta.zr"), e))?;
        self.write_page()?;
        // rename(2) replaces an empty directory and refuses a non-empty one,
        // so a store that appeared meanwhile is never overwritten.
        fs::rename(&self.build, &self.dest).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTEMPTY) | Some(libc::EEXIST) | Some(libc::ENOTDIR) => {
                Error::AlreadyExists {
                    path: self.dest.clone(),
                }
            }
            _ => Error::io(&self.dest, e),
        })
    }

    /// Abandon the build: nothing is published.
    pub fn discard(self) {}
}

impl Drop for Writer {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.build);
        }
    }
}
