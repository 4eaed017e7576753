"""zrecord stores built by Ray Data: ``zt.zrecord.ray.Datasink``.

>>> import numpy as np, ray
>>> import zt.zrecord
>>> ds = ray.data.from_items([{"x": np.full(4, i, np.int32)} for i in range(100)])  # doctest: +SKIP
>>> sink = zt.zrecord.ray.Datasink("out", np.int32, (4,), column="x")            # doctest: +SKIP
>>> ds.write_datasink(sink)                                                       # doctest: +SKIP
>>> zt.zrecord.Dense.open(sink.manifest)                                          # doctest: +SKIP

Each write task writes its rows as one store, ``PATH/part-NNNNN`` named by
its task index; when every task has finished, the driver writes the
manifest ``PATH/dataset.json`` (:func:`zt.zrecord.concat`) listing the
stores in task order, once. A retried task replaces what its failed
attempt left, so the manifest names one store per task. The dataset's
records are its rows in task order: with Ray's
``DataContext.get_current().execution_options.preserve_order = True`` that
is the dataset's row order, record for record what one process building
the same rows gives.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ray.data import Datasink as _RayDatasink
from ray.data.block import Block, BlockAccessor

from . import _zrecord_parts as parts
from .zrecord import DEFAULT_LAYOUT

__all__ = ["Datasink"]


class Datasink(_RayDatasink):  # type: ignore[misc]
    """Write a Ray dataset as zrecord stores, one per write task, and a
    manifest over them (``dataset.write_datasink(Datasink(...))``).

    ``path`` is a directory or an ``s3://`` prefix. Give ``item_shape`` for
    a Dense store (each row's value has that shape, or that many elements
    in C order) or ``ndim`` for a Ragged one (each row's value is an array
    of that rank). ``column`` names the column holding the records (default:
    the dataset's only column). Values are cast to ``dtype`` when no value
    changes. ``codec``, ``dict_bytes``, ``data_shards``, ``level``,
    ``layout`` and ``storage_options`` are as for
    :meth:`zt.zrecord.Dense.create`. ``rows_per_store`` asks Ray to give
    each write task at least that many rows (fewer, larger stores).

    After ``write_datasink`` returns, ``manifest`` is the manifest's path,
    ``records`` the record count and ``stores`` the stores in order."""

    def __init__(
        self,
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
        rows_per_store: int | None = None,
    ) -> None:
        self.path = parts.resolve(path)
        self._spec = parts.spec_from(
            dtype, item_shape, ndim, column, codec, dict_bytes, data_shards, level, layout, storage_options
        )
        self._manifest_name = manifest
        self._rows_per_store = rows_per_store
        self.manifest: str | None = None
        self.records: int | None = None
        self.stores: list[str] = []

    @property
    def min_rows_per_write(self) -> int | None:
        return self._rows_per_store

    def _values(self, block: Block) -> Any:
        accessor = BlockAccessor.for_block(block)
        column = self._spec.column
        if column is None:
            names = accessor.column_names()
            if len(names) != 1:
                raise ValueError(f"the dataset has columns {names}: name the records' one with column=")
            column = names[0]
        return accessor.to_numpy(column)

    def _batches(self, blocks: Iterable[Block]) -> Iterable[Any]:
        for block in blocks:
            if BlockAccessor.for_block(block).num_rows():
                yield self._values(block)

    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any]:
        """One write task: its rows as the store ``part-<task index>``."""
        dest = parts.join(self.path, parts.part_name(ctx.task_idx))
        count = parts.write_part(self._spec, dest, self._batches(blocks))
        return {"task": ctx.task_idx, "path": dest, "records": count}

    def on_write_complete(self, write_result: Any) -> None:
        """On the driver, once: the manifest over the tasks' stores."""
        done = [(r["task"], r["path"]) for r in write_result.write_returns if r is not None]
        self.manifest, self.records, self.stores = parts.commit(self._spec, self.path, done, self._manifest_name)
