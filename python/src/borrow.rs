//! Borrowing a Python object's bytes through the buffer protocol.
//!
//! Every native function that reads or writes a caller's memory (the
//! writers, zrecord appends and gathers, the Sampler's `*_into`) takes the
//! object itself, never an integer address: [`Borrowed::get`] asks the
//! object for a C-contiguous buffer (`PyObject_GetBuffer`, writable where
//! the function writes), and the lengths, item sizes and element formats
//! are checked against the request before a byte is touched. A
//! [`Borrowed`] holds the buffer (and through it a reference to the
//! object) until it is dropped, so the memory stays valid, and numpy
//! refuses to resize the array, across any GIL release in between.
//!
//! The wheel is abi3 from Python 3.9 and `Py_buffer` joined the limited API
//! only in 3.11, so PyO3's `PyBuffer` is not available here. The struct
//! below is CPython's `Py_buffer`, whose layout has not changed since 3.3
//! and is frozen by the 3.11 stable ABI; `PyObject_GetBuffer` and
//! `PyBuffer_Release` are exported by every CPython 3.
//!
//! What this does not guard against: another Python thread writing the
//! same array while a call reads it (the bytes may tear, as with any
//! extension that releases the GIL; no memory outside the buffer is
//! touched).

use std::ffi::{c_char, c_int, c_void, CStr};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

/// CPython's `Py_buffer` (see the module docs).
#[repr(C)]
pub struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

extern "C" {
    /// Part of CPython's C API in every version 3 (see the module docs).
    /// `view` is a `Py_buffer`.
    pub fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut c_void, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
}

// Request flags (CPython's `PyBUF_*`).
const PYBUF_WRITABLE: c_int = 0x0001;
const PYBUF_FORMAT: c_int = 0x0004;
const PYBUF_ND: c_int = 0x0008;
const PYBUF_STRIDES: c_int = 0x0010 | PYBUF_ND;
const PYBUF_C_CONTIGUOUS: c_int = 0x0020 | PYBUF_STRIDES;

/// What the caller's memory must be.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Written into: the buffer must be writable.
    Write,
}

/// A held, C-contiguous buffer of a Python object.
pub struct Borrowed {
    /// Boxed so its address stays put from `PyObject_GetBuffer` to
    /// `PyBuffer_Release` (an exporter may keep pointers into it).
    raw: Box<RawBuffer>,
    /// The element format when one was asked for (plain numpy dtypes and
    /// `bytes`-like objects give one; ml_dtypes arrays cannot).
    format: Option<String>,
    access: Access,
}

// SAFETY: the buffer's memory is valid until `PyBuffer_Release`, which
// `Drop` calls with the GIL held; the pointers are only read meanwhile, from
// any thread (the exporter promises the memory does not move while a buffer
// is exported).
unsafe impl Send for Borrowed {}
// SAFETY: as above; shared access only hands out `&[u8]`.
unsafe impl Sync for Borrowed {}

impl Borrowed {
    /// Ask `obj` for a C-contiguous buffer (writable for [`Access::Write`]).
    /// `what` names the argument in errors. With `format`, the exporter
    /// must also say its element format (see [`Borrowed::u64s`]).
    pub fn get(
        obj: &Bound<'_, PyAny>,
        what: impl std::fmt::Display,
        access: Access,
        format: bool,
    ) -> PyResult<Self> {
        let py = obj.py();
        let mut flags = PYBUF_C_CONTIGUOUS;
        if access == Access::Write {
            flags |= PYBUF_WRITABLE;
        }
        if format {
            flags |= PYBUF_FORMAT;
        }
        let mut raw = Box::new(RawBuffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        });
        // SAFETY: `obj` is a live object; `raw` is a zeroed `Py_buffer`.
        let rc = unsafe {
            PyObject_GetBuffer(obj.as_ptr(), (&mut *raw as *mut RawBuffer).cast(), flags)
        };
        if rc != 0 {
            let err = PyErr::fetch(py);
            let kind = if access == Access::Write {
                "a writable, C-contiguous buffer"
            } else {
                "a C-contiguous buffer"
            };
            let message = format!("{what} must be {kind}: {}", err.value(py));
            // Not a buffer at all is a TypeError; a buffer of the wrong kind
            // (read-only, strided) a ValueError, as numpy says them.
            let new = if err.is_instance_of::<PyTypeError>(py) {
                PyTypeError::new_err(message)
            } else {
                PyValueError::new_err(message)
            };
            new.set_cause(py, Some(err));
            return Err(new);
        }
        let mut held = Borrowed {
            raw,
            format: None,
            access,
        };
        if access == Access::Write && held.raw.readonly != 0 {
            return Err(PyValueError::new_err(format!("{what} is read-only")));
        }
        if held.raw.len < 0 || (held.raw.len > 0 && held.raw.buf.is_null()) {
            return Err(PyValueError::new_err(format!("{what}: invalid buffer")));
        }
        if format && !held.raw.format.is_null() {
            // SAFETY: a non-null format is a NUL-terminated string owned by
            // the exporter for the buffer's life.
            let f = unsafe { CStr::from_ptr(held.raw.format) };
            held.format = Some(f.to_string_lossy().into_owned());
        }
        Ok(held)
    }

    /// The object's bytes, for reading (and, through [`Access::Write`]
    /// buffers, the same memory the caller sees).
    pub fn bytes(&self) -> &[u8] {
        if self.raw.len == 0 {
            return &[];
        }
        // SAFETY: `buf` points to `len` bytes (checked non-null) that stay
        // valid until release (see the module docs).
        unsafe { std::slice::from_raw_parts(self.raw.buf as *const u8, self.raw.len as usize) }
    }

    /// The object's bytes, for writing; the buffer was asked for writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        assert!(self.access == Access::Write, "bytes_mut on a read buffer");
        if self.raw.len == 0 {
            return &mut [];
        }
        // SAFETY: as `bytes`, and the exporter granted a writable buffer.
        unsafe { std::slice::from_raw_parts_mut(self.raw.buf as *mut u8, self.raw.len as usize) }
    }

    /// Bytes in the buffer.
    pub fn len(&self) -> usize {
        self.raw.len as usize
    }

    /// Bytes per element, as the exporter says.
    pub fn itemsize(&self) -> usize {
        self.raw.itemsize.max(0) as usize
    }

    /// Refuse a buffer whose length is not `expected` bytes.
    pub fn expect_len(&self, what: impl std::fmt::Display, expected: u64) -> PyResult<()> {
        if self.len() as u64 != expected {
            return Err(PyValueError::new_err(format!(
                "{what} holds {} bytes, expected {expected}",
                self.len()
            )));
        }
        Ok(())
    }

    /// Refuse a buffer whose elements are not bytes and not the width of
    /// `dtype` or of its storage type (a complex64 array may come as
    /// complex64 or as its f32 pairs).
    pub fn expect_dtype_width(
        &self,
        what: impl std::fmt::Display,
        dtype: zt::DType,
    ) -> PyResult<()> {
        let got = self.itemsize() as u64;
        let widths = [Some(1), dtype.size(), dtype.storage().size()];
        if !widths.contains(&Some(got)) {
            return Err(PyTypeError::new_err(format!(
                "{what} has {got}-byte elements, which cannot hold {dtype} ({}-byte elements)",
                dtype.size().unwrap_or(1)
            )));
        }
        Ok(())
    }

    /// Check that the buffer holds native 8-byte integers (a numpy int64 or
    /// uint64 array), aligned, and return how many. Needs `format` at `get`.
    fn check_words(&self, what: &str) -> PyResult<usize> {
        let format = self.format.as_deref().unwrap_or("B");
        // numpy spells native int64/uint64 `l`/`L` (or `q`/`Q`); a byte
        // order prefix other than native ('@', '=', '<' on this
        // little-endian target) means the integers need swapping.
        let native = cfg!(target_endian = "little");
        let code = match format.as_bytes() {
            [c] => Some(*c),
            [b'@' | b'=', c] => Some(*c),
            [b'<', c] if native => Some(*c),
            _ => None,
        };
        let ok = matches!(code, Some(b'q' | b'Q' | b'l' | b'L')) && self.itemsize() == 8;
        if !ok {
            return Err(PyTypeError::new_err(format!(
                "{what} must hold native 8-byte integers (int64 or uint64), got format {format:?}"
            )));
        }
        if self.raw.len % 8 != 0 || (self.raw.len > 0 && !(self.raw.buf as usize).is_multiple_of(8))
        {
            return Err(PyValueError::new_err(format!(
                "{what} must be aligned for 8-byte integers"
            )));
        }
        Ok(self.len() / 8)
    }

    /// The buffer as native u64s (see [`Borrowed::check_words`]).
    pub fn u64s(&self, what: &str) -> PyResult<&[u64]> {
        let n = self.check_words(what)?;
        if n == 0 {
            return Ok(&[]);
        }
        // SAFETY: `n * 8` valid bytes, aligned for u64, every bit pattern
        // a valid u64.
        Ok(unsafe { std::slice::from_raw_parts(self.raw.buf as *const u64, n) })
    }

    /// The buffer as writable native u64s.
    pub fn u64s_mut(&mut self, what: &str) -> PyResult<&mut [u64]> {
        assert!(self.access == Access::Write, "u64s_mut on a read buffer");
        let n = self.check_words(what)?;
        if n == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as `u64s`, and the buffer is writable.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.raw.buf as *mut u64, n) })
    }
}

/// Refuse buffers of which two share memory: filled from different
/// threads, their bytes would be a data race (and two `&mut` slices over
/// the same memory). `what` names one buffer by its index.
pub fn refuse_shared(buffers: &[Borrowed], what: impl Fn(usize) -> String) -> PyResult<()> {
    let span = |b: &Borrowed| (b.raw.buf as usize, b.len());
    let mut order: Vec<usize> = (0..buffers.len())
        .filter(|&i| buffers[i].len() > 0)
        .collect();
    order.sort_by_key(|&i| span(&buffers[i]).0);
    for pair in order.windows(2) {
        let ((a, a_len), (b, _)) = (span(&buffers[pair[0]]), span(&buffers[pair[1]]));
        if a + a_len > b {
            let (first, second) = (pair[0].min(pair[1]), pair[0].max(pair[1]));
            return Err(PyValueError::new_err(format!(
                "{} and {} share memory",
                what(first),
                what(second)
            )));
        }
    }
    Ok(())
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        // SAFETY: the buffer was filled by a successful `PyObject_GetBuffer`
        // and is released once; releasing needs the GIL.
        Python::attach(|_| unsafe { PyBuffer_Release(&mut *self.raw) });
    }
}
