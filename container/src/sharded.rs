//! The incremental writer of a sharded `.zt` checkpoint (`zt.Writer(path,
//! max_shard_size=...)`): objects go to shard files of at most a given
//! size as they arrive, split as `zt_core::shard::plan` splits a batch
//! (a new shard when the next object would tip the current one over the
//! limit; an object larger than the limit alone in a shard of its own,
//! listed before the shard being filled), so the same objects added in
//! the same order give byte for byte what `save_file(...,
//! max_shard_size=...)` writes: the shards `STEM-00001.zt`, ... and the
//! root at the destination (or, for one shard, a plain file there).
//!
//! Every shard is an ordinary [`Writer`] building in one staging
//! directory beside the destination; each stays open until
//! [`ShardedWriter::finish`], so file attributes set at any point reach
//! every shard (as a batch save gives every shard the metadata). Only a
//! complete set is published: shards (fsynced together first when
//! `publish`), then the root. An error, [`ShardedWriter::abandon`] or a
//! drop removes the staging directory and leaves the destination as it
//! was.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use zt_core::Rule;

use crate::cbor::Cbor;
use crate::write::{objects_to_ingest, ObjectIn, Options, Writer};
use zt_core::dtype::DType;
use zt_core::error::{Context, Error, Result};
use zt_core::publish::Staging;
use zt_core::shard::{self, ShardLayout, Tie};
use zt_core::source::Source;

/// The layout the `.zt` writer declares (`ZtWriter::shard_layout`): shard
/// names and the replaced-shard cleanup follow it. (How durable the files
/// are is the writer's `publish` option, as for one file.)
const LAYOUT: ShardLayout = ShardLayout {
    checkpoint_name: "model.zt",
    tie: Tie::Root(crate::root::write_root),
    durable: true,
};

/// One shard being written: its writer, the bytes placed in it and how
/// many objects.
struct Shard {
    writer: Writer,
    path: PathBuf,
    size: u64,
    count: usize,
}

/// Where the split puts the next object.
#[derive(Clone, Copy)]
enum Place {
    /// The shard being filled.
    Current,
    /// A new shard that replaces the current one, which closes.
    Next,
    /// A shard of its own, closed at once (larger than the limit).
    Own,
}

/// Which shard holds the open stream.
#[derive(Clone, Copy)]
enum Open {
    Current,
    Closed(usize),
}

/// A `.zt` checkpoint written object by object into shards of at most
/// `max` bytes.
pub struct ShardedWriter {
    dest: PathBuf,
    options: Options,
    max: u64,
    staging: Staging,
    /// Shards no longer filled, in checkpoint order.
    closed: Vec<Shard>,
    /// The shard being filled (placed after `closed` when it closes).
    current: Shard,
    streaming: Option<Open>,
    names: HashSet<String>,
    attributes: Option<Cbor>,
    /// Shard files created so far (their staging names).
    created: usize,
}

impl std::fmt::Debug for ShardedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardedWriter")
            .field("dest", &self.dest)
            .field("max", &self.max)
            .field("shards", &(self.closed.len() + 1))
            .finish()
    }
}

impl ShardedWriter {
    /// Start a checkpoint at `dest` (a local path) in shards of at most
    /// `max` bytes. `options.publish` makes the published files durable;
    /// `options.append` is refused (a checkpoint is written whole).
    pub fn create(dest: impl AsRef<Path>, options: Options, max: u64) -> Result<ShardedWriter> {
        let dest = dest.as_ref().to_path_buf();
        let refuse = |reason: &str| Error::Write {
            rule: Rule::WRITE_OPTIONS,
            ctx: Context::file(&dest),
            reason: reason.into(),
        };
        if options.append {
            return Err(refuse(
                "append amends one file; a sharded checkpoint is written whole",
            ));
        }
        if max == 0 {
            return Err(refuse("the shard size must be at least one byte"));
        }
        let staging = Staging::create(&dest)?;
        let current = new_shard(&staging, 1, &options).map_err(|e| relabel(e, &staging, &dest))?;
        Ok(ShardedWriter {
            dest,
            options,
            max,
            staging,
            closed: Vec::new(),
            current,
            streaming: None,
            names: HashSet::new(),
            attributes: None,
            created: 1,
        })
    }

    /// Where the split puts an object of `size` bytes.
    fn place(&self, size: u64) -> Place {
        if size > self.max {
            Place::Own
        } else if self.current.size + size > self.max {
            Place::Next
        } else {
            Place::Current
        }
    }

    /// Put an object of `size` bytes named `name` where the split places
    /// it, writing it with `f`; the placement holds only if `f` succeeds
    /// (a refused object changes nothing). Returns where it went.
    fn put(
        &mut self,
        name: &str,
        size: u64,
        f: impl FnOnce(&mut Writer) -> Result<()>,
    ) -> Result<Open> {
        if let Some(open) = self.streaming {
            // The shard's writer refuses with its own error.
            return self.on(open, f).map(|()| open);
        }
        if self.names.contains(name) {
            return Err(Error::DuplicateName {
                ctx: Context::file(&self.dest).tensor(name),
            });
        }
        let place = self.place(size);
        let written = match place {
            Place::Current => self.on(Open::Current, f).map(|()| None),
            Place::Next | Place::Own => {
                let mut fresh = self.new_shard()?;
                let out = f(&mut fresh.writer).map_err(|e| self.relabel(e));
                out.map(|()| Some(fresh))
            }
        }?;
        self.names.insert(name.to_string());
        let at = match (place, written) {
            (Place::Own, Some(mut own)) => {
                own.size = size;
                own.count = 1;
                self.closed.push(own);
                Open::Closed(self.closed.len() - 1)
            }
            (Place::Next, Some(next)) => {
                let full = std::mem::replace(&mut self.current, next);
                self.closed.push(full);
                Open::Current
            }
            _ => Open::Current,
        };
        if matches!(at, Open::Current) {
            self.current.size += size;
            self.current.count += 1;
        }
        Ok(at)
    }

    fn new_shard(&mut self) -> Result<Shard> {
        self.created += 1;
        new_shard(&self.staging, self.created, &self.options).map_err(|e| self.relabel(e))
    }

    /// An error about a staged file as one about the destination.
    fn relabel(&self, e: Error) -> Error {
        relabel(e, &self.staging, &self.dest)
    }

    /// Run `f` on the writer of a shard; a failure names the destination.
    fn on(&mut self, at: Open, f: impl FnOnce(&mut Writer) -> Result<()>) -> Result<()> {
        let w = match at {
            Open::Current => &mut self.current.writer,
            Open::Closed(i) => &mut self.closed[i].writer,
        };
        let out = f(w);
        out.map_err(|e| self.relabel(e))
    }

    /// Add an object (its size is its parts' bytes).
    pub fn add_object(&mut self, o: ObjectIn<'_>) -> Result<()> {
        let size = o.parts.iter().map(|p| p.data.len() as u64).sum();
        let name = o.name.clone();
        self.put(&name, size, |w| w.add_object(o)).map(|_| ())
    }

    /// Add a dense tensor.
    pub fn add(&mut self, name: &str, dtype: DType, shape: &[u64], data: &[u8]) -> Result<()> {
        self.add_object(ObjectIn::dense(name, dtype, shape, data))
    }

    /// Declare a streamed object of the declared part sizes (see
    /// [`Writer::stream`]); it is placed by their sum.
    pub fn stream(
        &mut self,
        name: &str,
        shape: &[u64],
        layout: &str,
        attributes: Option<Cbor>,
        parts: &[(&str, DType, u64)],
    ) -> Result<()> {
        let size = parts.iter().map(|p| p.2).sum();
        let at = self.put(name, size, |w| {
            w.stream(name, shape, layout, attributes, parts)
        })?;
        self.streaming = Some(at);
        Ok(())
    }

    /// Write the next bytes of the open stream.
    pub fn write_chunk(&mut self, chunk: &[u8]) -> Result<()> {
        let at = self.streaming.unwrap_or(Open::Current);
        self.on(at, |w| w.write_chunk(chunk))
    }

    /// The open stream's part and the bytes written into it.
    pub fn stream_position(&self) -> Option<(&str, u64)> {
        match self.streaming? {
            Open::Current => self.current.writer.stream_position(),
            Open::Closed(i) => self.closed[i].writer.stream_position(),
        }
    }

    /// Close the open stream.
    pub fn close_stream(&mut self) -> Result<()> {
        let at = self.streaming.unwrap_or(Open::Current);
        self.on(at, |w| w.close_stream())?;
        self.streaming = None;
        Ok(())
    }

    /// Set the file attributes: every shard's and the root's.
    pub fn set_attributes(&mut self, attributes: Cbor) -> Result<()> {
        // The current shard checks them as a file's attributes.
        self.on(Open::Current, |w| w.set_attributes(attributes.clone()))?;
        self.attributes = Some(attributes);
        Ok(())
    }

    /// Add every tensor of `source`, one object at a time (in name order
    /// when canonical, as [`Writer::ingest`] adds them).
    pub fn ingest(&mut self, source: &Source) -> Result<()> {
        for o in objects_to_ingest(source, self.options.canonical)? {
            self.add_object(o)?;
        }
        Ok(())
    }

    /// Finish every shard, write the root and publish the checkpoint at
    /// the destination (one shard: a plain file there, as a batch save
    /// writes it). Returns the bytes written, every file together.
    pub fn finish(self) -> Result<u64> {
        let ShardedWriter {
            dest,
            options,
            staging,
            mut closed,
            current,
            attributes,
            ..
        } = self;
        // The split lists no empty shard, unless there is nothing at all.
        if current.count > 0 || closed.is_empty() {
            closed.push(current);
        }
        publish(closed, &dest, &options, attributes).map_err(|e| relabel(e, &staging, &dest))
    }

    /// Discard everything written; the destination is left as it was.
    pub fn abandon(self) {
        // Dropping the shard writers removes their partials, dropping the
        // staging directory the rest.
    }
}

/// Finish the complete `shards` (in order), write their root and publish
/// them at `dest`.
fn publish(
    shards: Vec<Shard>,
    dest: &Path,
    options: &Options,
    attributes: Option<Cbor>,
) -> Result<u64> {
    let mut bytes = 0;
    let mut paths = Vec::with_capacity(shards.len());
    let mut written = Vec::with_capacity(shards.len());
    for mut s in shards {
        if let Some(a) = &attributes {
            s.writer.set_attributes(a.clone())?;
        }
        let file = s.writer.finish_shard()?;
        bytes += file.bytes;
        written.push(file);
        if options.publish {
            // The device writes this shard while the next one finishes.
            zt_core::publish::start_writeback(&s.path);
        }
        paths.push(s.path);
    }
    if options.publish {
        // Every shard on disk before anything names it.
        zt_core::publish::sync_files(&paths)?;
    }
    if paths.len() == 1 {
        std::fs::rename(&paths[0], dest).map_err(|e| Error::io(dest, e))?;
        if options.publish {
            zt_core::publish::sync_dir(&zt_core::location::parent_dir(dest))?;
        }
        return Ok(bytes);
    }
    let write_root = |at: &Path, labels: &[String]| {
        crate::root::write_root_cbor(at, &written, labels, attributes.clone(), options.publish)
    };
    let published = shard::publish_staged(&paths, dest, &LAYOUT, options.publish, &write_root)?;
    bytes += published.tie_bytes;
    Ok(bytes)
}

/// Shard file `n` in the staging directory (never synced on its own: the
/// checkpoint syncs all of them together), its whole-file digest kept as
/// it is written, for the root.
fn new_shard(staging: &Staging, n: usize, options: &Options) -> Result<Shard> {
    let path = staging.path().join(format!("shard-{n:05}.zt"));
    let options = Options {
        publish: false,
        ..*options
    };
    Ok(Shard {
        writer: Writer::create_shard(&path, options)?,
        path,
        size: 0,
        count: 0,
    })
}

/// An error about a file in the staging directory as one about the
/// checkpoint: the user knows the destination, not the hidden directory
/// it is built in (whose shard names are not yet the final ones).
fn relabel(e: Error, staging: &Staging, dest: &Path) -> Error {
    match e.context().file.clone() {
        Some(file) if file.starts_with(staging.path()) => e.relabel(&file, dest),
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::manifest_of;
    use crate::write::write_shard;
    use crate::write::Align;
    use zt_core::catalog::Digest;
    use zt_core::limits::Limits;
    use zt_core::store::Store;

    fn xxh3_of(path: &Path) -> String {
        let bytes = std::fs::read(path).unwrap();
        Digest::Xxh3(xxhash_rust::xxh3::xxh3_64(&bytes)).to_string()
    }

    #[test]
    fn the_root_records_each_shards_whole_file_digest_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("model.zt");
        let bytes = |seed: u8, n: usize| -> Vec<u8> {
            (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
        };
        let (a, b, c, e) = (
            bytes(1, 3000),
            bytes(2, 3000),
            bytes(3, 3000),
            bytes(4, 100),
        );
        let mut w = ShardedWriter::create(&dest, Options::default(), 7000).unwrap();
        w.add("a", DType::U8, &[3000], &a).unwrap();
        w.add("b", DType::U8, &[3000], &b).unwrap();
        w.add("c", DType::U8, &[3000], &c).unwrap();
        // A streamed part identical to `c`: shared, and cut back off the
        // file after it was written (and hashed).
        w.stream("d", &[3000], "dense", None, &[("data", DType::U8, 3000)])
            .unwrap();
        w.write_chunk(&c[..1000]).unwrap();
        w.write_chunk(&c[1000..]).unwrap();
        w.close_stream().unwrap();
        w.add("e", DType::U8, &[100], &e).unwrap();
        w.finish().unwrap();
        let root = Store::open(&dest).unwrap();
        let (_, m) = manifest_of(&root, &Limits::default()).unwrap();
        let m = m.unwrap();
        assert_eq!(m.shards.len(), 2);
        for s in &m.shards {
            let shard = dir.path().join(format!("model-{}.zt", s.name));
            assert_eq!(s.size, std::fs::metadata(&shard).unwrap().len());
            assert_eq!(s.digest, xxh3_of(&shard), "{}", s.name);
        }
    }

    #[test]
    fn a_batch_shard_is_hashed_as_written_holes_included() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        for (canonical, align) in [(true, Align::Canonical), (false, Align::Auto)] {
            let path = dir.path().join(format!("s-{canonical}.zt"));
            let objects = vec![
                ObjectIn::dense("big", DType::U8, &[300_000], &data),
                ObjectIn::dense("small", DType::U8, &[10], &data[..10]),
                ObjectIn::dense("twin", DType::U8, &[10], &data[..10]),
            ];
            let options = Options {
                canonical,
                align,
                ..Options::default()
            };
            let w = write_shard(&path, objects, None, &options).unwrap();
            assert_eq!(w.bytes, std::fs::metadata(&path).unwrap().len());
            assert_eq!(w.digest.unwrap().to_string(), xxh3_of(&path));
            let store = Store::open(&path).unwrap();
            let (footer, _) = manifest_of(&store, &Limits::default()).unwrap();
            let manifest =
                crate::container::read_manifest(&store, &footer, &Limits::default()).unwrap();
            assert_eq!(w.manifest.as_deref(), Some(&manifest[..]));
        }
    }
}
