"""loaderx 2.8.19's half of tests/test_loaderx28.py, run by the Python 3.12
interpreter of .venv-loaderx28 (loaderx 2.8 needs Python >= 3.12 and
numpy >= 2.5, so it cannot be imported next to zt's test suite).

    .venv-loaderx28/bin/python tests/loaderx28_helper.py JOBS.json RESULTS.json

JOBS.json is a list of jobs; RESULTS.json gets one result per job, in order:

* ``{"op": "write", "geometry": "dense"|"ragged", "path", "dtype", "item_shape"
  | "ndim", "codec", "data_shards", "dict": file or null, "records": .npz,
  "splits": [i, ...]}``: build a store with loaderx's DenseWriter /
  RaggedWriter, one append per slice between the splits. Dense records are
  ``x`` in the .npz; ragged records are ``values`` (bytes), ``shapes`` and
  ``ends`` (byte offsets). Result: ``{"ok": true}``.
* ``{"op": "read", "geometry", "path", "out": .npz}``: open with
  DenseStore / RaggedStore, gather every record through a CPU view and save
  the bytes (``values`` as uint8, ``shapes``); result: the store's length,
  dtype name, item_shape/ndim, codec and data_shards, or ``{"error": ...}``
  when loaderx refuses the store.
* ``{"op": "train_dict", "geometry", "path", "out"}``: loaderx's train_dict
  on a CPU view of the store, written to ``out``.
* ``{"op": "sampler", "cases": [[mode, length, batch, seed, [step, ...]], ...]}``:
  loaderx's Sampler, ``seek(step)`` then ``next()`` for each step; result:
  the batches as lists of ints.

Nothing here imports zt: every comparison happens in the main suite.

    .venv-loaderx28/bin/python tests/loaderx28_helper.py hold-reader PATH
    .venv-loaderx28/bin/python tests/loaderx28_helper.py hold-writer PATH

hold a DenseStore open (or a DenseWriter with three uint8[2] rows appended,
closed at the end), print "ready" and wait for stdin to close: the lock
tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import loaderx
import numpy as np
from loaderx import Allocator
from loaderx.sampler import Sampler
from loaderx.zrecord import DenseStore, DenseWriter, RaggedBatch, RaggedStore, RaggedWriter, train_dict

assert loaderx.__version__ == "2.8.19", loaderx.__version__


def ragged_records(npz, dtype):
    values, shapes, ends = npz["values"], npz["shapes"], npz["ends"]
    starts = np.concatenate([np.zeros(1, ends.dtype), ends[:-1]])
    return [
        values[a:b].view(dtype).reshape(tuple(int(d) for d in shape))
        for a, b, shape in zip(starts.tolist(), ends.tolist(), shapes)
    ]


def write(job):
    npz = np.load(job["records"])
    dtype = np.dtype(job["dtype"])
    d = Path(job["dict"]).read_bytes() if job["dict"] else None
    options = {"codec": job["codec"], "dict_bytes": d, "data_shards": job["data_shards"]}
    if job["geometry"] == "dense":
        x = npz["x"].view(dtype).reshape(-1, *job["item_shape"])
        writer = DenseWriter(job["path"], dtype, tuple(job["item_shape"]), **options)
        pieces = np.split(x, job["splits"])
        append = writer.append
    else:
        recs = ragged_records(npz, dtype)
        writer = RaggedWriter(job["path"], dtype, job["ndim"], **options)
        cuts = [0, *job["splits"], len(recs)]
        pieces = [recs[a:b] for a, b in zip(cuts[:-1], cuts[1:])]

        def append(part):
            writer.append(RaggedBatch.from_records(part))

    for piece in pieces:
        append(piece)
    writer.close()
    return {"ok": True}


def view(job, allocator):
    cls = DenseStore if job["geometry"] == "dense" else RaggedStore
    store = cls(job["path"])
    return store, store.bind(allocator)


def read(job, allocator):
    try:
        store, v = view(job, allocator)
    except Exception as e:  # loaderx's refusal is the result
        return {"error": f"{type(e).__name__}: {e}", "code": getattr(e, "code", None)}
    n = len(store)
    meta = {"len": n, "dtype": store.dtype.name, "codec": store.codec, "data_shards": store.data_shards}
    idxs = np.arange(n, dtype=np.uint64)
    if job["geometry"] == "dense":
        meta["item_shape"] = list(store.item_shape)
        x = np.from_dlpack(v.__getitems__(idxs))
        np.savez(job["out"], values=x.reshape(-1).view(np.uint8), shapes=np.array(x.shape, np.uint64))
    else:
        meta["ndim"] = store.ndim
        batch = v.__getitems__(idxs)
        values = np.from_dlpack(batch.values)
        cu = np.from_dlpack(batch.cu_seqlens)
        shapes = np.from_dlpack(batch.shapes)
        np.savez(
            job["out"],
            values=values.view(np.uint8),
            ends=(cu[1:].astype(np.uint64) * store.dtype.itemsize),
            shapes=shapes.astype(np.uint64),
        )
    store.close()
    return meta


def train(job, allocator):
    store, v = view(job, allocator)
    d = train_dict(v)
    Path(job["out"]).write_bytes(d)
    store.close()
    return {"bytes": len(d)}


def sampler(job):
    out = []
    for mode, length, batch, seed, steps in job["cases"]:
        s = Sampler(length, batch, mode, seed)
        batches = []
        for step in steps:
            s.seek(step)
            batches.append([int(i) for i in s.next()])
        out.append(batches)
    return out


def hold(kind: str, path: str) -> None:
    if kind == "hold-reader":
        handle = DenseStore(path)
    else:
        handle = DenseWriter(path, np.uint8, (2,), codec="raw")
        handle.append(np.ones((3, 2), np.uint8))
    print("ready", flush=True)
    sys.stdin.read()
    handle.close()


def main() -> None:
    if sys.argv[1] in ("hold-reader", "hold-writer"):
        hold(sys.argv[1], sys.argv[2])
        return
    jobs = json.loads(Path(sys.argv[1]).read_text())
    allocator = Allocator("cpu")
    results = []
    for job in jobs:
        op = job["op"]
        if op == "write":
            results.append(write(job))
        elif op == "read":
            results.append(read(job, allocator))
        elif op == "train_dict":
            results.append(train(job, allocator))
        elif op == "sampler":
            results.append(sampler(job))
        else:
            raise SystemExit(f"unknown op {op!r}")
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
