"""The `zt` command as the package installs it: one program (the Rust CLI
inside the extension) behind the `zt` script, `python -m zt` and the cargo
binary; its version, `--json` schemas (docs/CLI.md), completions, Ctrl-C."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import safetensors.numpy
from conftest import ROOT
from partials import building_in

import zt


def run(cmd, *args):
    return subprocess.run([*cmd, *map(os.fspath, args)], capture_output=True, text=True)


@pytest.fixture
def model(tmp):
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file(
        {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(4, dtype=np.int8)},
        path,
        metadata={"k": "v"},
    )
    return path


def cargo_binary() -> pathlib.Path | None:
    """The cargo-built `zt` binary (`cargo test` builds it for cli/tests),
    if one was built from the commit the extension was (a binary left from
    an earlier build would differ for that reason alone)."""
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    found = [p for p in (target / "debug" / "zt", target / "release" / "zt") if p.exists()]
    same = [p for p in found if zt.__commit__ in run([os.fspath(p)], "--version").stdout]
    return max(same, key=lambda p: p.stat().st_mtime) if same else None


def test_the_command_is_the_packages_entry_point(zt_cli):
    # Not a symlink to a cargo binary: the script pip writes for
    # [project.scripts], which runs zt.__main__:main.
    text = pathlib.Path(zt_cli).read_bytes()[:4096]
    assert text.startswith(b"#!") and b"zt.__main__" in text


def test_version_names_the_version_and_the_commit(zt_cli):
    out = run([zt_cli], "--version")
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout == f"zt {zt.__version__} (commit {zt.__commit__})\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", zt.__version__)
    git = ["git", "-C", os.fspath(ROOT)]
    if subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: the commit is 'unknown' here")
    # 12 hex digits, "-dirty" when built from uncommitted changes.
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?", zt.__commit__), zt.__commit__
    commit = zt.__commit__.removesuffix("-dirty")
    # Built from this history (HEAD itself unless commits came after the build).
    assert subprocess.run([*git, "merge-base", "--is-ancestor", commit, "HEAD"]).returncode == 0


def test_script_module_and_binary_behave_alike(zt_cli, model, tmp):
    """Same stdout, stderr and exit status for success, a failed check, an
    error and a usage error, from every front end."""
    other = tmp / "o.safetensors"
    safetensors.numpy.save_file({"b": np.arange(4, dtype=np.int8)}, other)
    fronts = {"script": [zt_cli], "module": [sys.executable, "-m", "zt"]}
    binary = cargo_binary()
    if binary is not None:
        fronts["binary"] = [os.fspath(binary)]
    cases = [
        ("ls", model),
        ("diff", model, other),  # exit 1
        ("info", tmp / "missing.npz"),  # exit 2
        ("ls",),  # usage error, exit 2
        ("--help",),
        ("bogus",),
    ]
    for case in cases:
        got = {front: run(cmd, *case) for front, cmd in fronts.items()}
        first = got["script"]
        for front, out in got.items():
            assert (out.returncode, out.stdout, out.stderr) == (first.returncode, first.stdout, first.stderr), (
                front,
                case,
            )
    assert [run([zt_cli], *c).returncode for c in cases] == [0, 1, 2, 2, 0, 2]
    assert "Usage: zt " in run([sys.executable, "-m", "zt"], "ls").stderr
    if binary is None:
        pytest.skip("no cargo-built zt binary to compare with (cargo test builds one)")


def test_a_reader_closing_the_pipe_ends_the_command_quietly(zt_cli, tmp):
    """`zt ls BIG | head -1`: the closed pipe is a normal end (status 0,
    nothing on stderr), as for ripgrep, in every front end."""
    big = tmp / "big.safetensors"
    # 4000 tensors: a listing far past a pipe's 64 KiB buffer.
    safetensors.numpy.save_file({f"layer.{i}.weight": np.zeros(2, np.float32) for i in range(4000)}, big)
    fronts = {"script": [zt_cli], "module": [sys.executable, "-m", "zt"]}
    binary = cargo_binary()
    if binary is not None:
        fronts["binary"] = [os.fspath(binary)]
    for front, cmd in fronts.items():
        for args in (["ls", big], ["ls", "--json", big], ["completions", "bash"]):
            proc = subprocess.Popen([*cmd, *map(os.fspath, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                first = proc.stdout.readline()
                proc.stdout.close()  # what `head -1` does after its line
                status = proc.wait(timeout=60)
                stderr = proc.stderr.read()
            finally:
                if proc.poll() is None:  # by PID, whatever happened above
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
            assert first, (front, args)
            assert (status, stderr) == (0, b""), (front, args, stderr.decode(errors="replace"))
    # Through a shell pipeline, as users meet it.
    done = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$0" ls "$1" | head -1', zt_cli, os.fspath(big)],
        capture_output=True,
        text=True,
        timeout=60,  # a hung pipeline is killed, not left running
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.split() == ["NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET"]


def test_ls_info_detect_json(zt_cli, model):
    listing = json.loads(run([zt_cli], "ls", "--json", model).stdout)
    assert [t["name"] for t in listing] == ["a.weight", "b"]
    a = listing[0]
    assert a["shape"] == [2, 3] and a["layout"] == "dense"
    (part,) = a["parts"]
    assert set(part) == {"name", "dtype", "shape", "nbytes", "file", "offset", "zero_copy"}
    assert part["dtype"] == "f32" and part["nbytes"] == 24 and part["file"] == os.fspath(model)
    # The offset is where safetensors put the bytes.
    header = int.from_bytes(model.read_bytes()[:8], "little")
    meta = json.loads(model.read_bytes()[8 : 8 + header])
    assert part["offset"] == 8 + header + meta["a.weight"]["data_offsets"][0]
    (info,) = json.loads(run([zt_cli], "info", "--json", model).stdout)
    assert info == {
        "file": os.fspath(model),
        "format": "safetensors",
        "tensors": 2,
        "bytes": 28,
        "zero_copy_parts": info["zero_copy_parts"],
        "attributes": {"k": "v"},
    }
    assert 1 <= info["zero_copy_parts"] <= 2  # the i8 tensor is aligned; f32 depends on the header
    assert json.loads(run([zt_cli], "detect", "--json", model).stdout) == {
        "file": os.fspath(model),
        "format": "safetensors",
    }


def test_verify_json_ok_canonical_and_failed(zt_cli, model, tmp):
    path = tmp / "m.zt"
    zt.convert(model, path)
    out = run([zt_cli], "verify", "--json", "--canonical", path)
    assert out.returncode == 0
    assert json.loads(out.stdout) == {
        "file": os.fspath(path),
        "ok": True,
        "deep": False,
        "checked": 2,
        "undigested": 0,
        "canonical": True,
        "violations": [],
        "error": None,
        "error_rule": None,
    }
    plain = json.loads(run([zt_cli], "verify", "--json", path).stdout)
    assert plain["canonical"] is None and plain["ok"] is True
    # A non-canonical file: a check that fails with exit 1, JSON still printed.
    loose = tmp / "loose.zt"
    zt.convert(model, loose, align="auto")
    if zt.canonical_violations(loose):
        out = run([zt_cli], "verify", "--json", "--canonical", loose)
        got = json.loads(out.stdout)
        assert out.returncode == 1 and got["ok"] is False and got["canonical"] is False
        assert got["violations"] == [{"rule": r, "detail": d} for r, d in zt.canonical_violations(loose)]
    # Corrupt a tensor's bytes: the digest check fails.
    data = bytearray(path.read_bytes())
    offset = json.loads(run([zt_cli], "ls", "--json", path).stdout)[0]["parts"][0]["offset"]
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    out = run([zt_cli], "verify", "--json", path)
    got = json.loads(out.stdout)
    assert out.returncode == 1 and got["ok"] is False and got["checked"] is None
    assert got["error"] and got["error_rule"]
    assert out.stderr == f"zt: error [{got['error_rule']}]: {got['error']}\n"


def test_diff_json_names_each_kind_of_difference(zt_cli, model, tmp):
    same = tmp / "same.npz"
    zt.convert(model, same)
    out = run([zt_cli], "diff", "--json", model, same)
    assert out.returncode == 0
    assert json.loads(out.stdout) == {"a": os.fspath(model), "b": os.fspath(same), "same": True, "differences": []}
    other = tmp / "other.safetensors"
    safetensors.numpy.save_file(
        {
            "a.weight": np.zeros((3, 2), np.float32),  # shape differs
            "b": np.arange(4, dtype=np.int8)[::-1].copy(),  # contents differ
            "c": np.zeros(1, np.uint8),  # only in b
        },
        other,
    )
    out = run([zt_cli], "diff", "--json", model, other)
    got = json.loads(out.stdout)
    assert out.returncode == 1 and got["same"] is False
    assert got["differences"] == [
        {
            "kind": "object",
            "name": "a.weight",
            "a": {"layout": "dense", "shape": [2, 3]},
            "b": {"layout": "dense", "shape": [3, 2]},
        },
        {"kind": "contents", "name": "b", "part": "data"},
        {"kind": "only_in_b", "name": "c"},
    ]
    # The text form says the same, one line per difference.
    text = run([zt_cli], "diff", model, other).stdout.splitlines()
    assert text == ["~ a.weight: dense [2, 3] vs dense [3, 2]", "~ b/data: contents differ", f"+ c (only in {other})"]


def test_bash_completion_completes_subcommands_and_flags(zt_cli):
    script = run([zt_cli], "completions", "bash")
    assert script.returncode == 0
    probe = (
        'source /dev/stdin; COMP_WORDS=(zt "$1"); COMP_CWORD=1; COMP_LINE="zt $1"; COMP_POINT=${#COMP_LINE}; '
        '_zt zt "$1" zt; printf "%s\\n" "${COMPREPLY[@]}"'
    )

    def complete(word):
        out = subprocess.run(["bash", "-c", probe, "bash", word], input=script.stdout, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return set(out.stdout.split())

    assert {"ls", "info", "convert", "verify", "diff", "detect", "completions"} <= complete("")
    assert complete("ve") == {"verify"}
    assert "--version" in complete("--")


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completions(zt_cli, shell):
    out = run([zt_cli], "completions", shell)
    assert out.returncode == 0 and out.stderr == ""
    for sub in ("ls", "info", "convert", "verify", "diff", "detect", "completions"):
        assert re.search(rf"\b{sub}\b", out.stdout), sub
    assert {"zsh": "--json", "fish": "-l json"}[shell] in out.stdout
    checker = {"zsh": ["zsh", "-n"], "fish": ["fish", "--no-execute"]}[shell]
    if shutil.which(checker[0]) is None:
        pytest.skip(f"{shell} is not installed: the script's syntax is unchecked")
    check = subprocess.run(checker, input=out.stdout, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_ctrl_c_ends_a_conversion_at_once_and_publishes_nothing(zt_cli, tmp):
    # zstd level 19 over incompressible bytes: slow, so the signal lands
    # while the native writer is busy (Python's handler would wait for it).
    src = tmp / "noise.safetensors"
    rng = np.random.default_rng(0)
    safetensors.numpy.save_file({f"w{i}": rng.integers(0, 256, 8 << 20, dtype=np.uint8) for i in range(4)}, src)
    dst = tmp / "out.zt"
    proc = subprocess.Popen(
        [zt_cli, "convert", "--compress", "zstd:19", src, dst], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60
        # The output is written unnamed (O_TMPFILE) until complete.
        while not building_in(proc.pid, tmp):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the conversion never started"
            time.sleep(0.01)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:  # by PID, whatever failed above
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGINT, err
    assert time.monotonic() - started < 5
    assert b"Traceback" not in err and b"KeyboardInterrupt" not in err
    assert not dst.exists()
