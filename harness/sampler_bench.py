"""Per-batch cost of drawing indices: zt.loader.Sampler against
numpy.random.default_rng().integers and loaderx 2.3.8's Sampler.

For each batch size, every case draws `calls` consecutive batches (about
`budget` indices) per run, and the runs of all cases are interleaved
(A B C ... A B C ...) so machine drift hits them equally. Many short runs
rather than a few long ones, because on a shared machine a long run is
almost always preempted. The tables give the median time per run and its
interquartile range, the time per batch and per index, and the speed
relative to numpy. zt and loaderx CYCLIC run in lockstep from the same seed
and their batches are compared: they must be identical.

    python -m harness.sampler_bench --runs 201 --budget 50000
    python -m harness --only sampler
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

import numpy as np
from loaderx.zsampler import Sampler as LoaderxSampler

from zt.loader import CYCLIC, IID, Sampler

from . import common, report

NUMPY = "numpy default_rng().integers"


def repeat(draw: Callable[[], np.ndarray], calls: int) -> Callable[[], int]:
    """One run: `calls` draws; returns a digest of the last batch so the
    work cannot be skipped and the batches can be compared."""

    def sample() -> int:
        batch = None
        for _ in range(calls):
            batch = draw()
        return common.digest(np.ascontiguousarray(batch).view(np.uint64))

    return sample


def cases(space: int, batch: int, calls: int) -> dict[str, Callable[[], int]]:
    rng = np.random.default_rng(0)
    zt_iid = Sampler(space, batch, IID, seed=0, rank=0, world_size=1)
    zt_iid_out = Sampler(space, batch, IID, seed=0, rank=0, world_size=1)
    zt_cyclic = Sampler(space, batch, CYCLIC, seed=0, rank=0, world_size=1)
    lx_iid = LoaderxSampler(space, batch, 1, 0)
    lx_cyclic = LoaderxSampler(space, batch, 2, 0)
    out = np.empty(batch, np.int64)
    out_cyclic = np.empty(batch, np.int64)
    return {
        NUMPY: repeat(lambda: rng.integers(0, space, batch), calls),
        "zt IID next()": repeat(zt_iid.next, calls),
        "zt IID next(out)": repeat(lambda: zt_iid_out.next(out), calls),
        "loaderx IID next() (borrowed)": repeat(lx_iid.next, calls),
        "zt CYCLIC next(out)": repeat(lambda: zt_cyclic.next(out_cyclic), calls),
        "loaderx CYCLIC next() (borrowed)": repeat(lx_cyclic.next, calls),
    }


def run(space: int, batches: list[int], runs: int, budget: int) -> list[report.Result]:
    results = []
    for batch in batches:
        calls = max(20, budget // batch)
        times, values = common.interleaved(cases(space, batch, calls), runs)
        assert values["zt CYCLIC next(out)"] == values["loaderx CYCLIC next() (borrowed)"], "CYCLIC streams differ"
        extra = {}
        for case, samples in times.items():
            median = common.summary(samples)[0] / calls
            extra[case] = {"per batch": f"{median * 1e6:.2f} µs", "ns per index": f"{median / batch * 1e9:.2f}"}
        results.append(
            report.Result(
                "sampler",
                f"Batch {batch:,}, space {space:,}, {calls:,} batches per run",
                times,
                peer=NUMPY,
                extra=extra,
                modules=["loaderx"],
                notes=["zt and loaderx CYCLIC batches compared after every run: identical."],
            )
        )
    return results


def header(runs: int) -> str:
    v = common.versions("numpy", "loaderx")
    load = os.getloadavg()[0]
    return (
        "## Drawing batch indices: zt.loader.Sampler against numpy and loaderx\n\n"
        f"numpy {v['numpy']}, loaderx {v['loaderx']}. {runs} interleaved runs per case after one warm-up; "
        "median and IQR of the time per run (per batch and per index beside it). `next()` returns a fresh "
        "array, `next(out)` fills the caller's; loaderx's `next()` returns a view of its reusable buffer. "
        f"1-minute load average at the start: {load:.1f} on {os.cpu_count()} cores."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 8192])
    ap.add_argument("--runs", type=int, default=201)
    ap.add_argument("--budget", type=int, default=50_000, help="indices drawn per run")
    args = ap.parse_args()
    results = run(args.space, args.batches, args.runs, args.budget)
    print(report.save(results, "sampler", header(args.runs)).read_text())


if __name__ == "__main__":
    main()
