"""Warm whole-file loads: what a load costs when the file is already in
the page cache (the second load of a model, a notebook re-run).

One 256 MiB file of fp16 matrices (`--tensors` of equal size) per format,
safetensors and npz (stored members, as `numpy.savez` writes), written by
the format's own library and read once untimed so every page is cached.
Cases, interleaved round by round, each followed by one byte of every page
of every array read (a mapped view costs nothing until touched):

* `zt.numpy.load_file` (the default: writable views of a private
  copy-on-write mapping);
* `zt.numpy.load_file(readonly=True)` (read-only views of zt's mapping);
* `zt.open` + `numpy()` of every tensor;
* upstream `ztensor.numpy.load_file` 2.1.2 (read-only views), the peer;
* upstream `ztensor.open` + `np.from_dlpack()` of every tensor: upstream's
  per-tensor API in the shape of zt's `open` row (each array touched as it
  is made), for a like-for-like reading of that row.

An npz load checks every member's CRC-32 at its first read (upstream does
not); the rows say what that costs at memory speed.

    python -m harness.warm_bench --runs 21          (or: python -m harness --only warm)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics

import numpy as np

import zt
import zt.numpy

from . import common, report
from .cold_bench import touch

MODULES = ["zt", "numpy", "safetensors", "ztensor"]
UPSTREAM = "upstream ztensor.numpy.load_file"
UPSTREAM_OPEN = "upstream ztensor.open + np.from_dlpack()"


def arrays(tensors: int, size_mb: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    n = size_mb * 2**20 // tensors // 2
    rows = 1024
    return {f"layer.{i}.w": rng.standard_normal((rows, n // rows)).astype(np.float16) for i in range(tensors)}


def zt_default(path) -> int:
    return touch(zt.numpy.load_file(path).values())


def zt_readonly(path) -> int:
    return touch(zt.numpy.load_file(path, readonly=True).values())


def zt_open(path) -> int:
    with zt.open(path) as src:
        return touch(src[name].numpy() for name in src)


def upstream(path) -> int:
    import ztensor.numpy

    return touch(ztensor.numpy.load_file(os.fspath(path)).values())


def upstream_open(path) -> int:
    """Upstream's per-tensor API in `zt_open`'s shape: each tensor made an
    array (`np.from_dlpack`, as upstream's own `load_file` makes them) and
    touched before the next is made."""
    import ztensor

    with ztensor.open(os.fspath(path)) as src:
        return touch(np.from_dlpack(t) for t in src.values())


def zt_crc(path) -> int:
    """zt's check of every npz member, one by one (its CRC-32, what each
    member's first read runs), through a fresh open: each member hashed on
    every core in pieces, combined."""
    with zt.open(path) as src:
        for name in src:
            src[name]._native._guard()
        return len(src)


def zt_crc_whole_load(path) -> int:
    """zt's check of every npz member as a whole load (``load_file``) runs
    it, through a fresh open: the read-ahead of every member, which checks
    the members together, laid end to end and cut into one span per core."""
    with zt.open(path) as src:
        src._native._read_ahead()
        for name in src:
            src[name]._native._guard()  # already checked: returns at once
        return len(src)


def read_members(path) -> int:
    """Every byte of the same members read once through a fresh mapping (a
    XOR over 8-byte words, numpy's reduction): a plain pass over the bytes,
    for scale."""
    with zt.open(path) as src:
        spans = [src[name].location[1:] for name in src]
    mapped = np.memmap(path, mode="r")
    acc = 0
    for offset, nbytes in spans:
        words = mapped[offset : offset + nbytes // 8 * 8].view(np.uint64)
        acc ^= int(np.bitwise_xor.reduce(words))
    del mapped
    return len(spans)


def read_members_every_core(path) -> int:
    """`read_members` on every core: the members dealt out to one thread per
    core (numpy's reduction releases the GIL), each XORing its members'
    words: the plain pass on every core, as zt's check hashes."""
    from concurrent.futures import ThreadPoolExecutor

    with zt.open(path) as src:
        spans = [src[name].location[1:] for name in src]
    mapped = np.memmap(path, mode="r")
    cores = os.cpu_count() or 1

    def xor(share) -> int:
        acc = 0
        for offset, nbytes in share:
            acc ^= int(np.bitwise_xor.reduce(mapped[offset : offset + nbytes // 8 * 8].view(np.uint64)))
        return acc

    with ThreadPoolExecutor(cores) as pool:
        list(pool.map(xor, [spans[i::cores] for i in range(cores)]))
    return len(spans)


def zlib_crc(path) -> int:
    """Python's zlib.crc32 of the same members (what zipfile, so numpy.load,
    checks with), one thread, through a fresh mapping."""
    import zlib

    with zt.open(path) as src:
        spans = [src[name].location[1:] for name in src]
    mapped = np.memmap(path, mode="r")
    for offset, nbytes in spans:
        zlib.crc32(mapped[offset : offset + nbytes])
    del mapped
    return len(spans)


EVERY_CORE = "read every byte on every core (XOR of words, a thread per core)"


def crc_rows(path, tensors: int, nbytes: int, runs: int) -> report.Result:
    cases = {
        "zt CRC-32 check of every member, as a whole load runs it": lambda: zt_crc_whole_load(path),
        "zt CRC-32 check of every member, one by one (first reads)": lambda: zt_crc(path),
        "zlib.crc32 of every member (1 thread)": lambda: zlib_crc(path),
        "read every byte (XOR of words)": lambda: read_members(path),
        EVERY_CORE: lambda: read_members_every_core(path),
    }
    samples, values = common.interleaved(cases, runs, warmup=2)
    assert set(values.values()) == {tensors}, values
    return report.Result(
        name="warm",
        title=f"The npz check against memory speed: {nbytes / 2**20:.0f} MiB of members, warm",
        samples=samples,
        peer=EVERY_CORE,
        nbytes=nbytes,
        modules=MODULES,
        notes=[
            "Each case opens the file afresh and passes over every member's bytes through a new mapping; "
            "The `read every byte` rows are numpy passes over the same bytes (a XOR reduction of 8-byte words, "
            "on one thread and on a thread per core), for scale: a plain pass, not the memory's limit (numpy's "
            "reduction is slower than a CRC-32 at AVX-512 width here). zt's check runs two ways: a whole load "
            "(`load_file`) checks every member together, the members laid end to end and cut into one span per "
            "core; a first read of one member checks that member, in pieces on every core, combined. "
            f"{runs} interleaved runs after 2 warm-ups; load average {os.getloadavg()[0]:.1f} at the end of the run."
        ],
    )


FAULTS = "page faults per load"


def _counting_faults(name, fn, faults: dict[str, list[int]]):
    """`fn` with the minor page faults of each call appended to faults[name]
    (one getrusage on each side, inside the timed call: microseconds)."""

    def case():
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        value = fn()
        faults.setdefault(name, []).append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return value

    return case


def run(tensors: int, size_mb: int, runs: int) -> list[report.Result]:
    import safetensors.numpy

    work = common.bench_dir("warm")
    data = arrays(tensors, size_mb)
    nbytes = sum(a.nbytes for a in data.values())
    want = touch(data.values())
    stem = f"model-{tensors}x{size_mb}"
    files = {"safetensors": work / f"{stem}.safetensors", "npz": work / f"{stem}.npz"}
    if not files["safetensors"].exists():
        safetensors.numpy.save_file(data, files["safetensors"])
    if not files["npz"].exists():
        np.savez(files["npz"], **data)
    results = []
    for fmt, path in files.items():
        cases = {
            "zt.numpy.load_file": lambda p=path: zt_default(p),
            "zt.numpy.load_file(readonly=True)": lambda p=path: zt_readonly(p),
            "zt.open + numpy()": lambda p=path: zt_open(p),
        }
        try:
            import ztensor  # noqa: F401

            cases[UPSTREAM] = lambda p=path: upstream(p)
            cases[UPSTREAM_OPEN] = lambda p=path: upstream_open(p)
        except ImportError:
            pass
        faults: dict[str, list[int]] = {}
        cases = {name: _counting_faults(name, fn, faults) for name, fn in cases.items()}
        samples, values = common.interleaved(cases, runs, warmup=2)
        bad = {k: v for k, v in values.items() if v != want}
        if bad:
            raise AssertionError(f"{fmt}: pages read differ from the arrays written: {sorted(bad)}")
        results.append(
            report.Result(
                name="warm",
                title=f"Warm load of {nbytes / 2**20:.0f} MiB {fmt} ({tensors} fp16 tensors), one byte of every page touched",
                samples=samples,
                peer=UPSTREAM if UPSTREAM in samples else None,
                nbytes=nbytes,
                modules=MODULES,
                extra={name: {FAULTS: f"{statistics.median(n):.0f}"} for name, n in faults.items()},
                notes=[
                    f"Files on {common.filesystem_of(work)}; {runs} interleaved runs after 2 warm-ups; "
                    f"load average {os.getloadavg()[0]:.1f} at the end of the run. `{FAULTS}`: the process's "
                    "minor page faults during one load and touch (median): each maps cached pages of the file, "
                    "as many at once as the page cache's folios allow, so readers with the same count pay the "
                    "kernel the same."
                ],
            )
        )
    results.append(crc_rows(files["npz"], tensors, nbytes, runs))
    return results


def header(runs: int) -> str:
    v = common.versions("safetensors", "ztensor")
    return (
        "## Warm whole-file loads (file in the page cache)\n\n"
        f"safetensors {v['safetensors']}, ztensor {v.get('ztensor', 'missing')}. {report.machine_line(MODULES)}\n\n"
        "Reproduce: `python -m harness.warm_bench --runs 21`.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=32)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--out", default="warm")
    args = ap.parse_args()
    results = run(args.tensors, args.size_mb, args.runs)
    for r in results:
        print(r.markdown())
    report.save(results, args.out, header(args.runs), plot=False)


if __name__ == "__main__":
    main()
