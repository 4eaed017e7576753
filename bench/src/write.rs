//! Writing one tensor workload, then verifying and converting the files.
//!
//! Writes: the same in-memory tensors to `.zt` canonical, `auto` and 4 KiB
//! placement (`zt::container::write::write_objects`, the batch path behind
//! `zt.numpy.save_file`) and to safetensors (`zt::formats::safetensors::write`).
//! No writer fsyncs inside the timed region; before each run the previous
//! output is removed and `sync(2)` runs outside the timer. After the runs
//! every file is opened and compared byte for byte with the source tensors.
//!
//! Verify and convert, on the files just written (warm cache): `zt verify`
//! shallow and `--deep` (`zt::verify`) on the canonical `.zt`,
//! and safetensors → canonical `.zt` through `zt::convert` (open included),
//! whose content digest must equal the directly written file's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use zt::container::verify::content_digest;
use zt::container::write::{write_objects, Options};
use zt::verify;
use zt::{Align, WriteOptions};

use crate::stats::{fold, interleaved, timed, Case, Rate, Res, Row, Table};
use crate::sys;
use crate::workloads::Tensors;

/// The write alternatives: row name, file suffix, how to write.
type WriteFn = fn(&Tensors, &Path) -> zt::Result<u64>;

fn zt_with(t: &Tensors, path: &Path, options: Options) -> zt::Result<u64> {
    write_objects(path, t.objects(), None, &options)
}

fn writers() -> [(&'static str, &'static str, WriteFn); 4] {
    [
        ("zt .zt canonical", "canonical.zt", |t, p| {
            zt_with(t, p, Options::default())
        }),
        ("zt .zt auto", "auto.zt", |t, p| {
            let o = Options {
                canonical: false,
                align: Align::Auto,
                ..Options::default()
            };
            zt_with(t, p, o)
        }),
        ("zt .zt 4 KiB", "4k.zt", |t, p| {
            let o = Options {
                canonical: false,
                align: Align::Bytes(4096),
                ..Options::default()
            };
            zt_with(t, p, o)
        }),
        ("zt safetensors", "model.safetensors", |t, p| {
            zt::formats::safetensors::write(p, &t.inputs(), &[])
        }),
    ]
}

/// The peer of the write table's ratios.
pub const PEER: &str = "zt safetensors";

/// Files left by the write table, for the read and verify tables.
#[derive(Debug, Clone)]
pub struct Written {
    pub canonical: PathBuf,
    pub auto: PathBuf,
    pub safetensors: PathBuf,
    /// Every file written, removed when this is dropped (also on errors).
    pub all: Vec<PathBuf>,
}

impl Drop for Written {
    fn drop(&mut self) {
        for p in &self.all {
            let _ = sys::remove(p);
        }
    }
}

/// The fold of every source tensor, by name.
pub fn folds(t: &Tensors) -> HashMap<String, u64> {
    t.tensors
        .iter()
        .map(|o| (o.name.clone(), fold(&o.data)))
        .collect()
}

/// Every tensor of `path` equals the source tensor of its name, exactly.
pub fn check_content(path: &Path, t: &Tensors) -> Res<()> {
    let source = zt::open(path)?;
    if source.len() != t.tensors.len() {
        return Err(format!(
            "{}: {} tensors, {} written",
            path.display(),
            source.len(),
            t.tensors.len()
        )
        .into());
    }
    for o in &t.tensors {
        let part = source.tensor(&o.name)?.data()?;
        if part.shape() != o.shape.as_slice() || part.bytes()?.as_ref() != o.data.as_slice() {
            return Err(format!(
                "{}: tensor {} differs from the source",
                path.display(),
                o.name
            )
            .into());
        }
    }
    Ok(())
}

/// The write table for one workload; the files of the last run stay.
pub fn table(t: &Tensors, dir: &Path, runs: usize) -> Res<(Table, Written)> {
    let payload = t.payload();
    let prefix = format!("write-{}-", t.kind.name());
    let sizes: RefCell<HashMap<&str, u64>> = Default::default();
    let mut cases = Vec::new();
    let mut written = Written {
        canonical: PathBuf::new(),
        auto: PathBuf::new(),
        safetensors: PathBuf::new(),
        all: Vec::new(),
    };
    for (name, suffix, write) in writers() {
        let path = dir.join(format!("{prefix}{suffix}"));
        written.all.push(path.clone());
        let sizes = &sizes;
        cases.push(Case::new(name, move || {
            sys::remove(&path)?;
            sys::sync_all();
            let (s, size) = timed(|| write(t, &path));
            sizes.borrow_mut().insert(name, size?);
            Ok(s)
        }));
    }
    let times = interleaved(&mut cases, runs, 1)?;
    drop(cases);
    let [canonical, auto, _, safetensors] = &written.all[..] else {
        unreachable!("four writers")
    };
    written.canonical = canonical.clone();
    written.auto = auto.clone();
    written.safetensors = safetensors.clone();
    for p in &written.all {
        check_content(p, t)?;
    }
    let sizes = sizes.into_inner();
    let mut table = Table::new(format!("Write {}", t.describe()), &[Rate::GiBps])
        .ratio(&format!("vs {PEER}"))
        .extra(&["size ÷ payload"]);
    for (name, _, _) in writers() {
        table.rows.push(
            Row::new(name, &times)
                .amounts(&[Some(payload as f64)])
                .vs(PEER)
                .extra(vec![format!("{:.3}", sizes[name] as f64 / payload as f64)]),
        );
    }
    table.notes.push(format!(
        "{runs} runs after one warm-up, interleaved; no writer fsyncs in the timed region \
         (the previous output is removed and sync(2) runs outside it). Every file is then \
         read back and compared byte for byte with the source tensors."
    ));
    Ok((table, written))
}

/// `zt verify` shallow and deep on the canonical `.zt`, and safetensors →
/// `.zt` through `zt::convert`.
pub fn verify_convert_table(t: &Tensors, w: &Written, dir: &Path, runs: usize) -> Res<Table> {
    let n = t.tensors.len() as u64;
    let converted = dir.join(format!("convert-{}.zt", t.kind.name()));
    let want = content_digest(&w.canonical)?;
    let mut cases = Vec::new();
    for (name, deep) in [("zt verify (shallow)", false), ("zt verify --deep", true)] {
        let path = &w.canonical;
        cases.push(Case::new(name, move || {
            let (s, v) = timed(|| verify(path, deep));
            let v = v?;
            if v.checked != n || v.undigested != 0 {
                return Err(format!("verify checked {} of {n} parts", v.checked).into());
            }
            Ok(s)
        }));
    }
    // Verify (shallow and deep interleaved), then convert on its own, so
    // no verify run always follows a convert's writes.
    let mut times = interleaved(&mut cases, runs, 1)?;
    drop(cases);
    let mut convert = Vec::new();
    {
        let (src, out) = (&w.safetensors, &converted);
        convert.push(Case::new(
            "zt convert safetensors → .zt canonical",
            move || {
                sys::remove(out)?;
                sys::sync_all();
                let (s, r) = timed(|| -> zt::Result<u64> {
                    zt::convert(&zt::open(src)?, out, &WriteOptions::default())
                });
                r?;
                if content_digest(out)? != want {
                    return Err("the converted file's content differs from the source".into());
                }
                Ok(s)
            },
        ));
    }
    times.extend(interleaved(&mut convert, runs, 1)?);
    drop(convert);
    sys::remove(&converted)?;
    let mut table = Table::new(
        format!("Verify and convert {}", t.describe()),
        &[Rate::GiBps],
    );
    for name in [
        "zt verify (shallow)",
        "zt verify --deep",
        "zt convert safetensors → .zt canonical",
    ] {
        table
            .rows
            .push(Row::new(name, &times).amounts(&[Some(t.payload() as f64)]));
    }
    table.notes.push(format!(
        "{runs} runs after one warm-up, warm cache; shallow and deep verify interleaved. verify recomputes every part's \
         XXH3 digest; --deep also hashes every shard file (these files have none). convert \
         includes opening the safetensors file; its output's content digest is checked \
         against the directly written canonical file on every run."
    ));
    Ok(table)
}
