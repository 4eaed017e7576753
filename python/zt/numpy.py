"""safetensors-shaped helpers over numpy arrays.

>>> zt.numpy.save_file({"w": np.ones((2, 2), np.float32)}, "m.safetensors")  # doctest: +SKIP
>>> zt.numpy.load_file("m.safetensors")["w"]                                  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from . import _write


def load_file(
    path, copy: bool = False, dequantize: bool = False, *, storage_options: dict | None = None
) -> dict[str, np.ndarray]:
    """Every tensor of a file (any readable format) as numpy arrays.

    ``copy=False`` returns read-only views of the mapped file where the
    bytes allow it; ``copy=True`` returns independent writable arrays.
    ``dequantize=True`` turns GGUF block-quantized tensors into float32
    arrays of their logical shape (see :meth:`zt.Tensor.dequantize`);
    without it they come back as their raw block bytes (uint8).
    ``path`` may be an object URL (``storage_options`` as for
    :func:`zt.open`).
    """
    import zt

    with zt.open(path, storage_options=storage_options) as source:
        tensors = [source[name] for name in source]
        plain = [t for t in tensors if not (dequantize and t.layout.startswith("gguf."))]
        if source._native.remote:
            # Over the network every tensor is fetched in one planned batch
            # of concurrent ranged GETs, not one request after another.
            views = source._native._arrays([t.name for t in plain], copy)
            arrays = {t.name: t._wrap(v) for t, v in zip(plain, views)}
        else:
            arrays = {t.name: t.numpy(copy=copy) for t in plain}
        return {t.name: arrays[t.name] if t.name in arrays else t.dequantize() for t in tensors}


def save_file(
    tensors: Mapping[str, np.ndarray],
    path,
    metadata: Mapping[str, str] | None = None,
    *,
    align: int | str | None = None,
    compression: bool | int = False,
    storage_options: dict | None = None,
) -> int:
    """Write arrays to ``path``; the extension picks the format
    (``.zt``, ``.safetensors``, ``.npz``, or ``.npy`` for a single array).
    ``metadata`` (str -> str) is stored by safetensors and ``.zt``. For
    ``.zt``: canonical unless ``align`` (``"auto"`` or a power of two >= 4096)
    or ``compression`` (True or a zstd level) is given; rank-0 arrays keep
    shape ``()``. The file is written beside ``path`` and renamed into place;
    an ``s3://`` path is uploaded when complete. Returns bytes written."""
    return _write.save(tensors, path, metadata, align, compression, storage_options)
