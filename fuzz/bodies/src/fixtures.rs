//! The fixed half of the targets whose input is one part of something
//! larger: the zrecord stores `zrecord_dict` puts its dictionary into, the
//! safetensors shards an `index_json` input indexes, and the object the
//! `http_response` server plays. The bodies build them at run time and
//! `generate` builds the seeds from the same definitions, so a seed always
//! matches what its body puts beside it.

/// The name of every shard an `index_json` input may name, with its bytes:
/// two shards of one checkpoint and a third file holding one of the first
/// shard's names (an index naming it merges two tensors of one name).
pub fn index_shards() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            SHARD_1,
            safetensors(
                &[
                    (
                        "a",
                        "F32",
                        &[2, 3],
                        &f32_bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
                    ),
                    (
                        "b",
                        "I64",
                        &[2],
                        &[7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0],
                    ),
                ],
                Some(r#"{"format":"pt"}"#),
            ),
        ),
        (
            SHARD_2,
            safetensors(
                &[
                    (
                        "c",
                        "BF16",
                        &[2, 2],
                        &[0x80, 0x3f, 0, 0x40, 0x40, 0x40, 0x80, 0x40],
                    ),
                    ("d", "U8", &[], &[42]),
                    ("e", "BOOL", &[0, 4], &[]),
                ],
                None,
            ),
        ),
        (
            SHARD_DUPLICATE,
            safetensors(
                &[
                    ("a", "F16", &[1], &[0, 0x3c]),
                    ("f", "I8", &[3], &[1, 0xff, 3]),
                ],
                None,
            ),
        ),
    ]
}

/// The first shard: `a` (f32 2x3) and `b` (i64 2), with metadata.
pub const SHARD_1: &str = "model-00001-of-00002.safetensors";
/// The second shard: `c` (bf16 2x2), `d` (u8 scalar), `e` (bool 0x4).
pub const SHARD_2: &str = "model-00002-of-00002.safetensors";
/// Another `a` (f16 1) and `f` (i8 3).
pub const SHARD_DUPLICATE: &str = "model-extra.safetensors";

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A safetensors file: the JSON header (offsets in order, padded with
/// spaces to 8 bytes as the reference writer pads it) and the data.
fn safetensors(tensors: &[(&str, &str, &[u64], &[u8])], metadata: Option<&str>) -> Vec<u8> {
    let mut entries = Vec::new();
    if let Some(m) = metadata {
        entries.push(format!(r#""__metadata__":{m}"#));
    }
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let shape: Vec<String> = shape.iter().map(u64::to_string).collect();
        let start = data.len();
        data.extend_from_slice(bytes);
        entries.push(format!(
            r#""{name}":{{"dtype":"{dtype}","shape":[{}],"data_offsets":[{start},{}]}}"#,
            shape.join(","),
            data.len()
        ));
    }
    let mut header = format!("{{{}}}", entries.join(",")).into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.extend_from_slice(&data);
    file
}

/// Bytes per record of the Dense store (`|u1`, 4x12) and of each sample
/// the dictionary is trained on.
pub const RECORD: usize = 48;
/// Records in each store.
pub const RECORDS: usize = 12;
/// Samples the dictionary is trained on.
const SAMPLES: usize = 64;
/// The dictionary's size bound: small, so that most of a seed is zstd's
/// header and entropy tables rather than content.
const DICT_BYTES: usize = 1024;

/// `n` records of `RECORD` bytes: compressible, each different, in the
/// style of zrecord/tests/store.rs, so frames reference the dictionary.
pub fn zrecord_records(n: usize, seed: u64) -> Vec<u8> {
    (0..n * RECORD)
        .map(|i| ((i as u64 / 7).wrapping_mul(seed + 31) % 23) as u8 + b'a')
        .collect()
}

/// The dictionary the `zrecord_dict` stores are written with (zstd's
/// trainer is deterministic): its bytes are the `trained.dict` seed.
pub fn zrecord_dictionary() -> Vec<u8> {
    let samples = zrecord_records(SAMPLES, 3);
    zrecord::train_dict(&samples, &[RECORD; SAMPLES], DICT_BYTES).expect("train the dictionary")
}

/// The object the `http_response` seeds serve: its bytes, ETag and
/// Last-Modified. The body's listed object is this one.
pub const OBJECT: &[u8] = b"zt fuzz object: forty-eight bytes, 0123456789abc";
const _: () = assert!(OBJECT.len() == 48);
/// Its ETag, quoted as servers send it.
pub const OBJECT_ETAG: &str = "\"zt-1\"";
/// Its Last-Modified.
pub const OBJECT_MODIFIED: &str = "Wed, 21 Oct 2015 07:28:00 GMT";

/// The `dcp` target's checkpoint: tensors written by zt's DCP writer
/// (`zt::formats::dcp::write`), as `(file name, bytes)` for every file of
/// its directory; the `.metadata` is the valid seed, the `.distcp` what the
/// body puts beside every input. Built in a scratch directory `dir` (which
/// must not exist) and read back; the writer is deterministic.
pub fn dcp_checkpoint(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    use zt::write::TensorIn;
    use zt::DType;
    let w = f32_bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let step = 7i64.to_le_bytes();
    let tensors = [
        TensorIn {
            name: "model.w",
            dtype: DType::F32,
            shape: &[2, 3],
            data: &w,
        },
        TensorIn {
            name: "model.b",
            dtype: DType::BF16,
            shape: &[2],
            data: &[0x80, 0x3f, 0, 0x40],
        },
        TensorIn {
            name: "step",
            dtype: DType::I64,
            shape: &[],
            data: &step,
        },
        TensorIn {
            name: "mask",
            dtype: DType::Bool,
            shape: &[0, 4],
            data: &[],
        },
    ];
    zt::formats::dcp::write::write(dir, &tensors, 1).expect("write the DCP fixture");
    let mut files = dir_files(dir);
    let (frame, _) = dcp_zstd(&dir.join("zstd"));
    files.push((DCP_ZSTD_FILE.to_string(), frame));
    files.sort();
    let _ = std::fs::remove_dir_all(dir);
    files
}

/// Every file of `dir`, as `(file name, bytes)`.
fn dir_files(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(dir)
        .expect("the DCP fixture")
        .filter_map(|e| {
            let path = e.expect("an entry").path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            path.is_file()
                .then(|| (name, std::fs::read(&path).expect("a fixture file")))
        })
        .collect()
}

/// The `.distcp` of the `dcp` fixture's compressed chunk.
pub const DCP_ZSTD_FILE: &str = "__z_0.distcp";

/// The `dcp` fixture's compressed chunk: `model.w` stored as torch's zstd
/// extension stores a chunk (`transform_descriptors` `["stream.zstd/1"]`),
/// as `(the bytes of` [`DCP_ZSTD_FILE`]`, a .metadata naming only it)`.
/// The `.metadata` is the one zt's writer writes for `model.w` alone (built
/// in `dir`, which must not exist), its file renamed, its length that of
/// the frame, and the descriptors added to its `_StorageInfo`. The frame
/// is the chunk's `torch.save` archive in raw blocks, with the header
/// torch's frames have (no content size, a 2 MiB window): libzstd decodes
/// it, and its bytes depend on no compressor's version.
pub fn dcp_zstd(dir: &std::path::Path) -> (Vec<u8>, Vec<u8>) {
    use zt::write::TensorIn;
    let w = f32_bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let tensor = TensorIn {
        name: "model.w",
        dtype: zt::DType::F32,
        shape: &[2, 3],
        data: &w,
    };
    zt::formats::dcp::write::write(dir, &[tensor], 1).expect("write the DCP zstd fixture");
    let files = dir_files(dir);
    let _ = std::fs::remove_dir_all(dir);
    let get = |n: &str| files.iter().find(|(f, _)| f == n).expect(n).1.clone();
    let (archive, meta) = (get("__0_0.distcp"), get(".metadata"));
    // Magic, frame header descriptor (nothing declared), window 2 MiB.
    let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x58];
    let blocks: Vec<&[u8]> = archive.chunks(128 << 10).collect();
    for (i, block) in blocks.iter().enumerate() {
        let last = u32::from(i + 1 == blocks.len());
        let header = (block.len() as u32) << 3 | last; // raw block
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        frame.extend_from_slice(block);
    }
    let enc = |s: &str| [&[0x8c, s.len() as u8][..], s.as_bytes()].concat();
    let find = |hay: &[u8], needle: &[u8]| {
        hay.windows(needle.len())
            .position(|w| w == needle)
            .expect("in the pickle")
    };
    // The file's name (same length), then the length (`BININT2`, as long
    // for both), then the descriptors as one more field.
    let mut meta = meta;
    let at = find(&meta, &enc("__0_0.distcp"));
    meta[at..at + 14].copy_from_slice(&enc(DCP_ZSTD_FILE));
    let length = |n: usize| [&[b'M'][..], &(n as u16).to_le_bytes()].concat();
    let key = find(&meta, &enc("length"));
    let value = key + find(&meta[key..], &length(archive.len()));
    meta[value..value + 3].copy_from_slice(&length(frame.len()));
    let field = [
        enc("transform_descriptors"),
        b"]".to_vec(),
        enc("stream.zstd/1"),
        b"a".to_vec(),
    ]
    .concat();
    let meta = [&meta[..value + 3], &field[..], &meta[value + 3..]].concat();
    let mut meta = meta;
    let framed = (meta.len() - 11) as u64;
    meta[3..11].copy_from_slice(&framed.to_le_bytes());
    (frame, meta)
}
