//! Reading tensor files through `zt::Source`, warm and cold.
//!
//! * open (metadata only): `Source::open`, warm cache;
//! * zero-copy traversal, warm: every part's `bytes()` (a view of the
//!   mapping where the file allows) folded to a number per tensor, which
//!   is compared with the source data's on every run;
//! * copy into owned buffers, warm: every part copied into a `Vec<u8>`,
//!   all held at once (what `load_file` hands back); checked after the timer;
//! * cold read: the file is `fsync`ed and dropped from the page cache with
//!   `posix_fadvise(DONTNEED)` before each run, `mincore` confirms the pages
//!   left, then open + zero-copy traversal is timed (no warm-up run).
//!
//! Files are interleaved run by run within each measurement (A B A B …).

use std::collections::HashMap;
use std::path::PathBuf;

use zt::Source;

use crate::stats::{fold, interleaved, timed, Case, Rate, Res, Row, Table, Times};
use crate::sys;

/// Above this cached fraction before a cold run the row is flagged.
const COLD_LIMIT: f64 = 0.05;

/// A file to read and what its tensors must fold to.
#[derive(Debug, Clone)]
pub struct ReadFile {
    /// Row label (`.zt canonical`, a path).
    pub label: String,
    pub path: PathBuf,
    /// The expected fold of every tensor, in the source's tensor order.
    pub expected: Vec<u64>,
    /// Bytes of tensor data.
    pub bytes: u64,
}

impl ReadFile {
    /// A file whose tensors must fold as `folds` (by name) says.
    pub fn checked(label: &str, path: PathBuf, folds: &HashMap<String, u64>) -> Res<ReadFile> {
        let source = zt::open(&path)?;
        let expected = source
            .tensors()
            .map(|t| {
                folds
                    .get(t.name())
                    .copied()
                    .ok_or_else(|| format!("{}: unexpected tensor {}", path.display(), t.name()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if expected.len() != folds.len() {
            return Err(format!(
                "{}: {} tensors, {} written",
                path.display(),
                expected.len(),
                folds.len()
            )
            .into());
        }
        Ok(ReadFile {
            label: label.into(),
            bytes: source.total_bytes(),
            path,
            expected,
        })
    }

    /// A file with nothing to compare with: the first traversal is the
    /// reference the timed runs must reproduce.
    pub fn self_checked(path: PathBuf) -> Res<ReadFile> {
        let source = zt::open(&path)?;
        Ok(ReadFile {
            label: path.display().to_string(),
            bytes: source.total_bytes(),
            expected: traverse(&source)?,
            path,
        })
    }

    fn check(&self, got: &[u64]) -> Res<()> {
        if got != self.expected {
            return Err(
                format!("{}: bytes read differ from the source", self.path.display()).into(),
            );
        }
        Ok(())
    }
}

/// Fold every byte of every tensor (XOR of its parts' folds).
pub fn traverse(source: &Source) -> Res<Vec<u64>> {
    let mut out = Vec::with_capacity(source.len());
    for t in source.tensors() {
        let mut acc = 0;
        for p in t.parts() {
            acc ^= fold(&p.bytes()?);
        }
        out.push(acc);
    }
    Ok(out)
}

/// Every part copied into an owned buffer, per tensor.
fn copy(source: &Source) -> Res<Vec<Vec<Vec<u8>>>> {
    let mut out = Vec::with_capacity(source.len());
    for t in source.tensors() {
        let parts: Result<Vec<Vec<u8>>, _> = t
            .parts()
            .map(|p| p.bytes().map(|b| b.into_owned()))
            .collect();
        out.push(parts?);
    }
    Ok(out)
}

fn fold_copies(copies: &[Vec<Vec<u8>>]) -> Vec<u64> {
    copies
        .iter()
        .map(|parts| parts.iter().fold(0, |acc, p| acc ^ fold(p)))
        .collect()
}

const OPEN: &str = "open (metadata only)";
const WARM: &str = "zero-copy traversal, warm";
const COPY: &str = "copy into owned buffers, warm";
const COLD: &str = "open + zero-copy traversal, cold";

fn row_name(measurement: &str, file: &ReadFile) -> String {
    format!("{measurement}: {}", file.label)
}

/// The warm measurements. Each measurement is its own interleaved group
/// (open A, open B, open A, …), so no case always follows another kind's
/// (a case right after a copy freed its buffers ran measurably slower).
fn warm(files: &[ReadFile], runs: usize) -> Res<Times> {
    let sources = files
        .iter()
        .map(|f| zt::open(&f.path))
        .collect::<Result<Vec<_>, _>>()?;
    let mut times = Times::new();
    let mut open: Vec<Case> = files
        .iter()
        .map(|f| {
            Case::new(row_name(OPEN, f), move || {
                let (s, source) = timed(|| zt::open(&f.path));
                std::hint::black_box(source?.len());
                Ok(s)
            })
        })
        .collect();
    times.extend(interleaved(&mut open, runs, 1)?);
    let mut warm: Vec<Case> = files
        .iter()
        .zip(&sources)
        .map(|(f, source)| {
            Case::new(row_name(WARM, f), move || {
                let (s, folds) = timed(|| traverse(source));
                f.check(&folds?)?;
                Ok(s)
            })
        })
        .collect();
    times.extend(interleaved(&mut warm, runs, 1)?);
    let mut copies: Vec<Case> = files
        .iter()
        .zip(&sources)
        .map(|(f, source)| {
            Case::new(row_name(COPY, f), move || {
                let (s, copies) = timed(|| copy(source));
                f.check(&fold_copies(&copies?))?;
                Ok(s)
            })
        })
        .collect();
    times.extend(interleaved(&mut copies, runs, 1)?);
    Ok(times)
}

/// Cold runs, every file interleaved; also the largest fraction of each
/// file found still cached after dropping it.
fn cold(files: &[ReadFile], runs: usize) -> Res<(Times, Vec<f64>)> {
    let kept: Vec<std::cell::Cell<f64>> = files.iter().map(|_| Default::default()).collect();
    let mut cases = Vec::new();
    for (f, kept) in files.iter().zip(&kept) {
        cases.push(Case::new(row_name(COLD, f), move || {
            sys::drop_cache(&f.path)?;
            kept.set(kept.get().max(sys::cached_fraction(&f.path)?));
            let (s, folds) = timed(|| -> Res<Vec<u64>> { traverse(&zt::open(&f.path)?) });
            f.check(&folds?)?;
            Ok(s)
        }));
    }
    let times = interleaved(&mut cases, runs, 0)?;
    drop(cases);
    Ok((times, kept.into_iter().map(|c| c.get()).collect()))
}

/// One table: open, warm traversal, copy and cold read of every file;
/// ratios against the file labelled `peer` when given.
pub fn table(title: &str, files: &[ReadFile], runs: usize, peer: Option<&str>) -> Res<Table> {
    let mut times = warm(files, runs)?;
    let (cold_times, kept) = cold(files, runs)?;
    times.extend(cold_times);
    let mut t = Table::new(title, &[Rate::GiBps]).extra(&["cached before run"]);
    if let Some(p) = peer {
        t = t.ratio(&format!("vs {p}"));
    }
    for m in [OPEN, WARM, COPY, COLD] {
        for (f, kept) in files.iter().zip(&kept) {
            let amount = (m != OPEN).then_some(f.bytes as f64);
            let mut row = Row::new(&row_name(m, f), &times).amounts(&[amount]);
            if let Some(p) = peer {
                row = row.vs(&format!("{m}: {p}"));
            }
            if m == COLD {
                let flag = if *kept > COLD_LIMIT {
                    " (NOT cold)"
                } else {
                    ""
                };
                row = row.extra(vec![format!("{:.1}%{flag}", kept * 100.0)]);
            }
            t.rows.push(row);
        }
    }
    t.notes.push(format!(
        "Files interleaved run by run within each measurement. Warm rows: one warm-up run, then {runs} runs; cold rows: {runs} runs, each after fsync + \
         posix_fadvise(DONTNEED), \"cached before run\" is the largest fraction of the file's pages \
         mincore still found cached. Every run's bytes are folded and compared with the source data."
    ));
    Ok(t)
}
