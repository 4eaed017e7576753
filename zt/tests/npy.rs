//! `.npy` / `.npz` reading and writing, on fixtures built byte by byte here
//! (the comparisons against numpy itself live in the Python tests).
//!
//! Every failure asserts the exact `Error` variant, and where it refuses
//! the input the rule it cites (`cites!`, `support/cites.rs`).

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;
#[macro_use]
#[path = "support/cites.rs"]
mod cites;
#[path = "support/open.rs"]
mod open;
use open::open_limited;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use flate2::{Compress, Compression, FlushCompress};
use zt::formats::npy::{write_npy, write_npz, Npy};
use zt::{Catalog, DType, Error, Format, Limits, OpenInput, OpenOptions, Source, Store, TensorIn};

// ---------------------------------------------------------------- fixtures

/// A `.npy` file of the given version whose header is `dict`, padded as
/// numpy pads it (spaces and `\n` to a multiple of 64).
fn npy_v(major: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let prefix = if major == 1 { 10 } else { 12 };
    let mut header = dict.as_bytes().to_vec();
    while (prefix + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[major, 0]);
    if major == 1 {
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out
}

fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    npy_v(1, dict, data)
}

fn dict(descr: &str, fortran: bool, shape: &str) -> String {
    let f = if fortran { "True" } else { "False" };
    format!("{{'descr': '{descr}', 'fortran_order': {f}, 'shape': {shape}, }}")
}

/// Run a plugin's `open` directly, bypassing detection, for files that
/// (rightly) fail the sniff.
fn plugin_open(format: &dyn Format, path: &Path, limits: &Limits) -> zt::Result<Catalog> {
    let store = Arc::new(Store::open(path).unwrap());
    format.open(&OpenInput::new(&store, limits))
}

fn only_bytes(source: &Source, name: &str) -> zt::Result<Vec<u8>> {
    Ok(source.tensor(name)?.data()?.bytes()?.into_owned())
}

fn le<T: Copy, const N: usize>(values: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|&v| to(v)).collect()
}

/// One member of a hand-built zip.
struct Member {
    name: String,
    method: u16,
    flags: u16,
    /// The bytes as stored in the archive (compressed for deflate).
    raw: Vec<u8>,
    uncompressed: u64,
    crc: u32,
}

fn crc(bytes: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(bytes);
    h.finalize()
}

fn stored(name: &str, bytes: &[u8]) -> Member {
    Member {
        name: name.into(),
        method: 0,
        flags: 0,
        raw: bytes.to_vec(),
        uncompressed: bytes.len() as u64,
        crc: crc(bytes),
    }
}

fn deflate(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn deflated(name: &str, bytes: &[u8]) -> Member {
    Member {
        name: name.into(),
        method: 8,
        flags: 0,
        raw: deflate(bytes),
        uncompressed: bytes.len() as u64,
        crc: crc(bytes),
    }
}

/// How the central directory and end records are written.
#[derive(Clone, Copy, Default)]
struct ZipStyle {
    /// Sizes and offsets in a zip64 extra field in the central directory.
    central_zip64: bool,
    /// A zip64 end record and locator before the end record.
    eocd64: bool,
}

/// Local headers as numpy writes them (`force_zip64`: 0xFFFFFFFF sizes and
/// a zip64 extra field); returns the bytes and each member's offset.
fn locals(members: &[Member]) -> (Vec<u8>, Vec<u64>) {
    let mut out = Vec::new();
    let mut offsets = Vec::new();
    for m in members {
        offsets.push(out.len() as u64);
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&45u16.to_le_bytes());
        out.extend_from_slice(&m.flags.to_le_bytes());
        out.extend_from_slice(&m.method.to_le_bytes());
        out.extend_from_slice(&[0, 0, 0x21, 0]);
        out.extend_from_slice(&m.crc.to_le_bytes());
        out.extend_from_slice(&[0xFF; 8]);
        out.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&20u16.to_le_bytes());
        out.extend_from_slice(m.name.as_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(&m.uncompressed.to_le_bytes());
        out.extend_from_slice(&(m.raw.len() as u64).to_le_bytes());
        out.extend_from_slice(&m.raw);
    }
    (out, offsets)
}

/// Append a central directory for `(member, local offset)` pairs and the
/// end records; `count` overrides the declared entry count.
fn finish(
    mut out: Vec<u8>,
    entries: &[(&Member, u64)],
    style: ZipStyle,
    count: Option<u64>,
) -> Vec<u8> {
    let dir_offset = out.len() as u64;
    for (m, offset) in entries {
        out.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        out.extend_from_slice(&(0x0300u16 | 45).to_le_bytes());
        out.extend_from_slice(&45u16.to_le_bytes());
        out.extend_from_slice(&m.flags.to_le_bytes());
        out.extend_from_slice(&m.method.to_le_bytes());
        out.extend_from_slice(&[0, 0, 0x21, 0]);
        out.extend_from_slice(&m.crc.to_le_bytes());
        let extra_len: u16 = if style.central_zip64 { 28 } else { 0 };
        if style.central_zip64 {
            out.extend_from_slice(&[0xFF; 8]);
        } else {
            out.extend_from_slice(&(m.raw.len() as u32).to_le_bytes());
            out.extend_from_slice(&(m.uncompressed as u32).to_le_bytes());
        }
        out.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&extra_len.to_le_bytes());
        out.extend_from_slice(&[0; 6]); // comment, disk, internal attributes
        out.extend_from_slice(&(0o600u32 << 16).to_le_bytes());
        if style.central_zip64 {
            out.extend_from_slice(&[0xFF; 4]);
        } else {
            out.extend_from_slice(&(*offset as u32).to_le_bytes());
        }
        out.extend_from_slice(m.name.as_bytes());
        if style.central_zip64 {
            out.extend_from_slice(&1u16.to_le_bytes());
            out.extend_from_slice(&24u16.to_le_bytes());
            out.extend_from_slice(&m.uncompressed.to_le_bytes());
            out.extend_from_slice(&(m.raw.len() as u64).to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
    }
    let dir_size = out.len() as u64 - dir_offset;
    let count = count.unwrap_or(entries.len() as u64);
    if style.eocd64 {
        let record = out.len() as u64;
        out.extend_from_slice(&0x0606_4b50u32.to_le_bytes());
        out.extend_from_slice(&44u64.to_le_bytes());
        out.extend_from_slice(&[45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&dir_size.to_le_bytes());
        out.extend_from_slice(&dir_offset.to_le_bytes());
        out.extend_from_slice(&0x0706_4b50u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&record.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes());
    }
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    let (count16, size32, offset32) = if style.eocd64 {
        (0xFFFF, 0xFFFF_FFFF, 0xFFFF_FFFF)
    } else {
        (count.min(0xFFFF) as u16, dir_size as u32, dir_offset as u32)
    };
    out.extend_from_slice(&count16.to_le_bytes());
    out.extend_from_slice(&count16.to_le_bytes());
    out.extend_from_slice(&size32.to_le_bytes());
    out.extend_from_slice(&offset32.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn zip(members: &[Member], style: ZipStyle) -> Vec<u8> {
    let (out, offsets) = locals(members);
    let entries: Vec<(&Member, u64)> = members.iter().zip(offsets).collect();
    finish(out, &entries, style, None)
}

fn f32_npy(values: &[f32], shape: &str) -> Vec<u8> {
    npy(&dict("<f4", false, shape), &le(values, f32::to_le_bytes))
}

// ------------------------------------------------------------------- .npy

#[test]
fn versions_one_two_three() {
    let dir = Dir::new();
    let data = le(&[1.5f32, -2.0, 3.25], f32::to_le_bytes);
    for major in 1..=3u8 {
        let path = dir.file(
            &format!("v{major}.npy"),
            &npy_v(major, &dict("<f4", false, "(3,)"), &data),
        );
        let source = zt::open(&path).unwrap();
        assert_eq!(source.format(), "npy");
        let t = source.tensor(&format!("v{major}")).unwrap();
        assert_eq!(t.shape(), &[3]);
        let part = t.data().unwrap();
        assert_eq!(part.dtype(), DType::F32);
        // The data starts at a multiple of 64: aligned, mapped, zero-copy.
        assert!(part.caps().map);
        assert_eq!(part.map().unwrap(), &data[..]);
    }
}

#[test]
fn v3_header_is_utf8_and_long_ints_are_v1_v2_only() {
    let dir = Dir::new();
    let long = "{'descr': '<u1', 'fortran_order': False, 'shape': (2L, 1L), }";
    for major in [1, 2] {
        let path = dir.file("long.npy", &npy_v(major, long, &[7, 8]));
        let source = zt::open(&path).unwrap();
        assert_eq!(source.tensor("long").unwrap().shape(), &[2, 1]);
    }
    let path = dir.file("long.npy", &npy_v(3, long, &[7, 8]));
    assert!(cites!(
        zt::open(&path),
        Err(Error::Header { .. }),
        &["npy.Header"]
    ));

    // A v3 header that is not UTF-8.
    let mut bad = npy_v(3, &dict("<u1", false, "(1,)"), &[1]);
    let nl = bad.iter().position(|&b| b == b'\n').unwrap();
    bad[nl - 1] = 0xFF;
    let path = dir.file("bad3.npy", &bad);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Header { .. }),
        &["npy.Header"]
    ));
}

#[test]
fn every_dtype() {
    let cases: &[(&str, DType)] = &[
        ("|b1", DType::Bool),
        ("|i1", DType::I8),
        ("<i2", DType::I16),
        ("<i4", DType::I32),
        ("<i8", DType::I64),
        ("|u1", DType::U8),
        ("<u2", DType::U16),
        ("<u4", DType::U32),
        ("<u8", DType::U64),
        ("<f2", DType::F16),
        ("<f4", DType::F32),
        ("<f8", DType::F64),
        ("<c8", DType::Complex64),
        ("<c16", DType::Complex128),
        ("=f4", DType::F32),
        ("|u2", DType::U16),
    ];
    let dir = Dir::new();
    for &(descr, dtype) in cases {
        let size = dtype.size().unwrap() as usize;
        let data: Vec<u8> = (0..3 * size)
            .map(|i| {
                if dtype == DType::Bool {
                    (i % 2) as u8
                } else {
                    i as u8
                }
            })
            .collect();
        let path = dir.file("a.npy", &npy(&dict(descr, false, "(3,)"), &data));
        let source = zt::open(&path).unwrap();
        let part = source.tensor("a").unwrap().data().unwrap();
        assert_eq!(part.dtype(), dtype, "{descr}");
        assert_eq!(part.shape(), &[3]);
        assert_eq!(&*part.bytes().unwrap(), &data[..], "{descr}");
        assert!(part.caps().locate, "{descr}");
    }
}

#[test]
fn unsupported_dtypes_are_refused() {
    let dir = Dir::new();
    // `|O` data is a pickle; the file is refused before any of it is read.
    let object = npy(&dict("|O", false, "(2,)"), b"\x80\x04\x95garbage pickle");
    let path = dir.file("obj.npy", &object);
    assert!(matches!(
        zt::open(&path),
        Err(Error::UnsupportedDType { .. })
    ));
    // Dtypes numpy reads without unpickling are read as their bytes, for
    // the Python side to view through the same numpy dtype: layout
    // `npy.descr/1`, one u8 part of `shape + [itemsize]`.
    for (descr, itemsize) in [
        ("<U10", 40u64),
        ("|S5", 5),
        ("<M8[ns]", 8),
        ("<m8[s]", 8),
        ("<f16", 16),
        ("|V16", 16),
        ("<c32", 32),
    ] {
        let data = vec![7u8; itemsize as usize];
        let path = dir.file("x.npy", &npy(&dict(descr, false, "()"), &data));
        let src = zt::open(&path).unwrap_or_else(|e| panic!("{descr}: {e}"));
        let t = src.tensor("x").unwrap();
        assert_eq!(t.layout(), zt::formats::npy::RECORD_LAYOUT, "{descr}");
        assert_eq!(t.shape(), &[] as &[u64]);
        let part = t.data().unwrap();
        assert_eq!(part.shape(), &[itemsize]);
        assert_eq!(&*part.bytes().unwrap(), &data[..]);
        let attr = |k: &str| {
            t.attributes()
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(attr("descr"), Some(zt::Value::Str(format!("'{descr}'"))));
        assert_eq!(attr("itemsize"), Some(zt::Value::Int(itemsize as i64)));
    }
    // A descr zt cannot size (and numpy would not read) is still refused.
    for descr in ["<c7", "<U", "|X4", "<M8[", "<i3"] {
        let path = dir.file("y.npy", &npy(&dict(descr, false, "()"), &[0; 16]));
        assert!(
            matches!(zt::open(&path), Err(Error::UnsupportedDType { .. })),
            "{descr}"
        );
    }
    // Structured, Fortran order: the rows are records, through strides.
    let structured =
        "{'descr': [('a', '<i4'), ('b', '<f8')], 'fortran_order': True, 'shape': (2, 2), }";
    let data: Vec<u8> = (0..48).collect();
    let path = dir.file("s.npy", &npy(structured, &data));
    let src = zt::open(&path).unwrap();
    let part = src.tensor("s").unwrap().data().unwrap();
    assert_eq!(part.shape(), &[2, 2, 12]);
    // Element (0, 1) is the third record in Fortran order.
    assert_eq!(&part.bytes().unwrap()[12..24], &data[24..36]);
    // A record size that disagrees with the data is refused.
    let path = dir.file("short.npy", &npy(structured, &data[..40]));
    assert!(zt::open(&path).is_err());
}

#[test]
fn rank_zero_and_empty() {
    let dir = Dir::new();
    let path = dir.file(
        "scalar.npy",
        &npy(&dict("<f8", false, "()"), &2.5f64.to_le_bytes()),
    );
    let source = zt::open(&path).unwrap();
    let t = source.tensor("scalar").unwrap();
    assert_eq!(t.shape(), &[] as &[u64]);
    assert_eq!(only_bytes(&source, "scalar").unwrap(), 2.5f64.to_le_bytes());

    let path = dir.file("empty.npy", &npy(&dict("<f4", false, "(0, 3)"), &[]));
    let source = zt::open(&path).unwrap();
    assert_eq!(source.tensor("empty").unwrap().shape(), &[0, 3]);
    assert!(only_bytes(&source, "empty").unwrap().is_empty());

    let path = dir.file("fempty.npy", &npy(&dict("<f4", true, "(3, 0)"), &[]));
    let source = zt::open(&path).unwrap();
    assert!(only_bytes(&source, "fempty").unwrap().is_empty());
}

#[test]
fn fortran_order_is_strided_not_transposed() {
    let dir = Dir::new();
    // [[0, 1, 2], [3, 4, 5]] stored column-major.
    let path = dir.file(
        "f.npy",
        &npy(&dict("|u1", true, "(2, 3)"), &[0, 3, 1, 4, 2, 5]),
    );
    let source = zt::open(&path).unwrap();
    let t = source.tensor("f").unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    let part = t.data().unwrap();
    assert_eq!(part.strides(), vec![1, 2]);
    assert!(!part.is_contiguous());
    assert_eq!(&*part.storage_bytes().unwrap(), &[0, 3, 1, 4, 2, 5]);
    assert_eq!(&*part.bytes().unwrap(), &[0, 1, 2, 3, 4, 5]);
    assert!(part.caps().map);

    // Wider elements and rank 3.
    let values: Vec<i32> = (0..24).collect();
    // Column-major storage of a (2, 3, 4) array whose C-order values are 0..24.
    let mut stored_f = Vec::new();
    for k in 0..4 {
        for j in 0..3 {
            for i in 0..2 {
                stored_f.push(values[i * 12 + j * 4 + k]);
            }
        }
    }
    let path = dir.file(
        "f3.npy",
        &npy(
            &dict("<i4", true, "(2, 3, 4)"),
            &le(&stored_f, i32::to_le_bytes),
        ),
    );
    let source = zt::open(&path).unwrap();
    let part = source.tensor("f3").unwrap().data().unwrap();
    assert_eq!(part.strides(), vec![1, 2, 6]);
    assert_eq!(&*part.bytes().unwrap(), &le(&values, i32::to_le_bytes)[..]);
}

#[test]
fn big_endian_is_swapped_never_mapped() {
    let dir = Dir::new();
    let values = [1i32, 2, -3, 0x0102_0304];
    let path = dir.file(
        "be.npy",
        &npy(&dict(">i4", false, "(4,)"), &le(&values, i32::to_be_bytes)),
    );
    let source = zt::open(&path).unwrap();
    let part = source.tensor("be").unwrap().data().unwrap();
    assert_eq!(part.dtype(), DType::I32);
    assert!(!part.caps().map);
    assert!(cites!(
        part.map(),
        Err(Error::Unsupported { .. }),
        &["access.Map"]
    ));
    assert_eq!(&*part.bytes().unwrap(), &le(&values, i32::to_le_bytes)[..]);

    // Complex numbers swap each half.
    let re_im = [1.5f32, -2.0, 3.0, 4.0];
    let path = dir.file(
        "c.npy",
        &npy(&dict(">c8", false, "(2,)"), &le(&re_im, f32::to_be_bytes)),
    );
    let source = zt::open(&path).unwrap();
    assert_eq!(
        only_bytes(&source, "c").unwrap(),
        le(&re_im, f32::to_le_bytes)
    );

    // Big-endian and Fortran order together.
    let stored_f = [0i16, 3, 1, 4, 2, 5];
    let path = dir.file(
        "bef.npy",
        &npy(
            &dict(">i2", true, "(2, 3)"),
            &le(&stored_f, i16::to_be_bytes),
        ),
    );
    let source = zt::open(&path).unwrap();
    assert_eq!(
        only_bytes(&source, "bef").unwrap(),
        le(&[0i16, 1, 2, 3, 4, 5], i16::to_le_bytes)
    );

    // One-byte big-endian types need no swap and stay mapped.
    let path = dir.file("b1.npy", &npy(&dict(">u1", false, "(2,)"), &[9, 8]));
    let source = zt::open(&path).unwrap();
    let part = source.tensor("b1").unwrap().data().unwrap();
    assert!(part.caps().map);
    assert_eq!(part.map().unwrap(), &[9, 8]);
}

#[test]
fn positional_store_reads_the_same() {
    let dir = Dir::new();
    let values = [1.0f64, 2.0];
    let path = dir.file(
        "p.npy",
        &npy(&dict(">f8", false, "(2,)"), &le(&values, f64::to_be_bytes)),
    );
    let source = zt::open_with(
        &path,
        &OpenOptions {
            map: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        only_bytes(&source, "p").unwrap(),
        le(&values, f64::to_le_bytes)
    );
}

// ---------------------------------------------------------- hostile .npy

#[test]
fn truncated_and_overlong_data() {
    let dir = Dir::new();
    let full = f32_npy(&[1.0, 2.0, 3.0], "(3,)");
    let path = dir.file("short.npy", &full[..full.len() - 1]);
    assert!(matches!(zt::open(&path), Err(Error::Truncated { .. })));

    let mut long = full.clone();
    long.push(0);
    let path = dir.file("long.npy", &long);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Range { .. }),
        &["npy.Size"]
    ));
}

#[test]
fn header_past_end_of_file() {
    let dir = Dir::new();
    let full = f32_npy(&[1.0], "(1,)");
    // Cut inside the header: the sniff refuses it, the plugin says why.
    let path = dir.file("cut.npy", &full[..40]);
    assert!(matches!(zt::open(&path), Err(Error::UnknownFormat { .. })));
    assert!(matches!(
        plugin_open(&Npy, &path, &Limits::default()),
        Err(Error::Truncated { .. })
    ));
    for len in [0, 5, 9, 11] {
        let path = dir.file("tiny.npy", &npy_v(2, "{}", &[])[..len]);
        assert!(
            matches!(
                plugin_open(&Npy, &path, &Limits::default()),
                Err(Error::Truncated { .. })
            ),
            "{len}"
        );
    }
    // A declared header length of 1 MB in a small v2 file.
    let mut huge = npy_v(2, &dict("<f4", false, "()"), &[0; 4]);
    huge[8..12].copy_from_slice(&1_000_000u32.to_le_bytes());
    let path = dir.file("huge.npy", &huge);
    assert!(matches!(
        plugin_open(&Npy, &path, &Limits::default()),
        Err(Error::Truncated { .. })
    ));
    // ... and of 4 GiB, past `Limits::header_bytes`: refused before reading.
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let path = dir.file("huge.npy", &huge);
    assert!(matches!(
        plugin_open(&Npy, &path, &Limits::default()),
        Err(Error::Limit { .. })
    ));
}

#[test]
fn bad_headers() {
    let dir = Dir::new();
    let bad = [
        "{'descr': '<f4', 'fortran_order': False}",
        "{'descr': '<f4', 'shape': (1,)}",
        "{'fortran_order': False, 'shape': (1,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': [1]}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1.0,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
        "{'descr': '<f4', 'fortran_order': 'no', 'shape': (1,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} ; import os",
        "{'descr': '<f4', 'fortran_order': False, 'shape': __import__('os')}",
        "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}",
    ];
    for text in bad {
        let path = dir.file("bad.npy", &npy(text, &[0; 4]));
        assert!(
            cites!(zt::open(&path), Err(Error::Header { .. }), &["npy.Header"]),
            "{text}: {:?}",
            zt::open(&path).err()
        );
    }
    // Not a dict at all (the sniff wants `{`, the plugin says why).
    let path = dir.file("list.npy", &npy("[1, 2, 3]", &[]));
    assert!(matches!(zt::open(&path), Err(Error::UnknownFormat { .. })));
    assert!(cites!(
        plugin_open(&Npy, &path, &Limits::default()),
        Err(Error::Header { .. }),
        &["npy.Header"]
    ));
    // Unknown versions.
    for (major, minor) in [(0u8, 0u8), (4, 0), (1, 1)] {
        let mut bytes = f32_npy(&[1.0], "(1,)");
        bytes[6] = major;
        bytes[7] = minor;
        let path = dir.file("ver.npy", &bytes);
        assert!(cites!(
            plugin_open(&Npy, &path, &Limits::default()),
            Err(Error::Header { .. }),
            &["npy.Version"]
        ));
    }
}

#[test]
fn shape_product_overflow() {
    let dir = Dir::new();
    let path = dir.file(
        "big.npy",
        &npy(&dict("<f8", false, "(4294967296, 4294967296, 2)"), &[0; 8]),
    );
    assert!(matches!(zt::open(&path), Err(Error::Overflow { .. })));
    // Elements fit, bytes do not.
    let path = dir.file(
        "big2.npy",
        &npy(&dict("<c16", false, "(18446744073709551615,)"), &[0; 8]),
    );
    assert!(matches!(zt::open(&path), Err(Error::Overflow { .. })));
}

#[test]
fn limits_apply() {
    let dir = Dir::new();
    let path = dir.file("a.npy", &f32_npy(&[1.0; 6], "(1, 2, 3)"));
    let rank = Limits {
        rank: 2,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&path, rank),
        Err(Error::Limit { .. })
    ));
    let header = Limits {
        header_bytes: 63,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&path, header),
        Err(Error::Limit { .. })
    ));
    let depth = Limits {
        depth: 1,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&path, depth),
        Err(Error::Limit { .. })
    ));
}

// ------------------------------------------------------------------- .npz

fn npz_fixture(style: ZipStyle, deflate_second: bool) -> Vec<u8> {
    let a = f32_npy(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "(2, 3)");
    let b = npy(
        &dict(">i4", false, "(2,)"),
        &le(&[7i32, -8], i32::to_be_bytes),
    );
    let c = npy(&dict("|u1", true, "(2, 2)"), &[0, 2, 1, 3]);
    let second = if deflate_second {
        deflated("model/b.npy", &b)
    } else {
        stored("model/b.npy", &b)
    };
    zip(
        &[
            stored("arr_0.npy", &a),
            second,
            deflated("c.npy", &c),
            stored("README.txt", b"not an array"),
        ],
        style,
    )
}

fn check_npz_fixture(source: &Source) {
    assert_eq!(source.format(), "npz");
    let names: Vec<&str> = source.tensors().map(|t| t.name()).collect();
    assert_eq!(names, ["arr_0", "model/b", "c"]);
    let a = source.tensor("arr_0").unwrap();
    assert_eq!(a.shape(), &[2, 3]);
    let part = a.data().unwrap();
    assert!(part.caps().locate);
    assert_eq!(
        &*part.bytes().unwrap(),
        &le(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], f32::to_le_bytes)[..]
    );
    assert_eq!(
        only_bytes(source, "model/b").unwrap(),
        le(&[7i32, -8], i32::to_le_bytes)
    );
    let c = source.tensor("c").unwrap().data().unwrap();
    assert!(!c.caps().map);
    assert_eq!(c.strides(), vec![1, 2]);
    assert_eq!(&*c.bytes().unwrap(), &[0, 1, 2, 3]);
}

#[test]
fn npz_stored_and_deflated_members() {
    let dir = Dir::new();
    for (i, style) in [
        ZipStyle::default(),
        ZipStyle {
            central_zip64: true,
            eocd64: false,
        },
        ZipStyle {
            central_zip64: true,
            eocd64: true,
        },
    ]
    .into_iter()
    .enumerate()
    {
        for deflate_second in [false, true] {
            let path = dir.file(&format!("f{i}.npz"), &npz_fixture(style, deflate_second));
            let source = zt::open(&path).unwrap();
            check_npz_fixture(&source);
            let positional = zt::open_with(
                &path,
                &OpenOptions {
                    map: false,
                    ..OpenOptions::default()
                },
            )
            .unwrap();
            check_npz_fixture(&positional);
        }
    }
}

#[test]
fn npz_deflated_big_member() {
    // Larger than flate2's internal buffers, so inflating takes many reads.
    let values: Vec<f64> = (0..100_000).map(|i| (i as f64).sin()).collect();
    let bytes = npy(
        &dict("<f8", false, "(100000,)"),
        &le(&values, f64::to_le_bytes),
    );
    let dir = Dir::new();
    let path = dir.file(
        "big.npz",
        &zip(&[deflated("x.npy", &bytes)], ZipStyle::default()),
    );
    let source = zt::open(&path).unwrap();
    assert_eq!(
        only_bytes(&source, "x").unwrap(),
        le(&values, f64::to_le_bytes)
    );
}

#[test]
fn npz_empty_archive() {
    let dir = Dir::new();
    let path = dir.file("empty.npz", &zip(&[], ZipStyle::default()));
    let source = zt::open(&path).unwrap();
    assert_eq!(source.format(), "npz");
    assert_eq!(source.tensors().count(), 0);
}

#[test]
fn npz_comment_and_utf8_names() {
    let dir = Dir::new();
    let a = f32_npy(&[1.0], "(1,)");
    let mut m = stored("gewicht_ä.npy", &a);
    m.flags = 0x0800;
    let mut bytes = zip(&[m], ZipStyle::default());
    // A zip comment after the end record.
    let n = bytes.len();
    bytes[n - 2..].copy_from_slice(&5u16.to_le_bytes());
    bytes.extend_from_slice(b"hello");
    let path = dir.file("u.npz", &bytes);
    let source = zt::open(&path).unwrap();
    assert_eq!(
        only_bytes(&source, "gewicht_ä").unwrap(),
        1.0f32.to_le_bytes()
    );
}

// ---------------------------------------------------------- hostile .npz

#[test]
fn npz_huge_declared_entry_count() {
    let dir = Dir::new();
    let a = stored("a.npy", &f32_npy(&[1.0], "(1,)"));
    let (body, offsets) = locals(std::slice::from_ref(&a));
    // zip64: 2^60 entries declared.
    let bytes = finish(
        body.clone(),
        &[(&a, offsets[0])],
        ZipStyle {
            central_zip64: false,
            eocd64: true,
        },
        Some(1 << 60),
    );
    let path = dir.file("huge.npz", &bytes);
    assert!(matches!(zt::open(&path), Err(Error::Limit { .. })));
    // Within the limit but more than the directory can hold.
    let bytes = finish(body, &[(&a, offsets[0])], ZipStyle::default(), Some(0xFFFF));
    let path = dir.file("many.npz", &bytes);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Header { .. }),
        &["zip.Directory"]
    ));
    // Fewer declared than present.
    let bytes = zip(
        &[
            stored("a.npy", &f32_npy(&[1.0], "(1,)")),
            stored("b.npy", &f32_npy(&[1.0], "(1,)")),
        ],
        ZipStyle::default(),
    );
    let mut patched = bytes.clone();
    let n = patched.len();
    patched[n - 12..n - 10].copy_from_slice(&1u16.to_le_bytes());
    patched[n - 14..n - 12].copy_from_slice(&1u16.to_le_bytes());
    let path = dir.file("fewer.npz", &patched);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Header { .. }),
        &["zip.Directory"]
    ));
}

#[test]
fn npz_limits() {
    let dir = Dir::new();
    let path = dir.file("f.npz", &npz_fixture(ZipStyle::default(), true));
    let tensors = Limits {
        tensors: 2,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&path, tensors),
        Err(Error::Limit { .. })
    ));
    let entries = Limits {
        entries: 3,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&path, entries),
        Err(Error::Limit { .. })
    ));
    let names = Limits {
        string_bytes: 8,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&path, names),
        Err(Error::Limit { .. })
    ));
}

#[test]
fn npz_overlapping_members() {
    let dir = Dir::new();
    let a = stored("a.npy", &f32_npy(&[1.0], "(1,)"));
    let (body, offsets) = locals(std::slice::from_ref(&a));
    // Two directory entries sharing one local header.
    let bytes = finish(
        body,
        &[(&a, offsets[0]), (&a, offsets[0])],
        ZipStyle::default(),
        None,
    );
    let path = dir.file("dup.npz", &bytes);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Range { .. }),
        &["zip.Bounds"]
    ));

    // A member whose declared size runs over the next member.
    let a = stored("a.npy", &f32_npy(&[1.0], "(1,)"));
    let b = stored("b.npy", &f32_npy(&[2.0], "(1,)"));
    let (body, offsets) = locals(&[a, b]);
    let a_long = Member {
        raw: vec![0; 200],
        uncompressed: 200,
        ..stored("a.npy", &f32_npy(&[1.0], "(1,)"))
    };
    let b = stored("b.npy", &f32_npy(&[2.0], "(1,)"));
    let bytes = finish(
        body,
        &[(&a_long, offsets[0]), (&b, offsets[1])],
        ZipStyle::default(),
        None,
    );
    let path = dir.file("over.npz", &bytes);
    let r = zt::open(&path);
    assert!(
        cites!(r, Err(Error::Range { .. }), &["zip.Bounds"]),
        "{:?}",
        r.err()
    );

    // A member whose data runs into the central directory.
    let a = stored("a.npy", &f32_npy(&[1.0], "(1,)"));
    let (body, offsets) = locals(std::slice::from_ref(&a));
    let a_long = Member {
        raw: vec![0; 1000],
        uncompressed: 1000,
        ..stored("a.npy", &f32_npy(&[1.0], "(1,)"))
    };
    let bytes = finish(body, &[(&a_long, offsets[0])], ZipStyle::default(), None);
    let path = dir.file("into.npz", &bytes);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Range { .. }),
        &["zip.Bounds"]
    ));
}

#[test]
fn npz_structural_errors() {
    let dir = Dir::new();
    let good = npz_fixture(ZipStyle::default(), true);
    // No end record.
    let path = dir.file("noend.npz", &good[..good.len() - 22]);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Header { .. }),
        &["zip.Directory"]
    ));
    // A local name that disagrees with the directory.
    let mut renamed = good.clone();
    renamed[30] = b'X';
    let path = dir.file("renamed.npz", &renamed);
    // (The first name, "Xrr_0.npy", still ends in .npy, so it sniffs as npz.)
    assert!(cites!(
        zt::open(&path),
        Err(Error::Header { .. }),
        &["zip.Entry"]
    ));
    // A stored member whose sizes disagree.
    let mut m = stored("a.npy", &f32_npy(&[1.0], "(1,)"));
    m.uncompressed += 1;
    let path = dir.file("sizes.npz", &zip(&[m], ZipStyle::default()));
    assert!(cites!(
        zt::open(&path),
        Err(Error::Header { .. }),
        &["npz.Member"]
    ));
    // A member that is not an npy.
    let path = dir.file(
        "notnpy.npz",
        &zip(
            &[stored("a.npy", b"PK not numpy at all")],
            ZipStyle::default(),
        ),
    );
    assert!(cites!(
        zt::open(&path),
        Err(Error::Header { .. }),
        &["npy.Magic"]
    ));
}

#[test]
fn npz_unsupported_members() {
    let dir = Dir::new();
    let a = f32_npy(&[1.0], "(1,)");
    let mut enc = stored("a.npy", &a);
    enc.flags = 1;
    let path = dir.file("enc.npz", &zip(&[enc], ZipStyle::default()));
    assert!(cites!(
        zt::open(&path),
        Err(Error::Unsupported { .. }),
        &["npz.Member"]
    ));
    let mut bz = stored("a.npy", &a);
    bz.method = 12;
    let path = dir.file("bz.npz", &zip(&[bz], ZipStyle::default()));
    assert!(cites!(
        zt::open(&path),
        Err(Error::Unsupported { .. }),
        &["npz.Member"]
    ));
    // The same in a member numpy would ignore is no error.
    let mut other = stored("notes.txt", b"x");
    other.method = 12;
    let path = dir.file(
        "ok.npz",
        &zip(&[stored("a.npy", &a), other], ZipStyle::default()),
    );
    assert_eq!(zt::open(&path).unwrap().tensors().count(), 1);
    // An object array inside an npz is listed as skipped; the rest reads.
    let obj = npy(&dict("|O", false, "(1,)"), b"\x80\x04.");
    let path = dir.file(
        "obj.npz",
        &zip(
            &[deflated("o.npy", &obj), stored("a.npy", &a)],
            ZipStyle::default(),
        ),
    );
    let src = zt::open(&path).unwrap();
    assert_eq!(src.names().collect::<Vec<_>>(), ["a"]);
    let skipped = src
        .attributes()
        .iter()
        .find(|(k, _)| k == "npz.skipped")
        .map(|(_, v)| v.clone());
    let Some(zt::Value::List(entries)) = skipped else {
        panic!("no npz.skipped: {:?}", src.attributes())
    };
    assert!(
        matches!(&entries[..], [zt::Value::Map(m)] if m[0] == ("name".into(), zt::Value::Str("o".into())))
    );
}

#[test]
fn npz_bad_crc() {
    let dir = Dir::new();
    let mut m = deflated("a.npy", &f32_npy(&[1.0, 2.0], "(2,)"));
    m.crc ^= 1;
    let path = dir.file("crc.npz", &zip(&[m], ZipStyle::default()));
    let source = zt::open(&path).unwrap();
    assert!(cites!(
        only_bytes(&source, "a"),
        Err(Error::Decode { .. }),
        &["npz.Inflate"]
    ));
}

#[test]
fn npz_corrupt_and_short_deflate_streams() {
    let dir = Dir::new();
    let bytes = f32_npy(&[1.0; 64], "(64,)");
    // The stream ends before the data does.
    let mut short = deflated("a.npy", &bytes[..bytes.len() - 8]);
    short.uncompressed = bytes.len() as u64;
    let path = dir.file("short.npz", &zip(&[short], ZipStyle::default()));
    let source = zt::open(&path).unwrap();
    assert!(cites!(
        only_bytes(&source, "a"),
        Err(Error::Decode { .. }),
        &["npz.Inflate"]
    ));
    // Garbage after a valid header chunk.
    let mut raw = sync_chunk(&bytes[..128]);
    raw.extend_from_slice(&[0xFF; 64]);
    let m = Member {
        raw,
        ..deflated("a.npy", &bytes)
    };
    let path = dir.file("garbage.npz", &zip(&[m], ZipStyle::default()));
    // The inflater decodes ahead into its window, so the garbage may be
    // found while reading the header or while reading the data.
    let r = zt::open(&path).and_then(|s| only_bytes(&s, "a"));
    assert!(cites!(r, Err(Error::Decode { .. }), &["npz.Inflate"]));
    // Garbage from the start: the header cannot be inflated.
    let m = Member {
        raw: vec![0xFF; 64],
        ..deflated("a.npy", &bytes)
    };
    let path = dir.file("garbage2.npz", &zip(&[m], ZipStyle::default()));
    assert!(cites!(
        zt::open(&path),
        Err(Error::Decode { .. }),
        &["npz.Inflate"]
    ));
}

/// Raw deflate of `bytes` as non-final blocks ending on a byte boundary
/// (a sync flush), so such chunks can be concatenated into one stream.
fn sync_chunk(bytes: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::best(), false);
    let mut out = Vec::with_capacity(bytes.len() + 64);
    c.compress_vec(bytes, &mut out, FlushCompress::Sync)
        .unwrap();
    assert_eq!(c.total_in(), bytes.len() as u64);
    out
}

/// The final (empty) block that ends a stream of sync chunks.
fn final_block() -> Vec<u8> {
    let mut c = Compress::new(Compression::best(), false);
    let mut out = Vec::with_capacity(64);
    c.compress_vec(&[], &mut out, FlushCompress::Finish)
        .unwrap();
    out
}

/// A deflate stream of `header` followed by `mib` MiB of zeros, built by
/// repeating one compressed MiB (a ~1000:1 bomb).
fn zero_bomb(header: &[u8], mib: usize) -> Vec<u8> {
    let mut out = sync_chunk(header);
    let zeros = sync_chunk(&vec![0u8; 1 << 20]);
    for _ in 0..mib {
        out.extend_from_slice(&zeros);
    }
    out.extend_from_slice(&final_block());
    out
}

#[test]
fn deflate_bomb_declaring_a_small_size() {
    let dir = Dir::new();
    // The header and zip agree on 16 bytes; the stream inflates to 50 MiB.
    let header = npy(&dict("|u1", false, "(16,)"), &[]);
    let mut member_bytes = header.clone();
    member_bytes.extend_from_slice(&[0; 16]);
    let m = Member {
        raw: zero_bomb(&header, 50),
        ..stored("bomb.npy", &member_bytes)
    };
    let m = Member { method: 8, ..m };
    assert!(m.raw.len() < 200_000);
    let path = dir.file("bomb.npz", &zip(&[m], ZipStyle::default()));
    let source = zt::open(&path).unwrap();
    assert!(cites!(
        only_bytes(&source, "bomb"),
        Err(Error::Decode { .. }),
        &["npz.Inflate"]
    ));

    // The zip declares 16 data bytes but the header 50 MiB: refused at open.
    let big_header = npy(&dict("|u1", false, "(52428800,)"), &[]);
    let m = Member {
        raw: zero_bomb(&big_header, 50),
        method: 8,
        ..stored("bomb.npy", &member_bytes)
    };
    let path = dir.file("bomb2.npz", &zip(&[m], ZipStyle::default()));
    assert!(matches!(zt::open(&path), Err(Error::Truncated { .. })));
}

#[test]
fn deflate_bomb_declaring_a_huge_size() {
    let dir = Dir::new();
    let header = npy(&dict("|u1", false, "(52428800,)"), &[]);
    let m = Member {
        name: "bomb.npy".into(),
        method: 8,
        flags: 0,
        raw: zero_bomb(&header, 50),
        uncompressed: header.len() as u64 + (50 << 20),
        crc: 0,
    };
    let path = dir.file("bomb.npz", &zip(&[m], ZipStyle::default()));
    let small = Limits {
        decoded_bytes: 1 << 20,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&path, small),
        Err(Error::Limit { .. })
    ));
    let total = Limits {
        total_decoded_bytes: 1 << 20,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&path, total),
        Err(Error::Limit { .. })
    ));
}

#[test]
fn deflate_member_declaring_more_than_it_holds() {
    // Header and zip agree on 1 GiB, the stream holds 16 bytes: decoding
    // fails after inflating what is there, without first allocating 1 GiB.
    let dir = Dir::new();
    let header = npy(&dict("|u1", false, "(1073741824,)"), &[]);
    let mut content = header.clone();
    content.extend_from_slice(&[0; 16]);
    let m = Member {
        uncompressed: header.len() as u64 + (1 << 30),
        ..deflated("liar.npy", &content)
    };
    let path = dir.file("liar.npz", &zip(&[m], ZipStyle::default()));
    let source = zt::open(&path).unwrap();
    assert!(cites!(
        only_bytes(&source, "liar"),
        Err(Error::Decode { .. }),
        &["npz.Inflate"]
    ));
}

// ------------------------------------------------------------------ sniff

#[test]
fn detection() {
    let dir = Dir::new();
    let npy_path = dir.file("x.bin", &f32_npy(&[1.0], "(1,)"));
    assert_eq!(zt::detect(&npy_path).unwrap(), "npy");
    let npz_path = dir.file("x.zip", &npz_fixture(ZipStyle::default(), true));
    assert_eq!(zt::detect(&npz_path).unwrap(), "npz");
    // A PyTorch zip is not an npz, even with .npy members later on.
    let torch = zip(
        &[
            stored("archive/data.pkl", b"\x80\x02}q\x00."),
            stored("archive/w.npy", &f32_npy(&[1.0], "(1,)")),
        ],
        ZipStyle::default(),
    );
    let path = dir.file("model.pt", &torch);
    assert_eq!(zt::detect(&path).unwrap(), "pt");
    // An empty archive is an npz only by its extension.
    let empty = zip(&[], ZipStyle::default());
    assert_eq!(zt::detect(dir.file("e.npz", &empty)).unwrap(), "npz");
    assert!(zt::detect(dir.file("e.zip", &empty)).is_err());
}

// ----------------------------------------------------------------- writer

fn sample(dtype: DType, n: usize) -> Vec<u8> {
    let size = dtype.size().unwrap() as usize;
    (0..n * size)
        .map(|i| {
            if dtype == DType::Bool {
                (i % 2) as u8
            } else {
                (i * 7) as u8
            }
        })
        .collect()
}

#[test]
fn write_npy_matches_numpy_bytes() {
    let dir = Dir::new();
    let path = dir.path("w.npy");
    let data = le(&[0.0f32; 6], f32::to_le_bytes);
    let n = write_npy(
        &path,
        &TensorIn {
            name: "ignored",
            dtype: DType::F32,
            shape: &[2, 3],
            data: &data,
        },
    )
    .unwrap();
    // np.save(np.zeros((2, 3), np.float32)) with numpy 2.x.
    let mut expected =
        b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
            .to_vec();
    expected.resize(127, b' ');
    expected.push(b'\n');
    expected.extend_from_slice(&data);
    assert_eq!(std::fs::read(&path).unwrap(), expected);
    assert_eq!(n, expected.len() as u64);
}

#[test]
fn write_npy_round_trip_every_dtype() {
    let dir = Dir::new();
    let path = dir.path("t.npy");
    for dtype in DType::ALL {
        for shape in [&[][..], &[5][..], &[2, 3][..], &[0, 4][..]] {
            let n: u64 = shape.iter().product();
            let size = dtype.size().unwrap_or(1) as usize;
            let data = if dtype.size().is_some() {
                sample(dtype, n as usize)
            } else {
                vec![0; n as usize * size]
            };
            let t = TensorIn {
                name: "t",
                dtype,
                shape,
                data: &data,
            };
            let result = write_npy(&path, &t);
            if zt::formats::npy::descr_for(dtype).is_none() {
                assert!(
                    cites!(result, Err(Error::Write { .. }), &["write.DType"]),
                    "{dtype}"
                );
                continue;
            }
            result.unwrap();
            let source = zt::open(&path).unwrap();
            let part = source.tensor("t").unwrap().data().unwrap();
            assert_eq!(part.dtype(), dtype);
            assert_eq!(part.shape(), shape);
            assert!(part.caps().map, "{dtype}");
            assert_eq!(&*part.bytes().unwrap(), &data[..]);
        }
    }
}

#[test]
fn write_refuses_bad_input() {
    let dir = Dir::new();
    let path = dir.path("bad.npy");
    let t = TensorIn {
        name: "x",
        dtype: DType::F32,
        shape: &[3],
        data: &[0; 8],
    };
    assert!(cites!(
        write_npy(&path, &t),
        Err(Error::Write { .. }),
        &["write.Size"]
    ));
    assert!(!path.exists());
    let bf16 = TensorIn {
        name: "x",
        dtype: DType::BF16,
        shape: &[1],
        data: &[0; 2],
    };
    assert!(cites!(
        write_npy(&path, &bf16),
        Err(Error::Write { .. }),
        &["write.DType"]
    ));
    let ok = TensorIn {
        name: "x",
        dtype: DType::U8,
        shape: &[1],
        data: &[1],
    };
    let npz = dir.path("bad.npz");
    assert!(matches!(
        write_npz(&npz, &[ok, ok]),
        Err(Error::DuplicateName { .. })
    ));
    let bf16 = TensorIn { name: "y", ..bf16 };
    assert!(cites!(
        write_npz(&npz, &[ok, bf16]),
        Err(Error::Write { .. }),
        &["write.DType"]
    ));
    assert!(!npz.exists());
}

#[test]
fn write_npz_round_trip() {
    let dir = Dir::new();
    let path = dir.path("w.npz");
    let a = sample(DType::F32, 6);
    let b = sample(DType::I64, 1);
    let c = sample(DType::Complex128, 3);
    let tensors = [
        TensorIn {
            name: "arr_0",
            dtype: DType::F32,
            shape: &[2, 3],
            data: &a,
        },
        TensorIn {
            name: "model/layer.0/b",
            dtype: DType::I64,
            shape: &[],
            data: &b,
        },
        TensorIn {
            name: "ünïcode",
            dtype: DType::Complex128,
            shape: &[3],
            data: &c,
        },
        TensorIn {
            name: "empty",
            dtype: DType::Bool,
            shape: &[0],
            data: &[],
        },
    ];
    let written = write_npz(&path, &tensors).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(written, bytes.len() as u64);
    // numpy's layout: the first local header has 0xFFFFFFFF sizes and a
    // 20-byte zip64 extra field.
    assert_eq!(&bytes[..4], b"PK\x03\x04");
    assert_eq!(&bytes[18..26], &[0xFF; 8]);
    assert_eq!(u16::from_le_bytes([bytes[28], bytes[29]]), 20);
    assert_eq!(&bytes[30..39], b"arr_0.npy");

    for map in [true, false] {
        let source = zt::open_with(
            &path,
            &OpenOptions {
                map,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        let names: Vec<&str> = source.tensors().map(|t| t.name()).collect();
        assert_eq!(names, ["arr_0", "model/layer.0/b", "ünïcode", "empty"]);
        for t in &tensors {
            let got = source.tensor(t.name).unwrap();
            assert_eq!(got.shape(), t.shape);
            let part = got.data().unwrap();
            assert_eq!(part.dtype(), t.dtype);
            assert_eq!(&*part.bytes().unwrap(), t.data);
        }
    }
    // An npz with no arrays is a valid empty archive.
    let empty = dir.path("empty.npz");
    write_npz(&empty, &[]).unwrap();
    assert_eq!(zt::open(&empty).unwrap().tensors().count(), 0);
}

#[test]
fn write_npz_many_members_uses_zip64_end_record() {
    let dir = Dir::new();
    let path = dir.path("many.npz");
    let names: Vec<String> = (0..70_000).map(|i| format!("t{i}")).collect();
    let data = [1u8];
    let tensors: Vec<TensorIn<'_>> = names
        .iter()
        .map(|n| TensorIn {
            name: n,
            dtype: DType::U8,
            shape: &[1],
            data: &data,
        })
        .collect();
    write_npz(&path, &tensors).unwrap();
    let source = zt::open(&path).unwrap();
    assert_eq!(source.tensors().count(), 70_000);
    assert_eq!(only_bytes(&source, "t69999").unwrap(), [1]);
}

// --------------------------------------------------------------- no panics

/// Open and read everything, ignoring errors: must never panic.
fn poke(path: &Path) {
    for map in [true, false] {
        let opened = zt::open_with(
            path,
            &OpenOptions {
                map,
                ..OpenOptions::default()
            },
        );
        if let Ok(source) = opened {
            for t in source.tensors() {
                let _ = t.data().and_then(|p| p.bytes().map(|b| b.len()));
            }
        }
    }
}

#[test]
fn mutated_files_never_panic() {
    let dir = Dir::new();
    let seeds = [
        ("a.npy", f32_npy(&[1.0, 2.0], "(2,)")),
        (
            "b.npy",
            npy_v(
                2,
                &dict(">i2", true, "(2, 2)"),
                &le(&[1i16, 2, 3, 4], i16::to_be_bytes),
            ),
        ),
        ("c.npz", npz_fixture(ZipStyle::default(), true)),
        (
            "d.npz",
            npz_fixture(
                ZipStyle {
                    central_zip64: true,
                    eocd64: true,
                },
                true,
            ),
        ),
    ];
    for (name, seed) in &seeds {
        for len in 0..seed.len() {
            poke(&dir.file(name, &seed[..len]));
        }
        // Every byte flipped a few ways (a stride keeps the test quick).
        for at in (0..seed.len()).step_by(3) {
            for value in [0x00, 0xFF, seed[at] ^ 0x80, seed[at].wrapping_add(1)] {
                let mut bytes = seed.clone();
                bytes[at] = value;
                poke(&dir.file(name, &bytes));
            }
        }
    }
}
