"""The loader state crosses languages: a state dict saved by zt's Python
DataLoader resumes zloader's Rust DataLoader (loader/examples/resume.rs) on
the same batches Python reads after load_state_dict, and a state the Rust
loader writes resumes the Python loader; on one rank and on others. The
state's form and checks are zloader's own (loader/tests/state.rs)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from zt.loader import CYCLIC, IID, SEQUENTIAL, DataLoader
from zt.zrecord import Dense

ROOT = pathlib.Path(__file__).resolve().parents[1]
N = 150


@pytest.fixture(scope="module")
def resume_bin() -> pathlib.Path:
    """The example binary, built (debug) by cargo."""
    if shutil.which("cargo") is None:
        pytest.skip("cargo is not installed")
    out = subprocess.run(
        ["cargo", "build", "-q", "-p", "zloader", "--example", "resume", "--message-format=json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "resume" and msg.get("executable"):
            return pathlib.Path(msg["executable"])
    raise AssertionError(f"cargo built no resume example:\n{out}")


@pytest.fixture
def store(tmp_path) -> pathlib.Path:
    """Record i: int64[1] = (i,)."""
    path = tmp_path / "d.zr"
    with Dense.create(path, np.int64, (1,)) as w:
        w.append(np.arange(N, dtype=np.int64)[:, None])
    return path


def rust(exe, store, mode, batch, seed, rank, world, state, steps) -> tuple[list[list[int]], str]:
    """The Rust loader's next ``steps`` batches after resuming ``state`` (a
    file, or None for step 0), and the state it saves after them."""
    args = [store, batch, int(mode), seed, rank, world, state or "-", steps]
    lines = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, check=True).stdout
    *batches, saved = lines.splitlines()
    return [json.loads(b) for b in batches], saved


def python(store, mode, batch, seed, rank, world, state, steps) -> tuple[list[list[int]], dict]:
    with Dense.open(store) as d:
        kw = dict(batch_size=batch, mode=mode, seed=seed, rank=rank, world_size=world, workers=2)
        with DataLoader({"d": d}, **kw) as dl:
            if state is not None:
                dl.load_state_dict(state)
            got = [next(dl)["d"][:, 0].tolist() for _ in range(steps)]
            return got, dl.state_dict()


@pytest.mark.parametrize("mode", [SEQUENTIAL, IID, CYCLIC])
def test_python_state_resumes_the_rust_loader(resume_bin, store, tmp_path, mode):
    # Python takes 5 steps of a global batch of 12 and saves.
    _, saved = python(store, mode, 12, 3, 0, 1, None, 5)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(saved))
    want, after = python(store, mode, 12, 3, 0, 1, json.loads(path.read_text()), 4)
    got, rust_after = rust(resume_bin, store, mode, 12, 3, 0, 1, path, 4)
    assert got == want
    assert rust_after == json.dumps(after), "the Rust state is Python's state dict, byte for byte"
    # Resumed on 3 ranks, the Rust ranks' batches together are Python's.
    ranks = [rust(resume_bin, store, mode, 12, 3, r, 3, path, 4) for r in range(3)]
    assert [sum((b[k] for b, _ in ranks), []) for k in range(4)] == want
    assert {s for _, s in ranks} == {rust_after}


@pytest.mark.parametrize("mode", [SEQUENTIAL, IID, CYCLIC])
def test_rust_state_resumes_the_python_loader(resume_bin, store, tmp_path, mode):
    # Rust takes 7 steps on rank 1 of 2 and saves; Python resumes on 1 and on 4 ranks.
    whole, _ = rust(resume_bin, store, mode, 8, 11, 0, 1, None, 10)
    _, saved = rust(resume_bin, store, mode, 8, 11, 1, 2, None, 7)
    state = json.loads(saved)
    assert state["global_step"] == 7 and state["samples_seen"] == 56
    got, after = python(store, mode, 8, 11, 0, 1, state, 3)
    assert got == whole[7:]
    assert after["global_step"] == 10
    ranks = [python(store, mode, 8, 11, r, 4, state, 3)[0] for r in range(4)]
    assert [sum((b[k] for b in ranks), []) for k in range(3)] == whole[7:]


def test_a_short_cyclic_state_crosses_both_ways(resume_bin, store, tmp_path):
    """CYCLIC over fewer records than one batch: each step is every record
    once, and samples_seen counts ``length`` per step in both languages."""
    small = tmp_path / "small.zr"
    with Dense.create(small, np.int64, (1,)) as w:
        w.append(np.arange(6, dtype=np.int64)[:, None])
    _, saved = python(small, CYCLIC, 10, 2, 0, 1, None, 3)
    assert saved["samples_seen"] == 18
    path = tmp_path / "state.json"
    path.write_text(json.dumps(saved))
    got, rust_after = rust(resume_bin, small, CYCLIC, 10, 2, 1, 2, path, 2)
    want, after = python(small, CYCLIC, 10, 2, 1, 2, saved, 2)
    assert got == want and len(got[0]) == 3
    assert rust_after == json.dumps(after)


def test_the_rust_loader_refuses_python_states_as_python_does(resume_bin, store, tmp_path):
    _, saved = python(store, CYCLIC, 12, 3, 0, 1, None, 2)
    path = tmp_path / "state.json"
    for state, needle in (
        ({**saved, "seed": 4}, "DataLoader state was saved with different settings (seed: saved 4, here 3)"),
        ({**saved, "version": 9}, "loader state version 9 is not one this zt reads (1 or 2)"),
        ({k: v for k, v in saved.items() if k != "global_step"}, "loader state lacks ['global_step']"),
    ):
        path.write_text(json.dumps(state))
        run = subprocess.run(
            [str(resume_bin), str(store), "12", "2", "3", "0", "1", str(path), "1"], capture_output=True, text=True
        )
        assert run.returncode == 1 and needle in run.stderr
        with pytest.raises((ValueError, KeyError)) as info:
            python(store, CYCLIC, 12, 3, 0, 1, state, 1)
        assert needle in str(info.value)
