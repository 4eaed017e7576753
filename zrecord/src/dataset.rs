//! A dataset of many stores read as one: what a cluster build leaves (one
//! store per write task or partition) and what a user concatenates.
//!
//! A *manifest* (a small JSON file, versioned) lists the stores in order,
//! each with its record count and the digest of its header; opened, it is
//! one [`Reader`] whose record `i` is found by a binary search over the
//! stores' first indices, and whose gathers split by store, run each
//! store's own gather (so a remote store's reads coalesce within it), and
//! put the records back in the caller's order.
//!
//! ```json
//! {"format": "zrecord-dataset", "version": 1, "stores": [
//!   {"path": "part-00000", "records": 1000, "digest": "xxh3-128:…"}
//! ]}
//! ```
//!
//! A store's `path` is relative to the manifest's directory unless it is
//! absolute or an object URL. The digest is xxh3-128 of the store's header
//! page (`meta.zr`'s first 4 KiB: record count, shard tails, codec,
//! schema): a store appended to, rebuilt or replaced since the manifest was
//! written is refused (rule `zrecord.DatasetStore`); the record bytes
//! themselves are not hashed (a store is immutable once published).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::json::{self, Value};
use crate::reader::{RaggedBatch, Reader};
use crate::schema::Geometry;

/// The manifest's `format` field.
pub const MANIFEST_FORMAT: &str = "zrecord-dataset";
/// The manifest version this reader writes and reads.
pub const MANIFEST_VERSION: u64 = 1;
/// A manifest is small: one line per store.
const MANIFEST_MAX_BYTES: u64 = 64 << 20;
/// The manifest's lists and objects nest two deep.
const MANIFEST_MAX_DEPTH: usize = 4;

/// Refusals of a manifest, or of a store it lists, cite one of these.
pub mod rules {
    /// The manifest is not a zrecord dataset manifest this reader reads.
    pub const MANIFEST: &str = "zrecord.DatasetManifest";
    /// A listed store is missing, changed since the manifest was written,
    /// or disagrees with the others (geometry, dtype, codec).
    pub const STORE: &str = "zrecord.DatasetStore";
}

/// One store of a dataset, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Where the store is: relative to the manifest's directory, absolute,
    /// or an object URL.
    pub path: String,
    /// Its record count.
    pub records: u64,
    /// `xxh3-128:` and 32 hex digits of its header page.
    pub digest: String,
}

/// A dataset manifest: its stores in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The stores, in the order their records are numbered.
    pub stores: Vec<Entry>,
}

fn refuse(path: &Path, rule: &'static str, reason: impl Into<String>) -> Error {
    Error::Dataset {
        path: path.to_path_buf(),
        rule,
        reason: reason.into(),
    }
}

impl Manifest {
    /// The manifest as JSON text (one store per line; keys in a fixed
    /// order, so equal manifests are equal bytes).
    pub fn encode(&self) -> String {
        let mut out = format!(
            "{{\"format\": \"{MANIFEST_FORMAT}\", \"version\": {MANIFEST_VERSION}, \"stores\": ["
        );
        for (i, e) in self.stores.iter().enumerate() {
            out.push_str(if i == 0 { "\n  " } else { ",\n  " });
            out.push_str(&format!(
                "{{\"path\": {}, \"records\": {}, \"digest\": {}}}",
                json_string(&e.path),
                e.records,
                json_string(&e.digest)
            ));
        }
        out.push_str(if self.stores.is_empty() {
            "]}\n"
        } else {
            "\n]}\n"
        });
        out
    }

    /// Read a manifest's bytes (`path` names it in errors).
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let bad = |reason: String| refuse(path, rules::MANIFEST, reason);
        let value =
            json::decode(bytes, MANIFEST_MAX_DEPTH).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Value::Object(fields) = value else {
            return Err(bad("not a JSON object".into()));
        };
        let field = |name: &str| fields.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
        match field("format") {
            Some(Value::Str(f)) if f == MANIFEST_FORMAT => {}
            other => {
                return Err(bad(format!(
                    "\"format\" is {other:?}, not {MANIFEST_FORMAT:?}"
                )))
            }
        }
        match field("version") {
            Some(Value::Int(v)) if v == &MANIFEST_VERSION.to_string() => {}
            other => {
                return Err(bad(format!(
                    "\"version\" is {other:?}; this reader reads version {MANIFEST_VERSION}"
                )))
            }
        }
        let Some(Value::Array(stores)) = field("stores") else {
            return Err(bad("\"stores\" is not a list".into()));
        };
        let mut entries = Vec::with_capacity(stores.len());
        for (i, store) in stores.iter().enumerate() {
            let Value::Object(store) = store else {
                return Err(bad(format!("store {i} is not an object")));
            };
            let get = |name: &str| store.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
            let (Some(Value::Str(p)), Some(Value::Int(records)), Some(Value::Str(digest))) =
                (get("path"), get("records"), get("digest"))
            else {
                return Err(bad(format!(
                    "store {i} needs \"path\" (text), \"records\" (an integer) and \"digest\" (text)"
                )));
            };
            let records = records
                .parse::<u64>()
                .map_err(|_| bad(format!("store {i}: records {records} is not a count")))?;
            entries.push(Entry {
                path: p.clone(),
                records,
                digest: digest.clone(),
            });
        }
        Ok(Manifest { stores: entries })
    }
}

/// A JSON string literal of `text`.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The stores of an opened dataset and where each one's records start.
pub(crate) struct Many {
    pub(crate) members: Vec<Arc<Reader>>,
    /// `starts[m]`: the first dataset index of store `m`; the last entry
    /// is the dataset's length.
    starts: Vec<u64>,
}

/// Where a gather's records come from: per store, its local indices and
/// their positions in the caller's list.
struct Split {
    member: usize,
    local: Vec<u64>,
    positions: Vec<usize>,
}

impl Many {
    fn split(&self, idxs: &[u64]) -> Result<Vec<Split>> {
        let len = *self.starts.last().unwrap_or(&0);
        let mut splits: Vec<Option<Split>> = (0..self.members.len()).map(|_| None).collect();
        for (position, &index) in idxs.iter().enumerate() {
            if index >= len {
                return Err(Error::OutOfRange { index, len });
            }
            let member = self.starts.partition_point(|&s| s <= index) - 1;
            let split = splits[member].get_or_insert_with(|| Split {
                member,
                local: Vec::new(),
                positions: Vec::new(),
            });
            split.local.push(index - self.starts[member]);
            split.positions.push(position);
        }
        Ok(splits.into_iter().flatten().collect())
    }

    /// True when any store is in object storage.
    pub(crate) fn is_remote(&self) -> bool {
        self.members.iter().any(|m| m.is_remote())
    }

    /// Start each store's part of a gather of `idxs`: the gather splits
    /// the indices the same way, so each store's gather takes exactly the
    /// fetch started here.
    pub(crate) fn fetch_ahead(&self, idxs: &[u64]) -> Result<()> {
        for s in self.split(idxs)? {
            self.members[s.member].fetch_ahead(&s.local)?;
        }
        Ok(())
    }

    pub(crate) fn record_lengths(&self, idxs: &[u64]) -> Result<Vec<u64>> {
        let mut out = vec![0u64; idxs.len()];
        for s in self.split(idxs)? {
            let lengths = self.members[s.member].record_lengths(&s.local)?;
            for (&at, length) in s.positions.iter().zip(lengths) {
                out[at] = length;
            }
        }
        Ok(out)
    }

    pub(crate) fn gather_dense(&self, idxs: &[u64], dst: &mut [u8], row: usize) -> Result<()> {
        for s in self.split(idxs)? {
            let member = &self.members[s.member];
            if s.positions.len() == idxs.len() {
                return member.gather_dense(&s.local, dst); // one store: in place
            }
            let mut rows = crate::reader::try_vec(s.local.len() * row, member.path(), "a gather")?;
            rows.resize(s.local.len() * row, 0u8);
            member.gather_dense(&s.local, &mut rows)?;
            for (j, &at) in s.positions.iter().enumerate() {
                dst[at * row..(at + 1) * row].copy_from_slice(&rows[j * row..(j + 1) * row]);
            }
        }
        Ok(())
    }

    pub(crate) fn gather_ragged_into(
        &self,
        idxs: &[u64],
        words: Vec<u64>,
        ndim: usize,
        path: &Path,
    ) -> Result<RaggedBatch> {
        let splits = self.split(idxs)?;
        if let [only] = splits.as_slice() {
            if only.positions.len() == idxs.len() {
                return self.members[only.member].gather_ragged_into(&only.local, words);
            }
        }
        let batches = splits
            .iter()
            .map(|s| self.members[s.member].gather_ragged(&s.local))
            .collect::<Result<Vec<_>>>()?;
        // Where each output record is: (batch, record in the batch).
        let mut from = vec![(0usize, 0usize); idxs.len()];
        for (b, s) in splits.iter().enumerate() {
            for (j, &at) in s.positions.iter().enumerate() {
                from[at] = (b, j);
            }
        }
        let total: usize = batches.iter().map(|b| b.len).sum();
        let mut words = words;
        words.clear();
        words.resize(total.div_ceil(8), 0);
        let mut offsets = crate::reader::try_vec(idxs.len() + 1, path, "Ragged offsets")?;
        let mut shapes = crate::reader::try_vec(idxs.len() * ndim, path, "Ragged shapes")?;
        offsets.push(0u64);
        // SAFETY: `words` holds `total.div_ceil(8)` initialized u64s, at
        // least `total` bytes.
        let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, total) };
        let mut cursor = 0usize;
        for &(b, j) in &from {
            let batch = &batches[b];
            let (start, end) = (batch.offsets[j] as usize, batch.offsets[j + 1] as usize);
            bytes[cursor..cursor + end - start].copy_from_slice(&batch.values()[start..end]);
            cursor += end - start;
            offsets.push(cursor as u64);
            shapes.extend_from_slice(&batch.shapes[j * ndim..(j + 1) * ndim]);
        }
        Ok(RaggedBatch {
            words,
            len: total,
            offsets,
            shapes,
        })
    }

    pub(crate) fn data_shards(&self) -> usize {
        self.members.iter().map(|m| m.data_shards()).sum()
    }
}

/// Where a manifest's store is: relative paths against the manifest's
/// directory.
fn resolve(manifest: &Path, store: &str) -> PathBuf {
    let as_path = Path::new(store);
    if crate::remote::is_url(as_path) || as_path.is_absolute() {
        return as_path.to_path_buf();
    }
    let text = manifest.to_string_lossy();
    if crate::remote::is_url(manifest) {
        let dir = text.rsplit_once('/').map_or(&*text, |(d, _)| d);
        return PathBuf::from(format!("{dir}/{store}"));
    }
    manifest.parent().unwrap_or(Path::new("")).join(store)
}

/// How a manifest at `manifest` names the store at `store`: relative to
/// the manifest's directory when it lies under it (so the dataset can move
/// as a whole), else as given.
fn relative_to(manifest: &Path, store: &Path) -> String {
    if crate::remote::is_url(manifest) != crate::remote::is_url(store) {
        return store.display().to_string();
    }
    let (m, s) = (manifest.to_string_lossy(), store.to_string_lossy());
    let dir = match m.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/"),
        None => String::new(),
    };
    match s.strip_prefix(dir.as_str()) {
        Some(rest) if !dir.is_empty() && !rest.is_empty() && !rest.starts_with('/') => {
            rest.trim_end_matches('/').to_string()
        }
        _ => store.display().to_string(),
    }
}

/// Open `paths` (stores) as one dataset, in order; every store must have
/// the same geometry (`dense` when given), dtype, item shape and codec.
pub fn open_many(
    paths: &[PathBuf],
    dense: Option<bool>,
    storage_options: &[(String, String)],
) -> Result<Reader> {
    let members = paths
        .iter()
        .map(|p| Reader::open_at(p, dense, storage_options).map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let name = paths.first().cloned().unwrap_or_default();
    assemble(
        name,
        members,
        &paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>(),
        true,
    )
}

/// One reader over readers already open, in order (a mixture's datasets
/// as one index space): they must agree on geometry and dtype (the same
/// type however the schema spells it), not on codec or kind, since each
/// gathers its own records; nothing is reopened or copied.
pub fn concat(readers: Vec<Arc<Reader>>) -> Result<Reader> {
    let names: Vec<String> = readers
        .iter()
        .map(|r| r.path().display().to_string())
        .collect();
    let name = PathBuf::from(format!("[{}]", names.join(", ")));
    assemble(name, readers, &names, false)
}

/// Open the dataset a manifest lists, each store checked against its
/// entry (record count and digest).
pub fn open_manifest(
    path: &Path,
    dense: Option<bool>,
    storage_options: &[(String, String)],
) -> Result<Reader> {
    let bytes = read_manifest(path, storage_options)?;
    let manifest = Manifest::decode(&bytes, path)?;
    let mut members = Vec::with_capacity(manifest.stores.len());
    for entry in &manifest.stores {
        let at = resolve(path, &entry.path);
        let store = Reader::open_at(&at, dense, storage_options).map_err(|e| match e {
            Error::NotFound { .. } => refuse(
                path,
                rules::STORE,
                format!("store {:?} is missing ({})", entry.path, at.display()),
            ),
            other => other,
        })?;
        if store.len() != entry.records || store.header_digest() != entry.digest {
            return Err(refuse(
                path,
                rules::STORE,
                format!(
                    "store {:?} changed since the manifest was written: {} records, digest {} (the manifest: {} records, {})",
                    entry.path,
                    store.len(),
                    store.header_digest(),
                    entry.records,
                    entry.digest
                ),
            ));
        }
        members.push(Arc::new(store));
    }
    let names: Vec<String> = manifest.stores.iter().map(|e| e.path.clone()).collect();
    assemble(path.to_path_buf(), members, &names, true)
}

fn read_manifest(path: &Path, storage_options: &[(String, String)]) -> Result<Vec<u8>> {
    if crate::remote::is_url(path) {
        return crate::remote::read_small(path, MANIFEST_MAX_BYTES, storage_options);
    }
    let file = zt_fsutil::open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound { path: path.into() },
        _ => Error::io(path, e),
    })?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len > MANIFEST_MAX_BYTES {
        return Err(refuse(
            path,
            rules::MANIFEST,
            format!("{len} bytes, past the {MANIFEST_MAX_BYTES}-byte limit of a manifest"),
        ));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    use std::io::Read;
    file.take(MANIFEST_MAX_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(path, e))?;
    Ok(bytes)
}

/// One reader over `members`, after checking they agree (on the codec too
/// when `same_codec`: a manifest's stores are one build's).
fn assemble(
    name: PathBuf,
    members: Vec<Arc<Reader>>,
    names: &[String],
    same_codec: bool,
) -> Result<Reader> {
    let Some(first) = members.first() else {
        return Err(refuse(
            &name,
            rules::MANIFEST,
            "a dataset needs at least one store",
        ));
    };
    for (m, store) in members.iter().enumerate().skip(1) {
        let (a, b) = (first.schema(), store.schema());
        let same_geometry = match (&a.geometry, &b.geometry) {
            (Geometry::Dense { item_shape: x }, Geometry::Dense { item_shape: y }) => x == y,
            (Geometry::Ragged { ndim: x }, Geometry::Ragged { ndim: y }) => x == y,
            _ => false,
        };
        // Across layouts one type has two spellings (`int32`, `<i4`); the
        // typestr tells them apart except for the ml_dtypes types (`|V2`).
        let same_dtype = a.dtype_name == b.dtype_name
            || (!same_codec && a.dtype == b.dtype && !a.dtype.starts_with("|V"));
        if !same_geometry || !same_dtype || (same_codec && first.codec() != store.codec()) {
            return Err(refuse(
                &name,
                rules::STORE,
                format!(
                    "store {:?} ({} {:?}, codec {}) differs from store {:?} ({} {:?}, codec {})",
                    names[m],
                    b.dtype_name,
                    b.geometry,
                    store.codec_name(),
                    names[0],
                    a.dtype_name,
                    a.geometry,
                    first.codec_name()
                ),
            ));
        }
    }
    let mut starts = Vec::with_capacity(members.len() + 1);
    let mut total = 0u64;
    for store in &members {
        starts.push(total);
        total = total
            .checked_add(store.len())
            .ok_or_else(|| refuse(&name, rules::MANIFEST, "the record counts overflow"))?;
    }
    starts.push(total);
    Ok(Reader::many(name, Many { members, starts }, total))
}

/// Write a manifest listing `stores` (in order) at `manifest` without
/// copying a record: each store is opened (checked as any open checks it)
/// for its count and digest. A store under the manifest's directory is
/// named relative to it, any other as given. The
/// manifest is written beside its destination and renamed into place.
pub fn write_manifest(
    stores: &[PathBuf],
    manifest: &Path,
    storage_options: &[(String, String)],
) -> Result<Manifest> {
    let members = stores
        .iter()
        .map(|p| Reader::open_at(p, None, storage_options).map(Arc::new))
        .collect::<Result<Vec<_>>>()?;
    let names: Vec<String> = stores.iter().map(|p| relative_to(manifest, p)).collect();
    let entries = members
        .iter()
        .zip(&names)
        .map(|(r, name)| Entry {
            path: name.clone(),
            records: r.len(),
            digest: r.header_digest(),
        })
        .collect();
    drop(assemble(manifest.to_path_buf(), members, &names, true)?); // they must agree
    let out = Manifest { stores: entries };
    let text = out.encode();
    if crate::remote::is_url(manifest) {
        crate::remote::write_small(manifest, text.as_bytes(), storage_options)?;
    } else {
        write_atomic(manifest, text.as_bytes())?;
    }
    Ok(out)
}

/// `bytes` at `path`, written beside it and renamed into place (a reader
/// finds the old manifest or the new one, never a part).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let partial = path.with_file_name(format!(".{name}.{:016x}.partial", zt_fsutil::random_u64()));
    let written = (|| {
        let mut file = zt_fsutil::create_new(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&partial, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(Error::io(path, e));
    }
    Ok(())
}
