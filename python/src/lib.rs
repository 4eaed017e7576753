//! `zt._zt`: the native half of the `zt` Python package.
//!
//! The Python package (`python/zt/`) wraps these classes in a Mapping-shaped
//! `Source` and a numpy-friendly `Tensor`. Everything here is thread-safe
//! (`frozen` classes over `Arc`ed, immutable Rust state) and releases the GIL
//! for any work that touches tensor bytes.

use std::path::PathBuf;
use std::sync::Arc;
use zt::Rule;

use pyo3::exceptions::{
    PyFileNotFoundError, PyKeyError, PyMemoryError, PyOSError, PyPermissionError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

mod array;
mod array_struct;
mod batch_pool;
mod borrow;
mod buffer;
mod cli;
mod dataloader;
mod dlpack;
mod loader;
mod onnx_data;
mod openings;
mod private_maps;
mod quant;
mod tables;
mod tensor;
mod writers;
mod zrecord;
mod zt_writer;

pyo3::create_exception!(
    zt,
    FormatError,
    PyValueError,
    "A tensor file is malformed, hostile, or cannot be served as asked. The message names the file, the tensor and the reason; `rule` names the check that failed (\"zt.BlobOverlap\", \"safetensors.Offsets\"; see zt::Rule), or is None; `file`, `tensor` and `offset` say where, each None where the error does not say."
);

/// Map a zt error onto the Python exception a user expects. A
/// `FormatError` carries the rule the input failed as `err.rule` (its name,
/// [`zt::Rule::name`]), so callers match on data rather than message text.
pub(crate) fn to_py_err(e: zt::Error) -> PyErr {
    let message = e.to_string();
    let rule = e.rule().map(zt::Rule::name);
    let ctx = e.context().clone();
    let format_error = |message: String| {
        let err = FormatError::new_err(message);
        Python::attach(|py| {
            let value = err.value(py);
            if let Some(rule) = rule {
                let _ = value.setattr("rule", rule);
            }
            // Where the failure is, as data beside the message.
            if let Some(file) = &ctx.file {
                let _ = value.setattr("file", file.to_string_lossy().into_owned());
            }
            if let Some(tensor) = &ctx.tensor {
                let _ = value.setattr("tensor", tensor.as_str());
            }
            if let Some(offset) = ctx.offset {
                let _ = value.setattr("offset", offset);
            }
        });
        err
    };
    match e {
        zt::Error::NotFound { .. } => PyFileNotFoundError::new_err(message),
        zt::Error::NoSuchTensor { .. } => PyKeyError::new_err(message),
        zt::Error::Io { .. } => PyOSError::new_err(message),
        zt::Error::Memory { .. } => PyMemoryError::new_err(message),
        zt::Error::Remote { kind, .. } => match kind {
            zt::RemoteKind::PermissionDenied => PyPermissionError::new_err(message),
            zt::RemoteKind::Io => PyOSError::new_err(message),
            zt::RemoteKind::Config | zt::RemoteKind::Unsupported => PyValueError::new_err(message),
            zt::RemoteKind::Changed | zt::RemoteKind::BadResponse => format_error(message),
            // The core reports these as Error::NotFound and Error::Memory.
            zt::RemoteKind::NotFound => PyFileNotFoundError::new_err(message),
            zt::RemoteKind::Memory { .. } => PyMemoryError::new_err(message),
        },
        _ => format_error(message),
    }
}

/// Convert a metadata value to a Python object.
pub(crate) fn value_to_py<'py>(py: Python<'py>, v: &zt::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        zt::Value::Null => py.None().into_bound(py),
        zt::Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any(),
        zt::Value::Int(i) => i.into_pyobject(py)?.into_any(),
        zt::Value::UInt(u) => u.into_pyobject(py)?.into_any(),
        zt::Value::Float(f) => f.into_pyobject(py)?.into_any(),
        zt::Value::Str(s) => s.into_pyobject(py)?.into_any(),
        zt::Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        zt::Value::List(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(value_to_py(py, item)?)?;
            }
            list.into_any()
        }
        zt::Value::Map(entries) => attributes_to_py(py, entries)?.into_any(),
    })
}

/// Convert attributes to a Python dict.
pub(crate) fn attributes_to_py<'py>(
    py: Python<'py>,
    attributes: &zt::Attributes,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (k, v) in attributes {
        dict.set_item(k, value_to_py(py, v)?)?;
    }
    Ok(dict)
}

/// Read limits from a Python dict of `Limits` field names to integers.
fn limits_from_py(limits: Option<&Bound<'_, PyDict>>) -> PyResult<zt::Limits> {
    let mut out = zt::Limits::default();
    let Some(dict) = limits else { return Ok(out) };
    for (key, value) in dict.iter() {
        let key: String = key.extract()?;
        let value: u64 = value.extract()?;
        match key.as_str() {
            "header_bytes" => out.header_bytes = value,
            "tensors" => out.tensors = value,
            "rank" => out.rank = value as usize,
            "decoded_bytes" => out.decoded_bytes = value,
            "total_decoded_bytes" => out.total_decoded_bytes = value,
            "string_bytes" => out.string_bytes = value,
            "entries" => out.entries = value,
            "depth" => out.depth = value as usize,
            "pickle_bytes" => out.pickle_bytes = value,
            "pickle_ops" => out.pickle_ops = value,
            "pickle_objects" => out.pickle_objects = value,
            "pickle_memo" => out.pickle_memo = value,
            "pickle_stack" => out.pickle_stack = value,
            "pickle_depth" => out.pickle_depth = value as usize,
            other => return Err(PyValueError::new_err(format!("unknown limit {other:?}"))),
        }
    }
    Ok(out)
}

/// Storage options from a Python dict of `str` to `str`, `int`, `float` or
/// `bool` (written as object_store reads them).
pub(crate) fn storage_options_from_py(
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<(String, String)>> {
    let Some(dict) = options else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(dict.len());
    for (key, value) in dict.iter() {
        let key: String = key.extract()?;
        let value = if let Ok(b) = value.extract::<bool>() {
            b.to_string()
        } else if let Ok(text) = value.extract::<String>() {
            text
        } else {
            value.str()?.to_string()
        };
        out.push((key, value));
    }
    Ok(out)
}

/// The options `open` and `open_ranks` take, from their keywords.
fn open_options(
    map: bool,
    limits: Option<&Bound<'_, PyDict>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<zt::OpenOptions> {
    Ok(zt::OpenOptions {
        limits: limits_from_py(limits)?,
        map,
        storage_options: storage_options_from_py(storage_options)?,
    })
}

/// Open one file, several files as one source, or a shard index.
#[pyfunction]
#[pyo3(signature = (paths, map = true, limits = None, storage_options = None))]
fn open(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    map: bool,
    limits: Option<&Bound<'_, PyDict>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<tensor::Source> {
    let options = open_options(map, limits, storage_options)?;
    let source = py
        .detach(|| match paths.as_slice() {
            [one] => zt::open_with(one, &options),
            many => zt::open_all_with(many, &options),
        })
        .map_err(to_py_err)?;
    Ok(tensor::Source::new(source))
}

/// Open the per-rank files of a DTensor run, in rank order, as one source
/// of global tensors; `verify_replicas` compares every replica's bytes
/// with the copy taken (`zt::open_ranks_verifying`).
#[pyfunction]
#[pyo3(signature = (paths, map = true, limits = None, storage_options = None, verify_replicas = false))]
fn open_ranks(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    map: bool,
    limits: Option<&Bound<'_, PyDict>>,
    storage_options: Option<&Bound<'_, PyDict>>,
    verify_replicas: bool,
) -> PyResult<tensor::Source> {
    let options = open_options(map, limits, storage_options)?;
    let source = py
        .detach(|| zt::open_ranks_verifying(&paths, &options, verify_replicas))
        .map_err(to_py_err)?;
    Ok(tensor::Source::new(source))
}

/// The format of a file, recognised by its structure.
#[pyfunction]
#[pyo3(signature = (path, storage_options = None))]
fn detect(
    py: Python<'_>,
    path: PathBuf,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<&'static str> {
    let options = zt::OpenOptions {
        storage_options: storage_options_from_py(storage_options)?,
        ..Default::default()
    };
    py.detach(|| zt::registry().detect(&path, &options))
        .map_err(to_py_err)
}

/// Convert files (read as one source), or an opened source, to `dst`,
/// whose extension picks the format. `align` is None, "canonical", "auto" or an int; `compression` a
/// zstd level; `storage_options` reach `s3://` sources and destinations.
/// Returns the bytes written. `format` (a writer's name: "safetensors",
/// "npz", "npy", "pt", "gguf", "zt", "dcp") overrides the extension.
/// `select` (glob patterns), `strip_prefix`, `rename` (`(old, new)` pairs)
/// and `dtype` (a cast's target by name) transform the source first
/// (`zt::Transform`). `ranks`: the sources are per-rank DTensor files in
/// rank order, merged by placements (`zt::open_ranks`). `files`: the
/// number of data files of a directory output (DCP's `.distcp`).
/// `durable=False`: no fsync (`WriteOptions::no_sync`), the rename only.
/// `layout="keras"`: HDF5 in Keras 3's weights layout, `max_shard_size`
/// then Keras's own sharded form (the HDF5 writer's `H5Options`).
#[pyfunction]
#[pyo3(signature = (sources, dst, align = None, compression = None, storage_options = None, format = None, max_shard_size = None, select = None, strip_prefix = None, rename = None, dtype = None, ranks = false, files = None, durable = true, layout = None))]
#[allow(clippy::too_many_arguments)]
fn convert(
    py: Python<'_>,
    sources: Bound<'_, PyAny>,
    dst: PathBuf,
    align: Option<Bound<'_, PyAny>>,
    compression: Option<i32>,
    storage_options: Option<&Bound<'_, PyDict>>,
    format: Option<String>,
    max_shard_size: Option<u64>,
    select: Option<Vec<String>>,
    strip_prefix: Option<String>,
    rename: Option<Vec<(String, String)>>,
    dtype: Option<String>,
    ranks: bool,
    files: Option<u64>,
    durable: bool,
    layout: Option<String>,
) -> PyResult<u64> {
    let keras = match layout.as_deref() {
        None => false,
        Some("keras") => true,
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "layout={other:?}: the writer's layout convert takes is \"keras\""
            )))
        }
    };
    let transform = zt::Transform {
        select: select.unwrap_or_default(),
        rename: zt::transform::Rename {
            strip_prefix,
            map: rename.unwrap_or_default(),
        },
        dtype: dtype
            .as_deref()
            .map(zt::transform::parse_cast_dtype)
            .transpose()
            .map_err(to_py_err)?,
    };
    if let Some(name) = format.as_deref() {
        if zt::registry().writer_named(name).is_none() {
            let known: Vec<&str> = zt::registry().writers().iter().map(|w| w.name()).collect();
            return Err(PyValueError::new_err(format!(
                "zt writes no format {name:?}; it writes {known:?}"
            )));
        }
    }
    let align = align.as_ref().map(align_from_py).transpose()?;
    let storage_options = storage_options_from_py(storage_options)?;
    let open = zt::OpenOptions {
        storage_options: storage_options.clone(),
        ..Default::default()
    };
    let options = zt::WriteOptions {
        files,
        storage_options,
        no_sync: !durable,
        ..zt::WriteOptions::default()
    };
    let (options, max_shard_size) = if keras {
        keras_options(
            options,
            &dst,
            format.as_deref(),
            &align,
            compression,
            max_shard_size,
        )?
    } else {
        let options = options.with_format(zt::ZtOptions { align, compression });
        (options, max_shard_size)
    };
    // An opened source (`zt.open_ranks(...)`, `zt.open(...)`), or paths.
    let (opened, paths) = match sources.cast::<tensor::Source>() {
        Ok(_) if ranks => return Err(PyValueError::new_err(
            "ranks=True merges rank files given by path; an opened source is converted as it is",
        )),
        Ok(source) => (Some(source.get().inner()?), Vec::new()),
        Err(_) => (None, sources.extract::<Vec<PathBuf>>()?),
    };
    py.detach(|| {
        let source = match opened {
            Some(source) if transform.is_identity() => source,
            Some(source) => Arc::new(source.transform(&transform)?),
            None => {
                let source = if ranks {
                    zt::open_ranks_with(&paths, &open)?
                } else {
                    zt::open_all_with(&paths, &open)?
                };
                Arc::new(if transform.is_identity() {
                    source
                } else {
                    source.transform(&transform)?
                })
            }
        };
        if keras {
            return zt::registry().convert_to(&source, &dst, "h5", &options);
        }
        if let Some(max) = max_shard_size {
            if format.is_some() {
                return Err(zt::Error::Write {
                    rule: Rule::WRITE_OPTIONS,
                    ctx: zt::Context::file(&dst),
                    reason: "a sharded write takes its format from the extension".into(),
                });
            }
            return zt::convert_sharded(&source, &dst, max, &options).map(|w| w.bytes);
        }
        match format.as_deref() {
            None => zt::convert(&source, &dst, &options),
            Some(name) => zt::registry().convert_to(&source, &dst, name, &options),
        }
    })
    .map_err(to_py_err)
}

/// A conversion to Keras's layout: the HDF5 writer's options, Keras's
/// shard size among them (so no other sharding applies); `.zt`'s options
/// and another format refused, as `save_file(layout="keras")` refuses
/// them.
fn keras_options(
    options: zt::WriteOptions,
    dst: &std::path::Path,
    format: Option<&str>,
    align: &Option<zt::Align>,
    compression: Option<i32>,
    max_shard_size: Option<u64>,
) -> PyResult<(zt::WriteOptions, Option<u64>)> {
    use zt::formats::h5::write::{H5Options, Layout as H5Layout};
    if align.is_some() || compression.is_some() {
        return Err(PyValueError::new_err(
            "layout= is an HDF5 option; align= and compression= are .zt's",
        ));
    }
    if format.is_some_and(|f| f != "h5") {
        return Err(PyValueError::new_err(
            "layout=\"keras\" writes HDF5; format= names another format",
        ));
    }
    if max_shard_size.is_some() && zt::location::is_url(dst) {
        // As save_file: the shards and their index go beside a local path.
        return Err(PyValueError::new_err(
            "Keras's sharded weights are written to a local directory, not a URL",
        ));
    }
    let options = options.with_format(H5Options {
        layout: Some(H5Layout::Keras),
        max_shard_size,
    });
    Ok((options, None))
}

/// `align=` as Python gives it: "canonical", "auto" or an int.
pub(crate) fn align_from_py(align: &Bound<'_, PyAny>) -> PyResult<zt::Align> {
    match align.extract::<String>() {
        Ok(text) => text.parse().map_err(PyValueError::new_err),
        Err(_) => Ok(zt::Align::Bytes(align.extract::<u64>()?)),
    }
}

/// Requests this process has sent to object storage, by kind, and the
/// bytes moved: `{"gets", "heads", "puts", "lists", "bytes_in", "bytes_out"}`,
/// and the attempts that repeated a failed one: `"retries"`.
#[pyfunction]
fn remote_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let s = zt::remote::client::stats().snapshot();
    let dict = PyDict::new(py);
    dict.set_item("gets", s.gets)?;
    dict.set_item("heads", s.heads)?;
    dict.set_item("puts", s.puts)?;
    dict.set_item("lists", s.lists)?;
    dict.set_item("bytes_in", s.bytes_in)?;
    dict.set_item("bytes_out", s.bytes_out)?;
    dict.set_item("retries", s.retries)?;
    Ok(dict)
}

/// The threads `load_file(copy=True)` copies `nbytes` of raw tensors on,
/// on this machine (`zt::copy::threads_for`).
#[pyfunction]
fn copy_threads(nbytes: u64) -> usize {
    zt::copy::threads_for(nbytes)
}

/// The operating system's page size.
#[pyfunction]
fn page_size() -> u64 {
    zt::store::page_size()
}

#[pymodule]
fn _zt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let format_error = m.py().get_type::<FormatError>();
    // The class default: a FormatError raised without a rule (from Python,
    // or a changed remote object) has `rule` None.
    format_error.setattr("rule", m.py().None())?;
    // And none of `file`, `tensor`, `offset` where the error has none.
    for field in ["file", "tensor", "offset"] {
        format_error.setattr(field, m.py().None())?;
    }
    m.add("FormatError", format_error)?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(open_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(batch_pool::batch_buffer, m)?)?;
    m.add("BATCH_POOLED_FROM", batch_pool::POOLED_FROM)?;
    m.add_function(wrap_pyfunction!(detect, m)?)?;
    m.add_function(wrap_pyfunction!(page_size, m)?)?;
    m.add_function(wrap_pyfunction!(copy_threads, m)?)?;
    m.add("COPY_THREAD_BYTES", zt::copy::THREAD_BYTES)?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(quant::dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(quant::repack_mlx, m)?)?;
    m.add_function(wrap_pyfunction!(quant::repack_q4_1, m)?)?;
    m.add_function(wrap_pyfunction!(onnx_data::onnx_external_data, m)?)?;
    m.add_function(wrap_pyfunction!(remote_stats, m)?)?;
    m.add_function(wrap_pyfunction!(writers::save, m)?)?;
    m.add_function(wrap_pyfunction!(writers::parse_shard_size, m)?)?;
    m.add_function(wrap_pyfunction!(zt_writer::verify, m)?)?;
    m.add_function(wrap_pyfunction!(zt_writer::content_id, m)?)?;
    m.add_function(wrap_pyfunction!(zt_writer::canonical_violations, m)?)?;
    m.add_class::<zt_writer::Writer>()?;
    m.add_class::<tensor::Source>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<array::ArrayView>()?;
    m.add_class::<private_maps::PrivateMaps>()?;
    m.add("BufferExporter", buffer::exporter_type(m.py())?)?;
    m.add_class::<loader::Sampler>()?;
    zrecord::register(m)?;
    openings::register(m)?;
    tables::register(m)?;
    m.add_class::<dataloader::DataLoaderCore>()?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    // What tells an object URL from a local path, for the Python side.
    m.add("URL_SCHEMES", zt::location::URL_SCHEMES.to_vec())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("__commit__", zt_cli::COMMIT)?;
    Ok(())
}
