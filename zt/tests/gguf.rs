//! GGUF reading and writing on files built byte by byte here (the
//! comparisons against gguf-py itself live in tests/test_gguf.py).
//!
//! Every failure asserts the exact `Error` variant, and where it refuses
//! the input the rule it cites (`cites!`, `support/cites.rs`).

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;
#[macro_use]
#[path = "support/cites.rs"]
mod cites;

use zt::formats::gguf::{dequantize, dequantize_rows_with, Gguf, GgufWriter};
use zt::{DType, Error, Format, FormatWriter, Limits, OpenOptions, Source, Value, WriteOptions};

// ---------------------------------------------------------------- builder

/// Bytes of a GGUF file in either byte order.
#[derive(Clone)]
struct Bytes {
    big: bool,
    buf: Vec<u8>,
}

impl Bytes {
    fn new(big: bool) -> Self {
        Bytes {
            big,
            buf: Vec::new(),
        }
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        let b = if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.buf.extend_from_slice(&b);
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        let b = if self.big {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        };
        self.buf.extend_from_slice(&b);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
        self
    }
    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
}

/// One tensor info plus its data.
struct T {
    name: &'static str,
    dims: Vec<u64>, // GGUF order, innermost first
    ty: u32,
    offset: u64,
    data: Vec<u8>,
}

/// A whole file: header, KV bytes (already encoded), tensor infos, padding
/// to `align`, then each tensor's data at its offset.
fn file(big: bool, version: u32, kv_count: u64, kvs: &[u8], tensors: &[T], align: u64) -> Vec<u8> {
    let mut b = Bytes::new(big);
    b.raw(b"GGUF")
        .u32(version)
        .u64(tensors.len() as u64)
        .u64(kv_count)
        .raw(kvs);
    for t in tensors {
        b.str(t.name).u32(t.dims.len() as u32);
        for &d in &t.dims {
            b.u64(d);
        }
        b.u32(t.ty).u64(t.offset);
    }
    let start = b.buf.len().div_ceil(align as usize) * align as usize;
    b.buf.resize(start, 0);
    for t in tensors {
        let at = start + t.offset as usize;
        if b.buf.len() < at + t.data.len() {
            b.buf.resize(at + t.data.len(), 0);
        }
        b.buf[at..at + t.data.len()].copy_from_slice(&t.data);
    }
    // gguf-py pads the last tensor too.
    if !tensors.is_empty() {
        b.buf
            .resize(b.buf.len().div_ceil(align as usize) * align as usize, 0);
    }
    b.buf
}

fn f32_bytes(v: &[f32], big: bool) -> Vec<u8> {
    v.iter()
        .flat_map(|x| {
            if big {
                x.to_be_bytes()
            } else {
                x.to_le_bytes()
            }
        })
        .collect()
}

fn le(v: &[f32]) -> Vec<u8> {
    f32_bytes(v, false)
}

fn f32_tensor(name: &'static str, dims: Vec<u64>, offset: u64, big: bool) -> T {
    let n: u64 = dims.iter().product();
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
    T {
        name,
        dims,
        ty: 0,
        offset,
        data: f32_bytes(&values, big),
    }
}

/// KV bytes of every scalar type, a string array and a nested array.
fn every_kv(big: bool) -> (u64, Vec<u8>) {
    let mut b = Bytes::new(big);
    b.str("general.architecture").u32(8).str("llama");
    b.str("k.u8").u32(0).u8(200);
    b.str("k.i8").u32(1).u8(0xff);
    b.str("k.u16").u32(2);
    let v = if big {
        0xbeefu16.to_be_bytes()
    } else {
        0xbeefu16.to_le_bytes()
    };
    b.raw(&v);
    b.str("k.i16").u32(3);
    let v = if big {
        (-2i16).to_be_bytes()
    } else {
        (-2i16).to_le_bytes()
    };
    b.raw(&v);
    b.str("k.u32").u32(4).u32(4_000_000_000);
    b.str("k.i32").u32(5).u32((-7i32) as u32);
    b.str("k.f32").u32(6).u32(1.5f32.to_bits());
    b.str("k.bool").u32(7).u8(1);
    b.str("k.u64").u32(10).u64(u64::MAX);
    b.str("k.i64").u32(11).u64((-9i64) as u64);
    b.str("k.f64").u32(12).u64(0.25f64.to_bits());
    b.str("tokenizer.ggml.tokens")
        .u32(9)
        .u32(8)
        .u64(3)
        .str("<s>")
        .str("a")
        .str("");
    b.str("k.nested").u32(9).u32(9).u64(2);
    b.u32(4).u64(2).u32(1).u32(2); // [1, 2] as u32
    b.u32(8).u64(1).str("x"); // ["x"]
    b.str("k.bytes").u32(8).u64(2).raw(&[0xff, 0xfe]);
    (15, b.buf)
}

fn open(bytes: &[u8]) -> zt::Result<Source> {
    open_limited(bytes, Limits::default())
}

fn open_limited(bytes: &[u8], limits: Limits) -> zt::Result<Source> {
    let dir = Dir::new();
    let path = dir.file("m.gguf", bytes);
    let source = zt::open_with(
        &path,
        &OpenOptions {
            limits,
            ..Default::default()
        },
    )?;
    // The mapping outlives the directory: keep it for the test's duration.
    std::mem::forget(dir);
    Ok(source)
}

/// Run the plugin's `open` directly, bypassing detection.
fn plugin_open(bytes: &[u8]) -> zt::Result<zt::Catalog> {
    let dir = Dir::new();
    let store = std::sync::Arc::new(zt::Store::open(dir.file("m.gguf", bytes)).unwrap());
    Gguf.open(&zt::OpenInput::new(&store, &Limits::default()))
}

fn attr<'a>(source: &'a Source, key: &str) -> &'a Value {
    &source
        .attributes()
        .iter()
        .find(|(k, _)| k == key)
        .unwrap()
        .1
}

fn bytes_of(source: &Source, name: &str) -> zt::Result<Vec<u8>> {
    Ok(source.tensor(name)?.data()?.bytes()?.into_owned())
}

// ---------------------------------------------------------------- reading

#[test]
fn every_value_type_and_shapes_reversed() {
    for big in [false, true] {
        for version in [2, 3] {
            let (n, kvs) = every_kv(big);
            let t = f32_tensor("w", vec![3, 2], 0, big);
            let bytes = file(big, version, n, &kvs, &[t], 32);
            let src = open(&bytes).unwrap();
            assert_eq!(src.format(), "gguf");
            assert_eq!(
                attr(&src, "general.architecture"),
                &Value::Str("llama".into())
            );
            assert_eq!(attr(&src, "k.u8"), &Value::Int(200));
            assert_eq!(attr(&src, "k.i8"), &Value::Int(-1));
            assert_eq!(attr(&src, "k.u16"), &Value::Int(0xbeef));
            assert_eq!(attr(&src, "k.i16"), &Value::Int(-2));
            assert_eq!(attr(&src, "k.u32"), &Value::Int(4_000_000_000));
            assert_eq!(attr(&src, "k.i32"), &Value::Int(-7));
            assert_eq!(attr(&src, "k.f32"), &Value::Float(1.5));
            assert_eq!(attr(&src, "k.bool"), &Value::Bool(true));
            assert_eq!(attr(&src, "k.u64"), &Value::UInt(u64::MAX));
            assert_eq!(attr(&src, "k.i64"), &Value::Int(-9));
            assert_eq!(attr(&src, "k.f64"), &Value::Float(0.25));
            assert_eq!(
                attr(&src, "tokenizer.ggml.tokens"),
                &Value::List(vec![
                    Value::Str("<s>".into()),
                    Value::Str("a".into()),
                    Value::Str("".into())
                ])
            );
            assert_eq!(
                attr(&src, "k.nested"),
                &Value::List(vec![
                    Value::List(vec![Value::Int(1), Value::Int(2)]),
                    Value::List(vec![Value::Str("x".into())]),
                ])
            );
            assert_eq!(attr(&src, "k.bytes"), &Value::Bytes(vec![0xff, 0xfe]));
            assert_eq!(attr(&src, "GGUF.version"), &Value::Int(version.into()));
            let endian = if big { "big" } else { "little" };
            assert_eq!(attr(&src, "GGUF.endian"), &Value::Str(endian.into()));
            let Value::Map(types) = attr(&src, "GGUF.types") else {
                panic!()
            };
            assert_eq!(types[1], ("k.u8".into(), Value::Str("u8".into())));
            assert_eq!(types[12].1, Value::Str("array[string]".into()));
            assert_eq!(
                types[13].1,
                Value::List(vec![
                    Value::Str("array[u32]".into()),
                    Value::Str("array[string]".into())
                ])
            );

            let w = src.tensor("w").unwrap();
            assert_eq!(w.shape(), &[2, 3]);
            assert_eq!(w.layout(), "dense");
            let part = w.data().unwrap();
            assert_eq!(part.dtype(), DType::F32);
            assert_eq!(part.caps().map, !big, "little-endian data is zero-copy");
            let want: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
            assert_eq!(part.bytes().unwrap().as_ref(), le(&want).as_slice());
        }
    }
}

#[test]
fn alignment_is_honoured() {
    let mut kv = Bytes::new(false);
    kv.str("general.alignment").u32(4).u32(64);
    let tensors = [
        f32_tensor("a", vec![3], 0, false),
        f32_tensor("b", vec![5], 64, false),
    ];
    let bytes = file(false, 3, 1, &kv.buf, &tensors, 64);
    let src = open(&bytes).unwrap();
    let b = src.tensor("b").unwrap().data().unwrap();
    assert_eq!(b.locate().unwrap().offset % 64, 0);
    assert_eq!(bytes_of(&src, "b").unwrap(), tensors[1].data);
    // The same offsets without the key: data starts at 32, so "b" at 64
    // from there is still fine, but an offset of 48 is not a multiple of 32.
    let tensors = [
        f32_tensor("a", vec![3], 0, false),
        f32_tensor("b", vec![5], 48, false),
    ];
    let bytes = file(false, 3, 0, &[], &tensors, 32);
    assert!(cites!(
        open(&bytes),
        Err(Error::Range { .. }),
        &["gguf.Placement"]
    ));
}

#[test]
fn block_types_are_objects_of_verbatim_blocks() {
    // Two Q8_0 blocks (64 elements, one row) with d = 1.0 and q = i - 16.
    let mut data = Vec::new();
    for _ in 0..2 {
        data.extend_from_slice(&[0x00, 0x3c]);
        data.extend((0..32).map(|i| (i as i8 - 16) as u8));
    }
    let t = T {
        name: "q",
        dims: vec![64, 1],
        ty: 8,
        offset: 0,
        data: data.clone(),
    };
    let src = open(&file(false, 3, 0, &[], &[t], 32)).unwrap();
    let q = src.tensor("q").unwrap();
    assert_eq!(q.layout(), "gguf.q8_0/1");
    assert_eq!(q.shape(), &[1, 64]);
    let part = q.data().unwrap();
    assert_eq!(
        (part.name(), part.dtype(), part.shape()),
        ("data", DType::U8, &[68u64][..])
    );
    assert_eq!(part.map().unwrap(), data.as_slice());
    let attrs = q.attributes();
    assert!(attrs.contains(&("elems_per_block".into(), Value::Int(32))));
    assert!(attrs.contains(&("block_bytes".into(), Value::Int(34))));
    assert!(attrs.contains(&("ggml_type".into(), Value::Int(8))));
    let values = dequantize(&q).unwrap();
    assert_eq!(values.len(), 64);
    assert_eq!((values[0], values[31], values[32]), (-16.0, 15.0, -16.0));
}

#[test]
fn dequantized_rows_are_those_rows_of_the_whole_tensor() {
    // Q8_0, three rows of two blocks (zt shape [3, 64]), each block with
    // its own scale so every row differs.
    let mut data = Vec::new();
    for block in 0..6u16 {
        data.extend_from_slice(&(0x3c00 + block * 0x100).to_le_bytes());
        data.extend((0..32).map(|i| (i as i8 - 16) as u8));
    }
    let t = T {
        name: "q",
        dims: vec![64, 3],
        ty: 8,
        offset: 0,
        data,
    };
    let src = open(&file(false, 3, 0, &[], &[t], 32)).unwrap();
    let q = src.tensor("q").unwrap();
    assert_eq!(q.shape(), &[3, 64]);
    let whole = dequantize(&q).unwrap();
    let rows = [2u64, 0, 1, 2];
    let got = dequantize_rows_with(&q, &rows, &Limits::default()).unwrap();
    let want: Vec<f32> = rows
        .iter()
        .flat_map(|&r| {
            whole[r as usize * 64..(r as usize + 1) * 64]
                .iter()
                .copied()
        })
        .collect();
    assert_eq!(got, want);
    assert!(dequantize_rows_with(&q, &[], &Limits::default())
        .unwrap()
        .is_empty());
    // A row past the end, and an output past the budget, are refused.
    assert!(cites!(
        dequantize_rows_with(&q, &[3], &Limits::default()),
        Err(Error::Range { .. }),
        &["gguf.Dequant"]
    ));
    let tight = Limits {
        decoded_bytes: 64 * 4,
        ..Limits::default()
    };
    assert!(dequantize_rows_with(&q, &[1], &tight).is_ok());
    assert!(cites!(
        dequantize_rows_with(&q, &[0, 1], &tight),
        Err(Error::Limit { .. }),
        &["core.Limit"]
    ));
}

#[test]
fn big_endian_block_data_is_kept_as_stored() {
    let data: Vec<u8> = (0..18).collect();
    let t = T {
        name: "q",
        dims: vec![32],
        ty: 2,
        offset: 0,
        data: data.clone(),
    };
    let src = open(&file(true, 3, 0, &[], &[t], 32)).unwrap();
    assert_eq!(bytes_of(&src, "q").unwrap(), data);
}

#[test]
fn unknown_type_fails_only_that_tensor() {
    let tensors = [
        T {
            name: "odd",
            dims: vec![16],
            ty: 99,
            offset: 0,
            data: vec![7; 16],
        },
        f32_tensor("w", vec![4], 32, false),
    ];
    let src = open(&file(false, 3, 0, &[], &tensors, 32)).unwrap();
    let odd = src.tensor("odd").unwrap();
    assert_eq!(odd.layout(), "gguf.unknown/1");
    assert!(odd
        .attributes()
        .contains(&("ggml_type".into(), Value::Int(99))));
    assert!(matches!(
        bytes_of(&src, "odd"),
        Err(Error::UnsupportedDType { .. })
    ));
    assert_eq!(bytes_of(&src, "w").unwrap(), tensors[1].data);
    // Writing it back is refused, naming it.
    let dir = Dir::new();
    let err = GgufWriter.write(&src, &dir.path("out.gguf"), &WriteOptions::default());
    assert!(cites!(err, Err(Error::Write { .. }), &["write.DType"]));
}

#[test]
fn version_one_is_refused() {
    let bytes = file(false, 1, 0, &[], &[], 32);
    assert!(cites!(
        open(&bytes),
        Err(Error::Unsupported { .. }),
        &["gguf.Version"]
    ));
}

// ---------------------------------------------------------------- hostile

fn kv_file(kvs: &[u8], count: u64) -> Vec<u8> {
    file(false, 3, count, kvs, &[], 32)
}

#[test]
fn string_length_past_eof() {
    let mut kv = Bytes::new(false);
    kv.str("k").u32(8).u64(1000).raw(b"short");
    assert!(matches!(
        open(&kv_file(&kv.buf, 1)),
        Err(Error::Truncated { .. })
    ));
    // A key whose length runs past the end.
    let mut kv = Bytes::new(false);
    kv.u64(1 << 40).raw(&[0; 16]);
    assert!(matches!(
        open(&kv_file(&kv.buf, 1)),
        Err(Error::Limit {
            limit: "string_bytes",
            ..
        })
    ));
    let mut kv = Bytes::new(false);
    kv.u64(100).raw(b"abc");
    assert!(matches!(
        open(&kv_file(&kv.buf, 1)),
        Err(Error::Truncated { .. })
    ));
}

#[test]
fn counts_past_eof_and_huge_counts() {
    // An array that claims more elements than the file holds.
    let mut kv = Bytes::new(false);
    kv.str("k").u32(9).u32(4).u64(1_000_000).u32(1);
    assert!(matches!(
        open(&kv_file(&kv.buf, 1)),
        Err(Error::Truncated { .. })
    ));
    // One past the entries limit.
    let mut kv = Bytes::new(false);
    kv.str("k").u32(9).u32(0).u64(u64::MAX / 2);
    assert!(matches!(
        open(&kv_file(&kv.buf, 1)),
        Err(Error::Limit {
            limit: "entries",
            ..
        })
    ));
    // Counts in the header: more pairs than the bytes could hold.
    assert!(matches!(
        open(&kv_file(&[0; 100], 10)),
        Err(Error::Truncated { .. })
    ));
    // Counts no file could hold are not GGUF to detection; the plugin
    // itself refuses them by limit before allocating anything.
    assert!(matches!(
        open(&kv_file(&[], 1 << 60)),
        Err(Error::UnknownFormat { .. })
    ));
    assert!(matches!(
        plugin_open(&kv_file(&[], 1 << 60)),
        Err(Error::Limit {
            limit: "entries",
            ..
        })
    ));
    let mut huge_tensors = file(false, 3, 0, &[], &[], 32);
    huge_tensors[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(
        plugin_open(&huge_tensors),
        Err(Error::Limit {
            limit: "tensors",
            ..
        })
    ));
    huge_tensors[8..16].copy_from_slice(&(1u64 << 19).to_le_bytes());
    assert!(matches!(
        plugin_open(&huge_tensors),
        Err(Error::Truncated { .. })
    ));
    // A truncated header.
    assert!(matches!(
        open(&huge_tensors[..12]),
        Err(Error::UnknownFormat { .. })
    ));
}

#[test]
fn limits_on_depth_strings_and_header() {
    let mut kv = Bytes::new(false);
    kv.str("k")
        .u32(9)
        .u32(9)
        .u64(1)
        .u32(9)
        .u64(1)
        .u32(0)
        .u64(1)
        .u8(1);
    let limits = Limits {
        depth: 2,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&kv_file(&kv.buf, 1), limits),
        Err(Error::Limit { limit: "depth", .. })
    ));
    assert!(open(&kv_file(&kv.buf, 1)).is_ok());
    let limits = Limits {
        string_bytes: 2,
        ..Limits::default()
    };
    let mut kv = Bytes::new(false);
    kv.str("k").u32(8).str("long");
    assert!(matches!(
        open_limited(&kv_file(&kv.buf, 1), limits),
        Err(Error::Limit {
            limit: "string_bytes",
            ..
        })
    ));
    let limits = Limits {
        header_bytes: 30,
        ..Limits::default()
    };
    assert!(matches!(
        open_limited(&kv_file(&kv.buf, 1), limits),
        Err(Error::Limit {
            limit: "header_bytes",
            ..
        })
    ));
}

#[test]
fn bad_metadata_values() {
    let bad = |kv: &Bytes| open(&kv_file(&kv.buf, 1));
    let mut kv = Bytes::new(false);
    kv.str("k").u32(7).u8(2);
    assert!(
        cites!(bad(&kv), Err(Error::Header { .. }), &["gguf.Metadata"]),
        "bool 2"
    );
    let mut kv = Bytes::new(false);
    kv.str("k").u32(13).u8(0);
    assert!(
        cites!(bad(&kv), Err(Error::Header { .. }), &["gguf.Metadata"]),
        "value type 13"
    );
    let mut kv = Bytes::new(false);
    kv.str("k").u32(9).u32(77).u64(0);
    assert!(
        cites!(bad(&kv), Err(Error::Header { .. }), &["gguf.Metadata"]),
        "array of type 77"
    );
    let mut kv = Bytes::new(false);
    kv.str("").u32(0).u8(0);
    assert!(
        cites!(bad(&kv), Err(Error::Header { .. }), &["gguf.Metadata"]),
        "empty key"
    );
    let mut kv = Bytes::new(false);
    kv.str("GGUF.version").u32(0).u8(0);
    assert!(
        cites!(bad(&kv), Err(Error::Header { .. }), &["gguf.Metadata"]),
        "reserved key"
    );
    let mut kv = Bytes::new(false);
    kv.str("k").u32(0).u8(0).str("k").u32(0).u8(1);
    assert!(
        cites!(
            open(&kv_file(&kv.buf, 2)),
            Err(Error::Header { .. }),
            &["gguf.Metadata"]
        ),
        "duplicate key"
    );
}

#[test]
fn bad_alignment() {
    for (ty, value) in [(4u32, 0u64), (4, 48), (4, 3), (10, 64)] {
        let mut kv = Bytes::new(false);
        kv.str("general.alignment").u32(ty);
        if ty == 10 {
            kv.u64(value);
        } else {
            kv.u32(value as u32);
        }
        assert!(
            cites!(
                open(&kv_file(&kv.buf, 1)),
                Err(Error::Header { .. }),
                &["gguf.Metadata"]
            ),
            "{ty} {value}"
        );
    }
}

#[test]
fn overlapping_and_out_of_bounds_tensors() {
    let overlap = [
        f32_tensor("a", vec![16], 0, false),
        f32_tensor("b", vec![4], 32, false),
    ];
    assert!(cites!(
        open(&file(false, 3, 0, &[], &overlap, 32)),
        Err(Error::Range { .. }),
        &["gguf.Placement"]
    ));
    // Declared in the other order: still an overlap.
    let overlap = [
        f32_tensor("b", vec![4], 32, false),
        f32_tensor("a", vec![16], 0, false),
    ];
    assert!(cites!(
        open(&file(false, 3, 0, &[], &overlap, 32)),
        Err(Error::Range { .. }),
        &["gguf.Placement"]
    ));
    let mut bytes = file(false, 3, 0, &[], &[f32_tensor("a", vec![16], 0, false)], 32);
    bytes.truncate(bytes.len() - 1);
    assert!(matches!(open(&bytes), Err(Error::Truncated { .. })));
    // An offset so large the absolute position overflows.
    let t = T {
        name: "a",
        dims: vec![1],
        ty: 0,
        offset: u64::MAX - 31,
        data: vec![],
    };
    let mut bytes = file(false, 3, 0, &[], &[], 32);
    let mut b = Bytes::new(false);
    b.str(t.name).u32(1).u64(1).u32(0).u64(t.offset);
    bytes.truncate(24);
    bytes[8..16].copy_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&b.buf);
    bytes.resize(96, 0);
    assert!(matches!(open(&bytes), Err(Error::Overflow { .. })));
}

#[test]
fn bad_tensor_infos() {
    let dup = [
        f32_tensor("a", vec![4], 0, false),
        f32_tensor("a", vec![4], 32, false),
    ];
    assert!(matches!(
        open(&file(false, 3, 0, &[], &dup, 32)),
        Err(Error::DuplicateName { .. })
    ));
    // A Q4_0 row of 48 elements is not whole blocks of 32.
    let q = T {
        name: "q",
        dims: vec![48],
        ty: 2,
        offset: 0,
        data: vec![0; 27],
    };
    assert!(cites!(
        open(&file(false, 3, 0, &[], &[q], 32)),
        Err(Error::Range { .. }),
        &["gguf.TensorInfo"]
    ));
    // Dimensions whose product overflows.
    let t = T {
        name: "t",
        dims: vec![1 << 40, 1 << 40],
        ty: 0,
        offset: 0,
        data: vec![],
    };
    assert!(matches!(
        open(&file(false, 3, 0, &[], &[t], 32)),
        Err(Error::Overflow { .. })
    ));
    let t = T {
        name: "t",
        dims: vec![u64::MAX],
        ty: 0,
        offset: 0,
        data: vec![],
    };
    assert!(cites!(
        open(&file(false, 3, 0, &[], &[t], 32)),
        Err(Error::Header { .. }),
        &["gguf.TensorInfo"]
    ));
    let t = T {
        name: "t",
        dims: vec![1; 65],
        ty: 0,
        offset: 0,
        data: vec![0; 4],
    };
    assert!(matches!(
        open(&file(false, 3, 0, &[], &[t], 32)),
        Err(Error::Limit { limit: "rank", .. })
    ));
}

// ---------------------------------------------------------------- writing

#[test]
fn write_round_trip_keeps_types_and_bytes() {
    let dir = Dir::new();
    for big in [false, true] {
        let (n, kvs) = every_kv(big);
        let q: Vec<u8> = (0..36).map(|i| i as u8).collect();
        let tensors = [
            f32_tensor("w", vec![3, 2], 0, big),
            T {
                name: "q",
                dims: vec![32, 2],
                ty: 2,
                offset: 32,
                data: q.clone(),
            },
        ];
        let path = dir.file("in.gguf", &file(big, 3, n, &kvs, &tensors, 32));
        let src = zt::open(&path).unwrap();
        let out = dir.path("out.gguf");
        GgufWriter
            .write(&src, &out, &WriteOptions::default())
            .unwrap();
        let back = zt::open(&out).unwrap();
        let strip = |s: &Source| -> Vec<(String, Value)> {
            s.attributes()
                .iter()
                .filter(|(k, _)| k != "GGUF.endian")
                .cloned()
                .collect()
        };
        assert_eq!(strip(&back), strip(&src));
        for name in ["w", "q"] {
            assert_eq!(
                bytes_of(&back, name).unwrap(),
                bytes_of(&src, name).unwrap()
            );
            assert_eq!(
                back.tensor(name).unwrap().shape(),
                src.tensor(name).unwrap().shape()
            );
        }
        if !big {
            // A little-endian v3 file comes back byte for byte.
            assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&path).unwrap());
        }
    }
}

#[test]
fn writer_refuses_what_gguf_cannot_hold() {
    let dir = Dir::new();
    let path = dir.path("u8.safetensors");
    let data = [1u8, 2, 3];
    zt::formats::safetensors::write(
        &path,
        &[zt::TensorIn {
            name: "u",
            dtype: DType::U8,
            shape: &[3],
            data: &data,
        }],
        &[],
    )
    .unwrap();
    let src = zt::open(&path).unwrap();
    let err = GgufWriter.write(&src, &dir.path("o.gguf"), &WriteOptions::default());
    assert!(cites!(err, Err(Error::Write { .. }), &["write.DType"]));
    assert!(!dir.path("o.gguf").exists());
    let opts = WriteOptions::default().with_format(zt::ZtOptions {
        compression: Some(3),
        ..zt::ZtOptions::default()
    });
    // Requests are checked against the writer's caps once, by the
    // registry, before any writer runs.
    assert!(cites!(
        zt::convert(&src, &dir.path("o.gguf"), &opts),
        Err(Error::Write { .. }),
        &["write.Options"]
    ));
}

#[test]
fn dense_sources_convert_with_metadata() {
    let dir = Dir::new();
    let path = dir.path("m.safetensors");
    let data = le(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    zt::formats::safetensors::write(
        &path,
        &[zt::TensorIn {
            name: "w",
            dtype: DType::F32,
            shape: &[2, 3],
            data: &data,
        }],
        &[("author".into(), "me".into())],
    )
    .unwrap();
    let src = zt::open(&path).unwrap();
    let out = dir.path("m.gguf");
    zt::convert(&src, &out, &WriteOptions::default()).unwrap();
    let back = zt::open(&out).unwrap();
    assert_eq!(attr(&back, "author"), &Value::Str("me".into()));
    assert_eq!(back.tensor("w").unwrap().shape(), &[2, 3]);
    assert_eq!(bytes_of(&back, "w").unwrap(), data);
}

#[test]
fn positional_reads_agree_with_the_mapping() {
    let (n, kvs) = every_kv(false);
    let q: Vec<u8> = (0..18).collect();
    let tensors = [
        f32_tensor("w", vec![3, 2], 0, false),
        T {
            name: "q",
            dims: vec![32],
            ty: 2,
            offset: 32,
            data: q,
        },
    ];
    let dir = Dir::new();
    let path = dir.file("m.gguf", &file(false, 3, n, &kvs, &tensors, 32));
    let mapped = zt::open(&path).unwrap();
    let positional = zt::open_with(
        &path,
        &OpenOptions {
            map: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(mapped.attributes(), positional.attributes());
    for name in ["w", "q"] {
        assert_eq!(
            bytes_of(&mapped, name).unwrap(),
            bytes_of(&positional, name).unwrap()
        );
        assert!(!positional.tensor(name).unwrap().data().unwrap().caps().map);
    }
    // A header larger than the first positional read (1 MiB) grows the buffer.
    let mut kv = Bytes::new(false);
    let long = "x".repeat(3 << 20);
    kv.str("k.long").u32(8).str(&long);
    let path = dir.file("long.gguf", &file(false, 3, 1, &kv.buf, &tensors[..1], 32));
    let positional = zt::open_with(
        &path,
        &OpenOptions {
            map: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(attr(&positional, "k.long"), &Value::Str(long));
    assert_eq!(bytes_of(&positional, "w").unwrap(), tensors[0].data);
}
