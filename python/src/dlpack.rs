//! DLPack export (`__dlpack__`), legacy and versioned (1.x).
//!
//! Mapped tensors go out zero-copy only through the versioned protocol,
//! which can flag them read-only; the legacy protocol cannot, so it gets an
//! owned copy (or a `BufferError` when the caller forbids copies). Rank 0
//! stays rank 0, and shape and strides are the part's own, never the
//! object's logical shape.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use zt::dtype::DType;

use crate::array::Keep;
use crate::tensor::Tensor;
use crate::to_py_err;

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;

const FLAG_READ_ONLY: u64 = 1;
const FLAG_IS_COPIED: u64 = 2;

const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// What the consumer's deleter frees: the memory owner plus the shape and
/// strides arrays the `DLTensor` points into.
struct Context {
    _keep: Keep,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// DLPack type code and bit width for a dtype (DLPack 1.1 codes).
fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F64 => (2, 64),
        DType::F32 => (2, 32),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::I64 => (0, 64),
        DType::I32 => (0, 32),
        DType::I16 => (0, 16),
        DType::I8 => (0, 8),
        DType::U64 => (1, 64),
        DType::U32 => (1, 32),
        DType::U16 => (1, 16),
        DType::U8 => (1, 8),
        DType::Bool => (6, 8),
        DType::Complex64 => (5, 64),
        DType::Complex128 => (5, 128),
        DType::F8E4M3Fn => (10, 8),
        DType::F8E4M3Fnuz => (11, 8),
        DType::F8E5M2 => (12, 8),
        DType::F8E5M2Fnuz => (13, 8),
        DType::F8E8M0 => (14, 8),
        DType::F6E2M3 => (15, 6),
        DType::F6E3M2 => (16, 6),
        DType::F4E2M1 => (17, 4),
        DType::I4 => (0, 4),
        DType::U4 => (1, 4),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` and its context were made by Box::into_raw in
    // `export` and the protocol calls the deleter exactly once.
    unsafe {
        let managed = Box::from_raw(managed);
        drop(Box::from_raw(managed.manager_ctx as *mut Context));
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    if managed.is_null() {
        return;
    }
    // SAFETY: as in `delete_legacy`.
    unsafe {
        let managed = Box::from_raw(managed);
        drop(Box::from_raw(managed.manager_ctx as *mut Context));
    }
}

/// Capsule destructor: free the tensor unless a consumer took it (and
/// renamed the capsule to `used_...`).
unsafe extern "C" fn capsule_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: called by Python with a live capsule; IsValid checks the name
    // without raising.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, NAME_LEGACY.as_ptr());
            delete_legacy(p as *mut DLManagedTensor);
        }
    }
}

unsafe extern "C" fn capsule_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `capsule_legacy`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr());
            delete_versioned(p as *mut DLManagedTensorVersioned);
        }
    }
}

/// Implement `Tensor.__dlpack__`.
pub fn export<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    max_version: Option<(u32, u32)>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyAny>> {
    if let Some(device) = dl_device {
        if device != (DEVICE_CPU, 0) {
            return Err(PyBufferError::new_err(format!(
                "zt tensors live on the CPU, not device {device:?}"
            )));
        }
    }
    let versioned = max_version.is_some_and(|(major, _)| major >= 1);
    let part = tensor.part_ref()?;
    let dtype = part.dtype();
    let mappable = part.caps().map;
    // Zero-copy needs a mapped tensor and a protocol that can say read-only.
    let zero_copy = match copy {
        Some(true) => false,
        Some(false) if !(mappable && versioned) => {
            let why = if mappable {
                "legacy DLPack cannot mark the mapped bytes read-only; ask with max_version=(1, 0)"
            } else {
                "the tensor is not a zero-copy view of its file (decoded or unaligned)"
            };
            return Err(PyBufferError::new_err(format!(
                "cannot export without a copy: {why}"
            )));
        }
        _ => mappable && versioned,
    };
    let shape: Vec<i64> = part.shape().iter().map(|&d| d as i64).collect();
    let (keep, data, strides, flags) = if zero_copy {
        let bytes = part.map().map_err(to_py_err)?;
        let keep = Keep::Mapped(Arc::clone(tensor.source()));
        (
            keep,
            bytes.as_ptr() as *mut c_void,
            part.strides(),
            FLAG_READ_ONLY,
        )
    } else {
        let bytes = py
            .detach(|| {
                part.bytes()
                    .and_then(|b| zt::buffer::try_own(&part.ctx(), "a DLPack copy", b))
            })
            .map_err(to_py_err)?;
        let data = bytes.as_ptr() as *mut c_void;
        (
            Keep::Owned(bytes),
            data,
            zt::dtype::c_strides(part.shape()),
            FLAG_IS_COPIED,
        )
    };
    if dtype.size().is_none() && strides != zt::dtype::c_strides(part.shape()) {
        return Err(PyValueError::new_err(
            "strided sub-byte tensors cannot be exported",
        ));
    }
    let mut ctx = Box::new(Context {
        _keep: keep,
        shape,
        strides,
    });
    let dl_tensor = DLTensor {
        data,
        device: DLDevice {
            device_type: DEVICE_CPU,
            device_id: 0,
        },
        ndim: ctx.shape.len() as i32,
        dtype: dl_dtype(dtype),
        shape: ctx.shape.as_mut_ptr(),
        strides: ctx.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    let ctx = Box::into_raw(ctx) as *mut c_void;
    // SAFETY: the capsule owns the boxed tensor until a consumer renames it
    // and takes over the deleter, or until the capsule dies unconsumed.
    unsafe {
        let capsule = if versioned {
            let managed = Box::into_raw(Box::new(DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 1 },
                manager_ctx: ctx,
                deleter: Some(delete_versioned),
                flags,
                dl_tensor,
            }));
            let capsule = ffi::PyCapsule_New(
                managed as *mut c_void,
                NAME_VERSIONED.as_ptr(),
                Some(capsule_versioned),
            );
            if capsule.is_null() {
                delete_versioned(managed);
            }
            capsule
        } else {
            let managed = Box::into_raw(Box::new(DLManagedTensor {
                dl_tensor,
                manager_ctx: ctx,
                deleter: Some(delete_legacy),
            }));
            let capsule = ffi::PyCapsule_New(
                managed as *mut c_void,
                NAME_LEGACY.as_ptr(),
                Some(capsule_legacy),
            );
            if capsule.is_null() {
                delete_legacy(managed);
            }
            capsule
        };
        Bound::from_owned_ptr_or_err(py, capsule)
    }
}
