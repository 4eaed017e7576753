"""The plan of ``zt.torch.load_sharded`` (``zt._load_plan``), without torch:
carried out in numpy over random tensors, placements, meshes and windows,
every rank ends with exactly its ``torch.chunk`` slices (computed here with
``np.array_split``'s torch.chunk equivalent), every byte is fetched once,
the fetching is balanced, and a window moves no more than asked."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from zt import _load_plan as lp


def _chunk_slice(n: int, parts: int, index: int) -> slice:
    """torch.chunk's piece `index` of `n`, written out independently."""
    size = math.ceil(n / parts) if n else 0
    pieces = [(i * size, min((i + 1) * size, n)) for i in range(parts) if i * size < n]
    if index < len(pieces):
        return slice(*pieces[index])
    return slice(0, 0)


def _expected(full: np.ndarray, dims, coord, mesh) -> np.ndarray:
    local = full
    for axis, dim in enumerate(dims):
        if dim is not None:
            index = [slice(None)] * local.ndim
            index[dim] = _chunk_slice(local.shape[dim], mesh[axis], coord[axis])
            local = local[tuple(index)]
    return local


def _carry_out(plan: lp.Plan, arrays: list[np.ndarray], world: int) -> list[list[np.ndarray]]:
    """Run the plan: fetch (slice rows of the stored array), exchange."""
    outputs = [
        [np.full(tuple(b - a for a, b in plan.boxes[i][r]), -1, dtype=arrays[i].dtype) for i in range(len(arrays))]
        for r in range(world)
    ]
    for k in range(len(plan.windows)):
        fetched = [
            {b: arrays[b.item][b.start : b.stop] if arrays[b.item].ndim else arrays[b.item] for b in plan.windows[k][r]}
            for r in range(world)
        ]
        for sender in range(world):
            for receiver in range(world):
                for piece in plan.pieces(k, sender, receiver):
                    outputs[receiver][piece.block.item][piece.dest] = fetched[sender][piece.block][piece.source]
    return outputs


def _random_case(rng: random.Random):
    mesh = rng.choice([(1,), (2,), (3,), (4,), (2, 2), (2, 3)])
    world = math.prod(mesh)
    items, arrays = [], []
    for i in range(rng.randint(1, 7)):
        ndim = rng.choice([0, 1, 2, 2, 3])
        shape = tuple(rng.choice([0, 1, 2, 3, 5, 9, 17]) for _ in range(ndim))
        dims = tuple(rng.choice([None, *range(ndim)]) if ndim else None for _ in mesh)
        arr = np.arange(math.prod(shape), dtype=np.int32).reshape(shape) + 1000 * i
        sliceable = bool(ndim) and rng.random() < 0.8
        items.append(lp.Item(f"t{i}", shape, "int32", 4, sliceable, (0, i), dims))
        arrays.append(arr)
    coords = [tuple(int(c) for c in np.unravel_index(r, mesh)) for r in range(world)]
    return mesh, world, coords, items, arrays


@pytest.mark.parametrize("seed", range(300))
def test_every_rank_ends_with_exactly_its_slices(seed):
    rng = random.Random(seed)
    mesh, world, coords, items, arrays = _random_case(rng)
    window = rng.choice([1, 16, 100, 1 << 20])
    plan = lp.plan(items, coords, mesh, window)
    outputs = _carry_out(plan, arrays, world)
    for r in range(world):
        for i, item in enumerate(items):
            want = _expected(arrays[i], item.placements, coords[r], mesh)
            np.testing.assert_array_equal(outputs[r][i], want, err_msg=f"rank {r} {item}")


@pytest.mark.parametrize("seed", range(100))
def test_every_byte_is_fetched_once(seed):
    mesh, world, coords, items, _ = _random_case(random.Random(seed))
    plan = lp.plan(items, coords, mesh, 64)
    seen = {}
    for window in plan.windows:
        for blocks in window:
            for b in blocks:
                for row in range(b.start, b.stop):
                    assert (b.item, row) not in seen, (b, seen[(b.item, row)])
                    seen[(b.item, row)] = b
    for i, item in enumerate(items):
        kept = any(all(a < z for a, z in plan.boxes[i][r]) for r in range(world))
        rows = set(range(item.rows)) if item.nbytes and kept else set()
        assert {row for (j, row) in seen if j == i} == rows, item


def _items(n: int, rows: int, cols: int, dims) -> list[lp.Item]:
    return [lp.Item(f"t{i}", (rows, cols), "float32", 4, True, (0, i), dims) for i in range(n)]


def test_shard_0_slices_are_read_by_their_keepers_and_never_sent():
    items = _items(3, 40, 8, (0,))
    plan = lp.plan(items, [(r,) for r in range(4)], (4,), 1 << 20)
    for k in range(len(plan.windows)):
        for s in range(4):
            for p in range(4):
                assert s == p or not plan.pieces(k, s, p)
    assert [plan.fetched_bytes(r) for r in range(4)] == [3 * 10 * 32] * 4


def test_replicated_tensors_are_fetched_in_equal_shares():
    items = _items(5, 101, 16, (None,))
    plan = lp.plan(items, [(r,) for r in range(3)], (3,), 1 << 20)
    shares = [plan.fetched_bytes(r) for r in range(3)]
    assert sum(shares) == 5 * 101 * 64
    assert max(shares) - min(shares) <= 64  # within one row


def test_a_tensor_read_whole_goes_to_the_least_loaded_rank():
    items = [lp.Item("big", (64, 64), "float32", 4, False, (0, 0), (None,))] + _items(2, 8, 8, (None,))
    plan = lp.plan(items, [(0,), (1,)], (2,), 1 << 20)
    holders = [r for r in range(2) for w in plan.windows for b in w[r] if b.item == 0]
    assert len(holders) == 1
    other = 1 - holders[0]
    assert plan.fetched_bytes(other) == 2 * 8 * 8 * 4  # the small ones went to the other rank


def test_a_window_sends_at_most_its_budget():
    items = _items(4, 50, 10, (None,)) + _items(2, 30, 12, (1,))
    plan = lp.plan(items, [(r,) for r in range(3)], (3,), 2000)
    assert len(plan.windows) > 1
    for k in range(len(plan.windows)):
        for s in range(3):
            sent = sum(piece.nbytes for p in range(3) if p != s for piece in plan.pieces(k, s, p))
            assert sent <= 2000, (k, s, sent)


def test_chunk_is_torch_chunk():
    for n in range(0, 40):
        for parts in range(1, 7):
            for i in range(parts):
                s = _chunk_slice(n, parts, i)
                assert lp.chunk(n, parts, i)[1] - lp.chunk(n, parts, i)[0] == s.stop - s.start
