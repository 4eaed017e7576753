//! ONNX reading on protobuf built byte by byte here, so every hostile
//! shape can be made exactly (the comparisons against `onnx` itself live
//! in tests/test_onnx.py).
//!
//! Every failure asserts the exact `Error` variant.

#[path = "support/dir.rs"]
mod dir;
use dir::Dir;
#[macro_use]
#[path = "support/cites.rs"]
mod cites;

use std::path::Path;
use std::sync::Arc;

use zt::formats::onnx::Onnx;
use zt::{Catalog, DType, Error, Format, Limits, OpenInput, OpenOptions, Source, Store};

// ------------------------------------------------------- protobuf writer

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// A varint field.
fn fv(field: u64, v: u64) -> Vec<u8> {
    let mut out = varint(field << 3);
    out.extend(varint(v));
    out
}

/// A length-delimited field.
fn fl(field: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = varint(field << 3 | 2);
    out.extend(varint(bytes.len() as u64));
    out.extend_from_slice(bytes);
    out
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

/// A TensorProto header: name, data_type, dims (packed).
fn tensor_head(name: &str, data_type: u64, dims: &[u64]) -> Vec<u8> {
    let packed: Vec<u8> = dims.iter().flat_map(|&d| varint(d)).collect();
    cat(&[fl(1, &packed), fv(2, data_type), fl(8, name.as_bytes())])
}

fn raw_tensor(name: &str, data_type: u64, dims: &[u64], raw: &[u8]) -> Vec<u8> {
    cat(&[tensor_head(name, data_type, dims), fl(9, raw)])
}

fn graph(parts: &[Vec<u8>]) -> Vec<u8> {
    cat(parts)
}

fn initializer(tensor: &[u8]) -> Vec<u8> {
    fl(5, tensor)
}

/// A ModelProto: ir_version 9, then the graph.
fn model(graph: &[u8]) -> Vec<u8> {
    cat(&[fv(1, 9), fl(2, b"zt-test"), fl(7, graph)])
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

// ------------------------------------------------------------- helpers

fn bytes_of(source: &Source, name: &str) -> zt::Result<Vec<u8>> {
    Ok(source.tensor(name)?.data()?.bytes()?.into_owned())
}

/// Run the plugin directly, bypassing the sniff.
fn plugin_open(path: &Path) -> zt::Result<Catalog> {
    let store = Arc::new(Store::open(path).unwrap());
    Onnx.open(&OpenInput::new(&store, &Limits::default()))
}

fn open_bytes(dir: &Dir, bytes: &[u8]) -> zt::Result<Source> {
    zt::open(dir.file("m.onnx", bytes))
}

// ------------------------------------------------------------ reading

#[test]
fn raw_data_is_a_zero_copy_range_at_its_file_offset() {
    let dir = Dir::new();
    let data = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let file = model(&graph(&[initializer(&raw_tensor("w", 1, &[2, 3], &data))]));
    let source = open_bytes(&dir, &file).unwrap();
    assert_eq!(source.format(), "onnx");
    let part = source.tensor("w").unwrap().data().unwrap();
    assert_eq!((part.dtype(), part.shape()), (DType::F32, &[2u64, 3][..]));
    let at = file.windows(data.len()).position(|w| w == data).unwrap() as u64;
    assert_eq!(part.locate().unwrap().offset, at);
    assert_eq!(&part.bytes().unwrap()[..], &data[..]);
    assert_eq!(part.caps().map, at % 4 == 0);
}

#[test]
fn typed_fields_packed_in_chunks_and_unpacked_decode_in_order() {
    let dir = Dir::new();
    // float_data: a packed chunk of two, one unpacked fixed32, a packed chunk of one.
    let mut single = varint(4 << 3 | 5);
    single.extend(3.0f32.to_le_bytes());
    let floats = cat(&[
        tensor_head("f", 1, &[4]),
        fl(4, &f32s(&[1.0, 2.0])),
        single,
        fl(4, &f32s(&[4.0])),
    ]);
    // int32_data for f16 bit patterns (one unpacked, two packed) and
    // negative int8 (sign-extended ten-byte varints).
    let halfs = cat(&[
        tensor_head("h", 10, &[3]),
        fv(5, 0x3c00),
        fl(5, &cat(&[varint(0x4000), varint(0xc000)])),
    ]);
    let int8 = cat(&[
        tensor_head("i", 3, &[2]),
        fl(5, &cat(&[varint(-1i64 as u64), varint(-128i64 as u64)])),
    ]);
    let i64s = cat(&[tensor_head("l", 7, &[1]), fv(7, -5i64 as u64)]);
    let file = model(&graph(&[
        initializer(&floats),
        initializer(&halfs),
        initializer(&int8),
        initializer(&i64s),
    ]));
    let source = open_bytes(&dir, &file).unwrap();
    assert_eq!(bytes_of(&source, "f").unwrap(), f32s(&[1.0, 2.0, 3.0, 4.0]));
    assert_eq!(
        bytes_of(&source, "h").unwrap(),
        vec![0x00, 0x3c, 0x00, 0x40, 0x00, 0xc0]
    );
    assert_eq!(bytes_of(&source, "i").unwrap(), vec![0xff, 0x80]);
    assert_eq!(bytes_of(&source, "l").unwrap(), (-5i64).to_le_bytes());
    let part = source.tensor("f").unwrap().data().unwrap();
    assert!(!part.caps().map && part.locate().is_none());
}

#[test]
fn subgraph_and_constant_names_are_scoped() {
    let dir = Dir::new();
    let body = graph(&[initializer(&raw_tensor("w", 2, &[1], &[7]))]);
    let attr_g = cat(&[fl(1, b"then_branch"), fl(6, &body)]);
    let if_node = cat(&[fl(3, b"If_0"), fl(4, b"If"), fl(5, &attr_g)]);
    let attr_t = cat(&[fl(1, b"value"), fl(5, &raw_tensor("", 2, &[1], &[9]))]);
    let constant = cat(&[fl(2, b"c"), fl(4, b"Constant"), fl(5, &attr_t)]);
    let file = model(&graph(&[
        fl(1, &if_node),
        fl(1, &constant),
        initializer(&raw_tensor("w", 2, &[1], &[5])),
    ]));
    let source = open_bytes(&dir, &file).unwrap();
    let names: Vec<&str> = source.names().collect();
    assert_eq!(names, ["If_0/then_branch/w", "c", "w"]);
    assert_eq!(bytes_of(&source, "If_0/then_branch/w").unwrap(), [7]);
    assert_eq!(bytes_of(&source, "c").unwrap(), [9]);
}

#[test]
fn external_data_is_mapped_from_the_data_file() {
    let dir = Dir::new();
    let data = f32s(&[1.5, 2.5]);
    let mut blob = vec![0u8; 4096];
    blob.extend(&data);
    dir.file("w.bin", &blob);
    let file = model(&graph(&[initializer(&external(
        "w",
        "w.bin",
        4096,
        Some(8),
    ))]));
    let source = open_bytes(&dir, &file).unwrap();
    assert_eq!(source.files().len(), 2);
    let part = source.tensor("w").unwrap().data().unwrap();
    assert!(part.caps().map);
    assert_eq!(part.map().unwrap(), &data[..]);
    assert_eq!(
        part.locate().unwrap().path,
        dir.path("w.bin").canonicalize().unwrap()
    );
}

fn external(name: &str, location: &str, offset: u64, length: Option<u64>) -> Vec<u8> {
    let entry = |k: &str, v: &str| fl(13, &cat(&[fl(1, k.as_bytes()), fl(2, v.as_bytes())]));
    let mut t = cat(&[
        tensor_head(name, 1, &[2]),
        entry("location", location),
        entry("offset", &offset.to_string()),
    ]);
    if let Some(n) = length {
        t.extend(entry("length", &n.to_string()));
    }
    t.extend(fv(14, 1));
    t
}

// ------------------------------------------------------------- hostile

#[test]
fn a_length_that_lies_is_truncated() {
    let dir = Dir::new();
    // The initializer claims 200 bytes; the graph holds fewer.
    let mut lie = varint(5 << 3 | 2);
    lie.extend(varint(200));
    lie.extend(raw_tensor("w", 2, &[1], &[1]));
    let file = model(&lie);
    assert!(matches!(
        open_bytes(&dir, &file),
        Err(Error::Truncated { .. })
    ));
    // At the top level the sniff already refuses it; the plugin says why.
    let mut top = fv(1, 9);
    top.extend(varint(7 << 3 | 2));
    top.extend(varint(1000));
    let path = dir.file("top.onnx", &top);
    assert!(matches!(plugin_open(&path), Err(Error::Truncated { .. })));
}

#[test]
fn a_truncated_varint_is_truncated() {
    let dir = Dir::new();
    // The graph ends inside a tag's varint.
    let file = model(&[0x80, 0x80]);
    assert!(matches!(
        open_bytes(&dir, &file),
        Err(Error::Truncated { .. })
    ));
    // A packed int32_data chunk that ends inside a varint.
    let t = cat(&[tensor_head("i", 6, &[1]), fl(5, &[0x81])]);
    let file = model(&graph(&[initializer(&t)]));
    assert!(matches!(
        open_bytes(&dir, &file),
        Err(Error::Truncated { .. })
    ));
}

#[test]
fn a_field_past_the_end_of_file_is_truncated() {
    let dir = Dir::new();
    // raw_data declares 64 bytes, the file ends after 4: every enclosing
    // length is made to agree, so only the innermost one lies.
    let mut t = tensor_head("w", 1, &[16]);
    t.extend(varint(9 << 3 | 2));
    t.extend(varint(64));
    t.extend(f32s(&[1.0]));
    let init = cat(&[varint(5 << 3 | 2), varint(t.len() as u64 + 60), t]);
    let file = cat(&[
        fv(1, 9),
        varint(7 << 3 | 2),
        varint(init.len() as u64 + 60),
        init,
    ]);
    let path = dir.file("m.onnx", &file);
    assert!(matches!(plugin_open(&path), Err(Error::Truncated { .. })));
}

#[test]
fn external_paths_that_escape_are_refused() {
    let outer = Dir::new();
    let secret = outer.file("secret.bin", &f32s(&[1.0, 2.0]));
    let model_dir = outer.path("model");
    std::fs::create_dir(&model_dir).unwrap();
    std::os::unix::fs::symlink(&secret, model_dir.join("link.bin")).unwrap();
    std::fs::create_dir(model_dir.join("sub")).unwrap();
    let absolute = secret.to_str().unwrap().to_string();
    for location in [
        "../secret.bin",
        absolute.as_str(),
        "link.bin",
        "sub/../../secret.bin",
        "sub",
    ] {
        let file = model(&graph(&[initializer(&external("w", location, 0, Some(8)))]));
        let path = model_dir.join("m.onnx");
        std::fs::write(&path, file).unwrap();
        let got = zt::open(&path);
        assert!(
            cites!(got, Err(Error::Header { .. }), &["core.Location"]),
            "{location}: {got:?}"
        );
    }
}

#[test]
fn external_ranges_past_the_data_file_are_truncated() {
    let dir = Dir::new();
    dir.file("w.bin", &f32s(&[1.0, 2.0, 3.0]));
    for (offset, length) in [(8, Some(8)), (16, None), (u64::MAX - 2, Some(8))] {
        let file = model(&graph(&[initializer(&external(
            "w", "w.bin", offset, length,
        ))]));
        let got = open_bytes(&dir, &file);
        assert!(
            matches!(got, Err(Error::Truncated { .. } | Error::Overflow { .. })),
            "{offset}: {got:?}"
        );
    }
    // A length that does not match the tensor is a range error.
    let file = model(&graph(&[initializer(&external("w", "w.bin", 0, Some(12)))]));
    assert!(cites!(
        open_bytes(&dir, &file),
        Err(Error::Range { .. }),
        &["onnx.Size"]
    ));
    // A missing data file.
    let file = model(&graph(&[initializer(&external(
        "w",
        "nope.bin",
        0,
        Some(8),
    ))]));
    assert!(matches!(
        open_bytes(&dir, &file),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn nesting_deeper_than_the_limit_is_refused() {
    let dir = Dir::new();
    let mut g = graph(&[initializer(&raw_tensor("w", 2, &[1], &[1]))]);
    for _ in 0..10 {
        let attr = cat(&[fl(1, b"body"), fl(6, &g)]);
        g = fl(1, &cat(&[fl(4, b"Loop"), fl(5, &attr)]));
    }
    let path = dir.file("m.onnx", &model(&g));
    let limits = Limits {
        depth: 5,
        ..Limits::default()
    };
    let got = zt::open_with(
        &path,
        &OpenOptions {
            limits,
            ..Default::default()
        },
    );
    assert!(
        matches!(got, Err(Error::Limit { limit: "depth", .. })),
        "{got:?}"
    );
    let source = zt::open(&path).unwrap();
    assert_eq!(source.len(), 1);
    assert!(source.names().next().unwrap().ends_with("/body/w"));
}

#[test]
fn string_tensors_are_listed_as_skipped() {
    let dir = Dir::new();
    let s = cat(&[tensor_head("s", 8, &[2, 1]), fl(6, b"x"), fl(6, b"yz")]);
    let w = raw_tensor("w", 1, &[2], &f32s(&[1.0, 2.0]));
    let file = model(&graph(&[initializer(&s), initializer(&w)]));
    let source = open_bytes(&dir, &file).unwrap();
    assert_eq!(source.names().collect::<Vec<_>>(), ["w"]);
    let skipped = source
        .attributes()
        .iter()
        .find(|(k, _)| k == "onnx.skipped")
        .map(|(_, v)| v.clone());
    let Some(zt::Value::List(entries)) = skipped else {
        panic!("no onnx.skipped: {:?}", source.attributes())
    };
    let [zt::Value::Map(entry)] = &entries[..] else {
        panic!("{entries:?}")
    };
    let field = |k: &str| entry.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(field("name"), Some(zt::Value::Str("s".into())));
    assert_eq!(
        field("shape"),
        Some(zt::Value::List(vec![zt::Value::Int(2), zt::Value::Int(1)]))
    );
}

#[test]
fn types_without_a_zt_dtype_are_refused() {
    let dir = Dir::new();
    for code in [25, 26, 0, 99] {
        let t = cat(&[tensor_head("s", code, &[1]), fl(6, b"x")]);
        let file = model(&graph(&[initializer(&t)]));
        let got = open_bytes(&dir, &file);
        assert!(
            matches!(got, Err(Error::UnsupportedDType { .. })),
            "{code}: {got:?}"
        );
    }
}

#[test]
fn element_counts_that_disagree_with_dims_are_range_errors() {
    let dir = Dir::new();
    let raw = raw_tensor("w", 1, &[3], &f32s(&[1.0, 2.0]));
    let typed = cat(&[tensor_head("t", 1, &[3]), fl(4, &f32s(&[1.0]))]);
    // Elements in a field that is not the dtype's.
    let wrong = cat(&[tensor_head("x", 7, &[1]), fv(5, 1)]);
    for t in [raw, typed, wrong] {
        let file = model(&graph(&[initializer(&t)]));
        assert!(cites!(
            open_bytes(&dir, &file),
            Err(Error::Range { .. }),
            &["onnx.Size"]
        ));
    }
}

#[test]
fn malformed_tensors_are_header_errors() {
    let dir = Dir::new();
    let negative = raw_tensor("w", 2, &[-1i64 as u64], &[]);
    let ragged_floats = cat(&[tensor_head("f", 1, &[1]), fl(4, &[0, 0, 0])]);
    let group = cat(&[tensor_head("g", 1, &[1]), vec![0x0b]]);
    for t in [negative, ragged_floats, group] {
        let file = model(&graph(&[initializer(&t)]));
        let got = open_bytes(&dir, &file);
        assert!(
            cites!(
                got,
                Err(Error::Header { .. }),
                &["onnx.Protobuf", "onnx.Tensor"]
            ),
            "{got:?}"
        );
    }
}

#[test]
fn too_many_tensors_or_dims_hit_the_limits() {
    let dir = Dir::new();
    let inits: Vec<Vec<u8>> = (0..5)
        .map(|i| initializer(&raw_tensor(&format!("w{i}"), 2, &[1], &[1])))
        .collect();
    let path = dir.file("m.onnx", &model(&graph(&inits)));
    let limits = Limits {
        tensors: 3,
        ..Limits::default()
    };
    let got = zt::open_with(
        &path,
        &OpenOptions {
            limits,
            ..Default::default()
        },
    );
    assert!(matches!(
        got,
        Err(Error::Limit {
            limit: "tensors",
            ..
        })
    ));
    let deep = raw_tensor("w", 2, &[1; 100], &[1]);
    let file = model(&graph(&[initializer(&deep)]));
    let got = open_bytes(&dir, &file);
    assert!(matches!(got, Err(Error::Limit { limit: "rank", .. })));
}

#[test]
fn duplicate_names_in_one_scope_are_refused() {
    let dir = Dir::new();
    let t = initializer(&raw_tensor("w", 2, &[1], &[1]));
    let file = model(&graph(&[t.clone(), t]));
    assert!(matches!(
        open_bytes(&dir, &file),
        Err(Error::DuplicateName { .. })
    ));
}

#[test]
fn sparse_linear_indices_outside_the_shape_fail_on_read() {
    let dir = Dir::new();
    let values = raw_tensor("sp", 1, &[2], &f32s(&[1.0, 2.0]));
    let indices = raw_tensor(
        "i",
        7,
        &[2],
        &cat(&[5i64.to_le_bytes().to_vec(), 99i64.to_le_bytes().to_vec()]),
    );
    let dims: Vec<u8> = cat(&[varint(2), varint(3)]);
    let sparse = cat(&[fl(1, &values), fl(2, &indices), fl(3, &dims)]);
    let file = model(&graph(&[fl(15, &sparse)]));
    let source = open_bytes(&dir, &file).unwrap();
    let t = source.tensor("sp").unwrap();
    assert_eq!(t.layout(), "zt.sparse_coo/1");
    assert_eq!(
        &t.part("values").unwrap().bytes().unwrap()[..],
        &f32s(&[1.0, 2.0])[..]
    );
    let coords = t.part("coords").unwrap();
    assert!(cites!(
        coords.bytes(),
        Err(Error::Decode { .. }),
        &["onnx.Sparse"]
    ));
}

#[test]
fn the_sniff_wants_model_proto_fields() {
    let dir = Dir::new();
    let good = model(&graph(&[]));
    assert_eq!(zt::detect(dir.file("a.bin", &good)).unwrap(), "onnx");
    // A field number ModelProto does not have, or the wrong wire type.
    for bad in [fv(9, 1), fl(1, b"x"), vec![0x08], b"hello world".to_vec()] {
        let got = zt::detect(dir.file("b.bin", &bad));
        assert!(
            matches!(got, Err(Error::UnknownFormat { .. })),
            "{bad:?}: {got:?}"
        );
    }
}

#[test]
fn external_data_beyond_two_gib_reads() {
    // Models over 2 GB must keep their weights in external files; a sparse
    // 3 GiB data file with a tensor past the 2 GiB (and 32-bit) marks.
    let dir = Dir::new();
    let path = dir.path("big.bin");
    let file = std::fs::File::create(&path).unwrap();
    let offset = (2u64 << 30) + (1 << 30) - 4096;
    file.set_len(3 << 30).unwrap();
    use std::os::unix::fs::FileExt;
    let data = f32s(&[7.0, 8.0]);
    file.write_at(&data, offset).unwrap();
    let m = model(&graph(&[initializer(&external(
        "w",
        "big.bin",
        offset,
        Some(8),
    ))]));
    let source = open_bytes(&dir, &m).unwrap();
    let part = source.tensor("w").unwrap().data().unwrap();
    assert_eq!(part.locate().unwrap().offset, offset);
    assert_eq!(part.map().unwrap(), &data[..]);
}

#[test]
fn positional_stores_read_the_same_bytes() {
    let dir = Dir::new();
    let data = f32s(&[1.5, 2.5]);
    dir.file("w.bin", &data);
    let typed = cat(&[tensor_head("t", 1, &[2]), fl(4, &data)]);
    let file = model(&graph(&[
        initializer(&external("e", "w.bin", 0, Some(8))),
        initializer(&raw_tensor("r", 1, &[2], &data)),
        initializer(&typed),
    ]));
    let path = dir.file("m.onnx", &file);
    let source = zt::open_with(
        &path,
        &OpenOptions {
            map: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    for name in ["e", "r", "t"] {
        let part = source.tensor(name).unwrap().data().unwrap();
        assert!(!part.caps().map);
        assert_eq!(&part.bytes().unwrap()[..], &data[..], "{name}");
    }
}
