//! `zt._zt.save`: the one native entry behind `zt.save`,
//! `zt.numpy.save_file`, `safetensors`-style `save` and friends, for every
//! format in the writer registry.
//!
//! The Python side hands over each array as `(name, dtype, shape, array)`:
//! the array object itself (C-contiguous, little-endian, prepared by
//! `zt/_write.py`), whose buffer is borrowed and held for the call
//! (`borrow.rs`), so the write runs without the GIL and without copying
//! every tensor into `bytes` first.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use zt::dtype::{num_elements, DType};
use zt::formats::h5::write::{H5Options, Layout as H5Layout};
use zt::{TensorIn, Value};

use crate::borrow::{Access, Borrowed};
use crate::{storage_options_from_py, to_py_err};

/// One array as the Python wrapper describes it.
type RawTensor<'py> = (String, String, Vec<u64>, Bound<'py, PyAny>);

/// Checked descriptions and the held buffers their data slices borrow.
struct Arrays {
    names: Vec<String>,
    dtypes: Vec<DType>,
    shapes: Vec<Vec<u64>>,
    buffers: Vec<Borrowed>,
}

impl Arrays {
    /// Borrow every array's buffer, checking that it holds exactly the
    /// bytes its dtype and shape need, in elements of its dtype's width
    /// (or bytes: packed and raw data).
    fn new(tensors: Vec<RawTensor<'_>>) -> PyResult<Self> {
        let mut out = Arrays {
            names: Vec::new(),
            dtypes: Vec::new(),
            shapes: Vec::new(),
            buffers: Vec::new(),
        };
        for (name, dtype, shape, array) in tensors {
            // Formatted only for an error: 50k small tensors made naming
            // each one up front a sixth of the checks before a save writes.
            let what = TensorNamed(&name);
            let dtype = dtype_named(&dtype, what)?;
            let need = num_elements(&shape)
                .and_then(|n| dtype.nbytes(n))
                .ok_or_else(|| {
                    PyValueError::new_err(format!("{what}: shape {shape:?} overflows"))
                })?;
            let buffer = Borrowed::get(&array, what, Access::Read, false)?;
            buffer.expect_len(what, need)?;
            buffer.expect_dtype_width(what, dtype)?;
            out.names.push(name);
            out.dtypes.push(dtype);
            out.shapes.push(shape);
            out.buffers.push(buffer);
        }
        Ok(out)
    }

    /// The tensors as `TensorIn`s, borrowing the held buffers.
    fn tensors(&self) -> Vec<TensorIn<'_>> {
        (0..self.names.len())
            .map(|i| TensorIn {
                name: &self.names[i],
                dtype: self.dtypes[i],
                shape: &self.shapes[i],
                data: self.buffers[i].bytes(),
            })
            .collect()
    }
}

/// `tensor "NAME"`, as errors about one tensor name it.
#[derive(Clone, Copy)]
struct TensorNamed<'a>(&'a str);

impl std::fmt::Display for TensorNamed<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tensor {:?}", self.0)
    }
}

/// A dtype by its zTensor name.
pub(crate) fn dtype_named(name: &str, what: impl std::fmt::Display) -> PyResult<DType> {
    DType::from_name(name)
        .ok_or_else(|| PyValueError::new_err(format!("unknown dtype {name:?} for {what}")))
}

/// File metadata as attributes: a dict (str keys) of attribute values.
fn metadata_from_py(
    metadata: Option<&Bound<'_, PyDict>>,
) -> PyResult<Option<Vec<(String, Value)>>> {
    let Some(dict) = metadata else {
        return Ok(None);
    };
    let zt::container::cbor::Cbor::Map(entries) = crate::zt_writer::dict_to_cbor(dict)? else {
        unreachable!("dict_to_cbor returns a map");
    };
    Ok(Some(
        entries
            .iter()
            .map(|(k, v)| {
                let key = match k {
                    zt::container::cbor::Cbor::Text(t) => t.to_string(),
                    _ => unreachable!("dict_to_cbor keys are text"),
                };
                (key, zt::container::manifest::to_value(v))
            })
            .collect(),
    ))
}

/// Write `tensors` to `path` (a local path or an `s3://` URL) in `format`,
/// a writer's name in the registry; returns the bytes written. With
/// `path=None`, returns the file's bytes instead (safetensors only, what
/// `safetensors.*.save` returns). `metadata` (a dict, or `None` for none)
/// becomes the file attributes; `align` and `compression` reach writers
/// that place or compress (`.zt`), and the others refuse them. `layout`
/// (`"keras"`) reaches the HDF5 writer, with `max_shard_size` then
/// splitting as Keras does (`NAME.weights.json` + its shards).
/// `durable=False` skips every fsync (`WriteOptions::no_sync`): the file is
/// still built beside and renamed into place.
#[pyfunction]
#[pyo3(signature = (path, format, tensors, metadata = None, align = None, compression = None, storage_options = None, max_shard_size = None, layout = None, durable = true))]
#[allow(clippy::too_many_arguments)]
pub fn save<'py>(
    py: Python<'py>,
    path: Option<PathBuf>,
    format: &str,
    tensors: Vec<RawTensor<'py>>,
    metadata: Option<&Bound<'py, PyDict>>,
    align: Option<&Bound<'py, PyAny>>,
    compression: Option<i32>,
    storage_options: Option<&Bound<'py, PyDict>>,
    max_shard_size: Option<u64>,
    layout: Option<&str>,
    durable: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let writer = zt::registry().writer_named(format).ok_or_else(|| {
        let known: Vec<&str> = zt::registry().writers().iter().map(|w| w.name()).collect();
        PyValueError::new_err(format!(
            "zt writes no format {format:?}; it writes {known:?}"
        ))
    })?;
    let arrays = Arrays::new(tensors)?;
    let metadata = metadata_from_py(metadata)?;
    let Some(path) = path else {
        if format != "safetensors" {
            return Err(PyValueError::new_err(format!(
                "only safetensors is written to memory; {format} needs a path"
            )));
        }
        let bytes = py
            .detach(|| {
                let pairs = metadata
                    .as_deref()
                    .map(|m| zt::write::string_metadata(std::path::Path::new(""), m))
                    .transpose()?;
                zt::formats::safetensors::to_bytes(&arrays.tensors(), pairs.as_deref())
            })
            .map_err(to_py_err)?;
        return Ok(PyBytes::new(py, &bytes).into_any());
    };
    zt::shard::refuse_index_name(&path).map_err(to_py_err)?;
    let options = zt::WriteOptions {
        storage_options: storage_options_from_py(storage_options)?,
        no_sync: !durable,
        ..zt::WriteOptions::default()
    };
    // One format's options travel with a request: an HDF5 layout (which
    // carries Keras's shard size), or `.zt`'s placement and compression.
    let (options, max_shard_size) = match layout {
        Some(layout) => {
            if align.is_some() || compression.is_some() {
                return Err(PyValueError::new_err(
                    "layout= is an HDF5 option; align= and compression= are .zt's",
                ));
            }
            let layout: H5Layout = layout.parse().map_err(PyValueError::new_err)?;
            let keras_shards = max_shard_size.filter(|_| layout == H5Layout::Keras);
            if keras_shards.is_some() && zt::location::is_url(&path) {
                // The shards and their index are written beside a local
                // path; a URL's spool holds one file.
                return Err(PyValueError::new_err(
                    "Keras's sharded weights are written to a local directory, not a URL",
                ));
            }
            let options = options.with_format(H5Options {
                layout: Some(layout),
                max_shard_size: keras_shards,
            });
            (options, max_shard_size.filter(|_| keras_shards.is_none()))
        }
        None => (
            options.with_format(zt::ZtOptions {
                align: align.map(crate::align_from_py).transpose()?,
                compression,
            }),
            max_shard_size,
        ),
    };
    zt::write::check_request(writer, &path, &options, metadata.as_deref()).map_err(to_py_err)?;
    let written = match max_shard_size {
        Some(max) => {
            let layout = writer
                .shard_layout()
                .map(|layout| options.shard_layout(layout))
                .ok_or_else(|| PyValueError::new_err(format!("{format} has no sharded layout")))?;
            let all = arrays.tensors();
            py.detach(|| {
                write_shards(
                    writer,
                    &layout,
                    &all,
                    metadata.as_deref(),
                    &path,
                    &options,
                    max,
                )
            })
        }
        None => py.detach(|| {
            zt::shard::to_destination(writer, &path, &options.storage_options, |local| {
                writer.write_arrays(&arrays.tensors(), metadata.as_deref(), local, &options)
            })
        }),
    }
    .map_err(to_py_err)?;
    Ok(written.into_pyobject(py)?.into_any())
}

/// `tensors` as a checkpoint in shards of at most `max` bytes, split, named
/// and indexed as Hugging Face does (see `zt::shard`; one shard is a plain
/// file at `path`); each shard is written by the format's `write_arrays`.
fn write_shards(
    writer: &dyn zt::FormatWriter,
    layout: &zt::shard::ShardLayout,
    all: &[TensorIn<'_>],
    metadata: Option<&[(String, Value)]>,
    path: &std::path::Path,
    options: &zt::WriteOptions,
    max: u64,
) -> zt::Result<u64> {
    let names: Vec<&str> = all.iter().map(|t| t.name).collect();
    let items: Vec<zt::shard::Item> = all
        .iter()
        .map(|t| zt::shard::Item {
            size: t.data.len() as u64,
            storage: None,
        })
        .collect();
    let deferred = zt::WriteOptions {
        defer_sync: true,
        ..options.clone()
    };
    let write = |indexes: &[usize], local: &std::path::Path, defer_sync: bool| {
        let subset: Vec<TensorIn<'_>> = indexes.iter().map(|&i| all[i]).collect();
        let options = if defer_sync { &deferred } else { options };
        writer.write_arrays_shard(&subset, metadata, local, options)
    };
    // A `.zt` root records the file attributes; an index has none.
    let attributes = metadata.map(<[_]>::to_vec).unwrap_or_default();
    let tensors = zt::shard::Tensors {
        names: &names,
        items: &items,
        attributes: &attributes,
        write: &write,
    };
    zt::shard::write(path, layout, &tensors, max, &options.storage_options).map(|w| w.bytes)
}

/// Bytes from a shard size string (`"5GB"`, `"4GiB"`, `"1000"`).
#[pyfunction]
pub fn parse_shard_size(text: &str) -> PyResult<u64> {
    zt::shard::parse_size(text).map_err(PyValueError::new_err)
}
