"""safetensors-shaped helpers over numpy arrays: ``save``, ``load``,
``save_file``, ``load_file`` with ``safetensors.numpy``'s signatures and
semantics, for every format zt reads (and the formats it writes).

>>> zt.numpy.save_file({"w": np.ones((2, 2), np.float32)}, "m.safetensors")  # doctest: +SKIP
>>> zt.numpy.load_file("m.safetensors")["w"]                                  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Union

import numpy as np

from . import _write
from ._load_into import LoadResult, load_into
from ._tensor import read_only_arrays

__all__ = ["LoadResult", "load", "load_file", "load_into", "save", "save_file"]

PathLike = Union[str, "os.PathLike[str]"]


def _arrays(source, copy: bool, dequantize: bool, readonly: bool) -> dict[str, np.ndarray]:
    """Every tensor of an open source as arrays (see :func:`load_file`)."""
    if not (copy or dequantize or source._native.remote):
        # A whole load (see below), without a Tensor object per tensor.
        if readonly:
            source._native._read_ahead()
            return read_only_arrays(source, source.keys())
        from ._load import writable_arrays

        return writable_arrays(source, source.keys())
    tensors = [source[name] for name in source]
    plain = [t for t in tensors if not (dequantize and t.layout.startswith("gguf."))]
    if source._native.remote or copy:
        # The arrays own their bytes (writable), read in one batch: over the
        # network one planned batch of concurrent ranged GETs, not one
        # request after another; from a local file, every destination
        # allocated, then the raw bytes pread into them in file order on
        # the cores the size warrants, without the GIL (zt_core::copy;
        # decoded tensors are decoded one by one).
        views = source._native._arrays([t.name for t in plain], copy)
        arrays = {t.name: t._wrap(v) for t, v in zip(plain, views)}
        return {t.name: arrays[t.name] if t.name in arrays else t.dequantize() for t in tensors}
    # A whole load: the disk reads every tensor's bytes the cache lacks in
    # file order with the reads queued ahead, whatever order the caller then
    # touches the arrays in (a cold load at the device's speed; see
    # zt_core::readahead), into the mapping the arrays view.
    if readonly:
        source._native._read_ahead()
        arrays = {t.name: t.numpy() for t in plain}
    else:
        from ._load import writable_arrays

        arrays = writable_arrays(source, [t.name for t in plain])
    return {t.name: arrays[t.name] if t.name in arrays else t.dequantize() for t in tensors}


def load_file(
    path: PathLike,
    copy: bool = False,
    dequantize: bool = False,
    *,
    readonly: bool = False,
    backend: str = "mmap",
    storage_options: dict | None = None,
    ranks: bool = False,
    dtype: object = None,
) -> dict[str, np.ndarray]:
    """Every tensor of a file (any readable format) as numpy arrays.

    The arrays are writable, as ``safetensors.numpy.load_file``'s are, and
    still not copies where the bytes allow it: views of a private
    copy-on-write mapping of the file (a write copies only the page it
    touches, never the file). ``readonly=True`` returns read-only views of
    the shared mapping instead (decoded tensors are still fresh arrays);
    ``copy=True`` returns independent arrays in fresh memory.
    ``dequantize=True`` turns GGUF block-quantized tensors into arrays of
    their logical shape (see :meth:`zt.Tensor.dequantize`); without it they
    come back as their raw block bytes (uint8). It also dequantizes the
    quantized safetensors schemes :func:`zt.open` reads with
    ``dequantize=True``. Either kind comes back as ``dtype`` (f32 by
    default; ``"bf16"`` gives ``ml_dtypes.bfloat16`` arrays, and casts the
    other floating tensors), computed in f32 and rounded once, as
    :func:`zt.convert` with ``dequantize=True`` writes them.
    ``backend="pread"`` reads with positional I/O instead of mapping, as
    safetensors' option does. ``path`` may be an object URL
    (``storage_options`` as for :func:`zt.open`). ``ranks=True``: ``path``
    is the list of per-rank DTensor files of one state dict (FSDP2, tensor
    parallel), in rank order, merged into the global tensors as
    :func:`zt.open_ranks` merges them.
    """
    import zt

    if backend not in ("mmap", "pread"):
        raise ValueError(f"backend must be 'mmap' or 'pread', got {backend!r}")
    if dtype is not None and not dequantize:
        raise ValueError("dtype goes with dequantize=True")
    opener = zt.open_ranks if ranks else zt.open
    opened = opener(path, map=backend == "mmap", storage_options=storage_options)
    if dequantize:
        # The view convert(dequantize=True) writes, GGUF's block types
        # included: each value in f32, rounded once to ``dtype`` (a
        # config.json beside a GGUF file says nothing of its blocks and is
        # not read).
        opened = zt.Source(zt._zt.dequantize(opened._native, zt._cast_name(dtype), None))
    with opened as source:
        return _arrays(source, copy, dequantize, readonly)


def save_file(
    tensors: Mapping[str, np.ndarray],
    path: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    align: int | str | None = None,
    compression: bool | int = False,
    format: str | None = None,
    storage_options: dict | None = None,
    max_shard_size: int | str | None = None,
    layout: str | None = None,
    durable: bool = True,
) -> int:
    """Write arrays to ``path``: in ``format`` (``"safetensors"``, ``"zt"``,
    ``"npz"``, ``"npy"``, ``"pt"``) when given, else in the format the
    extension names (``.zt``, ``.safetensors``, ``.npz``, ``.npy`` for a
    single array, ``.pt``/``.pth``/``.bin``), else safetensors, as
    ``safetensors.numpy.save_file`` writes any name. A safetensors file is
    byte for byte what ``safetensors.numpy.save_file`` writes.
    ``metadata`` (str -> str) is stored by safetensors and ``.zt``. For
    ``.zt``: canonical unless ``align`` (``"auto"`` or a power of two >= 4096)
    or ``compression`` (True or a zstd level) is given; rank-0 arrays keep
    shape ``()``. The file is written beside ``path`` and renamed into place;
    an ``s3://`` path is uploaded when complete. Returns bytes written.

    ``durable`` (default ``True``): the file's data is fsynced before the
    rename and its directory after, so a power loss leaves the old file or
    the whole new one. ``durable=False``: atomic rename, no fsync (what
    ``safetensors``, ``torch.save`` and numpy do): a crash of the process
    still leaves the old file or the new one, but after a power loss the
    new name may hold data that never reached the disk.

    ``max_shard_size`` (bytes, or ``"5GB"``, ``"500MB"``, ``"4GiB"``) writes a
    sharded checkpoint as Hugging Face does: safetensors or pt shards
    ``STEM-00001-of-00003.EXT`` and ``PATH.index.json``; for ``.zt``, shards
    ``STEM-00001.zt`` and a root at ``path``. Tensors keep the dict's order
    and are never split; one shard is a plain file at ``path``.

    ``.h5``/``.hdf5`` write HDF5 that h5py reads (groups from ``/`` in the
    names, contiguous datasets, ``metadata`` as attributes: ``name`` on the
    root, ``group/name`` on a group). ``layout="keras"`` writes Keras 3's
    ``.weights.h5`` (names ``layers/dense/vars/0``, ...) that
    ``keras.Model.load_weights`` reads; with ``max_shard_size``, Keras's
    sharded ``NAME.weights.json`` + ``NAME_0000N.weights.h5``."""
    return _write.save(
        tensors,
        path,
        metadata,
        align,
        compression,
        storage_options,
        format=format,
        max_shard_size=max_shard_size,
        layout=layout,
        durable=durable,
    )


def save(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None, *, format: str = "safetensors"
) -> bytes:
    """The file :func:`save_file` would write, as bytes: by default the
    safetensors bytes ``safetensors.numpy.save`` returns."""
    return _write.save_bytes(tensors, metadata, format)


def load(data: bytes, *, dequantize: bool = False, dtype: object = None) -> dict[str, np.ndarray]:
    """Every tensor of a file's bytes (any format zt reads) as independent,
    writable numpy arrays, as ``safetensors.numpy.load`` takes them.
    ``dequantize`` and ``dtype`` as :func:`load_file` takes them: GGUF's
    block types and the quantized safetensors schemes in ``dtype`` (f32 by
    default), each value computed in f32 and rounded once (no config.json
    is beside bytes: a scheme's defaults hold)."""
    import zt

    if dtype is not None and not dequantize:
        raise ValueError("dtype goes with dequantize=True")
    opened = _write.open_bytes(data)
    if dequantize:
        # The view load_file(dequantize=True) reads (see there).
        opened = zt.Source(zt._zt.dequantize(opened._native, zt._cast_name(dtype), None))
    with opened as source:
        return _arrays(source, True, dequantize, False)
