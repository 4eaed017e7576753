//! The native `Source` and `Tensor` classes.

use std::sync::{Arc, RwLock};

use pyo3::exceptions::{PyKeyError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::array::ArrayView;
use crate::borrow::{refuse_shared, Access, Borrowed};
use crate::{attributes_to_py, to_py_err};

/// An opened set of tensor files. `close()` drops this handle's reference;
/// arrays and tensors handed out keep the mapping alive until they go.
#[pyclass(frozen, module = "zt._zt")]
pub struct Source {
    inner: RwLock<Option<Arc<zt::Source>>>,
}

impl Source {
    pub fn new(source: zt::Source) -> Self {
        Source {
            inner: RwLock::new(Some(Arc::new(source))),
        }
    }

    /// The shared Rust source (an error once closed).
    pub(crate) fn inner(&self) -> PyResult<Arc<zt::Source>> {
        self.get()
    }

    fn get(&self) -> PyResult<Arc<zt::Source>> {
        let guard = self.inner.read().unwrap_or_else(|e| e.into_inner());
        guard
            .clone()
            .ok_or_else(|| PyValueError::new_err("the source is closed"))
    }
}

#[pymethods]
impl Source {
    /// Tensor names in file order, as a list built straight from the
    /// names (no owned copy of each first).
    fn names<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.get()?.names().map(|name| PyString::new(py, name)))
    }

    fn __len__(&self) -> PyResult<usize> {
        Ok(self.get()?.len())
    }

    fn __contains__(&self, name: &str) -> PyResult<bool> {
        Ok(self.get()?.get(name).is_some())
    }

    /// The tensor called `name` (KeyError if absent).
    fn tensor(&self, name: &str) -> PyResult<Tensor> {
        let source = self.get()?;
        let index = source
            .position(name)
            .ok_or_else(|| PyKeyError::new_err(name.to_string()))?;
        Ok(Tensor {
            source,
            index,
            part: None,
        })
    }

    /// The arrays of the single-part tensors `names` (see `Tensor._array`),
    /// read together: over the network, one planned batch of concurrent
    /// ranged GETs instead of one request after another; a local copy
    /// (`copy=True`) `pread` into destinations allocated first, in file
    /// order on the cores its size warrants (`zt::copy::owned_bytes_of`).
    fn _arrays(&self, py: Python<'_>, names: Vec<String>, copy: bool) -> PyResult<Vec<ArrayView>> {
        let source = self.get()?;
        py.detach(|| {
            let parts = names
                .iter()
                .map(|n| source.tensor(n).and_then(|t| t.data()))
                .collect::<zt::Result<Vec<_>>>()?;
            if copy && !source.is_remote() {
                // No read-ahead: the copy's own `pread`s, in file order,
                // are the read (reading ahead would copy every byte out of
                // the kernel twice, or build page tables the copy skips).
                let owned = zt::copy::owned_bytes_of(&parts)?;
                return Ok(parts
                    .iter()
                    .zip(owned)
                    .map(|(p, bytes)| ArrayView::for_part_owned(p, bytes))
                    .collect());
            }
            if !source.is_remote() {
                return parts
                    .iter()
                    .map(|p| ArrayView::for_part(Arc::clone(&source), p, copy))
                    .collect::<zt::Result<Vec<_>>>();
            }
            let storage = zt::part::storage_bytes_of(&parts)?;
            parts
                .iter()
                .zip(storage)
                .map(|(p, bytes)| ArrayView::for_part_read(Arc::clone(&source), p, copy, bytes))
                .collect()
        })
        .map_err(to_py_err)
    }

    /// For a whole read-only load: in one call, a read-only view of the
    /// mapped file for each of the tensors `names` stored raw in a mapping
    /// as one part of whole-byte elements (`None` for any other: decoded,
    /// record-typed, empty, strided backwards, sub-byte, several parts,
    /// which the caller takes through `Tensor._array`), and `(index, dtype
    /// name)` for each view whose dtype numpy has no type of its own (bf16,
    /// fp8 ...: handed out as same-width integers, which the caller
    /// re-views). Each tensor's lazy check (an npz member's CRC-32) runs
    /// first: a failure raises, naming the tensor.
    fn _mapped_views(
        &self,
        py: Python<'_>,
        names: Vec<String>,
    ) -> PyResult<(Vec<Option<ArrayView>>, Vec<Review>)> {
        let source = self.get()?;
        py.detach(|| {
            let mut views = Vec::with_capacity(names.len());
            let mut reviews = Vec::new();
            for (at, name) in names.iter().enumerate() {
                let tensor = source.tensor(name)?;
                let view = match tensor.data() {
                    Ok(part)
                        if tensor.layout() != zt::formats::npy::RECORD_LAYOUT
                            && views_in_place(&part) =>
                    {
                        if !crate::array::numpy_has(part.dtype()) {
                            reviews.push((at, part.dtype().name()));
                        }
                        Some(ArrayView::for_part(Arc::clone(&source), &part, false)?)
                    }
                    _ => None,
                };
                views.push(view);
            }
            Ok((views, reviews))
        })
        .map_err(to_py_err)
    }

    /// Write the C-order elements of the single-part tensors `names` into
    /// `dests` (one writable, C-contiguous buffer per name, each exactly
    /// the tensor's size and none sharing memory with another): raw bytes
    /// `pread` straight into the destinations in file order, on the cores
    /// their size warrants, without the GIL (`zt::copy::copy_into`).
    fn _copy_into(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        dests: Vec<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let source = self.get()?;
        if names.len() != dests.len() {
            return Err(PyValueError::new_err(format!(
                "{} destinations for {} tensors",
                dests.len(),
                names.len()
            )));
        }
        let what = |i: usize| format!("the destination of {:?}", names[i]);
        let mut held = dests
            .iter()
            .enumerate()
            .map(|(i, d)| Borrowed::get(d, what(i), Access::Write, false))
            .collect::<PyResult<Vec<_>>>()?;
        refuse_shared(&held, what)?;
        py.detach(|| {
            let parts = names
                .iter()
                .map(|n| source.tensor(n).and_then(|t| t.data()))
                .collect::<zt::Result<Vec<_>>>()?;
            let mut slices: Vec<&mut [u8]> = held.iter_mut().map(Borrowed::bytes_mut).collect();
            zt::copy::copy_into(&parts, &mut slices)
        })
        .map_err(to_py_err)
    }

    /// Ask the kernel to read the stored bytes of `names` (every tensor
    /// when None) ahead, in file order, up to half the available memory
    /// (see `zt_core::readahead`); the bytes asked for. What whole-load
    /// calls (`load_file`, `load_into`) run before touching any tensor.
    #[pyo3(signature = (names = None))]
    fn _read_ahead(&self, py: Python<'_>, names: Option<Vec<String>>) -> PyResult<u64> {
        let source = self.get()?;
        py.detach(|| match names {
            None => source.read_ahead_all(),
            Some(names) => {
                let indexes: Vec<usize> = names.iter().filter_map(|n| source.position(n)).collect();
                source.read_ahead(&indexes)
            }
        })
        .map_err(to_py_err)
    }

    /// True if some bytes come over the network.
    #[getter]
    fn remote(&self) -> PyResult<bool> {
        Ok(self.get()?.is_remote())
    }

    /// The detected format.
    #[getter]
    fn format(&self) -> PyResult<&'static str> {
        Ok(self.get()?.format())
    }

    /// The files this source reads.
    #[getter]
    fn files(&self) -> PyResult<Vec<String>> {
        Ok(self
            .get()?
            .files()
            .iter()
            .map(|p| p.display().to_string())
            .collect())
    }

    /// The version of each of `files` as opened: a remote object's pinned
    /// ETag (else size@last-modified), a local file's size, or None.
    #[getter]
    fn versions(&self) -> PyResult<Vec<Option<String>>> {
        Ok(self.get()?.versions().to_vec())
    }

    /// File-level attributes.
    #[getter]
    fn attributes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        attributes_to_py(py, self.get()?.attributes())
    }

    /// Total payload bytes.
    #[getter]
    fn nbytes(&self) -> PyResult<u64> {
        Ok(self.get()?.total_bytes())
    }

    /// True once `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// Drop this handle's reference to the files.
    fn close(&self) {
        self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
    }
}

/// One tensor, or one part of a multi-part tensor.
#[pyclass(frozen, module = "zt._zt")]
pub struct Tensor {
    source: Arc<zt::Source>,
    index: usize,
    /// `None`: the tensor itself (resolves to its only part when it has one).
    part: Option<usize>,
}

impl Tensor {
    fn tensor(&self) -> zt::Tensor<'_> {
        self.source
            .tensor_at(self.index)
            .expect("index from the same source")
    }

    /// The part this handle reads: the chosen one, or the only one.
    pub(crate) fn part_ref(&self) -> PyResult<zt::PartRef<'_>> {
        let tensor = self.tensor();
        match self.part {
            Some(i) => Ok(tensor
                .parts()
                .nth(i)
                .expect("part index from the same object")),
            None => tensor.data().map_err(to_py_err),
        }
    }

    pub(crate) fn source(&self) -> &Arc<zt::Source> {
        &self.source
    }
}

#[pymethods]
impl Tensor {
    /// Tensor name.
    #[getter]
    fn name(&self) -> &str {
        self.tensor().name()
    }

    /// Shape as a tuple (the part's shape for a part handle).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let shape = match self.part {
            Some(_) => self.part_ref()?.shape(),
            None => self.tensor().shape(),
        };
        PyTuple::new(py, shape)
    }

    /// Element type name (`"f32"`, `"bf16"`, ...).
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        Ok(self.part_ref()?.dtype().name())
    }

    /// Layout (`"dense"` or a profile id).
    #[getter]
    fn layout(&self) -> &str {
        self.tensor().layout()
    }

    /// True when `Tensor.numpy()` is the native array as numpy makes it,
    /// with nothing for the Python side to re-view: a dtype numpy has its
    /// own type for (not bf16, fp8, 4-bit ...) outside numpy's record
    /// layout. One lookup instead of three on every `numpy()`.
    #[getter]
    fn _plain(&self) -> PyResult<bool> {
        let dtype = self.part_ref()?.dtype();
        Ok(crate::array::numpy_as_is(self.tensor().layout(), dtype))
    }

    /// Part names.
    #[getter]
    fn parts(&self) -> Vec<String> {
        self.tensor().parts().map(|p| p.name().to_owned()).collect()
    }

    /// Payload bytes (all parts for a tensor handle).
    #[getter]
    fn nbytes(&self) -> PyResult<u64> {
        Ok(match self.part {
            Some(_) => self.part_ref()?.nbytes(),
            None => self.tensor().nbytes(),
        })
    }

    /// Element strides over the stored bytes.
    #[getter]
    fn strides(&self) -> PyResult<Vec<i64>> {
        Ok(self.part_ref()?.strides())
    }

    /// Per-tensor attributes.
    #[getter]
    fn attributes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        attributes_to_py(py, self.tensor().attributes())
    }

    /// Capabilities as a dict: map, locate, evict, verify, alignment, remote.
    #[getter]
    fn caps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let caps = self.part_ref()?.caps();
        let dict = PyDict::new(py);
        dict.set_item("map", caps.map)?;
        dict.set_item("locate", caps.locate)?;
        dict.set_item("evict", caps.evict)?;
        dict.set_item("verify", caps.verify)?;
        dict.set_item("alignment", caps.alignment)?;
        dict.set_item("remote", caps.remote)?;
        Ok(dict)
    }

    /// `(path, offset, nbytes)` of the raw bytes, or None when decoded.
    #[getter]
    fn location(&self) -> PyResult<Option<(String, u64, u64)>> {
        Ok(self
            .part_ref()?
            .locate()
            .map(|l| (l.path.display().to_string(), l.offset, l.nbytes)))
    }

    /// A handle on one part of a multi-part tensor.
    fn part(&self, name: &str) -> PyResult<Tensor> {
        let index = self
            .tensor()
            .parts()
            .position(|p| p.name() == name)
            .ok_or_else(|| PyKeyError::new_err(format!("no part {name:?}")))?;
        Ok(Tensor {
            source: Arc::clone(&self.source),
            index: self.index,
            part: Some(index),
        })
    }

    /// The elements in C order as bytes.
    fn tobytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let part = self.part_ref()?;
        let bytes = py.detach(|| part.bytes()).map_err(to_py_err)?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Run the tensor's read check (an npz member's CRC-32; once per
    /// source), as every read through zt does: what a caller that maps
    /// `location` itself runs before handing out a view.
    fn _guard(&self, py: Python<'_>) -> PyResult<()> {
        let part = self.part_ref()?;
        py.detach(|| part.guard()).map_err(to_py_err)
    }

    /// Ask the kernel to read the bytes ahead.
    fn prefetch(&self, py: Python<'_>) -> PyResult<()> {
        let part = self.part_ref()?;
        py.detach(|| part.prefetch()).map_err(to_py_err)
    }

    /// Drop the tensor's own pages from memory; returns the bytes dropped.
    fn evict(&self, py: Python<'_>) -> PyResult<u64> {
        let part = self.part_ref()?;
        py.detach(|| part.evict()).map_err(to_py_err)
    }

    /// An object exposing `__array_interface__` over the bytes: a read-only
    /// view of the mapping when possible and `copy` is false, an owned
    /// buffer otherwise (C order when `copy` is true). Sub-byte packed types
    /// come back as their raw bytes.
    #[pyo3(signature = (copy = false))]
    fn _array(&self, py: Python<'_>, copy: bool) -> PyResult<ArrayView> {
        let part = self.part_ref()?;
        py.detach(|| ArrayView::for_part(Arc::clone(&self.source), &part, copy))
            .map_err(to_py_err)
    }

    /// The elements of a selection (`start`, `count`, `step` per dimension)
    /// as a writable C-order array of shape `counts`, reading only the bytes
    /// the selection needs (see `zt::PartRef::read_selection`). Fails for
    /// sub-byte element types and parts not stored in C order; the Python
    /// side then slices the whole array instead.
    fn _read_selection(
        &self,
        py: Python<'_>,
        starts: Vec<u64>,
        counts: Vec<u64>,
        steps: Vec<u64>,
    ) -> PyResult<ArrayView> {
        if starts.len() != counts.len() || starts.len() != steps.len() {
            return Err(PyValueError::new_err(
                "starts, counts and steps differ in length",
            ));
        }
        let part = self.part_ref()?;
        let sel: Vec<zt::part::Sel> = starts
            .iter()
            .zip(&counts)
            .zip(&steps)
            .map(|((&start, &count), &step)| zt::part::Sel { start, count, step })
            .collect();
        let bytes = py.detach(|| part.read_selection(&sel)).map_err(to_py_err)?;
        Ok(ArrayView::from_owned(
            bytes,
            crate::array::typestr(part.dtype()),
            counts,
        ))
    }

    /// The tensor's values as f32 (GGUF block types, and dense f32 / f16 /
    /// bf16 tensors), in its logical shape.
    fn _dequantize(&self, py: Python<'_>) -> PyResult<ArrayView> {
        let tensor = self.tensor();
        let limits = self.source.limits();
        let values = py
            .detach(|| zt::formats::gguf::dequantize_with(&tensor, limits))
            .map_err(to_py_err)?;
        Ok(ArrayView::from_f32(values, tensor.shape().to_vec()))
    }

    /// The values (f32) of whole rows of a GGUF block-quantized tensor:
    /// the tensor seen as `[rows, last]`, the rows `rows` in that order, as
    /// an array of shape `[len(rows), last]`, reading and dequantizing only
    /// those rows' blocks (`zt::formats::gguf::dequantize_rows_with`). What
    /// `get_slice` reads a quantized tensor through.
    fn _dequantize_rows(&self, py: Python<'_>, rows: Vec<u64>) -> PyResult<ArrayView> {
        let tensor = self.tensor();
        let limits = self.source.limits();
        let last = tensor.shape().last().copied().unwrap_or(1);
        let values = py
            .detach(|| zt::formats::gguf::dequantize_rows_with(&tensor, &rows, limits))
            .map_err(to_py_err)?;
        Ok(ArrayView::from_f32(values, vec![rows.len() as u64, last]))
    }

    /// `(address, length)` of the mapping that holds this tensor, for tests
    /// that check a view really points into it.
    fn _mapping(&self) -> PyResult<Option<(usize, usize)>> {
        Ok(match self.part_ref()?.payload() {
            zt::Payload::Stored { store, .. } => store.mapping(),
            zt::Payload::Decoded { .. } => None,
        })
    }

    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream; // CPU only: there is no stream to synchronise with.
        crate::dlpack::export(py, self, max_version, dl_device, copy)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (crate::dlpack::DEVICE_CPU, 0)
    }

    fn __repr__(&self) -> PyResult<String> {
        let part = self.part_ref();
        let dtype = part
            .as_ref()
            .map(|p| p.dtype().name())
            .unwrap_or("multi-part");
        Ok(format!(
            "Tensor({:?}, {} {:?})",
            self.tensor().name(),
            dtype,
            self.tensor().shape()
        ))
    }
}

/// A view to re-view as another dtype (see `Source._mapped_views`): its
/// index among the views, and the zt dtype name.
type Review = (usize, &'static str);

/// Whether [`ArrayView::for_part`] views `part` in place in its mapped
/// file: raw stored bytes of whole-byte elements, not empty, with no
/// stride running backwards.
fn views_in_place(part: &zt::PartRef<'_>) -> bool {
    let zt::catalog::Payload::Stored { store, len, .. } = part.payload() else {
        return false;
    };
    part.dtype().size().is_some()
        && store.is_mapped()
        && *len > 0
        && part.strides().iter().all(|&s| s >= 0)
}
