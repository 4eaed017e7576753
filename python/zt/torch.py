"""torch helpers: safetensors-shaped ``load_file`` / ``save_file``, and the
DataLoader front (``DataLoader``, ``IterableDataset``, ``as_tensors``,
``RankFailure``, defined in ``zt._torch_loader``). torch is imported lazily,
on first use of either: the zt package does not depend on it."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from . import _write

_FRONT = ("DataLoader", "IterableDataset", "RankFailure", "as_tensors")


def __getattr__(name: str):
    # The loader front subclasses torch's IterableDataset, so it can only be
    # defined once torch is imported: do that on first access.
    if name in _FRONT:
        _torch()
        from . import _torch_loader

        return getattr(_torch_loader, name)
    raise AttributeError(f"module 'zt.torch' has no attribute {name!r}")


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ImportError("zt.torch needs PyTorch installed") from e
    return torch


def _to_torch(torch, arr: np.ndarray):
    """numpy (incl. ml_dtypes) -> torch without copying where possible."""
    special = {
        "bfloat16": torch.bfloat16,
        "float8_e4m3fn": torch.float8_e4m3fn,
        "float8_e5m2": torch.float8_e5m2,
        "float8_e4m3fnuz": torch.float8_e4m3fnuz,
        "float8_e5m2fnuz": torch.float8_e5m2fnuz,
        "float8_e8m0fnu": torch.float8_e8m0fnu,
    }
    name = arr.dtype.name
    with warnings.catch_warnings():
        # Read-only views of a mapping: torch warns that it cannot mark them read-only.
        warnings.simplefilter("ignore", UserWarning)
        if name in special:
            width = {1: np.uint8, 2: np.int16}[arr.dtype.itemsize]
            return torch.from_numpy(arr.view(width)).view(special[name])
        return torch.from_numpy(arr)


def load_file(path, device: str = "cpu", copy: bool = True, *, storage_options: dict | None = None) -> dict:
    """Every tensor of a file (a local path or an object URL) as torch
    tensors. ``copy=False`` shares the read-only mapping (writing to such a
    tensor is an error)."""
    from .numpy import load_file as load_arrays

    torch = _torch()
    arrays = load_arrays(path, copy=copy, storage_options=storage_options)
    out = {name: _to_torch(torch, arr) for name, arr in arrays.items()}
    return {k: v.to(device) for k, v in out.items()} if device != "cpu" else out


def save_file(
    tensors: Mapping[str, object],
    path,
    metadata: Mapping[str, str] | None = None,
    *,
    storage_options: dict | None = None,
) -> int:
    """Write torch tensors to a local path or an ``s3://`` URL; the
    extension picks the format."""
    torch = _torch()
    import ml_dtypes

    special = {
        torch.bfloat16: ml_dtypes.bfloat16,
        torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
        torch.float8_e5m2: ml_dtypes.float8_e5m2,
        torch.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
        torch.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
        torch.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
    }
    arrays = {}
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype in special:
            width = {1: torch.uint8, 2: torch.int16}[t.element_size()]
            arrays[name] = t.view(width).numpy().view(special[t.dtype])
        else:
            arrays[name] = t.numpy()
    return _write.save(arrays, path, metadata, storage_options=storage_options)
