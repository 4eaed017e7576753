//! The bodies of zt's fuzz targets, one function per target.
//!
//! `fuzz/libfuzzer/fuzz_targets/*.rs` are one-line `fuzz_target!` wrappers around
//! these (built by `cargo +nightly fuzz build`, run by
//! `fuzz/run-campaign.sh`). The same functions run on stable in
//! `cargo test` over every seed file (`tests/seeds.rs`), so CI exercises
//! each body without libFuzzer.
//!
//! Every body feeds its input to one parser and then reads every part of
//! every tensor it accepted. Errors are fine; panics, aborts, runaway
//! allocations and stack overflows are the findings.

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use zt::container::cbor::{decode, encode, DecodeLimits, MAX_DEPTH};
use zt::container::container::{Footer, MAGIC};
use zt::{Context, Format, Limits, OpenInput, OpenOptions, Source, Store};

mod seeds;
pub use seeds::{repo_root, seed_files, SEEDS};

/// A fuzz target: its name (the `fuzz_targets/NAME.rs` file) and body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in campaign order.
pub const TARGETS: &[Target] = &[
    ("open_any", open_any),
    ("safetensors", safetensors),
    ("pt", pt),
    ("pickle", pickle),
    ("gguf", gguf),
    ("numpy", numpy),
    ("onnx", onnx),
    ("h5", h5),
    ("zt_file", zt_file),
    ("zt_cbor", zt_cbor),
    ("zrecord_meta", zrecord_meta),
];

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

/// Write `data` to a scratch file named `input-N.EXT` (N unique per
/// thread, so test threads never share a file), run `f` on it, remove it.
fn with_file(ext: &str, data: &[u8], f: impl FnOnce(&Path)) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static SLOT: Cell<usize> = const { Cell::new(usize::MAX) });
    let slot = SLOT.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        s.get()
    });
    let path = scratch().join(format!("input-{slot}.{ext}"));
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
/// name), so the input length picks one without changing the bytes. Every
/// format a reader is registered for is named, so each plugin's extension
/// rules are reached (detection itself is structural).
const EXTENSIONS: [&str; 10] = [
    "bin",
    "npy",
    "npz",
    "safetensors",
    "gguf",
    "pt",
    "onnx",
    "h5",
    "zt",
    "safetensors.index.json",
];

/// Any bytes through the registry (sniff, then the plugin it picks), mapped
/// and read, with default and tight limits.
pub fn open_any(data: &[u8]) {
    let ext = EXTENSIONS[data.len() % EXTENSIONS.len()];
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

/// The safetensors plugin: JSON header, offsets, dtypes.
pub fn safetensors(data: &[u8]) {
    plugin(
        &zt::formats::safetensors::Safetensors,
        "safetensors",
        "safetensors",
        data,
    );
}

/// The PyTorch plugin on whole files: zip archives (`data.pkl` + storages)
/// and the legacy (pre-1.6) stream, which the plugin tells apart itself.
pub fn pt(data: &[u8]) {
    plugin(&zt::formats::pt::Pt, "pt", "pt", data);
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

/// The GGUF plugin: metadata values (arrays of arrays), tensor infos,
/// alignment, both byte orders, dequantization.
pub fn gguf(data: &[u8]) {
    plugin(&zt::formats::gguf::Gguf, "gguf", "gguf", data);
}

/// The npy and npz plugins on the same bytes: the npy header parser, and
/// the zip reader with its members' npy headers, deflate and CRC-32.
pub fn numpy(data: &[u8]) {
    plugin(&zt::formats::npy::Npy, "npy", "npy", data);
    plugin(&zt::formats::npy::Npz, "npz", "npz", data);
}

/// The ONNX plugin: protobuf walker, typed-field decoding, sparse
/// coordinates, external-data path checks (against the scratch `w.bin`).
pub fn onnx(data: &[u8]) {
    plugin(&zt::formats::onnx::Onnx, "onnx", "onnx", data);
}

/// HDF5 from well-formed h5py files outward: the input is a list of
/// (offset, xor) edits applied to one of the committed fixtures, so the
/// fuzzer starts deep inside B-trees, heaps and chunk indexes instead of
/// at a signature it would rarely guess.
pub fn h5(data: &[u8]) {
    const FIXTURES: [&[u8]; 2] = [
        include_bytes!("../../../zt/tests/data/h5/earliest.h5"),
        include_bytes!("../../../zt/tests/data/h5/latest.h5"),
    ];
    let Some((&pick, edits)) = data.split_first() else {
        return;
    };
    let mut bytes = FIXTURES[usize::from(pick) % FIXTURES.len()].to_vec();
    // Each edit: a 2-byte little-endian offset and a byte to xor there.
    for e in edits.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([e[0], e[1]])) % bytes.len();
        bytes[at] ^= e[2];
    }
    plugin(&zt::formats::h5::Hdf5, "hdf5", "h5", &bytes);
}

/// The `.zt` plugin on whole files: footer, manifest, layouts, zstd seek
/// tables, sparse and chunked parts.
pub fn zt_file(data: &[u8]) {
    plugin(&zt::formats::ztensor::Zt, "zt", "zt", data);
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
