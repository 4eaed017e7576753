//! PyTorch checkpoints: writer round trips and hostile archives, asserted
//! by exact `Error` variant and rule. (Fixtures made by torch are checked in
//! tests/test_pt.py; malicious pickles in tests/test_pt_malicious.py.)

#[macro_use]
#[path = "support/cites.rs"]
mod cites;

use std::path::Path;

use zt::zip::{write_stored_aligned, Member};
use zt::{DType, Error, Limits, Source, TensorIn};

fn s(text: &str) -> Vec<u8> {
    let mut v = vec![b'X'];
    v.extend_from_slice(&(text.len() as u32).to_le_bytes());
    v.extend_from_slice(text.as_bytes());
    v
}

fn int(v: i32) -> Vec<u8> {
    let mut out = vec![b'J'];
    out.extend_from_slice(&v.to_le_bytes());
    out
}

/// `_rebuild_tensor_v2` of float storage "0" declaring `numel` elements.
fn tensor(numel: i32, offset: i32, shape: &[i32], stride: &[i32]) -> Vec<u8> {
    let mut p = b"ctorch._utils\n_rebuild_tensor_v2\n((".to_vec();
    p.extend(s("storage"));
    p.extend_from_slice(b"ctorch\nFloatStorage\n");
    p.extend(s("0"));
    p.extend(s("cpu"));
    p.extend(int(numel));
    p.extend_from_slice(b"tQ");
    p.extend(int(offset));
    p.push(b'(');
    shape.iter().for_each(|&d| p.extend(int(d)));
    p.extend_from_slice(b"t(");
    stride.iter().for_each(|&d| p.extend(int(d)));
    p.extend_from_slice(b"t\x89}tR");
    p
}

fn state_dict(value: &[u8]) -> Vec<u8> {
    let mut p = b"\x80\x02}(".to_vec();
    p.extend(s("w"));
    p.extend_from_slice(value);
    p.extend_from_slice(b"u.");
    p
}

const W: [u8; 16] = [0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 128, 64];

fn archive(path: &Path, pickle: &[u8], data: &[u8]) {
    let members = [
        Member {
            name: "ckpt/data.pkl".into(),
            parts: [pickle, &[]],
            crc: crc32fast::hash(pickle),
        },
        Member {
            name: "ckpt/data/0".into(),
            parts: [data, &[]],
            crc: crc32fast::hash(data),
        },
    ];
    let mut out = Vec::new();
    write_stored_aligned(&mut out, &members, 64).unwrap();
    std::fs::write(path, out).unwrap();
}

fn open_with(path: &Path, limits: Limits) -> zt::Result<Source> {
    zt::open_with(
        path,
        &zt::OpenOptions {
            limits,
            ..Default::default()
        },
    )
}

#[test]
fn a_plain_state_dict_opens_zero_copy_under_any_root() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.pt");
    archive(&path, &state_dict(&tensor(4, 0, &[2, 2], &[2, 1])), &W);
    let src = zt::open(&path).unwrap();
    assert_eq!(src.format(), "pt");
    let part = src.tensor("w").unwrap().data().unwrap();
    assert_eq!(part.shape(), &[2, 2]);
    assert!(part.caps().map);
    assert_eq!(part.map().unwrap(), &W);
}

#[test]
fn transposed_views_keep_their_strides() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.pt");
    archive(&path, &state_dict(&tensor(4, 0, &[2, 2], &[1, 2])), &W);
    let src = zt::open(&path).unwrap();
    let part = src.tensor("w").unwrap().data().unwrap();
    assert_eq!(part.strides(), vec![1, 2]);
    assert!(!part.is_contiguous());
    let c: Vec<u8> = [1.0f32, 3.0, 2.0, 4.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    assert_eq!(&part.bytes().unwrap()[..], &c[..]);
}

#[test]
fn lying_storage_sizes_are_range_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lie.pt");
    for numel in [3, 5, i32::MAX] {
        archive(&path, &state_dict(&tensor(numel, 0, &[3], &[1])), &W);
        assert!(
            cites!(zt::open(&path), Err(Error::Range { .. }), &["pt.Storage"]),
            "{numel}"
        );
    }
}

#[test]
fn strides_past_the_storage_are_range_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reach.pt");
    archive(&path, &state_dict(&tensor(4, 2, &[2, 2], &[1, 1])), &W);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Range { .. }),
        &["pt.Storage"]
    ));
    archive(&path, &state_dict(&tensor(4, 0, &[2], &[4])), &W);
    assert!(cites!(
        zt::open(&path),
        Err(Error::Range { .. }),
        &["pt.Storage"]
    ));
}

#[test]
fn hostile_pickles_fail_by_variant() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.pt");
    type Case = (Vec<u8>, fn(&Error) -> bool);
    let cases: Vec<Case> = vec![
        (b"\x80\x02}(".to_vec(), |e| {
            matches!(e, Error::Truncated { .. })
        }),
        (b"\x80\x02\xff.".to_vec(), |e| {
            cites!(e, Error::Header { .. }, &["pt.Pickle"])
        }),
        (b"\x80\x02h\x07.".to_vec(), |e| {
            cites!(e, Error::Header { .. }, &["pt.Pickle"])
        }),
        (b"\x80\x02]Ns.".to_vec(), |e| {
            cites!(e, Error::Header { .. }, &["pt.Pickle"])
        }),
        (b"\x80\x02)Na.".to_vec(), |e| {
            cites!(e, Error::Header { .. }, &["pt.Pickle"])
        }),
        (
            [b"\x80\x02".as_slice(), &[b'('; 2_000_000], b"."].concat(),
            |e| {
                matches!(
                    e,
                    Error::Limit {
                        limit: "pickle_stack",
                        ..
                    }
                )
            },
        ),
        (
            state_dict(&[&[b']'; 5000][..], &[b'a'; 4999]].concat()),
            |e| {
                matches!(
                    e,
                    Error::Limit {
                        limit: "pickle_depth",
                        ..
                    }
                )
            },
        ),
        (state_dict(b"ctorch._utils\n_rebuild_qtensor\n)R"), |e| {
            cites!(e, Error::Unsupported { .. }, &["pt.Unsupported"])
        }),
        (
            state_dict(b"ctorch._utils\n_rebuild_tensor_v3\n((Xstorage\0\0\0\0"),
            |e| {
                cites!(
                    e,
                    Error::Truncated { .. } | Error::Header { .. },
                    &["core.Truncated"]
                )
            },
        ),
    ];
    for (i, (pickle, want)) in cases.into_iter().enumerate() {
        archive(&path, &pickle, &W);
        let err = zt::open(&path).expect_err(&format!("case {i}"));
        assert!(want(&err), "case {i}: {err:?}");
    }
}

#[test]
fn memo_doubling_is_walked_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bomb.pt");
    let mut bomb = b"]q\x00".to_vec();
    for _ in 0..64 {
        bomb.extend_from_slice(b"h\x00h\x00\x86q\x00");
    }
    let mut p = b"\x80\x02}(".to_vec();
    p.extend(s("w"));
    p.extend(tensor(4, 0, &[4], &[1]));
    p.extend(s("bomb"));
    p.extend(bomb);
    p.extend_from_slice(b"u.");
    archive(&path, &p, &W);
    let src = zt::open(&path).unwrap();
    assert_eq!(src.len(), 1);
    // With a tensor at the bottom, the tree of paths hits a limit.
    let mut p = b"\x80\x02".to_vec();
    p.extend(tensor(4, 0, &[4], &[1]));
    p.extend_from_slice(b"q\x00");
    for _ in 0..64 {
        p.extend_from_slice(b"h\x00h\x00\x86q\x00");
    }
    p.push(b'.');
    archive(&path, &p, &W);
    let limits = Limits {
        tensors: 1000,
        ..Limits::default()
    };
    assert!(matches!(
        open_with(&path, limits),
        Err(Error::Limit {
            limit: "tensors",
            ..
        })
    ));
}

#[test]
fn writer_round_trips_every_torch_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.pt");
    let dtypes = [
        DType::F64,
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::Complex64,
        DType::Complex128,
        DType::F8E4M3Fn,
        DType::F8E5M2,
        DType::F8E4M3Fnuz,
        DType::F8E5M2Fnuz,
        DType::F8E8M0,
    ];
    let names: Vec<String> = dtypes.iter().map(|d| format!("t.{d}")).collect();
    let data: Vec<Vec<u8>> = dtypes
        .iter()
        .map(|d| (0..6 * d.size().unwrap()).map(|i| (i % 2) as u8).collect())
        .collect();
    let shape = [2u64, 3];
    let inputs: Vec<TensorIn<'_>> = dtypes
        .iter()
        .zip(&names)
        .zip(&data)
        .map(|((&dtype, name), data)| TensorIn {
            name,
            dtype,
            shape: &shape,
            data,
        })
        .collect();
    zt::formats::pt::write(&path, &inputs).unwrap();
    let src = zt::open(&path).unwrap();
    assert_eq!(
        src.names().collect::<Vec<_>>(),
        names.iter().map(String::as_str).collect::<Vec<_>>()
    );
    for (t, want) in src.tensors().zip(&inputs) {
        let part = t.data().unwrap();
        assert_eq!(part.dtype(), want.dtype);
        assert_eq!(part.shape(), want.shape);
        assert_eq!(part.map().unwrap(), want.data);
        assert_eq!(part.locate().unwrap().offset % 64, 0);
    }
    // Through the FormatWriter registry too.
    let again = dir.path().join("again.pth");
    zt::convert(&src, &again, &zt::WriteOptions::default()).unwrap();
    assert_eq!(zt::open(&again).unwrap().len(), dtypes.len());
    // Types torch cannot hold are refused.
    let packed = [0u8; 1];
    let fp4 = TensorIn {
        name: "x",
        dtype: DType::F4E2M1,
        shape: &[2],
        data: &packed,
    };
    assert!(cites!(
        zt::formats::pt::write(&path, &[fp4]),
        Err(Error::Write { .. }),
        &["write.DType"]
    ));
}

/// Every torch-made fixture's pickle, truncated at every length and with
/// every byte replaced by a few values: the machine and the tensor search
/// return an error or a value, never panic.
#[test]
fn mutated_fixture_pickles_never_panic() {
    use zt::formats::pt::pickle::Vm;
    use zt::formats::pt::rebuild::{find_tensors, TorchInterp};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/pt");
    let limits = Limits {
        pickle_ops: 1 << 14,
        ..Limits::default()
    };
    let ctx = zt::Context::default();
    let mut checked = 0;
    for file in ["checkpoint.pt", "protocol4.pt", "nested.pt"] {
        let store = zt::Store::open(dir.join(file)).unwrap();
        let entries = zt::zip::read_entries(&store, &ctx, &limits).unwrap();
        let pkl = entries
            .iter()
            .find(|e| e.name.ends_with("/data.pkl"))
            .unwrap();
        let bytes = zt::zip::member_bytes(&store, &ctx, pkl, &limits, ("pickle_bytes", 1 << 20))
            .unwrap()
            .into_owned();
        let run = |data: &[u8]| {
            let mut vm = Vm::new(ctx.clone(), &limits);
            let mut interp = TorchInterp::default();
            if let Ok((root, _)) = vm.run(data, 0, &mut interp) {
                let _ = find_tensors(&vm, root, "root");
            }
        };
        for len in 0..bytes.len() {
            run(&bytes[..len]);
        }
        let mut data = bytes.clone();
        for i in 0..data.len() {
            let original = data[i];
            for v in [0x00, 0xff, original.wrapping_add(1)] {
                data[i] = v;
                run(&data);
                checked += 1;
            }
            data[i] = original;
        }
    }
    assert!(checked > 1_000, "{checked}");
}
