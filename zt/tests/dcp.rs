//! PyTorch distributed checkpoints (DCP): checkpoints built by hand here,
//! byte for byte in the layout torch 2.15 writes (`.metadata` a protocol-4
//! pickle of `Metadata`, each chunk a `torch.save` archive inside a
//! `.distcp` file), then broken one way at a time; each refusal asserted by
//! variant and rule. Checkpoints saved by torch itself are compared with
//! `dcp_to_torch_save` in tests/torch/test_dcp.py.

#[macro_use]
#[path = "support/cites.rs"]
mod cites;

use std::path::Path;

use zt::zip::{write_stored_aligned, Member};
use zt::{Error, Limits, Source};

const META: &str = "torch.distributed.checkpoint.metadata";

/// A protocol-4 pickle, written the way `pickle.dump` writes DCP metadata
/// (`SHORT_BINUNICODE` + `STACK_GLOBAL`, `NEWOBJ` + `BUILD` of a field dict).
#[derive(Default)]
struct Pickle(Vec<u8>);

impl Pickle {
    fn str(&mut self, s: &str) -> &mut Self {
        self.0.push(0x8c);
        self.0.push(u8::try_from(s.len()).unwrap());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn op(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }
    fn global(&mut self, module: &str, name: &str) -> &mut Self {
        self.str(module).str(name).op(b"\x93")
    }
    fn int(&mut self, v: u64) -> &mut Self {
        match u32::try_from(v) {
            Ok(v) if v < 1 << 31 => self.op(b"J").op(&v.to_le_bytes()),
            _ => self.op(b"\x8a\x08").op(&v.to_le_bytes()),
        }
    }
    /// `torch.Size(dims)`.
    fn size(&mut self, dims: &[u64]) -> &mut Self {
        self.global("torch", "Size").op(b"((");
        dims.iter().for_each(|&d| {
            self.int(d);
        });
        self.op(b"ttR")
    }
    /// `NEWOBJ` of `class` with no arguments, then `BUILD` with a dict
    /// whose items `fields` pushes.
    fn dataclass(
        &mut self,
        module: &str,
        class: &str,
        fields: impl FnOnce(&mut Self),
    ) -> &mut Self {
        self.global(module, class).op(b")\x81}(");
        fields(self);
        self.op(b"ub")
    }
}

/// One tensor entry: its dtype global name, global size, and chunks
/// `(offsets, sizes)`.
struct TensorEntry {
    fqn: &'static str,
    dtype: &'static str,
    size: Vec<u64>,
    chunks: Vec<(Vec<u64>, Vec<u64>)>,
}

/// One `storage_data` item: the chunk (fqn, offsets) and where it lies.
struct Location {
    fqn: &'static str,
    offsets: Vec<u64>,
    path: String,
    offset: u64,
    length: u64,
    transforms: Option<&'static str>,
}

/// `.metadata` for these entries; `extra` is pickled as one more field of
/// `Metadata` (where a hostile file hides a global).
fn metadata(
    tensors: &[TensorEntry],
    bytes_entries: &[&str],
    storage: &[Location],
    extra: Option<&dyn Fn(&mut Pickle)>,
) -> Vec<u8> {
    let mut p = Pickle::default();
    p.op(b"\x80\x04");
    p.dataclass(META, "Metadata", |p| {
        p.str("state_dict_metadata").op(b"}(");
        for t in tensors {
            p.str(t.fqn);
            p.dataclass(META, "TensorStorageMetadata", |p| {
                p.str("properties");
                p.global(META, "TensorProperties").op(b")\x81(");
                p.global("torch", t.dtype);
                p.global("torch.serialization", "_get_layout")
                    .str("torch.strided")
                    .op(b"\x85R\x89");
                p.global(META, "_MEM_FORMAT_ENCODING")
                    .int(0)
                    .op(b"\x85R\x89");
                p.op(b"tb");
                p.str("size").size(&t.size);
                p.str("chunks").op(b"]");
                for (offsets, sizes) in &t.chunks {
                    p.dataclass(META, "ChunkStorageMetadata", |p| {
                        p.str("offsets").size(offsets).str("sizes").size(sizes);
                    });
                    p.op(b"a");
                }
            });
        }
        for name in bytes_entries {
            p.str(name)
                .global(META, "BytesStorageMetadata")
                .op(b")\x81");
        }
        p.op(b"u");
        p.str("planner_data").op(b"}");
        p.str("storage_data").op(b"}(");
        for loc in storage {
            p.dataclass(META, "MetadataIndex", |p| {
                p.str("fqn").str(loc.fqn).str("offset").size(&loc.offsets);
                p.str("index").int(0);
            });
            p.dataclass(
                "torch.distributed.checkpoint.filesystem",
                "_StorageInfo",
                |p| {
                    p.str("relative_path").str(&loc.path);
                    p.str("offset")
                        .int(loc.offset)
                        .str("length")
                        .int(loc.length);
                    // Descriptors separated by commas, in order.
                    if let Some(t) = loc.transforms {
                        p.str("transform_descriptors").op(b"](");
                        t.split(',').for_each(|d| {
                            p.str(d);
                        });
                        p.op(b"e");
                    }
                },
            );
        }
        p.op(b"u");
        p.str("version").str("1.0.0");
        if let Some(extra) = extra {
            p.str("extra");
            extra(p);
        }
    });
    p.op(b".");
    p.0
}

/// A `torch.save(tensor)` archive: the tensor at the pickle's root, a view
/// of storage "0" (`storage` names its class) with `shape` and `stride`.
fn chunk_archive(storage: &str, numel: u64, shape: &[u64], stride: &[u64], data: &[u8]) -> Vec<u8> {
    let mut p = Pickle::default();
    p.op(b"\x80\x02");
    p.global("torch._utils", "_rebuild_tensor_v2").op(b"((");
    p.str("storage")
        .global("torch", storage)
        .str("0")
        .str("cpu")
        .int(numel);
    p.op(b"tQ").int(0).op(b"(");
    shape.iter().for_each(|&d| {
        p.int(d);
    });
    p.op(b"t(");
    stride.iter().for_each(|&d| {
        p.int(d);
    });
    p.op(b"t\x89}tR.");
    let pickle = p.0;
    let members = [
        Member {
            name: "archive/data.pkl".into(),
            parts: [&pickle, &[]],
            crc: crc32fast::hash(&pickle),
        },
        Member {
            name: "archive/byteorder".into(),
            parts: [b"little", &[]],
            crc: crc32fast::hash(b"little"),
        },
        Member {
            name: "archive/data/0".into(),
            parts: [data, &[]],
            crc: crc32fast::hash(data),
        },
    ];
    let mut out = Vec::new();
    write_stored_aligned(&mut out, &members, 64).unwrap();
    out
}

fn f32s(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(f32::to_le_bytes).collect()
}

fn c_strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// A `.distcp` file being built: chunk archives appended one after the
/// other, as DCP's writer appends them.
struct DistCp {
    name: String,
    bytes: Vec<u8>,
}

impl DistCp {
    fn new(name: &str) -> Self {
        DistCp {
            name: name.into(),
            bytes: Vec::new(),
        }
    }

    /// Append an f32 chunk (C order, or `stride` over `data`) of `fqn` at
    /// `offsets`; returns where it went.
    fn push(
        &mut self,
        fqn: &'static str,
        offsets: &[u64],
        shape: &[u64],
        stride: Option<&[u64]>,
        data: &[u8],
    ) -> Location {
        let strides = stride.map_or_else(|| c_strides(shape), <[u64]>::to_vec);
        let numel = data.len() as u64 / 4;
        let archive = chunk_archive("FloatStorage", numel, shape, &strides, data);
        let loc = Location {
            fqn,
            offsets: offsets.to_vec(),
            path: self.name.clone(),
            offset: self.bytes.len() as u64,
            length: archive.len() as u64,
            transforms: None,
        };
        self.bytes.extend_from_slice(&archive);
        loc
    }
}

/// The global 4x6 f32 tensor `w` (values 0..24), as the test's checkpoints
/// split it.
fn w_global() -> Vec<f32> {
    (0..24).map(|i| i as f32).collect()
}

/// Rows `r0..r1`, columns `c0..c1` of `w`, C order.
fn w_block(r0: u64, r1: u64, c0: u64, c1: u64) -> Vec<u8> {
    let w = w_global();
    f32s(
        (r0..r1)
            .flat_map(|r| (c0..c1).map(move |c| (r, c)))
            .map(|(r, c)| w[(r * 6 + c) as usize]),
    )
}

/// A checkpoint of three tensors over two files:
/// `model.w` 4x6 in four chunks (Shard(0) x Shard(1) over two ranks each),
/// `model.b` (3 elements, one chunk, zero-copy), `model.t` 3x2 stored
/// transposed (strides (1, 3)) in one chunk, `optim.v` 5 elements in two
/// uneven chunks plus an empty one, and a non-tensor `step`.
struct Fixture {
    tensors: Vec<TensorEntry>,
    storage: Vec<Location>,
    files: Vec<DistCp>,
}

fn fixture() -> Fixture {
    let mut r0 = DistCp::new("__0_0.distcp");
    let mut r1 = DistCp::new("__1_0.distcp");
    let b = f32s([1.5, -2.0, 3.25]);
    // `t` is the transpose of a 2x3 [[0,1,2],[3,4,5]]: its storage is that
    // 2x3 in C order, its strides (1, 3).
    let t_storage = f32s([0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let mut storage = vec![
        r0.push("model.b", &[0], &[3], None, &b),
        r0.push("model.w", &[0, 0], &[2, 3], None, &w_block(0, 2, 0, 3)),
        r1.push("model.w", &[0, 3], &[2, 3], None, &w_block(0, 2, 3, 6)),
        r0.push("model.w", &[2, 0], &[2, 3], None, &w_block(2, 4, 0, 3)),
        r1.push("model.w", &[2, 3], &[2, 3], None, &w_block(2, 4, 3, 6)),
        r1.push("model.t", &[0, 0], &[3, 2], Some(&[1, 3]), &t_storage),
        r0.push("optim.v", &[0], &[3], None, &f32s([10.0, 11.0, 12.0])),
        r1.push("optim.v", &[3], &[2], None, &f32s([13.0, 14.0])),
    ];
    // DCP locates the non-tensor entry too; zt never reads it.
    storage.push(Location {
        fqn: "step",
        offsets: vec![],
        path: "__0_0.distcp".into(),
        offset: 0,
        length: 1,
        transforms: None,
    });
    let tensors = vec![
        TensorEntry {
            fqn: "model.b",
            dtype: "float32",
            size: vec![3],
            chunks: vec![(vec![0], vec![3])],
        },
        TensorEntry {
            fqn: "model.w",
            dtype: "float32",
            size: vec![4, 6],
            chunks: vec![
                (vec![0, 0], vec![2, 3]),
                (vec![0, 3], vec![2, 3]),
                (vec![2, 0], vec![2, 3]),
                (vec![2, 3], vec![2, 3]),
            ],
        },
        TensorEntry {
            fqn: "model.t",
            dtype: "float32",
            size: vec![3, 2],
            chunks: vec![(vec![0, 0], vec![3, 2])],
        },
        TensorEntry {
            fqn: "optim.v",
            dtype: "float32",
            size: vec![5],
            chunks: vec![(vec![0], vec![3]), (vec![3], vec![2]), (vec![5], vec![0])],
        },
    ];
    Fixture {
        tensors,
        storage,
        files: vec![r0, r1],
    }
}

impl Fixture {
    /// Write the checkpoint into `dir` (files first, `.metadata` last).
    fn write(&self, dir: &Path) {
        self.write_with(dir, None);
    }

    fn write_with(&self, dir: &Path, extra: Option<&dyn Fn(&mut Pickle)>) {
        for f in &self.files {
            std::fs::write(dir.join(&f.name), &f.bytes).unwrap();
        }
        let meta = metadata(&self.tensors, &["step"], &self.storage, extra);
        std::fs::write(dir.join(".metadata"), meta).unwrap();
    }

    fn tensor(&mut self, fqn: &str) -> &mut TensorEntry {
        self.tensors.iter_mut().find(|t| t.fqn == fqn).unwrap()
    }
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

/// Open the checkpoint in `dir` and read every tensor: where a refusal
/// comes (open or read) is the reader's choice, the rule is not.
fn open_and_read(dir: &Path) -> zt::Result<Source> {
    let src = zt::open(dir)?;
    for t in src.tensors() {
        t.data()?.bytes()?;
    }
    Ok(src)
}

#[test]
fn a_directory_and_its_metadata_list_the_global_tensors() {
    let dir = tempfile::tempdir().unwrap();
    fixture().write(dir.path());
    for path in [dir.path().to_path_buf(), dir.path().join(".metadata")] {
        let src = zt::open(&path).unwrap();
        assert_eq!(src.format(), "dcp");
        let names: Vec<&str> = src.names().collect();
        assert_eq!(names, ["model.b", "model.w", "model.t", "optim.v"]);
        let w = src.tensor("model.w").unwrap().data().unwrap();
        assert_eq!(w.shape(), &[4, 6]);
        assert_eq!(w.dtype(), zt::DType::F32);
        assert_eq!(&w.bytes().unwrap()[..], &f32s(w_global())[..]);
        // Uneven chunks and an empty one (offset at the dimension's end).
        let v = src.tensor("optim.v").unwrap().data().unwrap();
        assert_eq!(
            &v.bytes().unwrap()[..],
            &f32s([10.0, 11.0, 12.0, 13.0, 14.0])[..]
        );
        // The non-tensor entry is named, never read.
        let bytes_entries = src
            .attributes()
            .iter()
            .find(|(k, _)| k == "dcp.bytes_entries")
            .map(|(_, v)| v.clone());
        assert_eq!(
            bytes_entries,
            Some(zt::Value::List(vec![zt::Value::Str("step".into())]))
        );
    }
}

#[test]
fn a_tensor_in_one_chunk_is_a_view_of_the_chunk() {
    let dir = tempfile::tempdir().unwrap();
    fixture().write(dir.path());
    let src = zt::open(dir.path()).unwrap();
    // The first archive of `__0_0.distcp` starts at offset 0 and torch
    // aligns its records to 64 bytes: mapped in place.
    let b = src.tensor("model.b").unwrap().data().unwrap();
    assert!(b.caps().map);
    assert_eq!(b.map().unwrap(), &f32s([1.5, -2.0, 3.25])[..]);
    // A transposed chunk keeps its strides; C order on request.
    let t = src.tensor("model.t").unwrap().data().unwrap();
    assert_eq!(t.strides(), vec![1, 3]);
    assert_eq!(
        &t.bytes().unwrap()[..],
        &f32s([0.0, 3.0, 1.0, 4.0, 2.0, 5.0])[..]
    );
    // A tensor of several chunks is assembled.
    let w = src.tensor("model.w").unwrap().data().unwrap();
    assert!(!w.caps().map);
}

#[test]
fn any_byte_range_of_an_assembled_tensor_is_read_alone() {
    let dir = tempfile::tempdir().unwrap();
    fixture().write(dir.path());
    let src = zt::open(dir.path()).unwrap();
    let w = src.tensor("model.w").unwrap().data().unwrap();
    let all = f32s(w_global());
    // Ranges that start and end inside elements, rows and chunks.
    for start in [0usize, 1, 5, 11, 12, 13, 47, 50, 95] {
        for len in [0usize, 1, 3, 4, 7, 12, 25, 48] {
            if start + len > all.len() {
                continue;
            }
            let got = w.storage_range(start as u64, len as u64).unwrap();
            assert_eq!(&got[..], &all[start..start + len], "{start}+{len}");
        }
    }
}

#[test]
fn a_strided_chunk_of_a_sharded_tensor_is_placed_by_its_strides() {
    // `u` is 4x2 = [[0,1],[2,3],[4,5],[6,7]]; rows 0..2 are saved as the
    // transpose of their 2x2 storage (strides (1, 2)), rows 2..4 in C order.
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    let mut r = DistCp::new("__2_0.distcp");
    let top = r.push(
        "u",
        &[0, 0],
        &[2, 2],
        Some(&[1, 2]),
        &f32s([0.0, 2.0, 1.0, 3.0]),
    );
    let bottom = r.push("u", &[2, 0], &[2, 2], None, &f32s([4.0, 5.0, 6.0, 7.0]));
    f.storage.extend([top, bottom]);
    f.files.push(r);
    f.tensors.push(TensorEntry {
        fqn: "u",
        dtype: "float32",
        size: vec![4, 2],
        chunks: vec![(vec![0, 0], vec![2, 2]), (vec![2, 0], vec![2, 2])],
    });
    f.write(dir.path());
    let src = open_and_read(dir.path()).unwrap();
    let u = src.tensor("u").unwrap().data().unwrap();
    let want = f32s((0..8).map(|i| i as f32));
    assert_eq!(&u.bytes().unwrap()[..], &want[..]);
    assert_eq!(&u.storage_range(6, 9).unwrap()[..], &want[6..15]);
}

#[test]
fn overlapping_chunks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    // The second row chunk starts one row early: rows 1..3 of columns 0..3.
    f.tensor("model.w").chunks[2].0 = vec![1, 0];
    f.storage[3].offsets = vec![1, 0];
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Chunks"]),
        "{got:?}"
    );
}

#[test]
fn chunks_need_not_form_a_grid() {
    // Columns 0..3 in one chunk of all four rows, columns 3..6 in two.
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    let mut r = DistCp::new("__2_0.distcp");
    let left = r.push("model.w", &[0, 0], &[4, 3], None, &w_block(0, 4, 0, 3));
    f.storage
        .retain(|l| !(l.fqn == "model.w" && l.offsets[1] == 0));
    f.storage.push(left);
    f.files.push(r);
    f.tensor("model.w").chunks = vec![
        (vec![0, 0], vec![4, 3]),
        (vec![0, 3], vec![2, 3]),
        (vec![2, 3], vec![2, 3]),
    ];
    f.write(dir.path());
    let src = open_and_read(dir.path()).unwrap();
    let w = src.tensor("model.w").unwrap().data().unwrap();
    assert_eq!(&w.bytes().unwrap()[..], &f32s(w_global())[..]);
}

#[test]
fn two_chunks_of_a_scalar_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    let mut r = DistCp::new("__2_0.distcp");
    let a = r.push("s", &[], &[], None, &f32s([7.0]));
    let b = r.push("s", &[], &[], None, &f32s([7.0]));
    f.storage.extend([a, b]);
    f.files.push(r);
    f.tensors.push(TensorEntry {
        fqn: "s",
        dtype: "float32",
        size: vec![],
        chunks: vec![(vec![], vec![]), (vec![], vec![])],
    });
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Chunks"]),
        "{got:?}"
    );
    // One chunk reads.
    f.tensor("s").chunks.pop();
    f.write(dir.path());
    let src = open_and_read(dir.path()).unwrap();
    assert_eq!(
        &src.tensor("s").unwrap().data().unwrap().bytes().unwrap()[..],
        &f32s([7.0])[..]
    );
}

#[test]
fn missing_chunks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    f.tensor("model.w").chunks.pop();
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Chunks"]),
        "{got:?}"
    );
}

#[test]
fn chunks_that_disagree_with_the_global_shape_are_refused() {
    for case in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let mut f = fixture();
        let w = f.tensor("model.w");
        match case {
            // Past the end of dimension 1.
            0 => w.chunks[3].1 = vec![2, 4],
            // A chunk of another rank.
            1 => w.chunks[3] = (vec![2, 3, 0], vec![2, 3, 1]),
            // The global shape is smaller than the chunks cover.
            _ => w.size = vec![4, 5],
        }
        f.write(dir.path());
        let got = open_and_read(dir.path());
        assert!(
            cites!(got, Err(Error::Header { .. }), &["dcp.ChunkShape"]),
            "{case}: {got:?}"
        );
    }
}

#[test]
fn a_chunk_unlike_its_metadata_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    // `.metadata` says int32; the archive holds float32.
    f.tensor("model.b").dtype = "int32";
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Chunk"]),
        "{got:?}"
    );

    // The archive's tensor is 2x3 where the chunk is 3x2 (same elements).
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    let mut r = DistCp::new("__2_0.distcp");
    f.storage[1] = r.push("model.w", &[0, 0], &[3, 2], None, &w_block(0, 2, 0, 3));
    f.files.push(r);
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Chunk"]),
        "{got:?}"
    );
}

#[test]
fn a_chunk_without_a_storage_entry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    f.storage.retain(|l| l.fqn != "model.t");
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Storage"]),
        "{got:?}"
    );
}

#[test]
fn a_chunk_past_its_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    // The last chunk of `__1_0.distcp`, one byte longer than the file.
    f.storage[7].length += 1;
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Range { .. }), &["dcp.ChunkRange"]),
        "{got:?}"
    );
    // An offset near the largest a pickle int gives overflows nothing.
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    f.storage[7].offset = i64::MAX as u64 - 2;
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Range { .. }), &["dcp.ChunkRange"]),
        "{got:?}"
    );
}

#[test]
fn a_relative_path_leaving_the_directory_is_refused() {
    let outer = tempfile::tempdir().unwrap();
    let dir = outer.path().join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    // A real chunk file outside the checkpoint, which must not be read.
    let f = fixture();
    std::fs::write(outer.path().join("outside.distcp"), &f.files[0].bytes).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(outer.path().join("outside.distcp"), dir.join("link.distcp"))
        .unwrap();
    let outside = outer.path().join("outside.distcp");
    let mut paths = vec![
        "../outside.distcp".to_string(),
        outside.to_string_lossy().into_owned(),
    ];
    if cfg!(unix) {
        paths.push("link.distcp".into());
    }
    for path in paths {
        let mut f = fixture();
        f.storage[0].path = path.clone();
        f.write(&dir);
        let got = open_and_read(&dir);
        assert!(
            cites!(got, Err(Error::Header { .. }), &["dcp.Path"]),
            "{path}: {got:?}"
        );
    }
}

#[test]
fn a_missing_distcp_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture();
    f.write(dir.path());
    std::fs::remove_file(dir.path().join("__1_0.distcp")).unwrap();
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.File"]),
        "{got:?}"
    );
}

#[test]
fn sizes_past_the_limits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    fixture().write(dir.path());
    // The assembled `model.w` is 96 bytes.
    let got = open_with(
        dir.path(),
        Limits {
            decoded_bytes: 64,
            ..Limits::default()
        },
    )
    .and_then(|src| {
        let w = src.tensor("model.w")?.data()?.bytes()?.len();
        Ok(w)
    });
    assert!(
        cites!(got, Err(Error::Limit { .. }), &["dcp.Limit"]),
        "{got:?}"
    );
    // Rank.
    let got = open_with(
        dir.path(),
        Limits {
            rank: 1,
            ..Limits::default()
        },
    );
    assert!(
        cites!(got, Err(Error::Limit { .. }), &["dcp.Limit"]),
        "{got:?}"
    );
    // Entries (tensor entries and their chunks).
    let got = open_with(
        dir.path(),
        Limits {
            entries: 4,
            ..Limits::default()
        },
    );
    assert!(
        cites!(got, Err(Error::Limit { .. }), &["dcp.Limit"]),
        "{got:?}"
    );
    // A global shape whose byte size overflows.
    let dir = tempfile::tempdir().unwrap();
    let mut f = fixture();
    f.tensor("model.w").size = vec![u64::MAX / 2, 6];
    f.write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Overflow { .. }), &["dcp.Limit"]),
        "{got:?}"
    );
}

#[test]
fn a_forbidden_global_in_metadata_is_refused_by_name() {
    let hostile: [&dyn Fn(&mut Pickle); 3] = [
        // A call of `os.system`, which a real unpickler would run.
        &|p: &mut Pickle| {
            p.global("os", "system").str("touch pwned").op(b"\x85R");
        },
        // A global that is only referenced.
        &|p: &mut Pickle| {
            p.global("builtins", "eval");
        },
        // A DCP-looking class from another module.
        &|p: &mut Pickle| {
            p.global("torch.distributed.checkpoint.planner", "Metadata")
                .op(b")\x81");
        },
    ];
    for (i, extra) in hostile.iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        fixture().write_with(dir.path(), Some(*extra));
        let got = zt::open(dir.path());
        assert!(
            cites!(got, Err(Error::Header { .. }), &["dcp.Global"]),
            "{i}: {got:?}"
        );
        let msg = got.unwrap_err().to_string();
        assert!(
            msg.contains("os.system") || msg.contains("builtins.eval") || msg.contains("planner"),
            "{msg}"
        );
        assert!(!dir.path().join("pwned").exists());
    }
}

#[test]
fn a_forbidden_global_is_named_even_in_a_malformed_pickle() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Pickle::default();
    p.op(b"\x80\x04")
        .str(META)
        .str("Metadata")
        .op(b"\x93")
        .global("subprocess", "Popen")
        .op(b"\xff");
    std::fs::write(dir.path().join(".metadata"), &p.0).unwrap();
    let got = zt::open(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Global"]),
        "{got:?}"
    );
    assert!(got.unwrap_err().to_string().contains("subprocess.Popen"));
}

#[test]
fn metadata_that_is_not_dcp_s_is_refused() {
    // A well-formed pickle whose root is a dict, not `Metadata`.
    let dir = tempfile::tempdir().unwrap();
    let mut p = Pickle::default();
    p.op(b"\x80\x04").str(META).op(b"0}.");
    std::fs::write(dir.path().join(".metadata"), &p.0).unwrap();
    let got = zt::open(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Metadata"]),
        "{got:?}"
    );
    // An unknown opcode is a malformed pickle, said of the metadata.
    let mut p = Pickle::default();
    p.op(b"\x80\x04").str(META).op(b"\xff");
    std::fs::write(dir.path().join(".metadata"), &p.0).unwrap();
    let got = zt::open(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Metadata"]),
        "{got:?}"
    );
}

#[test]
fn transforms_other_than_one_zstd_are_refused() {
    // Read as torch's registry reads descriptors: `stream.zstd/<v>` with
    // `v`'s first dotted part `1`; anything else, or two, is not read.
    for t in [
        "stream.gzip/1",
        "stream.zstd/2",
        "stream.zstd/10",
        "stream.zstd",
        "stream.zstd/1,stream.zstd/1",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut f = zstd_fixture(stream_frame);
        f.storage[0].transforms = Some(t);
        f.write(dir.path());
        let got = open_and_read(dir.path());
        assert!(
            cites!(got, Err(Error::Unsupported { .. }), &["dcp.Unsupported"]),
            "{t}: {got:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let mut f = zstd_fixture(stream_frame);
    f.storage[0].transforms = Some("stream.zstd/1.3");
    f.write(dir.path());
    open_and_read(dir.path()).unwrap();
}

/// The fixture with every tensor chunk stored through torch's zstd
/// extension: each archive replaced by `frame(archive)` in its file, its
/// `storage_data` entry saying `["stream.zstd/1"]`.
fn zstd_fixture(frame: fn(&[u8]) -> Vec<u8>) -> Fixture {
    let plain = fixture();
    let mut files: Vec<DistCp> = plain.files.iter().map(|d| DistCp::new(&d.name)).collect();
    let mut storage = Vec::new();
    for loc in plain.storage {
        if loc.fqn == "step" {
            storage.push(loc);
            continue;
        }
        let src = plain.files.iter().find(|d| d.name == loc.path).unwrap();
        let z = frame(&src.bytes[loc.offset as usize..(loc.offset + loc.length) as usize]);
        let dst = files.iter_mut().find(|d| d.name == loc.path).unwrap();
        storage.push(Location {
            offset: dst.bytes.len() as u64,
            length: z.len() as u64,
            transforms: Some("stream.zstd/1"),
            ..loc
        });
        dst.bytes.extend_from_slice(&z);
    }
    Fixture {
        tensors: plain.tensors,
        storage,
        files,
    }
}

/// One zstd frame as torch's writer makes it (the `zstandard` package's
/// `stream_writer`): level 3, no content size, no checksum.
fn stream_frame(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    e.include_contentsize(false).unwrap();
    e.include_checksum(false).unwrap();
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// One zstd frame declaring its content size and carrying a checksum.
fn sized_frame(bytes: &[u8]) -> Vec<u8> {
    let mut c = zstd::bulk::Compressor::new(3).unwrap();
    c.include_checksum(true).unwrap();
    c.compress(bytes).unwrap()
}

/// Where a frame's first block header starts, and where its content size
/// field is and how long (`None` when it declares none): RFC 8878 3.1.1.
fn frame_layout(frame: &[u8]) -> (usize, Option<(usize, usize)>) {
    let fhd = frame[4];
    let single = fhd & 0x20 != 0;
    let dict = [0, 1, 2, 4][(fhd & 3) as usize];
    let fcs = match (fhd >> 6, single) {
        (0, false) => 0,
        (0, true) => 1,
        (1, _) => 2,
        (2, _) => 4,
        _ => 8,
    };
    let at = 5 + usize::from(!single) + dict;
    (at + fcs, (fcs > 0).then_some((at, fcs)))
}

/// The fixture's first chunk (`model.b`, one C-order chunk) stored as
/// `frame` instead, its range `[offset, offset + frame.len() + extend)`.
fn with_first_frame(frame: &[u8], extend: i64) -> Fixture {
    let mut f = zstd_fixture(stream_frame);
    let file = &mut f.files[0];
    let offset = file.bytes.len() as u64;
    file.bytes.extend_from_slice(frame);
    file.bytes.extend_from_slice(&[0u8; 16]);
    f.storage[0].offset = offset;
    f.storage[0].length = (frame.len() as i64 + extend) as u64;
    f
}

/// `model.b`'s archive as the fixture stores it.
fn first_archive() -> Vec<u8> {
    let plain = fixture();
    let loc = &plain.storage[0];
    assert_eq!(loc.fqn, "model.b");
    plain.files[0].bytes[loc.offset as usize..(loc.offset + loc.length) as usize].to_vec()
}

/// Open and read the checkpoint in `dir` with `limits`.
fn read_with(dir: &Path, limits: Limits) -> zt::Result<Source> {
    let src = open_with(dir, limits)?;
    for t in src.tensors() {
        t.data()?.bytes()?;
    }
    Ok(src)
}

#[test]
fn zstd_chunks_read_as_the_same_chunks_stored_plain() {
    let plain_dir = tempfile::tempdir().unwrap();
    fixture().write(plain_dir.path());
    let plain = zt::open(plain_dir.path()).unwrap();
    // torch's frames (no content size), and frames declaring their size
    // with a checksum (verified).
    for (frame, sized) in [
        (stream_frame as fn(&[u8]) -> Vec<u8>, false),
        (sized_frame, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let f = zstd_fixture(frame);
        let declared = zstd::zstd_safe::get_frame_content_size(&f.files[0].bytes).unwrap();
        assert_eq!(declared.is_some(), sized);
        f.write(dir.path());
        let src = zt::open(dir.path()).unwrap();
        assert_eq!(
            src.names().collect::<Vec<_>>(),
            plain.names().collect::<Vec<_>>()
        );
        for name in plain.names() {
            let want = plain.tensor(name).unwrap().data().unwrap();
            let got = src.tensor(name).unwrap().data().unwrap();
            assert_eq!(got.shape(), want.shape(), "{name}");
            assert_eq!(got.dtype(), want.dtype(), "{name}");
            // A C-order chunk (`model.b`), one stored transposed
            // (`model.t`), one tensor of four chunks and one of uneven
            // chunks, all decompressed on read.
            assert_eq!(
                &got.bytes().unwrap()[..],
                &want.bytes().unwrap()[..],
                "{name}"
            );
            assert!(!got.caps().map, "{name}");
        }
        // A byte range of a tensor assembled from compressed chunks.
        let w = src.tensor("model.w").unwrap().data().unwrap();
        let all = w.bytes().unwrap().to_vec();
        assert_eq!(&w.storage_range(40, 24).unwrap()[..], &all[40..64]);
    }
}

#[test]
fn a_cut_zstd_frame_is_refused_at_every_length() {
    let frame = stream_frame(&first_archive());
    for cut in 0..frame.len() {
        let dir = tempfile::tempdir().unwrap();
        with_first_frame(&frame[..cut], 0).write(dir.path());
        let got = open_and_read(dir.path());
        assert!(
            cites!(got, Err(Error::Decode { .. }), &["dcp.Zstd"]),
            "cut {cut}: {got:?}"
        );
    }
}

#[test]
fn a_corrupt_zstd_frame_is_refused() {
    let archive = first_archive();
    // A block of the reserved type.
    let mut frame = stream_frame(&archive);
    let (block, _) = frame_layout(&frame);
    frame[block] |= 0b110;
    // Content that no longer matches the frame's checksum.
    let mut summed = sized_frame(&archive);
    let n = summed.len();
    summed[n - 6] ^= 0x55;
    // Another magic (the archive itself, no frame).
    for (what, frame) in [("block", frame), ("checksum", summed), ("magic", archive)] {
        let dir = tempfile::tempdir().unwrap();
        with_first_frame(&frame, 0).write(dir.path());
        let got = open_and_read(dir.path());
        assert!(
            cites!(got, Err(Error::Decode { .. }), &["dcp.Zstd"]),
            "{what}: {got:?}"
        );
    }
}

#[test]
fn a_zstd_frame_declaring_another_size_is_refused() {
    let archive = first_archive();
    let frame = sized_frame(&archive);
    let (_, Some((at, len))) = frame_layout(&frame) else {
        panic!("a sized frame declares its size")
    };
    let declared = |frame: &[u8]| {
        let mut v = [0u8; 8];
        v[..len].copy_from_slice(&frame[at..at + len]);
        u64::from_le_bytes(v)
    };
    let value = declared(&frame);
    for lie in [value + 1, value - 1] {
        let mut bad = frame.clone();
        bad[at..at + len].copy_from_slice(&lie.to_le_bytes()[..len]);
        let dir = tempfile::tempdir().unwrap();
        with_first_frame(&bad, 0).write(dir.path());
        let got = open_and_read(dir.path());
        assert!(
            cites!(got, Err(Error::Decode { .. }), &["dcp.Zstd"]),
            "{lie}: {got:?}"
        );
    }
}

#[test]
fn bytes_after_the_zstd_frame_are_refused() {
    let frame = stream_frame(&first_archive());
    let twice = [&frame[..], &frame[..]].concat();
    for (what, bytes, extend) in [("garbage", &frame, 3), ("a second frame", &twice, 0)] {
        let dir = tempfile::tempdir().unwrap();
        with_first_frame(bytes, extend).write(dir.path());
        let got = open_and_read(dir.path());
        assert!(
            cites!(got, Err(Error::Decode { .. }), &["dcp.Zstd"]),
            "{what}: {got:?}"
        );
    }
}

#[test]
fn a_zstd_chunk_decompressing_past_the_limits_is_refused() {
    // `decoded_bytes` above every tensor's bytes but below `model.b`'s
    // archive (its 12 bytes and the records around them).
    let dir = tempfile::tempdir().unwrap();
    zstd_fixture(stream_frame).write(dir.path());
    let limits = Limits {
        decoded_bytes: 512,
        ..Limits::default()
    };
    let src = open_with(dir.path(), limits.clone()).unwrap();
    let got = src
        .tensor("model.b")
        .unwrap()
        .data()
        .unwrap()
        .bytes()
        .map(|_| ());
    assert!(
        cites!(got, Err(Error::Limit { .. }), &["dcp.Limit"]),
        "{got:?}"
    );
    // Declared in the frame: refused at open.
    let dir = tempfile::tempdir().unwrap();
    zstd_fixture(sized_frame).write(dir.path());
    let got = read_with(dir.path(), limits);
    assert!(
        cites!(got, Err(Error::Limit { .. }), &["dcp.Limit"]),
        "{got:?}"
    );
}

#[test]
fn a_zstd_bomb_is_refused_past_what_its_archive_can_hold() {
    // 64 MiB of zeros for a 12-byte chunk: far more than a torch.save
    // archive of it holds. Undeclared, refused as it decompresses (never
    // past the chunk's bytes and 16 MiB); declared, at open.
    let zeros = vec![0u8; 64 << 20];
    for (what, frame) in [
        ("stream", stream_frame(&zeros)),
        ("sized", sized_frame(&zeros)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        with_first_frame(&frame, 0).write(dir.path());
        let got = open_and_read(dir.path());
        assert!(
            cites!(got, Err(Error::Decode { .. }), &["dcp.Zstd"]),
            "{what}: {got:?}"
        );
        let message = got.unwrap_err().to_string();
        assert!(message.contains("decompresses past"), "{what}: {message}");
    }
}

#[test]
fn a_zstd_frame_of_no_bytes_or_no_archive_is_refused() {
    // torch's SAFETENSORS serialization with the extension writes an
    // empty frame per chunk (torch cannot read it back either).
    for frame in [stream_frame(b""), sized_frame(b"")] {
        let dir = tempfile::tempdir().unwrap();
        with_first_frame(&frame, 0).write(dir.path());
        let got = open_and_read(dir.path());
        assert!(
            cites!(got, Err(Error::Unsupported { .. }), &["dcp.Unsupported"]),
            "{got:?}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    with_first_frame(&stream_frame(b"not an archive"), 0).write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Chunk"]),
        "{got:?}"
    );
    // An archive of another tensor than the metadata declares.
    let dir = tempfile::tempdir().unwrap();
    let other = chunk_archive("FloatStorage", 2, &[2], &[1], &f32s([1.0, 2.0]));
    with_first_frame(&stream_frame(&other), 0).write(dir.path());
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Chunk"]),
        "{got:?}"
    );
}

#[test]
fn truncated_files_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture();
    f.write(dir.path());
    let meta = std::fs::read(dir.path().join(".metadata")).unwrap();
    for cut in 0..meta.len() {
        std::fs::write(dir.path().join(".metadata"), &meta[..cut]).unwrap();
        // Every cut is an error (the pickle's STOP is its last byte), said
        // of the metadata; no cut is taken for another format.
        let got = open_and_read(dir.path());
        let rule = got.as_ref().err().and_then(|e| e.rule()).map(|r| r.name());
        assert!(
            rule.is_some_and(|r| r.starts_with("dcp.")
                || r == "core.Truncated"
                || r == "core.UnknownFormat"),
            "cut {cut}: {got:?}"
        );
    }
    std::fs::write(dir.path().join(".metadata"), &meta).unwrap();
    let r0 = f.files[0].bytes.clone();
    for cut in (0..r0.len()).step_by(7) {
        std::fs::write(dir.path().join("__0_0.distcp"), &r0[..cut]).unwrap();
        let got = open_and_read(dir.path());
        assert!(got.is_err(), "cut {cut}");
        assert!(got.unwrap_err().rule().is_some(), "cut {cut}");
    }
    // Flipped bytes in a chunk file: an error or a tensor, never a panic.
    for at in (0..r0.len()).step_by(5) {
        let mut bad = r0.clone();
        bad[at] ^= 0xff;
        std::fs::write(dir.path().join("__0_0.distcp"), &bad).unwrap();
        let _ = open_and_read(dir.path());
    }
}

#[test]
fn a_directory_without_a_checkpoint_says_so() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("__0_0.distcp"), b"").unwrap();
    let got = zt::open(dir.path());
    assert!(
        cites!(got, Err(Error::Index { .. }), &["index.Checkpoint"]),
        "{got:?}"
    );
}

/// A `SAFETENSORS`-format checkpoint as torch 2.15 writes it: each
/// `.distcp` holds its non-tensor entries' pickles, then one safetensors
/// file of its chunks by fqn; every chunk's `storage_data` offset is that
/// block's start and its length the chunk's bytes.
fn safetensors_checkpoint(dir: &Path, rename: Option<&str>) {
    let step_pickle = b"\x80\x02K\x03."; // stands in for the step's bytes
    let mut files = Vec::new();
    let mut storage = Vec::new();
    for (name, rows) in [("__0_0.distcp", 0..2u64), ("__1_0.distcp", 2..4)] {
        let block_data = w_block(rows.start, rows.end, 0, 6);
        let shape = [2u64, 6];
        let stored_name = match (rename, rows.start) {
            (Some(other), 2) => other,
            _ => "model.w",
        };
        let block = zt::formats::safetensors::to_bytes(
            &[zt::TensorIn {
                name: stored_name,
                dtype: zt::DType::F32,
                shape: &shape,
                data: &block_data,
            }],
            None,
        )
        .unwrap();
        let mut bytes = step_pickle.to_vec();
        let offset = bytes.len() as u64;
        bytes.extend_from_slice(&block);
        storage.push(Location {
            fqn: "model.w",
            offsets: vec![rows.start, 0],
            path: name.into(),
            offset,
            length: block_data.len() as u64,
            transforms: None,
        });
        files.push(DistCp {
            name: name.into(),
            bytes,
        });
    }
    let f = Fixture {
        tensors: vec![TensorEntry {
            fqn: "model.w",
            dtype: "float32",
            size: vec![4, 6],
            chunks: vec![(vec![0, 0], vec![2, 6]), (vec![2, 0], vec![2, 6])],
        }],
        storage,
        files,
    };
    f.write(dir);
}

#[test]
fn a_safetensors_format_checkpoint_assembles_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    safetensors_checkpoint(dir.path(), None);
    let src = zt::open(dir.path()).unwrap();
    let w = src.tensor("model.w").unwrap().data().unwrap();
    assert_eq!(&w.bytes().unwrap()[..], &f32s(w_global())[..]);
}

#[test]
fn a_safetensors_block_without_the_chunk_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    safetensors_checkpoint(dir.path(), Some("model.other"));
    let got = open_and_read(dir.path());
    assert!(
        cites!(got, Err(Error::Header { .. }), &["dcp.Chunk"]),
        "{got:?}"
    );
}

// Writing DCP (`format="dcp"`): zt's own reader reads it back. torch's
// reader is held to it in tests/torch/test_dcp_write.py.

/// Tensors of every kind the writer is asked for: f32, bf16, f16, int64,
/// bool, a scalar, an empty tensor, and names with dots.
fn write_inputs() -> Vec<(String, zt::DType, Vec<u64>, Vec<u8>)> {
    use zt::DType;
    let mut v = vec![
        (
            "model.w".to_string(),
            DType::F32,
            vec![4, 3],
            f32s((0..12).map(|i| i as f32 * 0.5)),
        ),
        (
            "model.b".into(),
            DType::BF16,
            vec![5],
            (0..10).map(|i| i as u8 * 7).collect(),
        ),
        (
            "h".into(),
            DType::F16,
            vec![2, 1, 2],
            vec![1, 60, 2, 61, 3, 62, 4, 63],
        ),
        (
            "step".into(),
            DType::I64,
            vec![],
            (-7i64).to_le_bytes().to_vec(),
        ),
        ("mask".into(), DType::Bool, vec![3], vec![1, 0, 1]),
        ("empty".into(), DType::F32, vec![0, 4], vec![]),
    ];
    // Enough bytes that a spread over files has something to spread.
    v.push((
        "big".into(),
        DType::U8,
        vec![300, 7],
        (0..2100).map(|i| (i % 251) as u8).collect(),
    ));
    v
}

fn tensor_ins(v: &[(String, zt::DType, Vec<u64>, Vec<u8>)]) -> Vec<zt::write::TensorIn<'_>> {
    v.iter()
        .map(|(name, dtype, shape, data)| zt::write::TensorIn {
            name,
            dtype: *dtype,
            shape,
            data,
        })
        .collect()
}

fn assert_reads_back(dir: &Path, inputs: &[(String, zt::DType, Vec<u64>, Vec<u8>)]) {
    let src = zt::open(dir).unwrap();
    assert_eq!(src.format(), "dcp");
    assert_eq!(src.len(), inputs.len());
    for (name, dtype, shape, data) in inputs {
        let t = src.tensor(name).unwrap().data().unwrap();
        assert_eq!(t.dtype(), *dtype, "{name}");
        assert_eq!(t.shape(), &shape[..], "{name}");
        assert_eq!(&t.bytes().unwrap()[..], &data[..], "{name}");
    }
}

fn distcp_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".distcp"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_written_checkpoint_reads_back_through_zt() {
    let inputs = write_inputs();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let writer = zt::registry().writer_named("dcp").unwrap();
    assert!(writer.caps().arrays);
    let n = writer
        .write_arrays(&tensor_ins(&inputs), None, &dir, &Default::default())
        .unwrap();
    assert!(dir.join(".metadata").is_file());
    assert_eq!(distcp_files(&dir), ["__0_0.distcp"]);
    let on_disk = std::fs::metadata(dir.join(".metadata")).unwrap().len()
        + std::fs::metadata(dir.join("__0_0.distcp")).unwrap().len();
    assert_eq!(n, on_disk);
    assert_reads_back(&dir, &inputs);
    // Each tensor is one chunk: the whole-tensor chunk is read in place.
    let src = zt::open(&dir).unwrap();
    assert!(src.tensor("model.w").unwrap().data().unwrap().caps().map);
    // Nothing is left beside the destination.
    let beside: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(beside.len(), 1);
}

#[test]
fn a_conversion_to_dcp_carries_every_tensor() {
    let inputs = write_inputs();
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    zt::formats::dcp::write::write(&first, &tensor_ins(&inputs), 1).unwrap();
    // DCP to DCP through a source, as `zt.convert(..., format="dcp")` and
    // `zt convert --to dcp` do.
    let source = zt::open(&first).unwrap();
    let second = tmp.path().join("second");
    zt::registry()
        .convert_to(&source, &second, "dcp", &Default::default())
        .unwrap();
    assert_reads_back(&second, &inputs);
}

#[test]
fn a_conversion_to_dcp_takes_the_number_of_files_as_an_option() {
    let inputs = write_inputs();
    let tmp = tempfile::tempdir().unwrap();
    let first = tmp.path().join("first");
    zt::formats::dcp::write::write(&first, &tensor_ins(&inputs), 1).unwrap();
    let source = zt::open(&first).unwrap();
    let files = |n| zt::WriteOptions {
        files: Some(n),
        ..Default::default()
    };
    let out = tmp.path().join("three");
    zt::registry()
        .convert_to(&source, &out, "dcp", &files(3))
        .unwrap();
    assert_eq!(
        distcp_files(&out),
        ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
    );
    assert_reads_back(&out, &inputs);
    // Zero files, and a file count for a format of one file, are refused
    // before anything is written.
    let zero = tmp.path().join("zero");
    let got = zt::registry().convert_to(&source, &zero, "dcp", &files(0));
    assert!(
        cites!(got, Err(Error::Write { .. }), &["write.Options"]),
        "{got:?}"
    );
    assert!(!zero.exists());
    let one = tmp.path().join("one.safetensors");
    let got = zt::convert(&source, &one, &files(2));
    assert!(
        cites!(got, Err(Error::Write { .. }), &["write.Options"]),
        "{got:?}"
    );
    assert!(got.unwrap_err().to_string().contains("files="));
    assert!(!one.exists());
    // A URL prefix is uploaded file by file (tests/torch/test_dcp_write.py
    // against SeaweedFS); a build without object storage says so.
    if !cfg!(feature = "remote") {
        let got = zt::registry().convert_to(
            &source,
            Path::new("s3://bucket/ckpt"),
            "dcp",
            &Default::default(),
        );
        assert!(
            matches!(
                got,
                Err(Error::Remote {
                    kind: zt::RemoteKind::Unsupported,
                    ..
                })
            ),
            "{got:?}"
        );
    }
    // A format zt does not write is named.
    let got = zt::registry().convert_to(&source, &tmp.path().join("x"), "nope", &files(1));
    assert!(
        cites!(got, Err(Error::Write { .. }), &["write.Format"]),
        "{got:?}"
    );
}

#[test]
fn detect_names_the_format_of_the_checkpoint_a_directory_opens_through() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    zt::formats::dcp::write::write(&dir, &tensor_ins(&write_inputs()), 2).unwrap();
    assert_eq!(zt::detect(&dir).unwrap(), "dcp");
    assert_eq!(zt::detect(dir.join(".metadata")).unwrap(), "dcp");
    // A model directory: its checkpoint file; a sharded one: its first shard.
    let model = tmp.path().join("model");
    let source = zt::open(&dir).unwrap();
    zt::convert_dir(
        &source,
        &model,
        "safetensors",
        1024,
        &[],
        &Default::default(),
    )
    .unwrap();
    assert!(model.join("model.safetensors.index.json").is_file());
    assert_eq!(zt::detect(&model).unwrap(), "safetensors");
    assert_eq!(
        zt::detect(model.join("model.safetensors.index.json")).unwrap(),
        "safetensors"
    );
    let pt = tmp.path().join("pt");
    zt::convert_dir(&source, &pt, "pt", 1 << 30, &[], &Default::default()).unwrap();
    assert_eq!(zt::detect(&pt).unwrap(), "pt");
    // A directory with no checkpoint says so, as opening it does.
    let empty = tempfile::tempdir().unwrap();
    let got = zt::detect(empty.path());
    assert!(
        cites!(got, Err(Error::Index { .. }), &["index.Checkpoint"]),
        "{got:?}"
    );
}

#[test]
fn tensors_spread_over_the_files_asked_for() {
    let inputs = write_inputs();
    let tmp = tempfile::tempdir().unwrap();
    for files in [2, 3, 7, 20] {
        let dir = tmp.path().join(format!("n{files}"));
        zt::formats::dcp::write::write(&dir, &tensor_ins(&inputs), files).unwrap();
        let expect: Vec<String> = (0..files.min(inputs.len()))
            .map(|i| format!("__0_{i}.distcp"))
            .collect();
        assert_eq!(distcp_files(&dir), expect);
        assert_reads_back(&dir, &inputs);
    }
}

#[test]
fn an_occupied_destination_is_refused_and_left_alone() {
    let inputs = write_inputs();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("keep"), b"mine").unwrap();
    let got = zt::formats::dcp::write::write(&dir, &tensor_ins(&inputs), 1);
    assert!(
        cites!(got, Err(Error::Write { .. }), &["write.Destination"]),
        "{got:?}"
    );
    assert_eq!(std::fs::read(dir.join("keep")).unwrap(), b"mine");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    // An empty directory is replaced.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    zt::formats::dcp::write::write(&empty, &tensor_ins(&inputs), 1).unwrap();
    assert_reads_back(&empty, &inputs);
}

#[test]
fn duplicate_names_and_bad_sizes_are_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    let data = f32s([1.0, 2.0]);
    let twice = [zt::write::TensorIn {
        name: "a",
        dtype: zt::DType::F32,
        shape: &[2],
        data: &data,
    }; 2];
    let got = zt::formats::dcp::write::write(&dir, &twice, 1);
    assert!(matches!(got, Err(Error::DuplicateName { .. })), "{got:?}");
    let short = [zt::write::TensorIn {
        name: "a",
        dtype: zt::DType::F32,
        shape: &[3],
        data: &data,
    }];
    let got = zt::formats::dcp::write::write(&dir, &short, 1);
    assert!(
        cites!(got, Err(Error::Write { .. }), &["write.Size"]),
        "{got:?}"
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}

#[test]
fn a_large_state_dict_reads_back_past_memo_frame_and_batch_bounds() {
    // Thousands of entries: memo indexes past 255 (`LONG_BINGET`), items
    // set in batches of 1000, `.metadata` over several 64 KiB frames.
    let names: Vec<String> = (0..2500).map(|i| format!("layers.{i}.w")).collect();
    let data: Vec<Vec<u8>> = (0..2500u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let tensors: Vec<zt::write::TensorIn<'_>> = names
        .iter()
        .zip(&data)
        .map(|(name, data)| zt::write::TensorIn {
            name,
            dtype: zt::DType::I32,
            shape: &[1],
            data,
        })
        .collect();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ckpt");
    zt::formats::dcp::write::write(&dir, &tensors, 2).unwrap();
    assert!(std::fs::metadata(dir.join(".metadata")).unwrap().len() > 3 * 65536);
    let src = zt::open(&dir).unwrap();
    assert_eq!(src.len(), 2500);
    for (name, data) in names.iter().zip(&data) {
        let t = src.tensor(name).unwrap().data().unwrap();
        assert_eq!(&t.bytes().unwrap()[..], &data[..], "{name}");
    }
}

/// A cast of a tensor assembled from chunks is taken a piece at a time
/// (the cast holds one piece of the original, not all of it): a 12 MiB f32
/// tensor in two column chunks (each row crosses both), cast to bf16,
/// equals the whole tensor's cast, element for element.
#[test]
fn a_cast_of_an_assembled_tensor_is_the_cast_of_the_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (rows, cols) = (3072u64, 1024u64);
    let value = |r: u64, c: u64| ((r * cols + c) as f32 * 0.37).sin() * 1e3;
    let block = |c0: u64, c1: u64| f32s((0..rows).flat_map(|r| (c0..c1).map(move |c| value(r, c))));
    let mut r0 = DistCp::new("__0_0.distcp");
    let mut r1 = DistCp::new("__1_0.distcp");
    let half = cols / 2;
    let storage = vec![
        r0.push("model.big", &[0, 0], &[rows, half], None, &block(0, half)),
        r1.push(
            "model.big",
            &[0, half],
            &[rows, half],
            None,
            &block(half, cols),
        ),
    ];
    let fixture = Fixture {
        tensors: vec![TensorEntry {
            fqn: "model.big",
            dtype: "float32",
            size: vec![rows, cols],
            chunks: vec![
                (vec![0, 0], vec![rows, half]),
                (vec![0, half], vec![rows, half]),
            ],
        }],
        storage,
        files: vec![r0, r1],
    };
    fixture.write(dir.path());
    let src = zt::open(dir.path()).unwrap();
    let cast = src
        .transform(&zt::Transform {
            dtype: Some(zt::DType::BF16),
            ..zt::Transform::default()
        })
        .unwrap();
    let got = cast
        .tensor("model.big")
        .unwrap()
        .data()
        .unwrap()
        .bytes()
        .unwrap();
    let want: Vec<u8> = (0..rows)
        .flat_map(|r| (0..cols).map(move |c| value(r, c)))
        .flat_map(|x| zt::cast::f32_to_bf16(x).to_le_bytes())
        .collect();
    assert_eq!(got.len(), want.len());
    assert!(got[..] == want[..]);
}
