//! Native half of `zt.zrecord`: `RecordWriter`, `RecordReader`, the
//! dictionary trainer. Gather output reaches numpy as `ArrayView`s over
//! pooled words (`array.rs`, `batch_pool.rs`).
//!
//! Arrays cross as the objects themselves, whose buffers are borrowed and
//! held for the call (`borrow.rs`: C-contiguous, writable where a gather
//! writes, index arrays of native 8-byte integers), so every append and
//! gather runs without the GIL and no Python caller can name memory it
//! does not own. Readers are `Arc`s behind a
//! lock: `close()` drops the handle's reference, and a gather still running
//! keeps its own, so closing never frees a mapping under a read.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use pyo3::exceptions::{
    PyFileNotFoundError, PyIndexError, PyOSError, PyPermissionError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use zrecord::{Codec, CreateOptions, Error, Geometry, Layout, Reader, Schema, Writer};

use crate::array::{ArrayView, Keep};
use crate::batch_pool::{self, Pooled};
use crate::borrow::{Access, Borrowed};

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
        Error::Dataset { rule, .. } => {
            let err = crate::FormatError::new_err(message);
            Python::attach(|py| {
                let _ = err.value(py).setattr("rule", rule);
            });
            err
        }
        Error::Memory { .. } => pyo3::exceptions::PyMemoryError::new_err(message),
        Error::Remote { kind, .. } => match kind {
            zrecord::RemoteKind::PermissionDenied => PyPermissionError::new_err(message),
            zrecord::RemoteKind::Config | zrecord::RemoteKind::Unsupported => {
                PyValueError::new_err(message)
            }
            zrecord::RemoteKind::Io => PyOSError::new_err(message),
            zrecord::RemoteKind::Changed | zrecord::RemoteKind::BadResponse => {
                crate::FormatError::new_err(message)
            }
            // zrecord reports these as Error::NotFound and Error::Memory.
            zrecord::RemoteKind::NotFound => {
                pyo3::exceptions::PyFileNotFoundError::new_err(message)
            }
            zrecord::RemoteKind::Memory { .. } => pyo3::exceptions::PyMemoryError::new_err(message),
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

/// The `count * ndim` uint64 shapes of a Ragged append (`ndim` from the
/// writer's schema), checked as a store error so it surfaces like the
/// writer's own.
fn shapes_of<'a>(shapes: &'a Borrowed, count: usize, w: &Writer) -> Result<&'a [u64], Error> {
    let invalid = |reason: String| Error::Invalid { reason };
    let words = shapes.u64s("shapes").map_err(|e| invalid(e.to_string()))?;
    let want = count.checked_mul(w.schema().ndim());
    if want != Some(words.len()) {
        return Err(invalid(format!(
            "shapes holds {} integers, expected {count} records x {} dims",
            words.len(),
            w.schema().ndim()
        )));
    }
    Ok(words)
}

/// A read-only C-contiguous buffer of `obj`.
fn read(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Borrowed> {
    Borrowed::get(obj, what, Access::Read, false)
}

/// A buffer of native 8-byte integers (`idxs`, `sizes`, `shapes`).
fn words(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Borrowed> {
    let b = Borrowed::get(obj, what, Access::Read, true)?;
    b.u64s(what)?;
    Ok(b)
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
    // The size is the digits after the kind, read without
    // `zrecord::schema::itemsize`'s check that NumPy parses the string:
    // ml_dtypes' float8_e5m2 has the `dtype.str` "<f1", which only its name
    // makes a type.
    let size = |t: &str| t.get(2..).and_then(|d| d.parse::<usize>().ok());
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

    /// Append whole Dense rows from a C-contiguous array.
    fn append_dense(&self, py: Python<'_>, records: Bound<'_, PyAny>) -> PyResult<u64> {
        let src = read(&records, "records")?;
        self.with(py, |w| w.append_dense(src.bytes()))
    }

    /// Append Ragged records: payloads end to end in one array, their byte
    /// sizes (uint64) and their shapes (`count * ndim` uint64).
    fn append_ragged(
        &self,
        py: Python<'_>,
        values: Bound<'_, PyAny>,
        sizes: Bound<'_, PyAny>,
        shapes: Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let values = read(&values, "values")?;
        let sizes = words(&sizes, "sizes")?;
        let shapes = words(&shapes, "shapes")?;
        let src = values.bytes();
        let sizes = sizes.u64s("sizes")?;
        let count = sizes.len();
        self.with(py, |w| {
            let shapes = shapes_of(&shapes, count, w)?;
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

    /// Append Ragged records that each sit in their own array (C-contiguous;
    /// a record's bytes are its array's), with their shapes (`count * ndim`
    /// uint64). Large records go to the file straight from the caller's
    /// arrays instead of being packed into one buffer first.
    fn append_ragged_each(
        &self,
        py: Python<'_>,
        records: Vec<Bound<'_, PyAny>>,
        shapes: Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let held = records
            .iter()
            .enumerate()
            .map(|(i, r)| read(r, &format!("records[{i}]")))
            .collect::<PyResult<Vec<_>>>()?;
        let shapes = words(&shapes, "shapes")?;
        let payloads: Vec<&[u8]> = held.iter().map(Borrowed::bytes).collect();
        self.with(py, |w| {
            let shapes = shapes_of(&shapes, payloads.len(), w)?;
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

    /// Open `paths` (stores, in order) as one dataset; every store must
    /// have the same schema and codec (see `zrecord::dataset`).
    #[staticmethod]
    #[pyo3(signature = (paths, dense, storage_options = None))]
    fn open_many(
        py: Python<'_>,
        paths: Vec<PathBuf>,
        dense: bool,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let storage_options = crate::storage_options_from_py(storage_options)?;
        let reader = py
            .detach(|| zrecord::open_many(&paths, Some(dense), &storage_options))
            .map_err(to_py)?;
        Ok(RecordReader {
            inner: RwLock::new(Some(Arc::new(reader))),
        })
    }

    /// Column `column` of a MosaicML MDS dataset (its directory or
    /// `index.json`, local or at an object-storage prefix) as a Dense (`dense=True`: a fixed-size encoding) or
    /// Ragged source of rank `ndim` (`zrecord::mds`).
    #[staticmethod]
    #[pyo3(signature = (path, dense, column, ndim, storage_options = None))]
    fn open_mds(
        py: Python<'_>,
        path: PathBuf,
        dense: bool,
        column: String,
        ndim: usize,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let storage_options = crate::storage_options_from_py(storage_options)?;
        let reader = py
            .detach(|| Reader::open_mds_at(&path, &column, ndim, &storage_options))
            .map_err(to_py)?;
        let is_dense = matches!(reader.schema().geometry, Geometry::Dense { .. });
        if is_dense != dense {
            let (want, other) = if dense {
                ("Dense", "Ragged")
            } else {
                ("Ragged", "Dense")
            };
            return Err(PyValueError::new_err(format!(
                "MDS column {column:?} is a {other} source, not {want}: use {other}.open_mds"
            )));
        }
        Ok(RecordReader {
            inner: RwLock::new(Some(Arc::new(reader))),
        })
    }

    /// One reader over open readers, in order (a mixture's datasets as one
    /// index space; `zrecord::concat`): nothing is reopened or copied.
    #[staticmethod]
    fn concat(readers: Vec<Py<RecordReader>>) -> PyResult<Self> {
        let readers = readers
            .iter()
            .map(|r| r.get().get())
            .collect::<PyResult<Vec<_>>>()?;
        let reader = zrecord::concat(readers).map_err(to_py)?;
        Ok(RecordReader {
            inner: RwLock::new(Some(Arc::new(reader))),
        })
    }

    /// Open a Megatron indexed dataset (`PREFIX`, `PREFIX.idx` or
    /// `PREFIX.bin`, local or at an object-storage prefix) as a Ragged
    /// source: its sequences, or with `documents` its documents, as records.
    #[staticmethod]
    #[pyo3(signature = (path, documents, storage_options = None))]
    fn open_binidx(
        py: Python<'_>,
        path: PathBuf,
        documents: bool,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let storage_options = crate::storage_options_from_py(storage_options)?;
        let unit = if documents {
            zrecord::binidx::Unit::Document
        } else {
            zrecord::binidx::Unit::Sequence
        };
        let reader = py
            .detach(|| Reader::open_binidx_at(&path, unit, &storage_options))
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

    /// The codec name, or "mixed" for a concatenation of stores whose
    /// codecs differ (`codecs` lists each store's).
    #[getter]
    fn codec(&self) -> PyResult<&'static str> {
        Ok(self.get()?.codec_name())
    }

    /// Each store's codec name, in record order.
    #[getter]
    fn codecs(&self) -> PyResult<Vec<&'static str>> {
        Ok(self.get()?.codecs().into_iter().map(Codec::name).collect())
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

    /// The raw `dict.zr` bytes are not kept; this says if the store (any
    /// store of a concatenation) has one.
    fn has_dict(&self) -> PyResult<bool> {
        Ok(self.get()?.codecs().contains(&Codec::ZstdDict))
    }

    /// Gather Dense rows for uint64 indices `idxs` into `out`, a writable
    /// C-contiguous array of exactly their bytes (the reader checks the
    /// length).
    fn gather_dense(
        &self,
        py: Python<'_>,
        idxs: Bound<'_, PyAny>,
        out: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let reader = self.get()?;
        let idxs = words(&idxs, "idxs")?;
        let mut out = Borrowed::get(&out, "out", Access::Write, false)?;
        let idxs = idxs.u64s("idxs")?;
        let dst = out.bytes_mut();
        py.detach(|| reader.gather_dense(idxs, dst)).map_err(to_py)
    }

    /// Gather Ragged records: `(values u8, offsets u64[n+1] in bytes, shapes u64[n, ndim])`.
    fn gather_ragged(
        &self,
        py: Python<'_>,
        idxs: Bound<'_, PyAny>,
    ) -> PyResult<(ArrayView, ArrayView, ArrayView)> {
        let reader = self.get()?;
        let ndim = reader.schema().ndim();
        let idxs = words(&idxs, "idxs")?;
        let idxs = idxs.u64s("idxs")?;
        let count = idxs.len();
        // The payloads go into a kept buffer of a dropped batch when there is
        // one (see batch_pool): large batches otherwise fault in fresh pages.
        let words = batch_pool::take_latest();
        let batch = py
            .detach(|| reader.gather_ragged_into(idxs, words))
            .map_err(to_py)?;
        // Owned u64 words, so any element type is aligned.
        let view = |words: Vec<u64>, typestr: &'static str, shape| {
            let address = words.as_ptr() as usize;
            ArrayView::kept(
                Keep::Pooled(Pooled::new(words)),
                address,
                typestr.into(),
                shape,
            )
        };
        let offsets_len = batch.offsets.len();
        Ok((
            view(batch.words, "|u1", vec![batch.len]),
            view(batch.offsets, "<u8", vec![offsets_len]),
            view(batch.shapes, "<u8", vec![count, ndim]),
        ))
    }

    /// Train this store's zstd dictionary for the tier named `tier` on the
    /// records loaderx would pick (`zrecord::samples`).
    fn train_dict<'py>(&self, py: Python<'py>, tier: &str) -> PyResult<Bound<'py, PyBytes>> {
        let reader = self.get()?;
        let tier = zrecord::DICT_TIERS
            .iter()
            .find(|t| t.name == tier)
            .ok_or_else(|| PyValueError::new_err(format!("unknown dictionary tier {tier:?}")))?;
        let dict = py
            .detach(|| zrecord::train_store_dict(&reader, tier))
            .map_err(to_py)?;
        Ok(PyBytes::new(py, &dict))
    }

    /// Release this handle (a running gather keeps its own reference).
    fn close(&self) {
        self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// Write a dataset manifest listing `stores` (in order) at `manifest`,
/// copying no record; returns the number of records in all.
#[pyfunction]
#[pyo3(signature = (stores, manifest, storage_options = None))]
pub fn zrecord_concat(
    py: Python<'_>,
    stores: Vec<PathBuf>,
    manifest: PathBuf,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<u64> {
    let storage_options = crate::storage_options_from_py(storage_options)?;
    let written = py
        .detach(|| zrecord::write_manifest(&stores, &manifest, &storage_options))
        .map_err(to_py)?;
    Ok(written.stores.iter().map(|e| e.records).sum())
}

/// Train a zstd dictionary of at most `dict_bytes` on samples end to end.
#[pyfunction]
pub fn train_dict<'py>(
    py: Python<'py>,
    samples: Bound<'py, PyAny>,
    sizes: Vec<usize>,
    dict_bytes: usize,
) -> PyResult<Bound<'py, PyBytes>> {
    let samples = read(&samples, "samples")?;
    let dict = py
        .detach(|| zrecord::train_dict(samples.bytes(), &sizes, dict_bytes))
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &dict))
}

/// The records of `total` (of `item_bytes` each) that train a dictionary
/// within `budget` bytes, as loaderx picks them (`zrecord::samples`).
#[pyfunction]
pub fn zrecord_sample_indices(total: u64, item_bytes: u64, budget: u64) -> Vec<u64> {
    zrecord::samples::spread_indices(
        total,
        zrecord::samples::sample_count(total, item_bytes, budget),
    )
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
    m.add_function(wrap_pyfunction!(train_dict, m)?)?;
    m.add_function(wrap_pyfunction!(dict_tiers, m)?)?;
    m.add_function(wrap_pyfunction!(zrecord_concat, m)?)?;
    m.add_function(wrap_pyfunction!(zrecord_sample_indices, m)?)?;
    Ok(())
}
