//! The `.zt` container and manifest decoder on arbitrary bytes: the strict
//! CBOR codec alone (and its round trip: whatever it accepts must re-encode
//! to the same bytes, since it only accepts deterministic encodings), then
//! the schema checks, then the whole file path (footer, manifest, layouts,
//! zstd-seekable parts). Errors are fine; panics and runaway allocations
//! are not.
//!
//! `cargo +nightly fuzz run zt_cbor`

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zt::container::cbor::{decode, encode, DecodeLimits, MAX_DEPTH};
use zt::container::container::{Footer, MAGIC};

fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("zt-fuzz-cbor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(item) = decode(data, DecodeLimits { depth: MAX_DEPTH }) {
        assert_eq!(encode(&item), data, "accepted a non-deterministic encoding");
        let _ = zt::container::manifest::from_cbor(&item, &zt::Context::default());
    }
    // The same bytes as the manifest of a file whose footer is valid, so
    // the fuzzer reaches blob, layout and encoding checks.
    let mut file = MAGIC.to_vec();
    file.resize(4096, 0);
    file.extend_from_slice(data);
    let footer = Footer {
        manifest_offset: 4096,
        manifest_length: data.len() as u64,
        manifest_hash: xxhash_rust::xxh3::xxh3_64(data),
        version: 2,
    };
    file.extend_from_slice(&footer.encode());
    let path = scratch().join("input.zt");
    std::fs::write(&path, &file).expect("write input");
    if let Ok(source) = zt::open(&path) {
        for t in source.tensors() {
            for p in t.parts() {
                let _ = p.bytes().map(|b| b.len());
            }
        }
    }
    let _ = std::fs::remove_file(&path);
});
