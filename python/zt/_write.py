"""Hand numpy arrays to the native writers without copying them into bytes."""

from __future__ import annotations

import os
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from . import _zt

_BY_NUMPY = {
    np.dtype("<f8"): "f64",
    np.dtype("<f4"): "f32",
    np.dtype("<f2"): "f16",
    np.dtype("<i8"): "i64",
    np.dtype("<i4"): "i32",
    np.dtype("<i2"): "i16",
    np.dtype("i1"): "i8",
    np.dtype("<u8"): "u64",
    np.dtype("<u4"): "u32",
    np.dtype("<u2"): "u16",
    np.dtype("u1"): "u8",
    np.dtype("?"): "bool",
    np.dtype("<c8"): "complex64",
    np.dtype("<c16"): "complex128",
    np.dtype(ml_dtypes.bfloat16): "bf16",
    np.dtype(ml_dtypes.float8_e4m3fn): "f8_e4m3fn",
    np.dtype(ml_dtypes.float8_e5m2): "f8_e5m2",
    np.dtype(ml_dtypes.float8_e4m3fnuz): "f8_e4m3fnuz",
    np.dtype(ml_dtypes.float8_e5m2fnuz): "f8_e5m2fnuz",
    np.dtype(ml_dtypes.float8_e8m0fnu): "f8_e8m0",
    np.dtype(ml_dtypes.float4_e2m1fn): "f4_e2m1",
}


def zt_dtype(dtype: np.dtype) -> str:
    """The zt dtype name for a numpy dtype (byte order ignored)."""
    dtype = np.dtype(dtype)
    little = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    try:
        return _BY_NUMPY[little]
    except KeyError:
        raise ValueError(f"zt cannot store numpy dtype {dtype}") from None


def _pack_f4(arr: np.ndarray) -> np.ndarray:
    """One ml_dtypes fp4 per byte -> two per byte, low nibble first."""
    codes = arr.reshape(-1).view(np.uint8) & 0x0F
    if codes.size % 2:
        codes = np.append(codes, np.uint8(0))
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)


def prepare(name: str, value) -> tuple[tuple, np.ndarray]:
    """Describe one array for the native writer and return the buffer that
    must stay alive during the call (little-endian, C-contiguous)."""
    arr = np.asarray(value)
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        raise ValueError(f"{name!r}: object and structured arrays cannot be stored")
    dtype = zt_dtype(arr.dtype)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    buf = _pack_f4(arr) if dtype == "f4_e2m1" else np.ascontiguousarray(arr)
    address = buf.__array_interface__["data"][0] if buf.nbytes else 0
    return (name, dtype, [int(d) for d in arr.shape], address, int(buf.nbytes)), buf


def save(
    tensors: Mapping[str, np.ndarray],
    path,
    metadata: Mapping[str, str] | None = None,
    align: int | str | None = None,
    compression: bool | int = False,
    storage_options: dict | None = None,
) -> int:
    """Write ``tensors`` to ``path`` (a local path or an ``s3://`` URL) in
    the format its extension names. ``align`` and ``compression`` apply to
    ``.zt`` only."""
    path = os.fspath(path)
    if not isinstance(tensors, Mapping):
        raise TypeError("tensors must be a mapping of name to array")
    described, keep_alive = [], []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r}")
        info, buf = prepare(name, value)
        described.append(info)
        keep_alive.append(buf)
    ext = os.path.splitext(path)[1].lower()
    if (align is not None or compression) and ext != ".zt":
        raise ValueError(f"{ext or 'this format'} files have no alignment or compression options; use .zt")
    if metadata is not None and ext not in (".safetensors", ".zt"):
        raise ValueError(f"{ext or 'this format'} files cannot carry metadata; use .safetensors or .zt")
    if ext == ".zt":
        from ._zt_writer import save_zt

        written = save_zt(described, path, metadata, align, compression, storage_options)
    elif ext == ".safetensors":
        meta = [(str(k), str(v)) for k, v in (metadata or {}).items()]
        written = _zt.write_safetensors(path, described, meta, storage_options)
    elif ext == ".npz":
        written = _zt.write_npz(path, described, storage_options)
    elif ext in (".pt", ".pth", ".bin"):
        written = _zt.write_pt(path, described, storage_options)
    elif ext == ".npy":
        if len(described) != 1:
            raise ValueError(f".npy holds exactly one array, got {len(described)}")
        written = _zt.write_npy(path, described[0], storage_options)
    else:
        raise ValueError(f"cannot write {path!r}: zt writes .zt, .safetensors, .npz, .npy and .pt/.pth/.bin")
    del keep_alive  # the buffers had to outlive the native call
    return written
