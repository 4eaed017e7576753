"""zt.torch.load_into against the reference path it replaces:
``model.load_state_dict(safetensors.torch.load_file(path))``, bit for bit,
with load_state_dict's strict semantics, writing into the model's own
memory (no new parameter objects, no second copy)."""

from __future__ import annotations

import pytest

import zt

torch = pytest.importorskip("torch")
import safetensors.torch as st  # noqa: E402
from torch import nn  # noqa: E402

import zt.torch  # noqa: E402


class Net(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.embed = nn.Embedding(50, 16, dtype=dtype)
        self.proj = nn.Linear(16, 24, dtype=dtype)
        self.norm = nn.LayerNorm(24, dtype=dtype)
        self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))


def bits(t):
    """A tensor's bytes, comparable across dtypes (NaN patterns included)."""
    return t.detach().contiguous().view(torch.uint8).flatten().tolist() if t.numel() else []


def random_state(dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in Net(dtype).state_dict().items():
        if t.dtype.is_floating_point:
            out[name] = torch.randn(t.shape, generator=g).to(t.dtype)
        else:
            out[name] = torch.randint(0, 1000, t.shape, generator=g, dtype=t.dtype)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_module_matches_load_state_dict_bit_for_bit(tmp_path, dtype):
    path = tmp_path / "m.safetensors"
    st.save_file(random_state(dtype), path)
    ref = Net(dtype)
    ref_result = ref.load_state_dict(st.load_file(path))
    got = Net(dtype)
    params_before = {n: p.data_ptr() for n, p in got.named_parameters()}
    result = zt.torch.load_into(got, path)
    assert (result.missing_keys, result.unexpected_keys) == (ref_result.missing_keys, ref_result.unexpected_keys)
    for (n, a), (m, b) in zip(ref.state_dict().items(), got.state_dict().items()):
        assert n == m and a.dtype == b.dtype and a.shape == b.shape
        assert bits(a) == bits(b), n
    # Written in place: the same parameter memory, still a leaf needing grad.
    assert {n: p.data_ptr() for n, p in got.named_parameters()} == params_before
    assert all(p.requires_grad for p in got.parameters())


def test_dict_of_tensors_in_place(tmp_path):
    state = random_state(torch.float32)
    path = tmp_path / "m.safetensors"
    st.save_file(state, path)
    dest = {k: torch.zeros_like(v) for k, v in state.items()}
    ptrs = {k: v.data_ptr() for k, v in dest.items()}
    assert zt.torch.load_into(dest, path) == ([], [])
    assert {k: v.data_ptr() for k, v in dest.items()} == ptrs
    assert all(bits(dest[k]) == bits(state[k]) for k in state)


def test_other_formats_read_into_the_model(tmp_path):
    """Any format zt reads: a torch.save checkpoint into a module."""
    state = random_state(torch.float16)
    path = tmp_path / "m.pt"
    torch.save(state, path)
    ref = Net(torch.float16)
    ref.load_state_dict(torch.load(path, weights_only=True))
    got = Net(torch.float16)
    zt.torch.load_into(got, path)
    assert all(bits(a) == bits(b) for a, b in zip(ref.state_dict().values(), got.state_dict().values()))


def test_strict_and_non_strict_keys_match_load_state_dict(tmp_path):
    state = random_state(torch.float32)
    del state["norm.bias"]
    state["extra.weight"] = torch.ones(2)
    path = tmp_path / "m.safetensors"
    st.save_file(state, path)
    with pytest.raises(RuntimeError):
        Net().load_state_dict(st.load_file(path))
    untouched = Net()
    before = [bits(t) for t in untouched.state_dict().values()]
    with pytest.raises(ValueError, match="Missing key.*norm.bias") as info:
        zt.torch.load_into(untouched, path)
    assert "Unexpected key(s): 'extra.weight'" in str(info.value)
    assert [bits(t) for t in untouched.state_dict().values()] == before  # nothing written
    ref = Net()
    ref_result = ref.load_state_dict(st.load_file(path), strict=False)
    got = Net()
    got.load_state_dict(ref.state_dict())  # the same starting values for the missing key
    got.proj.weight.data.zero_()
    result = zt.torch.load_into(got, path, strict=False)
    assert result.missing_keys == ref_result.missing_keys
    assert result.unexpected_keys == ref_result.unexpected_keys
    assert all(bits(a) == bits(b) for a, b in zip(ref.state_dict().values(), got.state_dict().values()))


def test_shape_or_dtype_mismatch_raises_before_writing(tmp_path):
    state = random_state(torch.float32)
    path = tmp_path / "m.safetensors"
    st.save_file(state, path)
    half = Net(torch.float16)
    before = [bits(t) for t in half.state_dict().values()]
    with pytest.raises(ValueError, match="dtype float32 in the file, float16 in the destination"):
        zt.torch.load_into(half, path)
    assert [bits(t) for t in half.state_dict().values()] == before
    wrong = {k: torch.zeros_like(v) for k, v in state.items()}
    wrong["proj.weight"] = torch.zeros(24, 15)
    with pytest.raises(ValueError, match=r"shape \(24, 16\) in the file, \(24, 15\) in the destination"):
        zt.torch.load_into(wrong, path)
    assert all(not v.any() for v in wrong.values())


def test_meta_tensors_are_refused(tmp_path):
    state = random_state(torch.float32)
    path = tmp_path / "m.safetensors"
    st.save_file(state, path)
    with pytest.raises(ValueError, match="on meta"):
        zt.torch.load_into({k: torch.empty_like(v, device="meta") for k, v in state.items()}, path)


def test_result_is_the_numpy_load_result(tmp_path):
    path = tmp_path / "m.safetensors"
    st.save_file({"a": torch.ones(3)}, path)
    result = zt.torch.load_into({"a": torch.zeros(3)}, path)
    assert isinstance(result, zt.numpy.LoadResult)
    assert result.missing_keys == [] and result.unexpected_keys == []
