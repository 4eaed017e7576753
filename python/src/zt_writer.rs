//! The `.zt` writer, verification and identity, for `zt.Writer`,
//! `zt.verify`, `zt.numpy.save_file(..., "x.zt")`.
//!
//! Arrays arrive as `(address, nbytes)` of C-contiguous numpy buffers the
//! Python side keeps alive for the call (see `writers.rs`), so writes run
//! without the GIL and without copies.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use zt::container::cbor::Cbor;
use zt::container::write::{ObjectIn, Options, PartIn, Writer as ZtWriter};
use zt::dtype::DType;
use zt::Align;

use crate::{storage_options_from_py, to_py_err};

/// A Python value as a CBOR attribute value.
pub fn py_to_cbor(v: &Bound<'_, PyAny>) -> PyResult<Cbor> {
    if v.is_none() {
        return Ok(Cbor::Null);
    }
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(Cbor::Bool(b.is_true()));
    }
    if v.cast::<PyInt>().is_ok() {
        if let Ok(u) = v.extract::<u64>() {
            return Ok(Cbor::UInt(u));
        }
        if let Ok(i) = v.extract::<i64>() {
            return Ok(Cbor::int(i));
        }
        let i: i128 = v.extract()?;
        if (-(1i128 << 64)..0).contains(&i) {
            return Ok(Cbor::NInt((-1 - i) as u64));
        }
        return Err(PyValueError::new_err(format!(
            "integer {i} does not fit CBOR"
        )));
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(Cbor::Float(f.value()));
    }
    if v.cast::<PyString>().is_ok() {
        return Ok(Cbor::Text(v.extract::<String>()?.into()));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(Cbor::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        return dict_to_cbor(d);
    }
    if let Ok(l) = v.cast::<PyList>() {
        return l
            .iter()
            .map(|x| py_to_cbor(&x))
            .collect::<PyResult<_>>()
            .map(Cbor::Array);
    }
    if let Ok(t) = v.cast::<PyTuple>() {
        return t
            .iter()
            .map(|x| py_to_cbor(&x))
            .collect::<PyResult<_>>()
            .map(Cbor::Array);
    }
    Err(PyTypeError::new_err(format!(
        "{} is not representable as a zTensor attribute",
        v.get_type().name()?
    )))
}

/// A dict with str keys as a CBOR map.
pub fn dict_to_cbor(d: &Bound<'_, PyDict>) -> PyResult<Cbor> {
    let mut out = Vec::with_capacity(d.len());
    for (k, v) in d.iter() {
        let k: String = k
            .extract()
            .map_err(|_| PyTypeError::new_err("attribute keys must be str"))?;
        out.push((Cbor::Text(k.into()), py_to_cbor(&v)?));
    }
    Ok(Cbor::Map(out))
}

fn dtype_of(name: &str) -> PyResult<DType> {
    DType::from_name(name).ok_or_else(|| PyValueError::new_err(format!("unknown dtype {name:?}")))
}

/// SAFETY contract (upheld by `zt/_zt_writer.py`): `address` points to
/// `nbytes` readable bytes that stay alive and unchanged during the call.
unsafe fn borrow<'a>(address: usize, nbytes: usize) -> PyResult<&'a [u8]> {
    if nbytes == 0 {
        return Ok(&[]);
    }
    if address == 0 {
        return Err(PyValueError::new_err("null buffer"));
    }
    // SAFETY: see the function contract.
    Ok(unsafe { std::slice::from_raw_parts(address as *const u8, nbytes) })
}

/// Parse the Python-side placement into writer options.
pub fn options(
    canonical: bool,
    align: Option<&Bound<'_, PyAny>>,
    publish: bool,
    append: bool,
    compression: Option<i32>,
) -> PyResult<Options> {
    let align = match align {
        None if canonical => Align::Canonical,
        None => Align::Auto,
        Some(a) => crate::align_from_py(a)?,
    };
    Ok(Options {
        canonical,
        align,
        publish,
        append,
        compression,
    })
}

/// One part as Python describes it: (name, dtype, address, nbytes, zstd level or None).
type RawPart = (String, String, usize, usize, Option<i32>);

fn parts_in(parts: Vec<RawPart>) -> PyResult<Vec<PartIn<'static>>> {
    parts
        .into_iter()
        .map(|(name, dtype, address, nbytes, compression)| {
            Ok(PartIn {
                name,
                dtype: dtype_of(&dtype)?,
                // SAFETY: the caller keeps the buffers alive for the call;
                // the 'static lifetime never escapes it.
                data: Cow::Borrowed(unsafe { borrow(address, nbytes)? }),
                compression,
            })
        })
        .collect()
}

/// The native `.zt` writer behind `zt.Writer`.
#[pyclass(frozen, module = "zt._zt")]
pub struct Writer {
    inner: Mutex<Option<ZtWriter>>,
    /// For an `s3://` destination: the staged local file, uploaded by
    /// `finish` (dropped, with nothing uploaded, on abandon).
    staged: Mutex<Option<zt::remote::Staged>>,
}

impl Writer {
    fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut ZtWriter) -> zt::Result<T> + Send,
    ) -> PyResult<T>
    where
        T: Send,
    {
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let w = guard
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("the writer is finished or abandoned"))?;
        py.detach(|| f(w)).map_err(to_py_err)
    }
}

#[pymethods]
impl Writer {
    #[new]
    #[pyo3(signature = (path, canonical = true, align = None, publish = false, append = false, compression = None, storage_options = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        canonical: bool,
        align: Option<Bound<'_, PyAny>>,
        publish: bool,
        append: bool,
        compression: Option<i32>,
        storage_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let opts = options(canonical, align.as_ref(), publish, append, compression)?;
        let staged = if zt::location::is_url(&path) {
            if append {
                return Err(PyValueError::new_err(
                    "append amends a local file; an object cannot be amended in place",
                ));
            }
            let so = storage_options_from_py(storage_options)?;
            Some(zt::remote::Staged::new(&path, &so).map_err(to_py_err)?)
        } else {
            None
        };
        let local = staged.as_ref().map_or(path.as_path(), |s| s.local());
        let w = py
            .detach(|| ZtWriter::create(local, opts))
            .map_err(to_py_err)?;
        Ok(Writer {
            inner: Mutex::new(Some(w)),
            staged: Mutex::new(staged),
        })
    }

    /// Add an object: `parts` is a list of (name, dtype, address, nbytes, level).
    #[pyo3(signature = (name, shape, parts, layout = "dense".to_string(), attributes = None))]
    fn add_object(
        &self,
        py: Python<'_>,
        name: String,
        shape: Vec<u64>,
        parts: Vec<RawPart>,
        layout: String,
        attributes: Option<Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let attributes = attributes.map(|a| dict_to_cbor(&a)).transpose()?;
        let parts = parts_in(parts)?;
        let o = ObjectIn {
            name,
            shape,
            layout,
            attributes,
            parts,
        };
        self.with(py, move |w| w.add_object(o))
    }

    /// Declare a streamed object: `parts` is a list of (name, dtype, nbytes).
    #[pyo3(signature = (name, shape, parts, layout = "dense".to_string(), attributes = None))]
    fn stream(
        &self,
        py: Python<'_>,
        name: String,
        shape: Vec<u64>,
        parts: Vec<(String, String, u64)>,
        layout: String,
        attributes: Option<Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let attributes = attributes.map(|a| dict_to_cbor(&a)).transpose()?;
        let parts = parts
            .into_iter()
            .map(|(n, d, l)| Ok((n, dtype_of(&d)?, l)))
            .collect::<PyResult<Vec<_>>>()?;
        self.with(py, move |w| {
            let refs: Vec<(&str, DType, u64)> =
                parts.iter().map(|(n, d, l)| (n.as_str(), *d, *l)).collect();
            w.stream(&name, &shape, &layout, attributes, &refs)
        })
    }

    /// Write bytes of the open stream (address, nbytes of a live buffer).
    fn write_chunk(&self, py: Python<'_>, address: usize, nbytes: usize) -> PyResult<()> {
        // SAFETY: the caller keeps the buffer alive for the call.
        let chunk = unsafe { borrow(address, nbytes)? };
        self.with(py, move |w| w.write_chunk(chunk))
    }

    /// (part name, bytes written) of the open stream, or None.
    fn stream_position(&self) -> PyResult<Option<(String, u64)>> {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        Ok(guard
            .as_ref()
            .and_then(|w| w.stream_position().map(|(n, k)| (n.to_string(), k))))
    }

    /// Close the open stream.
    fn close_stream(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |w| w.close_stream())
    }

    /// Set the file attributes.
    fn set_attributes(&self, py: Python<'_>, attributes: Bound<'_, PyDict>) -> PyResult<()> {
        let a = dict_to_cbor(&attributes)?;
        self.with(py, move |w| w.set_attributes(a))
    }

    /// Add every tensor of a native source.
    fn ingest(&self, py: Python<'_>, source: &crate::tensor::Source) -> PyResult<()> {
        let s = source.inner()?;
        self.with(py, move |w| w.ingest(&s))
    }

    /// Write the manifest and footer (and upload, for an object URL);
    /// returns the file size.
    fn finish(&self, py: Python<'_>) -> PyResult<u64> {
        let w = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| PyValueError::new_err("the writer is finished or abandoned"))?;
        let staged = self.staged.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| {
            let size = w.finish()?;
            if let Some(staged) = staged {
                staged.upload()?;
            }
            Ok(size)
        })
        .map_err(to_py_err)
    }

    /// Discard everything written (nothing is uploaded).
    fn abandon(&self) {
        if let Some(w) = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.abandon();
        }
        self.staged.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// True once finished or abandoned.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }
}

/// Write objects in one batch (`zt.numpy.save_file`): objects are
/// (name, shape, layout, parts) with parts as in `Writer.add_object`.
#[pyfunction]
#[pyo3(signature = (path, objects, attributes = None, canonical = true, align = None, compression = None, storage_options = None, max_shard_size = None))]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub fn write_zt(
    py: Python<'_>,
    path: PathBuf,
    objects: Vec<(String, Vec<u64>, String, Vec<RawPart>)>,
    attributes: Option<Bound<'_, PyDict>>,
    canonical: bool,
    align: Option<Bound<'_, PyAny>>,
    compression: Option<i32>,
    storage_options: Option<&Bound<'_, PyDict>>,
    max_shard_size: Option<u64>,
) -> PyResult<u64> {
    let storage_options = storage_options_from_py(storage_options)?;
    let opts = options(canonical, align.as_ref(), false, false, compression)?;
    let attributes = attributes.map(|a| dict_to_cbor(&a)).transpose()?;
    let objects = objects
        .into_iter()
        .map(|(name, shape, layout, parts)| {
            Ok(ObjectIn {
                name,
                shape,
                layout,
                attributes: None,
                parts: parts_in(parts)?,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    if let Some(max) = max_shard_size {
        return write_zt_sharded(py, &path, objects, attributes, &opts, max, &storage_options);
    }
    py.detach(|| {
        zt::publish::to_location(&path, &storage_options, |local| {
            zt::container::write::write_objects(local, objects, attributes, &opts)
        })
    })
    .map_err(to_py_err)
}

/// `write_zt` in shards of at most `max` bytes: ordinary `.zt` shards
/// `STEM-00001.zt`, ... and a root at `path` (see `zt::shard`).
fn write_zt_sharded(
    py: Python<'_>,
    path: &Path,
    objects: Vec<ObjectIn<'_>>,
    attributes: Option<Cbor>,
    opts: &Options,
    max: u64,
    storage_options: &[(String, String)],
) -> PyResult<u64> {
    let layout = zt::registry()
        .writer_named("zt")
        .and_then(|w| w.shard_layout())
        .expect("the .zt writer has a shard layout");
    let names: Vec<&str> = objects.iter().map(|o| o.name.as_str()).collect();
    let items: Vec<zt::shard::Item> = objects
        .iter()
        .map(|o| zt::shard::Item {
            size: o.parts.iter().map(|p| p.data.len() as u64).sum(),
            storage: None,
        })
        .collect();
    let attrs = zt::container::manifest::attributes_of(&attributes);
    let write = |indexes: &[usize], local: &Path| {
        let subset: Vec<ObjectIn<'_>> = indexes.iter().map(|&i| objects[i].clone()).collect();
        zt::container::write::write_objects(local, subset, attributes.clone(), opts)
    };
    let tensors = zt::shard::Tensors {
        names: &names,
        items: &items,
        attributes: &attrs,
        write: &write,
    };
    py.detach(|| zt::shard::write(path, &layout, &tensors, max, storage_options))
        .map(|w| w.bytes)
        .map_err(to_py_err)
}

/// Verify a file; returns (checked, undigested).
#[pyfunction]
#[pyo3(signature = (path, deep = false))]
pub fn verify(py: Python<'_>, path: PathBuf, deep: bool) -> PyResult<(u64, u64)> {
    let v = py.detach(|| zt::verify(&path, deep)).map_err(to_py_err)?;
    Ok((v.checked, v.undigested))
}

/// The content digest of a `.zt` file (`"sha256:..."`).
#[pyfunction]
pub fn content_id(py: Python<'_>, path: PathBuf) -> PyResult<String> {
    py.detach(|| zt::container::verify::content_digest(&path))
        .map(|d| d.to_string())
        .map_err(to_py_err)
}

/// The canonical-form violations of a `.zt` file: (rule, detail) pairs.
#[pyfunction]
pub fn canonical_violations(py: Python<'_>, path: PathBuf) -> PyResult<Vec<(u8, String)>> {
    py.detach(|| zt::container::verify::canonical_violations(&path))
        .map(|v| v.into_iter().map(|x| (x.rule, x.detail)).collect())
        .map_err(to_py_err)
}
