//! `zt._zt.DataLoaderCore`: the native half of `zt.loader.DataLoader`.
//!
//! Worker threads are [`zloader::DataLoader`]'s. Without a transform they
//! never touch the GIL: the consumer's `next()` waits with the GIL released
//! and turns the batch into Python objects at hand-off. With a transform,
//! the worker attaches to the interpreter, builds the batch's Python form
//! and calls `finish(step, columns)` (zt/loader.py's wrapper around the
//! user's transform); the result or the exception (with its traceback) is
//! what the consumer receives at that step.
//!
//! Columns cross as `ArrayView`s (`array.rs`) over the batch's own
//! memory, so a numpy array made from one keeps it (and the batch's
//! memory) alive for as long as the array lives.

use std::sync::Arc;

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use zloader::dataloader::{Column, Config, DEFAULT_PREFETCH_BYTES};
use zloader::{Batch, DataLoader, GatherError, Stream};
use zrecord::Geometry;

use crate::array::{ArrayView, Keep};
use crate::loader::{state_error, state_from_py, state_to_py};
use crate::zrecord::RecordReader;

/// What a worker hands over: the raw batch (no transform) or the
/// transform's outcome.
enum Item {
    Raw(Result<Batch, GatherError>),
    Done(u64, PyResult<Py<PyAny>>),
}

/// The Python form of a batch's columns: a Dense column is one buffer of
/// shape `(n, *item_shape)`; a Ragged column is `(values u8, offsets u64
/// (bytes), shapes u64[n, ndim])`.
fn columns_to_py<'py>(
    py: Python<'py>,
    streams: &[Stream],
    batch: Batch,
) -> PyResult<Bound<'py, PyList>> {
    let n = batch.indices.len();
    let list = PyList::empty(py);
    for (stream, column) in streams.iter().zip(batch.columns) {
        let schema = stream.reader.schema();
        match (column, &schema.geometry) {
            (Column::Dense(c), Geometry::Dense { item_shape }) => {
                let mut shape = vec![n];
                shape.extend(item_shape.iter().map(|&d| d as usize));
                let address = c.as_ptr() as usize;
                let typestr = schema.dtype.clone().into();
                let buf = ArrayView::kept(Keep::Column(c), address, typestr, shape);
                list.append(Py::new(py, buf)?)?;
            }
            (Column::Ragged(r), Geometry::Ragged { ndim }) => {
                let keep = r.lease();
                let batch = r.batch;
                // Each array keeps the batch counted as live (offsets and
                // shapes belong to the same batch as the values).
                let buffer = |words: Vec<u64>, typestr: &'static str, shape| {
                    let address = words.as_ptr() as usize;
                    let keep = Keep::Batch(words, keep.clone());
                    ArrayView::kept(keep, address, typestr.into(), shape)
                };
                let values = buffer(batch.words, "|u1", vec![batch.len]);
                let offsets_len = batch.offsets.len();
                let offsets = buffer(batch.offsets, "<u8", vec![offsets_len]);
                let shapes = buffer(batch.shapes, "<u8", vec![n, *ndim]);
                let parts = (
                    Py::new(py, values)?,
                    Py::new(py, offsets)?,
                    Py::new(py, shapes)?,
                );
                list.append(parts)?;
            }
            _ => {
                return Err(PyRuntimeError::new_err(
                    "batch column does not match its stream",
                ))
            }
        }
    }
    Ok(list)
}

/// The exception for a stream that failed at a step: zrecord's
/// `ZrecordError` (with loaderx's `code`) naming stream, step, store and
/// record; `MemoryError` for a batch too large to allocate, as a zrecord
/// gather raises (both carry `step` and `stream`).
fn gather_error(py: Python<'_>, e: GatherError) -> PyErr {
    let code = e.source.code();
    let message = e.to_string();
    let class = match e.source {
        zrecord::Error::Memory { .. } => Ok(py.get_type::<PyMemoryError>().into_any()),
        _ => py.import("zt._zt").and_then(|m| m.getattr("ZrecordError")),
    };
    let made = class.and_then(|t| t.call1((message.clone(),)));
    match made {
        Ok(exc) => {
            let _ = exc.setattr("code", code);
            let _ = exc.setattr("step", e.step);
            let _ = exc.setattr("stream", e.stream);
            PyErr::from_value(exc)
        }
        Err(_) => PyRuntimeError::new_err(message),
    }
}

fn to_py_err(e: zloader::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// The running native loader. `seek` moves it in place (no restart), so
/// one core serves a loader's whole life and a thread waiting in `next`
/// is never left holding a closed one.
#[pyclass(frozen, module = "zt._zt")]
pub struct DataLoaderCore {
    inner: DataLoader<Item>,
    streams: Arc<Vec<Stream>>,
}

/// Start the workers over already-opened streams.
fn start(
    streams: &Arc<Vec<Stream>>,
    config: Config,
    finish: Option<Py<PyAny>>,
) -> PyResult<DataLoader<Item>> {
    match finish {
        None => DataLoader::new(streams.to_vec(), config, Item::Raw),
        Some(finish) => {
            let layout = streams.clone();
            DataLoader::new(streams.to_vec(), config, move |batch| {
                let step = match &batch {
                    Ok(b) => b.step,
                    Err(e) => e.step,
                };
                Item::Done(
                    step,
                    Python::attach(|py| {
                        let batch = batch.map_err(|e| gather_error(py, e))?;
                        let step = batch.step;
                        let columns = columns_to_py(py, &layout, batch)?;
                        finish.call1(py, (step, columns))
                    }),
                )
            })
        }
    }
    .map_err(to_py_err)
}

#[pymethods]
impl DataLoaderCore {
    /// Start the workers over the caller's open readers (`zt._zt.RecordReader`,
    /// one per name): nothing is reopened, so a store replaced on disk since
    /// it was opened is not picked up halfway through a run, and starting or
    /// seeking costs no open-time checks. Arguments are validated by
    /// zt/loader.py; the checks here back them up.
    #[new]
    #[pyo3(signature = (readers, names, batch_size, mode, seed, rank, world_size, workers, prefetch, start_step, step_stride=1, finish=None, prefetch_bytes=DEFAULT_PREFETCH_BYTES, block_size=zloader::sampler::DEFAULT_BLOCK_SIZE, mix=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        readers: Vec<Py<RecordReader>>,
        names: Vec<String>,
        batch_size: u64,
        mode: u64,
        seed: u64,
        rank: u64,
        world_size: u64,
        workers: usize,
        prefetch: usize,
        start_step: u64,
        step_stride: u64,
        finish: Option<Py<PyAny>>,
        prefetch_bytes: u64,
        block_size: u64,
        mix: Option<Vec<(u64, u64)>>,
    ) -> PyResult<Self> {
        if readers.len() != names.len() {
            return Err(PyValueError::new_err("one name per stream reader"));
        }
        let streams = names
            .into_iter()
            .zip(&readers)
            .map(|(name, r)| {
                Ok(Stream {
                    name,
                    reader: r.get().get()?,
                })
            })
            .collect::<PyResult<Vec<Stream>>>()?;
        let length = streams.first().map_or(0, |s| s.reader.len());
        // A mixture's readers are its datasets concatenated (issue 38).
        let plan = crate::loader::settings_plan(
            length,
            batch_size,
            mode,
            seed,
            block_size,
            mix.as_deref(),
        )?
        .shard(rank, world_size)
        .map_err(to_py_err)?;
        if usize::try_from(plan.batch_len()).is_err() {
            return Err(to_py_err(zloader::Error::BatchTooLarge(plan.batch_len())));
        }
        let config = Config {
            plan,
            workers,
            prefetch,
            prefetch_bytes,
            start_step,
            step_stride,
        };
        let streams = Arc::new(streams);
        let inner = start(&streams, config, finish)?;
        Ok(DataLoaderCore { inner, streams })
    }

    /// Make `step` the next step delivered (what `seek` and
    /// `load_state_dict` call), from any thread or a transform: a `next()`
    /// waiting in another thread returns `step`'s batch; batches built for
    /// the old position are dropped. Waits for no worker, so a transform
    /// may call it. `RuntimeError` once closed.
    fn seek(&self, py: Python<'_>, step: u64) -> PyResult<()> {
        // The state lock is never held by a thread waiting for the GIL, but
        // a seek need not hold the GIL while it takes the lock either.
        let dropped = py
            .detach(|| self.inner.seek(step))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        // Prefetched items (transform results) are dropped here, GIL held.
        drop(dropped);
        Ok(())
    }

    /// The next step's `(step, transformed, value)`; `None` once closed.
    /// `value` is the transform's result, or the raw columns.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Option<(u64, bool, Bound<'py, PyAny>)>> {
        let item = py.detach(|| self.inner.next());
        match item {
            None => Ok(None),
            Some(Item::Done(step, result)) => Ok(Some((step, true, result?.into_bound(py)))),
            Some(Item::Raw(batch)) => {
                let batch = batch.map_err(|e| gather_error(py, e))?;
                let step = batch.step;
                let columns = columns_to_py(py, &self.streams, batch)?;
                Ok(Some((step, false, columns.into_any())))
            }
        }
    }

    /// The run's state dict (`zloader::DataLoader::state`): `ValueError`
    /// for a strided loader, whose position is not the run's.
    fn state_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let state = self.inner.state().map_err(to_py_err)?;
        state_to_py(py, &state)
    }

    /// Resume a state dict (`zloader::DataLoader::resume`): checked, then
    /// moved to as `seek` moves (a refused state leaves the loader where it
    /// was); `RuntimeError` once closed.
    fn load_state_dict(
        &self,
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        rebase: bool,
    ) -> PyResult<()> {
        let state = state_from_py(state)?;
        let step = self
            .inner
            .resume_step(&state, rebase)
            .map_err(state_error)?;
        if self.inner.is_closed() {
            return Err(PyRuntimeError::new_err("DataLoader is closed"));
        }
        self.seek(py, step)
    }

    /// The step `next()` delivers next.
    #[getter]
    fn position(&self) -> u64 {
        self.inner.position()
    }

    /// The distance between delivered steps.
    #[getter]
    fn step_stride(&self) -> u64 {
        self.inner.step_stride()
    }

    /// Batches whose buffers are alive (in flight, waiting or held).
    #[getter]
    fn live_batches(&self) -> usize {
        self.inner.live_batches()
    }

    /// The most batches alive at once so far.
    #[getter]
    fn peak_batches(&self) -> usize {
        self.inner.peak_batches()
    }

    /// True once closed.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Stop the workers and wait for them (except the calling thread when a
    /// transform closes its own loader). Undelivered batches are dropped here
    /// with the GIL held; the wait runs with it released, so a transform
    /// that is waiting for the GIL can finish.
    fn close(&self, py: Python<'_>) {
        drop(self.inner.shutdown());
        py.detach(|| self.inner.join());
    }
}

impl Drop for DataLoaderCore {
    fn drop(&mut self) {
        // The workers exit after their batch in hand; without the join they
        // never wait on a GIL this thread may hold.
        drop(self.inner.shutdown());
    }
}
