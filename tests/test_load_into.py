"""zt.numpy.load_into: checks first (load_state_dict's strict semantics),
then every tensor copied into the caller's own arrays. Files are written
by each format's own library and compared with that library's reading."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

import zt
import zt.numpy


def model(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((64, 32)).astype(np.float32),
        "layer.0.bias": rng.standard_normal(32).astype(np.float16),
        "layer.0.weight": rng.standard_normal((32, 32)).astype(ml_dtypes.bfloat16),
        "steps": np.arange(7, dtype=np.int64),
        "scalar": np.array(3.5, dtype=np.float64),
    }


def empty_like(arrays):
    return {k: np.zeros_like(v) for k, v in arrays.items()}


def written(tmp_path, fmt: str, arrays):
    """A file of `arrays` written by the format's own library, and that
    library's reading of it."""
    if fmt == "safetensors":
        path = tmp_path / "m.safetensors"
        safetensors.numpy.save_file(arrays, path)
        return path, safetensors.numpy.load_file(path)
    if fmt == "npz":
        path = tmp_path / "m.npz"
        plain = {k: v for k, v in arrays.items() if v.dtype != ml_dtypes.bfloat16}
        np.savez(path, **plain)
        with np.load(path) as f:
            return path, {k: f[k] for k in f.files}
    if fmt == "npz-compressed":
        path = tmp_path / "c.npz"
        plain = {k: v for k, v in arrays.items() if v.dtype != ml_dtypes.bfloat16}
        np.savez_compressed(path, **plain)
        with np.load(path) as f:
            return path, {k: f[k] for k in f.files}
    path = tmp_path / "m.zt"
    zt.numpy.save_file(arrays, path, compression=3 if fmt == "zt-zstd" else False)
    return path, dict(arrays)


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "npz-compressed", "zt", "zt-zstd"])
def test_loads_into_the_callers_arrays_in_place(tmp_path, fmt):
    path, want = written(tmp_path, fmt, model())
    dest = empty_like(want)
    addresses = {k: v.ctypes.data for k, v in dest.items()}
    result = zt.numpy.load_into(dest, path)
    assert result == zt.numpy.LoadResult([], [])
    assert sorted(dest) == sorted(want)
    for k, v in want.items():
        assert dest[k].ctypes.data == addresses[k], k  # the same memory, filled
        assert dest[k].dtype == v.dtype and dest[k].shape == v.shape, k
        assert dest[k].tobytes() == np.asarray(v).tobytes(), k


def test_a_strided_destination_is_filled_through_its_strides(tmp_path):
    arrays = {"w": np.arange(24, dtype=np.float32).reshape(4, 6)}
    path, _ = written(tmp_path, "safetensors", arrays)
    backing = np.zeros((4, 12), np.float32)
    dest = {"w": backing[:, ::2]}
    zt.numpy.load_into(dest, path)
    np.testing.assert_array_equal(backing[:, ::2], arrays["w"])
    assert not backing[:, 1::2].any()


def test_strict_names_missing_and_unexpected_keys_and_writes_nothing(tmp_path):
    arrays = model()
    path, _ = written(tmp_path, "safetensors", arrays)
    dest = empty_like(arrays)
    del dest["steps"]
    dest["extra"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=r"(?s)Missing key\(s\): 'extra'.*Unexpected key\(s\): 'steps'"):
        zt.numpy.load_into(dest, path)
    assert not any(v.any() for v in dest.values())


def test_not_strict_skips_and_reports_the_difference(tmp_path):
    arrays = model()
    path, want = written(tmp_path, "safetensors", arrays)
    dest = empty_like(arrays)
    del dest["steps"]
    dest["extra"] = np.zeros(3, np.float32)
    result = zt.numpy.load_into(dest, path, strict=False)
    assert result.missing_keys == ["extra"] and result.unexpected_keys == ["steps"]
    assert not dest["extra"].any()
    np.testing.assert_array_equal(dest["embed.weight"], want["embed.weight"])


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"embed.weight": np.zeros((32, 64), np.float32)}, r"shape \(64, 32\) in the file, \(32, 64\)"),
        ({"embed.weight": np.zeros((64, 32), np.float64)}, r"dtype float32 in the file, float64"),
        ({"embed.weight": [0.0] * 64}, r"not a numpy array"),
    ],
)
def test_shape_and_dtype_mismatches_are_refused_before_any_copy(tmp_path, bad, match):
    # Shape and dtype are checked even with strict=False, as load_state_dict does.
    arrays = model()
    path, _ = written(tmp_path, "safetensors", arrays)
    dest = {**empty_like(arrays), **bad}
    with pytest.raises(ValueError, match=match):
        zt.numpy.load_into(dest, path, strict=False)
    assert not any(v.any() for v in dest.values() if isinstance(v, np.ndarray))


def test_a_read_only_destination_is_refused(tmp_path):
    arrays = model()
    path, _ = written(tmp_path, "safetensors", arrays)
    dest = empty_like(arrays)
    dest["steps"].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        zt.numpy.load_into(dest, path)


def test_many_tensors_over_both_threads(tmp_path):
    # More than one claim's worth, so both copying threads take part.
    rng = np.random.default_rng(5)
    arrays = {f"t.{i:04d}": rng.standard_normal(4096).astype(np.float32) for i in range(600)}
    path, want = written(tmp_path, "zt", arrays)
    dest = empty_like(arrays)
    zt.numpy.load_into(dest, path)
    for k, v in want.items():
        np.testing.assert_array_equal(dest[k], v)


def test_tied_destinations_are_filled_in_order_like_load_state_dict(tmp_path):
    # Two names over one buffer (tied weights): load_state_dict copies them
    # in the destination's order, so the last one wins; the native copy
    # must not fill shared memory from two threads.
    arrays = {"a": np.full(1024, 1, np.float32), "b": np.full(1024, 2, np.float32)}
    path, _ = written(tmp_path, "safetensors", arrays)
    shared = np.zeros(1024, np.float32)
    dest = {"a": shared, "b": shared}
    zt.numpy.load_into(dest, path)
    assert (shared == 2).all()


def test_overlapping_views_of_one_buffer_are_left_to_numpy(tmp_path):
    arrays = {"lo": np.arange(8, dtype=np.int32), "hi": np.arange(8, 16, dtype=np.int32)}
    path, _ = written(tmp_path, "safetensors", arrays)
    backing = np.zeros(12, np.int32)
    dest = {"lo": backing[:8], "hi": backing[4:]}
    zt.numpy.load_into(dest, path)
    # In the destination's order, as load_state_dict copies: "hi" last.
    np.testing.assert_array_equal(backing, [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15])


@pytest.mark.parametrize("strided_first", [True, False])
def test_a_strided_view_over_a_contiguous_destination_is_filled_in_order(tmp_path, strided_first):
    arrays = {"all": np.arange(12, dtype=np.int32), "odd": np.full(6, -1, np.int32)}
    path, _ = written(tmp_path, "safetensors", arrays)
    backing = np.zeros(12, np.int32)
    views = {"all": backing, "odd": backing[1::2]}
    dest = dict(sorted(views.items(), reverse=strided_first))  # "odd" first, or "all" first
    zt.numpy.load_into(dest, path)
    want = np.arange(12, dtype=np.int32)
    if not strided_first:
        want[1::2] = -1  # "odd" copied last wins, as load_state_dict would
    np.testing.assert_array_equal(backing, want)


@pytest.mark.parametrize("backend", ["mmap", "pread"])
@pytest.mark.parametrize("fmt", ["safetensors", "npz", "npz-compressed", "zt-zstd"])
def test_both_backends_fill_raw_and_decoded_tensors(tmp_path, backend, fmt):
    path, want = written(tmp_path, fmt, model(3))
    dest = empty_like(want)
    zt.numpy.load_into(dest, path, backend=backend)
    for k, v in want.items():
        assert dest[k].tobytes() == np.asarray(v).tobytes(), k


def test_a_corrupt_npz_member_is_refused_and_its_destination_untouched(tmp_path):
    import struct
    import zipfile

    arrays = {"a": np.arange(4096, dtype=np.float32), "b": np.arange(16, dtype=np.int64)}
    path = tmp_path / "m.npz"
    np.savez(path, **arrays)
    # Flip one payload byte of "a.npy" (stored, so its CRC-32 no longer matches).
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("a.npy")
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)  # the local header's
    data_at = info.header_offset + 30 + name_len + extra_len
    raw[data_at + info.file_size - 8] ^= 0xFF
    path.write_bytes(bytes(raw))
    dest = empty_like(arrays)
    with pytest.raises(ValueError, match="(?i)crc"):
        zt.numpy.load_into(dest, path)
    assert not dest["a"].any() and not dest["b"].any()


@pytest.mark.parametrize("suffix", [".zt", ".safetensors"])
def test_packed_fp4_is_unpacked_into_one_byte_an_element(tmp_path, suffix):
    # Stored two codes a byte; numpy() (and so the destination) has one a byte.
    arrays = {"a": np.arange(16).astype(ml_dtypes.float4_e2m1fn).reshape(4, 4), "b": np.arange(8, dtype=np.float32)}
    path = tmp_path / f"m{suffix}"
    zt.numpy.save_file(arrays, path)
    dest = empty_like(arrays)
    zt.numpy.load_into(dest, path)
    for k, v in arrays.items():
        assert dest[k].tobytes() == v.tobytes(), k


def test_decoded_and_strided_npy_members_load_as_numpy_reads_them(tmp_path):
    # Big-endian (decoded), Fortran order (strided over the file), complex,
    # bool, datetime and structured rows, all written by numpy.
    arrays = {
        "be": np.arange(12, dtype=">f4").reshape(3, 4),
        "fortran": np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4)),
        "complex": (np.arange(6) + 1j).astype(np.complex64),
        "bool": np.array([True, False, True]),
        "when": np.arange(3).astype("datetime64[s]"),
        "rows": np.array([(1, 2.5), (3, 4.5)], dtype=[("x", "<i4"), ("y", "<f8")]),
    }
    path = tmp_path / "e.npz"
    np.savez(path, **arrays)
    with zt.open(path) as src:
        dest = {n: np.zeros(src[n].shape, src[n].numpy().dtype) for n in src}
    zt.numpy.load_into(dest, path)
    for k, v in arrays.items():
        assert (dest[k] == v).all(), k
