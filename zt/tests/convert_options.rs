//! A conversion's `select`, `rename` and `dtype` (`Source::transform`):
//! applied to a source, then written by the ordinary writers (a file, a
//! sharded checkpoint, another format), and read back.

use std::path::Path;

use zt::transform::{Rename, Transform};
use zt::{DType, Rule, TensorIn, WriteOptions};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// `model.w` f32 [2, 3] of edge values, `model.step` i64, `model.h` f16,
/// `optim.m` f32: a checkpoint with a model and its optimizer state.
fn checkpoint(dir: &Path) -> std::path::PathBuf {
    let w = f32_bytes(&[
        1.0,
        f32::from_bits(0x3F80_8000), // a bf16 tie: rounds to even (1.0)
        f32::from_bits(0x3F81_8000), // a tie above an odd mantissa: up
        f32::NAN,
        f32::MAX,                    // overflows bf16 to infinity
        f32::from_bits(0x0001_0000), // a subnormal, kept
    ]);
    let step: Vec<u8> = 12345i64.to_le_bytes().to_vec();
    let h: Vec<u8> = [0x3C00u16, 0x7BFF, 0x0001, 0xFC00]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let m = f32_bytes(&[0.5; 64]);
    let path = dir.join("ckpt.safetensors");
    zt::formats::safetensors::write(
        &path,
        &[
            TensorIn {
                name: "model.w",
                dtype: DType::F32,
                shape: &[2, 3],
                data: &w,
            },
            TensorIn {
                name: "model.step",
                dtype: DType::I64,
                shape: &[],
                data: &step,
            },
            TensorIn {
                name: "model.h",
                dtype: DType::F16,
                shape: &[4],
                data: &h,
            },
            TensorIn {
                name: "optim.m",
                dtype: DType::F32,
                shape: &[64],
                data: &m,
            },
        ],
        &[],
    )
    .unwrap();
    path
}

fn model_only_bf16() -> Transform {
    Transform {
        select: vec!["model.*".into()],
        rename: Rename {
            strip_prefix: Some("model.".into()),
            map: vec![],
        },
        dtype: Some(DType::BF16),
    }
}

#[test]
fn select_rename_cast_to_a_sharded_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let src = zt::open(checkpoint(dir.path())).unwrap();
    let view = src.transform(&model_only_bf16()).unwrap();
    let out = dir.path().join("out.safetensors");
    // Shards of at most 16 bytes: every tensor its own shard.
    let written = zt::convert_sharded(&view, &out, 16, &WriteOptions::default()).unwrap();
    assert_eq!(written.files.len(), 4, "{:?}", written.files); // 3 shards + index
    let back = zt::open(dir.path().join("out.safetensors.index.json")).unwrap();
    let mut names: Vec<&str> = back.names().collect();
    names.sort();
    assert_eq!(names, ["h", "step", "w"]);
    let w = back.tensor("w").unwrap();
    let w = w.data().unwrap();
    assert_eq!(w.dtype(), DType::BF16);
    assert_eq!(w.shape(), [2, 3]);
    assert_eq!(
        u16s(&w.bytes().unwrap()),
        [0x3F80, 0x3F80, 0x3F82, 0x7FC0, 0x7F80, 0x0001]
    );
    // f16 widened exactly into bf16's range (the subnormal 2^-24 is a
    // normal bf16; 65504 rounds to 65536).
    let h = back.tensor("h").unwrap();
    assert_eq!(
        u16s(&h.data().unwrap().bytes().unwrap()),
        [0x3F80, 0x4780, 0x3380, 0xFF80]
    );
    let step = back.tensor("step").unwrap();
    let step = step.data().unwrap();
    assert_eq!(step.dtype(), DType::I64);
    assert_eq!(step.bytes().unwrap()[..], 12345i64.to_le_bytes());
}

#[test]
fn every_writer_gets_the_transformed_source() {
    let dir = tempfile::tempdir().unwrap();
    let src = zt::open(checkpoint(dir.path())).unwrap();
    let view = src
        .transform(&Transform {
            select: vec!["model.w".into(), "optim.*".into()],
            rename: Rename {
                strip_prefix: None,
                map: vec![("optim.m".into(), "exp_avg".into())],
            },
            dtype: Some(DType::F16),
        })
        .unwrap();
    for ext in ["npz", "pt", "zt", "safetensors"] {
        let out = dir.path().join(format!("out.{ext}"));
        zt::convert(&view, &out, &WriteOptions::default()).unwrap();
        let back = zt::open(&out).unwrap();
        let mut names: Vec<&str> = back.names().collect();
        names.sort();
        assert_eq!(names, ["exp_avg", "model.w"], "{ext}");
        let m = back.tensor("exp_avg").unwrap();
        let m = m.data().unwrap();
        assert_eq!(m.dtype(), DType::F16, "{ext}");
        assert_eq!(u16s(&m.bytes().unwrap()), [0x3800; 64], "{ext}");
        let w = back.tensor("model.w").unwrap();
        assert_eq!(
            u16s(&w.data().unwrap().bytes().unwrap()),
            [0x3C00, 0x3C04, 0x3C0C, 0x7E00, 0x7C00, 0x0000],
            "{ext}"
        );
    }
}

#[test]
fn refusals_come_before_any_output() {
    let dir = tempfile::tempdir().unwrap();
    let src = zt::open(checkpoint(dir.path())).unwrap();
    let nothing = Transform {
        select: vec!["model.*".into(), "ema.*".into()],
        ..Default::default()
    };
    let err = src.transform(&nothing).unwrap_err();
    assert_eq!(err.rule(), Some(Rule::WRITE_SELECT));
    assert!(err.to_string().contains("ema.*"), "{err}");
    let clash = Transform {
        rename: Rename {
            strip_prefix: Some("model.".into()),
            map: vec![("optim.m".into(), "w".into())],
        },
        ..Default::default()
    };
    assert_eq!(
        src.transform(&clash).unwrap_err().rule(),
        Some(Rule::WRITE_RENAME)
    );
    // The view is metadata: its sizes are the cast's.
    let view = src.transform(&model_only_bf16()).unwrap();
    assert_eq!(view.len(), 3);
    assert_eq!(view.total_bytes(), 12 + 8 + 8);
}
