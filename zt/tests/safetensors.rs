//! safetensors plugin and the Source core: round trips, and every hostile
//! shape a file can take, each asserted by its exact error variant and the
//! rule it cites (`cites!`, `support/cites.rs`).

#[macro_use]
#[path = "support/cites.rs"]
mod cites;

use std::path::{Path, PathBuf};

use zt::{DType, Error, Limits, OpenOptions, TensorIn};

fn write_raw(
    dir: &Path,
    name: &str,
    header: &str,
    data: &[u8],
    declared_len: Option<u64>,
) -> PathBuf {
    let path = dir.join(name);
    let mut bytes = declared_len
        .unwrap_or(header.len() as u64)
        .to_le_bytes()
        .to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn open_err(path: &Path) -> Error {
    match zt::open(path) {
        Ok(_) => panic!("{} opened but should not", path.display()),
        Err(e) => e,
    }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[test]
fn round_trip_through_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let a = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = vec![1u8, 0, 1];
    let c = 7i64.to_le_bytes();
    let tensors = [
        TensorIn {
            name: "a",
            dtype: DType::F32,
            shape: &[2, 3],
            data: &a,
        },
        TensorIn {
            name: "b",
            dtype: DType::Bool,
            shape: &[3],
            data: &b,
        },
        TensorIn {
            name: "c",
            dtype: DType::I64,
            shape: &[],
            data: &c,
        },
    ];
    zt::formats::safetensors::write(&path, &tensors, &[("k".into(), "v".into())]).unwrap();
    let source = zt::open(&path).unwrap();
    assert_eq!(source.format(), "safetensors");
    assert_eq!(source.len(), 3);
    assert_eq!(
        source.attributes(),
        &vec![("k".to_string(), zt::Value::Str("v".into()))]
    );
    for t in &tensors {
        let part = source.tensor(t.name).unwrap().data().unwrap();
        assert_eq!(part.dtype(), t.dtype);
        assert_eq!(part.shape(), t.shape);
        assert_eq!(&*part.bytes().unwrap(), t.data);
        assert!(part.caps().map, "{} should be aligned", t.name);
    }
    // Positional reads give the same bytes but no zero-copy view.
    let positional = zt::open_with(
        &path,
        &OpenOptions {
            map: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let part = positional.tensor("a").unwrap().data().unwrap();
    assert_eq!(&*part.bytes().unwrap(), &a[..]);
    assert!(!part.caps().map);
    assert!(cites!(
        part.map(),
        Err(Error::Unsupported { .. }),
        &["access.Map"]
    ));
}

#[test]
fn writer_refuses_reserved_and_mismatched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let data = [0u8; 4];
    let reserved = [TensorIn {
        name: "__metadata__",
        dtype: DType::U8,
        shape: &[4],
        data: &data,
    }];
    assert!(cites!(
        zt::formats::safetensors::write(&path, &reserved, &[]),
        Err(Error::Write { .. }),
        &["write.Name"]
    ));
    let wrong = [TensorIn {
        name: "w",
        dtype: DType::F32,
        shape: &[2],
        data: &data,
    }];
    assert!(cites!(
        zt::formats::safetensors::write(&path, &wrong, &[]),
        Err(Error::Write { .. }),
        &["write.Size"]
    ));
    let dup = [
        TensorIn {
            name: "w",
            dtype: DType::U8,
            shape: &[4],
            data: &data,
        },
        TensorIn {
            name: "w",
            dtype: DType::U8,
            shape: &[4],
            data: &data,
        },
    ];
    assert!(matches!(
        zt::formats::safetensors::write(&path, &dup, &[]),
        Err(Error::DuplicateName { .. })
    ));
    assert!(!path.exists());
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no partial file left"
    );
}

#[test]
fn hostile_headers() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let e = |dtype: &str, shape: &str, a: u64, b: u64| {
        format!(r#"{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{a},{b}]}}"#)
    };

    let p = write_raw(d, "past-eof.safetensors", "{}", &[], Some(1 << 20));
    assert!(matches!(open_err(&p), Error::Truncated { .. }));

    // Past safetensors' own 100 MB cap the file is not safetensors at all;
    // under it, `Limits::header_bytes` applies.
    let p = write_raw(d, "huge.safetensors", "{}", &[], Some(200_000_000));
    assert!(matches!(open_err(&p), Error::UnknownFormat { .. }));
    let p = write_raw(
        d,
        "limit.safetensors",
        &format!("{{}}{}", " ".repeat(4094)),
        &[],
        None,
    );
    let tight = OpenOptions {
        limits: Limits {
            header_bytes: 1024,
            ..Limits::default()
        },
        ..OpenOptions::default()
    };
    assert!(matches!(
        zt::open_with(&p, &tight),
        Err(Error::Limit {
            limit: "header_bytes",
            ..
        })
    ));

    let p = write_raw(d, "notjson.safetensors", "{nope", &[], None);
    assert!(cites!(
        open_err(&p),
        Error::Header { .. },
        &["safetensors.Header"]
    ));

    let h = format!(
        r#"{{"a":{},"b":{}}}"#,
        e("F32", "[2]", 0, 8),
        e("F32", "[2]", 4, 12)
    );
    let p = write_raw(d, "overlap.safetensors", &h, &[0; 12], None);
    assert!(cites!(
        open_err(&p),
        Error::Range { .. },
        &["safetensors.Offsets"]
    ));

    let h = format!(
        r#"{{"a":{},"b":{}}}"#,
        e("F32", "[2]", 0, 8),
        e("F32", "[2]", 12, 20)
    );
    let p = write_raw(d, "gap.safetensors", &h, &[0; 20], None);
    assert!(cites!(
        open_err(&p),
        Error::Range { .. },
        &["safetensors.Offsets"]
    ));

    let h = format!(r#"{{"a":{}}}"#, e("F32", "[2]", 0, 8));
    let p = write_raw(d, "trailing.safetensors", &h, &[0; 9], None);
    assert!(cites!(
        open_err(&p),
        Error::Range { .. },
        &["safetensors.Offsets"]
    ));

    let h = format!(r#"{{"a":{}}}"#, e("F32", "[3]", 0, 8));
    let p = write_raw(d, "size.safetensors", &h, &[0; 8], None);
    assert!(cites!(
        open_err(&p),
        Error::Range { .. },
        &["safetensors.Size"]
    ));

    let h = format!(r#"{{"a":{}}}"#, e("F32", "[4294967296,4294967296]", 0, 8));
    let p = write_raw(d, "overflow.safetensors", &h, &[0; 8], None);
    assert!(matches!(open_err(&p), Error::Overflow { .. }));

    let h = format!(r#"{{"a":{}}}"#, e("F128", "[2]", 0, 8));
    let p = write_raw(d, "dtype.safetensors", &h, &[0; 8], None);
    assert!(matches!(open_err(&p), Error::UnsupportedDType { .. }));

    let h = format!(
        r#"{{"a":{},"a":{}}}"#,
        e("F32", "[2]", 0, 8),
        e("F32", "[2]", 0, 8)
    );
    let p = write_raw(d, "dup.safetensors", &h, &[0; 8], None);
    assert!(matches!(open_err(&p), Error::DuplicateName { .. }));

    let p = write_raw(
        d,
        "meta.safetensors",
        r#"{"__metadata__":{"a":1}}"#,
        &[],
        None,
    );
    assert!(cites!(
        open_err(&p),
        Error::Header { .. },
        &["safetensors.Metadata"]
    ));

    let h = format!(r#"{{"a":{}}}"#, e("F4", "[3]", 0, 2));
    let p = write_raw(d, "fp4.safetensors", &h, &[0; 2], None);
    assert!(cites!(
        open_err(&p),
        Error::Range { .. },
        &["safetensors.Size"]
    ));

    let short = d.join("short.safetensors");
    std::fs::write(&short, [1u8, 2, 3]).unwrap();
    assert!(matches!(open_err(&short), Error::UnknownFormat { .. }));
}

#[test]
fn errors_name_the_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let h = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    let p = write_raw(dir.path(), "named.safetensors", h, &[0; 8], None);
    let err = open_err(&p);
    assert_eq!(err.context().file.as_deref(), Some(p.as_path()));
    assert_eq!(err.context().tensor.as_deref(), Some("w"));
    assert!(err.to_string().contains("named.safetensors"));
}

#[test]
fn limits_bound_counts_and_rank() {
    let dir = tempfile::tempdir().unwrap();
    let entries: Vec<String> = (0..50)
        .map(|i| {
            format!(
                r#""t{i}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#,
                i + 1
            )
        })
        .collect();
    let p = write_raw(
        dir.path(),
        "many.safetensors",
        &format!("{{{}}}", entries.join(",")),
        &[0; 50],
        None,
    );
    assert_eq!(zt::open(&p).unwrap().len(), 50);
    let tight = OpenOptions {
        limits: Limits {
            tensors: 10,
            ..Limits::default()
        },
        ..OpenOptions::default()
    };
    assert!(matches!(
        zt::open_with(&p, &tight),
        Err(Error::Limit {
            limit: "tensors",
            ..
        })
    ));

    let shape = format!("[{}]", vec!["1"; 100].join(","));
    let h = format!(r#"{{"a":{{"dtype":"U8","shape":{shape},"data_offsets":[0,1]}}}}"#);
    let p = write_raw(dir.path(), "rank.safetensors", &h, &[0; 1], None);
    assert!(matches!(open_err(&p), Error::Limit { limit: "rank", .. }));
}

#[test]
fn an_index_naming_many_shards_opens_in_linear_time() {
    // 200k distinct shard files, none there: the first is reported missing
    // at once (collecting the shard list was quadratic in the shards).
    let dir = tempfile::tempdir().unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    let map: serde_json::Map<String, serde_json::Value> = (0..200_000)
        .map(|i| (format!("t{i}"), format!("s{i}.safetensors").into()))
        .collect();
    let json = serde_json::json!({ "weight_map": map });
    std::fs::write(&index, serde_json::to_vec(&json).unwrap()).unwrap();
    match zt::open(&index) {
        Err(Error::NotFound { ctx }) => {
            let missing = ctx.file.unwrap();
            assert!(missing.ends_with("s0.safetensors"), "{}", missing.display());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn open_all_refuses_collisions_and_index_checks_shards() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let one = [1u8];
    let write = |name: &str, tensor: &str| {
        let path = d.join(name);
        zt::formats::safetensors::write(
            &path,
            &[TensorIn {
                name: tensor,
                dtype: DType::U8,
                shape: &[1],
                data: &one,
            }],
            &[],
        )
        .unwrap();
        path
    };
    let a = write("a.safetensors", "x");
    let b = write("b.safetensors", "y");
    let c = write("c.safetensors", "x");
    assert_eq!(zt::open_all(&[&a, &b]).unwrap().len(), 2);
    assert!(matches!(
        zt::open_all(&[&a, &c]),
        Err(Error::DuplicateName { .. })
    ));

    let index = d.join("model.safetensors.index.json");
    std::fs::write(
        &index,
        r#"{"weight_map":{"x":"a.safetensors","y":"b.safetensors"}}"#,
    )
    .unwrap();
    let merged = zt::open(&index).unwrap();
    assert_eq!(merged.len(), 2);
    assert_eq!(merged.files().len(), 3);

    std::fs::write(
        &index,
        r#"{"weight_map":{"x":"b.safetensors","y":"b.safetensors"}}"#,
    )
    .unwrap();
    assert!(cites!(
        zt::open(&index),
        Err(Error::Index { .. }),
        &["index.Mismatch"]
    ));
    std::fs::write(&index, r#"{"weight_map":{"x":"/etc/passwd"}}"#).unwrap();
    assert!(cites!(
        zt::open(&index),
        Err(Error::Index { .. }),
        &["index.ShardPath"]
    ));
    std::fs::write(
        &index,
        r#"{"weight_map":{"x":"a.safetensors","z":"a.safetensors","y":"b.safetensors"}}"#,
    )
    .unwrap();
    assert!(cites!(
        zt::open(&index),
        Err(Error::Index { .. }),
        &["index.Mismatch"]
    ));
}

#[test]
fn evict_spares_shared_pages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let page = zt::store::page_size() as usize;
    let big = vec![1u8; 4 * page];
    let small = vec![2u8; 16];
    zt::formats::safetensors::write(
        &path,
        &[
            TensorIn {
                name: "a_big",
                dtype: DType::U8,
                shape: &[big.len() as u64],
                data: &big,
            },
            TensorIn {
                name: "b_small",
                dtype: DType::U8,
                shape: &[16],
                data: &small,
            },
        ],
        &[],
    )
    .unwrap();
    let source = zt::open(&path).unwrap();
    let small_part = source.tensor("b_small").unwrap().data().unwrap();
    // b_small sits in the last page of a_big: nothing of its own to drop.
    assert!(!small_part.caps().evict);
    assert_eq!(small_part.evict().unwrap(), 0);
    let big_part = source.tensor("a_big").unwrap().data().unwrap();
    let dropped = big_part.evict().unwrap();
    assert!(dropped > 0 && dropped as usize <= 4 * page);
    assert_eq!(&*big_part.bytes().unwrap(), &big[..]);
}

#[test]
fn detect_is_structural() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A safetensors file with a misleading extension is still safetensors.
    let h = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
    let p = write_raw(d, "weights.npy", h, &[0], None);
    assert_eq!(zt::detect(&p).unwrap(), "safetensors");
    // Eight plausible length bytes followed by no JSON object is nothing.
    let p = write_raw(d, "x.safetensors", "[1,2,3]", &[], None);
    assert!(matches!(zt::detect(&p), Err(Error::UnknownFormat { .. })));
    // Other formats' structures are recognised.
    let p = d.join("m.gguf");
    let mut gguf = b"GGUF".to_vec();
    gguf.extend_from_slice(&3u32.to_le_bytes());
    gguf.extend_from_slice(&0u64.to_le_bytes());
    gguf.extend_from_slice(&0u64.to_le_bytes());
    std::fs::write(&p, &gguf).unwrap();
    assert_eq!(zt::detect(&p).unwrap(), "gguf");
    assert_eq!(zt::open(&p).unwrap().len(), 0);
}

/// The header as the reference writer's serde derive writes it: fields in
/// declaration order (`dtype, shape, data_offsets`), tensors by its dtype
/// enum descending then name (F32 before U32 before I32 at one width), the
/// caller's `__metadata__` first, and `None` / `Some(&[])` telling no
/// metadata from an empty one. (Byte identity with safetensors itself is
/// tested against the library in tests/test_safetensors.py.)
#[test]
fn header_is_laid_out_as_the_reference_writes_it() {
    fn t<'a>(name: &'a str, dtype: DType, data: &'a [u8]) -> TensorIn<'a> {
        TensorIn {
            name,
            dtype,
            shape: &[1],
            data,
        }
    }
    let (four, eight) = ([0u8; 4], [0u8; 8]);
    let (four, eight) = (&four[..], &eight[..]);
    let tensors = [
        t("a", DType::I32, four),
        t("b", DType::U32, four),
        t("c", DType::F32, four),
        t("d", DType::Complex64, eight),
    ];
    let bytes =
        zt::formats::safetensors::to_bytes(&tensors, Some(&[("k".into(), "v".into())])).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    assert_eq!(
        header.trim_end(),
        r#"{"__metadata__":{"k":"v"},"d":{"dtype":"C64","shape":[1],"data_offsets":[0,8]},"c":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"b":{"dtype":"U32","shape":[1],"data_offsets":[12,16]},"a":{"dtype":"I32","shape":[1],"data_offsets":[16,20]}}"#
    );
    assert_eq!(n % 8, 0);
    let empty = zt::formats::safetensors::to_bytes(&tensors[..1], Some(&[])).unwrap();
    assert!(empty[8..].starts_with(br#"{"__metadata__":{},"a":"#));
    let none = zt::formats::safetensors::to_bytes(&tensors[..1], None).unwrap();
    assert!(none[8..].starts_with(br#"{"a":"#));
    // The file writer writes the same bytes.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.safetensors");
    zt::formats::safetensors::write_with(&path, &tensors, Some(&[("k".into(), "v".into())]))
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}
