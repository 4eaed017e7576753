//! Feed any bytes to the ONNX plugin directly (past the sniff, so the
//! protobuf walker sees every mutation) and read every part of every
//! tensor: typed-field decoding, sparse coordinates, external-data path
//! checks. Errors are fine; panics, aborts and runaway allocations are not.
//!
//! `cargo +nightly fuzz run onnx`

#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use zt::formats::onnx::Onnx;
use zt::{Format, Limits, OpenInput, Source, Store};

/// One scratch directory per fuzzing process (external data resolves
/// relative to it; it holds one small data file to find).
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("zt-fuzz-onnx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        std::fs::write(dir.join("w.bin"), [7u8; 256]).expect("data file");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let path = scratch().join("input.onnx");
    std::fs::write(&path, data).expect("write input");
    let limits = Limits::default();
    let store = Arc::new(Store::open(&path).expect("open input"));
    let catalog = Onnx.open(&OpenInput::new(&store, &limits));
    if let Ok(catalog) = catalog {
        if let Ok(source) = Source::from_catalog("onnx", store, catalog, limits) {
            for tensor in source.tensors() {
                for part in tensor.parts() {
                    let _ = part.bytes().map(|b| b.len());
                }
            }
        }
    }
    let _ = std::fs::remove_file(&path);
});
