"""zt.convert and `zt convert` between the formats zt writes, checked with
the reference readers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

import zt


def test_convert_safetensors_to_npz_and_back(tmp):
    arrays = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.array([True, False]),
        "s": np.array(2.5, np.float64),
    }
    safetensors.numpy.save_file(arrays, tmp / "a.safetensors", metadata={"k": "v"})
    zt.convert(tmp / "a.safetensors", tmp / "b.npz")
    ref = np.load(tmp / "b.npz")
    for k, v in arrays.items():
        np.testing.assert_array_equal(ref[k], v)
        assert ref[k].dtype == v.dtype
    zt.convert(tmp / "b.npz", tmp / "c.safetensors")
    back = safetensors.numpy.load_file(tmp / "c.safetensors")
    for k, v in arrays.items():
        assert back[k].tobytes() == v.tobytes()


def test_convert_materializes_fortran_and_big_endian(tmp):
    np.save(tmp / "f.npy", np.asfortranarray(np.arange(6, dtype=">i4").reshape(2, 3)))
    zt.convert(tmp / "f.npy", tmp / "f.safetensors")
    got = safetensors.numpy.load_file(tmp / "f.safetensors")["f"]
    np.testing.assert_array_equal(got, np.arange(6).reshape(2, 3))


def test_convert_keeps_ml_dtypes(tmp):
    arrays = {"h": np.linspace(-1, 1, 8, dtype=np.float32).astype(ml_dtypes.bfloat16)}
    zt.numpy.save_file(arrays, tmp / "a.safetensors")
    with pytest.raises(zt.FormatError, match="bf16"):
        zt.convert(tmp / "a.safetensors", tmp / "a.npz")  # npy has no bf16 descr
    assert not (tmp / "a.npz").exists()


def test_convert_refuses_what_it_cannot_honour(tmp):
    safetensors.numpy.save_file({"a": np.zeros(2, np.float32), "b": np.ones(2)}, tmp / "a.safetensors")
    with pytest.raises(zt.FormatError, match="no writer"):
        zt.convert(tmp / "a.safetensors", tmp / "a.unknown")
    with pytest.raises(zt.FormatError, match="exactly one"):
        zt.convert(tmp / "a.safetensors", tmp / "a.npy")
    with pytest.raises(zt.FormatError, match="alignment"):
        zt.convert(tmp / "a.safetensors", tmp / "b.safetensors", align="auto")
    assert sorted(p.name for p in tmp.iterdir()) == ["a.safetensors"]


def test_cli_convert(tmp, zt_cli):
    safetensors.numpy.save_file({"a": np.arange(5, dtype=np.int16)}, tmp / "a.safetensors")
    out = subprocess.run([zt_cli, "convert", tmp / "a.safetensors", tmp / "a.npz"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp / "a.npz")["a"], np.arange(5))
    out = subprocess.run(
        [zt_cli, "convert", tmp / "a.safetensors", tmp / "x.npz", "--compress", "zstd"], capture_output=True, text=True
    )
    assert out.returncode == 2 and "compression" in out.stderr


# --- select, rename, dtype -------------------------------------------------


def test_convert_options_refuse_before_writing(tmp):
    safetensors.numpy.save_file(
        {"model.a": np.zeros(2, np.float32), "b.a": np.ones(2, np.float32)}, tmp / "ckpt.safetensors"
    )
    with pytest.raises(zt.FormatError, match="ema") as info:
        zt.convert(tmp / "ckpt.safetensors", tmp / "o.safetensors", select=["model.*", "ema.*"])
    assert info.value.rule == "write.Select"
    with pytest.raises(zt.FormatError, match="one name") as info:
        zt.convert(tmp / "ckpt.safetensors", tmp / "o.safetensors", rename={"b.a": "model.a"})
    assert info.value.rule == "write.Rename"
    with pytest.raises(zt.FormatError) as info:
        zt.convert(tmp / "ckpt.safetensors", tmp / "o.safetensors", rename="model.", select="*", dtype="int8")
    assert info.value.rule == "write.Cast"
    # Stripping "b." from one and "model." from none: no clash, two names.
    zt.convert(tmp / "ckpt.safetensors", tmp / "o.safetensors", rename="b.")
    assert sorted(safetensors.numpy.load_file(tmp / "o.safetensors")) == ["a", "model.a"]
    with pytest.raises(zt.FormatError, match="one name") as info:
        zt.convert(tmp / "ckpt.safetensors", tmp / "p.safetensors", rename={"b.a": "a", "model.a": "a"})
    assert sorted(p.name for p in tmp.iterdir()) == ["ckpt.safetensors", "o.safetensors"]


def test_cli_convert_options(tmp, zt_cli):
    arrays = {
        "model.w": np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6),
        "model.n": np.arange(4, dtype=np.int32),
        "model.old": np.full(3, 1.5, np.float64),
        "optim.m": np.zeros(8, np.float32),
    }
    safetensors.numpy.save_file(arrays, tmp / "a.safetensors")
    argv = [zt_cli, "convert", tmp / "a.safetensors", tmp / "out.safetensors", "--select", "model.*"]
    argv += ["--strip-prefix", "model.", "--rename", "model.old=new", "--dtype", "f16"]
    out = subprocess.run(argv, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = safetensors.numpy.load_file(tmp / "out.safetensors")
    assert sorted(got) == ["n", "new", "w"]
    assert got["w"].dtype == np.float16 and np.array_equal(got["w"], arrays["model.w"].astype(np.float16))
    assert got["n"].dtype == np.int32 and np.array_equal(got["n"], arrays["model.n"])
    assert got["new"].dtype == np.float16 and np.array_equal(got["new"], np.full(3, 1.5, np.float16))
    bad = subprocess.run(argv[:4] + ["--select", "nothing.*"], capture_output=True, text=True)
    assert bad.returncode != 0 and "nothing.*" in bad.stderr
    bad = subprocess.run(argv[:4] + ["--rename", "no-equals"], capture_output=True, text=True)
    assert bad.returncode != 0 and "OLD=NEW" in bad.stderr


# A conversion holds one tensor and a read-ahead window, not the source
# (issue 43): measured as the child's peak resident set over its baseline,
# which counts the source's mapped pages. 8 tensors of 32 MiB (256 MiB):
# the bound, the largest tensor plus 128 MiB, is well under the source, so
# a writer that kept every tensor's bytes (or every mapped page) fails it.
PEAK = """
import json, sys
import zt

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

src, dst, kwargs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
before = status("VmRSS")
zt.convert(src, dst, **kwargs)
print(status("VmHWM") - before)
"""


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bounded")
    path = folder / "big.safetensors"
    rng = np.random.default_rng(7)
    tensors = {f"layers.{i}.w": rng.standard_normal(8 << 20, dtype=np.float32) for i in range(8)}
    zt.numpy.save_file(tensors, path)
    yield path
    # 256 MiB: gone with its module, not at the end of the session.
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize(
    "out, kwargs",
    [
        ("o.safetensors", {}),
        ("o.zt", {}),
        ("o.pt", {}),
        ("o.npz", {}),
        ("o.gguf", {}),
        ("o.pt", {"dtype": "bf16"}),
        ("o.zt", {"dtype": "bf16"}),
        ("o.zt", {"compression": 3}),
        ("dcp", {"format": "dcp"}),
        ("td", {"format": "tensordict"}),
        ("td.bin", {"format": "tensordict-consolidated"}),
        ("o.h5", {}),
    ],
)
def test_a_conversion_holds_a_tensor_and_a_window_not_the_source(big_source, tmp, out, kwargs):
    dst = tmp / out
    got = subprocess.run(
        [sys.executable, "-c", PEAK, str(big_source), str(dst), json.dumps(kwargs)],
        capture_output=True,
        text=True,
        check=True,
    )
    peak = int(got.stdout.strip())
    assert peak < (32 + 128) << 20, f"{out} {kwargs}: peak {peak >> 20} MiB over the baseline"
    src = zt.open(big_source)
    back = zt.open(dst)
    name = "layers.5.w"
    want = src[name].numpy()
    if kwargs.get("dtype") == "bf16":
        want = want.astype(ml_dtypes.bfloat16)
    assert back[name].numpy().tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "kwargs",
    [{"format": "dcp", "dcp_files": 3}, {"format": "tensordict"}, {"format": "tensordict-consolidated"}],
    ids=["dcp", "tensordict", "tensordict-consolidated"],
)
def test_a_directory_conversion_failing_partway_publishes_nothing(tmp, kwargs):
    """A source tensor that fails to read in the middle of a conversion (a
    stored npz member whose CRC numpy itself refuses, found only at read)
    leaves nothing at the destination and nothing beside it (issue 43)."""
    src = tmp / "src" / "bad.npz"
    src.parent.mkdir()
    good = np.arange(4096, dtype=np.float32)
    np.savez(src, a=good, b=good + 1, c=good + 2)
    raw = bytearray(src.read_bytes())
    at = raw.index((good + 1)[2000:2002].tobytes())
    raw[at] ^= 0xFF
    src.write_bytes(bytes(raw))
    out = tmp / "out" / "ckpt"
    out.parent.mkdir()
    with pytest.raises(zt.FormatError) as info:
        zt.convert(src, out, **kwargs)
    assert info.value.rule == "npz.Crc"
    assert list(out.parent.iterdir()) == []
