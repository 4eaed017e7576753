"""HDF5 written by zt (`.h5` destinations, issue 42), read by h5py (libhdf5)
bit for bit and by zt's own reader; refusals cite `h5.*`/`write.*` rules and
leave nothing at the destination. Keras's layout is in test_keras.py."""

from __future__ import annotations

import json
import os

import h5py
import ml_dtypes
import numpy as np
import pytest

import zt
import zt.numpy

RNG = np.random.default_rng(42)

NATIVE = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16", "?"]
# ml_dtypes' types h5py has no type for, by the name zt marks them with.
ML = {
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}


def sample(dtype, shape) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return RNG.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    if dt.kind == "f":
        return RNG.standard_normal(shape).astype(dt)
    # ml_dtypes: every bit pattern.
    return RNG.integers(0, 256, size=shape, dtype=np.uint8).view(dt)


def every_dtype() -> dict[str, np.ndarray]:
    tensors = {}
    for i, code in enumerate(NATIVE):
        tensors[f"native/{code}/x"] = sample(code, (3, 5 + i))
    tensors["bf16/w"] = RNG.integers(0, 1 << 16, size=(4, 7), dtype=np.uint16).view(ml_dtypes.bfloat16)
    for name, dt in ML.items():
        tensors[f"ml/{name}"] = sample(dt, (2, 9))
    tensors["scalar"] = np.array(2.5, dtype="f8")
    tensors["empty"] = np.zeros((0, 3), dtype="f4")
    tensors["deep/a/b/c/d/e"] = sample("i4", (17,))
    tensors["odd/ünïcode"] = sample("u1", (3,))
    return tensors


def test_every_dtype_reads_in_h5py_and_zt_bit_for_bit(tmp):
    tensors = every_dtype()
    path = tmp / "all.h5"
    written = zt.numpy.save_file(tensors, path)
    assert written == os.path.getsize(path)
    with h5py.File(path, "r") as f:
        seen = []
        f.visititems(lambda n, o: seen.append(n) if isinstance(o, h5py.Dataset) else None)
        assert sorted(seen) == sorted(tensors)
        for name, want in tensors.items():
            ds = f[name]
            got = ds[()]
            assert ds.shape == want.shape, name
            assert ds.chunks is None and ds.compression is None, name  # contiguous
            if want.dtype == ml_dtypes.bfloat16:
                # HDF5's float with bfloat16's fields: libhdf5 converts it to
                # float32, every value exact.
                assert got.dtype == np.float32, name
                assert got.tobytes() == want.astype(np.float32).tobytes(), name
                assert "dtype" not in ds.attrs
            elif want.dtype.name in ML:
                assert got.dtype == np.dtype("V1"), name
                assert got.tobytes() == want.tobytes(), name
                assert ds.attrs["dtype"] == want.dtype.name
            else:
                assert got.dtype == want.dtype, name
                assert np.asarray(got).tobytes() == want.tobytes(), name
    back = zt.numpy.load_file(path)
    assert sorted(back) == sorted(tensors)
    for name, want in tensors.items():
        assert back[name].dtype == want.dtype, name
        assert back[name].shape == want.shape, name
        assert back[name].tobytes() == want.tobytes(), name
    assert zt.detect(path) == "h5"


def test_datasets_are_aligned_and_read_in_place(tmp):
    tensors = {"a": sample("f8", (3,)), "b/c": sample("c16", (5, 3)), "d": sample("u1", (7,))}
    path = tmp / "aligned.h5"
    zt.numpy.save_file(tensors, path)
    with h5py.File(path, "r") as f:
        for name in tensors:
            assert f[name].id.get_offset() % 64 == 0, name
    with zt.open(path) as src:
        for name in tensors:
            assert src[name].caps["map"], name


def test_metadata_becomes_attributes(tmp):
    tensors = {"layers/dense/vars/0": sample("f4", (2, 2))}
    metadata = {
        "note": "hello",
        "n": 3,
        "x": 1.5,
        "flag": True,
        "ints": [1, 2, 3],
        "floats": [1.5, 2],
        "strs": ["a", "bb", ""],
        "big": "x" * 100_000,
        "layers/dense/vars/name": "d1",
        "extra/group/k": "made for its attribute",
    }
    path = tmp / "attrs.h5"
    zt.numpy.save_file(tensors, path, metadata=metadata)
    with h5py.File(path, "r") as f:
        assert f.attrs["note"] == "hello"
        assert f.attrs["n"] == 3 and f.attrs["n"].dtype == np.int64
        assert f.attrs["x"] == 1.5
        assert f.attrs["flag"] is np.True_ or f.attrs["flag"] == True  # noqa: E712
        assert f.attrs["ints"].tolist() == [1, 2, 3]
        assert f.attrs["floats"].tolist() == [1.5, 2.0]
        assert list(f.attrs["strs"]) == ["a", "bb", ""]
        assert f.attrs["big"] == "x" * 100_000
        assert f["layers/dense/vars"].attrs["name"] == "d1"
        assert f["extra/group"].attrs["k"] == "made for its attribute"
    with zt.open(path) as src:
        attrs = src.attributes
        for key, value in metadata.items():
            assert attrs[key] == value, key


def test_keras_layout_writes_bfloat16_as_keras_does(tmp):
    w = RNG.standard_normal((3, 2)).astype(ml_dtypes.bfloat16)
    path = tmp / "m.weights.h5"
    zt.numpy.save_file({"layers/dense/vars/0": w}, path, layout="keras")
    with h5py.File(path, "r") as f:
        ds = f["layers/dense/vars/0"]
        assert ds.dtype == np.dtype("V2") and ds.attrs["dtype"] == "bfloat16"
        assert np.array(ds, dtype=ml_dtypes.bfloat16).tobytes() == w.tobytes()
    back = zt.numpy.load_file(path)
    assert back["layers/dense/vars/0"].dtype == ml_dtypes.bfloat16
    assert back["layers/dense/vars/0"].tobytes() == w.tobytes()


def test_convert_to_h5_from_safetensors(tmp):
    tensors = {"model.embed": sample("f4", (8, 4)), "model.bias": sample("f2", (4,))}
    src = tmp / "m.safetensors"
    zt.numpy.save_file(tensors, src)
    dst = tmp / "m.h5"
    zt.convert(src, dst)
    with h5py.File(dst, "r") as f:
        for name, want in tensors.items():
            assert f[name][()].tobytes() == want.tobytes()


# Dataset attributes as h5py writes them: every kind zt's reader lists and
# its writer writes back (a float32 scalar is listed as a float and comes
# back float64, as a float in metadata does).
DATASET_ATTRS = {
    "units": "m/s",
    "n": np.int64(-3),
    "big": np.uint64(1 << 63),
    "x": 1.25,
    "x32": np.float32(0.5),
    "flag": np.True_,
    "ints": np.array([1, 2, 3], dtype="i8"),
    "floats": np.array([1.5, -2.0]),
    "names": np.array(["a", "bb", ""], dtype=h5py.string_dtype()),
}


def h5py_attrs(path) -> dict[str, dict]:
    """Every dataset's attributes as h5py reads them."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, dict(o.attrs)) if isinstance(o, h5py.Dataset) else None)
    return out


def same_attr(got, want) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if want.dtype.kind in "OSU":
        return got.tolist() == want.tolist()
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def test_a_conversion_to_hdf5_keeps_each_datasets_attributes(tmp):
    """Issue 42: HDF5 to HDF5 keeps what h5py lists in each dataset's
    `attrs`, each encoded as save_file encodes the same value given as
    metadata (a file attribute); a Keras `dtype` marker is the writer's
    own, never carried as a stale copy."""
    src = tmp / "src.h5"
    a, b = sample("f4", (3, 4)), sample("i2", (5,))
    bf = RNG.integers(0, 1 << 16, size=(2, 3), dtype=np.uint16).view(ml_dtypes.bfloat16)
    with h5py.File(src, "w") as f:
        ds = f.create_dataset("g/a", data=a)
        for k, v in DATASET_ATTRS.items():
            ds.attrs[k] = v
        f.create_dataset("g/h/b", data=b).attrs["only"] = "b's"
        # Keras's bfloat16: opaque 2-byte elements marked `dtype`.
        kb = f.create_dataset("k", data=bf.view(np.uint16).view("V2"))
        kb.attrs["dtype"] = "bfloat16"
        kb.attrs["note"] = "kept"
        f.attrs["file_note"] = "root"
    dst = tmp / "dst.h5"
    zt.convert(src, dst)
    got, want = h5py_attrs(dst), h5py_attrs(src)
    assert sorted(got) == ["g/a", "g/h/b", "k"]
    # As save_file writes the values zt reads from the source.
    with zt.open(src) as s:
        metadata = dict(s["g/a"].attributes)
    ref = tmp / "ref.h5"
    zt.numpy.save_file({"t": a}, ref, metadata=metadata)
    with h5py.File(ref, "r") as f:
        as_metadata = dict(f.attrs)
    assert sorted(got["g/a"]) == sorted(as_metadata) == sorted(DATASET_ATTRS)
    for k in DATASET_ATTRS:
        assert same_attr(got["g/a"][k], as_metadata[k]), k
    # ... which is what h5py wrote, but the float32 scalar widened.
    for k in DATASET_ATTRS:
        if k != "x32":
            assert same_attr(got["g/a"][k], want["g/a"][k]), k
    assert got["g/a"]["x32"] == 0.5 and got["g/a"]["x32"].dtype == np.float64
    assert got["g/h/b"] == {"only": "b's"}
    # Plain HDF5 writes bfloat16 as its own float type: no marker left.
    assert got["k"] == {"note": "kept"}
    with h5py.File(dst, "r") as f:
        assert f.attrs["file_note"] == "root"
        assert f["g/a"][()].tobytes() == a.tobytes() and f["g/h/b"][()].tobytes() == b.tobytes()
        assert np.array_equal(f["k"][()], bf.astype(np.float32))
    # Read back by zt: the same attributes, the same tensors.
    with zt.open(dst) as d, zt.open(src) as s:
        for name in ("g/a", "g/h/b", "k"):
            assert d[name].attributes == {k: v for k, v in s[name].attributes.items() if k != "dtype"}, name
            assert d[name].numpy().tobytes() == s[name].numpy().tobytes(), name


def test_per_tensor_attributes_of_a_zt_file_become_dataset_attributes(tmp):
    src = tmp / "m.zt"
    w = zt.Writer(src)
    w.add("enc/b", sample("f4", (2,)))
    w.add_object("enc/w", [2, 2], {"data": sample("f4", (2, 2))}, attributes={"role": "weight", "k": 7})
    w.finish()
    dst = tmp / "m.h5"
    zt.convert(src, dst)
    got = h5py_attrs(dst)
    assert got["enc/w"] == {"role": "weight", "k": 7} and got["enc/b"] == {}
    assert got["enc/w"]["k"].dtype == np.int64


# --- refusals -----------------------------------------------------------------


def refused(tmp, tensors, rule, **kw):
    path = tmp / "r.h5"
    with pytest.raises(zt.FormatError) as info:
        zt.numpy.save_file(tensors, path, **kw)
    assert info.value.rule == rule, info.value
    # Nothing at the destination, no partial left beside it.
    assert os.listdir(tmp) == [], os.listdir(tmp)
    return info.value


@pytest.mark.parametrize("name", ["", "/a", "a/", "a//b", "./a"])
def test_names_hdf5_cannot_hold_are_refused(tmp, name):
    refused(tmp, {name: np.zeros(2)}, "h5.Name")


def test_a_name_both_dataset_and_group_is_refused(tmp):
    refused(tmp, {"a": np.zeros(2), "a/b": np.zeros(2)}, "h5.Name")


def test_packed_dtypes_are_refused(tmp):
    refused(tmp, {"a": np.zeros(4, dtype=ml_dtypes.float4_e2m1fn)}, "write.DType")


@pytest.mark.parametrize(
    "metadata",
    [{"a/x": 1}, {"big": list(range(10_000))}],
    ids=["on-a-dataset", "past-an-attribute-message"],
)
def test_metadata_hdf5_cannot_hold_is_refused(tmp, metadata):
    refused(tmp, {"a": np.zeros(2)}, "h5.Attribute", metadata=metadata)


def test_maps_and_mixed_lists_are_stored_as_json_text(tmp):
    path = tmp / "json.h5"
    metadata = {"m": {"nested": [1, "a"]}, "l": [1, "a", None]}
    zt.numpy.save_file({"a": np.zeros(2)}, path, metadata=metadata)
    with h5py.File(path, "r") as f:
        assert json.loads(f.attrs["m"]) == metadata["m"]
        assert json.loads(f.attrs["l"]) == metadata["l"]


def test_keras_layout_refuses_names_that_are_not_variable_paths(tmp):
    refused(tmp, {"dense/kernel": np.zeros(2)}, "h5.Keras", layout="keras")


def test_a_failed_write_leaves_the_old_file(tmp):
    path = tmp / "keep.h5"
    zt.numpy.save_file({"a": np.arange(3)}, path)
    before = path.read_bytes()
    with pytest.raises(zt.FormatError):
        zt.numpy.save_file({"a": np.zeros(2), "a/b": np.zeros(2)}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp) == ["keep.h5"]
