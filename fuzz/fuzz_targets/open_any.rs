//! Open any bytes as a tensor file and read every tensor: errors are fine,
//! panics, aborts and runaway allocations are not.
//!
//! `cargo +nightly fuzz run open_any`

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zt::OpenOptions;

/// Detection also looks at the extension (an empty zip is an npz only by
/// name), so the input length picks one without changing the bytes. Every
/// format a reader is registered for is named, so each plugin's extension
/// rules are reached (detection itself is structural).
const EXTENSIONS: [&str; 9] = [
    "bin",
    "npy",
    "npz",
    "safetensors",
    "gguf",
    "pt",
    "onnx",
    "h5",
    "zt",
];

/// One scratch directory per fuzzing process.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("zt-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

fn read_all(options: &OpenOptions, path: &std::path::Path) {
    if let Ok(source) = zt::open_with(path, options) {
        for tensor in source.tensors() {
            for part in tensor.parts() {
                let _ = part.bytes().map(|b| b.len());
            }
        }
        // Digests and lazy checksums (npz CRC-32) of every part.
        let _ = zt::container::verify::verify(&source, false);
    }
}

fuzz_target!(|data: &[u8]| {
    let ext = EXTENSIONS[data.len() % EXTENSIONS.len()];
    let path = scratch().join(format!("input.{ext}"));
    std::fs::write(&path, data).expect("write input");
    // Default limits: what a user gets is what must hold up.
    for map in [true, false] {
        let options = OpenOptions {
            map,
            ..OpenOptions::default()
        };
        read_all(&options, &path);
    }
    // Tight budgets too, so `-malloc_limit_mb` stays meaningful: with the
    // defaults a valid 40 GiB fill may (rightly) ask for 40 GiB, and the
    // fallible path turns a refusal into an error the fuzzer cannot see.
    let tight = OpenOptions {
        limits: zt::Limits {
            decoded_bytes: 256 << 20,
            total_decoded_bytes: 1 << 30,
            ..zt::Limits::default()
        },
        ..OpenOptions::default()
    };
    read_all(&tight, &path);
    let _ = std::fs::remove_file(&path);
});
