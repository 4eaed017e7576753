"""The records that train a store's dictionary (``zrecord::samples``, what
makes zt's dictionaries loaderx's byte for byte), against loaderx's own
numpy expression over many sizes, and a store's native ``train_dict``
against the same training done by hand in Python."""

from __future__ import annotations

import numpy as np
import pytest

from zt import _zt
from zt.zrecord import Dense, Ragged, train_dict


def _numpy_selection(total: int, item: int, budget: int) -> list[int]:
    k = min(total, max(1, budget // max(item, 1)))
    return np.unique(np.linspace(0, total - 1, k).astype(np.int64)).tolist()


def test_the_selection_is_loaderxs_numpy_expression():
    rng = np.random.default_rng(3)
    cases = [(1, 1, 1), (2, 5, 4), (10**9, 1, 4 << 20), (4097, 3, 4 << 20), (10**6 + 7, 48, 4 << 20)]
    cases += [
        (int(n), int(i), int(b))
        for n, i, b in zip(rng.integers(1, 10**7, 300), rng.integers(1, 5000, 300), rng.integers(1, 64 << 20, 300))
    ]
    for total, item, budget in cases:
        assert _zt.zrecord_sample_indices(total, item, budget) == _numpy_selection(total, item, budget), (
            total,
            item,
            budget,
        )


@pytest.mark.parametrize("geometry", ["dense", "ragged"])
def test_a_stores_dictionary_is_trained_on_loaderxs_selection(tmp, geometry):
    rng = np.random.default_rng(5)
    if geometry == "dense":
        rows = (rng.integers(0, 40, size=(3000, 96)) // 7).astype(np.uint8)
        with Dense.create(tmp / "s", np.uint8, (96,)) as ds:
            ds.append(rows)
        store = Dense.open(tmp / "s")
        by_hand = rows[_numpy_selection(3000, 96, 4 << 20)]
        samples, sizes = by_hand.reshape(-1), [96] * len(by_hand)
    else:
        records = [(rng.integers(0, 30, size=int(n)) // 5).astype(np.int32) for n in rng.integers(1, 60, 2000)]
        with Ragged.create(tmp / "s", np.int32, 1) as ds:
            ds.append(records)
        store = Ragged.open(tmp / "s")
        item = int(np.mean([r.nbytes for r in records[:32]])) or 1
        picked = [records[i] for i in _numpy_selection(2000, item, 4 << 20)]
        samples, sizes = np.concatenate(picked).view(np.uint8), [r.nbytes for r in picked]
    with store:
        native = train_dict(store)
    assert native and native == _zt.train_dict(np.ascontiguousarray(samples), sizes, 32 << 10)
