"""Measurement helpers shared by every benchmark: a bench directory on real
storage, cold-cache eviction, interleaved runs, medians with spread."""

from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import subprocess
import time
from typing import Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def s3server():
    """The tests' SeaweedFS helper (`tests/s3server.py`), imported from its
    file. Putting `tests/` on `sys.path` instead would make its `torch/`
    directory importable as a namespace package named `torch`, so later
    comparisons would take torch for installed where it is not."""
    import importlib.util
    import sys

    module = sys.modules.get("s3server")
    if module is None:
        spec = importlib.util.spec_from_file_location("s3server", ROOT / "tests" / "s3server.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["s3server"] = module
        spec.loader.exec_module(module)
    return module


RESULTS = ROOT / "results"


def bench_base() -> pathlib.Path:
    """Where every comparison keeps its scratch files ($ZT_BENCH_DIR or work-bench/)."""
    return pathlib.Path(os.environ.get("ZT_BENCH_DIR", ROOT / "work-bench"))


def bench_dir(name: str) -> pathlib.Path:
    """A scratch directory on real storage (refuses tmpfs: it would measure RAM)."""
    path = bench_base() / name
    path.mkdir(parents=True, exist_ok=True)
    fs = filesystem_of(path)
    if fs in ("tmpfs", "ramfs"):
        raise SystemExit(f"{path} is on {fs}; set ZT_BENCH_DIR to a directory on a real disk")
    return path


def filesystem_of(path: pathlib.Path) -> str:
    """The filesystem type under `path`: findmnt's name (ext4 is "ext4"),
    else `stat -f`'s (which calls every ext filesystem "ext2/ext3")."""
    try:
        out = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE", "--target", os.fspath(path)], capture_output=True, text=True
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    except OSError:
        pass
    out = subprocess.run(["stat", "-f", "-c", "%T", os.fspath(path)], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def drop_cache(path: pathlib.Path) -> None:
    """Evict a file's pages from the page cache (cold read)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_fraction(path: pathlib.Path) -> float:
    """Fraction of a file's pages in the page cache (mincore), to check that a
    cold-cache run really starts cold."""
    import ctypes
    import mmap

    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(None, use_errno=True)
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = np.frombuffer(m, np.uint8)  # only to learn the mapping's address
        rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec)
        del view
    if rc != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return float((np.frombuffer(vec, np.uint8) & 1).mean())


def digest(arr: np.ndarray) -> int:
    """Touch every byte of an array and fold it to a number, so a reader
    that skips bytes is caught and the work cannot be optimised away."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    head = flat[: flat.size - flat.size % 8].view(np.uint64)
    acc = int(np.bitwise_xor.reduce(head)) if head.size else 0
    for b in flat[head.size * 8 :]:
        acc ^= int(b)
    return acc


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of `n` cases (a Williams design) in which every case runs in
    every position equally often and directly after every other case
    equally often: n orders for even n (and one), 2n for odd. Rotating one order
    (A B C, B C A, C A B) balances positions but not neighbours: each case
    then always follows the same one, and a case that leaves the process
    paying for it (freed memory handed back to the OS, cold caches)
    penalised only its fixed successor (the `.zt` open, after upstream
    ztensor's, measured 30% slower than after any other)."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        if len(first) % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    orders = [[(start + k) % n for k in first] for start in range(n)]
    if n % 2 and n > 1:
        orders += [order[::-1] for order in orders]
    return orders


def interleaved(
    cases: dict[str, Callable[[], object]],
    runs: int,
    warmup: int = 1,
    before: Callable[[], None] | None = None,
    after: Callable[[str], None] | None = None,
):
    """Run every case `runs` times, one round of all cases at a time, in the
    orders of `balanced_orders` taken in turn: machine drift hits all cases
    equally, no case always runs first in a round (the first write after the
    previous round's deletions measured up to 1.7x slower), and no case
    always follows the same one. `before()` runs before each timed call and
    `after(name)` after it, both untimed. Returns {name: [seconds, ...]} and
    the value each case returned (for correctness checks)."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    values: dict[str, object] = {}
    items = list(cases.items())
    orders = balanced_orders(len(items)) if items else [[]]
    for i in range(warmup + runs):
        for k in orders[i % len(orders)]:
            name, fn = items[k]
            if before:
                before()
            t0 = time.perf_counter()
            values[name] = fn()
            elapsed = time.perf_counter() - t0
            if after:
                after(name)
            if i >= warmup:
                times[name].append(elapsed)
    return times, values


def summary(samples: list[float]) -> tuple[float, float, float]:
    """Median and the interquartile range (q1, q3)."""
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q = statistics.quantiles(samples, n=4, method="inclusive")
    return statistics.median(samples), q[0], q[2]


def machine() -> dict:
    """The machine a table was measured on."""
    info = {"python": platform.python_version(), "kernel": platform.release(), "cores": os.cpu_count()}
    info["filesystem"] = bench_filesystem()
    try:
        cpuinfo = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
        meminfo = pathlib.Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return info
    info["cpu"] = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown")
    for line in meminfo:
        if line.startswith("MemTotal"):
            info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
    return info


def bench_filesystem() -> str:
    """The filesystem type of the bench directory (of its nearest existing parent)."""
    path = bench_base().resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:  # findmnt also gives the device
        out = subprocess.run(
            ["findmnt", "-n", "-o", "FSTYPE,SOURCE", "--target", os.fspath(path)], capture_output=True, text=True
        )
        fstype, source = out.stdout.split()[:2]
        return f"{fstype} ({source})"
    except (OSError, ValueError):
        return filesystem_of(path)


def zt_commit() -> str:
    """The git commit of the zt package this process imports ("+dirty" when its
    tracked files differ from it), or "unknown" outside a git checkout. The
    suite's own outputs (results/, README.md) do not count: a run rewrites
    them before it records the commit."""
    try:
        import zt

        where = pathlib.Path(zt.__file__).resolve().parent
        git = ["git", "-C", os.fspath(where)]
        head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        outputs = [":(top,exclude)results", ":(top,exclude)README.md"]
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", ":(top)", *outputs],
            capture_output=True,
            text=True,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (ImportError, OSError, subprocess.SubprocessError):
        return "unknown"


def versions(*modules: str) -> dict:
    """Installed version of each distribution ("missing" when absent); zt's
    carries the git commit it was imported from."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for m in modules:
        try:
            out[m] = version(m)
        except PackageNotFoundError:
            out[m] = "missing"
        if m == "zt" and out[m] != "missing":
            out[m] += f" (git {zt_commit()})"
    return out


def write_result(stem: str, markdown: str, raw: dict) -> pathlib.Path:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.md").write_text(markdown)
    (RESULTS / f"{stem}.json").write_text(json.dumps(raw, indent=1))
    return RESULTS / f"{stem}.md"


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def proc_status(key: str) -> int:
    """A `/proc/self/status` size field (`VmRSS`, `VmHWM`, `RssAnon`) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


# How often a measured call's anonymous memory is sampled.
ANON_POLL_S = 0.005


def measure_call(call: Callable[[], object]) -> dict:
    """Run `call` in this (fresh, imports done) process and return its time
    and memory: `seconds`; `baseline`, the resident set before it; `peak`,
    the resident high-water mark after it (VmHWM, which counts the file
    pages a mapping touches); `anon`, the peak anonymous memory over its
    value before, sampled every `ANON_POLL_S` (the kernel keeps no
    high-water mark of anonymous memory alone)."""
    import threading

    before, anon = proc_status("VmRSS"), [proc_status("RssAnon")]
    done = threading.Event()

    def poll():
        while not done.wait(ANON_POLL_S):
            anon.append(max(anon[-1], proc_status("RssAnon")))

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.perf_counter()
    try:
        call()
    finally:
        seconds = time.perf_counter() - t0
        done.set()
        poller.join()
    peak_anon = max(anon[-1], proc_status("RssAnon")) - anon[0]
    return {"seconds": seconds, "baseline": before, "peak": proc_status("VmHWM"), "anon": peak_anon}


class LoadWindow:
    """The 1-minute load average when a comparison's run started and ended,
    for its results header: other work sharing the cores slows every case
    alike (they are interleaved run by run), so the ratios hold while the
    absolute times do not."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None

    def begin(self) -> None:
        self.start = os.getloadavg()[0]

    def finish(self) -> None:
        self.end = os.getloadavg()[0]

    def sentence(self) -> str:
        """The header's sentence about it, with its paragraph break; empty
        before a run has begun and finished."""
        if self.start is None or self.end is None:
            return ""
        return (
            f"\n\nThis run: 1-minute load average {self.start:.1f} at the start and {self.end:.1f} at the end "
            "(other work sharing the cores; the cases are interleaved run by run, so the ratios hold)."
        )
