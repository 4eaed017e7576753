"""Read safetensors and npz through zt against each format's own library.

Measured, each case interleaved run by run with its peers:
  * open latency of a file with many small tensors (metadata only);
  * reading every byte of a large file: zt zero-copy, zt copy, and the
    reference reader, warm and cold cache (cold: posix_fadvise DONTNEED,
    checked with mincore).
Every read is checked against a digest of the bytes written.

    python -m harness.read_bench --tensors 10000 --size-mb 1024 --runs 5
"""

from __future__ import annotations

import argparse

import numpy as np
import safetensors
import safetensors.numpy

from . import common, report
from .read_formats import big_arrays, open_zt, read_zt


def make_many(path, count: int) -> None:
    rng = np.random.default_rng(0)
    safetensors.numpy.save_file(
        {f"layer.{i}.w": rng.standard_normal(64).astype(np.float32) for i in range(count)}, path
    )


def read_safetensors(path) -> dict[str, int]:
    return {k: common.digest(v) for k, v in safetensors.numpy.load_file(path).items()}


def read_npz(path) -> dict[str, int]:
    with np.load(path) as f:
        return {k: common.digest(f[k]) for k in f.files}


def open_safetensors(path) -> int:
    with safetensors.safe_open(path, "numpy") as f:
        return len(f.keys())


def read_cases(path, peer_name: str, peer, want: dict[str, int], runs: int, cold: bool) -> dict[str, list[float]]:
    cases = {
        "zt zero-copy": lambda: read_zt(path, False),
        "zt copy": lambda: read_zt(path, True),
        peer_name: lambda: peer(path),
    }
    before = None
    if cold:

        def before():
            common.drop_cache(path)
            assert common.cached_fraction(path) < 0.05, "the page cache kept the file"

    times, values = common.interleaved(cases, runs, warmup=0 if cold else 1, before=before)
    for name, got in values.items():
        assert got == want, f"{name} read wrong bytes"
    return times


def run(tensors: int, size_mb: int, runs: int, cold: bool = True) -> list[report.Result]:
    work = common.bench_dir("read")
    many = work / f"many-{tensors}.safetensors"
    if not many.exists():
        make_many(many, tensors)
    arrays = big_arrays(size_mb)
    want = {k: common.digest(v) for k, v in arrays.items()}
    st_path, npz_path = work / f"big-{size_mb}.safetensors", work / f"big-{size_mb}.npz"
    safetensors.numpy.save_file(arrays, st_path)
    np.savez(npz_path, **arrays)
    nbytes = sum(a.nbytes for a in arrays.values())
    del arrays

    open_times, values = common.interleaved(
        {"zt.open": lambda: open_zt(many), "safetensors.safe_open": lambda: open_safetensors(many)}, runs
    )
    assert values["zt.open"] == values["safetensors.safe_open"] == tensors
    gib = f"{nbytes / 2**30:.2f} GiB"
    results = [
        report.Result(
            "read",
            f"Open latency, {tensors:,} tensors (metadata only)",
            open_times,
            peer="safetensors.safe_open",
            modules=["safetensors"],
        )
    ]
    temps = ["warm"] + (["cold"] if cold else [])
    for fmt, path, peer_name, peer in (
        ("safetensors", st_path, "safetensors.numpy.load_file", read_safetensors),
        ("npz (stored)", npz_path, "numpy.load", read_npz),
    ):
        for temp in temps:
            times = read_cases(path, peer_name, peer, want, runs, cold=temp == "cold")
            results.append(
                report.Result(
                    "read", f"Read every byte of {gib} {fmt}, {temp} cache", times, peer=peer_name, nbytes=nbytes
                )
            )
    return results


def header(runs: int) -> str:
    work = common.bench_dir("read")
    v = common.versions("safetensors", "numpy")
    return (
        "## Reading safetensors and npz: zt against each format's own library\n\n"
        f"safetensors {v['safetensors']}, numpy {v['numpy']}. Files on {common.filesystem_of(work)} at `{work}`; "
        f"{runs} interleaved runs (after one warm-up for warm cache); every byte digested and checked. "
        "Cold cache: `posix_fadvise(DONTNEED)` before each run, checked with `mincore`. Data: synthetic fp16 matrices."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=10_000)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    results = run(args.tensors, args.size_mb, args.runs, cold=not args.no_cold)
    print((report.save(results, "read", header(args.runs))).read_text())


if __name__ == "__main__":
    main()
