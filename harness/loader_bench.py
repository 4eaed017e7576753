"""End-to-end loader throughput on the dense vision workload (loaderx §5):
`records` × uint8[3,224,224] images plus an int64 label, batch 256, CYCLIC.

Cases, each run in its own child process so its memory is measured alone:

* zt.loader.DataLoader (native worker threads, step-ordered) over a zrecord
  raw store;
* loaderx 2.3.8 DataLoader (one gather thread + transform threads) over the
  same records in the loaderx-2.3 layout (zt builds both stores);
* loaderx 2.8.19 Loader(streams, sampler, workers=4, prefetch=4) over the
  *same* store as zt (zt's default layout is loaderx 2.8's), one CPU view per
  stream, CYCLIC sampler; its DLPack outputs become numpy arrays
  (`np.from_dlpack`, zero-copy) inside the timed `next()`. It needs Python
  3.12, so its runs are harness/loaderx28_worker.py in .venv-loaderx28;
* torch.utils.data.DataLoader (2 worker processes over a numpy memmap
  dataset), once with the fork start method and once with spawn;
* grain's DataLoader (2 worker processes, `IndexSampler(shuffle=True,
  num_epochs=None)`, `Batch(256, drop_remainder=True)`) over the same .npy
  memmap (a random-access source; loaderx's benchmark fed grain an
  ArrayRecord store, which would not be the same data).
  Its runs use a venv of their own, work-bench/venv-grain
  (harness/requirements-grain.txt, made on first use; `--grain-venv` makes
  it alone), on a Python of 3.12 or later: .venv's Python 3.11.7 fails
  threaded `ast` use now and then with a false "AST constructor recursion
  depth mismatch" (CPython gh-106905, fixed in 3.11.8; a threaded repro
  failed on 3.11.7 and not on pyenv's 3.12.1 or 3.13.0), which failed
  grain's runs here. Without such a Python they run in .venv's.

A peer that cannot be imported is a "missing" row.

A run: one validation batch (compared with a direct gather of the same
indices), `warmup` batches, then `batches` timed `next()` calls. The parent
samples PSS over the child's process tree every 20 ms (psutil). Runs of the
cases are interleaved; the table gives the median time per run and its IQR,
batches/s, the p95 of one `next()` (over every timed call of every run) and
the peak PSS.

    python -m harness.loader_bench --records 2500 --batches 200 --runs 5 [--batch 256] [--out loader]
    python -m harness --only loader
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from . import common, loaderx28, report

SHAPE = (3, 224, 224)
ZT = "zt DataLoader (threads)"
LOADERX = "loaderx 2.3.8 DataLoader (threads)"
LOADERX28 = "loaderx 2.8.19 Loader (threads)"
TORCH = "torch DataLoader (fork, 2 workers, npy memmap)"
TORCH_SPAWN = "torch DataLoader (spawn, 2 workers, npy memmap)"
GRAIN = "grain DataLoader (2 worker processes, npy memmap)"
PEER_MODULE = {
    ZT: "zt",
    LOADERX: "loaderx",
    LOADERX28: "loaderx 2.8.19 (.venv-loaderx28)",
    TORCH: "torch",
    TORCH_SPAWN: "torch",
    GRAIN: "grain",
}
GRAIN_VENV = "venv-grain"


def prepare(records: int) -> dict:
    """Write the stores once per size: image + label zrecord stores (raw, 4
    shards) in both layouts (loaderx 2.8's, zt's default, read by zt and
    loaderx 2.8.19; loaderx 2.3's for loaderx 2.3.8: the same shard files),
    and the same images as .npy for torch and grain."""
    from zt.zrecord import Dense

    root = common.bench_dir(f"loader-{records}")
    npy = root / "image.npy"
    paths = {"npy": str(npy)}
    for tag, layout in (("28", "loaderx-2.8"), ("23", "loaderx-2.3")):
        image, label = root / f"image-{tag}.zr", root / f"label-{tag}.zr"
        paths[f"image{tag}"], paths[f"label{tag}"] = str(image), str(label)
        if (image / "meta.zr").exists():
            continue
        rng = np.random.default_rng(0)
        mm = np.lib.format.open_memmap(npy, mode="w+", dtype=np.uint8, shape=(records, *SHAPE))
        with Dense.create(image, np.uint8, SHAPE, codec="raw", data_shards=4, layout=layout) as ds:
            for start in range(0, records, 256):
                n = min(256, records - start)
                # Gradients plus noise, like loaderx's synthetic vision data.
                block = np.arange(224, dtype=np.uint8)[None, None, None, :] + rng.integers(0, 8, (n, *SHAPE), np.uint8)
                block += (np.arange(start, start + n) % 256).astype(np.uint8)[:, None, None, None]
                ds.append(block)
                mm[start : start + n] = block
        mm.flush()
        del mm
        with Dense.create(label, np.int64, (1,), codec="raw", data_shards=1, layout=layout) as ls:
            ls.append(np.arange(records, dtype=np.int64).reshape(-1, 1))
    return paths


# -- the child: one run of one case ----------------------------------------------


class NpyImages:
    """A random-access dataset over the .npy memmap (torch and grain): one
    record is a copy of the image and its index as the label. Defined at module
    level so spawned and grain worker processes can unpickle it."""

    def __init__(self, path: str):
        self.path, self.mm = path, None

    def __len__(self) -> int:
        return np.load(self.path, mmap_mode="r").shape[0]

    def __getitem__(self, i):
        if self.mm is None:
            self.mm = np.load(self.path, mmap_mode="r")
        return {"image": np.array(self.mm[i]), "label": np.int64(i)}

    def __getstate__(self):
        return {"path": self.path, "mm": None}


def _torch_loader(npy: str, batch: int, start_method: str):
    import torch.utils.data as tud

    return tud.DataLoader(
        NpyImages(npy),
        batch_size=batch,
        shuffle=True,
        num_workers=2,
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=2,
        multiprocessing_context=start_method,
    )


def _endless(loader):
    """next() over epochs: an epoch ends every len // batch steps; the other loaders are endless."""
    epoch = [iter(loader)]

    def get():
        try:
            return next(epoch[0])
        except StopIteration:
            epoch[0] = iter(loader)
            return next(epoch[0])

    return get


def _child(case: str, paths: dict, batch: int, workers: int, warmup: int, batches: int) -> dict:
    if case == ZT:
        from zt.loader import CYCLIC, DataLoader, Sampler
        from zt.zrecord import Dense

        image, label = Dense.open(paths["image28"]), Dense.open(paths["label28"])
        loader = DataLoader(
            {"image": image, "label": label}, batch_size=batch, mode=CYCLIC, seed=42, workers=workers, prefetch=4
        )
        first_idx = Sampler(len(image), batch, CYCLIC, seed=42, rank=0, world_size=1).next()
        first_ref = image[first_idx]
        get = loader.__next__
    elif case == LOADERX:
        from loaderx.dataloader import DataLoader as LxLoader
        from loaderx.zrecord import Dense as LxDense

        image, label = LxDense.open(paths["image23"]), LxDense.open(paths["label23"])
        loader = LxLoader({"image": image, "label": label}, transform_workers=workers, batch_size=batch)
        first_ref = None  # completion order is not preserved: check labels instead
        get = loader.__next__
    elif case in (TORCH, TORCH_SPAWN):
        loader = _torch_loader(paths["npy"], batch, "fork" if case == TORCH else "spawn")
        first_ref, get = None, _endless(loader)
    else:
        import grain.python as grain
        from absl import flags

        # With JAX installed (requirements-torch.txt, for the rank tests)
        # grain loads JAX's profiler and then reads its absl flags; outside
        # an absl app they are unparsed and grain raises
        # UnparsedFlagAccessError. Parse the defaults first.
        flags.FLAGS(sys.argv[:1])
        loader = grain.DataLoader(
            data_source=NpyImages(paths["npy"]),
            sampler=grain.IndexSampler(len(NpyImages(paths["npy"])), shuffle=True, num_epochs=None, seed=42),
            operations=[grain.Batch(batch, drop_remainder=True)],
            worker_count=2,
        )
        first_ref, get = None, iter(loader).__next__
    images = np.load(paths["npy"], mmap_mode="r")
    first = get()
    img = np.asarray(first["image"])
    labels = np.asarray(first["label"]).reshape(-1)
    assert img.shape == (batch, *SHAPE), img.shape
    assert (img == images[labels]).all(), "batch images do not match their labels"
    if first_ref is not None:
        assert (img == first_ref).all(), "first batch differs from a direct gather of the sampler's indices"
    check = common.digest(img)
    for _ in range(warmup):
        get()
    lat = []
    t0 = time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        b = get()
        lat.append(time.perf_counter() - t)
        del b
    total = time.perf_counter() - t0
    if hasattr(loader, "close"):
        loader.close()
    return {"seconds": total, "latencies": lat, "digest": check}


# -- the parent ---------------------------------------------------------------------


def _pss_tree(pid: int) -> int:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_full_info().pss
    return total


def one_run(case: str, paths: dict, **kw) -> dict:
    args = json.dumps({"case": case, "paths": paths, **kw})
    if case == LOADERX28:
        command = [os.fspath(loaderx28.PYTHON), os.fspath(loaderx28.WORKER), "loader", args]
    else:
        python = grain_python()[0] if case == GRAIN else sys.executable
        command = [python, "-m", "harness.loader_bench", "--child", args]
    proc = subprocess.Popen(
        command,
        cwd=common.ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,  # grain's absl and resource-tracker chatter; shown when a run fails
        text=True,
    )
    peak = 0
    done = threading.Event()

    def sample():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _pss_tree(proc.pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {_failure_line(err)[:200]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_pss"] = peak
    return result


def run_retrying_once(case: str, paths: dict, failures: list[str], **kw) -> dict:
    """`one_run`, run once more if it fails (the failure appended to
    `failures`, for the notes): CPython 3.11.7 now and then fails a threaded
    program's `ast` use with a false "AST constructor recursion depth
    mismatch" (gh-106905, fixed in 3.11.8), seen in grain's runs here. A
    second failure raises."""
    try:
        return one_run(case, paths, **kw)
    except RuntimeError as e:
        failures.append(str(e))
        return one_run(case, paths, **kw)


def _failure_line(stderr: str) -> str:
    """The line of a failed child's stderr that says what failed: the last
    exception line of its traceback (grain appends a notice about its
    filtered frames after it), else the last line."""
    lines = stderr.strip().splitlines() or [""]
    exceptions = [line for line in lines if re.match(r"[\w.]+(Error|Exception|Exit)\b", line)]
    return (exceptions or lines)[-1]


def _available(module: str, python: str = sys.executable) -> bool:
    """Whether a peer imports, checked in a child so a broken install cannot
    take the parent down."""
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
    return probe.returncode == 0


def _python_312() -> str | None:
    """A Python of 3.12 or later: pyenv's newest 3.12 or 3.13, else python3.12 or python3.13 on PATH."""
    root = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
    key = lambda p: [int(x) if x.isdigit() else -1 for x in p.parts[-3].split(".")]  # noqa: E731
    found = sorted(root.glob("versions/3.1[23].*/bin/python3"), key=key)
    return (
        next((os.fspath(p) for p in reversed(found)), None) or shutil.which("python3.12") or shutil.which("python3.13")
    )


@functools.cache
def grain_python(make: bool = False) -> tuple[str, str]:
    """The interpreter grain's runs use and a note on it: work-bench/venv-grain
    when it is there (`make`: made first when it is not, from
    harness/requirements-grain.txt), else this one."""
    venv = common.bench_base() / GRAIN_VENV
    python = venv / "bin" / "python"
    base = _python_312()
    if make and base and not (python.exists() and _available("grain", os.fspath(python))):
        print(f"[loader] making {venv} for grain on {base} (harness/requirements-grain.txt)", flush=True)
        subprocess.run([base, "-m", "venv", "--clear", os.fspath(venv)])
        req = common.ROOT / "harness" / "requirements-grain.txt"
        subprocess.run([os.fspath(python), "-m", "pip", "install", "-q", "-r", os.fspath(req)])
    if python.exists() and _available("grain", os.fspath(python)):
        probe = (
            "import sys, importlib.metadata as m; print(sys.version.split()[0], m.version('grain'), m.version('numpy'))"
        )
        py, grain, numpy = subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout.split()
        return os.fspath(python), f"grain ran in {venv.name} (Python {py}, grain {grain}, numpy {numpy})"
    return sys.executable, f"grain ran in this Python ({venv.name}: no Python 3.12 or later, or its install failed)"


def run(
    records: int, batches: int, runs: int, warmup: int = 10, workers: int = 4, batch: int = 256
) -> list[report.Result]:
    paths = prepare(records)
    everyone = [ZT, LOADERX, LOADERX28, TORCH, TORCH_SPAWN, GRAIN]
    importable = {m: _available(m) for m in dict.fromkeys(PEER_MODULE.values()) if m != PEER_MODULE[LOADERX28]}
    importable[PEER_MODULE[LOADERX28]] = loaderx28.missing() is None
    grain, grain_note = grain_python(make=True)
    importable["grain"] |= grain != sys.executable  # its venv's python imports grain
    cases = [c for c in everyone if importable[PEER_MODULE[c]]]
    peer = LOADERX28 if LOADERX28 in cases else LOADERX
    samples: dict[str, list[float]] = {c: [] for c in everyone}
    lats: dict[str, list[float]] = {c: [] for c in cases}
    peaks: dict[str, list[int]] = {c: [] for c in cases}
    kw = dict(batch=batch, workers=workers, warmup=warmup, batches=batches)
    failed: dict[str, str] = {}
    retried: dict[str, list[str]] = {}
    for _ in range(runs):
        for case in [c for c in cases if c not in failed]:
            try:
                r = run_retrying_once(case, paths, retried.setdefault(case, []), **kw)
            except RuntimeError as e:  # reported in its row, never dropped
                failed[case] = str(e)
                continue
            samples[case].append(r["seconds"])
            lats[case].extend(r["latencies"])
            peaks[case].append(r["peak_pss"])
    extra = {}
    for case in failed:
        samples[case] = []
        extra[case] = {"median": f"failed: {failed[case]}"}
    for case in [c for c in cases if c not in failed]:
        med = common.summary(samples[case])[0]
        p95 = statistics.quantiles(lats[case], n=20)[-1]
        extra[case] = {
            "batches/s": f"{batches / med:.1f}",
            "p95 next()": f"{p95 * 1e3:.2f} ms",
            "peak PSS": f"{max(peaks[case]) / 2**20:.0f} MiB",
        }
    for case in everyone:
        if case not in cases:
            extra[case] = {"median": f"missing ({PEER_MODULE[case]} does not import)"}
    mib = batch * int(np.prod(SHAPE)) / 2**20
    retries = [
        f"{case}: {len(errors)} run(s) failed and were run again (the rerun is the one timed); first failure: "
        f"{errors[0]}"
        for case, errors in retried.items()
        if errors
    ]
    return [
        report.Result(
            "loader",
            f"Dense vision: {records:,} × uint8[3,224,224] + int64 label, batch {batch} ({mib:.1f} MiB), "
            f"{batches} timed batches per run, {workers} workers",
            samples,
            peer=peer,
            extra=extra,
            modules=["zt", "numpy", "loaderx", "torch", "grain", "psutil"],
            notes=[
                "Every run checks its first batch: images equal the records their labels name (zt: also "
                "equal to a direct gather of Sampler's indices for step 0).",
                "loaderx 2.8.19 reads the same zrecord store as zt (zt's default layout is loaderx 2.8's); "
                "loaderx 2.3.8 reads the same records in the loaderx-2.3 layout (same shard files); torch (fork "
                "and spawn) and grain read the same images from an .npy memmap through one dataset class.",
                "loaderx 2.8.19 runs in Python 3.12 (its requirement), in its own child process like every case; "
                "its `next()` includes `np.from_dlpack` of its DLPack outputs (zero-copy).",
                f"{grain_note}.",
                "zt's peak PSS includes the store's own pages: zrecord's reader memory-maps its shards, so every "
                f"touched record (≈ {records * int(np.prod(SHAPE)) / 2**20:.0f} MiB here) counts toward the "
                "process; loaderx preads into its buffers, torch's workers map the .npy.",
                *retries,
            ],
        )
    ]


def header(runs: int) -> str:
    v = common.versions("numpy", "loaderx", "torch", "grain")
    lx28 = loaderx28.versions() if loaderx28.missing() is None else {"loaderx": "missing", "numpy": "-", "python": "-"}
    load = os.getloadavg()[0]
    return (
        "## End-to-end loader: zt.loader.DataLoader against loaderx 2.3.8 and 2.8.19, torch and grain\n\n"
        f"numpy {v['numpy']}, loaderx {v['loaderx']}; loaderx {lx28['loaderx']} (numpy {lx28['numpy']}, Python "
        f"{lx28['python']}); torch {v['torch']}, grain {v['grain']}. {runs} interleaved runs per case, each "
        "in a fresh child process (1 validation batch, 10 warm-up batches, then the timed `next()` calls); "
        "median and IQR of the time per run. Peak PSS is summed over the child's process tree, sampled every "
        f"20 ms. 1-minute load average at the start: {load:.1f} on {os.cpu_count()} cores."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--records", type=int, default=2500)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", default="loader", help="results/<out>.md")
    ap.add_argument("--grain-venv", action="store_true", help="only make work-bench/venv-grain (grain's runs)")
    args = ap.parse_args()
    if args.grain_venv:
        print(grain_python(make=True)[1])
        return
    if args.child:
        spec = json.loads(args.child)
        out = _child(spec.pop("case"), spec.pop("paths"), **spec)
        print(json.dumps(out))
        return
    results = run(args.records, args.batches, args.runs, workers=args.workers, batch=args.batch)
    print(report.save(results, args.out, header(args.runs)).read_text())


if __name__ == "__main__":
    main()
