"""Record stores (issue 9, comparison 5): zt.zrecord against loaderx 2.3.8,
loaderx 2.8.19 and the usual ways to keep training records on disk, on real
data.

Workloads (harness.stores_data says where the data comes from):
  * dense vision: N x uint8[3,224,224] resized crops of scikit-image's photographs;
  * ragged vision: N uint8[H,W,3] native-resolution crops, H and W in 64..512;
  * dense tokens: N x int32[512] GPT-2 tokens of real text;
  * ragged tokens: N records of 16..512 GPT-2 tokens (paragraphs).

Backends: zrecord raw / zstd / zstd_dict (zt, loaderx 2.3.8 and loaderx
2.8.19, 4 data shards, one dictionary trained by loaderx's train_dict for all,
untimed; zt keeps its own default levels: 3 for both, as loaderx; zt writes
its default layout, loaderx 2.8's, and for ragged workloads also reads with
`gather_packed`, the packed values + offsets + shapes that loaderx 2.8's
RaggedBatch is), npy-mmap (dense:
one .npy, `mm[idx]`; ragged: one flat values .npy + offsets + shapes), HDF5
(dense: chunks (1, *shape), one read_direct per record; ragged: one flat
dataset in 1 MiB chunks + offsets + shapes, one slice per record), LMDB (one
txn, 8-byte big-endian keys, no sync; one get per record), Arrow IPC (binary
column, 256-record batches, raw or zstd 3; memory-mapped, get_batch + take per
touched batch), Parquet (256-row groups, no dictionary, no statistics, raw or
zstd 3; read_row_group + take per touched group), ArrayRecord (group_size 1,
uncompressed or zstd 3; reader.read(list)). Byte stores keep a ragged record
as u64le shape + payload. Every backend returns numpy arrays it owns.

Method: writes are timed from create to close (encode, append, finalize; no
fsync), interleaved backend by backend for `write_rounds` rounds. Gathers: open,
one sequential warm sweep, then `rounds` rounds that alternate the backends;
each round replays the same `batches` IID batches of 256 (one fixed plan), and
every returned batch is checked outside the timer against the source arrays
(dtype, shapes, and a position-weighted 64-bit digest of every byte of every
record). Reported: logical (uncompressed) MiB/s and krecords/s from the median
round, IQR, p95 latency of one batch over every timed batch, bytes on disk
(st_blocks), ratio logical / disk. A backend whose package is missing is a
"missing" row. Each workload's files are deleted once it is measured.

loaderx 2.8.19 needs Python 3.12 and numpy 2.5: it runs in its own process
(harness/loaderx28.py), loads the same records from files once per
workload, and times its own writes (create to close) and gathers (each
`view.__getitems__(idx)`, dense outputs turned into numpy arrays with
`np.from_dlpack`; ragged outputs stay a packed RaggedBatch); it takes its
turn in the same interleaved rounds, and every batch it returns is checked
against the source records (a blake2b digest per record, outside the timer).

    python -m harness --only stores [--quick]
    python -m harness.stores_bench --vision 2500 --tokens 200000 --ragged 200000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from typing import Callable

import numpy as np

from . import common, loaderx28, report, stores_data

MIB = 1 << 20
GROUP = 256  # Arrow / Parquet batch size, as loaderx's bench

# ---- record <-> bytes for the byte stores ---------------------------------------------


def to_bytes(rec: np.ndarray, dense: bool) -> bytes:
    if dense:
        return rec.tobytes()
    return np.asarray(rec.shape, "<u8").tobytes() + rec.tobytes()


def from_bytes(buf, dtype, ndim: int) -> np.ndarray:
    """A ragged record from `u64le shape + payload` (copied: the caller may reuse buf)."""
    shape = np.frombuffer(buf, "<u8", ndim)
    return np.frombuffer(buf, dtype, offset=8 * ndim).reshape(shape).copy()


class Spec:
    """What a store holds: dense (dtype, item shape) or ragged (dtype, ndim)."""

    def __init__(self, data):
        self.dense = isinstance(data, np.ndarray)
        self.n = len(data)
        first = data[0]
        self.dtype, self.shape, self.ndim = first.dtype, first.shape, first.ndim
        self.logical = data.nbytes if self.dense else sum(r.nbytes for r in data)


def fill_dense(spec: Spec, bufs) -> np.ndarray:
    out = np.empty((len(bufs), *spec.shape), spec.dtype)
    flat = out.reshape(len(bufs), -1).view(np.uint8)
    for k, b in enumerate(bufs):
        flat[k] = np.frombuffer(b, np.uint8)
    return out


def decode(spec: Spec, bufs):
    if spec.dense:
        return fill_dense(spec, bufs)
    return [from_bytes(b, spec.dtype, spec.ndim) for b in bufs]


# ---- backends: write(path, data, spec) and open(path, spec) -> (gather, close) --------


def zrecord_backend(lib: str, codec: str):
    def write(path, data, spec, dict_bytes=None):
        if lib == "zt":
            from zt.zrecord import Dense, Ragged
        else:
            from loaderx.zrecord import Dense, Ragged
        d = dict_bytes if codec == "zstd_dict" else None
        if spec.dense:
            with Dense.create(path, spec.dtype, spec.shape, codec=codec, dict_bytes=d, data_shards=4) as w:
                step = max(1, 64 * MIB // data[0].nbytes)  # 64 MiB slices, as loaderx's bench
                for i in range(0, len(data), step):
                    w.append(data[i : i + step])
        else:
            with Ragged.create(path, spec.dtype, spec.ndim, codec=codec, dict_bytes=d, data_shards=4) as w:
                for i in range(0, len(data), 4096):  # 4096-record batches, as loaderx's bench
                    w.append(data[i : i + 4096])

    def open_(path, spec):
        if lib == "zt":
            from zt.zrecord import Dense, Ragged
        else:
            from loaderx.zrecord import Dense, Ragged
        store = (Dense if spec.dense else Ragged).open(path)
        return store.__getitem__, store.close

    write.needs_dict = codec == "zstd_dict"
    return write, open_


class Packed(tuple):
    """zt's `gather_packed` output (values, offsets, shapes): checked as the
    records it packs."""

    def records(self):
        values, offsets, shapes = self
        bounds = offsets.tolist()
        return [values[a:b].reshape(s) for a, b, s in zip(bounds[:-1], bounds[1:], map(tuple, shapes.tolist()))]


def zt_packed_backend(codec: str):
    """Reads the `zrecord <codec>` row's store (written once, by that row)."""

    def write(path, data, spec, dict_bytes=None):
        return 0.0

    def open_(path, spec):
        from zt.zrecord import Ragged

        store = Ragged.open(path.with_name(path.name.removesuffix("-(packed)")))
        return (lambda idx: Packed(store.gather_packed(idx))), store.close

    return write, open_


# ---- loaderx 2.8.19, in its own process -----------------------------------------------

LX28 = "loaderx 2.8.19"


class Lx28Session:
    """The worker and the workload it holds (one per workload)."""

    worker = None
    dict_file = None


def lx28_backend(codec: str):
    def write(path, data, spec, dict_bytes=None):
        dict_file = Lx28Session.dict_file if codec == "zstd_dict" else None
        r = Lx28Session.worker.call("write", path=os.fspath(path), codec=codec, dict=dict_file, shards=4)
        return float(r["seconds"])  # the worker's own timing replaces the round trip's

    def open_(path, spec):
        name = os.fspath(path)
        Lx28Session.worker.call("open", name=name, path=name, batch=256)
        return RemoteGather(name), lambda: Lx28Session.worker.call("close", name=name)

    write.needs_dict = codec == "zstd_dict"
    return write, open_


class RemoteGather:
    """One gather round run by the loaderx 2.8 worker."""

    def __init__(self, name: str):
        self.name = name

    def round(self, plan_file) -> dict:
        return Lx28Session.worker.call("gather", name=self.name, plan=os.fspath(plan_file))


def lx28_start(data, spec: Spec, base, dict_bytes) -> None:
    """Hand the workload to a fresh worker: records to files, loaded there once."""
    where = base / "lx28-data"
    where.mkdir()
    if spec.dense:
        np.save(where / "data.npy", data)
    else:
        sizes = np.fromiter((r.nbytes for r in data), np.uint64, len(data))
        np.save(
            where / "values.npy", np.concatenate([np.ascontiguousarray(r).reshape(-1).view(np.uint8) for r in data])
        )
        np.save(where / "ends.npy", np.cumsum(sizes))
        np.save(where / "shapes.npy", np.array([r.shape for r in data], np.uint64))
        (where / "dtype").write_text(spec.dtype.str)
    Lx28Session.dict_file = None
    if dict_bytes is not None:
        (where / "dict.zr").write_bytes(dict_bytes)
        Lx28Session.dict_file = os.fspath(where / "dict.zr")
    Lx28Session.worker = loaderx28.Worker()
    Lx28Session.worker.call("load", kind="dense" if spec.dense else "ragged", dir=os.fspath(where))


def lx28_stop() -> None:
    if Lx28Session.worker is not None:
        Lx28Session.worker.close()
        Lx28Session.worker = None


def blake_digests(data, spec: Spec) -> np.ndarray:
    """The worker's record digest (blake2b of the shape as <u8 and the bytes) of every source record."""
    import hashlib

    out = np.empty(spec.n, np.uint64)
    for i, rec in enumerate(data):
        h = hashlib.blake2b(np.asarray(rec.shape, "<u8").tobytes(), digest_size=8)
        h.update(np.ascontiguousarray(rec).tobytes())
        out[i] = int.from_bytes(h.digest(), "little")
    return out


def npy_write(path, data, spec, dict_bytes=None):
    path.mkdir()
    if spec.dense:
        mm = np.lib.format.open_memmap(path / "data.npy", mode="w+", dtype=spec.dtype, shape=data.shape)
        mm[:] = data
        mm.flush()
        del mm
        return
    sizes = np.fromiter((r.size for r in data), np.int64, len(data))
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    mm = np.lib.format.open_memmap(path / "values.npy", mode="w+", dtype=spec.dtype, shape=(int(offsets[-1]),))
    for r, a, b in zip(data, offsets[:-1], offsets[1:]):
        mm[a:b] = r.reshape(-1)
    mm.flush()
    del mm
    np.save(path / "offsets.npy", offsets)
    np.save(path / "shapes.npy", np.asarray([r.shape for r in data], np.int64))


def npy_open(path, spec):
    if spec.dense:
        mm = np.load(path / "data.npy", mmap_mode="r")
        return mm.__getitem__, lambda: None
    values = np.load(path / "values.npy", mmap_mode="r")
    offsets, shapes = np.load(path / "offsets.npy"), np.load(path / "shapes.npy")

    def gather(idx):
        return [np.array(values[offsets[i] : offsets[i + 1]]).reshape(shapes[i]) for i in idx]

    return gather, lambda: None


def h5_write(path, data, spec, dict_bytes=None):
    import h5py

    with h5py.File(path, "w") as f:
        if spec.dense:
            ds = f.create_dataset("data", shape=data.shape, dtype=spec.dtype, chunks=(1, *spec.shape))
            step = max(1, 64 * MIB // data[0].nbytes)
            for i in range(0, len(data), step):
                ds[i : i + step] = data[i : i + step]
            return
        sizes = np.fromiter((r.size for r in data), np.int64, len(data))
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        chunk = max(1, min(MIB // spec.dtype.itemsize, int(offsets[-1])))
        ds = f.create_dataset("values", shape=(int(offsets[-1]),), dtype=spec.dtype, chunks=(chunk,))
        step = 4096
        for i in range(0, len(data), step):
            ds[offsets[i] : offsets[min(i + step, len(data))]] = np.concatenate(
                [r.reshape(-1) for r in data[i : i + step]]
            )
        f.create_dataset("offsets", data=offsets)
        f.create_dataset("shapes", data=np.asarray([r.shape for r in data], np.int64))


def h5_open(path, spec):
    import h5py

    f = h5py.File(path, "r")
    if spec.dense:
        ds = f["data"]

        def gather(idx):
            out = np.empty((len(idx), *spec.shape), spec.dtype)
            for k, i in enumerate(idx):  # fancy selection is far slower (loaderx measured ~48x)
                ds.read_direct(out, np.s_[int(i)], np.s_[k])
            return out

        return gather, f.close
    values, offsets, shapes = f["values"], f["offsets"][:], f["shapes"][:]

    def gather_ragged(idx):
        return [values[offsets[i] : offsets[i + 1]].reshape(shapes[i]) for i in idx]

    return gather_ragged, f.close


def lmdb_write(path, data, spec, dict_bytes=None):
    import lmdb

    env = lmdb.open(str(path), map_size=max(4 * spec.logical, 64 * MIB), sync=False, metasync=False)
    with env.begin(write=True) as txn:
        for i, r in enumerate(data):
            txn.put(i.to_bytes(8, "big"), to_bytes(r, spec.dense), append=True)
    env.close()


def lmdb_open(path, spec):
    import lmdb

    env = lmdb.open(str(path), readonly=True, lock=False)

    def gather(idx):
        with env.begin(buffers=True) as txn:  # memoryviews into the map, copied by decode
            return decode(spec, [txn.get(int(i).to_bytes(8, "big")) for i in idx])

    return gather, env.close


def arrow_write(path, data, spec, dict_bytes=None, compression=None):
    import pyarrow as pa

    schema = pa.schema([("r", pa.binary())])
    opts = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 3) if compression else None)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema, options=opts) as w:
        for i in range(0, len(data), GROUP):
            w.write_batch(
                pa.record_batch(
                    [pa.array([to_bytes(r, spec.dense) for r in data[i : i + GROUP]], pa.binary())], schema=schema
                )
            )


def parquet_write(path, data, spec, dict_bytes=None, compression=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("r", pa.binary())])
    kw = dict(use_dictionary=False, write_statistics=False, compression="zstd" if compression else "none")
    if compression:
        kw["compression_level"] = 3
    with pq.ParquetWriter(str(path), schema, **kw) as w:
        for i in range(0, len(data), GROUP):
            batch = pa.record_batch(
                [pa.array([to_bytes(r, spec.dense) for r in data[i : i + GROUP]], pa.binary())], schema=schema
            )
            w.write_batch(batch, row_group_size=GROUP)


def take_grouped(spec: Spec, idx: np.ndarray, load_group: Callable[[int], object]):
    """Gather through fixed 256-record groups: load each touched group once, take its rows."""
    groups = idx // GROUP
    out = np.empty((len(idx), *spec.shape), spec.dtype) if spec.dense else [None] * len(idx)
    for g in np.unique(groups):
        where = np.flatnonzero(groups == g)
        col = load_group(int(g)).take(idx[where] - g * GROUP)
        offsets = np.frombuffer(col.buffers()[1], np.int32)[col.offset : col.offset + len(col) + 1]
        values = np.frombuffer(col.buffers()[2], np.uint8)
        if spec.dense:
            out[where] = values[offsets[0] : offsets[-1]].view(spec.dtype).reshape(len(where), *spec.shape)
        else:
            for k, a, b in zip(where, offsets[:-1], offsets[1:]):
                out[k] = from_bytes(values[a:b], spec.dtype, spec.ndim)
    return out


def arrow_open(path, spec):
    import pyarrow as pa

    source = pa.memory_map(str(path))
    reader = pa.ipc.open_file(source)
    return (lambda idx: take_grouped(spec, idx, lambda g: reader.get_batch(g).column(0))), source.close


def parquet_open(path, spec):
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(str(path), memory_map=True)
    load = lambda g: pf.read_row_group(g).column(0).combine_chunks()  # noqa: E731
    return (lambda idx: take_grouped(spec, idx, load)), pf.close


def arrayrecord_write(path, data, spec, dict_bytes=None, compression=None):
    from array_record.python.array_record_module import ArrayRecordWriter

    w = ArrayRecordWriter(str(path), "group_size:1," + ("zstd:3" if compression else "uncompressed"))
    for r in data:
        w.write(to_bytes(r, spec.dense))
    w.close()


def arrayrecord_open(path, spec):
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(str(path), "readahead_buffer_size:0")
    return (lambda idx: decode(spec, reader.read([int(i) for i in idx]))), reader.close


def with_compression(fn, compression):
    return lambda path, data, spec, dict_bytes=None: fn(path, data, spec, dict_bytes, compression)


# name -> (module that must import, write, open); LX28_MODULE: the loaderx 2.8 worker
LX28_MODULE = "<loaderx 2.8.19 worker>"
BACKENDS: dict[str, tuple[str, Callable, Callable]] = {}
for _codec in ["raw", "zstd", "zstd_dict"]:
    BACKENDS[f"zrecord {_codec}"] = ("zt.zrecord", *zrecord_backend("zt", _codec))
for _codec in ["raw", "zstd"]:
    BACKENDS[f"zrecord {_codec} (packed)"] = ("zt.zrecord", *zt_packed_backend(_codec))
for _codec in ["raw", "zstd", "zstd_dict"]:
    BACKENDS[f"loaderx 2.3.8 {_codec}"] = ("loaderx.zrecord", *zrecord_backend("loaderx", _codec))
for _codec in ["raw", "zstd", "zstd_dict"]:
    BACKENDS[f"{LX28} {_codec}"] = (LX28_MODULE, *lx28_backend(_codec))
# Rows that only ragged workloads have (zt's packed gather, loaderx 2.8's output shape).
RAGGED_ONLY = {"zrecord raw (packed)", "zrecord zstd (packed)"}
BACKENDS["npy-mmap"] = ("numpy", npy_write, npy_open)
BACKENDS["hdf5"] = ("h5py", h5_write, h5_open)
BACKENDS["lmdb"] = ("lmdb", lmdb_write, lmdb_open)
for _c in [None, "zstd"]:
    _s = f" {_c}" if _c else " raw"
    BACKENDS["arrow-ipc" + _s] = ("pyarrow", with_compression(arrow_write, _c), arrow_open)
    BACKENDS["parquet" + _s] = ("pyarrow.parquet", with_compression(parquet_write, _c), parquet_open)
    BACKENDS["arrayrecord" + _s] = (
        "array_record.python.array_record_module",
        with_compression(arrayrecord_write, _c),
        arrayrecord_open,
    )
PEER = "zrecord raw"


def available() -> dict[str, str | None]:
    """name -> None if importable, else why not."""
    import importlib

    out = {}
    lx28 = loaderx28.missing()
    for name, (mod, _, _) in BACKENDS.items():
        if mod == LX28_MODULE:
            out[name] = lx28
            continue
        try:
            importlib.import_module(mod)
            out[name] = None
        except ImportError as e:
            out[name] = f"missing ({type(e).__name__}: {e})"
    return out


# ---- verification -------------------------------------------------------------------


_WEIGHTS = np.zeros(0, np.uint64)


def weights(n: int) -> np.ndarray:
    """Odd 64-bit multipliers, one per word position (grown and cached)."""
    global _WEIGHTS
    if _WEIGHTS.size < n:
        size = max(n, 2 * _WEIGHTS.size)
        _WEIGHTS = (np.arange(1, size + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)) | np.uint64(1)
    return _WEIGHTS[:n]


def record_digest(rec: np.ndarray) -> int:
    """A position-weighted 64-bit fold of every byte: catches swapped words and records."""
    raw = np.ascontiguousarray(rec).reshape(-1).view(np.uint8)
    tail = raw.size % 8
    words = raw[: raw.size - tail].view(np.uint64)
    acc = int(np.bitwise_xor.reduce(words * weights(words.size))) if words.size else 0
    for k, b in enumerate(raw[raw.size - tail :].tolist()):
        acc ^= b << (8 * k + 3)
    return acc ^ (hash(rec.shape) & (2**64 - 1))


def dense_digests(batch: np.ndarray) -> np.ndarray:
    """record_digest of every row at once (when rows are whole 8-byte words)."""
    rows = np.ascontiguousarray(batch).reshape(len(batch), -1).view(np.uint8)
    if rows.shape[1] % 8:
        return np.array([record_digest(r) for r in batch], np.uint64)
    words = rows.view(np.uint64)
    shape_hash = np.uint64(hash(batch.shape[1:]) & (2**64 - 1))
    return np.bitwise_xor.reduce(words * weights(words.shape[1]), axis=1) ^ shape_hash


def source_digests(data, spec: Spec) -> np.ndarray:
    if spec.dense:
        return np.concatenate([dense_digests(data[i : i + 256]) for i in range(0, len(data), 256)])
    return np.array([record_digest(r) for r in data], np.uint64)


def check(out, idx: np.ndarray, expected: np.ndarray, spec: Spec, name: str) -> int:
    """Exact values: dtype, shape, and every record's digest against the source's. Returns logical bytes."""
    if isinstance(out, Packed):
        out = out.records()
    if spec.dense:
        assert isinstance(out, np.ndarray) and out.dtype == spec.dtype, f"{name}: wrong type/dtype"
        assert out.shape == (len(idx), *spec.shape), f"{name}: shape {out.shape}"
        got = dense_digests(out)
        nbytes = out.nbytes
    else:
        assert len(out) == len(idx), f"{name}: {len(out)} records for {len(idx)} indices"
        assert all(np.asarray(r).dtype == spec.dtype for r in out), f"{name}: wrong dtype"
        got = np.array([record_digest(np.asarray(r)) for r in out], np.uint64)
        nbytes = sum(np.asarray(r).nbytes for r in out)
    assert np.array_equal(got, expected[idx]), f"{name} returned wrong bytes"
    return nbytes


# ---- measurement ---------------------------------------------------------------------


def disk_bytes(path) -> int:
    if os.path.isfile(path):
        return os.stat(path).st_blocks * 512
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


def remove(path) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


def bench_workload(label, data, base, names, write_rounds, rounds, batches, batch):
    """Write every backend (interleaved), then gather (interleaved). Returns per-backend stats."""
    import loaderx.utils

    spec = Spec(data)
    if spec.dense:
        names = [n for n in names if n not in RAGGED_ONLY]
    dict_bytes = (
        loaderx.utils.train_dict(data) if any(BACKENDS[n][1].__dict__.get("needs_dict") for n in names) else None
    )
    remote = [n for n in names if BACKENDS[n][0] == LX28_MODULE]
    if remote:
        lx28_start(data, spec, base, dict_bytes)
    t_start = time.perf_counter()
    paths = {n: base / n.replace(" ", "-") for n in names}
    writes = {n: [] for n in names}
    for _ in range(write_rounds):
        for n in names:
            remove(paths[n])
            # No case starts with another's dirty pages still being written
            # back (the kernel's flusher shares the cores, and a writer past
            # the dirty limit is throttled): untimed, before every case.
            os.sync()
            t0 = time.perf_counter()
            own = BACKENDS[n][1](paths[n], data, spec, dict_bytes)
            writes[n].append(own if isinstance(own, float) else time.perf_counter() - t0)
    disk = {n: disk_bytes(paths[n]) for n in names}
    os.sync()  # the gathers below, too, start with nothing left to write back
    t_written = time.perf_counter()
    expected = source_digests(data, spec)
    expected_blake = blake_digests(data, spec) if remote else None
    sizes = np.full(spec.n, spec.logical // spec.n) if spec.dense else np.array([r.nbytes for r in data])
    rng = np.random.default_rng(7)
    plan = [rng.integers(0, spec.n, batch) for _ in range(batches)]
    plan_file = base / "plan.npy"
    np.save(plan_file, np.array(plan, np.uint64))
    logical = None
    readers = {}
    for n in names:
        gather, close = BACKENDS[n][2](paths[n], spec)
        if not isinstance(gather, RemoteGather):  # the worker warms its own on open
            for i in range(0, spec.n, batch):  # one sequential warm sweep
                gather(np.arange(i, min(i + batch, spec.n)))
        readers[n] = (gather, close)
    per_round = {n: [] for n in names}
    lat = {n: [] for n in names}
    for _ in range(rounds):
        for n in names:
            gather = readers[n][0]
            elapsed, nbytes = 0.0, 0
            if isinstance(gather, RemoteGather):
                r = gather.round(plan_file)
                for idx, dt, got in zip(plan, r["seconds"], r["digests"]):
                    assert np.array_equal(np.array(got, np.uint64), expected_blake[idx]), f"{n} returned wrong bytes"
                    elapsed += dt
                    lat[n].append(dt)
                    nbytes += int(sizes[idx].sum())
            else:
                for idx in plan:
                    t0 = time.perf_counter()
                    out = gather(idx)
                    dt = time.perf_counter() - t0
                    elapsed += dt
                    lat[n].append(dt)
                    nbytes += check(out, idx, expected, spec, n)
                    del out
            per_round[n].append(elapsed)
            assert logical in (None, nbytes)
            logical = nbytes
    for n in names:
        readers[n][1]()
        remove(paths[n])
    lx28_stop()
    t_end = time.perf_counter()
    print(
        f"[stores] {label}: dictionary + writes {t_written - t_start:.1f} s, reads {t_end - t_written:.1f} s",
        flush=True,
    )
    return spec, writes, disk, per_round, lat, logical


LOAD = common.LoadWindow()


def is_record_store(name: str) -> bool:
    """zt.zrecord's rows and loaderx's (2.3.8 and 2.8.19): what --zrecord-only keeps."""
    return name.startswith(("zrecord ", "loaderx ", f"{LX28} "))


def run(
    vision: int,
    tokens: int,
    ragged: int,
    runs: int,
    write_rounds: int,
    batches: int,
    batch: int = 256,
    zrecord_only: bool = False,
):
    """Every workload in turn; `runs` gather rounds, `batches` IID batches per round (a quarter of them for vision).
    `zrecord_only`: only zt.zrecord against loaderx 2.3.8 and 2.8.19, the other stores left out."""
    root = common.bench_dir("stores")
    LOAD.begin()
    why = available()
    if zrecord_only:
        why = {n: w for n, w in why.items() if is_record_store(n)}
    names = [n for n, w in why.items() if w is None]
    workloads = [
        ("dense vision", lambda: (stores_data.vision_dense(vision), None), max(1, batches // 4)),
        ("ragged vision", lambda: (stores_data.vision_ragged(vision), None), max(1, batches // 4)),
        ("dense tokens", lambda: stores_data.tokens_dense(tokens), batches),
        ("ragged tokens", lambda: stores_data.tokens_ragged(ragged), batches),
    ]
    results = []
    for label, make, nb in workloads:
        t0 = time.perf_counter()
        data, meta = make()
        print(f"[stores] {label}: data in {time.perf_counter() - t0:.1f} s", flush=True)
        base = root / label.replace(" ", "-")
        remove(base)
        base.mkdir()
        spec, writes, disk, per_round, lat, logical = bench_workload(
            label, data, base, names, write_rounds, runs, nb, batch
        )
        del data
        remove(base)
        results += tables(label, spec, meta, why, writes, disk, per_round, lat, logical, nb, batch)
    LOAD.finish()
    return results


def zt_row_of(name: str) -> str | None:
    """zt's row of a loaderx row's codec ("loaderx 2.3.8 zstd" -> "zrecord zstd"), else None."""
    for prefix in ("loaderx 2.3.8 ", f"{LX28} "):
        if name.startswith(prefix):
            return "zrecord " + name[len(prefix) :]
    return None


def describe(label: str, spec: Spec, meta) -> str:
    mib = spec.logical / MIB
    if spec.dense:
        return f"{label}: {spec.n:,} x {spec.dtype}[{','.join(map(str, spec.shape))}] ({mib:.1f} MiB)"
    return f"{label}: {spec.n:,} {spec.dtype} records, ndim {spec.ndim} ({mib:.1f} MiB)"


def tables(label, spec, meta, why, writes, disk, per_round, lat, logical, batches, batch):
    order = [n for n in BACKENDS if n in why and not (spec.dense and n in RAGGED_ONLY)]
    gather_samples = {n: per_round.get(n, []) for n in order}
    write_samples = {n: writes.get(n, []) for n in order if n not in RAGGED_ONLY}
    g_extra, w_extra = {}, {}
    for n in order:
        if why[n] is not None:
            g_extra[n] = w_extra[n] = {"median": why[n]}
            continue
        if n in RAGGED_ONLY:  # the same store as its list-returning row: no write row of its own
            med = common.summary(per_round[n])[0]
            g_extra[n] = {
                "MiB/s": f"{logical / MIB / med:.0f}",
                "krec/s": f"{batch * batches / med / 1e3:.1f}",
                "p95 batch": f"{statistics.quantiles(lat[n], n=20)[-1] * 1e3:.2f} ms" if len(lat[n]) > 1 else "",
            }
            continue
        med = common.summary(per_round[n])[0]
        g_extra[n] = {
            "MiB/s": f"{logical / MIB / med:.0f}",
            "krec/s": f"{batch * batches / med / 1e3:.1f}",
            "p95 batch": f"{statistics.quantiles(lat[n], n=20)[-1] * 1e3:.2f} ms" if len(lat[n]) > 1 else "",
        }
        wmed = common.summary(writes[n])[0]
        w_extra[n] = {
            "MiB/s": f"{spec.logical / MIB / wmed:.0f}",
            "disk MiB": f"{disk[n] / MIB:.1f}",
            "logical/disk": f"{spec.logical / disk[n]:.2f}×",
        }
        # A loaderx row against zt's row of the same codec (the same bytes on disk).
        mine = zt_row_of(n)
        if mine is not None and why.get(mine) is None and per_round.get(mine) and writes.get(mine):
            g_extra[n]["zt / this"] = f"{med / common.summary(per_round[mine])[0]:.2f}×"
            w_extra[n]["zt / this"] = f"{wmed / common.summary(writes[mine])[0]:.2f}×"
    notes = data_notes(label, spec, meta)
    if not spec.dense:
        notes.append(
            "`(packed)`: zt's `gather_packed` (one values buffer + offsets + shapes, no per-record arrays), "
            "the output shape of loaderx 2.8.19's ragged reads (a RaggedBatch); the other zrecord and loaderx "
            "2.3.8 rows return a list of per-record arrays."
        )
    return [
        report.Result(
            "stores",
            f"Gather, {describe(label, spec, meta)}: {batches} IID batch(es) of {batch} per round",
            gather_samples,
            peer=PEER,
            nbytes=logical,
            notes=notes,
            extra=g_extra,
        ),
        report.Result(
            "stores",
            f"Write, {describe(label, spec, meta)}",
            write_samples,
            peer=PEER,
            nbytes=spec.logical,
            extra=w_extra,
        ),
    ]


def data_notes(label, spec, meta) -> list[str]:
    if "vision" in label:
        photos = ", ".join(stores_data.photographs())
        how = (
            "random crops resized to 224×224 (PIL bilinear), random flip, CHW"
            if spec.dense
            else "random native-resolution crops, H and W lognormal (median 224, σ 0.45) clipped to 64..512, HWC"
        )
        return [f"Data: real photographs shipped in the scikit-image wheel ({photos}): {how}."]
    cycled = (
        f" The text gave fewer tokens than needed, so the stream repeats {meta['cycled']}×."
        if meta.get("cycled")
        else ""
    )
    shape = ""
    if not spec.dense:
        shape = " Records are paragraphs (blank-line separated); fragments under 16 tokens carry forward, longer ones split at 512."
    return [
        f"Data: {meta['text']}: {meta['files']:,} files, {meta['text_bytes'] / MIB:.0f} MiB of text, "
        f"{meta['tokens']:,} tokens (sha256 {meta['sha256'][:12]}). Tokenizer: {meta['tokenizer']}, "
        f"checked against llama.cpp's test vectors.{shape}{cycled}"
    ]


def header(runs: int, zrecord_only: bool = False) -> str:
    v = common.versions("numpy", "loaderx", "h5py", "lmdb", "pyarrow", "array-record", "scikit-image", "tokenizers")
    lx28 = loaderx28.versions() if loaderx28.missing() is None else {"loaderx": "missing", "numpy": "-", "python": "-"}
    base = common.bench_dir("stores")
    return (
        (
            "## Record stores: zt.zrecord against loaderx 2.3.8 and 2.8.19 (the other stores: results/stores.md)\n\n"
            if zrecord_only
            else "## Record stores: zt.zrecord against loaderx 2.3.8 and 2.8.19, npy-mmap, HDF5, LMDB, Arrow IPC, "
            "Parquet, ArrayRecord\n\n"
        )
        + ", ".join(f"{k} {val}" for k, val in v.items())
        + f"; loaderx {lx28['loaderx']} (numpy {lx28['numpy']}, Python {lx28['python']}, its own process)"
        + f". Filesystem {common.filesystem_of(base)}, warm page cache. {runs} gather rounds (each replays the same "
        "IID batches for every backend, backends alternating), median and IQR of the time per round; p95 over "
        "every timed batch. Write: create to close, no fsync, rounds alternating; each write and the gathers "
        "start with no dirty pages (`os.sync()` before each, untimed). `vs zrecord raw` = zrecord raw's "
        "median time / the row's; `zt / this` = a loaderx row's median time / zt's row of the same codec. "
        "zrecord zstd is level 3; zstd_dict uses loaderx's 32 KiB dictionary for both, "
        "both at level 3 (harness/zrecord_bench.py also runs zt at loaderx 2.3.5's 15). HDF5 ragged is one "
        "flat dataset + offsets (not vlen). Every gathered batch is checked against the source records (digest "
        f"of every byte, outside the timer). {os.cpu_count()} cores." + LOAD.sentence()
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vision", type=int, default=2500)
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--ragged", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--write-rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--out", default="stores")
    ap.add_argument(
        "--zrecord-only",
        action="store_true",
        help="only zt.zrecord against loaderx 2.3.8 and 2.8.19 (e.g. --out stores-zrecord)",
    )
    args = ap.parse_args()
    t0 = time.perf_counter()
    results = run(
        args.vision,
        args.tokens,
        args.ragged,
        args.rounds,
        args.write_rounds,
        args.batches,
        zrecord_only=args.zrecord_only,
    )
    print(report.save(results, args.out, header(args.rounds, args.zrecord_only)).read_text())
    print(f"[stores: {time.perf_counter() - t0:.0f} s]")


if __name__ == "__main__":
    main()
