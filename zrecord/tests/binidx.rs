//! Megatron indexed datasets (`zrecord::binidx`), written here byte for byte
//! as megatron-core's `IndexedDatasetBuilder` writes them (its own files
//! are compared in tests/torch/test_binidx.py): sequences and documents
//! gathered as Ragged records; every lie in the index refused with rule
//! `zrecord.Binidx`, at open when the counts do not fit the file, at the
//! gather naming the record otherwise.

use std::fs;
use std::path::{Path, PathBuf};

use zrecord::binidx::{Unit, RULE};
use zrecord::{Error, Reader};

/// `PREFIX.bin` and `PREFIX.idx` of `documents` (each a list of
/// sequences of i32 tokens), as the builder writes them.
fn write(dir: &Path, documents: &[Vec<Vec<i32>>]) -> PathBuf {
    let prefix = dir.join("corpus");
    let mut bin = Vec::new();
    let (mut lengths, mut pointers, mut docs) = (Vec::new(), Vec::new(), vec![0i64]);
    for doc in documents {
        for seq in doc {
            pointers.push(bin.len() as i64);
            lengths.push(seq.len() as i32);
            bin.extend(seq.iter().flat_map(|t| t.to_le_bytes()));
        }
        docs.push(lengths.len() as i64);
    }
    fs::write(prefix.with_extension("bin"), bin).unwrap();
    fs::write(
        prefix.with_extension("idx"),
        index(4, &lengths, &pointers, &docs),
    )
    .unwrap();
    prefix
}

fn index(code: u8, lengths: &[i32], pointers: &[i64], docs: &[i64]) -> Vec<u8> {
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(code);
    idx.extend((lengths.len() as u64).to_le_bytes());
    idx.extend((docs.len() as u64).to_le_bytes());
    idx.extend(lengths.iter().flat_map(|n| n.to_le_bytes()));
    idx.extend(pointers.iter().flat_map(|n| n.to_le_bytes()));
    idx.extend(docs.iter().flat_map(|n| n.to_le_bytes()));
    idx
}

/// A lying index: what it is, its lengths, pointers and document indices,
/// and the unit its records are read as.
type Lie = (&'static str, Vec<i32>, Vec<i64>, Vec<i64>, Unit);

fn corpus() -> Vec<Vec<Vec<i32>>> {
    (0..5)
        .map(|d| {
            (0..1 + d % 3)
                .map(|s| {
                    (0..(d * 3 + s * 5) % 11 + 1)
                        .map(|t| d * 1000 + s * 100 + t)
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn tokens(batch: &zrecord::RaggedBatch, j: usize) -> Vec<i32> {
    let (a, b) = (batch.offsets[j] as usize, batch.offsets[j + 1] as usize);
    batch.values()[a..b]
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn refused<T>(result: Result<T, Error>) -> Error {
    match result {
        Ok(_) => panic!("expected a refusal"),
        Err(e) => e,
    }
}

fn rule_of(e: &Error) -> &'static str {
    match e {
        Error::Dataset { rule, .. } => rule,
        other => panic!("not a binidx refusal: {other}"),
    }
}

#[test]
fn sequences_and_documents_are_ragged_records() {
    let dir = tempfile::tempdir().unwrap();
    let docs = corpus();
    let prefix = write(dir.path(), &docs);
    let sequences: Vec<Vec<i32>> = docs.iter().flatten().cloned().collect();
    // By prefix, or either file's name; open_at tells it from the names.
    for path in [
        prefix.clone(),
        prefix.with_extension("idx"),
        prefix.with_extension("bin"),
    ] {
        let r = Reader::open_at(&path, Some(false), &[]).unwrap();
        assert_eq!(r.len(), sequences.len() as u64);
        let idxs: Vec<u64> = (0..r.len()).rev().chain([0, 3]).collect();
        let batch = r.gather_ragged(&idxs).unwrap();
        for (j, &i) in idxs.iter().enumerate() {
            assert_eq!(tokens(&batch, j), sequences[i as usize]);
            assert_eq!(batch.shapes[j], sequences[i as usize].len() as u64);
        }
    }
    let r = Reader::open_binidx(&prefix, Unit::Document).unwrap();
    assert_eq!(r.len(), docs.len() as u64);
    let batch = r.gather_ragged(&[4, 0, 2]).unwrap();
    for (j, d) in [4, 0, 2].into_iter().enumerate() {
        assert_eq!(tokens(&batch, j), docs[d].concat());
    }
    assert_eq!(
        r.record_lengths(&[1]).unwrap(),
        [4 * docs[1].concat().len() as u64]
    );
    assert!(matches!(
        r.gather_ragged(&[5]),
        Err(Error::OutOfRange { index: 5, len: 5 })
    ));
    assert!(refused(Reader::open_at(&prefix, Some(true), &[]))
        .to_string()
        .contains("Ragged"));
}

#[test]
fn an_index_that_lies_is_refused_with_the_binidx_rule() {
    let dir = tempfile::tempdir().unwrap();
    let prefix = write(dir.path(), &corpus());
    let idx_path = prefix.with_extension("idx");
    let good = fs::read(&idx_path).unwrap();
    let bin_len = fs::metadata(prefix.with_extension("bin")).unwrap().len() as i64;

    // Refused at open: the header and the counts.
    let at_open: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("cut header", good[..20].to_vec()),
        (
            "magic",
            [b"MMIDIDX\x00\x01".as_slice(), &good[9..]].concat(),
        ),
        (
            "version",
            [&good[..9], &2u64.to_le_bytes(), &good[17..]].concat(),
        ),
        ("dtype", [&good[..17], &[9u8][..], &good[18..]].concat()),
        (
            "sequence count",
            [&good[..18], &u64::MAX.to_le_bytes(), &good[26..]].concat(),
        ),
        (
            "document count",
            [&good[..26], &(1u64 << 62).to_le_bytes(), &good[34..]].concat(),
        ),
        ("truncated table", good[..good.len() - 3].to_vec()),
        ("trailing bytes", [&good[..], &[0u8; 5][..]].concat()),
    ];
    for (what, bytes) in at_open {
        fs::write(&idx_path, &bytes).unwrap();
        let e = refused(Reader::open_at(&prefix, None, &[]));
        assert_eq!(rule_of(&e), RULE, "{what}: {e}");
    }

    // Refused at the gather, naming the record: lengths and pointers that
    // leave the data file, negative ones, documents out of order.
    let lengths = [3i32, 2];
    let cases: Vec<Lie> = vec![
        (
            "past the end",
            lengths.to_vec(),
            vec![0, bin_len - 4],
            vec![0, 2],
            Unit::Sequence,
        ),
        (
            "negative length",
            vec![-1, 2],
            vec![0, 12],
            vec![0, 2],
            Unit::Sequence,
        ),
        (
            "negative pointer",
            lengths.to_vec(),
            vec![-8, 12],
            vec![0, 2],
            Unit::Sequence,
        ),
        (
            "huge length",
            vec![i32::MAX, 2],
            vec![i64::MAX - 4, 12],
            vec![0, 2],
            Unit::Sequence,
        ),
        (
            "documents backwards",
            lengths.to_vec(),
            vec![0, 12],
            vec![2, 0],
            Unit::Document,
        ),
        (
            "document past the sequences",
            lengths.to_vec(),
            vec![0, 12],
            vec![0, 7],
            Unit::Document,
        ),
        (
            "document not contiguous",
            lengths.to_vec(),
            vec![0, 20],
            vec![0, 2],
            Unit::Document,
        ),
    ];
    for (what, lengths, pointers, docs, unit) in cases {
        fs::write(&idx_path, index(4, &lengths, &pointers, &docs)).unwrap();
        let r = Reader::open_binidx(&prefix, unit).unwrap();
        let all: Vec<u64> = (0..r.len()).collect();
        let e = r.gather_ragged(&all).unwrap_err();
        assert_eq!(rule_of(&e), RULE, "{what}: {e}");
        let e = r.record_lengths(&all).unwrap_err();
        assert_eq!(rule_of(&e), RULE, "{what}: {e}");
    }
    fs::remove_file(prefix.with_extension("bin")).unwrap();
    fs::write(&idx_path, &good).unwrap();
    assert!(matches!(
        refused(Reader::open_at(&prefix, None, &[])),
        Error::NotFound { .. }
    ));
}
