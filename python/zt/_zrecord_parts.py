"""One store per task of a cluster build, and the manifest that joins them.

Shared by :mod:`zt.zrecord_ray` (Ray Data) and :mod:`zt.zrecord_spark`
(Spark): a task writes its rows to ``PATH/part-NNNNN`` (its task or
partition index), the driver lists the parts in index order with
:func:`zt.zrecord.concat`. A retried task's attempt replaces what an
earlier attempt left, so the manifest names exactly one store per task.
"""

from __future__ import annotations

import math
import operator
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .zrecord import DEFAULT_LAYOUT, Dense, Ragged, _location, concat

#: The manifest's name under the dataset's path.
MANIFEST = "dataset.json"


def part_name(index: int) -> str:
    """The store a task writes: ``part-00003`` for task 3."""
    return f"part-{index:05d}"


def is_url(path: str | os.PathLike[str]) -> bool:
    """An object URL (``s3://...``), as :mod:`zt.zrecord` tells them."""
    return isinstance(_location(path), str)


def resolve(path: str | os.PathLike[str]) -> str:
    """``path`` as the tasks must see it: an object URL as it is, a local
    path absolute (a task's working directory is not the driver's)."""
    return os.fspath(path) if is_url(path) else os.path.abspath(path)


def join(path: str | os.PathLike[str], name: str) -> str:
    """``name`` under ``path`` (a directory or an object URL prefix)."""
    text = os.fspath(path)
    if is_url(text):
        return text.rstrip("/") + "/" + name
    return os.path.join(text, name)


class Spec:
    """What every part store of a dataset is created with: Dense when
    ``item_shape`` is given, Ragged when ``ndim`` is."""

    def __init__(
        self,
        dtype: Any,
        item_shape: int | Sequence[int] | None,
        ndim: int | None,
        column: str | None,
        codec: str,
        dict_bytes: bytes | None,
        data_shards: int,
        level: int | None,
        layout: str,
        storage_options: Mapping[str, Any] | None,
    ) -> None:
        if (item_shape is None) == (ndim is None):
            raise ValueError("give item_shape (a Dense store) or ndim (a Ragged store), not both")
        self.dtype = np.dtype(dtype)
        if item_shape is not None:
            if isinstance(item_shape, (int, np.integer)):
                item_shape = (operator.index(item_shape),)
            self.item_shape: tuple[int, ...] | None = tuple(operator.index(d) for d in item_shape)
        else:
            self.item_shape = None
        self.ndim = ndim
        self.column = column
        self.codec = codec
        self.dict_bytes = None if dict_bytes is None else bytes(dict_bytes)
        self.data_shards = data_shards
        self.level = level
        self.layout = layout
        self.storage_options = None if storage_options is None else dict(storage_options)

    @property
    def dense(self) -> bool:
        return self.item_shape is not None

    def create(self, dest: str) -> Dense | Ragged:
        options = dict(
            codec=self.codec,
            dict_bytes=self.dict_bytes,
            data_shards=self.data_shards,
            level=self.level,
            layout=self.layout,
            storage_options=self.storage_options,
        )
        if self.item_shape is not None:
            return Dense.create(dest, self.dtype, self.item_shape, **options)
        assert self.ndim is not None
        return Ragged.create(dest, self.dtype, self.ndim, **options)

    def open(self, path: str) -> Dense | Ragged:
        cls = Dense if self.dense else Ragged
        return cls.open(path, storage_options=self.storage_options)

    # -- rows to records ----------------------------------------------------

    def cast(self, array: np.ndarray) -> np.ndarray:
        """``array`` in the store's dtype: a safe cast, or a narrowing one
        within the same kind whose values all fit (int64 tokens into an
        int32 store); anything else is refused rather than wrapped."""
        if array.dtype == self.dtype:
            return array
        if np.can_cast(array.dtype, self.dtype, "safe"):
            return array.astype(self.dtype)
        if np.can_cast(array.dtype, self.dtype, "same_kind"):
            cast = array.astype(self.dtype)
            if array.dtype.kind not in "iub" or np.array_equal(cast.astype(array.dtype), array):
                return cast
            raise ValueError(f"values of {array.dtype} do not fit the store's dtype {self.dtype}")
        raise TypeError(f"cannot store {array.dtype} values as {self.dtype}")

    def dense_batch(self, values: Any) -> np.ndarray:
        """Rows as one ``(n, *item_shape)`` array. A row may hold its
        elements flat (C order), as a Spark array column does."""
        assert self.item_shape is not None
        array = values if isinstance(values, np.ndarray) and values.dtype != object else None
        if array is None:
            rows = [np.asarray(v) for v in values]
            if not rows:
                return np.empty((0, *self.item_shape), self.dtype)
            array = np.stack(rows)
        if array.shape[1:] != self.item_shape:
            width = math.prod(self.item_shape)
            if math.prod(array.shape[1:]) != width:
                raise ValueError(f"rows of shape {array.shape[1:]} do not make records of shape {self.item_shape}")
            array = array.reshape(len(array), *self.item_shape)
        return np.ascontiguousarray(self.cast(array))

    def ragged_batch(self, values: Iterable[Any]) -> list[np.ndarray]:
        records = []
        for value in values:
            record = self.cast(np.asarray(value))
            if record.ndim != self.ndim:
                raise ValueError(f"a record of rank {record.ndim} in a Ragged store of ndim {self.ndim}")
            records.append(record)
        return records

    def batch(self, values: Any) -> np.ndarray | list[np.ndarray]:
        return self.dense_batch(values) if self.dense else self.ragged_batch(values)


def _clear_local(dest: str) -> None:
    """Remove a store an earlier attempt of this task published (or left
    half-deleted), so the retry's store replaces it. Anything that is not
    a store is left alone and refused by ``create``."""
    if not os.path.isdir(dest):
        return
    names = set(os.listdir(dest))
    if "meta.zr" in names and all(n == "meta.zr" or n == "dict.zr" or n.startswith("data_") for n in names):
        shutil.rmtree(dest)


def _remote_store(spec: Spec, dest: str) -> Dense | Ragged | None:
    try:
        return spec.open(dest)
    except FileNotFoundError:
        return None


def _equal(spec: Spec, store: Dense | Ragged, first: int, batch: Any) -> bool:
    count = len(batch)
    if first + count > len(store):
        return False
    got = store[first : first + count]
    if spec.dense:
        return bool(np.array_equal(got, batch))
    return all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(got, batch))


def _holds(spec: Spec, store: Dense | Ragged, batches: Iterable[Any]) -> int | None:
    """The record count if ``store`` holds exactly ``batches``' records
    with the spec's schema and codec, else None."""
    if store.dtype != spec.dtype or store.codec != spec.codec:
        return None
    if spec.dense and getattr(store, "item_shape", None) != spec.item_shape:
        return None
    count = 0
    for values in batches:
        batch = spec.batch(values)
        if not _equal(spec, store, count, batch):
            return None
        count += len(batch)
    return count if count == len(store) else None


def write_part(spec: Spec, dest: str, batches: Iterable[Any]) -> int:
    """Write one task's records (an iterable of batches, each converted by
    ``spec.batch``) as the store ``dest``; returns the record count.

    Idempotent across attempts of one task: locally a store an earlier
    attempt published is replaced (a half-built one is cleared by
    ``create``). An object store cannot be deleted through zt, so there a
    complete store already at ``dest`` is kept if it holds exactly these
    records (an earlier attempt died after publishing) and refused
    otherwise; an upload that never reached ``meta.zr`` is overwritten."""
    if is_url(dest):
        existing = _remote_store(spec, dest)
        if existing is not None:
            with existing:
                count = _holds(spec, existing, batches)
            if count is None:
                raise FileExistsError(f"{dest} already holds a store with other records; remove it first")
            return count
    else:
        _clear_local(dest)
    count = 0
    with spec.create(dest) as store:
        for values in batches:
            batch = spec.batch(values)
            if len(batch):
                store.append(batch)  # type: ignore[arg-type]
                count += len(batch)
    return count


def chunked(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def commit(spec: Spec, path: str, parts: Sequence[tuple[int, str]], manifest: str) -> tuple[str, int, list[str]]:
    """The driver's commit: the manifest ``path/manifest`` listing one
    store per task in task order (a task index seen twice names one store).
    A build with no task (no rows) gets one empty store, so the manifest
    still opens. Returns the manifest, the record count and the stores."""
    path = resolve(path)
    by_index = dict(parts)
    if not by_index:
        dest = join(path, part_name(0))
        write_part(spec, dest, [])
        by_index = {0: dest}
    stores = [by_index[i] for i in sorted(by_index)]
    target = join(path, manifest)
    records = concat(stores, target, storage_options=spec.storage_options)
    return target, records, stores


def spec_from(
    dtype: Any,
    item_shape: int | Sequence[int] | None,
    ndim: int | None,
    column: str | None,
    codec: str = "raw",
    dict_bytes: bytes | None = None,
    data_shards: int = 4,
    level: int | None = None,
    layout: str = DEFAULT_LAYOUT,
    storage_options: Mapping[str, Any] | None = None,
) -> Spec:
    return Spec(dtype, item_shape, ndim, column, codec, dict_bytes, data_shards, level, layout, storage_options)
