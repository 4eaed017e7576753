"""Per-batch cost of drawing indices: zt.loader.Sampler against
numpy.random.default_rng().integers, loaderx 2.3.8's Sampler and loaderx
2.8.19's (stateless) Sampler.

For each batch size, every case draws `calls` consecutive batches (about
`budget` indices) per run, and the runs of all cases are interleaved
(A B C ... A B C ...) so machine drift hits them equally. Many short runs
rather than a few long ones, because on a shared machine a long run is
almost always preempted. The tables give the median time per run and its
interquartile range, the time per batch and per index, and the speed
relative to numpy. zt and loaderx CYCLIC run in lockstep from the same seed
and their batches are compared: they must be identical; so must zt's
LOADERX_IID and loaderx 2.8's IID.

loaderx 2.8.19 runs in its own Python 3.12 process (harness/loaderx28.py):
each of its runs is timed there, around the same loop of `next()` calls,
and reported back; the round trip is outside the timer.

    python -m harness.sampler_bench --runs 201 --budget 50000
    python -m harness --only sampler
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

import numpy as np
from loaderx.zsampler import Sampler as LoaderxSampler

from zt.loader import CYCLIC, IID, LOADERX_IID, Sampler

from . import common, loaderx28, report

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


LX28_IID = "loaderx 2.8.19 IID next() (borrowed)"
LX28_CYCLIC = "loaderx 2.8.19 CYCLIC next() (borrowed)"


class Remote:
    """A case run by the loaderx 2.8 worker: each call is one run there, and
    the worker's own timing of it replaces the harness's (which would add
    the round trip)."""

    def __init__(self, worker, key: str, space: int, batch: int, mode: int, calls: int):
        self.worker, self.key, self.calls = worker, key, calls
        worker.call("sampler_new", key=key, length=space, batch=batch, mode=mode, seed=0)
        self.seconds: list[float] = []

    def __call__(self) -> int:
        r = self.worker.call("sampler_run", key=self.key, calls=self.calls)
        self.seconds.append(r["seconds"])
        return r["digest"]


def cases(space: int, batch: int, calls: int, worker=None) -> dict[str, Callable[[], int]]:
    rng = np.random.default_rng(0)
    zt_iid = Sampler(space, batch, IID, seed=0, rank=0, world_size=1)
    zt_iid_out = Sampler(space, batch, IID, seed=0, rank=0, world_size=1)
    zt_cyclic = Sampler(space, batch, CYCLIC, seed=0, rank=0, world_size=1)
    lx_iid = LoaderxSampler(space, batch, 1, 0)
    lx_cyclic = LoaderxSampler(space, batch, 2, 0)
    zt_lx_iid = Sampler(space, batch, LOADERX_IID, seed=0, rank=0, world_size=1)
    out = np.empty(batch, np.int64)
    out_cyclic = np.empty(batch, np.int64)
    out_lx_iid = np.empty(batch, np.int64)
    table = {
        NUMPY: repeat(lambda: rng.integers(0, space, batch), calls),
        "zt IID next()": repeat(zt_iid.next, calls),
        "zt IID next(out)": repeat(lambda: zt_iid_out.next(out), calls),
        "zt LOADERX_IID next(out)": repeat(lambda: zt_lx_iid.next(out_lx_iid), calls),
        "loaderx 2.3.8 IID next() (borrowed)": repeat(lx_iid.next, calls),
        "zt CYCLIC next(out)": repeat(lambda: zt_cyclic.next(out_cyclic), calls),
        "loaderx 2.3.8 CYCLIC next() (borrowed)": repeat(lx_cyclic.next, calls),
    }
    if worker is None:
        return table
    # loaderx 2.8.19's rows beside 2.3.8's.
    order = {}
    for name, case in table.items():
        order[name] = case
        if name.startswith("loaderx 2.3.8 IID"):
            order[LX28_IID] = Remote(worker, f"iid-{batch}", space, batch, 1, calls)
        if name.startswith("loaderx 2.3.8 CYCLIC"):
            order[LX28_CYCLIC] = Remote(worker, f"cyclic-{batch}", space, batch, 2, calls)
    return order


def run(space: int, batches: list[int], runs: int, budget: int) -> list[report.Result]:
    results = []
    why = loaderx28.missing()
    worker = loaderx28.Worker() if why is None else None
    try:
        for batch in batches:
            calls = max(20, budget // batch)
            batch_cases = cases(space, batch, calls, worker)
            times, values = common.interleaved(batch_cases, runs)
            notes = ["zt and loaderx 2.3.8 CYCLIC batches compared after every run: identical."]
            assert values["zt CYCLIC next(out)"] == values["loaderx 2.3.8 CYCLIC next() (borrowed)"], "CYCLIC differs"
            if worker is not None:
                for name in (LX28_IID, LX28_CYCLIC):
                    times[name] = batch_cases[name].seconds[1:]  # the worker's timings, warm-up dropped
                assert values["zt CYCLIC next(out)"] == values[LX28_CYCLIC], "CYCLIC differs from loaderx 2.8"
                assert values["zt LOADERX_IID next(out)"] == values[LX28_IID], "LOADERX_IID differs from loaderx 2.8"
                notes.append(
                    "zt's CYCLIC and LOADERX_IID batches compared with loaderx 2.8.19's CYCLIC and IID after "
                    "every run: identical. loaderx 2.8.19 runs in its own Python 3.12 process and times its "
                    "runs there."
                )
            extra = {}
            for case, samples in times.items():
                median = common.summary(samples)[0] / calls
                extra[case] = {"per batch": f"{median * 1e6:.2f} µs", "ns per index": f"{median / batch * 1e9:.2f}"}
            if worker is None:
                for name in (LX28_IID, LX28_CYCLIC):
                    times[name] = []
                    extra[name] = {"median": why}
            results.append(
                report.Result(
                    "sampler",
                    f"Batch {batch:,}, space {space:,}, {calls:,} batches per run",
                    times,
                    peer=NUMPY,
                    extra=extra,
                    modules=["loaderx"],
                    notes=notes,
                )
            )
    finally:
        if worker is not None:
            worker.close()
    return results


def header(runs: int) -> str:
    v = common.versions("numpy", "loaderx")
    lx28 = loaderx28.versions() if loaderx28.missing() is None else {"loaderx": "missing", "python": "-"}
    load = os.getloadavg()[0]
    return (
        "## Drawing batch indices: zt.loader.Sampler against numpy and loaderx 2.3.8 and 2.8.19\n\n"
        f"numpy {v['numpy']}, loaderx {v['loaderx']}; loaderx {lx28['loaderx']} in Python {lx28['python']}. "
        f"{runs} interleaved runs per case after one warm-up; "
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
    ap.add_argument("--out", default="sampler", help="results/<out>.md")
    args = ap.parse_args()
    results = run(args.space, args.batches, args.runs, args.budget)
    print(report.save(results, args.out, header(args.runs)).read_text())


if __name__ == "__main__":
    main()
