"""zt.loader.Sampler against the reference, loaderx 2.3.8's Sampler.

SEQUENTIAL and CYCLIC must produce loaderx's index streams exactly (same
batches at every step), except where loaderx's 64-bit arithmetic wraps; those
cases are checked against exact big-integer arithmetic, and loaderx is shown
to differ there. IID is zt's own counter-based stream and is checked
statistically, as is LOADERX_IID (loaderx 2.8.19's IID stream, compared with
that library value for value in tests/test_loaderx28.py). Ranks run as
separate processes with RANK/WORLD_SIZE set.
"""

from __future__ import annotations

import doctest
import json
import math
import os
import random
import subprocess
import sys
import threading
from statistics import NormalDist

import numpy as np
import pytest
from loaderx.zsampler import Sampler as LoaderxSampler

import zt.loader
from zt.loader import CYCLIC, IID, LOADERX_IID, SEQUENTIAL, Sampler

U64 = (1 << 64) - 1

# (length, batch) pairs: tiny spaces, length < batch, batch dividing length or
# not, batch 1, batch == length.
SMALL = [
    (1, 1),
    (1, 5),
    (2, 3),
    (3, 8),
    (5, 5),
    (7, 2),
    (10, 4),
    (12, 4),
    (16, 16),
    (17, 5),
    (100, 1),
    (100, 7),
    (1000, 32),
    (1000, 999),
    (4096, 256),
    (12345, 100),
]
SEEDS = [0, 1, 42, 0xDEADBEEF, U64]

# Spaces far beyond any dataset; loaderx's CYCLIC and (below the overflow)
# SEQUENTIAL still work there.
HUGE = [1 << 32, (1 << 32) + 1, 1 << 40, (1 << 62) + 1, 1 << 63, (1 << 63) + 1, U64 - 1, U64]


def chi_square_bounds(dof: int, p: float) -> tuple[float, float]:
    """Two-sided bounds of a chi-square statistic at total tail probability
    `p` (Wilson-Hilferty approximation, accurate for dof >= 30)."""
    z = NormalDist().inv_cdf(1 - p / 2)
    c = 2 / (9 * dof)
    return dof * (1 - c - z * math.sqrt(c)) ** 3, dof * (1 - c + z * math.sqrt(c)) ** 3


def loaderx_stream(length: int, batch: int, mode: int, seed: int, steps: int, start: int = 0) -> list[list[int]]:
    with LoaderxSampler(length, batch, mode, seed) as ref:
        if start:
            ref.seek(start)
        return [ref.next().tolist() for _ in range(steps)]


def zt_stream(length: int, batch: int, mode: int, seed: int, steps: int, start: int = 0) -> list[list[int]]:
    s = Sampler(length, batch, mode, seed, rank=0, world_size=1)
    s.seek(start)
    return [s.next().tolist() for _ in range(steps)]


# -- identical streams ------------------------------------------------------------


@pytest.mark.parametrize("mode", [SEQUENTIAL, CYCLIC], ids=["sequential", "cyclic"])
@pytest.mark.parametrize("length,batch", SMALL)
def test_stream_matches_loaderx(length: int, batch: int, mode: int) -> None:
    # Enough steps for at least three cycles (CYCLIC) or three laps of the ring.
    steps = min(400, 3 * max(length // batch, 1) + 3)
    for seed in SEEDS:
        assert zt_stream(length, batch, mode, seed, steps) == loaderx_stream(length, batch, mode, seed, steps), seed


@pytest.mark.parametrize("mode", [SEQUENTIAL, CYCLIC], ids=["sequential", "cyclic"])
def test_seek_matches_loaderx(mode: int) -> None:
    """Random (length, batch, seed, step) including steps near 2^64 for
    CYCLIC, and SEQUENTIAL steps below loaderx's overflow (step*B < 2^64)."""
    rng = random.Random(8)
    for _ in range(300):
        length = rng.choice([rng.randrange(1, 50), rng.randrange(1, 10**6), rng.randrange(1, 1 << 40)])
        batch = rng.randrange(1, 300)
        seed = rng.randrange(1 << 64)
        if mode == CYCLIC:
            step = rng.choice([rng.randrange(1000), rng.randrange(U64), U64 - 1])
        else:
            step = rng.randrange(U64 // batch)
        assert zt_stream(length, batch, mode, seed, 2, step) == loaderx_stream(length, batch, mode, seed, 2, step)
        # The pure form agrees with the stream.
        s = Sampler(length, batch, mode, seed, rank=0, world_size=1)
        assert s.batch(step).tolist() == loaderx_stream(length, batch, mode, seed, 1, step)[0]


@pytest.mark.parametrize("length", HUGE)
def test_cyclic_huge_lengths_match_loaderx(length: int) -> None:
    rng = random.Random(length)
    for batch in (1, 2, 3, 64):
        seed = rng.randrange(1 << 64)
        assert zt_stream(length, batch, CYCLIC, seed, 3) == loaderx_stream(length, batch, CYCLIC, seed, 3)
        for step in (rng.randrange(U64), U64 - 1, U64 // batch - 1):
            ours = zt_stream(length, batch, CYCLIC, seed, 2, step)  # steps below 2^64 - 1: no wrap
            assert ours == loaderx_stream(length, batch, CYCLIC, seed, 2, step)
            assert all(0 <= v < length for b in ours for v in b)


@pytest.mark.parametrize("length", HUGE)
def test_sequential_huge_lengths(length: int) -> None:
    """Where loaderx's arithmetic cannot wrap (step*B < 2^64 and, while
    stepping, cursor + B < 2^64) the streams agree; everywhere zt equals the
    exact ring (s*B + i) mod length."""
    rng = random.Random(length)
    for batch in (1, 3, 64):
        for step in (0, rng.randrange(U64 // batch), U64 // batch, rng.randrange(1 << 64), U64):
            ours = zt_stream(length, batch, SEQUENTIAL, 0, 3, step)
            # The step counter is a u64: after 2^64 - 1 comes step 0.
            exact = [[(((step + k) % (1 << 64)) * batch + i) % length for i in range(batch)] for k in range(3)]
            assert ours == exact
            loaderx_cannot_wrap = (step + 2) * batch < 1 << 64 and length + batch <= 1 << 64
            if loaderx_cannot_wrap:
                assert ours == loaderx_stream(length, batch, SEQUENTIAL, 0, 3, step)


def test_sequential_differs_from_loaderx_only_where_it_wraps() -> None:
    """The documented divergences, shown against loaderx itself."""
    # seek: 3 * 2^63 wraps to 2^63 in loaderx, so its cursor is 2^63 mod 10 = 8.
    assert loaderx_stream(10, 3, SEQUENTIAL, 0, 1, 1 << 63) == [[8, 9, 0]]
    assert zt_stream(10, 3, SEQUENTIAL, 0, 1, 1 << 63) == [[4, 5, 6]]  # (3 * 2^63) mod 10 = 4
    # next: cursor + B passes 2^64 when length + B > 2^64.
    length, batch, step = U64, 4, (1 << 62) - 1  # cursor = 2^64 - 4 = length - 3
    theirs = loaderx_stream(length, batch, SEQUENTIAL, 0, 2, step)
    ours = zt_stream(length, batch, SEQUENTIAL, 0, 2, step)
    assert ours == [[U64 - 3, U64 - 2, U64 - 1, 0], [1, 2, 3, 4]]
    assert theirs[0] == ours[0]
    assert theirs[1] == [0, 1, 2, 3]  # loaderx's cursor wrapped to 2^64 mod 2^64 = 0


def test_step_counter_wraps_after_the_last_step() -> None:
    """The one CYCLIC divergence: zt's step is a u64 that wraps to 0 after
    2^64 - 1; loaderx's cycle counter instead moves on to the cycle "step
    2^64" would be in. Step 2^64 - 1 itself agrees."""
    length, batch, seed = 1000, 10, 3  # 100 steps per cycle
    ours = zt_stream(length, batch, CYCLIC, seed, 2, U64)
    theirs = loaderx_stream(length, batch, CYCLIC, seed, 2, U64)
    assert ours[0] == theirs[0]
    assert ours[1] == zt_stream(length, batch, CYCLIC, seed, 1, 0)[0]
    s = Sampler(length, batch, CYCLIC, seed, rank=0, world_size=1)
    s.seek(U64)
    s.next()
    assert s.step == 0


# -- cycles -------------------------------------------------------------------------


@pytest.mark.parametrize("length,batch", [(12, 4), (10, 4), (1000, 7), (1000, 1000), (3, 8), (1, 1), (4099, 64)])
def test_cyclic_covers_each_cycle(length: int, batch: int) -> None:
    """Each cycle is a permutation: distinct records, all of them when the
    batch divides the length; otherwise `length % batch` are dropped, a
    different set per cycle, so every record is reached over the cycles."""
    for seed in (0, 5, 123):
        s = Sampler(length, batch, CYCLIC, seed, rank=0, world_size=1)
        spc = s.steps_per_cycle
        assert spc == max(length // batch, 1)
        ever: set[int] = set()
        dropped = []
        for _cycle in range(20):
            cycle = np.concatenate([s.next() for _ in range(spc)])
            assert len(np.unique(cycle)) == cycle.size, "a record repeated inside a cycle"
            assert cycle.size == (length - length % batch if length >= batch else length)
            assert cycle.min() >= 0 and cycle.max() < length
            ever.update(cycle.tolist())
            dropped.append(frozenset(range(length)) - frozenset(cycle.tolist()))
        if length % batch and length >= batch:
            assert len(set(dropped)) > 1, "the dropped remainder did not rotate"
        if length <= 1000:
            assert ever == set(range(length))


# -- IID ----------------------------------------------------------------------------

P_VALUE = 1e-6  # a uniform generator fails these bounds with probability 1e-6
IIDS = pytest.mark.parametrize("iid", [IID, LOADERX_IID], ids=["iid", "loaderx_iid"])


@IIDS
def test_iid_uniform_counts(iid: int) -> None:
    """256,000 draws into 1,000 bins (256 expected per bin), three seeds:
    the chi-square statistic (999 dof) must lie inside the two-sided
    p = 1e-6 bounds."""
    low, high = chi_square_bounds(999, P_VALUE)
    for seed in (42, 7, U64):
        s = Sampler(1000, 256, iid, seed, rank=0, world_size=1)
        counts = np.bincount(np.concatenate([s.next() for _ in range(1000)]), minlength=1000)
        chi = float(((counts - 256.0) ** 2 / 256.0).sum())
        assert low < chi < high, (seed, chi, low, high)


@IIDS
def test_iid_unbiased_where_rejection_matters(iid: int) -> None:
    """length = 3 * 2^62: a multiply-shift without rejection returns
    multiples of 3 half the time instead of a third, and `x mod length`
    puts half the mass on the lowest third. Both show in these counts."""
    length = 3 << 62
    s = Sampler(length, 1000, iid, 11, rank=0, world_size=1)
    assert s.dtype == np.uint64  # indices up to 3 * 2^62 - 1 do not fit int64
    draws = np.concatenate([s.next() for _ in range(60)])
    assert int(draws.max()) < length
    thirds = (draws // (1 << 62)).astype(np.int64)
    for counts in (np.bincount((draws % 3).astype(np.int64), minlength=3), np.bincount(thirds, minlength=3)):
        e = draws.size / 3
        chi = float(((counts - e) ** 2 / e).sum())
        assert chi < -2 * math.log(P_VALUE), counts  # 2 dof: P(chi > x) = exp(-x/2)


@IIDS
def test_iid_in_range_and_deterministic(iid: int) -> None:
    for length in (1, 2, 3, 1000, (1 << 63) + 1, U64):
        a = Sampler(length, 512, iid, 3, rank=0, world_size=1)
        b = Sampler(length, 512, iid, 3, rank=0, world_size=1)
        for _ in range(5):
            x, y = a.next(), b.next()
            assert (x == y).all()
            assert int(x.max()) < length
    assert (Sampler(1, 64, iid, 3, rank=0, world_size=1).next() == 0).all()
    different = Sampler(1000, 64, iid, 4, rank=0, world_size=1).next()
    assert not (Sampler(1000, 64, iid, 3, rank=0, world_size=1).next() == different).all()


def test_the_two_iid_streams_differ_and_only_loaderx_iid_ignores_the_batch_size() -> None:
    # zt's IID keys each step; loaderx 2.8's keys each stream position
    # step * batch_size + i, so batch size 2B reads B's indices two at a time.
    zt_iid, lx_iid = (Sampler(1000, 8, m, 5, rank=0, world_size=1).next() for m in (IID, LOADERX_IID))
    assert not (zt_iid == lx_iid).all()
    half = Sampler(1000, 4, LOADERX_IID, 5, rank=0, world_size=1)
    assert (np.concatenate([half.next(), half.next()]) == lx_iid).all()
    half = Sampler(1000, 4, IID, 5, rank=0, world_size=1)
    assert not (np.concatenate([half.next(), half.next()]) == zt_iid).all()


# -- seek, state, borrow ----------------------------------------------------------------


@pytest.mark.parametrize(
    "mode", [SEQUENTIAL, IID, CYCLIC, LOADERX_IID], ids=["sequential", "iid", "cyclic", "loaderx_iid"]
)
def test_seek_equals_replay(mode: int) -> None:
    replay = Sampler(1000, 32, mode, 9, rank=0, world_size=1)
    stream = [replay.next().copy() for _ in range(100)]
    sought = Sampler(1000, 32, mode, 9, rank=0, world_size=1)
    for k in (0, 1, 31, 32, 99, 50, 7):
        sought.seek(k)
        assert sought.step == k
        assert (sought.next() == stream[k]).all()
        assert sought.step == k + 1
        assert (sought.batch(k) == stream[k]).all()
        assert sought.step == k + 1, "batch() must not move the step"
    iterator = iter(Sampler(1000, 32, mode, 9, rank=0, world_size=1))
    assert (next(iterator) == stream[0]).all() and (next(iterator) == stream[1]).all()


def test_state_dict_resumes_exactly() -> None:
    a = Sampler(5000, 64, CYCLIC, 5, rank=0, world_size=1)
    for _ in range(123):
        a.next()
    state = a.state_dict()
    assert state == {
        "version": 2,
        "global_step": 123,
        "global_batch_size": 64,
        "length": 5000,
        "mode": 2,
        "seed": 5,
        "samples_seen": 123 * 64,
    }
    json.dumps(state)  # checkpoint-friendly
    b = Sampler(5000, 64, CYCLIC, 5, rank=0, world_size=1)
    b.load_state_dict(state)
    for _ in range(100):
        assert (a.next() == b.next()).all()
    with pytest.raises(ValueError, match="seed: saved 5, here 6"):
        Sampler(5000, 64, CYCLIC, 6, rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(KeyError, match="global_step"):
        b.load_state_dict({k: v for k, v in state.items() if k != "global_step"})
    # The first format (before elastic resume) still loads.
    old = {"length": 5000, "batch_size": 64, "mode": 2, "seed": 5, "step": 40}
    b.load_state_dict(old)
    assert b.step == 40
    with pytest.raises(KeyError, match="step"):
        b.load_state_dict({k: v for k, v in old.items() if k != "step"})


def test_next_returns_fresh_arrays_or_fills_out() -> None:
    s = Sampler(1000, 16, IID, 1, rank=0, world_size=1)
    first, second = s.next(), s.next()
    assert first.dtype == np.int64 and first.shape == (16,)
    assert first.flags.writeable and first.base.obj.__class__ is bytearray  # its own memory, not the sampler's
    assert not np.shares_memory(first, second)
    kept = first.copy()
    s.next()
    assert (first == kept).all(), "a fresh array must not change on the next draw"

    out = np.empty(16, np.int64)
    got = s.next(out)
    assert got is out
    assert (out == s.batch(3)).all()
    s.next(out)  # the borrow: the same memory, overwritten
    assert (out == s.batch(4)).all()
    assert (s.batch(2, out=out) == s.batch(2)).all()

    for bad, error in [
        (np.empty(16, np.int32), ValueError),
        (np.empty(15, np.int64), ValueError),
        (np.empty((4, 4), np.int64), ValueError),
        (np.empty(32, np.int64)[::2], ValueError),
        ([0] * 16, TypeError),
    ]:
        with pytest.raises(error):
            s.next(bad)
    readonly = np.empty(16, np.int64)
    readonly.flags.writeable = False
    step = s.step
    with pytest.raises(ValueError, match="writeable"):
        s.next(readonly)
    assert s.step == step, "a refused out must not consume a step"


def test_concurrent_next_draws_distinct_steps() -> None:
    s = Sampler(10**6, 64, IID, 2, rank=0, world_size=1)
    got: list[tuple[int, ...]] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(200):
            b = tuple(s.next().tolist())
            with lock:
                got.append(b)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.step == 800
    assert sorted(got) == sorted(tuple(s.batch(k).tolist()) for k in range(800))


def test_concurrent_next_with_separate_out_buffers() -> None:
    """Threads lending different `out` arrays each get every batch written
    into their own array (the cached address never crosses threads)."""
    s = Sampler(10**6, 32, IID, 4, rank=0, world_size=1)
    got: list[tuple[int, ...]] = []
    lock = threading.Lock()

    def worker() -> None:
        out = np.full(32, -1, np.int64)
        for _ in range(300):
            s.next(out)
            with lock:
                got.append(tuple(out.tolist()))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(tuple(s.batch(k).tolist()) for k in range(1200))


def test_arguments_and_errors() -> None:
    with pytest.raises(ValueError, match="length must be in 1..2"):
        Sampler(0, 4, IID)
    with pytest.raises(ValueError, match="length must be in 1..2"):
        Sampler(1 << 64, 4, IID)
    with pytest.raises(ValueError, match="batch_size must be in 1..2"):
        Sampler(10, 0, IID)
    with pytest.raises(ValueError, match="mode must be"):
        Sampler(10, 4, 5)
    with pytest.raises(ValueError, match="seed must be in 0..2"):
        Sampler(10, 4, IID, seed=-1)
    with pytest.raises(TypeError, match="length must be an integer"):
        Sampler(10.0, 4, IID)
    with pytest.raises(ValueError, match="step must be in 0..2"):
        Sampler(10, 4, IID).seek(-1)
    with pytest.raises(ValueError, match="does not split evenly over world_size 5") as info:
        Sampler(100, 12, CYCLIC, rank=0, world_size=5)
    assert "batch_size divisible by 5 (e.g. 10 or 15)" in str(info.value)  # the fix, named
    with pytest.raises(ValueError, match=r"length\) must be divisible by world_size"):
        Sampler(7, 12, CYCLIC, rank=0, world_size=2)  # the global batch is 7 records
    with pytest.raises(ValueError, match="rank must be in 0..3, got 3"):
        Sampler(100, 12, CYCLIC, rank=3, world_size=3)
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        Sampler(100, 12, CYCLIC, rank=0, world_size=0)
    s = Sampler(10, 4, SEQUENTIAL, rank=0, world_size=1)
    assert zt.loader.Mode(2) is CYCLIC and Sampler.Mode.CYCLIC == 2 and SEQUENTIAL == 0 and IID == 1
    assert zt.loader.Mode(3) is LOADERX_IID and Sampler.Mode.LOADERX_IID == 3
    assert "mode=SEQUENTIAL" in repr(s)
    with s:
        s.next()
    with pytest.raises(RuntimeError, match="closed"):
        s.next()
    with pytest.raises(RuntimeError, match="closed"):
        s.seek(0)


def test_env_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    s = Sampler(100, 12, CYCLIC)
    assert (s.rank, s.world_size, s.batch_len) == (0, 1, 12)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    s = Sampler(100, 12, CYCLIC)
    assert (s.rank, s.world_size, s.batch_len, s.global_batch_len) == (2, 4, 3, 12)
    assert (s.rank, s.world_size) == (2, 4)
    assert Sampler(100, 12, CYCLIC, rank=1, world_size=2).batch_len == 6  # arguments win
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(ValueError, match="RANK='two'"):
        Sampler(100, 12, CYCLIC)


def test_module_doctest() -> None:
    result = doctest.testmod(zt.loader, raise_on_error=False)
    assert result.attempted >= 3 and result.failed == 0


# -- ranks as separate processes ----------------------------------------------------------

RANK_SCRIPT = """
import json, sys
from zt.loader import Sampler
length, batch, steps = 1000, 12, 40
out = {}
for mode in (0, 1, 2, 3):
    s = Sampler(length, batch, mode, seed=7)   # rank/world_size from RANK/WORLD_SIZE
    out[mode] = {"rank": s.rank, "world": s.world_size, "batches": [s.next().tolist() for _ in range(steps)]}
json.dump(out, sys.stdout)
"""


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_rank_slices_tile_the_global_batch(world_size: int) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_SCRIPT],
            env={**env, "RANK": str(rank), "WORLD_SIZE": str(world_size)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(world_size)
    ]
    results = []
    for p in procs:
        stdout, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        results.append(json.loads(stdout))
    for mode in (SEQUENTIAL, IID, CYCLIC, LOADERX_IID):
        whole = Sampler(1000, 12, mode, seed=7, rank=0, world_size=1)
        for step in range(40):
            parts = [r[str(int(mode))]["batches"][step] for r in results]
            assert [r[str(int(mode))]["rank"] for r in results] == list(range(world_size))
            assert all(len(p) == 12 // world_size for p in parts)
            # Contiguous slices in rank order are exactly the global batch ...
            assert sum(parts, []) == whole.next().tolist()
            # ... so they are disjoint by position; for CYCLIC the records are
            # distinct too, since one batch never repeats a record.
            if mode == CYCLIC:
                assert len(set(sum(parts, []))) == 12
