"""The native functions take objects, never addresses: whatever a Python
caller hands them, they read only the memory the object exports, and a
wrong length, a read-only target, a strided array or a wrong dtype is a
clear ValueError/TypeError (never a crash or a stray write)."""

from __future__ import annotations

import numpy as np
import pytest

import zt
from zt import _zt
from zt._tensor import memory_owner


def test_save_refuses_buffers_that_do_not_match_their_description(tmp):
    path = str(tmp / "a.safetensors")
    # Too short for its shape: refused before any byte is read.
    with pytest.raises(ValueError, match="holds 8 bytes, expected 16"):
        _zt.save(path, "safetensors", [("x", "f32", [4], np.zeros(2, np.float32))])
    # An integer is not a buffer (the old API took addresses).
    with pytest.raises(TypeError, match="C-contiguous buffer"):
        _zt.save(path, "safetensors", [("x", "f32", [4], 0x1000)])
    # Strided: refused, not read past its elements.
    strided = np.zeros(8, np.float32)[::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        _zt.save(path, "safetensors", [("x", "f32", [4], strided)])
    # Elements of another width than the dtype's.
    with pytest.raises(TypeError, match="8-byte elements"):
        _zt.save(path, "safetensors", [("x", "f32", [2], np.zeros(1, np.float64))])
    with pytest.raises(ValueError, match="unknown dtype"):
        _zt.save(path, "safetensors", [("x", "f128", [1], np.zeros(1, np.float64))])
    with pytest.raises(ValueError, match="zt writes no format"):
        _zt.save(path, "nope", [])
    assert not (tmp / "a.safetensors").exists()
    # The same call with a matching buffer writes what safetensors reads.
    _zt.save(path, "safetensors", [("x", "f32", [4], np.arange(4, dtype=np.float32))])
    from safetensors.numpy import load_file

    np.testing.assert_array_equal(load_file(path)["x"], np.arange(4, dtype=np.float32))


def test_zt_writer_parts_and_chunks_take_buffers_only(tmp):
    w = _zt.Writer(str(tmp / "a.zt"))
    with pytest.raises(TypeError, match="C-contiguous buffer"):
        w.add_object("x", [2], [("data", "f32", 12345, None)])
    with pytest.raises(ValueError, match="C-contiguous"):
        w.add_object("x", [2], [("data", "f32", np.zeros(4, np.float32)[::2], None)])
    w.stream("s", [2], [("data", "u8", 2)])
    with pytest.raises(TypeError, match="C-contiguous buffer"):
        w.write_chunk(99)
    w.write_chunk(b"\x01\x02")
    w.close_stream()
    w.finish()
    assert zt.open(tmp / "a.zt")["s"].numpy().tolist() == [1, 2]


def test_zrecord_gather_refuses_read_only_strided_and_mistyped_buffers(tmp):
    from zt import zrecord

    path = tmp / "d"
    with zrecord.Dense.create(path, dtype=np.float32, item_shape=(2,)) as d:
        d.append(np.arange(8, dtype=np.float32).reshape(4, 2))
    store = zrecord.Dense.open(path)
    reader = store._reader
    idxs = np.array([0, 3], dtype=np.uint64)
    out = np.zeros((2, 2), np.float32)
    reader.gather_dense(idxs, out)
    assert out.tolist() == [[0, 1], [6, 7]]
    # A read-only target is never written.
    frozen = np.zeros((2, 2), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        reader.gather_dense(idxs, frozen)
    assert not frozen.any()
    with pytest.raises(ValueError, match="writable"):
        reader.gather_dense(idxs, b"\0" * 16)
    # Wrong length: the reader refuses before writing.
    short = np.zeros((1, 2), np.float32)
    with pytest.raises(ValueError, match="one row per index"):
        reader.gather_dense(idxs, short)
    # Strided target.
    with pytest.raises(ValueError, match="C-contiguous"):
        reader.gather_dense(idxs, np.zeros((2, 4), np.float32)[:, ::2])
    # Indices must be native 8-byte integers.
    with pytest.raises(TypeError, match="8-byte integers"):
        reader.gather_dense(idxs.astype(np.int32), out)
    with pytest.raises(TypeError, match="8-byte integers"):
        reader.gather_dense(idxs.astype(">u8"), out)
    with pytest.raises(TypeError, match="buffer"):
        reader.gather_dense(12345, out)
    store.close()


def test_zrecord_ragged_appends_check_their_arrays(tmp):
    from zt import zrecord

    with zrecord.Ragged.create(tmp / "r", dtype=np.int32, ndim=1) as r:
        writer = r._writer
        with pytest.raises(TypeError, match="8-byte integers"):
            writer.append_ragged(np.zeros(4, np.int32), np.array([16], np.int32), np.array([4], np.uint64))
        # Shapes for the wrong number of records.
        with pytest.raises(ValueError, match="shapes holds 2 integers"):
            writer.append_ragged(np.zeros(4, np.int32), np.array([16], np.uint64), np.array([4, 4], np.uint64))
        # Sizes past the values buffer.
        with pytest.raises(ValueError, match="sizes pass the values buffer"):
            writer.append_ragged(np.zeros(4, np.int32), np.array([32], np.uint64), np.array([8], np.uint64))
        with pytest.raises(TypeError, match="buffer"):
            writer.append_ragged_each([0xDEAD], np.array([1], np.uint64))
        r.append([np.arange(3, dtype=np.int32)])
    assert zrecord.Ragged.open(tmp / "r")[0].tolist() == [0, 1, 2]


def test_sampler_out_is_checked_natively_on_every_call():
    from zt.loader import SEQUENTIAL, Sampler

    s = Sampler(100, 8, SEQUENTIAL, 0)
    native = s._native
    out = np.zeros(8, np.int64)
    native.next_into(out)
    assert out.tolist() == list(range(8))
    with pytest.raises(ValueError, match="writable"):
        frozen = np.zeros(8, np.int64)
        frozen.flags.writeable = False
        native.next_into(frozen)
    with pytest.raises(TypeError, match="8-byte integers"):
        native.next_into(np.zeros(8, np.float64))
    with pytest.raises(ValueError):
        native.next_into(np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        native.batch_into(0, np.zeros(16, np.int64)[::2])
    with pytest.raises(TypeError, match="buffer"):
        native.batch_into(0, 0x1000)
    # An adopted `out` whose flags change in place is refused, not written.
    s.next(out=out)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        s.next(out=out)


def test_train_dict_reads_only_its_buffer():
    with pytest.raises(TypeError, match="buffer"):
        _zt.train_dict(0x1000, [16], 1024)


def test_dtype_and_zrecord_tables_come_from_rust():
    import ml_dtypes

    from zt import zrecord
    from zt._tensor import numpy_dtype
    from zt._write import zt_dtype

    assert set(_zt.DTYPES) == {
        "f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "bool",
        "f8_e4m3fn", "f8_e5m2", "f8_e4m3fnuz", "f8_e5m2fnuz", "f8_e8m0", "f4_e2m1", "f6_e2m3", "f6_e3m2",
        "complex64", "complex128", "i4", "u4",
    }  # fmt: skip
    assert numpy_dtype("bf16") == np.dtype(ml_dtypes.bfloat16) and numpy_dtype("i8") == np.dtype("i1")
    assert numpy_dtype("f6_e2m3") == np.dtype("u1")  # numpy has no fp6: its bytes
    assert zt_dtype(np.dtype(">f4")) == "f32" and zt_dtype(ml_dtypes.float8_e8m0fnu) == "f8_e8m0"
    # zTensor registers no int4: saving one is refused before any native call.
    with pytest.raises(ValueError, match="cannot store numpy dtype int4"):
        zt_dtype(ml_dtypes.int4)
    assert _zt.DTYPES["complex64"]["storage"] == "f32" and _zt.DTYPES["f4_e2m1"]["bits"] == 4
    limits = _zt.ZRECORD_LIMITS
    assert zrecord.CODECS == limits["codecs"] == ("raw", "zstd", "zstd_dict")
    assert (zrecord.MAX_DATA_SHARDS, zrecord.MAX_RECORD_LEN) == (255, 1 << 31)


def test_every_native_array_is_an_array_view(tmp):
    from zt import zrecord

    with zrecord.Ragged.create(tmp / "r", dtype=np.int32, ndim=1) as r:
        r.append([np.arange(3, dtype=np.int32), np.arange(5, dtype=np.int32)])
    values, offsets, shapes = zrecord.Ragged.open(tmp / "r").gather_packed([1, 0])
    for arr in (values, shapes):  # offsets are rescaled to elements: a new array
        base = memory_owner(arr)
        assert type(base) is _zt.ArrayView and not base.readonly
    assert values.tolist() == [0, 1, 2, 3, 4, 0, 1, 2] and offsets.tolist() == [0, 5, 8]
    for gone in ("RecordBuffer", "LoaderBuffer", "write_safetensors", "write_zt", "safetensors_bytes"):
        assert not hasattr(_zt, gone)


def test_array_struct_hands_numpy_what_the_dict_form_describes(tmp):
    """numpy takes an ArrayView through `__array_struct__` (tried before
    the dict): the same memory, dtype, shape, strides and writability as
    the dict form gives, for mapped views (C order, Fortran order, 0-d,
    empty, every dtype numpy has), owned copies and a gather's output, and
    the array alone keeps the memory alive."""
    import gc

    from zt import zrecord

    class DictOnly:
        """The view seen through `__array_interface__` only."""

        def __init__(self, view):
            self.__array_interface__ = view.__array_interface__
            self.view = view

    arrays = {
        "c_order": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        "scalar": np.array(7, np.int16),
        "empty": np.zeros((0, 3), np.float32),
        "flags": np.array([True, False, True]),
        "complex": np.arange(4, dtype=np.complex128),
        "u64": np.arange(5, dtype=np.uint64),
        "i8": np.arange(-3, 3, dtype=np.int8),
    }
    path = tmp / "a.npz"
    np.savez(path, **arrays)
    with zrecord.Ragged.create(tmp / "r", dtype=np.int32, ndim=1) as r:
        r.append([np.arange(3, dtype=np.int32), np.arange(5, dtype=np.int32)])
    gathered = zrecord.Ragged.open(tmp / "r").gather_packed([1, 0])[0]
    with zt.open(path) as src:  # each view keeps its mapping alive after close
        views = [(name, copy, src[name]._native._array(copy)) for name in arrays for copy in (False, True)]
    views.append(("gather", False, memory_owner(gathered)))
    for name, copy, view in views:
        got, want = np.asarray(view), np.asarray(DictOnly(view))
        assert memory_owner(got) is view, name
        assert (got.dtype, got.shape, got.strides) == (want.dtype, want.shape, want.strides), (name, copy)
        assert got.__array_interface__["data"] == want.__array_interface__["data"], (name, copy)
        assert (got.flags.writeable, got.flags.aligned) == (want.flags.writeable, want.flags.aligned), name
        assert got.flags.c_contiguous == want.flags.c_contiguous, name
        assert got.tobytes() == want.tobytes(), name
        if name in arrays:
            np.testing.assert_array_equal(got, arrays[name])
            assert got.flags.writeable == copy, name
    # The array holds the view (and through it the mapping) on its own.
    with zt.open(path) as src:
        kept = np.asarray(src["c_order"]._native._array(False))
    del views
    gc.collect()
    np.testing.assert_array_equal(kept, arrays["c_order"])


def test_describe_hands_over_every_array_as_the_general_path_does():
    # The fast path (a C-contiguous ndarray of a dtype stored as it is)
    # and the general one (`prepare`) must describe an array alike, and
    # arrays at the fast path's edges take the general one: big-endian,
    # non-contiguous, a subclass, a numpy scalar, 4-bit, 0-d, empty.
    import ml_dtypes

    from zt._write import describe, prepare

    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    arrays = {
        "plain": base,
        "bool": base > 3,
        "bf16": base.astype(ml_dtypes.bfloat16),
        "big_endian": base.astype(">f4"),
        "transposed": base.T,
        "subclass": base.view(type("Sub", (np.ndarray,), {})),
        "scalar": np.float32(2.5),
        "zero_d": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 3), np.uint8),
        "fp4": np.zeros(6, dtype=ml_dtypes.float4_e2m1fn),
    }
    for (name, dtype, shape, buf), (key, value) in zip(describe(arrays), arrays.items()):
        assert name == key
        want_dtype, want_buf = prepare(key, value)
        assert dtype == want_dtype, key
        assert tuple(shape) == np.shape(value), key
        assert buf.tobytes() == want_buf.tobytes(), key
        assert buf.flags.c_contiguous, key
    # Only the plain, C-contiguous little-endian arrays went through as they are.
    described = dict((d[0], d[3]) for d in describe(arrays))
    assert described["plain"] is base
    assert described["big_endian"].dtype.byteorder in "=<"
    assert described["transposed"] is not arrays["transposed"]
