"""compressed-tensors NVFP4 (``nvfp4-pack-quantized``) dequantized (issue 41).

Fixtures are written by ``safetensors.numpy.save_file``. The expected values
replicate ``NVFP4PackedCompressor.decompress`` in numpy: the block scale
(float8_e4m3fn) divided by ``weight_global_scale`` in f32, times the e2m1
code's value (low nibble first) in f32, rounded once by ml_dtypes.
``tests/torch/test_quant_reference.py`` checks against compressed-tensors'
own decompressor.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from bitexact import same

import zt

FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
E4M3 = ml_dtypes.float8_e4m3fn


def reference(packed: np.ndarray, scale: np.ndarray, global_scale: np.ndarray) -> np.ndarray:
    rows, half = packed.shape
    values = np.empty((rows, half * 2), np.float32)
    values[:, 0::2] = FP4[packed & 0x0F]
    values[:, 1::2] = FP4[packed >> 4]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = scale.astype(np.float32) / global_scale.astype(np.float32)
        return (values.reshape(rows, -1, 16) * s[..., None]).reshape(rows, half * 2)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    rng = np.random.default_rng(41)
    d = tmp_path_factory.mktemp("nvfp4")
    packed = rng.integers(0, 256, (40, 48), dtype=np.uint8)
    packed.reshape(-1)[:256] = np.arange(256)
    scale = rng.integers(0, 0x7F, (40, 6), dtype=np.uint8)
    scale.reshape(-1)[:0x80] = np.arange(0x80)  # 0x7f: NaN
    p = "model.layers.0.self_attn.q_proj."
    tensors = {
        p + "weight_packed": packed,
        p + "weight_scale": scale.view(E4M3),
        p + "weight_global_scale": np.array([1.7e3], np.float32),
        p + "input_global_scale": np.array([2.0], np.float32),
        "model.norm.weight": rng.standard_normal(8, dtype=np.float32),
    }
    safetensors.numpy.save_file(tensors, str(d / "model.safetensors"))
    config = {"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}}
    (d / "config.json").write_text(json.dumps(config))
    return d / "model.safetensors", tensors


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_weights_as_decompress_computes_them(checkpoint, dtype):
    path, tensors = checkpoint
    np_dtype = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}[dtype]
    p = "model.layers.0.self_attn.q_proj."
    with zt.open(path, dequantize=True, dtype=dtype) as source:
        # The activation's global scale quantizes the layer's inputs at
        # inference: meaningless for the dequantized weight, it goes with it.
        assert sorted(source) == sorted([p + "weight", "model.norm.weight"])
        want = reference(tensors[p + "weight_packed"], tensors[p + "weight_scale"], tensors[p + "weight_global_scale"])
        with np.errstate(over="ignore"):
            want = want.astype(np_dtype)
        same(source[p + "weight"].numpy(), want)
        same(source[p + "weight"].numpy()[7:19], want[7:19])


def refused(tmp_path, tensors) -> str:
    path = tmp_path / "bad.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    with pytest.raises(zt.FormatError) as info:
        zt.open(path, dequantize=True)
    return info.value.rule


def test_tensors_that_disagree_are_refused(tmp_path):
    packed = np.zeros((4, 16), np.uint8)
    scale = np.zeros((4, 2), np.uint8).view(E4M3)
    g = np.ones(1, np.float32)
    ok = {"x.weight_packed": packed, "x.weight_scale": scale, "x.weight_global_scale": g}
    assert refused(tmp_path, {**ok, "x.weight_scale": np.zeros((4, 3), np.uint8).view(E4M3)}) == "quant.ScaleShape"
    assert refused(tmp_path, {**ok, "x.weight_packed": np.zeros((4, 12), np.uint8)}) == "quant.ScaleShape"
    assert refused(tmp_path, {**ok, "x.weight_global_scale": np.ones(2, np.float32)}) == "quant.ScaleShape"
    assert refused(tmp_path, {**ok, "x.weight_scale": np.zeros((4, 2), np.float32)}) == "quant.DType"
    assert refused(tmp_path, {**ok, "x.weight_global_scale": np.ones(1, np.float16)}) == "quant.DType"
    missing = dict(ok)
    del missing["x.weight_global_scale"]
    assert refused(tmp_path, missing) == "quant.Missing"
    path = tmp_path / "int4.safetensors"
    safetensors.numpy.save_file(ok, str(path))
    with pytest.raises(zt.FormatError) as info:
        zt.open(
            path,
            dequantize=True,
            quantization_config={"quant_method": "compressed-tensors", "format": "pack-quantized"},
        )
    assert info.value.rule == "quant.Scheme"
