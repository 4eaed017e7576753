"""zt.loader's BLOCK_SHUFFLE and mixtures (issue 38), end to end over real
stores: every batch is the stores' records at the sampler's indices, every
record comes once per epoch (of its dataset), a mixture holds its weights
in every batch and names each sample's dataset, and a saved state resumes
the same batches on another world size (and is refused by another
mixture). The sampling itself is pinned in loader/tests/mix.rs."""

from __future__ import annotations

import numpy as np
import pytest

from zt.loader import BLOCK_SHUFFLE, CYCLIC, IID, SEQUENTIAL, DataLoader, Sampler, integer_weights
from zt.zrecord import Dense, Ragged

WEB, CODE = 700, 130  # records
CODE_BASE = 100_000  # code record i holds CODE_BASE + i


def _write(path, first, n, ragged_path):
    with Dense.create(path, np.int64, (2,), data_shards=3) as w:
        ids = np.arange(first, first + n, dtype=np.int64)
        w.append(np.stack([ids, 3 * ids], axis=1))
    with Ragged.create(ragged_path, np.int32, 1, codec="zstd") as w:
        w.append([np.full(1 + i % 4, first + i, np.int32) for i in range(n)])


@pytest.fixture
def datasets(tmp_path):
    _write(tmp_path / "web.zr", 0, WEB, tmp_path / "web-r.zr")
    _write(tmp_path / "code.zr", CODE_BASE, CODE, tmp_path / "code-r.zr")
    opened = {
        "web": {"ids": Dense.open(tmp_path / "web.zr"), "text": Ragged.open(tmp_path / "web-r.zr")},
        "code": {"ids": Dense.open(tmp_path / "code.zr"), "text": Ragged.open(tmp_path / "code-r.zr")},
    }
    yield opened
    for streams in opened.values():
        for s in streams.values():
            s.close()


def _ids(batch) -> list[int]:
    """The records' ids, checked across both streams."""
    ids = batch["ids"][:, 0].tolist()
    assert batch["ids"][:, 1].tolist() == [3 * i for i in ids]
    assert [int(t[0]) for t in batch["text"]] == ids
    assert [len(t) for t in batch["text"]] == [1 + (i % CODE_BASE) % 4 for i in ids]
    return ids


def _mix(datasets, web=0.7, code=0.3):
    return {"web": (datasets["web"], web), "code": (datasets["code"], code)}


def test_block_shuffle_batches_are_the_records_once_per_epoch(datasets):
    web = datasets["web"]
    with DataLoader(web, batch_size=64, mode=BLOCK_SHUFFLE, block_size=16, seed=3, workers=2) as dl:
        seen = []
        for _ in range(3 * WEB // 64 + 1):
            seen.extend(_ids(dl.next()))
        expected = Sampler(WEB, 64, BLOCK_SHUFFLE, 3, rank=0, world_size=1, block_size=16)
        assert seen[:64] == expected.batch(0).tolist()
    for e in range(3):
        assert sorted(seen[e * WEB : (e + 1) * WEB]) == list(range(WEB))
    # Runs of the block: far fewer breaks than a shuffle of records.
    breaks = sum(b != a + 1 for a, b in zip(seen[:WEB], seen[1:WEB]))
    assert breaks <= WEB // 16 + 2
    assert seen[:WEB] != seen[WEB : 2 * WEB]


def test_a_mixture_holds_its_weights_and_names_each_dataset(datasets):
    with DataLoader(mix=_mix(datasets), batch_size=20, mode=CYCLIC, seed=1, workers=3) as dl:
        assert dl.datasets == ["web", "code"]
        assert dl.sampler.mix == [(7, WEB), (3, CODE)]
        web, code = [], []
        for _ in range(200):
            batch = dl.next()
            ids = _ids(batch)
            which = batch["dataset"].tolist()
            # 7:3 sums to 10, a batch of 20 starts at a multiple of it.
            assert which.count(0) == 14 and which.count(1) == 6
            for i, d in zip(ids, which):
                assert d == (1 if i >= CODE_BASE else 0)
                (code if d else web).append(i % CODE_BASE)
    # Each dataset is read once per its own epoch (web: 2800 / 700 = 4).
    for got, n in ((web, WEB), (code, CODE)):
        for e in range(len(got) // n):
            assert sorted(got[e * n : (e + 1) * n]) == list(range(n))


@pytest.mark.parametrize("mode", [BLOCK_SHUFFLE, IID, SEQUENTIAL])
def test_a_mixture_in_every_mode_gathers_its_indices(datasets, mode):
    s = Sampler(WEB + CODE, 24, mode, 9, rank=0, world_size=1, block_size=8, mix=[(1, WEB), (1, CODE)])
    with DataLoader(mix=_mix(datasets, 1, 1), batch_size=24, mode=mode, seed=9, block_size=8, workers=2) as dl:
        for step in range(40):
            batch = dl.next()
            want = [i if i < WEB else CODE_BASE + i - WEB for i in s.batch(step).tolist()]
            assert _ids(batch) == want
            assert batch["dataset"].tolist() == [int(i >= WEB) for i in s.batch(step).tolist()]


def test_a_mixture_resumes_on_another_world_size(datasets):
    kw = dict(mix=_mix(datasets), batch_size=24, mode=BLOCK_SHUFFLE, block_size=8, seed=5, workers=2)
    with DataLoader(**kw, rank=0, world_size=1) as one:
        run = [_ids(one.next()) for _ in range(30)]
        one.seek(12)
        state = one.state_dict()
    assert state["mode"] == 4 and state["block_size"] == 8 and state["mix"] > 0
    assert state["length"] == WEB + CODE and state["global_step"] == 12
    for world in (2, 3, 4):
        parts = []
        for rank in range(world):
            with DataLoader(**kw, rank=rank, world_size=world) as dl:
                dl.load_state_dict(state)
                parts.append([_ids(dl.next()) for _ in range(6)])
        for k in range(6):
            assert sum((p[k] for p in parts), []) == run[12 + k]
    # Another mixture, another block size or none: another stream, refused.
    other = dict(kw, mix=_mix(datasets, 0.6, 0.4))
    with DataLoader(**other, rank=0, world_size=1) as dl:
        with pytest.raises(ValueError, match=r"mix: saved \d+, here \d+"):
            dl.load_state_dict(state)
        dl.load_state_dict(state, rebase=True)
        assert dl.step == 12
    with DataLoader(**dict(kw, block_size=4), rank=0, world_size=1) as dl:
        with pytest.raises(ValueError, match="block_size: saved 8, here 4"):
            dl.load_state_dict(state)
    with DataLoader(datasets["web"], batch_size=24, rank=0, world_size=1) as dl:
        with pytest.raises(ValueError, match="different settings"):
            dl.load_state_dict(state)


def test_a_mixture_of_single_stores_and_a_transform(datasets):
    mix = {"web": (datasets["web"]["ids"], 2), "code": (datasets["code"]["ids"], 1)}
    with DataLoader(mix=mix, batch_size=9, transform=lambda b: (b["data"][:, 0], b["dataset"]), workers=2) as dl:
        for _ in range(10):
            ids, which = dl.next()
            assert ids.tolist() and len(which) == 9 and which.tolist().count(0) == 6
            assert [int(i >= CODE_BASE) for i in ids.tolist()] == which.tolist()


def test_a_mixture_of_stores_with_other_codecs(datasets, tmp_path):
    """A raw dataset mixed with a zstd one reads both, and the reader the
    loader concatenates says so ("mixed", each store's codec) instead of
    reporting the first store's codec for every record."""
    from zt import _zt

    with Dense.create(tmp_path / "z.zr", np.int64, (2,), codec="zstd") as w:
        ids = np.arange(CODE_BASE, CODE_BASE + 50, dtype=np.int64)
        w.append(np.stack([ids, 3 * ids], axis=1))
    with Dense.open(tmp_path / "z.zr") as z:
        web = datasets["web"]["ids"]
        joined = _zt.RecordReader.concat([web._reader, z._reader])
        assert (joined.codec, joined.codecs, joined.has_dict()) == ("mixed", ["raw", "zstd"], False)
        same = _zt.RecordReader.concat([z._reader, z._reader])
        assert (same.codec, same.codecs) == ("zstd", ["zstd", "zstd"])
        with DataLoader(mix={"web": (web, 1), "z": (z, 1)}, batch_size=10, workers=2, rank=0, world_size=1) as dl:
            for _ in range(12):
                batch = dl.next()
                rows, which = batch["data"], batch["dataset"].tolist()
                assert rows[:, 1].tolist() == [3 * i for i in rows[:, 0].tolist()]
                assert [int(i >= CODE_BASE) for i in rows[:, 0].tolist()] == which


def test_bad_mixtures_are_refused(datasets, tmp_path):
    web, code = datasets["web"], datasets["code"]
    with pytest.raises(TypeError, match="streams or mix="):
        DataLoader(web, mix=_mix(datasets))
    with pytest.raises(TypeError, match="needs streams"):
        DataLoader()
    with pytest.raises(TypeError, match="pair"):
        DataLoader(mix={"web": web})
    with pytest.raises(ValueError, match="has streams"):
        DataLoader(mix={"web": (web, 1), "code": ({"ids": code["ids"]}, 1)})
    with pytest.raises(ValueError, match="differs in type or dtype"):
        DataLoader(mix={"web": (web, 1), "code": ({"ids": code["text"], "text": code["ids"]}, 1)})
    with pytest.raises(ValueError, match="positive and finite"):
        DataLoader(mix={"web": (web, 1), "code": (code, 0)})
    with pytest.raises(ValueError, match="positive and finite"):
        DataLoader(mix={"web": (web, float("nan")), "code": (code, 1)})
    with pytest.raises(ValueError, match='"dataset"'):
        DataLoader(mix={"web": ({"dataset": web["ids"]}, 1), "code": ({"dataset": code["ids"]}, 1)})
    with Dense.create(tmp_path / "f.zr", np.float64, (2,)) as w:
        w.append(np.zeros((3, 2)))
    with Dense.open(tmp_path / "f.zr") as f:
        with pytest.raises(ValueError, match="differs in type or dtype"):
            DataLoader(mix={"web": (web["ids"], 1), "f": (f, 1)})
    with pytest.raises(ValueError, match="block_size must be in 1"):
        DataLoader(web, mode=BLOCK_SHUFFLE, block_size=0)


def test_integer_weights():
    assert integer_weights([0.7, 0.3]) == [7, 3]
    assert integer_weights([2, 4]) == [1, 2]
    assert integer_weights([0.5, 0.25, 0.25]) == [2, 1, 1]
    assert integer_weights([1, 1, 1]) == [1, 1, 1]
    third = integer_weights([1 / 3, 2 / 3])  # no short exact form: rounded
    assert sum(third) <= 1 << 24 and abs(third[1] / sum(third) - 2 / 3) < 1e-6
    assert integer_weights([1e-9, 1.0])[0] >= 1
    with pytest.raises(TypeError):
        integer_weights(["1"])
