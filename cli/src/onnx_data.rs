//! `zt convert model.onnx out.onnx --external-data [--location FILE]
//! [--threshold SIZE]` and `--inline`: an ONNX model's tensors moved to
//! an external data file or back into the model, the protobuf rewritten on
//! the wire (`zt::formats::onnx::rewrite`).

use std::path::{Path, PathBuf};
use zt::formats::onnx::rewrite::{self, Layout};
use zt::Rule;

/// What was asked besides the paths.
pub struct Request<'a> {
    /// `--inline` (else `--external-data`).
    pub inline: bool,
    /// `--location`.
    pub location: Option<&'a str>,
    /// `--threshold`, as typed.
    pub threshold: Option<&'a str>,
    /// Options of other conversions given as well (their flag names).
    pub others: Vec<&'static str>,
}

fn usage(reason: String) -> zt::Error {
    zt::Error::Write {
        rule: Rule::WRITE_USAGE,
        ctx: zt::Context::default(),
        reason,
    }
}

pub fn run(inputs: &[PathBuf], out: &Path, req: &Request<'_>) -> zt::Result<()> {
    let flag = if req.inline {
        "--inline"
    } else {
        "--external-data"
    };
    if let Some(other) = req.others.first() {
        return Err(usage(format!(
            "{flag} rewrites an ONNX model as it is; it takes no {other}"
        )));
    }
    if req.inline && (req.location.is_some() || req.threshold.is_some()) {
        return Err(usage(
            "--location and --threshold go with --external-data, not --inline".into(),
        ));
    }
    let [model] = inputs else {
        return Err(usage(format!("{flag} takes one ONNX model")));
    };
    // Before detection, which would fetch a remote model's head.
    rewrite::refuse_remote(model, out)?;
    let format = zt::detect(model)?;
    if format != "onnx" {
        return Err(usage(format!(
            "{flag} rewrites ONNX models; {} is {format}",
            model.display()
        )));
    }
    let layout = if req.inline {
        Layout::Inline
    } else {
        let threshold = req
            .threshold
            .map(|t| match t.parse::<u64>() {
                Ok(bytes) => Ok(bytes),
                Err(_) => zt::shard::parse_size(t).map_err(|e| usage(format!("--threshold: {e}"))),
            })
            .transpose()?;
        Layout::external(out, req.location, threshold)
    };
    let done = rewrite::rewrite(model, out, &layout)?;
    let data = match &done.data {
        Some((path, bytes)) => format!(
            ", {} tensors in {} ({bytes} bytes)",
            done.counts.externalized,
            path.display()
        ),
        None => String::new(),
    };
    crate::out::out!(
        "{}: {} bytes (onnx{data}{})",
        out.display(),
        done.model_bytes,
        match done.counts.inlined {
            0 => String::new(),
            n => format!(", {n} tensors inlined"),
        }
    );
    Ok(())
}
