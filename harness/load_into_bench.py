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
  does, for numpy);
* with torch installed, into an `nn.Module` holding the same tensors as
  parameters: `zt.torch.load_into(model, path)` against
  `model.load_state_dict(safetensors.torch.load_file(path))` and
  `model.load_state_dict(torch.load(pt, mmap=True, weights_only=True))`
  (`pt`: the same tensors written by `torch.save`).

Peak RSS: each case once more in a fresh process (`VmHWM`), the
destination allocated and touched first, so the figure over the destination
is the second allocation a load makes.

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

MODULES = ["zt", "numpy", "safetensors", "torch"]


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


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class Destination:
    """What a load writes into: numpy arrays, and (with torch) a module
    whose parameters are tensors of the same names and shapes."""

    def __init__(self, path):
        self.path = path
        self.pt = path.with_suffix(".pt")
        self.arrays = destination(path)
        self.model = torch_model(self.arrays) if have_torch() else None


def torch_model(arrays: dict[str, np.ndarray]):
    """An nn.Module tree with one zeroed fp16 parameter per name."""
    import torch
    from torch import nn

    root = nn.Module()
    for name, arr in arrays.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, nn.Parameter(torch.zeros(arr.shape, dtype=torch.float16)))
    return root


def via_safetensors(d: Destination) -> None:
    for k, v in safetensors.numpy.load_file(d.path).items():
        np.copyto(d.arrays[k], v)


def via_zt(d: Destination) -> None:
    zt.numpy.load_into(d.arrays, d.path)


def via_zt_torch(d: Destination) -> None:
    import zt.torch

    zt.torch.load_into(d.model, d.path)


def via_safetensors_torch(d: Destination) -> None:
    import safetensors.torch

    d.model.load_state_dict(safetensors.torch.load_file(d.path))


def via_torch_load(d: Destination) -> None:
    import torch

    d.model.load_state_dict(torch.load(d.pt, mmap=True, weights_only=True))


NUMPY_CASES = {"zt.numpy.load_into": via_zt, "safetensors load_file + copy": via_safetensors}
TORCH_CASES = {
    "zt.torch.load_into(model)": via_zt_torch,
    "load_state_dict(safetensors.torch.load_file)": via_safetensors_torch,
    "load_state_dict(torch.load(mmap=True))": via_torch_load,
}
CASES = {**NUMPY_CASES, **TORCH_CASES}


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
        "import pathlib\n"
        "dest = b.Destination(pathlib.Path(sys.argv[2]))\n"
        "for a in dest.arrays.values(): a.fill(1)\n"
        "if dest.model is not None:\n"
        "    for p in dest.model.parameters(): p.data.fill_(1)\n"
        "before = hwm()\n"
        "b.CASES[sys.argv[1]](dest)\n"
        "after = hwm()\n"
        "print(json.dumps([before * 1024, after * 1024]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, case, os.fspath(path)], capture_output=True, text=True, check=True, cwd=common.ROOT
    )
    before, after = json.loads(out.stdout)
    return after - before


def model_digests(d: Destination) -> dict[str, int]:
    return {k: common.digest(v.detach().numpy()) for k, v in d.model.state_dict().items()}


def run(size_mb: int, runs: int, rss: bool = True) -> list[report.Result]:
    """`rss`: also each case's peak RSS, from a fresh process per case (off in --quick: each imports torch)."""
    work = common.bench_dir("load_into")
    path = work / f"model-{size_mb}.safetensors"
    arrays = model(size_mb)
    nbytes = sum(a.nbytes for a in arrays.values())
    if not path.exists():
        safetensors.numpy.save_file(arrays, path)
    torch_ok = have_torch()
    if torch_ok and not path.with_suffix(".pt").exists():
        import torch

        torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, path.with_suffix(".pt"))
    want = {k: common.digest(v) for k, v in arrays.items()}
    del arrays
    dest = Destination(path)
    files = [path] + ([dest.pt] if torch_ok else [])
    groups = [
        (
            "arrays",
            NUMPY_CASES,
            "safetensors load_file + copy",
            lambda: {k: common.digest(v) for k, v in dest.arrays.items()},
        )
    ]
    if torch_ok:
        groups.append(
            ("a torch module", TORCH_CASES, "load_state_dict(safetensors.torch.load_file)", lambda: model_digests(dest))
        )
    results = []
    for what, group, peer, digests in groups:
        for label, cold in (("warm", False), ("cold", True)):
            cached: list[float] = []

            def before(cold=cold, cached=cached):
                if cold:
                    for f in files:
                        common.drop_cache(f)
                    cached.append(max(common.cached_fraction(f) for f in files))

            cases = {name: (lambda fn=fn: fn(dest)) for name, fn in group.items()}
            samples, _ = common.interleaved(cases, runs, warmup=1, before=before)
            assert digests() == want
            notes = [f"{len(dest.arrays)} tensors, {nbytes / 2**20:.0f} MiB fp16, on {common.filesystem_of(work)}."]
            if cold:
                notes.append(
                    "Cold: page cache dropped before every run; mincore before runs: "
                    f"max {max(cached, default=0):.3f} cached."
                )
            extra = {}
            if not cold and rss:
                for name in group:
                    extra[name] = {"peak RSS over destination": f"{peak_rss(name, path) / 2**20:.0f} MiB"}
                notes.append(
                    "Peak RSS (VmHWM) includes the page-cache pages a mapping touches (zt and torch.load(mmap=True) "
                    "read through mappings); it is not a measure of allocations alone."
                )
            results.append(
                report.Result(
                    name=f"load_into-{'torch-' if group is TORCH_CASES else ''}{label}",
                    title=f"Load into {what}, {nbytes / 2**20:.0f} MiB, {label} cache",
                    samples=samples,
                    peer=peer,
                    nbytes=nbytes,
                    modules=MODULES,
                    notes=notes,
                    extra=extra,
                )
            )
    if not torch_ok:
        results[-1].notes.append("No torch rows: torch is not installed.")
    return results


def header(runs: int) -> str:
    v = common.versions("safetensors", "numpy", "torch")
    return (
        "## Loading into existing arrays and models\n\n"
        f"safetensors {v['safetensors']}, numpy {v['numpy']}, torch {v['torch']}; "
        f"{runs} interleaved runs. "
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
