//! The fuzz targets' smoke test on stable: every body over every one of its
//! seed files (CI has no libFuzzer). A panic here is a finding, exactly as
//! under `cargo fuzz run`.

use zt_fuzz_bodies::{seed_files, SEEDS, TARGETS};

#[test]
fn every_target_has_seeds_and_survives_them() {
    for (name, body) in TARGETS {
        let seeds = seed_files(name);
        assert!(
            !seeds.is_empty(),
            "{name}: no seed files (run fuzz/make_seeds.py)"
        );
        for seed in seeds {
            let data = std::fs::read(&seed).unwrap();
            body(&data);
        }
    }
}

#[test]
fn every_target_has_a_seed_list_and_a_libfuzzer_wrapper() {
    let root = zt_fuzz_bodies::repo_root();
    for (name, _) in TARGETS {
        assert!(SEEDS.iter().any(|(n, _)| n == name), "{name}: not in SEEDS");
        let wrapper = root.join(format!("fuzz/libfuzzer/fuzz_targets/{name}.rs"));
        assert!(wrapper.is_file(), "{}: missing", wrapper.display());
    }
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
        let (_, body) = TARGETS
            .iter()
            .filter(|(n, _)| file.starts_with(&format!("{n}-")))
            .max_by_key(|(n, _)| n.len())
            .unwrap_or_else(|| panic!("{file}: names no target"));
        body(&std::fs::read(&path).unwrap());
    }
}

/// The seeds built in Rust are what their generator writes now, so they
/// match what the bodies put beside them: a change to a fixture (or to
/// zstd's trainer) that is not followed by
/// `cargo run -p zt-fuzz-bodies --example make-seeds` fails here.
#[test]
fn generated_seeds_are_up_to_date() {
    use zt_fuzz_bodies::generate::{seeds, GENERATED};
    for target in GENERATED {
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
