//! Reading a published store: every open-time check loaderx makes, the
//! RecordLoc table and the shards memory-mapped (a store is immutable once
//! published), and parallel gathers that copy or decode each record
//! straight into the caller's buffer.

use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};
use rayon::prelude::*;

use crate::codec::{Codec, Decoder};
use crate::error::{Error, Result};
use crate::fsio::try_lock;
use crate::layout::{Header, RecordLoc, LOC, PAGE};
use crate::schema::{Geometry, Schema};
use crate::writer::build_dir;

/// Below this many bytes a raw gather runs on the calling thread: handing
/// work to the pool costs more than copying saves.
const PARALLEL_BYTES: u64 = 1 << 20;

/// Decoding is ~10x the work of a copy per byte, so a compressed gather
/// goes to the pool from this many decoded bytes (a batch of 256 token
/// blocks of 2 KiB decoded on one thread ran at half loaderx's speed).
const PARALLEL_DECODED_BYTES: u64 = 64 << 10;

/// How many rows ahead of the copy a raw gather asks for the next row's
/// first bytes, so that row's cache and TLB misses overlap the copies.
const PREFETCH_AHEAD: usize = 4;

/// Hint the CPU to load the cache line at `data[at]` (no effect elsewhere).
#[inline]
fn prefetch(data: &[u8], at: usize) {
    if let Some(byte) = data.get(at) {
        zt_fsutil::prefetch(byte);
    }
}

/// An opened store (read-only; a local store's shared lock is held until
/// dropped).
pub struct Reader {
    path: PathBuf,
    /// `meta.zr`, holding the shared lock (local stores).
    _meta: Option<File>,
    pub(crate) header: Header,
    pub(crate) schema: Schema,
    bytes: Bytes,
    pub(crate) decoder: Decoder,
    /// xxh3-128 of the header page as read (what a dataset manifest
    /// records of the store); 0 for a dataset.
    header_digest: u128,
}

/// Where a reader's RecordLocs and records are.
enum Bytes {
    /// Mapped local files.
    Mapped {
        /// `meta.zr` from the first RecordLoc on (`None` for an empty store).
        locs: Option<Mmap>,
        /// Each shard mapped up to its committed tail (`None` when empty).
        shards: Vec<Option<Mmap>>,
    },
    /// The objects of a store in object storage, read by ranged GETs.
    #[cfg(feature = "remote")]
    Remote(crate::remote::Objects),
    /// The stores of a dataset (see [`crate::dataset`]).
    Many(crate::dataset::Many),
    /// A Megatron `.bin`/`.idx` pair (see [`crate::binidx`]).
    Binidx(crate::binidx::Binidx),
    /// One column of MosaicML MDS shards (see [`crate::mds`]).
    Mds(crate::mds::Mds),
}

/// A Ragged gather: payloads end to end, their byte offsets and shapes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RaggedBatch {
    /// Payload bytes of every record, end to end. Stored in u64 words so the
    /// buffer is aligned for any element type; `len` bytes are valid.
    pub words: Vec<u64>,
    /// Valid bytes in `words`.
    pub len: usize,
    /// `n + 1` byte offsets of the records in the payload buffer.
    pub offsets: Vec<u64>,
    /// `n * ndim` dimensions.
    pub shapes: Vec<u64>,
}

impl RaggedBatch {
    /// The payload bytes.
    pub fn values(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }
}

/// A dataset manifest rather than a store: a `.json` name, or a local
/// path that is a file (a store is a directory).
fn is_manifest(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "json") || path.is_file()
}

fn open_meta(dest: &Path) -> Result<File> {
    let meta = dest.join("meta.zr");
    match File::open(&meta) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == ErrorKind::NotFound => {
            // A store being built beside its destination is busy, not absent.
            if let Ok(f) = File::open(build_dir(dest).join("meta.zr")) {
                if !try_lock(&f, false).unwrap_or(true) {
                    return Err(Error::Busy { path: dest.into() });
                }
            }
            Err(Error::NotFound { path: dest.into() })
        }
        Err(e) => Err(Error::io(meta, e)),
    }
}

/// Check the directory holds exactly the shards the header names.
fn check_files(dest: &Path, header: &Header) -> Result<(Vec<File>, Option<Vec<u8>>)> {
    let shards = header.data_shards as usize;
    for entry in fs::read_dir(dest).map_err(|e| Error::io(dest, e))? {
        let name = entry.map_err(|e| Error::io(dest, e))?.file_name();
        let name = name.to_string_lossy();
        if let Some(rest) = name.strip_prefix("data_") {
            let expected = rest.strip_suffix(".zr").and_then(|n| {
                n.parse::<usize>()
                    .ok()
                    .filter(|&n| n < shards && format!("data_{n}.zr") == name)
            });
            if expected.is_none() {
                return Err(Error::UnexpectedShard {
                    path: dest.into(),
                    name: name.into_owned(),
                });
            }
        }
    }
    let mut files = Vec::with_capacity(shards);
    for (s, &tail) in header.tails.iter().enumerate() {
        let path = dest.join(format!("data_{s}.zr"));
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::MissingShard {
                    path: dest.into(),
                    shard: s,
                })
            }
            Err(e) => return Err(Error::io(path, e)),
        };
        let len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        if len < tail {
            return Err(Error::ShortShard { path, len, tail });
        }
        files.push(file);
    }
    let dict_path = dest.join("dict.zr");
    let dict = match fs::read(&dict_path) {
        Ok(d) => Some(d),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(dict_path, e)),
    };
    check_dict(dest, header.codec, dict.as_deref())?;
    Ok((files, dict))
}

/// A dictionary codec needs a non-empty `dict.zr`; the others have none.
pub(crate) fn check_dict(dest: &Path, codec: Codec, dict: Option<&[u8]>) -> Result<()> {
    match (codec, dict) {
        (Codec::ZstdDict, None | Some([])) => Err(Error::MissingDict { path: dest.into() }),
        (Codec::Raw | Codec::Zstd, Some(_)) => Err(Error::UnexpectedDict { path: dest.into() }),
        _ => Ok(()),
    }
}

fn map(file: &File, offset: u64, len: u64, path: &Path) -> Result<Option<Mmap>> {
    if len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| Error::Full { path: path.into() })?;
    // SAFETY: the store is immutable once published and we hold a shared
    // lock that keeps zt and loaderx writers away; lengths were checked.
    let m = unsafe { MmapOptions::new().offset(offset).len(len).map(file) }
        .map_err(|e| Error::io(path, e))?;
    Ok(Some(m))
}

impl Reader {
    /// Open the store at `path`, whose schema must be Dense (`dense`) or
    /// Ragged.
    pub fn open(path: impl AsRef<Path>, dense: bool) -> Result<Reader> {
        Self::open_with(path, Some(dense))
    }

    /// Open whatever geometry the store holds.
    pub fn open_any(path: impl AsRef<Path>) -> Result<Reader> {
        Self::open_with(path, None)
    }

    /// Open the store at `path`, a local directory or (with the `remote`
    /// feature) an `s3://` prefix read with `storage_options`.
    pub fn open_at(
        path: impl AsRef<Path>,
        dense: Option<bool>,
        storage_options: &[(String, String)],
    ) -> Result<Reader> {
        let path = path.as_ref();
        if crate::binidx::is_binidx(path) {
            if dense == Some(true) {
                return Err(Error::invalid(format!(
                    "{} is a Megatron indexed dataset, which is Ragged",
                    path.display()
                )));
            }
            return Self::open_binidx_at(path, crate::binidx::Unit::Sequence, storage_options);
        }
        if is_manifest(path) {
            return crate::dataset::open_manifest(path, dense, storage_options);
        }
        if crate::remote::is_url(path) {
            return crate::remote::open(path, dense, storage_options);
        }
        Self::open_with(path, dense)
    }

    /// A reader over parts already opened and checked.
    pub(crate) fn decode_schema(
        header: &Header,
        dense: Option<bool>,
        meta_path: &Path,
    ) -> Result<Schema> {
        match dense {
            Some(dense) => Schema::decode(&header.schema, dense, meta_path),
            None => Schema::decode(&header.schema, true, meta_path)
                .or_else(|_| Schema::decode(&header.schema, false, meta_path)),
        }
    }

    #[cfg(feature = "remote")]
    pub(crate) fn remote(
        path: PathBuf,
        header: Header,
        schema: Schema,
        objects: crate::remote::Objects,
        dict: Option<&[u8]>,
        page: &[u8],
    ) -> Result<Reader> {
        let decoder = Decoder::new(header.codec, dict, &path)?;
        Ok(Reader {
            path,
            _meta: None,
            header,
            schema,
            bytes: Bytes::Remote(objects),
            decoder,
            header_digest: xxhash_rust::xxh3::xxh3_128(page),
        })
    }

    /// A dataset's reader over its stores (`length` records in all).
    pub(crate) fn many(path: PathBuf, many: crate::dataset::Many, length: u64) -> Reader {
        let first = &many.members[0];
        let header = Header {
            length,
            data_shards: first.header.data_shards,
            codec: first.header.codec,
            tails: Vec::new(),
            schema: first.header.schema.clone(),
        };
        Reader {
            path,
            _meta: None,
            schema: first.schema.clone(),
            decoder: Decoder::new(Codec::Raw, None, Path::new(""))
                .expect("a raw decoder needs nothing"),
            header,
            bytes: Bytes::Many(many),
            header_digest: 0,
        }
    }

    /// `xxh3-128:` and the 32 hex digits of the store's header page: what a
    /// dataset manifest records of it (see [`crate::dataset`]).
    pub fn header_digest(&self) -> String {
        format!("xxh3-128:{:032x}", self.header_digest)
    }

    /// Open a Megatron indexed dataset (`PREFIX`, `PREFIX.idx` or
    /// `PREFIX.bin`) as a Ragged source of rank 1 whose records are its
    /// sequences or its documents (see [`crate::binidx`]).
    pub fn open_binidx(path: impl AsRef<Path>, unit: crate::binidx::Unit) -> Result<Reader> {
        Self::open_binidx_at(path, unit, &[])
    }

    /// [`Reader::open_binidx`] of a local pair or of one in object storage
    /// (`s3://bucket/PREFIX`, read with `storage_options`): `.idx` fetched
    /// once, `.bin` read by ranges per gather.
    pub fn open_binidx_at(
        path: impl AsRef<Path>,
        unit: crate::binidx::Unit,
        storage_options: &[(String, String)],
    ) -> Result<Reader> {
        let path = path.as_ref();
        let binidx = crate::binidx::Binidx::open(path, unit, storage_options)?;
        let schema = Schema::ragged(binidx.typestr, 1)?;
        let header = Header {
            length: binidx.len(),
            data_shards: 1,
            codec: Codec::Raw,
            tails: Vec::new(),
            schema: Vec::new(),
        };
        Ok(Reader {
            path: crate::binidx::paths(path).1,
            _meta: None,
            header,
            schema,
            bytes: Bytes::Binidx(binidx),
            decoder: Decoder::new(Codec::Raw, None, Path::new(""))
                .expect("a raw decoder needs nothing"),
            header_digest: 0,
        })
    }

    /// Column `column` of the MosaicML MDS dataset at `path` (its directory
    /// or `index.json`) as a Dense source (fixed-size encodings) or a
    /// Ragged one of rank `ndim` (`ndarray` columns; `bytes` and `str` are
    /// rank 1), its values copied from the mapped shards (see
    /// [`crate::mds`]).
    pub fn open_mds(path: impl AsRef<Path>, column: &str, ndim: usize) -> Result<Reader> {
        Self::open_mds_at(path, column, ndim, &[])
    }

    /// [`Reader::open_mds`] of a local dataset or of one in object storage
    /// (`s3://bucket/prefix`, read with `storage_options`): `index.json`
    /// read and the prefix listed once, each raw shard's offset table
    /// fetched at open and its samples by ranges per gather (a zstd-only
    /// shard is fetched and decompressed at open).
    pub fn open_mds_at(
        path: impl AsRef<Path>,
        column: &str,
        ndim: usize,
        storage_options: &[(String, String)],
    ) -> Result<Reader> {
        let path = path.as_ref();
        let mds = crate::mds::Mds::open(path, column, ndim, storage_options)?;
        let schema = mds.column.schema.clone();
        let header = Header {
            length: mds.len(),
            data_shards: 1,
            codec: Codec::Raw,
            tails: Vec::new(),
            schema: Vec::new(),
        };
        Ok(Reader {
            path: crate::mds::index_path(path),
            _meta: None,
            header,
            schema,
            bytes: Bytes::Mds(mds),
            decoder: Decoder::new(Codec::Raw, None, Path::new(""))
                .expect("a raw decoder needs nothing"),
            header_digest: 0,
        })
    }

    /// The MDS column this reader reads, if it reads one.
    fn mds_of(&self) -> Option<&crate::mds::Mds> {
        match &self.bytes {
            Bytes::Mds(mds) => Some(mds),
            _ => None,
        }
    }

    /// The Megatron pair this reader reads, if it reads one.
    fn binidx_of(&self) -> Option<&crate::binidx::Binidx> {
        match &self.bytes {
            Bytes::Binidx(binidx) => Some(binidx),
            _ => None,
        }
    }

    /// The stores of a dataset, or `None` for one store.
    fn many_of(&self) -> Option<&crate::dataset::Many> {
        match &self.bytes {
            Bytes::Many(many) => Some(many),
            _ => None,
        }
    }

    fn open_with(path: impl AsRef<Path>, dense: Option<bool>) -> Result<Reader> {
        let dest = path.as_ref().to_path_buf();
        if crate::remote::is_url(&dest) {
            return crate::remote::open(&dest, dense, &[]);
        }
        let meta_path = dest.join("meta.zr");
        let mut meta = open_meta(&dest)?;
        if !try_lock(&meta, false).map_err(|e| Error::io(&meta_path, e))? {
            return Err(Error::Busy { path: dest });
        }
        let meta_len = meta.metadata().map_err(|e| Error::io(&meta_path, e))?.len();
        let mut page = vec![0u8; PAGE.min(meta_len as usize)];
        meta.read_exact(&mut page)
            .map_err(|e| Error::io(&meta_path, e))?;
        let header = Header::decode(&page, meta_len, &meta_path)?;
        let (files, dict) = check_files(&dest, &header)?;
        let schema = Self::decode_schema(&header, dense, &meta_path)?;
        let locs = map(&meta, PAGE as u64, header.length * LOC as u64, &meta_path)?;
        let shards = files
            .iter()
            .zip(&header.tails)
            .enumerate()
            .map(|(s, (f, &tail))| map(f, 0, tail, &dest.join(format!("data_{s}.zr"))))
            .collect::<Result<Vec<_>>>()?;
        let decoder = Decoder::new(header.codec, dict.as_deref(), &dest)?;
        Ok(Reader {
            path: dest,
            _meta: Some(meta),
            header,
            schema,
            bytes: Bytes::Mapped { locs, shards },
            decoder,
            header_digest: xxhash_rust::xxh3::xxh3_128(&page),
        })
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.header.length
    }

    /// True for a store without records.
    pub fn is_empty(&self) -> bool {
        self.header.length == 0
    }

    /// The codec every record is stored with, or `None` for a dataset
    /// whose stores differ (a DataLoader mixture's concatenation may join
    /// a raw store and a zstd one): see [`Reader::codecs`].
    pub fn codec(&self) -> Option<Codec> {
        let codecs = self.codecs();
        match codecs.split_first() {
            Some((first, rest)) if rest.iter().all(|c| c == first) => Some(*first),
            _ => None,
        }
    }

    /// The codec's name, or `"mixed"` when the stores' differ.
    pub fn codec_name(&self) -> &'static str {
        self.codec().map_or("mixed", Codec::name)
    }

    /// Each store's codec, in record order (one entry for a store, one per
    /// store of a dataset, its datasets' stores in turn), so a mixed
    /// dataset reports what each part holds rather than its first store's.
    pub fn codecs(&self) -> Vec<Codec> {
        match self.many_of() {
            Some(many) => many.members.iter().flat_map(|m| m.codecs()).collect(),
            None => vec![self.header.codec],
        }
    }

    /// Number of data shards (a dataset's: all its stores').
    pub fn data_shards(&self) -> usize {
        match self.many_of() {
            Some(many) => many.data_shards(),
            None => self.header.data_shards as usize,
        }
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The header (length, tails, codec, schema bytes).
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same reader naming `path` (the URL of a cached remote store) in
    /// its errors and [`Reader::path`], not the local cache view it reads.
    #[cfg(feature = "remote")]
    pub(crate) fn relabeled(mut self, path: &Path) -> Reader {
        self.path = path.to_path_buf();
        self
    }

    /// The gather size (logical bytes) from which the pool is used.
    fn parallel_from(&self) -> u64 {
        match self.header.codec {
            Codec::Raw => PARALLEL_BYTES,
            Codec::Zstd | Codec::ZstdDict => PARALLEL_DECODED_BYTES,
        }
    }

    pub(crate) fn check_indices(&self, idxs: &[u64]) -> Result<()> {
        let len = self.len();
        match idxs.iter().find(|&&i| i >= len) {
            Some(&index) => Err(Error::OutOfRange { index, len }),
            None => Ok(()),
        }
    }

    /// Check record `index`'s location against its shard's tail: the shard
    /// and the end of its stored frame.
    pub(crate) fn check_loc(&self, index: u64, loc: RecordLoc) -> Result<(usize, u64)> {
        let shard = (index % self.header.data_shards as u64) as usize;
        let end = loc
            .check(self.header.codec, self.header.tails[shard])
            .map_err(|reason| Error::BadLoc {
                path: self.path.clone(),
                index,
                reason,
            })?;
        Ok((shard, end))
    }

    /// The mapped RecordLoc table and shards (local stores only).
    fn mapped(&self) -> (&[u8], &[Option<Mmap>]) {
        match &self.bytes {
            Bytes::Mapped { locs, shards } => (locs.as_deref().unwrap_or(&[]), shards),
            #[cfg(feature = "remote")]
            Bytes::Remote(_) => (&[], &[]),
            Bytes::Many(_) | Bytes::Binidx(_) | Bytes::Mds(_) => (&[], &[]),
        }
    }

    /// Record `index`'s location and stored frame, validated (local stores).
    fn frame(&self, index: u64) -> Result<(RecordLoc, &[u8])> {
        let (locs, shards) = self.mapped();
        let at = index as usize * LOC;
        let loc = RecordLoc::decode(&locs[at..at + LOC]);
        let (shard, end) = self.check_loc(index, loc)?;
        let data = shards[shard].as_deref().unwrap_or(&[]);
        Ok((loc, &data[loc.offset as usize..end as usize]))
    }

    /// True for a store, a Megatron corpus or MDS shards in object
    /// storage, or a dataset holding one (whose gathers wait on the network, and which
    /// [`Reader::fetch_ahead`] speeds up).
    pub fn is_remote(&self) -> bool {
        #[cfg(feature = "remote")]
        if let Bytes::Remote(_) = &self.bytes {
            return true;
        }
        self.binidx_of().is_some_and(|b| b.is_remote())
            || self.mds_of().is_some_and(|m| m.is_remote())
            || self.many_of().is_some_and(|m| m.is_remote())
    }

    /// Start fetching the records a gather of exactly `idxs` will read, so
    /// that gather (from any thread) takes their bytes instead of waiting
    /// for the network: a store in object storage sends their requests now,
    /// on the remote runtime (within its budget of requests and bytes in
    /// flight). Other stores need nothing fetched and do nothing. Up to 64
    /// gathers (1 GiB of stored records) may be started ahead; past that
    /// the oldest are cancelled.
    pub fn fetch_ahead(&self, idxs: &[u64]) -> Result<()> {
        #[cfg(feature = "remote")]
        if let Bytes::Remote(objects) = &self.bytes {
            self.check_indices(idxs)?;
            return objects.fetch_ahead(self, idxs);
        }
        if let Some(binidx) = self.binidx_of() {
            return binidx.fetch_ahead(idxs);
        }
        if let Some(mds) = self.mds_of() {
            return mds.fetch_ahead(idxs);
        }
        if let Some(many) = self.many_of() {
            return many.fetch_ahead(idxs);
        }
        Ok(())
    }

    /// The logical length of each record (what a Ragged gather allocates).
    pub fn record_lengths(&self, idxs: &[u64]) -> Result<Vec<u64>> {
        if let Some(many) = self.many_of() {
            return many.record_lengths(idxs);
        }
        if let Some(binidx) = self.binidx_of() {
            return binidx.record_lengths(idxs);
        }
        if let Some(mds) = self.mds_of() {
            return mds.record_lengths(idxs);
        }
        self.check_indices(idxs)?;
        #[cfg(feature = "remote")]
        if let Bytes::Remote(objects) = &self.bytes {
            return Ok(objects
                .locs(self, idxs)?
                .iter()
                .map(|loc| u64::from(loc.logic))
                .collect());
        }
        idxs.iter()
            .map(|&i| Ok(u64::from(self.frame(i)?.0.logic)))
            .collect()
    }

    /// Gather fixed-width records into `dst` (`idxs.len() * row` bytes).
    /// Runs of records that sit back to back in one shard and in `dst` are
    /// copied in one go.
    pub fn gather_dense(&self, idxs: &[u64], dst: &mut [u8]) -> Result<()> {
        let row = match self.schema.geometry {
            Geometry::Dense { .. } => self.schema.row_bytes().unwrap_or(0) as usize,
            Geometry::Ragged { .. } => {
                return Err(Error::invalid("gather_dense on a ragged store"))
            }
        };
        if Some(dst.len()) != idxs.len().checked_mul(row) {
            return Err(Error::invalid("destination is not one row per index"));
        }
        if let Some(many) = self.many_of() {
            return many.gather_dense(idxs, dst, row);
        }
        if let Some(mds) = self.mds_of() {
            return mds.gather_dense(idxs, dst, row);
        }
        self.check_indices(idxs)?;
        if idxs.is_empty() {
            return Ok(());
        }
        #[cfg(feature = "remote")]
        if let Bytes::Remote(objects) = &self.bytes {
            return objects.gather_dense(self, idxs, dst, row);
        }
        let threads = rayon::current_num_threads().max(1);
        if (dst.len() as u64) < self.parallel_from() || threads == 1 || idxs.len() < 2 {
            return self.gather_rows(idxs, dst, row);
        }
        // Contiguous blocks, a few per thread so uneven records even out.
        let per = idxs.len().div_ceil(threads * 4).max(1);
        dst.par_chunks_mut(per * row)
            .zip(idxs.par_chunks(per))
            .try_for_each(|(d, i)| self.gather_rows(i, d, row))
    }

    fn gather_rows(&self, idxs: &[u64], dst: &mut [u8], row: usize) -> Result<()> {
        if self.header.codec == Codec::Raw {
            return self.copy_rows(idxs, dst, row);
        }
        for (j, &index) in idxs.iter().enumerate() {
            let (loc, frame) = self.frame(index)?;
            self.decode_row(index, loc, frame, &mut dst[j * row..(j + 1) * row])?;
        }
        Ok(())
    }

    /// One Dense record into its row: checked against the schema's width,
    /// copied (raw) or decoded.
    pub(crate) fn decode_row(
        &self,
        index: u64,
        loc: RecordLoc,
        frame: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        self.check_row(index, loc, out.len())?;
        if self.header.codec == Codec::Raw {
            out.copy_from_slice(frame);
            return Ok(());
        }
        self.decoder
            .decode(frame, out)
            .map_err(|reason| Error::Decode {
                path: self.path.clone(),
                index,
                reason,
            })
    }

    fn check_row(&self, index: u64, loc: RecordLoc, row: usize) -> Result<()> {
        if loc.logic as usize != row {
            return Err(Error::BadLoc {
                path: self.path.clone(),
                index,
                reason: "record width differs from the schema's row",
            });
        }
        Ok(())
    }

    /// Raw rows in two passes: first every record's location, then the
    /// copies. Random indices make each RecordLoc lookup a cache miss;
    /// looked up back to back, the misses overlap one another instead of
    /// each waiting behind the previous row's copy (with the prefetch
    /// below; `python -m harness --only zrecord` compares the gather with
    /// a numpy memmap fancy-index gather and with loaderx).
    /// Runs of records that sit back to back in one shard and in `dst` are
    /// then copied in one go.
    fn copy_rows(&self, idxs: &[u64], dst: &mut [u8], row: usize) -> Result<()> {
        let shards = self.header.data_shards as u64;
        let mut spans: Vec<(usize, usize, usize)> =
            try_vec(idxs.len(), &self.path, "a Dense gather's record spans")?;
        for &index in idxs {
            let (loc, frame) = self.frame(index)?;
            self.check_row(index, loc, row)?;
            let start = loc.offset as usize;
            spans.push(((index % shards) as usize, start, start + frame.len()));
        }
        let mut j = 0;
        let (_, shard_maps) = self.mapped();
        while j < spans.len() {
            if let Some(&(shard, start, _)) = spans.get(j + PREFETCH_AHEAD) {
                prefetch(shard_maps[shard].as_deref().unwrap_or(&[]), start);
            }
            let (shard, start, mut end) = spans[j];
            let mut k = j + 1;
            while k < spans.len() && spans[k].0 == shard && spans[k].1 == end {
                end = spans[k].2;
                k += 1;
            }
            let data = shard_maps[shard].as_deref().unwrap_or(&[]);
            dst[j * row..k * row].copy_from_slice(&data[start..end]);
            j = k;
        }
        Ok(())
    }

    /// Gather Ragged records in one pass: payloads end to end, byte offsets
    /// and shapes, every shape prefix checked against its payload.
    pub fn gather_ragged(&self, idxs: &[u64]) -> Result<RaggedBatch> {
        self.gather_ragged_into(idxs, Vec::new())
    }

    /// [`Reader::gather_ragged`], writing the payloads into `words`'
    /// allocation (resized to fit; its contents are overwritten). A caller
    /// that keeps the buffers of dropped batches saves the kernel's fresh,
    /// zeroed pages on every large gather.
    pub fn gather_ragged_into(&self, idxs: &[u64], mut words: Vec<u64>) -> Result<RaggedBatch> {
        let ndim = match self.schema.geometry {
            Geometry::Ragged { ndim } => ndim,
            Geometry::Dense { .. } => return Err(Error::invalid("gather_ragged on a dense store")),
        };
        if let Some(many) = self.many_of() {
            return many.gather_ragged_into(idxs, words, ndim, &self.path);
        }
        if let Some(binidx) = self.binidx_of() {
            return binidx.gather_ragged_into(idxs, words);
        }
        if let Some(mds) = self.mds_of() {
            return mds.gather_ragged_into(idxs, words);
        }
        self.check_indices(idxs)?;
        #[cfg(feature = "remote")]
        let remote_locs = match &self.bytes {
            Bytes::Remote(objects) => Some(objects.locs(self, idxs)?),
            Bytes::Mapped { .. } | Bytes::Many(_) | Bytes::Binidx(_) | Bytes::Mds(_) => None,
        };
        let prefix = self.schema.shape_prefix_bytes();
        let mut offsets = try_vec(idxs.len() + 1, &self.path, "Ragged offsets")?;
        offsets.push(0u64);
        let mut total = 0u64;
        for (j, &i) in idxs.iter().enumerate() {
            #[cfg(feature = "remote")]
            let loc = match &remote_locs {
                Some(locs) => locs[j],
                None => self.frame(i)?.0,
            };
            #[cfg(not(feature = "remote"))]
            let loc = {
                let _ = j;
                self.frame(i)?.0
            };
            let logic = loc.logic as usize;
            if logic <= prefix {
                return Err(Error::Decode {
                    path: self.path.clone(),
                    index: i,
                    reason: "corrupt ragged record shape header".into(),
                });
            }
            // Saturated: a sum past u64 is refused by the allocation below.
            total = total.saturating_add((logic - prefix) as u64);
            offsets.push(total);
        }
        let len = usize::try_from(total)
            .map_err(|_| Error::invalid("gathered records exceed the addressable buffer"))?;
        let need = len.div_ceil(8);
        let memory = |what, bytes: u64| Error::Memory {
            path: self.path.clone(),
            what,
            bytes,
        };
        if words.capacity() < need {
            // calloc: fresh pages the kernel zeroes only when first touched.
            words = zeroed_words(need).ok_or_else(|| memory("a Ragged gather", total))?;
        } else {
            words.resize(need, 0);
        }
        // Saturated: an overflowing count is refused by the allocation.
        let shape_words = idxs.len().saturating_mul(ndim);
        let mut shapes = zeroed_words(shape_words)
            .ok_or_else(|| memory("Ragged shapes", (shape_words as u64).saturating_mul(8)))?;
        {
            // SAFETY: `words` holds len.div_ceil(8) * 8 >= len bytes.
            let values =
                unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, len) };
            let threads = rayon::current_num_threads().max(1);
            #[cfg(feature = "remote")]
            if let (Bytes::Remote(objects), Some(locs)) = (&self.bytes, &remote_locs) {
                objects.fill_ragged(self, idxs, locs, &offsets, values, &mut shapes, ndim)?;
                return Ok(RaggedBatch {
                    words,
                    len,
                    offsets,
                    shapes,
                });
            }
            if total < self.parallel_from() || threads == 1 || idxs.len() < 2 {
                self.fill_ragged(idxs, &offsets, values, &mut shapes, ndim)?;
            } else {
                let per = idxs.len().div_ceil(threads * 4).max(1);
                let blocks = split_blocks(idxs, &offsets, values, &mut shapes, ndim, per);
                blocks
                    .into_par_iter()
                    .try_for_each(|(i, o, v, s)| self.fill_ragged(i, o, v, s, ndim))?;
            }
        }
        Ok(RaggedBatch {
            words,
            len,
            offsets,
            shapes,
        })
    }

    fn fill_ragged(
        &self,
        idxs: &[u64],
        offsets: &[u64],
        values: &mut [u8],
        shapes: &mut [u64],
        ndim: usize,
    ) -> Result<()> {
        let base = offsets[0];
        let mut scratch = Vec::new();
        for (j, &i) in idxs.iter().enumerate() {
            let (loc, frame) = self.frame(i)?;
            let at = (offsets[j] - base) as usize;
            let end = (offsets[j + 1] - base) as usize;
            let shape = &mut shapes[j * ndim..(j + 1) * ndim];
            self.place_ragged(i, loc, frame, &mut scratch, shape, &mut values[at..end])?;
        }
        Ok(())
    }

    /// One Ragged record: decoded (into `scratch`) unless raw, its shape
    /// prefix read into `shape` and checked against the payload, the
    /// payload copied into `out`.
    pub(crate) fn place_ragged(
        &self,
        index: u64,
        loc: RecordLoc,
        frame: &[u8],
        scratch: &mut Vec<u8>,
        shape: &mut [u64],
        out: &mut [u8],
    ) -> Result<()> {
        let dim_bytes = self.schema.layout.dim_bytes();
        let prefix = shape.len() * dim_bytes;
        let record: &[u8] = if self.header.codec == Codec::Raw {
            frame
        } else {
            let logic = loc.logic as usize;
            if scratch.len() < logic && scratch.try_reserve(logic - scratch.len()).is_err() {
                return Err(Error::Memory {
                    path: self.path.clone(),
                    what: "a decoded record",
                    bytes: logic as u64,
                });
            }
            scratch.resize(logic, 0);
            self.decoder
                .decode(frame, scratch)
                .map_err(|reason| Error::Decode {
                    path: self.path.clone(),
                    index,
                    reason,
                })?;
            scratch
        };
        for (d, b) in shape
            .iter_mut()
            .zip(record[..prefix].chunks_exact(dim_bytes))
        {
            *d = b.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x));
        }
        let payload = &record[prefix..];
        let elements = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let expect = elements.and_then(|e| e.checked_mul(self.schema.itemsize as u64));
        if expect != Some(payload.len() as u64) || payload.len() != out.len() {
            return Err(Error::Decode {
                path: self.path.clone(),
                index,
                reason: "corrupt ragged record shape".into(),
            });
        }
        out.copy_from_slice(payload);
        Ok(())
    }
}

type Block<'a> = (&'a [u64], &'a [u64], &'a mut [u8], &'a mut [u64]);

/// Split a Ragged gather into blocks of `per` records with their own
/// slices of the output, so blocks fill in parallel without sharing.
fn split_blocks<'a>(
    idxs: &'a [u64],
    offsets: &'a [u64],
    mut values: &'a mut [u8],
    mut shapes: &'a mut [u64],
    ndim: usize,
    per: usize,
) -> Vec<Block<'a>> {
    let mut blocks = Vec::new();
    let mut start = 0;
    while start < idxs.len() {
        let end = (start + per).min(idxs.len());
        let bytes = (offsets[end] - offsets[start]) as usize;
        let (v, rest_v) = std::mem::take(&mut values).split_at_mut(bytes);
        let (s, rest_s) = std::mem::take(&mut shapes).split_at_mut((end - start) * ndim);
        values = rest_v;
        shapes = rest_s;
        blocks.push((&idxs[start..end], &offsets[start..=end], v, s));
        start = end;
    }
    blocks
}

/// An empty vector with room for `n` items, or [`Error::Memory`] naming the
/// store at `path`: buffers sized by a caller's index count are allocated
/// like the gather's output, so an absurd request is an error the caller
/// can catch, never an abort.
pub(crate) fn try_vec<T>(n: usize, path: &Path, what: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Memory {
        path: path.to_path_buf(),
        what,
        bytes: (n as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    Ok(v)
}

/// `n` zero words, or `None` when they cannot be allocated (or `n` words
/// pass the address space). Zeroed allocation (`calloc`) leaves untouched
/// pages to the kernel's zero page, as `vec![0; n]` does, but a failure is
/// the caller's to report instead of an abort: every buffer a gather or a
/// batch is given (here, in zloader and in the Python binding's batch
/// pool) comes from it.
pub fn zeroed_words(n: usize) -> Option<Vec<u64>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u64>(n).ok()?;
    // SAFETY: non-zero size; a null return is failure.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) } as *mut u64;
    if ptr.is_null() {
        return None;
    }
    // SAFETY: allocated by the global allocator for `n` u64s, all zeroed.
    Some(unsafe { Vec::from_raw_parts(ptr, n, n) })
}
