"""MLX's quantized weights against MLX itself (issue 41): ``mlx`` (its Linux
CPU wheel, ``mlx[cpu]``, pinned in requirements-dev.txt) quantizes random
matrices and small ``mlx.nn`` models with ``mx.quantize`` / ``nn.quantize``
and saves them with ``mx.save_safetensors`` beside a ``config.json`` as
mlx-lm writes it; zt's dequantization is compared bit for bit with
``mx.dequantize`` computing in f32 and with the single-rounding numpy
reference of ``test_quant_mlx.py``.

Where the scales are f16 or bf16, ``mx.dequantize`` computes in that type
(the product and the sum each rounded); zt computes in f32 and rounds once,
as every other scheme's reference does, so the f32 comparison casts the
scales and biases to f32 first, and the f16/bf16 outputs are compared with
the f32 result rounded once.
"""

from __future__ import annotations

import json

import gguf
import ml_dtypes
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
import safetensors.numpy
from bitexact import same
from mlx.utils import tree_flatten
from mlx_reference import reference

import zt

MX_DTYPES = {"f32": mx.float32, "f16": mx.float16, "bf16": mx.bfloat16}
NP_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def np_of(a: mx.array) -> np.ndarray:
    """An MLX array as numpy, bf16 through its bits."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(ml_dtypes.bfloat16)
    return np.array(a)


def save(d, arrays: dict[str, mx.array], quantization: dict) -> str:
    d.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(d / "model.safetensors"), arrays, metadata={"format": "mlx"})
    config = {"model_type": "llama", "quantization": quantization, "quantization_config": quantization}
    (d / "config.json").write_text(json.dumps(config))
    return str(d / "model.safetensors")


@pytest.mark.parametrize("scale_dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 8])
def test_affine_as_mx_quantize_writes_it(tmp_path, bits, scale_dtype):
    mx.random.seed(bits)
    for group in [32, 64, 128]:
        w = (mx.random.normal((3, 40, 256)) * 0.1).astype(MX_DTYPES[scale_dtype])
        wq, s, b = mx.quantize(w, group_size=group, bits=bits)
        name = "model.layers.0.mlp.switch_mlp.up_proj"
        arrays = {name + ".weight": wq, name + ".scales": s, name + ".biases": b}
        path = save(tmp_path / str(group), arrays, {"group_size": group, "bits": bits, "mode": "affine"})
        want = reference(np.array(wq), np_of(s), np_of(b), "affine", bits, group)
        mlx_f32 = mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=group, bits=bits)
        same(np.array(mlx_f32), want)
        for dtype in ["f32", "bf16", "f16"]:
            with zt.open(path, dequantize=True, dtype=dtype) as source:
                same(source[name + ".weight"].numpy(), want.astype(NP_DTYPES[dtype]))


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "nvfp4"])
def test_float_modes_as_mx_dequantize(tmp_path, mode):
    mx.random.seed(4)
    w = mx.random.normal((64, 512)) * 3
    wq, s = mx.quantize(w, mode=mode)
    # Every scale byte too: e8m0's 0 and 255, e4m3's NaN codes.
    s_all = mx.array(np.resize(np.arange(256, dtype=np.uint8), s.shape))
    group, bits = {"mxfp4": (32, 4), "mxfp8": (32, 8), "nvfp4": (16, 4)}[mode]
    for i, scales in enumerate([s, s_all]):
        arrays = {"lm_head.weight": wq, "lm_head.scales": scales}
        path = save(tmp_path / str(i), arrays, {"group_size": group, "bits": bits, "mode": mode})
        want = np.array(mx.dequantize(wq, scales, mode=mode, dtype=mx.float32))
        same(want, reference(np.array(wq), np.array(scales), None, mode, bits, group))
        for dtype in ["f32", "bf16"]:
            with zt.open(path, dequantize=True, dtype=dtype) as source:
                with np.errstate(over="ignore"):
                    same(source["lm_head.weight"].numpy(), want.astype(NP_DTYPES[dtype]))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(96, 128)
        self.q_proj = nn.Linear(128, 256, bias=True)
        self.down_proj = nn.Linear(256, 128, bias=False)
        self.norm = nn.RMSNorm(128)


def quantized_model(d, override: bool) -> tuple[str, dict[str, mx.array]]:
    """A small model as mlx-lm quantizes one: cast to f16, nn.quantize with
    group 32 / 4 bits (down_proj 8 bits, group 64, when ``override``)."""
    mx.random.seed(41)
    model = Tiny()
    model.set_dtype(mx.float16)
    layers = {"down_proj": {"group_size": 64, "bits": 8}} if override else {}

    def predicate(path, module):
        return layers.get(path, hasattr(module, "to_quantized"))

    nn.quantize(model, group_size=32, bits=4, class_predicate=predicate)
    arrays = dict(tree_flatten(model.parameters()))
    mx.eval(arrays)
    return save(d, arrays, {"group_size": 32, "bits": 4, **layers}), arrays


def test_an_nn_quantize_model_dequantized(tmp_path):
    path, arrays = quantized_model(tmp_path, override=True)
    with zt.open(path, dequantize=True) as source:
        assert sorted(source) == sorted(n for n in arrays if not n.endswith((".scales", ".biases")))
        for base, (bits, group) in {"embed_tokens": (4, 32), "q_proj": (4, 32), "down_proj": (8, 64)}.items():
            wq, s, b = (arrays[f"{base}.{k}"] for k in ["weight", "scales", "biases"])
            want = mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=group, bits=bits)
            same(source[base + ".weight"].numpy(), np.array(want))
        same(source["q_proj.bias"].numpy(), np_of(arrays["q_proj.bias"]))


def test_an_nn_quantize_model_through_gguf_and_back(tmp_path):
    path, arrays = quantized_model(tmp_path / "mlx", override=False)
    out = tmp_path / "model.gguf"
    zt.convert(path, out)
    reader = gguf.GGUFReader(str(out))
    for t in reader.tensors:
        if t.name.endswith(".weight") and t.name != "norm.weight":
            assert t.tensor_type == gguf.GGMLQuantizationType.Q4_1, t.name
            base = t.name.removesuffix(".weight")
            wq, s, b = (arrays[f"{base}.{k}"] for k in ["weight", "scales", "biases"])
            want = mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=32, bits=4)
            same(gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.Q4_1), np.array(want))
    back = tmp_path / "back" / "model.safetensors"
    back.parent.mkdir()
    zt.convert(out, back, layout="mlx")
    # MLX loads what zt wrote, every array as nn.quantize left it.
    loaded = mx.load(str(back))
    assert sorted(loaded) == sorted(arrays)
    for name, a in arrays.items():
        assert loaded[name].dtype == a.dtype and np.array_equal(np_of(loaded[name]), np_of(a)), name
    assert safetensors.numpy.load_file(str(back)).keys() == safetensors.numpy.load_file(path).keys()


@pytest.mark.parametrize("mode", ["mxfp4", "mxfp8", "nvfp4"])
def test_an_nn_quantize_model_in_float_modes(tmp_path, mode):
    """nn.quantize(mode=...) writes weight and scales only (mlx.nn keeps no
    NVFP4 global scale); every layer dequantized as mx.dequantize gives."""
    mx.random.seed(5)
    model = Tiny()
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, mode=mode)
    arrays = dict(tree_flatten(model.parameters()))
    mx.eval(arrays)
    path = save(tmp_path, arrays, {"mode": mode})
    with zt.open(path, dequantize=True) as source:
        assert sorted(source) == sorted(n for n in arrays if not n.endswith(".scales"))
        for base in ["embed_tokens", "q_proj", "down_proj"]:
            want = mx.dequantize(arrays[base + ".weight"], arrays[base + ".scales"], mode=mode, dtype=mx.float32)
            same(source[base + ".weight"].numpy(), np.array(want))
