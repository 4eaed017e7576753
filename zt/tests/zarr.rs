//! zarr stores read through the registry: small zarr-python-written
//! fixtures (`tests/data/zarr/`, made by `make_fixtures.py` beside them,
//! with what zarr-python reads back from each in `expected.json`), and
//! hostile stores made by mutating copies of them: a shard index past the
//! shard, chunks shorter or longer than their elements, a corrupted
//! checksum, keys that leave the store. The comparisons against
//! zarr-python at test time, over every codec combination, live in
//! `tests/test_zarr.py`.
//!
//! Every failure asserts the `Error` variant and the rule it cites.

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;
#[macro_use]
#[path = "support/cites.rs"]
mod cites;
#[path = "support/open.rs"]
mod open;
use open::read_all;

use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use zt::{Error, Limits, Value};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/zarr")
}

/// What zarr-python read from the fixture `store`: (name, dtype, shape,
/// bytes) in its member order.
fn expected(store: &str) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let text = std::fs::read_to_string(data().join("expected.json")).unwrap();
    let all: Json = serde_json::from_str(&text).unwrap();
    all[store]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let hex = a["hex"].as_str().unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let shape = a["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            (
                a["name"].as_str().unwrap().to_string(),
                a["dtype"].as_str().unwrap().to_string(),
                shape,
                bytes,
            )
        })
        .collect()
}

/// A copy of the fixture `store` in `dir`, to mutate; its path.
fn copy(dir: &Dir, store: &str) -> PathBuf {
    fn tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let dest = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                tree(&entry.path(), &dest);
            } else {
                std::fs::copy(entry.path(), &dest).unwrap();
            }
        }
    }
    let to = dir.path(store);
    tree(&data().join(store), &to);
    to
}

/// Every array of the store at `path`, read through the registry, as
/// zarr-python read the fixture `store`: names in its order, dtypes,
/// shapes and bytes.
fn assert_reads_as_zarr_python(path: &Path, store: &str) {
    let source = read_all(path, Limits::default()).unwrap();
    assert_eq!(source.format(), "zarr");
    let want = expected(store);
    let names: Vec<&str> = source.tensors().map(|t| t.name()).collect();
    let want_names: Vec<&str> = want.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(names, want_names);
    for (name, dtype, shape, bytes) in &want {
        let t = source.tensor(name).unwrap();
        assert_eq!(t.data().unwrap().dtype().name(), dtype, "{name}");
        assert_eq!(t.shape(), &shape[..], "{name}");
        assert_eq!(
            t.data().unwrap().bytes().unwrap().as_ref(),
            &bytes[..],
            "{name}"
        );
    }
}

/// Read every array of the store at `path`; the first error.
fn read_err(path: &Path) -> Error {
    match read_all(path, Limits::default()) {
        Ok(_) => panic!("{} read", path.display()),
        Err(e) => e,
    }
}

#[test]
fn consolidated_v3_group_reads_as_zarr_python_does() {
    let dir = Dir::new();
    let store = copy(&dir, "group.zarr");
    // The directory, or its root metadata file: the same store.
    assert_reads_as_zarr_python(&store, "group.zarr");
    assert_reads_as_zarr_python(&store.join("zarr.json"), "group.zarr");
    let source = zt::open(&store).unwrap();
    assert!(source
        .attributes()
        .iter()
        .any(|(k, v)| k == "title" && *v == Value::Str("fixture".into())));
}

#[test]
fn listed_v3_group_reads_the_same_arrays() {
    // Without its consolidated metadata the group is listed from its
    // directories; the arrays read the same.
    let dir = Dir::new();
    let store = copy(&dir, "group.zarr");
    let meta = store.join("zarr.json");
    let mut root: Json = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    root.as_object_mut()
        .unwrap()
        .remove("consolidated_metadata");
    std::fs::write(&meta, serde_json::to_vec(&root).unwrap()).unwrap();
    assert_reads_as_zarr_python(&store, "group.zarr");
}

#[test]
fn listed_v2_group_reads_as_zarr_python_does() {
    let dir = Dir::new();
    let store = copy(&dir, "v2.zarr");
    assert_reads_as_zarr_python(&store, "v2.zarr");
    assert_reads_as_zarr_python(&store.join(".zgroup"), "v2.zarr");
}

/// Rewrite the sharded array's end index (4 inner chunks, no CRC).
fn patch_index(store: &Path, entries: [(u64, u64); 4]) {
    let shard = store.join("sub/s/c/0");
    let mut raw = std::fs::read(&shard).unwrap();
    let at = raw.len() - 64;
    for (i, (offset, nbytes)) in entries.iter().enumerate() {
        raw[at + 16 * i..at + 16 * i + 8].copy_from_slice(&offset.to_le_bytes());
        raw[at + 16 * i + 8..at + 16 * i + 16].copy_from_slice(&nbytes.to_le_bytes());
    }
    std::fs::write(&shard, raw).unwrap();
}

#[test]
fn shard_index_out_of_range_is_refused() {
    let dir = Dir::new();
    let store = copy(&dir, "group.zarr");
    // Past the shard's data, into its index, overflowing, overlapping.
    for entries in [
        [(0, 4), (4, 4), (8, 1 << 40), (u64::MAX, u64::MAX)],
        [(0, 4), (4, 4), (8, 8), (u64::MAX, u64::MAX)],
        [(0, 4), (4, 4), (u64::MAX - 1, 4), (u64::MAX, u64::MAX)],
        [(0, 4), (2, 4), (8, 4), (u64::MAX, u64::MAX)],
    ] {
        patch_index(&store, entries);
        let e = read_err(&store);
        assert!(
            cites!(e, Error::Range { .. }, &["zarr.Shard"]),
            "{entries:?}: {e}"
        );
    }
    // A shard shorter than its index.
    std::fs::write(store.join("sub/s/c/0"), [0u8; 40]).unwrap();
    let e = read_err(&store);
    assert!(cites!(e, Error::Range { .. }, &["zarr.Shard"]), "{e}");
}

#[test]
fn chunks_that_lie_about_their_size_are_refused() {
    let dir = Dir::new();
    let store = copy(&dir, "group.zarr");
    // A raw chunk a byte short, then a byte long: 4 i32 elements are 16.
    let chunk = store.join("Raw/c/0");
    let good = std::fs::read(&chunk).unwrap();
    assert_eq!(good.len(), 16);
    for bad in [&good[..15], &[&good[..], &[0]].concat()[..]] {
        std::fs::write(&chunk, bad).unwrap();
        let e = read_err(&store);
        assert!(cites!(e, Error::Decode { .. }, &["zarr.Chunk"]), "{e}");
        assert!(e.to_string().contains("Raw/c/0"), "{e}");
    }
    std::fs::write(&chunk, &good).unwrap();
    // A zstd chunk that inflates past its chunk's 24 bytes.
    std::fs::write(
        store.join("w/c/0/0"),
        zstd::bulk::compress(&[7u8; 4096], 1).unwrap(),
    )
    .unwrap();
    let e = read_err(&store);
    assert!(cites!(e, Error::Decode { .. }, &["zarr.Chunk"]), "{e}");
}

#[test]
fn a_flipped_byte_under_crc32c_is_refused() {
    let dir = Dir::new();
    let store = copy(&dir, "group.zarr");
    let chunk = store.join("sub/t/c/1/0");
    let mut raw = std::fs::read(&chunk).unwrap();
    raw[3] ^= 0x10;
    std::fs::write(&chunk, raw).unwrap();
    let e = read_err(&store);
    assert!(cites!(e, Error::Decode { .. }, &["zarr.Checksum"]), "{e}");
}

#[test]
fn keys_that_leave_the_store_are_refused() {
    for key in [
        "../outside",
        "sub/../../outside",
        "/abs",
        "sub//t",
        "sub\\t",
        ".",
    ] {
        let dir = Dir::new();
        let store = copy(&dir, "group.zarr");
        let meta = store.join("zarr.json");
        let mut root: Json = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
        let nodes = root["consolidated_metadata"]["metadata"]
            .as_object_mut()
            .unwrap();
        let node = nodes.remove("sub/t").unwrap();
        nodes.insert(key.to_string(), node);
        std::fs::write(&meta, serde_json::to_vec(&root).unwrap()).unwrap();
        let e = zt::open(&store).map(drop).unwrap_err();
        assert!(cites!(e, Error::Header { .. }, &["zarr.Key"]), "{key}: {e}");
    }
}

#[cfg(unix)]
#[test]
fn a_chunk_symlinked_out_of_the_store_is_refused() {
    let dir = Dir::new();
    let store = copy(&dir, "group.zarr");
    let outside = dir.file("secret", &[0u8; 16]);
    let chunk = store.join("Raw/c/0");
    std::fs::remove_file(&chunk).unwrap();
    std::os::unix::fs::symlink(&outside, &chunk).unwrap();
    let e = read_err(&store);
    assert!(cites!(e, Error::Header { .. }, &["zarr.Key"]), "{e}");
}

#[test]
fn a_shape_past_the_limits_is_refused_before_allocating() {
    let dir = Dir::new();
    let store = copy(&dir, "group.zarr");
    let meta = store.join("zarr.json");
    let mut root: Json = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    root["consolidated_metadata"]["metadata"]["w"]["shape"] =
        serde_json::json!([1u64 << 40, 1u64 << 20]);
    std::fs::write(&meta, serde_json::to_vec(&root).unwrap()).unwrap();
    let e = zt::open(&store).map(drop).unwrap_err();
    assert!(cites!(e, Error::Limit { .. }, &["core.Limit"]), "{e}");
}
