"""``zt.torch.load_sharded``: a model load shared by the ranks of a process
group. Every byte the ranks keep is fetched from storage once, by one of
them, and each rank is sent only the slices it keeps.

How (the arithmetic is in ``zt._load_plan``):

1. every rank opens the source (headers only), picks the tensors and their
   placements, and checks with one ``all_gather`` that every rank of the
   group asked for the same thing (the error names the rank that differs).
   From object storage the group's first rank opens it, recording what the
   open fetched (``zt._zt.OpeningsRecording``), and shares those bytes with
   one broadcast; the others open the same source from them
   (``OpeningsReplay``), sending storage no request, pinned to the version
   the first rank opened, so storage serves the headers once;
2. every rank computes the same plan: who fetches which rows, window by
   window;
3. each window: every rank fetches its blocks (on a thread pool, the next
   window's in flight while this one is exchanged), the ranks agree that
   every fetch succeeded (else every rank raises, naming the rank and the
   tensor), then one ``all_to_all_single`` sends each rank exactly the
   bytes of its slices.

A collective that fails (a rank died, the group's timeout passed) raises
:class:`ShardedLoadError` on the ranks still running, naming the ranks
that stopped answering where the group's store can tell.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import fnmatch
import hashlib
import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import _load_plan

#: The most bytes a rank sends per window by default; smaller models get
#: smaller windows (see `_window_for`), so there are always a few and the
#: next window's fetch overlaps this one's exchange.
MAX_WINDOW_BYTES = 64 << 20
#: The fewest windows a default load aims for.
WINDOWS = 4
#: Concurrent fetches per rank (object storage: requests in flight).
DEFAULT_THREADS = 8

# zt's element types a state dict can hold, as torch's.
_TORCH_DTYPES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u64": "uint64",
    "u32": "uint32",
    "u16": "uint16",
    "u8": "uint8",
    "bool": "bool",
    "f8_e4m3fn": "float8_e4m3fn",
    "f8_e5m2": "float8_e5m2",
    "f8_e4m3fnuz": "float8_e4m3fnuz",
    "f8_e5m2fnuz": "float8_e5m2fnuz",
    "f8_e8m0": "float8_e8m0fnu",
    "complex64": "complex64",
    "complex128": "complex128",
}
# Bytes per element of the types wider than one byte.
_ITEMSIZES = {"complex128": 16, "f64": 8, "i64": 8, "u64": 8, "complex64": 8, "f32": 4, "i32": 4, "u32": 4}
_ITEMSIZES.update(dict.fromkeys(("f16", "bf16", "i16", "u16"), 2))
# Same-sized integers the bytes are moved as (numpy and torch agree on them).
_WORDS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64, 16: np.int64}
_TORCH_WORDS = {1: "uint8", 2: "int16", 4: "int32", 8: "int64", 16: "int64"}

# Loads started per group (by its members' global ranks): every member
# counts the same, so a load's store keys are the same on every rank.
_loads: dict[tuple[int, ...], int] = {}


class ShardedLoadError(RuntimeError):
    """A cooperative load failed on some rank; raised on every rank still
    running. ``ranks`` are the group ranks that failed or stopped answering."""

    def __init__(self, message: str, ranks: Sequence[int] = ()):
        super().__init__(message)
        self.ranks = list(ranks)


@dataclasses.dataclass
class LoadStats:
    """What one rank's share of a cooperative load moved."""

    #: Bytes of the loaded tensors as delivered, once: what storage serves
    #: across the group (a tensor stored compressed or block-quantized
    #: counts its delivered size here and below).
    needed_bytes: int = 0
    #: This rank's share of them, read from storage by it.
    fetched_bytes: int = 0
    #: Bytes this rank sent to, and received from, the other ranks.
    sent_bytes: int = 0
    received_bytes: int = 0
    #: Bytes of this rank's own tensors.
    kept_bytes: int = 0
    windows: int = 0
    #: Bytes that came over the network for this process while it opened
    #: the source (headers, indexes: on the group's first rank only, which
    #: opens a remote source for the group), and while it fetched tensors
    #: (``zt.remote_stats()``; 0 for local files).
    header_network_bytes: int = 0
    network_bytes: int = 0
    seconds: float = 0.0


class ShardedStateDict(dict):
    """A rank's state dict, with ``stats`` (:class:`LoadStats`)."""

    stats: LoadStats


@dataclasses.dataclass
class _Group:
    """The ranks loading together, and where each sits on the mesh."""

    group: Any
    rank: int
    world: int
    mesh_shape: tuple[int, ...]
    coords: list[tuple[int, ...]]
    global_ranks: list[int]
    #: This load's keys on the group's store (see _silent_ranks).
    store_prefix: str


def load_sharded(
    path,
    placements: Mapping[str, Any] | None = None,
    *,
    group=None,
    mesh=None,
    device="cpu",
    select=None,
    storage_options: dict | None = None,
    window_bytes: int | None = None,
    threads: int = DEFAULT_THREADS,
) -> ShardedStateDict:
    """This rank's state dict of a model loaded by every rank of ``group``
    together (call it on every rank of the group, with equal arguments).

    ``path``: anything :func:`zt.open` opens (a file, a list, a sharded
    Hugging Face directory or index, a DCP checkpoint; local paths on a
    shared filesystem, or ``s3://`` / ``https://``). ``placements`` maps
    tensor names, or glob patterns (the first that matches, exact names
    before patterns), to ``Replicate()`` or ``Shard(dim)`` (torch's
    ``torch.distributed.tensor`` classes; uneven splits as ``torch.chunk``
    makes them), or with a ``mesh`` to one placement per mesh dimension;
    tensors not named are replicated. ``select``: glob patterns (or one)
    of the tensors to load (default all). ``group``: the process group
    (default the world; a subgroup loads on its own). ``mesh``: a
    ``DeviceMesh`` over the group's ranks; the values are then ``DTensor``
    laid out as ``distribute_tensor`` would lay them. ``device``: where the
    tensors end up. GGUF block-quantized tensors arrive dequantized
    (float32).

    Storage serves each needed byte once across the group: each rank
    fetches a share (``Shard(0)`` slices by their keepers directly) and
    sends every other rank the bytes of its slices, ``window_bytes`` at a
    time (default: a quarter of what a rank sends, at most 64 MiB, so the
    next window's fetch overlaps this one's exchange), ``threads`` fetches
    in flight. The result's ``stats`` says what
    this rank moved. Raises :class:`ShardedLoadError` on every rank when a
    rank's fetch fails or a rank stops answering.
    """
    started = time.perf_counter()
    torch = _torch()
    import zt

    where = _group_of(torch, group, mesh)
    if (window_bytes is not None and window_bytes < 1) or threads < 1:
        raise ValueError("window_bytes and threads must be at least 1")
    patterns = _patterns(select)
    rules = _placement_rules(torch, placements, len(where.mesh_shape))
    network_before = zt.remote_stats().get("bytes_in", 0)
    # A rank that cannot open the source or refuses a tensor still takes
    # part in the next collective, so every rank learns of it.
    source, failure = _open(torch, where, path, storage_options)
    try:
        if source is not None:
            names = [n for n in source if patterns is None or any(fnmatch.fnmatchcase(n, p) for p in patterns)]
            files = {f: i for i, f in enumerate(source.files)}
            tensors = [source[n] for n in names]
            items = [
                _item(t, files, position, _placement_of(t.name, t.shape, rules)) for position, t in enumerate(tensors)
            ]
    except Exception as e:
        failure = e
    opened = zt.remote_stats().get("bytes_in", 0)
    try:
        _agree(torch, where, "opening the source", failure)
        _check_agreement(torch, where, items, source)
        window = window_bytes or _window_for(sum(i.nbytes for i in items), where.world)
        plan = _load_plan.plan(items, where.coords, where.mesh_shape, window)
        stats = LoadStats(needed_bytes=sum(i.nbytes for i in items), windows=len(plan.windows))
        outputs = _allocate(torch, plan, where.rank)
        _run(torch, where, plan, tensors, outputs, stats, threads)
    finally:
        if source is not None:
            source.close()
    state = ShardedStateDict()
    for item, (tensor, _) in zip(items, outputs):
        state[item.name] = _finish(torch, tensor, item, mesh, device)
        stats.kept_bytes += tensor.numel() * tensor.element_size()
    stats.header_network_bytes = opened - network_before
    stats.network_bytes = zt.remote_stats().get("bytes_in", 0) - opened
    stats.seconds = time.perf_counter() - started
    state.stats = stats
    return state


#: The group rank that opens a remote source for the group.
_OPENER = 0


def _is_remote(path) -> bool:
    from . import _zt

    paths = path if isinstance(path, (list, tuple)) else [path]
    return any(isinstance(p, str) and p.startswith(tuple(_zt.URL_SCHEMES)) for p in paths)


def _open(torch, where: _Group, path, storage_options) -> tuple[Any, BaseException | None]:
    """This rank's source, or the error opening it. A source the opener
    names locally (a shared filesystem) is opened by every rank at once; a
    remote one by the opener alone, whose recording of what the open
    fetched the others open from. One broadcast says which, so every rank
    takes the same path. When the opener's open fails the others get
    neither a source nor an error: ``_agree`` then reports the opener's."""
    import zt

    from . import _zt

    def open_here():
        try:
            return zt.open(path, storage_options=storage_options), None
        except Exception as e:
            return None, e

    if where.world == 1:
        return open_here()
    source, failure = None, None
    shared: list = [("open", None)]
    if where.rank == _OPENER and _is_remote(path):
        recording = _zt.OpeningsRecording()
        try:
            source, failure = open_here()
        finally:
            recorded = recording.finish()
        shared[0] = ("replay", recorded) if failure is None else ("failed", None)
    src = where.global_ranks[_OPENER]
    try:
        _collective(
            torch,
            where,
            "sharing the opened headers",
            lambda: torch.distributed.broadcast_object_list(shared, src=src, group=where.group),
        )
    except BaseException:
        if source is not None:
            source.close()
        raise
    how, recorded = shared[0]
    if how == "open":
        return open_here()
    if where.rank == _OPENER:
        return source, failure
    if how == "failed":
        return None, None
    try:
        replay = _zt.OpeningsReplay(recorded)
    except Exception as e:  # reported to every rank by `_agree`
        return None, e
    try:
        return open_here()
    finally:
        replay.close()


def _window_for(needed: int, world: int) -> int:
    """The default window: about a quarter of what one rank sends when
    every rank keeps everything (its share, to ``world - 1`` peers), between
    1 and 64 MiB. With one window nothing overlaps the exchange: the fetch
    and the exchange run in series (measured by `python -m harness --only
    ranks-load`)."""
    sends = needed * max(world - 1, 1) // world
    return min(MAX_WINDOW_BYTES, max(1 << 20, sends // WINDOWS))


def _torch():
    from .torch import _torch as import_torch

    import_torch()  # a clear ImportError without torch
    import torch.distributed

    return torch


def _group_of(torch, group, mesh) -> _Group:
    dist = torch.distributed
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "zt.torch.load_sharded needs an initialised process group (torch.distributed.init_process_group)"
        )
    if mesh is not None:
        mesh_ranks = [int(r) for r in mesh.mesh.flatten().tolist()]
        if group is None:
            group = mesh.get_group() if mesh.ndim == 1 else dist.group.WORLD
        if sorted(mesh_ranks) != sorted(dist.get_process_group_ranks(group)):
            raise ValueError(
                "the mesh's ranks are not the group's: pass group= the process group of exactly the mesh's ranks"
            )
        shape = tuple(int(n) for n in mesh.shape)
        coords: list[tuple[int, ...]] = [()] * len(mesh_ranks)
        for flat, global_rank in enumerate(mesh_ranks):
            coords[dist.get_group_rank(group, global_rank)] = tuple(int(c) for c in np.unravel_index(flat, shape))
    else:
        group = group if group is not None else dist.group.WORLD
        world = dist.get_world_size(group)
        shape = (world,)
        coords = [(r,) for r in range(world)]
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the group it was asked to load with")
    members = tuple(dist.get_process_group_ranks(group))
    _loads[members] = _loads.get(members, 0) + 1
    prefix = f"zt.load_sharded/{'-'.join(map(str, members))}/{_loads[members]}"
    return _Group(group, rank, len(coords), shape, coords, list(members), prefix)


def _patterns(select) -> list[str] | None:
    if select is None:
        return None
    if isinstance(select, str):
        return [select]
    patterns = list(select)
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError("select takes a glob pattern or a list of them")
    return patterns


def _placement_rules(torch, placements, mesh_dims: int) -> list[tuple[str, tuple]]:
    """``(pattern, placements per mesh dimension)``, exact names first."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    rules = []
    for pattern, value in (placements or {}).items():
        if not isinstance(pattern, str):
            raise TypeError(f"placements keys are names or glob patterns, got {pattern!r}")
        value = tuple(value) if isinstance(value, (list, tuple)) else (value,)
        if len(value) != mesh_dims:
            raise ValueError(f"placements[{pattern!r}]: {len(value)} placements for a mesh of {mesh_dims} dimensions")
        for p in value:
            if isinstance(p, _StridedShard) or not isinstance(p, (Replicate, Shard)):
                raise TypeError(f"placements[{pattern!r}]: {p!r}; load_sharded takes Replicate() and Shard(dim)")
        rules.append((pattern, value))
    rules.sort(key=lambda rule: any(c in rule[0] for c in "*?["))
    return rules


def _placement_of(name: str, shape: tuple, rules) -> tuple[int | None, ...]:
    """The tensor dimension each mesh dimension shards (None: replicated)."""
    from torch.distributed.tensor import Shard

    for pattern, value in rules:
        if pattern == name or fnmatch.fnmatchcase(name, pattern):
            dims = []
            for p in value:
                if not isinstance(p, Shard):
                    dims.append(None)
                    continue
                dim = p.dim + len(shape) if p.dim < 0 else p.dim
                if not 0 <= dim < len(shape):
                    raise ValueError(f"{name!r} of shape {tuple(shape)} cannot be Shard({p.dim})")
                dims.append(dim)
            return tuple(dims)
    return (None,) * (len(rules[0][1]) if rules else 1)


def _item(tensor, files: dict, position: int, placements: tuple) -> _load_plan.Item:
    """What the plan needs to know of one tensor, from its header."""
    name, shape = tensor.name, tuple(tensor.shape)
    if tensor.layout.startswith("gguf."):
        dtype, itemsize, sliceable = "float32", 4, False  # dequantized, whole
    elif tensor.layout == "dense" and tensor.dtype in _TORCH_DTYPES:
        dtype, itemsize = _TORCH_DTYPES[tensor.dtype], _ITEMSIZES.get(tensor.dtype, 1)
        sliceable = _rows_readable(tensor, itemsize)
    else:
        raise TypeError(
            f"zt.torch.load_sharded: {name!r} is {tensor.dtype} ({tensor.layout}); it loads whole-byte "
            "numeric tensors and GGUF block-quantized ones (zt.torch.load_file reads the others)"
        )
    location = tensor.location
    where = (files.get(location[0], len(files)), location[1]) if location else (len(files), position)
    if len(placements) == 1 and placements[0] is not None and not shape:
        raise ValueError(f"{name!r} is a scalar and cannot be sharded")
    return _load_plan.Item(name, shape, dtype, itemsize, sliceable, where, placements)


def _rows_readable(tensor, itemsize: int) -> bool:
    """Rows can be fetched alone: one run of raw bytes in C order."""
    shape = tuple(tensor.shape)
    if not shape or len(tensor.parts) != 1 or tensor.location is None:
        return False
    if tensor.location[2] != itemsize * math.prod(shape):
        return False
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(tensor.strides) == tuple(reversed(strides))


def _check_agreement(torch, where: _Group, items, source) -> None:
    """Every rank asked for the same tensors, placements and files: one
    ``all_gather`` of digests; a rank that differs is named."""
    aspects = {
        "the tensors selected": [i.name for i in items],
        "the tensors' shapes and types": [(i.shape, i.dtype) for i in items],
        "the placements": [i.placements for i in items],
        # A replaced object, or a file rewritten between two ranks' opens,
        # has another version: each rank reads only the version it pinned.
        "the files (names and versions)": [source.files, source.versions],
    }
    digests = b"".join(hashlib.sha256(repr(v).encode()).digest() for v in aspects.values())
    mine = torch.frombuffer(bytearray(digests), dtype=torch.uint8)
    every = [torch.empty_like(mine) for _ in range(where.world)]
    _collective(torch, where, "checking that the ranks agree", lambda: _all_gather(torch, every, mine, where))
    for rank, theirs in enumerate(every):
        if rank == where.rank or bytes(theirs.tolist()) == digests:
            continue
        differs = [
            what
            for k, what in enumerate(aspects)
            if theirs[32 * k : 32 * (k + 1)].tolist() != list(digests[32 * k : 32 * (k + 1)])
        ]
        raise ShardedLoadError(
            f"zt.torch.load_sharded: group rank {rank} (global rank {where.global_ranks[rank]}) asked for "
            f"something else than rank {where.rank}: {', '.join(differs)} differ; every rank must pass the same "
            "path, select and placements",
            [rank],
        )


def _all_gather(torch, out, tensor, where: _Group):
    buffers = [t.to(_comm_device(torch, where)) for t in out]
    torch.distributed.all_gather(buffers, tensor.to(_comm_device(torch, where)), group=where.group)
    for dst, src in zip(out, buffers):
        dst.copy_(src)


def _comm_device(torch, where: _Group):
    """NCCL moves CUDA tensors only; every other backend, CPU ones. (The
    NCCL path is written, and not yet run on a GPU here.)"""
    backend = torch.distributed.get_backend(where.group)
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def _allocate(torch, plan: _load_plan.Plan, rank: int) -> list:
    """This rank's tensors (its box of each), and their bytes as numpy
    integer arrays the exchange writes into."""
    out = []
    for item, boxes in zip(plan.items, plan.boxes):
        shape = tuple(b - a for a, b in boxes[rank])
        tensor = torch.empty(shape, dtype=getattr(torch, item.dtype))
        out.append((tensor, _words_of_tensor(torch, tensor, item.itemsize)))
    return out


def _words_of_tensor(torch, tensor, itemsize: int) -> np.ndarray:
    """A tensor's bytes as a writable numpy array of same-sized integers
    (16-byte elements as pairs of int64, on a last axis of 2)."""
    words = tensor.reshape(-1).view(getattr(torch, _TORCH_WORDS[itemsize])).numpy()
    return words.reshape(tuple(tensor.shape) + ((2,) if itemsize == 16 else ()))


def _words_of_array(arr: np.ndarray, itemsize: int, shape: tuple) -> np.ndarray:
    arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr.reshape(-1).view(_WORDS[itemsize]).reshape(shape + ((2,) if itemsize == 16 else ()))


def _fetch(tensor, item: _load_plan.Item, block: _load_plan.Block) -> np.ndarray:
    """The block's rows, read from storage, as an integer array."""
    rows = (block.stop - block.start, *item.shape[1:]) if item.shape else ()
    if not item.sliceable:
        arr = tensor.dequantize() if tensor.layout.startswith("gguf.") else tensor.numpy()
        return _words_of_array(arr, item.itemsize, tuple(item.shape))
    if tensor.caps["map"]:
        arr = tensor.numpy()[block.start : block.stop]
    else:
        starts = [block.start] + [0] * (len(item.shape) - 1)
        arr = np.asarray(tensor._native._read_selection(starts, list(rows), [1] * len(rows)))
    return _words_of_array(arr, item.itemsize, rows)


def _run(torch, where: _Group, plan: _load_plan.Plan, tensors, outputs, stats: LoadStats, threads: int) -> None:
    """Fetch and exchange, window by window, the next window's fetch in
    flight while this one is exchanged."""
    me = where.rank
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="zt-load") as pool:

        def start(k: int):
            blocks = plan.windows[k][me] if k < len(plan.windows) else []
            return [(b, pool.submit(_fetch, tensors[b.item], plan.items[b.item], b)) for b in blocks]

        pending = start(0)
        for k in range(len(plan.windows)):
            fetched, failure = {}, None
            for block, future in pending:
                try:
                    fetched[block] = future.result()
                except Exception as e:  # reported to every rank below
                    failure = failure or f"{plan.items[block.item].name!r}: {type(e).__name__}: {e}"
            pending = start(k + 1) if failure is None else []
            _agree(torch, where, f"reading window {k} from storage", failure)
            stats.fetched_bytes += sum(plan.block_bytes(b) for b in fetched)
            _exchange(torch, where, plan, k, fetched, outputs, stats)
            del fetched


def _agree(torch, where: _Group, what: str, failure: BaseException | str | None) -> None:
    """Every rank learns whether every rank's step ``what`` worked; if one
    failed, all raise with its message (the failing rank from its error)."""
    flags = torch.tensor([0 if failure is None else 1], dtype=torch.int32)
    every = [torch.empty_like(flags) for _ in range(where.world)]
    _collective(torch, where, what, lambda: _all_gather(torch, every, flags, where))
    failed = [r for r, f in enumerate(every) if int(f)]
    if not failed:
        return
    mine = None if failure is None else failure if isinstance(failure, str) else f"{type(failure).__name__}: {failure}"
    messages: list = [None] * where.world
    _collective(torch, where, what, lambda: torch.distributed.all_gather_object(messages, mine, group=where.group))
    detail = "; ".join(f"rank {r}: {messages[r]}" for r in failed)
    error = ShardedLoadError(f"zt.torch.load_sharded: {what} failed on {detail}", failed)
    if isinstance(failure, BaseException):
        raise error from failure
    raise error


def _exchange(torch, where: _Group, plan, window: int, fetched: dict, outputs, stats: LoadStats) -> None:
    """Send every rank the bytes of its slices from this window's blocks;
    receive ours; copy our own directly."""
    me, world = where.rank, where.world
    for piece in plan.pieces(window, me, me):
        outputs[piece.block.item][1][piece.dest] = fetched[piece.block][piece.source]
    if world == 1:
        return
    sends = [[] if p == me else plan.pieces(window, me, p) for p in range(world)]
    receives = [[] if s == me else plan.pieces(window, s, me) for s in range(world)]
    send_sizes = [sum(piece.nbytes for piece in pieces) for pieces in sends]
    recv_sizes = [sum(piece.nbytes for piece in pieces) for pieces in receives]
    send = np.empty(sum(send_sizes), dtype=np.uint8)
    at = 0
    for piece in itertools.chain.from_iterable(sends):
        _region(send, at, piece)[...] = fetched[piece.block][piece.source]
        at += piece.nbytes
    recv = np.empty(sum(recv_sizes), dtype=np.uint8)
    device = _comm_device(torch, where)
    send_t, recv_t = torch.from_numpy(send).to(device), torch.from_numpy(recv).to(device)
    _collective(
        torch,
        where,
        f"window {window}",
        lambda: torch.distributed.all_to_all_single(recv_t, send_t, recv_sizes, send_sizes, group=where.group),
    )
    if recv_t.device.type != "cpu":
        recv = recv_t.cpu().numpy()
    at = 0
    for piece in itertools.chain.from_iterable(receives):
        outputs[piece.block.item][1][piece.dest] = _region(recv, at, piece)
        at += piece.nbytes
    stats.sent_bytes += int(sum(send_sizes))
    stats.received_bytes += int(sum(recv_sizes))


def _region(buffer: np.ndarray, at: int, piece) -> np.ndarray:
    """A piece's place in a send or receive buffer, as its integer array."""
    itemsize = piece.nbytes // math.prod(piece.shape)
    words = buffer[at : at + piece.nbytes].view(_WORDS[itemsize])
    return words.reshape(piece.shape + ((2,) if itemsize == 16 else ()))


def _collective(torch, where: _Group, what: str, call) -> None:
    """Run a collective; when it fails (a peer died, the group timed out),
    raise a ShardedLoadError naming the ranks that stopped answering."""
    try:
        call()
    except ShardedLoadError:
        raise
    except Exception as e:
        silent = _silent_ranks(torch, where)
        who = (
            f"rank(s) {', '.join(map(str, silent))} stopped answering"
            if silent
            else "a rank stopped answering or failed"
        )
        raise ShardedLoadError(
            f"zt.torch.load_sharded: {who} ({what}, seen by rank {where.rank}): {type(e).__name__}: {e}",
            silent,
        ) from e


def _silent_ranks(torch, where: _Group, grace: float = 5.0) -> list[int]:
    """The group ranks that do not check in on the group's store within
    ``grace`` seconds of this rank's failure (each rank that sees the
    failure checks in). Empty when the store cannot tell."""
    try:
        store = torch.distributed.distributed_c10d._get_default_store()
    except Exception:
        return []

    def key(r: int) -> str:
        return f"{where.store_prefix}/alive/{where.global_ranks[r]}"

    try:
        store.set(key(where.rank), "1")
    except Exception:
        return []
    silent, deadline = [], time.monotonic() + grace
    for r in range(where.world):
        if r == where.rank:
            continue
        left = max(0.05, deadline - time.monotonic())
        try:
            store.wait([key(r)], datetime.timedelta(seconds=left))
        except Exception:
            silent.append(r)
    return silent


def _finish(torch, tensor, item, mesh, device):
    """This rank's tensor as handed out: moved to ``device``, and with a
    mesh a ``DTensor`` of the global shape (C-order strides)."""
    if mesh is not None:
        from torch.distributed.tensor import DTensor, Replicate, Shard

        placements = tuple(Replicate() if d is None else Shard(d) for d in item.placements)
        stride, step = [], 1
        for n in reversed(item.shape):
            stride.append(step)
            step *= n
        tensor = tensor.to(device)
        return DTensor.from_local(
            tensor, mesh, placements, run_check=False, shape=torch.Size(item.shape), stride=tuple(reversed(stride))
        )
    return tensor.to(device) if str(device) != "cpu" else tensor
