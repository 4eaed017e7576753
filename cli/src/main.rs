//! The `zt` command line tool.

mod convert;
mod progress;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::json;
use zt::{Align, Source, Value, WriteOptions};

#[derive(Parser)]
#[command(name = "zt", version, about = "Inspect tensor files of every format")]
struct Cli {
    /// S3 endpoint for s3:// paths (sets AWS_ENDPOINT_URL; an http://
    /// endpoint allows plain HTTP). Credentials, region and profile come
    /// from the standard AWS environment and files.
    #[arg(long, global = true, value_name = "URL")]
    endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List tensors: name, dtype, shape, bytes, offset.
    Ls {
        /// Files (several are read as one source; a shard index opens every shard).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Summarise files: format, tensor count, total bytes, attributes.
    Info {
        /// Files, each summarised on its own.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Convert files (read as one source) to the format OUT's extension
    /// names; or a model directory (its checkpoint, sharded or not, and
    /// its other files) to a model directory.
    Convert {
        /// Input files (or one model directory), then the output path last
        /// (a directory when it ends with / or is one).
        #[arg(required = true, num_args = 2..)]
        paths: Vec<PathBuf>,
        /// Write shards of at most this size, named and indexed as Hugging
        /// Face does: bytes, or a number with KB/MB/GB/TB or KiB/MiB/GiB/TiB
        /// (directory outputs default to 5GB).
        #[arg(long, value_name = "SIZE")]
        max_shard_size: Option<String>,
        /// Format of a directory output: safetensors (the default), pt or zt.
        #[arg(long, value_name = "FORMAT")]
        to: Option<String>,
        /// Blob placement for .zt: canonical, auto, or a power of two >= 4096.
        #[arg(long)]
        align: Option<String>,
        /// Compression for .zt: zstd or zstd:LEVEL.
        #[arg(long)]
        compress: Option<String>,
        /// Draw a progress line on stderr even when it is not a terminal.
        #[arg(long, conflicts_with = "no_progress")]
        progress: bool,
        /// Never draw a progress line (the default when stderr is not a terminal).
        #[arg(long)]
        no_progress: bool,
    },
    /// Print the detected format of a file.
    Detect {
        /// The file.
        file: PathBuf,
    },
    /// Check a file: structure and every part digest (.zt); exit 1 on failure.
    Verify {
        /// The file.
        file: PathBuf,
        /// Also hash every shard file against the root's shard digests.
        #[arg(long)]
        deep: bool,
        /// Also check the six rules of canonical form.
        #[arg(long)]
        canonical: bool,
    },
    /// Print the content digest of a .zt file (independent of placement,
    /// sharding and encoding).
    Id {
        /// The file.
        file: PathBuf,
    },
    /// Compare the decoded content of two files of any formats (names,
    /// layouts, dtypes, shapes, bytes); exit 1 on any difference.
    Diff {
        /// First file.
        a: PathBuf,
        /// Second file.
        b: PathBuf,
    },
    /// Remove what killed writers left behind: partial files beside each
    /// DEST whose writer is gone, and (always) dead processes' upload spools
    /// and the multipart uploads they never completed.
    Clean {
        /// Destinations whose stale partial files to remove.
        dests: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(endpoint) = &cli.endpoint {
        // Before any thread starts: every s3:// open, related file and
        // upload of this process reads the standard variable.
        std::env::set_var("AWS_ENDPOINT_URL", endpoint);
    }
    let result = match cli.command {
        Command::Ls { files, json } => ls(&files, json),
        Command::Info { files, json } => info(&files, json),
        Command::Convert {
            mut paths,
            max_shard_size,
            to,
            align,
            compress,
            progress,
            no_progress,
        } => {
            let out = paths.pop().expect("clap requires two paths");
            let show_progress = progress || (!no_progress && std::io::stderr().is_terminal());
            write_options(align.as_deref(), compress.as_deref()).and_then(|options| {
                convert::run(&convert::Request {
                    inputs: &paths,
                    out: &out,
                    options: &options,
                    max_shard_size: convert::shard_size(max_shard_size.as_deref())?,
                    to: to.as_deref(),
                    show_progress,
                })
            })
        }
        Command::Detect { file } => zt::detect(&file).map(|f| println!("{f}")),
        Command::Verify {
            file,
            deep,
            canonical,
        } => match verify(&file, deep, canonical) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => {
                eprintln!("zt: {e}");
                return ExitCode::from(1);
            }
        },
        Command::Id { file } => {
            zt::container::verify::content_digest(&file).map(|d| println!("{d}"))
        }
        Command::Diff { a, b } => match diff(&a, &b) {
            Ok(true) => Ok(()),
            Ok(false) => return ExitCode::from(1),
            Err(e) => Err(e),
        },
        Command::Clean { dests } => clean(&dests),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("zt: {e}");
            ExitCode::from(2)
        }
    }
}

/// One row per part: `(name, dtype, shape, bytes, offset or "-")`.
fn rows(source: &Source) -> Vec<[String; 5]> {
    let mut rows = Vec::new();
    for t in source.tensors() {
        for p in t.parts() {
            let name = if t.object().parts.len() == 1 {
                t.name().to_string()
            } else {
                format!("{}:{}", t.name(), p.name())
            };
            let offset = p.locate().map_or("-".to_string(), |l| l.offset.to_string());
            rows.push([
                name,
                p.dtype().to_string(),
                format!("{:?}", p.shape()),
                p.nbytes().to_string(),
                offset,
            ]);
        }
    }
    rows
}

fn ls(files: &[PathBuf], as_json: bool) -> zt::Result<()> {
    let source = zt::open_all(files)?;
    if as_json {
        let list: Vec<_> = source
            .tensors()
            .map(|t| {
                let parts: Vec<_> = t
                    .parts()
                    .map(|p| {
                        let loc = p.locate();
                        json!({
                            "name": p.name(), "dtype": p.dtype().name(), "shape": p.shape(),
                            "nbytes": p.nbytes(),
                            "file": loc.as_ref().map(|l| l.path.display().to_string()),
                            "offset": loc.as_ref().map(|l| l.offset),
                            "zero_copy": p.caps().map,
                        })
                    })
                    .collect();
                json!({"name": t.name(), "shape": t.shape(), "layout": t.layout(), "parts": parts})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list).expect("JSON"));
        return Ok(());
    }
    let header = ["NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET"].map(String::from);
    let rows = rows(&source);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                if i >= 3 {
                    format!("{cell:>w$}")
                } else {
                    format!("{cell:<w$}")
                }
            })
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

/// Parse `--align` and `--compress`.
fn write_options(align: Option<&str>, compress: Option<&str>) -> zt::Result<WriteOptions> {
    let bad = |reason: String| zt::Error::Write {
        ctx: zt::Context::default(),
        reason,
    };
    let align = align
        .map(|text| text.parse::<Align>().map_err(|e| bad(format!("--{e}"))))
        .transpose()?;
    let compression = match compress {
        None => None,
        Some("zstd") => Some(3),
        Some(spec) => match spec.strip_prefix("zstd:").and_then(|l| l.parse().ok()) {
            Some(level) => Some(level),
            None => {
                return Err(bad(format!(
                    "--compress {spec:?}: expected zstd or zstd:LEVEL"
                )))
            }
        },
    };
    Ok(WriteOptions {
        align,
        compression,
        storage_options: Vec::new(),
    })
}

fn clean(dests: &[PathBuf]) -> zt::Result<()> {
    for dest in dests {
        for removed in zt::publish::remove_stale(dest)? {
            println!("removed {}", removed.display());
        }
    }
    let config = zt::remote::config(&[])?;
    for removed in zt::remote::client::upload::remove_stale_spools(
        &zt::remote::client::config::spool_dir(&config),
    ) {
        println!("removed {}", removed.display());
    }
    for url in zt::remote::client::upload::abort_orphans(&config) {
        println!("aborted the unfinished upload of {url}");
    }
    Ok(())
}

fn value_text(v: &Value) -> String {
    match v {
        Value::Str(s) => s.clone(),
        other => other.to_json().to_string(),
    }
}

fn info(files: &[PathBuf], as_json: bool) -> zt::Result<()> {
    let mut out = Vec::new();
    for file in files {
        let source = zt::open(file)?;
        let zero_copy = source
            .tensors()
            .flat_map(|t| t.parts())
            .filter(|p| p.caps().map)
            .count();
        if as_json {
            let attrs: serde_json::Map<_, _> = source
                .attributes()
                .iter()
                .map(|(k, v)| (k.clone(), v.to_json()))
                .collect();
            out.push(json!({
                "file": file.display().to_string(), "format": source.format(),
                "tensors": source.len(), "bytes": source.total_bytes(),
                "zero_copy_parts": zero_copy, "attributes": attrs,
            }));
            continue;
        }
        println!("{}", file.display());
        println!("  format      {}", source.format());
        println!("  tensors     {}", source.len());
        println!("  bytes       {}", source.total_bytes());
        println!(
            "  zero-copy   {zero_copy} of {} parts",
            source
                .tensors()
                .map(|t| t.object().parts.len())
                .sum::<usize>()
        );
        if !source.attributes().is_empty() {
            println!("  attributes");
            for (k, v) in source.attributes() {
                let mut text = value_text(v);
                if text.len() > 120 {
                    let cut = text
                        .char_indices()
                        .map(|(i, _)| i)
                        .take_while(|&i| i <= 117)
                        .last();
                    text.truncate(cut.unwrap_or(0));
                    text.push_str("...");
                }
                println!("    {k} = {text}");
            }
        }
    }
    if as_json {
        println!("{}", serde_json::to_string_pretty(&out).expect("JSON"));
    }
    Ok(())
}

/// `zt verify`: prints what was checked; false when the canonical check
/// finds violations (integrity failures are errors).
fn verify(file: &std::path::Path, deep: bool, canonical: bool) -> zt::Result<bool> {
    let v = zt::verify(file, deep)?;
    println!(
        "{}: ok, {} parts verified, {} without a digest{}",
        file.display(),
        v.checked,
        v.undigested,
        if deep { ", shards hashed" } else { "" }
    );
    if canonical {
        let violations = zt::container::verify::canonical_violations(file)?;
        if violations.is_empty() {
            println!("{}: canonical", file.display());
        } else {
            for x in &violations {
                println!(
                    "{}: not canonical (rule {}): {}",
                    file.display(),
                    x.rule,
                    x.detail
                );
            }
            return Ok(false);
        }
    }
    Ok(true)
}

/// `zt diff`: true when the two files hold the same content.
fn diff(a: &std::path::Path, b: &std::path::Path) -> zt::Result<bool> {
    let (sa, sb) = (zt::open(a)?, zt::open(b)?);
    let mut same = true;
    let mut names: Vec<&str> = sa.names().chain(sb.names()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let (ta, tb) = match (sa.get(name), sb.get(name)) {
            (Some(x), Some(y)) => (x, y),
            (Some(_), None) => {
                println!("- {name} (only in {})", a.display());
                same = false;
                continue;
            }
            _ => {
                println!("+ {name} (only in {})", b.display());
                same = false;
                continue;
            }
        };
        if ta.layout() != tb.layout() || ta.shape() != tb.shape() {
            println!(
                "~ {name}: {} {:?} vs {} {:?}",
                ta.layout(),
                ta.shape(),
                tb.layout(),
                tb.shape()
            );
            same = false;
            continue;
        }
        let pa: Vec<_> = ta.parts().collect();
        let pb: Vec<_> = tb.parts().collect();
        if pa.len() != pb.len() {
            println!("~ {name}: {} parts vs {}", pa.len(), pb.len());
            same = false;
            continue;
        }
        for p in &pa {
            let Some(q) = tb.part(p.name()) else {
                println!("~ {name}: part {} only in {}", p.name(), a.display());
                same = false;
                continue;
            };
            if p.dtype() != q.dtype() || p.shape() != q.shape() {
                println!(
                    "~ {name}/{}: {} {:?} vs {} {:?}",
                    p.name(),
                    p.dtype(),
                    p.shape(),
                    q.dtype(),
                    q.shape()
                );
                same = false;
            } else if p.bytes()? != q.bytes()? {
                println!("~ {name}/{}: contents differ", p.name());
                same = false;
            }
        }
    }
    if same {
        println!("same content");
    }
    Ok(same)
}
