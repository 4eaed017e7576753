"""Dense and Ragged record stores in loaderx's on-disk format, loaderx-shaped.

A store is an ordered, immutable sequence of records with ids ``0..N-1`` in
append order. ``create`` returns an append-only container, ``open`` a
read-only one; ``close`` publishes a created store.

Two layouts, as two loaderx releases write them; ``open`` tells them apart
from the bytes, ``create`` writes either:

* ``layout="loaderx-2.8"`` (the default; loaderx 2.8.19, the current
  release): a JSON schema (``{"dtype": "int32", "item_shape": [12]}``) and
  u32 Ragged shape prefixes. Holds loaderx 2.8's twenty native-order dtypes
  (bool, (u)int8..64, float16/32/64, bfloat16, the float8 types,
  complex64/128).
* ``layout="loaderx-2.3"`` (loaderx 2.3.8): a MsgPack schema with
  ``dtype.str`` and u64 Ragged shape prefixes; any fixed-size dtype
  (non-native byte order, strings, datetimes).

Each opens in the loaderx release whose layout it has, byte for byte the
store that release builds from the same records; neither loaderx release
opens the other's stores.

>>> import numpy as np
>>> from zt.zrecord import Dense
>>> with Dense.create("rows", np.float32, (4,), codec="zstd") as ds:   # doctest: +SKIP
...     ds.append(np.ones((10, 4), np.float32))
>>> with Dense.open("rows") as ds:                                       # doctest: +SKIP
...     batch = ds[[3, 1, 4]]                                           # (3, 4) float32

Many stores read as one (what a cluster build leaves, one store per task):
``concat(stores, "train.json")`` writes a manifest listing them, with each
store's record count and header digest, without copying a record;
``Dense.open("train.json")`` (or ``Dense.open_many(stores)``) opens them
as one sequence, a gather split by store and put back in order. A store
changed or missing since the manifest was written is refused
(``zt.FormatError``, rule ``zrecord.DatasetStore``).

Unlike loaderx, a build happens beside the destination and is renamed into
place by ``close()``: an exception inside ``with create(...)`` (or a killed
process) publishes nothing. Gathers release the GIL and run in parallel;
``close()`` during a gather is safe (the gather keeps the store alive).
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import numpy.typing as npt

from . import _zt
from ._zt import ZrecordError

if TYPE_CHECKING:
    from typing_extensions import Self

PathLike = Union[str, "os.PathLike[str]"]
#: Object-storage options, as for :func:`zt.open`.
StorageOptions = Union[Mapping[str, Any], None]

__all__ = ["DEFAULT_LAYOUT", "DICT_TIERS", "LAYOUTS", "Dense", "Ragged", "ZrecordError", "concat", "train_dict"]

# The store's names and bounds, from the zrecord crate (`_zt.ZRECORD_LIMITS`).
_LIMITS = _zt.ZRECORD_LIMITS
CODECS = _LIMITS["codecs"]
MAX_DATA_SHARDS = _LIMITS["max_data_shards"]
MAX_RECORD_LEN = _LIMITS["max_record_len"]
DICT_TIERS = {name: {"dict_bytes": d, "sample_budget": s} for name, (d, s) in _zt.dict_tiers().items()}
# loaderx 2.3.8 and 2.8.19 both train one 32 KiB dictionary on at most 4 MiB
# of samples: tier "fast", byte for byte the same dictionary.
DEFAULT_TIER = "fast"
LAYOUTS = _LIMITS["layouts"]
DEFAULT_LAYOUT = _LIMITS["default_layout"]

_NUMPY_MAX_NDIMS = 64 if int(np.__version__.split(".", 1)[0]) >= 2 else 32
_MAX_INTP = np.iinfo(np.intp).max


# Ragged batches whose records average at least this many bytes are written
# record by record from the caller's arrays instead of packed first.
_UNPACKED_RECORD_BYTES = 64 << 10


def _validate_dtype(dtype):
    if dtype.fields is not None:
        raise ValueError("structured dtypes are not supported")
    if dtype.subdtype is not None:
        raise ValueError("subarray dtypes are not supported; put dimensions in the shape")
    if dtype.metadata is not None:
        raise ValueError("dtype metadata is not supported")
    if dtype.hasobject:
        raise ValueError("object dtypes cannot be persisted")
    if dtype.itemsize == 0:
        raise ValueError("zero-itemsize dtypes cannot be persisted")
    return dtype


def _validate_shape(value):
    try:
        dimensions = tuple(value)
    except TypeError:
        raise ValueError("item_shape must be an iterable of integers") from None
    shape = []
    for dimension in dimensions:
        if isinstance(dimension, (bool, np.bool_)):
            raise ValueError("item_shape dimensions must be integers")
        try:
            dimension = operator.index(dimension)
        except TypeError:
            raise ValueError("item_shape dimensions must be integers") from None
        if dimension < 0:
            raise ValueError("item_shape dimensions must be non-negative")
        shape.append(dimension)
    if len(shape) >= _NUMPY_MAX_NDIMS:
        raise ValueError(f"item_shape rank must be below NumPy's {_NUMPY_MAX_NDIMS}-dimension limit")
    return tuple(shape)


def _validate_ndim(value):
    if isinstance(value, (bool, np.bool_)):
        raise ValueError("ndim must be an integer")
    try:
        ndim = operator.index(value)
    except TypeError:
        raise ValueError("ndim must be an integer") from None
    if ndim < 1 or ndim > _NUMPY_MAX_NDIMS:
        raise ValueError(f"ndim must be between 1 and NumPy's {_NUMPY_MAX_NDIMS}-dimension limit")
    return ndim


def _validate_data_shards(value):
    if isinstance(value, (bool, np.bool_)):
        raise ValueError("data_shards must be an integer")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError("data_shards must be an integer") from None
    if not 1 <= value <= MAX_DATA_SHARDS:
        raise ValueError(f"data_shards must be between 1 and {MAX_DATA_SHARDS}")
    return value


def _check_codec(codec, dict_bytes):
    if not isinstance(codec, str) or codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}, expected one of {sorted(CODECS)}")
    if codec == "zstd_dict" and not dict_bytes:
        raise ValueError("creating a zstd_dict store requires non-empty dict_bytes from train_dict")
    if codec != "zstd_dict" and dict_bytes is not None:
        raise ValueError("dict_bytes requires codec='zstd_dict'")
    return None if dict_bytes is None else bytes(dict_bytes)


def _schema_dtype(name: str) -> np.dtype:
    """The dtype a schema names: NumPy's (``"<i4"``, ``"int32"``) or one of
    ml_dtypes' (``"bfloat16"``, ``"float8_e4m3fn"``), which loaderx 2.8 uses."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: F401  (registers its type names with numpy)

        return np.dtype(name)


def _location(path):
    """A store's location: a ``Path``, or an object URL kept as text
    (``pathlib`` would fold the ``//`` of ``s3://``)."""
    text = os.fspath(path)
    if isinstance(text, str) and text.startswith(tuple(_zt.URL_SCHEMES)):
        return text
    return Path(path)


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}, expected one of {list(LAYOUTS)}")
    return layout


class _Base:
    """Lifecycle, indexing and schema common to both geometries."""

    def __init__(self, *args, **kwargs):
        raise TypeError(f"use {type(self).__name__}.open(...) or {type(self).__name__}.create(...)")

    # -- construction -------------------------------------------------------

    def _open(self, path, dense, storage_options=None, many=None, documents=None, mds=None):
        self.path = _location(path)
        self._writer = None
        # How this reader was opened, so another process can open the same
        # source the same way (see :meth:`_open_as`).
        self._opened_as = (path, dense, storage_options, many, documents, mds)
        if mds is not None:
            self._reader = _zt.RecordReader.open_mds(os.fspath(self.path), dense, *mds, storage_options)
        elif documents is not None:
            self._reader = _zt.RecordReader.open_binidx(os.fspath(self.path), documents, storage_options)
        elif many is None:
            self._reader = _zt.RecordReader.open(os.fspath(self.path), dense, storage_options)
        else:
            self._reader = _zt.RecordReader.open_many([os.fspath(_location(p)) for p in many], dense, storage_options)
        try:
            dtype, ndim, item_shape = self._reader.schema()
            self.dtype = _validate_dtype(_schema_dtype(dtype))
            self.layout = self._reader.layout
            self.ndim = ndim
            if dense:
                self.item_shape = tuple(item_shape)
                self._row_bytes = math.prod(self.item_shape) * self.dtype.itemsize
            self.codec = self._reader.codec
            self.data_shards = self._reader.data_shards
        except BaseException:
            self._reader.close()
            raise

    def _create(self, path, dtype, item_shape, ndim, codec, dict_bytes, data_shards, level, layout, storage_options):
        dict_bytes = _check_codec(codec, dict_bytes)
        self.layout = _check_layout(layout)
        self.path = _location(path)
        self.dtype = _validate_dtype(np.dtype(dtype))
        self.codec = codec
        self.data_shards = _validate_data_shards(data_shards)
        self._reader = None
        if level is not None and (isinstance(level, bool) or not isinstance(level, int) or codec == "raw"):
            raise ValueError("level must be an int and needs a zstd codec")
        if item_shape is not None:
            self.item_shape = _validate_shape(item_shape)
            self.ndim = len(self.item_shape)
            self._row_bytes = math.prod(self.item_shape) * self.dtype.itemsize
            if self._row_bytes <= 0 or self._row_bytes > MAX_RECORD_LEN:
                raise ValueError(f"dense record width {self._row_bytes} is outside the native limit")
        else:
            self.ndim = _validate_ndim(ndim)
        self._writer = _zt.RecordWriter.create(
            os.fspath(self.path),
            self.dtype.str,
            self.dtype.name,
            None if item_shape is None else list(self.item_shape),
            None if item_shape is not None else self.ndim,
            codec,
            self.data_shards,
            dict_bytes,
            level,
            self.layout,
            storage_options,
        )

    # -- lifecycle ----------------------------------------------------------

    @classmethod
    def _open_as(cls, opened_as: tuple) -> Self:
        """A new reader of the source another reader was opened on, opened
        the same way (its ``_opened_as``: path, open method, options and
        storage options): how a spawned worker process reopens a stream."""
        path, dense, storage_options, many, documents, mds = opened_as
        self = cls.__new__(cls)
        self._open(path, dense, storage_options, many=many, documents=documents, mds=mds)
        return self

    def _require(self, writable):
        handle = self._writer if writable else self._reader
        if handle is None or handle.closed:
            other = self._reader if writable else self._writer
            if other is not None and not other.closed:
                operation = "append" if writable else "read"
                source = "create" if writable else "open"
                raise RuntimeError(f"{operation} requires a container returned by {source}()")
            raise RuntimeError("Container is closed")
        return handle

    def __len__(self) -> int:
        handle = self._writer if self._writer is not None else self._reader
        if handle is None or handle.closed:
            raise RuntimeError("Container is closed")
        return len(handle)

    @property
    def closed(self) -> bool:
        handle = self._writer if self._writer is not None else self._reader
        return handle is None or handle.closed

    def has_dict(self) -> bool:
        """True if the store uses a zstd dictionary."""
        return self.codec == "zstd_dict"

    def close(self) -> None:
        """Publish a created store (rename into place), or release a reader.
        Idempotent. Waits for a running append; a running gather keeps the
        store open until it returns."""
        if getattr(self, "_writer", None) is not None:
            self._writer.close()
        if getattr(self, "_reader", None) is not None:
            self._reader.close()

    def discard(self) -> None:
        """Abandon a store being created: nothing is published."""
        if getattr(self, "_writer", None) is not None:
            self._writer.discard()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc_val: object, exc_tb: object) -> None:
        # An exception inside `with create(...)` discards the build rather
        # than publishing a partial store.
        if exc_type is not None:
            self.discard()
        self.close()

    # -- indexing -----------------------------------------------------------

    def _idxs(self, idx):
        length = len(self._reader)
        if isinstance(idx, (bool, np.bool_)):
            raise TypeError("a boolean scalar is not a record index or mask")
        if isinstance(idx, slice):
            if (idx.start is not None and idx.start < 0) or (idx.stop is not None and idx.stop < 0):
                raise IndexError("negative record indices are not supported")
            idxs = np.arange(*idx.indices(length), dtype=np.uint64)
        elif type(idx) is np.ndarray and idx.dtype == np.uint64 and idx.flags.c_contiguous:
            idxs = idx
        else:
            # Any container form is a record set: ds[0, 5, 2] gathers 0, 5, 2.
            idxs = np.asarray([idx] if isinstance(idx, (int, np.integer)) else idx)
            if idxs.dtype == np.bool_:
                if idxs.ndim != 1 or idxs.size != length:
                    raise IndexError(f"boolean mask must be one-dimensional with length {length}")
                idxs = np.flatnonzero(idxs)
            elif idxs.size and not np.issubdtype(idxs.dtype, np.integer):
                raise TypeError("indices must be integers or a bool mask")
            if idxs.size and np.issubdtype(idxs.dtype, np.signedinteger) and idxs.min() < 0:
                raise IndexError("negative record indices are not supported")
            idxs = np.ascontiguousarray(idxs, dtype=np.uint64).reshape(-1)
        if idxs.size and idxs.max() >= length:
            raise IndexError(f"record index out of range for container of length {length}")
        return idxs

    def __getitem__(self, idx: Any) -> Any:
        """``ds[i]`` is one record; a list, tuple, ndarray, slice or bool mask
        is a record set (a gather)."""
        values = self.__getitems__(idx)
        return values[0] if isinstance(idx, (int, np.integer)) else values

    def __getitems__(self, idxs: Any) -> Any:
        reader = self._require(False)
        return self._gather(reader, self._idxs(idxs))


class Dense(_Base):
    """A fixed-shape sequence: one ``item_shape`` row per record. Reads
    return ``ndarray`` of shape ``(n, *item_shape)``."""

    @classmethod
    def open(cls, path: PathLike, *, storage_options: StorageOptions = None) -> Self:
        """Open an existing dense store for reading: a directory, or an
        ``s3://`` prefix (``storage_options`` as for :func:`zt.open`), or a
        dataset manifest (see :func:`concat`)."""
        self = cls.__new__(cls)
        self._open(path, True, storage_options)
        return self

    @classmethod
    def open_many(cls, paths: Sequence[PathLike], *, storage_options: StorageOptions = None) -> Self:
        """Open dense stores (directories or ``s3://`` prefixes, of one
        dtype, item shape and codec) as one sequence, in order."""
        paths = list(paths)
        self = cls.__new__(cls)
        self._open(paths[0] if paths else "", True, storage_options, many=paths)
        return self

    @classmethod
    def open_mds(cls, path: PathLike, column: str, *, storage_options: StorageOptions = None) -> Self:
        """Open one fixed-size column of MosaicML MDS shards (the directory
        ``streaming.MDSWriter`` wrote, or its ``index.json``) as a Dense
        source: ``ndarray:DTYPE:SHAPE`` columns as rows of that shape,
        scalar columns (``int``, ``uint8`` .. ``float64``) as item shape
        ``()``. Values are copied from the mapped shards (zstd-compressed
        shards without their raw file are decompressed at open); every
        sample is checked when gathered (rule ``zrecord.Mds``).

        ``path`` may be an object-storage prefix (``s3://bucket/dir``,
        ``gs://``, ``az://``; ``storage_options`` as for :func:`zt.open`):
        ``index.json`` is read and the prefix listed once, each raw shard's
        offset table fetched at open, and each gather fetches its samples'
        byte ranges (coalesced, within the process's request budget; the
        DataLoader starts its prefetch window's fetches ahead)."""
        self = cls.__new__(cls)
        self._open(path, True, storage_options, mds=(column, 1))
        return self

    @classmethod
    def create(
        cls,
        path: PathLike,
        dtype: npt.DTypeLike,
        item_shape: int | Sequence[int],
        *,
        codec: str = "raw",
        dict_bytes: bytes | None = None,
        data_shards: int = 4,
        level: int | None = None,
        layout: str = DEFAULT_LAYOUT,
        storage_options: StorageOptions = None,
    ) -> Self:
        """Create a new append-only dense store with an explicit schema.
        ``level`` overrides the zstd level (default 3 for both codecs, as
        loaderx 2.3.8 and 2.8.19 write; 15 is loaderx 2.3.5's dictionary
        level). ``layout`` is ``"loaderx-2.8"`` (default) or ``"loaderx-2.3"``
        (see the module docs). An ``s3://`` path is built locally and
        uploaded on :meth:`close` (shards first, ``meta.zr`` last)."""
        self = cls.__new__(cls)
        self._create(path, dtype, item_shape, None, codec, dict_bytes, data_shards, level, layout, storage_options)
        return self

    def append(self, records: np.ndarray) -> None:
        """Append one ``(batch, *item_shape)`` array (synchronous, GIL released)."""
        writer = self._require(True)
        batch = records
        if not isinstance(batch, np.ndarray):
            raise TypeError("dense append requires a numpy array")
        if batch.ndim == 0:
            batch = batch.reshape(1)
        if batch.dtype != self.dtype:
            raise ValueError(f"dense append dtype {batch.dtype} != store dtype {self.dtype}")
        if batch.ndim != len(self.item_shape) + 1 or batch.shape[1:] != self.item_shape:
            raise ValueError(f"dense append shape {batch.shape} != (batch, *{self.item_shape})")
        if len(batch) == 0:
            raise ValueError("append needs at least one record")
        src = np.ascontiguousarray(batch)
        writer.append_dense(src)

    def _gather(self, reader, idxs):
        shape = (idxs.size, *self.item_shape)
        nbytes = math.prod(shape) * self.dtype.itemsize
        if nbytes >= _zt.BATCH_POOLED_FROM:
            # Large batches reuse the buffers of dropped ones: fresh pages
            # cost more than the gather (see python/src/batch_pool.rs).
            values = np.asarray(_zt.batch_buffer(nbytes)).view(self.dtype).reshape(shape)
        else:
            values = np.empty(shape, dtype=self.dtype)
        reader.gather_dense(idxs, values)
        return values


class Ragged(_Base):
    """A sequence whose records keep their own shapes (fixed rank ``ndim``).
    Reads return a list of arrays that view one shared buffer per batch;
    :meth:`gather_packed` returns that buffer with offsets and shapes."""

    @classmethod
    def open(cls, path: PathLike, *, storage_options: StorageOptions = None) -> Self:
        """Open an existing ragged store for reading (a directory or an
        ``s3://`` prefix, or a dataset manifest: see :func:`concat`)."""
        self = cls.__new__(cls)
        self._open(path, False, storage_options)
        return self

    @classmethod
    def open_many(cls, paths: Sequence[PathLike], *, storage_options: StorageOptions = None) -> Self:
        """Open ragged stores (of one dtype, rank and codec) as one
        sequence, in order."""
        paths = list(paths)
        self = cls.__new__(cls)
        self._open(paths[0] if paths else "", False, storage_options, many=paths)
        return self

    @classmethod
    def open_mds(cls, path: PathLike, column: str, *, ndim: int = 1, storage_options: StorageOptions = None) -> Self:
        """Open one variable-size column of MosaicML MDS shards as a Ragged
        source: ``ndarray:DTYPE`` and ``ndarray`` columns as records of rank
        ``ndim`` with the shape each sample carries (an ``ndarray`` column's
        dtype is its first sample's, and every sample must have it),
        ``bytes`` and ``str`` as rank-1 uint8 records. As
        :meth:`Dense.open_mds` otherwise."""
        self = cls.__new__(cls)
        self._open(path, False, storage_options, mds=(column, operator.index(ndim)))
        return self

    @classmethod
    def open_binidx(cls, path: PathLike, *, unit: str = "sequence", storage_options: StorageOptions = None) -> Self:
        """Open a Megatron indexed dataset (``PREFIX``, ``PREFIX.idx`` or
        ``PREFIX.bin``, as ``IndexedDatasetBuilder`` writes them) as a
        rank-1 Ragged source: record ``i`` is sequence ``i``
        (``IndexedDataset[i]``), or with ``unit="document"`` document ``i``
        (its sequences end to end). Tokens are copied from the mapped
        ``.bin``; the index is read from its mapping and checked record by
        record (rule ``zrecord.Binidx``). ``Ragged.open(prefix)`` opens the
        sequences too.

        ``path`` may be an object-storage prefix (``s3://bucket/PREFIX``,
        ``gs://``, ``az://``; ``storage_options`` as for :func:`zt.open`):
        ``.idx`` is fetched once at open (past 1 GiB, or
        ``ZT_BINIDX_PAGED_ABOVE`` bytes, only its header: each gather
        fetches the 64 KiB pages of the index its records need, up to 64
        MiB of the most recently used kept), and each gather fetches its records' ``.bin``
        ranges (coalesced, within the process's request
        budget; the DataLoader starts its prefetch window's fetches
        ahead)."""
        if unit not in ("sequence", "document"):
            raise ValueError(f"unit must be 'sequence' or 'document', got {unit!r}")
        self = cls.__new__(cls)
        self._open(path, False, storage_options, documents=unit == "document")
        return self

    @classmethod
    def create(
        cls,
        path: PathLike,
        dtype: npt.DTypeLike,
        ndim: int,
        *,
        codec: str = "raw",
        dict_bytes: bytes | None = None,
        data_shards: int = 4,
        level: int | None = None,
        layout: str = DEFAULT_LAYOUT,
        storage_options: StorageOptions = None,
    ) -> Self:
        """Create a ragged store with an explicit dtype and record rank
        (``level``, ``layout`` and ``s3://`` paths as in
        :meth:`Dense.create`)."""
        self = cls.__new__(cls)
        self._create(path, dtype, None, ndim, codec, dict_bytes, data_shards, level, layout, storage_options)
        return self

    def append(self, records: Iterable[np.ndarray]) -> None:
        """Append an iterable of arrays as one batch (validated as a whole
        before anything is written)."""
        writer = self._require(True)
        arrays = records if type(records) is list else list(records)
        if not arrays:
            raise ValueError("append needs at least one record")
        # Validate with one set per property instead of a branchy loop per
        # record: the per-record Python cost is what bounds ragged writes.
        if {type(a) for a in arrays} != {np.ndarray}:
            raise TypeError("ragged records must be numpy arrays")
        dtypes = {a.dtype for a in arrays}
        if dtypes != {self.dtype}:
            other = next(d for d in dtypes if d != self.dtype)
            raise ValueError(f"ragged record dtype {other} != store dtype {self.dtype}")
        ndims = {a.ndim for a in arrays}
        if ndims != {self.ndim}:
            other = next(n for n in ndims if n != self.ndim)
            raise ValueError(f"ragged record ndim {other} != store ndim {self.ndim}")
        count = len(arrays)
        sizes = np.fromiter([a.nbytes for a in arrays], dtype=np.uint64, count=count)
        if not sizes.all():
            raise ValueError("empty records are not stored — a record must be non-empty")
        prefix = (4 if self.layout == "loaderx-2.8" else 8) * self.ndim  # the shape prefix
        if int(sizes.max()) > MAX_RECORD_LEN - prefix:
            raise ValueError(
                f"encoded record of {int(sizes.max()) + prefix} bytes exceeds the {MAX_RECORD_LEN} byte record limit"
            )
        if self.ndim == 1:
            shapes = sizes // np.uint64(self.dtype.itemsize)
        else:
            shapes = np.array([a.shape for a in arrays], dtype=np.uint64).reshape(count, self.ndim)
        if int(sizes.sum()) >= _UNPACKED_RECORD_BYTES * count:
            # Large records (images) are written from their own arrays:
            # packing them first cost a second copy and, for a fresh
            # batch-sized buffer, a page fault per 4 KiB (2x loaderx's time).
            arrays = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in arrays]
            writer.append_ragged_each(arrays, shapes)
            return
        # Small records (tokens): one packed buffer; per-record Python work
        # would cost more than the copy. `dtype=` keeps the store's byte
        # order: np.concatenate would otherwise convert '>i4' to native.
        if self.ndim == 1:
            values = np.concatenate(arrays, dtype=self.dtype) if count > 1 else np.ascontiguousarray(arrays[0])
        else:
            values = np.concatenate([a.reshape(-1) for a in arrays], dtype=self.dtype)
        writer.append_ragged(values, sizes, shapes)

    def gather_packed(self, idxs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One native pass: ``(values, offsets, shapes)`` where ``values`` is
        every record's elements end to end (1-D, store dtype), ``offsets`` the
        ``n + 1`` element offsets and ``shapes`` an ``(n, ndim)`` uint64 array."""
        reader = self._require(False)
        return self._packed(reader, self._idxs(idxs))

    def _packed(self, reader, idxs):
        values, offsets, shapes = reader.gather_ragged(idxs)
        values = np.asarray(values).view(self.dtype)
        offsets = np.asarray(offsets) // np.uint64(self.dtype.itemsize)
        return values, offsets, np.asarray(shapes)

    def _gather(self, reader, idxs):
        if idxs.size == 0:
            return []
        values, offsets, shapes = self._packed(reader, idxs)
        bounds = offsets.tolist()
        return [values[a:b].reshape(s) for a, b, s in zip(bounds[:-1], bounds[1:], map(tuple, shapes.tolist()))]


def concat(stores: Sequence[PathLike], manifest: PathLike, *, storage_options: StorageOptions = None) -> int:
    """Write a dataset manifest at ``manifest`` (a ``.json`` file, local or
    an object URL) listing ``stores`` in order, copying no record; returns
    the number of records in all. Each store is opened and checked; they
    must share a schema and codec. A store under the manifest's directory is
    named relative to it (the dataset moves as a whole). The manifest
    (``{"format": "zrecord-dataset", "version": 1, "stores": [{"path",
    "records", "digest"}, ...]}``) is written beside its destination and
    renamed into place; ``Dense.open(manifest)`` / ``Ragged.open(manifest)``
    read the stores as one, refusing a store changed since (rule
    ``zrecord.DatasetStore``)."""
    return _zt.zrecord_concat(
        [os.fspath(_location(s)) for s in stores], os.fspath(_location(manifest)), storage_options
    )


def __getattr__(name: str) -> Any:
    """``zt.zrecord.ray`` (a Ray Data datasink) and ``zt.zrecord.spark``
    (Spark partitions), imported on first use: each needs its engine."""
    if name in ("ray", "spark"):
        import importlib

        module = importlib.import_module(f"zt.zrecord_{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _pack_samples(source, budget):
    """Training samples (bytes end to end) and their sizes, within `budget`:
    the records loaderx picks (``zrecord::samples``, shared with the
    stores' own ``train_dict``)."""
    if isinstance(source, np.ndarray):
        if len(source) == 0:
            raise ValueError("cannot train a zstd dictionary on an empty array")
        if source.dtype.hasobject:
            raise ValueError("object arrays cannot train a zstd dictionary")
        item = math.prod(source.shape[1:]) * source.dtype.itemsize
        if item == 0:
            raise ValueError("zero-byte records cannot train a zstd dictionary")
        if item > budget:
            raise ValueError("one training record exceeds the sample budget")
        idx = np.asarray(_zt.zrecord_sample_indices(len(source), item, budget), dtype=np.int64)
        sample = np.ascontiguousarray(source[idx])
        return sample.reshape(-1).view(np.uint8), [item] * len(sample)
    chunks, sizes, total = [], [], 0
    for record in source:
        if isinstance(record, (bytes, bytearray)):
            b = bytes(record)
        else:
            array = np.asarray(record)
            # An object array's bytes are pointers: training on them would
            # make a dictionary of addresses.
            if array.dtype.hasobject:
                raise ValueError("object arrays cannot train a zstd dictionary")
            b = np.ascontiguousarray(array).tobytes()
        if not b:
            raise ValueError("zero-byte records cannot train a zstd dictionary")
        if len(b) > budget - total:
            if not chunks:
                raise ValueError("one training record exceeds the sample budget")
            break
        chunks.append(b)
        sizes.append(len(b))
        total += len(b)
        if total == budget:
            break
    if not chunks:
        raise ValueError("train_dict needs at least one record")
    return np.frombuffer(b"".join(chunks), dtype=np.uint8), sizes


def train_dict(source: Any, tier: str | None = None, *, path: PathLike | None = None) -> bytes:
    """Train a zstd dictionary for ``codec="zstd_dict"`` on ``source``: an
    ndarray of records, an opened Dense/Ragged store or an iterable of
    records. ``tier`` is one of :data:`DICT_TIERS` (default ``"fast"``: the
    32 KiB dictionary loaderx 2.3.8 and 2.8.19 train, byte for byte);
    ``path`` also writes the dictionary to a file."""
    tier = DEFAULT_TIER if tier is None else tier
    if tier not in DICT_TIERS:
        raise ValueError(f"unknown dictionary tier {tier!r}, expected one of {sorted(DICT_TIERS)}")
    spec = DICT_TIERS[tier]
    if isinstance(source, (Dense, Ragged)):
        try:
            reader = source._require(False)
        except RuntimeError:
            raise ValueError("train_dict requires an opened read-only container") from None
        d = reader.train_dict(tier)  # the selection and the training in zrecord
        if path is not None:
            Path(path).write_bytes(d)
        return d
    samples, sizes = _pack_samples(source, spec["sample_budget"])
    samples = np.ascontiguousarray(samples)
    d = _zt.train_dict(samples, sizes, spec["dict_bytes"])
    if path is not None:
        Path(path).write_bytes(d)
    return d
