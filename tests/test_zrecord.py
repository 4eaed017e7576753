"""zt.zrecord against loaderx 2.3.8: round trips in both layouts, interop
both ways in the loaderx-2.3 layout (values and, where the layout is
deterministic, bytes), every corruption loaderx rejects, locks across
processes, crash safety and concurrency. The loaderx-2.8 layout against
loaderx 2.8.19 itself is tests/test_loaderx28.py."""

from __future__ import annotations

import filecmp
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import limited
import numpy as np
import pytest
from loaderx.utils import train_dict as lx_train_dict
from loaderx.zrecord import Dense as LxDense
from loaderx.zrecord import Ragged as LxRagged
from loaderx.zrecord import ZrecordError as LxError

from zt import _zt
from zt.zrecord import DEFAULT_LAYOUT, DICT_TIERS, LAYOUTS, Dense, Ragged, ZrecordError, train_dict

CODECS = ["raw", "zstd", "zstd_dict"]
SHARDS = [1, 3, 4]
# What loaderx 2.3.8 opens and writes.
L23 = {"layout": "loaderx-2.3"}


def images(n=120, seed=0):
    rng = np.random.default_rng(seed)
    base = np.arange(3 * 6 * 5, dtype=np.uint8).reshape(3, 6, 5)
    return (base[None] + rng.integers(0, 4, (n, 3, 6, 5))).astype(np.uint8)


def records(n=150, seed=1, dtype=np.int32):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50, (int(rng.integers(1, 9)), 3)).astype(dtype) for _ in range(n)]


def same_records(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w)


def files(path):
    return sorted(os.listdir(path))


def frames(store):
    """The meta.zr page and every record's stored frame, in record order.
    loaderx 2.3.8 compresses in parallel and appends frames in completion
    order, so its shard files can differ between two builds of the same data;
    what must match is the page and each record's frame."""
    meta = (store / "meta.zr").read_bytes()
    page, locs = meta[:4096], meta[4096:]
    count = sum(1 for f in files(store) if f.startswith("data_"))
    shards = [(store / f"data_{i}.zr").read_bytes() for i in range(count)]
    out = []
    for i in range(len(locs) // 16):
        offset, phys, _logic = struct.unpack_from("<QII", locs, 16 * i)
        out.append(shards[i % len(shards)][offset : offset + phys])
    return page, out


def assert_same_store(a, b):
    """Same files, byte-identical where the build order allows, and the
    same page and frames always."""
    assert files(a) == files(b)
    assert frames(a) == frames(b)
    if (a / "dict.zr").exists():
        assert filecmp.cmp(a / "dict.zr", b / "dict.zr", shallow=False)


# ---- round trips --------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("shards", SHARDS)
def test_dense_round_trip(tmp, codec, shards, layout):
    x = images()
    d = train_dict(x, "fast") if codec == "zstd_dict" else None
    with Dense.create(
        tmp / "s", np.uint8, (3, 6, 5), codec=codec, dict_bytes=d, data_shards=shards, layout=layout
    ) as w:
        w.append(x[:50])
        w.append(x[50:])
        assert len(w) == 120 and w.layout == layout
    with Dense.open(tmp / "s") as r:
        assert (len(r), r.dtype, r.item_shape, r.ndim, r.codec, r.data_shards, r.layout) == (
            120,
            np.dtype(np.uint8),
            (3, 6, 5),
            3,
            codec,
            shards,
            layout,
        )
        assert np.array_equal(r[:], x)
        assert np.array_equal(r[7], x[7])
        assert np.array_equal(r[[9, 0, 9]], x[[9, 0, 9]])
        assert np.array_equal(r[3, 1, 2], x[[3, 1, 2]])
        assert np.array_equal(r[np.array([119, 4], np.int64)], x[[119, 4]])
        assert np.array_equal(r[10:40:3], x[10:40:3])
        mask = np.arange(120) % 7 == 0
        assert np.array_equal(r[mask], x[mask])
        assert r[[]].shape == (0, 3, 6, 5)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("shards", SHARDS)
def test_ragged_round_trip(tmp, codec, shards, layout):
    recs = records()
    d = train_dict(recs, "fast") if codec == "zstd_dict" else None
    with Ragged.create(tmp / "s", np.int32, 2, codec=codec, dict_bytes=d, data_shards=shards, layout=layout) as w:
        w.append(recs[:10])
        w.append(iter(recs[10:]))
    with Ragged.open(tmp / "s") as r:
        assert (len(r), r.dtype, r.ndim, r.codec, r.layout) == (150, np.dtype(np.int32), 2, codec, layout)
        same_records(r[:], recs)
        same_records([r[5]], [recs[5]])
        same_records(r[[149, 0, 3]], [recs[149], recs[0], recs[3]])
        values, offsets, shapes = r.gather_packed([2, 1])
        assert np.array_equal(values, np.concatenate([recs[2].ravel(), recs[1].ravel()]))
        assert offsets.tolist() == [0, recs[2].size, recs[2].size + recs[1].size]
        assert shapes.tolist() == [list(recs[2].shape), list(recs[1].shape)]
        assert r[[]] == []


def test_scalars_and_other_dtypes(tmp):
    x = np.arange(10, dtype=np.float64)
    with Dense.create(tmp / "s", np.float64, ()) as w:
        w.append(x)
    with Dense.open(tmp / "s") as r:
        assert r.item_shape == () and np.array_equal(r[:], x) and r[3] == 3.0
    # Non-native byte order: only the loaderx-2.3 layout holds it.
    y = np.array([[1 + 2j, 3j]] * 4, dtype=">c16")
    with pytest.raises(ValueError, match="loaderx-2.3"):
        Dense.create(tmp / "c", ">c16", (2,), codec="zstd")
    with Dense.create(tmp / "c", ">c16", (2,), codec="zstd", **L23) as w:
        w.append(y)
    with Dense.open(tmp / "c") as r:
        assert r.dtype == np.dtype(">c16") and np.array_equal(r[:], y)


def test_ml_dtypes_keep_their_names_in_the_loaderx_2_8_layout(tmp):
    import ml_dtypes

    # loaderx 2.8 names its types ("bfloat16"); 2.3's dtype.str of an
    # ml_dtypes type is "<V2", a void that forgets what it was.
    x = np.arange(24, dtype=np.float32).reshape(6, 4).astype(ml_dtypes.bfloat16)
    for layout, dtype in (("loaderx-2.8", np.dtype(ml_dtypes.bfloat16)), ("loaderx-2.3", np.dtype("V2"))):
        with Dense.create(tmp / layout, ml_dtypes.bfloat16, (4,), layout=layout) as w:
            w.append(x)
        with Dense.open(tmp / layout) as r:
            assert r.dtype == dtype and r[:].tobytes() == x.tobytes()
    meta = (tmp / "loaderx-2.8" / "meta.zr").read_bytes()
    schema = meta[2056 : 2056 + struct.unpack_from("<H", meta, 8)[0]]
    assert schema == b'{"dtype": "bfloat16", "item_shape": [4]}'
    recs = [np.full((i + 1, 2), i, ml_dtypes.float8_e4m3fn) for i in range(5)]
    with Ragged.create(tmp / "r", ml_dtypes.float8_e4m3fn, 2) as w:
        w.append(recs)
    with Ragged.open(tmp / "r") as r:
        same_records(r[:], recs)


# ---- layouts: what each loaderx release writes --------------------------------


def schema_bytes(store):
    meta = (store / "meta.zr").read_bytes()
    return meta[2056 : 2056 + struct.unpack_from("<H", meta, 8)[0]]


def test_default_layout_is_loaderx_2_8_and_opening_detects_either(tmp):
    assert DEFAULT_LAYOUT == "loaderx-2.8" and LAYOUTS == ("loaderx-2.8", "loaderx-2.3")
    x = images(20)
    with Dense.create(tmp / "new", np.uint8, (3, 6, 5)) as w:
        w.append(x)
    with Ragged.create(tmp / "rag", np.int32, 2) as w:
        w.append(records(5))
    assert schema_bytes(tmp / "new") == b'{"dtype": "uint8", "item_shape": [3, 6, 5]}'
    assert schema_bytes(tmp / "rag") == b'{"dtype": "int32", "ndim": 2}'
    with LxDense.create(tmp / "old", np.uint8, (3, 6, 5), codec="raw") as w:
        w.append(x)
    with Dense.open(tmp / "new") as a, Dense.open(tmp / "old") as b:
        assert (a.layout, b.layout) == ("loaderx-2.8", "loaderx-2.3")
        assert np.array_equal(a[:], b[:])
    # loaderx 2.3.8 reads only MsgPack schemas: the current layout is not its.
    with pytest.raises(Exception, match="extra data|unpack"):
        LxDense.open(tmp / "new")
    with pytest.raises(ValueError, match="unknown layout"):
        Dense.create(tmp / "x", np.uint8, (2,), layout="loaderx-2.4")


@pytest.mark.parametrize("codec", CODECS)
def test_dense_layouts_differ_only_in_the_schema(tmp, codec):
    # Built from the same records, a loaderx 2.3 and a loaderx 2.8 Dense store
    # (zt builds each byte for byte as that release does) share their shards,
    # tails, RecordLocs and dict.zr; only the schema and its length differ.
    x = images(90)
    d = train_dict(x) if codec == "zstd_dict" else None
    for layout in LAYOUTS:
        with Dense.create(
            tmp / layout, np.uint8, (3, 6, 5), codec=codec, dict_bytes=d, data_shards=3, layout=layout
        ) as w:
            w.append(x)
    new, old = tmp / "loaderx-2.8", tmp / "loaderx-2.3"
    assert files(new) == files(old)
    for name in files(new):
        if name != "meta.zr":
            assert filecmp.cmp(new / name, old / name, shallow=False), name
    a, b = (new / "meta.zr").read_bytes(), (old / "meta.zr").read_bytes()
    assert len(a) == len(b) and a[:8] == b[:8] and a[10:2056] == b[10:2056] and a[4096:] == b[4096:]
    assert schema_bytes(old).startswith(b"\x83") and schema_bytes(new).startswith(b"{")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ragged_shape_prefix_width_follows_the_layout(tmp, layout):
    # One record [[7, 8, 9]] of int32: the shape prefix is two u32 (2.8) or
    # two u64 (2.3), then the payload.
    with Ragged.create(tmp / "s", np.int32, 2, data_shards=1, layout=layout) as w:
        w.append([np.array([[7, 8, 9]], np.int32)])
    dims = "<II" if layout == "loaderx-2.8" else "<QQ"
    want = struct.pack(dims, 1, 3) + np.array([7, 8, 9], "<i4").tobytes()
    assert (tmp / "s" / "data_0.zr").read_bytes() == want


# ---- interop with loaderx 2.3.8 ------------------------------------------------


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
@pytest.mark.parametrize("shards", [1, 4])
def test_dense_interop_and_identical_bytes(tmp, codec, shards):
    x = images(200)
    d = lx_train_dict(x) if codec == "zstd_dict" else None
    # zt's default dictionary level is loaderx 2.3.8's, so the bytes compare.
    with LxDense.create(tmp / "lx", np.uint8, (3, 6, 5), codec=codec, dict_bytes=d, data_shards=shards) as w:
        w.append(x[:77])
        w.append(x[77:])
    with Dense.create(tmp / "zt", np.uint8, (3, 6, 5), codec=codec, dict_bytes=d, data_shards=shards, **L23) as w:
        w.append(x[:77])
        w.append(x[77:])
    assert_same_store(tmp / "lx", tmp / "zt")
    with Dense.open(tmp / "lx") as r:
        assert np.array_equal(r[:], x)
    with LxDense.open(tmp / "zt") as r:
        assert np.array_equal(r[np.arange(200)], x)


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_large_batches_reuse_dropped_buffers_but_never_live_ones(tmp, codec):
    # Batches of at least BATCH_POOLED_FROM bytes come from a pool of the
    # buffers of dropped batches; a batch still alive must keep its bytes.
    x = np.random.default_rng(5).integers(0, 255, (64, 64, 1024), dtype=np.uint8)  # 64 KiB records
    with Dense.create(tmp / "s", np.uint8, (64, 1024), codec=codec) as w:
        w.append(x)
    n = -(-_zt.BATCH_POOLED_FROM // x[0].nbytes)
    idx_a, idx_b = np.arange(n) % 64, (np.arange(n) * 7 + 3) % 64
    with Dense.open(tmp / "s") as r:
        a = r[idx_a]
        b = r[idx_b]  # `a` is alive: `b` must not share its memory
        assert not np.shares_memory(a, b)
        assert np.array_equal(a, x[idx_a]) and np.array_equal(b, x[idx_b])
        assert a.flags.writeable and a.dtype == np.uint8 and a.shape == (n, 64, 1024)
        address = a.__array_interface__["data"][0]
        del a
        c = r[idx_b]  # a's buffer, reused
        assert c.__array_interface__["data"][0] == address
        assert np.array_equal(c, x[idx_b]) and np.array_equal(b, x[idx_b])


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_large_ragged_batches_reuse_dropped_buffers_but_never_live_ones(tmp, codec):
    rng = np.random.default_rng(6)
    recs = [rng.integers(0, 255, (int(rng.integers(100, 200)), 96, 3), dtype=np.uint8) for _ in range(40)]
    with Ragged.create(tmp / "s", np.uint8, 3, codec=codec) as w:
        w.append(recs)
    n = -(-_zt.BATCH_POOLED_FROM // (150 * 96 * 3))  # batches of about the pooled size
    idx_a, idx_b = np.arange(n) % 40, (np.arange(n) * 7 + 3) % 40
    with Ragged.open(tmp / "s") as r:
        a = r[idx_a]
        big = r[np.arange(n * 2) % 40]  # larger: the gather grows what it was given
        b = r[idx_b]
        for got, idx in ((a, idx_a), (big, np.arange(n * 2) % 40), (b, idx_b)):
            assert all(np.array_equal(g, recs[i]) for g, i in zip(got, idx))
        assert not np.shares_memory(a[0], b[0]) and not np.shares_memory(big[0], b[0])
        del a, big
        c = r[idx_a]
        assert all(np.array_equal(g, recs[i]) for g, i in zip(c, idx_a))
        assert all(np.array_equal(g, recs[i]) for g, i in zip(b, idx_b))


@pytest.mark.parametrize("shards", [1, 4])
def test_token_rows_written_unpacked_match_loaderx(tmp, shards):
    # Raw rows of 1 KiB and more go to the file with one iovec each instead
    # of being packed first; the store must still be loaderx's byte for byte.
    x = np.random.default_rng(4).integers(0, 50257, (1000, 512), dtype=np.int32)
    for lib, cls, layout in (("lx", LxDense, {}), ("zt", Dense, L23)):
        with cls.create(tmp / lib, np.int32, (512,), codec="raw", data_shards=shards, **layout) as w:
            w.append(x[:333])
            w.append(x[333:])
    assert_same_store(tmp / "lx", tmp / "zt")
    with Dense.open(tmp / "zt") as r:
        assert np.array_equal(r[:], x)


@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
@pytest.mark.parametrize("shards", [1, 3, 4])
def test_compressed_windows_of_many_chunks_match_loaderx(tmp, codec, shards):
    # 40,000 rows of 256 bytes in one append: two windows (32,768 records at
    # most each) of several 1 MiB chunks per shard, which zt writes as each
    # chunk's offset becomes known. The frames must be loaderx's, and zt's
    # shards must hold them in record order, back to back.
    x = np.random.default_rng(5).integers(0, 300, (40_000, 64), dtype=np.int32)
    d = lx_train_dict(x) if codec == "zstd_dict" else None
    for lib, cls, layout in (("lx", LxDense, {}), ("zt", Dense, L23)):
        with cls.create(tmp / lib, np.int32, (64,), codec=codec, dict_bytes=d, data_shards=shards, **layout) as w:
            w.append(x[:1234])
            w.append(x[1234:])
    assert_same_store(tmp / "lx", tmp / "zt")
    locs = np.frombuffer((tmp / "zt" / "meta.zr").read_bytes()[4096:], dtype=[("o", "<u8"), ("p", "<u4"), ("l", "<u4")])
    for s in range(shards):
        mine = locs[s::shards]
        ends = np.cumsum(mine["p"].astype(np.uint64))
        assert mine["o"][0] == 0 and np.array_equal(mine["o"][1:], ends[:-1])
        assert (tmp / "zt" / f"data_{s}.zr").stat().st_size == ends[-1]
    with Dense.open(tmp / "zt") as r:
        assert np.array_equal(r[np.arange(0, 40_000, 7)], x[::7])


@pytest.mark.parametrize("codec", CODECS)
def test_large_ragged_records_written_unpacked_match_loaderx(tmp, codec):
    # Records averaging >= 64 KiB go to the file from their own arrays (no
    # packing); one is a non-contiguous view. The store must still be
    # loaderx's byte for byte.
    rng = np.random.default_rng(3)
    recs = [rng.integers(0, 255, (int(rng.integers(200, 300)), 150, 3), dtype=np.uint8) for _ in range(40)]
    recs[5] = np.asfortranarray(recs[5])[:, ::2]
    d = lx_train_dict(recs) if codec == "zstd_dict" else None
    with LxRagged.create(tmp / "lx", np.uint8, 3, codec=codec, dict_bytes=d) as w:
        w.append([np.ascontiguousarray(r) for r in recs])
    with Ragged.create(tmp / "zt", np.uint8, 3, codec=codec, dict_bytes=d, **L23) as w:
        w.append(recs[:25])
        w.append(recs[25:])
    assert_same_store(tmp / "lx", tmp / "zt")
    with Ragged.open(tmp / "zt") as r:
        same_records(r[np.arange(40)], recs)


@pytest.mark.parametrize("codec", CODECS)
def test_ragged_interop_and_identical_bytes(tmp, codec):
    recs = records(300)
    d = lx_train_dict(recs) if codec == "zstd_dict" else None
    with LxRagged.create(tmp / "lx", np.int32, 2, codec=codec, dict_bytes=d) as w:
        w.append(recs)
    with Ragged.create(tmp / "zt", np.int32, 2, codec=codec, dict_bytes=d, **L23) as w:
        w.append(recs)
    assert_same_store(tmp / "lx", tmp / "zt")
    with Ragged.open(tmp / "lx") as r:
        same_records(r[:], recs)
    with LxRagged.open(tmp / "zt") as r:
        same_records(r[np.arange(300)], recs)


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("codec", CODECS)
def test_ragged_non_native_byte_order_stores_the_values(tmp, ndim, codec):
    # Two or more '>i4' records used to be packed by np.concatenate, which
    # converts to native order: 7 was stored as 0x07000000 and read back as
    # 117440512 by zt and by loaderx. The store holds what the values are:
    # loaderx 2.3.8's own store of the same records, byte for byte.
    recs = [np.array([7], ">i4"), np.array([8, 9], ">i4"), np.arange(-3, 40, dtype=">i4")]
    recs = [r.reshape((1, -1) if ndim == 2 else -1) for r in recs]
    d = lx_train_dict(recs * 20) if codec == "zstd_dict" else None
    with Ragged.create(tmp / "zt", ">i4", ndim, codec=codec, dict_bytes=d, data_shards=1, **L23) as w:
        w.append(recs)
    with LxRagged.create(tmp / "lx", ">i4", ndim, codec=codec, dict_bytes=d, data_shards=1) as w:
        w.append(recs)
    assert_same_store(tmp / "lx", tmp / "zt")
    with Ragged.open(tmp / "zt") as r:
        assert r.dtype == np.dtype(">i4")
        same_records(r[:], recs)
        values, _, _ = r.gather_packed([0, 1])
        assert values.tolist() == [7, 8, 9]
    with LxRagged.open(tmp / "zt") as r:
        same_records(r[[0, 1, 2]], recs)
    if codec == "raw":
        prefix = 8 * ndim
        assert (tmp / "zt" / "data_0.zr").read_bytes()[prefix : prefix + 4] == b"\0\0\0\x07"
    # The current layout holds native byte order only, as loaderx 2.8 does.
    with pytest.raises(ValueError, match="loaderx-2.3"):
        Ragged.create(tmp / "new", ">i4", ndim)


def test_level_15_dict_store_opens_in_loaderx(tmp):
    # loaderx 2.3.5's dictionary level: other bytes, same records.
    x = images(200)
    d = train_dict(x)
    with Dense.create(tmp / "zt", np.uint8, (3, 6, 5), codec="zstd_dict", dict_bytes=d, level=15, **L23) as w:
        w.append(x)
    with LxDense.open(tmp / "zt") as r:
        assert np.array_equal(r[np.arange(200)], x)


def test_fast_tier_trains_the_loaderx_dictionary(tmp):
    # loaderx 2.3.8 (and 2.8.19, tests/test_loaderx28.py) train one 32 KiB
    # dictionary on at most 4 MiB: zt's default tier, byte for byte.
    x = images(400)
    assert train_dict(x) == train_dict(x, "fast") == lx_train_dict(x)
    recs = records(500)
    assert train_dict(recs) == lx_train_dict(recs)
    with LxRagged.create(tmp / "lx", np.int32, 2, codec="raw") as w:
        w.append(recs)
    with Ragged.open(tmp / "lx") as ours, LxRagged.open(tmp / "lx") as theirs:
        assert train_dict(ours) == lx_train_dict(theirs)


def test_train_dict_refuses_object_arrays():
    # An object array's bytes are pointers: no dictionary is trained on them.
    pointers = [np.array([object(), object()], dtype=object)] * 100
    for source in (pointers, iter(pointers), np.array(pointers)):
        with pytest.raises(ValueError, match="object arrays"):
            train_dict(source, "fast")
    with pytest.raises(ValueError, match="object arrays"):
        train_dict([np.arange(4)] * 50 + [np.array([1, "a"], dtype=object)], "fast")


def test_train_dict_sources_and_tiers(tmp):
    assert set(DICT_TIERS) == {"fast", "balanced", "max"}
    assert DICT_TIERS["balanced"] == {"dict_bytes": 128 << 10, "sample_budget": 16 << 20}
    x = images(300)
    with Dense.create(tmp / "d", np.uint8, (3, 6, 5)) as w:
        w.append(x)
    recs = records(300)
    with Ragged.create(tmp / "r", np.int32, 2) as w:
        w.append(recs)
    with Dense.open(tmp / "d") as dense, Ragged.open(tmp / "r") as ragged:
        for source in (x, dense, ragged, iter(recs), [r.tobytes() for r in recs]):
            d = train_dict(source, "fast")
            assert 0 < len(d) <= 32 << 10
    assert len(train_dict(x, "max", path=tmp / "dict.bin")) <= 1 << 20
    assert (tmp / "dict.bin").read_bytes() == train_dict(x, "max")
    with pytest.raises(ValueError):
        train_dict(x, "huge")
    with pytest.raises(ValueError):
        train_dict(x[:0])


# ---- corruption: loaderx and zt both refuse -------------------------------------


def poke(path, at, data):
    with open(path / "meta.zr", "r+b") as f:
        f.seek(at)
        f.write(data)


def truncate(name, size):
    def f(path):
        os.truncate(path / name, size)

    return f


CORRUPTIONS = {
    "truncated meta": truncate("meta.zr", 4095),
    "schema length 0": lambda p: poke(p, 8, struct.pack("<H", 0)),
    "schema length 2041": lambda p: poke(p, 8, struct.pack("<H", 2041)),
    "zero shards": lambda p: poke(p, 10, b"\0"),
    "unknown codec": lambda p: poke(p, 11, b"\x07"),
    "reserved byte": lambda p: poke(p, 13, b"\x01"),
    "inactive tail": lambda p: poke(p, 16 + 8 * 9, struct.pack("<Q", 1)),
    "short loc table": truncate("meta.zr", 4096 + 16 * 99),
    "short data file": truncate("data_1.zr", 10),
    "missing shard": lambda p: os.remove(p / "data_2.zr"),
    "extra shard": lambda p: (p / "data_3.zr").write_bytes(b""),
    "unexpected dict": lambda p: (p / "dict.zr").write_bytes(b"dict"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corruption_rejected_like_loaderx(tmp, name):
    x = images(100)
    with LxDense.create(tmp / "s", np.uint8, (3, 6, 5), codec="zstd", data_shards=3) as w:
        w.append(x)
    CORRUPTIONS[name](tmp / "s")
    with pytest.raises(LxError) as lx:
        LxDense.open(tmp / "s")
    assert lx.value.code == -8
    with pytest.raises(ZrecordError) as ours:
        Dense.open(tmp / "s")
    assert ours.value.code == -8


def test_missing_dict_rejected_like_loaderx(tmp):
    x = images(100)
    with LxDense.create(tmp / "s", np.uint8, (3, 6, 5), codec="zstd_dict", dict_bytes=lx_train_dict(x)) as w:
        w.append(x)
    os.remove(tmp / "s" / "dict.zr")
    with pytest.raises(LxError):
        LxDense.open(tmp / "s")
    with pytest.raises(ZrecordError) as ours:
        Dense.open(tmp / "s")
    assert ours.value.code == -8


def test_out_of_frontier_loc_rejected_on_read(tmp):
    x = images(10)
    with LxDense.create(tmp / "s", np.uint8, (3, 6, 5), codec="raw", data_shards=1) as w:
        w.append(x)
    poke(tmp / "s", 4096 + 16 * 2, struct.pack("<Q", 1 << 20))
    with LxDense.open(tmp / "s") as r, pytest.raises(LxError):
        r[2]
    with Dense.open(tmp / "s") as r:
        assert np.array_equal(r[1], x[1])
        with pytest.raises(ZrecordError) as e:
            r[2]
        assert e.value.code == -8


def test_geometry_mismatch_and_missing_store(tmp):
    with LxDense.create(tmp / "d", np.uint8, (2,), codec="raw") as w:
        w.append(np.zeros((3, 2), np.uint8))
    with pytest.raises(ValueError):
        Ragged.open(tmp / "d")
    with pytest.raises(FileNotFoundError):
        Dense.open(tmp / "nothing")


# ---- API contract --------------------------------------------------------------


def test_api_errors(tmp):
    with pytest.raises(TypeError):
        Dense()
    with pytest.raises(ValueError):
        Dense.create(tmp / "a", np.uint8, (2,), codec="lz4")
    with pytest.raises(ValueError):
        Dense.create(tmp / "a", np.uint8, (2,), codec="zstd_dict")
    with pytest.raises(ValueError):
        Dense.create(tmp / "a", np.uint8, (2,), codec="zstd", dict_bytes=b"x")
    with pytest.raises(ValueError):
        Dense.create(tmp / "a", object, (2,))
    with pytest.raises(ValueError):
        Dense.create(tmp / "a", [("a", "i4")], (2,))
    with pytest.raises(ValueError):
        Dense.create(tmp / "a", np.uint8, (0,))
    with pytest.raises(ValueError):
        Ragged.create(tmp / "a", np.uint8, 0)
    with pytest.raises(ValueError):
        Dense.create(tmp / "a", np.uint8, (2,), data_shards=256)
    w = Dense.create(tmp / "a", np.uint8, (2,))
    with pytest.raises(ValueError):
        w.append(np.zeros((3, 2), np.int8))
    with pytest.raises(ValueError):
        w.append(np.zeros((3, 3), np.uint8))
    with pytest.raises(ValueError):
        w.append(np.zeros((0, 2), np.uint8))
    with pytest.raises(RuntimeError, match="read requires"):
        w[0]
    w.append(np.zeros((3, 2), np.uint8)[:, ::-1])
    w.close()
    w.close()
    with pytest.raises(RuntimeError, match="closed"):
        len(w)
    r = Dense.open(tmp / "a")
    with pytest.raises(RuntimeError, match="append requires"):
        r.append(np.zeros((1, 2), np.uint8))
    with pytest.raises(IndexError):
        r[3]
    with pytest.raises(IndexError):
        r[-1]
    with pytest.raises(IndexError):
        r[np.array([True])]
    with pytest.raises(TypeError):
        r[True]
    with pytest.raises(TypeError):
        r[[0.5]]
    r.close()
    with pytest.raises(RuntimeError, match="closed"):
        r[0]
    g = Ragged.create(tmp / "g", np.int32, 1)
    with pytest.raises(ValueError, match="empty records"):
        g.append([np.ones(2, np.int32), np.ones(0, np.int32)])
    with pytest.raises(ValueError):
        g.append([np.ones((2, 2), np.int32)])
    with pytest.raises(TypeError):
        g.append([[1, 2]])
    with pytest.raises(ValueError):
        g.append([])
    assert len(g) == 0
    g.close()


# ---- publish, crash safety, locks ---------------------------------------------


def test_exception_inside_create_publishes_nothing(tmp):
    with pytest.raises(KeyError):
        with Dense.create(tmp / "s", np.uint8, (2,)) as w:
            w.append(np.ones((5, 2), np.uint8))
            raise KeyError("boom")
    assert not (tmp / "s").exists()
    assert os.listdir(tmp) == []
    with pytest.raises(FileNotFoundError):
        Dense.open(tmp / "s")


def test_nothing_visible_until_close(tmp):
    w = Dense.create(tmp / "s", np.uint8, (2,))
    w.append(np.ones((5, 2), np.uint8))
    assert not (tmp / "s").exists()
    with pytest.raises(ZrecordError) as e:
        Dense.open(tmp / "s")
    assert e.value.code == -13
    w.close()
    with Dense.open(tmp / "s") as r:
        assert len(r) == 5


def run_child(code, *args):
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


HOLD_ZT_READER = """
    import sys
    from zt.zrecord import Dense
    r = Dense.open(sys.argv[1]); print("ready", flush=True); sys.stdin.read()
"""
HOLD_LX_WRITER = """
    import sys, numpy as np
    from loaderx.zrecord import Dense
    w = Dense.create(sys.argv[1], np.uint8, (2,), codec="raw")
    w.append(np.ones((3, 2), np.uint8)); print("ready", flush=True); sys.stdin.read(); w.close()
"""
HOLD_ZT_WRITER = """
    import sys, numpy as np
    from zt.zrecord import Dense
    w = Dense.create(sys.argv[1], np.uint8, (2,), layout="loaderx-2.3")
    w.append(np.ones((3, 2), np.uint8)); print("ready", flush=True); sys.stdin.read(); w.close()
"""


def hold(code, path):
    child = run_child(code, path)
    assert child.stdout.readline().strip() == "ready"
    return child


def release(child):
    child.stdin.close()
    assert child.wait(30) == 0


def test_lock_modes_across_processes(tmp):
    with Dense.create(tmp / "s", np.uint8, (2,)) as w:
        w.append(np.ones((3, 2), np.uint8))
    reader = hold(HOLD_ZT_READER, tmp / "s")
    try:
        with Dense.open(tmp / "s") as r:  # readers share
            assert len(r) == 3
        with pytest.raises(ZrecordError) as e:
            Dense.create(tmp / "s", np.uint8, (2,))
        assert e.value.code == -13
        with pytest.raises(LxError) as e:
            LxDense.create(tmp / "s", np.uint8, (2,), codec="raw")
        assert e.value.code == -13
    finally:
        release(reader)
    with pytest.raises(ZrecordError) as e:
        Dense.create(tmp / "s", np.uint8, (2,))
    assert e.value.code == -12

    writer = hold(HOLD_LX_WRITER, tmp / "lx")
    try:
        with pytest.raises(ZrecordError) as e:
            Dense.open(tmp / "lx")
        assert e.value.code == -13
    finally:
        release(writer)
    with Dense.open(tmp / "lx") as r:
        assert len(r) == 3

    writer = hold(HOLD_ZT_WRITER, tmp / "zt")
    try:
        with pytest.raises(ZrecordError) as e:
            Dense.open(tmp / "zt")
        assert e.value.code == -13
        with pytest.raises(ZrecordError) as e:
            Dense.create(tmp / "zt", np.uint8, (2,))
        assert e.value.code == -13
    finally:
        release(writer)
    with LxDense.open(tmp / "zt") as r:
        assert len(r) == 3


KILLED_WRITER = """
    import sys, numpy as np
    from zt.zrecord import Dense
    w = Dense.create(sys.argv[1], np.uint8, (64,), codec="zstd")
    x = np.ones((1000, 64), np.uint8)
    print("ready", flush=True)
    while True:
        w.append(x)
"""


def test_kill_9_during_build_leaves_nothing(tmp):
    child = run_child(KILLED_WRITER, tmp / "s")
    assert child.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    assert not (tmp / "s").exists()
    with pytest.raises(FileNotFoundError):
        Dense.open(tmp / "s")
    with pytest.raises(FileNotFoundError):
        LxDense.open(tmp / "s")
    # The dead writer's build is cleared by the next create.
    with Dense.create(tmp / "s", np.uint8, (64,)) as w:
        w.append(np.zeros((2, 64), np.uint8))
    assert os.listdir(tmp) == ["s"]


# ---- concurrency ---------------------------------------------------------------


def test_concurrent_gathers_and_close_during_gather(tmp):
    x = np.random.default_rng(2).integers(0, 255, (400, 64, 64), dtype=np.uint8)
    with Dense.create(tmp / "s", np.uint8, (64, 64), codec="zstd") as w:
        w.append(x)
    r = Dense.open(tmp / "s")
    errors = []
    closed_reads = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            idx = rng.integers(0, 400, 64)
            try:
                got = r[idx]
            except RuntimeError:
                closed_reads.append(seed)
                return
            if not np.array_equal(got, x[idx]):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    r.close()  # never frees the mapping under a running gather
    for t in threads:
        t.join()
    assert errors == []
    with pytest.raises(RuntimeError, match="closed"):
        r[0]


def test_concurrent_appends_serialize(tmp):
    w = Dense.create(tmp / "s", np.int64, (4,))
    blocks = [np.full((100, 4), i, np.int64) for i in range(8)]
    threads = [threading.Thread(target=w.append, args=(b,)) for b in blocks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    with Dense.open(tmp / "s") as r:
        got = r[:]
    assert len(got) == 800
    # Each append lands as one contiguous block of 100 records.
    firsts = sorted(int(got[i, 0]) for i in range(0, 800, 100))
    assert firsts == list(range(8))
    for i in range(0, 800, 100):
        assert (got[i : i + 100] == got[i, 0]).all()


# -- hostile files (issue 19): each runs in a child under RLIMIT_AS
# (tests/limited.py), so an abort fails the test instead of passing by luck.


def test_zrecord_ragged_gather_sized_by_meta_zr_is_a_memory_error(tmp):
    """meta.zr claims 2 GiB for one zstd record; a gather of it four times
    would allocate 8 GiB before decoding anything."""
    from zt import zrecord

    store = tmp / "store"
    w = zrecord.Ragged.create(store, np.int32, 1, codec="zstd")
    w.append([np.arange(10, dtype=np.int32)])
    w.close()
    meta = store / "meta.zr"
    raw = bytearray(meta.read_bytes())
    raw[4096 + 12 : 4096 + 16] = struct.pack("<I", 1 << 31)  # RecordLoc[0].logic
    meta.write_bytes(bytes(raw))
    got = limited.run(f"from zt import zrecord\nzrecord.Ragged.open({os.fspath(store)!r}).gather_packed([0, 0, 0, 0])")
    assert got["kind"] == "MemoryError" and "store" in got["message"], got
