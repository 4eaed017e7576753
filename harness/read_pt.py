"""Read PyTorch checkpoints through zt against torch.load.

Two measurements, each interleaved run by run with its peers:
  * open latency of a checkpoint with many small tensors (metadata only:
    zt.open against torch.load(mmap=True), which also only maps);
  * reading every byte of a large checkpoint (a state dict of fp16
    matrices written by torch.save): zt zero-copy, zt copy, and
    torch.load(mmap=True, weights_only=True), warm and cold cache.
Every read is checked against a digest of the bytes written. Without
torch the checkpoints are written by zt and torch's rows read "missing".

    python -m harness.read_pt --tensors 10000 --size-mb 1024 --runs 5
"""

from __future__ import annotations

import argparse

import numpy as np

import zt

from . import common, report

PEER = "torch.load(mmap=True, weights_only=True)"


def load_torch():
    """torch, or None when it is not importable (its rows then read "missing")."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def save(arrays: dict[str, np.ndarray], path, torch) -> None:
    """torch.save a state dict; without torch, zt writes a checkpoint torch would read."""
    if torch is None:
        zt.numpy.save_file(arrays, path)
    else:
        torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, path)


def make_many(path, count: int, torch) -> None:
    rng = np.random.default_rng(0)
    save({f"layer.{i}.w": rng.standard_normal(64, dtype=np.float32) for i in range(count)}, path, torch)


def make_big(path, size_mb: int, torch) -> dict[str, int]:
    """fp16 matrices of ~64 MiB each adding up to size_mb. Returns digests."""
    rng = np.random.default_rng(1)
    per = min(64, size_mb)
    rows = per * (1 << 20) // 2 // 4096
    arrays = {
        f"block.{i}.weight": rng.integers(0, 1 << 16, size=(rows, 4096), dtype=np.uint16).view(np.float16)
        for i in range(max(1, size_mb // per))
    }
    save(arrays, path, torch)
    return {k: common.digest(v) for k, v in arrays.items()}


def read_zt(path, copy: bool) -> dict[str, int]:
    with zt.open(path) as src:
        return {name: common.digest(src[name].numpy(copy=copy)) for name in src}


def read_torch(path, torch) -> dict[str, int]:
    sd = torch.load(path, mmap=True, weights_only=True)
    return {k: common.digest(v.view(torch.int16).numpy()) for k, v in sd.items()}


def open_zt(path) -> int:
    with zt.open(path) as src:
        return len(src)


def open_torch(path, torch) -> int:
    return len(torch.load(path, mmap=True, weights_only=True))


def missing(times: dict[str, list[float]], torch) -> tuple[dict[str, list[float]], dict[str, dict[str, str]]]:
    """Add torch's row, empty, when torch is not importable."""
    if torch is not None:
        return times, {}
    return {**times, PEER: []}, {PEER: {"note": "missing: torch is not installed (files written by zt)"}}


def run(tensors: int, size_mb: int, runs: int, cold: bool = True) -> list[report.Result]:
    torch = load_torch()
    if torch is not None:
        torch.set_num_threads(1)
    work = common.bench_dir("read_pt")
    tag = "" if torch else "-zt"
    many, big = work / f"many-{tensors}{tag}.pt", work / f"big-{size_mb}{tag}.pt"
    if not many.exists():
        make_many(many, tensors, torch)
    want = make_big(big, size_mb, torch)
    nbytes = big.stat().st_size

    openers = {"zt.open": lambda: open_zt(many)}
    if torch:
        openers[PEER] = lambda: open_torch(many, torch)
    open_times, values = common.interleaved(openers, runs)
    assert all(v == tensors for v in values.values())
    open_times, extra = missing(open_times, torch)
    title = f"Open latency, {tensors:,} tensors (metadata only)"
    results = [report.Result("read_pt", title, open_times, peer=PEER, extra=extra, modules=["torch"])]
    readers = {"zt zero-copy": lambda: read_zt(big, False), "zt copy": lambda: read_zt(big, True)}
    if torch:
        readers[PEER] = lambda: read_torch(big, torch)

    def drop():
        common.drop_cache(big)
        assert common.cached_fraction(big) < 0.05, "the page cache kept the file"

    for temp in ["warm"] + (["cold"] if cold else []):
        before = drop if temp == "cold" else None
        times, values = common.interleaved(readers, runs, warmup=int(temp == "warm"), before=before)
        for name, got in values.items():
            assert got == want, f"{name} read wrong bytes"
        times, extra = missing(times, torch)
        title = f"Read every byte of a {nbytes / 2**30:.2f} GiB checkpoint, {temp} cache"
        results.append(report.Result("read_pt", title, times, peer=PEER, nbytes=nbytes, extra=extra))
    return results


def header(runs: int) -> str:
    work = common.bench_dir("read_pt")
    return (
        f"## Reading PyTorch checkpoints: zt against torch {common.versions('torch')['torch']}\n\n"
        f"Files written by `torch.save` (fp16 matrices of 64 MiB; by zt when torch is missing) on {common.filesystem_of(work)} at `{work}`; "
        f"{runs} interleaved runs (after one warm-up for warm cache); every byte digested and checked. "
        "Cold cache: `posix_fadvise(DONTNEED)` before each run, checked with `mincore`. torch runs on one thread."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=10_000)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    results = run(args.tensors, args.size_mb, args.runs, cold=not args.no_cold)
    try:
        import matplotlib  # noqa: F401

        plot = True
    except ImportError:
        plot = False
    path = report.save(results, "read_pt", header(args.runs), plot=plot)
    print(path.read_text())


if __name__ == "__main__":
    main()
