//! NumPy `.npy` and `.npz`.
//!
//! `.npy` is a preamble, a Python-dict header (parsed in `header.rs`) and
//! the raw array. Little-endian data is served zero-copy (C order as is,
//! Fortran order through element strides); big-endian data is byte-swapped
//! on demand. Arrays of other dtypes numpy reads without unpickling
//! (structured, subarray, string, void, datetime) are read as their bytes,
//! layout [`RECORD_LAYOUT`], which the Python side views through the same
//! numpy dtype. Object arrays are pickles and are never loaded: a lone
//! `.npy` of one is refused, an `.npz` member is listed in the archive's
//! `npz.skipped` attribute and the rest of the archive reads.
//!
//! `.npz` is a zip of `.npy` members (read by [`crate::zip`]). Stored members are
//! file ranges like a lone `.npy`; deflated members are inflated on demand,
//! never past the size their header declares, and checked against the
//! CRC-32 in the central directory.

mod header;
pub mod rules;
use crate::zip;
use zt_core::Rule;

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;

use zt_core::catalog::{
    ByteSwapped, Catalog, Check, CheckFailed, Decode, Object, Part, Payload, Value,
};
use zt_core::dtype::{f_strides, num_elements, DType};
use zt_core::error::{Context, Error, Result};
use zt_core::format::{Format, OpenInput, Probe};
use zt_core::inputs::{InputMeta, Inputs};
use zt_core::limits::Limits;
use zt_core::publish::publish_reading;
use zt_core::store::Store;
use zt_core::write::{FormatWriter, TensorIn, WriteOptions, WriterCaps};

pub use header::{descr_for, parse_descr};
pub use rules::{NPZ_RULES, RULES};

/// The `.npy` plugin: one array per file, named after the file's stem.
pub struct Npy;

/// The `.npz` plugin: a zip of `.npy` members, named as `numpy.load` names
/// them (the member name without `.npy`).
pub struct Npz;

/// The NumPy plugin: `.npy` (its own magic) and `.npz` (a zip, tried after
/// PyTorch's zips, which are more specific), with their writers.
pub static PLUGIN: zt_core::Plugin = zt_core::Plugin {
    name: "npy",
    readers: &[
        zt_core::Reader {
            format: &Npy,
            detect_rank: 35,
        },
        zt_core::Reader {
            format: &Npz,
            detect_rank: 50,
        },
    ],
    writers: &[&NpzWriter, &NpyWriter],
    rules: &[("npy", RULES), ("npz", NPZ_RULES)],
    checkpoints: &[],
};

impl Format for Npy {
    fn name(&self) -> &'static str {
        "npy"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["npy"]
    }

    /// The magic, a known major version, a header that fits in the file
    /// and opens a dict.
    fn sniff(&self, p: &Probe<'_>) -> bool {
        let Some(pre) = p.head.get(..8) else {
            return false;
        };
        let Ok(pre) = header::preamble(&Context::default(), pre) else {
            return false;
        };
        let prefix = pre.prefix_len as usize;
        let Some(bytes) = p.head.get(..prefix + 1) else {
            return false;
        };
        let hlen = header::header_len(&pre, bytes);
        pre.prefix_len.saturating_add(hlen) <= p.len && bytes[prefix] == b'{'
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let store = input.store;
        let ctx = input.ctx();
        let name = store
            .path()
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut reader = StoreReader::new(store, 0, store.len());
        let layout = read_layout(&mut reader, store.len(), &ctx, input.limits)?;
        let payload = raw_payload(store, layout.data_offset, &layout);
        Ok(Catalog {
            objects: vec![layout.object(name, payload)],
            ..Catalog::default()
        })
    }

    /// Fuzz target `numpy` (npy and npz on the same bytes): the npy header
    /// parser (seeds written by numpy).
    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(zt_core::FuzzTarget::new("numpy", &["fuzz/seeds/numpy"]))
    }
}

impl Format for Npz {
    fn name(&self) -> &'static str {
        "npz"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["npz"]
    }

    /// A zip whose first member is a `.npy` (numpy writes members in
    /// order), and not a PyTorch checkpoint (`.../data.pkl`); or an empty
    /// zip with the `.npz` extension (`np.savez` of nothing).
    fn sniff(&self, p: &Probe<'_>) -> bool {
        if p.extension == "npz" && p.head.starts_with(b"PK\x05\x06") {
            return true;
        }
        if !p.head.starts_with(b"PK\x03\x04") {
            return false;
        }
        let name_len = p
            .head
            .get(26..28)
            .map(|b| usize::from(b[0]) | usize::from(b[1]) << 8);
        let first = name_len.and_then(|n| p.head.get(30..30 + n));
        let torch = p
            .tail
            .windows(8)
            .enumerate()
            .any(|(i, w)| w == b"data.pkl" && p.tail.get(i + 8..i + 12) != Some(b".npy"));
        first.is_some_and(|name| name.ends_with(b".npy")) && !torch
    }

    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        let store = input.store;
        let ctx = input.ctx();
        let limits = input.limits;
        let entries = zip::read_entries(store, &ctx, limits)?;
        let mut objects = Vec::new();
        let mut checks: Vec<(usize, Arc<dyn Check>)> = Vec::new();
        let mut skipped = Vec::new();
        // numpy.load exposes only members ending in `.npy`, under the name
        // without the suffix; other members (and directories) are ignored.
        for entry in &entries {
            let Some(name) = entry.name.strip_suffix(".npy") else {
                continue;
            };
            limits.check_tensors(&ctx, (objects.len() + skipped.len()) as u64 + 1)?;
            match open_member(store, entry, name, &ctx, limits) {
                Ok(object) => {
                    // A deflated member's CRC is checked as it inflates; a
                    // stored one's at its first read (numpy.load checks both).
                    if entry.method == 0 {
                        let crc = MemberCrc {
                            store: Arc::clone(store),
                            offset: entry.data_start,
                            len: entry.compressed,
                            crc: entry.crc,
                            member: entry.name.clone(),
                        };
                        checks.push((objects.len(), Arc::new(crc)));
                    }
                    objects.push(object)
                }
                // A member zt does not read (an object array: a pickle)
                // does not refuse the archive; it is listed instead, as
                // HDF5's unread datasets are in `h5.skipped`.
                Err(Error::UnsupportedDType { dtype, .. }) => skipped.push(Value::Map(vec![
                    ("name".into(), Value::Str(name.to_string())),
                    (
                        "reason".into(),
                        Value::Str(format!("unsupported dtype {dtype}")),
                    ),
                ])),
                Err(e) => return Err(e),
            }
        }
        let mut attributes = Vec::new();
        if !skipped.is_empty() {
            attributes.push(("npz.skipped".into(), Value::List(skipped)));
        }
        Ok(Catalog {
            objects,
            attributes,
            checks,
            ..Catalog::default()
        })
    }

    /// Fuzz target `numpy` (npy and npz on the same bytes): the zip reader with
    /// its members' npy headers, deflate and CRC-32 (seeds written by numpy).
    fn fuzz(&self) -> Option<zt_core::FuzzTarget> {
        Some(zt_core::FuzzTarget::new("numpy", &["fuzz/seeds/numpy"]))
    }
}

/// What `rx` receives until every sender is gone, each waited for by
/// spinning a short while before sleeping: the pool thread hashing a piece
/// started with this one and is about to finish, and waking this thread
/// from a sleep cost more than the wait (members are checked one after
/// another, so the cost is paid once per member).
fn arrivals<T>(rx: &std::sync::mpsc::Receiver<T>) -> impl Iterator<Item = T> + '_ {
    use std::sync::mpsc::TryRecvError;
    std::iter::from_fn(move || {
        let spin_until = std::time::Instant::now() + SPIN;
        loop {
            match rx.try_recv() {
                Ok(v) => return Some(v),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) if std::time::Instant::now() < spin_until => {
                    std::hint::spin_loop()
                }
                Err(TryRecvError::Empty) => return rx.recv().ok(),
            }
        }
    })
}

/// How long [`arrivals`] spins before it sleeps.
const SPIN: std::time::Duration = std::time::Duration::from_micros(200);

/// The least a CRC piece is: 4 MiB take a fraction of a millisecond, many
/// times what handing a piece to a pool thread costs.
const CRC_PIECE: u64 = 4 << 20;

/// The CRC-32 of a stored member (its npy header and data), as
/// `numpy.load`'s zipfile checks it; run by the source at the member's
/// first read.
#[derive(Clone, Debug)]
struct MemberCrc {
    store: Arc<Store>,
    offset: u64,
    len: u64,
    crc: u32,
    member: String,
}

impl MemberCrc {
    /// The CRC-32 state of the member's bytes `from..to`, read 8 MiB at a
    /// time: a positional or remote store never buffers the whole member.
    fn hash_range(
        &self,
        from: u64,
        to: u64,
    ) -> std::result::Result<crc32fast::Hasher, CheckFailed> {
        let mut hasher = crc32fast::Hasher::new();
        let mut at = from;
        while at < to {
            let n = (to - at).min(8 << 20);
            let bytes = self
                .store
                .read(self.offset + at, n)
                .map_err(|e| CheckFailed {
                    // A member the store cannot give back cites the
                    // store's rule (a file that shrank is truncated).
                    rule: e.rule().unwrap_or(rules::NPZ_CRC),
                    reason: e.to_string(),
                })?;
            hasher.update(&bytes);
            at += n;
        }
        Ok(hasher)
    }
}

impl Check for MemberCrc {
    fn check(&self) -> std::result::Result<(), CheckFailed> {
        // A large member is hashed in contiguous pieces, one a core (the
        // check is a pass over every byte before the first read returns);
        // CRC-32 combines, so the pieces' states joined in order are the
        // whole member's. Pieces 1.. go to rayon's pool, whose threads
        // outlive the check (members are checked one by one as each is
        // first read, and a thread spawned per member cost more than the
        // member's hash); this thread hashes piece 0 meanwhile, so it is
        // working while a pool thread wakes, then collects the rest.
        let threads = zt_core::copy::threads_for_pieces(self.len, CRC_PIECE) as u64;
        let step = self.len.div_ceil(threads);
        let len = self.len;
        let range = move |i: u64| (i * step, ((i + 1) * step).min(len));
        let pieces: Vec<Option<_>> = if threads > 1 && rayon::current_thread_index().is_some() {
            // Checked on one of rayon's own threads (inside a parallel job):
            // waiting there for pieces handed to the pool could hold every
            // pool thread, so rayon splits the work itself.
            (0..threads)
                .into_par_iter()
                .map(|i| {
                    let (from, to) = range(i);
                    Some(self.hash_range(from, to))
                })
                .collect()
        } else {
            let (tx, rx) = std::sync::mpsc::channel();
            for i in 1..threads {
                let (me, tx) = (self.clone(), tx.clone());
                rayon::spawn(move || {
                    let (from, to) = range(i);
                    // The receiver outlives every sender: this cannot fail.
                    let _ = tx.send((i, me.hash_range(from, to)));
                });
            }
            drop(tx);
            let (from, to) = range(0);
            let mut pieces = vec![None; threads as usize];
            pieces[0] = Some(self.hash_range(from, to));
            for (i, piece) in arrivals(&rx) {
                pieces[i as usize] = Some(piece);
            }
            pieces
        };
        let mut whole = crc32fast::Hasher::new();
        for piece in pieces {
            // Never missing in practice (a panic in a spawned task aborts
            // under rayon's default handler); refused rather than assumed.
            let piece = piece.unwrap_or_else(|| {
                Err(CheckFailed {
                    rule: rules::NPZ_CRC,
                    reason: format!("member {:?}: a CRC-32 piece was not hashed", self.member),
                })
            });
            whole.combine(&piece?);
        }
        let actual = whole.finalize();
        if actual == self.crc {
            Ok(())
        } else {
            Err(CheckFailed {
                rule: rules::NPZ_CRC,
                reason: format!(
                    "member {:?}: bad CRC-32 {actual:#010x}, the archive says {:#010x}",
                    self.member, self.crc
                ),
            })
        }
    }

    /// Over object storage the check would fetch each member twice (the
    /// CRC pass, then the read): there `verify` checks it, reads do not.
    fn on_read(&self) -> bool {
        !self.store.is_remote()
    }

    /// The member's bytes and their CRC-32: a copy of the array hashes it
    /// as it copies (`zt_core::copy`) instead of reading it twice.
    fn crc32(&self) -> Option<zt_core::catalog::Crc32Range> {
        Some(zt_core::catalog::Crc32Range {
            offset: self.offset,
            len: self.len,
            crc: self.crc,
        })
    }
}

/// Build the object for one `.npy` member of an archive.
fn open_member(
    store: &Arc<Store>,
    entry: &zip::Entry,
    name: &str,
    ctx: &Context,
    limits: &Limits,
) -> Result<Object> {
    let mctx = ctx.clone().tensor(name).at(entry.local_offset);
    if entry.encrypted() {
        return Err(Error::Unsupported {
            rule: rules::NPZ_MEMBER,
            ctx: mctx,
            reason: format!("member {:?} is encrypted", entry.name),
        });
    }
    let mut raw = StoreReader::new(store, entry.data_start, entry.compressed);
    match entry.method {
        0 => {
            if entry.compressed != entry.uncompressed {
                return Err(Error::header(
                    mctx,
                    rules::NPZ_MEMBER,
                    format!(
                        "stored member {:?} declares {} compressed and {} uncompressed bytes",
                        entry.name, entry.compressed, entry.uncompressed
                    ),
                ));
            }
            let layout = read_layout(&mut raw, entry.uncompressed, &mctx, limits)?;
            let payload = raw_payload(store, entry.data_start + layout.data_offset, &layout);
            Ok(layout.object(name.to_string(), payload))
        }
        8 => {
            // Inflate only as far as the header; the data is inflated when
            // asked for.
            let mut inflater = flate2::read::DeflateDecoder::new(raw);
            let layout = read_layout(&mut inflater, entry.uncompressed, &mctx, limits)?;
            limits.check_decoded(&mctx, layout.data_len)?;
            let decoder = Inflate {
                store: Arc::clone(store),
                offset: entry.data_start,
                compressed: entry.compressed,
                header_len: layout.data_offset,
                data_len: layout.data_len,
                crc: entry.crc,
                swap_width: layout.swap_width(),
            };
            let payload = Payload::Decoded {
                decoder: Arc::new(decoder),
                decoded_len: layout.data_len,
            };
            Ok(layout.object(name.to_string(), payload))
        }
        method => Err(Error::Unsupported {
            rule: rules::NPZ_MEMBER,
            ctx: mctx,
            reason: format!(
                "member {:?} uses zip compression method {method}; only stored (0) and deflate (8) are read",
                entry.name
            ),
        }),
    }
}

/// What one `.npy` stream holds: its header and where its data is,
/// relative to the start of the stream.
#[derive(Debug)]
struct Layout {
    header: header::Header,
    data_offset: u64,
    data_len: u64,
}

impl Layout {
    /// Bytes per swapped unit; 1 when the data is little-endian already.
    fn swap_width(&self) -> usize {
        if self.header.swap {
            self.header.dtype.swap_width() as usize
        } else {
            1
        }
    }

    /// The dense object, with Fortran-order strides when the data is stored
    /// column-major (the bytes stay as stored; `PartRef::bytes` gathers
    /// them into C order).
    fn object(self, name: String, payload: Payload) -> Object {
        let h = self.header;
        if let Some(record) = h.record {
            return record_object(name, h.shape, h.fortran_order, record, payload);
        }
        let mut object = Object::dense(name, h.dtype, h.shape, payload);
        if h.fortran_order {
            let part = &mut object.parts[0];
            part.strides = Some(f_strides(&part.shape));
        }
        object
    }
}

/// The layout of an array whose numpy dtype zt has no element type for
/// (structured, subarray, strings, datetimes): see `record_object`.
pub const RECORD_LAYOUT: &str = "npy.descr/1";

/// An array of a numpy dtype zt reads as bytes: layout [`RECORD_LAYOUT`],
/// the array's shape, attributes `descr` (the header's descr as a Python
/// literal) and `itemsize`, and one part `data`, `u8` of shape
/// `shape + [itemsize]` (Fortran-ordered arrays through strides), which
/// `zt`'s Python side views as `numpy.lib.format.descr_to_dtype(descr)`:
/// the array `numpy.load` returns, over the same bytes.
fn record_object(
    name: String,
    shape: Vec<u64>,
    fortran_order: bool,
    record: header::Record,
    payload: Payload,
) -> Object {
    let mut part_shape = shape.clone();
    part_shape.push(record.itemsize);
    let strides = fortran_order.then(|| {
        let mut strides = Vec::with_capacity(part_shape.len());
        let mut step = record.itemsize as i64;
        for &d in &shape {
            strides.push(step);
            step = step.saturating_mul(d.max(1) as i64);
        }
        strides.push(1);
        strides
    });
    Object {
        name,
        shape,
        layout: RECORD_LAYOUT.into(),
        parts: vec![Part {
            name: "data".into(),
            dtype: DType::U8,
            shape: part_shape,
            strides,
            payload,
        }],
        attributes: vec![
            ("descr".into(), Value::Str(record.descr)),
            ("itemsize".into(), Value::Int(record.itemsize as i64)),
        ],
    }
}

/// The payload for data that lies as raw bytes at `offset` in `store`:
/// the range itself when little-endian, a byte-swapping decoder otherwise.
fn raw_payload(store: &Arc<Store>, offset: u64, layout: &Layout) -> Payload {
    match layout.swap_width() {
        1 => Payload::Stored {
            store: Arc::clone(store),
            offset,
            len: layout.data_len,
        },
        width => Payload::Decoded {
            decoder: Arc::new(ByteSwapped {
                store: Arc::clone(store),
                offset,
                len: layout.data_len,
                width,
            }),
            decoded_len: layout.data_len,
        },
    }
}

/// Read and check a `.npy` stream's preamble and header from `src`, whose
/// total length is `total` bytes (the file, or the member's declared
/// uncompressed size). The data must fill the rest exactly: less is
/// [`Error::Truncated`], more is [`Error::Range`].
fn read_layout(src: &mut dyn Read, total: u64, ctx: &Context, limits: &Limits) -> Result<Layout> {
    let need = |what: &'static str, needed: u64, at: u64| {
        if total.saturating_sub(at) < needed {
            Err(Error::Truncated {
                rule: Rule::TRUNCATED,
                ctx: ctx.clone().at(at),
                what,
                needed,
                available: total.saturating_sub(at),
            })
        } else {
            Ok(())
        }
    };
    let mut pre = [0u8; 12];
    need("npy preamble", 10, 0)?;
    read_full(src, &mut pre[..10], ctx, "npy preamble")?;
    let p = header::preamble(ctx, &pre)?;
    need("npy preamble", p.prefix_len, 0)?;
    read_full(
        src,
        &mut pre[10..p.prefix_len as usize],
        ctx,
        "npy preamble",
    )?;
    let hlen = header::header_len(&p, &pre);
    limits.check_header(ctx, hlen)?;
    need("npy header", hlen, p.prefix_len)?;
    let mut text = vec![0u8; hlen as usize];
    read_full(src, &mut text, ctx, "npy header")?;
    let header = header::parse(ctx, &text, p.major, limits)?;

    let data_offset = p.prefix_len + hlen;
    let data_len = num_elements(&header.shape)
        .and_then(|n| match &header.record {
            Some(r) => n.checked_mul(r.itemsize),
            None => header.dtype.nbytes(n),
        })
        .ok_or_else(|| Error::Overflow {
            rule: Rule::OVERFLOW,
            ctx: ctx.clone(),
            what: "npy data size",
        })?;
    need("npy data", data_len, data_offset)?;
    let extra = total - data_offset - data_len;
    if extra > 0 {
        return Err(Error::range(
            ctx.clone().at(data_offset + data_len),
            rules::SIZE,
            format!(
                "shape {:?} of {} needs {data_len} bytes; {extra} more follow",
                header.shape, header.dtype
            ),
        ));
    }
    Ok(Layout {
        header,
        data_offset,
        data_len,
    })
}

/// Fill `buf` from `src`; a stream that ends first is a decode error (the
/// lengths were checked against the declared size before reading).
fn read_full(src: &mut dyn Read, buf: &mut [u8], ctx: &Context, what: &str) -> Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        match src.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(Error::Decode {
                    rule: rules::NPZ_INFLATE,
                    ctx: ctx.clone(),
                    reason: format!("{what}: stream ends after {filled} of {} bytes", buf.len()),
                })
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(from_io(e, ctx, what)),
        }
    }
    Ok(())
}

/// Recover our own error from a [`StoreReader`], or describe a deflate
/// error as a decode failure.
fn from_io(e: io::Error, ctx: &Context, what: &str) -> Error {
    let message = e.to_string();
    match e.into_inner().map(|inner| inner.downcast::<Error>()) {
        Some(Ok(ours)) => *ours,
        _ => Error::Decode {
            rule: rules::NPZ_INFLATE,
            ctx: ctx.clone(),
            reason: format!("{what}: {message}"),
        },
    }
}

/// `Read` over `[offset, offset + len)` of a store, in bounded chunks, so
/// a positional store never reads more than a buffer's worth at a time.
struct StoreReader<'a> {
    store: &'a Store,
    pos: u64,
    end: u64,
}

impl<'a> StoreReader<'a> {
    fn new(store: &'a Store, offset: u64, len: u64) -> Self {
        StoreReader {
            store,
            pos: offset,
            end: offset.saturating_add(len),
        }
    }
}

impl Read for StoreReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (buf.len() as u64).min(self.end - self.pos);
        if n == 0 {
            return Ok(0);
        }
        let bytes = self.store.read(self.pos, n).map_err(io::Error::other)?;
        buf[..n as usize].copy_from_slice(&bytes);
        self.pos += n;
        Ok(n as usize)
    }
}

/// A deflated `.npz` member: inflate it, skip the npy header, return
/// exactly the declared data bytes, and check the member's CRC-32.
#[derive(Debug)]
struct Inflate {
    store: Arc<Store>,
    /// Offset of the compressed data.
    offset: u64,
    /// Compressed length.
    compressed: u64,
    /// Bytes of npy preamble and header before the data.
    header_len: u64,
    /// Bytes of data the header declares.
    data_len: u64,
    /// CRC-32 of the whole inflated member.
    crc: u32,
    /// Swap unit for big-endian data; 1 for none.
    swap_width: usize,
}

impl Decode for Inflate {
    fn decode(&self, limits: &Limits) -> Result<Vec<u8>> {
        let ctx = self.store.ctx().at(self.offset);
        limits.check_decoded(&ctx, self.data_len)?;
        // The header length was checked against `Limits::header_bytes` when
        // the member was opened.
        let raw = StoreReader::new(&self.store, self.offset, self.compressed);
        let mut inflater = flate2::read::DeflateDecoder::new(raw);
        let mut crc = crc32fast::Hasher::new();
        let mut head = vec![0u8; self.header_len as usize];
        read_full(&mut inflater, &mut head, &ctx, "deflated npy header")?;
        crc.update(&head);
        let mut out = inflate_exact(&mut inflater, self.data_len, self.compressed, &ctx)?;
        crc.update(&out);
        let mut probe = [0u8; 1];
        let more = loop {
            match inflater.read(&mut probe) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(from_io(e, &ctx, "deflated npy data")),
            }
        };
        if more != 0 {
            return Err(Error::Decode {
                rule: rules::NPZ_INFLATE,
                ctx,
                reason: format!(
                    "member inflates past its declared {} bytes",
                    self.header_len + self.data_len
                ),
            });
        }
        let actual = crc.finalize();
        if actual != self.crc {
            return Err(Error::Decode {
                rule: rules::NPZ_INFLATE,
                ctx,
                reason: format!(
                    "CRC-32 {actual:#010x} does not match the directory's {:#010x}",
                    self.crc
                ),
            });
        }
        zt_core::buffer::swap_units(&mut out, self.swap_width);
        Ok(out)
    }

    fn describe(&self) -> &'static str {
        "deflate"
    }
}

/// Inflate exactly `len` bytes. The buffer grows with what the stream
/// really yields and never past `len`, so a member that declares a huge
/// size but inflates to little costs little; a member that inflates past
/// `len` is caught by the caller's one-byte probe, not by allocating.
fn inflate_exact(src: &mut dyn Read, len: u64, compressed: u64, ctx: &Context) -> Result<Vec<u8>> {
    let len = usize::try_from(len).map_err(|_| Error::Overflow {
        rule: Rule::OVERFLOW,
        ctx: ctx.clone(),
        what: "decoded size",
    })?;
    // Array data rarely deflates better than 4:1; start there (at least
    // 1 MiB) so honest members need one allocation, then double.
    let first = usize::try_from(compressed.saturating_mul(4))
        .unwrap_or(usize::MAX)
        .max(1 << 20);
    crate::zip::read_exact_growing(src, len, first).map_err(|short| match short {
        crate::zip::ShortRead::Ended(filled) => Error::Decode {
            rule: rules::NPZ_INFLATE,
            ctx: ctx.clone(),
            reason: format!("deflate stream ends after {filled} of {len} data bytes"),
        },
        crate::zip::ShortRead::Io(e) => from_io(e, ctx, "deflated npy data"),
        crate::zip::ShortRead::Memory(bytes) => Error::Memory {
            ctx: ctx.clone(),
            what: "an inflated npz member",
            bytes: bytes as u64,
        },
    })
}

/// The npy preamble and header for `tensor`, after checking numpy can hold
/// its dtype and its shape's size is representable.
fn npy_header(ctx: &Context, tensor: InputMeta<'_>) -> Result<Vec<u8>> {
    let descr = descr_for(tensor.dtype).ok_or_else(|| Error::Write {
        rule: Rule::WRITE_DTYPE,
        ctx: ctx.clone().tensor(tensor.name),
        reason: format!(
            "numpy has no builtin dtype for {}; convert it first",
            tensor.dtype
        ),
    })?;
    tensor.nbytes(ctx)?;
    Ok(header::encode(descr, tensor.shape))
}

/// Write one array as a `.npy` file exactly as numpy 2.x's `np.save` does
/// (C order, little-endian, header padded to 64 bytes). The name of
/// `tensor` is not stored. Returns the bytes written.
pub fn write_npy(path: &Path, tensor: &TensorIn<'_>) -> Result<u64> {
    write_npy_input(path, &std::slice::from_ref(tensor), 0, true)
}

/// [`write_npy`] of tensor `i` of `tensors`, fetched as it is written;
/// fsynced before its rename when `durable`.
fn write_npy_input(path: &Path, tensors: &dyn Inputs, i: usize, durable: bool) -> Result<u64> {
    let ctx = Context::file(path);
    let header = npy_header(&ctx, tensors.meta(i))?;
    publish_reading(path, durable, |w| {
        let data = tensors.fetch(i, &ctx)?;
        w.write_all(&header)
            .and_then(|()| w.write_all(&data))
            .map_err(|e| Error::io(path, e))
    })
}

/// Write arrays as an uncompressed `.npz` laid out like numpy's `np.savez`
/// (members `<name>.npy` in the given order, zip64 local headers, CRC-32 in
/// every header). Returns the bytes written.
pub fn write_npz(path: &Path, tensors: &[TensorIn<'_>]) -> Result<u64> {
    write_npz_inputs(path, &tensors, true)
}

/// [`write_npz`] of tensors fetched one at a time, each as its member is
/// written (its CRC-32 goes in the local header before its bytes) and
/// released after; fsynced before its rename when `durable`.
fn write_npz_inputs(path: &Path, tensors: &dyn Inputs, durable: bool) -> Result<u64> {
    let ctx = Context::file(path);
    let mut seen = std::collections::HashSet::with_capacity(tensors.len());
    let headers = (0..tensors.len())
        .map(|i| {
            let t = tensors.meta(i);
            if !seen.insert(t.name) {
                return Err(Error::DuplicateName {
                    ctx: ctx.clone().tensor(t.name),
                });
            }
            if t.name.len() + 4 > usize::from(u16::MAX) {
                return Err(Error::Write {
                    rule: Rule::WRITE_NAME,
                    ctx: ctx.clone().tensor(t.name),
                    reason: "a zip member name is at most 65535 bytes".into(),
                });
            }
            npy_header(&ctx, t)
        })
        .collect::<Result<Vec<_>>>()?;
    publish_reading(path, durable, |w| {
        let io = |e| Error::io(path, e);
        let mut zip = zip::StoredZip::new(w, 1);
        for (i, h) in headers.iter().enumerate() {
            let data = tensors.fetch(i, &ctx)?;
            let mut crc = crc32fast::Hasher::new();
            crc.update(h);
            crc.update(&data);
            zip.add(&zip::Member {
                name: format!("{}.npy", tensors.meta(i).name),
                parts: [h, &data],
                crc: crc.finalize(),
            })
            .map_err(io)?;
            drop(data);
            tensors.release(i);
        }
        zip.finish().map_err(io)
    })
}

/// The `.npz` [`FormatWriter`] (uncompressed, as `np.savez` writes).
pub struct NpzWriter;

/// The `.npy` [`FormatWriter`]: a source holding exactly one dense tensor.
pub struct NpyWriter;

impl FormatWriter for NpzWriter {
    fn name(&self) -> &'static str {
        "npz"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["npz"]
    }

    /// From arrays too; no attributes and no options (a request with them
    /// is refused before a writer runs: `zt_core::write::check_request`).
    fn caps(&self) -> WriterCaps {
        WriterCaps::DENSE_ARRAYS
    }

    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        _metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        write_npz_inputs(path, &tensors, options.syncs())
    }

    /// Streams: each tensor fetched as its member is written.
    fn reads_ahead(&self) -> bool {
        true
    }

    fn write_inputs(
        &self,
        tensors: &dyn Inputs,
        _metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        write_npz_inputs(path, tensors, options.syncs())
    }
}

impl FormatWriter for NpyWriter {
    fn name(&self) -> &'static str {
        "npy"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["npy"]
    }

    /// From arrays too; no attributes and no options (a request with them
    /// is refused before a writer runs: `zt_core::write::check_request`).
    fn caps(&self) -> WriterCaps {
        WriterCaps::DENSE_ARRAYS
    }

    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        _metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        write_one_npy(path, &tensors, options.syncs())
    }

    /// Streams: the tensor fetched as it is written.
    fn reads_ahead(&self) -> bool {
        true
    }

    fn write_inputs(
        &self,
        tensors: &dyn Inputs,
        _metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        write_one_npy(path, tensors, options.syncs())
    }
}

/// `.npy` of the only tensor of `tensors`.
fn write_one_npy(path: &Path, tensors: &dyn Inputs, durable: bool) -> Result<u64> {
    match tensors.len() {
        1 => write_npy_input(path, tensors, 0, durable),
        many => Err(Error::Write {
            rule: Rule::WRITE_OBJECT,
            ctx: Context::file(path),
            reason: format!(".npy holds exactly one array; got {many}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member of `len` bytes in memory, with its CRC-32 (or a wrong one).
    fn member(len: usize, good: bool) -> MemberCrc {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4096) as u8).collect();
        let crc = crc32fast::hash(&bytes) ^ u32::from(!good);
        MemberCrc {
            store: Arc::new(Store::from_bytes("m.npz", bytes)),
            offset: 0,
            len: len as u64,
            crc,
            member: "x".into(),
        }
    }

    #[test]
    fn large_member_checks_in_pieces_from_any_thread() {
        let (good, bad) = (member(9 << 20, true), member(9 << 20, false));
        assert!(good.check().is_ok());
        assert_eq!(bad.check().unwrap_err().rule, rules::NPZ_CRC);
        // From the threads of a two-thread pool, both busy with checks at
        // once: pieces handed to the pool and waited for there would hold
        // both threads (this would never return).
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let outcomes: Vec<bool> = pool.install(|| {
            (0..8)
                .into_par_iter()
                .map(|i| if i % 2 == 0 { &good } else { &bad }.check().is_ok())
                .collect()
        });
        assert_eq!(
            outcomes,
            [true, false, true, false, true, false, true, false]
        );
    }

    #[test]
    fn store_errors_survive_io() {
        let e = io::Error::other(Error::range(Context::default(), rules::SIZE, "x"));
        assert!(matches!(
            from_io(e, &Context::default(), "t"),
            Error::Range { .. }
        ));
        let e = io::Error::new(io::ErrorKind::InvalidInput, "corrupt deflate stream");
        assert!(matches!(
            from_io(e, &Context::default(), "t"),
            Error::Decode { .. }
        ));
    }

    #[test]
    fn layout_limits_header() {
        let h = header::encode("<f4", &[2]);
        let mut bytes = h.clone();
        bytes.extend_from_slice(&[0; 8]);
        let limits = Limits {
            header_bytes: 16,
            ..Limits::default()
        };
        let r = read_layout(
            &mut &bytes[..],
            bytes.len() as u64,
            &Context::default(),
            &limits,
        );
        assert!(matches!(r, Err(Error::Limit { .. })));
        let ok = read_layout(
            &mut &bytes[..],
            bytes.len() as u64,
            &Context::default(),
            &Limits::default(),
        )
        .unwrap();
        assert_eq!((ok.data_offset, ok.data_len), (h.len() as u64, 8));
    }
}
