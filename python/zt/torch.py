"""torch helpers: safetensors.torch's API (``save``, ``load``, ``save_file``,
``load_file``, ``save_model``, ``load_model``, and the shared-storage
helpers other libraries import: ``storage_ptr``, ``storage_size``,
``_find_shared_tensors``, ``_is_complete``, ``_remove_duplicate_names``,
``_end_ptr``), and the
DataLoader front (``DataLoader``, ``IterableDataset``, ``as_tensors``,
``RankFailure``, defined in ``zt._torch_loader``), and ``load_sharded``,
a model load shared by the ranks of a process group (``zt._load_sharded``).
torch is imported lazily, on first use of any: the zt package does not
depend on it."""

from __future__ import annotations

import os
import warnings
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from . import _write
from ._load_into import LoadResult
from ._load_sharded import LoadStats, ShardedLoadError, ShardedStateDict, load_sharded  # noqa: F401 - re-exported

if TYPE_CHECKING:
    import torch as _torch_types

PathLike = Union[str, "os.PathLike[str]"]

_FRONT = ("DataLoader", "IterableDataset", "RankFailure", "as_tensors")


def __getattr__(name: str) -> Any:
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
    """numpy (incl. ml_dtypes) -> torch without copying where possible.
    fp4 (one ml_dtypes element per byte in zt's arrays) is packed two per
    byte into ``torch.float4_e2m1fn_x2``, the type safetensors loads F4 as,
    which halves the last dimension."""
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
        if name == "float4_e2m1fn":
            if not arr.shape or arr.shape[-1] % 2:
                raise ValueError(
                    f"an fp4 tensor of shape {arr.shape} has no float4_e2m1fn_x2 form (its last dimension must be even)"
                )
            codes = np.ascontiguousarray(arr).view(np.uint8) & 0x0F
            packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
            return torch.from_numpy(np.ascontiguousarray(packed)).view(torch.float4_e2m1fn_x2)
        if name in special:
            width = {1: np.uint8, 2: np.int16}[arr.dtype.itemsize]
            return torch.from_numpy(arr.view(width)).view(special[name])
        return torch.from_numpy(arr)


def _to_device(out: dict, device) -> dict:
    if device in ("cpu", None):
        return out
    return {k: v.to(device) for k, v in out.items()}


def load_file(
    path: PathLike,
    device: str | int | _torch_types.device = "cpu",
    copy: bool = False,
    *,
    readonly: bool = False,
    backend: str = "mmap",
    storage_options: dict[str, Any] | None = None,
    ranks: bool = False,
    dequantize: bool = False,
    dtype: object = None,
) -> dict[str, _torch_types.Tensor]:
    """Every tensor of a file (a local path or an object URL, any format zt
    reads) as torch tensors, as ``safetensors.torch.load_file`` returns
    them: writable, and views of a private copy-on-write mapping where the
    bytes allow it (see :func:`zt.numpy.load_file`). ``readonly=True``
    shares the read-only mapping (writing to such a tensor is an error);
    ``copy=True`` gives tensors in fresh memory. ``ranks=True``: ``path`` is
    the list of per-rank DTensor files of one state dict, in rank order,
    merged into the full tensors (:func:`zt.open_ranks`). ``dequantize=True``
    and ``dtype`` (``torch.bfloat16`` or ``"bf16"``, ...) as for
    :func:`zt.numpy.load_file`."""
    from .numpy import load_file as load_arrays

    torch = _torch()
    arrays = load_arrays(
        path,
        copy=copy,
        dequantize=dequantize,
        readonly=readonly,
        backend=backend,
        storage_options=storage_options,
        ranks=ranks,
        dtype=dtype,
    )
    return _to_device({name: _to_torch(torch, arr) for name, arr in arrays.items()}, device)


def load(data: bytes) -> dict[str, _torch_types.Tensor]:
    """Every tensor of a file's bytes (any format zt reads) as independent
    torch tensors, as ``safetensors.torch.load`` takes them."""
    from .numpy import load as load_arrays

    torch = _torch()
    return {name: _to_torch(torch, arr) for name, arr in load_arrays(data).items()}


def _numpy_view(torch, name: str, t) -> np.ndarray:
    """A writable numpy view of a CPU tensor's own memory, typed as zt's
    arrays of that dtype are (ml_dtypes for bfloat16 and fp8)."""
    if t.device.type != "cpu":
        raise ValueError(f"{name!r}: destination is on {t.device}; load_into writes tensors in CPU memory")
    special = _ml_dtypes_of(torch)
    t = t.detach()
    if t.dtype in special:
        width = {1: torch.uint8, 2: torch.int16}[t.element_size()]
        return t.view(width).numpy().view(special[t.dtype])
    try:
        return t.numpy()
    except TypeError:
        raise ValueError(f"{name!r}: destination dtype {t.dtype} has no numpy equivalent zt reads into") from None


def load_into(
    model_or_state_dict: _torch_types.nn.Module | Mapping[str, _torch_types.Tensor],
    path: PathLike,
    strict: bool = True,
    *,
    backend: str = "mmap",
) -> LoadResult:
    """Read every tensor of ``path`` (any format zt reads) into the memory
    of an existing model's tensors, in place: a ``torch.nn.Module`` (its
    ``state_dict()`` tensors, which share the parameters' and buffers'
    memory) or a mapping name -> tensor. The result equals
    ``model.load_state_dict(safetensors.torch.load_file(path), strict)``
    without building a second copy of the model: each tensor is one copy
    from the page cache into its destination, in file order.

    Names, shapes and dtypes are checked first (a mismatch raises
    ``ValueError`` before anything is written); ``strict`` as in
    ``load_state_dict``. Returns ``(missing_keys, unexpected_keys)`` (a
    :class:`zt.numpy.LoadResult`). Destinations must be in CPU memory."""
    from ._load_into import load_into as load_arrays

    torch = _torch()
    if isinstance(model_or_state_dict, torch.nn.Module):
        tensors = model_or_state_dict.state_dict()
    else:
        tensors = model_or_state_dict
    with torch.no_grad():
        dest = {name: _numpy_view(torch, name, t) for name, t in tensors.items()}
        return load_arrays(dest, path, strict, backend=backend)


# ---- shared storage: safetensors.torch's helpers ---------------------------
#
# transformers and other libraries import these from safetensors.torch
# (``storage_ptr``, ``storage_size``, ``_find_shared_tensors``, ...), so
# zt.torch has them under the same names, returning what safetensors 0.8.0's
# return for the same tensors.


def storage_ptr(tensor: _torch_types.Tensor) -> int:
    """The address of the storage behind ``tensor`` (not of its first
    element: a view's storage is its base's), or 0 where it has none that
    can be read (a sparse tensor; a meta tensor's is 0 too)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor: _torch_types.Tensor) -> int:
    """The bytes of the storage behind ``tensor``: the whole of its base's
    for a view, its own size for a meta tensor. A sparse tensor has no
    storage to measure (torch raises ``NotImplementedError``)."""
    return tensor.untyped_storage().nbytes()


def _end_ptr(tensor: _torch_types.Tensor) -> int:
    """One past the last byte of ``tensor``'s own elements: its last
    element's address plus the element's size (``data_ptr()`` for an empty
    tensor). safetensors finds the last element through ``view(-1)``,
    which fails for a strided view that cannot be flattened (``A[::2, :]``,
    ``expand``); zt computes it from the strides, the same address for
    every tensor that ``view(-1)`` accepts."""
    if not tensor.nelement():
        return tensor.data_ptr()
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + (last + 1) * tensor.element_size()


def _is_complete(tensor: _torch_types.Tensor) -> bool:
    """True if ``tensor`` starts where its storage starts and its elements
    fill the storage's bytes: the name worth keeping among tensors that
    share it (a view of a part, or with holes, is not)."""
    return tensor.data_ptr() == storage_ptr(tensor) and tensor.nelement() * tensor.element_size() == storage_size(
        tensor
    )


def _split_disjoint(groups: list[set[str]], tensors: Mapping[str, object]) -> list[set[str]]:
    """Each group of names on one storage, split where the tensors' byte
    spans do not overlap: walked in address order, a tensor starting at or
    past the end of the one before it starts a new group (the end of the one
    just before, as safetensors compares, not the furthest end so far)."""
    out: list[set[str]] = []
    for names in groups:
        if len(names) < 2:
            out.append(names)
            continue
        spans = sorted((tensors[n].data_ptr(), _end_ptr(tensors[n]), n) for n in names)
        _, end_before, first = spans[0]
        out.append({first})
        for start, end, name in spans[1:]:
            if start >= end_before:
                out.append({name})
            else:
                out[-1].add(name)
            end_before = end
    return out


def _find_shared_tensors(state_dict: Mapping[str, _torch_types.Tensor]) -> list[set[str]]:
    """The names of ``state_dict`` grouped by the memory they share: one
    set per storage (device, address and size), split where the tensors do
    not overlap; tensors on the meta device or with no storage (an empty
    or sparse tensor) are left out. In safetensors' order: the groups as
    Python's ``sorted`` orders sets (by inclusion, else as first seen)."""
    torch = _torch()
    by_storage: dict = {}
    meta = torch.device("meta")
    for name, t in state_dict.items():
        if t.device == meta:
            continue
        ptr = storage_ptr(t)
        if ptr == 0:
            continue
        size = storage_size(t)
        if size == 0:
            continue
        by_storage.setdefault((t.device, ptr, size), set()).add(name)
    return _split_disjoint(sorted(by_storage.values()), state_dict)


def _remove_duplicate_names(
    state_dict: Mapping[str, _torch_types.Tensor],
    *,
    preferred_names: list[str] | None = None,
    discard_names: list[str] | None = None,
) -> dict[str, list[str]]:
    """For each group of names sharing memory: the name to keep, mapped to
    the names to drop (sorted). The kept name covers the whole storage
    (:func:`_is_complete`); among those, the first in name order, preferring
    names not in ``discard_names`` and, over that, names in
    ``preferred_names``. A group where no name covers its storage raises
    ``RuntimeError``: keeping any would save more memory than it holds."""
    preferred = set(preferred_names or ())
    discard = set(discard_names or ())
    drop: dict[str, list[str]] = defaultdict(list)
    for group in _find_shared_tensors(state_dict):
        complete = {name for name in group if _is_complete(state_dict[name])}
        if not complete:
            raise RuntimeError(
                f"Error while trying to find names to remove to save state dict, but found no suitable name to"
                f" keep for saving amongst: {group}. None is covering the entire storage. Refusing to save/load"
                " the model since you could be storing much more memory than needed."
            )
        keep = min(complete - discard or complete)
        if preferred & complete:
            keep = min(preferred & complete)
        for name in sorted(group):
            if name != keep:
                drop[keep].append(name)
    return drop


# ---- what safetensors.torch refuses, refused the same way -----------------


def _refuse(torch, tensors) -> None:
    """Raise what ``safetensors.torch.save_file`` raises for the same input:
    ValueError for a non-dict, a non-tensor value, a sparse or a
    non-contiguous tensor; RuntimeError for tensors that share memory."""
    if not isinstance(tensors, Mapping):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(t)}")
        if t.layout != torch.strided:
            sparse.append(name)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed."
        )
    shared = [g for g in _find_shared_tensors(tensors) if len(g) > 1]
    if shared:
        raise RuntimeError(
            f"Some tensors share memory, this will lead to duplicate memory on disk and potential differences"
            f" when loading them again: {shared}. A potential way to correctly save your model is to use"
            " `save_model`."
        )
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means"
                " you are trying to save tensors which are reference of each other in which case it's"
                " recommended to save only the full tensors, and reslice at load time, or simply call"
                " `.contiguous()` on your tensor to pack it before saving."
            )


def _ml_dtypes_of(torch) -> dict:
    """torch dtypes numpy holds through ml_dtypes, and the ml_dtypes type of each."""
    import ml_dtypes

    return {
        torch.bfloat16: ml_dtypes.bfloat16,
        torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
        torch.float8_e5m2: ml_dtypes.float8_e5m2,
        torch.float8_e4m3fnuz: ml_dtypes.float8_e4m3fnuz,
        torch.float8_e5m2fnuz: ml_dtypes.float8_e5m2fnuz,
        torch.float8_e8m0fnu: ml_dtypes.float8_e8m0fnu,
    }


def _arrays(tensors: Mapping[str, object]) -> dict[str, np.ndarray]:
    """torch tensors -> numpy arrays over the same memory (CPU tensors are
    not copied): every dtype torch and safetensors share, fp4 included."""
    torch = _torch()
    _refuse(torch, tensors)
    import ml_dtypes

    special = _ml_dtypes_of(torch)
    fp4x2 = getattr(torch, "float4_e2m1fn_x2", None)
    arrays = {}
    for name, t in tensors.items():
        t = t.detach().cpu()
        if fp4x2 is not None and t.dtype == fp4x2:
            # Two fp4 values per byte, low nibble first: one ml_dtypes fp4
            # per byte, the last dimension doubled (as safetensors records
            # the shape).
            packed = t.view(torch.uint8).numpy()
            codes = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.uint8) if packed.ndim else None
            if codes is None:
                raise ValueError(f"Key `{name}`: a rank-0 float4_e2m1fn_x2 tensor has no shape to double")
            codes[..., 0::2] = packed & 0x0F
            codes[..., 1::2] = packed >> 4
            arrays[name] = codes.view(ml_dtypes.float4_e2m1fn)
        elif t.dtype in special:
            width = {1: torch.uint8, 2: torch.int16}[t.element_size()]
            arrays[name] = t.view(width).numpy().view(special[t.dtype])
        else:
            arrays[name] = t.numpy()
    return arrays


def save_file(
    tensors: Mapping[str, object],
    path: PathLike,
    metadata: Mapping[str, str] | None = None,
    *,
    format: str | None = None,
    storage_options: dict[str, Any] | None = None,
    max_shard_size: int | str | None = None,
    durable: bool = True,
) -> int:
    """Write torch tensors to a local path or an ``s3://`` URL, as
    ``safetensors.torch.save_file`` does (byte for byte, for a safetensors
    file), refusing what it refuses with the same exception types. The
    format is ``format``, else the extension's, else safetensors.
    ``max_shard_size`` writes a sharded checkpoint in the shards
    ``huggingface_hub.split_torch_state_dict_into_shards`` picks (see
    :func:`zt.numpy.save_file`). ``durable=False``: atomic rename, no
    fsync (see :func:`zt.numpy.save_file`)."""
    return _write.save(
        _arrays(tensors),
        path,
        metadata,
        storage_options=storage_options,
        format=format,
        max_shard_size=max_shard_size,
        durable=durable,
    )


def save(
    tensors: Mapping[str, object], metadata: Mapping[str, str] | None = None, *, format: str = "safetensors"
) -> bytes:
    """The bytes :func:`save_file` would write (``safetensors.torch.save``)."""
    return _write.save_bytes(_arrays(tensors), metadata, format)


# ---- models: shared tensors, as safetensors handles them ------------------


def save_model(
    model: _torch_types.nn.Module,
    filename: PathLike,
    metadata: Mapping[str, str] | None = None,
    force_contiguous: bool = True,
    *,
    format: str | None = None,
) -> None:
    """``safetensors.torch.save_model``: the model's state dict without the
    duplicate names of shared tensors (each dropped name recorded in the
    metadata as ``{dropped: kept}`` unless the caller set that key), made
    contiguous unless ``force_contiguous=False``."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            metadata = {} if metadata is None else metadata
            if name not in metadata:
                metadata[name] = kept
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata, format=format)
    except ValueError as e:
        raise ValueError(
            f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential caveats."
        ) from None


def load_model(
    model: _torch_types.nn.Module,
    filename: PathLike,
    strict: bool = True,
    device: str | int | _torch_types.device = "cpu",
    *,
    backend: str = "mmap",
) -> tuple[set[str], list[str]]:
    """``safetensors.torch.load_model``: load a file (any format zt reads)
    into ``model``, where names the model shares with a loaded one count
    as loaded. Returns ``(missing, unexpected)``; with ``strict`` either
    being non-empty raises ``RuntimeError``."""
    state_dict = load_file(filename, device=device, backend=backend)
    drop = _remove_duplicate_names(model.state_dict(), preferred_names=list(state_dict))
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for names in drop.values():
        for name in names:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected
