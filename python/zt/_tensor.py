"""The Python face of a tensor: numpy, DLPack and byte access."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from . import _zt

# The dtype table is Rust's (`_zt.DTYPES`: bits, storage, the typestr the
# native side hands out, the ml_dtypes type); these lookups are built from it.
_ML = {name: getattr(ml_dtypes, d["ml_dtypes"]) for name, d in _zt.DTYPES.items() if d["ml_dtypes"]}
# 4-bit types, stored two per byte (low nibble first), unpacked here to one
# ml_dtypes element per byte.
_NIBBLES = {name: t for name, t in _ML.items() if _zt.DTYPES[name]["bits"] == 4}
# Other dtypes numpy has no builtin for; the native side hands out
# same-width unsigned integers, re-viewed here as the ml_dtypes type.
_ML_DTYPES = {name: t for name, t in _ML.items() if name not in _NIBBLES}
# Packed to fewer than 8 bits per element (4-bit and 6-bit types).
SUBBYTE = frozenset(name for name, d in _zt.DTYPES.items() if d["bits"] % 8)
_NUMPY = {name: np.dtype(_ML.get(name, d["typestr"])) for name, d in _zt.DTYPES.items()}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype zt uses for a zt dtype name (bytes for a type numpy
    cannot hold, fp6)."""
    return _NUMPY.get(name, np.dtype("u1"))


def _unpack_nibbles(packed: np.ndarray, shape: tuple[int, ...], dtype) -> np.ndarray:
    """Two 4-bit codes per byte, low nibble first -> one ml_dtypes element per byte."""
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    codes = np.empty(packed.size * 2, dtype=np.uint8)
    codes[0::2] = packed & 0x0F
    codes[1::2] = packed >> 4
    return codes[:count].view(dtype).reshape(shape)


def read_only_arrays(source, names: list[str]) -> dict[str, np.ndarray]:
    """Read-only arrays of the tensors ``names`` of an open source (a whole
    load), each what ``source[name].numpy()`` returns. The views of every
    tensor stored raw in a mapped file come from one native call, without a
    :class:`Tensor` per tensor; any other tensor is taken through
    :meth:`Tensor.numpy`."""
    views, reviews = source._native._mapped_views(names)
    arrays = {}
    for name, view in zip(names, views):
        arrays[name] = source[name].numpy() if view is None else np.asarray(view)
    for at, dtype in reviews:
        if dtype in _ML_DTYPES:
            arrays[names[at]] = arrays[names[at]].view(_ML_DTYPES[dtype])
    return arrays


def memory_owner(arr: np.ndarray):
    """The object whose memory ``arr`` views: the end of its chain of
    ``base`` arrays. An array numpy made from an ``ArrayView``'s
    ``__array_struct__`` has the tuple ``(view, capsule)`` as its base
    (numpy 2; older numpy the view itself): the view is the owner."""
    base = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    if isinstance(base, tuple) and base and isinstance(base[0], _zt.ArrayView):
        return base[0]
    return base


def _views_the_file(arr: np.ndarray) -> bool:
    """True if ``arr`` is a view of a mapped file (no bytes were copied or
    decoded to make it)."""
    base = memory_owner(arr)
    return isinstance(base, _zt.ArrayView) and base.readonly


def _record_dtype(attributes: dict) -> np.dtype:
    """The numpy dtype of an ``npy.descr/1`` object: the descr its ``.npy``
    header stored, read as ``numpy.load`` reads it (the bytes per element
    checked against what the file holds)."""
    import ast

    from numpy.lib.format import descr_to_dtype

    dtype = descr_to_dtype(ast.literal_eval(attributes["descr"]))
    if dtype.hasobject or dtype.itemsize != attributes["itemsize"]:
        raise _zt.FormatError(f"descr {attributes['descr']} does not describe {attributes['itemsize']}-byte elements")
    return dtype


RECORD_LAYOUT = "npy.descr/1"


class Tensor(_zt.BufferExporter):
    """One tensor (or one part of a multi-part tensor) of a :class:`zt.Source`.

    It exports the buffer protocol, as upstream ztensor's ``Tensor`` does:
    ``memoryview(t)``, ``bytes(t)``, ``np.frombuffer(t, ...)`` see its bytes,
    read-only, a view of the mapped file where the stored bytes lie raw
    (a decoded copy otherwise), typed as :meth:`numpy` types them (its
    shape and strides too). bf16/fp8, which no buffer format names, export
    their stored integers (``uint16``/``uint8``), packed fp4/int4 their
    packed bytes, and arrays numpy cannot export (datetimes) their rows of
    bytes. numpy asks for a buffer before ``__array__``, so for those types
    ``np.asarray(t)`` is the stored integers: use ``t.numpy()``.
    """

    __slots__ = ("_native",)

    def _zt_buffer(self) -> np.ndarray:
        """The read-only array the buffer protocol exports (called by the
        native base type's buffer slot)."""
        name = self._native.dtype
        if name in _ML_DTYPES or name in SUBBYTE:
            arr = np.asarray(self._native._array(False))
        else:
            arr = self.numpy()
            try:
                memoryview(arr)
            except (ValueError, TypeError, BufferError):
                arr = np.asarray(self._native._array(False))
        if arr.flags.writeable:
            arr = arr.view()
            arr.flags.writeable = False
        return arr

    def __init__(self, native: _zt.Tensor):
        self._native = native

    name = property(lambda self: self._native.name, doc="Tensor name.")
    shape = property(lambda self: tuple(self._native.shape), doc="Shape as a tuple.")
    dtype = property(lambda self: self._native.dtype, doc='Element type name ("f32", "bf16", ...).')
    layout = property(lambda self: self._native.layout, doc='"dense" or a profile id.')
    parts = property(lambda self: self._native.parts, doc="Part names.")
    nbytes = property(lambda self: self._native.nbytes, doc="Payload bytes.")
    caps = property(lambda self: self._native.caps, doc="Capabilities: map, locate, evict, verify, alignment.")
    location = property(lambda self: self._native.location, doc="(path, offset, nbytes) or None.")
    attributes = property(lambda self: self._native.attributes, doc="Per-tensor attributes.")
    strides = property(lambda self: tuple(self._native.strides), doc="Element strides over the stored bytes.")

    def part(self, name: str) -> Tensor:
        """One part of a multi-part tensor."""
        return Tensor(self._native.part(name))

    def numpy(self, copy: bool = False) -> np.ndarray:
        """The tensor as a numpy array.

        ``copy=False``: a read-only view of the mapped file when the bytes are
        stored raw and aligned (``caps["map"]``), otherwise a decoded array.
        ``copy=True``: always a fresh, writable, C-ordered array.
        """
        return self._wrap(self._native._array(copy))

    def _wrap(self, view) -> np.ndarray:
        """The numpy array over a native array view of this tensor."""
        arr = np.asarray(view)
        if self._native._plain:
            return arr
        name = self._native.dtype
        if self._native.layout == RECORD_LAYOUT and self._native.parts == ["data"]:
            # Structured, string, datetime ... arrays: the bytes (one row of
            # `itemsize` per element) viewed as numpy's own dtype.
            dtype = _record_dtype(self._native.attributes)
            shape = tuple(self._native.shape)
            if arr.ndim == 1 and arr.size == int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
                # Stored flat (a .zt file keeps the layout structurally).
                arr = arr.reshape(shape + (dtype.itemsize,))
            if arr.ndim == 0 or arr.shape[-1] != dtype.itemsize:
                raise _zt.FormatError(f"{self.name!r}: stored rows are not {dtype.itemsize} bytes")
            if arr.strides[-1] != 1:
                arr = np.ascontiguousarray(arr)
            return arr.view(dtype)[..., 0]
        if name in _ML_DTYPES:
            arr = arr.view(_ML_DTYPES[name])
        elif name in _NIBBLES:
            arr = _unpack_nibbles(arr, self.shape, _NIBBLES[name])
        return arr

    def dequantize(self) -> np.ndarray:
        """The values as a writable float32 array of the tensor's shape.

        For GGUF block types (``layout`` ``gguf.<type>/1``), every type
        gguf-py 0.19 dequantizes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K,
        IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS,
        TQ1_0, TQ2_0, MXFP4, NVFP4), bit for bit what
        ``gguf.quants.dequantize`` returns, computed in Rust on the cores the
        output size warrants without holding the GIL; dense f32/f16/bf16
        tensors are converted. Other types (Q8_1, Q8_K, which gguf-py does
        not dequantize either) raise ``zt.FormatError`` (rule
        ``gguf.Dequant``).
        """
        return np.asarray(self._native._dequantize())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        # numpy 2's contract: copy=True always copies, None copies only if
        # it must, False never copies and raises when a copy is unavoidable.
        arr = self.numpy(copy=bool(copy))
        if copy is False and not _views_the_file(arr):
            raise ValueError(
                f"tensor {self.name!r} cannot be viewed without a copy ({self.layout}, caps {self.caps}); "
                "pass copy=None (or call numpy()) to let it be decoded or copied"
            )
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"converting tensor {self.name!r} to {np.dtype(dtype)} needs a copy")
            arr = arr.astype(dtype)
        return arr

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any:
        return self._native.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._native.__dlpack_device__()

    def tobytes(self) -> bytes:
        """The elements in C order as bytes."""
        return self._native.tobytes()

    def prefetch(self) -> None:
        """Ask the kernel to read this tensor's pages ahead."""
        self._native.prefetch()

    def evict(self) -> int:
        """Drop this tensor's own pages from memory; returns bytes dropped."""
        return self._native.evict()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a rank-0 tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"<zt.Tensor {self.name!r} {self.dtype} {list(self.shape)} {self.layout}>"
