//! numpy's `__array_struct__`: the array interface as a C struct in a
//! capsule (numpy's `PyArrayInterface`), which `np.asarray` tries before
//! `__array_interface__`. The dict form costs numpy a dictionary, a tuple
//! per shape and a typestr parse for every array; the struct hands over the
//! shape and strides as integers and the dtype as a `numpy.dtype` object
//! made once per typestr, so turning an `ArrayView` into an array is a few
//! field reads. It is part of numpy's array interface protocol, not its C
//! API: nothing is linked and the wheel stays abi3.
//!
//! numpy keeps the object that handed out the capsule (and the capsule) as
//! the array's `base`: older numpy sets `base` to the object, numpy 2 to
//! the tuple `(object, capsule)`.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{LazyLock, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;

/// `NPY_ARRAY_NOTSWAPPED`: the elements are in the machine's byte order.
const NOTSWAPPED: c_int = 0x200;
/// `NPY_ARRAY_WRITEABLE`.
const WRITEABLE: c_int = 0x400;
/// `NPY_ARR_HAS_DESCR`: `descr` holds the dtype.
const HAS_DESCR: c_int = 0x800;

/// numpy's `PyArrayInterface` (array interface version 3, struct form).
#[repr(C)]
struct PyArrayInterface {
    /// Always 2 (numpy checks it).
    two: c_int,
    nd: c_int,
    typekind: c_char,
    itemsize: c_int,
    flags: c_int,
    shape: *mut isize,
    strides: *mut isize,
    data: *mut c_void,
    descr: *mut ffi::PyObject,
}

/// What the capsule owns: the struct numpy reads (first, so the capsule's
/// pointer is the struct's), with a strong reference to the dtype its
/// `descr` names (released by [`release`]), and the shape and strides it
/// points into.
#[repr(C)]
struct Capsuled {
    interface: PyArrayInterface,
    /// `nd` sizes, then `nd` byte strides.
    dims: Vec<isize>,
}

/// A numpy dtype made once per typestr, with the kind and item size the
/// struct also carries.
struct Descr {
    dtype: Py<PyAny>,
    kind: c_char,
    itemsize: c_int,
}

static DESCRS: LazyLock<Mutex<HashMap<String, Descr>>> = LazyLock::new(Default::default);

/// `numpy.dtype(typestr)` with its kind and item size, made on first use.
fn descr(py: Python<'_>, typestr: &str) -> PyResult<(Py<PyAny>, c_char, c_int)> {
    let known = |map: &HashMap<String, Descr>| {
        map.get(typestr)
            .map(|d| (d.dtype.clone_ref(py), d.kind, d.itemsize))
    };
    if let Some(found) = known(&DESCRS.lock().unwrap_or_else(|e| e.into_inner())) {
        return Ok(found);
    }
    // Made without the lock held: numpy runs Python code.
    let dtype = py.import("numpy")?.getattr("dtype")?.call1((typestr,))?;
    let kind = dtype.getattr("kind")?.extract::<String>()?;
    let itemsize = dtype.getattr("itemsize")?.extract::<c_int>()?;
    let descr = Descr {
        dtype: dtype.unbind(),
        kind: kind.bytes().next().unwrap_or(b'V') as c_char,
        itemsize,
    };
    let mut map = DESCRS.lock().unwrap_or_else(|e| e.into_inner());
    let entry = map.entry(typestr.to_owned()).or_insert(descr);
    Ok((entry.dtype.clone_ref(py), entry.kind, entry.itemsize))
}

/// The capsule numpy reads as `__array_struct__` for `shape` elements of
/// `typestr` at `address`, with byte `strides` (C order when `None`).
/// The memory must stay valid for as long as the object handing out the
/// capsule lives: numpy keeps that object as the array's base.
pub fn capsule<'py>(
    py: Python<'py>,
    address: usize,
    typestr: &str,
    shape: &[u64],
    strides: Option<&[i64]>,
    readonly: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let (dtype, kind, itemsize) = descr(py, typestr)?;
    let too_big = || PyValueError::new_err("array dimension does not fit a pointer-sized integer");
    let mut dims = Vec::with_capacity(shape.len() * 2);
    for &d in shape {
        dims.push(isize::try_from(d).map_err(|_| too_big())?);
    }
    match strides {
        Some(strides) => {
            for &s in strides {
                dims.push(isize::try_from(s).map_err(|_| too_big())?);
            }
        }
        None => {
            // C order, spelled out so numpy works out contiguity and
            // alignment from the strides as it does for the dict form.
            let mut step = itemsize as isize;
            let at = dims.len();
            dims.resize(at + shape.len(), 0);
            for i in (0..shape.len()).rev() {
                dims[at + i] = step;
                step = step.saturating_mul(dims[i].max(1));
            }
        }
    }
    let nd = shape.len();
    let mut flags = HAS_DESCR;
    if !typestr.starts_with('>') || cfg!(target_endian = "big") {
        flags |= NOTSWAPPED;
    }
    if !readonly {
        flags |= WRITEABLE;
    }
    // numpy reads no byte of an empty array, but a null data pointer makes
    // it allocate memory of its own.
    let data = if address == 0 {
        std::ptr::NonNull::<u64>::dangling().as_ptr().cast()
    } else {
        address as *mut c_void
    };
    let boxed = Box::new(Capsuled {
        interface: PyArrayInterface {
            two: 2,
            nd: c_int::try_from(nd).map_err(|_| too_big())?,
            typekind: kind,
            itemsize,
            flags,
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            data,
            // The strong reference moves into the struct.
            descr: dtype.into_ptr(),
        },
        dims,
    });
    let raw = Box::into_raw(boxed);
    // SAFETY: `raw` is a live, uniquely owned box; its `dims` buffer does
    // not move when the box's pointer is handed on, so pointers into it
    // stay valid until `release` drops the box. The capsule has no name,
    // as numpy asks for (`PyCapsule_GetPointer(capsule, NULL)`).
    unsafe {
        let dims = (*raw).dims.as_mut_ptr();
        (*raw).interface.shape = dims;
        (*raw).interface.strides = dims.add(nd);
        let capsule = ffi::PyCapsule_New(raw.cast(), std::ptr::null(), Some(release));
        if capsule.is_null() {
            free(raw);
        }
        Bound::from_owned_ptr_or_err(py, capsule)
    }
}

/// The capsule's destructor: frees what [`capsule`] boxed.
unsafe extern "C" fn release(capsule: *mut ffi::PyObject) {
    // SAFETY: only capsules made by `capsule` get this destructor, and the
    // pointer they hold is the `Capsuled` box; it runs once, with the GIL
    // held (CPython calls destructors holding it).
    unsafe {
        let raw = ffi::PyCapsule_GetPointer(capsule, std::ptr::null());
        if !raw.is_null() {
            free(raw.cast::<Capsuled>());
        }
    }
}

/// Drop the box and its reference to the dtype.
///
/// # Safety
/// `raw` came from `Box::into_raw` in [`capsule`], is freed once, and the
/// GIL is held.
unsafe fn free(raw: *mut Capsuled) {
    // SAFETY: as the caller promises; `descr` holds the strong reference
    // `capsule` moved into it.
    unsafe {
        let boxed = Box::from_raw(raw);
        ffi::Py_DecRef(boxed.interface.descr);
    }
}
