//! The `zt` binary: the whole program is `zt_cli::run`, which the Python
//! package's `zt` command calls too.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(zt_cli::run(std::env::args_os()))
}
