"""Hostile inputs: each must raise a clear zt.FormatError (a ValueError),
citing the rule it broke (``err.rule``), and never crash the interpreter."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import safetensors.numpy

import zt


def st_file(path, header: dict | bytes, data: bytes = b"", length: int | None = None):
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(raw) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + raw + data)
    return path


def entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


CASES = {
    "empty file": lambda p: p.write_bytes(b""),
    "shorter than the length prefix": lambda p: p.write_bytes(b"\x10\x00\x00"),
    "header length past EOF": lambda p: st_file(p, {"a": entry()}, b"\0" * 8, length=1 << 20),
    "header length over 100 MB": lambda p: st_file(p, b"{}", length=200_000_000),
    "header not JSON": lambda p: st_file(p, b"{not json", b""),
    "header not UTF-8": lambda p: st_file(p, b'{"\xff": 1}'),
    "overlapping offsets": lambda p: st_file(p, {"a": entry(offsets=(0, 8)), "b": entry(offsets=(4, 12))}, b"\0" * 12),
    "gap between tensors": lambda p: st_file(p, {"a": entry(offsets=(0, 8)), "b": entry(offsets=(12, 20))}, b"\0" * 20),
    "trailing bytes": lambda p: st_file(p, {"a": entry()}, b"\0" * 16),
    "data shorter than declared": lambda p: st_file(p, {"a": entry()}, b"\0" * 4),
    "size disagrees with shape": lambda p: st_file(p, {"a": entry(shape=(3,))}, b"\0" * 8),
    "shape product overflows": lambda p: st_file(p, {"a": entry(shape=(2**40, 2**40))}, b"\0" * 8),
    "offsets reversed": lambda p: st_file(p, {"a": entry(offsets=(8, 0))}, b"\0" * 8),
    "unknown dtype": lambda p: st_file(p, {"a": entry(dtype="F128")}, b"\0" * 8),
    "metadata not strings": lambda p: st_file(p, {"__metadata__": {"a": 1}}),
    "duplicate names": lambda p: st_file(
        p, b'{"a":' + json.dumps(entry()).encode() + b',"a":' + json.dumps(entry()).encode() + b"}", b"\0" * 8
    ),
    "odd fp4 count": lambda p: st_file(p, {"a": entry(dtype="F4", shape=(3,), offsets=(0, 2))}, b"\0" * 2),
    "rank over the limit": lambda p: st_file(p, {"a": entry(shape=[1] * 100, offsets=(0, 4))}, b"\0" * 4),
    "npy truncated": lambda p: p.write_bytes(
        b"\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran_order': False, 'shape': (100,), }" + b" " * 60 + b"\n"
    ),
    "npy header is not a dict": lambda p: p.write_bytes(b"\x93NUMPY\x01\x00\x0a\x00[1, 2, 3]\n"),
}

# The rule each case's refusal cites (FormatError.rule, zt::Rule::name).
RULES = {
    "data shorter than declared": "safetensors.Offsets",
    "duplicate names": "core.DuplicateName",
    "empty file": "core.UnknownFormat",
    "gap between tensors": "safetensors.Offsets",
    "header length over 100 MB": "core.UnknownFormat",
    "header length past EOF": "core.Truncated",
    "header not JSON": "safetensors.Header",
    "header not UTF-8": "safetensors.Header",
    "metadata not strings": "safetensors.Metadata",
    "npy header is not a dict": "core.UnknownFormat",
    "npy truncated": "core.Truncated",
    "odd fp4 count": "safetensors.Size",
    "offsets reversed": "safetensors.Offsets",
    "overlapping offsets": "safetensors.Offsets",
    "rank over the limit": "core.Limit",
    "shape product overflows": "core.Overflow",
    "shorter than the length prefix": "core.UnknownFormat",
    "size disagrees with shape": "safetensors.Size",
    "trailing bytes": "safetensors.Offsets",
    "unknown dtype": "core.DType",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_file_is_a_clear_error(tmp, case):
    path = tmp / "bad.safetensors"
    CASES[case](path)
    with pytest.raises(zt.FormatError) as info:
        src = zt.open(path)
        for name in src:
            src[name].numpy()
    assert "bad.safetensors" in str(info.value)  # the message names the file
    assert isinstance(info.value, ValueError)
    assert info.value.rule == RULES[case]  # and the check it failed, as data


def test_many_tensors_are_bounded_by_limits(tmp):
    header = {f"t{i}": entry(offsets=(8 * i, 8 * i + 8)) for i in range(100)}
    path = st_file(tmp / "many.safetensors", header, b"\0" * 800)
    assert len(zt.open(path)) == 100
    with pytest.raises(zt.FormatError, match="tensors"):
        zt.open(path, limits={"tensors": 10})


def test_missing_file_is_file_not_found(tmp):
    with pytest.raises(FileNotFoundError):
        zt.open(tmp / "nope.safetensors")
    with pytest.raises(FileNotFoundError):
        zt.detect(tmp / "nope.safetensors")


def test_missing_tensor_is_key_error(tmp):
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file({"a": np.zeros(1, np.float32)}, path)
    with zt.open(path) as src:
        with pytest.raises(KeyError):
            src["b"]
        assert src.get("b") is None and "b" not in src


def test_random_garbage_never_crashes(tmp):
    rng = np.random.default_rng(7)
    for i in range(200):
        size = int(rng.integers(0, 4096))
        data = rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()
        if i % 3 == 0 and size > 8:  # a plausible length prefix
            data = struct.pack("<Q", size - 8) + b"{" + data[9:]
        path = tmp / f"g{i}.bin"
        path.write_bytes(data)
        try:
            src = zt.open(path)
            for name in src:
                src[name].tobytes()
        except (zt.FormatError, OSError):
            pass


def test_failed_write_leaves_no_partial_file(tmp):
    dest = tmp / "out.safetensors"
    with pytest.raises(ValueError):
        zt.numpy.save_file({"ok": np.zeros(3, np.float32), "bad": np.array([object()])}, dest)
    with pytest.raises(ValueError):
        zt.numpy.save_file({"__metadata__": np.zeros(3, np.float32)}, dest)
    assert list(tmp.iterdir()) == []


def test_a_format_error_without_a_rule_has_rule_none():
    # Raised from Python (or for a remote object that changed), a
    # FormatError names no rule; the class attribute says so.
    assert zt.FormatError("x").rule is None
    assert zt.FormatError.rule is None


def test_a_format_error_says_where_as_data(tmp):
    # The file and the tensor beside the message, as `rule` is.
    path = st_file(tmp / "m.safetensors", {"a": entry(shape=(3,))}, b"\0" * 8)
    with pytest.raises(zt.FormatError) as e:
        zt.open(path)
    assert e.value.file == str(path)
    assert e.value.tensor == "a"
    assert e.value.offset is None or isinstance(e.value.offset, int)
    # Raised from Python, it says nothing: every field is None.
    bare = zt.FormatError("x")
    assert (bare.rule, bare.file, bare.tensor, bare.offset) == (None, None, None, None)
