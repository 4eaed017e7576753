//! `zt convert`: files to a file, files to a sharded checkpoint
//! (`--max-shard-size`), model directories to model directories, anything
//! to a DCP checkpoint directory (`--to dcp`), and per-rank DTensor files
//! merged (`--ranks`).

use std::path::{Path, PathBuf};
use zt::Rule;

use zt::{Source, WriteOptions};

use crate::progress;

/// Conversions of less than this draw no progress line.
const PROGRESS_FROM: u64 = 64 << 20;

/// What `zt convert` was asked.
pub struct Request<'a> {
    /// Input files, or one model directory.
    pub inputs: &'a [PathBuf],
    /// Output file or directory.
    pub out: &'a Path,
    /// `--align`, `--compress`.
    pub options: &'a WriteOptions,
    /// `--max-shard-size`, parsed.
    pub max_shard_size: Option<u64>,
    /// `--to`: the format of an output its name does not tell: a format
    /// with no extension (a DCP or TensorDict memmap directory, TensorDict's
    /// consolidated file), or a model directory's shards.
    pub to: Option<&'a str>,
    /// `--select`, `--strip-prefix`, `--rename`, `--dtype`.
    pub transform: zt::Transform,
    /// `--ranks`: the inputs are per-rank DTensor files in rank order.
    pub ranks: bool,
    /// `--dequantize`: quantized safetensors schemes dequantized to the
    /// transform's dtype (`zt::formats::quant`), before it applies.
    pub dequantize: bool,
    /// `--layout mlx`: GGUF Q4_1 tensors as MLX's affine weights
    /// (`zt::formats::quant::mlx::repack::from_q4_1`).
    pub repack_mlx: bool,
    /// `--layout keras`: HDF5 in Keras's layout whatever OUT's extension
    /// (`NAME.weights.json` for the sharded form); the options carry it
    /// ([`keras_options`]).
    pub keras: bool,
    /// Draw the progress line.
    pub show_progress: bool,
}

/// A directory output: the path ends with `/`, is a directory, or has no
/// extension while the input is a model directory.
fn is_dir_output(out: &Path, input_is_dir: bool) -> bool {
    out.to_string_lossy().ends_with('/')
        || out.is_dir()
        || (input_is_dir && out.extension().is_none())
}

/// A format only `--to` names: its writer has no extension and no shard
/// layout. Its output is a directory of its own (DCP, TensorDict's memmap
/// directory: the writer names a directory index) or one file under any
/// name (TensorDict's consolidated file).
fn is_named_only_by_to(format: &str) -> bool {
    zt::registry()
        .writer_named(format)
        .is_some_and(|w| w.extensions().is_empty() && w.shard_layout().is_none())
}

/// Whether `format`'s output is a directory (its writer names the file
/// indexing the others).
fn writes_directory(format: &str) -> bool {
    zt::registry()
        .writer_named(format)
        .is_some_and(|w| w.directory_index().is_some())
}

pub fn run(req: &Request<'_>) -> zt::Result<()> {
    let input_dir = match req.inputs {
        [one] if one.is_dir() && !req.ranks => Some(one.as_path()),
        _ => None,
    };
    let source: Source = match input_dir {
        Some(dir) => zt::open(zt::model_dir::checkpoint_in(dir)?)?,
        None if req.ranks => zt::open_ranks(req.inputs)?,
        None => zt::open_all(req.inputs)?,
    };
    let source = if req.dequantize {
        let options = zt::formats::quant::Options {
            dtype: req.transform.dtype,
            config: None,
        };
        zt::formats::quant::dequantize(&source, &options)?
    } else if req.repack_mlx {
        zt::formats::quant::mlx::repack::from_q4_1(&source)?
    } else {
        source
    };
    let source = if req.transform.is_identity() {
        source
    } else {
        source.transform(&req.transform)?
    };
    if req.keras && (req.to.is_some() || req.ranks || req.inputs.iter().any(|p| p.is_dir())) {
        return Err(usage(
            "--layout keras writes one Keras weights file (or its shards) from files",
        ));
    }
    let own_dir = req.to.is_some_and(is_named_only_by_to);
    let dir_out = own_dir || is_dir_output(req.out, input_dir.is_some());
    if req.to.is_some() && !dir_out {
        return Err(usage(
            "--to names the format of a directory output; a file's extension names its format",
        ));
    }
    if req.options.files.is_some() && !own_dir {
        return Err(usage("--dcp-files N goes with --to dcp"));
    }
    if let Some(format) = req.to.filter(|_| own_dir) {
        if req.max_shard_size.is_some() {
            return Err(usage(&format!(
                "--max-shard-size shards a checkpoint; --to {format} writes no shards (a dcp directory spreads its tensors over --dcp-files N files)"
            )));
        }
        // A one-file format at a path naming a directory: said here, not
        // as the OS's "Not a directory" from the write.
        let names_dir = req.out.to_string_lossy().ends_with('/') || req.out.is_dir();
        if names_dir && !writes_directory(format) {
            return Err(usage(&format!(
                "--to {format} writes one file; {} names a directory",
                req.out.display()
            )));
        }
    }
    let expected = source.total_bytes();
    let started = std::time::Instant::now();
    let bar = (req.show_progress && expected >= PROGRESS_FROM)
        .then(|| progress::Progress::start(req.out.to_path_buf(), expected));
    let result = if req.keras {
        // The HDF5 writer by name: a sharded output is named `.json`.
        zt::registry()
            .convert_to(&source, req.out, "h5", req.options)
            .map(|bytes| zt::shard::Written {
                files: vec![req.out.to_path_buf()],
                bytes,
            })
    } else if own_dir {
        let format = req.to.unwrap_or_default();
        zt::registry()
            .convert_to(&source, req.out, format, req.options)
            .map(|bytes| zt::shard::Written {
                files: vec![req.out.to_path_buf()],
                bytes,
            })
    } else if dir_out {
        let extra = match input_dir {
            Some(dir) => zt::model_dir::companions(dir)?,
            None => Vec::new(),
        };
        let staged = if req.dequantize {
            StagedConfig::for_dequantized(&extra)?
        } else {
            None
        };
        let extra = match &staged {
            Some(s) => s.replace_in(extra),
            None => extra,
        };
        let format = req.to.unwrap_or("safetensors");
        let max = req
            .max_shard_size
            .unwrap_or(zt::shard::DEFAULT_MAX_SHARD_SIZE);
        zt::convert_dir(&source, req.out, format, max, &extra, req.options)
    } else if let Some(max) = req.max_shard_size {
        zt::convert_sharded(&source, req.out, max, req.options)
    } else {
        zt::convert(&source, req.out, req.options).map(|bytes| zt::shard::Written {
            files: vec![req.out.to_path_buf()],
            bytes,
        })
    };
    if let Some(bar) = bar {
        let done = result.as_ref().ok().map(|w| w.bytes);
        bar.finish(done, expected, started.elapsed());
    }
    let written = result?;
    let format = if req.keras {
        "h5, keras"
    } else if dir_out {
        req.to.unwrap_or("safetensors")
    } else {
        zt::writer_for(req.out)?.name()
    };
    let files = match written.files.len() {
        1 => String::new(),
        n => format!(", {n} files"),
    };
    crate::out::out!(
        "{}: {} tensors, {} bytes ({format}{files})",
        req.out.display(),
        source.len(),
        written.bytes
    );
    Ok(())
}

/// `--layout keras`'s write options: the HDF5 writer's, Keras's shard
/// size among them (Keras shards itself; no other sharding applies).
/// `--align`/`--compress` (`.zt`'s) are refused, as Python refuses them.
pub fn keras_options(
    options: WriteOptions,
    zt_options: bool,
    max_shard_size: Option<u64>,
) -> zt::Result<WriteOptions> {
    use zt::formats::h5::write::{H5Options, Layout};
    if zt_options {
        return Err(usage(
            "--layout keras writes HDF5; --align and --compress are .zt's",
        ));
    }
    Ok(options.with_format(H5Options {
        layout: Some(Layout::Keras),
        max_shard_size,
    }))
}

/// A dequantized model directory's `config.json`: the source's without its
/// `quantization_config` (`zt::formats::quant::config::without_quantization`),
/// staged in the temporary directory for the directory write to copy, and
/// removed when dropped.
struct StagedConfig {
    path: PathBuf,
}

impl StagedConfig {
    /// The staged configuration, if `extra` has a `config.json` that says
    /// how its weights are quantized (else it is copied unchanged).
    fn for_dequantized(extra: &[(String, PathBuf)]) -> zt::Result<Option<Self>> {
        let name = zt::formats::quant::config::CONFIG_FILE;
        let Some((_, src)) = extra.iter().find(|(n, _)| n == name) else {
            return Ok(None);
        };
        let ctx = zt::Context::file(src);
        let text = std::fs::read(src).map_err(|e| zt::Error::io(src, e))?;
        let Some(text) = zt::formats::quant::config::without_quantization(&ctx, &text)? else {
            return Ok(None);
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("zt-config-{}-{nanos}.json", std::process::id()));
        std::fs::write(&path, text).map_err(|e| zt::Error::io(&path, e))?;
        Ok(Some(StagedConfig { path }))
    }

    /// `extra` with its `config.json` read from the staged file.
    fn replace_in(&self, extra: Vec<(String, PathBuf)>) -> Vec<(String, PathBuf)> {
        let name = zt::formats::quant::config::CONFIG_FILE;
        extra
            .into_iter()
            .map(|(n, p)| {
                let p = if n == name { self.path.clone() } else { p };
                (n, p)
            })
            .collect()
    }
}

impl Drop for StagedConfig {
    fn drop(&mut self) {
        // A leftover file in the temporary directory is no failure.
        let _ = std::fs::remove_file(&self.path);
    }
}

fn usage(reason: &str) -> zt::Error {
    zt::Error::Write {
        rule: Rule::WRITE_USAGE,
        ctx: zt::Context::default(),
        reason: reason.into(),
    }
}

/// `--select`, `--strip-prefix`, `--rename OLD=NEW` and `--dtype` as one
/// [`zt::Transform`].
pub fn transform(
    select: Vec<String>,
    strip_prefix: Option<String>,
    rename: &[String],
    dtype: Option<&str>,
) -> zt::Result<zt::Transform> {
    let map = rename
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((old, new)) if !old.is_empty() && !new.is_empty() => {
                Ok((old.to_string(), new.to_string()))
            }
            _ => Err(usage(&format!("--rename {pair:?}: expected OLD=NEW"))),
        })
        .collect::<zt::Result<Vec<_>>>()?;
    Ok(zt::Transform {
        select,
        rename: zt::transform::Rename { strip_prefix, map },
        dtype: dtype.map(zt::transform::parse_cast_dtype).transpose()?,
    })
}

/// Parse `--max-shard-size`.
pub fn shard_size(text: Option<&str>) -> zt::Result<Option<u64>> {
    text.map(|t| zt::shard::parse_size(t).map_err(|e| usage(&format!("--max-shard-size: {e}"))))
        .transpose()
}
