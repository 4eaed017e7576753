"""The README's Python and shell examples, run as written; and the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy
from conftest import ROOT

import zt


def blocks(lang: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_python_and_shell_examples(tmp, zt_cli, monkeypatch, s3):
    # The object-storage example writes to this bucket of the test server
    # (the s3 fixture points the AWS variables at it).
    client = s3.boto3()
    if "zt-readme" not in {b["Name"] for b in client.list_buckets()["Buckets"]}:
        client.create_bucket(Bucket="zt-readme")
    monkeypatch.chdir(tmp)
    python = blocks("python")
    assert python, "README has no Python example"
    for code in python:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    shell = [b for b in blocks("sh") if "zt " in b and "scripts/" not in b]
    assert shell, "README has no CLI example"
    for block in shell:
        for line in block.splitlines():
            command = line.split("#", 1)[0].strip()
            if not command:
                continue
            args = command.split()
            assert args[0] == "zt"
            out = subprocess.run([zt_cli, *args[1:]], capture_output=True, text=True)
            assert out.returncode == 0, (command, out.stderr)
            expected = line.split("#", 1)[1].strip() if "#" in line else ""
            if args[1] == "detect":
                assert out.stdout.strip() == expected


def test_readme_python_examples_pass_mypy_strict(tmp):
    """The public API is typed (inline annotations, py.typed): every README
    Python example type-checks under `mypy --strict` against the installed
    package. (The torch example needs torch, outside this venv.)"""
    files = []
    for i, code in enumerate(blocks("python")):
        files.append(tmp / f"readme_{i}.py")
        files[-1].write_text(code)
    # And the types are real ones, not Any: what mypy infers for the API.
    revealed = {
        "zt.open('m.safetensors')['w'].numpy()": "numpy.ndarray[tuple[Any, ...], numpy.dtype[Any]]",
        "zt.numpy.load_file('m.npz')": "dict[str, numpy.ndarray[tuple[Any, ...], numpy.dtype[Any]]]",
        "zt.detect('m.npz')": "str",
        "zt.convert('a.npz', 'b.zt')": "int",
        "zt.verify('b.zt')": "tuple[int, int]",
        "zt.FormatError('x')": "zt._zt.FormatError",
        "zt.zrecord.Dense.open('d')": "zt.zrecord.Dense",
        "zt.zrecord.train_dict(None)": "bytes",
        "zt.loader.Sampler(10, 2, 0).mode": "zt.loader.Mode",
        "zt.__version__": "str",
    }
    files.append(tmp / "api_types.py")
    files[-1].write_text("import zt\n" + "".join(f"reveal_type({e})\n" for e in revealed))
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", ROOT / ".mypy_cache", *files],
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"no issues found in {len(files)} source files" in out.stdout
    got = re.findall(r'api_types.py:\d+: note: Revealed type is "(.*)"', out.stdout)
    assert got == list(revealed.values()), out.stdout


def test_quick_start_has_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    first = re.search(r"```sh\n(.*?)```", section, flags=re.S).group(1)
    commands = [c for c in first.splitlines() if c.strip() and not c.strip().startswith("#")]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci


@pytest.fixture
def model(tmp):
    path = tmp / "m.safetensors"
    safetensors.numpy.save_file(
        {"a.weight": np.zeros((2, 3), np.float32), "b": np.arange(4, dtype=np.int8)}, path, metadata={"k": "v"}
    )
    return path


def run(cli, *args):
    return subprocess.run([cli, *map(os.fspath, args)], capture_output=True, text=True)


def test_cli_ls_table_and_json(zt_cli, model):
    out = run(zt_cli, "ls", model)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET"]
    assert any(line.startswith("a.weight") and "f32" in line and "24" in line for line in lines)
    listing = json.loads(run(zt_cli, "ls", "--json", model).stdout)
    by_name = {t["name"]: t for t in listing}
    assert by_name["b"]["shape"] == [4] and by_name["b"]["parts"][0]["dtype"] == "i8"
    assert by_name["a.weight"]["parts"][0]["nbytes"] == 24


def test_cli_info_and_detect(zt_cli, model):
    info = json.loads(run(zt_cli, "info", "--json", model).stdout)[0]
    assert info["format"] == "safetensors" and info["tensors"] == 2 and info["bytes"] == 28
    assert info["attributes"] == {"k": "v"}
    assert run(zt_cli, "detect", model).stdout.strip() == "safetensors"


def test_cli_errors_are_clear(zt_cli, tmp):
    bad = tmp / "bad.safetensors"
    bad.write_bytes(b"\xff" * 64)
    out = run(zt_cli, "ls", bad)
    # The rule cited, as Python's FormatError.rule names it, then the message.
    with pytest.raises(zt.FormatError) as e:
        zt.open(bad)
    assert e.value.rule == "core.UnknownFormat"
    assert out.returncode == 2 and out.stderr == f"zt: error [{e.value.rule}]: {e.value}\n"
    out = run(zt_cli, "info", tmp / "missing.npz")
    # No rule for a missing file.
    assert out.returncode == 2 and out.stderr.startswith("zt: error: ") and "no such file" in out.stderr


def test_cli_convert_draws_progress_on_request_and_not_by_default(zt_cli, tmp):
    # 96 MiB: above the 64 MiB floor under which no line is drawn.
    src = tmp / "big.safetensors"
    safetensors.numpy.save_file({f"w{i}": np.full((4096, 1024), i, np.float32) for i in range(6)}, src)
    shown = run(zt_cli, "convert", "--progress", src, tmp / "big.zt")
    assert shown.returncode == 0, shown.stderr
    last = shown.stderr.replace("\x1b[K", "").replace("\r", "\n").strip().splitlines()[-1]
    assert last.startswith("[" + "#" * 30 + "] 100% ") and last.endswith("/s")
    quiet = run(zt_cli, "convert", src, tmp / "quiet.zt")  # stderr is a pipe here
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert run(zt_cli, "diff", src, tmp / "big.zt").returncode == 0
