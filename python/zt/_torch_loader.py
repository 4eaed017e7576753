"""The torch front of zt.loader: ``zt.torch.DataLoader``, ``zt.torch.IterableDataset``,
``zt.torch.as_tensors`` and ``zt.torch.RankFailure`` (imported from ``zt.torch``
on first use, so ``import zt.torch`` does not import torch).

* :class:`DataLoader` runs :class:`zt.loader.DataLoader` in this process and
  hands each batch over as torch tensors that share the loader's buffers
  (DLPack, no copy). Waiting for a batch releases the GIL; there is no Python
  generator between batches, only a method call.
* :class:`IterableDataset` is for code that already wraps its data in
  ``torch.utils.data.DataLoader``. With ``num_workers=n`` torch worker ``i``
  takes steps ``start + i, start + i + n, ...`` and torch's in-order
  round-robin over its workers then yields every step once, in step order.
  Tensors cross from torch's worker processes through shared memory (torch
  copies them there), so this path cannot be zero-copy; :class:`DataLoader`
  is.
* ``health_check=seconds`` (in :class:`DataLoader`) makes every step start
  with a tiny all-reduce over a gloo group of all ranks. A rank that died
  closes its sockets, so the others fail at once with :class:`RankFailure`
  naming the step; a rank that hangs or whose machine vanished makes them
  fail after ``seconds``. It also catches ranks at different steps (a rank
  resumed from another state). What it does not cover: a rank that dies
  while the others wait inside your own collectives (the gradient
  all-reduce) fails them there, under that collective's timeout.
"""

from __future__ import annotations

import datetime
import warnings
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from . import loader as _loader
from .torch import _to_torch

__all__ = ["DataLoader", "IterableDataset", "RankFailure", "as_tensors"]

# Their settings: zt.loader's keyword spec, less and plus what each front
# takes (zt.loader._KEYWORDS).
# `streams` may be left out for `mix=`, as in zt.loader's.
_FRONT = _loader._Front(
    "zt.torch.DataLoader",
    drop=("step_stride",),
    extra={"pin_memory": _loader._Keyword(False), "health_check": _loader._Keyword(None)},
    optional_streams=True,
)
_DATASET = _loader._Front(
    "zt.torch.IterableDataset",
    drop=("transform", "step_stride"),
    defaults={"workers": 2, "prefetch": 2},
    extra={"steps": _loader._Keyword(None, _loader._optional_step)},
    optional_streams=True,
)


class RankFailure(RuntimeError):
    """A peer rank is gone, stalled, or at another step: raised by
    :class:`DataLoader` with ``health_check`` at the step it hit (``.step``)."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        self.step = step


RankFailure.__module__ = "zt.torch"  # where users import it from

# -- numpy batches -> torch -------------------------------------------------------


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over the array's memory (DLPack; ml_dtypes types such as
    bfloat16, which numpy cannot export, through a same-width integer view)."""
    try:
        return torch.from_dlpack(array)
    except (BufferError, TypeError, RuntimeError):
        return _to_torch(torch, array)


def _ragged(values: np.ndarray, offsets: np.ndarray, shapes: np.ndarray) -> list[torch.Tensor]:
    """One tensor per record, each a view of the batch's one values tensor."""
    flat = _tensor(values)
    bounds = offsets.tolist()
    return [flat[a:b].view(s) for a, b, s in zip(bounds[:-1], bounds[1:], shapes.tolist())]


def as_tensors(batch: dict[str, Any]) -> dict[str, Any]:
    """A :class:`zt.loader.DataLoader` batch as torch tensors, sharing its
    memory: a Dense column becomes one tensor; a packed Ragged column
    ``(values, offsets, shapes)`` three; a list of arrays a list of tensors."""
    out = {}
    for name, value in batch.items():
        if isinstance(value, np.ndarray):
            out[name] = _tensor(value)
        elif isinstance(value, tuple):
            out[name] = tuple(_tensor(v) for v in value)
        elif isinstance(value, list):
            out[name] = [_tensor(v) for v in value]
        else:
            out[name] = value
    return out


class _Columns:
    """Builds the torch batch from the native columns directly (Ragged
    records as views of one values tensor), whatever form ``packed`` asks
    for: one conversion instead of numpy views converted one by one. A
    mixture's columns are its first dataset's (all have the same names and
    kinds)."""

    def __init__(self, streams: dict[str, Any] | None, packed: bool, mix: Any = None):
        from .zrecord import Dense

        streams = _loader._mix_first_streams(mix) if streams is None else streams
        self.packed = packed
        self.names = list(streams)
        # Anything not Dense is Ragged here; zt.loader.DataLoader refuses
        # streams that are neither before any batch is built.
        dtypes = [None if isinstance(ds, Dense) else getattr(ds, "dtype", None) for ds in streams.values()]
        self.kinds = [None if d is None else (d, np.uint64(d.itemsize)) for d in dtypes]

    def __call__(self, columns) -> dict[str, Any]:
        out = {}
        for name, kind, column in zip(self.names, self.kinds, columns):
            if kind is None:
                out[name] = _tensor(np.asarray(column))
                continue
            dtype, itemsize = kind
            values, offsets, shapes = (np.asarray(p) for p in column)
            values, offsets = values.view(dtype), offsets // itemsize
            if self.packed:
                out[name] = (_tensor(values), _tensor(offsets.view(np.int64)), _tensor(shapes.view(np.int64)))
            else:
                out[name] = _ragged(values, offsets, shapes)
        return out


def _pinned(value: Any) -> Any:
    """``value`` with every CPU tensor in it copied to page-locked memory."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, dict):
        return {k: _pinned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_pinned(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_pinned(v) for v in value)
    return value


def _finisher(transform: Any, pin_memory: bool):
    """What runs on the loader's worker threads after the conversion: the
    user's transform, then the pinning copy (None when neither is asked)."""
    if transform is None and not pin_memory:
        return None
    if not pin_memory:
        return transform
    if transform is None:
        return _pinned
    return lambda batch: _pinned(transform(batch))


def _can_pin() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


# -- the in-process front -------------------------------------------------------------


class DataLoader:
    """:class:`zt.loader.DataLoader` with batches as torch tensors.

    Same streams, settings, order, resume and sharding as
    :class:`zt.loader.DataLoader` (everything after ``streams`` is
    keyword-only), mixtures included: ``mix={"web": (streams, 0.7), ...}``
    in place of ``streams``, each batch then carrying ``"dataset"`` (an
    int64 tensor, each sample's dataset in the order of ``mix``). Each
    Dense column is one tensor over the loader's own buffer
    (``torch.from_dlpack``, no copy); a Ragged column is a list of
    tensors that are views of one values tensor, or with ``packed=True`` the
    ``(values, offsets, shapes)`` tensors (offsets in elements).

    ``transform(batch)`` receives the torch batch and runs on the loader's
    worker threads. ``pin_memory=True`` copies each batch into page-locked
    memory on the worker threads, for ``.to(device, non_blocking=True)``;
    without an accelerator it warns and leaves memory unpinned, as
    ``torch.utils.data.DataLoader`` does. ``health_check=seconds`` checks the
    other ranks before each step (see the module docs) and raises
    :class:`RankFailure` naming the step. ``prefetch_bytes`` bounds the
    batches built or waiting ahead of the consumer by bytes as well as by
    ``prefetch`` (see :class:`zt.loader.DataLoader`).
    """

    def __init__(self, streams: dict[str, Any] | None = None, *positional: Any, **settings: Any):
        self._loader = None
        kw = _FRONT.read(positional, settings)
        pin_memory, health_check = kw.pop("pin_memory"), kw.pop("health_check")
        if pin_memory and not _can_pin():
            warnings.warn(
                "pin_memory=True but no accelerator is available: batches stay in ordinary (pageable) memory",
                stacklevel=2,
            )
            pin_memory = False
        self.pin_memory = pin_memory
        # With a transform or pinning, the conversion (and the pinning copy)
        # run on the worker threads; otherwise at hand-off.
        kw["transform"] = _finisher(kw["transform"], pin_memory)
        columns = _Columns(streams, kw.pop("packed"), kw["mix"])
        self._loader = _loader.DataLoader(streams, _assemble=columns, _dataset_column=_tensor, **kw)
        try:
            self._health = None if health_check is None else _HealthCheck(self._loader.sampler, health_check)
        except BaseException:
            self._loader.close()
            raise

    # -- iteration --------------------------------------------------------------------

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self) -> dict[str, Any]:
        loader = self._loader
        if self._health is not None and not loader.closed:
            try:
                self._health.check(loader.step)
            except RankFailure:
                loader.close()
                raise
        return next(loader)

    def next(self) -> dict[str, Any]:
        """The next step's batch (``StopIteration`` once closed)."""
        return self.__next__()

    def __len__(self):
        raise TypeError("Eternal loader has no length.")

    # -- position (zt.loader.DataLoader's) ------------------------------------------

    @property
    def step(self) -> int:
        """The step the next ``next()`` returns."""
        return self._loader.step

    def seek(self, step: int) -> None:
        """See :meth:`zt.loader.DataLoader.seek`: safe from any thread or a
        transform; a ``next()`` waiting elsewhere returns ``step``'s batch."""
        self._loader.seek(step)

    def state_dict(self) -> dict[str, int]:
        """See :meth:`zt.loader.DataLoader.state_dict`: the global step and the
        settings of the global stream, the same on every rank."""
        return self._loader.state_dict()

    def load_state_dict(self, state: dict[str, int], *, rebase: bool = False) -> None:
        """See :meth:`zt.loader.DataLoader.load_state_dict` (any world size)."""
        self._loader.load_state_dict(state, rebase=rebase)

    @property
    def sampler(self) -> _loader.Sampler:
        return self._loader.sampler

    @property
    def datasets(self) -> list[str] | None:
        """A mixture's dataset names in the order ``"dataset"`` numbers them (else ``None``)."""
        return self._loader.datasets

    @property
    def loader(self) -> _loader.DataLoader:
        """The :class:`zt.loader.DataLoader` underneath."""
        return self._loader

    # -- lifecycle --------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._loader is None or self._loader.closed

    def close(self) -> None:
        if self._loader is not None:
            self._loader.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<zt.torch.DataLoader over {self._loader!r}>"


class _HealthCheck:
    """One all-reduce per step over a gloo group of every rank: the group's
    timeout bounds how long a lost rank can stall the others, and the
    reduced step numbers show a rank at another step.

    Steps go up to 2^64 - 1, past int64: each rank sends ``b = step - 2^63``
    (which fits) and ``~b`` (``-b - 1``, which fits too, where ``-b`` would
    not for step 0), so MAX gives the highest step and, through ``~``, the
    lowest."""

    def __init__(self, sampler: _loader.Sampler, seconds: float):
        import torch.distributed as dist

        if not (seconds > 0):
            raise ValueError(f"health_check must be a positive number of seconds, got {seconds!r}")
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("health_check needs torch.distributed initialised (init_process_group)")
        if dist.get_world_size() != sampler.world_size or dist.get_rank() != sampler.rank:
            raise ValueError(
                f"health_check checks the torch.distributed group (rank {dist.get_rank()} of "
                f"{dist.get_world_size()}), but this loader is rank {sampler.rank} of {sampler.world_size}"
            )
        self.dist = dist
        self.seconds = seconds
        self.rank, self.world = sampler.rank, sampler.world_size
        # Every rank builds its loader, so every rank joins this collective.
        self.group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=seconds))
        self.buffer = torch.zeros(2, dtype=torch.int64)

    def check(self, step: int) -> None:
        buffer = self.buffer
        biased = step - (1 << 63)
        buffer[0], buffer[1] = biased, ~biased
        try:
            self.dist.all_reduce(buffer, op=self.dist.ReduceOp.MAX, group=self.group)
        except Exception as exc:  # gloo raises RuntimeError or DistBackendError
            raise RankFailure(
                f"zt.torch.DataLoader health check before step {step} failed on rank {self.rank} of "
                f"{self.world}: another rank is gone, or has not reached this step within "
                f"{self.seconds:g} s ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
                "Restart every rank from the last saved state_dict(); any world size that divides the "
                "global batch resumes the same sequence.",
                step,
            ) from exc
        highest, lowest = int(buffer[0]) + (1 << 63), ~int(buffer[1]) + (1 << 63)
        if highest != step or lowest != step:
            raise RankFailure(
                f"zt.torch.DataLoader health check before step {step} on rank {self.rank} of {self.world}: "
                f"the ranks are at steps {lowest}..{highest}. Every rank must resume from the same "
                "state_dict() and take one batch per step.",
                step,
            )


# -- inside torch.utils.data.DataLoader --------------------------------------------


class IterableDataset(tud.IterableDataset):
    """zt's step-ordered batches for ``torch.utils.data.DataLoader``.

    Each item is one whole step's batch (this rank's slice), so give torch's
    loader ``batch_size=None``. With ``num_workers=n`` torch worker ``i``
    takes steps ``start_step + i, start_step + i + n, ...`` through its own
    :class:`zt.loader.DataLoader` (``workers`` threads); torch's in-order
    round-robin then yields the steps in order, each once, the same sequence
    for any ``num_workers``. ``steps`` bounds an iteration (each new
    iteration starts again at ``start_step``); without it the stream is
    endless. The rank and world size are found once, here in the main
    process, and passed to the workers.

    ``streams`` are opened readers; torch's worker processes reopen them
    the way they were opened (path, open method, storage options) when they
    are started with ``spawn`` (forked workers share the parent's).
    ``prefetch`` and ``prefetch_bytes`` bound each torch worker's own
    loader, so ``num_workers=n`` holds up to ``n`` times as much ahead.
    ``mix={"web": (streams, 0.7), ...}`` in place of ``streams`` reads a
    mixture as :class:`zt.loader.DataLoader` does (each batch gains
    ``"dataset"``), its datasets reopened in the same way.
    """

    def __init__(self, streams: dict[str, Any] | None = None, *positional: Any, **settings: Any):
        kw = _DATASET.read(positional, settings)
        super().__init__()
        streams = None if streams is None else dict(streams)
        mix = kw.pop("mix")
        start_step, steps = kw.pop("start_step"), kw.pop("steps")
        # Validates the streams, the mixture and the settings now, in the main process.
        probe = _loader.DataLoader(streams, mix=mix, **{**kw, "workers": 1, "prefetch": 1})
        probe.close()
        s = probe.sampler
        # What each torch worker's loader is given (the ranks found here).
        self._settings = {**kw, "batch_size": s.batch_size, "mode": int(s.mode), "seed": s.seed}
        self._settings.update(rank=s.rank, world_size=s.world_size)
        self._config = dict(s._config)
        self.rank, self.world_size = s.rank, s.world_size
        self.datasets = probe.datasets
        self.start_step = start_step
        self.steps = steps
        if mix is not None:
            # Each dataset as its dict of streams (one store is the stream "data").
            mix = {n: (d if isinstance(d, dict) else {"data": d}, w) for n, (d, w) in mix.items()}
        self._streams, self._mix = streams, mix
        self._kinds = None if streams is None else _paths(streams)
        self._mix_kinds = None if mix is None else {n: (_paths(d), w) for n, (d, w) in mix.items()}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_streams"] = state["_mix"] = None  # reopened from _kinds in a spawned worker
        return state

    def _open(self) -> tuple[dict[str, Any] | None, Any, list]:
        """The streams or the mixture (the parent's readers, or reopened as
        they were opened) and the readers that are ours to close."""
        if self._streams is not None or self._mix is not None:
            return self._streams, self._mix, []
        if self._kinds is not None:
            streams = _reopen(self._kinds)
            return streams, None, list(streams.values())
        mix = {n: (_reopen(kinds), w) for n, (kinds, w) in self._mix_kinds.items()}
        return None, mix, [ds for d, _ in mix.values() for ds in d.values()]

    def __iter__(self) -> _Share:
        info = tud.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        count = None
        if self.steps is not None:
            count = 0 if self.steps <= worker else -(-(self.steps - worker) // workers)
        streams, mix, owned = self._open()
        settings = dict(self._settings)
        packed = settings.pop("packed")
        try:
            loader = _loader.DataLoader(
                streams,
                mix=mix,
                start_step=self.start_step + worker,
                step_stride=workers,
                _assemble=_Columns(streams, packed, mix),
                _dataset_column=_tensor,
                **settings,
            )
        except BaseException:
            for ds in owned:
                ds.close()
            raise
        return _Share(loader, count, owned)

    # -- resume ---------------------------------------------------------------------

    def state_at(self, step: int) -> dict[str, int]:
        """The state dict of a run whose next step is ``step`` (count the
        batches you took from torch's loader: that count plus ``start_step``)."""
        return _loader._state(self._config, _loader._u64("step", step, 0))

    def load_state_dict(self, state: dict[str, int], *, rebase: bool = False) -> None:
        """Make the next iteration start where ``state`` left off (checked as
        :meth:`zt.loader.DataLoader.load_state_dict` checks it)."""
        self.start_step = _loader._resume_step(state, self._config, rebase, "dataset")


def _paths(streams: dict[str, Any]) -> dict[str, Any]:
    """What a spawned worker reopens each stream from: how each reader was
    opened (an MDS column, a Megatron corpus, several stores, storage
    options included), which pickles where the reader cannot."""
    return {name: _Reopenable(ds) for name, ds in streams.items()}


def _reopen(kinds: dict[str, Any]) -> dict[str, Any]:
    return {name: recipe.open() for name, recipe in kinds.items()}


class _Reopenable:
    """A reader's open call, picklable: the reader itself is a native
    handle that cannot cross into a spawned process."""

    def __init__(self, reader: Any):
        self.kind, self.opened_as = type(reader), reader._opened_as

    def open(self) -> Any:
        return self.kind._open_as(self.opened_as)


class _Share:
    """One torch worker's share of the steps: a plain iterator (no generator
    frame is kept between batches)."""

    def __init__(self, loader: _loader.DataLoader, count: int | None, owned: list):
        self.loader, self.left, self.owned = loader, count, owned

    def __iter__(self) -> _Share:
        return self

    def __next__(self) -> dict[str, Any]:
        if self.left is not None:
            if self.left <= 0:
                self.close()
                raise StopIteration
            self.left -= 1
        return next(self.loader)

    def close(self) -> None:
        self.loader.close()
        for ds in self.owned:
            ds.close()
        self.owned = []

    def __del__(self):
        self.close()


DataLoader.__init__.__signature__ = _FRONT.signature()  # type: ignore[attr-defined]
IterableDataset.__init__.__signature__ = _DATASET.signature()  # type: ignore[attr-defined]
