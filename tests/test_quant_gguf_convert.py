"""GGUF block-quantized tensors through ``zt.convert(..., dequantize=True,
dtype=...)`` and ``zt convert --dequantize`` (issue 41): every block type
gguf-py 0.19 dequantizes, in files gguf-py's GGUFWriter writes (seeded
random blocks with NaN, infinite and subnormal scales, and tensors quantized
by gguf-py's own quantizer), written to safetensors as dense tensors equal
to ``gguf.quants.dequantize`` rounded once to the target dtype (numpy's and
ml_dtypes' round to nearest even), NaN-aware; a type gguf-py does not
dequantize is refused before any output exists."""

from __future__ import annotations

import subprocess
import sys

import gguf
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from bitexact import same
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from test_gguf_quants import QUANTIZABLE, TYPES, random_blocks, reference, size, write

import zt
import zt.numpy

DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """One GGUF file holding every dequantizable type as random blocks
    (rows of 2 blocks), gguf-py-quantized tensors of rank 3, and plain
    f32 / f16 tensors; with gguf-py's own dequantization of each."""
    d = tmp_path_factory.mktemp("gguf-convert")
    tensors: dict[str, tuple[np.ndarray, Q]] = {}
    for k, qtype in enumerate(TYPES):
        _, nbytes = size(qtype)
        blocks = random_blocks(qtype, 24, seed=100 + k)
        tensors[f"blk.{k}.{qtype.name}"] = (blocks.reshape(12, 2 * nbytes), qtype)
    rng = np.random.default_rng(41)
    for qtype in QUANTIZABLE:
        block, _ = size(qtype)
        values = rng.standard_normal((3, 4, 2 * block)).astype(np.float32) * 3
        tensors[f"q.{qtype.name}"] = (gguf.quants.quantize(values, qtype), qtype)
    path = d / "model.gguf"
    plain = {
        "norm": rng.standard_normal(300).astype(np.float32),
        "half": rng.standard_normal((5, 7)).astype(np.float16),
    }
    w = gguf.GGUFWriter(path, "llama")
    for name, (data, qtype) in tensors.items():
        w.add_tensor(name, data, raw_dtype=qtype)
    for name, value in plain.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    want = {}
    for t in GGUFReader(path).tensors:
        if t.name in plain:
            want[t.name] = plain[t.name].astype(np.float32)
        else:
            want[t.name] = reference(t.data, t.tensor_type)
    return path, want


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_convert_matches_gguf_py_rounded_once(model, tmp_path, dtype):
    path, want = model
    out = tmp_path / "out.safetensors"
    zt.convert(path, out, dequantize=True, dtype=dtype)
    got = safetensors.numpy.load_file(str(out))
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        with np.errstate(all="ignore"):
            expected = value.astype(DTYPES[dtype])
        same(got[name], expected, (dtype, name))


def test_default_is_f32_and_the_cli_writes_the_same(model, tmp_path):
    path, want = model
    out = tmp_path / "f32.safetensors"
    zt.convert(path, out, dequantize=True)
    got = safetensors.numpy.load_file(str(out))
    for name, value in want.items():
        # Without a dtype a plain tensor keeps its own (the f16 one).
        same(got[name], value.astype(np.float16) if name == "half" else value, name)
    cli = tmp_path / "cli.safetensors"
    subprocess.run(
        [sys.executable, "-m", "zt", "convert", str(path), str(cli), "--dequantize", "--dtype", "bf16"],
        check=True,
        capture_output=True,
    )
    api = tmp_path / "api.safetensors"
    zt.convert(path, api, dequantize=True, dtype="bf16")
    assert cli.read_bytes() == api.read_bytes()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_load_file_dequantizes_to_dtype_as_convert_does(model, dtype):
    """``zt.numpy.load_file(dequantize=True, dtype=)`` gives GGUF's block
    types in ``dtype``, gguf-py's values rounded once (it once gave f32
    whatever ``dtype``), and casts the plain float tensors as convert does."""
    path, want = model
    got = zt.numpy.load_file(path, dequantize=True, dtype=dtype)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        with np.errstate(all="ignore"):
            expected = value.astype(DTYPES[dtype])
        same(got[name], expected, (dtype, name))


@pytest.mark.parametrize("dtype", [None, *DTYPES])
def test_load_bytes_dequantizes_to_dtype_as_load_file_does(model, dtype):
    """``zt.numpy.load(data, dequantize=True, dtype=)`` on a file's bytes:
    gguf-py's values rounded once to ``dtype`` (it once had no ``dtype``
    and gave f32); without one, f32 and the plain tensors as stored."""
    path, want = model
    got = zt.numpy.load(path.read_bytes(), dequantize=True, dtype=dtype)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        if dtype is None:
            expected = value.astype(np.float16) if name == "half" else value
        else:
            with np.errstate(all="ignore"):
                expected = value.astype(DTYPES[dtype])
        same(got[name], expected, (dtype, name))
    with pytest.raises(ValueError):
        zt.numpy.load(path.read_bytes(), dtype="bf16")


@pytest.mark.parametrize("mode", [{"copy": True}, {"readonly": True}, {"backend": "pread"}])
def test_load_file_dtype_holds_for_every_way_of_reading(model, mode):
    path, want = model
    got = zt.numpy.load_file(path, dequantize=True, dtype="bf16", **mode)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        with np.errstate(all="ignore"):
            expected = value.astype(ml_dtypes.bfloat16)
        same(got[name], expected, (mode, name))


def test_open_lists_dense_tensors_and_slices_read_rows(model):
    path, want = model
    with zt.open(path, dequantize=True, dtype="f32") as src:
        name = "q.Q4_K" if "q.Q4_K" in want else "q.Q8_0"
        t = src[name]
        assert t.layout == "dense" and t.shape == want[name].shape
        same(np.asarray(t.numpy()), want[name], name)


def test_types_gguf_py_cannot_dequantize_are_refused_before_output(tmp_path):
    _, nbytes = size(Q.Q8_K)
    path = tmp_path / "q8k.gguf"
    write(path, {"q": (np.zeros((2, nbytes), dtype=np.uint8), Q.Q8_K)})
    out = tmp_path / "out.safetensors"
    with pytest.raises(zt.FormatError, match="Q8_K") as info:
        zt.convert(path, out, dequantize=True, dtype="bf16")
    assert info.value.rule == "gguf.Dequant"
    assert not out.exists() and list(tmp_path.iterdir()) == [path]
