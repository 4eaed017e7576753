//! Per-rank DTensor files (`zt::open_ranks`): hand-built `torch.save`
//! archives whose values are DTensors pickled as torch 2.15 pickles them
//! (`_rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, ...)` with a
//! `DTensorSpec`, `DeviceMesh`, `_MeshLayout` and placements as inert
//! objects), merged, and every refusal asserted by variant and rule.
//! Files saved by torch itself under torchrun are checked in
//! tests/torch/test_fsdp_ranks.py.

#[macro_use]
#[path = "support/cites.rs"]
mod cites;

use std::path::{Path, PathBuf};

use zt::zip::{write_stored_aligned, Member};
use zt::{Error, Value};

fn s(text: &str) -> Vec<u8> {
    let mut v = vec![b'X'];
    v.extend_from_slice(&(text.len() as u32).to_le_bytes());
    v.extend_from_slice(text.as_bytes());
    v
}

fn int(v: u64) -> Vec<u8> {
    let mut out = vec![b'J'];
    out.extend_from_slice(&(v as i32).to_le_bytes());
    out
}

fn global(module: &str, name: &str) -> Vec<u8> {
    format!("c{module}\n{name}\n").into_bytes()
}

fn tuple(items: &[u64]) -> Vec<u8> {
    let mut p = vec![b'('];
    items.iter().for_each(|&d| p.extend(int(d)));
    p.push(b't');
    p
}

fn c_strides(shape: &[u64]) -> Vec<u64> {
    let mut out = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        out[d] = out[d + 1] * shape[d + 1].max(1);
    }
    out
}

/// `_rebuild_tensor_v2` of float storage `key`, C order.
fn tensor(key: &str, shape: &[u64]) -> Vec<u8> {
    let numel: u64 = shape.iter().product();
    let mut p = global("torch._utils", "_rebuild_tensor_v2");
    p.extend_from_slice(b"((");
    p.extend(s("storage"));
    p.extend(global("torch", "FloatStorage"));
    p.extend(s(key));
    p.extend(s("cpu"));
    p.extend(int(numel));
    p.extend_from_slice(b"tQ");
    p.extend(int(0));
    p.extend(tuple(shape));
    p.extend(tuple(&c_strides(shape)));
    p.extend_from_slice(b"\x89}tR");
    p
}

/// An object built as `cls()` then `BUILD` with a dict of `fields`.
fn object(module: &str, name: &str, fields: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut p = global(module, name);
    p.extend_from_slice(b")\x81");
    if !fields.is_empty() {
        p.extend_from_slice(b"}(");
        for (k, v) in fields {
            p.extend(s(k));
            p.extend_from_slice(v);
        }
        p.extend_from_slice(b"ub");
    }
    p
}

#[derive(Clone)]
enum P {
    Shard(u64),
    Strided(u64, u64),
    Replicate,
    Partial,
}

/// One DTensor of rank `rank` on a mesh of `mesh` (ranks in C order).
struct DT<'a> {
    key: &'a str,
    local: Vec<u64>,
    global: Vec<u64>,
    mesh: Vec<u64>,
    placements: Vec<P>,
    rank: u64,
}

fn dtensor(d: &DT) -> Vec<u8> {
    let n: u64 = d.mesh.iter().product();
    let mut coordinate = vec![0u64; d.mesh.len()];
    let mut r = d.rank;
    for (i, &m) in d.mesh.iter().enumerate().rev() {
        coordinate[i] = r % m;
        r /= m;
    }
    let strides = c_strides(&d.mesh);
    let mut axes = vec![b'('];
    for (&m, &st) in d.mesh.iter().zip(&strides) {
        axes.extend(object(
            "torch.distributed._mesh_layout",
            "_FlatLayout",
            &[("shape", tuple(&[m])), ("stride", tuple(&[st]))],
        ));
    }
    axes.push(b't');
    let layout = object(
        "torch.distributed._mesh_layout",
        "_MeshLayout",
        &[("axes", axes)],
    );
    let ranks: Vec<u64> = (0..n).collect();
    let mesh = object(
        "torch.distributed.device_mesh",
        "DeviceMesh",
        &[
            ("_device_type", s("cpu")),
            ("_layout", layout),
            ("_rank", int(d.rank)),
            ("_flatten_rank_map", tuple(&ranks)),
            ("_coordinate_on_dim", tuple(&coordinate)),
        ],
    );
    let mut placements = vec![b'('];
    for p in &d.placements {
        let types = "torch.distributed.tensor.placement_types";
        placements.extend(match p {
            P::Shard(dim) => object(types, "Shard", &[("dim", int(*dim))]),
            P::Strided(dim, split) => object(
                types,
                "_StridedShard",
                &[("dim", int(*dim)), ("split_factor", int(*split))],
            ),
            P::Replicate => object(types, "Replicate", &[]),
            P::Partial => object(types, "Partial", &[("reduce_op", s("sum"))]),
        });
    }
    placements.push(b't');
    let spec = object(
        "torch.distributed.tensor._dtensor_spec",
        "DTensorSpec",
        &[("mesh", mesh), ("placements", placements)],
    );
    let mut p = global("torch._tensor", "_rebuild_from_type_v2");
    p.push(b'(');
    p.extend(global("torch._utils", "_rebuild_wrapper_subclass"));
    p.extend(global("torch.distributed.tensor", "DTensor"));
    p.push(b'(');
    p.extend(global("torch.distributed.tensor", "DTensor"));
    p.extend(global("torch", "float32"));
    p.extend(tuple(&d.global));
    p.extend(tuple(&c_strides(&d.global)));
    p.extend(int(0));
    // The state is `(None, {...})`, as torch pickles it.
    p.extend_from_slice(b"NN\x89tN}(");
    p.extend(s("_local_tensor"));
    p.extend(tensor(d.key, &d.local));
    p.extend(s("_spec"));
    p.extend(spec);
    p.extend_from_slice(b"u\x86tR");
    p
}

/// A `torch.save` archive of a dict of `(name, pickled value, f32 data)`.
fn archive(path: &Path, entries: &[(&str, Vec<u8>, Vec<f32>)]) {
    let mut pickle = b"\x80\x02}(".to_vec();
    for (name, value, _) in entries {
        pickle.extend(s(name));
        pickle.extend_from_slice(value);
    }
    pickle.extend_from_slice(b"u.");
    let data: Vec<Vec<u8>> = entries
        .iter()
        .map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let mut members = vec![Member {
        name: "ckpt/data.pkl".into(),
        parts: [&pickle, &[]],
        crc: crc32fast::hash(&pickle),
    }];
    for (i, d) in data.iter().enumerate() {
        members.push(Member {
            name: format!("ckpt/data/{i}"),
            parts: [d, &[]],
            crc: crc32fast::hash(d),
        });
    }
    let mut out = Vec::new();
    write_stored_aligned(&mut out, &members, 64).unwrap();
    std::fs::write(path, out).unwrap();
}

fn floats(range: std::ops::Range<u32>) -> Vec<f32> {
    range.map(|x| x as f32).collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Rank `rank` of `world` holding, out of a 5x2 tensor `w` (rows 0..10 as
/// floats) sharded `Shard(0)`: rows [3r, 3r+3) as torch.chunk splits 5 rows
/// over 2 (3, 2) or 4 ranks (2, 2, 1, 0); a replicated DTensor `r` (3
/// elements); and a plain tensor `b`.
fn rank_file(dir: &Path, name: &str, rank: u64, world: u64) -> PathBuf {
    let chunk = 5u64.div_ceil(world);
    let start = (chunk * rank).min(5);
    let rows = (start + chunk).min(5) - start;
    let w = DT {
        key: "0",
        local: vec![rows, 2],
        global: vec![5, 2],
        mesh: vec![world],
        placements: vec![P::Shard(0)],
        rank,
    };
    let r = DT {
        key: "1",
        local: vec![3],
        global: vec![3],
        mesh: vec![world],
        placements: vec![P::Replicate],
        rank,
    };
    let path = dir.join(name);
    archive(
        &path,
        &[
            (
                "w",
                dtensor(&w),
                floats(start as u32 * 2..(start + rows) as u32 * 2),
            ),
            ("r", dtensor(&r), vec![7.0, 8.0, 9.0]),
            ("b", tensor("2", &[2]), vec![1.0, 2.0]),
        ],
    );
    path
}

fn ranks(dir: &Path, world: u64) -> Vec<PathBuf> {
    (0..world)
        .map(|r| {
            rank_file(
                dir,
                &format!("model_world_size_{world}_rank_{r}.pt"),
                r,
                world,
            )
        })
        .collect()
}

#[test]
fn uneven_shards_replicas_and_buffers_merge() {
    let dir = tempfile::tempdir().unwrap();
    for world in [1, 2, 4] {
        let sub = dir.path().join(world.to_string());
        std::fs::create_dir(&sub).unwrap();
        let src = zt::open_ranks(&ranks(&sub, world)).unwrap();
        assert_eq!(src.names().collect::<Vec<_>>(), ["w", "r", "b"]);
        let w = src.tensor("w").unwrap();
        assert_eq!(w.shape(), &[5, 2]);
        assert_eq!(f32s(&w.data().unwrap().bytes().unwrap()), floats(0..10));
        let r = src.tensor("r").unwrap();
        assert_eq!(f32s(&r.data().unwrap().bytes().unwrap()), [7.0, 8.0, 9.0]);
        // Replicas are one rank's bytes, never concatenated.
        assert!(r.data().unwrap().caps().map);
        let b = src.tensor("b").unwrap();
        assert_eq!(f32s(&b.data().unwrap().bytes().unwrap()), [1.0, 2.0]);
        assert_eq!(src.files().len(), world as usize);
        assert!(w
            .attributes()
            .contains(&("dtensor.placements".into(), Value::Str("Shard(0)".into()))));
    }
}

#[test]
fn one_rank_file_lists_its_local_shards_with_placements() {
    let dir = tempfile::tempdir().unwrap();
    let path = rank_file(dir.path(), "model_world_size_4_rank_2.pt", 2, 4);
    let src = zt::open(&path).unwrap();
    let w = src.tensor("w").unwrap();
    assert_eq!(w.shape(), &[1, 2]);
    assert_eq!(f32s(&w.data().unwrap().bytes().unwrap()), [8.0, 9.0]);
    let attr = |k: &str| {
        w.attributes()
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    let ints = |v: &[i64]| Some(Value::List(v.iter().map(|&i| Value::Int(i)).collect()));
    assert_eq!(
        attr("dtensor.placements"),
        Some(Value::Str("Shard(0)".into()))
    );
    assert_eq!(attr("dtensor.global_shape"), ints(&[5, 2]));
    assert_eq!(attr("dtensor.mesh_shape"), ints(&[4]));
    assert_eq!(attr("dtensor.coordinate"), ints(&[2]));
    assert_eq!(attr("dtensor.rank"), Some(Value::Int(2)));
    // The plain tensor has no DTensor attributes.
    assert!(src.tensor("b").unwrap().attributes().is_empty());
}

#[test]
fn a_two_dimensional_mesh_merges_by_each_mesh_dimension() {
    // A 4x6 tensor over a 2x2 mesh, Shard(0) x Shard(1): rank (i, j) holds
    // rows [2i, 2i+2), columns [3j, 3j+3).
    let dir = tempfile::tempdir().unwrap();
    let full: Vec<f32> = floats(0..24);
    let mut paths = Vec::new();
    for rank in 0..4u64 {
        let (i, j) = (rank / 2, rank % 2);
        let mut local = Vec::new();
        for row in 2 * i..2 * i + 2 {
            for col in 3 * j..3 * j + 3 {
                local.push(full[(row * 6 + col) as usize]);
            }
        }
        let d = DT {
            key: "0",
            local: vec![2, 3],
            global: vec![4, 6],
            mesh: vec![2, 2],
            placements: vec![P::Shard(0), P::Shard(1)],
            rank,
        };
        let path = dir.path().join(format!("rank_{rank}.pt"));
        archive(&path, &[("t", dtensor(&d), local)]);
        paths.push(path);
    }
    let src = zt::open_ranks(&paths).unwrap();
    let t = src.tensor("t").unwrap();
    assert_eq!(t.shape(), &[4, 6]);
    assert_eq!(f32s(&t.data().unwrap().bytes().unwrap()), full);
}

#[test]
fn a_missing_rank_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let all = ranks(dir.path(), 4);
    // Named rank 0, 1, 3: rank 2 has no file.
    let gap = [all[0].clone(), all[1].clone(), all[3].clone()];
    let e = zt::open_ranks(&gap).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankMissing"]), "{e}");
    assert!(e.to_string().contains("rank 2"), "{e}");
    // The first three of four, by name: rank 3 is missing.
    let e = zt::open_ranks(&all[..3]).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankMissing"]), "{e}");
    // Unnamed files fewer than the mesh.
    for (i, p) in all.iter().enumerate().take(2) {
        std::fs::copy(p, dir.path().join(format!("part{i}.pt"))).unwrap();
    }
    let two = [dir.path().join("part0.pt"), dir.path().join("part1.pt")];
    let e = zt::open_ranks(&two).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankMissing"]), "{e}");
    let e = zt::open_ranks::<PathBuf>(&[]).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankMissing"]), "{e}");
}

#[test]
fn files_out_of_rank_order_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let all = ranks(dir.path(), 2);
    let swapped = [all[1].clone(), all[0].clone()];
    let e = zt::open_ranks(&swapped).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankOrder"]), "{e}");
    // Unnamed files: the rank each DTensor's mesh records disagrees.
    std::fs::copy(&all[1], dir.path().join("a.pt")).unwrap();
    std::fs::copy(&all[0], dir.path().join("b.pt")).unwrap();
    let e = zt::open_ranks(&[dir.path().join("a.pt"), dir.path().join("b.pt")]).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankOrder"]), "{e}");
}

#[test]
fn more_files_than_the_mesh_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut files: Vec<PathBuf> = (0..2)
        .map(|r| rank_file(dir.path(), &format!("rank_{r}.pt"), r, 2))
        .collect();
    // A third file, a 2-rank mesh's rank 0 again (its recorded rank agrees
    // with nothing, but the mesh size is checked first).
    let third = dir.path().join("rank_2.pt");
    std::fs::copy(&files[0], &third).unwrap();
    files.push(third);
    let e = zt::open_ranks(&files).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankMesh"]), "{e}");
    // A name's world size disagreeing with the list.
    let named = dir.path().join("model_world_size_3_rank_0.pt");
    std::fs::copy(&files[0], &named).unwrap();
    let e = zt::open_ranks(&[named]).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankMissing"]), "{e}");
}

#[test]
fn shards_that_do_not_make_the_global_shape_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    // Rank 1 claims 3 rows of a 5-row Shard(0) tensor; torch.chunk gives it 2.
    for rank in 0..2u64 {
        let d = DT {
            key: "0",
            local: vec![3, 2],
            global: vec![5, 2],
            mesh: vec![2],
            placements: vec![P::Shard(0)],
            rank,
        };
        let path = dir.path().join(format!("rank_{rank}.pt"));
        archive(&path, &[("w", dtensor(&d), floats(0..6))]);
        paths.push(path);
    }
    let e = zt::open_ranks(&paths).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankShards"]), "{e}");
    assert_eq!(e.context().tensor.as_deref(), Some("w"));
    // Global shapes that differ between ranks.
    let mut paths = Vec::new();
    for (rank, rows) in [(0u64, 5u64), (1, 6)] {
        let d = DT {
            key: "0",
            local: vec![3, 2],
            global: vec![rows, 2],
            mesh: vec![2],
            placements: vec![P::Shard(0)],
            rank,
        };
        let path = dir.path().join(format!("g_rank_{rank}.pt"));
        archive(&path, &[("w", dtensor(&d), floats(0..6))]);
        paths.push(path);
    }
    let e = zt::open_ranks(&paths).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankShards"]), "{e}");
    // A tensor only rank 1 holds.
    let a = dir.path().join("t_rank_0.pt");
    let b = dir.path().join("t_rank_1.pt");
    archive(&a, &[("x", tensor("0", &[2]), vec![1.0, 2.0])]);
    archive(
        &b,
        &[
            ("x", tensor("0", &[2]), vec![1.0, 2.0]),
            ("y", tensor("1", &[1]), vec![3.0]),
        ],
    );
    let e = zt::open_ranks(&[a, b]).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankShards"]), "{e}");
}

#[test]
fn replicas_that_differ_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("rank_0.pt");
    let b = dir.path().join("rank_1.pt");
    archive(&a, &[("buf", tensor("0", &[2]), vec![1.0, 2.0])]);
    archive(&b, &[("buf", tensor("0", &[3]), vec![1.0, 2.0, 3.0])]);
    let e = zt::open_ranks(&[a, b]).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankReplica"]), "{e}");
    assert_eq!(e.context().tensor.as_deref(), Some("buf"));
}

#[test]
fn placements_zt_does_not_merge_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for rank in 0..2u64 {
        let d = DT {
            key: "0",
            local: vec![2],
            global: vec![2],
            mesh: vec![2],
            placements: vec![P::Partial],
            rank,
        };
        let path = dir.path().join(format!("rank_{rank}.pt"));
        archive(&path, &[("p", dtensor(&d), vec![1.0, 2.0])]);
        paths.push(path);
    }
    // Alone, each file opens: the local tensor with its placement.
    let one = zt::open(&paths[0]).unwrap();
    assert!(one.tensor("p").unwrap().attributes().contains(&(
        "dtensor.placements".into(),
        Value::Str("Partial(sum)".into())
    )));
    let e = zt::open_ranks(&paths).unwrap_err();
    assert!(
        cites!(e, Error::Unsupported { .. }, &["pt.RankPlacement"]),
        "{e}"
    );
    assert!(e.to_string().contains("Partial(sum)"), "{e}");
}

#[test]
fn meshes_that_disagree_between_ranks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (rank, p) in [(0u64, P::Shard(0)), (1, P::Replicate)] {
        let d = DT {
            key: "0",
            local: vec![1, 2],
            global: vec![2, 2],
            mesh: vec![2],
            placements: vec![p],
            rank,
        };
        let path = dir.path().join(format!("rank_{rank}.pt"));
        archive(&path, &[("w", dtensor(&d), vec![1.0, 2.0])]);
        paths.push(path);
    }
    let e = zt::open_ranks(&paths).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankMesh"]), "{e}");
}

#[test]
fn rank_files_opened_by_name_point_at_open_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let files = ranks(dir.path(), 2);
    let e = zt::open_all(&files).unwrap_err();
    assert!(cites!(e, Error::Index { .. }, &["pt.RankFiles"]), "{e}");
    let text = e.to_string();
    assert!(text.contains("open_ranks"), "{text}");
    assert!(text.contains("Shard(0)"), "{text}");
    assert_eq!(e.context().tensor.as_deref(), Some("w"));
    // Files that merely repeat a plain tensor's name keep the plain error.
    let plain = dir.path().join("plain.pt");
    archive(&plain, &[("b", tensor("0", &[2]), vec![1.0, 2.0])]);
    let e = zt::open_all(&[&plain, &plain]).unwrap_err();
    assert!(
        cites!(e, Error::DuplicateName { .. }, &["core.DuplicateName"]),
        "{e}"
    );
}

#[test]
fn merged_ranks_convert_to_one_safetensors_file() {
    let dir = tempfile::tempdir().unwrap();
    let src = zt::open_ranks(&ranks(dir.path(), 4)).unwrap();
    let out = dir.path().join("model.safetensors");
    zt::convert(&src, &out, &zt::WriteOptions::default()).unwrap();
    let back = zt::open(&out).unwrap();
    assert_eq!(back.len(), 3);
    for name in ["w", "r", "b"] {
        let (a, b) = (src.tensor(name).unwrap(), back.tensor(name).unwrap());
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert_eq!(
            a.data().unwrap().bytes().unwrap(),
            b.data().unwrap().bytes().unwrap(),
            "{name}"
        );
    }
    assert_eq!(
        f32s(&back.tensor("w").unwrap().data().unwrap().bytes().unwrap()),
        floats(0..10)
    );
}

#[test]
fn strided_shards_merge_from_non_adjacent_rows() {
    // _StridedShard(0, split_factor=2) of 9 rows over 2 ranks: the splits
    // [0, 5) and [5, 9) each chunked, rank 0 holding rows 0-2 and 5-6,
    // rank 1 rows 3-4 and 7-8.
    let dir = tempfile::tempdir().unwrap();
    let rows = |r: &[u32]| -> Vec<f32> {
        r.iter()
            .flat_map(|&i| [2 * i, 2 * i + 1])
            .map(|x| x as f32)
            .collect()
    };
    let held = [rows(&[0, 1, 2, 5, 6]), rows(&[3, 4, 7, 8])];
    let mut paths = Vec::new();
    for (rank, data) in held.into_iter().enumerate() {
        let d = DT {
            key: "0",
            local: vec![data.len() as u64 / 2, 2],
            global: vec![9, 2],
            mesh: vec![2],
            placements: vec![P::Strided(0, 2)],
            rank: rank as u64,
        };
        let path = dir.path().join(format!("rank_{rank}.pt"));
        archive(&path, &[("w", dtensor(&d), data)]);
        paths.push(path);
    }
    let src = zt::open_ranks(&paths).unwrap();
    let w = src.tensor("w").unwrap();
    assert_eq!(w.shape(), &[9, 2]);
    assert_eq!(f32s(&w.data().unwrap().bytes().unwrap()), floats(0..18));
    // A split factor past what zt merges is refused by name.
    let mut paths = Vec::new();
    for rank in 0..2u64 {
        let d = DT {
            key: "0",
            local: vec![1],
            global: vec![2],
            mesh: vec![2],
            placements: vec![P::Strided(0, 5000)],
            rank,
        };
        let path = dir.path().join(format!("big_rank_{rank}.pt"));
        archive(&path, &[("w", dtensor(&d), vec![1.0])]);
        paths.push(path);
    }
    let e = zt::open_ranks(&paths).unwrap_err();
    assert!(
        cites!(e, Error::Unsupported { .. }, &["pt.RankPlacement"]),
        "{e}"
    );
}

#[test]
fn a_dtensor_without_its_spec_is_a_malformed_object() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = global("torch._tensor", "_rebuild_from_type_v2");
    p.push(b'(');
    p.extend(global("torch._utils", "_rebuild_wrapper_subclass"));
    p.extend(global("torch.distributed.tensor", "DTensor"));
    p.push(b'(');
    p.extend(global("torch.distributed.tensor", "DTensor"));
    p.extend(global("torch", "float32"));
    p.extend(tuple(&[2]));
    p.extend(tuple(&[1]));
    p.extend(int(0));
    p.extend_from_slice(b"NN\x89tN}(");
    p.extend(s("_local_tensor"));
    p.extend(tensor("0", &[2]));
    p.extend_from_slice(b"u\x86tR");
    let path = dir.path().join("rank_0.pt");
    archive(&path, &[("w", p, vec![1.0, 2.0])]);
    let e = zt::open(&path).unwrap_err();
    assert!(cites!(e, Error::Header { .. }, &["pt.Object"]), "{e}");
}
