//! Recording and replaying what opening remote objects fetched
//! (`zt_remote::openings`), for `zt.torch.load_sharded`: one rank of a
//! group opens the source while recording, the others open it again from
//! the recording it shares, sending storage no request to open.

use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use zt::remote::client::openings::{Recording, Replay};

use crate::to_py_err;

/// Notes every object this process opens from object storage until
/// `finish()` (which returns the recording's bytes) or `close()`.
#[pyclass(frozen, module = "zt._zt")]
pub struct OpeningsRecording {
    inner: Mutex<Option<Recording>>,
}

#[pymethods]
impl OpeningsRecording {
    #[new]
    fn new() -> Self {
        OpeningsRecording {
            inner: Mutex::new(Some(Recording::start())),
        }
    }

    /// Stop, and the openings noted as bytes `OpeningsReplay` takes.
    fn finish<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let recording = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| PyValueError::new_err("this recording has finished"))?;
        let encoded = py.detach(|| recording.finish());
        Ok(PyBytes::new(py, &encoded))
    }

    /// Stop without encoding anything.
    fn close(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// While open, objects the recording (`OpeningsRecording.finish()`'s bytes,
/// from any process) holds are opened from it: no request is sent to open
/// them, and every read of them is pinned to the recorded version.
#[pyclass(frozen, module = "zt._zt")]
pub struct OpeningsReplay {
    inner: Mutex<Option<Replay>>,
}

#[pymethods]
impl OpeningsReplay {
    #[new]
    fn new(recording: &[u8]) -> PyResult<Self> {
        let replay = Replay::start(recording).map_err(|e| to_py_err(zt::remote::error(e)))?;
        Ok(OpeningsReplay {
            inner: Mutex::new(Some(replay)),
        })
    }

    /// Stop serving the recording (objects opened from it stay pinned).
    fn close(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<OpeningsRecording>()?;
    m.add_class::<OpeningsReplay>()?;
    Ok(())
}
