"""The global plan of a cooperative load (``zt.torch.load_sharded``): which
rank fetches which bytes from storage, and which bytes each rank sends to
which peer, computed identically on every rank from the headers alone (no
rank broadcasts a plan, so no rank waits on another to start).

The plan works on rows (ranges of a tensor's first dimension):

* every rank keeps a *box* of each tensor (a start and stop per dimension):
  the whole tensor when it is replicated, its ``torch.chunk`` slice along
  ``dim`` for ``Shard(dim)``, applied mesh dimension after mesh dimension
  as ``DTensor`` does;
* the rows of each tensor are cut where some rank's box starts or stops;
  rows only one rank keeps are fetched by that rank itself (a ``Shard(0)``
  slice is a contiguous run of the file: no exchange at all); rows several
  ranks keep go to a pool, cut into one contiguous run per rank so that
  every rank fetches about the same number of bytes, and then sent to
  whoever keeps them;
* a tensor whose rows cannot be read on their own (compressed, assembled
  from chunks, block-quantized, not stored in C order) is fetched whole by
  the least-loaded rank;
* each rank's fetches are cut into *windows* of a bounded number of bytes
  to send; window ``k`` of every rank is exchanged together, so a rank
  holds at most two windows (the one exchanged and the next, in flight).

Nothing here imports torch: the plan is plain arithmetic over integers,
tested on its own (``tests/test_load_plan.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

#: A tensor's region a rank keeps: ``(start, stop)`` per dimension.
Box = tuple[tuple[int, int], ...]


@dataclasses.dataclass(frozen=True)
class Item:
    """One tensor to load."""

    name: str
    shape: tuple[int, ...]
    #: The element type as delivered (torch's name: "float32", "bfloat16").
    dtype: str
    #: Bytes per element as delivered (a dequantized tensor's float32: 4).
    itemsize: int
    #: Rows can be read on their own: stored raw, in C order, in one run.
    sliceable: bool
    #: Where its bytes lie (file index, offset): fetches run in file order.
    where: tuple[int, int]
    #: Per mesh dimension: None (replicated) or the tensor dimension it is
    #: sharded along.
    placements: tuple[int | None, ...]

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        return self.itemsize * math.prod(self.shape[1:])

    @property
    def nbytes(self) -> int:
        return self.itemsize * math.prod(self.shape)


@dataclasses.dataclass(frozen=True)
class Block:
    """Rows ``[start, stop)`` of item ``item``, fetched by one rank."""

    item: int
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class Piece:
    """Bytes one rank sends another: the part of a fetched block that lies
    in the receiver's box."""

    block: Block
    #: Index into the fetched block's array (rows relative to the block).
    source: tuple[slice, ...]
    #: Index into the receiver's local tensor (relative to its box).
    dest: tuple[slice, ...]
    shape: tuple[int, ...]
    nbytes: int


def chunk(length: int, parts: int, index: int) -> tuple[int, int]:
    """``[start, stop)`` of piece ``index`` when ``torch.chunk`` splits
    ``length`` into ``parts``: pieces of ``ceil(length / parts)``, the last
    ones short or empty."""
    size = -(-length // parts)
    start = min(index * size, length)
    return start, min(start + size, length)


def box_of(item: Item, coord: Sequence[int], mesh_shape: Sequence[int]) -> Box:
    """The region of ``item`` the rank at mesh coordinate ``coord`` keeps."""
    bounds = [[0, n] for n in item.shape]
    for axis, dim in enumerate(item.placements):
        if dim is None:
            continue
        start, stop = bounds[dim]
        lo, hi = chunk(stop - start, mesh_shape[axis], coord[axis])
        bounds[dim] = [start + lo, start + hi]
    return tuple((a, b) for a, b in bounds)


def _empty(box: Box) -> bool:
    return any(a == b for a, b in box)


def _row_range(item: Item, box: Box) -> tuple[int, int]:
    return box[0] if item.shape else (0, 1)


@dataclasses.dataclass
class Plan:
    """Who fetches what, window by window, and who keeps what."""

    items: list[Item]
    #: boxes[i][r]: what rank r keeps of item i.
    boxes: list[list[Box]]
    #: windows[k][r]: the blocks rank r fetches in window k.
    windows: list[list[list[Block]]]

    @property
    def world(self) -> int:
        return len(self.boxes[0]) if self.boxes else 0

    def fetched_bytes(self, rank: int) -> int:
        """Bytes ``rank`` fetches from storage in all."""
        return sum(self.block_bytes(b) for w in self.windows for b in w[rank])

    def block_bytes(self, block: Block) -> int:
        """Bytes of a fetched block."""
        item = self.items[block.item]
        return item.row_bytes * (block.stop - block.start) if item.shape else item.nbytes

    def pieces(self, window: int, sender: int, receiver: int) -> list[Piece]:
        """What ``sender`` sends ``receiver`` in ``window``, in order (both
        sides compute the same list: the receiver unpacks by it)."""
        out = []
        for block in self.windows[window][sender]:
            item = self.items[block.item]
            box = self.boxes[block.item][receiver]
            if _empty(box):
                continue
            if not item.shape:
                out.append(Piece(block, (), (), (), item.itemsize))
                continue
            lo, hi = max(block.start, box[0][0]), min(block.stop, box[0][1])
            if lo >= hi:
                continue
            rest = [slice(a, b) for a, b in box[1:]]
            source = (slice(lo - block.start, hi - block.start), *rest)
            dest = (slice(lo - box[0][0], hi - box[0][0]), *(slice(0, b - a) for a, b in box[1:]))
            shape = (hi - lo, *(b - a for a, b in box[1:]))
            out.append(Piece(block, source, dest, shape, item.itemsize * math.prod(shape)))
        return out


def plan(
    items: list[Item],
    coords: Sequence[Sequence[int]],
    mesh_shape: Sequence[int],
    window_bytes: int,
) -> Plan:
    """The plan for ``items`` over the ranks at ``coords`` (one per rank, in
    rank order) of a mesh of ``mesh_shape``; each rank sends at most about
    ``window_bytes`` per window (a block that cannot be split may exceed it,
    alone in its window)."""
    world = len(coords)
    boxes = [[box_of(item, c, mesh_shape) for c in coords] for item in items]
    keepers = [[r for r in range(world) if not _empty(per_rank[r])] for per_rank in boxes]

    fetch: list[list[Block]] = [[] for _ in range(world)]
    load = [0] * world
    whole: list[int] = []  # items fetched whole by one rank of several keepers
    shared: list[Block] = []  # rows several ranks keep, shared out by bytes
    for i, item in enumerate(items):
        if item.nbytes == 0 or not keepers[i]:
            continue
        if not item.sliceable or not item.shape:
            if len(keepers[i]) == 1:
                fetch[keepers[i][0]].append(Block(i, 0, item.rows))
                load[keepers[i][0]] += item.nbytes
            else:
                whole.append(i)
            continue
        cuts = {0, item.rows}
        for r in keepers[i]:
            cuts.update(boxes[i][r][0])
        edges = sorted(cuts)
        for a, b in zip(edges, edges[1:]):
            need = [r for r in keepers[i] if boxes[i][r][0][0] <= a and b <= boxes[i][r][0][1]]
            if len(need) == 1:
                fetch[need[0]].append(Block(i, a, b))
                load[need[0]] += item.row_bytes * (b - a)
            elif need:
                shared.append(Block(i, a, b))

    # Whole items: largest first, each to the least-loaded rank.
    for i in sorted(whole, key=lambda i: (-items[i].nbytes, i)):
        r = min(range(world), key=lambda r: (load[r], r))
        fetch[r].append(Block(i, 0, items[i].rows))
        load[r] += items[i].nbytes

    # Shared rows: one contiguous run of the pool (in file order) per rank,
    # sized to bring every rank's load to the mean.
    shared.sort(key=lambda b: (items[b.item].where, b.item, b.start))
    pool = sum(items[b.item].row_bytes * (b.stop - b.start) for b in shared)
    if pool:
        target = (sum(load) + pool) // world
        deficit = [max(0, target - x) for x in load]
        if not any(deficit):
            deficit = [1] * world
        shares = [pool * d // sum(deficit) for d in deficit]
        last = max(r for r in range(world) if deficit[r])
        shares[last] += pool - sum(shares)
        _cut_pool(items, shared, shares, fetch)

    for r in range(world):
        fetch[r].sort(key=lambda b: (items[b.item].where, b.item, b.start))
    per_rank = [_windows(items, fetch[r], keepers, r, window_bytes) for r in range(world)]
    count = max((len(w) for w in per_rank), default=0)
    windows = [[w[k] if k < len(w) else [] for w in per_rank] for k in range(count)]
    return Plan(items, boxes, windows)


def _cut_pool(items: list[Item], shared: list[Block], shares: list[int], fetch: list[list[Block]]) -> None:
    """Deal the pool's rows out in order: rank 0 the first ``shares[0]``
    bytes, rank 1 the next, ...; a cut inside a row goes to the row's end
    when more than half of it is before the cut."""
    rank, room = 0, shares[0]
    for block in shared:
        row = items[block.item].row_bytes
        start = block.start
        while start < block.stop:
            while room <= 0 and rank + 1 < len(shares):
                rank += 1
                room += shares[rank]
            rows = block.stop - start if rank + 1 == len(shares) else max(1, (room + row // 2) // row)
            stop = min(block.stop, start + rows)
            fetch[rank].append(Block(block.item, start, stop))
            room -= (stop - start) * row
            start = stop


def _windows(
    items: list[Item], blocks: list[Block], keepers: list[list[int]], rank: int, budget: int
) -> list[list[Block]]:
    """A rank's fetches cut into windows of about ``budget`` bytes to move
    (each block's bytes times the ranks it goes to, itself counted once)."""
    windows: list[list[Block]] = [[]]
    room = budget
    for block in blocks:
        item = items[block.item]
        fan = max(1, len([r for r in keepers[block.item] if r != rank]))
        row = (item.row_bytes if item.shape else item.nbytes) * fan
        start = block.start
        while start < block.stop:
            fits = room // row if row else block.stop - start
            if fits == 0 and windows[-1]:
                windows.append([])
                room = budget
                continue
            if not item.sliceable or not item.shape:
                fits = block.stop - start  # whole: alone if it must
            stop = min(block.stop, start + max(1, fits))
            windows[-1].append(Block(block.item, start, stop))
            room -= (stop - start) * row
            start = stop
    return [w for w in windows if w]
