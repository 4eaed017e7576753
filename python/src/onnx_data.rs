//! `zt.convert(model, out, external_data=True|False, location=, threshold=)`:
//! an ONNX model's tensors moved to external data or back inline, the
//! protobuf rewritten on the wire (`zt::formats::onnx::rewrite`).

use std::path::PathBuf;

use pyo3::prelude::*;
use zt::formats::onnx::rewrite::{self, Layout};

use crate::to_py_err;

/// Rewrite the ONNX model `src` to `dst`: with `external`, tensors of at
/// least `threshold` bytes (default 1024) into the data file `location`
/// beside `dst` (default `dst`'s name + `.data`); else every tensor's
/// external bytes back into the model. `durable`: each file fsynced before
/// its rename. Returns the bytes written (model and data file).
#[pyfunction]
#[pyo3(signature = (src, dst, external, location = None, threshold = None, durable = true))]
pub fn onnx_external_data(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    external: bool,
    location: Option<String>,
    threshold: Option<u64>,
    durable: bool,
) -> PyResult<u64> {
    let layout = if external {
        Layout::external(&dst, location.as_deref(), threshold)
    } else {
        Layout::Inline
    };
    let done = py
        .detach(|| rewrite::rewrite_with(&src, &dst, &layout, durable))
        .map_err(to_py_err)?;
    Ok(done.model_bytes + done.data.map_or(0, |(_, n)| n))
}
