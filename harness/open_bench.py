"""Open cost of a checkpoint with many small tensors (metadata only).

The same tensors (50,000 float32 vectors of 64 elements by default, names
`layer.N.w`) are written twice, by each format's own library:
`zt.numpy.save_file` (`.zt`) and `safetensors.numpy.save_file`. Then, in one
interleaved run (warm cache: opening reads only the header), four openers:

* `zt.open` of the `.zt` file;
* `zt.open` of the safetensors file (zt's own baseline for the same tensors);
* upstream `ztensor.open` of the `.zt` file;
* `safetensors.safe_open` of the safetensors file.

Each opener lists its names and closes, so a lazy opener cannot skip the
manifest. Ratios are taken against `zt.open` of the `.zt` file.

    python -m harness.open_bench --tensors 50000 --runs 21
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import safetensors
import safetensors.numpy

import zt

from . import common, report

MODULES = ["zt", "numpy", "safetensors", "ztensor"]


def arrays(count: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {f"layer.{i}.w": rng.standard_normal(64).astype(np.float32) for i in range(count)}


def open_zt(path) -> int:
    with zt.open(path) as src:
        return len(list(src))


def open_upstream(path) -> int:
    import ztensor

    with ztensor.open(os.fspath(path)) as src:
        return len(list(src))


def open_safetensors(path) -> int:
    with safetensors.safe_open(path, "numpy") as f:
        return len(f.keys())


def run(tensors: int, runs: int) -> list[report.Result]:
    work = common.bench_dir("open")
    zt_path, st_path = work / f"many-{tensors}.zt", work / f"many-{tensors}.safetensors"
    data = arrays(tensors)
    if not zt_path.exists():
        zt.numpy.save_file(data, zt_path)
    if not st_path.exists():
        safetensors.numpy.save_file(data, st_path)
    cases = {
        "zt.open (.zt)": lambda: open_zt(zt_path),
        "zt.open (.safetensors)": lambda: open_zt(st_path),
        "safetensors.safe_open": lambda: open_safetensors(st_path),
    }
    try:
        import ztensor  # noqa: F401

        cases["ztensor 2.1.2 open (.zt)"] = lambda: open_upstream(zt_path)
    except ImportError:
        pass
    samples, values = common.interleaved(cases, runs, warmup=2)
    assert all(v == tensors for v in values.values()), values
    return [
        report.Result(
            name="open",
            title=f"Open latency, {tensors:,} float32[64] tensors (metadata only, warm cache)",
            samples=samples,
            peer="zt.open (.zt)",
            modules=MODULES,
            notes=[
                "Ratios are `zt.open (.zt)`'s median over each row's: below 1× the row is faster than zt's `.zt` open.",
                f"Files on {common.filesystem_of(work)}; {runs} interleaved runs after 2 warm-ups.",
            ],
        )
    ]


def header(runs: int) -> str:
    v = common.versions("safetensors", "ztensor")
    return (
        "## Open cost of many small tensors\n\n"
        f"safetensors {v['safetensors']}, ztensor {v.get('ztensor', 'missing')}. {report.machine_line(MODULES)}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensors", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--out", default="open")
    args = ap.parse_args()
    results = run(args.tensors, args.runs)
    for r in results:
        print(r.markdown())
    report.save(results, args.out, header(args.runs), plot=False)


if __name__ == "__main__":
    main()
