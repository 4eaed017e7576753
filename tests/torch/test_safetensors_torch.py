"""zt.torch as a drop-in for safetensors.torch (0.8.0, pinned): every call
run beside the real one on the same input. Files must be byte-identical,
loads equal (dtype, shape, bits), refusals the same exception types, and
save_model/load_model must handle shared tensors as safetensors does."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import zt

torch = pytest.importorskip("torch")
import safetensors  # noqa: E402
import safetensors.torch as st  # noqa: E402
from torch import nn  # noqa: E402

G = torch.Generator().manual_seed(7)


def sample(dtype, shape):
    """Random bits of `dtype` (every bit pattern, so fp8 NaNs too)."""
    n = int(np.prod(shape)) if shape else 1
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=G).bool()
    if dtype == torch.float4_e2m1fn_x2:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=G).view(dtype)
    width = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * width,), dtype=torch.uint8, generator=G)
    return raw.view(dtype).reshape(shape)


# Every dtype safetensors.torch saves.
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
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
    torch.float8_e8m0fnu,
    torch.float4_e2m1fn_x2,
]


def bits(t) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert bits(got[k]) == bits(want[k]), k


CASES = {
    "every_dtype": {f"t{i}": sample(d, (3, 4)) for i, d in enumerate(DTYPES)},
    "shapes": {
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros((0, 3), dtype=torch.bfloat16),
        "deep": sample(torch.float16, (1, 2, 1, 3)),
        "fp4_row": sample(torch.float4_e2m1fn_x2, (5,)),
    },
    "names": {
        "b.weight": sample(torch.float32, (2,)),
        "a.weight": sample(torch.int8, (2,)),
        'q"': sample(torch.float32, (1,)),
    },
    "grad": {"p": torch.ones(3, requires_grad=True)},
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("metadata", [None, {"format": "pt"}], ids=["none", "meta"])
def test_save_and_save_file_are_byte_identical(tmp_path, case, metadata):
    tensors = CASES[case]
    want = st.save(tensors, metadata=metadata)
    assert zt.torch.save(tensors, metadata=metadata) == want
    st.save_file(tensors, tmp_path / "st.safetensors", metadata=metadata)
    zt.torch.save_file(tensors, tmp_path / "zt.safetensors", metadata=metadata)
    assert (tmp_path / "zt.safetensors").read_bytes() == (tmp_path / "st.safetensors").read_bytes() == want


def test_loads_equal_safetensors_and_are_writable(tmp_path):
    tensors = {**CASES["every_dtype"], **CASES["shapes"]}
    path = tmp_path / "m.safetensors"
    st.save_file(tensors, path)
    data = path.read_bytes()
    want = st.load_file(path)
    for got in (zt.torch.load_file(path), zt.torch.load(data), zt.torch.load_file(path, backend="pread")):
        assert_same(got, want)
    got = zt.torch.load_file(path)
    got["t1"].add_(1)  # writable, as safetensors' are
    assert path.read_bytes() == data  # a private mapping: the file is untouched
    with safetensors.safe_open(path, "pt") as g, zt.safe_open(path, "pt") as f:
        assert f.keys() == g.keys()
        for name in g.keys():  # noqa: SIM118 - safe_open's keys()
            assert bits(f.get_tensor(name)) == bits(g.get_tensor(name)), name
            assert f.get_slice(name).get_shape() == g.get_slice(name).get_shape(), name
            assert f.get_slice(name).get_dtype() == g.get_slice(name).get_dtype(), name
        for key in [0, (slice(1, 3), slice(None, None, 2)), (Ellipsis, -1)]:
            got, want = f.get_slice("t3")[key], g.get_slice("t3")[key]
            assert got.dtype == want.dtype and got.shape == want.shape and bits(got) == bits(want)


REFUSED = {
    "shared": lambda: {"a": (t := torch.ones(4)), "b": t[:1]},
    "same_tensor": lambda: {"a": (t := torch.ones(4)), "b": t},
    "non_contiguous": lambda: {"a": torch.ones(3, 4).T},
    "not_a_tensor": lambda: {"a": 3},
    "sparse": lambda: {"a": torch.ones(3, 3).to_sparse()},
    "not_a_dict": lambda: [("a", torch.ones(2))],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refusals_raise_what_safetensors_raises(tmp_path, case):
    with pytest.raises(Exception) as want:
        st.save(REFUSED[case]())
    for call in (lambda t: zt.torch.save(t), lambda t: zt.torch.save_file(t, tmp_path / "x.safetensors")):
        with pytest.raises(Exception) as got:
            call(REFUSED[case]())
        assert type(got.value) is type(want.value), (case, got.value, want.value)
    assert not list(tmp_path.iterdir())


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.norm = nn.LayerNorm(4)
        self.register_buffer("steps", torch.tensor(3))


def test_save_model_and_load_model_match_safetensors(tmp_path):
    model = Tied()
    st.save_model(model, tmp_path / "st.safetensors", metadata={"k": "v"})
    zt.torch.save_model(model, tmp_path / "zt.safetensors", metadata={"k": "v"})
    st_bytes = (tmp_path / "st.safetensors").read_bytes()
    n = struct.unpack("<Q", st_bytes[:8])[0]
    # The dropped tied name and the caller's key make two metadata keys:
    # safetensors' HashMap order varies, so compare the header as JSON.
    import json

    zt_bytes = (tmp_path / "zt.safetensors").read_bytes()
    assert json.loads(zt_bytes[8 : 8 + n]) == json.loads(st_bytes[8 : 8 + n])
    assert zt_bytes[8 + n :] == st_bytes[8 + n :]
    st.save_model(model, tmp_path / "one.safetensors")
    zt.torch.save_model(model, tmp_path / "one_zt.safetensors")
    assert (tmp_path / "one_zt.safetensors").read_bytes() == (tmp_path / "one.safetensors").read_bytes()
    # Loading: every combination of writer and loader agrees.
    for path in (tmp_path / "st.safetensors", tmp_path / "zt.safetensors"):
        a, b = Tied(), Tied()
        want = st.load_model(a, path)
        got = zt.torch.load_model(b, path)
        assert (sorted(got[0]), sorted(got[1])) == (sorted(want[0]), sorted(want[1]))
        for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
            assert ka == kb and torch.equal(va, vb)
        assert b.head.weight is b.embed.weight
    # Missing and unexpected keys, strict or not.
    st.save_file({"embed.weight": torch.zeros(10, 4), "extra": torch.ones(1)}, tmp_path / "partial.safetensors")
    with pytest.raises(RuntimeError) as want:
        st.load_model(Tied(), tmp_path / "partial.safetensors")
    with pytest.raises(RuntimeError) as got:
        zt.torch.load_model(Tied(), tmp_path / "partial.safetensors")
    assert str(got.value) == str(want.value)
    want = st.load_model(Tied(), tmp_path / "partial.safetensors", strict=False)
    got = zt.torch.load_model(Tied(), tmp_path / "partial.safetensors", strict=False)
    assert (sorted(got[0]), sorted(got[1])) == (sorted(want[0]), sorted(want[1]))


def test_save_model_non_contiguous_needs_force_contiguous(tmp_path):
    model = nn.Linear(3, 4)
    model.weight = nn.Parameter(torch.ones(3, 4).T)
    for mod in (st, zt.torch):
        with pytest.raises(ValueError, match="force_contiguous"):
            mod.save_model(model, tmp_path / f"{mod.__name__}.safetensors", force_contiguous=False)
    st.save_model(model, tmp_path / "a.safetensors")
    zt.torch.save_model(model, tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_other_formats_through_the_same_calls(tmp_path):
    tensors = {"w": sample(torch.bfloat16, (4, 3)), "n": sample(torch.int64, (2,))}
    for fmt in ("zt", "npz", "pt"):
        path = tmp_path / f"m.{fmt}"
        zt.torch.save_file(tensors, path) if fmt != "npz" else None
        if fmt == "npz":  # npz has no bf16; write what numpy holds
            zt.torch.save_file({"n": tensors["n"]}, path)
            assert bits(zt.torch.load_file(path)["n"]) == bits(tensors["n"])
            continue
        assert_same(zt.torch.load_file(path), tensors)
        with zt.safe_open(path, "pt") as f:
            assert bits(f.get_slice("w")[1:3]) == bits(tensors["w"][1:3])
    assert torch.equal(torch.load(tmp_path / "m.pt", weights_only=True)["n"], tensors["n"])
    # A model into .zt and back.
    model = Tied()
    zt.torch.save_model(model, tmp_path / "model.zt")
    other = Tied()
    assert zt.torch.load_model(other, tmp_path / "model.zt") == (set(), [])
    assert torch.equal(other.head.weight, model.head.weight)


# ---- safetensors.torch's storage helpers, which other libraries import ----


def helper_inputs() -> dict:
    """Tensors whose storage and span the helpers measure: whole tensors,
    views of part of a storage (strided too), empty and meta tensors, a
    tensor set onto a smaller slice of another's storage (same address,
    other size), every element width."""
    base = torch.arange(16, dtype=torch.float32)
    grid = torch.zeros((3, 3))
    m = torch.randn(10)
    n = torch.empty([], dtype=m.dtype)
    n.set_(source=m.untyped_storage()[:16])
    return {
        "whole": grid,
        "rows": grid[:1, :],
        "tail": base[4:],
        "every_fourth": base[::4],
        "column": grid[:, 1],
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros((0, 3)),
        "empty_view": base[3:3],
        "meta": torch.zeros((2, 2), device="meta"),
        "m": m,
        "n_smaller_storage": n,
        "f16_every_fourth": torch.zeros(16, dtype=torch.float16)[::4],
        "fp8": sample(torch.float8_e4m3fn, (4,)),
        "fp4": sample(torch.float4_e2m1fn_x2, (2, 3)),
        "bool": sample(torch.bool, (5,)),
        "grad": torch.ones(3, requires_grad=True),
    }


def test_storage_helpers_match_safetensors():
    for name, t in helper_inputs().items():
        assert zt.torch.storage_ptr(t) == st.storage_ptr(t), name
        assert zt.torch.storage_size(t) == st.storage_size(t), name
        assert zt.torch._is_complete(t) == st._is_complete(t), name
        assert zt.torch._end_ptr(t) == st._end_ptr(t), name
    # A sparse tensor has no storage: address 0, and no size to measure.
    sparse = torch.ones(3, 3).to_sparse()
    assert zt.torch.storage_ptr(sparse) == st.storage_ptr(sparse) == 0
    with pytest.raises(NotImplementedError):
        st.storage_size(sparse)
    with pytest.raises(NotImplementedError):
        zt.torch.storage_size(sparse)


def test_end_ptr_of_views_view_minus_one_cannot_flatten():
    # safetensors flattens with view(-1), which these refuse; zt computes the
    # same end from the strides: the last element's address plus its size.
    grid = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    for t in (grid[::2, :], grid.T, torch.zeros(4).expand(3, 4), grid[:, 1:3]):
        with pytest.raises(RuntimeError):
            st._end_ptr(t)
        last = t[tuple(n - 1 for n in t.shape)]
        assert zt.torch._end_ptr(t) == last.data_ptr() + t.element_size()


class TiedAndCopied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.b = self.a
        self.c = nn.Linear(5, 5)


def shared_inputs() -> dict:
    """State dicts whose names share storage in every way safetensors groups."""
    grid = torch.zeros((3, 3))
    row = torch.zeros(4)
    m = torch.randn(10)
    n = torch.empty([], dtype=m.dtype)
    n.set_(source=m.untyped_storage()[:16])
    meta = torch.zeros((2, 2), device="meta")
    return {
        "view_of_whole": {"A": grid, "B": grid[:1, :]},
        "same_tensor_twice": {"A": grid, "B": grid[:1, :], "C": grid},
        "only_the_view": {"B": grid[:1, :]},
        "disjoint_halves": {"B": row[:2], "C": row[2:]},
        "overlapping_halves": {"B": row[:2], "C": row[1:]},
        "three_views": {"B": row[:2], "C": row[2:], "D": row[:1]},
        "same_address_other_size": {"m": m, "n": n},
        "meta": {"C": meta, "D": meta[:1]},
        "empty": {"e": torch.zeros(0), "f": torch.zeros((0, 2))},
        "tied_model": TiedAndCopied().state_dict(),
        "unshared_model": nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)).state_dict(),
    }


def outcome(call, *args, **kwargs):
    """What ``call`` returns (a dict of a defaultdict), or RuntimeError if it raises that."""
    try:
        result = call(*args, **kwargs)
    except RuntimeError:
        return RuntimeError
    return dict(result) if isinstance(result, dict) else result


@pytest.mark.parametrize("case", sorted(shared_inputs()))
def test_find_shared_tensors_and_remove_duplicate_names_match_safetensors(case):
    state_dict = shared_inputs()[case]
    # The same groups in the same order (a list, compared as such).
    assert zt.torch._find_shared_tensors(state_dict) == st._find_shared_tensors(state_dict)
    names = sorted(state_dict)
    for kwargs in (
        {},
        {"preferred_names": names[-1:]},
        {"discard_names": names[:1]},
        {"preferred_names": names[:1], "discard_names": names[:1]},
    ):
        want = outcome(st._remove_duplicate_names, state_dict, **kwargs)
        got = outcome(zt.torch._remove_duplicate_names, state_dict, **kwargs)
        assert got == want, (case, kwargs)
