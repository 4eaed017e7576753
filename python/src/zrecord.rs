//! Native half of `zt.zrecord`: `RecordWriter`, `RecordReader`, the
//! dictionary trainer and `RecordBuffer` (owned gather output exposed to
//! numpy through `__array_interface__`).
//!
//! Buffers cross as `(address, nbytes)` of C-contiguous numpy arrays that
//! the Python wrapper (`zt/zrecord.py`) keeps alive for the call, so every
//! append and gather runs without the GIL. Readers are `Arc`s behind a
//! lock: `close()` drops the handle's reference, and a gather still running
//! keeps its own, so closing never frees a mapping under a read.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use pyo3::exceptions::{
    PyFileNotFoundError, PyIndexError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use zrecord::{Codec, CreateOptions, Error, Geometry, Layout, Reader, Schema, Writer};

use crate::batch_pool::{self, Pooled};

pyo3::create_exception!(
    zt,
    ZrecordError,
    PyRuntimeError,
    "A zrecord store failed: busy, exists, malformed or an I/O error. `code` is loaderx's error code."
);

/// Map a zrecord error onto the exception loaderx raises for it.
fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match e {
        Error::NotFound { .. } => PyFileNotFoundError::new_err(message),
        Error::Invalid { .. }
        | Error::Schema { .. }
        | Error::SchemaSyntax { .. }
        | Error::SchemaFields { .. }
        | Error::DtypeNotInLayout { .. }
        | Error::RecordSize { .. } => PyValueError::new_err(message),
        Error::OutOfRange { .. } => PyIndexError::new_err(message),
        Error::Memory { .. } => pyo3::exceptions::PyMemoryError::new_err(message),
        Error::Remote { kind, .. } => match kind {
            zrecord::RemoteKind::PermissionDenied => PyPermissionError::new_err(message),
            zrecord::RemoteKind::Config | zrecord::RemoteKind::Unsupported => {
                PyValueError::new_err(message)
            }
            zrecord::RemoteKind::Network => PyOSError::new_err(message),
            zrecord::RemoteKind::Changed | zrecord::RemoteKind::BadResponse => {
                crate::FormatError::new_err(message)
            }
        },
        other => {
            let code = other.code();
            Python::attach(|py| {
                let err = ZrecordError::new_err(message);
                let _ = err.value(py).setattr("code", code);
                err
            })
        }
    }
}

/// A caller's buffer.
///
/// SAFETY (upheld by `zt/zrecord.py`): `address` points to `len` bytes of a
/// live, C-contiguous numpy array that is neither freed nor resized until
/// the call returns.
unsafe fn borrowed<'a>(address: usize, len: usize) -> PyResult<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if address == 0 {
        return Err(PyValueError::new_err("null buffer"));
    }
    Ok(std::slice::from_raw_parts(address as *const u8, len))
}

/// Like [`borrowed`], writable.
unsafe fn borrowed_mut<'a>(address: usize, len: usize) -> PyResult<&'a mut [u8]> {
    if len == 0 {
        return Ok(&mut []);
    }
    if address == 0 {
        return Err(PyValueError::new_err("null buffer"));
    }
    Ok(std::slice::from_raw_parts_mut(address as *mut u8, len))
}

/// A caller's uint64 array.
unsafe fn borrowed_u64<'a>(address: usize, count: usize) -> PyResult<&'a [u64]> {
    if count == 0 {
        return Ok(&[]);
    }
    if address == 0 || !address.is_multiple_of(std::mem::align_of::<u64>()) {
        return Err(PyValueError::new_err("index array must be aligned uint64"));
    }
    Ok(std::slice::from_raw_parts(address as *const u64, count))
}

/// The `count * ndim` uint64 shapes of a Ragged append (`ndim` from the
/// writer's schema), as a store error so it surfaces like the writer's own.
///
/// # Safety
/// As [`borrowed_u64`].
unsafe fn borrowed_shapes<'a>(
    address: usize,
    count: usize,
    w: &Writer,
) -> Result<&'a [u64], Error> {
    borrowed_u64(address, count * w.schema().ndim()).map_err(|e| Error::Invalid {
        reason: e.to_string(),
    })
}

/// Owned gather output (u64 words so any element type is aligned).
#[pyclass(frozen, module = "zt._zt")]
pub struct RecordBuffer {
    words: Pooled,
    typestr: &'static str,
    shape: Vec<usize>,
}

#[pymethods]
impl RecordBuffer {
    /// numpy's array interface, version 3 (writable, C order).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("version", 3)?;
        dict.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        dict.set_item("typestr", self.typestr)?;
        dict.set_item("data", (self.words.address(), false))?;
        dict.set_item("strides", py.None())?;
        Ok(dict)
    }
}

/// A store under construction (`Dense.create` / `Ragged.create`).
#[pyclass(frozen, module = "zt._zt")]
pub struct RecordWriter {
    inner: Mutex<Option<Writer>>,
    codec: Codec,
    data_shards: usize,
    layout: Layout,
    /// For an `s3://` destination: where the store is built, uploaded on
    /// `close` (nothing is uploaded on discard).
    staged: Mutex<Option<Staged>>,
}

/// A store built locally for an object-storage destination.
struct Staged {
    _spool: zt::remote::client::Spool,
    local: PathBuf,
    dest: PathBuf,
    storage_options: Vec<(String, String)>,
}

/// The layout for its name (`"loaderx-2.8"` / `"loaderx-2.3"`).
fn layout_named(name: &str) -> PyResult<Layout> {
    Layout::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown layout {name:?}, expected 'loaderx-2.8' or 'loaderx-2.3'"
        ))
    })
}

/// The dtype text for a schema in `layout`, from NumPy's `dtype.str` and
/// `dtype.name`: loaderx 2.8 names its types (`"int32"`, `"bfloat16"`), and
/// holds one only in native (little-endian) order and at its size (`">i4"`
/// is also named `"int32"`); loaderx 2.3 writes `dtype.str`.
fn schema_dtype<'a>(layout: Layout, typestr: &'a str, name: &'a str) -> &'a str {
    let size = zrecord::schema::itemsize;
    let named = !typestr.starts_with('>')
        && zrecord::schema::LOADERX28_DTYPES
            .iter()
            .any(|&(n, t)| n == name && size(t) == size(typestr));
    match layout {
        Layout::Loaderx28 if named => name,
        _ => typestr,
    }
}

impl RecordWriter {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Writer) -> zrecord::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            match guard.as_mut() {
                Some(w) => f(w).map_err(to_py),
                None => Err(PyRuntimeError::new_err("Container is closed")),
            }
        })
    }
}

#[pymethods]
impl RecordWriter {
    /// Start a store. Exactly one of `item_shape` (Dense) or `ndim` (Ragged);
    /// `dtype` and `dtype_name` are NumPy's `dtype.str` and `dtype.name`;
    /// `layout` is `"loaderx-2.8"` or `"loaderx-2.3"`.
    #[staticmethod]
    #[pyo3(signature = (path, dtype, dtype_name, item_shape, ndim, codec, data_shards, dict_bytes, level = None, layout = "loaderx-2.8", storage_options = None))]
    #[allow(clippy::too_many_arguments)]
    fn create(
        py: Python<'_>,
        path: PathBuf,
        dtype: &str,
        dtype_name: &str,
        item_shape: Option<Vec<u64>>,
        ndim: Option<usize>,
        codec: &str,
        data_shards: usize,
        dict_bytes: Option<Vec<u8>>,
        level: Option<i32>,
        layout: &str,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let codec = Codec::from_name(codec)
            .ok_or_else(|| PyValueError::new_err(format!("unknown codec {codec:?}")))?;
        let layout = layout_named(layout)?;
        let geometry = match (item_shape, ndim) {
            (Some(item_shape), None) => Geometry::Dense { item_shape },
            (None, Some(ndim)) => Geometry::Ragged { ndim },
            _ => return Err(PyValueError::new_err("give item_shape or ndim")),
        };
        let schema = Schema::new(layout, schema_dtype(layout, dtype, dtype_name), geometry)
            .map_err(to_py)?;
        let options = CreateOptions {
            codec,
            data_shards,
            dict: dict_bytes,
            level,
        };
        let staged = if zrecord::remote::is_url(&path) {
            let storage_options = crate::storage_options_from_py(storage_options)?;
            let config = zt::remote::config(&storage_options).map_err(crate::to_py_err)?;
            let spool = zt::remote::client::Spool::create(&config)
                .map_err(|e| crate::to_py_err(zt::remote::error(e)))?;
            let name = path
                .file_name()
                .map_or("store".into(), |n| n.to_string_lossy().into_owned());
            Some(Staged {
                local: spool.path_for(&name),
                _spool: spool,
                dest: path.clone(),
                storage_options,
            })
        } else {
            None
        };
        let build_at = staged
            .as_ref()
            .map_or(path.as_path(), |s| s.local.as_path());
        let writer = py
            .detach(|| Writer::create(build_at, &schema, &options))
            .map_err(to_py)?;
        Ok(RecordWriter {
            inner: Mutex::new(Some(writer)),
            codec,
            data_shards,
            layout,
            staged: Mutex::new(staged),
        })
    }

    /// Append whole Dense rows from a C-contiguous buffer.
    fn append_dense(&self, py: Python<'_>, address: usize, nbytes: usize) -> PyResult<u64> {
        // SAFETY: see `borrowed`.
        let src = unsafe { borrowed(address, nbytes)? };
        self.with(py, |w| w.append_dense(src))
    }

    /// Append Ragged records: payloads end to end in one buffer, their byte
    /// sizes and their shapes (`count * ndim` uint64).
    fn append_ragged(
        &self,
        py: Python<'_>,
        values: (usize, usize),
        sizes: usize,
        shapes: usize,
        count: usize,
    ) -> PyResult<u64> {
        // SAFETY: see `borrowed`.
        let src = unsafe { borrowed(values.0, values.1)? };
        let sizes = unsafe { borrowed_u64(sizes, count)? };
        self.with(py, |w| {
            // SAFETY: see `borrowed`.
            let shapes = unsafe { borrowed_shapes(shapes, count, w)? };
            let mut payloads = Vec::with_capacity(count);
            let mut at = 0usize;
            for &size in sizes {
                let end = usize::try_from(size)
                    .ok()
                    .and_then(|s| at.checked_add(s))
                    .filter(|&e| e <= src.len());
                let end = end.ok_or_else(|| Error::Invalid {
                    reason: "sizes pass the values buffer".into(),
                })?;
                payloads.push(&src[at..end]);
                at = end;
            }
            w.append_ragged(&payloads, shapes)
        })
    }

    /// Append Ragged records that each sit in their own buffer: `addrs` and
    /// `sizes` are `count` uint64 (address, byte size) pairs, `shapes`
    /// `count * ndim` uint64. Large records go to the file straight from
    /// the caller's arrays instead of being packed into one buffer first.
    fn append_ragged_each(
        &self,
        py: Python<'_>,
        addrs: usize,
        sizes: usize,
        shapes: usize,
        count: usize,
    ) -> PyResult<u64> {
        // SAFETY: see `borrowed`; the caller keeps every record alive.
        let addrs = unsafe { borrowed_u64(addrs, count)? };
        let sizes = unsafe { borrowed_u64(sizes, count)? };
        let payloads = addrs
            .iter()
            .zip(sizes)
            .map(|(&a, &n)| {
                let (a, n) = (usize::try_from(a), usize::try_from(n));
                match (a, n) {
                    (Ok(a), Ok(n)) => unsafe { borrowed(a, n) },
                    _ => Err(PyValueError::new_err("record address or size out of range")),
                }
            })
            .collect::<PyResult<Vec<&[u8]>>>()?;
        self.with(py, |w| {
            // SAFETY: see `borrowed`.
            let shapes = unsafe { borrowed_shapes(shapes, count, w)? };
            w.append_ragged(&payloads, shapes)
        })
    }

    /// Records appended so far.
    fn __len__(&self) -> PyResult<usize> {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        guard
            .as_ref()
            .map(|w| w.len() as usize)
            .ok_or_else(|| PyRuntimeError::new_err("Container is closed"))
    }

    /// The codec name.
    #[getter]
    fn codec(&self) -> &'static str {
        self.codec.name()
    }

    /// The shard count.
    #[getter]
    fn data_shards(&self) -> usize {
        self.data_shards
    }

    /// The layout name (`"loaderx-2.8"` or `"loaderx-2.3"`).
    #[getter]
    fn layout(&self) -> &'static str {
        self.layout.name()
    }

    /// True once closed or discarded.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// Publish the store (waits for a running append); for an object URL,
    /// upload it (shards first, `meta.zr` last). Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let writer = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            writer.map_or(Ok(()), Writer::close)?;
            let staged = self.staged.lock().unwrap_or_else(|e| e.into_inner()).take();
            match staged {
                Some(s) => zrecord::remote::publish(&s.local, &s.dest, &s.storage_options),
                None => Ok(()),
            }
        })
        .map_err(to_py)
    }

    /// Abandon the build: nothing is published. Idempotent.
    fn discard(&self, py: Python<'_>) {
        py.detach(|| {
            let writer = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
            drop(writer);
            self.staged.lock().unwrap_or_else(|e| e.into_inner()).take();
        })
    }
}

/// An opened store (`Dense.open` / `Ragged.open`).
#[pyclass(frozen, module = "zt._zt")]
pub struct RecordReader {
    inner: RwLock<Option<Arc<Reader>>>,
}

impl RecordReader {
    /// The open reader (shared with the DataLoader, which gathers from it
    /// without reopening the store).
    pub(crate) fn get(&self) -> PyResult<Arc<Reader>> {
        let guard = self.inner.read().unwrap_or_else(|e| e.into_inner());
        guard
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("Container is closed"))
    }
}

#[pymethods]
impl RecordReader {
    /// Open a store whose schema is Dense (`dense=True`) or Ragged.
    #[staticmethod]
    #[pyo3(signature = (path, dense, storage_options = None))]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        dense: bool,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let storage_options = crate::storage_options_from_py(storage_options)?;
        let reader = py
            .detach(|| Reader::open_at(&path, Some(dense), &storage_options))
            .map_err(to_py)?;
        Ok(RecordReader {
            inner: RwLock::new(Some(Arc::new(reader))),
        })
    }

    /// `(dtype, ndim, item_shape or None)`; `dtype` as the schema spells it
    /// (a loaderx 2.8 name such as `"bfloat16"`, or a `dtype.str`).
    fn schema(&self) -> PyResult<(String, usize, Option<Vec<u64>>)> {
        let r = self.get()?;
        let s = r.schema();
        let shape = match &s.geometry {
            Geometry::Dense { item_shape } => Some(item_shape.clone()),
            Geometry::Ragged { .. } => None,
        };
        Ok((s.dtype_name.clone(), s.ndim(), shape))
    }

    /// The layout name (`"loaderx-2.8"` or `"loaderx-2.3"`), told from the
    /// schema's encoding.
    #[getter]
    fn layout(&self) -> PyResult<&'static str> {
        Ok(self.get()?.schema().layout.name())
    }

    /// Number of records.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.get()?.len() as usize)
    }

    /// The codec name.
    #[getter]
    fn codec(&self) -> PyResult<&'static str> {
        Ok(self.get()?.codec().name())
    }

    /// The shard count.
    #[getter]
    fn data_shards(&self) -> PyResult<usize> {
        Ok(self.get()?.data_shards())
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// The raw `dict.zr` bytes are not kept; this says if the store has one.
    fn has_dict(&self) -> PyResult<bool> {
        Ok(self.get()?.codec() == Codec::ZstdDict)
    }

    /// Gather Dense rows for `count` uint64 indices into a C-contiguous buffer.
    fn gather_dense(
        &self,
        py: Python<'_>,
        idxs: usize,
        count: usize,
        dst: usize,
        nbytes: usize,
    ) -> PyResult<()> {
        let reader = self.get()?;
        // SAFETY: see `borrowed`.
        let idxs = unsafe { borrowed_u64(idxs, count)? };
        let dst = unsafe { borrowed_mut(dst, nbytes)? };
        py.detach(|| reader.gather_dense(idxs, dst)).map_err(to_py)
    }

    /// Gather Ragged records: `(values u8, offsets u64[n+1] in bytes, shapes u64[n, ndim])`.
    fn gather_ragged(
        &self,
        py: Python<'_>,
        idxs: usize,
        count: usize,
    ) -> PyResult<(RecordBuffer, RecordBuffer, RecordBuffer)> {
        let reader = self.get()?;
        let ndim = reader.schema().ndim();
        // SAFETY: see `borrowed`.
        let idxs = unsafe { borrowed_u64(idxs, count)? };
        // The payloads go into a kept buffer of a dropped batch when there is
        // one (see batch_pool): large batches otherwise fault in fresh pages.
        let words = batch_pool::take_latest();
        let batch = py
            .detach(|| reader.gather_ragged_into(idxs, words))
            .map_err(to_py)?;
        let values = RecordBuffer {
            words: Pooled::new(batch.words),
            typestr: "|u1",
            shape: vec![batch.len],
        };
        let offsets = RecordBuffer {
            typestr: "<u8",
            shape: vec![batch.offsets.len()],
            words: Pooled::new(batch.offsets),
        };
        let shapes = RecordBuffer {
            typestr: "<u8",
            shape: vec![count, ndim],
            words: Pooled::new(batch.shapes),
        };
        Ok((values, offsets, shapes))
    }

    /// Release this handle (a running gather keeps its own reference).
    fn close(&self) {
        self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Train a zstd dictionary of at most `dict_bytes` on samples end to end.
#[pyfunction]
pub fn train_dict<'py>(
    py: Python<'py>,
    samples: (usize, usize),
    sizes: Vec<usize>,
    dict_bytes: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    // SAFETY: see `borrowed`.
    let samples = unsafe { borrowed(samples.0, samples.1)? };
    let dict = py
        .detach(|| zrecord::train_dict(samples, &sizes, dict_bytes))
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &dict))
}

/// `{name: (dict_bytes, sample_budget)}` for the dictionary tiers.
#[pyfunction]
pub fn dict_tiers(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for t in zrecord::DICT_TIERS {
        d.set_item(t.name, (t.dict_bytes, t.sample_budget))?;
    }
    Ok(d)
}

/// Register the zrecord classes and functions on the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ZrecordError", m.py().get_type::<ZrecordError>())?;
    m.add_class::<RecordWriter>()?;
    m.add_class::<RecordReader>()?;
    m.add_class::<RecordBuffer>()?;
    m.add_function(wrap_pyfunction!(train_dict, m)?)?;
    m.add_function(wrap_pyfunction!(dict_tiers, m)?)?;
    Ok(())
}
