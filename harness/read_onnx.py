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

from . import common
from .read_bench import table


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
    kwargs = {"save_as_external_data": True, "location": path.name + ".data", "size_threshold": 0} if external else {}
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
        "onnx.load + to_array": lambda: read_reference(path),
    }


def check(values: dict, want: dict) -> None:
    for name, got in values.items():
        assert got == want, f"{name} read wrong bytes"


def run(size_mb: int, embedded_mb: int, runs: int, cold: bool = True, stem: str | None = "read_onnx") -> str:
    work = common.bench_dir("read_onnx")
    ext = work / f"ext-{size_mb}.onnx"
    want = make(ext, size_mb, external=True)
    data = work / (ext.name + ".data")
    nbytes = data.stat().st_size
    peer = "onnx.load + to_array"

    warm, values = common.interleaved(readers(ext), runs)
    check(values, want)
    md = [f"## ONNX read: zt vs onnx {common.versions('onnx')['onnx']}", ""]
    md.append(
        f"Files on {common.filesystem_of(work)} at `{work}`; {runs} interleaved runs after one warm-up; every byte digested.\n"
    )
    md.append(table(f"External data, {nbytes / 2**30:.2f} GiB, warm cache", warm, peer, nbytes))
    raw = {"machine": common.machine(), "versions": common.versions("zt", "onnx", "numpy"), "external_warm": warm}
    if cold:

        def drop() -> None:
            common.drop_cache(ext)
            common.drop_cache(data)

        cold_times, values = common.interleaved(readers(ext), runs, warmup=0, before=drop)
        check(values, want)
        md.append(
            table(
                f"External data, {nbytes / 2**30:.2f} GiB, cold cache (posix_fadvise DONTNEED)",
                cold_times,
                peer,
                nbytes,
            )
        )
        raw["external_cold"] = cold_times
    if embedded_mb:
        emb = work / f"emb-{embedded_mb}.onnx"
        want = make(emb, embedded_mb, external=False)
        size = emb.stat().st_size
        times, values = common.interleaved(readers(emb), runs)
        check(values, want)
        md.append(
            table(f"Weights inside the protobuf (raw_data), {size / 2**30:.2f} GiB, warm cache", times, peer, size)
        )
        raw["embedded_warm"] = times
    md.append(f"Machine: {common.machine()}\n")
    text = "\n".join(md)
    if stem:
        common.write_result(stem, text, raw)
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--embedded-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args()
    print(run(args.size_mb, args.embedded_mb, args.runs, cold=not args.no_cold))


if __name__ == "__main__":
    main()
