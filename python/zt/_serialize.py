"""safetensors' low-level API: ``TensorSpec``, ``serialize``,
``serialize_file`` and ``deserialize``, which ``safetensors.numpy`` and
``safetensors.torch`` are written over (and code that writes from raw
pointers calls directly). The bytes written are zt's safetensors writer's,
byte for byte what safetensors 0.8.0 writes from the same specs.

>>> a = np.arange(6, dtype=np.float32)                                    # doctest: +SKIP
>>> spec = zt.TensorSpec(dtype="float32", shape=[2, 3], data_ptr=a.ctypes.data, data_len=a.nbytes)  # doctest: +SKIP
>>> zt.deserialize(zt.serialize({"a": spec}))[0][1]["dtype"]              # doctest: +SKIP
'F32'
"""

from __future__ import annotations

import ctypes
import operator
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _zt
from ._safe_open import _ST_DTYPES

# The dtype names TensorSpec takes (torch's and numpy's), as safetensors'
# format codes.
_SPEC_DTYPES = {
    "bool": "BOOL",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "uint32": "U32",
    "int64": "I64",
    "uint64": "U64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2": "F8_E5M2",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "float4_e2m1fn_x2": "F4",
    "complex64": "C64",
}
# safetensors' format codes as zt's dtype names.
_ZT_DTYPES = {code: name for name, code in _ST_DTYPES.items()}

_U64 = (1 << 64) - 1


def _unsigned(what: str, value: Any) -> int:
    """``value`` as an unsigned 64-bit int, refused as safetensors' binding
    refuses it (``TypeError`` for a non-integer, ``OverflowError`` out of range)."""
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(
            f"argument {what!r}: {type(value).__name__!r} object cannot be interpreted as an integer"
        ) from None
    if n < 0:
        raise OverflowError(f"argument {what!r}: can't convert negative int to unsigned")
    if n > _U64:
        raise OverflowError(f"argument {what!r}: int too big to convert")
    return n


class TensorSpec:
    """One tensor for :func:`serialize` / :func:`serialize_file`, as
    ``safetensors.TensorSpec``: ``TensorSpec(dtype=, shape=, data_ptr=,
    data_len=)``, all keyword-only.

    ``dtype`` is torch's or numpy's name (``"float32"``, ``"bfloat16"``,
    ``"float4_e2m1fn_x2"``, ...); an unknown one raises ``zt.FormatError``
    here (safetensors' ``SafetensorError``). ``shape`` is the element count
    along each axis; for ``float4_e2m1fn_x2`` (two values a byte) it is
    torch's storage shape and the last dimension is doubled, so
    ``spec.shape`` is the shape written to the header. ``data_ptr`` and
    ``data_len`` are the address and byte length of the tensor's C-order,
    little-endian bytes: raw memory that the caller keeps alive for every
    call that reads the spec. ``spec.dtype`` is the format code (``"F32"``).
    """

    __slots__ = ("_code", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype: str, shape: Any, data_ptr: int, data_len: int) -> None:
        if not isinstance(dtype, str):
            raise TypeError(f"argument 'dtype': {type(dtype).__name__!r} object is not an instance of 'str'")
        if isinstance(shape, (str, bytes)):
            raise TypeError(f"argument 'shape': a {type(shape).__name__} is not a sequence of ints")
        dims = [_unsigned("shape", d) for d in shape]
        code = _SPEC_DTYPES.get(dtype)
        if code is None:
            raise _zt.FormatError(f"Unknown dtype {dtype!r}. Supported dtypes: {', '.join(_SPEC_DTYPES)}")
        if code == "F4" and dims:
            dims[-1] *= 2  # two values a byte: the header counts values
            if dims[-1] > _U64:
                raise _zt.FormatError(f"F4 last dimension {dims[-1] // 2} doubled overflows")
        self._code = code
        self._shape = dims
        self._data_ptr = _unsigned("data_ptr", data_ptr)
        self._data_len = _unsigned("data_len", data_len)

    @property
    def dtype(self) -> str:
        """The format code written to the header (``"F32"``, ``"BF16"``, ``"F4"``, ...)."""
        return self._code

    @property
    def shape(self) -> list[int]:
        """The shape written to the header (the last dimension doubled for ``F4``)."""
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        """The address of the tensor's bytes."""
        return self._data_ptr

    @property
    def data_len(self) -> int:
        """The length of the tensor's bytes."""
        return self._data_len

    def __repr__(self) -> str:
        return f"TensorSpec(dtype='{self._code}', shape={self._shape}, data_ptr={self._data_ptr}, data_len={self._data_len})"

    def _described(self, name: str) -> tuple[str, str, list[int], np.ndarray]:
        """``(name, zt dtype, shape, bytes)`` for the native writer: the
        spec's sizes checked as safetensors checks them, and its memory
        viewed (not copied) as a uint8 array."""
        bits = _zt.DTYPES[_ZT_DTYPES[self._code]]["bits"]
        count = 1
        for d in self._shape:
            count *= d
        if count * bits % 8:
            raise _zt.FormatError(
                f"Error while serializing: tensor {name!r}: {count} {self._code} values do not end on a byte boundary"
            )
        if count * bits // 8 != self._data_len:
            raise _zt.FormatError(
                f"Error while serializing: invalid shape, data type, or offset for tensor {name!r}:"
                f" {self._code} of shape {self._shape} is {count * bits // 8} bytes, data_len is {self._data_len}"
            )
        if self._data_len == 0:
            data = np.empty(0, dtype=np.uint8)
        elif self._data_ptr == 0:
            # safetensors would read address 0 and crash the process.
            raise _zt.FormatError(f"Error while serializing: tensor {name!r}: data_ptr is 0 for {self._data_len} bytes")
        else:
            data = np.frombuffer((ctypes.c_ubyte * self._data_len).from_address(self._data_ptr), dtype=np.uint8)
        return name, _ZT_DTYPES[self._code], self._shape, data


def _described(tensor_dict: Mapping[str, TensorSpec]) -> list[tuple]:
    if not isinstance(tensor_dict, Mapping):
        raise TypeError(f"argument 'tensor_dict': {type(tensor_dict).__name__!r} object is not a dict")
    out = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"argument 'tensor_dict': tensor names must be str, got {name!r}")
        if not isinstance(spec, TensorSpec):
            raise TypeError(
                f"argument 'tensor_dict': {name!r} is a {type(spec).__name__}, not a TensorSpec"
                " (serialize takes TensorSpecs since safetensors 0.8)"
            )
        out.append(spec._described(name))
    return out


def _metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise TypeError(f"argument 'metadata': {type(metadata).__name__!r} object is not a dict")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"argument 'metadata': must map str to str, got {k!r}: {v!r}")
    return dict(metadata)


def serialize(tensor_dict: Mapping[str, TensorSpec], metadata: Mapping[str, str] | None = None) -> bytes:
    """The safetensors file of ``tensor_dict`` (name -> :class:`TensorSpec`)
    and ``metadata`` (str -> str), as bytes: ``safetensors.serialize``.
    Written without the GIL, from the specs' memory as it lies."""
    return _zt.save(None, "safetensors", _described(tensor_dict), _metadata(metadata))


def serialize_file(
    tensor_dict: Mapping[str, TensorSpec],
    filename: str | os.PathLike[str],
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write :func:`serialize`'s bytes to ``filename`` (a safetensors file
    whatever its extension, as ``safetensors.serialize_file`` writes it),
    without the GIL: built beside it and renamed into place."""
    _zt.save(os.fspath(filename), "safetensors", _described(tensor_dict), _metadata(metadata))


def deserialize(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Every tensor of a file's bytes as ``safetensors.deserialize`` returns
    them: ``[(name, {"shape": [...], "dtype": "F32", "data": bytearray})]``,
    in the order the bytes lie (safetensors' order is its hash map's). Any
    format zt reads, for tensors safetensors has a dtype for; ``data`` is
    the C-order, little-endian bytes (fp4 two values a byte)."""
    from ._write import open_bytes

    with open_bytes(data) as source:
        tensors = [source[name] for name in source]
        located = sorted(
            range(len(tensors)),
            key=lambda i: ((tensors[i].location or ("", 0, 0))[1], i),
        )
        out = []
        for i in located:
            t = tensors[i]
            code = _ST_DTYPES.get(t.dtype) if t.layout == "dense" else None
            if code is None:
                raise _zt.FormatError(
                    f"{t.name!r}: a {t.dtype} {t.layout} tensor has no safetensors dtype; read it with zt.open"
                )
            out.append((t.name, {"shape": list(t.shape), "dtype": code, "data": bytearray(t.tobytes())}))
        return out


__all__ = ["TensorSpec", "deserialize", "serialize", "serialize_file"]
