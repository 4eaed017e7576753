//! Where each target's seed files live, relative to the repository root.
//!
//! A plugin's target is seeded from the directories its readers declare
//! (`zt::FuzzTarget::seeds`, and `fuzz/seeds/NAME` when it makes seeds in
//! Rust, `FuzzTarget::make_seeds`); the targets written in this crate from
//! [`SEEDS`]; `open_any` from both its own list and every plugin target's.
//! `fuzz/make_seeds.py` writes most `fuzz/seeds/*` directories with the
//! reference libraries (small files, committed); the PyTorch and HDF5
//! fixtures are the test suite's own; `zrecord_dict`, `zrecord_binidx`,
//! `zrecord_manifest`, `index_json`,
//! `http_response` and `dcp`, whose inputs are one part of a whole the body
//! supplies, and the plugin targets that make seeds in Rust, are written by
//! `cargo run -p zt-fuzz-bodies --example make-seeds` ([`crate::generate`]).
//! `fuzz/run-campaign.sh` hands the same directories to libFuzzer,
//! `tests/seeds.rs` runs every body over them, and `zt/tests/conformance.rs`
//! (which compiles this file in) takes its fixtures from them.

use std::path::{Path, PathBuf};

/// The seed directories of the targets written in this crate (and
/// `open_any`'s own, beside every plugin target's).
pub const SEEDS: &[(&str, &[&str])] = &[
    (
        "open_any",
        &[
            "fuzz/seeds/onnx",
            "zt/tests/data/h5",
            "tests/data/h5_legacy",
        ],
    ),
    ("pickle", &["fuzz/seeds/pickle"]),
    ("onnx", &["fuzz/seeds/onnx"]),
    ("h5", &["fuzz/seeds/h5"]),
    ("zt_cbor", &["fuzz/seeds/zt_cbor"]),
    ("zrecord_meta", &["fuzz/seeds/zrecord_meta"]),
    ("zrecord_dict", &["fuzz/seeds/zrecord_dict"]),
    ("zrecord_binidx", &["fuzz/seeds/zrecord_binidx"]),
    ("zrecord_mds", &["fuzz/seeds/zrecord_mds"]),
    ("zrecord_manifest", &["fuzz/seeds/zrecord_manifest"]),
    ("index_json", &["fuzz/seeds/index_json"]),
    ("http_response", &["fuzz/seeds/http_response"]),
    ("dcp", &["fuzz/seeds/dcp"]),
    ("zarr_blosc", &["fuzz/seeds/zarr_blosc"]),
    ("quant_config", &["fuzz/seeds/quant_config"]),
];

/// The fuzz targets the registry's plugins declare, in registry order.
pub fn plugin_targets() -> Vec<zt::FuzzGroup> {
    zt::plugins()
        .iter()
        .flat_map(|plugin| plugin.fuzz_targets())
        .collect()
}

/// Every target's seed directories: `open_any` first (its own, then every
/// plugin target's), the plugins' targets, then the rest of [`SEEDS`].
pub fn all_seed_dirs() -> Vec<(&'static str, Vec<String>)> {
    let plugins = plugin_targets();
    let own = |dirs: &[&str]| dirs.iter().map(|d| d.to_string()).collect::<Vec<_>>();
    let mut open_any = own(SEEDS[0].1);
    for group in &plugins {
        for dir in &group.seed_dirs {
            if !open_any.contains(dir) {
                open_any.push(dir.clone());
            }
        }
    }
    let mut all = vec![(SEEDS[0].0, open_any)];
    all.extend(plugins.iter().map(|g| (g.target.name, g.seed_dirs.clone())));
    all.extend(SEEDS[1..].iter().map(|(name, dirs)| (*name, own(dirs))));
    all
}

/// Files that are not seeds: the generators and their notes.
fn is_seed(path: &Path) -> bool {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    path.is_file() && !matches!(ext, "py" | "md" | "json" | "txt")
}

/// The repository root (this crate lives at `fuzz/bodies`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every seed file of `target`, sorted (no such target: none).
pub fn seed_files(target: &str) -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = Vec::new();
    for (name, dirs) in all_seed_dirs() {
        if name != target {
            continue;
        }
        for dir in dirs {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            files.extend(entries.flatten().map(|e| e.path()).filter(|p| is_seed(p)));
        }
    }
    files.sort();
    files
}
