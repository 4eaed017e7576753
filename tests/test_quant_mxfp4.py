"""gpt-oss MXFP4 expert tensors dequantized (issue 41).

Fixtures are written by ``safetensors.numpy.save_file``. The expected values
replicate transformers' ``convert_moe_packed_tensors`` in numpy: each e2m1
code's value (``FP4_VALUES``, low nibble first) times ``2^(scale - 127)`` by
``ldexp`` (as ``torch.ldexp``: exact, infinite where it overflows, zero
staying zero), rounded once by ml_dtypes, the ``[experts, rows, values]`` result transposed
to ``[experts, values, rows]``. ``tests/torch/test_quant_reference.py``
checks against transformers' own function.
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


def reference(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    experts, rows, groups, width = blocks.shape
    values = np.empty((experts, rows, groups, width * 2), np.float32)
    values[..., 0::2] = FP4[blocks & 0x0F]
    values[..., 1::2] = FP4[blocks >> 4]
    with np.errstate(over="ignore"):
        out = np.ldexp(values, (scales.astype(np.int32) - 127)[..., None]).astype(np.float32)
    return out.reshape(experts, rows, groups * width * 2).transpose(0, 2, 1)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    rng = np.random.default_rng(41)
    d = tmp_path_factory.mktemp("mxfp4")
    blocks = rng.integers(0, 256, (2, 16, 8, 16), dtype=np.uint8)
    blocks.reshape(-1)[:256] = np.arange(256)
    scales = rng.integers(118, 136, (2, 16, 8), dtype=np.uint8)
    scales.reshape(-1)[:256] = np.arange(256)
    p = "model.layers.0.mlp.experts."
    tensors = {
        p + "gate_up_proj_blocks": blocks,
        p + "gate_up_proj_scales": scales,
        p + "gate_up_proj_bias": rng.standard_normal((2, 16), dtype=np.float32),
        p + "down_proj_blocks": rng.integers(0, 256, (2, 130, 1, 16), dtype=np.uint8),
        p + "down_proj_scales": rng.integers(120, 130, (2, 130, 1), dtype=np.uint8),
    }
    safetensors.numpy.save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "mxfp4"}}))
    return d / "model.safetensors", tensors


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_experts_as_the_parameters_are(gpt_oss, dtype):
    path, tensors = gpt_oss
    np_dtype = {"bf16": ml_dtypes.bfloat16, "f32": np.float32}[dtype]
    p = "model.layers.0.mlp.experts."
    with zt.open(path, dequantize=True, dtype=dtype) as source:
        assert sorted(source) == sorted([p + "gate_up_proj", p + "gate_up_proj_bias", p + "down_proj"])
        for proj in ("gate_up_proj", "down_proj"):
            want = reference(tensors[p + proj + "_blocks"], tensors[p + proj + "_scales"]).astype(np_dtype)
            same(source[p + proj].numpy(), want)
        # A slice of one expert reads that expert's blocks.
        want = reference(tensors[p + "down_proj_blocks"], tensors[p + "down_proj_scales"]).astype(np_dtype)
        same(source[p + "down_proj"].numpy()[1, 3:20], want[1, 3:20])


def test_convert_writes_the_parameters(gpt_oss, tmp_path):
    path, tensors = gpt_oss
    out = tmp_path / "bf16.safetensors"
    zt.convert(path, out, dequantize=True, dtype="bf16")
    got = safetensors.numpy.load_file(str(out))
    p = "model.layers.0.mlp.experts."
    want = reference(tensors[p + "gate_up_proj_blocks"], tensors[p + "gate_up_proj_scales"])
    same(got[p + "gate_up_proj"], want.astype(ml_dtypes.bfloat16))


def refused(tmp_path, tensors, config=None) -> str:
    path = tmp_path / "bad.safetensors"
    safetensors.numpy.save_file(tensors, str(path))
    with pytest.raises(zt.FormatError) as info:
        zt.open(path, dequantize=True, quantization_config=config)
    return info.value.rule


def test_blocks_and_scales_that_disagree_are_refused(tmp_path):
    u8 = np.zeros
    blocks = u8((2, 4, 3, 16), np.uint8)
    assert refused(tmp_path, {"e_blocks": blocks, "e_scales": u8((2, 4, 2), np.uint8)}) == "quant.ScaleShape"
    assert refused(tmp_path, {"e_blocks": blocks, "e_scales": u8((2, 4, 3, 1), np.uint8)}) == "quant.ScaleShape"
    assert refused(tmp_path, {"e_blocks": u8((4, 3, 16), np.uint8), "e_scales": u8((4, 3), np.uint8)}) == (
        "quant.ScaleShape"
    )
    assert refused(tmp_path, {"e_blocks": blocks.astype(np.int8), "e_scales": u8((2, 4, 3), np.uint8)}) == (
        "quant.DType"
    )
    assert refused(tmp_path, {"e_blocks": blocks, "e_scales": u8((2, 4, 3), np.float32)}) == "quant.DType"
    mxfp4 = {"quant_method": "mxfp4"}
    assert refused(tmp_path, {"e_scales": u8((2, 4, 3), np.uint8)}, mxfp4) == "quant.Missing"
    assert refused(tmp_path, {"e_blocks": blocks}, mxfp4) == "quant.Missing"
    # Without a configuration, `_scales` alone is left as it is.
    safetensors.numpy.save_file({"e_scales": u8((2, 4, 3), np.uint8)}, str(tmp_path / "plain.safetensors"))
    with zt.open(tmp_path / "plain.safetensors", dequantize=True) as source:
        assert list(source) == ["e_scales"]
