"""Where this process sits among the ranks of a run: ``(rank, world_size)``
and where they came from.

Looked up in this order, the first that answers wins:

1. explicit ``rank`` / ``world_size`` arguments (each one overrides only itself);
2. ``torch.distributed`` when a process group is initialised;
3. the ``RANK`` / ``WORLD_SIZE`` environment variables (torchrun, SLURM
   wrappers and most launchers set them);
4. JAX's ``process_index()`` / ``process_count()`` when ``jax`` is already
   imported;
5. rank 0 of 1.

Nothing here imports torch or jax: a process group cannot exist unless
``torch.distributed`` was imported, and JAX's process numbers mean something
only to a program that uses JAX. Importing either costs seconds (and JAX
grabs accelerators), which a data loader has no business doing.
"""

from __future__ import annotations

import dataclasses
import operator
import os
import sys
from typing import Any

_U64_MAX = (1 << 64) - 1

ARGUMENTS = "arguments"
TORCH = "torch.distributed"
ENVIRONMENT = "environment (RANK/WORLD_SIZE)"
JAX = "jax"
DEFAULT = "default (one process)"


@dataclasses.dataclass(frozen=True)
class Ranks:
    """A process's place in a run."""

    rank: int
    world_size: int
    #: The rank among the processes of this machine (``LOCAL_RANK``, else
    #: ``rank`` when there is one machine's worth of processes); which
    #: accelerator to pin memory for.
    local_rank: int
    #: Where ``rank`` and ``world_size`` came from (one of the names above;
    #: "arguments + <source>" when only one of them was passed).
    source: str


def _argument(name: str, value: Any) -> int:
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if not 0 <= value <= _U64_MAX:
        raise ValueError(f"{name} must be in 0..2^64-1, got {value}")
    return value


def _env_int(variable: str) -> int | None:
    text = os.environ.get(variable)
    if text is None or text.strip() == "":
        return None
    try:
        parsed = int(text)
    except ValueError:
        raise ValueError(f"{variable}={text!r} in the environment is not an integer") from None
    if not 0 <= parsed <= _U64_MAX:
        raise ValueError(f"{variable}={text!r} in the environment is out of range")
    return parsed


def _from_torch() -> tuple[int, int] | None:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
    except Exception:  # a half-imported or stubbed-out torch: fall through
        return None
    return dist.get_rank(), dist.get_world_size()


def _from_environment() -> tuple[int, int] | None:
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if rank is None and world is None:
        return None
    return (0 if rank is None else rank), (1 if world is None else world)


def _from_jax() -> tuple[int, int] | None:
    jax = sys.modules.get("jax")
    if jax is None or not hasattr(jax, "process_index"):
        return None
    return int(jax.process_index()), int(jax.process_count())


def discover(rank: Any = None, world_size: Any = None) -> Ranks:
    """This process's :class:`Ranks` (see the module docs for the order)."""
    explicit_rank = None if rank is None else _argument("rank", rank)
    explicit_world = None if world_size is None else _argument("world_size", world_size)
    found, source = None, DEFAULT
    if explicit_rank is None or explicit_world is None:
        for name, lookup in ((TORCH, _from_torch), (ENVIRONMENT, _from_environment), (JAX, _from_jax)):
            found = lookup()
            if found is not None:
                source = name
                break
    discovered_rank, discovered_world = found if found is not None else (0, 1)
    if explicit_rank is not None and explicit_world is not None:
        source = ARGUMENTS
    elif explicit_rank is not None or explicit_world is not None:
        source = f"{ARGUMENTS} + {source}"
    rank = discovered_rank if explicit_rank is None else explicit_rank
    world = discovered_world if explicit_world is None else explicit_world
    if world < 1:
        raise ValueError(f"world_size must be at least 1, got 0 (from {source})")
    if rank >= world:
        raise ValueError(f"rank must be in 0..{world}, got {rank} (from {source})")
    local = _env_int("LOCAL_RANK")
    return Ranks(rank, world, rank if local is None else local, source)


def uneven_batch_message(global_batch: int, world_size: int, source: str, short_cyclic: bool) -> str:
    """Why a global batch cannot be split over the ranks, and what to change.

    Data-parallel steps need the same number of samples on every rank, so a
    remainder is neither padded nor dropped: the caller picks the fix."""
    below = global_batch - global_batch % world_size
    above = below + world_size
    sizes = f"{below} or {above}" if below else f"{above}"
    worlds = [w for w in range(1, min(global_batch, 64) + 1) if global_batch % w == 0]
    head = (
        f"the global batch of {global_batch} samples does not split evenly over world_size {world_size} "
        f"(from {source}): every rank must get the same number of samples per step. "
    )
    if short_cyclic:
        # batch_size does not decide the global batch here: the record count does.
        return head + (
            f"A CYCLIC sampler over fewer records than one batch emits all {global_batch} records per step, "
            f"so the record count (length) must be divisible by world_size {world_size} too: use a dataset of "
            f"{sizes} records, a batch_size of at most {global_batch} that {world_size} divides, or a world "
            f"size that divides {global_batch} ({', '.join(map(str, worlds))})."
        )
    return head + (
        f"Choose a batch_size divisible by {world_size} (e.g. {sizes}), or run on a world size that "
        f"divides {global_batch} ({', '.join(map(str, worlds))})."
    )
