"""Loading a file into arrays that already exist (``zt.numpy.load_into``).

Every name, dtype and shape is checked before a byte is read, with
``load_state_dict``'s ``strict=`` semantics for missing and unexpected
names. Then each tensor is copied once into its destination by the native core
(``zt_core::copy::copy_into``), without the GIL: a tensor stored raw in a
local file is ``pread`` straight from the page cache into the
destination's memory (no intermediate array, no page tables of a mapping
walked), in file-offset order on the cores its size warrants, so the
disk's readahead sees one forward pass; a decoded one (compressed,
big-endian, typed protobuf fields) is decoded and then copied.
Destinations numpy cannot hand over as one writable block (strided
views) and tied weights (two names over the same memory, filled in the
order given, as ``load_state_dict`` fills them) are copied by numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ._tensor import RECORD_LAYOUT, SUBBYTE, _record_dtype, numpy_dtype


class LoadResult(NamedTuple):
    """What ``load_into`` did not load, as ``load_state_dict`` reports it."""

    missing_keys: list[str]
    unexpected_keys: list[str]


def _dtype_of(t) -> np.dtype:
    """The numpy dtype ``t.numpy()`` returns, known without reading it."""
    if t.layout == RECORD_LAYOUT and t.parts == ["data"]:
        return _record_dtype(t.attributes)
    if t.layout.startswith("gguf."):
        return np.dtype(np.uint8)  # raw blocks, as numpy() returns them
    return numpy_dtype(t.dtype)


def _check(dest: Mapping[str, np.ndarray], source, strict: bool):
    """(pairs to copy, missing, unexpected), or ValueError naming every
    mismatch at once; nothing has been read yet."""
    names = set(source)
    missing = sorted(k for k in dest if k not in names)
    unexpected = sorted(n for n in names if n not in dest)
    errors = []
    if strict and (missing or unexpected):
        if missing:
            errors.append("Missing key(s): " + ", ".join(repr(k) for k in missing))
        if unexpected:
            errors.append("Unexpected key(s): " + ", ".join(repr(k) for k in unexpected))
    pairs = []
    for name in dest:
        if name not in names:
            continue
        arr, t = dest[name], source[name]
        if not isinstance(arr, np.ndarray):
            errors.append(f"{name!r}: destination is a {type(arr).__name__}, not a numpy array")
            continue
        if not arr.flags.writeable:
            errors.append(f"{name!r}: destination array is read-only")
            continue
        want = _dtype_of(t)
        if tuple(arr.shape) != tuple(t.shape):
            errors.append(f"{name!r}: shape {tuple(t.shape)} in the file, {tuple(arr.shape)} in the destination")
        elif arr.dtype != want:
            errors.append(f"{name!r}: dtype {want} in the file, {arr.dtype} in the destination")
        else:
            pairs.append((t, arr))
    if errors:
        raise ValueError(
            f"cannot load {source.files[0] if source.files else 'the file'} into the destination:\n  "
            + "\n  ".join(errors)
        )
    return pairs, missing, unexpected


def _extent(arr: np.ndarray) -> tuple[int, int]:
    """[first byte, end) of the memory an array's elements span."""
    low = high = arr.__array_interface__["data"][0]
    for dim, stride in zip(arr.shape, arr.strides):
        reach = stride * (dim - 1)
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return low, high + arr.itemsize


def _overlapping(pairs) -> set[int]:
    """Positions of the non-empty destinations whose span of memory overlaps
    another one's (tied weights, overlapping views, strided or not; two
    interleaved strided views count too, which only costs them the native
    copy)."""
    spans = sorted((*_extent(arr), i) for i, (_, arr) in enumerate(pairs) if arr.nbytes)
    found: set[int] = set()
    reach, owner = -1, -1  # the furthest end so far, and whose it is
    for low, high, i in spans:
        if low < reach:
            # It starts inside the span that reaches furthest, so it overlaps it.
            found.update((i, owner))
        if high > reach:
            reach, owner = high, i
    return found


def _native_and_rest(pairs):
    """(pairs the native copy fills, pairs numpy copies one by one): the
    native copy takes C-contiguous destinations that share memory with no
    other destination, of tensors whose stored bytes are the array's bytes;
    strided destinations, destinations over shared memory (tied weights)
    and packed 4- and 6-bit tensors (which ``numpy()`` unpacks to a byte an
    element) are left to numpy, in the order given, as ``load_state_dict``
    copies them."""
    shared = _overlapping(pairs)
    native = {
        i
        for i, (t, arr) in enumerate(pairs)
        if arr.flags.c_contiguous and arr.nbytes and t.dtype not in SUBBYTE and i not in shared
    }
    return (
        [pair for i, pair in enumerate(pairs) if i in native],
        [pair for i, pair in enumerate(pairs) if i not in native and pair[1].nbytes],
    )


def _copy_all(source, pairs) -> None:
    native, rest = _native_and_rest(pairs)
    if native:
        # Checked sizes, then the raw bytes pread (or copied out of the
        # mapping) straight into the destinations in file order, on the
        # cores their size warrants, without the GIL (zt_core::copy).
        source._native._copy_into([t.name for t, _ in native], [arr for _, arr in native])
    for t, arr in rest:
        np.copyto(arr, t.numpy(copy=False), casting="no")


def load_into(dest: Mapping[str, np.ndarray], path, strict: bool = True, *, backend: str = "mmap") -> LoadResult:
    """Read every tensor of ``path`` (any format zt reads) into the
    existing, writable arrays of ``dest`` (a mapping name -> ndarray),
    in place.

    Names, shapes and dtypes are checked first: a shape or dtype mismatch,
    or a read-only destination, raises ``ValueError`` before anything is
    read. With ``strict=True`` (the default) names in ``dest`` missing from
    the file, or in the file but not in ``dest``, raise too, as
    ``torch.nn.Module.load_state_dict`` does; with ``strict=False`` they
    are skipped and reported in the returned ``LoadResult``. On an error
    while copying, arrays already written keep their new values.
    """
    import zt

    if backend not in ("mmap", "pread"):
        raise ValueError(f"backend must be 'mmap' or 'pread', got {backend!r}")
    with zt.open(path, map=backend == "mmap") as source:
        pairs, missing, unexpected = _check(dest, source, strict)
        _copy_all(source, pairs)
    return LoadResult(missing, unexpected)
