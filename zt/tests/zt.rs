//! `.zt` writer, verification and hostile-input tests (the conformance
//! corpus is in `zt_conformance.rs`; byte-compatibility with upstream
//! ztensor is tested from Python in `tests/test_zt.py`).

#[macro_use]
#[path = "support/cites.rs"]
mod cites;

use std::borrow::Cow;

use zt::container::cbor::Cbor;
use zt::container::verify::{canonical_violations, content_digest};
use zt::container::write::{write_objects, ObjectIn, Options, PartIn, Writer};
use zt::verify;
use zt::{Align, DType, Error};

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn opts(align: Align) -> Options {
    Options {
        canonical: align == Align::Canonical,
        align,
        ..Options::default()
    }
}

#[test]
fn batch_and_incremental_writers_agree_and_dedup() {
    let dir = tempfile::tempdir().unwrap();
    let a = f32s(&[1.0, 2.0, 3.0]);
    let b = f32s(&[4.0; 1000]);
    for align in [Align::Canonical, Align::Auto, Align::Bytes(8192)] {
        let (p1, p2) = (dir.path().join("1.zt"), dir.path().join("2.zt"));
        let objects = vec![
            ObjectIn::dense("a", DType::F32, &[3], &a),
            ObjectIn::dense("b", DType::F32, &[1000], &b),
            ObjectIn::dense("c", DType::F32, &[3], &a),
        ];
        write_objects(&p1, objects, None, &opts(align)).unwrap();
        let mut w = Writer::create(&p2, opts(align)).unwrap();
        w.add("a", DType::F32, &[3], &a).unwrap();
        w.stream("b", &[1000], "dense", None, &[("data", DType::F32, 4000)])
            .unwrap();
        for chunk in b.chunks(999) {
            w.write_chunk(chunk).unwrap();
        }
        w.close_stream().unwrap();
        w.stream("c", &[3], "dense", None, &[("data", DType::F32, 12)])
            .unwrap();
        w.write_chunk(&a).unwrap();
        w.close_stream().unwrap();
        w.finish().unwrap();
        assert_eq!(
            std::fs::read(&p1).unwrap(),
            std::fs::read(&p2).unwrap(),
            "{align:?}"
        );
        let src = zt::open(&p1).unwrap();
        let (la, lc) = (
            src.tensor("a").unwrap().data().unwrap().locate().unwrap(),
            src.tensor("c").unwrap().data().unwrap().locate().unwrap(),
        );
        assert_eq!(la, lc);
        assert_eq!(verify(&p1, true).unwrap().checked, 3);
        assert_eq!(
            canonical_violations(&p1).unwrap().is_empty(),
            align == Align::Canonical
        );
    }
}

#[test]
fn large_parts_hashed_while_written_still_share_and_match_the_batch_writer() {
    // Parts of 8 MiB or more are written by `Writer::add` while a helper
    // hashes them; a repeat is found after its write and cut back off the
    // file. Same bytes as the batch writer, in every placement.
    let dir = tempfile::tempdir().unwrap();
    let big = |seed: u32| -> Vec<u8> {
        (0..(9u32 << 20) / 4)
            .flat_map(|i| (i.wrapping_mul(2_654_435_761) ^ seed).to_le_bytes())
            .collect()
    };
    let (x, y) = (big(1), big(2));
    let mut x_tail = x.clone();
    *x_tail.last_mut().unwrap() ^= 1;
    let small = f32s(&[7.0; 10]);
    let named: [(&str, &[u8]); 6] = [
        ("a", &x),
        ("b", &y),
        ("c", &x),
        ("d", &small),
        ("e", &x_tail),
        ("f", &y),
    ];
    for align in [Align::Canonical, Align::Auto, Align::Bytes(8192)] {
        let (p1, p2) = (dir.path().join("batch.zt"), dir.path().join("incr.zt"));
        let objects = named
            .iter()
            .map(|(n, d)| ObjectIn::dense(n, DType::F32, &[(d.len() / 4) as u64], d))
            .collect();
        write_objects(&p1, objects, None, &opts(align)).unwrap();
        let mut w = Writer::create(&p2, opts(align)).unwrap();
        for (n, d) in named {
            w.add(n, DType::F32, &[(d.len() / 4) as u64], d).unwrap();
        }
        w.finish().unwrap();
        assert_eq!(
            std::fs::read(&p1).unwrap(),
            std::fs::read(&p2).unwrap(),
            "{align:?}"
        );
        let src = zt::open(&p2).unwrap();
        let at = |n: &str| src.tensor(n).unwrap().data().unwrap().locate().unwrap();
        assert_eq!(at("a"), at("c"));
        assert_eq!(at("b"), at("f"));
        assert_ne!(at("a"), at("e"));
        assert_eq!(verify(&p2, true).unwrap().checked, 6);
        if align == Align::Canonical {
            let violations = canonical_violations(&p2).unwrap();
            assert!(violations.is_empty(), "{violations:?}");
        }
    }
}

#[test]
fn content_digest_ignores_placement_and_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let data = f32s(&[0.5; 4096]);
    let mut ids = Vec::new();
    for (i, (align, level)) in [
        (Align::Canonical, None),
        (Align::Bytes(4096), None),
        (Align::Auto, Some(5)),
    ]
    .into_iter()
    .enumerate()
    {
        let p = dir.path().join(format!("{i}.zt"));
        let o = Options {
            compression: level,
            ..opts(align)
        };
        write_objects(
            &p,
            vec![ObjectIn::dense("x", DType::F32, &[4096], &data)],
            None,
            &o,
        )
        .unwrap();
        ids.push(content_digest(&p).unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn verify_checks_data_rules() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.zt");
    let o = ObjectIn {
        name: "m".into(),
        shape: vec![3],
        layout: "dense".into(),
        attributes: None,
        parts: vec![PartIn {
            name: "data".into(),
            dtype: DType::Bool,
            data: Cow::Borrowed(&[1, 2, 0]),
            compression: None,
        }],
    };
    write_objects(&p, vec![o], None, &Options::default()).unwrap();
    assert!(cites!(
        verify(&p, false),
        Err(Error::Integrity { .. }),
        &["zt.LayoutData"]
    ));
    // CSR whose column index is out of range.
    let p = dir.path().join("csr.zt");
    let idx: Vec<u8> = [0u32, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
    let ptr: Vec<u8> = [0u32, 1, 2].iter().flat_map(|x| x.to_le_bytes()).collect();
    let vals = f32s(&[1.0, 2.0]);
    let part = |name: &str, dtype, data: &[u8]| PartIn {
        name: name.into(),
        dtype,
        data: Cow::Owned(data.to_vec()),
        compression: None,
    };
    let o = ObjectIn {
        name: "s".into(),
        shape: vec![2, 4],
        layout: "zt.sparse_csr/1".into(),
        attributes: None,
        parts: vec![
            part("values", DType::F32, &vals),
            part("indices", DType::U32, &idx),
            part("indptr", DType::U32, &ptr),
        ],
    };
    write_objects(&p, vec![o], None, &Options::default()).unwrap();
    assert!(zt::open(&p).is_ok());
    assert!(cites!(
        verify(&p, false),
        Err(Error::Integrity { .. }),
        &["zt.LayoutData"]
    ));
}

/// Two identical tensors share one blob: neither may report pages of its
/// own to evict, and evicting one must drop nothing the other maps.
#[test]
fn deduplicated_parts_do_not_evict_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("tied.zt");
    let big = f32s(&[7.0; 64 << 10]);
    let objects = vec![
        ObjectIn::dense("a", DType::F32, &[64 << 10], &big),
        ObjectIn::dense("b", DType::F32, &[64 << 10], &big),
    ];
    write_objects(&p, objects, None, &opts(Align::Canonical)).unwrap();
    let src = zt::open(&p).unwrap();
    let (a, b) = (
        src.tensor("a").unwrap().data().unwrap(),
        src.tensor("b").unwrap().data().unwrap(),
    );
    assert_eq!(a.locate(), b.locate(), "the writer shares the blob");
    assert!(!a.caps().evict && !b.caps().evict);
    assert_eq!(a.evict().unwrap(), 0);
}

/// The default (non-durable) incremental writer still builds beside the
/// destination: a write that fails or is dropped leaves the old file whole.
#[test]
fn a_failed_write_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("keep.zt");
    write_objects(
        &p,
        vec![ObjectIn::dense("old", DType::F32, &[1], &f32s(&[1.0]))],
        None,
        &Options::default(),
    )
    .unwrap();
    let before = std::fs::read(&p).unwrap();
    let mut w = Writer::create(&p, Options::default()).unwrap();
    w.add("b", DType::F32, &[1], &f32s(&[2.0])).unwrap();
    assert!(w.add("a", DType::F32, &[1], &f32s(&[3.0])).is_err());
    drop(w);
    assert_eq!(std::fs::read(&p).unwrap(), before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn writer_refusals_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.zt");
    let mut w = Writer::create(
        &p,
        Options {
            publish: true,
            ..Options::default()
        },
    )
    .unwrap();
    w.add("b", DType::F32, &[1], &f32s(&[1.0])).unwrap();
    assert!(cites!(
        w.add("a", DType::F32, &[1], &f32s(&[1.0])),
        Err(Error::Write { .. }),
        &["zt.Write"]
    ));
    assert!(cites!(
        w.add("c", DType::F32, &[2], &f32s(&[1.0])),
        Err(Error::Write { .. }),
        &["zt.DenseSize"]
    ));
    drop(w);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let bad = Options {
        align: Align::Bytes(4096),
        ..Options::default()
    };
    assert!(cites!(
        Writer::create(&p, bad),
        Err(Error::Write { .. }),
        &["write.Options"]
    ));
    let attrs = Cbor::map([("", Cbor::Null)]);
    let mut w = Writer::create(&p, Options::default()).unwrap();
    assert!(cites!(
        w.set_attributes(attrs),
        Err(Error::Write { .. }),
        &["zt.Name"]
    ));
    w.abandon();
    assert!(!p.exists());
}

#[test]
fn append_keeps_the_old_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.zt");
    write_objects(
        &p,
        vec![ObjectIn::dense("a", DType::F32, &[1], &f32s(&[1.0]))],
        None,
        &Options::default(),
    )
    .unwrap();
    let before = std::fs::read(&p).unwrap();
    let mut w = Writer::open(&p, opts(Align::Auto)).unwrap();
    w.add("b", DType::F32, &[1], &f32s(&[2.0])).unwrap();
    assert!(matches!(
        w.add("a", DType::F32, &[1], &f32s(&[2.0])),
        Err(Error::DuplicateName { .. })
    ));
    w.finish().unwrap();
    let after = std::fs::read(&p).unwrap();
    assert_eq!(&after[..before.len()], &before[..]);
    let src = zt::open(&p).unwrap();
    assert_eq!(src.names().collect::<Vec<_>>(), ["a", "b"]);
    assert!(!canonical_violations(&p).unwrap().is_empty());
}

#[test]
fn every_truncation_and_bit_flip_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("v.zt");
    let mut o = ObjectIn::dense("w", DType::F32, &[3], &[0u8; 12]);
    o.attributes = Some(Cbor::map([(
        "k",
        Cbor::Array(vec![Cbor::Float(0.5), Cbor::Text("x".into())]),
    )]));
    write_objects(&p, vec![o], None, &opts(Align::Bytes(4096))).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    let q = dir.path().join("h.zt");
    for cut in [0, 7, 47, 48, 4096, bytes.len() - 41, bytes.len() - 1] {
        std::fs::write(&q, &bytes[..cut]).unwrap();
        assert!(zt::open(&q).is_err(), "cut at {cut}");
    }
    // Flip every byte of the manifest and footer: errors, never panics.
    for i in bytes.len() - 400..bytes.len() {
        let mut b = bytes.clone();
        b[i] ^= 0x5a;
        std::fs::write(&q, &b).unwrap();
        if let Ok(src) = zt::open(&q) {
            for t in src.tensors() {
                for part in t.parts() {
                    let _ = part.bytes();
                }
            }
        }
    }
}

#[test]
fn range_reads_decode_only_the_frames_they_touch() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("z.zt");
    let data: Vec<u8> = (0..(3 << 20) + 1000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let o = Options {
        compression: Some(1),
        ..opts(Align::Auto)
    };
    write_objects(
        &p,
        vec![ObjectIn::dense("z", DType::U8, &[data.len() as u64], &data)],
        None,
        &o,
    )
    .unwrap();
    let store = zt::Store::open(&p).unwrap();
    let (_, m) = zt::container::read::manifest_of(&store, &zt::Limits::default()).unwrap();
    let part = &m.unwrap().objects[0].parts[0];
    let blob = store.read(part.offset, part.length).unwrap().into_owned();
    let frames =
        zt::container::encoding::seek_table(&blob, data.len() as u64, &zt::Context::default())
            .unwrap();
    assert_eq!(frames.len(), 4);
    drop(store);
    // Corrupt the last frame: a range inside frame 0 still reads; the whole part does not.
    let mut bytes = std::fs::read(&p).unwrap();
    let last = frames[3];
    bytes[(part.offset + last.offset + last.compressed / 2) as usize] ^= 0xff;
    std::fs::write(&p, &bytes).unwrap();
    let src = zt::open(&p).unwrap();
    let t = src.tensor("z").unwrap();
    let pr = t.data().unwrap();
    assert_eq!(&pr.storage_range(100, 5000).unwrap()[..], &data[100..5100]);
    let across = pr.storage_range((1 << 20) - 10, 20).unwrap();
    assert_eq!(&across[..], &data[(1 << 20) - 10..(1 << 20) + 10]);
    assert!(cites!(
        pr.bytes(),
        Err(Error::Decode { .. }),
        &["zt.Encoding"]
    ));
    assert!(cites!(
        pr.storage_range(0, data.len() as u64 + 1),
        Err(Error::Range { .. }),
        &["core.ReadRange"]
    ));
}

#[test]
fn shards_resolve_positionally_and_verify_deeply() {
    use zt::container::cbor::encode;
    use zt::container::container::{Footer, MAGIC};
    let dir = tempfile::tempdir().unwrap();
    let data = f32s(&[1.0, 2.0, 3.0, 4.0]);
    // A data shard: magic, one blob at 4096, a footer with no manifest.
    let mut shard = MAGIC.to_vec();
    shard.resize(4096, 0);
    shard.extend_from_slice(&data);
    shard.extend_from_slice(
        &Footer {
            manifest_offset: 0,
            manifest_length: 0,
            manifest_hash: 0,
            version: 2,
        }
        .encode(),
    );
    let shard_path = dir.path().join("model-00001.zt");
    std::fs::write(&shard_path, &shard).unwrap();
    let digest = zt::DigestAlgorithm::Sha256.digest(&shard).to_string();
    let part = Cbor::map([
        ("dtype", Cbor::Text("f32".into())),
        ("blob", Cbor::Array(vec![Cbor::UInt(4096), Cbor::UInt(16)])),
        ("shard", Cbor::Text("00001".into())),
    ]);
    let obj = Cbor::map([
        ("shape", Cbor::Array(vec![Cbor::UInt(4)])),
        ("layout", Cbor::Text("dense".into())),
        ("parts", Cbor::map([("data", part)])),
    ]);
    let root = Cbor::map([
        ("objects", Cbor::map([("w", obj)])),
        (
            "shards",
            Cbor::map([(
                "00001",
                Cbor::map([
                    ("size", Cbor::UInt(shard.len() as u64)),
                    ("digest", Cbor::Text(digest.into())),
                ]),
            )]),
        ),
    ]);
    let manifest = encode(&root);
    let mut file = MAGIC.to_vec();
    file.resize(4096, 0);
    file.extend_from_slice(&manifest);
    let hash = match zt::DigestAlgorithm::Xxh3.digest(&manifest) {
        zt::Digest::Xxh3(h) => h,
        _ => unreachable!(),
    };
    file.extend_from_slice(
        &Footer {
            manifest_offset: 4096,
            manifest_length: manifest.len() as u64,
            manifest_hash: hash,
            version: 2,
        }
        .encode(),
    );
    let root_path = dir.path().join("model.zt");
    std::fs::write(&root_path, &file).unwrap();
    let src = zt::open(&root_path).unwrap();
    assert_eq!(src.files().len(), 2);
    assert_eq!(
        &src.tensor("w").unwrap().data().unwrap().bytes().unwrap()[..],
        &data[..]
    );
    verify(&root_path, true).unwrap();
    // Same size, different bytes: the open succeeds (it reads no shard
    // byte), the first read of a tensor in the shard hashes it and fails,
    // and so does every check.
    let mut tampered = shard.clone();
    tampered[4096] ^= 1;
    std::fs::write(&shard_path, &tampered).unwrap();
    let src = zt::open(&root_path).unwrap();
    assert!(cites!(
        src.tensor("w").unwrap().data().unwrap().bytes(),
        Err(Error::Integrity { .. }),
        &["zt.ShardIdentity"]
    ));
    for deep in [false, true] {
        assert!(cites!(
            verify(&root_path, deep),
            Err(Error::Integrity { .. }),
            &["zt.ShardIdentity"]
        ));
    }
    // A shard of the wrong size fails at open.
    tampered.push(0);
    std::fs::write(&shard_path, &tampered).unwrap();
    assert!(cites!(
        zt::open(&root_path),
        Err(Error::Index { .. }),
        &["zt.ShardIdentity"]
    ));
    std::fs::remove_file(&shard_path).unwrap();
    assert!(matches!(zt::open(&root_path), Err(Error::NotFound { .. })));
}

#[test]
fn a_refused_name_names_the_file_and_tensor_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.zt");
    let data = f32s(&[1.0]);
    let bad = "x\0y";
    let err = write_objects(
        &path,
        vec![ObjectIn::dense(bad, DType::F32, &[1], &data)],
        None,
        &Options::default(),
    )
    .unwrap_err();
    assert!(cites!(err, Error::Write { .. }, &["zt.Name"]), "{err:?}");
    let text = err.to_string();
    let file = path.display().to_string();
    assert_eq!(text.matches(&file).count(), 1, "{text}");
    assert_eq!(text.matches("tensor ").count(), 1, "{text}");
    assert!(text.contains("breaks the name rules"), "{text}");
    assert!(!path.exists());
}

/// A root `.zt` of 8 KiB of zero data at 4096 and `objects` as its
/// manifest (name -> (blob offset, blob length), dense f32[4] each).
fn root_with(
    dir: &std::path::Path,
    name: &str,
    objects: &[(&str, u64, u64)],
) -> std::path::PathBuf {
    use zt::container::cbor::encode;
    use zt::container::container::{Footer, MAGIC};
    let objects = objects.iter().map(|&(name, offset, len)| {
        let part = Cbor::map([
            ("dtype", Cbor::Text("f32".into())),
            (
                "blob",
                Cbor::Array(vec![Cbor::UInt(offset), Cbor::UInt(len)]),
            ),
        ]);
        let obj = Cbor::map([
            ("shape", Cbor::Array(vec![Cbor::UInt(4)])),
            ("layout", Cbor::Text("dense".into())),
            ("parts", Cbor::map([("data", part)])),
        ]);
        (name, obj)
    });
    let manifest = encode(&Cbor::map([("objects", Cbor::map(objects))]));
    let mut file = MAGIC.to_vec();
    file.resize(4096 + 8192, 0);
    let manifest_offset = file.len() as u64;
    file.extend_from_slice(&manifest);
    let zt::Digest::Xxh3(hash) = zt::DigestAlgorithm::Xxh3.digest(&manifest) else {
        unreachable!()
    };
    file.extend_from_slice(
        &Footer {
            manifest_offset,
            manifest_length: manifest.len() as u64,
            manifest_hash: hash,
            version: 2,
        }
        .encode(),
    );
    let path = dir.join(name);
    std::fs::write(&path, &file).unwrap();
    path
}

#[test]
fn open_reports_what_validation_finds_first_then_the_first_bad_object_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let failure = |objects: &[(&str, u64, u64)]| {
        let path = root_with(dir.path(), "m.zt", objects);
        let e = zt::open(&path).unwrap_err();
        let image = zt::container::read::validate_image(
            &zt::Store::open(&path).unwrap(),
            &zt::Limits::default(),
        );
        (
            e.rule().map(|r| r.name()),
            e.context().tensor.clone(),
            image,
        )
    };
    // Both break the dense size equation (8 bytes for f32[4]). The
    // manifest lists "zz" first (shorter keys sort first); the open names
    // "aaa", the first by name, as upstream's name-ordered catalog meets it.
    let (rule, tensor, _) = failure(&[("zz", 4096, 8), ("aaa", 8192, 8)]);
    assert_eq!(
        (rule, tensor.as_deref()),
        (Some("zt.DenseSize"), Some("aaa"))
    );
    // A partial overlap outranks any object's layout.
    // (Blob offsets are multiples of 4096.)
    let (rule, _, image) = failure(&[("zz", 4096, 8192), ("aaa", 8192, 16)]);
    assert_eq!(rule, Some("zt.BlobOverlap"));
    assert_eq!(image.unwrap_err().rule().map(|r| r.name()), rule);
    // A blob out of bounds outranks an overlap and the layouts; the first
    // in manifest order is named.
    let (rule, tensor, image) =
        failure(&[("zz", 4096, 8192), ("aaa", 8192, 16), ("bbbb", 1 << 20, 16)]);
    assert_eq!(
        (rule, tensor.as_deref()),
        (Some("zt.BlobBounds"), Some("bbbb"))
    );
    assert_eq!(image.unwrap_err().rule().map(|r| r.name()), rule);
    // Intact, every object reads, listed by name.
    let path = root_with(dir.path(), "ok.zt", &[("zz", 4096, 16), ("aaa", 8192, 16)]);
    let names: Vec<String> = zt::open(&path).unwrap().names().map(String::from).collect();
    assert_eq!(names, ["aaa", "zz"]);
}

/// A conversion to `.zt` streams object by object through the incremental
/// writer; its bytes must be the batch writer's for the same objects:
/// mapped and decoded parts (a compressed source, a cast), duplicates
/// shared, other layouts' parts as stored, attributes, an empty tensor,
/// canonical and aligned placements, and compressed output.
#[test]
fn conversions_to_zt_write_the_batch_writers_bytes() {
    use zt::container::write::{attributes_cbor, objects_of, ZtOptions};
    use zt::{Transform, WriteOptions};
    let dir = tempfile::tempdir().unwrap();
    let src_path = dir.path().join("src.zt");
    let big: Vec<u8> = (0..300_000u32)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let small = f32s(&[1.0, 2.0, 3.0]);
    let idx: Vec<u8> = [0u32, 1].iter().flat_map(|x| x.to_le_bytes()).collect();
    let ptr: Vec<u8> = [0u32, 1, 2].iter().flat_map(|x| x.to_le_bytes()).collect();
    let vals = f32s(&[1.0, 2.0]);
    let part = |name: &str, dtype, data: &[u8], compression| PartIn {
        name: name.into(),
        dtype,
        data: Cow::Owned(data.to_vec()),
        compression,
    };
    let csr = ObjectIn {
        name: "sparse".into(),
        shape: vec![2, 2],
        layout: "zt.sparse_csr/1".into(),
        attributes: None,
        parts: vec![
            part("values", DType::F32, &vals, None),
            part("indices", DType::U32, &idx, None),
            part("indptr", DType::U32, &ptr, None),
        ],
    };
    let dense = |name: &str, shape: &[u64], data: &[u8], compression| ObjectIn {
        name: name.into(),
        shape: shape.to_vec(),
        layout: "dense".into(),
        attributes: None,
        parts: vec![part("data", DType::F32, data, compression)],
    };
    let objects = vec![
        dense("z.big", &[300_000], &big, Some(1)),
        dense("a", &[3], &small, None),
        dense("dup", &[3], &small, None),
        dense("empty", &[0], &[], None),
        csr,
    ];
    let attributes = Cbor::map([("k", Cbor::Text("v".into()))]);
    let o = Options {
        canonical: false,
        ..opts(Align::Auto)
    };
    write_objects(&src_path, objects, Some(attributes), &o).unwrap();
    let source = zt::open(&src_path).unwrap();
    let cast = source
        .transform(&Transform {
            dtype: Some(DType::BF16),
            ..Transform::default()
        })
        .unwrap();
    let aligned = WriteOptions::default().with_format(ZtOptions {
        align: Some(Align::Bytes(4096)),
        ..ZtOptions::default()
    });
    // Compressed (issue 43): a window of objects encoded at once, then
    // added in order; the big part spans two frames.
    let compressed = WriteOptions::default().with_format(ZtOptions {
        compression: Some(3),
        ..ZtOptions::default()
    });
    for (label, source, options) in [
        ("canonical", &source, WriteOptions::default()),
        ("cast", &cast, WriteOptions::default()),
        ("aligned", &source, aligned),
        ("compressed", &source, compressed.clone()),
        ("compressed-cast", &cast, compressed),
    ] {
        let streamed = dir.path().join(format!("{label}-streamed.zt"));
        let batch = dir.path().join(format!("{label}-batch.zt"));
        zt::convert(source, &streamed, &options).unwrap();
        write_objects(
            &batch,
            objects_of(source).unwrap(),
            attributes_cbor(source.attributes()),
            &Options::from_write_options(&options),
        )
        .unwrap();
        assert_eq!(
            std::fs::read(&streamed).unwrap(),
            std::fs::read(&batch).unwrap(),
            "{label}"
        );
    }
}
