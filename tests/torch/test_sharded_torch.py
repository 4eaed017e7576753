"""Sharded checkpoints written by zt.torch.save_file and `zt convert`, loaded
by huggingface_hub's sharded loader (`load_torch_model`, what
`from_pretrained` does for a directory): the split is
`split_torch_state_dict_into_shards`'s and the tensors come back identical."""

from __future__ import annotations

import json
import subprocess

import pytest

import zt
import zt.torch

torch = pytest.importorskip("torch")
from huggingface_hub import load_torch_model, split_torch_state_dict_into_shards  # noqa: E402
from torch import nn  # noqa: E402


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Embedding(50, 16), nn.Linear(16, 48), nn.LayerNorm(48), nn.Linear(48, 16, bias=False), nn.Linear(16, 50)
    ).to(torch.bfloat16)


@pytest.mark.parametrize("name, safe", [("model.safetensors", True), ("pytorch_model.bin", False)])
def test_huggingface_hub_loads_what_zt_sharded(tmp, name, safe):
    model = make_model(0)
    state = model.state_dict()
    zt.torch.save_file(state, tmp / name, max_shard_size=3000)
    split = split_torch_state_dict_into_shards(
        state, max_shard_size=3000, filename_pattern=name.replace(".", "{suffix}.", 1)
    )
    index = json.loads((tmp / f"{name}.index.json").read_text())
    assert index["weight_map"] == split.tensor_to_filename
    assert index["metadata"]["total_size"] == split.metadata["total_size"]
    fresh = make_model(1)
    result = load_torch_model(fresh, tmp, strict=True, safe=safe)
    assert not result.missing_keys and not result.unexpected_keys
    for key, want in state.items():
        got = fresh.state_dict()[key]
        assert got.dtype == want.dtype and torch.equal(got, want), key


def test_directory_conversion_loads_in_huggingface_hub(tmp, zt_cli):
    model = make_model(2)
    src = tmp / "src"
    src.mkdir()
    zt.torch.save_file(model.state_dict(), src / "pytorch_model.bin", max_shard_size=4000)
    out = tmp / "out"
    done = subprocess.run([zt_cli, "convert", src, out, "--max-shard-size", "3KB"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fresh = make_model(3)
    load_torch_model(fresh, out, strict=True)
    for key, want in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], want), key
