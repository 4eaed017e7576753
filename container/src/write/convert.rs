//! `zt convert` / `zt.convert` to `.zt`: a source's objects written one at
//! a time.
//!
//! Raw parts (no compression asked) go through the incremental [`Writer`]
//! object by object, each object's parts fetched as it is reached
//! ([`SourceInputs`]: read ahead a window at a time, mapped pages dropped
//! once written), so a conversion holds one object and a window, not the
//! source, and writes what the batch writer writes for the same objects
//! byte for byte (the same placement, sharing and manifest). With
//! compression the batch writer runs instead: it compresses on every core,
//! which needs the parts up front.

use std::path::Path;

use zt_core::error::Result;
use zt_core::inputs::{Bytes, InputMeta, Inputs, SourceInputs};
use zt_core::source::Source;
use zt_core::write::{WriteOptions, WrittenFile};

use super::batch::{write_objects, write_shard};
use super::input::{attributes_cbor, object_attributes, objects_of, ObjectIn, PartIn};
use super::options::Options;
use super::stream::Writer;

/// Convert `source` to a `.zt` file at `path` (durable unless
/// `options.defer_sync`: [`Options::from_write_options`]).
pub fn convert(source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
    let opts = Options::from_write_options(options);
    if streams(&opts) {
        return by_object(
            source,
            opts.canonical,
            Writer::create(path, opts)?,
            Writer::finish,
        );
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
        return by_object(source, opts.canonical, writer, Writer::finish_shard);
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

/// Whether a conversion with `options` goes object by object: raw parts
/// into a new file.
fn streams(options: &Options) -> bool {
    options.compression.is_none() && !options.append
}

/// Every object of `source` added to `writer` (in name order when
/// canonical, the order canonical placement requires; the source's
/// otherwise), then the source's attributes, then `finish`. A failure
/// drops the writer, which removes its partial file.
fn by_object<T>(
    source: &Source,
    canonical: bool,
    mut writer: Writer,
    finish: impl FnOnce(Writer) -> Result<T>,
) -> Result<T> {
    let tensors: Vec<_> = source.tensors().collect();
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    if canonical {
        order.sort_by(|&a, &b| tensors[a].name().cmp(tensors[b].name()));
    }
    // Every part in the order written, read as `objects_of` reads it:
    // dense tensors' elements in C order, other layouts as stored.
    let mut items = Vec::new();
    for &object in &order {
        let t = &tensors[object];
        let read = if t.layout() == "dense" {
            Bytes::Elements
        } else {
            Bytes::Stored
        };
        for part in t.parts() {
            let meta = InputMeta {
                name: part.name(),
                dtype: part.dtype(),
                shape: part.shape(),
            };
            items.push((object, meta, part, read));
        }
    }
    let inputs = SourceInputs::from_parts(source, items);
    let mut next = 0;
    for &object in &order {
        let t = &tensors[object];
        let first = next;
        let mut parts = Vec::new();
        for part in t.parts() {
            parts.push(PartIn {
                name: part.name().to_string(),
                dtype: part.dtype(),
                data: inputs.bytes(next)?,
                compression: None,
            });
            next += 1;
        }
        writer.add_object(ObjectIn {
            name: t.name().to_string(),
            shape: t.shape().to_vec(),
            layout: t.layout().to_string(),
            attributes: object_attributes(t.attributes()),
            parts,
        })?;
        (first..next).for_each(|i| inputs.release(i));
    }
    if let Some(a) = attributes_cbor(source.attributes()) {
        writer.set_attributes(a)?;
    }
    finish(writer)
}
