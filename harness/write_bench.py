"""Write throughput and file size for three workloads (zTensor's):
  large  -- a few big matrices;
  mixed  -- realistic transformer shapes of several sizes;
  small  -- ~50k tensors of 10 KiB each (at 512 MiB).
Each writer writes the same arrays; runs are interleaved, the output removed
and `sync`ed outside the timed region. zt's writers fsync their output (every
format, `.zt` included: zt's one durability rule) and upstream ztensor's
does; the other libraries do not, so `safetensors save_file + fsync` is
the peer held to the same rule (the file and its directory fsynced), and
zt's `durable=False` rows (atomic rename, no fsync) are zt held to theirs. Data: synthetic random bits (the seed's workloads are
synthetic).

    python -m harness.write_bench --size-mb 512 --runs 3

`--kinds small --size-mb 128` is the small-write case on its own (13,107
tensors of 10 KiB), saved as results/write-small-128.md beside the full table;
`--cases A B ...` runs only those writers (results/write-small-128-peers.md):
a durable writer's fsync waits on whatever the device still holds from the
writers run before it (an earlier output's writeback, its deletion), so a
run among fifteen writers, some writing 1 GiB, measures the neighbours too.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from typing import Callable

import numpy as np
import safetensors.numpy

import zt

from . import common, report


def workload(kind: str, size_mb: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    total = size_mb << 20
    shapes: list[tuple[int, ...]] = []
    if kind == "large":
        per = max(total // 8, 1 << 20)
        shapes = [(per // 4 // 4096, 4096)] * max(1, total // per)
    elif kind == "mixed":
        cycle = [(2048, 2048), (512, 2048), (8192, 2048), (2048, 8192), (2048,), (2048,)]
        used, i = 0, 0
        while used < total:
            shapes.append(cycle[i % len(cycle)])
            used += int(np.prod(shapes[-1])) * 4
            i += 1
    elif kind == "small":
        shapes = [(2560,)] * (total // 10240)  # 10 KiB of f32 each
    else:
        raise ValueError(kind)
    return {
        f"t{i:06d}": rng.integers(0, 1 << 32, size=s, dtype=np.uint32).view(np.float32) for i, s in enumerate(shapes)
    }


def _optional(module: str):
    """Import a peer library, or None when it is not installed (reported as missing)."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        return None


def _h5py_write(h5py, arrays, path):
    with h5py.File(path, "w") as f:
        for k, v in arrays.items():
            f.create_dataset(k, data=v)


def _gguf_write(gguf, arrays, path):
    w = gguf.GGUFWriter(path, "bench")
    for k, v in arrays.items():
        w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _onnx_write(onnx, arrays, path):
    from onnx import helper, numpy_helper

    graph = helper.make_graph([], "bench", [], [], [numpy_helper.from_array(v, k) for k, v in arrays.items()])
    onnx.save_model(helper.make_model(graph), path)


def _torch_write(torch, arrays, path):
    torch.save({k: torch.from_numpy(v) for k, v in arrays.items()}, path)


def _durable_safetensors(arrays, path) -> None:
    """The peer held to zt's durability rule: `safetensors.numpy.save_file`,
    then the file fsynced and its directory after (what zt's writers do
    before and after their rename), so the bytes are on the device when it
    returns."""
    safetensors.numpy.save_file(arrays, path)
    for target, flags in ((path, os.O_RDONLY), (os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)):
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def writers() -> dict[str, tuple[str, Callable[[dict, str], None] | None]]:
    """name -> (extension, write function or None when the peer is missing)."""
    ztensor = _optional("ztensor.numpy")
    h5py, gguf, onnx, torch = (_optional(m) for m in ("h5py", "gguf", "onnx", "torch"))
    return {
        "zt .zt canonical": (".zt", lambda a, p: zt.numpy.save_file(a, p)),
        "zt .zt auto": (".zt", lambda a, p: zt.numpy.save_file(a, p, align="auto")),
        "zt .zt 4 KiB": (".zt", lambda a, p: zt.numpy.save_file(a, p, align=4096)),
        "ztensor 2.1.2 canonical": (".zt", ztensor and (lambda a, p: ztensor.save_file(a, p))),
        "ztensor 2.1.2 4 KiB": (".zt", ztensor and (lambda a, p: ztensor.save_file(a, p, align=4096))),
        "zt .zt canonical, durable=False": (".zt", lambda a, p: zt.numpy.save_file(a, p, durable=False)),
        "zt → safetensors": (".safetensors", lambda a, p: zt.numpy.save_file(a, p)),
        "zt → safetensors, durable=False": (
            ".safetensors",
            lambda a, p: zt.numpy.save_file(a, p, durable=False),
        ),
        "safetensors.numpy.save_file": (".safetensors", lambda a, p: safetensors.numpy.save_file(a, p)),
        "safetensors save_file + fsync": (".safetensors", _durable_safetensors),
        "zt → npz": (".npz", lambda a, p: zt.numpy.save_file(a, p)),
        "numpy.savez": (".npz", lambda a, p: np.savez(p, **a)),
        "zt → pt": (".pt", lambda a, p: zt.numpy.save_file(a, p)),
        "torch.save": (".pt", torch and (lambda a, p: _torch_write(torch, a, p))),
        "gguf.GGUFWriter": (".gguf", gguf and (lambda a, p: _gguf_write(gguf, a, p))),
        "onnx.save_model": (".onnx", onnx and (lambda a, p: _onnx_write(onnx, a, p))),
        "h5py": (".h5", h5py and (lambda a, p: _h5py_write(h5py, a, p))),
    }


def measure(kind: str, arrays: dict[str, np.ndarray], runs: int, only=None) -> report.Result:
    """Every available writer (or those named in `only`) on one workload, interleaved."""
    work = common.bench_dir("write")
    payload = sum(a.nbytes for a in arrays.values())
    sizes: dict[str, int] = {}
    # CPU time of the whole process (every thread) per call: on shared
    # cores the wall time also counts other work's turns, the CPU time
    # only this writer's own work.
    cpu: dict[str, list[float]] = {}

    def case(name: str, ext: str, fn):
        path = work / f"{kind}-{''.join(c if c.isalnum() else '_' for c in name)}{ext}"

        def go():
            c0 = time.process_time()
            fn(arrays, os.fspath(path))
            cpu.setdefault(name, []).append(time.process_time() - c0)
            sizes[name] = path.stat().st_size

        return go

    def clean():
        for p in work.glob(f"{kind}-*"):
            p.unlink()
        os.sync()

    chosen = {name: w for name, w in writers().items() if only is None or name in only}
    cases = {name: case(name, ext, fn) for name, (ext, fn) in chosen.items() if fn}
    times, _ = common.interleaved(cases, runs, warmup=1, before=clean)
    clean()
    for name, (_, fn) in chosen.items():
        if fn is None:
            times[name] = []  # reported as missing, never silently dropped
    peer_cpu = (
        statistics.median(cpu["safetensors.numpy.save_file"][1:]) if "safetensors.numpy.save_file" in cpu else None
    )
    extra = {}
    for n in sizes:
        own = statistics.median(cpu[n][1:])  # the warm-up's call left out
        extra[n] = {
            "CPU time": f"{own * 1e3:.1f} ms",
            "CPU vs safetensors.numpy.save_file": f"{peer_cpu / own:.2f}×" if peer_cpu else "",
            "size ÷ payload": f"{sizes[n] / payload:.3f}",
        }
    title = f"Write {kind}: {len(arrays):,} tensors, {payload / 2**20:.0f} MiB"
    modules = ["zt", "numpy", "safetensors", "ztensor", "torch", "gguf", "onnx", "h5py"]
    return report.Result(
        "write", title, times, peer="safetensors.numpy.save_file", nbytes=payload, extra=extra, modules=modules
    )


# The alignment trade-off (zTensor's table): zt's .zt writer at each placement.
ALIGNMENTS = {"4 KiB": "zt .zt 4 KiB", "64 KiB (canonical)": "zt .zt canonical", "auto": "zt .zt auto"}


def alignment(kinds, results: list[report.Result]) -> report.Result:
    """Payload ratio and throughput per placement and workload, taken from the
    runs above (no extra writes): one row per (workload, placement)."""
    samples, extra = {}, {}
    for kind, r in zip(kinds, results):
        canonical = common.summary(r.samples[ALIGNMENTS["64 KiB (canonical)"]])[0]
        for label, writer in ALIGNMENTS.items():
            case = f"{kind}, {label}"
            samples[case] = r.samples[writer]
            med = common.summary(r.samples[writer])[0]
            extra[case] = {
                "GiB/s": f"{r.nbytes / med / 2**30:.2f}",
                "size ÷ payload": r.extra[writer]["size ÷ payload"],
                "vs canonical": f"{canonical / med:.2f}×",
            }
    return report.Result(
        "write",
        "Alignment trade-off: zt .zt placement (the same runs as the tables above)",
        samples,
        extra=extra,
        modules=["zt", "numpy"],
        notes=["`auto` places blobs of at least 1 MiB at 64 KiB and smaller ones at 4 KiB."],
    )


LOAD = common.LoadWindow()


def run(size_mb: int, runs: int, kinds=("large", "mixed", "small"), only=None) -> list[report.Result]:
    LOAD.begin()
    results = [measure(kind, workload(kind, size_mb), runs, only) for kind in kinds]
    LOAD.finish()
    return results if only else results + [alignment(kinds, results)]


def header(runs: int) -> str:
    work = common.bench_dir("write")
    v = common.versions("safetensors", "numpy", "ztensor", "torch", "gguf", "onnx", "h5py")
    return (
        "## Writing: zt's writers against each format's own library and upstream ztensor\n\n"
        + ", ".join(f"{k} {x}" for k, x in v.items())
        + f". Files on {common.filesystem_of(work)}; {runs} interleaved runs after one warm-up; the previous output is "
        "deleted and `sync`ed outside the timed region. zt's writers (every format) fsync the file before its rename "
        "and the directory after; upstream ztensor fsyncs in `Writer.finish`; the other libraries do not fsync, "
        "so `safetensors save_file + fsync` is safetensors held to zt's rule (file and directory fsynced). Throughput is payload bytes per second; "
        "`size ÷ payload` shows the padding each placement costs (the alignment trade-off). `CPU time` is the "
        "median CPU time of the process (all its threads) per write, which other work on shared cores inflates less "
        "than the wall time (only through the caches); its ratio is the peer's CPU time over the case's."
        + LOAD.sentence()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--kinds", nargs="+", choices=["large", "mixed", "small"], default=["large", "mixed", "small"])
    ap.add_argument("--cases", nargs="+", choices=list(writers()), help="only these writers (no alignment table)")
    args = ap.parse_args()
    every = args.kinds == ["large", "mixed", "small"] and not args.cases
    # Every workload and writer is the full table; a part is saved beside it, by name.
    stem = "write" if every else f"write-{'-'.join(args.kinds)}-{args.size_mb}" + ("-peers" if args.cases else "")
    results = run(args.size_mb, args.runs, args.kinds, args.cases)
    command = " ".join(["python -m harness.write_bench", *(shlex.quote(a) for a in sys.argv[1:])])
    print(report.save(results, stem, header(args.runs) + f"\n\nReproduce: `{command}`.").read_text())


if __name__ == "__main__":
    main()
