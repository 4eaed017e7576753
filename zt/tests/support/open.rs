//! Opening a file under chosen limits and reading every tensor of it:
//! `open_limited`, `read_all`, `read_parts`. Shared by the per-format test
//! files and the conformance runner (`conformance.rs`); each uses a subset.
#![allow(dead_code)]

use std::path::Path;

use zt::{Limits, OpenOptions, Source};

/// Open `path` through the registry (detection included) under `limits`.
pub fn open_limited(path: &Path, limits: Limits) -> zt::Result<Source> {
    zt::open_with(
        path,
        &OpenOptions {
            limits,
            ..Default::default()
        },
    )
}

/// Open `path` under `limits` and read every tensor's data part; the
/// first error, if any.
pub fn read_all(path: &Path, limits: Limits) -> zt::Result<Source> {
    let source = open_limited(path, limits)?;
    for t in source.tensors() {
        t.data()?.bytes()?;
    }
    Ok(source)
}

/// Read every part of every tensor of `source` (C-order bytes, decoded
/// where stored encoded), then verify it (stored digests, lazy checksums
/// such as an npz member's CRC-32); the first error, if any.
pub fn read_parts(source: &Source) -> zt::Result<()> {
    for t in source.tensors() {
        for part in t.parts() {
            part.bytes()?;
        }
    }
    zt::container::verify::verify(source, false).map(drop)
}
