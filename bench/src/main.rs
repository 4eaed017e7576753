//! `zt-bench`: Rust-only measurements of the reader core, no Python needed.
//!
//! ```text
//! cargo run --release -p zt-bench -- read FILE... [--runs N]
//! ```
//!
//! For each file: open latency (metadata only), a warm zero-copy traversal
//! that touches every byte, and a copy of every tensor into owned buffers.
//! Prints a Markdown table with the median and interquartile range of N runs.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Instant;

use zt::Source;

fn usage() -> ! {
    eprintln!("usage: zt-bench read FILE... [--runs N]");
    std::process::exit(2);
}

/// Median and interquartile range of the samples, in seconds.
fn summary(mut samples: Vec<f64>) -> (f64, f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

/// Fold every byte so the traversal cannot be optimised away.
fn fold(bytes: &[u8]) -> u64 {
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

fn time<T>(runs: usize, mut f: impl FnMut() -> T) -> Vec<f64> {
    black_box(f()); // warm-up
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            black_box(f());
            t.elapsed().as_secs_f64()
        })
        .collect()
}

fn row(name: &str, samples: Vec<f64>, bytes: Option<u64>) {
    let (median, q1, q3) = summary(samples);
    let rate = bytes.map_or("-".to_string(), |b| {
        format!("{:.2}", b as f64 / median / (1u64 << 30) as f64)
    });
    println!(
        "| {name} | {:.3} ms | {:.3} – {:.3} ms | {rate} |",
        median * 1e3,
        q1 * 1e3,
        q3 * 1e3
    );
}

fn main() -> zt::Result<()> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some("read") {
        usage();
    }
    let mut files: Vec<PathBuf> = Vec::new();
    let mut runs = 5usize;
    while let Some(arg) = args.next() {
        if arg == "--runs" {
            runs = args
                .next()
                .and_then(|n| n.parse().ok())
                .filter(|&n| n > 0)
                .unwrap_or_else(|| usage());
        } else {
            files.push(arg.into());
        }
    }
    if files.is_empty() {
        usage();
    }
    for file in files {
        let source = Source::open(&file)?;
        let bytes = source.total_bytes();
        println!(
            "\n### {} ({}, {} tensors, {bytes} bytes)\n",
            file.display(),
            source.format(),
            source.len()
        );
        println!("| measurement | median | IQR | GiB/s |\n|---|---|---|---|");
        row(
            "open (metadata only)",
            time(runs, || Source::open(&file).map(|s| s.len())),
            None,
        );
        let traverse = || -> zt::Result<u64> {
            let mut acc = 0;
            for t in source.tensors() {
                for p in t.parts() {
                    acc ^= fold(&p.bytes()?);
                }
            }
            Ok(acc)
        };
        let expected = traverse()?;
        row(
            "zero-copy traversal, warm",
            time(runs, || assert_eq!(traverse().ok(), Some(expected))),
            Some(bytes),
        );
        let copy = || -> zt::Result<usize> {
            let mut total = 0;
            for t in source.tensors() {
                for p in t.parts() {
                    total += p.bytes()?.into_owned().len();
                }
            }
            Ok(total)
        };
        row(
            "copy into owned buffers, warm",
            time(runs, || copy().ok()),
            Some(bytes),
        );
    }
    Ok(())
}
