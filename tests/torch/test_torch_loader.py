"""zt.torch's loader front in one process: tensors that share the loader's
memory, the IterableDataset inside torch.utils.data.DataLoader worker
processes (each sample of a step once, steps in order, for any worker
count), pinned memory as torch's own DataLoader handles it, torch.compile,
and the argument checks."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest
from ranks_data import (
    GLOBAL_BATCH,
    MIX_BLOCK,
    MIX_WEIGHTS,
    MODES,
    SEED,
    dense_rows,
    mix_reference,
    ragged_records,
    reference,
    write_stores,
)

torch = pytest.importorskip("torch")
import torch.utils.data as tud  # noqa: E402

import zt.torch as ztt  # noqa: E402
from zt.loader import BLOCK_SHUFFLE, CYCLIC, DataLoader, Mode  # noqa: E402
from zt.zrecord import Dense, Ragged  # noqa: E402


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return write_stores(tmp_path_factory.mktemp("torch-front"))


@pytest.fixture
def streams(stores):
    d, r = Dense.open(stores / "d.zr"), Ragged.open(stores / "r.zr")
    yield {"d": d, "r": r}
    d.close()
    r.close()


def _samples(batch):
    """[index, digest] of every sample, plus its dataset in a mixture (a
    tensor, as every other column is)."""
    from ranks_data import digest

    rows = batch["d"].numpy()
    recs = [t.numpy() for t in batch["r"]]
    out = [[int(row[0]), digest(row, rec)] for row, rec in zip(rows, recs)]
    if "dataset" in batch:
        assert isinstance(batch["dataset"], torch.Tensor) and batch["dataset"].dtype == torch.int64
        for sample, d in zip(out, batch["dataset"].tolist()):
            sample.append(d)
    return out


def _mix(streams):
    """ranks_data's mixture: the stores with themselves, weights 2:1."""
    return {"a": (streams, MIX_WEIGHTS[0]), "b": (streams, MIX_WEIGHTS[1])}


MIX_KW = dict(batch_size=GLOBAL_BATCH, mode=BLOCK_SHUFFLE, block_size=MIX_BLOCK, seed=SEED)


def test_as_tensors_shares_memory_through_dlpack(streams):
    with DataLoader(streams, batch_size=GLOBAL_BATCH, seed=SEED, rank=0, world_size=1, packed=True) as dl:
        batch = next(dl)
    tensors = ztt.as_tensors(batch)
    assert tensors["d"].data_ptr() == batch["d"].ctypes.data  # the same bytes, not a copy
    values, offsets, shapes = batch["r"]
    assert tensors["r"][0].data_ptr() == values.ctypes.data
    assert tensors["d"].dtype == torch.int64 and tuple(tensors["d"].shape) == (GLOBAL_BATCH, 3)
    tensors["d"][0, 1] = 12345  # writable, and the write is seen through the array
    assert batch["d"][0, 1] == 12345


def test_torch_dataloader_batches_are_the_loaders_buffers(streams):
    want = reference("CYCLIC", range(6))
    with ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, seed=SEED, workers=2, prefetch=2, rank=0, world_size=1) as dl:
        kept = []
        for step in range(6):
            batch = next(dl)
            assert isinstance(batch["d"], torch.Tensor) and all(isinstance(t, torch.Tensor) for t in batch["r"])
            assert _samples(batch) == want[step]
            # Each record of a Ragged column is a view into one values buffer.
            bases = {t.untyped_storage().data_ptr() for t in batch["r"]}
            assert len(bases) == 1
            kept.append(batch["d"])
            del batch
        gc.collect()
        # The tensors alone keep the native buffers alive: they are not copies.
        assert dl.loader.live_batches >= len(kept)
        del kept
        gc.collect()
        assert dl.loader.live_batches <= 2 + 1


def test_transform_runs_on_torch_batches(streams):
    def transform(batch):
        return {"sum": batch["d"][:, 0].sum(), "n": len(batch["r"])}

    want = reference("IID", range(4))
    with ztt.DataLoader(
        streams, batch_size=GLOBAL_BATCH, mode=Mode.IID, seed=SEED, transform=transform, rank=0, world_size=1
    ) as dl:
        for step in range(4):
            out = next(dl)
            assert int(out["sum"]) == sum(i for i, _ in want[step]) and out["n"] == GLOBAL_BATCH


def _through_torch(ds, **kw):
    return [_samples(b) for b in tud.DataLoader(ds, batch_size=None, **kw)]


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # 3 on 2 cores, on purpose
@pytest.mark.parametrize("mode", MODES)
def test_iterable_dataset_in_torch_workers_yields_each_step_once_in_order(streams, mode):
    """torch worker i takes steps start+i, start+i+n, ...; torch's in-order
    round-robin then gives steps start, start+1, ... with each sample once."""
    start, steps = 5, 11
    want = reference(mode, range(start, start + steps))
    ds = ztt.IterableDataset(
        streams,
        batch_size=GLOBAL_BATCH,
        mode=Mode[mode],
        seed=SEED,
        rank=0,
        world_size=1,
        start_step=start,
        steps=steps,
    )
    by_workers = {n: _through_torch(ds, num_workers=n) for n in (0, 2, 3)}
    for n, got in by_workers.items():
        assert got == want, f"num_workers={n}"


def test_iterable_dataset_under_spawn_reopens_by_path_and_resumes(streams):
    ds = ztt.IterableDataset(streams, batch_size=GLOBAL_BATCH, seed=SEED, rank=1, world_size=2, steps=6)
    first = _through_torch(ds, num_workers=2, multiprocessing_context="spawn")
    full = reference("CYCLIC", range(12))
    half = GLOBAL_BATCH // 2
    assert first == [s[half:] for s in full[:6]], "rank 1 of 2 gets the second half of each global batch"
    ds.load_state_dict(ds.state_at(6))
    assert ds.start_step == 6
    assert _through_torch(ds, num_workers=2) == [s[half:] for s in full[6:12]]
    with pytest.raises(ValueError, match="seed: saved"):
        ds.load_state_dict({**ds.state_at(6), "seed": SEED + 1})


def test_spawned_workers_reopen_each_stream_as_it_was_opened(stores):
    """A spawned torch worker reopens each stream with the open method it
    was opened by, not as a store at its path (Dense.open of an MDS
    directory failed in the worker): an MDS column and two stores read as
    one give, per step, the records the sampler names, from streaming's own
    decode of the MDS fixture and from the arrays the stores were written
    from."""
    import pathlib

    from zt.loader import Sampler

    mds_dir = pathlib.Path(__file__).parent.parent / "data" / "mds"
    tokens = np.load(mds_dir / "expected-single.npz")["single"]
    records = ragged_records() * 2
    mds = Dense.open_mds(mds_dir / "single", "tokens")
    many = Ragged.open_many([stores / "r.zr", stores / "r.zr"])
    try:
        for name, stream, count in (("m", mds, len(tokens)), ("r", many, len(records))):
            ds = ztt.IterableDataset(
                {name: stream}, batch_size=10, mode=Mode.IID, seed=SEED, rank=0, world_size=1, steps=4
            )
            batches = list(tud.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"))
            sampler = Sampler(count, 10, Mode.IID, SEED, rank=0, world_size=1)
            assert len(batches) == 4
            for step, batch in enumerate(batches):
                idx = sampler.batch(step).tolist()
                if name == "m":
                    assert np.array_equal(batch["m"].numpy(), tokens[idx]), step
                else:
                    assert [t.tolist() for t in batch["r"]] == [records[i].tolist() for i in idx], step
    finally:
        mds.close()
        many.close()


def test_a_mixture_through_the_torch_dataloader_names_each_samples_dataset(streams):
    """zt.torch.DataLoader(mix=..., block_size=...) (issue 38): per step the
    one-process mixture (indices from a Sampler, bytes from the arrays the
    stores were written from), "dataset" an int64 tensor; a transform
    receives it."""
    want = mix_reference(range(30))
    with ztt.DataLoader(mix=_mix(streams), **MIX_KW, workers=3, rank=0, world_size=1) as dl:
        assert dl.datasets == ["a", "b"] and dl.sampler.mix == [(2, 200), (1, 200)]
        got = [_samples(next(dl)) for _ in range(30)]
    assert got == want
    # Each batch holds its 2:1 share.
    assert all(sum(s[2] for s in step) == GLOBAL_BATCH // 3 for step in got)
    with ztt.DataLoader(mix=_mix(streams), **MIX_KW, transform=lambda b: b["dataset"] * 10, rank=0, world_size=1) as dl:
        assert [next(dl).tolist() for _ in range(3)] == [[s[2] * 10 for s in step] for step in want[:3]]
    # Another block size is another stream.
    with ztt.DataLoader(mix=_mix(streams), **{**MIX_KW, "block_size": 1}, rank=0, world_size=1) as dl:
        assert _samples(next(dl)) != want[0]


def test_a_torch_mixture_resumes_on_another_world_size(streams):
    """A state saved by one process resumes the mixture on 2 and 3 ranks:
    at every step the ranks' samples together are the one-process batch;
    another mixture's state is refused."""
    want = mix_reference(range(20))
    with ztt.DataLoader(mix=_mix(streams), **MIX_KW, rank=0, world_size=1) as one:
        for _ in range(9):
            next(one)
        state = one.state_dict()
    assert state["global_step"] == 9 and state["mix"] > 0 and state["block_size"] == MIX_BLOCK
    for world in (2, 3):
        parts = []
        for rank in range(world):
            with ztt.DataLoader(mix=_mix(streams), **MIX_KW, workers=2, rank=rank, world_size=world) as dl:
                dl.load_state_dict(state)
                parts.append([_samples(next(dl)) for _ in range(11)])
        for k in range(11):
            assert sum((p[k] for p in parts), []) == want[9 + k], f"W={world}, step {9 + k}"
    other = {"a": (streams, 1), "b": (streams, 1)}
    with ztt.DataLoader(mix=other, **MIX_KW, rank=0, world_size=1) as dl:
        with pytest.raises(ValueError, match=r"mix: saved \d+, here \d+"):
            dl.load_state_dict(state)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # 3 on 2 cores, on purpose
def test_a_mixture_in_the_iterable_dataset_over_torch_workers_and_spawn(streams):
    """IterableDataset(mix=...): torch workers (forked, and spawned, which
    reopen every dataset's stores by path) yield the mixture's steps in
    order, each once, with "dataset"; state_at/load_state_dict resume it."""
    want = mix_reference(range(16))
    ds = ztt.IterableDataset(mix=_mix(streams), **MIX_KW, rank=0, world_size=1, start_step=2, steps=8)
    assert ds.datasets == ["a", "b"]
    for n in (0, 3):
        assert _through_torch(ds, num_workers=n) == want[2:10], f"num_workers={n}"
    half = GLOBAL_BATCH // 2
    second = ztt.IterableDataset(mix=_mix(streams), **MIX_KW, rank=1, world_size=2, steps=4)
    second.load_state_dict(second.state_at(10))
    got = _through_torch(second, num_workers=2, multiprocessing_context="spawn")
    assert got == [s[half:] for s in want[10:14]], "rank 1 of 2 gets the second half of each global batch"
    with pytest.raises(ValueError, match=r"mix: saved"):
        second.load_state_dict({**second.state_at(3), "mix": second.state_at(3)["mix"] + 1})
    # A single store per dataset is the stream "data", reopened as well.
    single = {"a": (streams["d"], 2), "b": (streams["d"], 1)}
    ds = ztt.IterableDataset(mix=single, **MIX_KW, rank=0, world_size=1, steps=3)
    batches = list(tud.DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn"))
    assert [[int(r[0]) for r in b["data"]] for b in batches] == [[s[0] for s in step] for step in want[:3]]
    assert [b["dataset"].tolist() for b in batches] == [[s[2] for s in step] for step in want[:3]]


def test_pin_memory_without_an_accelerator_warns_as_torch_does(streams):
    if torch.cuda.is_available():
        pytest.skip("an accelerator is present: see test_pin_memory_pins")
    # torch's own DataLoader warns and does not pin when there is nothing to pin for.
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        next(iter(tud.DataLoader(list(range(4)), batch_size=2, pin_memory=True)))
    assert any("pin_memory" in str(w.message) for w in theirs)
    with pytest.warns(UserWarning, match="pin_memory=True but no accelerator"):
        dl = ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, rank=0, world_size=1, pin_memory=True)
    with dl:
        assert not dl.pin_memory and not next(dl)["d"].is_pinned()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinning needs an accelerator")
def test_pin_memory_pins(streams):
    with ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, rank=0, world_size=1, pin_memory=True) as dl:
        batch = next(dl)
        assert batch["d"].is_pinned() and all(t.is_pinned() for t in batch["r"])
        assert _samples({k: v for k, v in batch.items()}) == reference("CYCLIC", range(1))[0]


def test_compiled_step_consumes_batches(streams):
    """The batches are ordinary tensors: a fullgraph torch.compile'd step
    traces them without graph breaks (eager backend: no C++ toolchain)."""

    @torch.compile(backend="eager", fullgraph=True)
    def step(x):
        return (x.float() * 2).sum(dim=1)

    with ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, seed=SEED, rank=0, world_size=1) as dl:
        for _ in range(3):
            x = next(dl)["d"]
            torch.testing.assert_close(step(x), (x.float() * 2).sum(dim=1))


def test_arguments_are_checked(streams):
    with pytest.raises(TypeError, match="settings by keyword"):
        ztt.DataLoader(streams, 8)
    with pytest.raises(TypeError, match="settings by keyword"):
        ztt.IterableDataset(streams, 8)
    with pytest.raises(ValueError, match="health_check needs torch.distributed initialised"):
        ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, rank=0, world_size=1, health_check=5)
    with pytest.raises(ValueError, match="batch_size divisible by 5"):
        ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, rank=0, world_size=5)
    with pytest.raises(ValueError, match="opened for reading"):
        ztt.DataLoader({"x": np.zeros(3)}, batch_size=4, rank=0, world_size=1)
    assert ztt.RankFailure.__module__ == "zt.torch"
    assert len(dense_rows()) == len(ragged_records())
    assert CYCLIC == Mode.CYCLIC


def test_readme_torch_example(tmp_path, monkeypatch):
    """The README's torch example (its ```python torch block), run as written."""
    import re

    from conftest import ROOT

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python torch\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert blocks, "README has no torch example"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


def test_the_fronts_share_zt_loaders_keyword_spec(streams):
    import inspect

    base = inspect.signature(DataLoader).parameters
    front = inspect.signature(ztt.DataLoader).parameters
    dataset = inspect.signature(ztt.IterableDataset).parameters
    assert [k for k in front if k not in base] == ["pin_memory", "health_check"]
    assert [k for k in base if k not in front] == ["step_stride"]
    assert [k for k in dataset if k not in base] == ["steps"]
    assert [k for k in base if k not in dataset] == ["transform", "step_stride"]
    for name, p in base.items():
        if name in front:
            assert front[name].default == p.default, name
        if name in dataset and name not in ("workers", "prefetch"):
            assert dataset[name].default == p.default, name
    assert (dataset["workers"].default, dataset["prefetch"].default) == (2, 2)
    # Checked in the main process, with zt.loader's messages.
    with pytest.raises(ValueError, match="workers must be positive"):
        ztt.IterableDataset(streams, batch_size=GLOBAL_BATCH, workers=0, rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"steps must be in 0\.\.2\^64-1"):
        ztt.IterableDataset(streams, batch_size=GLOBAL_BATCH, steps=-1, rank=0, world_size=1)
    with pytest.raises(TypeError, match="zt.torch.DataLoader\\(\\) got an unexpected keyword argument 'step_stride'"):
        ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, step_stride=2, rank=0, world_size=1)
    with pytest.raises(TypeError, match="transform must be callable"):
        ztt.DataLoader(streams, batch_size=GLOBAL_BATCH, transform=3, rank=0, world_size=1)
