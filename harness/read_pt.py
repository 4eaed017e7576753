"""Read PyTorch checkpoints through zt against torch.load.

Two measurements, each interleaved run by run with its peers:
  * open latency of a checkpoint with many small tensors (metadata only:
    zt.open against torch.load(mmap=True), which also only maps);
  * reading every byte of a large checkpoint (a state dict of fp16
    matrices written by torch.save): zt zero-copy, zt copy, and
    torch.load(mmap=True, weights_only=True), warm and cold cache.
Every read is checked against a digest of the bytes written.

    python -m harness.read_pt --tensors 10000 --size-mb 1024 --runs 5
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import zt

from . import common, report


def make_many(path, count: int) -> None:
    g = torch.Generator().manual_seed(0)
    torch.save({f"layer.{i}.w": torch.randn(64, generator=g) for i in range(count)}, path)


def make_big(path, size_mb: int) -> dict[str, int]:
    """fp16 matrices of ~64 MiB each adding up to size_mb. Returns digests."""
    rng = np.random.default_rng(1)
    per = min(64, size_mb)
    tensors = {}
    for i in range(max(1, size_mb // per)):
        rows = per * (1 << 20) // 2 // 4096
        bits = rng.integers(0, 1 << 16, size=(rows, 4096), dtype=np.uint16)
        tensors[f"block.{i}.weight"] = torch.from_numpy(bits.view(np.int16)).view(torch.float16)
    torch.save(tensors, path)
    return {k: common.digest(v.view(torch.int16).numpy()) for k, v in tensors.items()}


def read_zt(path, copy: bool) -> dict[str, int]:
    with zt.open(path) as src:
        return {name: common.digest(src[name].numpy(copy=copy)) for name in src}


def read_torch(path) -> dict[str, int]:
    sd = torch.load(path, mmap=True, weights_only=True)
    return {k: common.digest(v.view(torch.int16).numpy()) for k, v in sd.items()}


def open_zt(path) -> int:
    with zt.open(path) as src:
        return len(src)


def open_torch(path) -> int:
    return len(torch.load(path, mmap=True, weights_only=True))


PEER = "torch.load(mmap=True, weights_only=True)"


def run(tensors: int, size_mb: int, runs: int, cold: bool = True) -> list[report.Result]:
    torch.set_num_threads(1)
    work = common.bench_dir("read_pt")
    many, big = work / f"many-{tensors}.pt", work / f"big-{size_mb}.pt"
    if not many.exists():
        make_many(many, tensors)
    want = make_big(big, size_mb)
    nbytes = big.stat().st_size

    open_times, values = common.interleaved({"zt.open": lambda: open_zt(many), PEER: lambda: open_torch(many)}, runs)
    assert values["zt.open"] == values[PEER] == tensors
    results = [report.Result("read_pt", f"Open latency, {tensors:,} tensors (metadata only)", open_times, peer=PEER)]
    readers = {
        "zt zero-copy": lambda: read_zt(big, False),
        "zt copy": lambda: read_zt(big, True),
        PEER: lambda: read_torch(big),
    }

    def drop():
        common.drop_cache(big)
        assert common.cached_fraction(big) < 0.05, "the page cache kept the file"

    for temp in ["warm"] + (["cold"] if cold else []):
        before = drop if temp == "cold" else None
        times, values = common.interleaved(readers, runs, warmup=int(temp == "warm"), before=before)
        for name, got in values.items():
            assert got == want, f"{name} read wrong bytes"
        title = f"Read every byte of a {nbytes / 2**30:.2f} GiB checkpoint, {temp} cache"
        results.append(report.Result("read_pt", title, times, peer=PEER, nbytes=nbytes))
    return results


def header(runs: int) -> str:
    work = common.bench_dir("read_pt")
    return (
        f"## Reading PyTorch checkpoints: zt against torch {common.versions('torch')['torch']}\n\n"
        f"Files written by `torch.save` (fp16 matrices of 64 MiB) on {common.filesystem_of(work)} at `{work}`; "
        f"{runs} interleaved runs (after one warm-up for warm cache); every byte digested and checked. "
        "Cold cache: `posix_fadvise(DONTNEED)` before each run. torch runs on one thread."
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
