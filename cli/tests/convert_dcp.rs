//! `zt convert --to dcp` (and `--dcp-files N`), `zt detect` on a
//! checkpoint directory, and the usage errors around them, as a user runs
//! the binary. torch reading what it writes is held to it in
//! tests/torch/test_dcp_write.py; `--ranks` over files torch saved in
//! tests/torch/test_fsdp_ranks.py.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use zt::{DType, TensorIn};

fn zt(args: &[&OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zt"))
        .args(args)
        .output()
        .expect("run the zt binary")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("UTF-8 output")
}

/// A safetensors file of three f32 tensors and one i64.
fn source(path: &Path) -> Vec<(String, Vec<u64>, Vec<u8>)> {
    let f32s = |n: u32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (i as f32 * 0.25).to_le_bytes())
            .collect()
    };
    let tensors = vec![
        ("model.a".to_string(), vec![4, 8], f32s(32)),
        ("model.b".to_string(), vec![100], f32s(100)),
        ("model.c".to_string(), vec![3, 3], f32s(9)),
    ];
    let mut ins: Vec<TensorIn<'_>> = tensors
        .iter()
        .map(|(name, shape, data)| TensorIn {
            name,
            dtype: DType::F32,
            shape,
            data,
        })
        .collect();
    let step = 7i64.to_le_bytes();
    ins.push(TensorIn {
        name: "step",
        dtype: DType::I64,
        shape: &[],
        data: &step,
    });
    zt::formats::safetensors::write(path, &ins, &[]).unwrap();
    tensors
}

fn distcp_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".distcp"))
        .collect();
    names.sort();
    names
}

#[test]
fn a_file_converts_to_a_dcp_directory_over_the_files_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model.safetensors");
    let tensors = source(&src);
    // No extension, not a directory yet: --to dcp makes it one.
    let ckpt = tmp.path().join("ckpt");
    let out = zt(&[
        "convert".as_ref(),
        src.as_os_str(),
        ckpt.as_os_str(),
        "--to".as_ref(),
        "dcp".as_ref(),
        "--dcp-files".as_ref(),
        "2".as_ref(),
        "--select".as_ref(),
        "model.*".as_ref(),
        "--strip-prefix".as_ref(),
        "model.".as_ref(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("3 tensors"), "{}", stdout(&out));
    assert!(stdout(&out).contains("(dcp)"), "{}", stdout(&out));
    assert!(ckpt.join(".metadata").is_file());
    assert_eq!(distcp_files(&ckpt), ["__0_0.distcp", "__0_1.distcp"]);
    let back = zt::open(&ckpt).unwrap();
    assert_eq!(back.format(), "dcp");
    assert_eq!(back.len(), 3);
    for (name, shape, data) in &tensors {
        let short = name.strip_prefix("model.").unwrap();
        let t = back.tensor(short).unwrap().data().unwrap();
        assert_eq!(t.shape(), &shape[..], "{short}");
        assert_eq!(&t.bytes().unwrap()[..], &data[..], "{short}");
    }
    // detect names the format of the file a directory opens through.
    let out = zt(&["detect".as_ref(), ckpt.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "dcp\n");
    // And back: the DCP directory as a source, to safetensors.
    let again = tmp.path().join("again.safetensors");
    let out = zt(&["convert".as_ref(), ckpt.as_os_str(), again.as_os_str()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = zt(&["diff".as_ref(), ckpt.as_os_str(), again.as_os_str()]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    // A DCP directory to a sharded model directory: its `.distcp` files
    // and `.metadata` are the checkpoint, not companions to copy.
    let model = tmp.path().join("model");
    let out = zt(&[
        "convert".as_ref(),
        ckpt.as_os_str(),
        model.as_os_str(),
        "--max-shard-size".as_ref(),
        "256".as_ref(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut names: Vec<String> = std::fs::read_dir(&model)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
            "model.safetensors.index.json",
        ]
    );
    let out = zt(&["diff".as_ref(), ckpt.as_os_str(), model.as_os_str()]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(zt::detect(&model).unwrap(), "safetensors");
}

#[test]
fn the_default_is_one_distcp_file_per_gib() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model.safetensors");
    source(&src);
    let ckpt = tmp.path().join("ckpt/");
    let out = zt(&[
        "convert".as_ref(),
        src.as_os_str(),
        ckpt.as_os_str(),
        "--to".as_ref(),
        "dcp".as_ref(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(distcp_files(&ckpt), ["__0_0.distcp"]);
    assert_eq!(zt::open(&ckpt).unwrap().len(), 4);
}

#[test]
fn options_that_do_not_fit_a_dcp_output_are_usage_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("model.safetensors");
    source(&src);
    let ckpt = tmp.path().join("ckpt");
    let cases: [(&[&str], &str); 4] = [
        (&["--to", "dcp", "--max-shard-size", "1MB"], "--dcp-files"),
        (&["--to", "dcp", "--dcp-files", "0"], "at least 1"),
        (&["--to", "dcp", "--align", "auto"], "alignment"),
        (&["--dcp-files", "2"], "--to dcp"),
    ];
    for (extra, says) in cases {
        let mut args: Vec<&OsStr> = vec!["convert".as_ref(), src.as_os_str(), ckpt.as_os_str()];
        args.extend(extra.iter().map(OsStr::new));
        let out = zt(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        assert!(stderr(&out).contains(says), "{extra:?}: {}", stderr(&out));
        assert!(!ckpt.exists(), "{extra:?}");
    }
}
