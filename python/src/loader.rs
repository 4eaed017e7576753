//! `zt._zt.Sampler`: the native half of `zt.loader.Sampler`.
//!
//! A frozen class over an immutable [`zloader::Plan`] and an atomic step
//! counter, so it is thread-safe without a lock: concurrent `next_*` calls
//! each draw a distinct step. Batches come back either as a fresh
//! `bytearray` (which the Python side views as an int64 array without a
//! copy) or written into a caller's array, whose buffer is borrowed
//! (`borrow.rs`: writable, C-contiguous, native 8-byte integers, exactly
//! one rank's batch long) for the fill.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::{PyKeyError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyDict, PyFloat, PyString};

use zloader::sampler::DEFAULT_BLOCK_SIZE;
use zloader::state::Value;
use zloader::{Mix, Mode, Plan, State};

use crate::borrow::{Access, Borrowed};

/// Batches at least this long are filled with the GIL released: below it,
/// releasing and re-taking the GIL costs more than the fill.
const DETACH_AT: usize = 1 << 15;

fn to_py_err(e: zloader::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A loader error as Python raises it: a missing key is a `KeyError`, a
/// value of the wrong type a `TypeError`, anything else a `ValueError`.
pub(crate) fn state_error(e: zloader::Error) -> PyErr {
    use zloader::Error as E;
    match e {
        E::StateMissing(_) => PyKeyError::new_err(e.to_string()),
        E::StateNotObject(_) | E::StateNotInteger { .. } => PyTypeError::new_err(e.to_string()),
        e => to_py_err(e),
    }
}

/// One value of a Python state dict as `zloader` reads it: an integer (or
/// anything else `operator.index` takes) as its decimal text, a bool as itself,
/// a float as its value, anything else by type name and repr.
fn state_value(v: &Bound<'_, PyAny>) -> PyResult<Value> {
    if let Ok(b) = v.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if let Ok(f) = v.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    let index = v.py().import("operator")?.getattr("index")?;
    match index.call1((v,)) {
        Ok(i) => Ok(Value::Int(i.str()?.to_string())),
        Err(e) if e.is_instance_of::<PyTypeError>(v.py()) => Ok(Value::Other {
            type_name: v.get_type().name()?.to_string(),
            repr: v.repr()?.to_string(),
        }),
        Err(e) => Err(e),
    }
}

/// A Python state dict (`state_dict()`'s, or the first format) as a
/// checked [`State`]; keys that are not strings are not the state's.
pub(crate) fn state_from_py(state: &Bound<'_, PyAny>) -> PyResult<State> {
    let Ok(dict) = state.cast::<PyDict>() else {
        let name = state.get_type().name()?.to_string();
        return Err(state_error(zloader::Error::StateNotObject(name)));
    };
    let mut entries = Vec::with_capacity(dict.len());
    for (k, v) in dict.iter() {
        if let Ok(k) = k.cast::<PyString>() {
            entries.push((k.to_cow()?.into_owned(), state_value(&v)?));
        }
    }
    State::from_entries(entries).map_err(state_error)
}

/// A [`State`] as the dict `state_dict()` returns (its keys in order).
pub(crate) fn state_to_py<'py>(py: Python<'py>, state: &State) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in state.entries() {
        dict.set_item(key, value)?;
    }
    Ok(dict)
}

/// The unsharded plan of a loader's settings (already validated by
/// `zt/loader.py`): over one index space of `length` records, or over a
/// mixture's `(weight, length)` datasets, whose lengths sum to `length`.
pub(crate) fn settings_plan(
    length: u64,
    batch_size: u64,
    mode: u64,
    seed: u64,
    block_size: u64,
    mix: Option<&[(u64, u64)]>,
) -> PyResult<Plan> {
    let mode = Mode::try_from(mode).map_err(to_py_err)?;
    let plan = match mix {
        None => Plan::new(length, batch_size, mode, seed),
        Some(parts) => {
            let mix = Mix::new(parts).map_err(to_py_err)?;
            if mix.total_length() != length {
                return Err(PyValueError::new_err(format!(
                    "length {length} is not the mixture's {} records",
                    mix.total_length()
                )));
            }
            Plan::mixed(mix, batch_size, mode, seed)
        }
    };
    plan.and_then(|p| p.with_block_size(block_size))
        .map_err(to_py_err)
}

/// The sampler state shared by every thread that uses one Python object.
#[pyclass(frozen, module = "zt._zt")]
pub struct Sampler {
    plan: Plan,
    step: AtomicU64,
}

impl Sampler {
    fn len(&self) -> usize {
        self.plan.batch_len() as usize // addressable: checked in `new`
    }

    /// Fill `out` (exactly one rank's batch) for `step`.
    fn fill(&self, py: Python<'_>, step: u64, out: &mut [u64]) -> PyResult<()> {
        if out.len() >= DETACH_AT {
            py.detach(|| self.plan.fill(step, out))
        } else {
            self.plan.fill(step, out)
        }
        .map_err(to_py_err)
    }

    /// A new bytearray holding `step`'s batch in native-endian u64s.
    fn fresh<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyByteArray>> {
        let len = self.len();
        PyByteArray::new_with(py, len * 8, |bytes| {
            // SAFETY: every bit pattern is a valid u64.
            let (head, words, tail) = unsafe { bytes.align_to_mut::<u64>() };
            if head.is_empty() && tail.is_empty() {
                return self.fill(py, step, words);
            }
            // An allocator that did not align the buffer for u64: fill
            // aside and copy the bytes in.
            let mut aside = vec![0u64; len];
            self.fill(py, step, &mut aside)?;
            for (chunk, word) in bytes.chunks_exact_mut(8).zip(&aside) {
                chunk.copy_from_slice(&word.to_ne_bytes());
            }
            Ok(())
        })
    }

    /// The caller's `out` as one rank's batch, after checking that it is
    /// a writable, C-contiguous buffer of exactly `batch_len` native 8-byte
    /// integers.
    fn borrow_out(&self, out: &Bound<'_, PyAny>) -> PyResult<Borrowed> {
        let mut held = Borrowed::get(out, "out", Access::Write, true)?;
        let len = held.u64s_mut("out")?.len();
        if len != self.len() {
            return Err(to_py_err(zloader::Error::BufferLength {
                expected: self.plan.batch_len(),
                got: len as u64,
            }));
        }
        Ok(held)
    }

    fn advance(&self) -> u64 {
        self.step.fetch_add(1, Ordering::Relaxed) // wraps after u64::MAX, as documented
    }
}

#[pymethods]
impl Sampler {
    /// Argument ranges are checked by `zt/loader.py` with loaderx's messages;
    /// the checks here back them up.
    #[new]
    #[pyo3(signature = (length, batch_size, mode, seed, rank, world_size, block_size=DEFAULT_BLOCK_SIZE, mix=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        length: u64,
        batch_size: u64,
        mode: u64,
        seed: u64,
        rank: u64,
        world_size: u64,
        block_size: u64,
        mix: Option<Vec<(u64, u64)>>,
    ) -> PyResult<Self> {
        let plan = settings_plan(length, batch_size, mode, seed, block_size, mix.as_deref())?
            .shard(rank, world_size)
            .map_err(to_py_err)?;
        // The same check as `zloader::Sampler::from_plan`, and a bytearray
        // length must fit a Py_ssize_t.
        if plan
            .batch_len()
            .checked_mul(8)
            .is_none_or(|b| b > isize::MAX as u64)
        {
            return Err(to_py_err(zloader::Error::BatchTooLarge(plan.batch_len())));
        }
        Ok(Sampler {
            plan,
            step: AtomicU64::new(0),
        })
    }

    /// The current step's batch in a new bytearray; advances the step.
    fn next_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyByteArray>> {
        let step = self.advance();
        self.fresh(py, step)
    }

    /// Fill `out` (one rank's batch of int64/uint64) with the current
    /// step's batch; advances the step and returns the step drawn.
    fn next_into(&self, py: Python<'_>, out: Bound<'_, PyAny>) -> PyResult<u64> {
        // Checked before the step is taken, so a bad buffer consumes no step.
        let mut out = self.borrow_out(&out)?;
        let step = self.advance();
        self.fill(py, step, out.u64s_mut("out")?)?;
        Ok(step)
    }

    /// Any step's batch in a new bytearray (the counter is untouched).
    fn batch_bytes<'py>(&self, py: Python<'py>, step: u64) -> PyResult<Bound<'py, PyByteArray>> {
        self.fresh(py, step)
    }

    /// Any step's batch into `out`, as `next_into` (the counter is untouched).
    fn batch_into(&self, py: Python<'_>, step: u64, out: Bound<'_, PyAny>) -> PyResult<()> {
        let mut out = self.borrow_out(&out)?;
        self.fill(py, step, out.u64s_mut("out")?)
    }

    /// Make `step` the next step drawn.
    fn seek(&self, step: u64) {
        self.step.store(step, Ordering::Relaxed);
    }

    /// The step the next draw returns.
    #[getter]
    fn step(&self) -> u64 {
        self.step.load(Ordering::Relaxed)
    }

    /// Indices per rank and step.
    #[getter]
    fn batch_len(&self) -> u64 {
        self.plan.batch_len()
    }

    /// Indices in one global batch (before sharding).
    #[getter]
    fn global_batch_len(&self) -> u64 {
        self.plan.global_batch_len()
    }

    /// The state dict of a run over these settings whose next step is
    /// `step` (what `state_dict()` returns: `zloader::State`'s saved form).
    #[staticmethod]
    #[pyo3(signature = (length, batch_size, mode, seed, step, block_size=DEFAULT_BLOCK_SIZE, mix=None))]
    #[allow(clippy::too_many_arguments)]
    fn state_dict_at<'py>(
        py: Python<'py>,
        length: u64,
        batch_size: u64,
        mode: u64,
        seed: u64,
        step: u64,
        block_size: u64,
        mix: Option<Vec<(u64, u64)>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let plan = settings_plan(length, batch_size, mode, seed, block_size, mix.as_deref())?;
        state_to_py(py, &State::at(&plan, step))
    }

    /// The step a loader over these settings resumes a state dict at
    /// (`zloader::State::resume_step`; messages name `what`).
    #[staticmethod]
    #[pyo3(signature = (state, length, batch_size, mode, seed, rebase, what, block_size=DEFAULT_BLOCK_SIZE, mix=None))]
    #[allow(clippy::too_many_arguments)]
    fn resume_step_of(
        state: &Bound<'_, PyAny>,
        length: u64,
        batch_size: u64,
        mode: u64,
        seed: u64,
        rebase: bool,
        what: &str,
        block_size: u64,
        mix: Option<Vec<(u64, u64)>>,
    ) -> PyResult<u64> {
        let plan = settings_plan(length, batch_size, mode, seed, block_size, mix.as_deref())?;
        state_from_py(state)?
            .resume_step_named(&plan, rebase, what)
            .map_err(state_error)
    }

    /// CYCLIC: steps per cycle; None otherwise.
    #[getter]
    fn steps_per_cycle(&self) -> Option<u64> {
        self.plan.steps_per_cycle()
    }
}
