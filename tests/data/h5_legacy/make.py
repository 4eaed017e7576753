"""HDF5 files in the shapes older libhdf5 releases wrote, which no library
installed today writes, made by rewriting messages of files h5py writes.

    .venv/bin/python tests/data/h5_legacy/make.py

writes `legacy.h5` beside this script (a few KB, committed: zt/tests/h5.rs
and the h5 fuzz target read it). tests/test_h5.py imports this module and
writes the same shapes at test time, each compared with h5py, which reads
them through libhdf5 2.0: every rewrite below produces bytes libhdf5 still
decodes, as the tests check.

The rewrites (HDF5 file format specification, "Data Layout Message" and
"Fill Value Message"; libhdf5's H5Olayout.c and H5Ofill.c decoders):

- Data layout version 1 (HDF5 1.4) and 2 (1.6): dimensionality n, layout
  class, 5 reserved bytes, the address (absent for compact data), then n
  4-byte dimension sizes whose last one is the element size; compact data
  follows as a 4-byte size and the bytes. No separate element-size field
  follows the dimensions, whatever the specification's table suggests:
  libhdf5 never wrote or read one. h5py writes version 3 (class, then for
  chunked data n, the B-tree address and the same n sizes), so the chunk
  B-tree, chunks and filters stay as written and only the message changes.
- Fill value version 1: allocation time, write time, "defined", then a
  4-byte size, always present: the libhdf5 that wrote version 1 stored -1
  (0xFFFFFFFF) there for "no fill value". libhdf5 reads the size as signed
  and only when "defined" is set.
- A 512-byte userblock in the layout MATLAB v7.3 files have: 116 bytes of
  text, an 8-byte subsystem offset, version 0x0200 and the endian mark "IM".

Soft links in old-style (symbol-table) groups need no rewrite: libhdf5
still writes them as symbol table entries of cache type 2 with no object
header, the link value in the group's local heap (`libver="earliest"`).
"""

from __future__ import annotations

import pathlib
import struct
from collections.abc import Callable

import h5py
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent

NIL, FILL, LAYOUT = 0x0000, 0x0005, 0x0008
MATLAB_HEADER = (
    (b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 .").ljust(
        116, b" "
    )
    + b"\x00" * 8
    + struct.pack("<H", 0x0200)
    + b"IM"
)

Message = tuple[int, int, bytes]  # type, flags, body


def header_messages(raw: bytes, at: int) -> tuple[int, list[Message]]:
    """The messages of the version-1 object header at absolute offset `at`
    (16-byte prefix, then 8-byte message headers: type, size, flags), and
    the size of its message area."""
    version, _, _, _, size = struct.unpack_from("<BBHII", raw, at)
    assert version == 1, "a version-1 object header"
    msgs, pos, end = [], at + 16, at + 16 + size
    while pos < end:
        kind, length, flags = struct.unpack_from("<HHB", raw, pos)
        msgs.append((kind, flags, bytes(raw[pos + 8 : pos + 8 + length])))
        pos += 8 + length
    return size, msgs


def rewrite_header(raw: bytearray, at: int, edit: Callable[[list[Message]], list[Message]]) -> None:
    """Replace the messages of the object header at `at` by `edit(messages)`,
    each padded to 8 bytes as version-1 headers align them; the free space
    left (h5py leaves a NIL message of about 130 bytes) becomes one NIL
    message, so a message may grow as long as the header has room."""
    size, msgs = header_messages(raw, at)
    msgs = [m for m in edit(msgs) if m[0] != NIL]
    area = b""
    for kind, flags, body in msgs:
        body = body + bytes(-len(body) % 8)
        area += struct.pack("<HHB3x", kind, len(body), flags) + body
    free = size - len(area)
    assert free == 0 or free >= 8, f"the header has no room ({free} bytes left)"
    if free:
        area += struct.pack("<HHB3x", NIL, free - 8, 0) + bytes(free - 8)
        msgs.append((NIL, 0, b""))
    raw[at + 16 : at + 16 + size] = area
    struct.pack_into("<H", raw, at + 2, len(msgs))


def replace(kind: int, new: Callable[[bytes], bytes]) -> Callable[[list[Message]], list[Message]]:
    """An edit that rewrites the body of the one message of type `kind`."""

    def edit(msgs: list[Message]) -> list[Message]:
        assert [m[0] for m in msgs].count(kind) == 1
        return [(k, f, new(b) if k == kind else b) for k, f, b in msgs]

    return edit


def old_layout(version: int, shape: tuple[int, ...], itemsize: int) -> Callable[[bytes], bytes]:
    """Rewrite a version-3 layout message as version 1 or 2 (see above)."""

    def new(body: bytes) -> bytes:
        assert body[0] == 3
        cls = body[1]
        if cls == 2:  # chunked: n, B-tree address, n sizes (the last: element size)
            n = body[2]
            return struct.pack("<BBB5x", version, n, 2) + body[3 : 11 + 4 * n]
        # Contiguous and compact store the dataset's dimensions and the
        # element size in the n = rank + 1 sizes.
        dims = struct.pack(f"<{len(shape) + 1}I", *shape, itemsize)
        head = struct.pack("<BBB5x", version, len(shape) + 1, cls)
        if cls == 1:  # contiguous: address, then (version 3) an 8-byte size
            return head + body[2:10] + dims
        (size,) = struct.unpack_from("<H", body, 2)  # compact: 2-byte size, data
        return head + dims + struct.pack("<I", size) + body[4 : 4 + size]

    return new


def fill_v1(body: bytes) -> bytes:
    """A version-2 fill value message as version 1: with a value, the same
    fields; without one (h5py writes "defined" with size 0), "not defined"
    and the size -1 that version 1 always carried."""
    assert body[0] == 2
    alloc, when, defined = body[1], body[2], body[3]
    if defined and len(body) >= 8 and struct.unpack_from("<I", body, 4)[0] > 0:
        return b"\x01" + body[1:]
    return struct.pack("<BBBBi", 1, alloc, when, 0, -1)


def fill_v2_minus_one(body: bytes) -> bytes:
    """Version 2, "defined" with the size -1: libhdf5 reads the size as
    signed and keeps no value for it."""
    assert body[0] == 2
    return struct.pack("<BBBBi", 2, body[1], body[2], 1, -1)


def patch(path: pathlib.Path, edits: dict[str, Callable[[list[Message]], list[Message]]]) -> None:
    """Apply `edits` (dataset path -> header edit) to the file at `path`."""
    with h5py.File(path, "r") as f:
        base = f.userblock_size  # object addresses count from the superblock
        where = {name: base + h5py.h5o.get_info(f[name].id).addr for name in edits}
    raw = bytearray(path.read_bytes())
    for name, edit in edits.items():
        rewrite_header(raw, where[name], edit)
    path.write_bytes(bytes(raw))


def compact(f: h5py.File, name: str, data: np.ndarray) -> None:
    space = h5py.h5s.create_simple(data.shape)
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.COMPACT)
    dcpl.set_obj_track_times(False)  # no modification time: the same bytes each run
    ds = h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(data.dtype), space, dcpl=dcpl)
    ds.write(h5py.h5s.ALL, h5py.h5s.ALL, data)


def layouts(f: h5py.File) -> dict[str, Callable[[list[Message]], list[Message]]]:
    """Datasets whose layout messages become versions 1 and 2. Ranks 1 and 3
    give 2 and 4 dimension sizes: messages that end exactly at their 8-byte
    boundary, where a reader expecting an element-size field runs off."""
    gzip = {"compression": "gzip"}
    chunked = {
        "layout1/r1_f4": (1, np.arange(10, dtype="<f4"), (4,), {}),
        "layout1/r2_i2_gzip": (1, np.arange(35, dtype="<i2").reshape(5, 7), (2, 3), {**gzip, "shuffle": True}),
        "layout2/r3_u1": (2, np.arange(60, dtype="u1").reshape(3, 4, 5), (2, 2, 2), {}),
        "layout2/r1_be_f8": (2, np.linspace(-1, 1, 9).astype(">f8"), (4,), gzip),
    }
    edits = {}
    for name, (version, values, chunks, opts) in chunked.items():
        f.create_dataset(name, data=values, chunks=chunks, **opts)
        edits[name] = replace(LAYOUT, old_layout(version, values.shape, values.itemsize))
    # Chunks left unwritten read as the fill value.
    d = f.create_dataset("layout1/partial_i4", shape=(4, 6), dtype="<i4", chunks=(2, 2), fillvalue=-7)
    d[:2, :3] = np.arange(6).reshape(2, 3)
    edits["layout1/partial_i4"] = replace(LAYOUT, old_layout(1, (4, 6), 4))
    f["layout1/contiguous_f4"] = np.arange(12, dtype="<f4").reshape(3, 4)
    edits["layout1/contiguous_f4"] = replace(LAYOUT, old_layout(1, (3, 4), 4))
    compact(f, "layout2/compact_i4", np.arange(6, dtype="<i4") * 3)
    edits["layout2/compact_i4"] = replace(LAYOUT, old_layout(2, (6,), 4))
    return edits


def fills(f: h5py.File) -> dict[str, Callable[[list[Message]], list[Message]]]:
    """Chunked datasets whose fill value messages become version 1 (with and
    without a value) and version 2 with the size -1. Every chunk of the
    ones without a value is written: libhdf5 leaves unwritten elements of
    an undefined fill value uninitialized, so there is nothing to compare."""
    f.create_dataset("fill/v1_undefined", data=np.arange(12, dtype="<f4"), chunks=(4,))
    d = f.create_dataset("fill/v1_value", shape=(12,), dtype="<i4", chunks=(4,), fillvalue=7)
    d[:4] = np.arange(4)
    f.create_dataset("fill/v2_minus_one", data=np.arange(8, dtype="<u2"), chunks=(3,))
    return {
        "fill/v1_undefined": replace(FILL, fill_v1),
        "fill/v1_value": replace(FILL, fill_v1),
        "fill/v2_minus_one": replace(FILL, fill_v2_minus_one),
    }


def soft_links(f: h5py.File) -> None:
    """Soft links in old-style groups: absolute, relative and dangling."""
    f["soft_abs"] = h5py.SoftLink("/layout1/r1_f4")
    f["layout2/soft_rel"] = h5py.SoftLink("r3_u1")
    f["dangling"] = h5py.SoftLink("/nowhere")


def legacy(path: pathlib.Path, userblock: int = 0) -> None:
    """One file with every legacy shape (superblock 0, old-style groups),
    after a MATLAB v7.3-style userblock when `userblock` is 512."""
    with h5py.File(path, "w", libver="earliest", userblock_size=userblock) as f:
        f.attrs["note"] = "legacy shapes"
        edits = layouts(f) | fills(f)
        soft_links(f)
    patch(path, edits)
    if userblock:
        with open(path, "r+b") as fh:
            fh.write(MATLAB_HEADER)


if __name__ == "__main__":
    legacy(HERE / "legacy.h5", userblock=512)
