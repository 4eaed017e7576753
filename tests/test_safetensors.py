"""safetensors files written by the reference library, read back through zt
and compared bit for bit."""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy

import zt

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
    with pytest.raises(zt.FormatError, match="layer.1.w"):
        zt.open(index)
    # An index that points outside its directory is refused.
    index.write_text(json.dumps({"weight_map": {"x": "../escape.safetensors"}}))
    with pytest.raises(zt.FormatError, match="leaves"):
        zt.open(index)


def test_open_all_merges_and_refuses_collisions(tmp):
    safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, tmp / "1.safetensors")
    safetensors.numpy.save_file({"b": np.ones(3, np.int8)}, tmp / "2.safetensors")
    safetensors.numpy.save_file({"a": np.ones(2, np.float32)}, tmp / "3.safetensors")
    with zt.open([tmp / "1.safetensors", tmp / "2.safetensors"]) as src:
        assert sorted(src) == ["a", "b"] and len(src.files) == 2
    with pytest.raises(zt.FormatError, match="duplicate"):
        zt.open([tmp / "1.safetensors", tmp / "3.safetensors"])


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
