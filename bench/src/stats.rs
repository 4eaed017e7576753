//! The method every table shares: alternatives interleaved run by run
//! (A B C A B C …, so machine drift hits all of them equally), the median
//! and interquartile range of the timed runs, ratios to a peer computed pair
//! by pair, and the Markdown table they land in.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

/// Errors of a benchmark: anything that stops it, with a readable message.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// Result of a benchmark step.
pub type Res<T> = std::result::Result<T, Error>;

/// Timed samples (seconds) by case name.
pub type Times = HashMap<String, Vec<f64>>;

/// Median and quartiles of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub q1: f64,
    pub q3: f64,
}

/// Median and quartiles, inclusive method with linear interpolation (what
/// Python's `statistics.quantiles(method="inclusive")` gives, as the
/// harness uses).
pub fn summary(samples: &[f64]) -> Summary {
    assert!(!samples.is_empty(), "no samples to summarise");
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let pos = (s.len() - 1) as f64 * q;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        s[lo] + (s[hi] - s[lo]) * (pos - lo as f64)
    };
    Summary {
        median: at(0.5),
        q1: at(0.25),
        q3: at(0.75),
    }
}

/// A duration for a table: µs, ms or s with three or four significant digits.
pub fn fmt_time(seconds: f64) -> String {
    if seconds < 1e-3 {
        format!("{:.1} µs", seconds * 1e6)
    } else if seconds < 1.0 {
        format!("{:.1} ms", seconds * 1e3)
    } else {
        format!("{seconds:.2} s")
    }
}

/// Fold every byte to a number, so a traversal that skips bytes is caught
/// and the work cannot be optimised away (the harness's `digest`).
pub fn fold(bytes: &[u8]) -> u64 {
    let mut chunks = bytes.chunks_exact(8);
    let mut acc = 0u64;
    for c in &mut chunks {
        acc ^= u64::from_le_bytes(c.try_into().expect("8 bytes"));
    }
    chunks
        .remainder()
        .iter()
        .fold(acc, |a, &b| a ^ u64::from(b))
}

/// Seconds `f` takes, and its value.
pub fn timed<T>(f: impl FnOnce() -> T) -> (f64, T) {
    let t = Instant::now();
    let v = f();
    (t.elapsed().as_secs_f64(), v)
}

/// One alternative of an interleaved comparison. A run returns the seconds
/// it measured, so it can keep setup and checks (dropping the cache,
/// removing the previous output, comparing digests) outside its timer.
pub struct Case<'a> {
    pub name: String,
    pub run: Box<dyn FnMut() -> Res<f64> + 'a>,
}

impl<'a> Case<'a> {
    /// A case named `name`.
    pub fn new(name: impl Into<String>, run: impl FnMut() -> Res<f64> + 'a) -> Case<'a> {
        Case {
            name: name.into(),
            run: Box::new(run),
        }
    }
}

/// Run every case `warmup + runs` times, alternating A B C A B C …; returns
/// the timed samples (warm-up rounds dropped) by case name.
pub fn interleaved(cases: &mut [Case<'_>], runs: usize, warmup: usize) -> Res<Times> {
    let mut out: Times = cases.iter().map(|c| (c.name.clone(), Vec::new())).collect();
    for round in 0..warmup + runs {
        for case in cases.iter_mut() {
            let seconds = (case.run)().map_err(|e| format!("{}: {e}", case.name))?;
            if round >= warmup {
                out.get_mut(&case.name).expect("named case").push(seconds);
            }
        }
    }
    Ok(out)
}

/// A throughput column: what a row's amount is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    /// Bytes per second, in GiB/s.
    GiBps,
    /// Bytes per second, in MiB/s.
    MiBps,
    /// Records per second, in thousands.
    KRecords,
}

impl Rate {
    fn header(self) -> &'static str {
        match self {
            Rate::GiBps => "GiB/s",
            Rate::MiBps => "MiB/s",
            Rate::KRecords => "krecords/s",
        }
    }

    fn scale(self) -> f64 {
        match self {
            Rate::GiBps => (1u64 << 30) as f64,
            Rate::MiBps => (1u64 << 20) as f64,
            Rate::KRecords => 1e3,
        }
    }
}

/// One row of a timing table.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub samples: Vec<f64>,
    /// The amount per run for each of the table's rate columns (bytes or
    /// records), `None` where a rate means nothing (open latency).
    pub amounts: Vec<Option<f64>>,
    /// The row the ratio column compares with (by name).
    pub peer: Option<String>,
    /// The table's extra columns, in order.
    pub extra: Vec<String>,
}

impl Row {
    /// A row with the samples of `name` from an interleaved run.
    pub fn new(name: &str, times: &Times) -> Row {
        Row {
            name: name.to_string(),
            samples: times.get(name).cloned().unwrap_or_default(),
            amounts: Vec::new(),
            peer: None,
            extra: Vec::new(),
        }
    }

    /// Set the amounts for the rate columns.
    pub fn amounts(mut self, amounts: &[Option<f64>]) -> Row {
        self.amounts = amounts.to_vec();
        self
    }

    /// Compare with the row named `peer`.
    pub fn vs(mut self, peer: &str) -> Row {
        self.peer = Some(peer.to_string());
        self
    }

    /// Set the extra columns.
    pub fn extra(mut self, extra: Vec<String>) -> Row {
        self.extra = extra;
        self
    }
}

/// A timing table: median, IQR, rates, the ratio to each row's peer (the
/// median of the per-run ratios peer/row: above 1 the row is faster) and
/// extra columns.
#[derive(Debug, Clone)]
pub struct Table {
    pub title: String,
    pub rates: Vec<Rate>,
    /// Header of the ratio column (`vs safetensors`), when rows have peers.
    pub ratio: Option<String>,
    pub extra: Vec<String>,
    pub rows: Vec<Row>,
    /// Lines printed under the table.
    pub notes: Vec<String>,
}

impl Table {
    /// An empty table.
    pub fn new(title: impl Into<String>, rates: &[Rate]) -> Table {
        Table {
            title: title.into(),
            rates: rates.to_vec(),
            ratio: None,
            extra: Vec::new(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Name the ratio column.
    pub fn ratio(mut self, header: &str) -> Table {
        self.ratio = Some(header.to_string());
        self
    }

    /// Name the extra columns.
    pub fn extra(mut self, headers: &[&str]) -> Table {
        self.extra = headers.iter().map(|h| h.to_string()).collect();
        self
    }

    /// Markdown: a `###` title, the table, the notes.
    pub fn markdown(&self) -> String {
        let mut headers = vec!["case", "median", "IQR"];
        headers.extend(self.rates.iter().map(|r| r.header()));
        headers.extend(self.ratio.as_deref());
        headers.extend(self.extra.iter().map(String::as_str));
        let mut out = format!("### {}\n\n| {} |\n|", self.title, headers.join(" | "));
        out.push_str(&"---|".repeat(headers.len()));
        out.push('\n');
        for row in &self.rows {
            let cells = self.cells(row);
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        for note in &self.notes {
            let _ = write!(out, "\n{note}\n");
        }
        out
    }

    fn cells(&self, row: &Row) -> Vec<String> {
        let mut cells = vec![row.name.clone()];
        if row.samples.is_empty() {
            cells.push("missing".into());
            cells.resize(
                3 + self.rates.len() + usize::from(self.ratio.is_some()),
                "-".into(),
            );
        } else {
            let s = summary(&row.samples);
            cells.push(fmt_time(s.median));
            cells.push(format!("{} – {}", fmt_time(s.q1), fmt_time(s.q3)));
            for (i, rate) in self.rates.iter().enumerate() {
                cells.push(match row.amounts.get(i).copied().flatten() {
                    Some(a) => format!("{:.2}", a / s.median / rate.scale()),
                    None => "-".into(),
                });
            }
            if self.ratio.is_some() {
                cells.push(self.ratio_cell(row));
            }
        }
        for i in 0..self.extra.len() {
            cells.push(row.extra.get(i).cloned().unwrap_or_else(|| "-".into()));
        }
        cells
    }

    /// Median over runs of peer time / row time, run i against run i.
    fn ratio_cell(&self, row: &Row) -> String {
        let Some(peer) = row
            .peer
            .as_ref()
            .and_then(|p| self.rows.iter().find(|r| &r.name == p))
        else {
            return "-".into();
        };
        let ratios: Vec<f64> = peer
            .samples
            .iter()
            .zip(&row.samples)
            .map(|(p, r)| p / r)
            .collect();
        if ratios.is_empty() {
            return "-".into();
        }
        format!("{:.2}×", summary(&ratios).median)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_match_python_inclusive() {
        // statistics.quantiles([1, 2, 3, 4], n=4, method="inclusive") == [1.75, 2.5, 3.25]
        let s = summary(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.q1, s.median, s.q3), (1.75, 2.5, 3.25));
        let one = summary(&[7.0]);
        assert_eq!((one.q1, one.median, one.q3), (7.0, 7.0, 7.0));
    }

    #[test]
    fn fold_sees_every_byte() {
        let mut bytes = vec![0u8; 19];
        assert_eq!(fold(&bytes), 0);
        bytes[18] = 1;
        assert_eq!(fold(&bytes), 1);
        bytes[3] = 2;
        assert_ne!(fold(&bytes), 1);
    }

    #[test]
    fn interleaves_and_drops_warmup() {
        let order = std::cell::RefCell::new(Vec::new());
        let mut cases = vec![
            Case::new("a", || {
                order.borrow_mut().push('a');
                Ok(1.0)
            }),
            Case::new("b", || {
                order.borrow_mut().push('b');
                Ok(2.0)
            }),
        ];
        let times = interleaved(&mut cases, 2, 1).unwrap();
        drop(cases);
        assert_eq!(order.into_inner(), vec!['a', 'b', 'a', 'b', 'a', 'b']);
        assert_eq!(times["a"], vec![1.0, 1.0]);
        assert_eq!(times["b"], vec![2.0, 2.0]);
    }

    #[test]
    fn table_has_ratio_pair_by_pair_and_missing_rows() {
        let times: Times = [
            ("zt".to_string(), vec![1.0, 2.0]),
            ("peer".to_string(), vec![2.0, 8.0]),
        ]
        .into();
        let mut t = Table::new("T", &[Rate::GiBps]).ratio("vs peer");
        t.rows.push(
            Row::new("zt", &times)
                .amounts(&[Some((1u64 << 30) as f64)])
                .vs("peer"),
        );
        t.rows.push(Row::new("peer", &times).vs("peer"));
        t.rows.push(Row::new("gone", &times));
        let md = t.markdown();
        assert!(
            md.contains("| zt | 1.50 s | 1.25 s – 1.75 s | 0.67 | 3.00× |"),
            "{md}"
        );
        assert!(md.contains("| gone | missing | - | - | - |"), "{md}");
    }
}
