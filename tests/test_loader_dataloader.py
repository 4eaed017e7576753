"""zt.loader.DataLoader: step order, alignment, resume, sharding, errors,
closing and bounded memory, over stores written by zt.zrecord."""

from __future__ import annotations

import gc
import struct
import threading
import time
import traceback

import numpy as np
import pytest

from zt.loader import CYCLIC, IID, SEQUENTIAL, DataLoader, Sampler
from zt.zrecord import Dense, Ragged, ZrecordError

N = 200  # records
ROW = (3, 4)


def _ragged_record(i: int) -> np.ndarray:
    return np.full(1 + i % 7, i, dtype=np.int32)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A Dense store (record i is a (3, 4) block filled with i) and a Ragged
    store (record i is i repeated 1 + i % 7 times), `N` records each."""
    root = tmp_path_factory.mktemp("dl")
    rows = np.repeat(np.arange(N, dtype=np.int64), 12).reshape(N, *ROW)
    with Dense.create(root / "image.zr", np.int64, ROW, codec="zstd", data_shards=3) as ds:
        ds.append(rows)
    with Ragged.create(root / "tokens.zr", np.int32, 1, codec="raw", data_shards=2) as rs:
        rs.append([_ragged_record(i) for i in range(N)])
    return root


@pytest.fixture
def streams(stores):
    image = Dense.open(stores / "image.zr")
    tokens = Ragged.open(stores / "tokens.zr")
    yield {"image": image, "tokens": tokens}
    image.close()
    tokens.close()


def _take(loader, n):
    return [next(loader) for _ in range(n)]


def _ids(batch):
    """The record ids a batch holds, checked for alignment between streams."""
    image = batch["image"]
    ids = image[:, 0, 0]
    assert (image == ids[:, None, None]).all()
    tokens = batch["tokens"]
    assert len(tokens) == len(ids)
    for t, i in zip(tokens, ids.tolist()):
        np.testing.assert_array_equal(t, _ragged_record(i))
    return ids


@pytest.mark.parametrize("mode", [SEQUENTIAL, IID, CYCLIC])
def test_order_equals_sampler_for_any_worker_count(streams, mode):
    sampler = Sampler(N, 32, mode, seed=7, rank=0, world_size=1)
    expected = [sampler.next() for _ in range(20)]
    for workers in (1, 2, 4):
        with DataLoader(
            streams, batch_size=32, mode=mode, seed=7, workers=workers, prefetch=3, rank=0, world_size=1
        ) as dl:
            got = [_ids(b) for b in _take(dl, 20)]
        for e, g in zip(expected, got):
            np.testing.assert_array_equal(g, e)


def test_batches_equal_direct_gather(streams):
    sampler = Sampler(N, 16, CYCLIC, seed=3, rank=0, world_size=1)
    with DataLoader(streams, batch_size=16, mode=CYCLIC, seed=3, workers=2, rank=0, world_size=1) as dl:
        for _ in range(15):
            idxs = sampler.next()
            batch = next(dl)
            np.testing.assert_array_equal(batch["image"], streams["image"][idxs])
            assert batch["image"].dtype == np.int64 and batch["image"].shape == (16, *ROW)
            direct = streams["tokens"][idxs]
            assert len(batch["tokens"]) == len(direct)
            for a, b in zip(batch["tokens"], direct):
                assert a.dtype == b.dtype
                np.testing.assert_array_equal(a, b)


def test_packed_ragged_form(streams):
    sampler = Sampler(N, 16, CYCLIC, seed=3, rank=0, world_size=1)
    with DataLoader(streams, batch_size=16, mode=CYCLIC, seed=3, workers=2, rank=0, world_size=1, packed=True) as dl:
        for _ in range(5):
            values, offsets, shapes = next(dl)["tokens"]
            want = streams["tokens"].gather_packed(sampler.next())
            for g, w in zip((values, offsets, shapes), want):
                assert g.dtype == w.dtype
                np.testing.assert_array_equal(g, w)


def test_resume_gives_identical_sequence(streams):
    with DataLoader(streams, batch_size=24, mode=CYCLIC, seed=11, workers=3, rank=0, world_size=1) as dl:
        run = [_ids(b) for b in _take(dl, 30)]
    with DataLoader(streams, batch_size=24, mode=CYCLIC, seed=11, workers=2, rank=0, world_size=1) as dl:
        _take(dl, 12)
        state = dl.state_dict()
        assert state["global_step"] == 12 and state["global_batch_size"] == 24
    # A fresh process would rebuild the loader and load the state.
    with DataLoader(streams, batch_size=24, mode=CYCLIC, seed=11, workers=4, rank=0, world_size=1) as dl:
        dl.load_state_dict(state)
        resumed = [_ids(b) for b in _take(dl, 18)]
        dl.seek(5)
        sought = [_ids(b) for b in _take(dl, 3)]
    with DataLoader(streams, batch_size=24, mode=CYCLIC, seed=11, workers=1, rank=0, world_size=1, start_step=20) as dl:
        started = [_ids(b) for b in _take(dl, 5)]
    for a, b in zip(run[12:], resumed):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(run[5:8], sought):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(run[20:25], started):
        np.testing.assert_array_equal(a, b)


def test_load_state_dict_refuses_other_settings(streams):
    with DataLoader(streams, batch_size=24, mode=CYCLIC, seed=11, workers=1, rank=0, world_size=1) as dl:
        state = dl.state_dict()
    with DataLoader(streams, batch_size=24, mode=CYCLIC, seed=12, workers=1, rank=0, world_size=1) as dl:
        with pytest.raises(ValueError, match="different settings"):
            dl.load_state_dict(state)


def test_rank_sharding_concatenates_to_global_batch(streams):
    kw = dict(batch_size=32, mode=CYCLIC, seed=5, workers=2)
    with (
        DataLoader(streams, rank=0, world_size=1, **kw) as whole,
        DataLoader(streams, rank=0, world_size=2, **kw) as r0,
        DataLoader(streams, rank=1, world_size=2, **kw) as r1,
    ):
        for _ in range(10):
            g, a, b = next(whole), next(r0), next(r1)
            assert len(a["tokens"]) == len(b["tokens"]) == 16
            np.testing.assert_array_equal(np.concatenate([a["image"], b["image"]]), g["image"])
            for x, y in zip(a["tokens"] + b["tokens"], g["tokens"]):
                np.testing.assert_array_equal(x, y)


def test_transform_runs_on_workers_and_keeps_order(streams):
    seen_threads = set()

    def transform(batch):
        seen_threads.add(threading.current_thread().ident)
        return {"sum": int(batch["image"].sum()), "ids": batch["image"][:, 0, 0].copy()}

    sampler = Sampler(N, 16, IID, seed=9, rank=0, world_size=1)
    with DataLoader(
        streams, batch_size=16, mode=IID, seed=9, workers=3, transform=transform, rank=0, world_size=1
    ) as dl:
        for _ in range(12):
            out = next(dl)
            np.testing.assert_array_equal(out["ids"], sampler.next())
    assert threading.main_thread().ident not in seen_threads


def _fails_at_step_three(batch):
    if batch["image"][0, 0, 0] == FAIL_ID:
        raise KeyError("boom in transform")
    return batch


FAIL_ID = None


def test_transform_error_reaches_consumer_with_traceback(streams):
    global FAIL_ID
    sampler = Sampler(N, 8, SEQUENTIAL, seed=0, rank=0, world_size=1)
    FAIL_ID = int(sampler.batch(3)[0])
    with DataLoader(
        streams, batch_size=8, mode=SEQUENTIAL, seed=0, workers=4, transform=_fails_at_step_three, rank=0, world_size=1
    ) as dl:
        _take(dl, 3)
        with pytest.raises(KeyError, match="boom in transform") as info:
            next(dl)
        frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
        assert "_fails_at_step_three" in frames
        assert any("step 3" in note for note in info.value.__notes__)
        # The loader goes on with the next step.
        np.testing.assert_array_equal(_ids(next(dl)), sampler.batch(4))


def test_corrupt_record_surfaces_at_its_step(tmp_path):
    rows = np.arange(16 * 8, dtype=np.uint8).reshape(16, 8) * 3
    path = tmp_path / "c.zr"
    with Dense.create(path, np.uint8, (8,), codec="zstd", data_shards=1) as ds:
        ds.append(rows)
    # Overwrite record 9's stored zstd frame with garbage.
    meta = (path / "meta.zr").read_bytes()
    offset, phys, _logic = struct.unpack_from("<QII", meta, 4096 + 16 * 9)
    with open(path / "data_0.zr", "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * phys)
    with (
        Dense.open(path) as ds,
        DataLoader({"x": ds}, batch_size=4, mode=SEQUENTIAL, workers=2, rank=0, world_size=1) as dl,
    ):
        np.testing.assert_array_equal(next(dl)["x"], rows[0:4])
        np.testing.assert_array_equal(next(dl)["x"], rows[4:8])
        with pytest.raises(ZrecordError) as info:
            next(dl)
        message = str(info.value)
        assert 'stream "x"' in message and "step 2" in message and "record 9" in message and "c.zr" in message
        assert info.value.step == 2 and info.value.stream == "x"
        np.testing.assert_array_equal(next(dl)["x"], rows[12:16])


def test_close_from_another_thread_wakes_consumer(streams):
    def slow(batch):
        time.sleep(0.05)
        return batch

    dl = DataLoader(streams, batch_size=64, mode=CYCLIC, workers=2, prefetch=2, transform=slow, rank=0, world_size=1)
    next(dl)
    timer = threading.Timer(0.1, dl.close)
    timer.start()
    started = time.monotonic()
    with pytest.raises(StopIteration):
        while True:
            next(dl)
    timer.join()
    assert time.monotonic() - started < 5
    assert dl.closed


def test_close_under_load_without_transform(streams):
    for _ in range(5):
        dl = DataLoader(streams, batch_size=64, mode=IID, workers=4, prefetch=4, rank=0, world_size=1)
        kept = next(dl)
        closer = threading.Thread(target=dl.close)
        closer.start()
        closer.join(5)
        assert not closer.is_alive()
        # A batch handed out before close still owns its memory.
        _ids(kept)


def test_close_from_transform(streams):
    holder = {}

    def closing(batch):
        if batch["image"][0, 0, 0] >= 0 and holder.get("go"):
            holder["dl"].close()
        return batch

    dl = DataLoader(streams, batch_size=16, mode=SEQUENTIAL, workers=3, transform=closing, rank=0, world_size=1)
    holder["dl"] = dl
    next(dl)
    holder["go"] = True
    with pytest.raises(StopIteration):
        for _ in range(100):
            next(dl)
    assert dl.closed
    holder.clear()


def test_memory_bounded_with_slow_consumer(streams):
    workers, prefetch = 3, 2
    with DataLoader(
        streams, batch_size=32, mode=CYCLIC, workers=workers, prefetch=prefetch, rank=0, world_size=1
    ) as dl:
        for _ in range(15):
            batch = next(dl)
            time.sleep(0.02)  # the workers run ahead as far as they may
            assert dl.live_batches <= prefetch + 1  # the window plus the batch held here
            del batch
        assert dl.peak_batches <= prefetch + workers
        assert dl.peak_batches >= 2  # it did prefetch


def test_dense_buffers_are_reused_not_leaked(streams):
    with DataLoader(streams, batch_size=32, mode=CYCLIC, workers=2, prefetch=2, rank=0, world_size=1) as dl:
        for _ in range(50):
            next(dl)
        gc.collect()
        assert dl.live_batches <= 2 + 1


def test_validation(streams, stores, tmp_path):
    with pytest.raises(ValueError, match="need at least one stream"):
        DataLoader({})
    closed = Dense.open(stores / "image.zr")
    closed.close()
    with pytest.raises(ValueError, match=r"opened for reading: \['a'\]"):
        DataLoader({"a": closed})
    with pytest.raises(ValueError, match=r"opened for reading: \['b'\]"):
        DataLoader({"b": np.zeros(3)})
    with Dense.create(tmp_path / "short.zr", np.int64, ROW) as w:
        w.append(np.zeros((5, *ROW), np.int64))
    with Dense.open(tmp_path / "short.zr") as short:
        with pytest.raises(ValueError, match="same number of records"):
            DataLoader({"image": streams["image"], "short": short})
    with pytest.raises(TypeError, match="workers must be an integer"):
        DataLoader(streams, workers=True)
    with pytest.raises(ValueError, match="prefetch must be positive"):
        DataLoader(streams, prefetch=0)
    with pytest.raises(ValueError, match="world_size"):
        DataLoader(streams, batch_size=33, rank=0, world_size=2)
    with DataLoader(streams, rank=0, world_size=1) as dl, pytest.raises(TypeError, match="no length"):
        len(dl)
