//! The `.zt` writer, verification and identity, for `zt.Writer`,
//! `zt.verify`, `zt.numpy.save_file(..., "x.zt")`.
//!
//! Arrays arrive as the objects themselves, whose buffers are borrowed and
//! held for the call (see `borrow.rs`), so writes run without the GIL and
//! without copies. The batch write (`zt.numpy.save_file(..., "x.zt")`) is
//! `writers.rs`'s `save`, over the writer registry.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Mutex;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use zt::container::cbor::Cbor;
use zt::container::sharded::ShardedWriter;
use zt::container::write::{ObjectIn, Options, PartIn, Writer as ZtWriter};
use zt::dtype::DType;
use zt::Align;

use crate::borrow::{Access, Borrowed};
use crate::writers::dtype_named;
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

/// One part as Python describes it: (name, dtype, array, zstd level or None).
type RawPart<'py> = (String, String, Bound<'py, PyAny>, Option<i32>);

/// Parts whose buffers are borrowed and held while the writer reads them.
struct HeldParts {
    described: Vec<(String, DType, Option<i32>)>,
    buffers: Vec<Borrowed>,
}

impl HeldParts {
    /// Borrow each part's buffer: C-contiguous, in bytes or elements of its
    /// dtype's storage width (the writer checks the lengths against the
    /// shape and layout).
    fn new(parts: Vec<RawPart<'_>>) -> PyResult<Self> {
        let mut out = HeldParts {
            described: Vec::with_capacity(parts.len()),
            buffers: Vec::with_capacity(parts.len()),
        };
        for (name, dtype, array, compression) in parts {
            let what = format!("part {name:?}");
            let dtype = dtype_named(&dtype, &what)?;
            let buffer = Borrowed::get(&array, &what, Access::Read, false)?;
            buffer.expect_dtype_width(&what, dtype)?;
            out.described.push((name, dtype, compression));
            out.buffers.push(buffer);
        }
        Ok(out)
    }

    /// The parts, borrowing the held buffers.
    fn parts(&self) -> Vec<PartIn<'_>> {
        self.described
            .iter()
            .zip(&self.buffers)
            .map(|((name, dtype, compression), buffer)| PartIn {
                name: name.clone(),
                dtype: *dtype,
                data: Cow::Borrowed(buffer.bytes()),
                compression: *compression,
            })
            .collect()
    }
}

/// One file, or a sharded checkpoint (`max_shard_size`). Boxed: the
/// writer's hasher state is 64-byte aligned, more than the 16 bytes
/// CPython's allocator gives a Python object, so it cannot live inline in
/// one (a debug build's alignment check aborts).
enum Inner {
    One(Box<ZtWriter>),
    Sharded(Box<ShardedWriter>),
}

/// The same call on either writer.
macro_rules! either {
    ($inner:expr, $w:ident => $call:expr) => {
        match $inner {
            Inner::One($w) => $call,
            Inner::Sharded($w) => $call,
        }
    };
}

impl Inner {
    fn add_object(&mut self, o: ObjectIn<'_>) -> zt::Result<()> {
        either!(self, w => w.add_object(o))
    }
    fn stream(
        &mut self,
        name: &str,
        shape: &[u64],
        layout: &str,
        attributes: Option<Cbor>,
        parts: &[(&str, DType, u64)],
    ) -> zt::Result<()> {
        either!(self, w => w.stream(name, shape, layout, attributes, parts))
    }
    fn write_chunk(&mut self, chunk: &[u8]) -> zt::Result<()> {
        either!(self, w => w.write_chunk(chunk))
    }
    fn stream_position(&self) -> Option<(&str, u64)> {
        either!(self, w => w.stream_position())
    }
    fn close_stream(&mut self) -> zt::Result<()> {
        either!(self, w => w.close_stream())
    }
    fn set_attributes(&mut self, a: Cbor) -> zt::Result<()> {
        either!(self, w => w.set_attributes(a))
    }
    fn ingest(&mut self, s: &zt::Source) -> zt::Result<()> {
        either!(self, w => w.ingest(s))
    }
    fn finish(self) -> zt::Result<u64> {
        either!(self, w => w.finish())
    }
    fn abandon(self) {
        either!(self, w => w.abandon())
    }
}

/// The native `.zt` writer behind `zt.Writer`.
#[pyclass(frozen, module = "zt._zt")]
pub struct Writer {
    inner: Mutex<Option<Inner>>,
    /// For an `s3://` destination: the staged local file, uploaded by
    /// `finish` (dropped, with nothing uploaded, on abandon).
    staged: Mutex<Option<zt::remote::Staged>>,
}

impl Writer {
    fn with<T>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner) -> zt::Result<T> + Send,
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
    #[pyo3(signature = (path, canonical = true, align = None, publish = false, append = false, compression = None, storage_options = None, max_shard_size = None))]
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
        max_shard_size: Option<u64>,
    ) -> PyResult<Self> {
        let opts = options(canonical, align.as_ref(), publish, append, compression)?;
        zt::shard::refuse_index_name(&path).map_err(to_py_err)?;
        if let Some(max) = max_shard_size {
            if zt::location::is_url(&path) {
                return Err(PyValueError::new_err(
                    "max_shard_size writes a local checkpoint; write it locally and upload the directory, \
                     or use zt.convert / save_file, which shard to object storage",
                ));
            }
            let w = py
                .detach(|| ShardedWriter::create(&path, opts, max))
                .map_err(to_py_err)?;
            return Ok(Writer {
                inner: Mutex::new(Some(Inner::Sharded(Box::new(w)))),
                staged: Mutex::new(None),
            });
        }
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
            inner: Mutex::new(Some(Inner::One(Box::new(w)))),
            staged: Mutex::new(staged),
        })
    }

    /// Add an object: `parts` is a list of (name, dtype, array, level).
    #[pyo3(signature = (name, shape, parts, layout = "dense".to_string(), attributes = None))]
    fn add_object(
        &self,
        py: Python<'_>,
        name: String,
        shape: Vec<u64>,
        parts: Vec<RawPart<'_>>,
        layout: String,
        attributes: Option<Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let attributes = attributes.map(|a| dict_to_cbor(&a)).transpose()?;
        let held = HeldParts::new(parts)?;
        let o = ObjectIn {
            name,
            shape,
            layout,
            attributes,
            parts: held.parts(),
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
            .map(|(n, d, l)| {
                let d = dtype_named(&d, format_args!("part {n:?}"))?;
                Ok((n, d, l))
            })
            .collect::<PyResult<Vec<_>>>()?;
        self.with(py, move |w| {
            let refs: Vec<(&str, DType, u64)> =
                parts.iter().map(|(n, d, l)| (n.as_str(), *d, *l)).collect();
            w.stream(&name, &shape, &layout, attributes, &refs)
        })
    }

    /// Write the bytes of `chunk` (any C-contiguous buffer) to the open stream.
    fn write_chunk(&self, py: Python<'_>, chunk: Bound<'_, PyAny>) -> PyResult<()> {
        let chunk = Borrowed::get(&chunk, "chunk", Access::Read, false)?;
        self.with(py, |w| w.write_chunk(chunk.bytes()))
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
