"""Hand numpy arrays to the native writers without copying them into bytes."""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from . import _zt
from ._tensor import numpy_dtype

# numpy dtype -> zt name, from Rust's dtype table (`_zt.DTYPES`): every
# dtype zTensor registers that numpy (or ml_dtypes) has a type for (fp6 has
# none; int4/uint4 are ONNX's, which zTensor does not register).
_BY_NUMPY = {
    numpy_dtype(name): name for name, d in _zt.DTYPES.items() if d["zt"] and (d["ml_dtypes"] or d["bits"] % 8 == 0)
}


# The dtypes an array can be handed over in as it is (little-endian or
# native, one element per byte or more): `describe`'s fast path.
_AS_IS = {d: name for d, name in _BY_NUMPY.items() if _zt.DTYPES[name]["bits"] != 4}


def zt_dtype(dtype: np.dtype) -> str:
    """The zt dtype name for a numpy dtype (byte order ignored)."""
    dtype = np.dtype(dtype)
    little = dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype
    try:
        return _BY_NUMPY[little]
    except KeyError:
        raise ValueError(f"zt cannot store numpy dtype {dtype}") from None


def _pack_nibbles(arr: np.ndarray) -> np.ndarray:
    """One ml_dtypes 4-bit element per byte -> two per byte, low nibble first."""
    codes = arr.reshape(-1).view(np.uint8) & 0x0F
    if codes.size % 2:
        codes = np.append(codes, np.uint8(0))
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8)


def prepare(name: str, value) -> tuple[str, np.ndarray]:
    """The zt dtype name of one array and the little-endian, C-contiguous
    array holding its bytes, which the native writer borrows (fp4 packed two
    per byte)."""
    if not isinstance(value, (np.ndarray, np.generic)):
        raise ValueError(f"Key `{name}` is invalid, expected np.ndarray but received {type(value)}")
    arr = np.asarray(value)
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        raise ValueError(f"{name!r}: object and structured arrays cannot be stored")
    dtype = zt_dtype(arr.dtype)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    buf = _pack_nibbles(arr) if _zt.DTYPES[dtype]["bits"] == 4 else np.ascontiguousarray(arr)
    return dtype, buf


# What a `format=` may name, what a file name's extension picks, and what
# each writer accepts: the registry's writers that write from arrays (GGUF
# is written by conversion), with their capabilities as the Rust writers
# hold them (`zt::write::WriterCaps`; the writers check every request
# against them, so nothing here repeats those rules).
FORMATS = tuple(name for name, _, _ in _zt.ARRAY_WRITERS)
_BY_EXTENSION = {f".{ext}": name for name, exts, _ in _zt.ARRAY_WRITERS for ext in exts}
CAPS = {name: caps for name, _, caps in _zt.ARRAY_WRITERS}


def format_of(path: str, format: str | None) -> str:
    """The format to write: ``format`` when given, else the extension's,
    else safetensors (what code written for ``safetensors.save_file``
    expects of a name like ``model.ckpt`` or ``weights``)."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"zt writes no format {format!r}; it writes {', '.join(FORMATS)}")
        return format
    return _BY_EXTENSION.get(os.path.splitext(path)[1].lower(), "safetensors")


def describe(tensors: Mapping[str, np.ndarray]) -> list[tuple]:
    """``(name, dtype, shape, array)`` of each tensor for ``_zt.save``,
    which borrows each array's buffer for the call."""
    if not isinstance(tensors, Mapping):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensors)}")
    described = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, got {name!r}")
        # The common case, a C-contiguous ndarray of a dtype stored as it
        # is, costs two lookups: 50k small tensors made this loop a fifth
        # of a save.
        as_is = _AS_IS.get(value.dtype) if type(value) is np.ndarray and value.flags.c_contiguous else None
        if as_is is not None:
            described.append((name, as_is, value.shape, value))
            continue
        dtype, buf = prepare(name, value)
        described.append((name, dtype, [int(d) for d in np.shape(value)], buf))
    return described


def metadata_pairs(metadata: Mapping[str, str] | None) -> list[tuple[str, str]] | None:
    """``__metadata__`` for the native writer: ``None`` writes none, ``{}`` an
    empty one (as safetensors does). Keys and values must be ``str``, as
    safetensors requires (it raises ``TypeError`` otherwise)."""
    if metadata is None:
        return None
    pairs = []
    for k, v in dict(metadata).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str to str, got {k!r}: {v!r}")
        pairs.append((k, v))
    return pairs


def save(
    tensors: Mapping[str, np.ndarray],
    path,
    metadata: Mapping[str, str] | None = None,
    align: int | str | None = None,
    compression: bool | int = False,
    storage_options: dict | None = None,
    format: str | None = None,
    max_shard_size: int | str | None = None,
    layout: str | None = None,
    durable: bool = True,
) -> int:
    """Write ``tensors`` to ``path`` (a local path or an ``s3://`` URL) in
    ``format``, or the format its extension names (safetensors for any
    other name). ``align`` and ``compression`` apply to ``.zt`` only.
    ``max_shard_size`` writes a sharded checkpoint (see :func:`shard_size`).
    ``layout="keras"`` writes HDF5 in Keras 3's weights layout (sharded as
    Keras shards with ``max_shard_size``: ``NAME.weights.json`` and
    ``NAME_0000N.weights.h5``). ``durable=False``: atomic rename, no
    fsync (see :func:`zt.numpy.save_file`)."""
    path = os.fspath(path)
    described = describe(tensors)
    if layout == "keras" and format is None:
        format = "h5"  # `m.weights.json` names Keras's sharded form too
    fmt = format_of(path, format)
    max_bytes = None if max_shard_size is None else shard_size(max_shard_size)
    from ._zt_writer import _level

    level = _level(None, compression)  # a writer that takes no compression refuses it
    if metadata is not None and CAPS[fmt]["metadata"] == "strings":
        # str to str, raising TypeError otherwise, as safetensors does.
        metadata = dict(metadata_pairs(metadata))
    return _zt.save(
        path, fmt, described, _as_dict(metadata), align, level, storage_options, max_bytes, layout, bool(durable)
    )


def _as_dict(metadata: Mapping | None) -> dict | None:
    return None if metadata is None else dict(metadata)


def shard_size(size: int | str) -> int:
    """Bytes from a shard size as Hugging Face writes one: an int, or a
    string like ``"5GB"`` (decimal KB/MB/GB/TB, as huggingface_hub reads
    them) or ``"4GiB"`` (binary KiB/MiB/GiB/TiB, as transformers reads them)."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise TypeError(f"max_shard_size must be an int or a str like '5GB', got {size!r}")
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size must be positive, got {size}")
        return size
    return _zt.parse_shard_size(size)


def save_bytes(
    tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None, format: str = "safetensors"
) -> bytes:
    """What :func:`save` would write, as bytes (``safetensors.*.save``)."""
    fmt = format_of("", format)
    if fmt == "safetensors":
        pairs = metadata_pairs(metadata)
        return _zt.save(None, fmt, describe(tensors), None if pairs is None else dict(pairs))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="zt-save-") as d:
        path = os.path.join(d, "data")
        save(tensors, path, metadata, format=fmt)
        with open(path, "rb") as f:
            return f.read()


def open_bytes(data):
    """A :class:`zt.Source` over ``data`` (the bytes of a file in any format
    zt reads), for ``load``. The bytes go to a temporary file that is
    unlinked at once; the mapping keeps them."""
    import tempfile

    import zt

    view = memoryview(data).cast("B")
    # A lone .npy is named after its file: "arr_0", as np.savez names a
    # positional array.
    with tempfile.TemporaryDirectory(prefix="zt-load-") as d:
        path = os.path.join(d, "arr_0")
        with open(path, "wb") as f:
            f.write(view)
        return zt.open(path)
