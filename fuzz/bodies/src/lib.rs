//! The bodies of zt's fuzz targets.
//!
//! The registry's readers are fuzzed by targets derived from their plugins
//! (`Format::fuzz`, gathered by `Plugin::fuzz_targets`): one target per name
//! a plugin's readers declare, whose body opens the input with each of those
//! readers past the sniff ([`Body::Readers`]). Nothing here names them. The
//! targets whose input is not a file one reader opens alone (the registry's
//! detection, the pickle machine, the `.zt` CBOR codec, HDF5 edits of a
//! fixture, zrecord's parts, a shard index, HTTP responses, a DCP
//! `.metadata` beside its `.distcp`, a zarr `blosc` chunk, a quantized
//! checkpoint with its `config.json`) are written here
//! ([`WRITTEN`]).
//! [`targets`] lists both.
//!
//! `fuzz/libfuzzer/fuzz_targets/body.rs` is the one libFuzzer binary: it
//! runs the target `ZT_FUZZ_TARGET` names (built by `cargo +nightly fuzz
//! build`, run by `fuzz/run-campaign.sh`). The same bodies run on stable in
//! `cargo test` over every seed file (`tests/seeds.rs`), so CI exercises each
//! body without libFuzzer.
//!
//! Every body feeds its input to one parser and then reads every part of
//! every tensor it accepted. Errors are fine; panics, aborts, runaway
//! allocations and stack overflows are the findings.

use std::cell::{Cell, OnceCell};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use zt::container::cbor::{decode, encode, DecodeLimits, MAX_DEPTH};
use zt::container::container::{Footer, MAGIC};
use zt::{Context, Format, Limits, OpenInput, OpenOptions, Source, Store};

pub mod fixtures;
pub mod generate;
pub mod http;
mod seeds;
pub use seeds::{all_seed_dirs, plugin_targets, repo_root, seed_files, SEEDS};

/// A target written here: its name and body.
pub type Written = (&'static str, fn(&[u8]));

/// The targets written here, in campaign order (`open_any` first; the
/// plugins' targets follow it, then the rest of these).
pub const WRITTEN: &[Written] = &[
    ("open_any", open_any),
    ("pickle", pickle),
    ("onnx", onnx),
    ("h5", h5),
    ("zt_cbor", zt_cbor),
    ("zrecord_meta", zrecord_meta),
    ("zrecord_dict", zrecord_dict),
    ("zrecord_binidx", zrecord_binidx),
    ("zrecord_mds", zrecord_mds),
    ("zrecord_manifest", zrecord_manifest),
    ("index_json", index_json),
    ("http_response", http_response),
    ("dcp", dcp),
    ("zarr_blosc", zarr_blosc),
    ("quant_config", quant_config),
];

/// What a target runs on each input.
#[derive(Clone)]
pub enum Body {
    /// A body written here.
    Written(fn(&[u8])),
    /// A plugin's readers, each past the sniff on the same bytes (written to
    /// a file named with the reader's first extension), under default and
    /// tight limits, every part of every tensor read.
    Readers(Vec<&'static dyn Format>),
}

/// A fuzz target: its name and body.
#[derive(Clone)]
pub struct Target {
    /// Its name: `ZT_FUZZ_TARGET`, `fuzz/run-campaign.sh NAME`,
    /// `fuzz/corpus/NAME`, `fuzz/regressions/NAME-WHAT`.
    pub name: &'static str,
    /// Its body.
    pub body: Body,
}

impl Target {
    /// Run the body on one input.
    pub fn run(&self, data: &[u8]) {
        match &self.body {
            Body::Written(body) => body(data),
            Body::Readers(readers) => {
                for format in readers {
                    let ext = format.extensions().first().copied().unwrap_or("bin");
                    plugin(*format, format.name(), ext, data);
                }
            }
        }
    }
}

/// Every target, in campaign order: `open_any`, each plugin's (registry
/// order), then the rest of [`WRITTEN`]. A plugin's target named as one
/// written here is a mistake this refuses (panics).
pub fn targets() -> &'static [Target] {
    static TARGETS: OnceLock<Vec<Target>> = OnceLock::new();
    TARGETS.get_or_init(|| {
        let written = |&(name, body): &Written| Target {
            name,
            body: Body::Written(body),
        };
        let mut targets: Vec<Target> = WRITTEN[..1].iter().map(written).collect();
        for group in plugin_targets() {
            let name = group.target.name;
            assert!(
                !WRITTEN.iter().any(|(n, _)| *n == name) && !targets.iter().any(|t| t.name == name),
                "fuzz target {name} is declared twice"
            );
            targets.push(Target {
                name,
                body: Body::Readers(group.readers),
            });
        }
        targets.extend(WRITTEN[1..].iter().map(written));
        targets
    })
}

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    targets().iter().find(|t| t.name == name)
}

/// One scratch directory per process; onnx external data resolves
/// relative to it, so it holds one small data file to find.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("zt-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        std::fs::write(dir.join("w.bin"), [7u8; 256]).expect("data file");
        dir
    })
}

/// A number unique to this thread, so test threads never share a scratch
/// file.
fn slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static SLOT: Cell<usize> = const { Cell::new(usize::MAX) });
    SLOT.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        s.get()
    })
}

/// Write `data` to a scratch file named `input-N.EXT` (N: [`slot`]), run
/// `f` on it, remove it.
fn with_file(ext: &str, data: &[u8], f: impl FnOnce(&Path)) {
    let path = scratch().join(format!("input-{}.{ext}", slot()));
    std::fs::write(&path, data).expect("write input");
    f(&path);
    let _ = std::fs::remove_file(&path);
}

/// Parts larger than this are read only under [`tight`] limits.
const DEFAULT_PASS_MAX: u64 = 256 << 20;

/// Read every part of every tensor, then verify (digests and lazy
/// checksums such as npz CRC-32). Under default limits (`whole` false) a
/// part declaring more than [`DEFAULT_PASS_MAX`] is skipped, and so is
/// verify: a valid 8 GiB fill is within the default 64 GiB budget and
/// rightly allocates (lazily zeroed), which `-malloc_limit_mb` would report
/// as a finding (the h5 campaign's only one, fuzz/regressions/h5-fill-8gib);
/// the tight pass reads it and must refuse it before allocating.
fn read_all(source: &Source, whole: bool) {
    for tensor in source.tensors() {
        for part in tensor.parts() {
            if whole || part.nbytes() <= DEFAULT_PASS_MAX {
                let _ = part.bytes().map(|b| b.len());
            }
        }
    }
    if whole {
        let _ = zt::container::verify::verify(source, false);
        // GGUF block tensors through their dequantize kernels (bounded by
        // the tight limits' decoded_bytes before any output is allocated).
        for tensor in source.tensors() {
            if tensor.layout().starts_with("gguf.") {
                let _ = zt::formats::gguf::dequantize_with(&tensor, source.limits());
            }
        }
        // Quantized safetensors schemes: the planner's checks, then every
        // dequantized tensor through its decoder.
        let options = zt::formats::quant::Options {
            dtype: Some(zt::DType::BF16),
            config: None,
        };
        if let Ok(dequantized) = zt::formats::quant::dequantize(source, &options) {
            read_parts(&dequantized);
        }
        // MLX's layouts, whose bits only a configuration gives (the seed
        // fuzz/seeds/safetensors/mlx.safetensors has a layer of each), and
        // the lossless repacks between MLX affine 4-bit and GGUF Q4_1.
        let config = zt::formats::quant::config::parse(&Context::default(), MLX_CONFIG.as_bytes())
            .expect("valid JSON");
        let options = zt::formats::quant::Options {
            config: Some(config.clone()),
            ..options
        };
        if let Ok(dequantized) = zt::formats::quant::dequantize(source, &options) {
            read_parts(&dequantized);
        }
        let repack = zt::formats::quant::mlx::repack::to_q4_1_with(source, &config);
        if let Ok(Some(repacked)) = repack {
            read_parts(&repacked);
        }
        if let Ok(mlx) = zt::formats::quant::mlx::repack::from_q4_1(source) {
            read_parts(&mlx);
        }
    }
}

/// The MLX configuration the fuzz body dequantizes with: a layer of each
/// mode by name (as the `mlx.safetensors` seed names them).
const MLX_CONFIG: &str = r#"{"quantization": {"group_size": 32, "bits": 4,
    "x3": {"bits": 3}, "m": {"mode": "mxfp4"}, "m8": {"mode": "mxfp8"},
    "n": {"mode": "nvfp4"}}}"#;

/// Every part of every tensor of `source` read (its decoders run).
fn read_parts(source: &Source) {
    for tensor in source.tensors() {
        for part in tensor.parts() {
            let _ = part.bytes().map(|b| b.len());
        }
    }
}

/// Tight budgets, so `-malloc_limit_mb` stays meaningful: with the
/// defaults a valid 40 GiB fill may (rightly) ask for 40 GiB, and the
/// fallible path turns a refusal into an error the fuzzer cannot see.
fn tight() -> Limits {
    Limits {
        decoded_bytes: 256 << 20,
        total_decoded_bytes: 1 << 30,
        ..Limits::default()
    }
}

/// One plugin, past the registry's sniff (so every mutation reaches its
/// parser), under default and tight limits.
fn plugin(format: &dyn Format, name: &'static str, ext: &str, data: &[u8]) {
    with_file(ext, data, |path| {
        for (limits, whole) in [(Limits::default(), false), (tight(), true)] {
            let Ok(store) = Store::open(path) else {
                return;
            };
            let store = Arc::new(store);
            if let Ok(catalog) = format.open(&OpenInput::new(&store, &limits)) {
                if let Ok(source) = Source::from_catalog(name, store, catalog, limits) {
                    read_all(&source, whole);
                }
            }
        }
    });
}

/// Detection also looks at the extension (an empty zip is an npz only by
/// name), so the input length picks one without changing the bytes: `bin`,
/// each registered reader's first extension (detection order), and a shard
/// index's, so each plugin's extension rules are reached (detection itself
/// is structural).
fn extensions() -> &'static [&'static str] {
    static EXTENSIONS: OnceLock<Vec<&'static str>> = OnceLock::new();
    EXTENSIONS.get_or_init(|| {
        let mut list = vec!["bin"];
        for format in zt::registry().formats() {
            if let Some(ext) = format.extensions().first() {
                if !list.contains(ext) {
                    list.push(ext);
                }
            }
        }
        list.push("safetensors.index.json");
        list
    })
}

/// Any bytes through the registry (sniff, then the plugin it picks), mapped
/// and read, with default and tight limits.
pub fn open_any(data: &[u8]) {
    let ext = extensions()[data.len() % extensions().len()];
    with_file(ext, data, |path| {
        for map in [true, false] {
            let options = OpenOptions {
                map,
                ..OpenOptions::default()
            };
            if let Ok(source) = zt::open_with(path, &options) {
                read_all(&source, false);
            }
        }
        let options = OpenOptions {
            limits: tight(),
            ..OpenOptions::default()
        };
        if let Ok(source) = zt::open_with(path, &options) {
            read_all(&source, true);
        }
    });
}

/// Any bytes straight into the pickle machine and the tensor search, in
/// both the zip and the legacy interpretation (`pt` reaches the machine
/// only through a valid zip or the legacy magic).
pub fn pickle(data: &[u8]) {
    use zt::formats::pt::pickle::Vm;
    use zt::formats::pt::rebuild::{find_tensors, TorchInterp};
    // Small budgets keep each input fast; the checks are the same.
    let limits = Limits {
        pickle_ops: 1 << 16,
        pickle_objects: 1 << 14,
        ..Limits::default()
    };
    for legacy in [false, true] {
        let mut vm = Vm::new(Context::default(), &limits);
        let mut interp = TorchInterp {
            legacy,
            ..TorchInterp::default()
        };
        if let Ok((root, _)) = vm.run(data, 0, &mut interp) {
            let _ = find_tensors(&vm, root, "root");
        }
    }
}

/// The ONNX plugin: protobuf walker, typed-field decoding, sparse
/// coordinates, external-data path checks (against the scratch `w.bin`).
/// Written here (the ONNX reader declares no `Format::fuzz` yet); the
/// same body as a derived target's.
pub fn onnx(data: &[u8]) {
    plugin(&zt::formats::onnx::Onnx, "onnx", "onnx", data);
    onnx_rewrite(data);
}

/// The rewrite to external data and back (`onnx::rewrite`, its own plan
/// of every message on the way to a tensor): any input is refused or
/// rewritten, and a model the reader opened still opens rewritten.
fn onnx_rewrite(data: &[u8]) {
    use zt::formats::onnx::rewrite::{rewrite, Layout};
    let opens = |path: &Path| {
        let limits = Limits::default();
        Store::open(path).is_ok_and(|store| {
            let store = Arc::new(store);
            zt::formats::onnx::Onnx
                .open(&OpenInput::new(&store, &limits))
                .is_ok()
        })
    };
    with_file("onnx", data, |path| {
        let out = scratch().join(format!("rewritten-{}.onnx", slot()));
        let data_file = format!("rewritten-{}.data", slot());
        let opened = opens(path);
        for layout in [
            Layout::External {
                location: data_file.clone(),
                threshold: 16,
            },
            Layout::Inline,
        ] {
            if rewrite(path, &out, &layout).is_ok() && opened {
                assert!(opens(&out), "a model zt opens no longer opens rewritten");
            }
        }
        let _ = std::fs::remove_file(&out);
        let _ = std::fs::remove_file(scratch().join(&data_file));
    });
}

/// HDF5 from well-formed h5py files outward: the input is a list of
/// (offset, xor) edits applied to one of the committed fixtures, so the
/// fuzzer starts deep inside B-trees, heaps and chunk indexes instead of
/// at a signature it would rarely guess. Byte 0 picks the fixture: with
/// its high bit set, the legacy one (layout and fill value messages of
/// older libhdf5 releases, soft links in old-style groups, a userblock);
/// otherwise, as before that fixture existed, earliest or latest by parity.
pub fn h5(data: &[u8]) {
    const FIXTURES: [&[u8]; 2] = [
        include_bytes!("../../../zt/tests/data/h5/earliest.h5"),
        include_bytes!("../../../zt/tests/data/h5/latest.h5"),
    ];
    const LEGACY: &[u8] = include_bytes!("../../../tests/data/h5_legacy/legacy.h5");
    let Some((&pick, edits)) = data.split_first() else {
        return;
    };
    let mut bytes = if pick & 0x80 != 0 {
        LEGACY.to_vec()
    } else {
        FIXTURES[usize::from(pick) % FIXTURES.len()].to_vec()
    };
    // Each edit: a 2-byte little-endian offset and a byte to xor there.
    for e in edits.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % bytes.len();
        bytes[at] ^= e[2];
    }
    plugin(&zt::formats::h5::Hdf5, "hdf5", "h5", &bytes);
}

/// The `.zt` manifest decoder on arbitrary bytes: the strict CBOR codec
/// alone (whatever it accepts must re-encode to the same bytes, since it
/// only accepts deterministic encodings), then the schema checks, then the
/// same bytes as the manifest of a file whose footer is valid, so the
/// fuzzer reaches blob, layout and encoding checks.
pub fn zt_cbor(data: &[u8]) {
    if let Ok(item) = decode(data, DecodeLimits { depth: MAX_DEPTH }) {
        assert_eq!(encode(&item), data, "accepted a non-deterministic encoding");
        let _ = zt::container::manifest::from_cbor(&item, &Context::default());
    }
    let mut file = MAGIC.to_vec();
    file.resize(4096, 0);
    file.extend_from_slice(data);
    let footer = Footer {
        manifest_offset: 4096,
        manifest_length: data.len() as u64,
        manifest_hash: xxhash_rust::xxh3::xxh3_64(data),
        version: 2,
    };
    file.extend_from_slice(&footer.encode());
    with_file("zt", &file, |path| {
        if let Ok(source) = zt::open_with(
            path,
            &OpenOptions {
                limits: tight(),
                ..OpenOptions::default()
            },
        ) {
            read_all(&source, true);
        }
    });
}

/// `meta.zr`: arbitrary bytes as the header page, schema and RecordLoc
/// table. Whatever parses must check every RecordLoc without panicking,
/// and a page that decodes re-encodes to the same bytes.
pub fn zrecord_meta(data: &[u8]) {
    use zrecord::layout::{Header, RecordLoc, LOC, PAGE, SCHEMA_AT};
    use zrecord::Schema;
    let path = Path::new("meta.zr");
    let Ok(header) = Header::decode(data, data.len() as u64, path) else {
        return;
    };
    let _ = Schema::decode(&header.schema, true, path);
    let _ = Schema::decode(&header.schema, false, path);
    let table = &data[PAGE..];
    for (i, raw) in table
        .chunks_exact(LOC)
        .take(header.length as usize)
        .enumerate()
    {
        let loc = RecordLoc::decode(raw);
        let tail = header.tails[i % header.data_shards as usize];
        let _ = loc.check(header.codec, tail);
    }
    let page = header.encode();
    let end = SCHEMA_AT + header.schema.len();
    assert_eq!(&page[..end], &data[..end]);
}

/// The zrecord stores `zrecord_dict` puts its input into, built once per
/// thread (in `zrecord-N` of the scratch directory, N: [`slot`]) with
/// [`fixtures::zrecord_dictionary`]: a Dense store in loaderx 2.8's layout
/// with two shards and a Ragged one in loaderx 2.3's with one, both
/// `zstd_dict`, whose frames name the dictionary's id. Each with whether it
/// is Dense.
fn zrecord_stores() -> Vec<(PathBuf, bool)> {
    thread_local!(static STORES: OnceCell<Vec<(PathBuf, bool)>> = const { OnceCell::new() });
    STORES.with(|s| s.get_or_init(build_zrecord_stores).clone())
}

fn build_zrecord_stores() -> Vec<(PathBuf, bool)> {
    use zrecord::{Codec, CreateOptions, Geometry, Layout, Schema, Writer};
    let dir = scratch().join(format!("zrecord-{}", slot()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("zrecord scratch directory");
    let options = |data_shards| CreateOptions {
        codec: Codec::ZstdDict,
        data_shards,
        dict: Some(fixtures::zrecord_dictionary()),
        level: None,
    };
    let records = fixtures::zrecord_records(fixtures::RECORDS, 5);

    let dense = dir.join("dense");
    let schema = Schema::dense("|u1", &[4, 12]).expect("dense schema");
    let mut w = Writer::create(&dense, &schema, &options(2)).expect("create the dense store");
    w.append_dense(&records).expect("append dense records");
    w.close().expect("publish the dense store");

    let ragged = dir.join("ragged");
    let schema =
        Schema::new(Layout::Loaderx23, "<i4", Geometry::Ragged { ndim: 1 }).expect("ragged schema");
    let mut w = Writer::create(&ragged, &schema, &options(1)).expect("create the ragged store");
    let lens: Vec<usize> = (0..fixtures::RECORDS).map(|i| 1 + i % 12).collect();
    let payloads: Vec<&[u8]> = records
        .chunks_exact(fixtures::RECORD)
        .zip(&lens)
        .map(|(r, &n)| &r[..4 * n])
        .collect();
    let shapes: Vec<u64> = lens.iter().map(|&n| n as u64).collect();
    w.append_ragged(&payloads, &shapes)
        .expect("append ragged records");
    w.close().expect("publish the ragged store");
    vec![(dense, true), (ragged, false)]
}

/// `dict.zr`: arbitrary bytes as a zrecord store's zstd dictionary. Each
/// of two `zstd_dict` stores (Dense and Ragged) gets the input as its
/// `dict.zr` and is opened and gathered whole (a dictionary zstd cannot
/// load fails the open; one whose id the frames do not name, the gather);
/// a Ragged gather that succeeds has an offset per record. Then the input
/// as a writer's `dict_bytes`: a dictionary both the encoder and the
/// decoder accept must round-trip a record.
pub fn zrecord_dict(data: &[u8]) {
    use zrecord::codec::{Decoder, Encoder};
    use zrecord::{Codec, Reader};
    for (store, dense) in zrecord_stores() {
        std::fs::write(store.join("dict.zr"), data).expect("write dict.zr");
        let Ok(reader) = Reader::open(&store, dense) else {
            continue;
        };
        let all: Vec<u64> = (0..reader.len()).collect();
        let _ = reader.record_lengths(&all);
        if dense {
            let mut out = vec![0u8; all.len() * fixtures::RECORD];
            let _ = reader.gather_dense(&all, &mut out);
        } else if let Ok(batch) = reader.gather_ragged(&all) {
            assert_eq!(batch.offsets.len(), all.len() + 1);
            assert_eq!(batch.values().len() as u64, batch.offsets[all.len()]);
        }
    }
    let path = Path::new("dict.zr");
    let (Ok(encoder), Ok(decoder)) = (
        Encoder::new(Codec::ZstdDict, Some(data), None),
        Decoder::new(Codec::ZstdDict, Some(data), path),
    ) else {
        return;
    };
    let record = fixtures::zrecord_records(1, 7);
    let mut frame = Vec::new();
    if encoder
        .encode(&[&record], &mut Vec::new(), &mut frame)
        .is_ok()
    {
        let mut back = vec![0u8; record.len()];
        let decoded = decoder.decode(&frame, &mut back);
        assert_eq!(decoded, Ok(()), "a dictionary's own frame does not decode");
        assert_eq!(
            back, record,
            "a dictionary's own frame decodes to other bytes"
        );
    }
}

/// A Megatron `.bin`/`.idx` pair: the input is `[idx length: u32 LE][idx]
/// [bin]` (a shorter input is all index), written as `input-N.idx` and
/// `input-N.bin` and opened as sequences and as documents; the first 4096
/// records of each are gathered and their lengths read. A gather that
/// succeeds has an offset per record and as many bytes as its last offset.
pub fn zrecord_binidx(data: &[u8]) {
    use zrecord::binidx::Unit;
    use zrecord::Reader;
    let (idx, bin) = match data.get(..4) {
        Some(head) => {
            let n = u32::from_le_bytes(head.try_into().expect("4 bytes")) as usize;
            let rest = &data[4..];
            rest.split_at(n.min(rest.len()))
        }
        None => (data, &[][..]),
    };
    let prefix = scratch().join(format!("input-{}", slot()));
    std::fs::write(prefix.with_extension("idx"), idx).expect("write the index");
    std::fs::write(prefix.with_extension("bin"), bin).expect("write the data");
    for unit in [Unit::Sequence, Unit::Document] {
        let Ok(reader) = Reader::open_binidx(&prefix, unit) else {
            continue;
        };
        let some: Vec<u64> = (0..reader.len().min(4096)).collect();
        let _ = reader.record_lengths(&some);
        if let Ok(batch) = reader.gather_ragged(&some) {
            assert_eq!(batch.offsets.len(), some.len() + 1);
            assert_eq!(batch.values().len() as u64, batch.offsets[some.len()]);
        }
    }
    let _ = std::fs::remove_file(prefix.with_extension("idx"));
    let _ = std::fs::remove_file(prefix.with_extension("bin"));
}

/// MosaicML MDS: the input is `[index length: u32 LE][index.json][shard]`
/// (a shorter input is all index), written as `index.json` and
/// `shard.00000.mds` in a directory of its own; each column the seeds have
/// is opened at ranks 1 and 2 and its first 4096 records gathered. A
/// gather that succeeds has a row (Dense) or an offset (Ragged) per record.
pub fn zrecord_mds(data: &[u8]) {
    use zrecord::Reader;
    let (index, shard) = match data.get(..4) {
        Some(head) => {
            let n = u32::from_le_bytes(head.try_into().expect("4 bytes")) as usize;
            let rest = &data[4..];
            rest.split_at(n.min(rest.len()))
        }
        None => (data, &[][..]),
    };
    let dir = scratch().join(format!("mds-{}", slot()));
    std::fs::create_dir_all(&dir).expect("make the dataset directory");
    std::fs::write(dir.join("index.json"), index).expect("write the index");
    std::fs::write(dir.join("shard.00000.mds"), shard).expect("write the shard");
    for column in [
        "tokens", "image", "any", "blob", "text", "fixed", "label", "u16", "f64",
    ] {
        for ndim in [1, 2] {
            let Ok(reader) = Reader::open_mds(&dir, column, ndim) else {
                continue;
            };
            let some: Vec<u64> = (0..reader.len().min(4096)).collect();
            let _ = reader.record_lengths(&some);
            if reader.schema().row_bytes().is_some() {
                let row = reader.schema().row_bytes().unwrap_or(0) as usize;
                let mut rows = vec![0u8; row * some.len()];
                let _ = reader.gather_dense(&some, &mut rows);
            } else if let Ok(batch) = reader.gather_ragged(&some) {
                assert_eq!(batch.offsets.len(), some.len() + 1);
                assert_eq!(batch.values().len() as u64, batch.offsets[some.len()]);
                assert_eq!(batch.shapes.len(), some.len() * reader.schema().ndim());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A dataset manifest (`zrecord::dataset::Manifest`): whatever decodes
/// encodes to text that decodes to the same manifest.
pub fn zrecord_manifest(data: &[u8]) {
    use zrecord::Manifest;
    let path = Path::new("train.json");
    let Ok(manifest) = Manifest::decode(data, path) else {
        return;
    };
    let again = Manifest::decode(manifest.encode().as_bytes(), path);
    assert_eq!(
        again.ok(),
        Some(manifest),
        "a manifest does not survive its own encoding"
    );
}

/// Write the shards an `index_json` input may name into the scratch
/// directory (once per process).
fn index_shards() {
    static WRITTEN: OnceLock<()> = OnceLock::new();
    WRITTEN.get_or_init(|| {
        for (name, bytes) in fixtures::index_shards() {
            std::fs::write(scratch().join(name), bytes).expect("write a shard");
        }
    });
}

/// Hugging Face `*.index.json`: the input is the index, written beside
/// small valid safetensors shards ([`fixtures::index_shards`]) and opened
/// with `zt::open` (mapped and read, default and tight limits), every
/// tensor of every shard it accepts read: the JSON, `weight_map`, shard
/// paths (escapes, an index naming an index), the agreement of index and
/// shards, merging, `metadata`.
pub fn index_json(data: &[u8]) {
    index_shards();
    with_file("safetensors.index.json", data, |path| {
        for map in [true, false] {
            let options = OpenOptions {
                map,
                ..OpenOptions::default()
            };
            if let Ok(source) = zt::open_with(path, &options) {
                read_all(&source, false);
            }
        }
        let options = OpenOptions {
            limits: tight(),
            ..OpenOptions::default()
        };
        if let Ok(source) = zt::open_with(path, &options) {
            read_all(&source, true);
        }
    });
}

/// The object-storage client's response handling: the input is the raw
/// responses of a scripted HTTP/1.1 server on 127.0.0.1 ([`http`] says
/// which answers what) to `zt_remote` opening `http://127.0.0.1:PORT/obj`
/// (two concurrent ranged probes, then a `HEAD` if the head probe was
/// refused) and reading a range of it, then to a ranged read of the object
/// as a listing would give it ([`fixtures::OBJECT`]'s size and ETag), which
/// always reaches the server: status lines, headers (`Content-Range`,
/// `Content-Length`, `ETag`, `Last-Modified`, chunked bodies), bodies
/// longer or shorter than announced, versions that change between requests.
/// Every read that succeeds returns exactly the bytes asked for.
/// One chunk of zarr's `blosc` codec (a Blosc 1 frame for c-blosc, past
/// zt's checks of its header), decoded with the chunk's expected size
/// generous and tight: what decodes never passes it.
pub fn zarr_blosc(data: &[u8]) {
    for cap in [1u64 << 20, 256] {
        if let Ok(out) = zt::formats::zarr::decode_blosc(data, cap) {
            assert!(
                out.len() as u64 <= cap,
                "{} bytes decoded past {cap}",
                out.len()
            );
        }
    }
}

pub fn http_response(data: &[u8]) {
    use zt_remote::RemoteObject;
    let server = http::server();
    let _turn = server.play(data);
    let url = server.url("obj");
    if let Ok(object) = RemoteObject::open(&url, http::config()) {
        let size = object.len();
        let (at, len) = (size / 3, (size - size / 3).min(1 << 20));
        if let Ok(bytes) = object.read(at, len) {
            assert_eq!(bytes.len() as u64, len, "read {len} bytes at {at}");
        }
    }
    let listed = RemoteObject::listed(
        &url,
        http::config(),
        fixtures::OBJECT.len() as u64,
        fixtures::OBJECT_ETAG.into(),
    )
    .expect("the server's URL");
    let (at, len) = LISTED_READ;
    if let Ok(bytes) = listed.read(at, len) {
        assert_eq!(bytes.len() as u64, len, "read {len} bytes at {at}");
    }
}

/// The range the listed object's read asks for (offset, length): it
/// fetches the block around it, the whole 48-byte object (`bytes=0-47`).
pub const LISTED_READ: (u64, u64) = (16, 16);

/// The files of the `dcp` fixture checkpoint ([`fixtures::dcp_checkpoint`]),
/// built once per process.
fn dcp_fixture() -> &'static [(String, Vec<u8>)] {
    static FILES: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    FILES.get_or_init(|| fixtures::dcp_checkpoint(&scratch().join("dcp-fixture")))
}

/// PyTorch distributed checkpoints: the input is the `.metadata`, written
/// into a directory (one per thread, `dcp-N`) beside the small valid
/// `__0_0.distcp` of [`fixtures::dcp_checkpoint`] (and its `__z_0.distcp`,
/// a chunk stored through torch's zstd extension), opened by the DCP plugin
/// past its sniff (default and tight limits) and through the directory, and
/// every tensor read: the restricted pickle machine with DCP's globals, the metadata's
/// schema, `storage_data` paths (escapes, missing files), chunk tiling and
/// assembly, each chunk's `torch.save` archive located on its range, the
/// zstd transform's descriptors and frame.
pub fn dcp(data: &[u8]) {
    let dir = scratch().join(format!("dcp-{}", slot()));
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir).expect("dcp scratch directory");
        for (name, bytes) in dcp_fixture() {
            if name != ".metadata" {
                std::fs::write(dir.join(name), bytes).expect("write a distcp file");
            }
        }
    }
    let meta = dir.join(".metadata");
    std::fs::write(&meta, data).expect("write the input");
    // The plugin itself, past the sniff, so every mutation reaches it.
    for (limits, whole) in [(Limits::default(), false), (tight(), true)] {
        let Ok(store) = Store::open(&meta) else {
            return;
        };
        let store = Arc::new(store);
        let input = OpenInput::new(&store, &limits);
        if let Ok(catalog) = zt::formats::dcp::Dcp.open(&input) {
            if let Ok(source) = Source::from_catalog("dcp", store, catalog, limits) {
                read_all(&source, whole);
            }
        }
    }
    // And the directory as a user opens it, positionally.
    let options = OpenOptions {
        map: false,
        ..OpenOptions::default()
    };
    if let Ok(source) = zt::open_with(&dir, &options) {
        read_all(&source, false);
    }
}

/// A quantized safetensors checkpoint and the `config.json` beside it: the
/// input is `[config length: u32 LE][config.json][model.safetensors]` (a
/// shorter input is all configuration), written as those two files in a
/// directory of its own (`quant-N`) and opened under the tight limits.
/// What the configuration changes is what the plugin targets, whose MLX
/// configuration and FP8 blocks are fixed, cannot reach: its parsing
/// (`quantization_config`, MLX's `quantization` with per-layer entries),
/// the FP8 block size, MLX's bits, group sizes and modes, each of which
/// sizes the planner's checks and the kernels' rows. The checkpoint is
/// dequantized with the configuration read from beside it and with it
/// passed in, repacked to Q4_1 both ways, and every tensor read; the
/// configuration is also rewritten without its quantization keys, as a
/// dequantizing conversion writes it, which must still be JSON.
pub fn quant_config(data: &[u8]) {
    use zt::formats::quant::{self, config};
    let (text, model) = match data.get(..4) {
        Some(head) => {
            let n = u32::from_le_bytes(head.try_into().expect("4 bytes")) as usize;
            let rest = &data[4..];
            rest.split_at(n.min(rest.len()))
        }
        None => (data, &[][..]),
    };
    let ctx = Context::default();
    if let Ok(Some(rewritten)) = config::without_quantization(&ctx, text) {
        assert!(
            config::parse(&ctx, &rewritten).is_ok(),
            "the rewritten configuration is not JSON"
        );
    }
    let dir = scratch().join(format!("quant-{}", slot()));
    std::fs::create_dir_all(&dir).expect("quant scratch directory");
    let path = dir.join("model.safetensors");
    std::fs::write(dir.join(config::CONFIG_FILE), text).expect("write config.json");
    std::fs::write(&path, model).expect("write the checkpoint");
    let options = OpenOptions {
        limits: tight(),
        ..OpenOptions::default()
    };
    let Ok(source) = zt::open_with(&path, &options) else {
        return;
    };
    let dtype = [zt::DType::BF16, zt::DType::F16, zt::DType::F32][data.len() % 3];
    let beside = quant::Options {
        dtype: Some(dtype),
        config: None,
    };
    if let Ok(dequantized) = quant::dequantize(&source, &beside) {
        read_parts(&dequantized);
    }
    if let Ok(Some(repacked)) = quant::mlx::repack::to_q4_1(&source) {
        read_parts(&repacked);
        if let Ok(back) = quant::mlx::repack::from_q4_1(&repacked) {
            read_parts(&back);
        }
    }
    if let Ok(value) = config::parse(&ctx, text) {
        let given = quant::Options {
            config: Some(value),
            ..beside
        };
        if let Ok(dequantized) = quant::dequantize(&source, &given) {
            read_parts(&dequantized);
        }
    }
}
