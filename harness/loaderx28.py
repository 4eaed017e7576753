"""loaderx 2.8.19 for the harness: it needs Python >= 3.12 and numpy >= 2.5,
so it runs in .venv-loaderx28 (scripts/setup-loaderx28.sh) as a child
process, harness/loaderx28_worker.py, which times its own calls and reports
back. Its rows sit in the same tables as everything else, measured in the
same run, interleaved with the other cases round by round.
"""

from __future__ import annotations

import json
import os
import subprocess

from . import common

PYTHON = common.ROOT / ".venv-loaderx28" / "bin" / "python"
WORKER = common.ROOT / "harness" / "loaderx28_worker.py"
VERSION = "2.8.19"


def missing() -> str | None:
    """Why loaderx 2.8.19 cannot run here (None when it can)."""
    if not PYTHON.exists():
        return "missing (no .venv-loaderx28: run scripts/setup-loaderx28.sh)"
    probe = subprocess.run(
        [os.fspath(PYTHON), "-c", "import loaderx; print(loaderx.__version__)"], capture_output=True, text=True
    )
    if probe.returncode != 0 or probe.stdout.strip() != VERSION:
        return f"missing (.venv-loaderx28 has no loaderx {VERSION}: run scripts/setup-loaderx28.sh)"
    return None


def versions() -> dict:
    """{"loaderx", "numpy", "python"} of the worker's interpreter."""
    with Worker() as w:
        return w.call("version")


class Worker:
    """A running loaderx28_worker.py: `call(op, **args)` sends one request
    and returns its reply (RuntimeError when the worker reports an error)."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [os.fspath(PYTHON), os.fspath(WORKER), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=common.ROOT,
        )

    def call(self, op: str, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"loaderx 2.8 worker exited ({self.proc.wait()})")
        reply = json.loads(line)
        if isinstance(reply, dict) and "error" in reply:
            raise RuntimeError(f"loaderx 2.8: {reply['error']}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
