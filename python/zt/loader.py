"""Step-based batch sampling for training loops (``zt.loader``).

A :class:`Sampler` says which record indices step ``s`` of a run reads. Each
batch is a pure function of ``(length, batch_size, mode, seed, s)``, so
``seek(s)`` is O(1) in every mode and a resumed run reads exactly the batches
it would have read.

>>> from zt.loader import CYCLIC, Sampler
>>> s = Sampler(10, 4, CYCLIC, seed=123)
>>> s.next().tolist()
[1, 4, 3, 2]
>>> s.seek(0); s.next().tolist()
[1, 4, 3, 2]

Modes (loaderx's names and values):

* ``SEQUENTIAL`` (0): a window sliding over the ring of indices: step ``s``
  reads ``(s * batch_size + i) % length``.
* ``IID`` (1): uniform with replacement (counter-based, unbiased).
* ``CYCLIC`` (2): without replacement; each cycle is a fresh permutation of
  ``[0, length)`` walked one batch per step, dropping the ``length %
  batch_size`` positions that do not fill a batch (a different set each
  cycle). With fewer records than one batch, each step returns all
  ``length`` records.
* ``LOADERX_IID`` (3, a zt extension): uniform with replacement, loaderx
  2.8's own IID stream, so a run moved from loaderx 2.8 (where it is
  ``Sampler.Mode.IID``) resumes on the same indices.

SEQUENTIAL and CYCLIC produce exactly loaderx 2.8.19's index streams for the
same ``(length, batch_size, seed)`` at every step below ``2**64``, and
loaderx 2.3.8's except where 2.3.8's 64-bit arithmetic wraps (SEQUENTIAL with
``step * batch_size >= 2**64`` or ``length + batch_size > 2**64``), where zt
and 2.8 compute the exact value. After step ``2**64 - 1`` zt's step counter
wraps to 0 (loaderx 2.8 raises ``OverflowError``). zt's IID is its own
counter-based stream (loaderx 2.3.8's is a stateful generator, 2.8's is
``LOADERX_IID``).

Sharding: with ``rank``/``world_size`` (default: the ``RANK`` and
``WORLD_SIZE`` environment variables torchrun sets, else 0 and 1), every
rank computes the same global batch and keeps its own contiguous slice
``[rank * n, (rank + 1) * n)``, ``n = batch_size // world_size``; the slices
are disjoint and together are the global batch. A global batch that does not
split evenly is refused with ``ValueError``.
"""

from __future__ import annotations

import enum
import operator
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _zt

_frombuffer = np.frombuffer

__all__ = ["CYCLIC", "IID", "LOADERX_IID", "SEQUENTIAL", "DataLoader", "Mode", "Sampler"]

_U64_MAX = (1 << 64) - 1


class Mode(enum.IntEnum):
    """Sampling modes, numbered as loaderx numbers them (LOADERX_IID, loaderx
    2.8's IID stream, is zt's)."""

    SEQUENTIAL = 0
    IID = 1
    CYCLIC = 2
    LOADERX_IID = 3


SEQUENTIAL = Mode.SEQUENTIAL
IID = Mode.IID
CYCLIC = Mode.CYCLIC
LOADERX_IID = Mode.LOADERX_IID


def _u64(name: str, value: Any, low: int) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not low <= value <= _U64_MAX:
        raise ValueError(f"{name} must be in {low}..2^64-1, got {value}")
    return value


def _from_env(name: str, value: Any, variable: str, default: int) -> int:
    """An explicit argument, else the launcher's environment variable, else the default."""
    if value is not None:
        return _u64(name, value, 0)
    text = os.environ.get(variable)
    if text is None or text.strip() == "":
        return default
    try:
        parsed = int(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} in the environment is not an integer") from None
    if not 0 <= parsed <= _U64_MAX:
        raise ValueError(f"{variable}={text!r} in the environment is out of range")
    return parsed


class Sampler:
    """Endless stream of index batches over ``[0, length)``.

    ``next()`` returns this rank's indices for the current step and advances
    it. Indices are ``int64`` (``uint64`` only when ``length > 2**63``, where
    they may not fit an int64; :attr:`dtype` says which).

    Thread-safe: concurrent ``next()`` calls each draw a distinct step.
    """

    Mode = Mode  # loaderx spells the modes Sampler.Mode.SEQUENTIAL, ...

    def __init__(
        self,
        length: int,
        batch_size: int,
        mode: int,
        seed: int = 42,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        length = _u64("length", length, 1)
        batch_size = _u64("batch_size", batch_size, 1)
        try:
            mode = Mode(operator.index(mode))
        except (TypeError, ValueError):
            raise ValueError(
                f"mode must be SEQUENTIAL (0), IID (1), CYCLIC (2) or LOADERX_IID (3), got {mode!r}"
            ) from None
        seed = _u64("seed", seed, 0)
        rank = _from_env("rank", rank, "RANK", 0)
        world_size = _from_env("world_size", world_size, "WORLD_SIZE", 1)
        if world_size < 1:
            raise ValueError("world_size must be at least 1, got 0")
        self._native = _zt.Sampler(length, batch_size, int(mode), seed, rank, world_size)
        self._config = {"length": length, "batch_size": batch_size, "mode": int(mode), "seed": seed}
        self._rank = rank
        self._world_size = world_size
        self._len: int = self._native.batch_len
        self._dtype = np.dtype(np.int64) if length <= 1 << 63 else np.dtype(np.uint64)
        self._shape = (self._len,)
        # The last `out` array checked and its data address, as one tuple so
        # that threads passing different arrays never pair one array with
        # another's address (see `next`).
        self._borrowed: tuple[np.ndarray | None, int] = (None, 0)

    # -- drawing --------------------------------------------------------------

    def next(self, out: np.ndarray | None = None) -> np.ndarray:
        """This rank's indices for the current step; advances the step.

        By default a fresh array the caller owns. With ``out`` (a writable,
        C-contiguous 1-D array of :attr:`dtype` and length :attr:`batch_len`),
        the indices are written into ``out`` and ``out`` itself is returned:
        a borrow that the next ``next(out=out)`` overwrites, so copy it to keep
        a batch. ``out`` is validated the first time it is passed; the sampler
        then keeps a reference to it (so numpy refuses to resize it and its
        memory stays put) and writes into that memory on each call until
        another ``out`` replaces it.
        """
        native = self._native
        if native is None:
            raise RuntimeError("Sampler is closed")
        if out is None:
            return _frombuffer(native.next_bytes(), self._dtype)
        held, address = self._borrowed
        if out is not held:
            address = self._adopt(out)
        native.next_into(address, self._len)
        return out

    def batch(self, step: int, out: np.ndarray | None = None) -> np.ndarray:
        """This rank's indices for any ``step``, leaving the current step alone
        (a pure function of ``(seed, step)``). ``out`` as in :meth:`next`."""
        step = _u64("step", step, 0)
        native = self._native_or_raise()
        if out is None:
            return _frombuffer(native.batch_bytes(step), self._dtype)
        held, address = self._borrowed
        if out is not held:
            address = self._adopt(out)
        native.batch_into(step, address, self._len)
        return out

    def _adopt(self, out: np.ndarray) -> int:
        """Validate a new ``out``, cache it with its data address, and return
        the address.

        Checking once is enough for memory safety: nothing done to an array
        in place (changing its shape, dtype, strides or flags) changes which
        bytes it owns, and the reference kept here makes numpy refuse to
        resize it."""
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
        if out.dtype != self._dtype:
            raise ValueError(f"out must have dtype {self._dtype}, got {out.dtype}")
        if out.shape != self._shape:
            raise ValueError(f"out must have shape {self._shape}, got {out.shape}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be C-contiguous and writeable")
        address = out.ctypes.data
        self._borrowed = (out, address)
        return address

    # -- position ---------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step the next :meth:`next` draws."""
        return self._native_or_raise().step

    def seek(self, step: int) -> None:
        """Make ``step`` the next step drawn. O(1): nothing is replayed."""
        self._native_or_raise().seek(_u64("step", step, 0))

    def state_dict(self) -> dict[str, int]:
        """The step plus the settings that decide the stream. Restore with
        :meth:`load_state_dict` on a sampler built with the same settings
        (the rank and world size may differ: the global stream is the same)."""
        return {**self._config, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from :meth:`state_dict`; refuses a state recorded with
        different settings, which would silently give a different stream."""
        missing = [k for k in (*self._config, "step") if k not in state]
        if missing:
            raise KeyError(f"sampler state lacks {missing}")
        differ = {k: (state[k], v) for k, v in self._config.items() if state[k] != v}
        if differ:
            detail = ", ".join(f"{k}: saved {saved}, here {here}" for k, (saved, here) in differ.items())
            raise ValueError(f"sampler state was saved with different settings ({detail})")
        self.seek(state["step"])

    # -- description --------------------------------------------------------------

    @property
    def length(self) -> int:
        return self._config["length"]

    @property
    def batch_size(self) -> int:
        """The global batch size the sampler was made with."""
        return self._config["batch_size"]

    @property
    def mode(self) -> Mode:
        return Mode(self._config["mode"])

    @property
    def seed(self) -> int:
        return self._config["seed"]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def batch_len(self) -> int:
        """Indices this rank receives per step: ``global_batch_len // world_size``."""
        return self._len

    @property
    def global_batch_len(self) -> int:
        """Indices per step over all ranks: ``batch_size``, or ``length`` for
        CYCLIC over fewer records than one batch."""
        return self._native_or_raise().global_batch_len

    @property
    def steps_per_cycle(self) -> int | None:
        """CYCLIC: steps per permutation (``max(length // batch_size, 1)``);
        ``None`` in the other modes."""
        return self._native_or_raise().steps_per_cycle

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the index arrays (int64, or uint64 when ``length > 2**63``)."""
        return self._dtype

    # -- protocol -------------------------------------------------------------------

    def __iter__(self) -> Iterator[np.ndarray]:
        return self

    def __next__(self) -> np.ndarray:
        return self.next()

    def close(self) -> None:
        """Release the native sampler; later draws raise ``RuntimeError``."""
        self._native = None
        self._borrowed = (None, 0)

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _native_or_raise(self):
        if self._native is None:
            raise RuntimeError("Sampler is closed")
        return self._native

    def __repr__(self) -> str:
        c = self._config
        shard = f", rank={self._rank}, world_size={self._world_size}" if self._world_size > 1 else ""
        state = "closed" if self._native is None else f"step={self._native.step}"
        return (
            f"<zt.loader.Sampler length={c['length']} batch_size={c['batch_size']} "
            f"mode={Mode(c['mode']).name} seed={c['seed']}{shard} {state}>"
        )


# -- DataLoader ------------------------------------------------------------------


def _positive(name: str, value: Any) -> int:
    """loaderx's check for worker and prefetch counts (bool refused)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer") from None
    if value < 1:
        raise ValueError(f"{name} must be positive")
    return value


def _column_builder(stream: Any, packed: bool):
    """The function turning one native column into the value a batch holds."""
    from .zrecord import Dense

    if isinstance(stream, Dense):
        return np.asarray
    dtype = stream.dtype
    itemsize = np.uint64(dtype.itemsize)

    def ragged(parts):
        values, offsets, shapes = (np.asarray(p) for p in parts)
        values = values.view(dtype)
        offsets = offsets // itemsize
        if packed:
            return values, offsets, shapes
        bounds = offsets.tolist()
        return [values[a:b].reshape(s) for a, b, s in zip(bounds[:-1], bounds[1:], map(tuple, shapes.tolist()))]

    return ragged


def _assembler(names: list[str], builders: list):
    """The function turning a native column list into the batch dict."""
    pairs = list(zip(names, builders))

    def assemble(columns):
        return {name: build(column) for (name, build), column in zip(pairs, columns)}

    return assemble


def _transformer(assemble, transform):
    """What a worker thread calls: assemble the batch, run the transform, and
    note the step on an exception (its traceback is kept)."""

    def finish(step, columns):
        try:
            return transform(assemble(columns))
        except BaseException as exc:
            exc.add_note(f"raised by the zt.loader.DataLoader transform at step {step}")
            raise

    return finish


class DataLoader:
    """Endless, step-ordered batches gathered from zrecord streams.

    ``streams`` maps names to opened :class:`zt.zrecord.Dense` /
    :class:`zt.zrecord.Ragged` readers of equal length. Step ``s``'s batch is
    ``{name: values}`` gathered at :class:`Sampler`'s indices for step ``s``
    (the same indices for every stream): a ``(n, *item_shape)`` array for a
    Dense stream, a list of arrays for a Ragged one (or, with
    ``packed=True``, the ``(values, offsets, shapes)`` of
    :meth:`zt.zrecord.Ragged.gather_packed`). Every array is owned by the
    batch: keeping one keeps its memory, and nothing reuses it until it is
    dropped.

    ``workers`` native threads claim steps, gather without the GIL and hand
    batches over in step order, so the sequence is the same for any number of
    workers; at most ``prefetch`` batches are built or waiting ahead of the
    consumer. ``transform(batch)`` (optional) runs on the worker threads, and
    may run concurrently; its result is what ``next()`` returns, and an
    exception it raises is raised by ``next()`` at that step, with its
    traceback. A stream that fails (a corrupt record) raises
    ``zt.zrecord.ZrecordError`` at the step that hit it, naming the stream,
    the store and the record; the loader then goes on with the next step.

    Resume: :meth:`state_dict` / :meth:`load_state_dict` and :meth:`seek`
    (or ``start_step``) give exactly the batches the original run gave from
    that step on. ``rank`` / ``world_size`` shard each global batch as
    :class:`Sampler` does. :meth:`close` stops the workers; it is safe from
    the consumer, another thread or a transform.
    """

    def __init__(
        self,
        streams: dict[str, Any],
        batch_size: int = 256,
        mode: int = CYCLIC,
        seed: int = 42,
        workers: int = 4,
        prefetch: int = 4,
        transform: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        start_step: int = 0,
        *,
        packed: bool = False,
    ):
        from .zrecord import Dense, Ragged

        self._core = None
        self.streams = dict(streams)
        if not self.streams:
            raise ValueError("need at least one stream")
        invalid = [
            name
            for name, ds in self.streams.items()
            if not isinstance(ds, (Dense, Ragged)) or getattr(ds, "_reader", None) is None or ds.closed
        ]
        if invalid:
            raise ValueError(f"DataLoader streams must be opened for reading: {invalid}")
        lengths = {name: len(ds) for name, ds in self.streams.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"all streams must hold the same number of records, got {lengths}")
        length = next(iter(lengths.values()))
        self._workers = _positive("workers", workers)
        self._prefetch = _positive("prefetch", prefetch)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        # The Sampler validates the index settings with its messages and gives
        # the state dict; the workers compute the same batches natively.
        self.sampler = Sampler(length, batch_size, mode, seed, rank, world_size)
        self._transform = transform
        names = list(self.streams)
        self._assemble = _assembler(names, [_column_builder(self.streams[n], packed) for n in names])
        self._paths = [os.fspath(self.streams[n].path) for n in names]
        self._names = names
        self._lock = threading.Lock()
        self._closed = False
        self._core = self._start(_u64("start_step", start_step, 0))

    def _start(self, step: int):
        s = self.sampler
        finish = None if self._transform is None else _transformer(self._assemble, self._transform)
        return _zt.DataLoaderCore(
            self._paths,
            self._names,
            s.batch_size,
            int(s.mode),
            s.seed,
            s.rank,
            s.world_size,
            self._workers,
            self._prefetch,
            step,
            finish,
        )

    # -- iteration ------------------------------------------------------------------

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self):
        core = self._core
        if core is None or self._closed:
            raise StopIteration
        item = core.next()
        if item is None:
            raise StopIteration
        _step, transformed, value = item
        return value if transformed else self._assemble(value)

    def next(self):
        """The next step's batch (``StopIteration`` once closed)."""
        return self.__next__()

    def __len__(self):
        raise TypeError("Eternal loader has no length.")

    # -- position ---------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step the next ``next()`` returns."""
        core = self._core
        if core is None:
            raise RuntimeError("DataLoader is closed")
        return core.position

    def seek(self, step: int) -> None:
        """Make ``step`` the next step returned: the workers restart there and
        batches already prefetched are dropped."""
        step = _u64("step", step, 0)
        with self._lock:
            if self._closed:
                raise RuntimeError("DataLoader is closed")
            old, self._core = self._core, None
            old.close()
            self._core = self._start(step)

    def state_dict(self) -> dict[str, int]:
        """The sampler settings and the next step (JSON-friendly)."""
        return {**self.sampler.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from :meth:`state_dict` (refused if the sampler settings differ)."""
        check = Sampler(self.sampler.length, self.sampler.batch_size, self.sampler.mode, self.sampler.seed, 0, 1)
        check.load_state_dict(state)  # raises on missing keys or different settings
        self.seek(state["step"])

    # -- diagnostics -----------------------------------------------------------------

    @property
    def live_batches(self) -> int:
        """Batches whose buffers are alive now (in flight, waiting or held by you)."""
        core = self._core
        return 0 if core is None else core.live_batches

    @property
    def peak_batches(self) -> int:
        """The most batches alive at once since the last start or seek."""
        core = self._core
        return 0 if core is None else core.peak_batches

    @property
    def workers(self) -> int:
        return self._workers

    @property
    def prefetch(self) -> int:
        return self._prefetch

    # -- lifecycle ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop the workers and wait for them (a transform calling this skips
        its own thread). Streams belong to the caller and stay open."""
        self._closed = True
        core = self._core
        if core is not None:
            core.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        core = getattr(self, "_core", None)
        if core is not None:
            core.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step={self.step}"
        return (
            f"<zt.loader.DataLoader streams={self._names} batch_size={self.sampler.batch_size} "
            f"mode={self.sampler.mode.name} workers={self._workers} prefetch={self._prefetch} {state}>"
        )
