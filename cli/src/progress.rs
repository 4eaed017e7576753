//! A progress line for long conversions, drawn on stderr.
//!
//! Every writer builds its output in a partial file beside the
//! destination (`zt::publish::Partial`: unnamed where the filesystem has
//! `O_TMPFILE`, else named `.NAME.PID.RANDOM.partial`) and renames it at
//! the end, so the display needs no hook inside the writers: a thread
//! watches this process's partial of the destination
//! grow and redraws one line a few times a second. The expected size is
//! the source's payload; padding and compression make the real size differ,
//! so the percentage is capped below 100 until the writer returns.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const REDRAW: Duration = Duration::from_millis(200);
const WIDTH: usize = 30;

/// A running progress display; `finish` stops it and draws the last line.
pub struct Progress {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Progress {
    /// Watch the partial of `dest` grow towards about `expected` bytes.
    pub fn start(dest: PathBuf, expected: u64) -> Progress {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let started = Instant::now();
            // Redraw until `finish` sends (or the display is dropped).
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(REDRAW) {
                // The file is absent before the writer creates it and after
                // the rename: nothing to draw then.
                if let Some(size) = own_partial_size(&dest) {
                    draw(line(size, expected, started.elapsed(), false));
                }
            }
        });
        Progress { stop, thread }
    }

    /// Stop watching; on success draw the final line for `written` bytes.
    pub fn finish(self, written: Option<u64>, expected: u64, elapsed: Duration) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
        match written {
            Some(n) => {
                draw(line(n, expected, elapsed, true));
                eprintln!();
            }
            None => eprint!("\r\x1b[K"),
        }
    }
}

/// The size of this process's partial file of `dest`, if it has one; for
/// a sharded write, its staging directory: every shard in it, finished
/// or still a partial, so the line counts bytes across all shards. A
/// partial with no name (`O_TMPFILE`, see `zt::publish::Partial`) is
/// found through the writer's registry, a named one by its name.
fn own_partial_size(dest: &Path) -> Option<u64> {
    if let Some(len) = zt::publish::unnamed_partial_len(dest) {
        return Some(len);
    }
    let mine = format!(".{}.", std::process::id());
    let partial = zt::publish::partials_of(dest)
        .ok()?
        .into_iter()
        .find(|p| p.to_string_lossy().contains(&mine))?;
    let meta = std::fs::metadata(&partial).ok()?;
    if !meta.is_dir() {
        return Some(meta.len());
    }
    let entries = std::fs::read_dir(&partial).ok()?;
    let named: u64 = entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    Some(named + zt::publish::unnamed_partials_len_in(&partial))
}

fn draw(text: String) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[K{text}");
    let _ = err.flush();
}

/// One progress line: bar, percent, bytes and rate.
pub fn line(done: u64, expected: u64, elapsed: Duration, finished: bool) -> String {
    let fraction = match (finished, expected) {
        (true, _) => 1.0,
        (false, 0) => 0.0,
        (false, e) => (done as f64 / e as f64).min(0.99),
    };
    let filled = (fraction * WIDTH as f64).round() as usize;
    let secs = elapsed.as_secs_f64().max(1e-6);
    format!(
        "[{}{}] {:>3.0}% {} in {:.1} s, {}/s",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        fraction * 100.0,
        human(done as f64),
        secs,
        human(done as f64 / secs)
    )
}

fn human(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_the_bytes_and_stops_short_until_done() {
        let half = line(512 << 20, 1 << 30, Duration::from_secs(2), false);
        assert!(half.starts_with(&format!("[{}{}]", "#".repeat(15), "-".repeat(15))));
        assert!(
            half.contains(" 50% 512.0 MiB in 2.0 s, 256.0 MiB/s"),
            "{half}"
        );
        // Padding can make the output larger than the payload.
        let over = line(2 << 30, 1 << 30, Duration::from_secs(1), false);
        assert!(over.contains(" 99% "), "{over}");
        let done = line(2 << 30, 1 << 30, Duration::from_secs(1), true);
        assert!(done.contains("100% 2.0 GiB"), "{done}");
    }
}
