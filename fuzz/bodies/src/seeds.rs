//! Where each target's seed files live, relative to the repository root.
//!
//! `fuzz/make_seeds.py` writes the `fuzz/seeds/*` directories with the
//! reference libraries (small files, committed); the PyTorch and HDF5
//! fixtures are the test suite's own; `zrecord_dict`, `index_json` and
//! `http_response` and `dcp`, whose inputs are one part of a whole the body supplies,
//! are written by `cargo run -p zt-fuzz-bodies --example make-seeds` from
//! the body's own definitions ([`crate::generate`]). `fuzz/run-campaign.sh` hands the same
//! directories to libFuzzer, and `tests/seeds.rs` runs every body over them.

use std::path::{Path, PathBuf};

/// Per target, the directories whose files seed it.
pub const SEEDS: &[(&str, &[&str])] = &[
    (
        "open_any",
        &[
            "fuzz/seeds/safetensors",
            "fuzz/seeds/gguf",
            "fuzz/seeds/numpy",
            "fuzz/seeds/onnx",
            "fuzz/seeds/zt",
            "tests/data/pt",
            "zt/tests/data/h5",
            "tests/data/h5_legacy",
        ],
    ),
    ("safetensors", &["fuzz/seeds/safetensors"]),
    ("pt", &["tests/data/pt"]),
    ("pickle", &["fuzz/seeds/pickle"]),
    ("gguf", &["fuzz/seeds/gguf"]),
    ("numpy", &["fuzz/seeds/numpy"]),
    ("onnx", &["fuzz/seeds/onnx"]),
    ("h5", &["fuzz/seeds/h5"]),
    ("zt_file", &["fuzz/seeds/zt"]),
    ("zt_cbor", &["fuzz/seeds/zt_cbor"]),
    ("zrecord_meta", &["fuzz/seeds/zrecord_meta"]),
    ("zrecord_dict", &["fuzz/seeds/zrecord_dict"]),
    ("index_json", &["fuzz/seeds/index_json"]),
    ("http_response", &["fuzz/seeds/http_response"]),
    ("dcp", &["fuzz/seeds/dcp"]),
];

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
    for (name, dirs) in SEEDS {
        if *name != target {
            continue;
        }
        for dir in *dirs {
            let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                continue;
            };
            files.extend(entries.flatten().map(|e| e.path()).filter(|p| is_seed(p)));
        }
    }
    files.sort();
    files
}
