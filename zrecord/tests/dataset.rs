//! Datasets of many stores (`zrecord::dataset`): a manifest's stores read
//! as one, record for record what the stores hold end to end; a store
//! changed, missing or unlike the others refused with its rule; hostile
//! manifests refused.

use std::fs;
use std::path::{Path, PathBuf};

use zrecord::dataset::{rules, Manifest, MANIFEST_FORMAT};
use zrecord::{open_many, write_manifest, Codec, CreateOptions, Error, Reader, Schema, Writer};

const WIDTH: usize = 12;

fn options(codec: Codec, shards: usize) -> CreateOptions {
    CreateOptions {
        codec,
        data_shards: shards,
        dict: None,
        level: None,
    }
}

/// A Dense store of `n` rows whose bytes encode (store, row).
fn dense(dir: &Path, name: &str, store: u8, n: usize, codec: Codec) -> (PathBuf, Vec<u8>) {
    let data: Vec<u8> = (0..n * WIDTH)
        .map(|i| store.wrapping_mul(53) ^ ((i / WIDTH) as u8).wrapping_mul(7) ^ (i % WIDTH) as u8)
        .collect();
    let path = dir.join(name);
    let schema = Schema::dense("|u1", &[3, 4]).unwrap();
    let mut w = Writer::create(&path, &schema, &options(codec, 1 + store as usize % 3)).unwrap();
    if n > 0 {
        w.append_dense(&data).unwrap();
    }
    w.close().unwrap();
    (path, data)
}

/// A Ragged store of `n` records of 1..=9 int32 each.
fn ragged(dir: &Path, name: &str, store: u32, n: usize) -> (PathBuf, Vec<Vec<u8>>) {
    let records: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let len = 1 + (i * 7 + store as usize) % 9;
            (0..len)
                .flat_map(|k| (store * 1000 + i as u32 * 10 + k as u32).to_le_bytes())
                .collect()
        })
        .collect();
    let path = dir.join(name);
    let schema = Schema::ragged("<i4", 1).unwrap();
    let mut w = Writer::create(&path, &schema, &options(Codec::Zstd, 2)).unwrap();
    let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let shapes: Vec<u64> = records.iter().map(|r| (r.len() / 4) as u64).collect();
    w.append_ragged(&refs, &shapes).unwrap();
    w.close().unwrap();
    (path, records)
}

/// The error of an open expected to fail (a `Reader` has no `Debug`).
fn refused<T>(result: Result<T, Error>) -> Error {
    match result {
        Ok(_) => panic!("opened, expected a refusal"),
        Err(e) => e,
    }
}

fn rule_of(e: Error) -> &'static str {
    match e {
        Error::Dataset { rule, .. } => rule,
        other => panic!("not a dataset refusal: {other}"),
    }
}

/// Indices in an order that visits every store back and forth.
fn scattered(len: u64) -> Vec<u64> {
    (0..len)
        .map(|i| (i * 7919) % len)
        .chain([len - 1, 0, len - 1])
        .collect()
}

#[test]
fn a_manifest_reads_its_stores_as_one_dense_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let parts = [
        dense(dir.path(), "part-0", 0, 40, Codec::Raw),
        dense(dir.path(), "part-1", 1, 0, Codec::Raw),
        dense(dir.path(), "part-2", 2, 25, Codec::Raw),
        dense(dir.path(), "part-3", 3, 61, Codec::Raw),
    ];
    let all: Vec<u8> = parts.iter().flat_map(|(_, d)| d.clone()).collect();
    let manifest = dir.path().join("train.json");
    let paths: Vec<PathBuf> = parts.iter().map(|(p, _)| p.clone()).collect();
    let written = write_manifest(&paths, &manifest, &[]);
    let written = written.unwrap();
    assert_eq!(
        written.stores.iter().map(|e| e.records).collect::<Vec<_>>(),
        [40, 0, 25, 61]
    );
    let text = fs::read_to_string(&manifest).unwrap();
    assert!(text.contains(MANIFEST_FORMAT));
    // Stores under the manifest's directory are named relative to it.
    assert_eq!(written.stores[2].path, "part-2");
    assert_eq!(
        Manifest::decode(text.as_bytes(), &manifest).unwrap(),
        written
    );

    let r = Reader::open_at(&manifest, Some(true), &[]).unwrap();
    assert_eq!(r.len(), 126);
    assert_eq!(r.data_shards(), 1 + 2 + 3 + 1);
    let idxs = scattered(r.len());
    let mut out = vec![0u8; idxs.len() * WIDTH];
    r.gather_dense(&idxs, &mut out).unwrap();
    for (j, &i) in idxs.iter().enumerate() {
        let i = i as usize;
        assert_eq!(
            &out[j * WIDTH..(j + 1) * WIDTH],
            &all[i * WIDTH..(i + 1) * WIDTH],
            "record {i}"
        );
    }
    assert_eq!(r.record_lengths(&[0, 125, 40]).unwrap(), [12, 12, 12]);
    // One store's records only: the same bytes (gathered in place).
    let mut one = vec![0u8; 3 * WIDTH];
    r.gather_dense(&[66, 65, 67], &mut one).unwrap();
    assert_eq!(&one[WIDTH..2 * WIDTH], &all[65 * WIDTH..66 * WIDTH]);
    assert!(matches!(
        r.gather_dense(&[126], &mut [0u8; WIDTH]),
        Err(Error::OutOfRange {
            index: 126,
            len: 126
        })
    ));
}

#[test]
fn open_many_reads_ragged_stores_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let parts = [
        ragged(dir.path(), "a", 1, 30),
        ragged(dir.path(), "b", 2, 17),
        ragged(dir.path(), "c", 3, 5),
    ];
    let all: Vec<Vec<u8>> = parts.iter().flat_map(|(_, r)| r.clone()).collect();
    let paths: Vec<PathBuf> = parts.iter().map(|(p, _)| p.clone()).collect();
    let r = open_many(&paths, Some(false), &[]).unwrap();
    assert_eq!(r.len(), 52);
    let idxs = scattered(r.len());
    let batch = r.gather_ragged(&idxs).unwrap();
    for (j, &i) in idxs.iter().enumerate() {
        let (a, b) = (batch.offsets[j] as usize, batch.offsets[j + 1] as usize);
        assert_eq!(&batch.values()[a..b], &all[i as usize][..], "record {i}");
        assert_eq!(batch.shapes[j], (all[i as usize].len() / 4) as u64);
    }
    // Each store's own lengths (payload and shape prefix), in the caller's order.
    let (first, last) = (
        Reader::open(&paths[0], false).unwrap(),
        Reader::open(&paths[2], false).unwrap(),
    );
    let want = [
        last.record_lengths(&[4]).unwrap()[0],
        first.record_lengths(&[0]).unwrap()[0],
    ];
    assert_eq!(r.record_lengths(&[51, 0]).unwrap(), want);
}

#[test]
fn a_store_changed_since_the_manifest_was_written_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = dense(dir.path(), "a", 0, 10, Codec::Raw);
    let (b, _) = dense(dir.path(), "b", 1, 10, Codec::Raw);
    let manifest = dir.path().join("m.json");
    write_manifest(&[a.clone(), b.clone()], &manifest, &[]).unwrap();
    assert!(Reader::open_at(&manifest, Some(true), &[]).is_ok());

    // Rebuilt with the same record count: the header (its tails) differs.
    fs::remove_dir_all(&b).unwrap();
    dense(dir.path(), "b", 4, 10, Codec::Zstd);
    let e = refused(Reader::open_at(&manifest, Some(true), &[]));
    assert!(
        e.to_string()
            .contains("changed since the manifest was written"),
        "{e}"
    );
    assert_eq!(rule_of(e), rules::STORE);

    fs::remove_dir_all(&b).unwrap();
    let e = refused(Reader::open_at(&manifest, Some(true), &[]));
    assert!(e.to_string().contains("is missing"), "{e}");
    assert_eq!(rule_of(e), rules::STORE);
}

#[test]
fn stores_unlike_each_other_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = dense(dir.path(), "a", 0, 10, Codec::Raw);
    let (z, _) = dense(dir.path(), "z", 1, 10, Codec::Zstd);
    let (r, _) = ragged(dir.path(), "r", 1, 4);
    for other in [&z, &r] {
        let e = refused(open_many(&[a.clone(), other.clone()], None, &[]));
        assert_eq!(rule_of(e), rules::STORE);
        let e = write_manifest(&[a.clone(), other.clone()], &dir.path().join("x.json"), &[])
            .unwrap_err();
        assert_eq!(rule_of(e), rules::STORE);
    }
    assert!(!dir.path().join("x.json").exists());
    assert_eq!(rule_of(refused(open_many(&[], None, &[]))), rules::MANIFEST);
}

#[test]
fn hostile_manifests_are_refused_with_the_manifest_rule() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = dense(dir.path(), "a", 0, 3, Codec::Raw);
    let digest = Reader::open(&a, true).unwrap().header_digest();
    let store =
        |records: &str| format!(r#"{{"path": "a", "records": {records}, "digest": "{digest}"}}"#);
    let cases = [
        "".to_string(),
        "[]".to_string(),
        "{\"format\": \"zrecord-dataset\", \"version\": 2, \"stores\": []}".to_string(),
        "{\"format\": \"other\", \"version\": 1, \"stores\": []}".to_string(),
        "{\"format\": \"zrecord-dataset\", \"version\": 1, \"stores\": {}}".to_string(),
        format!(
            "{{\"format\": \"zrecord-dataset\", \"version\": 1, \"stores\": [{}]}}",
            store("-1")
        ),
        format!(
            "{{\"format\": \"zrecord-dataset\", \"version\": 1, \"stores\": [{}]}}",
            store("99999999999999999999999")
        ),
        format!(
            "{{\"format\": \"zrecord-dataset\", \"version\": 1, \"stores\": [{}",
            store("3")
        ),
        "{\"format\": \"zrecord-dataset\", \"version\": 1, \"stores\": [[[[[[]]]]]]}".to_string(),
        "{\"format\": \"zrecord-dataset\", \"version\": 1, \"stores\": []}".to_string(),
    ];
    for (i, text) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad-{i}.json"));
        fs::write(&path, text).unwrap();
        let e = refused(Reader::open_at(&path, None, &[]));
        assert_eq!(rule_of(e), rules::MANIFEST, "case {i}: {text}");
    }
    // The well-formed one opens.
    let good = dir.path().join("good.json");
    fs::write(
        &good,
        format!(
            "{{\"format\": \"zrecord-dataset\", \"version\": 1, \"stores\": [{}]}}",
            store("3")
        ),
    )
    .unwrap();
    assert_eq!(Reader::open_at(&good, Some(true), &[]).unwrap().len(), 3);
}

#[test]
fn a_concatenation_of_stores_with_other_codecs_reports_each() {
    // A DataLoader mixture joins its datasets' stores whatever their
    // codecs: the reader says "mixed" and lists each store's, rather than
    // passing off the first store's codec as every record's.
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let (raw, raw_rows) = dense(dir.path(), "raw", 0, 20, Codec::Raw);
    let (zstd, zstd_rows) = dense(dir.path(), "zstd", 1, 9, Codec::Zstd);
    let open = |p: &Path| Arc::new(Reader::open_at(p, Some(true), &[]).unwrap());
    let mixed = zrecord::dataset::concat(vec![open(&raw), open(&zstd)]).unwrap();
    assert_eq!(mixed.codec(), None);
    assert_eq!(mixed.codec_name(), "mixed");
    assert_eq!(mixed.codecs(), [Codec::Raw, Codec::Zstd]);
    let mut out = vec![0u8; 2 * WIDTH];
    mixed.gather_dense(&[21, 3], &mut out).unwrap();
    assert_eq!(&out[..WIDTH], &zstd_rows[WIDTH..2 * WIDTH]);
    assert_eq!(&out[WIDTH..], &raw_rows[3 * WIDTH..4 * WIDTH]);
    // A concatenation of concatenations lists every store, in order.
    let inner = Arc::new(zrecord::dataset::concat(vec![open(&zstd), open(&zstd)]).unwrap());
    assert_eq!(inner.codec(), Some(Codec::Zstd));
    assert_eq!(inner.codec_name(), "zstd");
    let outer = zrecord::dataset::concat(vec![inner, open(&raw)]).unwrap();
    assert_eq!(outer.codecs(), [Codec::Zstd, Codec::Zstd, Codec::Raw]);
    assert_eq!(outer.codec_name(), "mixed");
    let one = open(&raw);
    assert_eq!(
        (one.codec(), one.codecs()),
        (Some(Codec::Raw), vec![Codec::Raw])
    );
}
