"""Loading a checkpoint into arrays that already exist.

A transformer-shaped fp16 model (`--size-mb`, default 512) written by
`safetensors.numpy.save_file`; the destination is a dict of preallocated
numpy arrays (a model's parameters). Cases, interleaved run by run, warm
(the file in the page cache) and cold (`posix_fadvise(DONTNEED)` before
each run, mincore-checked):

* `zt.numpy.load_into(dest, path)`: names, dtypes and shapes checked, then
  one copy per tensor from the mapping into the destination;
* the safetensors path: `safetensors.numpy.load_file(path)`, then each array
  copied into its destination (what `model.load_state_dict(load_file(path))`
  does, for numpy).

Peak RSS: each case once more in a fresh process (`VmHWM`), the
destination allocated and touched first, so the figure over the destination
is the second allocation a load makes. No torch rows yet:
`zt.torch.load_into` is not built.

    python -m harness.load_into_bench --size-mb 512 --runs 7
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np
import safetensors.numpy

import zt
import zt.numpy

from . import common, report

MODULES = ["zt", "numpy", "safetensors"]


def model(size_mb: int) -> dict[str, np.ndarray]:
    """fp16 blocks of a 2048-wide transformer (random bits), to size_mb."""
    rng = np.random.default_rng(7)
    width, out, i = 2048, {}, 0
    while sum(a.nbytes for a in out.values()) < size_mb << 20:
        for name, shape in (("attn.qkv", (3 * width, width)), ("attn.out", (width, width)), ("norm", (width,))):
            out[f"layer.{i}.{name}"] = rng.integers(0, 1 << 16, size=shape, dtype=np.uint16).view(np.float16)
        i += 1
    return out


def destination(path) -> dict[str, np.ndarray]:
    """Zeroed, touched arrays of the file's names, shapes and dtypes."""
    with zt.open(path) as src:
        return {n: np.zeros(src[n].shape, np.float16) for n in src}


def via_safetensors(dest, path) -> None:
    for k, v in safetensors.numpy.load_file(path).items():
        np.copyto(dest[k], v)


def via_zt(dest, path) -> None:
    zt.numpy.load_into(dest, path)


CASES = {"zt.numpy.load_into": via_zt, "safetensors load_file + copy": via_safetensors}


def peak_rss(case: str, path) -> int:
    """Peak RSS (bytes) of a fresh process that allocates and touches the
    destination and runs `case` once, minus its peak before the load. RSS
    counts the page-cache pages a mapping touches (shared, reclaimable) as
    well as fresh allocations, so a mapped load shows the file's size here
    without allocating it."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a child
    # of this (large) process would start at the parent's peak and every
    # load would read as 0.
    code = (
        "import json, sys\n"
        "from harness import load_into_bench as b\n"
        "def hwm():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmHWM:'): return int(line.split()[1])\n"
        "dest = b.destination(sys.argv[2])\n"
        "for a in dest.values(): a.fill(1)\n"
        "before = hwm()\n"
        "b.CASES[sys.argv[1]](dest, sys.argv[2])\n"
        "after = hwm()\n"
        "print(json.dumps([before * 1024, after * 1024]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, case, os.fspath(path)], capture_output=True, text=True, check=True, cwd=common.ROOT
    )
    before, after = json.loads(out.stdout)
    return after - before


def run(size_mb: int, runs: int) -> list[report.Result]:
    work = common.bench_dir("load_into")
    path = work / f"model-{size_mb}.safetensors"
    arrays = model(size_mb)
    nbytes = sum(a.nbytes for a in arrays.values())
    if not path.exists():
        safetensors.numpy.save_file(arrays, path)
    want = {k: common.digest(v) for k, v in arrays.items()}
    del arrays
    dest = destination(path)
    results = []
    for label, cold in (("warm", False), ("cold", True)):
        cached = []

        def before(cold=cold, cached=cached):
            if cold:
                common.drop_cache(path)
                cached.append(common.cached_fraction(path))

        cases = {name: (lambda fn=fn: fn(dest, path)) for name, fn in CASES.items()}
        samples, _ = common.interleaved(cases, runs, warmup=1, before=before)
        assert {k: common.digest(v) for k, v in dest.items()} == want
        notes = [f"{len(dest)} tensors, {nbytes / 2**20:.0f} MiB fp16, on {common.filesystem_of(work)}."]
        if cold:
            notes.append(
                f"Cold: page cache dropped before every run; mincore before runs: max {max(cached, default=0):.3f} cached."
            )
        extra = {}
        if not cold:
            for name in CASES:
                extra[name] = {"peak RSS over destination": f"{peak_rss(name, path) / 2**20:.0f} MiB"}
            notes.append(
                "Peak RSS includes the mapped file's page-cache pages (zt reads through a shared mapping); "
                "it is not a measure of allocations alone."
            )
        results.append(
            report.Result(
                name=f"load_into-{label}",
                title=f"Load into existing arrays, {nbytes / 2**20:.0f} MiB, {label} cache",
                samples=samples,
                peer="safetensors load_file + copy",
                nbytes=nbytes,
                modules=MODULES,
                notes=notes,
                extra=extra,
            )
        )
    results[-1].notes.append("No torch rows: `zt.torch.load_into` is not built yet.")
    return results


def header(runs: int) -> str:
    v = common.versions("safetensors", "numpy")
    return (
        "## Loading into existing arrays\n\n"
        f"safetensors {v['safetensors']}, numpy {v['numpy']}; {runs} interleaved runs. "
        f"{report.machine_line(MODULES)}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default="load_into")
    args = ap.parse_args()
    results = run(args.size_mb, args.runs)
    for r in results:
        print(r.markdown())
    report.save(results, args.out, header(args.runs), plot=False)


if __name__ == "__main__":
    main()
