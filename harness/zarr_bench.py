"""Random reads of chunks of a zarr v3 store, zt against zarr-python.

One float32 array written by zarr-python (its own writer, the pinned
3.1.x) in each codec layout, read from the same store on disk by both:

* `zstd`: chunks of `rows` × all columns, each its own `zstd` object;
* `sharded`: the same inner chunks, `shard` of them per shard object
  (`sharding_indexed`, zstd inside: a read fetches the shard's index, then
  the inner chunk's byte range);
* `raw`: the same chunks uncompressed (the decode cost taken away).

Chunks are row bands (every column) because zt slices along the leading
dimension (`safe_open(...).get_slice(name)[a:b]` reads the chunks those rows
meet); a single-chunk slice is then the same read for both libraries.

Workloads, each timed from opening the store (`zt.safe_open(store)` /
`zarr.open_array(store)`; both read the metadata file) to the last byte:

* `random chunks`: `reads` single-chunk slices at random chunk indices (the
  same seeded sequence for both, repeats allowed), every one compared with
  the array written before timing and digested while timed;
* `whole array`: the array read in full and digested.

Cases interleaved run by run (`common.interleaved`), a warm-up first; warm
page cache (the store was just written). zarr-python reads chunks through
its asyncio store with its default concurrency; zt reads them on its own
threads. The 1-minute load average at start and end is in the header.
Whole reads have a third case, `zt get_tensor, 1 thread`: the same read in
a worker process whose CPU pool has one thread (`RAYON_NUM_THREADS=1`), so
chunks decode one after another; the worker is driven a line per read and
interleaved with the other cases, its reply (the digest) checked.

    python -m harness --only zarr
    python -m harness.zarr_bench --rows 8192 --cols 2048 --chunk-rows 32 --runs 7
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import numpy as np

import zt

from . import common, report

MODULES = ["zarr", "numcodecs"]
LOAD: dict[str, float] = {}


def layouts(chunk_rows: int, shard: int) -> dict[str, dict]:
    """zarr-python's create_array arguments per layout."""
    from zarr.codecs import ZstdCodec

    zstd = ZstdCodec(level=3)
    return {
        "zstd": dict(compressors=zstd),
        "sharded": dict(shards=(chunk_rows * shard, None), compressors=zstd),
        "raw": dict(compressors=None),
    }


def write(path, data: np.ndarray, chunk_rows: int, kw: dict):
    """The array at `path` as zarr-python writes it (one chunk per row band)."""
    import zarr

    kw = dict(kw)
    if "shards" in kw:
        kw["shards"] = (kw["shards"][0], data.shape[1])
    arr = zarr.create_array(
        str(path), shape=data.shape, chunks=(chunk_rows, data.shape[1]), dtype=data.dtype, zarr_format=3, **kw
    )
    arr[...] = data
    return arr


def readers(path, spans: list[tuple[int, int]]):
    """{case: fn} for the random-chunk workload: each returns the digests."""
    import zarr

    def zt_chunks():
        with zt.safe_open(os.fspath(path), framework="numpy") as f:
            sl = f.get_slice("")
            return [common.digest(sl[a:b]) for a, b in spans]

    def zarr_chunks():
        arr = zarr.open_array(str(path), mode="r")
        return [common.digest(arr[a:b]) for a, b in spans]

    return {"zt get_slice": zt_chunks, "zarr-python arr[a:b]": zarr_chunks}


# A zt that decodes chunks one after another: the same read in a process
# whose CPU pool has one thread (rayon's RAYON_NUM_THREADS), driven line by
# line so it interleaves with the other cases; each line it answers is the
# read's digest.
SERIAL_WORKER = """
import sys
import zt
from harness import common

for line in sys.stdin:
    with zt.safe_open(line.strip(), framework="numpy") as f:
        print(common.digest(f.get_tensor("")), flush=True)
"""


class SerialWorker:
    """The one-thread zt process; `read(path)` asks it for one whole read."""

    def __init__(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERIAL_WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
            env={**os.environ, "RAYON_NUM_THREADS": "1"},
        )

    def read(self, path) -> int:
        self.proc.stdin.write(os.fspath(path) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def whole_readers(path, serial: SerialWorker | None = None):
    import zarr

    def zt_whole():
        with zt.safe_open(os.fspath(path), framework="numpy") as f:
            return common.digest(f.get_tensor(""))

    def zarr_whole():
        return common.digest(zarr.open_array(str(path), mode="r")[...])

    cases = {"zt get_tensor": zt_whole}
    if serial is not None:
        cases["zt get_tensor, 1 thread"] = lambda: serial.read(path)
    cases["zarr-python arr[...]"] = zarr_whole
    return cases


def run(rows: int, cols: int, chunk_rows: int, shard: int, reads: int, runs: int) -> list[report.Result]:
    LOAD["start"] = os.getloadavg()[0]
    work = common.bench_dir("zarr")
    rng = np.random.default_rng(7)
    data = rng.standard_normal((rows, cols), dtype=np.float32)
    n_chunks = -(-rows // chunk_rows)
    picks = rng.integers(0, n_chunks, size=reads)
    spans = [(int(i) * chunk_rows, min(rows, (int(i) + 1) * chunk_rows)) for i in picks]
    want_chunks = [common.digest(data[a:b]) for a, b in spans]
    want_whole = common.digest(data)
    results = []
    serial = SerialWorker()
    for layout, kw in layouts(chunk_rows, shard).items():
        path = work / f"{layout}.zarr"
        shutil.rmtree(path, ignore_errors=True)
        write(path, data, chunk_rows, kw)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        objects = sum(1 for f in path.rglob("*") if f.is_file())
        for case, fn in readers(path, spans).items():  # checked once before timing
            assert fn() == want_chunks, f"{layout}: {case} read other bytes"
        for case, fn in whole_readers(path, serial).items():
            assert fn() == want_whole, f"{layout}: {case} read other bytes"
        note = f"{objects} objects, {size / 2**20:.1f} MiB on disk"
        chunk_mib = chunk_rows * cols * 4 / 2**20
        times, _ = common.interleaved(readers(path, spans), runs, warmup=1)
        results.append(
            report.Result(
                "zarr",
                f"{layout}: {reads} random single-chunk reads ({chunk_mib:.2f} MiB chunks of {n_chunks}), open included",
                times,
                peer="zarr-python arr[a:b]",
                nbytes=sum(b - a for a, b in spans) * cols * 4,
                notes=[note],
                modules=list(MODULES),
            )
        )
        times, _ = common.interleaved(whole_readers(path, serial), runs, warmup=1)
        results.append(
            report.Result(
                "zarr",
                f"{layout}: whole array ({rows} × {cols} f32, {data.nbytes / 2**20:.0f} MiB), open included",
                times,
                peer="zarr-python arr[...]",
                nbytes=data.nbytes,
                notes=[note],
                modules=list(MODULES),
            )
        )
        shutil.rmtree(path)
    serial.close()
    LOAD["end"] = os.getloadavg()[0]
    return results


def header(runs: int) -> str:
    load = (
        f" This run: 1-minute load average {LOAD['start']:.1f} at the start and {LOAD['end']:.1f} at the end "
        "(other work shares the 2 cores; the cases are interleaved run by run, so the ratios hold better than "
        "the absolute times)."
        if {"start", "end"} <= LOAD.keys()
        else ""
    )
    return (
        "## zarr: random chunk reads and whole-array reads, zt against zarr-python\n\n"
        "One float32 array written by zarr-python in each layout (zstd chunks; the same inner chunks sharded; "
        "raw chunks), read from the same store on "
        f"{common.bench_filesystem()} at `{common.bench_dir('zarr')}` with a warm page cache. Chunks are row "
        "bands, so a single-chunk slice is the same read for both. Every read's bytes are checked against the "
        f"array written before timing and digested while timed. {runs} runs per case after one warm-up, "
        "cases interleaved; median and IQR; ratios: zarr-python median ÷ case median (above 1 = zt faster). "
        "`zt get_tensor, 1 thread` is the same whole read with chunks decoded one after another (a worker "
        "process with `RAYON_NUM_THREADS=1`), beside zt's own, which decodes them on its CPU pool."
        f"{load}\n\n"
        f"Reproduce: `python -m harness.zarr_bench --runs {runs}` (or `python -m harness --only zarr`)."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--chunk-rows", type=int, default=32)
    ap.add_argument("--shard", type=int, default=16, help="inner chunks per shard")
    ap.add_argument("--reads", type=int, default=200)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    results = run(args.rows, args.cols, args.chunk_rows, args.shard, args.reads, args.runs)
    print(report.save(results, "zarr", header(args.runs)).read_text())


if __name__ == "__main__":
    main()
