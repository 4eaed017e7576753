"""A corpus sweep (issue 19): every file zt accepts has tensors whose
declared size fits their payload, and every dense tensor survives
`zt.convert` to each writable format bit for bit.

The corpus is what the reference libraries write (safetensors, numpy, h5py,
gguf, onnx) plus the committed fixtures (tests/data/pt, fuzz/seeds). Files
zt refuses are not part of the property; a conversion may refuse a tensor
the target format cannot hold (with `zt.FormatError`), never change one.
"""

from __future__ import annotations

import math
import os
import pathlib

import h5py
import numpy as np
import pytest
import safetensors.numpy

import zt

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGETS = ["safetensors", "npz", "zt"]

ITEMSIZE = {"bool": 1, "u8": 1, "i8": 1, "u16": 2, "i16": 2, "f16": 2, "bf16": 2}
ITEMSIZE.update({"u32": 4, "i32": 4, "f32": 4, "u64": 8, "i64": 8, "f64": 8, "c64": 8, "c128": 16})


def reference_corpus(d: pathlib.Path) -> list[pathlib.Path]:
    """Small files in every format, written by the format's own library."""
    rng = np.random.default_rng(19)
    arrays = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "i64": np.arange(7, dtype=np.int64),
        "u8": rng.integers(0, 255, (2, 2, 2), dtype=np.uint8),
        "f16": rng.standard_normal(9).astype(np.float16),
        "empty": np.zeros((0, 4), np.float32),
        "scalar": np.array(2.5, np.float64),
        "b": np.array([True, False, True]),
    }
    out = []
    safetensors.numpy.save_file(arrays, d / "ref.safetensors")
    np.savez(d / "ref.npz", **arrays)
    np.savez_compressed(d / "refc.npz", **arrays)
    np.save(d / "fortran.npy", np.asfortranarray(arrays["f32"]))
    np.save(d / "be.npy", arrays["i64"].astype(">i8"))
    with h5py.File(d / "ref.h5", "w") as f:
        f["f32"] = arrays["f32"]
        f.create_dataset("chunked", data=np.arange(100, dtype=np.int32), chunks=(10,), compression="gzip")
        f.create_dataset("fill", shape=(4,), dtype="f8", fillvalue=1.25)
    out += [d / n for n in ("ref.safetensors", "ref.npz", "refc.npz", "fortran.npy", "be.npy", "ref.h5")]
    try:
        import gguf

        w = gguf.GGUFWriter(os.fspath(d / "ref.gguf"), "llama")
        w.add_tensor("f32", arrays["f32"])
        w.add_tensor("i32", np.arange(8, dtype=np.int32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        out.append(d / "ref.gguf")
    except ImportError:
        pass
    try:
        import onnx
        from onnx import helper, numpy_helper

        inits = [numpy_helper.from_array(arrays["f32"], "w"), numpy_helper.from_array(arrays["i64"], "b")]
        onnx.save(helper.make_model(helper.make_graph([], "g", [], [], initializer=inits)), d / "ref.onnx")
        out.append(d / "ref.onnx")
    except ImportError:
        pass
    return out


def committed_corpus() -> list[pathlib.Path]:
    files = sorted((ROOT / "tests" / "data" / "pt").glob("*.pt"))
    files += sorted(p for p in (ROOT / "fuzz" / "seeds").rglob("*") if p.is_file())
    return files


def dense_bytes(src) -> dict[str, bytes]:
    """C-order bytes of every dense tensor of a known element size, after
    checking that its declared size fits its payload."""
    out = {}
    for name in src:
        t = src[name]
        if t.layout != "dense" or t.dtype not in ITEMSIZE:
            continue
        want = math.prod(t.shape) * ITEMSIZE[t.dtype]
        data = t.tobytes()
        assert len(data) == want, (name, t.shape, t.dtype, len(data))
        if not t.strides or t.strides == tuple(np.cumprod((t.shape[1:] + (1,))[::-1])[::-1]):
            assert t.nbytes == want, (name, t.nbytes, want)
        out[name] = data
    return out


def test_every_accepted_file_round_trips_bit_exactly(tmp):
    corpus = reference_corpus(tmp) + committed_corpus()
    accepted = converted = 0
    for path in corpus:
        try:
            with zt.open(path) as src:
                before = dense_bytes(src)
        except zt.FormatError:
            continue  # refused: outside the property
        accepted += 1
        for target in TARGETS:
            dest = tmp / f"out-{path.stem}.{target}"
            try:
                zt.convert(path, dest)
            except zt.FormatError:
                assert not dest.exists()  # a refusal publishes nothing
                continue
            converted += 1
            with zt.open(dest) as out:
                after = dense_bytes(out)
            for name, data in before.items():
                assert name in after, (path.name, target, name)
                assert after[name] == data, (path.name, target, name)
            dest.unlink()
    assert accepted >= 10 and converted >= 20, (accepted, converted)


@pytest.mark.parametrize("target", TARGETS)
def test_random_arrays_round_trip(tmp, target):
    """Random shapes and dtypes through each writer and back."""
    rng = np.random.default_rng(1919)
    dtypes = [np.float32, np.float64, np.int8, np.uint16, np.int32, np.int64, np.float16, np.bool_]
    for case in range(40):
        rank = int(rng.integers(0, 4))
        shape = tuple(int(x) for x in rng.integers(0, 5, rank))
        dtype = dtypes[case % len(dtypes)]
        a = np.asarray((rng.standard_normal(shape) * 100).astype(dtype))
        src = tmp / f"c{case}.safetensors"
        safetensors.numpy.save_file({"a": a}, src)
        dest = tmp / f"out{case}.{target}"
        zt.convert(src, dest)
        with zt.open(dest) as out:
            assert out["a"].shape == shape
            assert out["a"].tobytes() == a.tobytes(), (case, shape, dtype)
