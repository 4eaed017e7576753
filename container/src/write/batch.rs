//! The batch writer: every tensor in memory (or mapped) at once, written
//! front to back in one pass: raw parts hashed chunk by chunk on the
//! writing thread just before each chunk is written, compression (and its
//! hashing) ahead on the pool.

use crate::rules;
use std::os::unix::fs::FileExt;
use std::path::Path;
use zt_core::Rule;

use super::describe::{finish_file, manifest, ObjectOut, PartOut};
use super::heap::Heap;
use super::input::{check_object, sort_parts, ObjectIn, PartIn};
use super::options::Options;
use super::stream::Writer;
use crate::ahead;
use crate::cbor::Cbor;
use crate::container::MAGIC;
use crate::dedup::{BlobKey, Seen};
use crate::encoding::{self};
use crate::manifest::{self};
use crate::scout::{self, Scouted, WRITE_PIECE};
use crate::sink::{FileHash, Sink};
use zt_core::catalog::Digest;
use zt_core::error::{Context, Error, Result};
use zt_core::publish::Partial;
use zt_core::write::WrittenFile;

/// Write `objects` to `path` in one batch: compression off the writing
/// thread, duplicates confirmed in memory, one sequential
/// pass of writes. The file is built beside `path` and renamed
/// into place (fsynced when `options.publish`). Returns the file size.
pub fn write_objects(
    path: &Path,
    objects: Vec<ObjectIn<'_>>,
    attributes: Option<Cbor>,
    options: &Options,
) -> Result<u64> {
    write_batch(path, objects, attributes, options, false).map(|w| w.bytes)
}

/// [`write_objects`] for a shard of a sharded checkpoint: also the
/// whole-file digest, kept as the bytes are written (one more XXH3 pass
/// over memory on the writing thread, no read of the file), and the
/// manifest, which the root records. A shard is a new file: `append` is
/// refused.
pub fn write_shard(
    path: &Path,
    objects: Vec<ObjectIn<'_>>,
    attributes: Option<Cbor>,
    options: &Options,
) -> Result<WrittenFile> {
    if options.append {
        return Err(Error::Write {
            rule: Rule::WRITE_OPTIONS,
            ctx: Context::file(path),
            reason: "a shard is written whole; it cannot amend a file".into(),
        });
    }
    write_batch(path, objects, attributes, options, true)
}

/// The batch writer; with `describe`, the whole-file digest is kept as the
/// file is written and the manifest returned.
fn write_batch(
    path: &Path,
    mut objects: Vec<ObjectIn<'_>>,
    attributes: Option<Cbor>,
    options: &Options,
    describe: bool,
) -> Result<WrittenFile> {
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
        return Ok(WrittenFile::sized(path, w.finish()?));
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
            rule: e.rule().unwrap_or(rules::WRITE),
            ctx: ctx.clone(),
            reason: e.detail(),
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
    let hash = describe.then(|| {
        let mut h = FileHash::new();
        h.update_at(0, MAGIC);
        h
    });
    let mut blobs = Blobs {
        sink: {
            let sink = Sink::new(file, MAGIC.len() as u64, hash);
            if options.publish {
                sink.write_back_early()
            } else {
                sink
            }
        },
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
    let mut hash = blobs.sink.take_hash();
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
    let bytes = manifest(&outs, attributes.as_ref(), &ctx)?;
    let (total, manifest) = finish_file(file, &mut heap, bytes, options, path, hash.as_mut())?;
    partial.commit(options.publish)?;
    Ok(WrittenFile {
        path: path.to_path_buf(),
        bytes: total,
        digest: hash.map(|h| h.digest(total)),
        manifest: describe.then_some(manifest),
    })
}

/// Where the batch writer put one part.
struct PartPlaced {
    digest: Digest,
    encoded: bool,
    offset: u64,
    stored: u64,
}
/// Where the batch writer has put each part so far, and the sink it
/// writes the blobs through, front to back.
struct Blobs<'f, 'd, 'o> {
    /// Borrows each raw part's bytes until they are written.
    sink: Sink<'f, 'd>,
    heap: Heap,
    options: &'o Options,
    /// One entry per part, in part order.
    placed: Vec<PartPlaced>,
}

impl Blobs<'_, '_, '_> {
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

/// Raw parts: the scout, on this thread, hashes each part and finds the
/// ones that repeat an earlier part, each chunk just before it is written.
fn write_raw<'p, 'd: 'p, F>(
    n: usize,
    part: &F,
    blobs: &mut Blobs<'_, 'p, '_>,
) -> std::io::Result<()>
where
    F: Fn(usize) -> &'p PartIn<'d> + Sync,
{
    // The streamed part being written, its offset and bytes written.
    let mut streaming: Option<(usize, u64, usize)> = None;
    scout::scout(
        n,
        |i| &part(i).data[..],
        |message| {
            match message {
                Scouted::Whole(w) => {
                    if let Some(j) = w.twin {
                        blobs.share(j, w.digest);
                        return Ok(());
                    }
                    let data = &part(w.part).data;
                    let offset = blobs.begin(data.len() as u64)?;
                    blobs.sink.put(data)?;
                    blobs.done(w.digest, false, offset, data.len() as u64);
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
                        _ => return Err(std::io::Error::other("scout skipped a part's chunks")),
                    };
                    blobs.done(digest, false, offset, part(i).data.len() as u64);
                }
            }
            Ok(())
        },
    )?;
    if blobs.placed.len() != n {
        return Err(std::io::Error::other("the scout skipped a part"));
    }
    Ok(())
}

/// Parts with compression: hashing and compression (the CPU work) run ahead
/// on the pool while this thread places and writes each part as its result
/// arrives.
fn write_encoded<'p, 'd: 'p, F>(
    n: usize,
    part: &F,
    blobs: &mut Blobs<'_, 'p, '_>,
    path: &Path,
) -> Result<()>
where
    F: Fn(usize) -> &'p PartIn<'d> + Sync,
{
    let default_level = blobs.options.compression;
    let prepare = |i: usize| -> Result<(Digest, Option<Vec<u8>>)> {
        let p = part(i);
        let digest = Digest::Xxh3(crate::xxh3::xxh3_64(&p.data));
        let encoded = match p.compression.or(default_level) {
            Some(level) => Some(encoding::encode(&p.data, level).map_err(|e| Error::io(path, e))?),
            None => None,
        };
        Ok((digest, encoded))
    };
    let io = |e| Error::io(path, e);
    ahead::run_ahead(n, prepare, |ready| {
        let mut first_of: Seen<usize> = Seen::default();
        for i in 0..n {
            let (digest, encoded) = ready.take(i)?;
            let data = &part(i).data;
            let key = BlobKey::new(&digest, data.len() as u64, encoded.is_some());
            // Equality is confirmed on the bytes in memory before sharing.
            let same = |j: usize| Ok::<_, Error>(part(j).data[..] == data[..]);
            if let Some(j) = first_of.find(&key, same)? {
                blobs.share(j, digest);
                continue;
            }
            let stored = encoded.as_ref().map_or(data.len(), Vec::len) as u64;
            let offset = blobs.begin(stored).map_err(io)?;
            match &encoded {
                Some(bytes) => blobs.sink.put_copy(bytes),
                None => blobs.sink.put(data),
            }
            .map_err(io)?;
            first_of.record(key, i);
            blobs.done(digest, encoded.is_some(), offset, stored);
        }
        Ok(())
    })
}
