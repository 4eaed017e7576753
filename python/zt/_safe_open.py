"""``zt.safe_open``: safetensors' lazy reader, for every format zt reads.

>>> with zt.safe_open("model.safetensors", framework="np") as f:   # doctest: +SKIP
...     rows = f.get_slice("embed.weight")[1024:2048]                 # reads only those rows

A slice reads only the bytes it needs: the runs of the stored array it
covers, gathered from the mapping (only their pages are touched), read one
run at a time with ``backend="pread"``, or, from object storage, fetched as
one planned batch of ranged GETs. Tensors zt decodes (compressed, typed
protobuf fields, big-endian) decode only the range the runs span where the
encoding can seek, and whole otherwise; fp4 and other sub-byte types, and
arrays not stored in C order, are sliced after reading the whole tensor.
"""

from __future__ import annotations

import operator
import os
from typing import Any

import numpy as np

from . import _zt
from ._tensor import _ML_DTYPES, Tensor

# safetensors' names for zt's element types.
_ST_DTYPES = {
    "f64": "F64",
    "f32": "F32",
    "f16": "F16",
    "bf16": "BF16",
    "i64": "I64",
    "i32": "I32",
    "i16": "I16",
    "i8": "I8",
    "u64": "U64",
    "u32": "U32",
    "u16": "U16",
    "u8": "U8",
    "bool": "BOOL",
    "f8_e4m3fn": "F8_E4M3",
    "f8_e5m2": "F8_E5M2",
    "f8_e4m3fnuz": "F8_E4M3FNUZ",
    "f8_e5m2fnuz": "F8_E5M2FNUZ",
    "f8_e8m0": "F8_E8M0",
    "f4_e2m1": "F4",
    "f6_e2m3": "F6_E2M3",
    "f6_e3m2": "F6_E3M2",
    "complex64": "C64",
    "complex128": "C128",
    "i4": "I4",
    "u4": "U4",
}

_FRAMEWORKS = {"np": "np", "numpy": "np", "pt": "pt", "torch": "pt", "pytorch": "pt"}


def _framework(name: str) -> str:
    try:
        return _FRAMEWORKS[name]
    except KeyError:
        raise ValueError(
            f"framework {name!r}: zt.safe_open gives numpy ('np', 'numpy') or torch ('pt') tensors"
        ) from None


class safe_open:  # noqa: N801 - the name safetensors gives it
    """Open a tensor file lazily, as ``safetensors.safe_open`` does: a
    context manager with ``keys()``, ``offset_keys()``, ``metadata()``,
    ``get_tensor(name)``, ``get_tensors()`` and ``get_slice(name)``.

    ``framework`` is ``"np"`` / ``"numpy"`` or ``"pt"`` (torch tensors, moved
    to ``device``). ``backend="pread"`` reads with positional I/O instead of
    mapping. ``filename`` is any file zt reads (or several, or a shard
    index), local or an object URL (``storage_options`` as for
    :func:`zt.open`). Tensors come back writable, as safetensors' do: views
    of a private copy-on-write mapping where the bytes allow it.
    """

    def __init__(
        self,
        filename: str | os.PathLike[str],
        framework: str,
        device: Any = "cpu",
        *,
        backend: str = "mmap",
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        import zt

        if backend not in ("mmap", "pread"):
            raise ValueError(f"backend must be 'mmap' or 'pread', got {backend!r}")
        self._framework = _framework(framework)
        self._device = device
        if isinstance(filename, (str, bytes, os.PathLike)):
            filename = os.fspath(filename)
        self._source = zt.open(filename, map=backend == "mmap", storage_options=storage_options)
        self._maps = None

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the file (tensors already taken stay valid)."""
        self._source.close()

    def keys(self) -> list[str]:
        """Tensor names, sorted (as safetensors returns them)."""
        return sorted(self._source.keys())

    def offset_keys(self) -> list[str]:
        """Tensor names in the order their bytes lie in the file(s)."""
        files = {f: i for i, f in enumerate(self._source.files)}

        def where(item):
            position, name = item
            location = self._source[name].location if len(self._source[name].parts) == 1 else None
            if location is None:
                return (len(files), 0, position)
            return (files.get(location[0], len(files)), location[1], position)

        return [name for _, name in sorted(enumerate(self._source.keys()), key=where)]

    def metadata(self) -> dict | None:
        """The file's metadata (safetensors' ``__metadata__``; for other
        formats their file attributes), or ``None`` when it has none."""
        return dict(self._source.attributes) or None

    def _tensor(self, name: str) -> Tensor:
        if name not in self._source:
            raise KeyError(f"File does not contain tensor {name}")
        return self._source[name]

    def _convert(self, arr: np.ndarray):
        if self._framework == "np":
            return arr
        from .torch import _to_device, _to_torch, _torch

        return _to_device({"t": _to_torch(_torch(), arr)}, self._device)["t"]

    def get_tensor(self, name: str) -> Any:
        """The whole tensor, writable."""
        from ._load import PrivateMaps

        t = self._tensor(name)
        if self._maps is None:
            self._maps = PrivateMaps()
        arr = None if self._source._native.remote else self._maps.array(t)
        if arr is None:
            arr = t.numpy(copy=False)
            if not arr.flags.writeable:
                arr = arr.copy()
        return self._convert(arr)

    def get_tensors(self) -> dict:
        """Every tensor, by name, in file order."""
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def get_slice(self, name: str) -> SafeSlice:
        """A handle to slice ``name`` without reading the rest of it."""
        return SafeSlice(self._tensor(name), self._convert)


class SafeSlice:
    """One tensor, sliced on demand (``safe_open.get_slice``): ``get_shape()``,
    ``get_dtype()``, and ``[...]`` with ints (negative ones count from the
    end), slices (any step; bounds clamp as numpy's do) and one ``...``."""

    def __init__(self, tensor: Tensor, convert):
        self._t = tensor
        self._convert = convert

    def get_shape(self) -> list[int]:
        """The shape, as a list."""
        return list(self._t.shape)

    def get_dtype(self) -> str:
        """The element type, as safetensors names it (``"F32"``, ``"BF16"``, ...)."""
        return _ST_DTYPES.get(self._t.dtype, self._t.dtype.upper())

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._t.shape)

    def __len__(self) -> int:
        return len(self._t)

    def __getitem__(self, key: Any) -> Any:
        return self._convert(self._read(key))

    def _read(self, key) -> np.ndarray:
        shape = self._t.shape
        items = key if isinstance(key, tuple) else (key,)
        if sum(1 for k in items if k is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if Ellipsis in items:
            at = items.index(Ellipsis)
            fill = len(shape) - (len(items) - 1)
            items = items[:at] + (slice(None),) * max(fill, 0) + items[at + 1 :]
        if len(items) > len(shape):
            raise IndexError(f"too many indices: {len(items)} for a tensor of rank {len(shape)}")
        items = items + (slice(None),) * (len(shape) - len(items))
        starts, counts, steps, flip, drop = [], [], [], [], []
        for d, (k, dim) in enumerate(zip(items, shape)):
            if isinstance(k, slice):
                start, stop, step = k.indices(dim)
                count = len(range(start, stop, step))
                if step < 0:
                    # The same elements in increasing order, reversed after.
                    start, step = (start + (count - 1) * step if count else 0), -step
                    flip.append(d)
            else:
                try:
                    i = operator.index(k)
                except TypeError:
                    raise TypeError(
                        f"unsupported index {k!r}: slices, ints and ... only (safetensors' get_slice takes these)"
                    ) from None
                if not -dim <= i < dim:
                    raise IndexError(f"index {i} is out of bounds for dimension {d} with size {dim}")
                start, count, step = i % dim, 1, 1
                drop.append(d)
            starts.append(start)
            counts.append(count)
            steps.append(step or 1)
        try:
            arr = self._selection(starts, counts, steps)
        except _zt.FormatError:
            # Sub-byte types, arrays not stored in C order, layouts with no
            # one part: slice the whole array.
            whole = self._t.numpy()
            index = tuple(slice(s, s + c * st, st) if c else slice(0, 0) for s, c, st in zip(starts, counts, steps))
            arr = np.array(whole[index])
        if flip:
            arr = np.flip(arr, axis=tuple(flip))
        if drop:
            # The int-indexed dimensions (length 1 here) go, as numpy drops them.
            arr = arr.reshape([n for d, n in enumerate(arr.shape) if d not in drop])
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            arr = arr.copy(order="C")
        return arr

    def _selection(self, starts, counts, steps) -> np.ndarray:
        native = self._t._native
        if native.layout != "dense":
            raise _zt.FormatError("not a dense tensor")
        arr = np.asarray(native._read_selection(starts, counts, steps))
        name = native.dtype
        if name in _ML_DTYPES:
            arr = arr.view(_ML_DTYPES[name])
        return arr


__all__ = ["SafeSlice", "safe_open"]
