//! Megatron's indexed datasets (`PREFIX.bin` + `PREFIX.idx`, what
//! `megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder` writes
//! and every pretraining corpus in the Megatron world ships) read as a
//! Ragged source of rank 1: record `i` is sequence `i` (or, with
//! [`Unit::Document`], document `i`: its sequences end to end), its tokens
//! copied from the mapped `.bin`.
//!
//! `.idx`, little-endian: `MMIDIDX\0\0`, version u64 (1), dtype code u8
//! (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16), sequence count
//! u64, document count u64, then the sequence lengths (i32, in elements),
//! the sequence pointers (i64, byte offsets into `.bin`) and the document
//! indices (i64: the first sequence of each document, then the count),
//! and for a multimodal dataset one i8 mode per sequence.
//!
//! Nothing is trusted: the counts must fit the file before anything is
//! read, and every record's bytes are checked against `.bin` when it is
//! gathered (the index is read from its mapping, never copied, so opening
//! a corpus of any size costs the same). A refusal cites rule
//! `zrecord.Binidx`.
//!
//! In object storage (`s3://bucket/PREFIX`, `gs://`, `az://`: the feature
//! `remote`) the pair is two objects, opened together: `.idx` is fetched
//! whole (the same count checks run on its bytes) up to
//! `crate::binidx_pages::PAGED_ABOVE` bytes, past it only its header is
//! read (and checked against the object's size) and gathers fetch the
//! pages of its entries they read (`crate::binidx_pages`; each entry
//! checked as above when used), `.bin` is opened by its
//! head and tail (its size and version; an object of up to 1.25 MiB is
//! then in memory) and read by ranges per gather, pinned to that version:
//! every record's span, checked as above, through
//! `crate::ranged` (coalesced, within the process's fetch budget, or
//! taken from a fetch the DataLoader started ahead).

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::reader::RaggedBatch;

/// What a binidx refusal cites.
pub const RULE: &str = "zrecord.Binidx";

const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";
/// Magic, version, dtype code, sequence count, document count.
const HEADER: u64 = 9 + 8 + 1 + 8 + 8;

/// An array of the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Array {
    /// Sequence lengths (i32).
    Lengths = 0,
    /// Sequence pointers (i64).
    Pointers = 1,
    /// Document indices (i64).
    Documents = 2,
}

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// One sequence (`IndexedDataset[i]`).
    Sequence,
    /// One document: its sequences, which lie end to end in `.bin`.
    Document,
}

/// The `.idx` bytes: mapped, fetched whole from object storage, or (a
/// large one in object storage) read by pages as gathers need them.
enum Index {
    Mapped(Mmap),
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    Fetched(Vec<u8>),
    #[cfg(feature = "remote")]
    Paged(crate::binidx_pages::Pages),
}

/// The index entries one gather reads: the whole index, or the pages
/// loaded for the gather.
enum View<'a> {
    Whole(&'a [u8]),
    #[cfg(feature = "remote")]
    Pages(crate::binidx_pages::Pinned),
}

/// Where `.bin`'s tokens are read from.
enum Data {
    /// Mapped (`None` for an empty `.bin`).
    Mapped(Option<Mmap>),
    /// An object read by ranges, and the gathers started ahead on it.
    #[cfg(feature = "remote")]
    Remote {
        bin: std::sync::Arc<zt_remote::RemoteObject>,
        ranged: crate::ranged::Ranged,
    },
}

/// An opened binidx pair.
pub(crate) struct Binidx {
    idx: Index,
    bin: Data,
    /// `.bin`'s size in bytes.
    bin_len: u64,
    bin_path: PathBuf,
    idx_path: PathBuf,
    /// Bytes per token.
    pub(crate) itemsize: u64,
    /// NumPy's `dtype.str` of the tokens.
    pub(crate) typestr: &'static str,
    sequences: u64,
    documents: u64,
    unit: Unit,
}

fn refuse(path: &Path, reason: impl Into<String>) -> Error {
    Error::Dataset {
        path: path.to_path_buf(),
        rule: RULE,
        reason: reason.into(),
    }
}

/// `PREFIX.idx` and `PREFIX.bin` from a prefix or either file's name.
pub fn paths(path: &Path) -> (PathBuf, PathBuf) {
    let text = path.to_string_lossy();
    let prefix = text
        .strip_suffix(".idx")
        .or_else(|| text.strip_suffix(".bin"))
        .unwrap_or(&text);
    (
        PathBuf::from(format!("{prefix}.idx")),
        PathBuf::from(format!("{prefix}.bin")),
    )
}

/// True if `path` names a binidx pair (a `.idx`/`.bin` name, or a local
/// prefix whose `.idx` exists; an object-storage prefix is not probed).
pub fn is_binidx(path: &Path) -> bool {
    let (idx, _) = paths(path);
    path.extension().is_some_and(|e| e == "idx" || e == "bin")
        || (!crate::remote::is_url(path) && idx.is_file())
}

fn map_file(path: &Path) -> Result<(Option<Mmap>, u64)> {
    let file: File = zt_fsutil::open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound { path: path.into() },
        _ => Error::io(path, e),
    })?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len == 0 {
        return Ok((None, 0));
    }
    // SAFETY: read-only mapping of a regular file; a corpus is not
    // rewritten while read (as for loaderx stores, whose readers map too).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    Ok((Some(map), len))
}

/// What an index's first bytes say, checked against its size.
struct Header {
    itemsize: u64,
    typestr: &'static str,
    sequences: u64,
    documents: u64,
}

impl Header {
    /// The header at the start of `head`, whose counts must fit an index of
    /// `idx_len` bytes (`head` may be the index's first bytes only).
    fn parse(head: &[u8], idx_len: u64, idx_path: &Path) -> Result<Header> {
        if idx_len < HEADER || head.len() < HEADER as usize || &head[..9] != MAGIC {
            return Err(refuse(idx_path, "not a Megatron index (no MMIDIDX header)"));
        }
        let version = u64::from_le_bytes(head[9..17].try_into().expect("8 bytes"));
        if version != 1 {
            return Err(refuse(
                idx_path,
                format!("index version {version}; version 1 is read"),
            ));
        }
        let (itemsize, typestr) = match head[17] {
            1 => (1, "|u1"),
            2 => (1, "|i1"),
            3 => (2, "<i2"),
            4 => (4, "<i4"),
            5 => (8, "<i8"),
            6 => (8, "<f8"),
            7 => (4, "<f4"),
            8 => (2, "<u2"),
            code => return Err(refuse(idx_path, format!("unknown dtype code {code}"))),
        };
        let sequences = u64::from_le_bytes(head[18..26].try_into().expect("8 bytes"));
        let documents = u64::from_le_bytes(head[26..34].try_into().expect("8 bytes"));
        // Lengths (4), pointers (8), document indices (8), and optionally
        // one mode byte per sequence: the counts must fit the file.
        let need = sequences
            .checked_mul(12)
            .and_then(|n| n.checked_add(documents.checked_mul(8)?))
            .and_then(|n| n.checked_add(HEADER));
        match need {
            Some(need) if need == idx_len || Some(idx_len) == need.checked_add(sequences) => {}
            _ => {
                return Err(refuse(
                    idx_path,
                    format!(
                        "{sequences} sequences and {documents} document indices do not fit its {idx_len} bytes"
                    ),
                ))
            }
        }
        Ok(Header {
            itemsize,
            typestr,
            sequences,
            documents,
        })
    }

    /// The lengths', pointers' and document indices' `(offset, len)` in
    /// the index (within it once [`Header::parse`] accepted it).
    #[cfg(feature = "remote")]
    fn arrays(&self) -> [(u64, u64); 3] {
        let (s, d) = (self.sequences, self.documents);
        [
            (HEADER, 4 * s),
            (HEADER + 4 * s, 8 * s),
            (HEADER + 12 * s, 8 * d),
        ]
    }
}

impl Binidx {
    /// Open the pair `path` names (local, or an object-storage URL read
    /// with `storage_options`), its records `unit`s.
    pub(crate) fn open(
        path: &Path,
        unit: Unit,
        storage_options: &[(String, String)],
    ) -> Result<Binidx> {
        if crate::remote::is_url(path) {
            #[cfg(feature = "remote")]
            return Self::open_remote(path, unit, storage_options);
            #[cfg(not(feature = "remote"))]
            return Err(crate::remote::unsupported(path));
        }
        let _ = storage_options;
        let (idx_path, bin_path) = paths(path);
        let (idx, _) = map_file(&idx_path)?;
        let idx = idx.ok_or_else(|| refuse(&idx_path, "the index is empty"))?;
        let (bin, bin_len) = map_file(&bin_path)?;
        let header = Header::parse(&idx, idx.len() as u64, &idx_path)?;
        Self::checked(
            Index::Mapped(idx),
            header,
            idx_path,
            Data::Mapped(bin),
            bin_len,
            bin_path,
            unit,
        )
    }

    /// The pair at an object-storage prefix: `.idx` fetched whole (its
    /// open's head and tail reads, then the rest if any) up to
    /// [`crate::binidx_pages::paged_above`] bytes, past it read by pages
    /// per gather; `.bin` opened (size and version) at the same time.
    #[cfg(feature = "remote")]
    fn open_remote(
        path: &Path,
        unit: Unit,
        storage_options: &[(String, String)],
    ) -> Result<Binidx> {
        use std::sync::Arc;
        use zt_remote::RemoteObject;

        let (idx_path, bin_path) = paths(path);
        let config = crate::remote::config(path, storage_options)?;
        let url = |p: &Path| p.to_string_lossy().into_owned();
        let (idx, bin) = std::thread::scope(|scope| {
            let bin = scope.spawn(|| RemoteObject::open(&url(&bin_path), Arc::clone(&config)));
            let idx = RemoteObject::open(&url(&idx_path), Arc::clone(&config));
            (idx, bin.join().expect("opening an object does not panic"))
        });
        let idx = idx.map_err(|e| crate::remote::error(&idx_path, e))?;
        // The header, from what the open already fetched, is checked
        // against the object's size before the rest is read: a lying index
        // is refused without downloading it.
        let head = idx
            .read(0, HEADER.min(idx.len()))
            .map_err(|e| crate::remote::error(&idx_path, e))?;
        let header = Header::parse(&head, idx.len(), &idx_path)?;
        let idx = if idx.len() > crate::binidx_pages::paged_above()? {
            Index::Paged(crate::binidx_pages::Pages::new(
                Arc::new(idx),
                header.arrays(),
            ))
        } else {
            let idx = idx
                .read(0, idx.len())
                .map_err(|e| crate::remote::error(&idx_path, e))?;
            // The bytes read are the object's: the header seen is theirs.
            Header::parse(&idx, idx.len() as u64, &idx_path)?;
            Index::Fetched(idx)
        };
        let bin = bin.map_err(|e| crate::remote::error(&bin_path, e))?;
        let bin_len = bin.len();
        Self::checked(
            idx,
            header,
            idx_path,
            Data::Remote {
                bin: Arc::new(bin),
                ranged: crate::ranged::Ranged::default(),
            },
            bin_len,
            bin_path,
            unit,
        )
    }

    /// The pair over its bytes, once the index's header and counts are
    /// checked against its size.
    fn checked(
        idx: Index,
        header: Header,
        idx_path: PathBuf,
        bin: Data,
        bin_len: u64,
        bin_path: PathBuf,
        unit: Unit,
    ) -> Result<Binidx> {
        let Header {
            itemsize,
            typestr,
            sequences,
            documents,
        } = header;
        let out = Binidx {
            idx,
            bin,
            bin_len,
            bin_path,
            idx_path,
            itemsize,
            typestr,
            sequences,
            documents,
            unit,
        };
        if unit == Unit::Document && out.documents == 0 {
            return Err(refuse(&out.idx_path, "no document indices"));
        }
        Ok(out)
    }

    /// Number of records.
    pub(crate) fn len(&self) -> u64 {
        match self.unit {
            Unit::Sequence => self.sequences,
            Unit::Document => self.documents - 1,
        }
    }

    /// The index entries a gather of `idxs` (in range) reads: the whole
    /// index, or (paged) the pages holding them, fetched together (for
    /// documents, their document indices first, then their sequences').
    fn view(&self, idxs: &[u64]) -> Result<View<'_>> {
        #[cfg(not(feature = "remote"))]
        let _ = idxs;
        match &self.idx {
            Index::Mapped(map) => Ok(View::Whole(map)),
            Index::Fetched(bytes) => Ok(View::Whole(bytes)),
            #[cfg(feature = "remote")]
            Index::Paged(pages) => {
                use crate::binidx_pages::{key, keys};
                let path = &self.idx_path;
                if self.unit == Unit::Sequence {
                    let wanted = idxs
                        .iter()
                        .flat_map(|&i| [key(Array::Lengths, i), key(Array::Pointers, i)]);
                    return Ok(View::Pages(pages.load(path, wanted)?));
                }
                let documents = idxs
                    .iter()
                    .flat_map(|&i| [key(Array::Documents, i), key(Array::Documents, i + 1)]);
                let first = View::Pages(pages.load(path, documents.clone())?);
                // A document whose sequences are out of range loads none:
                // its span refuses it.
                let mut wanted: Vec<_> = documents.collect();
                for &i in idxs {
                    let (a, b) = (self.document(&first, i), self.document(&first, i + 1));
                    if let (Ok(a), Ok(b)) = (u64::try_from(a), u64::try_from(b)) {
                        if a <= b && b <= self.sequences {
                            wanted.extend(keys(Array::Lengths, a, b));
                            wanted.extend(keys(Array::Pointers, a, b));
                        }
                    }
                }
                drop(first);
                Ok(View::Pages(pages.load(path, wanted)?))
            }
        }
    }

    /// Entry `i` of `array` (`N`: its width), from `view`.
    fn entry<const N: usize>(&self, view: &View, array: Array, i: u64) -> [u8; N] {
        let bytes = match view {
            View::Whole(idx) => {
                let at = match array {
                    Array::Lengths => HEADER,
                    Array::Pointers => HEADER + 4 * self.sequences,
                    Array::Documents => HEADER + 12 * self.sequences,
                } + N as u64 * i;
                &idx[at as usize..at as usize + N]
            }
            #[cfg(feature = "remote")]
            View::Pages(pinned) => pinned.entry(array, i),
        };
        bytes.try_into().expect("an entry's width")
    }

    fn length(&self, view: &View, i: u64) -> i32 {
        i32::from_le_bytes(self.entry(view, Array::Lengths, i))
    }

    fn pointer(&self, view: &View, i: u64) -> i64 {
        i64::from_le_bytes(self.entry(view, Array::Pointers, i))
    }

    fn document(&self, view: &View, j: u64) -> i64 {
        i64::from_le_bytes(self.entry(view, Array::Documents, j))
    }

    /// Sequence `i`'s bytes in `.bin`: `(offset, length)`, checked.
    fn sequence_span(&self, view: &View, i: u64) -> Result<(u64, u64)> {
        let (length, pointer) = (self.length(view, i), self.pointer(view, i));
        let bin_len = self.bin_len;
        let span = u64::try_from(length)
            .ok()
            .zip(u64::try_from(pointer).ok())
            .and_then(|(n, at)| Some((at, n.checked_mul(self.itemsize)?)))
            .filter(|&(at, n)| at.checked_add(n).is_some_and(|end| end <= bin_len));
        span.ok_or_else(|| {
            refuse(
                &self.bin_path,
                format!(
                    "sequence {i}: {length} tokens at byte {pointer} do not lie in its {bin_len} bytes"
                ),
            )
        })
    }

    /// Record `i`'s bytes in `.bin`: `(offset, length)`, checked.
    fn span(&self, view: &View, i: u64) -> Result<(u64, u64)> {
        if self.unit == Unit::Sequence {
            return self.sequence_span(view, i);
        }
        let (first, end) = (self.document(view, i), self.document(view, i + 1));
        let range = u64::try_from(first)
            .ok()
            .zip(u64::try_from(end).ok())
            .filter(|&(a, b)| a <= b && b <= self.sequences);
        let Some((first, end)) = range else {
            return Err(refuse(
                &self.idx_path,
                format!(
                    "document {i}: sequences {first}..{end} are not within the {} sequences",
                    self.sequences
                ),
            ));
        };
        if first == end {
            return Ok((0, 0));
        }
        let (start, mut len) = self.sequence_span(view, first)?;
        for s in first + 1..end {
            let (at, n) = self.sequence_span(view, s)?;
            if at != start + len {
                return Err(refuse(
                    &self.idx_path,
                    format!("document {i}: sequence {s} does not follow the one before it in the data file"),
                ));
            }
            len += n;
        }
        Ok((start, len))
    }

    pub(crate) fn record_lengths(&self, idxs: &[u64]) -> Result<Vec<u64>> {
        Ok(self.spans(idxs)?.into_iter().map(|s| s.1).collect())
    }

    fn check(&self, idxs: &[u64]) -> Result<()> {
        let len = self.len();
        match idxs.iter().find(|&&i| i >= len) {
            Some(&index) => Err(Error::OutOfRange { index, len }),
            None => Ok(()),
        }
    }

    /// True when `.bin` is read from object storage.
    pub(crate) fn is_remote(&self) -> bool {
        !matches!(self.bin, Data::Mapped(_))
    }

    /// The checked spans of `idxs` in `.bin`.
    fn spans(&self, idxs: &[u64]) -> Result<Vec<(u64, u64)>> {
        self.check(idxs)?;
        let view = self.view(idxs)?;
        idxs.iter().map(|&i| self.span(&view, i)).collect()
    }

    /// Start fetching the tokens a gather of exactly `idxs` reads (object
    /// storage; nothing to do for a mapped `.bin`).
    pub(crate) fn fetch_ahead(&self, idxs: &[u64]) -> Result<()> {
        #[cfg(feature = "remote")]
        if let Data::Remote { bin, ranged } = &self.bin {
            let spans = self.spans(idxs)?;
            return ranged.start(
                &self.bin_path,
                idxs,
                vec![(std::sync::Arc::clone(bin), spans)],
            );
        }
        let _ = idxs;
        Ok(())
    }

    pub(crate) fn gather_ragged_into(
        &self,
        idxs: &[u64],
        mut words: Vec<u64>,
    ) -> Result<RaggedBatch> {
        let spans = self.spans(idxs)?;
        let total: u64 = spans.iter().map(|s| s.1).sum();
        let total =
            usize::try_from(total).map_err(|_| Error::invalid("a gather larger than memory"))?;
        // Object storage: every span fetched now (or taken from the fetch
        // started ahead), one buffer per span.
        let fetched: Option<Vec<Vec<u8>>> = match &self.bin {
            Data::Mapped(_) => None,
            #[cfg(feature = "remote")]
            Data::Remote { bin, ranged } => {
                let mut got = ranged.fetch(&self.bin_path, idxs, || {
                    vec![(std::sync::Arc::clone(bin), spans.clone())]
                })?;
                let got = got.pop().unwrap_or_default();
                if got.len() != spans.len()
                    || got.iter().zip(&spans).any(|(g, s)| g.len() as u64 != s.1)
                {
                    return Err(Error::invalid("a fetch returned other ranges than asked"));
                }
                Some(got)
            }
        };
        words.clear();
        words
            .try_reserve_exact(total.div_ceil(8))
            .map_err(|_| Error::Memory {
                path: self.bin_path.clone(),
                what: "a gather",
                bytes: total as u64,
            })?;
        words.resize(total.div_ceil(8), 0);
        let mut offsets = crate::reader::try_vec(idxs.len() + 1, &self.bin_path, "Ragged offsets")?;
        let mut shapes = crate::reader::try_vec(idxs.len(), &self.bin_path, "Ragged shapes")?;
        offsets.push(0);
        // SAFETY: `words` holds `total.div_ceil(8)` initialized u64s.
        let bytes = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, total) };
        let data = match &self.bin {
            Data::Mapped(map) => map.as_deref().unwrap_or(&[]),
            #[cfg(feature = "remote")]
            Data::Remote { .. } => &[],
        };
        let mut cursor = 0usize;
        for (j, &(at, n)) in spans.iter().enumerate() {
            let (at, n) = (at as usize, n as usize);
            let record = match &fetched {
                Some(got) => &got[j][..],
                None => &data[at..at + n],
            };
            bytes[cursor..cursor + n].copy_from_slice(record);
            cursor += n;
            offsets.push(cursor as u64);
            shapes.push((n as u64) / self.itemsize);
        }
        Ok(RaggedBatch {
            words,
            len: total,
            offsets,
            shapes,
        })
    }
}
