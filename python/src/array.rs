//! `ArrayView`: the one object through which native memory reaches numpy.
//! It exposes numpy's array interface (`__array_struct__`, and
//! `__array_interface__` for consumers that read only the dict) over a
//! tensor's bytes, a gather's output (zrecord) or a DataLoader batch's
//! column, and numpy turns it into an array whose `base` holds this
//! object (see `crate::array_struct`). That keeps the
//! mapping (or the owned buffer, or the batch) alive for as long as any
//! array views it, without depending on numpy's C API (so the wheel is
//! abi3 and numpy-version independent).

use std::borrow::Cow;
use std::sync::Arc;

use zloader::dataloader::{BatchLease, DenseColumn};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use zt::dtype::DType;

/// What keeps an array's memory alive.
pub enum Keep {
    /// A view of a mapping owned by the source.
    Mapped(#[allow(dead_code)] Arc<zt::Source>),
    /// A writable view of a private copy-on-write mapping of a file.
    Private(#[allow(dead_code)] Arc<zt::store::PrivateMap>),
    /// An owned buffer (decoded or copied bytes).
    Owned(#[allow(dead_code)] Vec<u8>),
    /// Owned f32 values (dequantized), kept as they are: no second buffer.
    OwnedF32(#[allow(dead_code)] Vec<f32>),
    /// A gather's output buffer, returned to the pool when dropped.
    Pooled(#[allow(dead_code)] crate::batch_pool::Pooled),
    /// A DataLoader batch's Dense column.
    Column(#[allow(dead_code)] DenseColumn),
    /// Words of a DataLoader batch's Ragged column, with the lease that
    /// keeps the batch counted as live while any of its arrays is.
    Batch(#[allow(dead_code)] Vec<u64>, #[allow(dead_code)] BatchLease),
}

/// Array memory plus its numpy description.
#[pyclass(frozen, module = "zt._zt")]
pub struct ArrayView {
    _keep: Keep,
    address: usize,
    typestr: Cow<'static, str>,
    shape: Vec<u64>,
    /// Byte strides; `None` for C order.
    strides: Option<Vec<i64>>,
    readonly: bool,
}

/// The numpy typestr of the scalar numpy holds a dtype in. ML float types
/// are exposed as same-width unsigned integers and re-viewed in Python as
/// `ml_dtypes` types.
pub fn typestr(dtype: DType) -> &'static str {
    match dtype {
        DType::F64 => "<f8",
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::BF16 => "<u2",
        DType::I64 => "<i8",
        DType::I32 => "<i4",
        DType::I16 => "<i2",
        DType::I8 => "|i1",
        DType::U64 => "<u8",
        DType::U32 => "<u4",
        DType::U16 => "<u2",
        DType::Bool => "|b1",
        DType::Complex64 => "<c8",
        DType::Complex128 => "<c16",
        _ => "|u1",
    }
}

/// Whether numpy has a type of its own for `dtype`: the types [`typestr`]
/// names exactly (bf16 and everything it hands out as bytes need a second
/// look on the Python side).
pub fn numpy_has(dtype: DType) -> bool {
    dtype == DType::U8 || (dtype != DType::BF16 && typestr(dtype) != "|u1")
}

/// Whether the array numpy makes of a view of `dtype` elements, in a
/// tensor of `layout`, is what `Tensor.numpy()` returns as it is: a dtype
/// numpy has ([`numpy_has`]) outside numpy's record layout (whose bytes the
/// Python side views as the stored descr).
pub fn numpy_as_is(layout: &str, dtype: DType) -> bool {
    numpy_has(dtype) && layout != zt::formats::npy::RECORD_LAYOUT
}

impl ArrayView {
    /// Describe `part`'s bytes for numpy, given its stored bytes already
    /// read (by `zt::part::storage_bytes_of`, which reads many parts of a
    /// remote object together): a view when they are borrowed from a
    /// mapping and no copy is asked for, else an owned array.
    pub fn for_part_read(
        source: Arc<zt::Source>,
        part: &zt::PartRef<'_>,
        copy: bool,
        storage: Cow<'_, [u8]>,
    ) -> zt::Result<Self> {
        let dtype = part.dtype();
        let ctx = part.ctx();
        let Some(size) = dtype.size() else {
            let shape = vec![part.nbytes()];
            return Self::from_bytes(&ctx, source, storage, copy, shape, None, "|u1");
        };
        let shape = part.shape().to_vec();
        if part.is_contiguous() {
            return Self::from_bytes(&ctx, source, storage, copy, shape, None, typestr(dtype));
        }
        if copy {
            let (shape_in, strides) = (part.shape(), part.strides());
            let limits = source.limits();
            let c_order =
                zt::part::materialize(&ctx, limits, &storage, shape_in, &strides, size as usize)?;
            return Ok(Self::owned(c_order, typestr(dtype), shape, None));
        }
        let strides = part
            .strides()
            .into_iter()
            .map(|s| s * size as i64)
            .collect();
        Self::from_bytes(
            &ctx,
            source,
            storage,
            false,
            shape,
            Some(strides),
            typestr(dtype),
        )
    }

    /// A writable C-order array over `bytes`, `part`'s elements as
    /// `zt::part::PartRef::bytes` gives them (an owned copy): typed and
    /// shaped as [`ArrayView::for_part`] types a copy.
    pub fn for_part_owned(part: &zt::PartRef<'_>, bytes: Vec<u8>) -> Self {
        let dtype = part.dtype();
        match dtype.size() {
            // Sub-byte packed types: the raw bytes; Python unpacks them.
            None => {
                let shape = vec![bytes.len() as u64];
                Self::owned(bytes, "|u1", shape, None)
            }
            Some(_) => Self::owned(bytes, typestr(dtype), part.shape().to_vec(), None),
        }
    }

    /// Describe `part`'s bytes for numpy.
    pub fn for_part(
        source: Arc<zt::Source>,
        part: &zt::PartRef<'_>,
        copy: bool,
    ) -> zt::Result<Self> {
        let dtype = part.dtype();
        // Sub-byte packed types: hand out the raw bytes; Python unpacks them.
        let Some(size) = dtype.size() else {
            let bytes = part.bytes()?;
            let shape = vec![part.nbytes()];
            return Self::from_bytes(&part.ctx(), source, bytes, copy, shape, None, "|u1");
        };
        let byte_strides =
            |strides: Vec<i64>| strides.into_iter().map(|s| s * size as i64).collect();
        // numpy reads unaligned elements correctly, so a raw part in the
        // mapping is viewed in place even where `caps().map` (which promises
        // dtype alignment, as DLPack consumers need) is false.
        let mapped = if copy {
            None
        } else {
            part.map_unaligned().ok()
        };
        if let Some(bytes) = mapped {
            let strides = (!part.is_contiguous()).then(|| byte_strides(part.strides()));
            return Ok(ArrayView {
                address: bytes.as_ptr() as usize,
                _keep: Keep::Mapped(source),
                typestr: typestr(dtype).into(),
                shape: part.shape().to_vec(),
                strides,
                readonly: true,
            });
        }
        if copy {
            // A copy is always C order and writable.
            let bytes = zt::buffer::try_own(&part.ctx(), "a copy", part.bytes()?)?;
            return Ok(Self::owned(
                bytes,
                typestr(dtype),
                part.shape().to_vec(),
                None,
            ));
        }
        // Not in a mapping (decoded, positional): owned storage bytes
        // with the stored strides, so no materialization happens twice.
        let storage = zt::buffer::try_own(&part.ctx(), "a copy", part.storage_bytes()?)?;
        let strides = (!part.is_contiguous()).then(|| byte_strides(part.strides()));
        Ok(Self::owned(
            storage,
            typestr(dtype),
            part.shape().to_vec(),
            strides,
        ))
    }

    fn from_bytes(
        ctx: &zt::Context,
        source: Arc<zt::Source>,
        bytes: Cow<'_, [u8]>,
        copy: bool,
        shape: Vec<u64>,
        strides: Option<Vec<i64>>,
        typestr: &'static str,
    ) -> zt::Result<Self> {
        Ok(match bytes {
            Cow::Borrowed(b) if !copy => ArrayView {
                address: b.as_ptr() as usize,
                _keep: Keep::Mapped(source),
                typestr: typestr.into(),
                shape,
                strides,
                readonly: true,
            },
            other => Self::owned(
                zt::buffer::try_own(ctx, "a copy", other)?,
                typestr,
                shape,
                strides,
            ),
        })
    }

    /// A writable view of `part`'s stored bytes at `address` in `map` (a
    /// private mapping of its file, `zt::store::PrivateMaps::view`): typed,
    /// shaped and strided as [`ArrayView::for_part`] views the shared
    /// mapping (sub-byte types as their raw bytes). `None` for negative
    /// strides, which such a view cannot start at the part's first byte.
    pub fn private(
        map: Arc<zt::store::PrivateMap>,
        address: usize,
        part: &zt::PartRef<'_>,
    ) -> Option<Self> {
        let dtype = part.dtype();
        let (typestr, shape, strides) = match dtype.size() {
            None => ("|u1", vec![part.nbytes()], None),
            Some(size) => {
                let strides = part.strides();
                if strides.iter().any(|&s| s < 0) {
                    return None;
                }
                let strides = (!part.is_contiguous())
                    .then(|| strides.into_iter().map(|s| s * size as i64).collect());
                (typestr(dtype), part.shape().to_vec(), strides)
            }
        };
        Some(ArrayView {
            _keep: Keep::Private(map),
            address,
            typestr: typestr.into(),
            shape,
            strides,
            readonly: false,
        })
    }

    /// An owned, writable array of `shape` over `bytes` (C order).
    pub fn from_owned(bytes: Vec<u8>, typestr: &'static str, shape: Vec<u64>) -> Self {
        Self::owned(bytes, typestr, shape, None)
    }

    /// An owned, writable f32 array of `shape` (dequantized values).
    pub fn from_f32(values: Vec<f32>, shape: Vec<u64>) -> Self {
        ArrayView {
            address: values.as_ptr() as usize,
            _keep: Keep::OwnedF32(values),
            typestr: if cfg!(target_endian = "little") {
                "<f4".into()
            } else {
                ">f4".into()
            },
            shape,
            strides: None,
            readonly: false,
        }
    }

    /// A writable uint8 array over the first `len` bytes of a pooled
    /// buffer starting at `address`.
    pub fn pooled(buf: crate::batch_pool::Pooled, address: usize, len: usize) -> Self {
        Self::kept(Keep::Pooled(buf), address, "|u1".into(), vec![len])
    }

    /// A writable C-order array of `shape` over memory that `keep` owns,
    /// starting at `address` (a gather's output, a batch's column).
    pub fn kept(keep: Keep, address: usize, typestr: Cow<'static, str>, shape: Vec<usize>) -> Self {
        ArrayView {
            _keep: keep,
            address,
            typestr,
            shape: shape.into_iter().map(|d| d as u64).collect(),
            strides: None,
            readonly: false,
        }
    }

    fn owned(
        bytes: Vec<u8>,
        typestr: &'static str,
        shape: Vec<u64>,
        strides: Option<Vec<i64>>,
    ) -> Self {
        ArrayView {
            address: bytes.as_ptr() as usize,
            _keep: Keep::Owned(bytes),
            typestr: typestr.into(),
            shape,
            strides,
            readonly: false,
        }
    }
}

#[pymethods]
impl ArrayView {
    /// numpy's array interface in its struct form, which numpy tries first
    /// (see `crate::array_struct`).
    #[getter]
    fn __array_struct__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::array_struct::capsule(
            py,
            self.address,
            &self.typestr,
            &self.shape,
            self.strides.as_deref(),
            self.readonly,
        )
    }

    /// numpy's array interface, version 3 (the dict form, for consumers
    /// that read only it).
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("version", 3)?;
        dict.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        dict.set_item("typestr", self.typestr.as_ref())?;
        dict.set_item("data", (self.address, self.readonly))?;
        match &self.strides {
            Some(s) => dict.set_item("strides", PyTuple::new(py, s)?)?,
            None => dict.set_item("strides", py.None())?,
        }
        Ok(dict)
    }

    /// True if the memory is a read-only view of a mapped file.
    #[getter]
    fn readonly(&self) -> bool {
        self.readonly
    }
}
