//! MosaicML streaming's MDS shards (`index.json` + `shard.N.mds`, what
//! `streaming.MDSWriter` writes) read as a record source: one column of
//! the samples, Dense when its encoding has a fixed size (`ndarray:DTYPE:
//! SHAPE`, the scalars `int`, `uint8` .. `float64`), else Ragged (`ndarray:
//! DTYPE` with its shape per sample, `ndarray` with dtype and shape per
//! sample, `bytes` and `str` as bytes).
//!
//! `index.json` (version 2): `{"shards": [{"format": "mds", "version": 2,
//! "column_names", "column_encodings", "column_sizes" (null for a
//! variable-size column), "samples", "raw_data": {"basename", "bytes"},
//! "zip_data": null | {"basename", "bytes"}, "compression": null |
//! "zstd[:level]" | ...}], "version": 2}`; columns are in sorted order.
//!
//! A raw shard, little-endian: `u32 samples`, `u32 offsets[samples + 1]`
//! (absolute byte offsets of each sample and the end), then the samples;
//! a sample is one `u32` size per variable-size column, then every
//! column's bytes in column order (`MDSWriter.encode_sample`,
//! `MDSReader.decode_sample`). A shard whose raw file is absent is read
//! from its compressed file (`zip_data`) when the codec is zstd, into
//! memory bounded by the raw size the index gives (shards are under 4 GiB:
//! their offsets are u32); other codecs are refused.
//!
//! Nothing is trusted: the index's counts and sizes are checked against the
//! files at open, and every sample's offsets, column sizes and array
//! headers when it is gathered. A refusal cites rule `zrecord.Mds`.
//!
//! In object storage (`s3://bucket/dir`, `gs://`, `az://`: the feature
//! `remote`) `index.json` is read and the prefix listed once (each shard's
//! size and ETag, so a shard costs no request until read); each raw
//! shard's sample count and offset table are fetched at open (one exact
//! range each), and a gather fetches its samples' byte ranges through
//! `crate::ranged` (coalesced, within the process's budget, or taken
//! from a fetch the DataLoader started ahead), then checks and decodes
//! them as above. A zstd-only shard is fetched whole and decompressed at
//! open.

use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::json::Value;
use crate::reader::RaggedBatch;
use crate::schema::Schema;

/// What an MDS refusal cites.
pub const RULE: &str = "zrecord.Mds";

/// The largest `index.json` read: an index lists shards, not samples.
const INDEX_MAX_BYTES: u64 = 64 << 20;
/// JSON nesting deeper than this is refused.
const INDEX_MAX_DEPTH: usize = 8;
/// A raw shard's offsets are u32: no shard reaches 4 GiB.
const SHARD_MAX_BYTES: u64 = 1 << 32;

fn refuse(path: &Path, reason: impl Into<String>) -> Error {
    Error::Dataset {
        path: path.to_path_buf(),
        rule: RULE,
        reason: reason.into(),
    }
}

/// How the column's bytes become a record.
#[derive(Clone, Debug, PartialEq)]
enum Encoding {
    /// Exactly `size` bytes of the record's dtype (a fixed ndarray or a scalar).
    Fixed { size: u64 },
    /// `bytes` or `str`: the bytes, a rank-1 uint8 record.
    Bytes,
    /// `ndarray:DTYPE`: `[ndim << 2 | shape dtype][shape][values]`.
    ShapedArray,
    /// `ndarray`: `[dtype code]` then as [`Encoding::ShapedArray`].
    DtypedArray { code: u8 },
}

/// What one column is, as a record source.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    /// The column's name.
    pub name: String,
    /// Its MDS encoding, as the index spells it.
    pub encoding: String,
    /// Dense (fixed size) or Ragged.
    pub schema: Schema,
}

/// A column as the first shard declares it: the encoding's text, what it
/// makes, the typestr, the itemsize and the fixed item shape (`None`:
/// Ragged); every other shard must declare the same encoding.
type Declared = (String, Encoding, &'static str, u64, Option<Vec<u64>>);

/// One shard's raw bytes.
enum Bytes {
    Mapped(Mmap),
    Decompressed(Vec<u8>),
    /// A raw shard in object storage: its sample count and offset table
    /// fetched at open, its samples by ranges per gather.
    #[cfg(feature = "remote")]
    Remote {
        object: std::sync::Arc<zt_remote::RemoteObject>,
        table: Vec<u8>,
    },
}

impl Bytes {
    /// The shard's bytes from its start: all of them, or (in object
    /// storage) its table of offsets only.
    fn get(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Decompressed(v) => v,
            #[cfg(feature = "remote")]
            Bytes::Remote { table, .. } => table,
        }
    }
}

struct Shard {
    path: PathBuf,
    bytes: Bytes,
    /// The raw shard's size.
    len: u64,
    samples: u64,
    /// Sizes of the columns before this one that are fixed (`Some`) or
    /// carried per sample (`None`), and this column's.
    sizes: Vec<Option<u64>>,
    column: usize,
}

/// An opened MDS dataset, one column of it.
pub(crate) struct Mds {
    shards: Vec<Shard>,
    /// `starts[s]`: shard `s`'s first sample; the last entry is the total.
    starts: Vec<u64>,
    encoding: Encoding,
    /// Bytes per element.
    itemsize: u64,
    /// Ragged: the rank every record must have.
    ndim: usize,
    pub(crate) column: Column,
    /// Gathers started ahead (shards in object storage).
    #[cfg(feature = "remote")]
    ranged: crate::ranged::Ranged,
}

/// `index.json` of `path` (the file, or the directory holding it).
pub fn index_path(path: &Path) -> PathBuf {
    if path.file_name().is_some_and(|n| n == "index.json") {
        path.to_path_buf()
    } else {
        path.join("index.json")
    }
}

/// True if `path` is an MDS directory or its `index.json` (told by the
/// index's first shard saying `"format": "mds"` is left to the open).
pub fn is_mds(path: &Path) -> bool {
    index_path(path).is_file()
}

/// streaming's ndarray value dtypes: code, NumPy `dtype.str`, itemsize.
const DTYPES: [(u8, &str, &str, u64); 11] = [
    (8, "uint8", "|u1", 1),
    (9, "int8", "|i1", 1),
    (16, "uint16", "<u2", 2),
    (17, "int16", "<i2", 2),
    (18, "float16", "<f2", 2),
    (32, "uint32", "<u4", 4),
    (33, "int32", "<i4", 4),
    (34, "float32", "<f4", 4),
    (64, "uint64", "<u8", 8),
    (65, "int64", "<i8", 8),
    (66, "float64", "<f8", 8),
];

fn dtype_by_name(name: &str) -> Option<(u8, &'static str, u64)> {
    DTYPES.iter().find(|d| d.1 == name).map(|d| (d.0, d.2, d.3))
}

fn dtype_by_code(code: u8) -> Option<(&'static str, u64)> {
    DTYPES.iter().find(|d| d.0 == code).map(|d| (d.2, d.3))
}

/// The record source an encoding makes: its encoding, typestr, itemsize and
/// fixed item shape (`None`: Ragged). `ndarray` (dtype per sample) comes
/// back with code 0, filled in from the first sample.
fn parse_encoding(
    text: &str,
    path: &Path,
) -> Result<(Encoding, &'static str, u64, Option<Vec<u64>>)> {
    let bad = |why: &str| refuse(path, format!("column encoding {text:?}: {why}"));
    if let Some((_, typestr, size)) = dtype_by_name(text) {
        return Ok((Encoding::Fixed { size }, typestr, size, Some(Vec::new())));
    }
    match text {
        "int" => return Ok((Encoding::Fixed { size: 8 }, "<i8", 8, Some(Vec::new()))),
        "bytes" | "str" => return Ok((Encoding::Bytes, "|u1", 1, None)),
        "ndarray" => return Ok((Encoding::DtypedArray { code: 0 }, "|u1", 1, None)),
        _ => {}
    }
    let Some(config) = text.strip_prefix("ndarray:") else {
        return Err(bad(
            "not an encoding of arrays (bytes, str, int, a numeric scalar or ndarray)",
        ));
    };
    let mut args = config.split(':');
    let dtype = args.next().unwrap_or("");
    let shape = args.next();
    if args.next().is_some() {
        return Err(bad("more than a dtype and a shape"));
    }
    let Some((_, typestr, itemsize)) = dtype_by_name(dtype) else {
        return Err(bad("not one of streaming's ndarray dtypes"));
    };
    let Some(shape) = shape else {
        return Ok((Encoding::ShapedArray, typestr, itemsize, None));
    };
    let dims = shape
        .split(',')
        .map(|d| d.trim().parse::<u64>().ok().filter(|&d| d >= 1))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| bad("a shape of positive integers"))?;
    let size = dims
        .iter()
        .try_fold(itemsize, |n, &d| n.checked_mul(d))
        .filter(|&n| n < SHARD_MAX_BYTES)
        .ok_or_else(|| bad("an array larger than a shard"))?;
    Ok((Encoding::Fixed { size }, typestr, itemsize, Some(dims)))
}

fn member<'a>(object: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
    object.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn as_u64(value: Option<&Value>) -> Option<u64> {
    match value {
        Some(Value::Int(text)) => text.parse().ok(),
        _ => None,
    }
}

fn as_str(value: Option<&Value>) -> Option<&str> {
    match value {
        Some(Value::Str(s)) => Some(s),
        _ => None,
    }
}

/// A shard's file name: one path component, nothing that climbs out.
fn basename<'a>(value: Option<&'a Value>, index: &Path, s: usize) -> Result<&'a str> {
    let name = match value {
        Some(Value::Object(o)) => as_str(member(o, "basename")),
        _ => None,
    };
    match name {
        Some(n) if !n.is_empty() && !n.contains(['/', '\\']) && n != "." && n != ".." => Ok(n),
        _ => Err(refuse(index, format!("shard {s}: no plain file basename"))),
    }
}

fn file_bytes(value: Option<&Value>) -> Option<u64> {
    match value {
        Some(Value::Object(o)) => as_u64(member(o, "bytes")),
        _ => None,
    }
}

fn map(path: &Path) -> Result<Option<Mmap>> {
    let file = match zt_fsutil::open_regular(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len == 0 {
        return Err(refuse(path, "the shard is empty"));
    }
    // SAFETY: read-only mapping of a regular file; a dataset is not
    // rewritten while read (as for the stores, whose readers map too).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok(Some(map))
}

/// The zstd-compressed shard `data` (read from `path`), decompressed to
/// exactly `raw` bytes.
fn decompress(path: &Path, data: &[u8], raw: u64) -> Result<Vec<u8>> {
    let mut out = crate::reader::try_vec::<u8>(raw as usize, path, "a decompressed shard")?;
    // One byte past the size the index gives, to tell a longer shard.
    let mut decoder = zstd::stream::read::Decoder::new(data).map_err(|e| Error::io(path, e))?;
    use std::io::Read;
    (&mut decoder)
        .take(raw + 1)
        .read_to_end(&mut out)
        .map_err(|e| refuse(path, format!("not a zstd stream: {e}")))?;
    if out.len() as u64 != raw {
        return Err(refuse(
            path,
            format!("decompresses to {} bytes, the index says {raw}", out.len()),
        ));
    }
    Ok(out)
}

/// A sample fetched from object storage, and where it starts in its shard.
type Fetched = (Vec<u8>, usize);
/// A gathered record: its element bytes, shape and rank.
type Record<'a> = (&'a [u8], [u64; 64], usize);
/// Where a mapped or decompressed shard holds a record's bytes: the shard
/// number and the offset (`None`: fetched from object storage).
type Origin = Option<(usize, usize)>;

/// Where a dataset's files are: a directory, or a prefix in object storage
/// (listed once at open, so a shard costs no request until it is read).
enum Files {
    Local(PathBuf),
    #[cfg(feature = "remote")]
    Remote {
        dir: String,
        config: std::sync::Arc<zt_remote::RemoteConfig>,
        options: Vec<(String, String)>,
        listed: std::collections::HashMap<String, zt_remote::list::Listed>,
    },
}

impl Files {
    /// The files of the dataset in `dir`, and its index's bytes.
    fn open(
        dir: PathBuf,
        index: &Path,
        storage_options: &[(String, String)],
    ) -> Result<(Files, Vec<u8>)> {
        if !crate::remote::is_url(&dir) {
            let _ = storage_options;
            return Ok((Files::Local(dir), read_index(index)?));
        }
        #[cfg(not(feature = "remote"))]
        return Err(crate::remote::unsupported(&dir));
        #[cfg(feature = "remote")]
        {
            let text = crate::remote::read_small(index, INDEX_MAX_BYTES, storage_options)?;
            let config = crate::remote::config(&dir, storage_options)?;
            let dir = dir.to_string_lossy().into_owned();
            let listed = zt_remote::list::list(&dir, &config)
                .map_err(|e| crate::remote::error(Path::new(&dir), e))?
                .into_iter()
                .map(|l| (l.name.clone(), l))
                .collect();
            Ok((
                Files::Remote {
                    dir,
                    config,
                    options: storage_options.to_vec(),
                    listed,
                },
                text,
            ))
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        match self {
            Files::Local(dir) => dir.join(name),
            #[cfg(feature = "remote")]
            Files::Remote { dir, .. } => PathBuf::from(format!("{dir}/{name}")),
        }
    }

    /// The raw shard `name` (at `path`), `None` when absent: mapped, or in
    /// object storage the object (no request yet).
    fn raw(&self, path: &Path, name: &str) -> Result<Option<Bytes>> {
        match self {
            Files::Local(_) => {
                let _ = name;
                Ok(map(path)?.map(Bytes::Mapped))
            }
            #[cfg(feature = "remote")]
            Files::Remote { config, listed, .. } => {
                use zt_remote::RemoteObject;
                let Some(l) = listed.get(name) else {
                    return Ok(None);
                };
                let url = path.to_string_lossy();
                let object = match &l.etag {
                    Some(tag) => RemoteObject::listed(&url, config.clone(), l.size, tag.clone()),
                    None => RemoteObject::open(&url, config.clone()),
                }
                .map_err(|e| crate::remote::error(path, e))?;
                // Its table comes with every shard's (`Mds::fetch_tables`).
                Ok(Some(Bytes::Remote {
                    object: std::sync::Arc::new(object),
                    table: Vec::new(),
                }))
            }
        }
    }

    /// The compressed shard `name` (at `path`) whole.
    fn compressed(&self, path: &Path, name: &str) -> Result<Vec<u8>> {
        let absent = || {
            refuse(
                path,
                "neither the raw shard nor its compressed file is there",
            )
        };
        match self {
            Files::Local(_) => std::fs::read(path).map_err(|e| match (e.kind(), name) {
                (std::io::ErrorKind::NotFound, _) => absent(),
                _ => Error::io(path, e),
            }),
            #[cfg(feature = "remote")]
            Files::Remote {
                listed, options, ..
            } => {
                if !listed.contains_key(name) {
                    return Err(absent());
                }
                crate::remote::read_small(path, SHARD_MAX_BYTES, options)
            }
        }
    }
}

impl Mds {
    /// Open column `column` of the MDS dataset at `path` (its directory or
    /// `index.json`); `ndim` is the rank of a Ragged `ndarray` column's
    /// records (1 for `bytes`/`str`; ignored for fixed-size columns).
    pub(crate) fn open(
        path: &Path,
        column: &str,
        ndim: usize,
        storage_options: &[(String, String)],
    ) -> Result<Mds> {
        let index = index_path(path);
        let dir = index.parent().unwrap_or(Path::new("")).to_path_buf();
        let (files, text) = Files::open(dir, &index, storage_options)?;
        let root = match crate::json::decode(&text, INDEX_MAX_DEPTH) {
            Ok(Value::Object(o)) => o,
            Ok(_) => return Err(refuse(&index, "not a JSON object")),
            Err(e) => {
                return Err(refuse(
                    &index,
                    format!("not JSON ({:?} at byte {})", e.kind, e.at),
                ))
            }
        };
        if as_u64(member(&root, "version")) != Some(2) {
            return Err(refuse(&index, "index version is not 2"));
        }
        let Some(Value::Array(entries)) = member(&root, "shards") else {
            return Err(refuse(&index, "no shards list"));
        };
        if entries.is_empty() {
            return Err(refuse(&index, "no shards"));
        }
        let mut shards = Vec::with_capacity(entries.len());
        let mut starts = vec![0u64];
        let mut found: Option<Declared> = None;
        for (s, entry) in entries.iter().enumerate() {
            let Value::Object(entry) = entry else {
                return Err(refuse(&index, format!("shard {s} is not an object")));
            };
            let shard = Self::open_shard(&index, &files, s, entry, column, &mut found)?;
            let total = starts[s]
                .checked_add(shard.samples)
                .ok_or_else(|| refuse(&index, "the sample counts overflow"))?;
            starts.push(total);
            shards.push(shard);
        }
        #[cfg(feature = "remote")]
        Self::fetch_tables(&mut shards)?;
        let (encoding_text, mut encoding, mut typestr, mut itemsize, shape) =
            found.expect("at least one shard");
        // `ndarray`: the dtype is each sample's; the first fixes the column's.
        if let Encoding::DtypedArray { .. } = encoding {
            let first = shards.iter().find(|s| s.samples > 0);
            let code = match first {
                Some(shard) => {
                    let (value, at) = shard.value_owned(0)?;
                    *value
                        .first()
                        .ok_or_else(|| shard.bad(at, "an empty ndarray value"))?
                }
                None => 8, // no samples: uint8, as any
            };
            let (t, n) = dtype_by_code(code).ok_or_else(|| {
                refuse(
                    &shards[0].path,
                    format!("unknown ndarray dtype code {code}"),
                )
            })?;
            (encoding, typestr, itemsize) = (Encoding::DtypedArray { code }, t, n);
        }
        let (schema, ndim) = match &shape {
            Some(dims) => (Schema::dense(typestr, dims)?, dims.len()),
            None => {
                let ndim = if encoding == Encoding::Bytes { 1 } else { ndim };
                if ndim == 0 || ndim > 63 {
                    return Err(Error::invalid(
                        "an MDS ndarray column's records have rank 1 to 63",
                    ));
                }
                (Schema::ragged(typestr, ndim)?, ndim)
            }
        };
        Ok(Mds {
            shards,
            starts,
            encoding,
            itemsize,
            ndim,
            column: Column {
                name: column.to_string(),
                encoding: encoding_text,
                schema,
            },
            #[cfg(feature = "remote")]
            ranged: Default::default(),
        })
    }

    fn open_shard(
        index: &Path,
        files: &Files,
        s: usize,
        entry: &[(String, Value)],
        column: &str,
        found: &mut Option<Declared>,
    ) -> Result<Shard> {
        let bad = |why: String| refuse(index, format!("shard {s}: {why}"));
        if as_str(member(entry, "format")) != Some("mds") {
            return Err(bad("format is not \"mds\"".into()));
        }
        let list = |key: &str| match member(entry, key) {
            Some(Value::Array(items)) => Ok(items),
            _ => Err(bad(format!("no {key} list"))),
        };
        let (names, encodings, sizes) = (
            list("column_names")?,
            list("column_encodings")?,
            list("column_sizes")?,
        );
        if names.len() != encodings.len() || names.len() != sizes.len() {
            return Err(bad("column lists of different lengths".into()));
        }
        let mut at = None;
        let mut fixed = Vec::with_capacity(names.len());
        for (c, ((name, enc), size)) in names.iter().zip(encodings).zip(sizes).enumerate() {
            let (Value::Str(name), Value::Str(_)) = (name, enc) else {
                return Err(bad("a column name or encoding is not a string".into()));
            };
            fixed.push(match size {
                Value::Null => None,
                Value::Int(_) => Some(
                    as_u64(Some(size))
                        .filter(|&n| n < SHARD_MAX_BYTES)
                        .ok_or_else(|| bad(format!("column {name:?} has size {size:?}")))?,
                ),
                _ => return Err(bad(format!("column {name:?} has size {size:?}"))),
            });
            if name == column {
                at = Some(c);
            }
        }
        let Some(c) = at else {
            let names: Vec<&str> = names.iter().filter_map(|n| as_str(Some(n))).collect();
            return Err(bad(format!("no column {column:?} (columns: {names:?})")));
        };
        let Value::Str(encoding_text) = &encodings[c] else {
            unreachable!("checked a string")
        };
        let (encoding, typestr, itemsize, shape) = parse_encoding(encoding_text, index)?;
        // The size the index gives must be the encoding's own.
        let own = match encoding {
            Encoding::Fixed { size } => Some(size),
            _ => None,
        };
        if fixed[c] != own {
            return Err(bad(format!(
                "column {column:?} of encoding {encoding_text:?} has size {:?}",
                fixed[c]
            )));
        }
        match found {
            None => *found = Some((encoding_text.clone(), encoding, typestr, itemsize, shape)),
            Some((first, ..)) if first != encoding_text => {
                return Err(bad(format!(
                    "column {column:?} is {encoding_text:?}, shard 0 has {first:?}"
                )))
            }
            Some(_) => {}
        }
        let samples =
            as_u64(member(entry, "samples")).ok_or_else(|| bad("no sample count".into()))?;
        let raw = member(entry, "raw_data");
        let raw_name = basename(raw, index, s)?;
        let raw_bytes = file_bytes(raw)
            .filter(|&n| n < SHARD_MAX_BYTES)
            .ok_or_else(|| bad("raw_data has no size under 4 GiB".into()))?;
        let table_end = samples
            .checked_add(2)
            .and_then(|n| n.checked_mul(4))
            .filter(|&n| n <= raw_bytes);
        let raw_path = files.path(raw_name);
        let bytes = match files.raw(&raw_path, raw_name)? {
            Some(bytes) => bytes,
            None => {
                let zip = member(entry, "zip_data").filter(|v| **v != Value::Null);
                let compression = as_str(member(entry, "compression"));
                let Some(zip) = zip else {
                    return Err(refuse(&raw_path, "the shard is missing"));
                };
                let zip_name = basename(Some(zip), index, s)?;
                let zip_path = files.path(zip_name);
                let codec = compression.map(|c| c.split(':').next().unwrap_or(""));
                if codec != Some("zstd") {
                    return Err(refuse(
                        &zip_path,
                        format!(
                            "compression {compression:?}: zt decompresses zstd shards (others: keep the raw shard beside it)"
                        ),
                    ));
                }
                let compressed = files.compressed(&zip_path, zip_name)?;
                Bytes::Decompressed(decompress(&zip_path, &compressed, raw_bytes)?)
            }
        };
        let len = match &bytes {
            #[cfg(feature = "remote")]
            Bytes::Remote { object, .. } => object.len(),
            other => other.get().len() as u64,
        };
        let shard = Shard {
            path: raw_path,
            bytes,
            len,
            samples,
            sizes: fixed,
            column: c,
        };
        if len != raw_bytes {
            return Err(refuse(
                &shard.path,
                format!("{len} bytes, the index says {raw_bytes}"),
            ));
        }
        // A shard in object storage has its table fetched with the others'
        // (`fetch_tables`), and checked there.
        if table_end.is_none() || (!shard.is_remote() && !shard.holds_samples()) {
            return Err(shard.not_holding());
        }
        Ok(shard)
    }

    /// The offset tables of the shards in object storage, fetched together
    /// (one exact range each, as many in flight as the budget admits) and
    /// checked to hold the samples the index lists.
    #[cfg(feature = "remote")]
    fn fetch_tables(shards: &mut [Shard]) -> Result<()> {
        let mut jobs = Vec::new();
        let mut which = Vec::new();
        for (s, shard) in shards.iter().enumerate() {
            if let Bytes::Remote { object, .. } = &shard.bytes {
                let table = shard
                    .samples
                    .saturating_add(2)
                    .saturating_mul(4)
                    .min(shard.len);
                jobs.push((std::sync::Arc::clone(object), vec![(0, table)]));
                which.push(s);
            }
        }
        if jobs.is_empty() {
            return Ok(());
        }
        let path = shards[which[0]].path.clone();
        let fetched = zt_remote::runtime::block_on(zt_remote::fetch::ranges_of(jobs))
            .and_then(|r| r)
            .map_err(|e| crate::remote::error(&path, e))?;
        for (s, mut got) in which.into_iter().zip(fetched) {
            let shard = &mut shards[s];
            if let Bytes::Remote { table, .. } = &mut shard.bytes {
                *table = got.pop().unwrap_or_default();
            }
            if !shard.holds_samples() {
                return Err(shard.not_holding());
            }
        }
        Ok(())
    }

    /// Records over all shards.
    pub(crate) fn len(&self) -> u64 {
        *self.starts.last().unwrap_or(&0)
    }

    /// The shard holding record `index` and its sample number there (only
    /// the remote gather's plan asks by record).
    #[cfg(feature = "remote")]
    fn locate(&self, index: u64) -> Result<(&Shard, u64)> {
        let (s, i) = self.shard_of(index)?;
        Ok((&self.shards[s], i))
    }

    /// The shard number holding record `index`, and its sample there.
    fn shard_of(&self, index: u64) -> Result<(usize, u64)> {
        if index >= self.len() {
            return Err(Error::OutOfRange {
                index,
                len: self.len(),
            });
        }
        let s = self.starts.partition_point(|&st| st <= index) - 1;
        Ok((s, index - self.starts[s]))
    }

    /// A record from its column's bytes `value` (sample `i` of `shard`,
    /// at `at`): its element bytes and shape, checked against the encoding.
    #[allow(clippy::too_many_arguments)]
    fn decode_value<'a>(
        encoding: &Encoding,
        ndim: usize,
        itemsize: u64,
        shard: &Shard,
        i: u64,
        value: &'a [u8],
        at: usize,
    ) -> Result<(&'a [u8], [u64; 64], usize)> {
        let mut shape = [0u64; 64];
        let bad = |why: String| shard.bad(at, &format!("sample {i}: {why}"));
        match *encoding {
            Encoding::Fixed { size } => {
                if value.len() as u64 != size {
                    return Err(bad(format!(
                        "{} bytes, the column holds {size}",
                        value.len()
                    )));
                }
                Ok((value, shape, 0))
            }
            Encoding::Bytes => {
                shape[0] = value.len() as u64;
                Ok((value, shape, 1))
            }
            Encoding::ShapedArray | Encoding::DtypedArray { .. } => {
                let mut rest = value;
                if let Encoding::DtypedArray { code } = *encoding {
                    match rest.split_first() {
                        Some((&c, tail)) if c == code => rest = tail,
                        Some((&c, _)) => {
                            return Err(bad(format!(
                                "dtype code {c}, the column's first sample has {code}"
                            )))
                        }
                        None => return Err(bad("an empty ndarray value".into())),
                    }
                }
                let Some((&head, tail)) = rest.split_first() else {
                    return Err(bad("no shape byte".into()));
                };
                let rank = usize::from(head >> 2);
                let width = 1usize << (head & 3);
                if rank != ndim {
                    return Err(bad(format!(
                        "rank {rank}, the column's records have rank {ndim}"
                    )));
                }
                let Some((dims, values)) = tail.split_at_checked(ndim * width) else {
                    return Err(bad("its shape runs past the value".into()));
                };
                let mut elements = 1u64;
                for (d, chunk) in dims.chunks_exact(width).enumerate() {
                    let mut word = [0u8; 8];
                    word[..width].copy_from_slice(chunk);
                    shape[d] = u64::from_le_bytes(word);
                    elements = elements.saturating_mul(shape[d]);
                }
                if elements.checked_mul(itemsize) != Some(values.len() as u64) {
                    return Err(bad(format!(
                        "shape {:?} does not fit its {} value bytes",
                        &shape[..ndim],
                        values.len()
                    )));
                }
                Ok((values, shape, ndim))
            }
        }
    }

    /// True when a shard is read from object storage.
    pub(crate) fn is_remote(&self) -> bool {
        #[cfg(feature = "remote")]
        return self
            .shards
            .iter()
            .any(|s| matches!(s.bytes, Bytes::Remote { .. }));
        #[cfg(not(feature = "remote"))]
        false
    }

    /// The ranges a gather of `idxs` reads from shards in object storage:
    /// per shard read, the object and the samples' spans, with their
    /// positions in `idxs`; and each position's sample start.
    #[cfg(feature = "remote")]
    #[allow(clippy::type_complexity)]
    fn plan(
        &self,
        idxs: &[u64],
    ) -> Result<(
        Vec<zt_remote::fetch::ObjectRanges>,
        Vec<Vec<usize>>,
        Vec<usize>,
    )> {
        let mut by_shard: Vec<Option<(usize, Vec<(u64, u64)>, Vec<usize>)>> =
            (0..self.shards.len()).map(|_| None).collect();
        let mut begins = vec![0usize; idxs.len()];
        for (j, &index) in idxs.iter().enumerate() {
            let (shard, i) = self.locate(index)?;
            if !matches!(shard.bytes, Bytes::Remote { .. }) {
                continue;
            }
            let (begin, end) = shard.span(i)?;
            begins[j] = begin;
            let s = self.starts.partition_point(|&st| st <= index) - 1;
            let entry = by_shard[s].get_or_insert_with(|| (s, Vec::new(), Vec::new()));
            entry.1.push((begin as u64, (end - begin) as u64));
            entry.2.push(j);
        }
        let (mut jobs, mut members) = (Vec::new(), Vec::new());
        for (s, ranges, these) in by_shard.into_iter().flatten() {
            if let Bytes::Remote { object, .. } = &self.shards[s].bytes {
                jobs.push((std::sync::Arc::clone(object), ranges));
                members.push(these);
            }
        }
        Ok((jobs, members, begins))
    }

    /// Start fetching the samples a gather of exactly `idxs` reads from
    /// shards in object storage.
    pub(crate) fn fetch_ahead(&self, idxs: &[u64]) -> Result<()> {
        #[cfg(feature = "remote")]
        {
            let (jobs, _, _) = self.plan(idxs)?;
            if !jobs.is_empty() {
                self.ranged.start(&self.shards[0].path, idxs, jobs)?;
            }
        }
        let _ = idxs;
        Ok(())
    }

    /// Per position of `idxs`, its sample's bytes and start when its shard
    /// is in object storage (fetched together, or taken from the fetch
    /// started ahead), else `None`.
    fn fetched(&self, idxs: &[u64]) -> Result<Vec<Option<Fetched>>> {
        #[cfg_attr(not(feature = "remote"), allow(unused_mut))]
        let mut out: Vec<Option<Fetched>> = (0..idxs.len()).map(|_| None).collect();
        #[cfg(feature = "remote")]
        {
            let (jobs, members, begins) = self.plan(idxs)?;
            if !jobs.is_empty() {
                let got = self
                    .ranged
                    .fetch(&self.shards[0].path, idxs, move || jobs)?;
                for (these, samples) in members.into_iter().zip(got) {
                    for (j, sample) in these.into_iter().zip(samples) {
                        out[j] = Some((sample, begins[j]));
                    }
                }
            }
        }
        Ok(out)
    }

    /// `f` over the records of `idxs`: each one's element bytes and shape,
    /// checked against the encoding, and where a mapped or decompressed
    /// shard holds those bytes (shard number, offset), for [`Mds::copy_runs`].
    fn with_records<R>(
        &self,
        idxs: &[u64],
        f: impl FnOnce(&[Record<'_>], &[Origin]) -> Result<R>,
    ) -> Result<R> {
        let fetched = self.fetched(idxs)?;
        let path = &self.shards[0].path;
        let mut records = crate::reader::try_vec(idxs.len(), path, "a gather")?;
        let mut origins = crate::reader::try_vec(idxs.len(), path, "a gather")?;
        for (&index, sample) in idxs.iter().zip(&fetched) {
            let (s, i) = self.shard_of(index)?;
            let shard = &self.shards[s];
            let (value, at, offset) = match sample {
                Some((sample, begin)) => (shard.column_of(sample, i, *begin)?, *begin, None),
                None => {
                    let (value, begin, offset) = shard.value(i)?;
                    (value, begin, Some(offset))
                }
            };
            let record = Self::decode_value(
                &self.encoding,
                self.ndim,
                self.itemsize,
                shard,
                i,
                value,
                at,
            )?;
            // A record's elements end its value (an array's header comes
            // first), so they start this far into the shard.
            origins.push(offset.map(|o| (s, o + value.len() - record.0.len())));
            records.push(record);
        }
        f(&records, &origins)
    }

    /// `records`' bytes end to end into `dst` (exactly their total), one
    /// copy per run of records lying back to back in one local shard: the
    /// consecutive samples of a shard whose samples are this column alone
    /// (a token dataset), as a block-shuffled batch reads them.
    fn copy_runs(&self, records: &[Record<'_>], origins: &[Origin], dst: &mut [u8]) {
        let mut cursor = 0usize;
        let mut j = 0usize;
        while j < records.len() {
            let mut k = j + 1;
            let mut stop = cursor + records[j].0.len();
            if let Some((s, start)) = origins[j] {
                let mut end = start + records[j].0.len();
                while k < records.len() && origins[k] == Some((s, end)) {
                    end += records[k].0.len();
                    k += 1;
                }
                stop = cursor + (end - start);
                // Every record of the run was cut from this shard's bytes at
                // these offsets, so the run is in bounds.
                dst[cursor..stop].copy_from_slice(&self.shards[s].bytes.get()[start..end]);
            } else {
                dst[cursor..stop].copy_from_slice(records[j].0);
            }
            cursor = stop;
            j = k;
        }
    }

    pub(crate) fn record_lengths(&self, idxs: &[u64]) -> Result<Vec<u64>> {
        self.with_records(idxs, |records, _| {
            Ok(records.iter().map(|r| r.0.len() as u64).collect())
        })
    }

    pub(crate) fn gather_dense(&self, idxs: &[u64], dst: &mut [u8], row: usize) -> Result<()> {
        self.with_records(idxs, |records, origins| {
            if records.iter().any(|(value, ..)| value.len() != row) {
                return Err(Error::invalid("an MDS value is not one row"));
            }
            self.copy_runs(records, origins, &mut dst[..records.len() * row]);
            Ok(())
        })
    }

    pub(crate) fn gather_ragged_into(&self, idxs: &[u64], words: Vec<u64>) -> Result<RaggedBatch> {
        self.with_records(idxs, |records, origins| self.pack(records, origins, words))
    }

    /// Ragged records end to end, with their offsets and shapes.
    fn pack(
        &self,
        records: &[Record<'_>],
        origins: &[Origin],
        mut words: Vec<u64>,
    ) -> Result<RaggedBatch> {
        let path = &self.shards[0].path;
        let total: usize = records.iter().map(|r| r.0.len()).sum();
        words.clear();
        words
            .try_reserve_exact(total.div_ceil(8))
            .map_err(|_| Error::Memory {
                path: path.clone(),
                what: "a gather",
                bytes: total as u64,
            })?;
        words.resize(total.div_ceil(8), 0);
        let mut offsets = crate::reader::try_vec(records.len() + 1, path, "Ragged offsets")?;
        let mut shapes = crate::reader::try_vec(records.len() * self.ndim, path, "Ragged shapes")?;
        offsets.push(0u64);
        // SAFETY: `words` holds `total.div_ceil(8)` initialized u64s.
        let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, total) };
        self.copy_runs(records, origins, bytes);
        let mut cursor = 0u64;
        for (value, shape, ndim) in records {
            cursor += value.len() as u64;
            offsets.push(cursor);
            shapes.extend_from_slice(&shape[..*ndim]);
        }
        Ok(RaggedBatch {
            words,
            len: total,
            offsets,
            shapes,
        })
    }
}

/// `index.json`'s bytes, refused past [`INDEX_MAX_BYTES`].
fn read_index(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let file = zt_fsutil::open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound { path: path.into() },
        _ => Error::io(path, e),
    })?;
    let mut bytes = Vec::new();
    file.take(INDEX_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > INDEX_MAX_BYTES {
        return Err(refuse(
            path,
            format!("past the {INDEX_MAX_BYTES}-byte limit of an index"),
        ));
    }
    Ok(bytes)
}

fn read_u32(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes"))
}

impl Shard {
    fn bad(&self, _at: usize, why: &str) -> Error {
        refuse(&self.path, why.to_string())
    }

    fn is_remote(&self) -> bool {
        #[cfg(feature = "remote")]
        return matches!(self.bytes, Bytes::Remote { .. });
        #[cfg(not(feature = "remote"))]
        false
    }

    /// The shard's table is whole and starts with the index's sample count
    /// (the table's size against the shard's was checked at open).
    fn holds_samples(&self) -> bool {
        let table = self.bytes.get();
        table.len() as u64 >= self.samples.saturating_add(2).saturating_mul(4)
            && u64::from(read_u32(table, 0)) == self.samples
    }

    fn not_holding(&self) -> Error {
        refuse(
            &self.path,
            format!(
                "its header does not hold the {} samples the index lists",
                self.samples
            ),
        )
    }

    /// Sample `i`'s bytes `begin..end` in the shard, checked against its
    /// table and size.
    fn span(&self, i: u64) -> Result<(usize, usize)> {
        let data = self.bytes.get();
        let at = 4 + 4 * i as usize; // i < samples: inside the checked table
        let (begin, end) = (read_u32(data, at) as usize, read_u32(data, at + 4) as usize);
        let table_end = 4 * (self.samples as usize + 2);
        if begin < table_end || begin > end || end as u64 > self.len {
            return Err(self.bad(
                begin,
                &format!(
                    "sample {i}: bytes {begin}..{end} are not in its samples ({table_end}..{})",
                    self.len
                ),
            ));
        }
        Ok((begin, end))
    }

    /// Sample `i`'s bytes of this shard's column, where the sample starts
    /// and where those bytes start (a mapped or decompressed shard).
    fn value(&self, i: u64) -> Result<(&[u8], usize, usize)> {
        let (begin, end) = self.span(i)?;
        let range = self.column_range(&self.bytes.get()[begin..end], i, begin)?;
        let (start, stop) = (begin + range.start, begin + range.end);
        Ok((&self.bytes.get()[start..stop], begin, start))
    }

    /// Sample `i`'s bytes of this shard's column (the sample fetched if the
    /// shard is in object storage), and where the sample starts.
    fn value_owned(&self, i: u64) -> Result<(Vec<u8>, usize)> {
        #[cfg(feature = "remote")]
        if let Bytes::Remote { object, .. } = &self.bytes {
            let (begin, end) = self.span(i)?;
            let sample = object
                .read(begin as u64, (end - begin) as u64)
                .map_err(|e| crate::remote::error(&self.path, e))?;
            return Ok((self.column_of(&sample, i, begin)?.to_vec(), begin));
        }
        let (value, at, _) = self.value(i)?;
        Ok((value.to_vec(), at))
    }

    /// This shard's column in `sample` (sample `i`, at `begin`).
    fn column_of<'a>(&self, sample: &'a [u8], i: u64, begin: usize) -> Result<&'a [u8]> {
        Ok(&sample[self.column_range(sample, i, begin)?])
    }

    /// Where this shard's column lies in `sample` (sample `i`, at `begin`).
    fn column_range(&self, sample: &[u8], i: u64, begin: usize) -> Result<std::ops::Range<usize>> {
        let variable = self.sizes.iter().filter(|s| s.is_none()).count();
        let mut head = 0usize;
        let mut offset = 4 * variable;
        let mut size = 0u64;
        for (c, fixed) in self.sizes.iter().enumerate() {
            let n = match fixed {
                Some(n) => *n,
                None => {
                    if 4 * (head + 1) > sample.len() {
                        return Err(
                            self.bad(begin, &format!("sample {i}: its column sizes run past it"))
                        );
                    }
                    let n = read_u32(sample, 4 * head);
                    head += 1;
                    u64::from(n)
                }
            };
            if c == self.column {
                size = n;
                break;
            }
            offset = offset.saturating_add(n as usize);
        }
        match offset
            .checked_add(size as usize)
            .filter(|&e| e <= sample.len())
        {
            Some(stop) => Ok(offset..stop),
            None => Err(self.bad(
                begin,
                &format!(
                    "sample {i}: its columns run past its {} bytes",
                    sample.len()
                ),
            )),
        }
    }
}
