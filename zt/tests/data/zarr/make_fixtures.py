"""Write the small zarr stores that zt/tests/zarr.rs reads and mutates
into hostile inputs, with zarr-python (3.1.x, pinned in
requirements-dev.txt) as the writer and the oracle. Run from the
repository root:

    .venv/bin/python zt/tests/data/zarr/make_fixtures.py

`expected.json` holds what zarr-python reads back from each store: every
array in the order `Group.members(max_depth=None)` yields it, its zt dtype
name, shape and C-order little-endian bytes (hex). Each store is a few
kilobytes; the values are deterministic.
"""

import json
import pathlib
import shutil
import warnings

import numcodecs
import numpy as np
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, GzipCodec, ShardingCodec, TransposeCodec, ZstdCodec

HERE = pathlib.Path(__file__).resolve().parent
warnings.filterwarnings("ignore", message=".*Consolidated metadata.*")


def v3_group(path: pathlib.Path) -> None:
    """A consolidated v3 group: zstd chunks with a partial edge and an
    unwritten row of chunks; raw chunks; a sharded array (no index CRC, so
    the test can rewrite its index) with an empty inner chunk; transpose +
    big-endian + gzip + crc32c; an array never written."""
    root = zarr.open_group(str(path), mode="w", zarr_format=3, attributes={"title": "fixture"})
    w = root.create_array("w", shape=(5, 7), chunks=(2, 3), dtype="f4", fill_value=1.5, compressors=ZstdCodec(level=3))
    w[:4] = (np.arange(35, dtype="f4").reshape(5, 7) * 0.5)[:4]
    raw = root.create_array("Raw", shape=(6,), chunks=(4,), dtype="i4", compressors=None)
    raw[...] = np.arange(6, dtype="i4") * -3
    sub = root.create_group("sub")
    s = sub.create_array(
        "s",
        shape=(8,),
        chunks=(8,),
        dtype="u2",
        fill_value=9,
        serializer=ShardingCodec(chunk_shape=(2,), codecs=[BytesCodec()], index_codecs=[BytesCodec()]),
        compressors=None,
    )
    s[:6] = np.arange(6, dtype="u2") * 1000
    t = sub.create_array(
        "t",
        shape=(3, 4),
        chunks=(2, 2),
        dtype="i8",
        filters=[TransposeCodec(order=(1, 0))],
        serializer=BytesCodec(endian="big"),
        compressors=[GzipCodec(level=1), Crc32cCodec()],
    )
    t[...] = np.arange(12, dtype="i8").reshape(3, 4) - 5
    root.create_array("empty", shape=(2, 2), chunks=(1, 2), dtype="f8", fill_value=-0.25)
    zarr.consolidate_metadata(str(path))


def v2_group(path: pathlib.Path) -> None:
    """A v2 group read by listing (no .zmetadata): a big-endian f8 array in
    F order with zlib chunks."""
    root = zarr.open_group(str(path), mode="w", zarr_format=2, attributes={"v": 2})
    a = root.create_array("a", shape=(3, 5), chunks=(2, 2), dtype=">f8", order="F", compressors=numcodecs.Zlib(level=1))
    a[...] = np.arange(15, dtype="f8").reshape(3, 5) / 4
    root.create_group("g").create_array("b", shape=(4,), chunks=(3,), dtype="u1", compressors=None)[...] = [1, 2, 3, 4]


def zt_dtype(dt: np.dtype) -> str:
    return "bool" if dt.kind == "b" else f"{dt.kind}{dt.itemsize * 8}"


def expected(path: pathlib.Path) -> list[dict]:
    group = zarr.open_group(str(path), mode="r")
    out = []
    for name, node in group.members(max_depth=None):
        if not isinstance(node, zarr.Array):
            continue
        data = np.asarray(node[...])
        data = np.ascontiguousarray(data.astype(data.dtype.newbyteorder("<")))
        out.append(
            {"name": name, "dtype": zt_dtype(data.dtype), "shape": list(data.shape), "hex": data.tobytes().hex()}
        )
    return out


def main() -> None:
    stores = {"group.zarr": v3_group, "v2.zarr": v2_group}
    want = {}
    for name, write in stores.items():
        path = HERE / name
        shutil.rmtree(path, ignore_errors=True)
        write(path)
        want[name] = expected(path)
    want["v2.zarr"].sort(key=lambda a: a["name"])  # listed: zarr-python's order is completion order
    (HERE / "expected.json").write_text(json.dumps(want, indent=1) + "\n")


if __name__ == "__main__":
    main()
