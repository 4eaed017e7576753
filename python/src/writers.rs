//! Writers called by `zt.numpy.save_file` and friends.
//!
//! The Python side hands over each array as `(name, dtype, shape, address,
//! nbytes)`, where the address is a C-contiguous numpy buffer that the
//! caller keeps alive for the duration of the call. That lets the write
//! run without the GIL and without copying every tensor into `bytes` first.

use std::path::{Path, PathBuf};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use zt::dtype::DType;
use zt::TensorIn;

use crate::{storage_options_from_py, to_py_err};

/// One array as the Python wrapper describes it.
type RawTensor = (String, String, Vec<u64>, usize, usize);

/// Validated descriptions whose data slices borrow the caller's buffers.
struct Borrowed {
    names: Vec<String>,
    dtypes: Vec<DType>,
    shapes: Vec<Vec<u64>>,
    spans: Vec<(usize, usize)>,
}

impl Borrowed {
    fn new(tensors: Vec<RawTensor>) -> PyResult<Self> {
        let mut out = Borrowed {
            names: Vec::new(),
            dtypes: Vec::new(),
            shapes: Vec::new(),
            spans: Vec::new(),
        };
        for (name, dtype, shape, address, nbytes) in tensors {
            let dtype = DType::from_name(&dtype).ok_or_else(|| {
                PyValueError::new_err(format!("unknown dtype {dtype:?} for {name:?}"))
            })?;
            if address == 0 && nbytes != 0 {
                return Err(PyValueError::new_err(format!("null buffer for {name:?}")));
            }
            out.names.push(name);
            out.dtypes.push(dtype);
            out.shapes.push(shape);
            out.spans.push((address, nbytes));
        }
        Ok(out)
    }

    /// The tensors as `TensorIn`s.
    ///
    /// SAFETY (upheld by the caller, `zt/_write.py`): every address points to
    /// `nbytes` readable bytes of a numpy array that stays alive, and is not
    /// resized, until the write returns.
    fn tensors(&self) -> Vec<TensorIn<'_>> {
        (0..self.names.len())
            .map(|i| {
                let (address, nbytes) = self.spans[i];
                let data: &[u8] = if nbytes == 0 {
                    &[]
                } else {
                    // SAFETY: see the method documentation.
                    unsafe { std::slice::from_raw_parts(address as *const u8, nbytes) }
                };
                TensorIn {
                    name: &self.names[i],
                    dtype: self.dtypes[i],
                    shape: &self.shapes[i],
                    data,
                }
            })
            .collect()
    }
}

/// Write through `write` to `path`: in place for a local path, staged and
/// uploaded for an `s3://` URL.
fn write_to(
    py: Python<'_>,
    path: &Path,
    storage_options: Option<&Bound<'_, PyDict>>,
    write: impl FnOnce(&Path) -> zt::Result<u64> + Send,
) -> PyResult<u64> {
    let storage_options = storage_options_from_py(storage_options)?;
    py.detach(|| zt::publish::to_location(path, &storage_options, write))
        .map_err(to_py_err)
}

/// Write a safetensors file; returns the bytes written. `metadata=None`
/// writes no `__metadata__`, an empty list an empty one.
#[pyfunction]
#[pyo3(signature = (path, tensors, metadata = None, storage_options = None))]
pub fn write_safetensors(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<RawTensor>,
    metadata: Option<Vec<(String, String)>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<u64> {
    let borrowed = Borrowed::new(tensors)?;
    write_to(py, &path, storage_options, |local| {
        zt::formats::safetensors::write_with(local, &borrowed.tensors(), metadata.as_deref())
    })
}

/// A safetensors file in memory, as `safetensors.*.save` returns it.
#[pyfunction]
#[pyo3(signature = (tensors, metadata = None))]
pub fn safetensors_bytes<'py>(
    py: Python<'py>,
    tensors: Vec<RawTensor>,
    metadata: Option<Vec<(String, String)>>,
) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
    let borrowed = Borrowed::new(tensors)?;
    let bytes = py
        .detach(|| zt::formats::safetensors::to_bytes(&borrowed.tensors(), metadata.as_deref()))
        .map_err(to_py_err)?;
    Ok(pyo3::types::PyBytes::new(py, &bytes))
}

/// Write one array as `.npy`; returns the bytes written.
#[pyfunction]
#[pyo3(signature = (path, tensor, storage_options = None))]
pub fn write_npy(
    py: Python<'_>,
    path: PathBuf,
    tensor: RawTensor,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<u64> {
    let borrowed = Borrowed::new(vec![tensor])?;
    write_to(py, &path, storage_options, |local| {
        zt::formats::npy::write_npy(local, &borrowed.tensors()[0])
    })
}

/// Write arrays as an uncompressed `.npz`; returns the bytes written.
#[pyfunction]
#[pyo3(signature = (path, tensors, storage_options = None))]
pub fn write_npz(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<RawTensor>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<u64> {
    let borrowed = Borrowed::new(tensors)?;
    write_to(py, &path, storage_options, |local| {
        zt::formats::npy::write_npz(local, &borrowed.tensors())
    })
}

/// Write arrays as a PyTorch zip checkpoint (a state dict that
/// `torch.load(weights_only=True)` reads); returns the bytes written.
#[pyfunction]
#[pyo3(signature = (path, tensors, storage_options = None))]
pub fn write_pt(
    py: Python<'_>,
    path: PathBuf,
    tensors: Vec<RawTensor>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<u64> {
    let borrowed = Borrowed::new(tensors)?;
    write_to(py, &path, storage_options, |local| {
        zt::formats::pt::write(local, &borrowed.tensors())
    })
}

/// Write a checkpoint in shards of at most `max_shard_size` bytes, split,
/// named and indexed as Hugging Face does (see `zt::shard`); one shard is a
/// plain file at `path`. `format` is `"safetensors"` or `"pt"` (`.zt` goes
/// through `write_zt`). Returns (bytes written, files published).
#[pyfunction]
#[pyo3(signature = (path, format, tensors, max_shard_size, metadata = None, storage_options = None))]
pub fn write_sharded(
    py: Python<'_>,
    path: PathBuf,
    format: &str,
    tensors: Vec<RawTensor>,
    max_shard_size: u64,
    metadata: Option<Vec<(String, String)>>,
    storage_options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(u64, Vec<PathBuf>)> {
    let storage_options = storage_options_from_py(storage_options)?;
    let layout = zt::registry()
        .writer_named(format)
        .and_then(|w| w.shard_layout())
        .ok_or_else(|| PyValueError::new_err(format!("{format} has no sharded layout")))?;
    let borrowed = Borrowed::new(tensors)?;
    let all = borrowed.tensors();
    let names: Vec<&str> = all.iter().map(|t| t.name).collect();
    let items: Vec<zt::shard::Item> = all
        .iter()
        .map(|t| zt::shard::Item {
            size: t.data.len() as u64,
            storage: None,
        })
        .collect();
    let pt = format == "pt";
    let write = |indexes: &[usize], local: &Path| {
        let subset: Vec<TensorIn<'_>> = indexes.iter().map(|&i| all[i]).collect();
        if pt {
            zt::formats::pt::write(local, &subset)
        } else {
            zt::formats::safetensors::write_with(local, &subset, metadata.as_deref())
        }
    };
    let attributes = Vec::new();
    let tensors = zt::shard::Tensors {
        names: &names,
        items: &items,
        attributes: &attributes,
        write: &write,
    };
    let written = py
        .detach(|| zt::shard::write(&path, &layout, &tensors, max_shard_size, &storage_options))
        .map_err(to_py_err)?;
    Ok((written.bytes, written.files))
}

/// Bytes from a shard size string (`"5GB"`, `"4GiB"`, `"1000"`).
#[pyfunction]
pub fn parse_shard_size(text: &str) -> PyResult<u64> {
    zt::shard::parse_size(text).map_err(PyValueError::new_err)
}
