"""loaderx 2.8.19's side of the harness, run by .venv-loaderx28's Python 3.12
(loaderx 2.8 needs Python >= 3.12 and numpy >= 2.5; the harness runs in
.venv, 3.11). It imports only numpy and loaderx, times its own calls with
the same clock as the harness (time.perf_counter around the call being
measured, nothing else) and reports numbers back; harness/loaderx28.py is
the client.

    python harness/loaderx28_worker.py serve            # JSON lines: one request in, one reply out
    python harness/loaderx28_worker.py loader '<json>'  # one DataLoader run (harness/loader_bench.py)

Requests (each a JSON object with "op"): "version"; "sampler_new"/"sampler_run"
(sampler_bench); "load", "write", "open", "gather", "close" (stores_bench).
Every gathered record is digested outside the timer (blake2b of its shape
as <u8 words and its bytes, 8 bytes), for the parent to compare with the
source records.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import loaderx
import numpy as np
from loaderx import Allocator, Loader
from loaderx.sampler import Sampler
from loaderx.zrecord import DenseStore, DenseWriter, RaggedBatch, RaggedStore, RaggedWriter

MIB = 1 << 20


def record_digest(shape, payload) -> int:
    h = hashlib.blake2b(np.asarray(shape, "<u8").tobytes(), digest_size=8)
    h.update(payload)
    return int.from_bytes(h.digest(), "little")


def fold(batch: np.ndarray) -> int:
    """XOR of a uint64 batch (harness.common.digest of it)."""
    return int(np.bitwise_xor.reduce(np.ascontiguousarray(batch).view(np.uint64))) if batch.size else 0


class Worker:
    def __init__(self):
        self.allocator = Allocator("cpu")
        self.samplers = {}
        self.data = None
        self.views = {}

    # -- sampler ------------------------------------------------------------------

    def sampler_new(self, key, length, batch, mode, seed):
        self.samplers[key] = Sampler(length, batch, mode, seed)
        return {}

    def sampler_run(self, key, calls):
        s = self.samplers[key]
        t0 = time.perf_counter()
        for _ in range(calls):
            batch = s.next()
        seconds = time.perf_counter() - t0
        return {"seconds": seconds, "digest": fold(batch)}

    # -- stores -------------------------------------------------------------------

    def load(self, kind, dir):
        """The workload the parent saved: dense `data.npy`, or ragged
        `values.npy` (bytes), `ends.npy` (byte offsets), `shapes.npy`, `dtype`."""
        if kind == "dense":
            self.data = np.load(f"{dir}/data.npy")
        else:
            dtype = np.dtype(Path(dir, "dtype").read_text())
            values = np.load(f"{dir}/values.npy")
            ends = np.load(f"{dir}/ends.npy").tolist()
            shapes = np.load(f"{dir}/shapes.npy").tolist()
            starts = [0, *ends[:-1]]
            self.data = [values[a:b].view(dtype).reshape(s) for a, b, s in zip(starts, ends, shapes)]
        self.kind = kind
        return {"records": len(self.data)}

    def write(self, path, codec, dict, shards):
        d = Path(dict).read_bytes() if dict else None
        data = self.data
        t0 = time.perf_counter()
        if self.kind == "dense":
            w = DenseWriter(path, data.dtype, data.shape[1:], codec=codec, dict_bytes=d, data_shards=shards)
            step = max(1, 64 * MIB // data[0].nbytes)  # 64 MiB slices, as the harness's other zrecord rows
            for i in range(0, len(data), step):
                w.append(data[i : i + step])
        else:
            w = RaggedWriter(path, data[0].dtype, data[0].ndim, codec=codec, dict_bytes=d, data_shards=shards)
            for i in range(0, len(data), 4096):  # 4096-record batches, as the harness's other zrecord rows
                w.append(RaggedBatch.from_records(data[i : i + 4096]))
        w.close()
        return {"seconds": time.perf_counter() - t0}

    def open(self, name, path, batch):
        store = (DenseStore if self.kind == "dense" else RaggedStore)(path)
        view = store.bind(self.allocator)
        n = len(store)
        for i in range(0, n, batch):  # one sequential warm sweep, as every backend gets
            view.__getitems__(np.arange(i, min(i + batch, n), dtype=np.uint64))
        self.views[name] = (store, view)
        return {"records": n}

    def gather(self, name, plan):
        """One round: every batch of the plan, each timed alone; digests after."""
        _, view = self.views[name]
        batches = np.load(plan)
        seconds, digests = [], []
        for idx in batches:
            t0 = time.perf_counter()
            out = view.__getitems__(idx)
            if self.kind == "dense":
                out = np.from_dlpack(out)  # zero-copy: the numpy array the caller uses
            seconds.append(time.perf_counter() - t0)
            digests.append(self.digests(out))
            del out
        return {"seconds": seconds, "digests": digests}

    def digests(self, out):
        if self.kind == "dense":
            rows = out.reshape(len(out), -1)
            shape = out.shape[1:]
            return [record_digest(shape, r.tobytes()) for r in rows]
        values = np.from_dlpack(out.values).view(np.uint8)
        itemsize = np.from_dlpack(out.values).dtype.itemsize
        cu = np.from_dlpack(out.cu_seqlens).astype(np.int64) * itemsize
        shapes = np.from_dlpack(out.shapes).tolist()
        return [record_digest(s, values[a:b].tobytes()) for a, b, s in zip(cu[:-1], cu[1:], shapes)]

    def close(self, name):
        store, _ = self.views.pop(name)
        store.close()
        return {}


def serve() -> None:
    worker = Worker()
    for line in sys.stdin:
        request = json.loads(line)
        op = request.pop("op")
        try:
            if op == "version":
                reply = {"loaderx": loaderx.__version__, "numpy": np.__version__, "python": sys.version.split()[0]}
            else:
                reply = getattr(worker, op)(**request)
        except Exception as e:  # reported to the parent, which fails the row
            reply = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(reply), flush=True)


def loader_run(spec: dict) -> dict:
    """One run of loader_bench's loaderx 2.8 case: Loader over the image and
    label stores (one CPU view each), CYCLIC Sampler, `workers` threads,
    prefetch 4; every next() turns the DLPack outputs into numpy arrays."""
    paths, batch = spec["paths"], spec["batch"]
    allocator = Allocator("cpu")
    image, label = DenseStore(paths["image28"]), DenseStore(paths["label28"])
    sampler = Sampler(len(image), batch, Sampler.Mode.CYCLIC, 42)
    loader = Loader(
        {"image": [image.bind(allocator)], "label": [label.bind(allocator)]},
        sampler,
        workers=spec["workers"],
        prefetch=4,
    )

    def get():
        (shard,) = next(loader)
        return {name: np.from_dlpack(t) for name, t in shard.items()}

    images = np.load(paths["npy"], mmap_mode="r")
    first = get()
    img, labels = first["image"], first["label"].reshape(-1)
    assert img.shape == (batch, 3, 224, 224), img.shape
    assert (img == images[labels]).all(), "batch images do not match their labels"
    check = int(np.bitwise_xor.reduce(np.ascontiguousarray(img).reshape(-1).view(np.uint64)))
    del first, img
    for _ in range(spec["warmup"]):
        get()
    lat = []
    t0 = time.perf_counter()
    for _ in range(spec["batches"]):
        t = time.perf_counter()
        b = get()
        lat.append(time.perf_counter() - t)
        del b
    total = time.perf_counter() - t0
    loader.close()
    return {"seconds": total, "latencies": lat, "digest": check}


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    elif sys.argv[1] == "loader":
        print(json.dumps(loader_run(json.loads(sys.argv[2]))))
    else:
        raise SystemExit(__doc__)
