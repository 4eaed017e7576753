//! HDF5 from well-formed h5py files outward: the input is a list of
//! (offset, xor) edits applied to one of the committed fixtures, so the
//! fuzzer starts deep inside B-trees, heaps and chunk indexes instead of
//! at a signature it would rarely guess. Then every tensor is read.
//!
//! `cargo +nightly fuzz run h5`

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zt::{Limits, OpenOptions};

const FIXTURES: [&[u8]; 2] = [
    include_bytes!("../../formats/tests/data/h5/earliest.h5"),
    include_bytes!("../../formats/tests/data/h5/latest.h5"),
];

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("zt-fuzz-h5-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, edits)) = data.split_first() else {
        return;
    };
    let mut bytes = FIXTURES[usize::from(pick) % FIXTURES.len()].to_vec();
    // Each edit: a 2-byte little-endian offset and a byte to xor there.
    for e in edits.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % bytes.len();
        bytes[at] ^= e[2];
    }
    let path = scratch().join("input.h5");
    std::fs::write(&path, &bytes).expect("write input");
    let options = OpenOptions {
        // Small budgets keep each run fast; the limits are what is tested.
        limits: Limits {
            decoded_bytes: 64 << 20,
            ..Limits::default()
        },
        ..OpenOptions::default()
    };
    if let Ok(source) = zt::open_with(&path, &options) {
        for tensor in source.tensors() {
            let _ = tensor.data().and_then(|p| p.bytes().map(|b| b.len()));
        }
    }
});
