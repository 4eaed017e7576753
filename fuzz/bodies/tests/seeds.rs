//! The fuzz targets' smoke test on stable: every body over every one of its
//! seed files (CI has no libFuzzer). A panic here is a finding, exactly as
//! under `cargo fuzz run`.

use zt_fuzz_bodies::{all_seed_dirs, plugin_targets, seed_files, target, targets, Body, SEEDS};

#[test]
fn every_target_has_seeds_and_survives_them() {
    for target in targets() {
        let name = target.name;
        let seeds = seed_files(name);
        assert!(
            !seeds.is_empty(),
            "{name}: no seed files (run fuzz/make_seeds.py, or for seeds made in \
             Rust `cargo run -p zt-fuzz-bodies --example make-seeds`)"
        );
        for seed in seeds {
            let data = std::fs::read(&seed).unwrap();
            target.run(&data);
        }
    }
}

/// The targets come from the registry: each plugin target runs its readers,
/// the written ones have their seed lists, names are unique, and every
/// reader zt registers is fuzzed by a target of its own or by a body
/// written here (`open_any` reaches them all through detection).
#[test]
fn the_targets_are_the_registrys_and_the_written_ones() {
    let names: Vec<&str> = targets().iter().map(|t| t.name).collect();
    let mut unique = names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    assert_eq!(names[0], "open_any");
    let groups = plugin_targets();
    for group in &groups {
        match &target(group.target.name).unwrap().body {
            Body::Readers(readers) => assert_eq!(readers.len(), group.readers.len()),
            Body::Written(_) => panic!("{}: not the plugin's readers", group.target.name),
        }
    }
    for (name, _) in SEEDS {
        assert!(target(name).is_some(), "{name}: in SEEDS, not a target");
    }
    assert_eq!(all_seed_dirs().len(), targets().len());
    // The readers with a written body of their own (their input needs a
    // whole the body supplies, or their plugin declares no target yet).
    const WRITTEN_FOR: &[&str] = &["h5", "dcp", "onnx"];
    for format in zt::registry().formats() {
        let derived = groups
            .iter()
            .any(|g| g.readers.iter().any(|r| r.name() == format.name()));
        assert!(
            derived || WRITTEN_FOR.contains(&format.name()),
            "{}: no fuzz target (Format::fuzz)",
            format.name()
        );
    }
    // The same targets as before they came from the registry.
    for name in ["safetensors", "pt", "gguf", "numpy", "zt_file"] {
        assert!(
            groups.iter().any(|g| g.target.name == name),
            "{name} is not a plugin target"
        );
    }
}

/// One libFuzzer binary runs every target (`ZT_FUZZ_TARGET`), so adding a
/// format adds no wrapper: the crate's only `[[bin]]` is `body`.
#[test]
fn one_libfuzzer_binary_runs_every_target() {
    let root = zt_fuzz_bodies::repo_root();
    let manifest = std::fs::read_to_string(root.join("fuzz/libfuzzer/Cargo.toml")).unwrap();
    let bins: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .filter_map(|l| l.strip_suffix('"'))
        .filter(|n| *n != "zt-fuzz")
        .collect();
    assert_eq!(bins, ["body"]);
    assert!(root.join("fuzz/libfuzzer/fuzz_targets/body.rs").is_file());
    let wrappers: Vec<_> = std::fs::read_dir(root.join("fuzz/libfuzzer/fuzz_targets"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(wrappers, ["body.rs"]);
}

/// Findings from the campaigns, minimized, kept as regression inputs.
#[test]
fn regressions() {
    let dir = zt_fuzz_bodies::repo_root().join("fuzz/regressions");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        // Named TARGET-WHAT: the body is picked from the name.
        let path = entry.path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let target = targets()
            .iter()
            .filter(|t| file.starts_with(&format!("{}-", t.name)))
            .max_by_key(|t| t.name.len())
            .unwrap_or_else(|| panic!("{file}: names no target"));
        target.run(&std::fs::read(&path).unwrap());
    }
}

/// The seeds built in Rust are what their generator writes now, so they
/// match what the bodies put beside them: a change to a fixture (or to
/// zstd's trainer) that is not followed by
/// `cargo run -p zt-fuzz-bodies --example make-seeds` fails here.
#[test]
fn generated_seeds_are_up_to_date() {
    use zt_fuzz_bodies::generate::{generated, seeds};
    for target in generated() {
        let expected = seeds(target);
        let committed: Vec<(String, Vec<u8>)> = seed_files(target)
            .iter()
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(p).unwrap())
            })
            .collect();
        let mut expected_sorted = expected.clone();
        expected_sorted.sort();
        assert!(
            committed == expected_sorted,
            "{target}: fuzz/seeds/{target} is not what the generator writes; run \
             `cargo run -p zt-fuzz-bodies --example make-seeds`"
        );
    }
}

/// The `dcp` seed of a compressed chunk is a checkpoint zt reads, not one
/// it refuses: beside the fixture's files it opens, and its one tensor
/// decompresses to the chunk the writer stored.
#[test]
fn the_dcp_zstd_seed_reads() {
    let scratch = std::env::temp_dir().join(format!("zt-dcp-zstd-seed-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let files = zt_fuzz_bodies::fixtures::dcp_checkpoint(&scratch.join("fixture"));
    let dir = scratch.join("ckpt");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in &files {
        if name != ".metadata" {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
    let seed = zt_fuzz_bodies::repo_root().join("fuzz/seeds/dcp/zstd.metadata");
    std::fs::copy(seed, dir.join(".metadata")).unwrap();
    let src = zt::open(&dir).unwrap();
    let w = src.tensor("model.w").unwrap().data().unwrap();
    let want: Vec<u8> = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(&w.bytes().unwrap()[..], &want[..]);
    assert!(!w.caps().map);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The `quant_config` seeds reach the kernels rather than a refusal: each
/// checkpoint, with its configuration beside it, dequantizes and every
/// tensor reads, no quantized weight is left (no scale tensor listed), and
/// the MLX affine 4-bit group 32 one repacks to Q4_1 and back to the same
/// bytes.
#[test]
fn the_quant_config_seeds_dequantize() {
    use zt::formats::quant::{self, mlx::repack};
    let seeds = seed_files("quant_config");
    assert!(seeds.len() >= 6, "{seeds:?}");
    let dir = std::env::temp_dir().join(format!("zt-quant-config-seeds-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for seed in seeds {
        let data = std::fs::read(&seed).unwrap();
        let n = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
        std::fs::write(dir.join("config.json"), &data[4..4 + n]).unwrap();
        let path = dir.join("model.safetensors");
        std::fs::write(&path, &data[4 + n..]).unwrap();
        let source = zt::open(&path).unwrap();
        let options = quant::Options {
            dtype: Some(zt::DType::BF16),
            config: None,
        };
        let out = quant::dequantize(&source, &options)
            .unwrap_or_else(|e| panic!("{}: {e}", seed.display()));
        assert!(
            out.len() < source.len(),
            "{}: nothing dequantized",
            seed.display()
        );
        for name in out.names() {
            assert!(
                !name.ends_with("scales") && !name.contains("_scale"),
                "{}: {name} left quantized",
                seed.display()
            );
        }
        for tensor in out.tensors() {
            for part in tensor.parts() {
                part.bytes()
                    .unwrap_or_else(|e| panic!("{}: {}: {e}", seed.display(), tensor.name()));
            }
        }
        if seed.ends_with("mlx-q4_1.bin") {
            let q4_1 = repack::to_q4_1(&source)
                .unwrap()
                .expect("an MLX checkpoint");
            let back = repack::from_q4_1(&q4_1).unwrap();
            for name in ["w4.weight", "w4.scales", "w4.biases"] {
                let want = source
                    .tensor(name)
                    .unwrap()
                    .data()
                    .unwrap()
                    .bytes()
                    .unwrap();
                let got = back.tensor(name).unwrap().data().unwrap().bytes().unwrap();
                assert_eq!(&want[..], &got[..], "{name}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
