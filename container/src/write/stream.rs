//! The incremental `.zt` writer: objects added one at a time, or streamed
//! a chunk at a time; also amends an existing file in place (append, §2.5).

use crate::rules;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use zt_core::Rule;

use super::describe::{finish_file, manifest, object_cbor, storage_and_type, ObjectOut, PartOut};
use super::heap::Heap;
use super::input::{check_object, objects_to_ingest, sort_parts, ObjectIn, PartIn};
use super::options::Options;
use crate::cbor::{self, Cbor};
use crate::container::{self, FLOOR, MAGIC};
use crate::dedup::BlobKey;
use crate::encoding::{self};
use crate::hash_ahead;
use crate::manifest::{self};
use crate::sink::FileHash;
use crate::validate::{self};
use crate::xxh3::{xxh3_64, Xxh3};
use zt_core::catalog::Digest;
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::limits::Limits;
use zt_core::publish::Partial;
use zt_core::source::Source;
use zt_core::store::Store;
use zt_core::write::WrittenFile;

/// An open stream: the object being written a chunk at a time.
#[derive(Debug)]
struct Stream {
    object: ObjectOut,
    /// (name, dtype, declared length) of the parts, in name order.
    parts: Vec<(String, DType, u64)>,
    /// Index of the part being written and bytes written into it.
    current: usize,
    written: u64,
    hasher: Xxh3,
    /// Heap cursor before the current part was placed (for undoing a duplicate).
    part_start: (u64, u64),
    /// The whole-file digest before the current part (restored when the
    /// part is found to be a duplicate and cut back off the file).
    file_hash_before: Option<FileHash>,
}

/// A part's digest (XXH3 of its decoded bytes) and, for a part stored
/// encoded, its `zt.zstd-seekable/1` bytes: what [`Writer::add_object`]
/// computes for each part, computed ahead by a caller that encodes many
/// parts at once ([`Writer::add_prepared`]).
#[derive(Debug)]
pub struct Prepared {
    /// XXH3 of the decoded bytes.
    pub digest: Digest,
    /// The encoded bytes; `None` for a raw part.
    pub encoded: Option<Vec<u8>>,
}

impl Prepared {
    /// `part` hashed and, when it has a level (its own, else `default`),
    /// encoded at it.
    pub fn of(part: &PartIn<'_>, default: Option<i32>) -> std::io::Result<Prepared> {
        let digest = Digest::Xxh3(xxh3_64(&part.data));
        let encoded = match part.compression.or(default) {
            Some(level) => Some(encoding::encode(&part.data, level)?),
            None => None,
        };
        Ok(Prepared { digest, encoded })
    }
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
    /// The whole-file digest, fed as blobs are written (a shard's:
    /// [`Writer::create_shard`]).
    hash: Option<FileHash>,
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
        Writer::create_new(dest, options, false)
    }

    /// Start a shard of a sharded checkpoint: a new file whose whole-file
    /// digest is kept as its blobs are written, for
    /// [`Writer::finish_shard`] (its root records it; the file is never
    /// read back to hash it). `append` is refused.
    pub fn create_shard(path: impl AsRef<Path>, options: Options) -> Result<Writer> {
        let dest = path.as_ref().to_path_buf();
        options.check(&Context::file(&dest))?;
        if options.append {
            return Err(Error::Write {
                rule: Rule::WRITE_OPTIONS,
                ctx: Context::file(&dest),
                reason: "a shard is written whole; it cannot amend a file".into(),
            });
        }
        Writer::create_new(dest, options, true)
    }

    fn create_new(dest: PathBuf, options: Options, hash: bool) -> Result<Writer> {
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
            hash: hash.then(|| {
                let mut h = FileHash::new();
                h.update_at(0, MAGIC);
                h
            }),
        })
    }

    /// Amend an existing `.zt` root (§2.5): new blobs, a new manifest and a
    /// new footer go past the current end; nothing existing is overwritten.
    pub fn open(path: impl AsRef<Path>, mut options: Options) -> Result<Writer> {
        let dest = path.as_ref().to_path_buf();
        options.append = true;
        options.canonical = false;
        let store = Store::open_positional(&dest)?;
        let (footer, m) = crate::read::manifest_of(&store, &Limits::default())?;
        let m = m.ok_or_else(|| Error::Write {
            rule: rules::WRITE,
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
        .map_err(|e| Error::header(Context::file(&dest), e.rule, e.reason))?;
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
            hash: None,
        })
    }

    fn ctx(&self) -> Context {
        Context::file(&self.dest)
    }

    /// An I/O failure (an encoding's) reported against the file written.
    pub(super) fn io_error(&self, e: std::io::Error) -> Error {
        Error::io(&self.dest, e)
    }

    fn file(&self) -> Result<&File> {
        self.target
            .as_ref()
            .map(Target::file)
            .ok_or_else(|| Error::Write {
                rule: Rule::WRITE_STATE,
                ctx: self.ctx(),
                reason: "the writer is finished".into(),
            })
    }

    fn check_idle(&self) -> Result<()> {
        if self.stream.is_some() {
            return Err(Error::Write {
                rule: Rule::WRITE_STATE,
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
        self.check_levels(&o)?;
        let default = self.options.compression;
        let prepared = o
            .parts
            .iter()
            .map(|p| {
                if self.hashes_while_writing(p) {
                    Ok(None)
                } else {
                    Prepared::of(p, default).map(Some)
                }
            })
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| Error::io(&self.dest, e))?;
        self.place(o, prepared)
    }

    /// Whether part `p` is written while a helper thread hashes it
    /// ([`Writer::put_raw_hashing`]) instead of hashed first: a raw part of
    /// [`hash_ahead::WORTH_A_THREAD`] bytes or more, in a new file, with a second
    /// core to hash on.
    fn hashes_while_writing(&self, p: &PartIn<'_>) -> bool {
        p.compression.or(self.options.compression).is_none()
            && p.data.len() >= hash_ahead::WORTH_A_THREAD
            && matches!(self.target, Some(Target::New(_)))
            && std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
    }

    /// [`Writer::add_object`] with each part's digest (and encoding)
    /// computed ahead, `prepared[i]` for `o.parts[i]`: a caller encodes
    /// many parts at once, on every core, and adds them in order; the file
    /// is what `add_object` writes for the same objects. A part prepared
    /// for another compression than the writer's (or its own) is refused.
    pub fn add_prepared(&mut self, o: ObjectIn<'_>, prepared: Vec<Prepared>) -> Result<()> {
        self.check_idle()?;
        let ObjectIn {
            name,
            shape,
            layout,
            attributes,
            parts,
        } = o;
        if parts.len() != prepared.len() {
            return Err(self.misprepared(&name, "one prepared part per part"));
        }
        // Sorted together, as `add_object` sorts the parts.
        let mut paired: Vec<_> = parts.into_iter().zip(prepared).collect();
        paired.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        let (parts, prepared): (Vec<_>, Vec<_>) = paired.into_iter().unzip();
        let o = ObjectIn {
            name,
            shape,
            layout,
            attributes,
            parts,
        };
        self.check_new(&o)?;
        self.check_levels(&o)?;
        for (p, ready) in o.parts.iter().zip(&prepared) {
            let level = p.compression.or(self.options.compression);
            if level.is_some() != ready.encoded.is_some() {
                return Err(self.misprepared(&o.name, "a part prepared for another compression"));
            }
        }
        self.place(o, prepared.into_iter().map(Some).collect())
    }

    fn misprepared(&self, name: &str, what: &str) -> Error {
        Error::Write {
            rule: Rule::WRITE_STATE,
            ctx: self.ctx().tensor(name),
            reason: format!("{what} (the caller's preparation does not match the object)"),
        }
    }

    /// Canonical form stores raw parts: no part of `o` may ask for
    /// compression (its own or the writer's).
    fn check_levels(&self, o: &ObjectIn<'_>) -> Result<()> {
        let default = self.options.compression;
        if self.options.canonical && o.parts.iter().any(|p| p.compression.or(default).is_some()) {
            return Err(Error::Write {
                rule: rules::WRITE,
                ctx: self.ctx().tensor(&o.name),
                reason: "canonical form stores raw parts".into(),
            });
        }
        Ok(())
    }

    /// Write (or share) each part's blob of a checked object, parts in
    /// name order with their prepared digests and encodings (`None`: a raw
    /// part hashed as it is written).
    fn place(&mut self, o: ObjectIn<'_>, prepared: Vec<Option<Prepared>>) -> Result<()> {
        let mut parts = Vec::with_capacity(o.parts.len());
        for (p, prepared) in o.parts.iter().zip(prepared) {
            let Some(Prepared { digest, encoded }) = prepared else {
                let (offset, length, digest) = self.put_raw_hashing(&p.data)?;
                parts.push(PartOut {
                    name: p.name.clone(),
                    dtype: p.dtype,
                    offset,
                    length,
                    encoded: None,
                    digest,
                });
                continue;
            };
            // Encoded parts are shared when their decoded bytes match: the
            // key is the decoded digest and length, confirmed on the
            // encoded bytes.
            let key = BlobKey::new(&digest, p.data.len() as u64, encoded.is_some());
            let (offset, length, encoded) = match encoded {
                None => {
                    let (off, len) = self.put_blob(&p.data, key)?;
                    (off, len, None)
                }
                Some(enc) => {
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
    fn put_blob(&mut self, stored: &[u8], key: BlobKey) -> Result<(u64, u64)> {
        let len = stored.len() as u64;
        let same = |(off, their_len)| Ok(their_len == len && self.same_as_written(off, stored)?);
        if let Some(shared) = self.heap.seen.find(&key, same)? {
            return Ok(shared);
        }
        let offset = self.heap.place(len, self.options.align_for(len));
        self.file()?
            .write_all_at(stored, offset)
            .map_err(|e| Error::io(&self.dest, e))?;
        if let Some(h) = &mut self.hash {
            h.update_at(offset, stored);
        }
        self.heap.seen.record(key, (offset, len));
        Ok((offset, len))
    }

    /// Write a large raw part while a helper thread hashes it, then share
    /// an earlier blob instead if one has its digest and bytes, cutting the
    /// part back off the end of the file as a streamed duplicate is: with a
    /// second core the hash then costs the writing thread nothing, where
    /// [`Prepared::of`] hashes the whole part before the write begins.
    /// Returns the blob's offset and length, and the part's digest.
    fn put_raw_hashing(&mut self, data: &[u8]) -> Result<(u64, u64, Digest)> {
        let len = data.len() as u64;
        let (cursor_before, hash_before) = (self.heap.cursor, self.hash.clone());
        let offset = self.heap.place(len, self.options.align_for(len));
        let file = self.file()?;
        let (written, digest) = std::thread::scope(|scope| {
            let hasher = scope.spawn(|| xxh3_64(data));
            let written = file.write_all_at(data, offset);
            let digest = hasher
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e));
            (written, Digest::Xxh3(digest))
        });
        written.map_err(|e| Error::io(&self.dest, e))?;
        if let Some(h) = &mut self.hash {
            h.update_at(offset, data);
        }
        let (offset, len) = self.share_or_keep(&digest, offset, len, cursor_before, hash_before)?;
        Ok((offset, len, digest))
    }

    /// The blob of a raw part just written at the end of the file (`len`
    /// bytes at `offset`, digest `digest`): an earlier blob with the same
    /// digest and bytes if there is one, the part then cut back off the
    /// file (the heap's cursor and the whole-file digest as they were
    /// before it, `cursor_before` and `hash_before`); else its own,
    /// recorded for later parts to share.
    fn share_or_keep(
        &mut self,
        digest: &Digest,
        offset: u64,
        len: u64,
        cursor_before: u64,
        hash_before: Option<FileHash>,
    ) -> Result<(u64, u64)> {
        let key = BlobKey::new(digest, len, false);
        let same = |(off, stored)| Ok(stored == len && self.same_regions(off, offset, len)?);
        if let Some(shared) = self.heap.seen.find(&key, same)? {
            self.heap.cursor = cursor_before;
            self.hash = hash_before;
            self.file()?
                .set_len(self.heap.cursor.max(8))
                .map_err(|e| Error::io(&self.dest, e))?;
            return Ok(shared);
        }
        self.heap.seen.record(key, (offset, len));
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
                rule: rules::WRITE,
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
            hasher: Xxh3::new(),
            part_start: (0, 0),
            file_hash_before: None,
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
                .collect::<Result<manifest::Parts>>()?,
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
                rule: Rule::WRITE_OBJECT,
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
            rule: e.rule().unwrap_or(rules::WRITE),
            ctx: octx.clone(),
            reason: e.detail(),
        })?;
        Ok(())
    }

    fn begin_part(&mut self, s: &mut Stream) {
        let len = s.parts.get(s.current).map_or(0, |p| p.2);
        s.part_start = (self.heap.cursor, 0);
        let offset = self.heap.place(len, self.options.align_for(len));
        s.part_start.1 = offset;
        s.written = 0;
        s.hasher = Xxh3::new();
        s.file_hash_before = self.hash.clone();
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
        let digest = Digest::Xxh3(s.hasher.digest());
        let (cursor_before, offset) = s.part_start;
        let placed = self.share_or_keep(
            &digest,
            offset,
            len,
            cursor_before,
            s.file_hash_before.take(),
        )?;
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
                    rule: Rule::WRITE_STATE,
                    ctx: self.ctx(),
                    reason: "no streamed object is open".into(),
                });
            };
            let Some(&(_, _, len)) = s.parts.get(s.current) else {
                let name = s.object.name.clone();
                return Err(Error::Write {
                    rule: Rule::WRITE_STATE,
                    ctx: self.ctx().tensor(name),
                    reason: "more bytes than the parts declared".into(),
                });
            };
            let take = (len - s.written).min(chunk.len() as u64) as usize;
            let at = s.part_start.1 + s.written;
            s.hasher.update(&chunk[..take]);
            s.written += take as u64;
            let file = self.target.as_ref().expect("open while streaming").file();
            file.write_all_at(&chunk[..take], at)
                .map_err(|e| Error::io(&self.dest, e))?;
            if let Some(h) = &mut self.hash {
                h.update_at(at, &chunk[..take]);
            }
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
                rule: Rule::WRITE_STATE,
                ctx: self.ctx(),
                reason: "no streamed object is open".into(),
            });
        };
        if s.current < s.parts.len() {
            let (name, _, len) = &s.parts[s.current];
            return Err(Error::Write {
                rule: Rule::WRITE_STATE,
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
            rule: e.rule().unwrap_or(rules::WRITE),
            ctx: self.ctx(),
            reason: e.detail(),
        })?;
        self.attributes = Some(attributes);
        Ok(())
    }

    /// Add every tensor of `source` (any readable format), in name order
    /// when canonical.
    pub fn ingest(&mut self, source: &Source) -> Result<()> {
        for o in objects_to_ingest(source, self.options.canonical)? {
            self.add_object(o)?;
        }
        Ok(())
    }

    /// Write the manifest and footer; publish if asked. Returns the file size.
    pub fn finish(self) -> Result<u64> {
        self.finish_file().map(|w| w.bytes)
    }

    /// [`Writer::finish`] for a writer made by [`Writer::create_shard`]:
    /// also the whole-file digest and the manifest, which the root records.
    pub fn finish_shard(self) -> Result<WrittenFile> {
        if self.hash.is_none() {
            return Err(Error::Write {
                rule: Rule::WRITE_STATE,
                ctx: self.ctx(),
                reason: "only a writer created for a shard describes one".into(),
            });
        }
        self.finish_file()
    }

    fn finish_file(mut self) -> Result<WrittenFile> {
        self.check_idle()?;
        let ctx = self.ctx();
        let bytes = match self.prior.take() {
            None => manifest(&self.objects, self.attributes.as_ref(), &ctx)?,
            // Appending: the new objects join the file's manifest as read.
            Some(Cbor::Map(mut entries)) => {
                let mut objs: Vec<(String, Cbor)> = self
                    .objects
                    .iter()
                    .map(|o| Ok((o.name.clone(), object_cbor(o, &ctx)?)))
                    .collect::<Result<Vec<_>>>()?;
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
                cbor::encode(&Cbor::Map(entries))
            }
            Some(other) => cbor::encode(&other),
        };
        let target = self.target.take().expect("checked idle");
        let mut hash = self.hash.take();
        let (total, manifest) = finish_file(
            target.file(),
            &mut self.heap,
            bytes,
            &self.options,
            &self.dest,
            hash.as_mut(),
        )?;
        match target {
            Target::New(partial) => partial.commit(self.options.publish)?,
            Target::Amend(file) => file.sync_data().map_err(|e| Error::io(&self.dest, e))?,
        }
        self.done = true;
        Ok(WrittenFile {
            path: self.dest.clone(),
            bytes: total,
            manifest: hash.is_some().then_some(manifest),
            digest: hash.map(|h| h.digest(total)),
        })
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
