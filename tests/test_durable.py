"""``durable=`` on ``save_file`` and ``convert``: the default fsyncs the file
before its rename (and the directory after); ``durable=False`` is the
atomic rename alone, with no fsync by any thread, and writes the same
bytes. The syscalls are counted with ``strace`` on a child process."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy

import zt
import zt.numpy

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace counts the fsyncs")

TENSORS = {"a": np.arange(3000, dtype=np.float32), "b": np.ones((40, 30), np.float16)}

SAVE = """
import sys, numpy as np, zt, zt.numpy
tensors = {"a": np.arange(3000, dtype=np.float32), "b": np.ones((40, 30), np.float16)}
kind, dst, durable = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if kind == "save":
    zt.numpy.save_file(tensors, dst, durable=durable)
elif kind == "sharded":
    zt.numpy.save_file(tensors, dst, max_shard_size=8000, durable=durable)
else:
    zt.convert(kind, dst, durable=durable)
"""


def syncs(tmp, kind: str, dst, durable: bool) -> int:
    """The fsync/fdatasync calls of a child writing ``dst``."""
    log = tmp / "strace.log"
    subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,syncfs,sync", "-o", str(log)]
        + [sys.executable, "-c", SAVE, kind, str(dst), "1" if durable else "0"],
        check=True,
    )
    return sum(1 for line in log.read_text().splitlines() if "sync" in line)


@pytest.mark.parametrize("ext", ["safetensors", "zt", "npz", "pt", "h5"])
def test_save_file_durable_false_syncs_nothing_and_writes_the_same_bytes(tmp, ext):
    durable, fast = tmp / f"durable.{ext}", tmp / f"fast.{ext}"
    assert syncs(tmp, "save", durable, True) >= 2  # the file, then its directory
    assert syncs(tmp, "save", fast, False) == 0
    assert durable.read_bytes() == fast.read_bytes()
    assert not [p for p in tmp.iterdir() if p.name.startswith(".")]  # no partial left
    with zt.open(fast) as src:
        for name, want in TENSORS.items():
            np.testing.assert_array_equal(src[name].numpy(), want)


def test_npy_durable_false(tmp):
    code = "import sys, numpy as np, zt.numpy; zt.numpy.save_file({'x': np.arange(9)}, sys.argv[1], durable=sys.argv[2] == '1')"
    counts = []
    for durable in (True, False):
        log = tmp / "strace.log"
        subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", str(log), sys.executable, "-c", code]
            + [str(tmp / f"{durable}.npy"), "1" if durable else "0"],
            check=True,
        )
        counts.append(sum(1 for line in log.read_text().splitlines() if "sync" in line))
    assert counts[0] >= 2 and counts[1] == 0
    assert (tmp / "True.npy").read_bytes() == (tmp / "False.npy").read_bytes()
    np.testing.assert_array_equal(np.load(tmp / "False.npy"), np.arange(9))


def test_sharded_save_durable_false_syncs_nothing(tmp):
    (tmp / "d").mkdir()
    (tmp / "f").mkdir()
    assert syncs(tmp, "sharded", tmp / "d" / "model.safetensors", True) >= 2
    assert syncs(tmp, "sharded", tmp / "f" / "model.safetensors", False) == 0
    names = sorted(p.name for p in (tmp / "d").iterdir())
    assert names == sorted(p.name for p in (tmp / "f").iterdir()) and len(names) == 3  # two shards + index
    for name in names:
        assert (tmp / "d" / name).read_bytes() == (tmp / "f" / name).read_bytes(), name


@pytest.mark.parametrize("ext", ["zt", "safetensors", "npz"])
def test_convert_durable_false_syncs_nothing(tmp, ext):
    src = tmp / "src.safetensors"
    safetensors.numpy.save_file(TENSORS, src)
    assert syncs(tmp, str(src), tmp / f"d.{ext}", True) >= 2
    assert syncs(tmp, str(src), tmp / f"f.{ext}", False) == 0
    assert (tmp / f"d.{ext}").read_bytes() == (tmp / f"f.{ext}").read_bytes()


WRITER = """
import sys, numpy as np, zt
dst, durable = sys.argv[1], sys.argv[2] == "1"
with zt.Writer(dst, durable=durable) as w:
    w.add("a", np.arange(3000, dtype=np.float32))
    w.add("b", np.ones((40, 30), np.float16))
"""

ONNX_EXTERNAL = """
import sys, zt
src, dst, durable = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
zt.convert(src, dst, external_data=True, durable=durable)
"""


def child_syncs(tmp, code: str, *args) -> int:
    """The fsync/fdatasync calls of a child running ``code`` with ``args``."""
    log = tmp / "strace.log"
    subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,syncfs,sync", "-o", str(log)]
        + [sys.executable, "-c", code, *map(str, args)],
        check=True,
    )
    return sum(1 for line in log.read_text().splitlines() if "sync" in line)


def test_writer_durable_is_publish(tmp):
    """``zt.Writer(durable=)`` is ``publish=`` under save_file's name: True
    fsyncs the file and its directory, False neither, the same bytes."""
    assert child_syncs(tmp, WRITER, tmp / "d.zt", "1") >= 2
    assert child_syncs(tmp, WRITER, tmp / "f.zt", "0") == 0
    assert (tmp / "d.zt").read_bytes() == (tmp / "f.zt").read_bytes()
    with zt.open(tmp / "f.zt") as src:
        for name, want in TENSORS.items():
            np.testing.assert_array_equal(src[name].numpy(), want)
    with pytest.raises(ValueError, match="contradict"):
        zt.Writer(tmp / "x.zt", publish=True, durable=False)
    assert not (tmp / "x.zt").exists()


def test_onnx_external_data_durable_false_syncs_nothing(tmp):
    """``convert(external_data=True)`` fsyncs the data file and the model
    (and their directory) by default and nothing with ``durable=False``;
    both outputs are the same bytes and onnx loads them as the source."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    weights = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64), "b": np.ones(512, np.float16)}
    graph = helper.make_graph([], "g", [], [], [numpy_helper.from_array(v, k) for k, v in weights.items()])
    src = tmp / "src.onnx"
    onnx.save_model(helper.make_model(graph), src)
    (tmp / "d").mkdir()
    (tmp / "f").mkdir()
    assert child_syncs(tmp, ONNX_EXTERNAL, src, tmp / "d" / "m.onnx", "1") >= 3
    assert child_syncs(tmp, ONNX_EXTERNAL, src, tmp / "f" / "m.onnx", "0") == 0
    for name in ("m.onnx", "m.onnx.data"):
        assert (tmp / "d" / name).read_bytes() == (tmp / "f" / name).read_bytes(), name
    assert sorted(p.name for p in (tmp / "f").iterdir()) == ["m.onnx", "m.onnx.data"]  # no partial left
    model = onnx.load(tmp / "f" / "m.onnx")
    got = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert got.keys() == weights.keys()
    for name, want in weights.items():
        np.testing.assert_array_equal(got[name], want)
