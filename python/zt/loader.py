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
* ``BLOCK_SHUFFLE`` (4, a zt extension): without replacement, in blocks of
  ``block_size`` consecutive records (default 64): each epoch is a shuffle of
  the blocks (their boundaries move every epoch), records inside a block in
  order, so a batch reads a few long runs of a store (few large ranged reads
  on object storage) at the cost of neighbours that come together. Step
  ``s`` reads positions ``s * batch_size + i`` of the endless sequence of
  epochs: every record comes once per epoch and nothing is dropped.

Mixtures (``mix=[(weight, length), ...]``, what :class:`DataLoader`'s
``mix=`` builds): the datasets are concatenated into one index space, each
position of the global stream goes to a dataset in the weights' proportions
(deterministically, exact over every ``sum(weights)`` positions and within a
few samples of exact in every batch), and each dataset is read as its own
stream in ``mode`` with its own seed (CYCLIC and BLOCK_SHUFFLE as epochs of
that dataset, each record once per epoch, nothing dropped).

SEQUENTIAL and CYCLIC produce exactly loaderx 2.8.19's index streams for the
same ``(length, batch_size, seed)`` at every step below ``2**64``, and
loaderx 2.3.8's except where 2.3.8's 64-bit arithmetic wraps (SEQUENTIAL with
``step * batch_size >= 2**64`` or ``length + batch_size > 2**64``), where zt
and 2.8 compute the exact value. After step ``2**64 - 1`` zt's step counter
wraps to 0 (loaderx 2.8 raises ``OverflowError``). zt's IID is its own
counter-based stream (loaderx 2.3.8's is a stateful generator, 2.8's is
``LOADERX_IID``).

Sharding: every rank computes the same global batch and keeps its own
contiguous slice ``[rank * n, (rank + 1) * n)``, ``n = batch_size //
world_size``; the slices are disjoint and together are the global batch. The
rank and world size are the ``rank``/``world_size`` arguments when given,
else ``torch.distributed``'s when a process group is initialised, else the
``RANK``/``WORLD_SIZE`` environment variables, else JAX's process index and
count when ``jax`` is imported, else 0 and 1 (``zt._ranks``). A global batch
that does not split evenly is refused with ``ValueError`` naming the fix.

Elastic resume: a state dict records the global step and the settings that
decide the global stream (global batch size, length, mode, seed), never a
rank's position. A run saved at step ``k`` on ``W`` ranks and resumed on any
``W'`` that divides the global batch continues the same global sequence: at
every step the ranks' batches together are the single-process batch.
"""

from __future__ import annotations

import enum
import inspect
import operator
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from . import _ranks, _zt

_frombuffer = np.frombuffer

__all__ = [
    "BLOCK_SHUFFLE",
    "CYCLIC",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_PREFETCH_BYTES",
    "IID",
    "LOADERX_IID",
    "SEQUENTIAL",
    "DataLoader",
    "Mode",
    "Sampler",
]

_U64_MAX = (1 << 64) - 1

DEFAULT_PREFETCH_BYTES = 1 << 30
"""The default ``prefetch_bytes`` of :class:`DataLoader`: 1 GiB."""

DEFAULT_BLOCK_SIZE = 64
"""BLOCK_SHUFFLE's records per block when no ``block_size`` is given."""

_MIX_MAX_DATASETS = 32
_MIX_MAX_WEIGHT_SUM = 1 << 32


class Mode(enum.IntEnum):
    """Sampling modes, numbered as loaderx numbers them (LOADERX_IID, loaderx
    2.8's IID stream, is zt's)."""

    SEQUENTIAL = 0
    IID = 1
    CYCLIC = 2
    LOADERX_IID = 3
    BLOCK_SHUFFLE = 4


SEQUENTIAL = Mode.SEQUENTIAL
IID = Mode.IID
CYCLIC = Mode.CYCLIC
LOADERX_IID = Mode.LOADERX_IID
BLOCK_SHUFFLE = Mode.BLOCK_SHUFFLE


def _u64(name: str, value: Any, low: int, high: int = _U64_MAX, bound: str = "2^64-1") -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in {low}..{bound}, got {value}")
    return value


# The class attribute Sampler.Mode shadows the enum inside the class body.
_Mode = Mode


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
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        mix: Any = None,
    ) -> None:
        length = _u64("length", length, 1)
        batch_size = _u64("batch_size", batch_size, 1)
        try:
            mode = Mode(operator.index(mode))
        except (TypeError, ValueError):
            raise ValueError(
                f"mode must be SEQUENTIAL (0), IID (1), CYCLIC (2), LOADERX_IID (3) or BLOCK_SHUFFLE (4), got {mode!r}"
            ) from None
        seed = _u64("seed", seed, 0)
        block_size = _u64("block_size", block_size, 1)
        mix = _mix_parts(mix, length)
        ranks = _ranks.discover(rank, world_size)
        short_cyclic = mode == CYCLIC and length < batch_size and mix is None
        global_len = length if short_cyclic else batch_size
        if global_len % ranks.world_size:
            raise ValueError(_ranks.uneven_batch_message(global_len, ranks.world_size, ranks.source, short_cyclic))
        self._native = _zt.Sampler(length, batch_size, int(mode), seed, ranks.rank, ranks.world_size, block_size, mix)
        self._config = {
            "length": length,
            "batch_size": batch_size,
            "mode": int(mode),
            "seed": seed,
            "block_size": block_size,
            "mix": mix,
        }
        self._ranks = ranks
        self._rank = ranks.rank
        self._world_size = ranks.world_size
        self._len: int = self._native.batch_len
        self._dtype = np.dtype(np.int64) if length <= 1 << 63 else np.dtype(np.uint64)
        self._shape = (self._len,)
        # The last `out` array checked (its Python-level checks are skipped
        # while the same array comes back; the native fill checks its buffer
        # on every call).
        self._adopted: np.ndarray | None = None

    # -- drawing --------------------------------------------------------------

    def next(self, out: np.ndarray | None = None) -> np.ndarray:
        """This rank's indices for the current step; advances the step.

        By default a fresh array the caller owns. With ``out`` (a writable,
        C-contiguous 1-D array of :attr:`dtype` and length :attr:`batch_len`),
        the indices are written into ``out`` and ``out`` itself is returned:
        a borrow that the next ``next(out=out)`` overwrites, so copy it to keep
        a batch. ``out`` is validated (with loaderx's messages) the first time
        it is passed; the native fill borrows its buffer on every call and
        checks again that it is writable, C-contiguous and exactly one batch
        of 8-byte integers, so no change to ``out`` can make it write
        elsewhere.
        """
        native = self._native
        if native is None:
            raise RuntimeError("Sampler is closed")
        if out is None:
            return _frombuffer(native.next_bytes(), self._dtype)
        if out is not self._adopted:
            self._adopt(out)
        native.next_into(out)
        return out

    def batch(self, step: int, out: np.ndarray | None = None) -> np.ndarray:
        """This rank's indices for any ``step``, leaving the current step alone
        (a pure function of ``(seed, step)``). ``out`` as in :meth:`next`."""
        step = _u64("step", step, 0)
        native = self._native_or_raise()
        if out is None:
            return _frombuffer(native.batch_bytes(step), self._dtype)
        if out is not self._adopted:
            self._adopt(out)
        native.batch_into(step, out)
        return out

    def _adopt(self, out: np.ndarray) -> None:
        """Validate a new ``out`` with loaderx's messages and remember it."""
        if not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy array, got {type(out).__name__}")
        if out.dtype != self._dtype:
            raise ValueError(f"out must have dtype {self._dtype}, got {out.dtype}")
        if out.shape != self._shape:
            raise ValueError(f"out must have shape {self._shape}, got {out.shape}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be C-contiguous and writeable")
        self._adopted = out

    # -- position ---------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step the next :meth:`next` draws."""
        return self._native_or_raise().step

    def seek(self, step: int) -> None:
        """Make ``step`` the next step drawn. O(1): nothing is replayed."""
        self._native_or_raise().seek(_u64("step", step, 0))

    def state_dict(self) -> dict[str, int]:
        """Where the run is, for every rank at once (JSON-friendly):
        ``global_step`` (the next step), ``global_batch_size``, ``length``,
        ``mode``, ``seed``, and ``samples_seen`` (``global_step`` times the
        global batch). No rank's position is in it: resume on any world size
        (see :meth:`load_state_dict`)."""
        return _state(self._config, self.step)

    def load_state_dict(self, state: dict[str, int], *, rebase: bool = False) -> None:
        """Resume from :meth:`state_dict` (or the older ``{"step", "batch_size",
        ...}`` form), on any rank and world size.

        A state saved with a different global batch size, seed, mode or
        length would give a different sample sequence, so it is refused with
        ``ValueError``. ``rebase=True`` accepts it knowingly: this sampler
        keeps its own settings and starts at the first step at which at least
        ``samples_seen`` samples have been drawn under them, a new sequence
        that covers about as much of the data as the old run had."""
        self.seek(_resume_step(state, self._config, rebase, "sampler"))

    # -- description --------------------------------------------------------------

    @property
    def length(self) -> int:
        return self._config["length"]

    @property
    def batch_size(self) -> int:
        """The global batch size the sampler was made with."""
        return self._config["batch_size"]

    @property
    def mode(self) -> _Mode:
        return Mode(self._config["mode"])

    @property
    def seed(self) -> int:
        return self._config["seed"]

    @property
    def block_size(self) -> int:
        """BLOCK_SHUFFLE's records per block."""
        return self._config["block_size"]

    @property
    def mix(self) -> list[tuple[int, int]] | None:
        """A mixture's ``(integer weight, length)`` per dataset, or ``None``."""
        mix = self._config["mix"]
        return None if mix is None else list(mix)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        """``LOCAL_RANK`` (torchrun sets it), else :attr:`rank`."""
        return self._ranks.local_rank

    @property
    def rank_source(self) -> str:
        """Where :attr:`rank` and :attr:`world_size` came from: "arguments",
        "torch.distributed", "environment (RANK/WORLD_SIZE)", "jax" or
        "default (one process)"."""
        return self._ranks.source

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
        self._adopted = None

    def __enter__(self) -> Sampler:
        return self

    def __exit__(self, *exc: object) -> None:
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


# -- state dicts -------------------------------------------------------------------
# The state dict's form, versions, checks and re-basing are zloader's
# (`zloader::State`, loader/src/state.rs); these call it.


def _state(config: dict[str, Any], step: int) -> dict[str, int]:
    """The state dict of a run over ``config``'s settings whose next step is ``step``."""
    c = config
    return _zt.Sampler.state_dict_at(
        c["length"], c["batch_size"], c["mode"], c["seed"], step, c["block_size"], c["mix"]
    )


def _resume_step(state: dict[str, Any], config: dict[str, Any], rebase: bool, what: str) -> int:
    """The step to resume at: the saved step when the settings match, else
    (with ``rebase``) the first step past the saved sample count."""
    c = config
    return _zt.Sampler.resume_step_of(
        state, c["length"], c["batch_size"], c["mode"], c["seed"], rebase, what, c["block_size"], c["mix"]
    )


# -- mixtures --------------------------------------------------------------------


def _mix_parts(mix: Any, length: int) -> list[tuple[int, int]] | None:
    """A Sampler's ``mix``: ``(integer weight, length)`` per dataset, the
    lengths summing to ``length``."""
    if mix is None:
        return None
    parts = []
    for part in mix:
        weight, n = part
        parts.append((_u64("mix weight", weight, 1, _MIX_MAX_WEIGHT_SUM, "2^32"), _u64("mix length", n, 1)))
    if not 1 <= len(parts) <= _MIX_MAX_DATASETS:
        raise ValueError(f"a mixture holds 1 to {_MIX_MAX_DATASETS} datasets, got {len(parts)}")
    if sum(w for w, _ in parts) > _MIX_MAX_WEIGHT_SUM:
        raise ValueError("a mixture's integer weights must sum to at most 2^32")
    if sum(n for _, n in parts) != length:
        raise ValueError(f"length {length} is not the mixture's {sum(n for _, n in parts)} records")
    return parts


def integer_weights(weights: list[Any]) -> list[int]:
    """The integer weights a mixture samples with, from the caller's
    (positive, finite) numbers: exact proportions in lowest terms when they
    are decimal fractions (``0.7, 0.3`` -> ``7, 3``, so every 10 samples hold
    7 and 3) whose terms sum to at most 2^32, else rounded to 2^-24 of the
    total (never below 1)."""
    import math
    from fractions import Fraction

    fractions = []
    for w in weights:
        if isinstance(w, bool) or not isinstance(w, (int, float, np.integer, np.floating)):
            raise TypeError(f"mix weights must be numbers, got {type(w).__name__}")
        if not math.isfinite(w) or w <= 0:
            raise ValueError(f"mix weights must be positive and finite, got {w!r}")
        fractions.append(Fraction(int(w)) if isinstance(w, (int, np.integer)) else Fraction(repr(float(w))))
    total = sum(fractions)
    shares = [f / total for f in fractions]
    scale = math.lcm(*(s.denominator for s in shares))
    if scale <= _MIX_MAX_WEIGHT_SUM:
        return [int(s * scale) for s in shares]
    rounded = [max(1, round(s * (1 << 24))) for s in shares]
    g = math.gcd(*rounded)
    return [r // g for r in rounded]


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


def _ignoring_step(assemble):
    """``assemble(columns)`` as the loader calls it, ``(step, columns)``."""
    return lambda step, columns: assemble(columns)


def _with_datasets(assemble, sampler: Sampler, parts: list[tuple[int, int]], as_column=None):
    """A mixture's batches: the streams' columns plus ``"dataset"``, each
    sample's dataset number (the order of ``mix``), found from the step's
    indices and the datasets' starts in the concatenated index space; a
    front whose columns are not numpy (zt.torch's) converts it with
    ``as_column``."""
    starts = np.cumsum([0] + [n for _, n in parts[:-1]], dtype=np.uint64)

    def with_datasets(step, columns):
        batch = assemble(columns)
        indices = sampler.batch(step).astype(np.uint64, copy=False)
        which = np.searchsorted(starts, indices, side="right").astype(np.int64) - 1
        batch["dataset"] = which if as_column is None else as_column(which)
        return batch

    return with_datasets


def _checked_streams(streams: Any, where: str) -> dict[str, Any]:
    """``streams`` as a dict of open Dense/Ragged readers of one length."""
    from .zrecord import Dense, Ragged

    streams = dict(streams)
    if not streams:
        raise ValueError(f"need at least one stream{where}")
    invalid = [
        name
        for name, ds in streams.items()
        if not isinstance(ds, (Dense, Ragged)) or getattr(ds, "_reader", None) is None or ds.closed
    ]
    if invalid:
        raise ValueError(f"DataLoader streams must be opened for reading{where}: {invalid}")
    lengths = {name: len(ds) for name, ds in streams.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"all streams must hold the same number of records{where}, got {lengths}")
    return streams


def _mix_first_streams(mix: Any) -> dict[str, Any]:
    """The streams of a mixture's first dataset (every dataset has the same
    names and kinds), for a front that builds its columns before the loader
    checks the mixture; ``{}`` when ``mix`` is malformed (the loader then
    refuses it with its own message)."""
    if not isinstance(mix, dict) or not mix:
        return {}
    entry = next(iter(mix.values()))
    if not (isinstance(entry, tuple) and len(entry) == 2):
        return {}
    data = entry[0]
    return dict(data) if isinstance(data, dict) else {"data": data}


def _mixture(mix: Any):
    """``mix={"web": (streams_or_store, weight), ...}`` as the loader reads
    it: one concatenated reader per stream name (the datasets in order), the
    ``(integer weight, length)`` parts and the dataset names. A dataset is
    a dict of streams, or one store (the stream ``"data"``); every dataset
    must have the same stream names and types."""
    if not isinstance(mix, dict) or not mix:
        raise TypeError('mix must be a non-empty dict {"name": (streams or store, weight), ...}')
    names, datasets, weights = [], [], []
    for name, entry in mix.items():
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise TypeError(f"mix[{name!r}] must be a (streams or store, weight) pair")
        data, weight = entry
        streams = data if isinstance(data, dict) else {"data": data}
        datasets.append(_checked_streams(streams, f" in mix[{name!r}]"))
        names.append(name)
        weights.append(weight)
    first = list(datasets[0])
    if "dataset" in first:
        raise ValueError("a mixture's batches name each sample's dataset \"dataset\": no stream may be called that")
    for name, ds in zip(names, datasets):
        if list(ds) != first:
            raise ValueError(f"mix[{name!r}] has streams {list(ds)}, mix[{names[0]!r}] has {first}")
        for s in first:
            if type(ds[s]) is not type(datasets[0][s]) or ds[s].dtype != datasets[0][s].dtype:
                raise ValueError(f"stream {s!r} of mix[{name!r}] differs in type or dtype from mix[{names[0]!r}]'s")
    readers = [_zt.RecordReader.concat([ds[s]._reader for ds in datasets]) for s in first]
    integer = integer_weights(weights)
    parts = [(w, len(next(iter(ds.values())))) for w, ds in zip(integer, datasets)]
    return datasets[0], readers, parts, names


def _transformer(assemble, transform):
    """What a worker thread calls: assemble the batch, run the transform, and
    note the step on an exception (its traceback is kept)."""

    def finish(step, columns):
        try:
            return transform(assemble(step, columns))
        except BaseException as exc:
            exc.add_note(f"raised by the zt.loader.DataLoader transform at step {step}")
            raise

    return finish


def _callable(name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable, got {type(value).__name__}")
    return value


def _byte_budget(name: str, value: Any) -> int:
    return _u64(name, _positive(name, value), 1)


def _step(name: str, value: Any) -> int:
    return _u64(name, value, 0)


def _optional_step(name: str, value: Any) -> int | None:
    return None if value is None else _u64(name, value, 0)


class _Keyword(NamedTuple):
    """One DataLoader setting: its default and its check (``None``: checked
    where it is used, the index settings and the ranks by :class:`Sampler`)."""

    default: Any
    check: Callable[[str, Any], Any] | None = None


# The DataLoader keyword spec: the settings every front (zt.loader.DataLoader,
# zt.torch.DataLoader, zt.torch.IterableDataset) takes after `streams`, by
# keyword only, with one default and one check each. A front leaves some out,
# changes a default or adds its own (`_Front`).
_KEYWORDS: dict[str, _Keyword] = {
    "batch_size": _Keyword(256),
    "mode": _Keyword(CYCLIC),
    "seed": _Keyword(42),
    "block_size": _Keyword(DEFAULT_BLOCK_SIZE),
    "workers": _Keyword(4, _positive),
    "prefetch": _Keyword(4, _positive),
    "prefetch_bytes": _Keyword(DEFAULT_PREFETCH_BYTES, _byte_budget),
    "transform": _Keyword(None, _callable),
    "rank": _Keyword(None),
    "world_size": _Keyword(None),
    "start_step": _Keyword(0, _step),
    "step_stride": _Keyword(1, _positive),
    "packed": _Keyword(False),
    "mix": _Keyword(None),
}

_POSITIONAL_HINT = (
    "{front} takes one positional argument (streams) and its settings by keyword, "
    "e.g. {front}(streams, batch_size=256, workers=4); got {n} more positional: {values}. "
    "(loaderx's DataLoader(streams, 8) means 8 transform workers, so a positional batch size "
    "would silently mean something else.)"
)


class _Front:
    """One front's keywords, made from :data:`_KEYWORDS`: which it leaves
    out, the defaults it changes, the settings of its own. Gives the front's
    signature (its ``__init__.__signature__``) and reads its arguments."""

    def __init__(
        self,
        name: str,
        *,
        drop: tuple[str, ...] = (),
        defaults: dict[str, Any] | None = None,
        extra: dict[str, _Keyword] | None = None,
        internal: tuple[str, ...] = (),
        optional_streams: bool = False,
    ) -> None:
        spec = {k: v for k, v in _KEYWORDS.items() if k not in drop}
        for k, default in (defaults or {}).items():
            spec[k] = spec[k]._replace(default=default)
        spec.update(extra or {})
        self.name, self.spec, self.internal = name, spec, internal
        self.optional_streams = optional_streams

    def signature(self) -> inspect.Signature:
        P = inspect.Parameter
        streams = P("streams", P.POSITIONAL_OR_KEYWORD, **({"default": None} if self.optional_streams else {}))
        params = [P("self", P.POSITIONAL_OR_KEYWORD), streams]
        params += [P(k, P.KEYWORD_ONLY, default=v.default) for k, v in self.spec.items()]
        return inspect.Signature(params)

    def read(self, positional: tuple, given: dict[str, Any]) -> dict[str, Any]:
        """Every setting (given or default), checked; internal keywords
        (``_assemble``) pass through unchecked."""
        if positional:
            values = ", ".join(map(repr, positional))
            raise TypeError(_POSITIONAL_HINT.format(front=self.name, n=len(positional), values=values))
        unknown = [k for k in given if k not in self.spec and k not in self.internal]
        if unknown:
            raise TypeError(f"{self.name}() got an unexpected keyword argument {unknown[0]!r}")
        out = {k: given.get(k, v.default) for k, v in self.spec.items()}
        for k, v in self.spec.items():
            if v.check is not None:
                out[k] = v.check(k, out[k])
        out.update((k, given[k]) for k in self.internal if k in given)
        return out


# `streams` may be left out for `mix=`, which names the datasets instead.
_FRONT = _Front("zt.loader.DataLoader", internal=("_assemble", "_dataset_column"), optional_streams=True)


class DataLoader:
    """Endless, step-ordered batches gathered from zrecord streams.

    ``streams`` maps names to opened :class:`zt.zrecord.Dense` /
    :class:`zt.zrecord.Ragged` readers of equal length; every other argument
    is keyword-only. Step ``s``'s batch is ``{name: values}`` gathered at
    :class:`Sampler`'s indices for step ``s`` (the same indices for every
    stream): a ``(n, *item_shape)`` array for a Dense stream, a list of
    arrays for a Ragged one (or, with ``packed=True``, the ``(values,
    offsets, shapes)`` of :meth:`zt.zrecord.Ragged.gather_packed`). Every
    array is owned by the batch: keeping one keeps its memory, and nothing
    reuses it until it is dropped.

    The loader gathers from the readers you pass (they are shared, not
    reopened: starting, seeking and resuming open nothing). Streams belong to
    the caller; closing one while the loader runs is safe (the loader keeps
    the store open until it stops).

    ``workers`` native threads claim steps, gather without the GIL and hand
    batches over in step order, so the sequence is the same for any number of
    workers. Memory ahead of the consumer is bounded twice: at most
    ``prefetch`` batches are built or waiting, and a worker starts another
    only while those hold less than ``prefetch_bytes`` (default 1 GiB,
    :data:`DEFAULT_PREFETCH_BYTES`), so a huge ``prefetch`` with an idle
    consumer stops at the byte budget instead of growing until the process
    dies. A batch's bytes are what the loader gathers (its index array, Dense
    rows, Ragged values, offsets and shapes), not what a transform makes of
    them; the window passes the budget by at most the batch started just
    under it (plus, for Ragged streams, the difference between the last
    batch's size and the size of those still being gathered, one per
    worker). The step ``next()`` waits for is always started, so a batch
    larger than ``prefetch_bytes`` still comes, one at a time.
    ``transform(batch)`` (optional) runs on the worker threads, and
    may run concurrently; its result is what ``next()`` returns, and an
    exception it raises is raised by ``next()`` at that step, with its
    traceback. A stream that fails (a corrupt record) raises
    ``zt.zrecord.ZrecordError`` at the step that hit it, naming the stream,
    the store and the record; the loader then goes on with the next step.

    Resume: :meth:`state_dict` / :meth:`load_state_dict` and :meth:`seek`
    (or ``start_step``) give exactly the batches the original run gave from
    that step on, on any rank and world size (see :class:`Sampler` for how
    ``rank`` / ``world_size`` are found and shard each global batch).
    ``step_stride=n`` delivers steps ``start_step, start_step + n, ...``:
    ``n`` loaders started at consecutive steps split a run between them (how
    :class:`zt.torch.IterableDataset` feeds torch's worker processes).
    :meth:`seek` and :meth:`close` are safe from the consumer, another thread
    or a transform: a seek moves the loader (a ``next()`` waiting elsewhere
    returns the new step's batch), a close stops it.
    """

    def __init__(self, streams: dict[str, Any] | None = None, *positional: Any, **settings: Any) -> None:
        # Settings: `_KEYWORDS`. `_assemble` (internal: zt.torch's front)
        # replaces the function that turns the native columns into a batch
        # (numpy arrays by default), and `_dataset_column` converts a
        # mixture's numpy "dataset" column to that front's kind.
        self._core = None
        kw = _FRONT.read(positional, settings)
        mix = kw["mix"]
        if mix is None:
            if streams is None:
                raise TypeError("DataLoader needs streams (or mix=)")
            self.streams = _checked_streams(streams, "")
            self.datasets = None
            length = len(next(iter(self.streams.values())))
            readers = [ds._reader for ds in self.streams.values()]
            mix_parts = None
        else:
            if streams is not None:
                raise TypeError("pass streams or mix=, not both (mix= names each dataset's streams)")
            self.streams, readers, mix_parts, self.datasets = _mixture(mix)
            length = sum(n for _, n in mix_parts)
        self._workers = kw["workers"]
        self._prefetch = kw["prefetch"]
        self._prefetch_bytes = kw["prefetch_bytes"]
        self._stride = kw["step_stride"]
        transform, packed, _assemble = kw["transform"], kw["packed"], kw.get("_assemble")
        # The Sampler validates the index settings with its messages, finds
        # the ranks and gives the state dict; the workers compute the same
        # batches natively.
        self.sampler = Sampler(
            length,
            kw["batch_size"],
            kw["mode"],
            kw["seed"],
            kw["rank"],
            kw["world_size"],
            block_size=kw["block_size"],
            mix=mix_parts,
        )
        self._transform = transform
        names = list(self.streams)
        if _assemble is None:
            _assemble = _assembler(names, [_column_builder(self.streams[n], packed) for n in names])
        if mix_parts is not None:
            _assemble = _with_datasets(_assemble, self.sampler, mix_parts, kw.get("_dataset_column"))
        else:
            _assemble = _ignoring_step(_assemble)
        self._assemble = _assemble
        self._names = names
        self._closed = False
        s = self.sampler
        finish = None if transform is None else _transformer(self._assemble, transform)
        self._core = _zt.DataLoaderCore(
            readers,
            names,
            s.batch_size,
            int(s.mode),
            s.seed,
            s.rank,
            s.world_size,
            self._workers,
            self._prefetch,
            kw["start_step"],
            self._stride,
            finish,
            self._prefetch_bytes,
            s.block_size,
            mix_parts,
        )

    # -- iteration ------------------------------------------------------------------

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self) -> Any:
        core = self._core
        if core is None or self._closed:
            raise StopIteration
        item = core.next()
        if item is None:
            raise StopIteration
        step, transformed, value = item
        return value if transformed else self._assemble(step, value)

    def next(self) -> Any:
        """The next step's batch (``StopIteration`` once closed)."""
        return self.__next__()

    def __len__(self) -> int:
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
        """Make ``step`` the next step returned. Batches already prefetched
        are dropped, and batches being built for the old position (a
        transform already running finishes) are dropped when done; the
        workers go on from ``step`` over the same open readers.

        Safe from any thread and from a transform, and returns at once (it
        waits for no worker). A ``next()`` that has not yet received its
        batch when the seek lands, such as one waiting in another thread,
        returns ``step``'s batch; one that already received its batch
        returns that. This is rather than refusing a seek while a ``next()``
        is in flight because the caller usually cannot know whether one is
        (a consumer loop in another thread, a transform deciding to skip
        ahead): refusing would make a seek fail or not by timing, where this
        way the result is the same as the two calls made one after the
        other. ``RuntimeError`` once closed."""
        step = _u64("step", step, 0)
        core = self._core
        if core is None or self._closed:
            raise RuntimeError("DataLoader is closed")
        core.seek(step)

    def state_dict(self) -> dict[str, int]:
        """The run's position for every rank at once: the next global step and
        the settings that decide the global stream (JSON-friendly; see
        :meth:`Sampler.state_dict`). Save it from any rank."""
        return self._core_or_raise().state_dict()

    def load_state_dict(self, state: dict[str, int], *, rebase: bool = False) -> None:
        """Resume from :meth:`state_dict`, on any rank and world size. A state
        saved with a different global batch size, seed, mode or length is
        refused with ``ValueError`` unless ``rebase=True`` (see
        :meth:`Sampler.load_state_dict`)."""
        self._core_or_raise().load_state_dict(state, rebase)

    def _core_or_raise(self):
        core = self._core
        if core is None:
            raise RuntimeError("DataLoader is closed")
        return core

    # -- diagnostics -----------------------------------------------------------------

    @property
    def live_batches(self) -> int:
        """Batches whose buffers are alive now (in flight, waiting or held by you)."""
        core = self._core
        return 0 if core is None else core.live_batches

    @property
    def peak_batches(self) -> int:
        """The most batches alive at once since the loader started."""
        core = self._core
        return 0 if core is None else core.peak_batches

    @property
    def workers(self) -> int:
        return self._workers

    @property
    def step_stride(self) -> int:
        return self._stride

    @property
    def prefetch(self) -> int:
        return self._prefetch

    @property
    def prefetch_bytes(self) -> int:
        """The byte budget of the batches built or waiting ahead of the consumer."""
        return self._prefetch_bytes

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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        core = getattr(self, "_core", None)
        if core is not None:
            core.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"step={self.step}"
        return (
            f"<zt.loader.DataLoader streams={self._names} batch_size={self.sampler.batch_size} "
            f"mode={self.sampler.mode.name} workers={self._workers} prefetch={self._prefetch} {state}>"
        )


DataLoader.__init__.__signature__ = _FRONT.signature()  # type: ignore[attr-defined]
