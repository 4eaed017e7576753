"""Writable arrays without copying: views of a private copy-on-write
mapping of the file.

safetensors' ``load_file`` returns writable arrays, and code written for it
writes into them (in-place updates, ``arr *= scale``). zt's own views are of
a shared read-only mapping, so they cannot be writable. A private mapping
(``MAP_PRIVATE``, Python's ``mmap.ACCESS_COPY``) can: reading it is as free
as the shared one, and the first write to a page gives this process its own
copy of that page, never touching the file. A tensor whose bytes lie raw in
a local file is viewed through such a mapping (one per file, shared by every
array of that file, alive while any array is); any other (decoded,
big-endian, remote, sub-byte packed) comes back as a fresh writable array.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from . import _zt
from ._tensor import _ML_DTYPES, RECORD_LAYOUT, SUBBYTE, Tensor, numpy_dtype

# Element types stored below a byte: the raw bytes are unpacked (copied).
_SUBBYTE = SUBBYTE


def _storage_dtype(name: str) -> np.dtype:
    """The numpy dtype of the stored elements (ml_dtypes types as the
    unsigned integer of their width, which ``Tensor._wrap`` re-views)."""
    if name in _ML_DTYPES:
        return np.dtype(_zt.DTYPES[name]["typestr"])
    return numpy_dtype(name)


class PrivateMaps:
    """The copy-on-write mappings of the files one load reads."""

    def __init__(self):
        self._maps: dict[str, mmap.mmap | None] = {}

    def _map(self, path: str, size: int) -> mmap.mmap | None:
        if path not in self._maps:
            try:
                with open(path, "rb") as f:
                    # The file zt opened: refuse one that changed size since.
                    if os.fstat(f.fileno()).st_size < size or size == 0:
                        self._maps[path] = None
                    else:
                        self._maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError):
                self._maps[path] = None
        return self._maps[path]

    def array(self, t: Tensor) -> np.ndarray | None:
        """``t`` as a writable view of a private mapping, or ``None`` when
        its bytes are not a raw range of a local file."""
        native = t._native
        names = native.parts
        if len(names) != 1:
            return None
        part = native.part(names[0])
        location = part.location
        caps = part.caps
        if location is None or caps.get("remote"):
            return None
        path, offset, nbytes = location
        dtype_name = part.dtype
        if nbytes == 0:
            return None
        mm = self._map(path, offset + nbytes)
        if mm is None:
            return None
        # The view bypasses zt's reads, so it runs their check itself: an
        # npz member whose CRC-32 fails is refused, as numpy.load and
        # every other zt read refuse it.
        native._guard()
        if dtype_name in _SUBBYTE:
            raw = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=offset)
        else:
            dtype = _storage_dtype(dtype_name)
            shape = tuple(part.shape)
            strides = tuple(s * dtype.itemsize for s in part.strides)
            if any(s < 0 for s in strides):
                return None
            try:
                raw = np.ndarray(shape, dtype=dtype, buffer=mm, offset=offset, strides=strides)
            except (TypeError, ValueError):
                return None
        return t._wrap(raw)


def writable_arrays(source, tensors: list[Tensor]) -> dict[str, np.ndarray]:
    """Writable arrays of ``tensors`` (single-part), zero-copy where their
    bytes allow it."""
    maps = PrivateMaps()
    out = {}
    for t in tensors:
        arr = maps.array(t)
        if arr is None:
            arr = t.numpy(copy=False)
            if not arr.flags.writeable:
                arr = arr.copy()
        out[t.name] = arr
    return out


__all__ = ["PrivateMaps", "RECORD_LAYOUT", "writable_arrays"]
