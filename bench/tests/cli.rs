//! End to end: `zt-bench all` at a tiny size in a scratch directory on real
//! disk (under `target/`), checking that the Markdown has every row, that
//! `--out` holds the same text, and that the scratch files are gone.

use std::path::{Path, PathBuf};
use std::process::Command;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_zt-bench"))
        .args(args)
        .output()
        .expect("zt-bench runs")
}

#[test]
fn all_prints_every_row() {
    let dir = scratch("zt-bench-all");
    let out = dir.join("results/bench.md");
    let o = bench(&[
        "all",
        "--size-mb",
        "1",
        "--runs",
        "2",
        "--dir",
        dir.join("work").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(
        o.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&o.stderr)
    );

    let mut want = vec!["## zt-bench".to_string(), "Machine: ".to_string()];
    for kind in ["large", "mixed", "small"] {
        want.push(format!("### Write {kind}: "));
        want.push(format!("### Read {kind}: "));
        want.push(format!("### Verify and convert {kind}: "));
    }
    for row in [
        "zt .zt canonical",
        "zt .zt auto",
        "zt .zt 4 KiB",
        "zt safetensors",
        "zt verify (shallow)",
        "zt verify --deep",
        "zt convert safetensors → .zt canonical",
    ] {
        want.push(format!("| {row} | "));
    }
    for m in [
        "open (metadata only)",
        "zero-copy traversal, warm",
        "copy into owned buffers, warm",
        "open + zero-copy traversal, cold",
    ] {
        for file in [".zt canonical", ".zt auto", "safetensors"] {
            want.push(format!("| {m}: {file} | "));
        }
    }
    for w in ["dense vision", "dense token blocks"] {
        want.push(format!("### zrecord {w}: "));
    }
    for row in ["append raw", "append zstd", "gather raw", "gather zstd"] {
        want.push(format!("| {row} | "));
    }
    for w in &want {
        assert!(stdout.contains(w.as_str()), "missing {w:?} in\n{stdout}");
    }
    // Every timed row has numbers, none is reported missing.
    assert!(!stdout.contains("| missing |"), "{stdout}");
    // Each write/read/verify row appears once per workload (3), zrecord rows once per workload (2).
    assert_eq!(stdout.matches("| zt .zt auto | ").count(), 3);
    assert_eq!(stdout.matches("| gather zstd | ").count(), 2);

    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), stdout.trim());
    let left: Vec<_> = std::fs::read_dir(dir.join("work")).unwrap().collect();
    assert!(left.is_empty(), "scratch files left: {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn read_checks_files_and_refuses_tmpfs() {
    let dir = scratch("zt-bench-read");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.safetensors");
    let data: Vec<u8> = (0..4096u32).flat_map(|x| x.to_le_bytes()).collect();
    let t = zt::TensorIn {
        name: "w",
        dtype: zt::DType::F32,
        shape: &[64, 64],
        data: &data,
    };
    zt::formats::safetensors::write(&path, &[t], &[]).unwrap();
    let o = bench(&["read", path.to_str().unwrap(), "--runs", "1"]);
    let stdout = String::from_utf8(o.stdout).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        stdout.contains("| open + zero-copy traversal, cold: "),
        "{stdout}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let shm_is_tmpfs = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.len() > 2 && f[1] == "/dev/shm" && f[2] == "tmpfs"
    });
    if shm_is_tmpfs {
        let o = bench(&[
            "write",
            "--size-mb",
            "1",
            "--dir",
            "/dev/shm/zt-bench-refused",
        ]);
        let _ = std::fs::remove_dir_all("/dev/shm/zt-bench-refused");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && stderr.contains("tmpfs"), "{stderr}");
    }
}
