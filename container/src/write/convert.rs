//! `zt convert` / `zt.convert` to `.zt`: a source's objects written one at
//! a time.
//!
//! Objects go through the incremental [`Writer`] in order, each object's
//! parts fetched as it is reached ([`SourceInputs`]: read ahead a window
//! at a time, mapped pages dropped once written), so a conversion holds
//! one object and a window, not the source, and writes what the batch
//! writer writes for the same objects byte for byte (the same placement,
//! sharing and manifest). With compression, the objects of a window
//! ([`COMPRESS_WINDOW`] bytes, at least one object) are hashed and encoded
//! together on every core, then added in order and released. Only an
//! append (to an existing file) runs the batch writer.

use std::path::Path;

use zt_core::error::{Context, Result};
use zt_core::inputs::{Bytes, InputMeta, Inputs, SourceInputs};
use zt_core::source::Source;
use zt_core::write::{WriteOptions, WrittenFile};

use super::batch::{write_objects, write_shard};
use super::input::{attributes_cbor, object_attributes, objects_of, ObjectIn, PartIn};
use super::options::Options;
use super::stream::{Prepared, Writer};
use rayon::prelude::*;

/// The decoded bytes of the objects a compressed conversion encodes
/// together: enough parts to keep every core busy, few enough that the
/// window's bytes and their encodings stay small beside one large tensor.
pub const COMPRESS_WINDOW: u64 = 16 << 20;

/// Convert `source` to a `.zt` file at `path` (durable unless
/// `options.defer_sync`: [`Options::from_write_options`]).
pub fn convert(source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
    let opts = Options::from_write_options(options);
    if streams(&opts) {
        return by_object(source, &opts, Writer::create(path, opts)?, Writer::finish);
    }
    let objects = whole(source)?;
    write_objects(path, objects, attributes_cbor(source.attributes()), &opts)
}

/// [`convert`] for a shard of a sharded checkpoint: also the whole-file
/// digest and the manifest, which the root records.
pub fn convert_shard(source: &Source, path: &Path, options: &WriteOptions) -> Result<WrittenFile> {
    let opts = Options::from_write_options(options);
    if streams(&opts) {
        let writer = Writer::create_shard(path, opts)?;
        return by_object(source, &opts, writer, Writer::finish_shard);
    }
    let objects = whole(source)?;
    write_shard(path, objects, attributes_cbor(source.attributes()), &opts)
}

/// Every object of `source` at once, for the batch writer: the source read
/// ahead in file order first (the writer reports that it reads ahead
/// itself, so the registry does not).
fn whole(source: &Source) -> Result<Vec<ObjectIn<'_>>> {
    // Advice only: a failure to read ahead is no reason to fail.
    let _ = source.read_ahead_all();
    objects_of(source)
}

/// Whether a conversion with `options` goes object by object: into a new
/// file.
fn streams(options: &Options) -> bool {
    !options.append
}

/// Every object of `source` added to `writer` (in name order when
/// canonical, the order canonical placement requires; the source's
/// otherwise), then the source's attributes, then `finish`. With
/// compression, a window of objects is encoded at once ([`by_window`]). A
/// failure drops the writer, which removes its partial file.
fn by_object<T>(
    source: &Source,
    options: &Options,
    mut writer: Writer,
    finish: impl FnOnce(Writer) -> Result<T>,
) -> Result<T> {
    let tensors: Vec<_> = source.tensors().collect();
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    if options.canonical {
        order.sort_by(|&a, &b| tensors[a].name().cmp(tensors[b].name()));
    }
    // Every part in the order written, read as `objects_of` reads it:
    // dense tensors' elements in C order, other layouts as stored.
    let mut items = Vec::new();
    // Where each object's parts start among them, and its decoded bytes.
    let mut starts = Vec::with_capacity(order.len() + 1);
    let mut sizes = Vec::with_capacity(order.len());
    for &object in &order {
        let t = &tensors[object];
        let read = if t.layout() == "dense" {
            Bytes::Elements
        } else {
            Bytes::Stored
        };
        starts.push(items.len());
        let mut size = 0u64;
        for part in t.parts() {
            let meta = InputMeta {
                name: part.name(),
                dtype: part.dtype(),
                shape: part.shape(),
            };
            // Decoded bytes where the shape says (a compressed source's
            // payload is smaller than what is held), else as stored.
            size += meta
                .nbytes(&Context::default())
                .unwrap_or_else(|_| part.nbytes());
            items.push((object, meta, part, read));
        }
        sizes.push(size);
    }
    starts.push(items.len());
    let inputs = SourceInputs::from_parts(source, items);
    // The object at `order[k]`, its parts fetched.
    let object_in = |k: usize| -> Result<ObjectIn<'_>> {
        let t = &tensors[order[k]];
        let parts = t
            .parts()
            .zip(starts[k]..starts[k + 1])
            .map(|(part, i)| {
                Ok(PartIn {
                    name: part.name().to_string(),
                    dtype: part.dtype(),
                    data: inputs.bytes(i)?,
                    compression: None,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ObjectIn {
            name: t.name().to_string(),
            shape: t.shape().to_vec(),
            layout: t.layout().to_string(),
            attributes: object_attributes(t.attributes()),
            parts,
        })
    };
    let release = |k: usize| (starts[k]..starts[k + 1]).for_each(|i| inputs.release(i));
    match options.compression {
        None => {
            for k in 0..order.len() {
                writer.add_object(object_in(k)?)?;
                release(k);
            }
        }
        Some(level) => by_window(&mut writer, level, &sizes, object_in, release)?,
    }
    if let Some(a) = attributes_cbor(source.attributes()) {
        writer.set_attributes(a)?;
    }
    finish(writer)
}

/// The objects `0..sizes.len()` (`sizes[k]` decoded bytes of object `k`,
/// fetched by `object_in`) added to `writer` with compression at `level`:
/// a window of objects at a time ([`COMPRESS_WINDOW`]) hashed and encoded
/// on every core (each part's frames too, `encoding::encode`), then added
/// in order and released, so what is held is one window and its encodings.
fn by_window<'a>(
    writer: &mut Writer,
    level: i32,
    sizes: &[u64],
    object_in: impl Fn(usize) -> Result<ObjectIn<'a>>,
    release: impl Fn(usize),
) -> Result<()> {
    let mut next = 0;
    while next < sizes.len() {
        let mut end = next;
        let mut bytes = 0u64;
        while end < sizes.len() && (end == next || bytes + sizes[end] <= COMPRESS_WINDOW) {
            bytes += sizes[end];
            end += 1;
        }
        let window = (next..end).map(&object_in).collect::<Result<Vec<_>>>()?;
        let parts: Vec<&PartIn<'_>> = window.iter().flat_map(|o| &o.parts).collect();
        let mut prepared = parts
            .par_iter()
            .map(|p| Prepared::of(p, Some(level)))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| writer.io_error(e))?
            .into_iter();
        for (k, o) in (next..end).zip(window) {
            let ready = prepared.by_ref().take(o.parts.len()).collect();
            writer.add_prepared(o, ready)?;
            release(k);
        }
        next = end;
    }
    Ok(())
}
