"""`load_file(copy=True)`: every tensor in memory of its own, bit for bit the
file's, for every format; raw tensors through the batch copy of the core
(`zt_core::copy`: destinations allocated first, the bytes copied in file
order on several threads when the load is large enough), decoded ones
(compressed, big-endian) decoded as before."""

from __future__ import annotations

import os
import zipfile

import ml_dtypes
import numpy as np
import pytest

import zt
import zt.numpy
from zt import _zt


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "f32": rng.standard_normal((33, 17)).astype(np.float32),
        "f16": rng.standard_normal(1001).astype(np.float16),
        "i64": rng.integers(-(1 << 60), 1 << 60, size=(3, 5, 7)),
        "u8": rng.integers(0, 256, size=257, dtype=np.uint8),
        "bool": rng.integers(0, 2, size=19).astype(bool),
        "scalar": np.float64(2.5).reshape(()),
        "empty": np.zeros((0, 4), np.float32),
    }


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def owns(arr: np.ndarray, mappings: list[tuple[int, int]]) -> None:
    """Writable, C-ordered, and not inside any of the source's mappings."""
    assert arr.flags.writeable and arr.flags.c_contiguous
    if arr.nbytes:
        start = arr.__array_interface__["data"][0]
        for base, length in mappings:
            assert not (base <= start < base + length), "a view of the file's mapping"


def mappings_of(path) -> list[tuple[int, int]]:
    with zt.open(path) as src:
        return sorted({m for name in src if (m := src[name]._native._mapping()) is not None})


def check_copy(path, want: dict[str, np.ndarray], backend: str = "mmap") -> dict[str, np.ndarray]:
    mappings = mappings_of(path)
    got = zt.numpy.load_file(path, copy=True, backend=backend)
    assert sorted(got) == sorted(want)
    for name, arr in want.items():
        same(got[name], arr)
        owns(got[name], mappings)
    return got


def write(path, arrays: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """Write `arrays` as `kind`; the arrays the file holds."""
    if kind == "safetensors":
        zt.numpy.save_file(arrays, path)
    elif kind in ("zt", "zt-zstd"):
        zt.numpy.save_file(arrays, path, compression=kind == "zt-zstd")
    elif kind == "pt":
        zt.numpy.save_file(arrays, path, format="pt")
    elif kind == "npz":
        np.savez(path, **arrays)
    elif kind == "npz-deflate":
        np.savez_compressed(path, **arrays)
    elif kind == "npy-big-endian":  # a lone .npy is named after its file
        np.save(path, arrays["f32"].astype(">f4"))
        return {path.stem: arrays["f32"]}
    elif kind == "npy-fortran":
        np.save(path, np.asfortranarray(arrays["i64"]))
        return {path.stem: arrays["i64"]}
    return arrays


KINDS = ["safetensors", "zt", "zt-zstd", "pt", "npz", "npz-deflate", "npy-big-endian", "npy-fortran"]
SUFFIX = {"zt-zstd": ".zt", "npz-deflate": ".npz", "npy-big-endian": ".npy", "npy-fortran": ".npy"}


@pytest.mark.parametrize("backend", ["mmap", "pread"])
@pytest.mark.parametrize("kind", KINDS)
def test_copies_are_the_files_tensors_in_memory_of_their_own(tmp, kind, backend):
    path = tmp / f"m{SUFFIX.get(kind, '.' + kind)}"
    want = write(path, tensors(), kind)
    got = check_copy(path, want, backend)
    # Independent of the file: a write stays in the array, and the arrays
    # outlive the source (closed by load_file) and the file itself.
    before = path.read_bytes()
    for arr in got.values():
        if arr.nbytes:
            arr.reshape(-1).view(np.uint8)[0] ^= 0xFF
    assert path.read_bytes() == before
    path.unlink()
    for name, arr in got.items():
        if arr.nbytes:
            arr.reshape(-1).view(np.uint8)[0] ^= 0xFF
        same(arr, want[name])


def test_a_large_load_is_copied_on_several_threads_and_exactly(tmp):
    """Past 2 x COPY_THREAD_BYTES the copy runs on two threads or more
    (where there are cores): tensors split across claims, claims holding
    many small tensors, odd sizes and offsets so no boundary is aligned."""
    rng = np.random.default_rng(5)
    arrays = {}
    for i in range(3):
        arrays[f"big.{i}"] = rng.integers(0, 1 << 16, size=(11 << 20) + 3 * i + 1, dtype=np.uint16)
        for j in range(40):
            arrays[f"small.{i}.{j}"] = rng.integers(0, 256, size=1000 + j, dtype=np.uint8)
    arrays["bf16"] = rng.standard_normal(3 << 20).astype(ml_dtypes.bfloat16)
    total = sum(a.nbytes for a in arrays.values())
    assert total >= 2 * _zt.COPY_THREAD_BYTES
    cores = len(os.sched_getaffinity(0))
    assert _zt.copy_threads(total) == min(cores, total // _zt.COPY_THREAD_BYTES) >= min(cores, 2)
    for kind in ("safetensors", "npz"):
        path = tmp / f"big.{kind}"
        # np.savez keeps no bfloat16 (it writes void); safetensors does.
        want = arrays if kind == "safetensors" else {k: v for k, v in arrays.items() if k != "bf16"}
        write(path, want, kind)
        for backend in ("mmap", "pread"):
            check_copy(path, want, backend)


def test_a_small_load_stays_on_one_thread(tmp):
    arrays = tensors()
    assert _zt.copy_threads(sum(a.nbytes for a in arrays.values())) == 1
    assert _zt.copy_threads(_zt.COPY_THREAD_BYTES - 1) == 1
    path = tmp / "small.safetensors"
    zt.numpy.save_file(arrays, path)
    check_copy(path, arrays)


def test_load_from_bytes_copies_through_the_same_path():
    arrays = tensors()
    got = zt.numpy.load(zt.numpy.save(arrays))
    for name, arr in arrays.items():
        same(got[name], arr)
        assert got[name].flags.writeable


def test_an_npz_member_with_a_bad_crc_is_never_copied(tmp):
    path = tmp / "bad.npz"
    x = np.arange(1000, dtype=np.float32)
    np.savez(path, x=x, y=np.ones(3, np.int64))
    raw = bytearray(path.read_bytes())
    raw[raw.index(x[500:502].tobytes())] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        np.load(path)["x"]
    for backend in ("mmap", "pread"):
        with pytest.raises(zt.FormatError, match="CRC") as info:
            zt.numpy.load_file(path, copy=True, backend=backend)
        assert info.value.rule == "npz.Crc"


def test_gguf_dequantize_with_copy_keeps_its_path(tmp):
    gguf = pytest.importorskip("gguf")
    path = tmp / "m.gguf"
    w = gguf.GGUFWriter(os.fspath(path), "llama")
    dense = np.arange(64, dtype=np.float32).reshape(2, 32)
    w.add_tensor("dense", dense)
    q = gguf.quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("q", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    got = zt.numpy.load_file(path, copy=True, dequantize=True)
    same(got["dense"], dense)
    want = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
    np.testing.assert_array_equal(got["q"], want)
    raw = zt.numpy.load_file(path, copy=True)["q"]
    same(raw, q.view(np.uint8).reshape(-1))
    assert raw.flags.writeable
