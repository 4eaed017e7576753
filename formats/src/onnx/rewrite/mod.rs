//! Moving an ONNX model's tensors to external data and back, rewriting the
//! protobuf on the wire (`zt convert model.onnx out.onnx --external-data`,
//! `--inline`; Python `zt.convert(..., external_data=True|False)`).
//!
//! A model past protobuf's 2 GB limit cannot be built in memory by
//! protobuf at all, and `onnx.save_model(save_as_external_data=True)` holds
//! the whole model (and a copy of each tensor) while it writes. Here the
//! model is walked once on the wire (`plan.rs`: which messages change and
//! their new lengths), then written front to back (`emit.rs`): unchanged
//! runs and tensor bytes are copied file to file by the kernel, so memory
//! is a fixed buffer plus one small node per tensor moved.
//!
//! What moves, as onnx's `convert_model_to_external_data(...,
//! convert_attribute=True)` chooses: every dense tensor with `raw_data` (or
//! already external) that passes `threshold` as onnx compares it
//! ([`moves`]: the bytes object's size, 33 more than the data) among graph
//! initializers and node attribute tensors (a `Constant`'s value among
//! them), in every graph, subgraph (`If`/`Loop`/`Scan` bodies), function
//! and training graph. Tensors in typed fields (`float_data`, ...) and
//! string tensors stay inline, as onnx leaves them; sparse tensors are
//! never moved out (onnx loads no sparse tensor's external data), and
//! their external bytes are written inline. A tensor that was external
//! and stays in the model is written inline, so the output refers to no
//! file but its own data file.
//!
//! The data file lies in the output's directory (`location` plain
//! relative components that stay there, else [`rules::LOCATION`] and
//! nothing written); each tensor at an offset aligned to 64 bytes, 4096
//! from 1 MiB, so zt maps it, except in a `.safetensors` data file
//! (`st.rs`: onnx-safetensors' layout, initializers only, packed). Both files are built as partials and
//! renamed into place, the data file first. An output message past
//! protobuf's 2 GB limit (an `--inline` of a large model) is refused
//! before anything is written ([`rules::PROTOBUF_LIMIT`]).

mod emit;
mod plan;
mod st;

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::external::Externals;
use super::rules;
use super::wire::Reader;
use plan::Planner;
use zt_core::error::{Context, Error, Result};
use zt_core::format::OpenInput;
use zt_core::limits::Limits;
use zt_core::location::{self, parent_dir};
use zt_core::publish::Partial;
use zt_core::store::Store;

pub use plan::Counts;

/// The largest message protobuf parses (`INT_MAX` bytes).
pub const PROTOBUF_MAX: u64 = i32::MAX as u64;

/// onnx's default size threshold (`convert_model_to_external_data`).
pub const DEFAULT_THRESHOLD: u64 = 1024;

/// What CPython's `sys.getsizeof` adds to a `bytes` object's length (its
/// object header and trailing NUL, 64-bit builds): onnx compares
/// `sys.getsizeof(tensor.raw_data) >= size_threshold`, not the data's
/// length.
pub const PY_BYTES_OVERHEAD: u64 = 33;

/// Whether a tensor of `len` data bytes moves out at `threshold`, exactly
/// as onnx's `convert_model_to_external_data` decides it (so 991 bytes
/// move at the default 1024; 990 stay). Matched rather than "at least
/// `threshold` bytes" so a model zt externalizes has the same tensors
/// external as the one onnx's own conversion writes, and a threshold
/// means the same number to both.
pub fn moves(len: u64, threshold: u64) -> bool {
    len.saturating_add(PY_BYTES_OVERHEAD) >= threshold
}

/// Where the output's tensors go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Tensors that pass `threshold` ([`moves`]) into the data file
    /// `location`, relative to the output's directory.
    External { location: String, threshold: u64 },
    /// Every tensor's bytes inside the model.
    Inline,
}

impl Layout {
    /// External data at `location` (default: the output's file name +
    /// `.data`, as `torch.onnx` names it) for tensors from `threshold`
    /// bytes (default 1024, onnx's).
    pub fn external(out: &Path, location: Option<&str>, threshold: Option<u64>) -> Layout {
        let location = match location {
            Some(l) => l.to_string(),
            None => format!(
                "{}.data",
                out.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "model.onnx".into())
            ),
        };
        Layout::External {
            location,
            threshold: threshold.unwrap_or(DEFAULT_THRESHOLD),
        }
    }
}

/// What a rewrite wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The model file's size.
    pub model_bytes: u64,
    /// The data file and its size, when tensors moved there.
    pub data: Option<(PathBuf, u64)>,
    pub counts: Counts,
}

/// Refuse a model or output in object storage ([`rules::REMOTE`]): the
/// rewrite copies runs of the model file to file (`copy_file_range`) and
/// resolves its external data as local siblings, so both ends are local
/// files. Called before anything is fetched or detected.
pub fn refuse_remote(model: &Path, out: &Path) -> Result<()> {
    if location::is_url(model) {
        // The model is read, not written: "unsupported", not "cannot write".
        return Err(Error::unsupported(
            Context::file(model),
            rules::REMOTE,
            "an ONNX model in object storage is not rewritten there: external data is \
             moved between local files; download the model (and its data files) first",
        ));
    }
    if location::is_url(out) {
        return Err(Error::write(
            Context::file(out),
            rules::REMOTE,
            "an ONNX rewrite writes a local model and data file; write it locally, \
             then upload both",
        ));
    }
    Ok(())
}

/// Rewrite the ONNX model `model` to `out` with its tensors laid out as
/// `layout` says (see the module's docs), durably: each file fsynced
/// before its rename and the directory after.
pub fn rewrite(model: &Path, out: &Path, layout: &Layout) -> Result<Rewritten> {
    rewrite_with(model, out, layout, true)
}

/// [`rewrite`], fsyncing only when `durable` (`zt.convert(durable=)`);
/// without it each file is still built beside its name and renamed into
/// place, the data file before the model that names it.
pub fn rewrite_with(model: &Path, out: &Path, layout: &Layout, durable: bool) -> Result<Rewritten> {
    refuse_remote(model, out)?;
    let data_path = match layout {
        Layout::External { location, .. } => Some(data_path(out, location)?),
        Layout::Inline => None,
    };
    let store = Arc::new(Store::open(model)?);
    let limits = Limits::default();
    let input = OpenInput::new(&store, &limits);
    let safetensors =
        matches!(layout, Layout::External { location, .. } if st::is_safetensors(location));
    let plan = |data_start: u64| {
        store.begin_walk();
        let mut planner = Planner {
            model: &store,
            limits: &limits,
            ext: Externals::new(&input),
            layout,
            moved: Vec::new(),
            data_len: data_start,
            counts: Counts::default(),
            safetensors,
            entries: Vec::new(),
        };
        let planned = store
            .read(0, store.len())
            .and_then(|bytes| planner.model(Reader::new(&bytes, 0)));
        input.end_walks();
        planned
            .map(|body| (body, planner))
            .map_err(|e| e.in_file(model))
    };
    let (mut body, mut planner) = plan(0)?;
    // A safetensors data file starts with a header naming every tensor
    // moved, and each tensor's offset counts it: a second walk places the
    // same tensors (packed, so their relative places are the same) after
    // it.
    let mut data_head = Vec::new();
    if safetensors && !planner.moved.is_empty() {
        let ctx = Context::file(data_path.as_deref().unwrap_or(out));
        data_head = st::header(&ctx, &planner.entries)?;
        (body, planner) = plan(data_head.len() as u64)?;
    }
    let model_len = body.as_ref().map_or(store.len(), |b| b.len);
    if model_len > PROTOBUF_MAX {
        return Err(Error::write(
            Context::file(out),
            rules::PROTOBUF_LIMIT,
            format!(
                "the model would be {model_len} bytes, past protobuf's 2 GB limit \
                 ({PROTOBUF_MAX} bytes): keep its tensors in external data"
            ),
        ));
    }
    let (moved, counts) = (planner.moved, planner.counts);
    let mut written_data = None;
    let data_partial = match (&data_path, moved.is_empty()) {
        (Some(path), false) => {
            let partial = Partial::create(path)?;
            let mut sink = emit::Sink::new(partial.file(), path);
            sink.lit(&data_head)?;
            sink.data_file(&moved)?;
            written_data = Some((path.clone(), sink.finish()?));
            Some(partial)
        }
        _ => None,
    };
    let partial = Partial::create(out)?;
    let mut sink = emit::Sink::new(partial.file(), out);
    match &body {
        Some(body) => sink.body(&store, body)?,
        None => sink.copy(&store, 0, store.len())?,
    }
    let model_bytes = sink.finish()?;
    if let Some(data) = data_partial {
        data.commit(durable)?;
    }
    partial.commit(durable)?;
    Ok(Rewritten {
        model_bytes,
        data: written_data,
        counts,
    })
}

/// The data file `location` names beside `out`, refused unless it is
/// plain relative components that stay in `out`'s directory (resolved
/// through symlinks) and is not `out` itself.
pub fn data_path(out: &Path, location: &str) -> Result<PathBuf> {
    let refuse = |why: &str| {
        Error::write(
            Context::file(out),
            rules::LOCATION,
            format!("external data location {location:?} {why}"),
        )
    };
    let rel = Path::new(location);
    if location.is_empty() || location.contains(['\0', '\\']) {
        return Err(refuse("is empty or not a relative path of plain names"));
    }
    if rel.is_absolute() || location::is_url(rel) {
        return Err(refuse("is absolute; it must be relative to the model"));
    }
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(refuse("leaves the model's directory"));
    }
    let dir = parent_dir(out);
    let path = dir.join(rel);
    let Some(name) = path.file_name() else {
        return Err(refuse("names no file"));
    };
    let canonical_dir = dir.canonicalize().map_err(|e| Error::io(&dir, e))?;
    let data_dir = parent_dir(&path);
    let resolved = data_dir
        .canonicalize()
        .map_err(|_| refuse("is in a directory that does not exist"))?;
    if !resolved.starts_with(&canonical_dir) {
        return Err(refuse("leaves the model's directory through a symlink"));
    }
    let resolved = resolved.join(name);
    if out.file_name() == Some(name) && resolved.parent() == Some(canonical_dir.as_path()) {
        return Err(refuse("is the model file itself"));
    }
    Ok(path)
}
