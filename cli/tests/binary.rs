//! The cargo binary is `zt_cli::run`: its version line, `--json` and
//! completions as a user sees them (the Python suite checks the package's
//! `zt` command prints byte for byte what this binary prints).

use std::process::{Command, Output};

use zt::{DType, TensorIn};

fn zt(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zt"))
        .args(args)
        .output()
        .expect("run the zt binary")
}

fn text(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

#[test]
fn version_names_the_version_and_the_commit() {
    let out = zt(&["--version".as_ref()]);
    assert!(out.status.success());
    let line = text(&out);
    assert_eq!(line, format!("zt {}\n", zt_cli::VERSION));
    let commit = zt_cli::COMMIT;
    let hash = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        commit == "unknown" || (hash.len() == 12 && hash.bytes().all(|b| b.is_ascii_hexdigit())),
        "{commit}"
    );
    // "-dirty" exactly when the sources the binary is built from differ
    // from HEAD (cargo reran build.rs for this build if they changed).
    if commit != "unknown" {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let status = Command::new("git")
            .args(["status", "--porcelain", "--untracked-files=no", "--"])
            .args(env!("ZT_GIT_SOURCES").split(' '))
            .current_dir(root)
            .output()
            .expect("git runs where the commit was found");
        let dirty = !status.stdout.is_empty();
        assert_eq!(commit.ends_with("-dirty"), dirty, "{commit}");
    }
    assert!(line.starts_with(&format!("zt {} (commit ", env!("CARGO_PKG_VERSION"))));
}

#[test]
fn detect_and_diff_print_json() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        dir.path().join("a.safetensors"),
        dir.path().join("b.safetensors"),
    );
    let one: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    let two: Vec<u8> = [1.0f32, 3.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    for (path, data) in [(&a, &one), (&b, &two)] {
        let t = TensorIn {
            name: "w",
            dtype: DType::F32,
            shape: &[2],
            data,
        };
        zt::formats::safetensors::write(path, &[t], &[]).unwrap();
    }
    let out = zt(&["detect".as_ref(), "--json".as_ref(), a.as_os_str()]);
    let got: serde_json::Value = serde_json::from_str(&text(&out)).unwrap();
    assert_eq!(
        got,
        serde_json::json!({"file": a.display().to_string(), "format": "safetensors"})
    );
    let out = zt(&[
        "diff".as_ref(),
        "--json".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let got: serde_json::Value = serde_json::from_str(&text(&out)).unwrap();
    assert_eq!(got["same"], false);
    assert_eq!(
        got["differences"],
        serde_json::json!([{"kind": "contents", "name": "w", "part": "data"}])
    );
}

#[test]
fn completions_for_each_shell() {
    // fish spells a long flag `-l json`.
    for (shell, mark, json_flag) in [
        ("bash", "complete -F _zt", "--json"),
        ("zsh", "#compdef zt", "--json"),
        ("fish", "complete -c zt", "-l json"),
    ] {
        let out = zt(&["completions".as_ref(), shell.as_ref()]);
        assert!(out.status.success(), "{shell}");
        let script = text(&out);
        assert!(script.contains(mark), "{shell}: {script}");
        assert!(
            script.contains("verify") && script.contains(json_flag),
            "{shell}"
        );
    }
}

#[test]
fn errors_cite_their_rule_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.safetensors");
    std::fs::write(&bad, [0xffu8; 64]).unwrap();
    let out = zt(&["ls".as_ref(), bad.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    // The rule as `zt::Rule::name` (Python's `FormatError.rule`) names it.
    let e = zt::open(&bad).map(drop).unwrap_err();
    assert_eq!(e.rule().map(zt::Rule::name), Some("core.UnknownFormat"));
    assert_eq!(stderr, format!("zt: error [core.UnknownFormat]: {e}\n"));
    // A failure without a rule: no brackets.
    let missing = dir.path().join("missing.npz");
    let out = zt(&["info".as_ref(), missing.as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with("zt: error: ") && stderr.ends_with("no such file\n"),
        "{stderr}"
    );
}
