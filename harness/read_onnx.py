"""Read ONNX models through zt against `onnx.load` + `numpy_helper.to_array`.

Two models, each read in full by every reader, interleaved run by run:
  * a model of --size-mb MiB whose weights are external data (one file,
    written by `onnx.save_model(..., save_as_external_data=True)`), warm
    and cold cache;
  * a model of --embedded-mb MiB with the weights inside the protobuf
    (`raw_data`), warm cache.
Every read is checked against a digest of the arrays written.

    python -m harness.read_onnx --size-mb 1024 --embedded-mb 256 --runs 5
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
from onnx import helper, numpy_helper

import zt

from . import common, report

PEER = "onnx.load + to_array"


def make(path, size_mb: int, external: bool) -> dict[str, int]:
    """fp16 matrices of up to 64 MiB each adding up to size_mb. Returns digests."""
    rng = np.random.default_rng(2)
    per = min(64, size_mb)
    arrays = {}
    for i in range(max(1, size_mb // per)):
        rows = per * (1 << 20) // 2 // 4096
        arrays[f"block.{i}.weight"] = rng.integers(0, 1 << 16, size=(rows, 4096), dtype=np.uint16).view(np.float16)
    graph = helper.make_graph([], "g", [], [], initializer=[numpy_helper.from_array(a, n) for n, a in arrays.items()])
    model = helper.make_model(graph, producer_name="zt-bench")
    data = path.with_name(path.name + ".data")
    # onnx appends to an existing data file: start from none.
    data.unlink(missing_ok=True)
    kwargs = {"save_as_external_data": True, "location": data.name, "size_threshold": 0} if external else {}
    onnx.save_model(model, os.fspath(path), **kwargs)
    return {k: common.digest(v) for k, v in arrays.items()}


def read_zt(path, copy: bool) -> dict[str, int]:
    with zt.open(path) as src:
        return {name: common.digest(src[name].numpy(copy=copy)) for name in src}


def read_reference(path) -> dict[str, int]:
    model = onnx.load(os.fspath(path))
    return {t.name: common.digest(numpy_helper.to_array(t)) for t in model.graph.initializer}


def readers(path):
    return {
        "zt zero-copy": lambda: read_zt(path, False),
        "zt copy": lambda: read_zt(path, True),
        PEER: lambda: read_reference(path),
    }


def check(values: dict, want: dict) -> None:
    for name, got in values.items():
        assert got == want, f"{name} read wrong bytes"


def run(size_mb: int, embedded_mb: int, runs: int, cold: bool = True) -> list[report.Result]:
    work = common.bench_dir("read_onnx")
    ext = work / f"ext-{size_mb}.onnx"
    want = make(ext, size_mb, external=True)
    data = work / (ext.name + ".data")
    nbytes = data.stat().st_size
    assert nbytes == size_mb << 20, "the data file holds exactly the tensors"
    gib = f"{nbytes / 2**30:.2f} GiB"
    results = []
    temps = ["warm"] + (["cold"] if cold else [])
    for temp in temps:
        before = None
        if temp == "cold":

            def before():
                for path in (ext, data):
                    common.drop_cache(path)
                assert common.cached_fraction(data) < 0.05, "the page cache kept the file"

        times, values = common.interleaved(readers(ext), runs, warmup=0 if before else 1, before=before)
        check(values, want)
        results.append(
            report.Result(
                "read_onnx", f"External data, {gib}, {temp} cache", times, peer=PEER, nbytes=nbytes, modules=["onnx"]
            )
        )
    if embedded_mb:
        emb = work / f"emb-{embedded_mb}.onnx"
        want = make(emb, embedded_mb, external=False)
        size = emb.stat().st_size
        times, values = common.interleaved(readers(emb), runs)
        check(values, want)
        title = f"Weights inside the protobuf (raw_data), {size / 2**30:.2f} GiB, warm cache"
        results.append(report.Result("read_onnx", title, times, peer=PEER, nbytes=size))
    return results


def header(runs: int) -> str:
    work = common.bench_dir("read_onnx")
    v = common.versions("onnx", "numpy")
    return (
        "## Reading ONNX: zt against `onnx.load` + `numpy_helper.to_array`\n\n"
        f"onnx {v['onnx']}, numpy {v['numpy']}. Models written by `onnx.save_model`; files on "
        f"{common.filesystem_of(work)} at `{work}`; {runs} interleaved runs (after one warm-up for warm cache); "
        "every byte digested and checked. Cold cache: `posix_fadvise(DONTNEED)` on the model and its data file "
        "before each run, checked with `mincore`. Data: synthetic fp16 matrices."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--embedded-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    results = run(args.size_mb, args.embedded_mb, args.runs, cold=not args.no_cold)
    print(report.save(results, "read_onnx", header(args.runs)).read_text())


if __name__ == "__main__":
    main()
