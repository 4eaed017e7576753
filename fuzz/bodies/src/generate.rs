//! The seeds of the targets whose input is one part of a larger whole the
//! body supplies ([`crate::fixtures`]): built here from the same
//! definitions, so that they match it. Written by `cargo run -p
//! zt-fuzz-bodies --example make-seeds` (fuzz/make_seeds.py writes the
//! others with the reference libraries); `tests/seeds.rs` checks that the
//! committed files are what this writes.

use std::path::{Path, PathBuf};

use crate::fixtures::{
    zrecord_dictionary, zrecord_records, OBJECT, OBJECT_ETAG, OBJECT_MODIFIED, RECORD, SHARD_1,
    SHARD_2, SHARD_DUPLICATE,
};
use crate::http;

/// The targets written in this crate whose seeds this module writes.
pub const GENERATED: &[&str] = &[
    "zrecord_dict",
    "zrecord_binidx",
    "zrecord_manifest",
    "index_json",
    "http_response",
    "dcp",
];

/// One seed: its file name and bytes.
pub type Seed = zt::plugin::Seed;

/// Every target whose seeds are made in Rust: [`GENERATED`], then the
/// plugins' targets that make their own (`zt::FuzzTarget::make_seeds`).
pub fn generated() -> Vec<&'static str> {
    let mut targets = GENERATED.to_vec();
    targets.extend(
        crate::plugin_targets()
            .iter()
            .filter(|g| g.target.make_seeds.is_some())
            .map(|g| g.target.name),
    );
    targets
}

/// The seeds of `target` (none for a target not in [`generated`]).
pub fn seeds(target: &str) -> Vec<Seed> {
    let seeds = match target {
        "zrecord_dict" => zrecord_dict(),
        "zrecord_binidx" => zrecord_binidx(),
        "zrecord_manifest" => zrecord_manifest(),
        "index_json" => index_json(),
        "http_response" => http_response(),
        "dcp" => dcp(),
        _ => {
            return crate::plugin_targets()
                .iter()
                .find(|g| g.target.name == target)
                .and_then(|g| g.target.make_seeds)
                .map(|make| make())
                .unwrap_or_default()
        }
    };
    seeds
        .into_iter()
        .map(|(name, bytes)| (name.to_string(), bytes))
        .collect()
}

/// Where the seeds of `target` live (`zt::FuzzTarget::made_seeds_dir` for
/// a plugin's).
pub fn seed_dir(target: &str) -> PathBuf {
    crate::repo_root().join("fuzz/seeds").join(target)
}

/// Replace the seed files of `target` in `dir` by [`seeds`]`(target)`;
/// notes beside them (`README.md`) stay.
pub fn write(target: &str, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_file() && path.extension().is_none_or(|e| e != "md") {
            std::fs::remove_file(&path)?;
        }
    }
    for (name, bytes) in seeds(target) {
        std::fs::write(dir.join(name), bytes)?;
    }
    Ok(())
}

/// The dictionary the stores were written with, and what becomes of one in
/// a damaged or foreign `dict.zr`.
fn zrecord_dict() -> Vec<(&'static str, Vec<u8>)> {
    let trained = zrecord_dictionary();
    // Loads, but names another id than the frames do.
    let mut other_id = trained.clone();
    other_id[4..8].copy_from_slice(&0x1234_5678u32.to_le_bytes());
    // The magic and id with entropy tables no Huffman or FSE header starts
    // with, and cut after them: what panicked before the fallible
    // constructors (zrecord/tests/store.rs).
    let mut garbage = trained.clone();
    garbage[8..].fill(0xff);
    let cut = trained[..8].to_vec();
    // Half the tables.
    let half = trained[..trained.len() / 2].to_vec();
    // No magic: a raw-content dictionary, which zstd loads as it is.
    let raw = zrecord_records(4, 3);
    assert_eq!(raw.len(), 4 * RECORD);
    vec![
        ("trained.dict", trained),
        ("other-id.dict", other_id),
        ("garbage-tables.dict", garbage),
        ("cut-8.dict", cut),
        ("half.dict", half),
        ("raw-content.dict", raw),
        ("empty.dict", Vec::new()),
    ]
}

/// An index as `save_pretrained` writes it (keys sorted, indented by two)
/// with `weight_map` and `metadata` as given.
fn index(weight_map: &[(&str, &str)], metadata: &str) -> Vec<u8> {
    let mut map: Vec<(&str, &str)> = weight_map.to_vec();
    map.sort();
    let entries: Vec<String> = map
        .iter()
        .map(|(name, file)| format!("    \"{name}\": \"{file}\""))
        .collect();
    format!(
        "{{\n  \"metadata\": {metadata},\n  \"weight_map\": {{\n{}\n  }}\n}}\n",
        entries.join(",\n")
    )
    .into_bytes()
}

/// Megatron pairs as `zrecord_binidx` takes them (`[idx length][idx][bin]`),
/// as megatron-core's builder writes them: a corpus of three documents of
/// i32 tokens, the same as u16, and one whose second pointer lies.
fn zrecord_binidx() -> Vec<(&'static str, Vec<u8>)> {
    fn pair(
        code: u8,
        itemsize: usize,
        lengths: &[i32],
        pointers: Option<&[i64]>,
        docs: &[i64],
    ) -> Vec<u8> {
        let mut idx = b"MMIDIDX\x00\x00".to_vec();
        idx.extend(1u64.to_le_bytes());
        idx.push(code);
        idx.extend((lengths.len() as u64).to_le_bytes());
        idx.extend((docs.len() as u64).to_le_bytes());
        idx.extend(lengths.iter().flat_map(|n| n.to_le_bytes()));
        let mut at = 0i64;
        let built: Vec<i64> = lengths
            .iter()
            .map(|&n| {
                let p = at;
                at += i64::from(n) * itemsize as i64;
                p
            })
            .collect();
        idx.extend(
            pointers
                .unwrap_or(&built)
                .iter()
                .flat_map(|n| n.to_le_bytes()),
        );
        idx.extend(docs.iter().flat_map(|n| n.to_le_bytes()));
        let bin: Vec<u8> = (0..at as usize).map(|i| (i * 37 % 251) as u8).collect();
        let mut out = (idx.len() as u32).to_le_bytes().to_vec();
        out.extend(idx);
        out.extend(bin);
        out
    }
    let lengths = [3, 5, 1, 4, 2];
    let docs = [0, 2, 3, 5];
    vec![
        ("corpus-i32.binidx", pair(4, 4, &lengths, None, &docs)),
        ("corpus-u16.binidx", pair(8, 2, &lengths, None, &docs)),
        (
            "lying-pointer.binidx",
            pair(4, 4, &lengths, Some(&[0, 9999, 32, 36, 52]), &docs),
        ),
    ]
}

/// Dataset manifests as `zrecord::dataset::Manifest::encode` writes them,
/// and two it refuses.
fn zrecord_manifest() -> Vec<(&'static str, Vec<u8>)> {
    let digest = "xxh3-128:0123456789abcdef0123456789abcdef";
    let manifest = zrecord::Manifest {
        stores: vec![
            zrecord::dataset::Entry {
                path: "part-00000".into(),
                records: 1000,
                digest: digest.into(),
            },
            zrecord::dataset::Entry {
                path: "s3://bucket/a \"quoted\" store".into(),
                records: 0,
                digest: digest.into(),
            },
        ],
    };
    vec![
        ("two-stores.manifest", manifest.encode().into_bytes()),
        (
            "empty.manifest",
            zrecord::Manifest { stores: vec![] }.encode().into_bytes(),
        ),
        (
            "version-2.manifest",
            br#"{"format": "zrecord-dataset", "version": 2, "stores": []}"#.to_vec(),
        ),
    ]
}

/// Indexes of the shards [`crate::fixtures::index_shards`] writes, valid
/// and refused.
fn index_json() -> Vec<(&'static str, Vec<u8>)> {
    let total = "{\n    \"total_size\": 49\n  }";
    let both = [
        ("a", SHARD_1),
        ("b", SHARD_1),
        ("c", SHARD_2),
        ("d", SHARD_2),
        ("e", SHARD_2),
    ];
    let with = |extra: (&'static str, &'static str)| {
        let mut map = both.to_vec();
        map.push(extra);
        map
    };
    let moved = |name: &str, to: &'static str| {
        both.iter()
            .map(|&(n, f)| if n == name { (n, to) } else { (n, f) })
            .collect::<Vec<_>>()
    };
    let metadata = "{\n    \"total_size\": 49,\n    \"format\": \"pt\",\n    \
                    \"nested\": {\"list\": [1, -2, 3.5, 1e300, 18446744073709551615, null, true, \"x\"]}\n  }";
    vec![
        ("two-shards.index", index(&both, total)),
        ("one-shard.index", index(&both[..2], total)),
        ("metadata.index", index(&both, metadata)),
        // Refused: a tensor in the other shard than the index says, a
        // tensor no shard has, a shard holding a name the index puts in
        // another, a shard outside the directory, one that is itself an
        // index, one that is missing.
        ("misplaced.index", index(&moved("c", SHARD_1), total)),
        ("lacks.index", index(&with(("z", SHARD_2)), total)),
        (
            "duplicate.index",
            index(&with(("f", SHARD_DUPLICATE)), total),
        ),
        (
            "escape.index",
            index(&moved("a", "../model-00001-of-00002.safetensors"), total),
        ),
        (
            "names-an-index.index",
            index(&moved("a", "other.safetensors.index.json"), total),
        ),
        (
            "missing-shard.index",
            index(&with(("z", "model-00003-of-00003.safetensors")), total),
        ),
        (
            "not-a-string.index",
            b"{\"weight_map\": {\"a\": 1}}\n".to_vec(),
        ),
        ("empty-map.index", b"{\"weight_map\": {}}\n".to_vec()),
    ]
}

/// One response: status line, headers, blank line, body.
fn response(status: &str, headers: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// What a server holding [`OBJECT`] answers, ETag and Last-Modified as given.
struct Honest {
    etag: Option<&'static str>,
}

impl Honest {
    fn version(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![("Last-Modified", OBJECT_MODIFIED.to_string())];
        if let Some(tag) = self.etag {
            h.push(("ETag", tag.to_string()));
        }
        h
    }

    /// 206 with `range` of the object (the whole of it for every request
    /// the body sends: the object is smaller than either probe and than a
    /// block).
    fn partial(&self) -> Vec<u8> {
        let mut h = self.version();
        let size = OBJECT.len();
        h.push(("Content-Range", format!("bytes 0-{}/{size}", size - 1)));
        h.push(("Content-Length", size.to_string()));
        response("206 Partial Content", &h, OBJECT)
    }

    /// 200 and no body, to a HEAD.
    fn head(&self) -> Vec<u8> {
        let mut h = self.version();
        h.push(("Content-Length", OBJECT.len().to_string()));
        response("200 OK", &h, b"")
    }

    /// The four answers: head probe, tail probe, HEAD, read.
    fn all(&self) -> [Vec<u8>; 4] {
        [self.partial(), self.partial(), self.head(), self.partial()]
    }
}

/// `[head probe, tail probe, HEAD, read]` with the read's answer replaced.
fn read_answer(read: Vec<u8>) -> Vec<Vec<u8>> {
    let mut parts = HONEST.all().to_vec();
    parts[3] = read;
    parts
}

const HONEST: Honest = Honest {
    etag: Some(OBJECT_ETAG),
};

/// A 206 of [`OBJECT`] with these changes to its headers and body.
fn partial_with(set: &[(&'static str, &str)], body: &[u8]) -> Vec<u8> {
    let mut h = HONEST.version();
    let size = OBJECT.len();
    h.push(("Content-Range", format!("bytes 0-{}/{size}", size - 1)));
    h.push(("Content-Length", body.len().to_string()));
    for (name, value) in set {
        h.retain(|(n, _)| n != name);
        h.push((name, value.to_string()));
    }
    response("206 Partial Content", &h, body)
}

/// Servers honest, lying and broken.
fn http_response() -> Vec<(&'static str, Vec<u8>)> {
    let size = OBJECT.len();
    let chunked = {
        let mut h = HONEST.version();
        h.push(("Content-Range", format!("bytes 0-{}/{size}", size - 1)));
        h.push(("Transfer-Encoding", "chunked".into()));
        let (a, b) = OBJECT.split_at(16);
        let mut body = format!("{:x}\r\n", a.len()).into_bytes();
        body.extend_from_slice(a);
        body.extend_from_slice(format!("\r\n{:x}\r\n", b.len()).as_bytes());
        body.extend_from_slice(b);
        body.extend_from_slice(b"\r\n0\r\n\r\n");
        response("206 Partial Content", &h, &body)
    };
    let longer = [OBJECT, OBJECT].concat();
    let unsatisfiable = response(
        "416 Range Not Satisfiable",
        &[
            ("Content-Range", "bytes */0".into()),
            ("Content-Length", "0".into()),
        ],
        b"",
    );
    let empty_head = response(
        "200 OK",
        &[
            ("ETag", "\"empty\"".into()),
            ("Last-Modified", OBJECT_MODIFIED.into()),
            ("Content-Length", "0".into()),
        ],
        b"",
    );
    let not_found = response("404 Not Found", &[("Content-Length", "0".into())], b"");
    let whole = {
        let mut h = HONEST.version();
        h.push(("Content-Length", size.to_string()));
        response("200 OK", &h, OBJECT)
    };
    let other_size = format!("bytes 0-{}/{}", size - 1, size + 1);
    let seeds: Vec<(&str, Vec<Vec<u8>>)> = vec![
        ("honest.http", HONEST.all().to_vec()),
        ("no-etag.http", Honest { etag: None }.all().to_vec()),
        (
            "chunked.http",
            vec![chunked.clone(), chunked.clone(), HONEST.head(), chunked],
        ),
        // An empty object: both probes refused, the HEAD says 0 bytes.
        (
            "empty-object.http",
            vec![unsatisfiable.clone(), unsatisfiable, empty_head],
        ),
        (
            "not-found.http",
            vec![
                not_found.clone(),
                not_found.clone(),
                not_found.clone(),
                not_found,
            ],
        ),
        // A server that ignores Range: 200 and the whole object.
        (
            "ignores-range.http",
            vec![whole.clone(), whole.clone(), HONEST.head(), whole],
        ),
        // The object changes between open's two probes.
        (
            "tail-changed.http",
            vec![
                HONEST.partial(),
                partial_with(&[("ETag", "\"zt-2\"")], OBJECT),
                HONEST.head(),
                HONEST.partial(),
            ],
        ),
        ("tail-other-size.http", {
            let mut p = HONEST.all().to_vec();
            p[1] = partial_with(&[("Content-Range", &other_size)], OBJECT);
            p
        }),
        // The read's answers: another version, no ETag, another range, a
        // body longer than the range (announced, or only sent), shorter
        // (announced, or cut off by the end of the connection), no
        // Content-Range, a status that is no 206.
        (
            "read-changed.http",
            read_answer(partial_with(&[("ETag", "\"zt-2\"")], OBJECT)),
        ),
        (
            "read-no-etag.http",
            read_answer(Honest { etag: None }.partial()),
        ),
        (
            "read-other-range.http",
            read_answer(partial_with(&[("Content-Range", "bytes 8-55/56")], OBJECT)),
        ),
        ("read-longer.http", read_answer(partial_with(&[], &longer))),
        (
            "read-longer-unannounced.http",
            read_answer(partial_with(&[("Content-Length", "48")], &longer)),
        ),
        (
            "read-short.http",
            read_answer(partial_with(&[], &OBJECT[..20])),
        ),
        (
            "read-cut-off.http",
            read_answer(partial_with(&[("Content-Length", "48")], &OBJECT[..20])),
        ),
        (
            "read-no-content-range.http",
            read_answer({
                let mut h = HONEST.version();
                h.push(("Content-Length", size.to_string()));
                response("206 Partial Content", &h, OBJECT)
            }),
        ),
        (
            "read-precondition-failed.http",
            read_answer(response(
                "412 Precondition Failed",
                &[("Content-Length", "0".into())],
                b"",
            )),
        ),
        ("read-garbage.http", read_answer(b"HTTP/1.1 2".to_vec())),
    ];
    seeds
        .into_iter()
        .map(|(name, parts)| (name, http::join(&parts)))
        .collect()
}

/// `.metadata` files for the `dcp` fixture's `.distcp`
/// ([`crate::fixtures::dcp_checkpoint`]): the valid one zt's writer wrote,
/// and it changed one way at a time.
fn dcp() -> Vec<(&'static str, Vec<u8>)> {
    let dir = std::env::temp_dir().join(format!("zt-dcp-seeds-{}", std::process::id()));
    let files = crate::fixtures::dcp_checkpoint(&dir);
    let valid = files
        .iter()
        .find(|(n, _)| n == ".metadata")
        .map(|(_, b)| b.clone())
        .expect("the fixture's .metadata");
    // A string of the pickle (`SHORT_BINUNICODE`) replaced by another, the
    // frame's length kept right (the fixture's pickle is one frame).
    let swap = |from: &str, to: &str| -> Vec<u8> {
        let enc = |s: &str| [&[0x8c, s.len() as u8][..], s.as_bytes()].concat();
        let (from, to) = (enc(from), enc(to));
        let at = valid
            .windows(from.len())
            .position(|w| w == from)
            .expect("the string is in the pickle");
        let mut out = [&valid[..at], &to[..], &valid[at + from.len()..]].concat();
        let frame = (out.len() - 11) as u64;
        out[3..11].copy_from_slice(&frame.to_le_bytes());
        out
    };
    let mut protocol5 = valid.clone();
    protocol5[1] = 5;
    vec![
        ("valid.metadata", valid.clone()),
        ("protocol-5.metadata", protocol5),
        // Refused: paths leaving the directory, a missing file, a global
        // outside DCP's, a dtype zt has no type for, a cut pickle.
        ("escape.metadata", swap("__0_0.distcp", "../__0_0.distcp")),
        ("absolute.metadata", swap("__0_0.distcp", "/etc/hostname")),
        ("missing.metadata", swap("__0_0.distcp", "__0_1.distcp")),
        ("forbidden-global.metadata", swap("_get_layout", "system")),
        (
            "forbidden-module.metadata",
            swap("torch.serialization", "os"),
        ),
        ("other-dtype.metadata", swap("bfloat16", "float16")),
        ("unknown-dtype.metadata", swap("float32", "qint8")),
        ("renamed.metadata", swap("model.w", "model.x")),
        ("half.metadata", valid[..valid.len() / 2].to_vec()),
        // A chunk stored through torch's zstd extension (the fixture's
        // `__z_0.distcp`).
        ("zstd.metadata", {
            let zdir = dir.with_extension("zstd");
            crate::fixtures::dcp_zstd(&zdir).1
        }),
    ]
}
