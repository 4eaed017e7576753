"""ONNX external data (issue 42, measured): moving a large model's
initializers into one external data file, zt against onnx as users do it.

Two sources, both built with onnx's own helpers (`numpy_helper.from_array`,
`helper.make_graph`/`make_model`, `onnx.save_model`) from random float32
matrices (a MatMul + Add chain, one `[n, n]` weight and one `[n]` bias per
layer, every one past the 1 KiB threshold):

* the issue's size: a model past protobuf's 2 GB limit, which can only
  exist with its weights outside the protobuf, saved as
  `torch.onnx.export` saves such models (`save_as_external_data=True,
  all_tensors_to_one_file=False`: one file per initializer beside the
  model), gathered into one data file;
* an inline model just under the 2 GB limit (every tensor in the protobuf,
  the largest model that has no external data), externalized.

The two cases, each in a fresh child process per run:

* `zt.convert(src, dst, external_data=True)`: the protobuf rewritten on
  the wire, tensor bytes copied file to file;
* the peer, as users do it: `onnx.save_model(onnx.load(src), dst,
  save_as_external_data=True, all_tensors_to_one_file=True,
  location=<dst name>.data)` (onnx's default 1 KiB threshold, as zt's).

The child imports what its case needs, records `VmRSS`, runs the call
under `perf_counter`, and reports the time, `VmHWM` (the kernel's
high-water mark of the resident set, which counts mapped file pages) minus
that baseline, and its peak anonymous memory (`RssAnon` sampled every 5 ms
by a thread) over its value before (the method of
`harness/checkpoint_bench.py`). Cases are interleaved run by run
(`common.balanced_orders`), one warm-up round first; each run writes into
an empty directory, deleted and `sync`ed after, outside the timed region.
After the timed runs both outputs are checked with
`onnx.checker.check_model(full_check=True)`, loaded by `onnx.load` (with
their external data) and compared with the source initializer by
initializer (name, dtype, dims, every byte), and each initializer that
moved is external.

    python -m harness --only onnx-external          # results/onnx-external.md
    python -m harness.onnx_external_bench --quick --runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

from . import common, report

MODULES = ["onnx"]
MIB = 1 << 20
THRESHOLD = 1024

ZT = "zt.convert(external_data=True)"
PEER = "onnx.load → onnx.save_model(save_as_external_data=True)"
CASES = (ZT, PEER)

# name -> (layers, n): `layers` float32 [n, n] weights (+ a [n] bias each).
FULL = {"external": (10, 8192), "inline": (7, 8192)}  # 2.5 GiB (past 2 GB); 1.75 GiB (under it)
QUICK = {"external": (4, 2048), "inline": (3, 2048)}  # 64 MiB; 48 MiB


# --- the source models ------------------------------------------------------------------------------------------


def build(path: pathlib.Path, layers: int, n: int, external: bool) -> dict[str, tuple[str, tuple, int]]:
    """A MatMul + Add chain of `layers` random [n, n] float32 weights and [n]
    biases, saved by `onnx.save_model` (one external file per initializer
    with `external`, else inline). Returns each initializer's digest."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(42)
    inits, nodes, want = [], [], {}
    prev = "x"
    for i in range(layers):
        for name, shape in ((f"layers.{i}.weight", (n, n)), (f"layers.{i}.bias", (n,))):
            arr = rng.standard_normal(shape, dtype=np.float32)
            want[name] = ("float32", shape, common.digest(arr))
            inits.append(numpy_helper.from_array(arr, name))
            del arr
        nodes.append(helper.make_node("MatMul", [prev, f"layers.{i}.weight"], [f"h{i}"]))
        nodes.append(helper.make_node("Add", [f"h{i}", f"layers.{i}.bias"], [f"y{i}"]))
        prev = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, n])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    del inits, graph
    if external:
        onnx.save_model(model, os.fspath(path), save_as_external_data=True, all_tensors_to_one_file=False)
    else:
        onnx.save_model(model, os.fspath(path))
    return want


def check(out: pathlib.Path, want: dict) -> None:
    """The output is valid ONNX, its initializers equal the source's, and
    every one of at least THRESHOLD bytes is external in one data file."""
    import onnx
    from onnx import TensorProto, numpy_helper

    onnx.checker.check_model(os.fspath(out), full_check=True)
    model = onnx.load(os.fspath(out), load_external_data=False)
    files = set()
    for t in model.graph.initializer:
        nbytes = int(np.prod(t.dims)) * 4
        external = t.data_location == TensorProto.EXTERNAL
        assert external == (nbytes >= THRESHOLD), (out, t.name)
        if external:
            files.add({e.key: e.value for e in t.external_data}["location"])
    assert files == {out.name + ".data"}, (out, files)
    onnx.load_external_data_for_model(model, os.fspath(out.parent))
    got = {}
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        got[t.name] = (str(arr.dtype), arr.shape, common.digest(arr))
    assert got == want, out


# --- the cases, each run in a child (`--child CASE SRC DST`) ------------------------------------------------------


def child_main(case: str, src: str, dst: str) -> None:

    if case == ZT:
        import zt

        def call():
            zt.convert(src, dst, external_data=True)
    else:
        import onnx

        def call():
            model = onnx.load(src)
            onnx.save_model(
                model,
                dst,
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=os.path.basename(dst) + ".data",
                size_threshold=THRESHOLD,
            )

    print(json.dumps(common.measure_call(call)))


def child(case: str, src: pathlib.Path, dst: pathlib.Path) -> dict:
    argv = [sys.executable, "-m", "harness.onnx_external_bench", "--child", case, os.fspath(src), os.fspath(dst)]
    got = subprocess.run(argv, cwd=common.ROOT, capture_output=True, text=True)
    if got.returncode != 0:
        raise RuntimeError(f"{case} failed (exit {got.returncode}):\n{got.stderr[-4000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def interleave(src: pathlib.Path, work: pathlib.Path, runs: int, warmup: int):
    """Both cases `warmup + runs` times in balanced orders, each into an
    empty directory (deleted and synced after, the last kept for the
    check). Returns {case: [(seconds, peak RSS over baseline, peak anon)]}."""
    got: dict[str, list[tuple[float, int, int]]] = {c: [] for c in CASES}
    orders = common.balanced_orders(len(CASES))
    for i in range(warmup + runs):
        for k in orders[i % len(orders)]:
            case = CASES[k]
            out = work / f"out-{k}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            os.sync()
            r = child(case, src, out / "model.onnx")
            if i >= warmup:
                got[case].append((r["seconds"], r["peak"] - r["baseline"], r["anon"]))
            if i < warmup + runs - 1:
                shutil.rmtree(out)
            os.sync()
    return got


def result(name: str, title: str, got, nbytes: int, notes: list[str]) -> report.Result:
    samples = {c: [r[0] for r in got[c]] for c in CASES}
    peaks = {c: statistics.median(r[1] for r in got[c]) for c in CASES}
    extra = {}
    for c in CASES:
        lo, hi = min(r[1] for r in got[c]), max(r[1] for r in got[c])
        extra[c] = {
            "peak RSS over baseline": f"{peaks[c] / MIB:.0f} MiB ({lo / MIB:.0f} – {hi / MIB:.0f})",
            "RSS ÷ peer's": f"{peaks[c] / peaks[PEER]:.3f}×",
            "peak anonymous": f"{statistics.median(r[2] for r in got[c]) / MIB:.0f} MiB",
        }
    return report.Result(name, title, samples, peer=PEER, nbytes=nbytes, notes=notes, extra=extra, modules=MODULES)


def run(runs: int, sizes: dict, warmup: int = 1) -> list[report.Result]:
    LOAD.begin()
    work = common.bench_dir("onnx-external")
    fs = common.filesystem_of(work)
    method = (
        "Time: the call alone, inside a fresh child process per run (interpreter start and imports excluded). "
        "Peak RSS: the child's VmHWM after the call minus its VmRSS just before it (imports done); it counts the "
        "file pages a mapping touches. Peak anonymous: the child's RssAnon (allocations alone), sampled every 5 ms, "
        "over its value before. Medians over the runs, (min – max) beside. GiB/s is tensor bytes moved per second. "
        "zt fsyncs both files it writes before returning; onnx does not (its time excludes the flush)."
    )
    checked = (
        "Both outputs pass `onnx.checker.check_model(full_check=True)`; `onnx.load` of each with its external data "
        "gives the source's initializers byte for byte, every one of at least 1 KiB external in `model.onnx.data`."
    )
    results = []
    try:
        for form in ("external", "inline"):
            layers, n = sizes[form]
            src_dir = work / f"src-{form}"
            shutil.rmtree(src_dir, ignore_errors=True)
            src_dir.mkdir()
            src = src_dir / "model.onnx"
            t0 = time.perf_counter()
            want = build(src, layers, n, external=form == "external")
            built = time.perf_counter() - t0
            nbytes = layers * (n * n + n) * 4
            on_disk = sum(p.stat().st_size for p in src_dir.iterdir())
            got = interleave(src, work, runs, warmup)
            for k in range(len(CASES)):
                check(work / f"out-{k}" / "model.onnx", want)
            shape = f"{layers} float32 [{n}, {n}] weights + [{n}] biases"
            if form == "external":
                past = " past protobuf's 2 GB limit" if on_disk >= 2**31 else ""
                title = (
                    f"A {on_disk / 2**30:.2f} GiB model{past}, one file per initializer (as torch.onnx.export "
                    f"saves it), to one external data file"
                )
                described = (
                    f"Source: {shape} ({nbytes / MIB:.0f} MiB of tensors), saved by `onnx.save_model("
                    f"save_as_external_data=True, all_tensors_to_one_file=False)` as {len(list(src_dir.iterdir()))} "
                    f"files"
                )
            else:
                title = f"An inline {on_disk / 2**30:.2f} GiB model (under protobuf's 2 GB limit) to external data"
                described = f"Source: {shape} ({nbytes / MIB:.0f} MiB of tensors), saved inline by `onnx.save_model`"
            notes = [f"{described} in {built:.0f} s, on {fs} at `{work}`, warm in the page cache.", method, checked]
            results.append(result(f"onnx-external-{form}", title, got, nbytes, notes))
            shutil.rmtree(src_dir)
            for k in range(len(CASES)):
                shutil.rmtree(work / f"out-{k}", ignore_errors=True)
    finally:
        LOAD.finish()
        shutil.rmtree(work, ignore_errors=True)
    return results


# The load average while `run` ran, for the header.
LOAD = common.LoadWindow()


def header(runs: int) -> str:
    return (
        "## ONNX external data: a model's initializers moved to one data file\n\n"
        f"{runs} interleaved runs after one warm-up, each a fresh child process; `vs` is the peer's median time over "
        "the case's (higher is faster), `RSS ÷` the case's median peak RSS over the peer's (lower is smaller). "
        "Reproduce: `python -m harness --only onnx-external` (`--quick`: 64 MiB and 48 MiB models, one run). "
        f"{report.machine_line(['zt', 'numpy', *MODULES])}{LOAD.sentence()}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the small models")
    ap.add_argument("--out", default="onnx-external")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(*args.child)
        return
    results = run(args.runs, QUICK if args.quick else FULL)
    path = report.save(results, args.out, header(args.runs), plot=False)
    print(path.read_text())


if __name__ == "__main__":
    main()
