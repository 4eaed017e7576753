"""Loading a file into arrays that already exist (``zt.numpy.load_into``).

Every name, dtype and shape is checked before a byte is read, with
``load_state_dict``'s ``strict=`` semantics for missing and unexpected
names. Then each tensor is copied once into its destination: a tensor
stored raw in a mapped file goes straight from the page cache into the
destination's memory (no intermediate array); a decoded one (compressed,
big-endian, typed protobuf fields) is decoded and then copied. Tensors are
taken in file-offset order by two threads (numpy's copy releases the GIL),
so the page cache's readahead sees one forward pass.

This is the Python-level implementation: the copy is numpy's, from the
zero-copy view zt already hands out. A native path (the Rust core writing
into the destination's buffer, and ``pread`` for unmapped stores) is not
built yet.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ._tensor import RECORD_LAYOUT, _record_dtype, numpy_dtype

# Tensors are claimed by the copying threads in runs of about this many
# bytes, so 50k small tensors cost 50k copies, not 50k hand-offs.
_CLAIM_BYTES = 4 << 20
_THREADS = 2


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


def _file_order(pairs):
    """Raw tensors by (file, offset); decoded ones after them."""

    def key(pair):
        loc = pair[0].location
        return (0, loc[0], loc[1]) if loc else (1, "", 0)

    return sorted(pairs, key=key)


def _claims(pairs):
    """Runs of consecutive tensors of about _CLAIM_BYTES each."""
    run, size = [], 0
    for pair in pairs:
        run.append(pair)
        size += pair[1].nbytes
        if size >= _CLAIM_BYTES:
            yield run
            run, size = [], 0
    if run:
        yield run


def _copy_all(pairs) -> None:
    runs = list(_claims(_file_order(pairs)))
    counter = itertools.count()  # next() on a count is atomic under the GIL
    failures: list[BaseException] = []

    def work():
        while not failures:
            i = next(counter)
            if i >= len(runs):
                return
            try:
                for t, arr in runs[i]:
                    np.copyto(arr, t.numpy(copy=False), casting="no")
            except BaseException as e:  # re-raised on the calling thread
                failures.append(e)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(_THREADS, len(runs)) - 1)]
    for th in threads:
        th.start()
    work()
    for th in threads:
        th.join()
    if failures:
        raise failures[0]


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
        # Every read queued in file order before the copies start.
        source._native._read_ahead([t.name for t, _ in pairs])
        _copy_all(pairs)
    return LoadResult(missing, unexpected)
