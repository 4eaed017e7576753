"""zt against loaderx 2.8.19, the current loaderx release: stores both ways
(every geometry x codec, every dtype loaderx 2.8 holds), byte for byte, the
dictionary it trains, and its sampler streams.

loaderx 2.8 needs Python >= 3.12 and numpy >= 2.5, so its half runs in
.venv-loaderx28 (made by scripts/setup-loaderx28.sh, which scripts/test.sh
runs) as one subprocess per group of checks: tests/loaderx28_helper.py
builds and reads stores and draws batches there, and everything is compared
here, in zt's interpreter. The loaderx-2.3 layout against loaderx 2.3.8 is
tests/test_zrecord.py.
"""

from __future__ import annotations

import filecmp
import json
import os
import pathlib
import shutil
import struct
import subprocess

import numpy as np
import pytest

from zt.loader import CYCLIC, LOADERX_IID, SEQUENTIAL, Sampler
from zt.zrecord import Dense, Ragged, ZrecordError, train_dict

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-loaderx28" / "bin" / "python"
HELPER = ROOT / "tests" / "loaderx28_helper.py"
CODECS = ["raw", "zstd", "zstd_dict"]
# loaderx 2.8's dtypes (loaderx/dtypes.py), by name.
DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "complex64",
    "complex128",
]


def run_loaderx28(jobs: list, where: pathlib.Path) -> list:
    """Run `jobs` in loaderx 2.8.19's interpreter; its results, in order."""
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: run `bash scripts/setup-loaderx28.sh` (scripts/test.sh does)")
    job_file, result_file = where / "jobs.json", where / "results.json"
    job_file.write_text(json.dumps(jobs))
    proc = subprocess.run(
        [os.fspath(PYTHON), os.fspath(HELPER), os.fspath(job_file), os.fspath(result_file)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"loaderx 2.8.19 helper failed:\n{proc.stderr[-4000:]}")
    return json.loads(result_file.read_text())


def dtype_of(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: F401

        return np.dtype(name)


def values(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    """n compressible values of `dtype` (small integers, cast)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 2 if dtype == np.bool_ else 40, n)
    return small.astype(np.float32).astype(dtype)


class Case:
    """One store: geometry, dtype, rank, codec, shards; its records and the
    paths of zt's build and loaderx 2.8's."""

    def __init__(self, root, geometry, dtype, dims, codec, shards, n=150):
        self.geometry, self.dtype_name, self.codec, self.shards = geometry, dtype, codec, shards
        self.dtype = dtype_of(dtype)
        self.id = f"{geometry}-{dtype}-{codec}-{shards}" + ("" if dims in ((12,), 2) else f"-{dims}")
        self.dir = root / self.id
        self.dir.mkdir()
        self.zt, self.lx = self.dir / "zt", self.dir / "lx"
        if geometry == "dense":
            self.item_shape = dims
            self.x = values(self.dtype, n * int(np.prod(dims)), len(self.id)).reshape(n, *dims)
        else:
            self.ndim = dims
            rng = np.random.default_rng(len(self.id))
            self.recs = []
            for i in range(n):
                shape = tuple(int(d) for d in rng.integers(1, 6, dims))
                self.recs.append(values(self.dtype, int(np.prod(shape)), i).reshape(shape))
        self.dict = None
        if codec == "zstd_dict":
            self.dict = train_dict(self.x if geometry == "dense" else self.recs)
            (self.dir / "dict.bin").write_bytes(self.dict)

    def write_zt(self):
        options = {"codec": self.codec, "dict_bytes": self.dict, "data_shards": self.shards}
        if self.geometry == "dense":
            with Dense.create(self.zt, self.dtype, self.item_shape, **options) as w:
                w.append(self.x[:61])
                w.append(self.x[61:])
        else:
            with Ragged.create(self.zt, self.dtype, self.ndim, **options) as w:
                w.append(self.recs[:61])
                w.append(self.recs[61:])

    def jobs(self):
        records = self.dir / "records.npz"
        if self.geometry == "dense":
            np.savez(records, x=self.x.reshape(-1).view(np.uint8))
            dims = {"item_shape": list(self.item_shape)}
        else:
            sizes = [r.nbytes for r in self.recs]
            np.savez(
                records,
                values=np.concatenate([np.ascontiguousarray(r).reshape(-1).view(np.uint8) for r in self.recs]),
                shapes=np.array([r.shape for r in self.recs], np.uint64),
                ends=np.cumsum(sizes).astype(np.uint64),
            )
            dims = {"ndim": self.ndim}
        common = {"geometry": self.geometry}
        return [
            {
                "op": "write",
                "path": os.fspath(self.lx),
                "dtype": self.dtype_name,
                "codec": self.codec,
                "data_shards": self.shards,
                "dict": os.fspath(self.dir / "dict.bin") if self.dict else None,
                "records": os.fspath(records),
                "splits": [61],
                **common,
                **dims,
            },
            {"op": "read", "path": os.fspath(self.zt), "out": os.fspath(self.dir / "zt-read.npz"), **common},
            {"op": "read", "path": os.fspath(self.lx), "out": os.fspath(self.dir / "lx-read.npz"), **common},
        ]

    def expected_bytes(self):
        if self.geometry == "dense":
            return self.x.tobytes(), [len(self.x), *self.item_shape]
        return b"".join(np.ascontiguousarray(r).tobytes() for r in self.recs), [list(r.shape) for r in self.recs]


STORE_CASES = [("dense", "int32", (12,), c, s) for c in CODECS for s in (1, 4)] + [
    ("ragged", "int32", 2, c, s) for c in CODECS for s in (1, 4)
]
DTYPE_CASES = [("dense", d, (2, 3), "raw", 3) for d in DTYPES] + [
    ("dense", "float64", (), "zstd", 2),
    ("ragged", "uint8", 3, "zstd", 3),
    ("ragged", "bfloat16", 1, "raw", 2),
    ("ragged", "complex64", 2, "zstd_dict", 1),
    ("ragged", "bool", 1, "raw", 4),
]
ALL_CASES = STORE_CASES + DTYPE_CASES


def case_id(spec):
    geometry, dtype, dims, codec, shards = spec
    return f"{geometry}-{dtype}-{codec}-{shards}" + ("" if dims in ((12,), 2) else f"-{dims}")


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Every case built by zt and by loaderx 2.8.19, and read back by
    loaderx 2.8.19; plus loaderx 2.8's dictionaries and its verdict on a
    loaderx-2.3-layout store. One subprocess for all of it."""
    root = tmp_path_factory.mktemp("loaderx28")
    cases = {}
    jobs = []
    for spec in ALL_CASES:
        case = Case(root, *spec)
        case.write_zt()
        cases[case.id] = case
        jobs += case.jobs()
    old = root / "layout-2.3"
    with Dense.create(old, np.int32, (12,), layout="loaderx-2.3") as w:
        w.append(np.zeros((3, 12), np.int32))
    jobs.append({"op": "read", "geometry": "dense", "path": os.fspath(old), "out": os.fspath(root / "old.npz")})
    # Every corruption loaderx 2.3.8 refuses (tests/test_zrecord.py), applied
    # to a store loaderx 2.8 built the same bytes of.
    for name, corrupt in CORRUPTIONS.items():
        bad = root / "corrupt" / name.replace(" ", "-")
        shutil.copytree(cases["dense-int32-zstd-4"].zt, bad)
        corrupt(bad)
        jobs.append({"op": "read", "geometry": "dense", "path": os.fspath(bad), "out": os.fspath(bad / "x.npz")})
    dicts = ["dense-int32-raw-1", "ragged-int32-raw-1"]
    for name in dicts:
        jobs.append(
            {
                "op": "train_dict",
                "geometry": cases[name].geometry,
                "path": os.fspath(cases[name].lx),
                "out": os.fspath(root / f"{name}.dict"),
            }
        )
    results = run_loaderx28(jobs, root)
    per_case = {}
    for i, name in enumerate(cases):
        per_case[name] = results[3 * i : 3 * i + 3]
    at = 3 * len(cases)
    corrupt = dict(zip(CORRUPTIONS, results[at + 1 : at + 1 + len(CORRUPTIONS)]))
    return {
        "cases": cases,
        "results": per_case,
        "old": results[at],
        "corrupt": corrupt,
        "root": root,
        "dicts": dicts,
    }


def poke(path, at, data):
    with open(path / "meta.zr", "r+b") as f:
        f.seek(at)
        f.write(data)


def truncate(name, size):
    return lambda path: os.truncate(path / name, size)


CORRUPTIONS = {
    "truncated meta": truncate("meta.zr", 4095),
    "schema length 0": lambda p: poke(p, 8, struct.pack("<H", 0)),
    "schema length 2041": lambda p: poke(p, 8, struct.pack("<H", 2041)),
    "zero shards": lambda p: poke(p, 10, b"\0"),
    "unknown codec": lambda p: poke(p, 11, b"\x07"),
    "reserved byte": lambda p: poke(p, 13, b"\x01"),
    "inactive tail": lambda p: poke(p, 16 + 8 * 9, struct.pack("<Q", 1)),
    "short loc table": truncate("meta.zr", 4096 + 16 * 149),
    "short data file": truncate("data_1.zr", 10),
    "missing shard": lambda p: os.remove(p / "data_2.zr"),
    "extra shard": lambda p: (p / "data_4.zr").write_bytes(b""),
    "unexpected dict": lambda p: (p / "dict.zr").write_bytes(b"dict"),
}


def frames(store):
    """The meta.zr page and every record's stored frame, in record order
    (loaderx may place a shard's frames in completion order)."""
    meta = (store / "meta.zr").read_bytes()
    page, locs = meta[:4096], meta[4096:]
    count = sum(1 for f in os.listdir(store) if f.startswith("data_"))
    shards = [(store / f"data_{i}.zr").read_bytes() for i in range(count)]
    out = []
    for i in range(len(locs) // 16):
        offset, phys, logic = struct.unpack_from("<QII", locs, 16 * i)
        out.append((shards[i % len(shards)][offset : offset + phys], logic))
    return page, out


@pytest.mark.parametrize("spec", ALL_CASES, ids=case_id)
def test_zt_builds_loaderx28s_store_byte_for_byte(stores, spec):
    case = stores["cases"][case_id(spec)]
    assert stores["results"][case.id][0] == {"ok": True}
    assert sorted(os.listdir(case.zt)) == sorted(os.listdir(case.lx))
    assert frames(case.zt) == frames(case.lx)
    for name in os.listdir(case.lx):
        # Frames in logical order in each shard, as zt writes them: the files
        # are then identical too (loaderx's single small chunk per shard).
        assert filecmp.cmp(case.zt / name, case.lx / name, shallow=False), name


def check_read(result, npz, case):
    data, shapes = case.expected_bytes()
    assert result["len"] == (len(case.x) if case.geometry == "dense" else len(case.recs))
    assert (result["dtype"], result["codec"], result["data_shards"]) == (case.dtype_name, case.codec, case.shards)
    got = np.load(npz)
    assert got["values"].tobytes() == data
    if case.geometry == "dense":
        assert result["item_shape"] == list(case.item_shape)
        assert got["shapes"].tolist() == shapes
    else:
        assert result["ndim"] == case.ndim
        assert got["shapes"].tolist() == shapes
        assert got["ends"].tolist() == np.cumsum([r.nbytes for r in case.recs]).tolist()


@pytest.mark.parametrize("spec", ALL_CASES, ids=case_id)
def test_loaderx28_reads_zt_stores(stores, spec):
    case = stores["cases"][case_id(spec)]
    write, zt_read, lx_read = stores["results"][case.id]
    check_read(zt_read, case.dir / "zt-read.npz", case)
    check_read(lx_read, case.dir / "lx-read.npz", case)


@pytest.mark.parametrize("spec", ALL_CASES, ids=case_id)
def test_zt_reads_loaderx28_stores(stores, spec):
    case = stores["cases"][case_id(spec)]
    if case.geometry == "dense":
        with Dense.open(case.lx) as r:
            assert (r.layout, r.dtype, r.item_shape, r.codec, r.data_shards) == (
                "loaderx-2.8",
                case.dtype,
                case.item_shape,
                case.codec,
                case.shards,
            )
            got = r[::-1]
            assert got.dtype == case.dtype and got.tobytes() == case.x[::-1].tobytes()
    else:
        with Ragged.open(case.lx) as r:
            assert (r.layout, r.dtype, r.ndim, r.codec) == ("loaderx-2.8", case.dtype, case.ndim, case.codec)
            got = r[np.arange(len(case.recs))[::-1]]
            for g, w in zip(got, case.recs[::-1]):
                assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes()


def test_loaderx28_refuses_the_loaderx23_layout(stores):
    # loaderx 2.8 decodes the schema as UTF-8 JSON, which MsgPack is not: the
    # loaderx-2.3 layout is for loaderx 2.3, and zt's default is 2.8's.
    assert stores["old"].get("error", "").startswith("UnicodeDecodeError"), stores["old"]


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_rejected_like_loaderx28(stores, name):
    theirs = stores["corrupt"][name]
    assert theirs.get("code") == -8, theirs
    with pytest.raises(ZrecordError) as ours:
        Dense.open(stores["root"] / "corrupt" / name.replace(" ", "-"))
    assert ours.value.code == -8


def hold(kind: str, path) -> subprocess.Popen:
    child = subprocess.Popen(
        [os.fspath(PYTHON), os.fspath(HELPER), kind, os.fspath(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "ready"
    return child


def release(child: subprocess.Popen) -> None:
    child.stdin.close()
    assert child.wait(60) == 0


def test_lock_modes_across_loaderx28_processes(tmp):
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: run `bash scripts/setup-loaderx28.sh`")
    with Dense.create(tmp / "s", np.uint8, (2,)) as w:
        w.append(np.ones((3, 2), np.uint8))
    reader = hold("hold-reader", tmp / "s")
    try:
        with Dense.open(tmp / "s") as r:  # readers share, across the two libraries
            assert len(r) == 3
        with pytest.raises(ZrecordError) as e:
            Dense.create(tmp / "s", np.uint8, (2,))
        assert e.value.code == -13
    finally:
        release(reader)
    writer = hold("hold-writer", tmp / "lx")  # loaderx builds in place, locked
    try:
        with pytest.raises(ZrecordError) as e:
            Dense.open(tmp / "lx")
        assert e.value.code == -13
        with pytest.raises(ZrecordError) as e:
            Dense.create(tmp / "lx", np.uint8, (2,))
        assert e.value.code == -13
    finally:
        release(writer)
    with Dense.open(tmp / "lx") as r:
        assert r.layout == "loaderx-2.8" and np.array_equal(r[:], np.ones((3, 2), np.uint8))


def test_train_dict_is_loaderx28s(stores):
    # loaderx 2.8 trains one 32 KiB dictionary on at most 4 MiB of a view's
    # records: zt's default tier, byte for byte (the same zstd 1.5.7 trainer).
    for name in stores["dicts"]:
        case = stores["cases"][name]
        theirs = (stores["root"] / f"{name}.dict").read_bytes()
        opener = Dense if case.geometry == "dense" else Ragged
        with opener.open(case.zt) as r:
            assert train_dict(r) == theirs
        assert train_dict(case.x if case.geometry == "dense" else case.recs) == theirs


# ---- the sampler ------------------------------------------------------------------

LENGTHS = [1, 2, 3, 10, 1000, (1 << 32) + 5, (1 << 63) + 1, (1 << 64) - 1]
BATCHES = [1, 7, 64]
SEEDS = [0, 42, (1 << 64) - 1]
STEPS = [0, 1, 2, 12345, 1 << 40, (1 << 64) - 2, (1 << 64) - 1]
# zt's mode -> loaderx 2.8's Sampler.Mode (loaderx's IID stream is zt's LOADERX_IID).
MODES = {SEQUENTIAL: 0, LOADERX_IID: 1, CYCLIC: 2}


def test_sampler_streams_are_loaderx28s(tmp):
    cases = [
        (zt_mode, length, batch, seed) for zt_mode in MODES for length in LENGTHS for batch in BATCHES for seed in SEEDS
    ]
    jobs = [{"op": "sampler", "cases": [[MODES[m], n, b, s, STEPS] for m, n, b, s in cases]}]
    (theirs,) = run_loaderx28(jobs, tmp)
    for (mode, length, batch, seed), want in zip(cases, theirs):
        ours = Sampler(length, batch, mode, seed, rank=0, world_size=1)
        for step, batch_want in zip(STEPS, want):
            ours.seek(step)
            assert ours.next().tolist() == batch_want, (mode.name, length, batch, seed, step)
        if batch == 64 and (mode != CYCLIC or length >= batch):
            # Ranks take contiguous slices of the same global batch.
            for rank in range(4):
                shard = Sampler(length, batch, mode, seed, rank=rank, world_size=4)
                shard.seek(STEPS[3])
                assert shard.next().tolist() == want[3][16 * rank : 16 * (rank + 1)]
