//! Everything the CLI prints on stdout goes through [`line`] (the `out!`
//! macro), which returns the write's error instead of panicking as
//! `println!` does. A reader that closes the pipe early (`zt ls BIG | head
//! -1`) ends the command quietly with status 0, as ripgrep and other
//! Rust tools do; Rust (and Python, for the pip `zt`) ignore SIGPIPE, so
//! the closed pipe arrives as `EPIPE` on the next write.

use std::io::Write;
use std::path::Path;

/// The name stdout errors carry, so [`closed_pipe`] knows them.
const STDOUT: &str = "<stdout>";

/// Print one line on stdout.
pub fn line(args: std::fmt::Arguments<'_>) -> zt::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_fmt(args)
        .and_then(|()| stdout.write_all(b"\n"))
        .map_err(|e| zt::Error::io(Path::new(STDOUT), e))
}

/// Write bytes on stdout as they are.
pub fn bytes(data: &[u8]) -> zt::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(data)
        .and_then(|()| stdout.flush())
        .map_err(|e| zt::Error::io(Path::new(STDOUT), e))
}

/// True when `e` is stdout's reader having gone away: not a failure of
/// the command, and nothing to report.
pub fn closed_pipe(e: &zt::Error) -> bool {
    matches!(e, zt::Error::Io { ctx, source }
        if source.kind() == std::io::ErrorKind::BrokenPipe
            && ctx.file.as_deref() == Some(Path::new(STDOUT)))
}

/// `println!` that returns the write's error from the enclosing function
/// (which returns `zt::Result`).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::line(format_args!($($arg)*))?
    };
}
pub(crate) use out;
