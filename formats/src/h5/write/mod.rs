//! HDF5 written (`.h5`, `.hdf5`): groups from `/`-separated names,
//! contiguous uncompressed datasets aligned to 64 bytes (so zt's reader
//! maps them), file attributes from metadata (`name` on the root,
//! `group/name` on that group, as the reader lists them), published
//! through a partial file and a rename like every writer.
//!
//! `layout="keras"` ([`H5Options`]) writes Keras 3's `.weights.h5`:
//! names are object paths ending in `vars/N`, bfloat16 and the float8
//! types are opaque elements marked with a `dtype` attribute as Keras
//! marks bfloat16, and with a shard size the checkpoint is Keras's
//! sharded form (`NAME.weights.json` + `NAME_0000N.weights.h5`).
//!
//! A conversion carries each tensor's own attributes (an HDF5 dataset's,
//! any source's per-tensor metadata) onto its dataset, encoded as file
//! attributes are, so HDF5 to HDF5 keeps what h5py lists in `ds.attrs`.

mod encode;
mod file;
pub mod keras;
mod tree;

use std::any::Any;
use std::path::Path;

use zt_core::catalog::{Attributes, Value};
use zt_core::error::{Context, Error, Result};
use zt_core::inputs::{Inputs, SourceInputs};
use zt_core::source::Source;
use zt_core::write::{
    carried_attributes, FormatOption, FormatOptions, FormatWriter, MetadataCaps, TensorIn,
    WriteOptions, WriterCaps,
};
use zt_core::Rule;

pub use file::{ml_dtype_named, ml_dtypes_name};

/// How the file's tensors are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Any `/`-separated names; bfloat16 as HDF5's float type with its
    /// fields.
    #[default]
    Plain,
    /// Keras 3's `.weights.h5`.
    Keras,
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "plain" | "h5" => Ok(Layout::Plain),
            "keras" => Ok(Layout::Keras),
            other => Err(format!(
                "unknown HDF5 layout {other:?}: \"plain\" or \"keras\""
            )),
        }
    }
}

/// The HDF5 writer's options: its layout and, for Keras, the shard size.
#[derive(Debug, Clone, Copy, Default)]
pub struct H5Options {
    /// The layout (`None`: plain, and nothing requested).
    pub layout: Option<Layout>,
    /// Keras's sharded form: at most this many bytes of variables a
    /// shard.
    pub max_shard_size: Option<u64>,
}

/// The option's name.
pub const OPTION_LAYOUT: &str = "layout";

impl FormatOptions for H5Options {
    fn requested(&self) -> Vec<FormatOption> {
        let mut out = Vec::new();
        if self.layout.is_some() || self.max_shard_size.is_some() {
            out.push(FormatOption {
                name: OPTION_LAYOUT,
                what: "layout",
                hint: "; use .h5",
            });
        }
        out
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The HDF5 writer.
pub struct H5Writer;

impl FormatWriter for H5Writer {
    fn name(&self) -> &'static str {
        "h5"
    }

    fn extensions(&self) -> &'static [&'static str] {
        &["h5", "hdf5"]
    }

    fn caps(&self) -> WriterCaps {
        WriterCaps {
            metadata: MetadataCaps::Any,
            options: &[OPTION_LAYOUT],
            arrays: true,
        }
    }

    fn write_arrays(
        &self,
        tensors: &[TensorIn<'_>],
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        self.write_inputs(&tensors, metadata, path, options)
    }

    /// A conversion: [`zt_core::write::write_dense`]'s tensors and file
    /// attributes, and each tensor's attributes for its dataset.
    fn write(&self, source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
        let inputs = SourceInputs::new(source, path)?;
        let metadata = carried_attributes(source, self.caps().metadata);
        // `SourceInputs::new` takes the source's tensors in this order.
        let attributes: Vec<&Attributes> = source.tensors().map(|t| t.attributes()).collect();
        write_h5(&inputs, metadata.as_deref(), &attributes, path, options)
    }

    /// Streams: the file is placed from names and shapes, then each
    /// tensor fetched as its dataset's bytes are written.
    fn reads_ahead(&self) -> bool {
        true
    }

    fn write_inputs(
        &self,
        tensors: &dyn Inputs,
        metadata: Option<&[(String, Value)]>,
        path: &Path,
        options: &WriteOptions,
    ) -> Result<u64> {
        write_h5(tensors, metadata, &[], path, options)
    }
}

/// Write `tensors` with file `metadata` and, where given, each one's
/// dataset `attributes`, as the writer's options lay them out.
fn write_h5(
    tensors: &dyn Inputs,
    metadata: Option<&[(String, Value)]>,
    attributes: &[&Attributes],
    path: &Path,
    options: &WriteOptions,
) -> Result<u64> {
    let o = options
        .format_options::<H5Options>()
        .copied()
        .unwrap_or_default();
    let layout = o.layout.unwrap_or_default();
    let metadata = metadata.unwrap_or(&[]);
    let durable = options.syncs();
    match o.max_shard_size {
        None => file::publish(tensors, metadata, attributes, path, layout, durable),
        Some(max) if layout == Layout::Keras => {
            keras::publish_sharded(tensors, metadata, attributes, path, max, durable)
        }
        Some(_) => Err(Error::Write {
            rule: Rule::WRITE_OPTIONS,
            ctx: Context::file(path),
            reason: "plain HDF5 has no sharded form; layout=\"keras\" shards as Keras does".into(),
        }),
    }
}
