"""zt.loader.DataLoader under concurrent control and at its limits: seek from
another thread or a transform while next() waits, the byte bound on the
prefetch window, and state dicts at the edges of the step range."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from zt.loader import DEFAULT_PREFETCH_BYTES, IID, SEQUENTIAL, DataLoader, Sampler
from zt.zrecord import Dense, Ragged

N = 200  # records
ROW = (3, 4)
U64_MAX = (1 << 64) - 1
# A guard for waits that only a broken loader would exhaust, never a delay.
HANG = 60


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A Dense store (record i is a (3, 4) int64 block filled with i) and a
    Ragged one (record i is i repeated 1 + i % 7 times)."""
    root = tmp_path_factory.mktemp("dlrel")
    rows = np.repeat(np.arange(N, dtype=np.int64), 12).reshape(N, *ROW)
    with Dense.create(root / "image.zr", np.int64, ROW, codec="zstd", data_shards=2) as ds:
        ds.append(rows)
    with Ragged.create(root / "tokens.zr", np.int32, 1) as rs:
        rs.append([np.full(1 + i % 7, i, dtype=np.int32) for i in range(N)])
    return root


@pytest.fixture
def image(stores):
    with Dense.open(stores / "image.zr") as ds:
        yield ds


def _ids(batch) -> list[int]:
    return batch["image"][:, 0, 0].tolist()


def _run(dl, n):
    """`n` batches from a plain `for` loop (the loop that ended after 0
    batches when a seek closed the loader under it)."""
    out = []
    for batch in dl:
        out.append(batch)
        if len(out) == n:
            break
    return out


# -- seek while next() waits --------------------------------------------------------


def test_seek_from_another_thread_while_next_waits_on_a_slow_transform(image):
    """Every transform is held at a gate, so the consumer thread's next()
    can only wait; a seek from a third thread must return without waiting
    for the held transforms, and the waiting next() must return the new
    step's batch (it raised StopIteration on a loader nobody closed)."""
    sampler = Sampler(N, 8, IID, seed=1, rank=0, world_size=1)
    gate = threading.Event()

    def held(batch):
        gate.wait(HANG)
        return batch

    dl = DataLoader(
        {"image": image}, batch_size=8, mode=IID, seed=1, workers=2, prefetch=2, transform=held, rank=0, world_size=1
    )
    got: dict = {}
    entered = threading.Barrier(2)

    def consume():
        entered.wait(HANG)
        try:
            got["batches"] = _run(dl, 2)
        except BaseException as exc:  # reported below, in the test's thread
            got["error"] = exc

    consumer = threading.Thread(target=consume)
    consumer.start()
    entered.wait(HANG)
    seeker = threading.Thread(target=dl.seek, args=(7,))
    seeker.start()
    seeker.join(HANG)
    seek_returned = not seeker.is_alive()
    gate.set()  # release the transforms whatever happened
    consumer.join(HANG)
    seeker.join(HANG)
    try:
        assert seek_returned, "seek waited for the transforms in flight"
        assert "error" not in got, got.get("error")
        assert [_ids(b) for b in got["batches"]] == [sampler.batch(7).tolist(), sampler.batch(8).tolist()]
        assert dl.step == 9 and not dl.closed
    finally:
        dl.close()


def test_seek_from_a_transform_keeps_the_for_loop_going(image):
    """With prefetch=1, step 3 is gathered only after the consumer took
    steps 0-2; its transform seeks to 50, so the `for` loop sees 0, 1, 2,
    50, 51, ... (it ended at once: the seek closed the loader it iterated)."""
    sampler = Sampler(N, 8, IID, seed=2, rank=0, world_size=1)
    step3 = sampler.batch(3).tolist()
    holder: dict = {}

    def skip_ahead(batch):
        if _ids(batch) == step3 and not holder.get("sought"):
            holder["sought"] = True
            holder["dl"].seek(50)
        return batch

    dl = DataLoader(
        {"image": image},
        batch_size=8,
        mode=IID,
        seed=2,
        workers=3,
        prefetch=1,
        transform=skip_ahead,
        rank=0,
        world_size=1,
    )
    holder["dl"] = dl
    try:
        got = [_ids(b) for b in _run(dl, 7)]
        assert got == [sampler.batch(s).tolist() for s in (0, 1, 2, 50, 51, 52, 53)]
        assert dl.step == 54
    finally:
        holder.clear()
        dl.close()


def test_concurrent_seeks_never_end_the_for_loop(image):
    """A thread seeking over and over while another iterates: the loop
    gets every batch it asks for, each one the step after the previous or
    a seek's target (IID batches identify their step)."""
    sampler = Sampler(N, 8, IID, seed=3, rank=0, world_size=1)
    targets = [1000 * k for k in range(1, 31)]
    by_ids = {tuple(sampler.batch(t).tolist()): t for t in targets}
    with DataLoader(
        {"image": image}, batch_size=8, mode=IID, seed=3, workers=3, prefetch=3, rank=0, world_size=1
    ) as dl:
        start = threading.Barrier(2)

        def seek_all():
            start.wait(HANG)
            for t in targets:
                dl.seek(t)

        seeker = threading.Thread(target=seek_all)
        seeker.start()
        start.wait(HANG)
        batches = _run(dl, 300)
        seeker.join(HANG)
        assert len(batches) == 300
        previous = -1
        for batch in batches:
            ids = tuple(_ids(batch))
            if ids == tuple(sampler.batch(previous + 1).tolist()):
                previous += 1
            else:
                assert ids in by_ids, f"a batch that is neither step {previous + 1} nor a seek target"
                previous = by_ids[ids]
        assert dl.step >= targets[-1]  # the last seek has landed


def test_seek_after_close_is_refused(image):
    dl = DataLoader({"image": image}, batch_size=8, workers=1, rank=0, world_size=1)
    dl.close()
    with pytest.raises(RuntimeError, match="closed"):
        dl.seek(3)


# -- the prefetch window's byte bound ----------------------------------------------------


def test_idle_consumer_window_stops_at_prefetch_bytes(image):
    """prefetch=10**9 let an idle consumer's loader gather until memory ran
    out; a byte budget of 2.5 batches admits exactly 3 (each started while
    the window held less), and once the workers are stopped and joined no
    other step was ever gathered."""
    batch = 8 * 12 * 8 + 8 * 8  # rows, plus the index array
    seen: list[list[int]] = []
    three = threading.Event()

    def record(b):
        seen.append(_ids(b))
        if len(seen) == 3:
            three.set()
        return b

    dl = DataLoader(
        {"image": image},
        batch_size=8,
        mode=SEQUENTIAL,
        workers=4,
        prefetch=10**9,
        prefetch_bytes=batch * 5 // 2,
        transform=record,
        rank=0,
        world_size=1,
    )
    assert three.wait(HANG)
    dl.close()  # joins the workers: nothing is gathered after this
    sampler = Sampler(N, 8, SEQUENTIAL, rank=0, world_size=1)
    assert sorted(seen) == [sampler.batch(s).tolist() for s in range(3)]
    assert dl.prefetch_bytes == batch * 5 // 2


def test_batch_larger_than_prefetch_bytes_still_comes(stores, image):
    """The step next() waits for is always gathered, so a budget smaller
    than one batch delivers every batch, one at a time."""
    sampler = Sampler(N, 16, IID, seed=4, rank=0, world_size=1)
    with (
        Ragged.open(stores / "tokens.zr") as tokens,
        DataLoader(
            {"image": image, "tokens": tokens},
            batch_size=16,
            mode=IID,
            seed=4,
            workers=3,
            prefetch=8,
            prefetch_bytes=1,
            rank=0,
            world_size=1,
        ) as dl,
    ):
        for step in range(20):
            batch = next(dl)
            assert _ids(batch) == sampler.batch(step).tolist()
            assert [int(t[0]) for t in batch["tokens"]] == sampler.batch(step).tolist()
            del batch
        # The batch being built and the one this loop held, never more.
        assert dl.peak_batches <= 2


def test_prefetch_bytes_validation(image):
    with DataLoader({"image": image}, rank=0, world_size=1) as dl:
        assert dl.prefetch_bytes == DEFAULT_PREFETCH_BYTES == 1 << 30
    with pytest.raises(ValueError, match="prefetch_bytes must be positive"):
        DataLoader({"image": image}, prefetch_bytes=0)
    with pytest.raises(TypeError, match="prefetch_bytes must be an integer"):
        DataLoader({"image": image}, prefetch_bytes=True)
    with pytest.raises(ValueError, match=r"prefetch_bytes must be in 1\.\.2\^64-1"):
        DataLoader({"image": image}, prefetch_bytes=1 << 64)


# -- state dicts at the edges of the step range ---------------------------------------------


@pytest.mark.parametrize("step", [0, 1 << 63, U64_MAX])
def test_state_dict_round_trips_at_the_edges(image, step):
    """A loader at step 2^64 - 1 (or 2^63 with a batch of 2 or more) wrote a
    samples_seen past 2^64 that its own load_state_dict refused."""
    sampler = Sampler(N, 8, IID, seed=5, rank=0, world_size=1)
    kw = dict(batch_size=8, mode=IID, seed=5, workers=2, rank=0, world_size=1)
    with DataLoader({"image": image}, start_step=step, **kw) as dl:
        state = json.loads(json.dumps(dl.state_dict()))
        assert state["global_step"] == step and state["samples_seen"] == step * 8
    with DataLoader({"image": image}, **kw) as dl:
        dl.load_state_dict(state)
        assert dl.step == step
        assert _ids(next(dl)) == sampler.batch(step).tolist()
    sampler.seek(step)
    resumed = Sampler(N, 8, IID, seed=5, rank=0, world_size=1)
    resumed.load_state_dict(sampler.state_dict())
    assert resumed.step == step


def test_rebase_past_the_last_step_is_refused_clearly(image):
    """A state from another global batch whose sample count this loader
    cannot reach in 2^64 steps names that, instead of a step out of range."""
    with DataLoader({"image": image}, batch_size=16, start_step=U64_MAX, rank=0, world_size=1) as dl:
        state = dl.state_dict()
    with DataLoader({"image": image}, batch_size=8, rank=0, world_size=1) as dl:
        with pytest.raises(ValueError, match="past this DataLoader's last step"):
            dl.load_state_dict(state, rebase=True)
        state["samples_seen"] = U64_MAX * U64_MAX + 1
        with pytest.raises(ValueError, match="samples_seen must be in"):
            dl.load_state_dict(state, rebase=True)
