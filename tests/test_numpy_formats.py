""".npy and .npz files written by numpy itself, read back through zt and
compared bit for bit."""

from __future__ import annotations

import io
import os
import struct
import zipfile

import limited
import ml_dtypes
import numpy as np
import pytest

import zt

GiB = limited.GiB

RNG = np.random.default_rng(1)

DTYPES = ["<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "<u2", "|u1", "|b1", "<c8", "<c16"]
ZT_NAMES = {
    "f8": "f64",
    "f4": "f32",
    "f2": "f16",
    "i8": "i64",
    "i4": "i32",
    "i2": "i16",
    "i1": "i8",
    "u8": "u64",
    "u4": "u32",
    "u2": "u16",
    "u1": "u8",
    "b1": "bool",
    "c8": "complex64",
    "c16": "complex128",
}


def sample(dtype: str, shape) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return RNG.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt.newbyteorder("=")).astype(dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    return RNG.standard_normal(shape).astype(dt)


def assert_same(t: zt.Tensor, want: np.ndarray) -> None:
    got = t.numpy()
    assert got.shape == want.shape
    little = want.dtype.newbyteorder("<") if want.dtype.byteorder == ">" else want.dtype
    assert got.dtype == little
    np.testing.assert_array_equal(got, want)
    assert t.tobytes() == np.ascontiguousarray(want).astype(want.dtype.newbyteorder("<")).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 4), (), (0,), (2, 3, 5)])
def test_npy_every_dtype(tmp, dtype, shape):
    want = sample(dtype, shape)
    path = tmp / "a.npy"
    np.save(path, want)
    assert zt.detect(path) == "npy"
    with zt.open(path) as src:
        (t,) = src.values()
        assert t.dtype == ZT_NAMES[dtype[1:]]
        assert_same(t, want)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_format_versions(tmp, version):
    want = sample("<f4", (7, 3))
    path = tmp / "v.npy"
    with open(path, "wb") as f:
        np.lib.format.write_array(f, want, version=version)
    with zt.open(path) as src:
        assert_same(src["v"], want)


def test_npy_fortran_order_has_strides_not_transposed_data(tmp):
    want = np.asfortranarray(sample("<f4", (3, 5)))
    path = tmp / "f.npy"
    np.save(path, want)
    with zt.open(path) as src:
        t = src["f"]
        got = t.numpy()
        np.testing.assert_array_equal(got, want)
        assert got.flags.f_contiguous and not got.flags.c_contiguous
        assert t.caps["map"]  # still zero-copy: the strides describe the stored order
        assert t.tobytes() == np.ascontiguousarray(want).tobytes()  # C order on request
        assert t.numpy(copy=True).flags.c_contiguous


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">c16", ">u2"])
def test_npy_big_endian_is_swapped_never_mapped(tmp, dtype):
    want = sample(dtype, (4, 3))
    path = tmp / "be.npy"
    np.save(path, want)
    with zt.open(path) as src:
        t = src["be"]
        assert t.caps["map"] is False
        np.testing.assert_array_equal(t.numpy(), want)
        assert t.numpy().dtype.byteorder in "<="


def test_npy_big_endian_fortran(tmp):
    want = np.asfortranarray(sample(">f8", (3, 4)))
    path = tmp / "bf.npy"
    np.save(path, want)
    with zt.open(path) as src:
        np.testing.assert_array_equal(src["bf"].numpy(), want)
        np.testing.assert_array_equal(np.frombuffer(src["bf"].tobytes(), "<f8").reshape(3, 4), want)


def test_object_arrays_are_refused(tmp):
    path = tmp / "o.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(zt.FormatError, match="dtype") as info:
        zt.open(path)
    assert info.value.rule == "core.DType"


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_stored_and_deflated(tmp, compressed):
    arrays = {f"x{d[1:]}": sample(d, (5, 6)) for d in DTYPES}
    arrays["scalar"] = sample("<f8", ())
    arrays["empty"] = sample("<i4", (0, 3))
    arrays["fortran"] = np.asfortranarray(sample("<f4", (4, 6)))
    arrays["bigendian"] = sample(">i4", (3,))
    arrays["nested/name"] = sample("<u2", (2,))
    path = tmp / "a.npz"
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    assert zt.detect(path) == "npz"
    reference = np.load(path)
    with zt.open(path) as src:
        assert sorted(src) == sorted(reference.files)
        for name in arrays:
            t = src[name]
            np.testing.assert_array_equal(t.numpy(), reference[name])
            if compressed:
                assert t.caps["map"] is False and t.location is None
    ours = zt.numpy.load_file(path)
    for name in arrays:
        np.testing.assert_array_equal(ours[name], reference[name])


def test_npz_positional_names(tmp):
    path = tmp / "p.npz"
    np.savez(path, np.arange(3), np.ones((2, 2)))
    with zt.open(path) as src:
        assert sorted(src) == ["arr_0", "arr_1"]


@pytest.mark.parametrize("comment_len", [0, 100, 4096, 30_000, 65_535])
def test_npz_with_an_archive_comment(tmp, comment_len):
    # The end record is looked for in the archive's last 4 KiB first, then
    # in the whole window a comment allows: either way numpy's arrays.
    path = tmp / "c.npz"
    arrays = {"a": sample("<f4", (7, 3)), "b": np.arange(10, dtype=np.int64)}
    np.savez(path, **arrays)
    with zipfile.ZipFile(path, "a") as z:
        z.comment = b"c" * comment_len
    with np.load(path) as want:
        got = zt.numpy.load_file(path)
        assert sorted(got) == sorted(want.files)
        for name in want.files:
            assert got[name].tobytes() == want[name].tobytes(), name


def test_npz_large_member_zip64(tmp):
    # numpy forces zip64 local headers on every member; a 5 MiB member
    # exercises the extra-field path with real sizes.
    want = sample("<f4", (1280, 1024))
    path = tmp / "big.npz"
    np.savez(path, big=want)
    with zt.open(path) as src:
        np.testing.assert_array_equal(src["big"].numpy(), want)


def test_zt_writes_npz_and_npy_numpy_reads(tmp):
    arrays = {"a": sample("<f4", (3, 4)), "b": sample("|b1", ()), "c": sample("<c8", (2,))}
    zt.numpy.save_file(arrays, tmp / "o.npz")
    ref = np.load(tmp / "o.npz")
    for k, v in arrays.items():
        np.testing.assert_array_equal(ref[k], v)
        assert ref[k].dtype == v.dtype
    zt.numpy.save_file({"x": arrays["a"]}, tmp / "o.npy")
    np.testing.assert_array_equal(np.load(tmp / "o.npy"), arrays["a"])


def test_deflate_bomb_fails_cleanly(tmp):
    # A member that declares a small array but inflates to 64 MiB of zeros.
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (4,)})
    payload = header.getvalue() + b"\0" * (64 << 20)
    path = tmp / "bomb.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", payload)
    with pytest.raises(zt.FormatError) as info:
        src = zt.open(path)
        src["x"].numpy()
    assert info.value.rule == "npy.Size"
    # And a member that honestly declares a huge size is refused by the limits.
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (16 << 20,)})
    path2 = tmp / "huge.npz"
    with zipfile.ZipFile(path2, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", header.getvalue() + b"\0" * (64 << 20))
    with pytest.raises(zt.FormatError, match="limit") as info:
        zt.open(path2, limits={"decoded_bytes": 1 << 20})
    assert info.value.rule == "core.Limit"


# Dtypes numpy reads without unpickling but zt has no element type for:
# read as numpy reads them, the same numpy dtype over the same bytes.
RECORD_DTYPES = {
    "structured": np.dtype([("a", "<i4"), ("b", "<f8", (2,)), ("s", "S3")]),
    "aligned": np.dtype([("x", "u1"), ("y", "<f8")], align=True),  # padding fields
    "nested": np.dtype([("p", [("x", "<f4"), ("y", "<f4")]), ("id", "<u8")]),
    "titles": np.dtype({"names": ["n"], "formats": ["<i2"], "titles": ["The title"]}),
    "big_endian_fields": np.dtype([("be", ">i4"), ("le", "<u2")]),
    "unicode": np.dtype("<U7"),
    "bytes": np.dtype("S5"),
    "void": np.dtype("V6"),
    "datetime": np.dtype("<M8[ms]"),
    "timedelta": np.dtype("<m8[s]"),
    "long_double": np.dtype(np.longdouble),
}


def record_sample(dtype: np.dtype, shape) -> np.ndarray:
    raw = RNG.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    arr = raw.view(dtype).reshape(shape).copy()
    if dtype.kind == "U":
        arr[...] = "héllo"[: dtype.itemsize // 4]
    return arr


def same_bytes(got: np.ndarray, want: np.ndarray) -> None:
    """Same dtype, shape and bits, field by field: numpy leaves the padding
    between fields of an array it reads from a zip uninitialised (it assigns
    fields), where zt's bytes are the file's."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.names:
        for name in got.dtype.names:
            same_bytes(got[name], want[name])
    else:
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("kind", sorted(RECORD_DTYPES))
@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_dtypes_read_as_numpy_reads_them(tmp, kind, order):
    arr = record_sample(RECORD_DTYPES[kind], (3, 4))
    if order == "F":
        arr = np.asfortranarray(arr)
    np.save(tmp / "r.npy", arr)
    want = np.load(tmp / "r.npy")
    with zt.open(tmp / "r.npy") as src:
        t = src["r"]
        assert t.layout == "npy.descr/1" and t.shape == (3, 4)
        same_bytes(t.numpy(), want)
        same_bytes(t.numpy(copy=True), want)
    for got in (zt.numpy.load_file(tmp / "r.npy"), zt.numpy.load((tmp / "r.npy").read_bytes())):
        (arr,) = got.values()  # from bytes, a lone array is "arr_0", as np.savez names it
        same_bytes(arr, want)
        assert arr.flags.writeable
    with zt.safe_open(tmp / "r.npy", "np") as f:
        same_bytes(f.get_tensor("r"), want)
        same_bytes(f.get_slice("r")[1:, ::2], want[1:, ::2])


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_with_records_and_object_members(tmp, compressed):
    """An archive with structured and string members reads whole; an object
    member (a pickle, which numpy.load refuses without allow_pickle) is
    listed in `npz.skipped` instead of refusing the archive."""
    members = {k: record_sample(d, (5,)) for k, d in RECORD_DTYPES.items()}
    members["plain"] = np.arange(4.0)
    members["objects"] = np.array([1, "two", None], dtype=object)
    (np.savez_compressed if compressed else np.savez)(tmp / "a.npz", **members)
    with np.load(tmp / "a.npz") as want, zt.open(tmp / "a.npz") as src:
        assert set(src) == set(members) - {"objects"}
        for name in src:
            same_bytes(src[name].numpy(), want[name])
        with pytest.raises(ValueError):
            want["objects"]  # numpy refuses it too, without allow_pickle
        assert [e["name"] for e in src.attributes["npz.skipped"]] == ["objects"]
    got = zt.numpy.load_file(tmp / "a.npz")
    assert set(got) == set(members) - {"objects"}
    same_bytes(got["structured"], members["structured"])


def test_record_arrays_survive_a_zt_round_trip(tmp):
    """A .zt file keeps an `npy.descr/1` object structurally (upstream
    ztensor reads it as one), and zt views it as numpy's dtype again; a
    format with no such layout refuses it by name."""
    import ztensor

    arr = record_sample(RECORD_DTYPES["structured"], (2, 3))
    np.savez(tmp / "r.npz", r=arr, f=np.ones(2))
    zt.convert(tmp / "r.npz", tmp / "r.zt")
    with zt.open(tmp / "r.zt") as src:
        same_bytes(src["r"].numpy(), arr)
    assert ztensor.open(str(tmp / "r.zt"))["r"].layout == "npy.descr/1"
    with pytest.raises(zt.FormatError, match="npy.descr/1") as info:
        zt.convert(tmp / "r.npz", tmp / "r.safetensors")
    assert info.value.rule == "write.DType"


# -- hostile files (issue 19): each runs in a child under RLIMIT_AS
# (tests/limited.py), so an abort fails the test instead of passing by luck.


def test_npz_deflate_member_past_the_memory_limit_is_a_memory_error(tmp):
    """A real deflated member of 1.25 GiB of zeros (written through
    zipfile as numpy.savez_compressed writes it, streamed), read in a
    process limited to 1 GiB."""
    path = tmp / "zeros.npz"
    n = 1280 << 20
    header = {"descr": "|u1", "fortran_order": False, "shape": (n,)}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("x.npy", "w", force_zip64=True) as m:
            np.lib.format.write_array_header_1_0(m, header)
            chunk = bytes(64 << 20)
            for _ in range(n // len(chunk)):
                m.write(chunk)
    assert np.load(path)["x"].shape == (n,)  # valid for numpy
    got = limited.run(f"zt.open({os.fspath(path)!r})['x'].numpy()", limit=1 * GiB)
    assert got["kind"] == "MemoryError" and "zeros.npz" in got["message"], got


def test_npz_stored_member_with_bad_crc_is_refused_at_first_read(tmp):
    path = tmp / "bad.npz"
    np.savez(path, x=np.arange(1000, dtype=np.float32), y=np.ones(3, np.int64))
    raw = bytearray(path.read_bytes())
    at = raw.index(np.arange(1000, dtype=np.float32)[500:502].tobytes())
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile, match="CRC"):  # the reference refuses it
        np.load(path)["x"]
    with zt.open(path) as src:  # open stays metadata-only
        assert src["x"].shape == (1000,)
        np.testing.assert_array_equal(src["y"].numpy(), np.ones(3, np.int64))
        for _ in range(2):  # refused every time, never handed out
            with pytest.raises(zt.FormatError, match="CRC") as info:
                src["x"].numpy()
            assert info.value.rule == "npz.Crc"
    with pytest.raises(zt.FormatError, match="CRC") as info:
        zt.verify(path)
    assert info.value.rule == "npz.Crc"


@pytest.mark.parametrize(
    "load",
    [
        pytest.param(lambda p: zt.numpy.load_file(p), id="load_file"),
        pytest.param(lambda p: zt.numpy.load_file(p, readonly=True), id="load_file-readonly"),
        pytest.param(lambda p: zt.numpy.load_file(p, copy=True), id="load_file-copy"),
        pytest.param(lambda p: zt.numpy.load(p.read_bytes()), id="load-bytes"),
        pytest.param(lambda p: zt.safe_open(p, "np").get_tensor("x"), id="safe_open"),
        pytest.param(lambda p: zt.numpy.load_into({"x": np.empty(1000, np.float32)}, p), id="load_into"),
    ],
)
def test_npz_member_with_bad_crc_is_refused_by_every_whole_load(tmp, load):
    """Writable loads view a private mapping of the file (`zt._load`),
    which zt's own reads never touch: the view runs the member's CRC
    itself, so no path hands out bytes numpy.load would refuse. (The
    writable load_file and safe_open once returned them.)"""
    path = tmp / "bad.npz"
    np.savez(path, x=np.arange(1000, dtype=np.float32))
    raw = bytearray(path.read_bytes())
    raw[raw.index(np.arange(1000, dtype=np.float32)[500:502].tobytes())] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(zt.FormatError, match="CRC") as info:
        load(path)
    assert info.value.rule == "npz.Crc"


@pytest.mark.parametrize("where", [0.1, 0.5, 0.99])
def test_npz_large_member_crc_is_checked_in_pieces(tmp, where):
    """A member big enough to be hashed on several threads: a flipped byte
    in any piece is found, and the intact member reads (the pieces' CRCs,
    combined, are the archive's)."""
    x = np.arange(20 << 20, dtype=np.float32)  # 80 MiB
    good, bad = tmp / "good.npz", tmp / "bad.npz"
    np.savez(good, x=x)
    raw = bytearray(good.read_bytes())
    raw[200 + int((len(raw) - 400) * where)] ^= 0x01  # inside the member's data (headers < 200 bytes)
    bad.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        np.load(bad)["x"]
    with zt.open(good) as src:
        np.testing.assert_array_equal(src["x"].numpy(), x)
    with zt.open(bad) as src, pytest.raises(zt.FormatError, match="CRC") as info:
        src["x"].numpy()
    assert info.value.rule == "npz.Crc"


@pytest.mark.parametrize("readonly", [False, True], ids=["writable", "readonly"])
def test_npz_whole_load_checks_members_together_and_names_the_bad_one(tmp, readonly):
    """A whole load hashes its members' CRCs together, laid end to end and
    cut into one span per core (zt_core::crc_many), so the cuts fall inside
    members: a flipped byte is still found in its own member, and only
    there."""
    members = {f"m{i}": np.arange(i * 700_000 + 5, dtype=np.float32) * (i + 1) for i in range(6)}
    good, bad = tmp / "good.npz", tmp / "bad.npz"
    np.savez(good, **members)
    with zt.open(good) as src:
        offset = src["m3"].location[1]
    raw = bytearray(good.read_bytes())
    raw[offset + 4 * 1000] ^= 0x01
    bad.write_bytes(bytes(raw))
    got = zt.numpy.load_file(good, readonly=readonly)
    for name, x in members.items():
        np.testing.assert_array_equal(got[name], x)
    with pytest.raises(zt.FormatError, match="m3") as info:
        zt.numpy.load_file(bad, readonly=readonly)
    assert info.value.rule == "npz.Crc"
    with zt.open(bad) as src:
        src._native._read_ahead()  # every member checked together
        for name, x in members.items():
            if name == "m3":
                with pytest.raises(zt.FormatError, match="CRC"):
                    src[name].numpy()
            else:
                np.testing.assert_array_equal(src[name].numpy(), x)


def test_npz_stored_member_with_good_crc_reads_zero_copy(tmp):
    path = tmp / "ok.npz"
    x = np.arange(1000, dtype=np.float32)
    np.savez(path, x=x)
    with zt.open(path) as src:
        a = src["x"].numpy()
        np.testing.assert_array_equal(a, x)
        assert not a.flags.owndata
    assert zt.verify(path)[0] >= 1


def test_npy_header_descr_nested_100000_deep_is_a_depth_error(tmp):
    """A header whose descr is lists 100,000 deep: numpy's own parser
    refuses it (`ast.literal_eval` recursion); zt's stops at `Limits.depth`."""
    descr = "[" * 100_000 + "]" * 100_000
    header = ("{'descr': " + descr + ", 'fortran_order': False, 'shape': (1,), }").encode()
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    path = tmp / "deep.npy"
    path.write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", len(header)) + header)
    with pytest.raises((ValueError, RecursionError, MemoryError)):
        np.load(path)
    got = limited.run(f"zt.open({os.fspath(path)!r})")
    assert got["kind"] == "FormatError" and "depth" in got["message"] and "deep.npy" in got["message"], got


def _readonly_load_matches_each_tensor(path):
    """`load_file(readonly=True)` (every mapped tensor's view from one
    native call: `zt._tensor.read_only_arrays`) gives what each
    tensor's own `numpy()` gives: dtype, shape, strides, bytes, a read-only
    view of the file exactly where that one is (a decoded tensor is a fresh
    array either way)."""
    from zt._tensor import _views_the_file

    got = zt.numpy.load_file(path, readonly=True)
    with zt.open(path) as src:
        want = {name: src[name].numpy() for name in src}
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        assert (g.dtype, g.shape, g.strides) == (w.dtype, w.shape, w.strides), name
        assert g.tobytes() == w.tobytes(), name
        assert _views_the_file(g) == _views_the_file(w) == (not g.flags.writeable), name
    return got


def _writable_load_matches_each_tensor(path):
    """The default `load_file` (writable views of a private mapping, every
    view from one native call: `zt._load.writable_arrays`) gives each
    tensor's dtype, shape and values, every array writable, a raw one a
    view of the private mapping, and a write changes neither the file nor
    the next load."""
    from zt._tensor import memory_owner

    original = path.read_bytes()
    got = zt.numpy.load_file(path)
    with zt.open(path) as src:
        want = {name: src[name].numpy() for name in src}
        raw = {name: src[name].caps["map"] for name in src}
    assert list(got) == list(want)
    for name, w in want.items():
        g = got[name]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), name
        assert g.tobytes() == w.tobytes() and g.flags.writeable, name
        owner = memory_owner(g)
        if raw[name] and g.size:
            assert isinstance(owner, zt._zt.ArrayView) and not owner.readonly, name
        if g.size:
            flat = np.ravel(g, order="K")  # a view: C or Fortran order
            assert np.shares_memory(flat, g), name
            flat.view(np.uint8)[0] ^= 0xFF
    assert path.read_bytes() == original
    again = zt.numpy.load_file(path)
    for name, w in want.items():
        assert again[name].tobytes() == w.tobytes(), name


def test_whole_loads_of_npz_view_what_each_tensor_gives(tmp):
    arrays = {
        "c_order": np.arange(12, dtype=np.float32).reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
        "big_endian": np.arange(5, dtype=">i4"),
        "record": np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b", "<f8")]),
        "strings": np.array(["ab", "cde"]),
        "empty": np.zeros((0, 3), np.float32),
        "flags": np.array([True, False, True]),
        "complex": np.arange(4, dtype=np.complex64),
        "scalar": np.array(7, np.int16),
    }
    path = tmp / "mixed.npz"
    np.savez(path, **arrays)
    got = _readonly_load_matches_each_tensor(path)
    for name, x in arrays.items():
        np.testing.assert_array_equal(got[name], x)
    assert got["fortran"].flags.f_contiguous
    _writable_load_matches_each_tensor(path)


def test_whole_loads_of_safetensors_view_what_each_tensor_gives(tmp):
    arrays = {
        "bf16": np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3),
        "fp8": np.linspace(-2, 2, 8, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn),
        "f16": np.ones((2, 2), np.float16),
        "u8": np.arange(3, dtype=np.uint8),
        "i64": np.arange(3, dtype=np.int64),
        "empty": np.zeros((0,), np.float32),
    }
    path = tmp / "m.safetensors"
    zt.numpy.save_file(arrays, path)
    got = _readonly_load_matches_each_tensor(path)
    for name, x in arrays.items():
        assert got[name].dtype == x.dtype
        np.testing.assert_array_equal(got[name].view(np.uint8), x.view(np.uint8))
    _writable_load_matches_each_tensor(path)


def test_readonly_whole_load_of_shards_views_each_shard(tmp):
    """A sharded checkpoint (index.json over several files): each tensor a
    view of its own shard's mapping."""
    arrays = {f"layer{i}.w": np.full((64, 64), i, np.float32) for i in range(6)}
    root = tmp / "model.safetensors"
    zt.numpy.save_file(arrays, root, max_shard_size=40_000)
    index = tmp / "model.safetensors.index.json"
    with zt.open(index) as src:
        shards = [f for f in src.files if not f.endswith(".json")]
        assert len(shards) >= 2
        views, reviews = src._native._mapped_views(src.keys())
        assert all(v is not None for v in views) and reviews == []
        where = {name: src[name].location for name in src}
    got = _readonly_load_matches_each_tensor(index)
    for name, x in arrays.items():
        np.testing.assert_array_equal(got[name], x)
    # Each view starts where its own shard's mapping holds its bytes.
    starts = {name: got[name].__array_interface__["data"][0] - where[name][1] for name in got}
    by_shard = {}
    for name, start in starts.items():
        by_shard.setdefault(where[name][0], set()).add(start)
    assert len(by_shard) == len(shards) and all(len(s) == 1 for s in by_shard.values()), by_shard
