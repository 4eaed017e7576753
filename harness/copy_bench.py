"""Copy mode: loading a checkpoint into fresh, independent arrays.

A safetensors file of large fp16 and fp32 tensors (`--size-mb`, default
1024, random bits) written by `safetensors.numpy.save_file`, read warm (in
the page cache). Cases, interleaved run by run:

* `zt.numpy.load_file(copy=True)`: every destination allocated first, then
  the raw bytes `pread` straight into them (the mapped file reopened for
  it) in file order on the cores the size warrants (`zt_core::copy`);
* the same with `backend="pread"` (the file never mapped);
* numpy's copy of zt's zero-copy views,
  `{k: v.copy() for k, v in zt.numpy.load_file(p).items()}`: one tensor
  after another on one core, the baseline the ratios are against;
* `safetensors.numpy.load_file(p)`, the peer (it copies).

Every case's arrays are checked bit for bit against the written tensors once
before timing. Each timed call keeps its arrays until the clock stops, so
freeing them is not timed for any case.

    python -m harness.copy_bench --size-mb 1024 --runs 15
"""

from __future__ import annotations

import argparse
import os
import random

import numpy as np
import safetensors.numpy

import zt
import zt.numpy
from zt._tensor import memory_owner

from . import common, report

MODULES = ["zt", "numpy", "safetensors"]

BASELINE = "numpy copy of zt views"


def model(size_mb: int, width: int = 4096) -> dict[str, np.ndarray]:
    """Alternating fp16 [width, width] and fp32 [width / 2, width] tensors
    (32 MiB each at the default width, random bits) with a small fp32 norm
    vector after each pair, to `size_mb`."""
    rng = np.random.default_rng(11)
    out: dict[str, np.ndarray] = {}
    i = 0
    while sum(a.nbytes for a in out.values()) < size_mb << 20:
        out[f"layer.{i}.proj"] = rng.integers(0, 1 << 16, size=(width, width), dtype=np.uint16).view(np.float16)
        out[f"layer.{i}.mlp"] = rng.integers(0, 1 << 32, size=(width // 2, width), dtype=np.uint32).view(np.float32)
        out[f"layer.{i}.norm"] = rng.standard_normal(width).astype(np.float32)
        i += 1
    return out


def zt_copy(path) -> dict[str, np.ndarray]:
    return zt.numpy.load_file(path, copy=True)


def zt_copy_pread(path) -> dict[str, np.ndarray]:
    return zt.numpy.load_file(path, copy=True, backend="pread")


def numpy_copy(path) -> dict[str, np.ndarray]:
    return {k: v.copy() for k, v in zt.numpy.load_file(path).items()}


def safetensors_load(path) -> dict[str, np.ndarray]:
    return safetensors.numpy.load_file(path)


CASES = {
    "zt.numpy.load_file(copy=True)": zt_copy,
    'zt.numpy.load_file(copy=True, backend="pread")': zt_copy_pread,
    BASELINE: numpy_copy,
    "safetensors.numpy.load_file": safetensors_load,
}


def owns_its_memory(arr: np.ndarray) -> bool:
    """Writable and not a view of a file mapping (numpy's own buffer, or an
    owned zt buffer)."""
    import mmap

    base = memory_owner(arr)
    return arr.flags.writeable and not isinstance(base, mmap.mmap) and not getattr(base, "readonly", False)


def check(cases, path, want: dict[str, int]) -> None:
    """Each case once: every tensor bit for bit, and (copying cases) in
    memory of its own."""
    for name, fn in cases.items():
        got = fn(path)
        assert {k: common.digest(v) for k, v in got.items()} == want, name
        assert all(owns_its_memory(v) for v in got.values()), name
        del got


def shuffled_rounds(cases, runs: int, after, seed: int = 16) -> dict[str, list[float]]:
    """`common.interleaved`, one warm-up round and then `runs` rounds, each
    in a fresh (seeded) random order rather than a rotation. Rotating keeps
    who follows whom: the case after safetensors' load always ran right
    after it freed 1 GiB of 4 KiB pages, and on the 2-core VM these tables
    were measured on, that run took 2-5x the time, nearly all of it kernel
    time, whichever case it was (numpy's copy and zt's alike; likely the
    VM's memory balloon: freed memory faulted back in from the host)."""
    rng = random.Random(seed)
    common.interleaved(cases, 0, warmup=1, after=after)
    names = list(cases)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(runs):
        rng.shuffle(names)
        times, _ = common.interleaved({name: cases[name] for name in names}, 1, warmup=0, after=after)
        for name, t in times.items():
            samples[name].extend(t)
    return {name: samples[name] for name in cases}


def run(size_mb: int, runs: int, width: int = 4096) -> list[report.Result]:
    work = common.bench_dir("copy")
    path = work / f"model-{size_mb}-{width}.safetensors"
    arrays = model(size_mb, width)
    nbytes = sum(a.nbytes for a in arrays.values())
    if not path.exists():
        safetensors.numpy.save_file(arrays, path)
    want = {k: common.digest(v) for k, v in arrays.items()}
    del arrays
    check(CASES, path, want)
    kept: list[object] = []

    def timed(fn):
        def call():
            kept.append(fn(path))

        return call

    load_before = os.getloadavg()
    samples = shuffled_rounds({name: timed(fn) for name, fn in CASES.items()}, runs, after=lambda _: kept.clear())
    load_after = os.getloadavg()
    pressure = cpu_pressure()
    cached = common.cached_fraction(path)
    with zt.open(path) as src:
        count = len(src)
    notes = [
        f"{count} tensors (fp16 [{width}, {width}] and fp32 [{width // 2}, {width}], fp32 [{width}] norms), "
        f"{nbytes / 2**20:.0f} MiB, on {common.filesystem_of(work)}; warm cache "
        f"({cached:.3f} of the file's pages cached after the runs).",
        f"Release build; {runs} interleaved rounds in shuffled order after one warm-up; freeing the arrays "
        "is not timed. "
        f"Load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after "
        f"on {os.cpu_count()} cores{pressure}; zt copies on up to {zt_threads(nbytes)} threads here. "
        "Other work on the same cores takes the second copying thread's core away: compare ratios within a table.",
    ]
    return [
        report.Result(
            name="copy",
            title=f"Copy mode: independent arrays of {nbytes / 2**20:.0f} MiB, warm cache",
            samples=samples,
            peer=BASELINE,
            nbytes=nbytes,
            modules=MODULES,
            notes=notes,
        )
    ]


def cpu_pressure() -> str:
    """The text ", CPU pressure N% over the last minute" (Linux PSI: the share of time
    some runnable task waited for a core), or "" where unavailable."""
    try:
        with open("/proc/pressure/cpu") as f:
            line = f.readline()
        avg60 = dict(kv.split("=") for kv in line.split()[1:])["avg60"]
    except (OSError, KeyError, ValueError):
        return ""
    return f", CPU pressure {float(avg60):.0f}% over the last minute"


def zt_threads(nbytes: int) -> int:
    """The threads zt's copy uses for `nbytes` on this machine."""
    from zt import _zt

    return _zt.copy_threads(nbytes)


def header(runs: int) -> str:
    v = common.versions("safetensors", "numpy")
    return (
        "## Copy mode: `load_file(copy=True)`\n\n"
        f"safetensors {v['safetensors']}, numpy {v['numpy']}; {runs} interleaved runs. "
        f"Ratios are the numpy copy's median over each row's. {report.machine_line(MODULES)}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", default="copy")
    args = ap.parse_args()
    results = run(args.size_mb, args.runs)
    for r in results:
        print(r.markdown())
    report.save(results, args.out, header(args.runs), plot=True)


if __name__ == "__main__":
    main()
