//! `zt._zt`: the native half of the `zt` Python package.
//!
//! The Python package (`python/zt/`) wraps these classes in a Mapping-shaped
//! `Source` and a numpy-friendly `Tensor`. Everything here is thread-safe
//! (`frozen` classes over `Arc`ed, immutable Rust state) and releases the GIL
//! for any work that touches tensor bytes.

use std::path::PathBuf;

use pyo3::exceptions::{PyFileNotFoundError, PyKeyError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

mod array;
mod batch_pool;
mod dataloader;
mod dlpack;
mod loader;
mod tensor;
mod writers;
mod zrecord;
mod zt_writer;

pyo3::create_exception!(
    zt,
    FormatError,
    PyValueError,
    "A tensor file is malformed, hostile, or cannot be served as asked. The message names the file, the tensor and the reason."
);

/// Map a zt error onto the Python exception a user expects.
pub(crate) fn to_py_err(e: zt::Error) -> PyErr {
    let message = e.to_string();
    match e {
        zt::Error::NotFound { .. } => PyFileNotFoundError::new_err(message),
        zt::Error::NoSuchTensor { .. } => PyKeyError::new_err(message),
        zt::Error::Io { .. } => PyOSError::new_err(message),
        _ => FormatError::new_err(message),
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

/// Open one file, several files as one source, or a shard index.
#[pyfunction]
#[pyo3(signature = (paths, map = true, limits = None))]
fn open(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    map: bool,
    limits: Option<&Bound<'_, PyDict>>,
) -> PyResult<tensor::Source> {
    let options = zt::OpenOptions {
        limits: limits_from_py(limits)?,
        map,
    };
    let source = py
        .detach(|| match paths.as_slice() {
            [one] => zt::open_with(one, &options),
            many => zt::open_all_with(many, &options),
        })
        .map_err(to_py_err)?;
    Ok(tensor::Source::new(source))
}

/// The format of a file, recognised by its structure.
#[pyfunction]
fn detect(py: Python<'_>, path: PathBuf) -> PyResult<&'static str> {
    py.detach(|| zt::detect(&path)).map_err(to_py_err)
}

/// Convert files (read as one source) to `dst`, whose extension picks the
/// format. `align` is None, "canonical", "auto" or an int; `compression` a
/// zstd level. Returns the bytes written.
#[pyfunction]
#[pyo3(signature = (sources, dst, align = None, compression = None))]
fn convert(
    py: Python<'_>,
    sources: Vec<PathBuf>,
    dst: PathBuf,
    align: Option<Bound<'_, PyAny>>,
    compression: Option<i32>,
) -> PyResult<u64> {
    let align = match align {
        None => None,
        Some(a) => match a.extract::<String>() {
            Ok(s) if s == "canonical" => Some(zt::Align::Canonical),
            Ok(s) if s == "auto" => Some(zt::Align::Auto),
            Ok(s) => {
                return Err(PyValueError::new_err(format!(
                    "align={s:?}: expected None, 'canonical', 'auto' or an int"
                )))
            }
            Err(_) => Some(zt::Align::Bytes(a.extract::<u64>()?)),
        },
    };
    let options = zt::WriteOptions { align, compression };
    py.detach(|| {
        let source = zt::open_all(&sources)?;
        zt::convert(&source, &dst, &options)
    })
    .map_err(to_py_err)
}

/// The operating system's page size.
#[pyfunction]
fn page_size() -> u64 {
    zt::store::page_size()
}

#[pymodule]
fn _zt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FormatError", m.py().get_type::<FormatError>())?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    m.add_function(wrap_pyfunction!(batch_pool::batch_buffer, m)?)?;
    m.add("BATCH_POOLED_FROM", batch_pool::POOLED_FROM)?;
    m.add_function(wrap_pyfunction!(detect, m)?)?;
    m.add_function(wrap_pyfunction!(page_size, m)?)?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    m.add_function(wrap_pyfunction!(writers::write_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(writers::write_npy, m)?)?;
    m.add_function(wrap_pyfunction!(writers::write_npz, m)?)?;
    m.add_function(wrap_pyfunction!(writers::write_pt, m)?)?;
    m.add_function(wrap_pyfunction!(zt_writer::write_zt, m)?)?;
    m.add_function(wrap_pyfunction!(zt_writer::verify, m)?)?;
    m.add_function(wrap_pyfunction!(zt_writer::content_id, m)?)?;
    m.add_function(wrap_pyfunction!(zt_writer::canonical_violations, m)?)?;
    m.add_class::<zt_writer::Writer>()?;
    m.add_class::<tensor::Source>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<array::ArrayView>()?;
    m.add_class::<loader::Sampler>()?;
    zrecord::register(m)?;
    m.add_class::<dataloader::DataLoaderCore>()?;
    m.add_class::<dataloader::LoaderBuffer>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
