"""zrecord stores built by Spark: ``zt.zrecord.spark``.

>>> import numpy as np
>>> import zt.zrecord
>>> manifest = zt.zrecord.spark.write_partitions(df, "out", np.int32, (4,), column="x")  # doctest: +SKIP
>>> zt.zrecord.Dense.open(manifest)                                                        # doctest: +SKIP

Each partition is written as one store, ``PATH/part-NNNNN`` named by its
partition index, by :func:`partition_writer`'s function (usable in
``rdd.mapPartitionsWithIndex``); the driver then writes the manifest
``PATH/dataset.json`` (:func:`zt.zrecord.concat`) listing the stores in
partition order. :func:`write_partitions` does both. A retried (or
speculative) task attempt replaces what another attempt of it left, so
the manifest names one store per partition. The dataset's records are the
rows in partition order, record for record what one process building the
same rows gives.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from . import _zrecord_parts as parts
from .zrecord import DEFAULT_LAYOUT

__all__ = ["commit", "partition_writer", "write_partitions"]

#: Rows converted and appended at a time by a partition's writer.
BATCH_ROWS = 4096


def _value(row: Any, column: str | None) -> Any:
    """A row's record: a DataFrame ``Row`` (or a dict or tuple) gives its
    ``column`` (or its only field); anything else (an ndarray, a list) is
    the record itself."""
    if isinstance(row, Mapping):
        if column is None:
            if len(row) != 1:
                raise ValueError(f"rows have fields {list(row)}: name the records' one with column=")
            return next(iter(row.values()))
        return row[column]
    if isinstance(row, tuple):  # a Row
        if column is not None:
            return row[column]
        if len(row) != 1:
            raise ValueError("rows have several fields: name the records' one with column=")
        return row[0]
    return row


def partition_writer(
    path: str | os.PathLike[str],
    dtype: Any,
    item_shape: int | Sequence[int] | None = None,
    *,
    ndim: int | None = None,
    column: str | None = None,
    codec: str = "raw",
    dict_bytes: bytes | None = None,
    data_shards: int = 4,
    level: int | None = None,
    layout: str = DEFAULT_LAYOUT,
    storage_options: Mapping[str, Any] | None = None,
) -> Callable[[int, Iterable[Any]], Iterator[tuple[str, int]]]:
    """A function for ``rdd.mapPartitionsWithIndex``: it writes partition
    ``i``'s rows as the store ``path/part-<i>`` and yields one
    ``(store path, record count)``. ``item_shape`` (Dense) or ``ndim``
    (Ragged), ``column`` and the store options are as for
    :class:`zt.zrecord.ray.Datasink`; a row's value may be an ndarray or
    (nested) lists, and a Dense row may hold its elements flat (C order,
    as an ``ArrayType`` column does). Commit with :func:`commit`."""
    spec = parts.spec_from(
        dtype, item_shape, ndim, column, codec, dict_bytes, data_shards, level, layout, storage_options
    )
    return _writer(spec, parts.resolve(path))


def _writer(spec: parts.Spec, root: str) -> Callable[[int, Iterable[Any]], Iterator[tuple[str, int]]]:
    def write(index: int, rows: Iterable[Any]) -> Iterator[tuple[str, int]]:
        dest = parts.join(root, parts.part_name(index))
        values = (_value(row, spec.column) for row in rows)
        count = parts.write_part(spec, dest, parts.chunked(values, BATCH_ROWS))
        yield dest, count

    return write


def commit(
    written: Iterable[tuple[str, int]],
    path: str | os.PathLike[str],
    *,
    manifest: str = parts.MANIFEST,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """On the driver: write ``path/manifest`` listing the stores that
    :func:`partition_writer`'s tasks returned, in the order given
    (``rdd.mapPartitionsWithIndex(...).collect()`` gives partition order).
    Returns the manifest's path."""
    from .zrecord import concat

    stores = [store for store, _ in written]
    if len(set(stores)) != len(stores):
        raise ValueError("a partition's store is listed twice")
    target = parts.join(parts.resolve(path), manifest)
    concat(stores, target, storage_options=storage_options)
    return target


def write_partitions(
    data: Any,
    path: str | os.PathLike[str],
    dtype: Any,
    item_shape: int | Sequence[int] | None = None,
    *,
    ndim: int | None = None,
    column: str | None = None,
    codec: str = "raw",
    dict_bytes: bytes | None = None,
    data_shards: int = 4,
    level: int | None = None,
    layout: str = DEFAULT_LAYOUT,
    storage_options: Mapping[str, Any] | None = None,
    manifest: str = parts.MANIFEST,
) -> str:
    """Write a Spark DataFrame or RDD as one zrecord store per partition
    and the manifest over them (:func:`partition_writer`, then
    :func:`commit`); returns the manifest's path. A DataFrame's records are
    its ``column`` (default: its only column) in row order."""
    rdd = data
    if hasattr(data, "rdd") and hasattr(data, "columns"):  # a DataFrame
        if column is not None:
            data = data.select(column)
            column = None
        rdd = data.rdd
    spec = parts.spec_from(
        dtype, item_shape, ndim, column, codec, dict_bytes, data_shards, level, layout, storage_options
    )
    root = parts.resolve(path)
    written = rdd.mapPartitionsWithIndex(_writer(spec, root)).collect()
    target, _, _ = parts.commit(spec, root, [(i, store) for i, (store, _) in enumerate(written)], manifest)
    return target
