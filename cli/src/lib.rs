//! The `zt` command line tool, as a library: [`run`] is the whole program.
//!
//! Two front ends call it, so there is one implementation of the CLI: the
//! cargo binary (`src/bin/zt.rs`, for Rust users) and the Python package's
//! `zt` command and `python -m zt` (`zt._zt.cli_main`, which installing the
//! wheel provides). `--json` output is described in `docs/CLI.md`.

mod convert;
mod diff;
mod endpoint;
mod json_out;
mod onnx_data;
mod out;
mod progress;

use out::out;
use zt::Rule;

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};
use serde_json::json;
use zt::{Align, Source, Value, WriteOptions, ZtOptions};

/// `zt --version`: the crate version and the git commit it was built from
/// (`build.rs`; "unknown" outside a git checkout, e.g. from an sdist).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ZT_GIT_COMMIT"),
    ")"
);

/// The git commit zt was built from (12 hex digits), or "unknown".
pub const COMMIT: &str = env!("ZT_GIT_COMMIT");

#[derive(Parser)]
#[command(name = "zt", version = VERSION, about = "Inspect tensor files of every format")]
struct Cli {
    /// Object-storage endpoint for s3://, gs:// and az:// paths (sets
    /// AWS_ENDPOINT_URL, GOOGLE_BASE_URL or STORAGE_EMULATOR_HOST, and
    /// AZURE_STORAGE_ENDPOINT or the connection string's BlobEndpoint; an
    /// http:// endpoint allows plain HTTP). Credentials come from each
    /// service's standard environment (and AWS's files).
    #[arg(long, global = true, value_name = "URL")]
    endpoint: Option<String>,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: Convert's many options cost nothing boxed or not.
#[allow(clippy::large_enum_variant)]
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
    /// its other files) to a model directory; or anything to a DCP
    /// checkpoint directory (--to dcp). A DCP directory as input is read
    /// through its .metadata; per-rank DTensor files merge with --ranks.
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
        /// Format of an output its name does not tell: for a directory
        /// output safetensors (the default), pt or zt (a sharded
        /// checkpoint); dcp (a PyTorch distributed checkpoint directory:
        /// `.metadata` and `__0_N.distcp` files), tensordict (a TensorDict
        /// memmap directory) or tensordict-consolidated (one TensorDict
        /// consolidated file, under any name).
        #[arg(long, value_name = "FORMAT")]
        to: Option<String>,
        /// With --to dcp: spread the tensors over N .distcp files by bytes
        /// (default: one per GiB of tensor data).
        #[arg(long, value_name = "N")]
        dcp_files: Option<u64>,
        /// The inputs are per-rank DTensor files (FSDP2, tensor parallel:
        /// `model_world_size_W_rank_R.pt`) in rank order: merge them by
        /// their placements into global tensors.
        #[arg(long)]
        ranks: bool,
        /// Blob placement for .zt: canonical, auto, or a power of two >= 4096.
        #[arg(long)]
        align: Option<String>,
        /// Compression for .zt: zstd or zstd:LEVEL.
        #[arg(long)]
        compress: Option<String>,
        /// Convert only the tensors whose names match this glob (`*`, `?`,
        /// `[abc]`); repeat for a union. A pattern matching nothing is an error.
        #[arg(long, value_name = "GLOB")]
        select: Vec<String>,
        /// Strip this prefix from the names that start with it.
        #[arg(long, value_name = "PREFIX")]
        strip_prefix: Option<String>,
        /// Write the tensor named OLD as NEW; repeatable (before --strip-prefix).
        #[arg(long, value_name = "OLD=NEW")]
        rename: Vec<String>,
        /// Cast floating tensors (f64, f32, f16, bf16) to bf16, f16, f32 or
        /// f64, rounding as torch does; other tensors are unchanged.
        #[arg(long, value_name = "DTYPE")]
        dtype: Option<String>,
        /// Dequantize a quantized checkpoint (DeepSeek/Kimi block-scaled,
        /// per-tensor or per-row FP8, gpt-oss MXFP4, compressed-tensors
        /// NVFP4, MLX affine/mxfp4/mxfp8/nvfp4, GGUF block types): each
        /// weight computed in f32 from its scales, rounded once to --dtype
        /// (default f32), the scale tensors (and activation scales)
        /// consumed; the block size (MLX: bits and group size) from the
        /// config.json beside the input; a model directory's copied
        /// config.json loses its quantization_config.
        #[arg(long)]
        dequantize: bool,
        /// `mlx`: write a GGUF's Q4_1 tensors as MLX's affine 4-bit weights
        /// (X.weight u32, X.scales and X.biases f16), moved without going
        /// through floats. (MLX to GGUF needs no flag: an MLX config.json
        /// beside the input makes its 4-bit group-32 weights Q4_1.)
        /// `keras`: HDF5 in Keras 3's weights layout (names `.../vars/N`),
        /// with --max-shard-size Keras's sharded form (OUT
        /// `NAME.weights.json` + `NAME_0000N.weights.h5`).
        #[arg(long, value_name = "LAYOUT", value_parser = ["mlx", "keras"], conflicts_with = "dequantize")]
        layout: Option<String>,
        /// ONNX to ONNX: move the model's tensors (initializers, Constant
        /// values) of at least --threshold bytes into an external data file
        /// beside OUT, rewriting the protobuf without loading it.
        #[arg(long, conflicts_with = "inline")]
        external_data: bool,
        /// With --external-data: the data file, relative to OUT's directory
        /// (default: OUT's file name + .data); one ending .safetensors is
        /// written as onnx-safetensors writes it (initializers only).
        #[arg(long, value_name = "FILE", requires = "external_data")]
        location: Option<String>,
        /// With --external-data: the smallest tensor moved out (bytes, or
        /// with KB/MB/KiB/...; default 1024), compared as onnx compares it:
        /// a tensor's length + 33 (Python's bytes header) against it.
        #[arg(long, value_name = "SIZE", requires = "external_data")]
        threshold: Option<String>,
        /// ONNX to ONNX: write every tensor's external data back into the
        /// model (refused past protobuf's 2 GB limit).
        #[arg(long)]
        inline: bool,
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
        /// Print JSON.
        #[arg(long)]
        json: bool,
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
        /// Print JSON (also when the check fails).
        #[arg(long)]
        json: bool,
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
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove what killed writers left behind: partial files beside each
    /// DEST whose writer is gone, and (always) dead processes' upload spools,
    /// the multipart uploads they never completed and the objects failed
    /// uploads could not delete (journaled).
    Clean {
        /// Destinations whose stale partial files to remove.
        dests: Vec<PathBuf>,
    },
    /// Print a shell completion script: `source <(zt completions bash)`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Run the `zt` command line on `args` (the first is the program name, as
/// in `std::env::args_os`) and return the process exit status: 0 success,
/// 1 a failed check (`verify`, `diff`), 2 an error or a usage error.
/// Everything is printed to this process's stdout and stderr, which are
/// flushed before returning.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let status = match Cli::try_parse_from(args) {
        Ok(cli) => dispatch(cli),
        Err(e) => {
            // Help and version go to stdout with status 0, usage errors to
            // stderr with status 2: what `Cli::parse` does, minus the exit.
            let _ = e.print();
            u8::try_from(e.exit_code()).unwrap_or(2)
        }
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    status
}

fn dispatch(cli: Cli) -> u8 {
    if let Some(endpoint) = &cli.endpoint {
        // Before any thread starts: every open, related file and upload
        // of this process reads the standard variables.
        endpoint::apply(endpoint);
    }
    let result = match cli.command {
        Command::Ls { files, json } => ls(&files, json),
        Command::Info { files, json } => info(&files, json),
        Command::Convert {
            mut paths,
            max_shard_size,
            to,
            dcp_files,
            ranks,
            align,
            compress,
            select,
            strip_prefix,
            rename,
            dtype,
            dequantize,
            layout,
            external_data,
            location,
            threshold,
            inline,
            progress,
            no_progress,
        } => {
            let out = paths.pop().expect("clap requires two paths");
            if external_data || inline {
                let others = [
                    ("--max-shard-size", max_shard_size.is_some()),
                    ("--to", to.is_some()),
                    ("--dcp-files", dcp_files.is_some()),
                    ("--ranks", ranks),
                    ("--align", align.is_some()),
                    ("--compress", compress.is_some()),
                    ("--select", !select.is_empty()),
                    ("--strip-prefix", strip_prefix.is_some()),
                    ("--rename", !rename.is_empty()),
                    ("--dtype", dtype.is_some()),
                    ("--dequantize", dequantize),
                    ("--layout", layout.is_some()),
                ];
                let request = onnx_data::Request {
                    inline,
                    location: location.as_deref(),
                    threshold: threshold.as_deref(),
                    others: others.iter().filter(|o| o.1).map(|o| o.0).collect(),
                };
                onnx_data::run(&paths, &out, &request)
            } else {
                let show_progress = progress || (!no_progress && std::io::stderr().is_terminal());
                let keras = layout.as_deref() == Some("keras");
                write_options(align.as_deref(), compress.as_deref()).and_then(|options| {
                    let options = WriteOptions {
                        files: dcp_files,
                        ..options
                    };
                    let mut max_shard_size = convert::shard_size(max_shard_size.as_deref())?;
                    let options = if keras {
                        let zt_options = align.is_some() || compress.is_some();
                        convert::keras_options(options, zt_options, max_shard_size.take())?
                    } else {
                        options
                    };
                    convert::run(&convert::Request {
                        inputs: &paths,
                        out: &out,
                        options: &options,
                        max_shard_size,
                        to: to.as_deref(),
                        transform: convert::transform(
                            select,
                            strip_prefix,
                            &rename,
                            dtype.as_deref(),
                        )?,
                        ranks,
                        dequantize,
                        repack_mlx: layout.as_deref() == Some("mlx"),
                        keras,
                        show_progress,
                    })
                })
            }
        }
        Command::Detect { file, json } => zt::detect(&file).and_then(|f| {
            if json {
                json_out::print(&json!({"file": file.display().to_string(), "format": f}))
            } else {
                out::line(format_args!("{f}"))
            }
        }),
        Command::Verify {
            file,
            deep,
            canonical,
            json,
        } => {
            let outcome = verify(&file, deep, canonical, json);
            return match outcome {
                Ok(true) => 0,
                Ok(false) => 1,
                Err(e) if out::closed_pipe(&e) => 0,
                Err(e) => {
                    if json {
                        // The failure is reported on stderr whatever
                        // happens to the JSON document.
                        let _ = json_out::print(&json_out::verify_failed(&file, deep, &e));
                    }
                    report(&e);
                    1
                }
            };
        }
        Command::Id { file } => zt::container::verify::content_digest(&file)
            .and_then(|d| out::line(format_args!("{d}"))),
        Command::Diff { a, b, json } => match diff(&a, &b, json) {
            Ok(true) => Ok(()),
            Ok(false) => return 1,
            Err(e) => Err(e),
        },
        Command::Clean { dests } => clean(&dests),
        Command::Completions { shell } => {
            // Into a buffer: clap_complete panics on a failed write (a
            // closed pipe); this reports it instead.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "zt", &mut script);
            out::bytes(&script)
        }
    };
    match result {
        Ok(()) => 0,
        // stdout's reader went away (`zt ls BIG | head -1`): a quiet end.
        Err(e) if out::closed_pipe(&e) => 0,
        Err(e) => {
            report(&e);
            2
        }
    }
}

/// An error on stderr: `zt: error [RULE]: MESSAGE`, RULE the check that
/// failed as Python's `FormatError.rule` names it (`onnx.Remote`), so a
/// script can match on it rather than on the message; `zt: error:
/// MESSAGE` for a failure that cites none (a missing file, an I/O error).
fn report(e: &zt::Error) {
    match e.rule() {
        Some(rule) => eprintln!("zt: error [{}]: {e}", rule.name()),
        None => eprintln!("zt: error: {e}"),
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
        out!("{}", serde_json::to_string_pretty(&list).expect("JSON"));
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
        out!("{}", line.join("  ").trim_end());
    }
    Ok(())
}

/// Parse `--align` and `--compress`.
fn write_options(align: Option<&str>, compress: Option<&str>) -> zt::Result<WriteOptions> {
    let bad = |reason: String| zt::Error::Write {
        rule: Rule::WRITE_OPTIONS,
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
    // The `.zt` plugin's options, for any destination: a writer whose caps
    // do not list one refuses it (`check_request`).
    Ok(WriteOptions::default().with_format(ZtOptions { align, compression }))
}

fn clean(dests: &[PathBuf]) -> zt::Result<()> {
    for dest in dests {
        for removed in zt::publish::remove_stale(dest)? {
            out!("removed {}", removed.display());
        }
    }
    let config = zt::remote::config(&[])?;
    for removed in zt::remote::client::upload::remove_stale_spools(
        &zt::remote::client::config::spool_dir(&config),
    ) {
        out!("removed {}", removed.display());
    }
    for url in zt::remote::client::upload::abort_orphans(&config) {
        out!("aborted the unfinished upload of {url}");
    }
    // What failed multi-object writes could not delete (journaled with
    // the versions they put): deleted, unless a whole write is at their
    // destination now, whose files they might be.
    use zt::remote::client::leftovers::{clear_all, Outcome};
    for (url, outcome) in clear_all(&config) {
        match outcome {
            Outcome::Deleted => out!("deleted {url}, left by a failed upload"),
            Outcome::Kept => out!(
                "kept {url}, left by a failed upload: still journaled (a whole write is \
                 at its destination, or the delete failed)"
            ),
            Outcome::Gone | Outcome::Replaced => {}
        }
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
        out!("{}", file.display());
        out!("  format      {}", source.format());
        out!("  tensors     {}", source.len());
        out!("  bytes       {}", source.total_bytes());
        out!(
            "  zero-copy   {zero_copy} of {} parts",
            source
                .tensors()
                .map(|t| t.object().parts.len())
                .sum::<usize>()
        );
        if !source.attributes().is_empty() {
            out!("  attributes");
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
                out!("    {k} = {text}");
            }
        }
    }
    if as_json {
        out!("{}", serde_json::to_string_pretty(&out).expect("JSON"));
    }
    Ok(())
}

/// `zt verify`: prints what was checked; false when the canonical check
/// finds violations (integrity failures are errors).
fn verify(file: &std::path::Path, deep: bool, canonical: bool, as_json: bool) -> zt::Result<bool> {
    let v = zt::verify(file, deep)?;
    if as_json {
        let violations = canonical
            .then(|| zt::container::verify::canonical_violations(file))
            .transpose()?;
        json_out::print(&json_out::verified(file, deep, &v, violations.as_deref()))?;
        return Ok(violations.is_none_or(|x| x.is_empty()));
    }
    out!(
        "{}: ok, {} parts verified, {} without a digest{}",
        file.display(),
        v.checked,
        v.undigested,
        if deep { ", shards hashed" } else { "" }
    );
    if canonical {
        let violations = zt::container::verify::canonical_violations(file)?;
        if violations.is_empty() {
            out!("{}: canonical", file.display());
        } else {
            for x in &violations {
                out!(
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
fn diff(a: &std::path::Path, b: &std::path::Path, as_json: bool) -> zt::Result<bool> {
    let differences = diff::differences(&zt::open(a)?, &zt::open(b)?)?;
    if as_json {
        json_out::print(&diff::to_json(a, b, &differences))?;
    } else {
        for d in &differences {
            out!("{}", d.text(a, b));
        }
        if differences.is_empty() {
            out!("same content");
        }
    }
    Ok(differences.is_empty())
}
