//! `zt._zt.cli_main`: the Python package's `zt` command (and `python -m zt`)
//! is the Rust CLI itself, `zt_cli::run`, the program the cargo binary runs;
//! there is no second CLI written in Python.

use std::ffi::OsString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::prelude::*;

/// Run the `zt` command line on `argv` (`argv[0]` is the program name) and
/// return its exit status. It prints to this process's stdout and stderr
/// and releases the GIL while it runs.
#[pyfunction]
pub fn cli_main(py: Python<'_>, argv: Vec<OsString>) -> i32 {
    py.detach(
        || match catch_unwind(AssertUnwindSafe(|| zt_cli::run(argv))) {
            Ok(status) => i32::from(status),
            // The panic hook has printed the message, as in the binary, whose
            // status after a panic is 101.
            Err(_) => 101,
        },
    )
}
