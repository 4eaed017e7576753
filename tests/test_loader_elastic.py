"""zt.loader across ranks, in one process: keyword-only settings, readers
shared rather than reopened, strided loaders, the state dict (global step,
old format, refusals, re-basing) and resuming on another world size. The
same properties with real processes under torchrun are in tests/torch/."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from zt import _ranks
from zt.loader import CYCLIC, IID, SEQUENTIAL, DataLoader, Sampler
from zt.zrecord import Dense, Ragged

N = 150


@pytest.fixture
def stores(tmp_path):
    """Record i: Dense int64[2] = (i, 7 i); Ragged int32 of i repeated 1 + i % 5 times."""
    with Dense.create(tmp_path / "d.zr", np.int64, (2,), data_shards=2) as w:
        w.append(np.stack([np.arange(N), 7 * np.arange(N)], axis=1).astype(np.int64))
    with Ragged.create(tmp_path / "r.zr", np.int32, 1) as w:
        w.append([np.full(1 + i % 5, i, np.int32) for i in range(N)])
    return tmp_path


@pytest.fixture
def streams(stores):
    d, r = Dense.open(stores / "d.zr"), Ragged.open(stores / "r.zr")
    yield {"d": d, "r": r}
    d.close()
    r.close()


def _ids(batch) -> list[int]:
    ids = batch["d"][:, 0].tolist()
    assert batch["d"][:, 1].tolist() == [7 * i for i in ids]
    assert [t[0] if len(t) else None for t in batch["r"]] == ids
    return ids


def _global(mode, batch, seed, steps, start=0):
    s = Sampler(N, batch, mode, seed, rank=0, world_size=1)
    return [s.batch(k).tolist() for k in range(start, start + steps)]


def test_settings_are_keyword_only(streams):
    # loaderx's DataLoader(streams, 8) means 8 transform workers: a
    # positional argument must fail loudly, not become a batch size.
    with pytest.raises(TypeError, match=r"settings by keyword.*got 1 more positional: 8"):
        DataLoader(streams, 8)
    with pytest.raises(TypeError, match="2 more positional"):
        DataLoader(streams, 32, CYCLIC)


def test_readers_are_shared_not_reopened(stores, streams):
    """Seeking and resuming restart the workers over the readers passed in:
    with the store directories gone from disk they still gather (a reopen
    by path would fail)."""
    with DataLoader(streams, batch_size=10, mode=CYCLIC, seed=3, workers=2, rank=0, world_size=1) as dl:
        first = [_ids(next(dl)) for _ in range(4)]
        shutil.rmtree(stores / "d.zr")
        shutil.rmtree(stores / "r.zr")
        dl.seek(1)
        assert [_ids(next(dl)) for _ in range(3)] == first[1:]
        state = dl.state_dict()
        dl.load_state_dict({**state, "global_step": 0})
        assert _ids(next(dl)) == first[0]
    assert first == _global(CYCLIC, 10, 3, 4)


def test_strided_loaders_split_a_run(streams):
    """Three loaders at stride 3 (as three torch workers run them) cover
    every step once; each step's batch is the unstrided run's."""
    want = _global(IID, 12, 5, 12, start=4)
    got = {}
    for offset in range(3):
        with DataLoader(
            streams,
            batch_size=12,
            mode=IID,
            seed=5,
            workers=2,
            rank=0,
            world_size=1,
            start_step=4 + offset,
            step_stride=3,
        ) as dl:
            for k in range(4):
                step = dl.step
                assert step == 4 + offset + 3 * k
                got[step] = _ids(next(dl))
            with pytest.raises(ValueError, match="every 3th step"):
                dl.state_dict()
    assert [got[s] for s in sorted(got)] == want and sorted(got) == list(range(4, 16))


@pytest.mark.parametrize("mode", [SEQUENTIAL, IID, CYCLIC])
def test_resume_on_another_world_size_continues_the_global_stream(streams, mode):
    """W=2 for steps 0-5, W=3 for 6-11, W=1 for 12-17, each from the state
    the previous one saved (through JSON, as a checkpoint would): the ranks'
    batches concatenated equal the single-process stream at every step."""
    batch, seed = 12, 21
    want = _global(mode, batch, seed, 18)
    got, state = [], None
    for world, steps in ((2, 6), (3, 6), (1, 6)):
        loaders = [
            DataLoader(streams, batch_size=batch, mode=mode, seed=seed, workers=2, rank=r, world_size=world)
            for r in range(world)
        ]
        for dl in loaders:
            if state is not None:
                dl.load_state_dict(json.loads(state))
        for _ in range(steps):
            got.append([i for dl in loaders for i in _ids(next(dl))])
        states = [dl.state_dict() for dl in loaders]
        assert all(s == states[0] for s in states), "every rank saves the same state"
        state = json.dumps(states[0])
        for dl in loaders:
            dl.close()
    assert got == want
    assert json.loads(state)["global_step"] == 18


def test_resume_refuses_other_settings_unless_rebased(streams):
    with DataLoader(streams, batch_size=12, mode=CYCLIC, seed=1, rank=0, world_size=1) as dl:
        for _ in range(5):
            next(dl)
        state = dl.state_dict()
    assert state["samples_seen"] == 60
    for changed, needle in (
        (dict(batch_size=20), "global_batch_size: saved 12, here 20"),
        (dict(seed=2), "seed: saved 1, here 2"),
        (dict(mode=IID), "mode: saved 2, here 1"),
    ):
        kw = {**dict(batch_size=12, mode=CYCLIC, seed=1), **changed}
        with DataLoader(streams, rank=0, world_size=1, **kw) as dl:
            with pytest.raises(ValueError, match=needle) as info:
                dl.load_state_dict(state)
            assert "rebase=True" in str(info.value)
            assert dl.step == 0, "a refused state leaves the loader where it was"
            # Re-basing: this loader's own sequence, from the first step at
            # which 60 samples have been drawn under its settings.
            dl.load_state_dict(state, rebase=True)
            assert dl.step == -(-60 // kw["batch_size"])
            assert _ids(next(dl)) == _global(kw["mode"], kw["batch_size"], kw["seed"], 1, start=dl.step - 1)[0]
    with pytest.raises(ValueError, match="version 9"):
        Sampler(N, 12, CYCLIC, 1, rank=0, world_size=1).load_state_dict({**state, "version": 9})


def test_old_state_format_still_loads(streams):
    """The state dict before elastic resume: {"length", "batch_size", "mode", "seed", "step"}."""
    old = {"length": N, "batch_size": 12, "mode": int(CYCLIC), "seed": 4, "step": 9}
    with DataLoader(streams, batch_size=12, mode=CYCLIC, seed=4, rank=1, world_size=2) as dl:
        dl.load_state_dict(old)
        assert dl.step == 9
        assert _ids(next(dl)) == _global(CYCLIC, 12, 4, 1, start=9)[0][6:]
        assert dl.state_dict()["global_step"] == 10
    with pytest.raises(ValueError, match="seed: saved 4, here 5"):
        Sampler(N, 12, CYCLIC, 5, rank=0, world_size=1).load_state_dict(old)


def test_rank_discovery_order(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    # An imported JAX is a source of ranks; another test of this process
    # (Keras's, whose numpy backend imports JAX) may have imported it.
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    assert _ranks.discover() == _ranks.Ranks(0, 1, 0, _ranks.DEFAULT)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert _ranks.discover() == _ranks.Ranks(3, 4, 1, _ranks.ENVIRONMENT)
    assert _ranks.discover(0, 2) == _ranks.Ranks(0, 2, 1, _ranks.ARGUMENTS)
    assert _ranks.discover(rank=2).source == f"{_ranks.ARGUMENTS} + {_ranks.ENVIRONMENT}"
    with pytest.raises(ValueError, match=r"rank must be in 0..2, got 3 \(from arguments \+ environment"):
        _ranks.discover(world_size=2)
    s = Sampler(N, 12, CYCLIC)
    assert (s.rank, s.world_size, s.local_rank, s.rank_source) == (3, 4, 1, _ranks.ENVIRONMENT)
    with pytest.raises(ValueError, match=r"over world_size 5 \(from environment.*batch_size divisible by 5"):
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "5")
        Sampler(N, 12, CYCLIC)


def test_settings_come_from_one_keyword_spec(streams):
    import inspect

    sig = inspect.signature(DataLoader)
    assert list(sig.parameters) == [
        "streams",
        "batch_size",
        "mode",
        "seed",
        "block_size",
        "workers",
        "prefetch",
        "prefetch_bytes",
        "transform",
        "rank",
        "world_size",
        "start_step",
        "step_stride",
        "packed",
        "mix",
    ]
    assert all(p.kind is p.KEYWORD_ONLY for name, p in sig.parameters.items() if name != "streams")
    assert sig.parameters["batch_size"].default == 256 and sig.parameters["mode"].default == CYCLIC
    with DataLoader(streams, rank=0, world_size=1) as dl:
        assert (dl.sampler.batch_size, dl.sampler.seed, dl.workers, dl.prefetch) == (256, 42, 4, 4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        DataLoader(streams, batchsize=8)
    with pytest.raises(ValueError, match="step_stride must be positive"):
        DataLoader(streams, step_stride=0)
    with pytest.raises(TypeError, match="transform must be callable, got int"):
        DataLoader(streams, transform=3)
