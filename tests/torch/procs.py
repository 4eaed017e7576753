"""Processes for the multi-rank tests: free ports, and launches that are
always cleaned up.

Each launch runs in a session of its own, so every process it starts
(torchrun's workers too, even after torchrun itself died and they were
re-parented) carries the launch's session id; cleanup SIGKILLs each of
them by PID. Nothing else on the machine is touched."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
PYTHON = sys.executable
TORCHRUN = str(pathlib.Path(sys.executable).with_name("torchrun"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(**extra: str) -> dict[str, str]:
    """The environment of a rank on this machine: gloo over loopback, one
    OpenMP thread (2 cores shared by all ranks), the test helpers importable."""
    env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def _session_members(sid: int) -> list[int]:
    """PIDs whose session id is `sid` (field 6 of /proc/PID/stat)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:
            members.append(int(entry))
    return members


class Launch:
    """One started process (and its descendants), output in files under `logs`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: pathlib.Path):
        logs.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.stdout_path, self.stderr_path = logs / f"{name}.out", logs / f"{name}.err"
        with open(self.stdout_path, "w") as out, open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True
            )
        self.pid = self.proc.pid

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        out = self.stdout_path.read_text(errors="replace")
        err = self.stderr_path.read_text(errors="replace")
        return f"--- {self.name} stdout ---\n{out[-4000:]}\n--- {self.name} stderr ---\n{err[-6000:]}"

    def kill(self) -> None:
        """SIGKILL every process of this launch, by PID, and reap the root."""
        for _ in range(3):  # a process may fork while we look
            pids = _session_members(self.pid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class Launches:
    """A context manager owning launches: all are killed on exit, pass or fail."""

    def __init__(self, logs: pathlib.Path):
        self.logs = logs
        self.started: list[Launch] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> Launch:
        launch = Launch(name, argv, env, self.logs)
        self.started.append(launch)
        return launch

    def __enter__(self) -> Launches:
        return self

    def __exit__(self, *exc) -> None:
        for launch in self.started:
            launch.kill()


# What a rank prints when torch's C++ runtime aborts it (seen once in a
# full-suite run, gloo on CPU under load, in a job that only saves files).
TORCH_ABORT = "terminate called without an active exception"


def run_file_job(
    group: Launches, name: str, argv: list[str], env: dict[str, str], timeout: float, attempts: int = 3
) -> tuple[int, Launch]:
    """Run a torchrun job that only writes files (fixtures), again when a
    rank died of torch's own abort (`TORCH_ABORT`): the files it writes are
    rewritten whole by the next attempt. Any other failure, or the abort
    `attempts` times, is returned for the test to report."""
    for attempt in range(1, attempts + 1):
        run = group.start(f"{name}-{attempt}", argv, env)
        rc = run.wait(timeout)
        if rc == 0 or TORCH_ABORT not in run.output():
            return rc, run
    return rc, run


def torchrun_argv(nproc: int, script: pathlib.Path, *args: str) -> list[str]:
    """torchrun on one node, rendezvous on 127.0.0.1 at a free port (the
    recipe verified on this 2-core machine; arguments positional, since
    torchrun's argparse would read an abbreviated --start as --start-method)."""
    return [
        TORCHRUN,
        "--nnodes=1",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        "--max_restarts=0",
        str(script),
        *args,
    ]
