"""Malicious PyTorch checkpoints, built the way attackers build them.

Payload pickles come from ``pickle.dumps`` of objects whose ``__reduce__``
returns the attack (as exploit kits do), or are assembled opcode by opcode
for the tricks ``pickle.dumps`` never emits (``BUILD`` of ``__setstate__``,
``INST``/``OBJ``, nested pickles, memo bombs). Each payload would create
``marker`` if unpickled by ``pickle.loads`` / ``torch.load(weights_only=False)``.
Nothing here needs torch: the tensor parts are written as the opcodes
``torch.save`` emits.
"""

from __future__ import annotations

import os
import pickle
import pickletools
import struct
import subprocess
import zipfile
import zlib


def s(text: str) -> bytes:
    """BINUNICODE."""
    raw = text.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def g(module: str, name: str) -> bytes:
    """GLOBAL."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def i(v: int) -> bytes:
    """BININT, or LONG1 past 32 bits (as pickle writes numel >= 2**31)."""
    if -(2**31) <= v < 2**31:
        return b"J" + struct.pack("<i", v)
    raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def tensor(numel: int = 4, offset: int = 0, shape=(4,), stride=(1,), legacy: bool = False) -> bytes:
    """``_rebuild_tensor_v2`` over float storage "0", as torch.save writes it
    (legacy persistent ids carry a sixth field, the view metadata)."""
    view = b"N" if legacy else b""
    pid = b"(" + s("storage") + g("torch", "FloatStorage") + s("0") + s("cpu") + i(numel) + view + b"tQ"
    dims = b"(" + b"".join(i(d) for d in shape) + b"t"
    strides = b"(" + b"".join(i(d) for d in stride) + b"t"
    args = b"(" + pid + i(offset) + dims + strides + b"\x89" + g("collections", "OrderedDict") + b")R" + b"t"
    return g("torch._utils", "_rebuild_tensor_v2") + args + b"R"


def reduce_payload(obj, protocol: int = 2) -> bytes:
    """The opcodes ``pickle.dumps`` writes for ``obj``, without the PROTO,
    FRAME and STOP framing, so the snippet can be embedded as one value."""
    raw = pickle.dumps(obj, protocol=protocol)
    ops = list(pickletools.genops(raw))
    out = []
    for k, (opcode, _, pos) in enumerate(ops):
        end = ops[k + 1][2] if k + 1 < len(ops) else len(raw)
        if opcode.name not in ("PROTO", "FRAME", "STOP"):
            out.append(raw[pos:end])
    return b"".join(out)


class Reduce:
    """An object whose unpickling calls ``func(*args)``."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def payloads(marker: str) -> dict[str, tuple[bytes, str]]:
    """name -> (opcodes that push one value, expected outcome "inert" | "error")."""
    q = repr(marker)
    cmd = f"touch {marker}"
    return {
        "os.system via __reduce__": (reduce_payload(Reduce(os.system, cmd)), "inert"),
        "os.system via GLOBAL": (g("os", "system") + b"(" + s(cmd) + b"tR", "inert"),
        "subprocess.Popen via STACK_GLOBAL": (
            reduce_payload(Reduce(subprocess.Popen, ["touch", marker]), protocol=4),
            "inert",
        ),
        "builtins.eval": (reduce_payload(Reduce(eval, f"open({q}, 'w').close()")), "inert"),
        "builtins.exec": (reduce_payload(Reduce(exec, f"import os; os.system({cmd!r})")), "inert"),
        "getattr(__import__('os'), 'system')": (
            g("builtins", "getattr")
            + b"("
            + g("builtins", "__import__")
            + b"("
            + s("os")
            + b"tR"
            + s("system")
            + b"tR("
            + s(cmd)
            + b"tR",
            "inert",
        ),
        # BUILD with a dict sets instance attributes; a second BUILD then
        # calls the instance's __setstate__, which the first one set.
        "BUILD __setstate__": (
            g("argparse", "Namespace") + b")R}" + s("__setstate__") + g("os", "system") + b"sb" + s(cmd) + b"b",
            "inert",
        ),
        "INST": (b"(" + s(cmd) + b"ios\nsystem\n", "inert"),
        "OBJ": (b"(" + g("os", "system") + s(cmd) + b"o", "inert"),
        "nested pickle": (nested_pickle(marker), "inert"),
        "_rebuild_from_type_v2 of os.system": (
            g("torch._tensor", "_rebuild_from_type_v2")
            + b"("
            + g("os", "system")
            + g("builtins", "object")
            + b"("
            + s(cmd)
            + b"t}tR",
            "inert",
        ),
        "storage class os.system": (
            g("torch._utils", "_rebuild_tensor_v2")
            + b"(("
            + s("storage")
            + g("os", "system")
            + s(cmd)
            + s("cpu")
            + i(4)
            + b"tQ"
            + i(0)
            + b"("
            + i(4)
            + b"t("
            + i(1)
            + b"t\x89}tR",
            "error",
        ),
    }


def nested_pickle(marker: str) -> bytes:
    inner = pickle.dumps(Reduce(os.system, f"touch {marker}"), protocol=2)
    return g("pickle", "loads") + b"(C" + bytes([len(inner)]) + inner + b"tR"


def state_dict_with(payload: bytes, legacy: bool = False) -> bytes:
    """{"w": <float tensor of storage 0>, "evil": <payload>}."""
    return b"\x80\x02}(" + s("w") + tensor(legacy=legacy) + s("evil") + payload + b"u."


def bare(payload: bytes) -> bytes:
    """The payload alone, as a whole pickle (the control run's input)."""
    return b"\x80\x02" + payload + b"."


W_BYTES = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)


def zip_checkpoint(path, pickle_bytes: bytes, records: dict[str, bytes] | None = None) -> None:
    """A torch-shaped zip: archive/data.pkl, archive/data/<key>, version, byteorder."""
    records = {"0": W_BYTES} if records is None else records
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle_bytes)
        z.writestr("archive/byteorder", "little")
        for key, data in records.items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", "3\n")


def legacy_checkpoint(path, main_pickle: bytes, keys=("0",), storages=(W_BYTES,), sys_info: bytes | None = None):
    """The legacy stream: magic, protocol, sys_info, object, keys, storages."""
    magic = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
    proto = pickle.dumps(1001, protocol=2)
    info = sys_info or pickle.dumps({"protocol_version": 1001, "little_endian": True}, protocol=2)
    key_list = pickle.dumps(list(keys), protocol=2)
    body = b"".join(struct.pack("<q", len(d) // 4) + d for d in storages)
    path.write_bytes(magic + proto + info + main_pickle + key_list + body)


def memo_doubling(steps: int = 60) -> bytes:
    """A tuple of two references to the previous tuple, `steps` times: a
    few hundred bytes that unpickle to a tree of 2**steps leaves."""
    body = b"]q\x00" + b"h\x00h\x00\x86q\x00" * steps
    return b"\x80\x02}(" + s("w") + tensor() + s("bomb") + body + b"u."


def deep_nesting(depth: int = 100_000) -> bytes:
    """Lists nested `depth` deep (EMPTY_LIST x depth, then APPEND x depth-1)."""
    return b"\x80\x02}(" + s("w") + tensor() + s("deep") + b"]" * depth + b"a" * (depth - 1) + b"u."


def mark_bomb(count: int = 2_000_000) -> bytes:
    return b"\x80\x02" + b"(" * count + b"."


def overlapping_zip(path) -> None:
    """Two records whose bytes overlap: data/1's local header sits inside
    data/0's data (how non-recursive zip bombs reuse bytes)."""
    pkl = state_dict_with(b"N")
    entries = []
    out = bytearray()

    def local(name: str, data: bytes) -> bytes:
        crc = zlib.crc32(data)
        n = name.encode()
        return (
            struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0x21, crc, len(data), len(data), len(n), 0) + n + data
        )

    inner = local("archive/data/1", W_BYTES)
    for name, data in [("archive/data.pkl", pkl), ("archive/data/0", inner + W_BYTES)]:
        entries.append((name, len(out), data))
        out += local(name, data)
    # data/1 points into data/0's data.
    data0_start = entries[1][1] + 30 + len(b"archive/data/0")
    entries.append(("archive/data/1", data0_start, W_BYTES))
    cd = bytearray()
    for name, off, data in entries:
        n = name.encode()
        cd += struct.pack(
            "<IHHHHHHIIIHHHHHII",
            0x02014B50,
            20,
            20,
            0,
            0,
            0,
            0x21,
            zlib.crc32(data),
            len(data),
            len(data),
            len(n),
            0,
            0,
            0,
            0,
            0,
            off,
        )
        cd += n
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(cd), len(out), 0)
    path.write_bytes(bytes(out + cd + end))


def pt_file(path, pickle_bytes: bytes, records=None):
    zip_checkpoint(path, pickle_bytes, records)
    return os.fspath(path)


def stride0_pt(path, dims: int) -> str:
    """A ~600-byte checkpoint: one float stored once, viewed (stride 0) as
    `dims` elements, as `torch.zeros(1).expand(dims)` saves."""
    body = b"\x80\x02}(" + s("w") + tensor(numel=1, shape=(dims,), stride=(0,)) + b"u."
    return pt_file(path, body, {"0": struct.pack("<f", 1.5)})
