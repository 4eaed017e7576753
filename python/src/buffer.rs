//! The buffer protocol for `zt.Tensor` (`memoryview(tensor)`, `bytes(t)`,
//! `np.frombuffer(t, ...)`), as upstream ztensor's `Tensor` offers it:
//! read-only, zero-copy where the bytes lie mapped.
//!
//! The wheel is abi3 from Python 3.9, and the buffer slots joined the
//! limited API only in 3.11, so PyO3 cannot declare `__getbuffer__` here.
//! The slot itself is in every CPython's stable ABI table (slot 1), so this
//! module builds, with `PyType_FromSpec`, a tiny base type
//! `zt._zt.BufferExporter` whose only slot is `bf_getbuffer`. The Python
//! `zt.Tensor` subclasses it and defines `_zt_buffer()`, which returns a
//! read-only numpy array over the tensor's bytes (its typed view, or the
//! stored integers for types numpy's buffers cannot carry: bf16, fp8, packed
//! fp4). The slot hands the request to that array (`PyObject_GetBuffer`),
//! so the exported buffer is numpy's own: its format, shape and strides,
//! its `obj` the array, which keeps the mapping (or the decoded copy) alive
//! for as long as the buffer lives, and its release numpy's.
//!
//! numpy itself asks an object for a buffer before `__array__`, so
//! `np.asarray(tensor)` goes through here too, and gets the same typed,
//! zero-copy array `Tensor.numpy()` gives (the storage integers for bf16 and
//! fp8, whose `numpy()` is an `ml_dtypes` array).

use std::ffi::{c_int, c_void};
use std::ptr;

use pyo3::ffi;
use pyo3::prelude::*;

extern "C" {
    /// Part of CPython's C API in every version (exported by the
    /// interpreter; extension modules resolve it at load time). `view` is a
    /// `Py_buffer`, which the 3.9 limited API does not declare; it is only
    /// passed through.
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut c_void, flags: c_int) -> c_int;
}

/// `bf_getbuffer`: ask the exporter (a `zt.Tensor`) for its array and let
/// the array fill the buffer.
unsafe extern "C" fn getbuffer(
    exporter: *mut ffi::PyObject,
    view: *mut c_void,
    flags: c_int,
) -> c_int {
    Python::attach(|py| {
        // SAFETY: CPython calls this slot with a live object.
        let exporter = unsafe { Bound::from_borrowed_ptr(py, exporter) };
        match exporter.call_method0("_zt_buffer") {
            // SAFETY: `view` is the caller's `Py_buffer`; the array fills it
            // and takes its own reference as the buffer's `obj`.
            Ok(array) => unsafe { PyObject_GetBuffer(array.as_ptr(), view, flags) },
            Err(e) => {
                e.restore(py);
                -1
            }
        }
    })
}

static NAME: &std::ffi::CStr = c"zt._zt.BufferExporter";
static DOC: &std::ffi::CStr = c"Base of zt.Tensor: the buffer protocol over `_zt_buffer()`.";

/// The `BufferExporter` type (see the module docs).
pub fn exporter_type(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let mut slots = [
        ffi::PyType_Slot {
            slot: ffi::Py_bf_getbuffer,
            pfunc: getbuffer as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_doc,
            pfunc: DOC.as_ptr() as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_new,
            pfunc: ffi::PyType_GenericNew as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: 0,
            pfunc: ptr::null_mut(),
        },
    ];
    let mut spec = ffi::PyType_Spec {
        name: NAME.as_ptr(),
        basicsize: 0,
        itemsize: 0,
        flags: (ffi::Py_TPFLAGS_DEFAULT | ffi::Py_TPFLAGS_BASETYPE) as std::ffi::c_uint,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: the spec and its slots are valid for the call (CPython copies
    // the slots; the name and doc are statics, which outlive the type).
    unsafe {
        let ty = ffi::PyType_FromSpec(&mut spec);
        Bound::from_owned_ptr_or_err(py, ty)
    }
}
