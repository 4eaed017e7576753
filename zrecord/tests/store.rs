//! Round trips, every open-time rejection loaderx makes (asserted by
//! variant), lock modes and publish semantics.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use zrecord::{train_dict, Codec, CreateOptions, Error, Geometry, Layout, Reader, Schema, Writer};

fn rows(n: usize, width: usize, seed: u64) -> Vec<u8> {
    // Compressible but not constant, so zstd frames differ per record.
    (0..n * width)
        .map(|i| ((i as u64 / 7).wrapping_mul(seed + 31) % 23) as u8)
        .collect()
}

fn options(codec: Codec, shards: usize, sample: &[u8], width: usize) -> CreateOptions {
    let dict = (codec == Codec::ZstdDict).then(|| {
        let sizes = vec![width; sample.len() / width];
        train_dict(sample, &sizes, 4096).unwrap()
    });
    CreateOptions {
        codec,
        data_shards: shards,
        dict,
        level: None,
    }
}

fn dense_store(dir: &Path, codec: Codec, shards: usize, n: usize) -> (PathBuf, Vec<u8>) {
    let width = 48;
    let data = rows(n, width, 3);
    let path = dir.join(format!("d-{codec:?}-{shards}"));
    let schema = Schema::dense("|u1", &[4, 12]).unwrap();
    let mut w = Writer::create(&path, &schema, &options(codec, shards, &data, width)).unwrap();
    w.append_dense(&data[..width * (n / 3)]).unwrap();
    w.append_dense(&data[width * (n / 3)..]).unwrap();
    w.close().unwrap();
    (path, data)
}

#[test]
fn dense_round_trip_every_codec_and_shard_count() {
    let dir = tempfile::tempdir().unwrap();
    for codec in [Codec::Raw, Codec::Zstd, Codec::ZstdDict] {
        for shards in [1, 2, 4, 7] {
            let n = 5000; // crosses a 4096-record append window
            let (path, data) = dense_store(dir.path(), codec, shards, n);
            let r = Reader::open(&path, true).unwrap();
            assert_eq!(
                (r.len(), r.codec(), r.data_shards()),
                (n as u64, Some(codec), shards)
            );
            let all: Vec<u64> = (0..n as u64).collect();
            let mut out = vec![0u8; data.len()];
            r.gather_dense(&all, &mut out).unwrap();
            assert_eq!(out, data, "{codec:?} {shards}");
            let pick = [4999u64, 0, 17, 17, 2500];
            let mut out = vec![0u8; 5 * 48];
            r.gather_dense(&pick, &mut out).unwrap();
            for (j, &i) in pick.iter().enumerate() {
                assert_eq!(
                    &out[j * 48..(j + 1) * 48],
                    &data[i as usize * 48..(i as usize + 1) * 48]
                );
            }
        }
    }
}

#[test]
fn ragged_round_trip_every_codec_and_shard_count() {
    let dir = tempfile::tempdir().unwrap();
    for (layout, codec) in [Layout::Loaderx28, Layout::Loaderx23]
        .into_iter()
        .flat_map(|l| [Codec::Raw, Codec::Zstd, Codec::ZstdDict].map(|c| (l, c)))
    {
        for shards in [1, 3, 4] {
            let n = 600;
            let mut payloads = Vec::new();
            let mut shapes = Vec::new();
            for i in 0..n {
                let (a, b) = (1 + i % 5, 1 + (i * 7) % 11);
                shapes.extend([a as u64, b as u64]);
                payloads.push(rows(a * b, 4, i as u64));
            }
            let refs: Vec<&[u8]> = payloads.iter().map(|p| p.as_slice()).collect();
            let sample: Vec<u8> = payloads.concat();
            let path = dir.path().join(format!("r-{layout}-{codec:?}-{shards}"));
            let schema = Schema::new(layout, "<i4", Geometry::Ragged { ndim: 2 }).unwrap();
            let mut opts = options(codec, shards, &sample, 4);
            if codec == Codec::ZstdDict {
                let sizes: Vec<usize> = payloads.iter().map(|p| p.len()).collect();
                opts.dict = Some(train_dict(&sample, &sizes, 4096).unwrap());
            }
            let mut w = Writer::create(&path, &schema, &opts).unwrap();
            w.append_ragged(&refs, &shapes).unwrap();
            w.close().unwrap();
            let r = Reader::open(&path, false).unwrap();
            assert_eq!(r.schema(), &schema);
            let idxs: Vec<u64> = (0..n as u64).rev().collect();
            let got = r.gather_ragged(&idxs).unwrap();
            for (j, &i) in idxs.iter().enumerate() {
                let i = i as usize;
                let (a, b) = (got.offsets[j] as usize, got.offsets[j + 1] as usize);
                assert_eq!(&got.values()[a..b], payloads[i].as_slice());
                assert_eq!(&got.shapes[j * 2..j * 2 + 2], &shapes[i * 2..i * 2 + 2]);
            }
            assert_eq!(
                r.record_lengths(&[0]).unwrap(),
                // The shape prefix: two u32 (loaderx 2.8) or two u64 (2.3).
                vec![2 * layout.dim_bytes() as u64 + payloads[0].len() as u64]
            );
        }
    }
}

#[test]
fn schema_geometry_must_match() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dense_store(dir.path(), Codec::Raw, 2, 10);
    assert!(matches!(
        Reader::open(&path, false),
        Err(Error::SchemaFields { .. })
    ));
    assert!(Reader::open_any(&path).is_ok());
}

#[test]
fn bad_arguments_are_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let schema = Schema::ragged("<i4", 1).unwrap();
    let mut w = Writer::create(&path, &schema, &CreateOptions::default()).unwrap();
    assert!(matches!(
        w.append_ragged(&[], &[]),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        w.append_ragged(&[&[1, 2, 3, 4][..], &[][..]], &[1, 0]),
        Err(Error::RecordSize { index: 1, .. })
    ));
    assert!(matches!(
        w.append_ragged(&[&[1, 2, 3, 4][..]], &[2]),
        Err(Error::Invalid { .. })
    ));
    assert!(matches!(
        w.append_dense(&[0; 4]),
        Err(Error::Invalid { .. })
    ));
    assert_eq!(w.len(), 0);
    let dict_without = CreateOptions {
        codec: Codec::ZstdDict,
        ..CreateOptions::default()
    };
    assert!(matches!(
        Writer::create(dir.path().join("x"), &schema, &dict_without),
        Err(Error::Invalid { .. })
    ));
    let dict_with_raw = CreateOptions {
        dict: Some(vec![1]),
        ..CreateOptions::default()
    };
    assert!(matches!(
        Writer::create(dir.path().join("y"), &schema, &dict_with_raw),
        Err(Error::Invalid { .. })
    ));
    let zero = CreateOptions {
        data_shards: 0,
        ..CreateOptions::default()
    };
    assert!(matches!(
        Writer::create(dir.path().join("z"), &schema, &zero),
        Err(Error::Invalid { .. })
    ));
    assert!(Schema::dense("|O", &[1]).is_err());
    assert!(Schema::dense("<f4", &[0]).is_err());
    assert!(Schema::ragged("<f4", 0).is_err());
}

// ---- publish, discard, locks --------------------------------------------

#[test]
fn nothing_is_published_before_close_and_drop_discards() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let schema = Schema::dense("<i4", &[2]).unwrap();
    let mut w = Writer::create(&path, &schema, &CreateOptions::default()).unwrap();
    w.append_dense(&[1; 80]).unwrap();
    assert!(!path.exists());
    assert!(matches!(Reader::open(&path, true), Err(Error::Busy { .. })));
    assert!(matches!(
        Writer::create(&path, &schema, &CreateOptions::default()),
        Err(Error::Busy { .. })
    ));
    drop(w);
    assert!(!path.exists());
    assert_eq!(
        fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the build is removed"
    );
    assert!(matches!(
        Reader::open(&path, true),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn stale_build_of_a_dead_writer_is_cleared() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let build = zrecord::writer::build_dir(&path);
    fs::create_dir(&build).unwrap();
    fs::write(build.join("meta.zr"), b"junk").unwrap();
    assert!(matches!(
        Reader::open(&path, true),
        Err(Error::NotFound { .. })
    ));
    let schema = Schema::dense("<i4", &[2]).unwrap();
    let mut w = Writer::create(&path, &schema, &CreateOptions::default()).unwrap();
    w.append_dense(&[0; 8]).unwrap();
    w.close().unwrap();
    assert_eq!(Reader::open(&path, true).unwrap().len(), 1);
    assert!(!build.exists());
}

#[test]
fn lock_modes() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dense_store(dir.path(), Codec::Raw, 2, 10);
    let schema = Schema::dense("|u1", &[4, 12]).unwrap();
    let a = Reader::open(&path, true).unwrap();
    let b = Reader::open(&path, true).unwrap();
    assert!(matches!(
        Writer::create(&path, &schema, &CreateOptions::default()),
        Err(Error::Busy { .. })
    ));
    drop((a, b));
    assert!(matches!(
        Writer::create(&path, &schema, &CreateOptions::default()),
        Err(Error::AlreadyExists { .. })
    ));
    let other = dir.path().join("other");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("note"), b"x").unwrap();
    assert!(matches!(
        Writer::create(&other, &schema, &CreateOptions::default()),
        Err(Error::AlreadyExists { .. })
    ));
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let mut w = Writer::create(&empty, &schema, &CreateOptions::default()).unwrap();
    w.append_dense(&[7; 48]).unwrap();
    w.close().unwrap();
    assert_eq!(Reader::open(&empty, true).unwrap().len(), 1);
    let nested = dir.path().join("a/b/c");
    Writer::create(&nested, &schema, &CreateOptions::default())
        .unwrap()
        .close()
        .unwrap();
    assert_eq!(Reader::open(&nested, true).unwrap().len(), 0);
}

// ---- corruption: every case loaderx rejects -------------------------------

fn corrupt(f: impl FnOnce(&Path)) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dense_store(dir.path(), Codec::Zstd, 3, 30);
    f(&path);
    Reader::open(&path, true)
        .err()
        .expect("corrupt store must not open")
}

fn poke(path: &Path, at: u64, bytes: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .open(path.join("meta.zr"))
        .unwrap();
    f.write_all_at(bytes, at).unwrap();
}

#[test]
fn truncated_meta_page() {
    let e = corrupt(|p| {
        OpenOptions::new()
            .write(true)
            .open(p.join("meta.zr"))
            .unwrap()
            .set_len(4095)
            .unwrap()
    });
    assert!(matches!(e, Error::ShortPage { len: 4095, .. }), "{e:?}");
}

#[test]
fn schema_length_zero_or_too_long() {
    assert!(matches!(
        corrupt(|p| poke(p, 8, &0u16.to_le_bytes())),
        Error::SchemaLength { len: 0, .. }
    ));
    assert!(matches!(
        corrupt(|p| poke(p, 8, &2041u16.to_le_bytes())),
        Error::SchemaLength { len: 2041, .. }
    ));
}

#[test]
fn zero_shards_unknown_codec_reserved_byte() {
    assert!(matches!(
        corrupt(|p| poke(p, 10, &[0])),
        Error::NoShards { .. }
    ));
    assert!(matches!(
        corrupt(|p| poke(p, 11, &[3])),
        Error::UnknownCodec { tag: 3, .. }
    ));
    assert!(matches!(
        corrupt(|p| poke(p, 14, &[1])),
        Error::Reserved {
            index: 2,
            value: 1,
            ..
        }
    ));
}

#[test]
fn nonzero_inactive_tail() {
    let e = corrupt(|p| poke(p, 16 + 8 * 200, &5u64.to_le_bytes()));
    assert!(
        matches!(
            e,
            Error::InactiveTail {
                slot: 200,
                tail: 5,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn short_loc_table() {
    let e = corrupt(|p| {
        OpenOptions::new()
            .write(true)
            .open(p.join("meta.zr"))
            .unwrap()
            .set_len(4096 + 16 * 29)
            .unwrap()
    });
    assert!(
        matches!(e, Error::ShortLocTable { records: 30, .. }),
        "{e:?}"
    );
    let e = corrupt(|p| poke(p, 0, &u64::MAX.to_le_bytes()));
    assert!(matches!(e, Error::ShortLocTable { .. }), "{e:?}");
}

#[test]
fn short_missing_and_extra_shards() {
    let e = corrupt(|p| {
        OpenOptions::new()
            .write(true)
            .open(p.join("data_1.zr"))
            .unwrap()
            .set_len(3)
            .unwrap()
    });
    assert!(matches!(e, Error::ShortShard { len: 3, .. }), "{e:?}");
    let e = corrupt(|p| fs::remove_file(p.join("data_2.zr")).unwrap());
    assert!(matches!(e, Error::MissingShard { shard: 2, .. }), "{e:?}");
    let e = corrupt(|p| fs::write(p.join("data_3.zr"), b"").unwrap());
    assert!(matches!(e, Error::UnexpectedShard { .. }), "{e:?}");
    // Unrelated files are tolerated.
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dense_store(dir.path(), Codec::Raw, 2, 5);
    fs::write(path.join(".published"), b"").unwrap();
    assert!(Reader::open(&path, true).is_ok());
}

#[test]
fn dictionary_presence_must_match_codec() {
    let e = corrupt(|p| fs::write(p.join("dict.zr"), b"dict").unwrap());
    assert!(matches!(e, Error::UnexpectedDict { .. }), "{e:?}");
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dense_store(dir.path(), Codec::ZstdDict, 2, 50);
    fs::remove_file(path.join("dict.zr")).unwrap();
    assert!(matches!(
        Reader::open(&path, true),
        Err(Error::MissingDict { .. })
    ));
}

/// The zstd dictionary magic (`ZSTD_MAGIC_DICTIONARY`, little-endian):
/// what makes zstd parse a dictionary's header and entropy tables instead
/// of taking its bytes as raw content.
const DICT_MAGIC: [u8; 4] = [0x37, 0xa4, 0x30, 0xec];

/// A zstd_dict store whose `dict.zr` `damage` rewrote.
fn open_with_damaged_dict(damage: impl FnOnce(&Path)) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dense_store(dir.path(), Codec::ZstdDict, 2, 50);
    assert_eq!(fs::read(path.join("dict.zr")).unwrap()[..4], DICT_MAGIC);
    damage(&path.join("dict.zr"));
    Reader::open(&path, true)
        .err()
        .expect("a store with a dictionary zstd cannot load must not open")
}

#[test]
fn dictionary_cut_to_its_magic_and_id_is_an_error_not_a_panic() {
    let e = open_with_damaged_dict(|dict| {
        OpenOptions::new()
            .write(true)
            .open(dict)
            .unwrap()
            .set_len(8)
            .unwrap()
    });
    assert!(matches!(e, Error::BadDict { len: 8, .. }), "{e:?}");
    assert!(e.is_format());
}

#[test]
fn dictionary_with_the_magic_and_garbage_tables_is_an_error_not_a_panic() {
    let e = open_with_damaged_dict(|dict| {
        let mut bytes = fs::read(dict).unwrap();
        // Keep the magic and dictionary id; the entropy tables after them
        // become bytes no Huffman or FSE header starts with.
        for b in &mut bytes[8..] {
            *b = 0xff;
        }
        fs::write(dict, bytes).unwrap();
    });
    assert!(matches!(e, Error::BadDict { .. }), "{e:?}");
    assert!(e.is_format());
}

#[test]
fn writer_given_a_dictionary_zstd_cannot_load_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Schema::dense("|u1", &[48]).unwrap();
    let data = rows(64, 48, 5);
    let good = train_dict(&data, &[48; 64], 4096).unwrap();
    let mut garbage = good.clone();
    garbage[8..].fill(0xff);
    let mut cut = good.clone();
    cut.truncate(8);
    for (name, dict) in [("garbage", garbage), ("cut", cut)] {
        let options = CreateOptions {
            codec: Codec::ZstdDict,
            data_shards: 1,
            dict: Some(dict),
            level: None,
        };
        let path = dir.path().join(name);
        let e = Writer::create(&path, &schema, &options)
            .err()
            .expect("an unloadable dictionary must be refused");
        assert!(matches!(e, Error::Invalid { .. }), "{name}: {e:?}");
        // Refused before anything was built.
        assert!(!path.exists(), "{name}");
    }
    // Bytes without the magic are a raw-content dictionary, which zstd
    // takes (as loaderx does): they still build a readable store.
    let options = CreateOptions {
        codec: Codec::ZstdDict,
        data_shards: 1,
        dict: Some(b"raw content dictionary bytes".to_vec()),
        level: None,
    };
    let path = dir.path().join("raw-content");
    let mut w = Writer::create(&path, &schema, &options).unwrap();
    w.append_dense(&data).unwrap();
    w.close().unwrap();
    let mut out = vec![0u8; 48];
    Reader::open(&path, true)
        .unwrap()
        .gather_dense(&[3], &mut out)
        .unwrap();
    assert_eq!(out, data[3 * 48..4 * 48]);
}

/// The zeroed allocation every gather and batch buffer comes from fails
/// instead of aborting: past the address space, and past what a layout can
/// describe.
#[test]
fn zeroed_words_refuse_what_cannot_be_allocated() {
    assert!(zrecord::reader::zeroed_words(1 << 57).is_none());
    assert!(zrecord::reader::zeroed_words(usize::MAX).is_none());
    assert_eq!(zrecord::reader::zeroed_words(3), Some(vec![0u64; 3]));
}

#[test]
fn bad_schema_bytes() {
    // Not a MsgPack map, so read as loaderx 2.8's JSON, which it is not.
    let e = corrupt(|p| poke(p, 2056, &[0xc1]));
    assert!(
        matches!(
            e,
            Error::SchemaSyntax {
                layout: Layout::Loaderx28,
                ..
            }
        ),
        "{e:?}"
    );
    // A MsgPack map (loaderx 2.3) cut short.
    let e = corrupt(|p| {
        let schema = Schema::new(
            Layout::Loaderx23,
            "|u1",
            Geometry::Dense {
                item_shape: vec![3, 6, 5],
            },
        )
        .unwrap()
        .encode();
        poke(p, 8, &(schema.len() as u16 - 1).to_le_bytes());
        poke(p, 2056, &schema[..schema.len() - 1]);
    });
    assert!(
        matches!(
            e,
            Error::SchemaSyntax {
                layout: Layout::Loaderx23,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn record_locs_outside_the_frontier_fail_the_gather() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dense_store(dir.path(), Codec::Raw, 1, 10);
    // Record 4's offset past the shard tail.
    poke(&path, 4096 + 16 * 4, &10_000u64.to_le_bytes());
    // Record 6's stored length differs from its logical one (raw).
    poke(&path, 4096 + 16 * 6 + 8, &47u32.to_le_bytes());
    let r = Reader::open(&path, true).unwrap();
    let mut out = vec![0u8; 48];
    assert!(r.gather_dense(&[3], &mut out).is_ok());
    assert!(matches!(
        r.gather_dense(&[4], &mut out),
        Err(Error::BadLoc { index: 4, .. })
    ));
    assert!(matches!(
        r.gather_dense(&[6], &mut out),
        Err(Error::BadLoc { index: 6, .. })
    ));
    assert!(matches!(
        r.gather_dense(&[10], &mut out),
        Err(Error::OutOfRange { index: 10, len: 10 })
    ));
}

#[test]
fn corrupt_zstd_frame_is_a_decode_error() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = dense_store(dir.path(), Codec::Zstd, 1, 10);
    let f = OpenOptions::new()
        .write(true)
        .open(path.join("data_0.zr"))
        .unwrap();
    f.write_all_at(&[0xff; 4], 0).unwrap();
    let r = Reader::open(&path, true).unwrap();
    let mut out = vec![0u8; 48];
    assert!(matches!(
        r.gather_dense(&[0], &mut out),
        Err(Error::Decode { index: 0, .. })
    ));
    assert!(r.gather_dense(&[1], &mut out).is_ok());
}

#[test]
fn corrupt_ragged_shape_prefix_is_a_decode_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r");
    let mut w = Writer::create(
        &path,
        &Schema::ragged("<i4", 1).unwrap(),
        &CreateOptions {
            data_shards: 1,
            ..CreateOptions::default()
        },
    )
    .unwrap();
    w.append_ragged(&[&[0u8; 8][..]], &[2]).unwrap();
    w.close().unwrap();
    let f = OpenOptions::new()
        .write(true)
        .open(path.join("data_0.zr"))
        .unwrap();
    f.write_all_at(&3u64.to_le_bytes(), 0).unwrap();
    let r = Reader::open(&path, false).unwrap();
    assert!(matches!(r.gather_ragged(&[0]), Err(Error::Decode { .. })));
}

#[test]
fn meta_page_parser_rejects_garbage_without_panicking() {
    let path = Path::new("meta.zr");
    for len in [0usize, 16, 4095] {
        assert!(matches!(
            zrecord::layout::Header::decode(&vec![0; len], len as u64, path),
            Err(Error::ShortPage { .. })
        ));
    }
    let mut page = vec![0u8; 4096];
    page[8] = 1;
    page[10] = 1;
    page[2056] = 0x80;
    let h = zrecord::layout::Header::decode(&page, 4096, path).unwrap();
    assert_eq!((h.length, h.data_shards, h.codec), (0, 1, Codec::Raw));
    assert!(matches!(
        Schema::decode(&h.schema, true, path),
        Err(Error::SchemaFields { .. })
    ));
}

#[test]
fn appends_cross_window_boundaries() {
    // More records than one 32768-record append window, in every codec.
    let dir = tempfile::tempdir().unwrap();
    let n = 70_000usize;
    let data: Vec<u8> = (0..n as u32).flat_map(|i| i.to_le_bytes()).collect();
    for codec in [Codec::Raw, Codec::Zstd] {
        let path = dir.path().join(format!("w-{codec:?}"));
        let schema = Schema::dense("<u4", &[]).unwrap();
        let opts = CreateOptions {
            codec,
            data_shards: 3,
            ..CreateOptions::default()
        };
        let mut w = Writer::create(&path, &schema, &opts).unwrap();
        w.append_dense(&data[..4 * 5]).unwrap();
        w.append_dense(&data[4 * 5..]).unwrap();
        w.close().unwrap();
        let r = Reader::open(&path, true).unwrap();
        let all: Vec<u64> = (0..n as u64).collect();
        let mut out = vec![0u8; data.len()];
        r.gather_dense(&all, &mut out).unwrap();
        assert_eq!(out, data);
    }
}
