"""The Python API's shape: Mapping behaviour, positional reads, numpy
protocols, errors."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.numpy

import zt


@pytest.fixture
def model(tmp):
    arrays = {"b": np.arange(6, dtype=np.int32).reshape(2, 3), "a": np.ones(4, np.float64)}
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file(arrays, path)
    return path, arrays


def test_mapping_protocol(model):
    path, arrays = model
    with zt.open(path) as src:
        assert len(src) == 2 and set(src) == set(arrays) and set(src.keys()) == set(arrays)
        assert "a" in src and "zz" not in src and 3 not in src
        assert src.get("zz") is None
        items = dict(src.items())
        assert {k: v.shape for k, v in items.items()} == {k: v.shape for k, v in arrays.items()}
        assert [t.name for t in src.values()] == list(src.keys())
        assert src.format == "safetensors" and src.files == [str(path)]
        assert src.nbytes == sum(a.nbytes for a in arrays.values())
        assert "safetensors" in repr(src) and "int32" not in repr(src["b"])
        t = src["b"]
        assert (t.name, t.dtype, t.shape, t.layout, t.parts, t.nbytes) == ("b", "i32", (2, 3), "dense", ["data"], 24)
        path_, offset, nbytes = t.location
        assert path_ == str(path) and nbytes == 24 and offset > 8
        assert t.strides == (3, 1)
        assert len(t) == 2
    assert src.closed and "closed" in repr(src)
    with pytest.raises(ValueError, match="closed"):
        src["a"]


def test_positional_mode_reads_the_same_bytes(model):
    path, arrays = model
    with zt.open(path, map=False) as src:
        for k, v in arrays.items():
            t = src[k]
            assert t.caps["map"] is False and t.caps["locate"] is True
            got = t.numpy()
            assert got.flags.writeable  # an owned buffer, not a view
            np.testing.assert_array_equal(got, v)


def test_numpy_protocols(model):
    path, arrays = model
    with zt.open(path) as src:
        np.testing.assert_array_equal(np.asarray(src["b"]), arrays["b"])
        as_float = np.asarray(src["b"], dtype=np.float32)
        assert as_float.dtype == np.float32 and as_float.tolist() == arrays["b"].tolist()
        copied = np.array(src["b"], copy=True)
        assert copied.flags.writeable


def test_limits_are_validated(model):
    path, _ = model
    with pytest.raises(ValueError, match="unknown limit"):
        zt.open(path, limits={"no_such_limit": 1})
    assert len(zt.open(path, limits={"tensors": 2})) == 2


def test_formats_detected_before_they_are_readable(tmp):
    import struct

    gguf = tmp / "m.gguf"
    gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    h5 = tmp / "m.h5"
    h5.write_bytes(b"\x89HDF\r\n\x1a\n\x00" + b"\x00" * 100)
    ztf = tmp / "m.zt"
    # A zTensor data shard: magic, then a footer whose manifest fields are all zero.
    ztf.write_bytes(b"\x89ZT2\r\n\x1a\n" + struct.pack("<QQQII", 0, 0, 0, 2, 0) + b"\x89ZT2\r\n\x1a\n")
    assert [zt.detect(p) for p in (gguf, h5, ztf)] == ["gguf", "h5", "zt"]


def test_array_copy_false_raises_when_a_copy_is_unavoidable(tmp):
    # numpy 2's __array__ contract: copy=False never copies. (numpy itself
    # asks for the buffer protocol first; __array__ is what other array
    # consumers call.)
    zt.numpy.save_file({"a": np.arange(6, dtype=np.float32)}, tmp / "m.safetensors")
    zt.numpy.save_file({"a": np.arange(6, dtype=np.float32)}, tmp / "c.zt", compression=True)
    with zt.open(tmp / "m.safetensors") as src:
        view = src["a"].__array__(copy=False)
        assert not view.flags.writeable and view.tolist() == list(range(6))
        with pytest.raises(ValueError, match="copy"):
            src["a"].__array__(np.float64, copy=False)
    with zt.open(tmp / "c.zt") as src:
        with pytest.raises(ValueError, match="without a copy"):
            src["a"].__array__(copy=False)
        assert src["a"].__array__().tolist() == list(range(6))  # copy=None decodes
