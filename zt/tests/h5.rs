//! HDF5 reading on small h5py-written fixtures (`tests/data/h5/`, made by
//! `make_fixtures.py` beside them), and hostile inputs made by mutating
//! them: cycles, offsets past the end, a chunk that inflates past its
//! size, a B-tree that claims a billion records, truncations and flipped
//! bytes. The comparisons against h5py itself live in `tests/test_h5.py`.
//!
//! Every failure asserts the exact `Error` variant.

#[macro_use]
#[path = "support/cites.rs"]
mod cites;

use std::path::{Path, PathBuf};

use zt::formats::h5::reader::lookup3;
use zt::{Error, Limits, OpenOptions, Source, Value};

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/h5")
        .join(name);
    std::fs::read(path).unwrap()
}

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(tempfile::tempdir().unwrap())
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

/// Open and read every tensor; the first error, if any.
fn read_all(path: &Path, limits: Limits) -> Result<Source, Error> {
    let options = OpenOptions {
        limits,
        ..OpenOptions::default()
    };
    let source = zt::open_with(path, &options)?;
    for t in source.tensors() {
        t.data()?.bytes()?;
    }
    Ok(source)
}

fn find(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    hay.windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// Offset of the contiguous layout message body of `a/b/x` (layout
/// version 3, class 1, then address and the size 64).
fn contiguous_layout(bytes: &[u8]) -> usize {
    let hits: Vec<usize> = (0..bytes.len() - 18)
        .filter(|&i| {
            bytes[i] == 3 && bytes[i + 1] == 1 && bytes[i + 10..i + 18] == 64u64.to_le_bytes()
        })
        .collect();
    assert_eq!(hits.len(), 1, "one contiguous layout message");
    hits[0]
}

#[test]
fn earliest_fixture_reads() {
    let dir = Dir::new();
    let path = dir.file("e.h5", &fixture("earliest.h5"));
    let source = read_all(&path, Limits::default()).unwrap();
    assert_eq!(source.format(), "h5");
    let names: Vec<&str> = source.tensors().map(|t| t.name()).collect();
    assert_eq!(names, ["a/b/x", "z"]);
    let x = source.tensor("a/b/x").unwrap();
    assert_eq!(x.shape(), &[4, 4]);
    let want: Vec<f32> = (0..16).map(|i| i as f32).collect();
    assert_eq!(f32s(&x.data().unwrap().bytes().unwrap()), want);
    let z = source.tensor("z").unwrap();
    assert_eq!(z.data().unwrap().bytes().unwrap().as_ref(), &[0u8; 256][..]);
    assert!(source
        .attributes()
        .iter()
        .any(|(k, v)| k == "note" && *v == Value::Str("fixture".into())));
}

#[test]
fn latest_fixture_reads_dense_groups() {
    let dir = Dir::new();
    let path = dir.file("l.h5", &fixture("latest.h5"));
    let source = read_all(&path, Limits::default()).unwrap();
    assert_eq!(source.tensors().count(), 12);
    let d = source.tensor("many/d07").unwrap();
    let b = d.data().unwrap().bytes().unwrap().into_owned();
    assert_eq!(
        b,
        [7i32, 7, 7]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>()
    );
}

#[test]
fn contiguous_offset_past_eof_is_truncated() {
    let mut bytes = fixture("earliest.h5");
    let at = contiguous_layout(&bytes);
    bytes[at + 2..at + 10].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let dir = Dir::new();
    let err = read_all(&dir.file("eof.h5", &bytes), Limits::default()).unwrap_err();
    assert!(matches!(err, Error::Truncated { .. }), "{err}");
    // An address so large that base + address overflows.
    bytes[at + 2..at + 10].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
    let err = read_all(&dir.file("ovf.h5", &bytes), Limits::default()).unwrap_err();
    assert!(
        matches!(err, Error::Overflow { .. } | Error::Truncated { .. }),
        "{err}"
    );
}

#[test]
fn chunk_address_past_eof_fails_when_read_not_when_opened() {
    let mut bytes = fixture("earliest.h5");
    // The chunk B-tree (node type 1): child 0 follows the header, the two
    // sibling addresses and key 0 (size, mask, two 8-byte offsets).
    let at = find(&bytes, b"TREE")
        .into_iter()
        .find(|&at| bytes[at + 4] == 1)
        .unwrap();
    let child = at + 8 + 16 + 24;
    bytes[child..child + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let dir = Dir::new();
    let path = dir.file("chunk-eof.h5", &bytes);
    let source = zt::open(&path).unwrap();
    let err = source
        .tensor("z")
        .unwrap()
        .data()
        .unwrap()
        .bytes()
        .unwrap_err();
    assert!(matches!(err, Error::Truncated { .. }), "{err}");
    // Other tensors still read.
    assert_eq!(
        source
            .tensor("a/b/x")
            .unwrap()
            .data()
            .unwrap()
            .bytes()
            .unwrap()
            .len(),
        64
    );
}

#[test]
fn chunk_inflating_past_its_size_fails_to_decode() {
    let mut bytes = fixture("earliest.h5");
    // Layout v3 chunked: 3, 2, dimensionality 2, B-tree address, then the
    // chunk dims 64 and the element size 4. Declare 16-element chunks:
    // the stored chunk still inflates to 64 elements.
    let hits: Vec<usize> = (0..bytes.len() - 19)
        .filter(|&i| {
            bytes[i..i + 3] == [3, 2, 2] && bytes[i + 11..i + 19] == [64, 0, 0, 0, 4, 0, 0, 0]
        })
        .collect();
    assert_eq!(hits.len(), 1);
    bytes[hits[0] + 11] = 16;
    let dir = Dir::new();
    let err = read_all(&dir.file("bomb.h5", &bytes), Limits::default()).unwrap_err();
    assert!(cites!(err, Error::Decode { .. }, &["h5.Filter"]), "{err}");
    assert!(err.to_string().contains("inflates past"), "{err}");
}

#[test]
fn group_graph_cycle_ends_the_walk() {
    let mut bytes = fixture("earliest.h5");
    // The root's object header address, from the superblock's root entry.
    let root = u64::from_le_bytes(bytes[64..72].try_into().unwrap());
    // Point the first member of every symbol table node back at the root:
    // `a` now links to `/` itself.
    for at in find(&bytes, b"SNOD") {
        let entry = at + 8;
        bytes[entry + 8..entry + 16].copy_from_slice(&root.to_le_bytes());
    }
    let dir = Dir::new();
    let source = read_all(&dir.file("cycle.h5", &bytes), Limits::default()).unwrap();
    let names: Vec<&str> = source.tensors().map(|t| t.name()).collect();
    assert_eq!(names, ["z"]);
}

#[test]
fn btree_node_pointing_at_itself_is_a_header_error() {
    let mut bytes = fixture("earliest.h5");
    let trees = find(&bytes, b"TREE");
    // The root group's B-tree is the first one written.
    let at = trees[0];
    assert_eq!(bytes[at + 4], 0, "a group node");
    bytes[at + 5] = 1; // level 1: its children are nodes
    let child = at + 8 + 16 + 8; // after the header, the siblings and key 0
    bytes[child..child + 8].copy_from_slice(&(at as u64).to_le_bytes());
    let dir = Dir::new();
    let err = read_all(&dir.file("loop.h5", &bytes), Limits::default()).unwrap_err();
    assert!(
        cites!(err, Error::Header { .. }, &["h5.Structure"]),
        "{err}"
    );
}

#[test]
fn btree_claiming_a_billion_records_hits_the_entries_limit() {
    let mut bytes = fixture("latest.h5");
    let heads = find(&bytes, b"BTHD");
    assert_eq!(heads.len(), 1);
    let at = heads[0];
    // Total record count at +26 (8 bytes), checksum over [at, at + 34).
    bytes[at + 26..at + 34].copy_from_slice(&1_000_000_000u64.to_le_bytes());
    let sum = lookup3(&bytes[at..at + 34]);
    bytes[at + 34..at + 38].copy_from_slice(&sum.to_le_bytes());
    let dir = Dir::new();
    let err = read_all(&dir.file("billion.h5", &bytes), Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Limit {
                limit: "entries",
                ..
            }
        ),
        "{err}"
    );
    // The same tree without the fixed checksum is caught by the checksum.
    bytes[at + 34] ^= 1;
    let err = read_all(&dir.file("bad-sum.h5", &bytes), Limits::default()).unwrap_err();
    assert!(
        cites!(err, Error::Header { .. }, &["h5.Structure"]),
        "{err}"
    );
}

#[test]
fn a_small_work_budget_is_enforced() {
    let dir = Dir::new();
    let path = dir.file("l.h5", &fixture("latest.h5"));
    let limits = Limits {
        entries: 10,
        ..Limits::default()
    };
    let err = read_all(&path, limits).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Limit {
                limit: "entries",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn truncations_fail_cleanly() {
    let dir = Dir::new();
    for name in ["earliest.h5", "latest.h5"] {
        let bytes = fixture(name);
        for len in (0..bytes.len()).step_by(13) {
            let path = dir.file("cut.h5", &bytes[..len]);
            // Short files may not even be recognised; none may panic.
            let _ = read_all(&path, Limits::default());
        }
        let err = read_all(&dir.file("cut.h5", &bytes[..200]), Limits::default()).unwrap_err();
        assert!(
            cites!(
                err,
                Error::Truncated { .. } | Error::Header { .. },
                &["core.Truncated"]
            ),
            "{name}: {err}"
        );
    }
}

#[test]
fn flipped_bytes_never_panic() {
    let dir = Dir::new();
    for name in ["earliest.h5", "latest.h5"] {
        let bytes = fixture(name);
        for at in (0..bytes.len()).step_by(5) {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[at] ^= flip;
                let _ = read_all(&dir.file("flip.h5", &b), Limits::default());
            }
        }
    }
}
