//! `zt-bench`: Rust-only measurements of zt and zrecord, no Python needed.
//!
//! ```text
//! cargo run --release -p zt-bench -- all [--size-mb 512] [--runs 5] [--dir work-bench/zt-bench] [--out results/bench.md]
//! cargo run --release -p zt-bench -- write [--workload large|mixed|small]... [same options]
//! cargo run --release -p zt-bench -- zrecord [same options]
//! cargo run --release -p zt-bench -- read FILE... [--runs 5] [--out FILE]
//! ```
//!
//! `all` measures, for each of zTensor's three write workloads (large, mixed,
//! small; `--size-mb` each, the same tensors in memory for every writer):
//! writes to `.zt` canonical / auto / 4 KiB and safetensors (throughput,
//! size ÷ payload); reads of the canonical and auto `.zt` and the safetensors files
//! (open latency, warm zero-copy traversal, copy into owned buffers, cold
//! read after `posix_fadvise(DONTNEED)` checked with `mincore`); `zt verify`
//! shallow and deep; safetensors → `.zt` conversion. Then zrecord Dense
//! stores (raw and zstd; dense vision and token blocks, `--size-mb` each):
//! append and IID-batch gather, logical MiB/s and krecords/s.
//!
//! Method (as the Python harness): alternatives interleaved run by run,
//! one warm-up run (none for cold reads), median and interquartile range,
//! ratios to the peer pair by pair, every byte read or gathered compared
//! with the source data, files on real disk (tmpfs refused). Markdown goes
//! to stdout, table by table, and to `--out` when given.

mod read;
mod records;
mod stats;
mod sys;
mod workloads;
mod write;

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::stats::{Res, Table};
use crate::workloads::{Kind, Records, Tensors};

#[derive(Parser)]
#[command(
    name = "zt-bench",
    about = "Rust-only benchmarks of zt and zrecord (Markdown out)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Common {
    /// MiB of data per workload.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(1..))]
    size_mb: u64,
    /// Timed runs per case (after one warm-up run).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    runs: u64,
    /// Scratch directory on real disk (tmpfs is refused); files are removed after use.
    #[arg(long, default_value = "work-bench/zt-bench")]
    dir: PathBuf,
    /// Also write the Markdown to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Every table: write, read, verify and convert per workload, then zrecord.
    All(Common),
    /// Write tables only.
    Write {
        #[command(flatten)]
        common: Common,
        /// Workloads to write (default: all three).
        #[arg(long = "workload", value_parser = ["large", "mixed", "small"])]
        workloads: Vec<String>,
    },
    /// zrecord append and gather tables.
    Zrecord(Common),
    /// Read existing files: open, warm zero-copy traversal, copy, cold read.
    Read {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Timed runs per case.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        runs: u64,
        /// Also write the Markdown to this file.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// The Markdown being produced: printed table by table, saved at the end.
struct Report {
    text: String,
}

impl Report {
    fn new(fs: &str) -> Report {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let mut r = Report {
            text: String::new(),
        };
        r.add(&format!(
            "## zt-bench\n\n`zt-bench {}`\n\nMachine: {}.\n",
            args.join(" "),
            sys::machine(fs)
        ));
        r
    }

    fn add(&mut self, markdown: &str) {
        println!("{markdown}");
        let _ = std::io::stdout().flush();
        self.text.push_str(markdown);
        self.text.push('\n');
    }

    fn table(&mut self, t: Table) {
        self.add(&t.markdown());
    }

    fn save(&self, out: Option<&Path>) -> Res<()> {
        if let Some(out) = out {
            if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(out, &self.text).map_err(|e| format!("{}: {e}", out.display()))?;
            eprintln!("zt-bench: wrote {}", out.display());
        }
        Ok(())
    }
}

fn progress(what: &str) {
    eprintln!("zt-bench: {what}");
}

/// Write (and with `full`, read, verify and convert) one tensor workload.
fn tensors(kind: Kind, c: &Common, report: &mut Report, full: bool) -> Res<()> {
    let runs = c.runs as usize;
    let t = Tensors::generate(kind, c.size_mb);
    progress(&format!("write {}", t.describe()));
    let (table, written) = write::table(&t, &c.dir, runs)?;
    report.table(table);
    if full {
        progress(&format!("read {}", t.describe()));
        let folds = write::folds(&t);
        let files = [
            read::ReadFile::checked(".zt canonical", written.canonical.clone(), &folds)?,
            read::ReadFile::checked(".zt auto", written.auto.clone(), &folds)?,
            read::ReadFile::checked("safetensors", written.safetensors.clone(), &folds)?,
        ];
        let title = format!("Read {}", t.describe());
        report.table(read::table(&title, &files, runs, Some("safetensors"))?);
        progress(&format!("verify and convert {}", t.describe()));
        report.table(write::verify_convert_table(&t, &written, &c.dir, runs)?);
    }
    drop(written); // removes the files
    Ok(())
}

fn record_stores(c: &Common, report: &mut Report) -> Res<()> {
    for make in [Records::vision as fn(u64) -> Records, Records::token_blocks] {
        let r = make(c.size_mb);
        progress(&format!("zrecord {}", r.describe()));
        report.table(records::table(&r, &c.dir, c.runs as usize)?);
    }
    Ok(())
}

fn run(cli: Cli) -> Res<()> {
    match cli.command {
        Command::All(c) => {
            let mut report = Report::new(sys::bench_dir(&c.dir)?);
            for kind in Kind::ALL {
                tensors(kind, &c, &mut report, true)?;
            }
            record_stores(&c, &mut report)?;
            report.save(c.out.as_deref())
        }
        Command::Write { common, workloads } => {
            let mut report = Report::new(sys::bench_dir(&common.dir)?);
            let kinds: Vec<Kind> = if workloads.is_empty() {
                Kind::ALL.to_vec()
            } else {
                workloads.iter().filter_map(|w| Kind::parse(w)).collect()
            };
            for kind in kinds {
                tensors(kind, &common, &mut report, false)?;
            }
            report.save(common.out.as_deref())
        }
        Command::Zrecord(c) => {
            let mut report = Report::new(sys::bench_dir(&c.dir)?);
            record_stores(&c, &mut report)?;
            report.save(c.out.as_deref())
        }
        Command::Read { files, runs, out } => {
            let mut filesystems = Vec::new();
            for f in &files {
                let fs = sys::filesystem(f).map_err(|e| format!("{}: {e}", f.display()))?;
                if matches!(fs, "tmpfs" | "ramfs") {
                    return Err(format!(
                        "{} is on {fs}: cold reads would measure memory",
                        f.display()
                    )
                    .into());
                }
                filesystems.push(fs);
            }
            filesystems.dedup();
            let mut report = Report::new(&filesystems.join(", "));
            let files = files
                .into_iter()
                .map(read::ReadFile::self_checked)
                .collect::<Res<Vec<_>>>()?;
            let title = if files.len() == 1 {
                format!("Read {}", files[0].label)
            } else {
                format!("Read {} files", files.len())
            };
            report.table(read::table(&title, &files, runs as usize, None)?);
            report.save(out.as_deref())
        }
    }
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("zt-bench: {e}");
        std::process::exit(1);
    }
}
