"""The records the multi-rank tests load, and their reference digests.

Shared by the tests (which write the stores and compute the expected
stream without zt's loader: indices from a one-process Sampler, record bytes
from the arrays the stores were written from) and by rank_job.py (which
runs inside every rank and reports what each rank's batches held)."""

from __future__ import annotations

import hashlib
import pathlib

import numpy as np

N = 200  # records
GLOBAL_BATCH = 12  # splits over 1, 2, 3 and 4 ranks
MODES = ("SEQUENTIAL", "IID", "CYCLIC")
SEED = 17


def dense_rows() -> np.ndarray:
    """Record i of the Dense stream: int64[3] = (i, random, random)."""
    rng = np.random.default_rng(1)
    rows = rng.integers(-(1 << 40), 1 << 40, (N, 3), dtype=np.int64)
    rows[:, 0] = np.arange(N)
    return rows


def ragged_records() -> list[np.ndarray]:
    """Record i of the Ragged stream: float32 of length 1 + 7i mod 11 (first value i)."""
    rng = np.random.default_rng(2)
    out = []
    for i in range(N):
        rec = rng.standard_normal(1 + (7 * i) % 11).astype(np.float32)
        rec[0] = i
        out.append(rec)
    return out


def write_stores(root: pathlib.Path) -> pathlib.Path:
    from zt.zrecord import Dense, Ragged

    root.mkdir(parents=True, exist_ok=True)
    with Dense.create(root / "d.zr", np.int64, (3,), codec="zstd", data_shards=2) as w:
        w.append(dense_rows())
    with Ragged.create(root / "r.zr", np.float32, 1, codec="raw", data_shards=2) as w:
        w.append(ragged_records())
    return root


def digest(dense_row: np.ndarray, ragged_record: np.ndarray) -> str:
    """One record's identity: its bytes in both streams."""
    data = (
        np.ascontiguousarray(dense_row, np.int64).tobytes() + np.ascontiguousarray(ragged_record, np.float32).tobytes()
    )
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def reference(mode: str, steps: range) -> list[list[list]]:
    """The single-process stream: per step, [index, digest] of every sample
    of the global batch, in order."""
    from zt.loader import Mode, Sampler

    rows, recs = dense_rows(), ragged_records()
    sampler = Sampler(N, GLOBAL_BATCH, Mode[mode], SEED, rank=0, world_size=1)
    out = []
    for step in steps:
        idx = sampler.batch(step).tolist()
        out.append([[i, digest(rows[i], recs[i])] for i in idx])
    return out


# A mixture of the stores with themselves (weights 2:1), block-shuffled: the
# ranks' batches name each sample's dataset (issue 38).
MIX_WEIGHTS = (2, 1)
MIX_BLOCK = 5


def mix_reference(steps: range) -> list[list[list]]:
    """The single-process stream of the mixture: per step, [record, digest,
    dataset] of every sample of the global batch, in order."""
    from zt.loader import BLOCK_SHUFFLE, Sampler

    rows, recs = dense_rows(), ragged_records()
    parts = [(w, N) for w in MIX_WEIGHTS]
    sampler = Sampler(2 * N, GLOBAL_BATCH, BLOCK_SHUFFLE, SEED, rank=0, world_size=1, block_size=MIX_BLOCK, mix=parts)
    out = []
    for step in steps:
        idx = sampler.batch(step).tolist()
        out.append([[i % N, digest(rows[i % N], recs[i % N]), i // N] for i in idx])
    return out
