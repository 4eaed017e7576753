"""The PyTorch suite: needs torch itself (requirements-torch.txt; scripts/test.sh
installs it). torch.load reads what zt writes, zt reads what torch.save
writes (checked bit for bit against torch.load on files made at test time),
and zt.torch round trips."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

import zt

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.bool,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
]

TYPED = DTYPES[:9] + [torch.bool, torch.complex64, torch.complex128]


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def sample(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).clamp(-4, 4).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def flatten(obj, prefix=""):
    join = (lambda k: f"{prefix}.{k}") if prefix else str
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from flatten(v, join(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from flatten(v, join(i))


def assert_same(path, expected: dict):
    with zt.open(path) as src:
        assert sorted(src) == sorted(expected)
        for name, t in expected.items():
            got = src[name]
            assert list(got.shape) == list(t.shape), name
            assert got.tobytes() == raw(t), name


# --- torch.load reads what zt writes -------------------------------------------


@pytest.mark.parametrize("mmap", [False, True])
def test_torch_loads_zt_output_every_dtype(tmp, mmap):
    tensors = {f"layer.{i}.{str(d).split('.')[1]}": sample(d, (3, 5), seed=i) for i, d in enumerate(DTYPES)}
    tensors["scalar"] = torch.tensor(7.5)
    tensors["empty"] = torch.zeros(0, 4)
    tensors["big_dim"] = torch.arange(70_000, dtype=torch.int32)
    path = tmp / "zt.pt"
    zt.torch.save_file(tensors, path)
    loaded = torch.load(path, weights_only=True, mmap=mmap)
    assert isinstance(loaded, dict) and list(loaded) == list(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype, name
        assert loaded[name].shape == t.shape, name
        assert raw(loaded[name]) == raw(t), name


def test_torch_loads_numpy_save_file_and_convert(tmp):
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.array([True, False])}
    zt.numpy.save_file(arrays, tmp / "np.pth")
    loaded = torch.load(tmp / "np.pth", weights_only=True)
    np.testing.assert_array_equal(loaded["w"].numpy(), arrays["w"])
    np.testing.assert_array_equal(loaded["b"].numpy(), arrays["b"])
    # convert: a torch checkpoint with views -> .bin -> torch.load
    base = torch.arange(30.0).reshape(5, 6)
    torch.save({"t": base.t(), "row": base[2], "base": base}, tmp / "views.pt")
    zt.convert(tmp / "views.pt", tmp / "out.bin")
    back = torch.load(tmp / "out.bin", weights_only=True)
    assert torch.equal(back["t"], base.t()) and torch.equal(back["row"], base[2])
    assert back["t"].is_contiguous()


# --- zt reads what torch.save writes ---------------------------------------------


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.bn = nn.BatchNorm1d(3)
        self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(3)])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["zip", "legacy", "protocol4"])
def test_zt_matches_torch_load(tmp, seed, kind):
    """Random checkpoints: every dtype, views, nesting, optimizer state."""
    g = torch.Generator().manual_seed(seed)
    # torch.load cannot read its own legacy files of the dtypes it saves as
    # untyped storages (fp8, uint16/32/64); leave those out there.
    pool = [d for d in DTYPES if kind != "legacy" or d in TYPED]
    dtype = pool[seed * 3 % len(pool)]
    base = sample(dtype, (7, 6), seed)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4, generator=g)).sum().backward()
    opt.step()
    obj = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "views": [base, base.t(), base[1:5:2, ::2], base[3], base.reshape(-1)[5:17].reshape(3, 4)],
        "more": {i: sample(pool[(seed + i) % len(pool)], (i + 1, 2), seed + i) for i in range(4)},
        "step": seed,
    }
    path = tmp / "c.pt"
    kwargs = {"_use_new_zipfile_serialization": False} if kind == "legacy" else {}
    if kind == "protocol4":
        kwargs["pickle_protocol"] = 4
    torch.save(obj, path, **kwargs)
    loaded = torch.load(path, weights_only=kind != "protocol4")
    assert_same(path, dict(flatten(loaded)))
    with zt.open(path) as src:
        assert src.attributes["step"] == seed


def test_torch_save_of_a_module(tmp):
    torch.manual_seed(0)
    model = Small()
    torch.save(model, tmp / "m.pt")
    assert_same(tmp / "m.pt", model.state_dict())


def test_torch_save_of_a_storage_shared_dict(tmp):
    w = torch.randn(4, 4)
    torch.save({"a": w, "b": w, "c": w[1:]}, tmp / "s.pt")
    with zt.open(tmp / "s.pt") as src:
        assert src["a"].location == src["b"].location
        assert src["c"].location[1] == src["a"].location[1] + 16
    assert_same(tmp / "s.pt", {"a": w, "b": w, "c": w[1:]})


def test_torch_load_refuses_what_zt_refuses_too(tmp):
    """A pickled payload: torch.load(weights_only=True) refuses it, zt reads
    the tensors around it and runs nothing."""
    marker = tmp / "pwned"

    class Evil:
        def __reduce__(self):
            import os

            return os.system, (f"touch {marker}",)

    t = torch.arange(4.0)
    torch.save({"w": t, "evil": Evil()}, tmp / "e.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp / "e.pt", weights_only=True)
    assert_same(tmp / "e.pt", {"w": t})
    assert not marker.exists()


# --- zt.torch round trips ----------------------------------------------------


@pytest.mark.parametrize("ext", ["pt", "safetensors"])
def test_zt_torch_round_trip(tmp, ext):
    common = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int64, torch.uint8, torch.bool)
    tensors = {str(d): sample(d, (2, 3)) for d in DTYPES if ext == "pt" or d in common}
    path = tmp / f"rt.{ext}"
    zt.torch.save_file(tensors, path)
    for copy in (True, False):
        back = zt.torch.load_file(path, copy=copy)
        for name, t in tensors.items():
            assert back[name].dtype == t.dtype, name
            assert hashlib.sha256(raw(back[name])).digest() == hashlib.sha256(raw(t)).digest(), name


def test_zt_torch_load_file_of_a_torch_checkpoint(tmp):
    base = torch.randn(6, 4)
    torch.save({"w": base, "wt": base.t()}, tmp / "v.pt")
    back = zt.torch.load_file(tmp / "v.pt", copy=False)
    assert torch.equal(back["wt"], base.t())
    assert back["wt"].stride() == base.t().stride()  # a view, not a copy
