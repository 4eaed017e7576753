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
GGUF block-quantized tensors slice as their values: the rows the slice
covers are read and dequantized to float32 (the blocks run along the last
axis, so rows are independent).

``safe_open`` also takes an open file object, as ``safetensors._safe_open_handle``
does (``_safe_open_handle`` is here too): a local file's handle is opened
by its name (checked to be the very file the handle has open), any other
object with ``read`` (an fsspec handle, ``io.BytesIO``) is copied to a
temporary file first.
"""

from __future__ import annotations

import operator
import os
import shutil
import tempfile
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


def _is_handle(obj: Any) -> bool:
    """True for an open file object (anything with ``read``), not a path."""
    return not isinstance(obj, (str, bytes, os.PathLike, list, tuple)) and callable(getattr(obj, "read", None))


def _local_name(f: Any) -> str | None:
    """The path of the local file the handle ``f`` has open, when its
    ``name`` names that very file (same device and inode as its
    descriptor), else None."""
    name = getattr(f, "name", None)
    if not isinstance(name, (str, os.PathLike)):
        return None
    try:
        mine = os.fstat(f.fileno())
        there = os.stat(name)
    except (AttributeError, OSError, ValueError):
        # No descriptor (io.UnsupportedOperation is an OSError), a closed
        # file, or a name that is not there.
        return None
    return os.fspath(name) if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino) else None


_COPY_STEP = 8 << 20


def _open_handle(f: Any, map: bool):
    """A :class:`zt.Source` over the file object ``f``: the local file it
    has open, by name; else its bytes (read from the start, in 8 MiB steps)
    copied to a temporary file that is unlinked once open (the mapping or
    descriptor keeps it). The handle's position is restored."""
    import zt

    path = _local_name(f)
    if path is not None:
        return zt.open(path, map=map)
    stem = getattr(f, "name", None) or getattr(f, "path", None)
    stem = os.path.basename(os.fspath(stem)) if isinstance(stem, (str, os.PathLike)) else ""
    seekable = callable(getattr(f, "seek", None))
    at = f.tell() if seekable and callable(getattr(f, "tell", None)) else None
    if seekable:
        f.seek(0)
    directory = tempfile.mkdtemp(prefix="zt-handle-")
    try:
        # A lone .npy is named after its file: "arr_0" when the handle has no name.
        copy = os.path.join(directory, stem or "arr_0")
        with open(copy, "wb") as out:
            while True:
                chunk = f.read(_COPY_STEP)
                if not chunk:
                    break
                if not isinstance(chunk, (bytes, bytearray, memoryview)):
                    raise TypeError(f"safe_open reads a file object opened in binary mode; read() gave {type(chunk)}")
                out.write(chunk)
        return zt.open(copy, map=map)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if at is not None:
            f.seek(at)


class safe_open:  # noqa: N801 - the name safetensors gives it
    """Open a tensor file lazily, as ``safetensors.safe_open`` does: a
    context manager with ``keys()``, ``offset_keys()``, ``metadata()``,
    ``get_tensor(name)``, ``get_tensors()`` and ``get_slice(name)``.

    ``framework`` is ``"np"`` / ``"numpy"`` or ``"pt"`` (torch tensors, moved
    to ``device``). ``backend="pread"`` reads with positional I/O instead of
    mapping. ``filename`` is any file zt reads (or several, or a shard
    index), local or an object URL (``storage_options`` as for
    :func:`zt.open`), or an open binary file object (a local file's handle
    is opened by its name; another, an fsspec handle or ``io.BytesIO``, is
    copied to a temporary file). Tensors come back writable, as
    safetensors' do: views of a private copy-on-write mapping where the
    bytes allow it. Once closed, every call raises ``zt.FormatError``.
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
        self._maps = None
        if _is_handle(filename):
            self._source = _open_handle(filename, map=backend == "mmap")
            return
        if isinstance(filename, (str, bytes, os.PathLike)):
            filename = os.fspath(filename)
        try:
            self._source = zt.open(filename, map=backend == "mmap", storage_options=storage_options)
        except FileNotFoundError:
            if not isinstance(filename, str) or "://" in filename or os.path.lexists(filename):
                raise  # an object URL, or a shard the file names: zt's message says which
            # The file itself: worded as safetensors words it.
            raise FileNotFoundError(f"No such file or directory: {filename}") from None

    def __enter__(self) -> safe_open:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the file (tensors already taken stay valid). Every call
        after it raises ``zt.FormatError`` (safetensors' ``SafetensorError``)."""
        self._source.close()

    def _open(self):
        """The source, or ``zt.FormatError`` once closed (as safetensors
        raises its ``SafetensorError``)."""
        if self._source.closed:
            raise _zt.FormatError("File is closed")
        return self._source

    def keys(self) -> list[str]:
        """Tensor names, sorted (as safetensors returns them)."""
        return sorted(self._open().keys())

    def offset_keys(self) -> list[str]:
        """Tensor names in the order their bytes lie in the file(s)."""
        source = self._open()
        files = {f: i for i, f in enumerate(source.files)}

        def where(item):
            position, name = item
            location = source[name].location if len(source[name].parts) == 1 else None
            if location is None:
                return (len(files), 0, position)
            return (files.get(location[0], len(files)), location[1], position)

        return [name for _, name in sorted(enumerate(source.keys()), key=where)]

    def metadata(self) -> dict | None:
        """The file's metadata (safetensors' ``__metadata__``; for other
        formats their file attributes), or ``None`` when it has none."""
        return dict(self._open().attributes) or None

    def _tensor(self, name: str) -> Tensor:
        source = self._open()
        if name not in source:
            raise KeyError(f"File does not contain tensor {name}")
        return source[name]

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
            self._maps = PrivateMaps(self._open())
        return self._convert(self._maps.arrays([t])[0])

    def get_tensors(self) -> dict:
        """Every tensor, by name, in file order."""
        return {name: self.get_tensor(name) for name in self.offset_keys()}

    def get_slice(self, name: str) -> SafeSlice:
        """A handle to slice ``name`` without reading the rest of it."""
        return SafeSlice(self._tensor(name), self._convert)


class _safe_open_handle(safe_open):  # noqa: N801 - the name safetensors gives it
    """``safetensors._safe_open_handle``: :class:`safe_open` over an open
    file object ``f`` (a local file's handle, an fsspec handle, anything
    with ``read``)."""

    def __init__(self, f: Any, framework: str, device: Any = "cpu", *, backend: str = "mmap") -> None:
        if not _is_handle(f):
            raise TypeError(f"_safe_open_handle takes an open file object, got {type(f)}")
        super().__init__(f, framework, device, backend=backend)


class SafeSlice:
    """One tensor, sliced on demand (``safe_open.get_slice``): ``get_shape()``,
    ``get_dtype()``, and ``[...]`` with ints (negative ones count from the
    end), slices (any step; bounds and steps clamp as numpy's do), one
    ``...``, and ``[]`` (nothing of the first dimension, as numpy's
    ``a[[]]``). A GGUF block-quantized tensor slices as its float32
    values (``get_dtype()`` is ``"F32"``): only the rows the slice covers
    are read and dequantized."""

    def __init__(self, tensor: Tensor, convert):
        self._t = tensor
        self._convert = convert

    def get_shape(self) -> list[int]:
        """The shape, as a list."""
        return list(self._t.shape)

    def get_dtype(self) -> str:
        """The element type, as safetensors names it (``"F32"``, ``"BF16"``, ...)."""
        if self._quantized:
            return "F32"
        return _ST_DTYPES.get(self._t.dtype, self._t.dtype.upper())

    @property
    def _quantized(self) -> bool:
        """A GGUF block-quantized tensor (sliced as its dequantized values)."""
        return self._t.layout.startswith("gguf.")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._t.shape)

    def __len__(self) -> int:
        return len(self._t)

    def __getitem__(self, key: Any) -> Any:
        return self._convert(self._read(key))

    def _read(self, key) -> np.ndarray:
        shape = self._t.shape
        if isinstance(key, list):
            if key:
                raise TypeError(
                    f"unsupported index {key!r}: a list only when empty (safetensors' get_slice takes [] alone)"
                )
            key = slice(0, 0)  # numpy's a[[]]: none of the first dimension
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
                if count <= 1:
                    # One element or none: the step never applies (numpy
                    # takes any step, past 2**64 too).
                    start, step = (start if count else 0), 1
                elif step < 0:
                    # The same elements in increasing order, reversed after.
                    start, step = start + (count - 1) * step, -step
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
            steps.append(step)
        read = self._dequantized if self._quantized else self._values
        arr = read(starts, counts, steps)
        if flip:
            arr = np.flip(arr, axis=tuple(flip))
        if drop:
            # The int-indexed dimensions (length 1 here) go, as numpy drops them.
            arr = arr.reshape([n for d, n in enumerate(arr.shape) if d not in drop])
        if not arr.flags.c_contiguous or not arr.flags.writeable:
            arr = arr.copy(order="C")
        return arr

    def _values(self, starts, counts, steps) -> np.ndarray:
        """The selection's elements, reading only the runs it covers where
        the tensor allows it."""
        try:
            return self._selection(starts, counts, steps)
        except _zt.FormatError:
            # Sub-byte types, arrays not stored in C order, layouts with no
            # one part: slice the whole array.
            whole = self._t.numpy()
            index = tuple(slice(s, s + c * st, st) if c else slice(0, 0) for s, c, st in zip(starts, counts, steps))
            return np.array(whole[index])

    def _dequantized(self, starts, counts, steps) -> np.ndarray:
        """The selection of a GGUF block-quantized tensor as float32: the
        rows it covers (every dimension but the last) read and dequantized,
        then the last dimension sliced."""
        shape = self._t.shape
        if not shape:
            raise _zt.FormatError(f"{self._t.name!r}: a rank-0 quantized tensor cannot be sliced")
        rows = np.zeros(1, dtype=np.int64)  # a rank-1 tensor is one row
        for start, count, step, dim in zip(starts[:-1], counts[:-1], steps[:-1], shape[:-1]):
            picked = np.arange(start, start + count * step, step, dtype=np.int64)
            rows = (rows[:, None] * dim + picked[None, :]).reshape(-1)
        values = np.asarray(self._t._native._dequantize_rows(rows.tolist()))
        values = values.reshape([*counts[:-1], shape[-1]])
        start, count, step = starts[-1], counts[-1], steps[-1]
        return values[..., start : start + count * step : step]

    def _selection(self, starts, counts, steps) -> np.ndarray:
        native = self._t._native
        if native.layout != "dense":
            raise _zt.FormatError("not a dense tensor")
        arr = np.asarray(native._read_selection(starts, counts, steps))
        name = native.dtype
        if name in _ML_DTYPES:
            arr = arr.view(_ML_DTYPES[name])
        return arr


__all__ = ["SafeSlice", "_safe_open_handle", "safe_open"]
