"""Quantized safetensors schemes against their reference packages' own
code on CPU torch (issue 41): transformers' fine-grained FP8 dequantization
(``Fp8Dequantize._dequantize_one``, what ``from_pretrained`` runs on a
machine without a GPU, and ``_dequantize_fp8_weight`` in f32 for the
ragged grids ``_dequantize_one`` refuses), on checkpoints saved by
``safetensors.torch``. Compared bit for bit, NaN as NaN.
"""

from __future__ import annotations

import json

import bitexact
import ml_dtypes
import numpy as np
import pytest
import torch

transformers_fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
from safetensors.torch import save_file  # noqa: E402

import zt  # noqa: E402


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor's values as numpy holds them (torch's bfloat16, which
    numpy lacks, as ml_dtypes' over the same bits)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit, NaN where the reference has NaN: tests/bitexact.py's
    comparison, on the tensors' numpy views."""
    bitexact.same(as_numpy(got), as_numpy(want))


def fp8_weight(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Every e4m3fn code (NaN 0x7f/0xff among them), then random ones."""
    codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    n = min(256, codes.numel())
    codes.view(-1)[:n] = torch.arange(n, dtype=torch.uint8)
    return codes.view(torch.float8_e4m3fn)


def fp8_scales(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    s = torch.rand(shape, generator=gen) * 2e-3 + 1e-5
    specials = torch.tensor([3.0e38, 1e-40, 0.0, float("inf"), float("nan")])
    n = min(s.numel(), len(specials))
    s.view(-1)[:n] = specials[:n]
    return s


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fp8_blocks_match_transformers(tmp_path, dtype):
    gen = torch.Generator().manual_seed(41)
    # Whole blocks (what _dequantize_one takes) and ragged edges (what
    # _dequantize_fp8_weight takes, as DeepSeek's weight_dequant does).
    whole = {
        "a.weight": fp8_weight(gen, (256, 384)),
        "a.weight_scale_inv": fp8_scales(gen, (2, 3)),
        "e.weight": fp8_weight(gen, (3, 128, 256)),
        "e.weight_scale_inv": fp8_scales(gen, (3, 1, 2)),
    }
    ragged = {
        "r.weight": fp8_weight(gen, (300, 200)),
        "r.weight_scale_inv": fp8_scales(gen, (3, 2)),
        "x.weight": fp8_weight(gen, (2, 130, 257)),
        "x.weight_scale_inv": fp8_scales(gen, (2, 2, 3)),
    }
    path = tmp_path / "model.safetensors"
    save_file({**whole, **ragged, "norm.weight": torch.ones(4, dtype=torch.bfloat16)}, str(path))
    (tmp_path / "config.json").write_text(
        json.dumps({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}})
    )
    op = transformers_fp8.Fp8Dequantize(hf_quantizer=None)
    name = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}[dtype]
    got = zt.torch.load_file(path, dequantize=True, dtype=name)
    assert sorted(got) == ["a.weight", "e.weight", "norm.weight", "r.weight", "x.weight"]
    for w in ("a.weight", "e.weight"):
        want = op._dequantize_one(whole[w], whole[w + "_scale_inv"], output_dtype=dtype)
        same(got[w], want)
    for w in ("r.weight", "x.weight"):
        f32 = transformers_fp8._dequantize_fp8_weight(ragged[w], ragged[w + "_scale_inv"], [128, 128], torch.float32)
        same(got[w], f32.to(dtype))
    same(got["norm.weight"], torch.ones(4, dtype=torch.bfloat16).to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpt_oss_mxfp4_matches_convert_moe_packed_tensors(tmp_path, dtype):
    """gpt-oss expert tensors (``*_blocks`` u8 codes, ``*_scales`` u8 e8m0)
    listed as transformers' ``convert_moe_packed_tensors`` returns them:
    every code, every scale exponent (0 and 255, infinity, among them)."""
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    gen = torch.Generator().manual_seed(41)
    blocks = torch.randint(0, 256, (2, 16, 8, 16), generator=gen, dtype=torch.uint8)
    blocks.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    scales = torch.randint(118, 136, (2, 16, 8), generator=gen, dtype=torch.uint8)
    scales.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    down = torch.randint(0, 256, (2, 24, 1, 16), generator=gen, dtype=torch.uint8)
    down_scales = torch.randint(120, 130, (2, 24, 1), generator=gen, dtype=torch.uint8)
    prefix = "model.layers.0.mlp.experts."
    tensors = {
        prefix + "gate_up_proj_blocks": blocks,
        prefix + "gate_up_proj_scales": scales,
        prefix + "gate_up_proj_bias": torch.randn(2, 16, generator=gen),
        prefix + "down_proj_blocks": down,
        prefix + "down_proj_scales": down_scales,
        "model.layers.0.mlp.router.weight": torch.randn(2, 4, generator=gen).to(torch.bfloat16),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "mxfp4"}}))
    name = {torch.bfloat16: "bf16", torch.float32: "f32"}[dtype]
    got = zt.torch.load_file(path, dequantize=True, dtype=name)
    assert sorted(got) == sorted(
        [
            prefix + "gate_up_proj",
            prefix + "gate_up_proj_bias",
            prefix + "down_proj",
            "model.layers.0.mlp.router.weight",
        ]
    )
    for proj in ("gate_up_proj", "down_proj"):
        want = mxfp4.convert_moe_packed_tensors(
            tensors[prefix + proj + "_blocks"], tensors[prefix + proj + "_scales"], dtype=dtype
        )
        same(got[prefix + proj], want)
    same(got[prefix + "gate_up_proj_bias"], tensors[prefix + "gate_up_proj_bias"].to(dtype))


def test_compressed_tensors_nvfp4_matches_decompress(tmp_path):
    """NVFP4 (``nvfp4-pack-quantized``) as compressed-tensors writes it:
    a bf16 weight packed by ``NVFP4PackedCompressor.compress`` and one of
    raw random bytes (every code; every finite e4m3 scale, zero among them),
    each compared with ``NVFP4PackedCompressor.decompress``."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    gen = torch.Generator().manual_seed(41)
    weight = torch.randn(48, 96, generator=gen).to(torch.bfloat16)
    global_scale = (448.0 * 6.0 / weight.float().abs().max()).reshape(1)
    block_amax = weight.float().reshape(48, 6, 16).abs().amax(-1)
    packed = NVFP4PackedCompressor.compress(
        {"weight": weight, "weight_scale": block_amax / 6.0 * global_scale, "weight_global_scale": global_scale},
        scheme,
    )
    raw_codes = torch.randint(0, 256, (32, 64), generator=gen, dtype=torch.uint8)
    raw_codes.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    raw_scales = torch.randint(0, 0x7F, (32, 8), generator=gen, dtype=torch.uint8)
    raw_scales.view(-1)[:0x7F] = torch.arange(0x7F, dtype=torch.uint8)
    raw = {
        "weight_packed": raw_codes,
        "weight_scale": raw_scales.view(torch.float8_e4m3fn),
        "weight_global_scale": torch.tensor([3.7e-3]),
    }
    tensors = {f"model.layers.0.mlp.down_proj.{k}": v for k, v in packed.items()}
    tensors.update({f"model.layers.0.mlp.up_proj.{k}": v for k, v in raw.items()})
    tensors["model.norm.weight"] = torch.ones(8, dtype=torch.bfloat16)
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    config = {"quantization_config": {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    got = zt.torch.load_file(path, dequantize=True, dtype="bf16")
    assert sorted(got) == [
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.norm.weight",
    ]
    same(got["model.layers.0.mlp.down_proj.weight"], NVFP4PackedCompressor.decompress(packed, scheme)["weight"])
    same(got["model.layers.0.mlp.up_proj.weight"], NVFP4PackedCompressor.decompress(raw, scheme)["weight"])


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16])
def test_compressed_tensors_float_quantized_matches_decompress(tmp_path, scale_dtype):
    """FP8 as compressed-tensors' ``float-quantized`` format writes it: a
    ``weight_scale`` per tensor (``[1]``, the ``FP8`` preset, with its
    static ``input_scale``) and one per row (``[rows, 1]``, the
    ``FP8_DYNAMIC`` preset), weights quantized by
    ``FloatQuantizationCompressor.compress``, each compared with its
    ``decompress`` (in the scale's dtype, as it returns it); the
    activation scale is consumed with its weight."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    gen = torch.Generator().manual_seed(41)
    weight = (torch.randn(64, 160, generator=gen) * 3).to(torch.bfloat16)
    tensor_scheme = preset_name_to_scheme("FP8", ["Linear"])
    channel_scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    amax = weight.float().abs()
    per_tensor = (amax.max() / 448.0).reshape(1).to(scale_dtype)
    per_row = (amax.amax(dim=1, keepdim=True) / 448.0).to(scale_dtype)
    q = FloatQuantizationCompressor.compress({"weight": weight, "weight_scale": per_tensor}, tensor_scheme)
    c = FloatQuantizationCompressor.compress({"weight": weight, "weight_scale": per_row}, channel_scheme)
    assert q["weight"].dtype == torch.float8_e4m3fn and q["weight_scale"].shape == (1,)
    assert c["weight_scale"].shape == (64, 1)
    tensors = {f"model.q_proj.{k}": v for k, v in q.items()}
    tensors["model.q_proj.input_scale"] = torch.tensor([0.02], dtype=scale_dtype)
    tensors.update({f"model.o_proj.{k}": v for k, v in c.items()})
    tensors["model.norm.weight"] = torch.ones(8, dtype=torch.bfloat16)
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {"format": "float-quantized", "weights": {"num_bits": 8, "type": "float"}}},
        }
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    name = {torch.float32: "f32", torch.bfloat16: "bf16"}[scale_dtype]
    got = zt.torch.load_file(path, dequantize=True, dtype=name)
    assert sorted(got) == ["model.norm.weight", "model.o_proj.weight", "model.q_proj.weight"]
    same(got["model.q_proj.weight"], FloatQuantizationCompressor.decompress(q, tensor_scheme)["weight"])
    same(got["model.o_proj.weight"], FloatQuantizationCompressor.decompress(c, channel_scheme)["weight"])
    # Without dequantize nothing changes: the scales are listed.
    with zt.open(path) as src:
        listed = set(src.keys())
    assert {"model.q_proj.input_scale", "model.o_proj.weight_scale"} <= listed


@pytest.mark.parametrize("shape", [(), (1,)])
def test_fp8_per_tensor_scale_inv_matches_transformers(tmp_path, shape):
    """A per-tensor ``weight_scale_inv`` (transformers' FP8 with
    ``weight_block_size: null``): ``_dequantize_fp8_weight`` with no block
    size multiplies the whole weight by it, in f32, rounded once to bf16;
    a 3-D expert weight under one scale too."""
    gen = torch.Generator().manual_seed(7)
    tensors = {
        "a.weight": fp8_weight(gen, (96, 200)),
        "a.weight_scale_inv": torch.tensor(3.5e-3).reshape(shape),
        "e.weight": fp8_weight(gen, (2, 40, 72)),
        "e.weight_scale_inv": torch.tensor(0.75).reshape(shape),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": None}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    got = zt.torch.load_file(path, dequantize=True, dtype="bf16")
    assert sorted(got) == ["a.weight", "e.weight"]
    for w in ("a.weight", "e.weight"):
        f32 = transformers_fp8._dequantize_fp8_weight(tensors[w], tensors[w + "_scale_inv"], None, torch.float32)
        same(got[w], f32.to(torch.bfloat16))


def test_nvfp4_scalar_global_scale_and_input_scales(tmp_path):
    """An NVFP4 ``weight_global_scale`` of shape ``[]`` is the same one
    value as the ``[1]`` compressed-tensors writes, and dequantizes as that
    does: equal to ``decompress`` given it as ``[1]``. (``decompress`` handed
    the 0-dim tensor itself divides its bf16 block scales in bf16, since
    torch does not promote past a 0-dim operand, and so rounds twice; zt
    computes in f32 and rounds once, as for ``[1]``.) The activations'
    ``input_global_scale`` is consumed with the weight."""
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    gen = torch.Generator().manual_seed(5)
    raw = {
        "weight_packed": torch.randint(0, 256, (16, 32), generator=gen, dtype=torch.uint8),
        "weight_scale": torch.randint(0, 0x7F, (16, 4), generator=gen, dtype=torch.uint8).view(torch.float8_e4m3fn),
        "weight_global_scale": torch.tensor(3.7e-3),
    }
    tensors = {f"l.{k}": v for k, v in raw.items()}
    tensors["l.input_global_scale"] = torch.tensor([12.5])
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    got = zt.torch.load_file(path, dequantize=True, dtype="bf16")
    assert sorted(got) == ["l.weight"]
    as_written = {**raw, "weight_global_scale": raw["weight_global_scale"].reshape(1)}
    same(got["l.weight"], NVFP4PackedCompressor.decompress(as_written, scheme)["weight"])
