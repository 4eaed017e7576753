//! HDF5 reading on small h5py-written fixtures (`tests/data/h5/`, made by
//! `make_fixtures.py` beside them), and hostile inputs made by mutating
//! them: cycles, offsets past the end, a chunk that inflates past its
//! size, a B-tree that claims a billion records, truncations and flipped
//! bytes. The comparisons against h5py itself live in `tests/test_h5.py`.
//!
//! Every failure asserts the exact `Error` variant.

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;
#[macro_use]
#[path = "support/cites.rs"]
mod cites;
// `read_all`: open and read every tensor; the first error, if any.
#[path = "support/open.rs"]
mod open;
use open::read_all;

use std::path::Path;

use zt::formats::h5::reader::lookup3;
use zt::{Error, Limits, Source, Value};

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/h5")
        .join(name);
    std::fs::read(path).unwrap()
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

// -- files in the shapes older libhdf5 releases wrote (tests/data/h5_legacy,
// made by make.py there from h5py files, with a MATLAB v7.3-style 512-byte
// userblock): layout messages of versions 1 and 2, fill value messages of
// version 1, soft links in old-style groups.

fn legacy_fixture() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/h5_legacy/legacy.h5");
    std::fs::read(path).unwrap()
}

fn open_legacy(dir: &Dir) -> Source {
    let path = dir.file("legacy.h5", &legacy_fixture());
    read_all(&path, Limits::default()).unwrap()
}

fn bytes_of(source: &Source, name: &str) -> Vec<u8> {
    let t = source.tensor(name).unwrap();
    t.data().unwrap().bytes().unwrap().into_owned()
}

fn le<T: Copy, const N: usize>(
    values: impl IntoIterator<Item = T>,
    f: fn(T) -> [u8; N],
) -> Vec<u8> {
    values.into_iter().flat_map(f).collect()
}

/// The entries of the list attribute `key` (`h5.skipped`, `h5.links`),
/// each as its string fields.
fn listed(source: &Source, key: &str) -> Vec<Vec<(String, String)>> {
    let Some((_, Value::List(items))) = source.attributes().iter().find(|(k, _)| k == key) else {
        return Vec::new();
    };
    items
        .iter()
        .map(|item| match item {
            Value::Map(fields) => fields
                .iter()
                .map(|(k, v)| match v {
                    Value::Str(s) => (k.clone(), s.clone()),
                    other => panic!("{key}: field {k} is {other:?}"),
                })
                .collect(),
            other => panic!("{key}: entry {other:?}"),
        })
        .collect()
}

fn field<'a>(entry: &'a [(String, String)], name: &str) -> &'a str {
    &entry.iter().find(|(k, _)| k == name).unwrap().1
}

#[test]
fn layout_messages_of_versions_1_and_2_read_as_written() {
    let dir = Dir::new();
    let source = open_legacy(&dir);
    let cases: [(&str, &[u64], Vec<u8>); 6] = [
        // Rank 1: two dimension sizes end the message at its 8-byte
        // boundary, with no element-size field after them.
        (
            "layout1/r1_f4",
            &[10],
            le((0..10).map(|i| i as f32), f32::to_le_bytes),
        ),
        (
            "layout1/r2_i2_gzip",
            &[5, 7],
            le(0..35i16, i16::to_le_bytes),
        ),
        ("layout2/r3_u1", &[3, 4, 5], (0..60u8).collect()),
        (
            "layout2/r1_be_f8",
            &[9],
            le((0..9).map(|i| -1.0 + 0.25 * f64::from(i)), f64::to_le_bytes),
        ),
        (
            "layout1/contiguous_f4",
            &[3, 4],
            le((0..12).map(|i| i as f32), f32::to_le_bytes),
        ),
        (
            "layout2/compact_i4",
            &[6],
            le((0..6).map(|i| 3 * i), i32::to_le_bytes),
        ),
    ];
    for (name, shape, want) in cases {
        assert_eq!(source.tensor(name).unwrap().shape(), shape, "{name}");
        assert_eq!(bytes_of(&source, name), want, "{name}");
    }
    // Unwritten chunks of a version-1 layout keep the fill value.
    let partial: Vec<i32> = (0..24)
        .map(|i| {
            if i / 6 < 2 && i % 6 < 3 {
                (i / 6) * 3 + i % 6
            } else {
                -7
            }
        })
        .collect();
    assert_eq!(
        bytes_of(&source, "layout1/partial_i4"),
        le(partial, i32::to_le_bytes)
    );
}

#[test]
fn fill_value_messages_of_older_writers_read() {
    let dir = Dir::new();
    let source = open_legacy(&dir);
    // Version 1 "undefined" with the size 0xFFFFFFFF, every chunk written.
    assert_eq!(
        bytes_of(&source, "fill/v1_undefined"),
        le((0..12).map(|i| i as f32), f32::to_le_bytes)
    );
    // Version 1 with a value: the chunks never written hold it.
    let want = [0, 1, 2, 3, 7, 7, 7, 7, 7, 7, 7, 7];
    assert_eq!(
        bytes_of(&source, "fill/v1_value"),
        le(want, i32::to_le_bytes)
    );
    // Version 2 "defined" with the size -1: no value.
    assert_eq!(
        bytes_of(&source, "fill/v2_minus_one"),
        le(0..8u16, u16::to_le_bytes)
    );
}

#[test]
fn soft_links_in_old_style_groups_are_listed_not_followed() {
    let dir = Dir::new();
    let source = open_legacy(&dir);
    // After a MATLAB v7.3-style userblock.
    assert!(legacy_fixture().starts_with(b"MATLAB 7.3 MAT-file"));
    assert_eq!(source.format(), "h5");
    let links: Vec<(String, String, String)> = listed(&source, "h5.links")
        .iter()
        .map(|e| {
            let f = |k| field(e, k).to_string();
            (f("name"), f("kind"), f("target"))
        })
        .collect();
    let want = [
        ("dangling", "/nowhere"),
        ("layout2/soft_rel", "r3_u1"),
        ("soft_abs", "/layout1/r1_f4"),
    ];
    for (name, target) in want {
        let entry = (name.to_string(), "soft".to_string(), target.to_string());
        assert!(links.contains(&entry), "{name}: {links:?}");
    }
    assert_eq!(links.len(), want.len());
    // Each dataset is a tensor once, under its own path only.
    assert_eq!(source.tensors().count(), 10);
    assert!(source.tensor("soft_abs").is_err());
    assert!(listed(&source, "h5.skipped").is_empty());
}

/// `earliest.h5` with `edit` applied to the bytes of `a/b/x`'s header,
/// given the offset of its layout message body.
fn earliest_with(edit: impl FnOnce(&mut Vec<u8>, usize)) -> Vec<u8> {
    let mut bytes = fixture("earliest.h5");
    let at = contiguous_layout(&bytes);
    edit(&mut bytes, at);
    bytes
}

#[test]
fn a_dataset_message_zt_cannot_parse_skips_that_dataset_only() {
    let dir = Dir::new();
    // The f32 datatype message body: class 1 version 1, IEEE bits, size 4.
    let f32_type = [0x11, 0x20, 0x1f, 0x00, 0x04, 0x00, 0x00, 0x00];
    let cases: [(&str, Vec<u8>, &str); 3] = [
        (
            "layout version",
            earliest_with(|b, at| b[at] = 9),
            "unknown layout version 9",
        ),
        (
            "datatype class",
            earliest_with(|b, at| {
                let ty = *find(&b[..at], &f32_type).last().unwrap();
                b[ty] = 0x1e; // class 14: none such
            }),
            "unknown datatype class 14",
        ),
        (
            // The dataspace message (version 1, rank 2, max dims) claims
            // rank 3: its dimensions run past the message.
            "dataspace rank",
            earliest_with(|b, at| {
                let space = *find(&b[..at], &[1, 2, 1, 0, 0, 0, 0, 0, 4]).last().unwrap();
                b[space + 1] = 3;
            }),
            "dataspace message",
        ),
    ];
    for (what, bytes, reason) in cases {
        let source = read_all(&dir.file("bad.h5", &bytes), Limits::default())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let names: Vec<&str> = source.tensors().map(|t| t.name()).collect();
        assert_eq!(names, ["z"], "{what}");
        assert_eq!(bytes_of(&source, "z"), vec![0u8; 256], "{what}");
        let skipped = listed(&source, "h5.skipped");
        assert_eq!(skipped.len(), 1, "{what}: {skipped:?}");
        assert_eq!(field(&skipped[0], "name"), "a/b/x", "{what}");
        assert!(
            field(&skipped[0], "reason").contains(reason),
            "{what}: {skipped:?}"
        );
    }
}

#[test]
fn budgets_and_structure_errors_still_refuse_the_file() {
    let dir = Dir::new();
    // A rank over the limit is a budget, not a message zt cannot parse.
    let path = dir.file("e.h5", &fixture("earliest.h5"));
    let limits = Limits {
        rank: 1,
        ..Limits::default()
    };
    let err = read_all(&path, limits).unwrap_err();
    assert!(matches!(err, Error::Limit { limit: "rank", .. }), "{err}");
    // A symbol table entry with no object header that is no soft link.
    let mut bytes = fixture("earliest.h5");
    let node = find(&bytes, b"SNOD")[0];
    bytes[node + 8 + 8..node + 8 + 16].copy_from_slice(&[0xff; 8]);
    let err = read_all(&dir.file("nohdr.h5", &bytes), Limits::default()).unwrap_err();
    assert!(
        cites!(err, Error::Header { .. }, &["h5.Structure"]),
        "{err}"
    );
}

#[test]
fn an_attribute_zt_cannot_parse_is_listed_and_the_rest_reads() {
    let mut bytes = fixture("earliest.h5");
    // The root's attribute `note` (message version 1: name padded to 8
    // bytes, then its datatype, a variable-length string, class 9).
    let name = find(&bytes, b"note\0\0\0\0")[0];
    assert_eq!(bytes[name + 8] & 0x0f, 9);
    bytes[name + 8] = (bytes[name + 8] & 0xf0) | 14; // class 14: none such
    let dir = Dir::new();
    let source = read_all(&dir.file("attr.h5", &bytes), Limits::default()).unwrap();
    assert_eq!(source.tensors().count(), 2);
    assert!(!source.attributes().iter().any(|(k, _)| k == "note"));
    let skipped = listed(&source, "h5.skipped");
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(field(&skipped[0], "name"), "@note");
    assert!(field(&skipped[0], "reason").contains("unknown datatype class 14"));
}
