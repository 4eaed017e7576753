"""``zt.Writer``, ``zt.verify`` and friends: writing and checking ``.zt`` files."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np

from . import _zt
from ._write import prepare, shard_size, zt_dtype

PathLike = Union[str, "os.PathLike[str]"]

# Logical type -> the storage dtype it rides on, from Rust's dtype table.
_LOGICAL = {name: d["storage"] for name, d in _zt.DTYPES.items() if d["storage"] != name and d["zt"]}

_ENCODING = "zt.zstd-seekable/1"


def _level(encoding, compression) -> int | None:
    """A zstd level from an ``encoding`` id or a ``compression`` flag/level."""
    if encoding not in (None, _ENCODING):
        raise ValueError(f"unknown encoding {encoding!r}; zt writes {_ENCODING!r}")
    if compression is True or (encoding is not None and compression in (None, False)):
        return 3
    if compression in (None, False):
        return None
    return int(compression)


def _part(pname: str, spec: Any) -> tuple:
    """One part from a numpy array, or a dict ``{dtype, data, logical?, encoding?}``."""
    if isinstance(spec, Mapping):
        data = np.ascontiguousarray(np.frombuffer(memoryview(spec["data"]).cast("B"), dtype=np.uint8))
        dtype = spec.get("logical") or spec["dtype"]
        if spec.get("logical") and _LOGICAL.get(spec["logical"]) != spec["dtype"]:
            raise ValueError(
                f"part {pname!r}: logical type {spec['logical']} needs dtype {_LOGICAL.get(spec['logical'])}"
            )
        level = _level(spec.get("encoding"), spec.get("compression"))
    else:
        dtype, data = prepare(pname, np.asarray(spec))
        level = None
    return (pname, dtype, data, level)


class Sink:
    """Accepts the bytes of a streamed object, in part-name order. Close it
    (or use it as a context manager) before using the writer again."""

    def __init__(self, writer: Writer, sizes: Mapping[str, int] | None = None):
        self._writer = writer
        self._order = sorted(sizes or {})
        self._sizes = dict(sizes or {})
        # What `written` reports, as upstream ztensor counts it: the bytes
        # of the part being written, kept at a finished part's size until
        # the next write reaches the next part (so after the last byte it is
        # the last part's size, not 0).
        self._written = 0
        self._closed = False

    def write(self, chunk: Any) -> None:
        """Write the next bytes (any buffer: bytes, numpy array, memoryview)."""
        arr = np.ascontiguousarray(np.frombuffer(memoryview(chunk).cast("B"), dtype=np.uint8))
        native = self._writer._native
        before = native.stream_position()
        native.write_chunk(arr)
        after = native.stream_position()
        if not arr.nbytes:
            # Upstream starts counting the next part on any write, even an
            # empty one.
            if after is not None:
                self._written = after[1]
            return
        if after is not None and (after[1] > 0 or before is None or after[0] == before[0]):
            self._written = after[1]
        else:
            # This write finished a part and no byte has reached the next
            # one yet: report the part just finished.
            done = self._order.index(after[0]) - 1 if after is not None else len(self._order) - 1
            self._written = self._sizes.get(self._order[done], 0) if 0 <= done < len(self._order) else 0

    @property
    def part(self) -> str | None:
        """The part the next bytes go to (``None`` once every byte arrived)."""
        pos = None if self._closed else self._writer._native.stream_position()
        return pos[0] if pos else None

    @property
    def written(self) -> int:
        """Bytes written into the current part (after the last byte, the
        last part's size, as upstream ztensor reports it); 0 once closed."""
        return 0 if self._closed else self._written

    def close(self) -> None:
        """Finish the object; every declared byte must have arrived."""
        self._writer._native.close_stream()
        self._closed = True

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()


class Writer:
    """Writes a ``.zt`` (zTensor v2) file.

    ``canonical=True`` (the default) gives the byte-reproducible canonical
    form: names added in ascending order, raw parts, 64 KiB placement,
    identical parts shared. ``canonical=False`` places blobs by ``align``:
    ``"auto"`` (the default: large tensors at 64 KiB, small ones at 4 KiB) or
    a power of two >= 4096, and allows compression. A new file is always
    built beside ``path`` and renamed into place on :meth:`finish`, so the
    old file at ``path`` stays whole until then; ``publish=True`` (or
    ``durable=True``, the name ``save_file`` and ``convert`` use for it)
    also fsyncs the file before the rename and its directory after (durable
    across a power loss); ``publish=False``/``durable=False``, the default
    here, is the atomic rename with no fsync. ``append=True`` amends an
    existing file in place.
    An exception in a ``with`` block, :meth:`abandon`, or a writer dropped
    unfinished leaves nothing behind (an amended file is cut back). An
    ``s3://`` destination is built in a local spool and uploaded by
    :meth:`finish` (``storage_options`` as for :func:`zt.open`).

    ``max_shard_size`` (bytes, or ``"5GB"``, ``"4GiB"``, read as Hugging
    Face reads them) writes a sharded checkpoint instead, object by
    object: a new shard starts when the next object would take the current
    one past the size (an object larger than the size gets a shard of its
    own), exactly as ``save_file(..., max_shard_size=...)`` splits, names
    and roots the same objects given in the same order (``STEM-00001.zt``,
    ... beside a root at ``path``; one shard is a plain file at ``path``).
    Nothing appears at ``path`` before :meth:`finish`, when the complete
    set is published (shards first, the root last); attributes apply to
    every shard and the root. Local paths only, and not with ``append``.
    """

    def __init__(
        self,
        path: PathLike,
        canonical: bool = True,
        align: int | str | None = None,
        publish: bool = False,
        append: bool = False,
        compression: int | bool | None = None,
        storage_options: dict[str, Any] | None = None,
        max_shard_size: int | str | None = None,
        *,
        durable: bool | None = None,
    ) -> None:
        if durable is not None:
            # One switch under two names: refuse a call that sets them apart
            # rather than pick one silently.
            if publish and not durable:
                raise ValueError("publish=True and durable=False contradict each other: pass one of them")
            publish = bool(durable)
        level = _level(None, compression)
        max_bytes = None if max_shard_size is None else shard_size(max_shard_size)
        self._native = _zt.Writer(os.fspath(path), canonical, align, publish, append, level, storage_options, max_bytes)

    def add(
        self,
        name: str,
        data: Any,
        shape: Sequence[int] | None = None,
        dtype: str | None = None,
        logical: str | None = None,
        encoding: str | None = None,
        compression: int | bool | None = None,
    ) -> None:
        """Add a dense tensor: a numpy array, or raw bytes with ``shape`` and
        ``dtype`` (a storage dtype, with ``logical`` for bool/fp8/fp4/complex)."""
        if dtype is None:
            arr = np.asarray(data)
            shape = list(arr.shape)
            dt, buf = prepare(name, arr)
            part = ("data", dt, buf, _level(encoding, compression))
        else:
            spec = {"dtype": dtype, "data": data, "logical": logical, "encoding": encoding, "compression": compression}
            part = _part("data", spec)
        self._native.add_object(name, [int(d) for d in shape], [part], "dense", None)

    def add_object(
        self,
        name: str,
        shape: Sequence[int],
        parts: Mapping[str, Any],
        layout: str = "dense",
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """Add an object with any parts: each a numpy array or a dict
        ``{dtype, data, logical?, encoding?}``."""
        described = [_part(p, spec) for p, spec in parts.items()]
        self._native.add_object(name, [int(d) for d in shape], described, layout, attributes)

    def stream(
        self,
        name: str,
        shape: Sequence[int],
        parts: Mapping[str, Mapping[str, Any]],
        layout: str = "dense",
        attributes: Mapping[str, Any] | None = None,
    ) -> Sink:
        """Declare an object whose bytes are written afterwards through the
        returned :class:`Sink`; ``parts`` maps names to ``{dtype, nbytes,
        logical?}``. Identical parts are still shared."""
        described = [(p, spec.get("logical") or spec["dtype"], int(spec["nbytes"])) for p, spec in parts.items()]
        self._native.stream(name, [int(d) for d in shape], described, layout, attributes)
        return Sink(self, {p: int(spec["nbytes"]) for p, spec in parts.items()})

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        """Set the file attributes (str keys; int, float, str, bytes, bool,
        None, lists and dicts as values)."""
        self._native.set_attributes(dict(attributes))

    def ingest(self, source: Any) -> None:
        """Add every tensor of a :class:`zt.Source` (any format)."""
        self._native.ingest(source._native)

    def finish(self) -> int:
        """Write the manifest and footer (and publish). Returns the file size."""
        return self._native.finish()

    def abandon(self) -> None:
        """Discard the file."""
        self._native.abandon()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is not None:
            self.abandon()
        elif not self._native.closed:
            self.finish()


def verify(path: PathLike, deep: bool = False) -> tuple[int, int]:
    """Check a file: every structural rule and every part digest (and, with
    ``deep``, every shard's whole-file digest). Returns ``(checked,
    undigested)``; raises :class:`zt.FormatError` on any mismatch."""
    return _zt.verify(os.fspath(path), deep)


def content_id(path: PathLike) -> str:
    """The content digest of a ``.zt`` file (independent of placement,
    sharding and encoding)."""
    return _zt.content_id(os.fspath(path))


def canonical_violations(path: PathLike) -> list[tuple[int, str]]:
    """The canonical-form rules (§6.3) a ``.zt`` file breaks; empty when canonical."""
    return _zt.canonical_violations(os.fspath(path))


__all__ = ["Sink", "Writer", "canonical_violations", "content_id", "verify", "zt_dtype"]
