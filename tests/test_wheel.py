"""The wheel as users get it: built by maturin (abi3), installed into a fresh
virtualenv that holds nothing of the project, where `zt --help`, `zt ls`,
`python -m zt ls` and the README's first Python example must work. A file
missing from the wheel, or a dependency missing from pyproject.toml, fails
here (the project's own venv would hide both)."""

from __future__ import annotations

import filecmp
import os
import pathlib
import re
import subprocess
import sys

from conftest import ROOT

import zt

DATA = ROOT / "tests" / "data" / "pt"


def target_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")


def profile() -> str:
    """The profile of the extension this venv runs: scripts/setup.sh's
    `maturin develop --release`, or a developer's plain `maturin develop`
    (that copies the built library unchanged). Building the wheel in that
    profile reuses the build (a link and a zip, not a compile); the code is
    the same in either."""
    installed = pathlib.Path(zt._zt.__file__)
    for name, folder in (("release", "release"), ("dev", "debug")):
        built = target_dir() / folder / "lib_zt.so"
        if built.exists() and filecmp.cmp(installed, built, shallow=False):
            return name
    return "release"


def readme_first_python_example() -> str:
    section = (ROOT / "README.md").read_text().split("## Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


def pinned(name: str) -> str:
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        if line.split("==")[0].strip().lower() == name:
            return line.strip()
    raise AssertionError(f"{name} is not pinned in requirements-dev.txt")


def test_the_wheel_alone_brings_zt_and_its_command(tmp):
    wheels = tmp / "wheels"
    maturin = pathlib.Path(sys.executable).parent / "maturin"
    build = subprocess.run(
        # The same flags as `maturin develop` (no --strip, which would
        # recompile the extension crate instead of reusing it).
        [maturin, "build", "--quiet", "--profile", profile(), "-m", "python/Cargo.toml", "-o", wheels],
        cwd=ROOT,
        env={**os.environ, "CARGO_TARGET_DIR": os.fspath(target_dir())},
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    (wheel,) = wheels.glob("*.whl")
    assert "-abi3-" in wheel.name, wheel.name

    venv = tmp / "venv"
    # No pip inside (ensurepip is the slow part): this interpreter's pip
    # installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    py, bin_ = venv / "bin" / "python", venv / "bin"
    # The wheel and its declared dependencies; safetensors only because the
    # README example writes its file with it.
    pip = [sys.executable, "-m", "pip", "--python", py, "--disable-pip-version-check"]
    install = subprocess.run(
        [*pip, "install", "--quiet", wheel, pinned("safetensors")],
        capture_output=True,
        text=True,
    )
    assert install.returncode == 0, install.stderr[-4000:]
    # Run away from the checkout, so nothing of it can be imported.
    work = tmp / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"

    def run(*cmd):
        out = subprocess.run([*map(os.fspath, cmd)], cwd=work, env=env, capture_output=True, text=True)
        assert out.returncode == 0, (cmd, out.stdout, out.stderr)
        return out.stdout

    where = run(py, "-c", "import zt, sys; print(zt.__file__); print(zt.__version__)").split()
    assert pathlib.Path(where[0]).is_relative_to(venv), where
    assert "Usage: zt [OPTIONS] <COMMAND>" in run(bin_ / "zt", "--help")
    assert (
        run(bin_ / "zt", "--version")
        == f"zt {where[1]} (commit {run(py, '-c', 'import zt; print(zt.__commit__)').strip()})\n"
    )
    listing = run(bin_ / "zt", "ls", DATA / "checkpoint.pt")
    assert listing.splitlines()[0].split() == ["NAME", "DTYPE", "SHAPE", "BYTES", "OFFSET"]
    assert run(py, "-m", "zt", "ls", DATA / "checkpoint.pt") == listing
    (work / "example.py").write_text(readme_first_python_example())
    assert "f16 (4, 8) True" in run(py, "example.py")
    assert run(bin_ / "zt", "detect", work / "model.npz").strip() == "npz"
