"""Per-batch cost of drawing indices: zt.loader.Sampler against
numpy.random.default_rng().integers and loaderx 2.3.8's Sampler.

For each batch size, every case draws `calls` consecutive batches from a
space of `--space` indices per sample, and the samples of all cases are
interleaved (A B C ... A B C ...) so machine drift hits them equally. The
table gives the median time per batch, its interquartile range, and the
speed relative to numpy. zt and loaderx CYCLIC run in lockstep from the same
seed, and their batches are compared: they must be identical.

    python -m harness.sampler_bench --runs 201 --budget 50000
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

import numpy as np
from loaderx.zsampler import Sampler as LoaderxSampler

from zt.loader import CYCLIC, IID, Sampler

from . import common


def repeat(draw: Callable[[], np.ndarray], calls: int) -> Callable[[], int]:
    """A sample: `calls` draws; returns a digest of the last batch so the
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
        "numpy default_rng().integers": repeat(lambda: rng.integers(0, space, batch), calls),
        "zt IID next()": repeat(zt_iid.next, calls),
        "zt IID next(out)": repeat(lambda: zt_iid_out.next(out), calls),
        "loaderx IID next() (borrowed)": repeat(lx_iid.next, calls),
        "zt CYCLIC next(out)": repeat(lambda: zt_cyclic.next(out_cyclic), calls),
        "loaderx CYCLIC next() (borrowed)": repeat(lx_cyclic.next, calls),
    }


def table(batch: int, times: dict[str, list[float]], calls: int) -> str:
    peer = "numpy default_rng().integers"
    peer_median = common.summary(times[peer])[0]
    rows = [
        f"### batch {batch}",
        "",
        "| sampler | median per batch | IQR | ns per index | vs numpy |",
        "|---|---|---|---|---|",
    ]
    for name, samples in times.items():
        per = [s / calls for s in samples]
        med, q1, q3 = common.summary(per)
        rows.append(
            f"| {name} | {med * 1e6:.2f} µs | {q1 * 1e6:.2f} – {q3 * 1e6:.2f} µs | "
            f"{med / batch * 1e9:.2f} | {peer_median / calls / med:.2f}× |"
        )
    return "\n".join(rows) + "\n"


def run(space: int, batches: list[int], runs: int, budget: int, stem: str | None = "sampler") -> str:
    md = [
        f"## Sampler: zt.loader vs numpy {np.__version__} and loaderx {common.versions('loaderx')['loaderx']}",
        "",
        f"Index space {space:,}; each sample draws `calls` consecutive batches (≈{budget:,} indices); "
        f"{runs} interleaved samples per case after one warm-up; median and IQR of the time per batch.\n",
    ]
    load = os.getloadavg()[0]
    md.append(f"1-minute load average at the start: {load:.1f} on {os.cpu_count()} cores (a shared machine).\n")
    raw: dict = {
        "machine": common.machine(),
        "versions": common.versions("zt", "loaderx", "numpy"),
        "space": space,
        "load_average": load,
    }
    for batch in batches:
        calls = max(20, budget // batch)
        times, values = common.interleaved(cases(space, batch, calls), runs)
        assert values["zt CYCLIC next(out)"] == values["loaderx CYCLIC next() (borrowed)"], "CYCLIC streams differ"
        md.append(f"{calls} calls per sample.\n")
        md.append(table(batch, times, calls))
        raw[str(batch)] = {"calls": calls, "seconds_per_sample": times}
    md.append(f"Machine: {common.machine()}\n")
    md.append("Command: `python -m harness.sampler_bench " + f"--space {space} --runs {runs} --budget {budget}`\n")
    text = "\n".join(md)
    if stem:
        common.write_result(stem, text, raw)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, nargs="+", default=[256, 1024, 8192])
    ap.add_argument("--runs", type=int, default=201)
    ap.add_argument("--budget", type=int, default=50_000, help="indices drawn per sample")
    args = ap.parse_args()
    print(run(args.space, args.batches, args.runs, args.budget))


if __name__ == "__main__":
    main()
