"""zt.convert's dtype, select and rename options checked against torch:
casts bit for bit as torch rounds, and sharded and DCP sources converted to
what safetensors.torch reads back (the numpy-only option tests are in
tests/test_convert.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch

import zt

torch = pytest.importorskip("torch")


def _f32_patterns() -> np.ndarray:
    """f32 bit patterns across the whole space, subsampled by an odd stride
    (every exponent and sign, every residue of the bits a 16-bit cast
    drops), plus the edge cases: zeros, infinities, NaNs (quiet, signalling,
    negative), the largest finite, the smallest subnormal, and the ties
    either side of 1.0 for bf16 and f16."""
    sampled = np.arange(0, 1 << 32, 251, dtype=np.uint64).astype(np.uint32)
    edges = np.array(
        [
            0x00000000,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0x7F800001,
            0xFFFFFFFF,
            0x7F7FFFFF,
            0xFF7FFFFF,
            0x00000001,
            0x80000001,
            0x007FFFFF,
            0x3F808000,
            0x3F818000,
            0x3F807FFF,
            0x3F808001,  # bf16 ties and neighbours
            0x3F801000,
            0x3F803000,
            0x477FF000,
            0x477FEFFF,  # f16 ties, f16 overflow tie
            0x33000000,
            0x33000001,
            0x33C00000,  # f16 subnormal ties
        ],
        dtype=np.uint32,
    )
    return np.concatenate([edges, sampled]).view(np.float32)


def _same_bits(got, want) -> None:
    """Equal bit for bit, except that a NaN may be any NaN (as the decision
    on casts allows)."""

    assert got.dtype == want.dtype and got.shape == want.shape
    nan = torch.isnan(want.float())
    assert torch.equal(torch.isnan(got.float()), nan)
    bits = torch.int16 if want.element_size() == 2 else {4: torch.int32, 8: torch.int64}[want.element_size()]
    assert torch.equal(got[~nan].view(bits), want[~nan].view(bits))


@pytest.mark.parametrize("to", ["bf16", "f16"])
def test_cast_matches_torch_bit_for_bit(tmp, to):

    x = _f32_patterns()
    with np.errstate(invalid="ignore", over="ignore"):
        wide = x[: 1 << 20].astype(np.float64) * np.float64(1.0 + 2.0**-30)  # values f32 cannot hold
    safetensors.numpy.save_file({"x": x, "d": wide}, tmp / "a.safetensors")
    target = {"bf16": torch.bfloat16, "f16": torch.float16}[to]
    zt.convert(tmp / "a.safetensors", tmp / "b.safetensors", dtype=to)
    got = safetensors.torch.load_file(tmp / "b.safetensors")
    _same_bits(got["x"], torch.from_numpy(x).to(target))
    _same_bits(got["d"], torch.from_numpy(wide).to(target))
    if to == "f16":
        # numpy's own IEEE cast agrees off the NaNs.
        finite = ~np.isnan(x)
        with np.errstate(over="ignore"):
            assert np.array_equal(
                got["x"].numpy()[finite].view(np.uint16), x[finite].astype(np.float16).view(np.uint16)
            )
    # Widening back is exact.
    zt.convert(tmp / "b.safetensors", tmp / "c.safetensors", dtype=torch.float32)
    back = safetensors.torch.load_file(tmp / "c.safetensors")
    _same_bits(back["x"], got["x"].to(torch.float32))


def test_select_rename_dtype_to_a_sharded_checkpoint(tmp):

    g = torch.Generator().manual_seed(1)
    state = {
        "model.embed.weight": torch.randn(64, 32, generator=g),
        "model.layers.0.w": torch.randn(32, 32, generator=g, dtype=torch.float64),
        "model.layers.0.h": torch.randn(32, generator=g).to(torch.float16),
        "model.ids": torch.arange(-8, 8, dtype=torch.int64),
        "model.mask": torch.tensor([True, False, True]),
        "lm_head.weight": torch.randn(16, 32, generator=g),
        "optim.exp_avg": torch.randn(64, 32, generator=g),
    }
    safetensors.torch.save_file(state, tmp / "ckpt.safetensors")
    zt.convert(
        tmp / "ckpt.safetensors",
        tmp / "out.safetensors",
        max_shard_size=4096,
        select=["model.*", "lm_head.*"],
        rename="model.",
        dtype="bf16",
    )
    index = tmp / "out.safetensors.index.json"

    files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    assert len(files) > 1
    got = {}
    for name in files:
        got.update(safetensors.torch.load_file(tmp / name))
    expect = {}
    for k, v in state.items():
        if k.startswith("optim."):
            continue
        name = k.removeprefix("model.")
        expect[name] = v.to(torch.bfloat16) if v.is_floating_point() else v
    assert sorted(got) == sorted(expect)
    for k, v in expect.items():
        assert got[k].dtype == v.dtype, k
        _same_bits(got[k], v) if v.is_floating_point() else torch.testing.assert_close(got[k], v, rtol=0, atol=0)
    # A mapping renames exact names; the rest keep theirs.
    zt.convert(
        tmp / "ckpt.safetensors",
        tmp / "m.safetensors",
        select="lm_head.*",
        rename={"lm_head.weight": "output.weight"},
    )
    assert list(safetensors.torch.load_file(tmp / "m.safetensors")) == ["output.weight"]


def test_dcp_select_rename_dtype_to_sharded_safetensors(tmp):
    dcp = pytest.importorskip("torch.distributed.checkpoint")

    g = torch.Generator().manual_seed(2)
    w = torch.randn(48, 16, generator=g)
    state = {
        "model": {
            "w": w,
            "w_t": torch.randn(8, 12, generator=g).t(),  # saved with its strides
            "h": torch.randn(5, generator=g).to(torch.float16),
            "ids": torch.arange(6, dtype=torch.int64),
        },
        "optim": {"state": {"w": {"exp_avg": w * 0.5}}, "step": 7},
    }
    dcp.save(state, checkpoint_id=tmp / "ckpt")
    (tmp / "out").mkdir()
    zt.convert(
        tmp / "ckpt",
        tmp / "out" / "model.safetensors",
        max_shard_size=1024,
        select="model.*",
        rename="model.",
        dtype="bf16",
    )
    index = json.loads((tmp / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2
    got = {}
    for name in sorted(set(index["weight_map"].values())):
        got.update(safetensors.torch.load_file(tmp / "out" / name))
    expect = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in state["model"].items()}
    assert sorted(got) == sorted(expect)
    for k, v in expect.items():
        assert got[k].dtype == v.dtype, k
        if v.is_floating_point():
            _same_bits(got[k], v.contiguous())
        else:
            assert torch.equal(got[k], v), k
