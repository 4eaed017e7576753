"""Reliability round 3 (issue 36), as a user meets it from Python and the
shell: what is not a regular file is neither read nor replaced, names at
the filesystem's limit are written, and a hostile store fails cleanly."""

from __future__ import annotations

import os
import signal
import subprocess

import numpy as np
import pytest
import safetensors.numpy
from partials import building_in

import zt
import zt.numpy


@pytest.fixture
def model(tmp):
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file({"w": np.arange(6, dtype=np.float32)}, path)
    return path


def test_a_fifo_is_refused_not_waited_on(tmp):
    # Opening a FIFO for reading blocks until a writer comes: forever, for
    # a model path. zt refuses it before reading.
    fifo = tmp / "model.safetensors"
    os.mkfifo(fifo)
    for read in (zt.open, zt.numpy.load_file, zt.detect):
        with pytest.raises(OSError, match="a FIFO is not a regular file"):
            read(fifo)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can replace /dev/null")
def test_a_device_destination_is_refused_and_left_alone(tmp, model, zt_cli):
    before = os.stat("/dev/null")
    with pytest.raises(ValueError, match="a character device, not a regular file"):
        zt.numpy.save_file({"w": np.zeros(2)}, "/dev/null")  # safetensors, as for any unknown extension
    # Through a link, as `cp` would write into it: refused too.
    link = tmp / "out.safetensors"
    link.symlink_to("/dev/null")
    done = subprocess.run([zt_cli, "convert", model, link], capture_output=True, text=True)
    assert done.returncode != 0
    assert "a character device, not a regular file" in done.stderr, done.stderr
    assert link.is_symlink()
    after = os.stat("/dev/null")
    assert (after.st_mode, after.st_rdev, after.st_ino) == (before.st_mode, before.st_rdev, before.st_ino)


def test_fifo_and_directory_destinations_are_refused(tmp, model, zt_cli):
    fifo = tmp / "out.safetensors"
    os.mkfifo(fifo)
    (tmp / "dir.safetensors").mkdir()
    for dest, kind in [(fifo, "a FIFO"), (tmp / "dir.safetensors", "a directory")]:
        with pytest.raises(ValueError, match=f"{kind}, not a regular file"):
            zt.numpy.save_file({"w": np.zeros(2)}, dest)
        done = subprocess.run([zt_cli, "convert", model, dest], capture_output=True, text=True)
        assert done.returncode != 0 and kind in done.stderr, done.stderr
    assert os.path.exists(fifo) and not os.path.isfile(fifo)


@pytest.mark.parametrize("length", [220, 240, 255])
def test_a_name_at_the_filesystems_limit_is_written_as_safetensors_writes_it(tmp, length):
    tensors = {"w": np.arange(4, dtype=np.float32)}
    name = "m" * (length - len(".safetensors")) + ".safetensors"
    safetensors.numpy.save_file(tensors, tmp / ("ref" + name[3:]))
    zt.numpy.save_file(tensors, tmp / name)
    assert (tmp / name).read_bytes() == (tmp / ("ref" + name[3:])).read_bytes()
    assert sorted(p.name for p in tmp.iterdir()) == sorted([name, "ref" + name[3:]])


def test_a_tensor_file_is_not_written_under_an_index_name(tmp):
    # Written, such a file was then read back as an index, and refused.
    for name in ("w.safetensors.index.json", "model.index.json"):
        with pytest.raises(zt.FormatError, match="index") as e:
            zt.numpy.save_file({"w": np.zeros(2, np.float32)}, tmp / name)
        assert e.value.rule == "write.Destination"
        with pytest.raises(zt.FormatError, match="index"):
            zt.Writer(tmp / name)
    assert list(tmp.iterdir()) == []


def test_a_killed_writer_leaves_nothing_beside_the_destination(tmp, zt_cli):
    # About 160 MB: long enough to be killed while it writes. The output
    # has no name until it is complete (O_TMPFILE), so kill -9 leaves no
    # hidden partial (a named one was left before).
    rng = np.random.default_rng(3)
    src = tmp / "src" / "m.safetensors"
    src.parent.mkdir()
    safetensors.numpy.save_file({f"w{i}": rng.standard_normal((1000, 1000)).astype(np.float32) for i in range(40)}, src)
    out = tmp / "out"
    out.mkdir()
    killed = 0
    for _ in range(3):
        proc = subprocess.Popen([zt_cli, "convert", src, out / "m.zt"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            while proc.poll() is None and not building_in(proc.pid, out):
                pass
        finally:
            if proc.poll() is None:  # by PID
                os.kill(proc.pid, signal.SIGKILL)
                killed += 1
            proc.communicate()
        assert sorted(p.name for p in out.iterdir()) in ([], ["m.zt"])
        for p in out.iterdir():
            p.unlink()
    if killed == 0:
        pytest.skip("every conversion finished before it could be killed")
