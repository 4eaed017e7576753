"""Writable arrays without copying: views of a private copy-on-write
mapping of the file.

safetensors' ``load_file`` returns writable arrays, and code written for it
writes into them (in-place updates, ``arr *= scale``). zt's own views are of
a shared read-only mapping, so they cannot be writable. A private mapping
(``MAP_PRIVATE``) can: reading it is as free as the shared one, and the
first write to a page gives this process its own copy of that page, never
touching the file. A tensor whose bytes lie raw in a local file is viewed
through such a mapping, made in Rust from the descriptor zt opened (so it
is the file zt validated, whatever was renamed over the path since), one
per file, shared by every array of that file and alive while any array
is; any other (decoded, big-endian, remote, several parts) comes back as a
fresh writable array.
"""

from __future__ import annotations

import numpy as np

from . import _zt
from ._tensor import RECORD_LAYOUT, Tensor


class PrivateMaps:
    """The copy-on-write mappings of the files one load (or one
    ``safe_open`` handle) reads."""

    def __init__(self, source):
        self._maps = _zt.PrivateMaps(source._native)

    def arrays(self, tensors: list[Tensor], read_ahead: bool = False) -> list[np.ndarray]:
        """Writable arrays of ``tensors``, zero-copy where their bytes allow
        it. ``read_ahead``: a whole load, whose bytes the cache lacks are
        read into the private mappings first, in file order. A tensor whose
        lazy check fails (an npz member's CRC-32) raises, as its reads do."""
        views, _ = self._maps.arrays([t.name for t in tensors], read_ahead)
        return [_writable(t, view) for t, view in zip(tensors, views)]


def _writable(t: Tensor, view) -> np.ndarray:
    """The writable array of ``t`` over its private view, or a copy where it
    has none."""
    if view is not None:
        return t._wrap(view)
    arr = t.numpy(copy=False)
    return arr if arr.flags.writeable else arr.copy()


def writable_arrays(source, names: list[str]) -> dict[str, np.ndarray]:
    """Writable arrays of the tensors ``names`` of a whole load, zero-copy
    where their bytes allow it, the bytes the cache lacks read ahead in
    file order into the mappings the arrays view. The views come from one
    native call; a :class:`Tensor` is made only for a tensor whose array
    needs more than numpy's view (a copy, or a re-view as bf16, records
    ...)."""
    views, plain = _zt.PrivateMaps(source._native).arrays(names, True)
    arrays = {}
    for name, view, as_is in zip(names, views, plain):
        arrays[name] = np.asarray(view) if as_is else _writable(source[name], view)
    return arrays


__all__ = ["PrivateMaps", "RECORD_LAYOUT", "writable_arrays"]
