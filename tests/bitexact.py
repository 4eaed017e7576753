"""Bit-exact comparison of a decoded array with its reference: what every
quantized scheme's test asserts (the values are computed in f32 and rounded
once, as the reference library rounds them, so equal bits, not closeness)."""

from __future__ import annotations

import numpy as np

_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def same(got: np.ndarray, want: np.ndarray, what: object = None) -> None:
    """Equal bit for bit, NaN wherever the reference has NaN (a NaN's
    payload bits are not compared); ``what`` names the case on failure."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan), what
    width = _BITS[got.dtype.itemsize]
    bad = np.flatnonzero(got.view(width)[~nan] != want.view(width)[~nan])
    assert bad.size == 0, (what, bad[:5])
