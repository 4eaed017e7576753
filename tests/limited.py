"""Run a hostile case in a child process under an address-space limit.

An allocation that aborts (Rust's `handle_alloc_error`), a stack overflow or
a segfault kills only the child, and the test sees it as a failure: a case
cannot pass by luck because the machine happened to have the memory. The
child reports the exception it caught (its type and message) on stdout.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap

GiB = 1 << 30

CHILD = """
import json, sys
def _report(kind, message):
    print("ZT-RESULT " + json.dumps({"kind": kind, "message": message[:2000]}), flush=True)
try:
{body}
except BaseException as e:  # noqa: BLE001 - the child reports whatever it caught
    _report(type(e).__name__, str(e))
else:
    _report("none", "")
"""


def run(code: str, *, limit: int = 4 * GiB, timeout: float = 120, cwd=None, env=None) -> dict:
    """Run `code` (statements; `zt`, `numpy as np` imported) in a child with
    RLIMIT_AS = `limit`. Returns {"kind": exception type name or "none",
    "message": ...}; a child that dies (signal, abort) or hangs fails the
    calling test with its stderr."""
    body = textwrap.indent("import numpy as np\nimport zt\n" + textwrap.dedent(code), "    ")
    script = CHILD.replace("{body}", body)

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limit_memory,
            cwd=cwd,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the case ran past {timeout} s (stalled):\n{code}") from e
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ZT-RESULT ")]
    if proc.returncode != 0 or not lines:
        raise AssertionError(
            f"the child died (exit {proc.returncode}) instead of raising:\n{code}\n--- stderr:\n{proc.stderr[-3000:]}"
        )
    return json.loads(lines[-1][len("ZT-RESULT ") :])


def run_cli(args: list[str], *, limit: int = 4 * GiB, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the `zt` CLI under RLIMIT_AS; a signal death fails the test."""

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, preexec_fn=limit_memory)
    if proc.returncode < 0 or proc.returncode >= 128:
        raise AssertionError(f"{args} died with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc
