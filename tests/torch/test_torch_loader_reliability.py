"""zt.torch's loader front at the edges of the step range (the health check's
all-reduce past int64, a dataset resumed at step 2^64 - 1) and with the
prefetch byte bound and in-place seek of zt.loader.DataLoader."""

from __future__ import annotations

import threading

import pytest
from ranks_data import GLOBAL_BATCH, SEED, N, write_stores

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.utils.data as tud  # noqa: E402

import zt.torch as ztt  # noqa: E402
from zt.loader import CYCLIC, DataLoader, Sampler  # noqa: E402
from zt.zrecord import Dense, Ragged  # noqa: E402

U64_MAX = (1 << 64) - 1
HANG = 60  # a guard only a broken loader reaches


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return write_stores(tmp_path_factory.mktemp("torch-reliability"))


@pytest.fixture
def streams(stores):
    d, r = Dense.open(stores / "d.zr"), Ragged.open(stores / "r.zr")
    yield {"d": d, "r": r}
    d.close()
    r.close()


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of this process alone (rank 0 of 1)."""
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _ids(batch) -> list[int]:
    return batch["d"][:, 0].tolist()


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("step", [0, (1 << 63) - 1, 1 << 63, U64_MAX])
def test_health_check_at_steps_past_int64(streams, step):
    """The check all-reduced [step, -step] as int64, so from step 2^63 on
    every next() failed with torch's overflow error; the steps must also
    decode back exactly, or the check would report ranks at other steps."""
    sampler = Sampler(N, GLOBAL_BATCH, CYCLIC, SEED, rank=0, world_size=1)
    with ztt.DataLoader(
        streams, batch_size=GLOBAL_BATCH, seed=SEED, workers=2, rank=0, world_size=1, start_step=step, health_check=30
    ) as dl:
        assert _ids(next(dl)) == sampler.batch(step).tolist()
        # The step after 2^64 - 1 is 0 (the step counter wraps), checked too.
        assert _ids(next(dl)) == sampler.batch((step + 1) & U64_MAX).tolist()


def test_iterable_dataset_resumes_at_the_last_step(streams):
    """A state saved at step 2^64 - 1 loads into the dataset, whose next
    iteration starts there."""
    with DataLoader(streams, batch_size=GLOBAL_BATCH, seed=SEED, start_step=U64_MAX, rank=0, world_size=1) as dl:
        state = dl.state_dict()
    ds = ztt.IterableDataset(streams, batch_size=GLOBAL_BATCH, seed=SEED, steps=1, rank=0, world_size=1)
    ds.load_state_dict(state)
    assert ds.start_step == U64_MAX
    (batch,) = list(tud.DataLoader(ds, batch_size=None, num_workers=0))
    sampler = Sampler(N, GLOBAL_BATCH, CYCLIC, SEED, rank=0, world_size=1)
    assert _ids(batch) == sampler.batch(U64_MAX).tolist()


def test_torch_front_seek_from_another_thread_while_next_waits(streams):
    """zt.torch.DataLoader's seek is zt.loader's: a next() waiting in
    another thread (the transforms held at a gate) returns the new step's
    batch, and the seek does not wait for the held transforms."""
    sampler = Sampler(N, GLOBAL_BATCH, CYCLIC, SEED, rank=0, world_size=1)
    gate = threading.Event()

    def held(batch):
        gate.wait(HANG)
        return batch

    dl = ztt.DataLoader(
        streams, batch_size=GLOBAL_BATCH, seed=SEED, workers=2, prefetch=2, transform=held, rank=0, world_size=1
    )
    got: dict = {}
    entered = threading.Barrier(2)

    def consume():
        entered.wait(HANG)
        try:
            got["batch"] = next(dl)
        except BaseException as exc:  # reported below, in the test's thread
            got["error"] = exc

    consumer = threading.Thread(target=consume)
    consumer.start()
    entered.wait(HANG)
    seeker = threading.Thread(target=dl.seek, args=(9,))
    seeker.start()
    seeker.join(HANG)
    seek_returned = not seeker.is_alive()
    gate.set()
    consumer.join(HANG)
    seeker.join(HANG)
    try:
        assert seek_returned, "seek waited for the transforms in flight"
        assert "error" not in got, got.get("error")
        assert _ids(got["batch"]) == sampler.batch(9).tolist()
    finally:
        dl.close()


def test_prefetch_bytes_reaches_the_loader(streams):
    with ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, prefetch_bytes=4096, rank=0, world_size=1) as dl:
        assert dl.loader.prefetch_bytes == 4096
        next(dl)
    with pytest.raises(ValueError, match="prefetch_bytes must be positive"):
        ztt.IterableDataset(streams, batch_size=GLOBAL_BATCH, prefetch_bytes=0, rank=0, world_size=1)
    ds = ztt.IterableDataset(streams, batch_size=GLOBAL_BATCH, prefetch_bytes=1, steps=3, rank=0, world_size=1)
    assert len(list(tud.DataLoader(ds, batch_size=None, num_workers=0))) == 3
