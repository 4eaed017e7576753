"""Quantized safetensors schemes against their reference packages' own
code on CPU torch (issue 41): transformers' fine-grained FP8 dequantization
(``Fp8Dequantize._dequantize_one``, what ``from_pretrained`` runs on a
machine without a GPU, and ``_dequantize_fp8_weight`` in f32 for the
ragged grids ``_dequantize_one`` refuses), on checkpoints saved by
``safetensors.torch``. Compared bit for bit, NaN as NaN.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers_fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
from safetensors.torch import save_file  # noqa: E402

import zt  # noqa: E402


def same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.float()), nan)
    bits = {2: torch.int16, 4: torch.int32}[got.element_size()]
    assert torch.equal(got.view(bits)[~nan], want.view(bits)[~nan])


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
