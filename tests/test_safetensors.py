"""safetensors files written by the reference library, read back through zt
and compared bit for bit."""

from __future__ import annotations

import itertools
import json
import os
import struct

import limited
import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

import zt
from zt._tensor import memory_owner

GiB = limited.GiB

RNG = np.random.default_rng(0)

# Every dtype the safetensors format defines that numpy can hold, with the zt name.
NUMPY_DTYPES = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "i64": np.int64,
    "i32": np.int32,
    "i16": np.int16,
    "i8": np.int8,
    "u64": np.uint64,
    "u32": np.uint32,
    "u16": np.uint16,
    "u8": np.uint8,
    "bool": np.bool_,
}
# dtypes written through safetensors.serialize from raw bytes, as torch would write them.
# keyed by the name safetensors' TensorSpec takes
RAW_DTYPES = {
    "bfloat16": ("bf16", ml_dtypes.bfloat16, 2),
    "float8_e4m3fn": ("f8_e4m3fn", ml_dtypes.float8_e4m3fn, 1),
    "float8_e5m2": ("f8_e5m2", ml_dtypes.float8_e5m2, 1),
    "float8_e8m0fnu": ("f8_e8m0", ml_dtypes.float8_e8m0fnu, 1),
    "float8_e4m3fnuz": ("f8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz, 1),
    "float8_e5m2fnuz": ("f8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz, 1),
    "complex64": ("complex64", np.complex64, 8),
}


def serialize_raw(name: str, dtype: str, shape: list[int], raw: np.ndarray) -> bytes:
    """Write one tensor from raw bytes with the reference serializer."""
    spec = safetensors.TensorSpec(dtype=dtype, shape=shape, data_ptr=raw.ctypes.data, data_len=raw.nbytes)
    return bytes(safetensors.serialize({name: spec}))


def sample(dtype, shape):
    if dtype == np.bool_:
        return np.asarray(RNG.integers(0, 2, size=shape).astype(np.bool_))
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.asarray(RNG.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True))
    return np.asarray((RNG.standard_normal(shape) * 100).astype(dtype))


@pytest.mark.parametrize("name", sorted(NUMPY_DTYPES))
def test_every_numpy_dtype_bit_exact(tmp, name):
    dtype = NUMPY_DTYPES[name]
    arrays = {"a": sample(dtype, (3, 5)), "scalar": sample(dtype, ()), "empty": sample(dtype, (0, 4))}
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file(arrays, path)
    with zt.open(path) as src:
        assert src.format == "safetensors"
        assert sorted(src) == sorted(arrays)
        for key, want in arrays.items():
            t = src[key]
            assert t.dtype == name
            assert t.shape == want.shape
            got = t.numpy()
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes()
            assert t.tobytes() == want.tobytes()
    reference = safetensors.numpy.load_file(path)
    ours = zt.numpy.load_file(path)
    for key in arrays:
        assert ours[key].tobytes() == reference[key].tobytes()


@pytest.mark.parametrize("st_name", sorted(RAW_DTYPES))
def test_ml_dtypes_from_raw_bytes(tmp, st_name):
    zt_name, ml_type, width = RAW_DTYPES[st_name]
    raw_array = RNG.integers(0, 256, size=4 * 6 * width, dtype=np.uint8)
    raw = raw_array.tobytes()
    path = tmp / "m.safetensors"
    path.write_bytes(serialize_raw("w", st_name, [4, 6], raw_array))
    with zt.open(path) as src:
        t = src["w"]
        assert t.dtype == zt_name
        arr = t.numpy()
        assert arr.dtype == np.dtype(ml_type)
        assert arr.shape == (4, 6)
        assert arr.tobytes() == raw


def test_f4_packed_two_per_byte(tmp):
    codes = RNG.integers(0, 16, size=12, dtype=np.uint8)
    packed = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)
    path = tmp / "m.safetensors"
    # torch's float4_e2m1fn_x2 storage shape [2, 3] is logical shape [2, 6].
    path.write_bytes(serialize_raw("w", "float4_e2m1fn_x2", [2, 3], packed))
    with zt.open(path) as src:
        t = src["w"]
        assert t.dtype == "f4_e2m1" and t.nbytes == 6 and t.shape == (2, 6)
        arr = t.numpy()
        assert arr.dtype == np.dtype(ml_dtypes.float4_e2m1fn)
        assert arr.view(np.uint8).reshape(-1).tolist() == codes.tolist()


def test_metadata_is_file_attributes(tmp):
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file({"a": np.zeros(3, np.float32)}, path, metadata={"format": "np", "step": "7"})
    with zt.open(path) as src:
        assert src.attributes == {"format": "np", "step": "7"}


def test_zero_copy_is_real_and_outlives_close(tmp):
    path = tmp / "m.safetensors"
    want = np.arange(1024, dtype=np.float32).reshape(32, 32)
    safetensors.numpy.save_file({"w": want}, path)
    src = zt.open(path)
    t = src["w"]
    assert t.caps["map"] is True
    arr = t.numpy()
    start, length = t._native._mapping()
    assert start <= arr.ctypes.data < start + length
    assert arr.ctypes.data - start == t.location[1]
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr[0, 0] = 1
    src.close()
    del t
    import gc

    gc.collect()
    assert np.array_equal(arr, want)  # the mapping is still alive
    copy = zt.open(path)["w"].numpy(copy=True)
    assert copy.flags.writeable and copy.flags.c_contiguous
    copy[0, 0] = 5  # independent of the file


def test_unaligned_tensor_is_an_unaligned_view_for_numpy_but_not_mappable_for_dlpack(tmp):
    # A hand-made file (as MLX writes them) whose f32 data starts at an odd offset.
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    if (8 + len(header)) % 4 == 0:
        header += b" "
    data = np.array([1.5, -2.0], np.float32).tobytes()
    path = tmp / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)
    assert safetensors.numpy.load_file(path)["w"].tolist() == [1.5, -2.0]
    with zt.open(path) as src:
        t = src["w"]
        assert t.caps["map"] is False and t.caps["locate"] is True
        arr = t.numpy()
        assert arr.tolist() == [1.5, -2.0]
        # numpy handles unaligned elements: a read-only view of the mapping.
        assert not arr.flags.aligned and not arr.flags.writeable
        copy = t.numpy(copy=True)
        assert copy.flags.aligned and copy.flags.writeable and copy.tolist() == [1.5, -2.0]


def test_sharded_checkpoint_with_index(tmp):
    a = {"layer.0.w": sample(np.float32, (4, 4)), "layer.0.b": sample(np.float32, (4,))}
    b = {"layer.1.w": sample(np.float16, (4, 4))}
    safetensors.numpy.save_file(a, tmp / "model-00001-of-00002.safetensors")
    safetensors.numpy.save_file(b, tmp / "model-00002-of-00002.safetensors")
    weight_map = {k: "model-00001-of-00002.safetensors" for k in a}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in b})
    index = tmp / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 104}, "weight_map": weight_map}))
    with zt.open(index) as src:
        assert sorted(src) == sorted(weight_map)
        for k, v in {**a, **b}.items():
            assert src[k].numpy().tobytes() == v.tobytes()
        assert src.attributes["metadata"] == {"total_size": 104}
    # An index that puts a tensor in the wrong shard is refused.
    weight_map["layer.1.w"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(zt.FormatError, match="layer.1.w") as info:
        zt.open(index)
    assert info.value.rule == "index.Mismatch"
    # An index that points outside its directory is refused.
    index.write_text(json.dumps({"weight_map": {"x": "../escape.safetensors"}}))
    with pytest.raises(zt.FormatError, match="leaves") as info:
        zt.open(index)
    assert info.value.rule == "index.ShardPath"


def test_open_all_merges_and_refuses_collisions(tmp):
    safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, tmp / "1.safetensors")
    safetensors.numpy.save_file({"b": np.ones(3, np.int8)}, tmp / "2.safetensors")
    safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, tmp / "3.safetensors")
    with zt.open([tmp / "1.safetensors", tmp / "2.safetensors"]) as src:
        assert sorted(src) == ["a", "b"] and len(src.files) == 2
    with pytest.raises(zt.FormatError, match="duplicate") as info:
        zt.open([tmp / "1.safetensors", tmp / "3.safetensors"])
    assert info.value.rule == "core.DuplicateName"


def test_zt_writer_output_reads_in_reference(tmp):
    arrays = {
        "f": sample(np.float32, (3, 7)),
        "h": sample(np.float16, (5,)),
        "i": sample(np.int64, ()),
        "b": sample(np.bool_, (2, 2)),
        "bf": sample(np.float32, (4,)).astype(ml_dtypes.bfloat16),
    }
    path = tmp / "ours.safetensors"
    zt.numpy.save_file(arrays, path, metadata={"k": "v"})
    loaded = safetensors.safe_open(path, "numpy")
    assert loaded.metadata() == {"k": "v"}
    for k in ["f", "h", "i", "b"]:
        assert loaded.get_tensor(k).tobytes() == arrays[k].tobytes()
    with zt.open(path) as src:
        for k, v in arrays.items():
            assert src[k].numpy().tobytes() == np.ascontiguousarray(v).tobytes()
            assert src[k].caps["map"]  # the writer aligns every tensor


def test_dlpack_shapes_strides_and_rank0(tmp):
    path = tmp / "m.safetensors"
    arrays = {"m": sample(np.float32, (3, 4)), "s": sample(np.int32, ())}
    safetensors.numpy.save_file(arrays, path)
    with zt.open(path) as src:
        m = np.from_dlpack(src["m"])
        assert m.shape == (3, 4) and m.tobytes() == arrays["m"].tobytes()
        assert not m.flags.writeable  # versioned DLPack carries the read-only flag
        s = np.from_dlpack(src["s"])
        assert s.shape == () and s.tobytes() == arrays["s"].tobytes()
        assert src["m"].__dlpack_device__() == (1, 0)
        with pytest.raises(BufferError):
            src["m"].__dlpack__(copy=False)  # legacy protocol cannot say read-only
        assert type(src["m"].__dlpack__()).__name__ == "PyCapsule"


def test_threads_share_one_source(tmp):
    from concurrent.futures import ThreadPoolExecutor

    arrays = {f"t{i}": sample(np.float32, (64,)) for i in range(32)}
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file(arrays, path)
    with zt.open(path) as src:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda k: (k, src[k].numpy(copy=True)), list(arrays) * 4))
    for k, got in results:
        assert got.tobytes() == arrays[k].tobytes()


def test_prefetch_and_evict(tmp):
    path = tmp / "m.safetensors"
    page = zt.page_size()
    arrays = {"big": np.ones(4 * page, np.float32), "small": np.ones(3, np.float32)}
    safetensors.numpy.save_file(arrays, path)
    with zt.open(path) as src:
        big = src["big"]
        big.prefetch()
        assert big.caps["evict"] is True
        dropped = big.evict()
        assert 0 < dropped <= 4 * 4 * page + page
        assert np.array_equal(big.numpy(), arrays["big"])  # pages fault back in
        assert src["small"].evict() == 0  # shares its pages with the header and 'big'


# ------------------------------------------ a drop-in for safetensors' API
#
# Each test runs the real safetensors (0.8.0, pinned) beside zt on the same
# input: zt.numpy's save/load/save_file/load_file and zt.safe_open must give
# what safetensors gives (byte for byte, for what is written).


def st_header(data: bytes) -> tuple[int, dict]:
    n = struct.unpack("<Q", data[:8])[0]
    return n, json.loads(data[8 : 8 + n])


# Inputs that exercise the writer's layout: every dtype numpy has in
# safetensors (mixed, so its dtype order matters), rank 0, zero-size,
# big-endian arrays (written little-endian), names JSON must escape, and
# names that sort differently as bytes and as text.
SAVE_CASES = {
    "empty": {},
    "one": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
    "every_dtype": {f"t_{n}": sample(d, (3, 2)) for n, d in NUMPY_DTYPES.items()},
    "same_width_mixed": {
        "a": sample(np.int32, (4,)),
        "b": sample(np.float32, (4,)),
        "c": sample(np.uint32, (4,)),
        "d": sample(np.int64, (2,)),
        "e": sample(np.float64, (2,)),
        "f": sample(np.uint64, (2,)),
        "g": np.ones(2, np.complex64),
        "h": sample(np.int16, (3,)),
        "i": sample(np.float16, (3,)),
        "j": sample(np.uint16, (3,)),
        "k": sample(np.bool_, (5,)),
        "l": sample(np.int8, (5,)),
        "m": sample(np.uint8, (5,)),
    },
    "shapes": {"scalar": np.array(3.5), "zero": np.zeros((0, 3), np.int8), "deep": np.zeros((1, 2, 1, 3), np.float16)},
    "big_endian": {"be": np.arange(5, dtype=">i4"), "bf": np.linspace(0, 1, 3).astype(">f8")},
    "names": {
        'q"uote': np.ones(1, np.int8),
        "back\\slash": np.ones(1, np.int8),
        "ünï": np.ones(2),
        "\n\t": np.ones(1),
        "Z": np.ones(1),
        "a.b": np.ones(1),
    },
}
METADATA_CASES = [None, {}, {"format": "np"}, {"ünicode": 'q"uo\\te'}]


@pytest.mark.parametrize("case", sorted(SAVE_CASES))
@pytest.mark.parametrize("metadata", METADATA_CASES, ids=["none", "empty", "one", "escaped"])
def test_save_and_save_file_are_byte_identical_to_safetensors(tmp, case, metadata):
    tensors = SAVE_CASES[case]
    want = safetensors.numpy.save(tensors, metadata=metadata)
    if not tensors and metadata == {}:
        # safetensors' one broken output: no tensors and an empty
        # metadata dict give the header `{},"__metadata__":{}}`, which
        # safetensors itself cannot read back. zt writes valid JSON.
        with pytest.raises(safetensors.SafetensorError):
            safetensors.numpy.load(want)
        assert zt.numpy.load(zt.numpy.save(tensors, metadata=metadata)) == {}
        return
    assert zt.numpy.save(tensors, metadata=metadata) == want
    safetensors.numpy.save_file(tensors, tmp / "st.safetensors", metadata=metadata)
    zt.numpy.save_file(tensors, tmp / "zt.safetensors", metadata=metadata)
    assert (tmp / "zt.safetensors").read_bytes() == (tmp / "st.safetensors").read_bytes() == want


def test_several_metadata_keys_differ_only_in_safetensors_own_order(tmp):
    # safetensors keeps __metadata__ in a Rust HashMap, so with two or more
    # keys its own output changes from run to run; zt writes the caller's
    # order. Everything else is identical.
    metadata = {f"k{i}": str(i) for i in range(6)}
    tensors = SAVE_CASES["same_width_mixed"]
    want, got = safetensors.numpy.save(tensors, metadata=metadata), zt.numpy.save(tensors, metadata=metadata)
    (n_want, h_want), (n_got, h_got) = st_header(want), st_header(got)
    assert n_got == n_want and h_got == h_want and got[8 + n_got :] == want[8 + n_want :]
    assert list(h_got["__metadata__"]) == list(metadata)


def test_load_and_load_file_match_safetensors_and_are_writable(tmp):
    import mmap

    tensors = {**SAVE_CASES["every_dtype"], **SAVE_CASES["shapes"]}
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file(tensors, path, metadata={"k": "v"})
    original = path.read_bytes()
    for got in (zt.numpy.load(original), zt.numpy.load_file(path), zt.numpy.load_file(path, backend="pread")):
        want = safetensors.numpy.load_file(path)
        assert got.keys() == want.keys()
        for name, arr in want.items():
            assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
            assert np.array_equal(got[name], arr), name
            assert got[name].flags.writeable, name
    # Writable without a copy: views of a private copy-on-write mapping.
    # A write changes the array, never the file.
    arrays = zt.numpy.load_file(path)
    w = arrays["t_f32"]
    base = memory_owner(w)
    assert isinstance(base, zt._zt.ArrayView) and not base.readonly
    w[...] = 7
    assert (w == 7).all() and path.read_bytes() == original
    assert np.array_equal(zt.numpy.load_file(path)["t_f32"], tensors["t_f32"])
    # Read-only views of the shared mapping on request, copies on request.
    assert not zt.numpy.load_file(path, readonly=True)["t_f32"].flags.writeable
    copied = zt.numpy.load_file(path, copy=True)["t_f32"]
    base = memory_owner(copied)
    assert copied.flags.writeable and not isinstance(base, mmap.mmap)


def test_writable_views_map_the_file_zt_opened_not_one_renamed_over_its_path(tmp):
    """The private mapping is made from the descriptor zt opened and
    validated: a file of the same layout renamed over the path afterwards
    (a checkpoint saved again) is not what the arrays show."""
    first = {"w": np.arange(4096, dtype=np.float32), "b": np.ones(3, np.float32)}
    second = {k: -v for k, v in first.items()}
    path, other = tmp / "m.safetensors", tmp / "next.safetensors"
    safetensors.numpy.save_file(first, path)
    safetensors.numpy.save_file(second, other)
    with zt.safe_open(path, "np") as f:
        os.replace(other, path)
        got = {k: f.get_tensor(k) for k in first}
    for k, v in first.items():
        np.testing.assert_array_equal(got[k], v)
        assert got[k].flags.writeable and not got[k].flags.owndata
    np.testing.assert_array_equal(zt.numpy.load_file(path)["w"], second["w"])


def test_save_file_names_and_format(tmp):
    tensors = SAVE_CASES["one"]
    want = safetensors.numpy.save(tensors)
    # Any name safetensors would write (no extension, an unknown one) is safetensors.
    for name in ("weights", "model.ckpt", "model.SAFETENSORS", "x.tmp"):
        zt.numpy.save_file(tensors, tmp / name)
        assert (tmp / name).read_bytes() == want, name
    # format= overrides the extension, for every writer.
    zt.numpy.save_file(tensors, tmp / "really.safetensors", format="npz")
    assert zt.detect(tmp / "really.safetensors") == "npz"
    assert np.array_equal(np.load(tmp / "really.safetensors")["w"], tensors["w"])
    zt.numpy.save_file(tensors, tmp / "m.npz", format="safetensors")
    assert (tmp / "m.npz").read_bytes() == want
    zt.numpy.save_file(tensors, tmp / "m.bin", format="zt")
    assert zt.detect(tmp / "m.bin") == "zt"
    assert zt.numpy.load(zt.numpy.save(tensors, format="npz"))["w"].tolist() == tensors["w"].tolist()
    zt.convert(tmp / "weights", tmp / "out.data", format="npz")
    assert np.array_equal(np.load(tmp / "out.data")["w"], tensors["w"])
    with pytest.raises(ValueError, match="no format"):
        zt.numpy.save_file(tensors, tmp / "x", format="tiff")


def test_refusals_are_value_errors(tmp):
    # safetensors.numpy refuses these too, though by accident (AttributeError
    # from a missing `.dtype`); zt says ValueError, as safetensors.torch does.
    for bad in ({"a": 3}, {"a": [1, 2]}):
        with pytest.raises(AttributeError):
            safetensors.numpy.save(bad)
        with pytest.raises(ValueError):
            zt.numpy.save(bad)
        with pytest.raises(ValueError):
            zt.numpy.save_file(bad, tmp / "x.safetensors")
    with pytest.raises(ValueError):
        zt.numpy.save([("a", np.ones(2))])
    with pytest.raises(ValueError):
        zt.numpy.save({"o": np.array([object()])})
    with pytest.raises(TypeError):
        zt.numpy.save({"a": np.ones(2)}, metadata={"k": 1})
    assert list(tmp.iterdir()) == []


def test_non_contiguous_arrays_are_written_as_their_values(tmp):
    # A deliberate difference: safetensors.numpy writes a non-contiguous
    # array's memory in storage order (a transpose comes back scrambled);
    # zt writes its values, which is what safetensors.torch insists on.
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert not np.array_equal(safetensors.numpy.load(safetensors.numpy.save({"t": a.T}))["t"], a.T)
    assert np.array_equal(zt.numpy.load(zt.numpy.save({"t": a.T}))["t"], a.T)
    assert zt.numpy.save({"t": a.T}) == safetensors.numpy.save({"t": np.ascontiguousarray(a.T)})


# Keys safetensors' get_slice takes, and ones only zt takes (numpy's rules:
# negative bounds, negative steps, bounds that clamp).
ST_KEYS = [
    0,
    -1,
    slice(None),
    (slice(None), 1),
    (Ellipsis, 1),
    (Ellipsis, slice(1, 3)),
    (slice(None, None, 2),),
    (0, slice(None, None, 2)),
    (slice(1, 3), slice(0, 5, 3)),
    (0, 0, 0),
    (Ellipsis,),
    (0, Ellipsis, 1),
    (slice(1, 2), Ellipsis, slice(None, None, 2)),
]
NUMPY_KEYS = [
    (slice(-2, None),),
    (slice(None, None, -1),),
    (slice(None), slice(None, None, -2), slice(-3, -1)),
    (slice(5, 9),),
    (slice(1, 100), slice(None, None, 7)),
    (-2, slice(None), -1),
]


def slice_fixture(tmp):
    arrays = {
        "a": np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6),
        "i": sample(np.int16, (7, 3, 2)),
        "e": np.zeros((0, 4, 3), np.float64),
    }
    path = tmp / "s.safetensors"
    safetensors.numpy.save_file(arrays, path, metadata={"k": "v"})
    return path, arrays


def test_safe_open_matches_safetensors(tmp):
    path, arrays = slice_fixture(tmp)
    with zt.safe_open(path, framework="np") as f, safetensors.safe_open(path, framework="np") as g:
        assert f.keys() == g.keys() and f.offset_keys() == g.offset_keys()
        assert f.metadata() == g.metadata() == {"k": "v"}
        for name in g.keys():  # noqa: SIM118 - safe_open's keys(), not a dict's
            want = g.get_tensor(name)
            got = f.get_tensor(name)
            assert got.dtype == want.dtype and np.array_equal(got, want) and got.flags.writeable
            s, r = f.get_slice(name), g.get_slice(name)
            assert s.get_shape() == r.get_shape() and s.get_dtype() == r.get_dtype()
            if name == "e":
                continue
            for key in ST_KEYS:
                try:
                    want = r[key]
                except safetensors.SafetensorError:
                    # safetensors refuses a bound past the end; numpy clamps.
                    want = arrays[name][key]
                got = s[key]
                assert got.shape == want.shape and got.dtype == want.dtype, (name, key)
                assert np.array_equal(got, want), (name, key)
                assert got.flags.writeable and got.flags.c_contiguous
            for key in NUMPY_KEYS:
                assert np.array_equal(s[key], arrays[name][key]), (name, key)
        assert {k: v.tolist() for k, v in f.get_tensors().items()} == {
            k: v.tolist() for k, v in g.get_tensors().items()
        }
        with pytest.raises(IndexError):
            f.get_slice("a")[4]
        with pytest.raises(IndexError):
            f.get_slice("a")[0, 0, 0, 0]
        with pytest.raises(KeyError):
            f.get_tensor("nope")
    # metadata() is None when the file has none, as safetensors says.
    safetensors.numpy.save_file(arrays, tmp / "bare.safetensors")
    with (
        zt.safe_open(tmp / "bare.safetensors", "numpy") as f,
        safetensors.safe_open(tmp / "bare.safetensors", "numpy") as g,
    ):
        assert f.metadata() is g.metadata() is None


def test_get_slice_for_every_format(tmp):
    """get_slice over every reader: raw stored bytes (safetensors, npy,
    stored npz, pt, zt, gguf), decoded ones (big-endian npy, deflated npz,
    zstd-seekable .zt, onnx typed fields), and the fallbacks (Fortran order,
    fp4): always what numpy indexing of the whole array gives."""
    import gguf
    import onnx
    from onnx import helper

    a = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)
    files = {}
    for ext in ("safetensors", "npz", "pt", "zt"):
        files[ext] = tmp / f"m.{ext}"
        zt.numpy.save_file({"a": a}, files[ext])
    files["zstd"] = tmp / "c.zt"
    zt.numpy.save_file({"a": a}, files["zstd"], compression=True)
    files["be"] = tmp / "a.npy"
    np.save(files["be"], a.astype(">f4"))
    files["fortran"] = tmp / "f" / "a.npy"
    files["fortran"].parent.mkdir()
    np.save(files["fortran"], np.asfortranarray(a))
    files["deflated"] = tmp / "d.npz"
    np.savez_compressed(files["deflated"], a=a)
    files["gguf"] = tmp / "m.gguf"
    w = gguf.GGUFWriter(files["gguf"], "llama")
    w.add_tensor("a", a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    files["onnx"] = tmp / "m.onnx"
    tp = helper.make_tensor("a", onnx.TensorProto.FLOAT, a.shape, a.reshape(-1).tolist())  # float_data, decoded
    onnx.save_model(helper.make_model(helper.make_graph([], "g", [], [], initializer=[tp])), files["onnx"])
    for (kind, path), backend in itertools.product(files.items(), ("mmap", "pread")):
        with zt.safe_open(path, "np", backend=backend) as f:
            s = f.get_slice("a")
            assert s.get_shape() == [6, 8] and s.get_dtype() == "F32", kind
            for key in ST_KEYS[:9] + NUMPY_KEYS:
                key = key if isinstance(key, tuple) else (key,)
                key = key[:2] if len(key) > 2 and Ellipsis not in key else key
                try:
                    want = a[key]
                except IndexError:
                    continue
                assert np.array_equal(s[key], want), (kind, backend, key)
    f4 = np.array([[0.5, 1.0, -2.0, 6.0], [0.0, 3.0, -0.5, 1.5]], dtype=ml_dtypes.float4_e2m1fn)
    zt.numpy.save_file({"f4": f4}, tmp / "f4.safetensors")
    with zt.safe_open(tmp / "f4.safetensors", "np") as f:
        assert f.get_slice("f4").get_dtype() == "F4"
        assert np.array_equal(f.get_slice("f4")[1, ::2], f4[1, ::2])


def test_get_slice_takes_what_safetensors_readme_passes(tmp):
    """`[]` (nothing of the first dimension), `()` (everything), and steps
    and bounds past 2**64, which numpy clamps: as numpy indexes the array,
    and as safetensors slices where it accepts the key."""
    path, arrays = slice_fixture(tmp)
    a = arrays["a"]
    big = 2**64
    keys = [
        [],
        (),
        slice(None, None, big),
        slice(3, None, -big),
        slice(big, None),
        slice(-big, big, 2),
        (slice(None), slice(None, None, -(2**65))),
        (Ellipsis, slice(1, None, big)),
    ]
    for backend in ("mmap", "pread"):
        with zt.safe_open(path, "np", backend=backend) as f, safetensors.safe_open(path, "np") as g:
            for key in keys:
                got, want = f.get_slice("a")[key], a[key]
                assert got.shape == want.shape and np.array_equal(got, want), (backend, key)
                assert got.flags.writeable and got.flags.c_contiguous
            for key in ([], (), slice(None, None, 2**62)):  # the ones safetensors takes
                assert np.array_equal(f.get_slice("a")[key], g.get_slice("a")[key]), key
            with pytest.raises(TypeError, match="empty"):
                f.get_slice("a")[[0, 1]]  # numpy's fancy indexing: safetensors refuses it too


def test_closed_safe_open_raises_format_error_where_safetensors_raises_its_error(tmp):
    path, _ = slice_fixture(tmp)
    calls = {
        "keys": lambda f: f.keys(),
        "offset_keys": lambda f: f.offset_keys(),
        "metadata": lambda f: f.metadata(),
        "get_tensor": lambda f: f.get_tensor("a"),
        "get_tensors": lambda f: f.get_tensors(),
        "get_slice": lambda f: f.get_slice("a"),
    }
    assert zt.SafetensorError is zt.FormatError
    with safetensors.safe_open(path, "np") as g, zt.safe_open(path, "np") as f:
        taken = f.get_slice("a")
    for call in calls.values():
        with pytest.raises(safetensors.SafetensorError):
            call(g)
        with pytest.raises(zt.FormatError, match="closed"):
            call(f)
    # A slice taken while open still reads, as safetensors' does.
    assert np.array_equal(taken[1], np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)[1])


def test_missing_file_is_worded_as_safetensors_words_it(tmp):
    missing = os.fspath(tmp / "notafile")
    with pytest.raises(FileNotFoundError) as want:
        safetensors.safe_open(missing, framework="np")
    with pytest.raises(FileNotFoundError) as got:
        zt.safe_open(missing, framework="np")
    assert str(got.value) == str(want.value) == f"No such file or directory: {missing}"


# TensorSpec dtype names, with arrays of their bytes as numpy holds them.
SPEC_ARRAYS = {
    **{np.dtype(d).name: d for d in NUMPY_DTYPES.values()},
    **{st_name: t for st_name, (_, t, _) in RAW_DTYPES.items()},
}


def spec_inputs() -> dict[str, np.ndarray]:
    """One array per TensorSpec dtype (fp4 as packed bytes), in every shape
    kind: a matrix, a scalar, an empty tensor."""
    out = {}
    for name, dtype in SPEC_ARRAYS.items():
        for shape in ((3, 4), (), (0, 5)):
            raw = RNG.integers(0, 256, size=int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
            out[f"{name}{list(shape)}"] = (name, list(shape), raw)
    out["float4_e2m1fn_x2[2, 3]"] = ("float4_e2m1fn_x2", [2, 3], RNG.integers(0, 256, size=6, dtype=np.uint8))
    return out


def specs(module, inputs) -> dict:
    return {
        key: module.TensorSpec(dtype=dtype, shape=shape, data_ptr=raw.ctypes.data, data_len=raw.nbytes)
        for key, (dtype, shape, raw) in inputs.items()
    }


@pytest.mark.parametrize("metadata", [None, {"format": "np"}], ids=["none", "meta"])
def test_tensorspec_serialize_and_serialize_file_are_byte_identical_to_safetensors(tmp, metadata):
    inputs = spec_inputs()
    got, want = specs(zt, inputs), specs(safetensors, inputs)
    for key in inputs:
        g, w = got[key], want[key]
        assert (g.dtype, g.shape, g.data_ptr, g.data_len, repr(g)) == (
            w.dtype,
            w.shape,
            w.data_ptr,
            w.data_len,
            repr(w),
        )
    data = safetensors.serialize(want, metadata=metadata)
    assert zt.serialize(got, metadata=metadata) == data
    # safetensors whatever the extension, as serialize_file writes it.
    for name in ("m.safetensors", "weights.npz"):
        safetensors.serialize_file(want, tmp / f"st-{name}", metadata=metadata)
        zt.serialize_file(got, tmp / name, metadata=metadata)
        assert (tmp / name).read_bytes() == (tmp / f"st-{name}").read_bytes() == data
    # And deserialize reads back what safetensors' does, in file order.
    assert sorted(zt.deserialize(data)) == sorted(safetensors.deserialize(data))
    assert [name for name, _ in zt.deserialize(data)] == zt.safe_open(tmp / "m.safetensors", "np").offset_keys()
    assert all(type(d["data"]) is bytearray for _, d in zt.deserialize(data))


def test_tensorspec_and_serialize_refuse_what_safetensors_refuses():
    raw = np.zeros(16, np.uint8)
    ptr = raw.ctypes.data
    cases = {
        "unknown_dtype": lambda m: m.TensorSpec(dtype="nonsense", shape=[1], data_ptr=0, data_len=0),
        "negative_dim": lambda m: m.TensorSpec(dtype="float32", shape=[-1], data_ptr=0, data_len=0),
        "str_shape": lambda m: m.TensorSpec(dtype="float32", shape="ab", data_ptr=0, data_len=0),
        "float_dim": lambda m: m.TensorSpec(dtype="float32", shape=[1.0], data_ptr=0, data_len=0),
        "negative_ptr": lambda m: m.TensorSpec(dtype="float32", shape=[1], data_ptr=-1, data_len=4),
        "positional": lambda m: m.TensorSpec("float32", [1], 0, 0),
        "raw_dict": lambda m: m.serialize({"t": {"dtype": "float32", "shape": [1], "data_ptr": 0, "data_len": 0}}),
        "short_data": lambda m: m.serialize({"t": m.TensorSpec(dtype="float32", shape=[4], data_ptr=ptr, data_len=15)}),
        "half_byte": lambda m: m.serialize(
            {"t": m.TensorSpec(dtype="float4_e2m1fn_x2", shape=[], data_ptr=ptr, data_len=1)}
        ),
        "int_metadata": lambda m: m.serialize({}, metadata={"k": 1}),
        "empty_bytes": lambda m: m.deserialize(b""),
    }
    for case, call in cases.items():
        with pytest.raises(Exception) as want:
            call(safetensors)
        with pytest.raises(Exception) as got:
            call(zt)
        if isinstance(want.value, safetensors.SafetensorError):
            assert isinstance(got.value, zt.SafetensorError), (case, got.value)
        else:
            assert type(got.value) is type(want.value), (case, got.value, want.value)
    # Bytes to read at address 0: safetensors reads there (the process
    # dies); zt refuses.
    with pytest.raises(zt.FormatError, match="data_ptr is 0"):
        zt.serialize({"t": zt.TensorSpec(dtype="float32", shape=[1], data_ptr=0, data_len=4)})


def test_safe_open_on_file_objects(tmp):
    """Open handles, as safetensors' `_safe_open_handle` takes them (a local
    file's, text mode included, opened by its name) and more: an fsspec
    handle of any filesystem or an io.BytesIO (copied to a temporary
    file). The handle's position is left where it was."""
    import io

    import fsspec

    path, arrays = slice_fixture(tmp)
    data = path.read_bytes()
    memory = fsspec.filesystem("memory")
    with memory.open("/zt-test/s.safetensors", "wb") as out:
        out.write(data)
    handles = {
        "text": lambda: open(path),  # noqa: SIM115 - closed below
        "binary": lambda: open(path, "rb"),  # noqa: SIM115
        "fsspec_local": lambda: fsspec.filesystem("file").open(os.fspath(path), "rb"),
        "fsspec_memory": lambda: memory.open("/zt-test/s.safetensors", "rb"),
        "bytesio": lambda: io.BytesIO(data),
    }
    for (kind, make), backend, opener in itertools.product(
        handles.items(), ("mmap", "pread"), (zt._safe_open_handle, zt.safe_open)
    ):
        handle = make()
        try:
            if kind != "text":
                handle.seek(5)
            with opener(handle, framework="np", backend=backend) as f:
                assert f.keys() == sorted(arrays) and f.metadata() == {"k": "v"}, kind
                for name, want in arrays.items():
                    assert np.array_equal(f.get_tensor(name), want), (kind, name)
                assert np.array_equal(f.get_slice("a")[1:3, ::2], arrays["a"][1:3, ::2])
            if kind != "text":
                assert handle.tell() == 5, kind
        finally:
            handle.close()
    # safetensors' own reads the same by name.
    with open(path) as handle, safetensors._safe_open_handle(handle, framework="np") as g:
        assert g.keys() == sorted(arrays)
    # A handle whose name now names another file reads the file it has open.
    with open(path, "rb") as handle:
        os.replace(path, tmp / "moved.safetensors")
        safetensors.numpy.save_file({"other": np.ones(2)}, path)
        with zt._safe_open_handle(handle, framework="np") as f:
            assert f.keys() == sorted(arrays)
    with pytest.raises(TypeError, match="binary"):
        zt.safe_open(io.StringIO("not bytes"), framework="np")


# What opening a remote object fetches from its start (zt_remote's HEAD_BYTES).
HEAD_FETCH = 1 << 20


def test_get_slice_over_s3_reads_only_the_slice(tmp, s3, bucket):
    """Tensor-parallel sharding of a remote checkpoint: a slice comes by
    ranged reads of the runs it covers, not the whole tensor. Runs closer
    than the remote planner's coalescing gap are fetched as one request, gap
    included (within its bound on read amplification), so a column block of
    a narrow matrix reads at most the span of its rows; of a wide one, only
    its own runs. What the open already fetched (the object's first MiB:
    the header and the first rows of `tall`) is served from memory, so the
    bytes moved may fall short of the slice by that much."""
    tall = RNG.standard_normal((2048, 1024)).astype(np.float32)
    wide = RNG.standard_normal((8, 1 << 19)).astype(np.float32)
    path = tmp / "big.safetensors"
    safetensors.numpy.save_file({"tall": tall, "wide": wide, "b": np.ones(3, np.float32)}, path)
    s3.boto3().upload_file(str(path), bucket, "big.safetensors")
    url = f"s3://{bucket}/big.safetensors"
    row = 1024 * 4
    cases = [
        ("tall", (slice(512, 768),), 256 * row, 256 * row),
        ("tall", (slice(1500, 1504), slice(None, None, 2)), 4 * row - 4, 4 * row),
        ("tall", (slice(None), slice(0, 128)), 2048 * 128 * 4, 2047 * row + 128 * 4),
        ("wide", (slice(None), slice(0, 1024)), 8 * 1024 * 4, 8 * 1024 * 4),
        ("wide", (slice(2, 6), slice(-4096, None, 3)), 4 * 1366 * 4, 4 * 4096 * 4),
    ]
    with zt.safe_open(url, "np") as f:
        for name, key, need, most in cases:
            before = zt.remote_stats()["bytes_in"]
            got = f.get_slice(name)[key]
            moved = zt.remote_stats()["bytes_in"] - before
            assert np.array_equal(got, {"tall": tall, "wide": wide}[name][key]), (name, key)
            assert need - HEAD_FETCH <= moved <= most, (name, key, moved)


# -- hostile files (issue 19): each runs in a child under RLIMIT_AS
# (tests/limited.py), so an abort fails the test instead of passing by luck.


def sparse_f32_file(path, n: int) -> None:
    """A valid safetensors file of one f32[n] tensor "w", its data a hole
    (sparse on disk, so a many-GiB file costs nothing)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + 4 * n)


def test_safetensors_copy_past_the_memory_limit_is_a_memory_error(tmp):
    """A valid 2.2 GiB file (sparse on disk), mapped, then read with
    copy=True in a process limited to 3 GiB of address space (the mapping
    fits, a second 2.2 GiB does not): MemoryError, never an abort."""
    path, n = tmp / "big.safetensors", (2200 << 20) // 4
    sparse_f32_file(path, n)
    code = f"src = zt.open({os.fspath(path)!r})\nassert src['w'].numpy().shape == ({n},)\nsrc['w'].numpy(copy=True)"
    got = limited.run(code, limit=3 * GiB)
    assert got["kind"] == "MemoryError" and "big.safetensors" in got["message"], got


def test_a_mapping_past_the_address_space_limit_is_a_memory_error(tmp):
    """A valid 5 GiB file (sparse on disk) opened in a process limited to
    3 GiB of address space: the whole-file mapping cannot be made, which is
    a MemoryError naming the file and the way around it (it was an OSError,
    ENOMEM); map=False opens the same file with positional reads."""
    path, n = tmp / "huge.safetensors", (5 << 30) // 4
    sparse_f32_file(path, n)
    got = limited.run(f"zt.open({os.fspath(path)!r})", limit=3 * GiB)
    assert got["kind"] == "MemoryError", got
    assert "huge.safetensors" in got["message"] and "map=False" in got["message"], got
    code = f"src = zt.open({os.fspath(path)!r}, map=False)\nassert src['w'].shape == ({n},)"
    assert limited.run(code, limit=3 * GiB)["kind"] == "none"


def test_a_file_that_shrinks_under_a_positional_source_is_a_format_error(tmp):
    """map=False is the safe path the README offers for files that may
    change: a file truncated after open fails the read with a FormatError
    saying the file shrank, in this process (a mapped view would SIGBUS)."""
    path = tmp / "shrinks.safetensors"
    safetensors.numpy.save_file({"a": np.arange(4096, dtype=np.float32)}, path)
    with zt.open(path, map=False) as src:
        os.truncate(path, 1024)
        with pytest.raises(zt.FormatError, match="shrank after it was opened"):
            src["a"].numpy()
        with pytest.raises(zt.FormatError, match="shrank"):
            src["a"].numpy(copy=True)


def test_zero_element_tensor_with_a_huge_dim_is_a_format_error(tmp):
    path = tmp / "zero.safetensors"
    header = json.dumps({"a": {"dtype": "F32", "shape": [0, 2**64 - 1], "data_offsets": [0, 0]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    got = limited.run(f"src = zt.open({os.fspath(path)!r})\nsrc['a'].numpy()")
    assert got["kind"] == "FormatError" and "2^63" in got["message"], got


def test_safetensors_header_json_nested_100000_deep_is_a_format_error(tmp):
    """`__metadata__` holding arrays 100,000 deep: the JSON parser's depth
    bound refuses it (no stack overflow), as safetensors itself does."""
    header = b'{"__metadata__":{"k":' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
    path = tmp / "deep.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(safetensors.SafetensorError):
        safetensors.safe_open(path, "np")
    got = limited.run(f"zt.open({os.fspath(path)!r})")
    assert got["kind"] == "FormatError" and "deep.safetensors" in got["message"], got
