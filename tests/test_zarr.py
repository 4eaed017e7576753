"""zarr stores written by zarr-python (3.1, pinned in requirements-dev.txt)
at test time, read through zt (which does not use zarr) and compared bit
for bit with what zarr-python reads: every array of the hierarchy, its
name (the array path without a leading "/"), shape, dtype and bytes."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct
import subprocess
import warnings

import numpy as np
import pytest

import zt

zarr = pytest.importorskip("zarr")
from zarr.codecs import (  # noqa: E402
    BytesCodec,
    Crc32cCodec,
    GzipCodec,
    ShardingCodec,
    ShardingCodecIndexLocation,
    TransposeCodec,
    ZstdCodec,
)

warnings.filterwarnings("ignore", message=".*Consolidated metadata.*")
RNG = np.random.default_rng(42)
DTYPES = ["bool", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]


def sample(dtype, shape) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return RNG.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        native = dt.newbyteorder("=")
        return RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=native).astype(dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    return RNG.standard_normal(shape).astype(dt)


def zarr_arrays(node, prefix="") -> dict:
    """Every array under a zarr group (or the array itself), by path."""
    if isinstance(node, zarr.Array):
        return {prefix: node}
    out = {}
    for name, member in node.members():
        path = f"{prefix}/{name}" if prefix else name
        out.update(zarr_arrays(member, path))
    return out


def assert_matches_zarr(path, expect=None) -> zt.Source:
    """zt reads every array of the store exactly as zarr-python does."""
    node = zarr.open(str(path), mode="r")
    want = zarr_arrays(node)
    if expect is not None:
        assert sorted(want) == sorted(expect)
    src = zt.open(path)
    assert src.format == "zarr"
    assert sorted(src.keys()) == sorted(want)
    for name, arr in want.items():
        data = np.asarray(arr[...])
        data = data.astype(data.dtype.newbyteorder("="))
        got = src[name].numpy()
        assert got.dtype == data.dtype, name
        assert got.shape == data.shape, name
        assert got.tobytes() == data.tobytes(), name
    return src


def write_v3(path, data, *, chunks, fill_value=None, written=None, **kw):
    """A v3 array at `path` holding `data` (only the box `written` if given)."""
    arr = zarr.create_array(
        str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, fill_value=fill_value, zarr_format=3, **kw
    )
    arr[written if written is not None else ...] = data[written if written is not None else ...]
    return arr


CODECS = {
    "raw": dict(compressors=None),
    "big-endian": dict(compressors=None, serializer=BytesCodec(endian="big")),
    "transpose": dict(compressors=None, filters=[TransposeCodec(order=(1, 0, 2))]),
    "zstd": dict(compressors=ZstdCodec(level=3)),
    "zstd-checksum": dict(compressors=ZstdCodec(level=1, checksum=True)),
    "gzip": dict(compressors=GzipCodec(level=5)),
    "crc32c": dict(compressors=Crc32cCodec()),
    "zstd+crc32c": dict(compressors=[ZstdCodec(level=1), Crc32cCodec()]),
    "transpose+be+gzip+crc32c": dict(
        filters=[TransposeCodec(order=(2, 0, 1))],
        serializer=BytesCodec(endian="big"),
        compressors=[GzipCodec(level=1), Crc32cCodec()],
    ),
}


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_v3_codecs_and_dtypes_bit_for_bit(tmp_path, codec, dtype):
    data = sample(dtype, (5, 7, 3))
    # Ragged edge chunks in every dimension, one chunk never written.
    write_v3(tmp_path / "a.zarr", data, chunks=(2, 3, 2), written=np.s_[:4, :, :], **CODECS[codec])
    src = assert_matches_zarr(tmp_path / "a.zarr", [""])
    assert src[""].numpy().shape == (5, 7, 3)


SHARDS = {
    "default": dict(shards=(4, 6, 3), compressors=ZstdCodec(level=1)),
    "raw-inner": dict(shards=(4, 6, 3), compressors=None),
    "index-start": dict(
        serializer=ShardingCodec(
            chunk_shape=(2, 3, 3),
            codecs=[BytesCodec(endian="big"), GzipCodec(level=1)],
            index_location=ShardingCodecIndexLocation.start,
        ),
        compressors=None,
        chunks=(4, 6, 3),
    ),
    "transpose-inner": dict(
        serializer=ShardingCodec(
            chunk_shape=(2, 3, 3),
            codecs=[TransposeCodec(order=(2, 1, 0)), BytesCodec(), Crc32cCodec()],
            index_codecs=[BytesCodec(endian="big")],
        ),
        compressors=None,
        chunks=(4, 6, 3),
    ),
}


@pytest.mark.parametrize("shard", sorted(SHARDS))
@pytest.mark.parametrize("dtype", ["bool", "i2", "u8", "f2", "f4", "c16"])
def test_v3_sharding_bit_for_bit(tmp_path, shard, dtype):
    kw = dict(SHARDS[shard])
    chunks = kw.pop("chunks", (2, 3, 3))
    data = sample(dtype, (9, 7, 3))
    # A written box that leaves whole shards and inner chunks empty.
    write_v3(
        tmp_path / "s.zarr",
        data,
        chunks=chunks,
        written=np.s_[:5, 2:, :],
        fill_value=1 if dtype != "bool" else True,
        **kw,
    )
    assert_matches_zarr(tmp_path / "s.zarr", [""])


def test_a_slice_reads_only_the_chunks_it_spans(tmp_path):
    data = sample("f4", (64, 32))
    write_v3(tmp_path / "a.zarr", data, chunks=(8, 32), shards=(32, 32), compressors=ZstdCodec(level=1))
    # Damage every inner chunk of the second shard: a slice of the first
    # still reads, the whole array does not.
    shard = tmp_path / "a.zarr" / "c" / "1" / "0"
    raw = bytearray(shard.read_bytes())
    raw[:16] = b"\xff" * 16
    shard.write_bytes(bytes(raw))
    with zt.safe_open(tmp_path / "a.zarr" / "zarr.json", framework="numpy") as f:
        got = f.get_slice("")[3:20]
    np.testing.assert_array_equal(got, data[3:20])
    with pytest.raises(zt.FormatError):
        zt.open(tmp_path / "a.zarr")[""].numpy()


@pytest.mark.parametrize(
    "layout",
    [
        dict(chunks=(3, 5), compressors=ZstdCodec(level=1)),
        dict(chunks=(3, 5), compressors=None, filters=[TransposeCodec(order=(1, 0))]),
        dict(chunks=(4, 10), shards=(12, 20), compressors=GzipCodec(level=1)),
    ],
    ids=["zstd", "transpose", "sharded"],
)
def test_many_chunks_decode_together_bit_for_bit(tmp_path, layout):
    # Hundreds of chunks decoded on the pool at once into one buffer: edge
    # chunks partial in both dimensions, chunks (and inner chunks, whole
    # shards) never written left as the fill value, and row ranges that
    # start and end inside chunks.
    data = sample("f8", (67, 83))
    kw = dict(layout)
    chunks = kw.pop("chunks")
    arr = write_v3(tmp_path / "m.zarr", data, chunks=chunks, fill_value=-7.25, written=np.s_[5:50, 11:70], **kw)
    arr[60:, :] = data[60:, :]
    assert sum(p.is_file() for p in (tmp_path / "m.zarr" / "c").rglob("*")) > 20
    src = assert_matches_zarr(tmp_path / "m.zarr", [""])
    whole = np.asarray(zarr.open_array(str(tmp_path / "m.zarr"), mode="r")[...])
    assert (whole == -7.25).any() and (whole != -7.25).any()
    with zt.safe_open(tmp_path / "m.zarr" / "zarr.json", framework="numpy") as f:
        for a, b in [(0, 67), (1, 2), (4, 61), (49, 67), (66, 67)]:
            got = f.get_slice("")[a:b]
            assert got.tobytes() == whole[a:b].tobytes(), (a, b)
    assert src[""].numpy().tobytes() == whole.tobytes()


@pytest.mark.parametrize(
    "fill",
    [0.0, -2.5, float("nan"), float("inf"), float("-inf"), "0x7fc00001"],
)
@pytest.mark.parametrize("dtype", ["f2", "f4", "f8"])
def test_v3_fill_values(tmp_path, dtype, fill):
    if isinstance(fill, str):
        fill = {"f2": "0x7e01", "f4": "0x7fc00001", "f8": "0x7ff8000000000001"}[dtype]
        fill = np.frombuffer(bytes.fromhex(fill[2:])[::-1], dtype=dtype)[0]
    arr = zarr.create_array(str(tmp_path / "f.zarr"), shape=(5, 3), chunks=(2, 3), dtype=dtype, fill_value=fill)
    arr[:2] = 1
    assert_matches_zarr(tmp_path / "f.zarr")


def test_v3_complex_bool_and_int_fill_values(tmp_path):
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    g.create_array("c", shape=(3,), chunks=(2,), dtype="c8", fill_value=1 + 2j)
    g.create_array("b", shape=(3,), chunks=(2,), dtype="bool", fill_value=True)
    g.create_array("i", shape=(3,), chunks=(2,), dtype="i8", fill_value=-(2**62))
    g.create_array("u", shape=(3,), chunks=(2,), dtype="u8", fill_value=2**64 - 1)
    assert_matches_zarr(tmp_path / "g.zarr", ["c", "b", "i", "u"])


@pytest.mark.parametrize("consolidated", [False, True])
def test_v3_group_hierarchy(tmp_path, consolidated):
    root = zarr.open_group(str(tmp_path / "h.zarr"), mode="w", zarr_format=3, attributes={"title": "t"})
    root.create_group("empty")
    model = root.create_group("model")
    layer = model.create_group("layer.0")
    expect = {}
    for i, (where, name, shape) in enumerate(
        [(root, "scalar", ()), (model, "w", (4, 6)), (layer, "b", (6,)), (layer, "zero", (0, 3))]
    ):
        data = sample("f4", shape)
        arr = where.create_array(
            name, shape=shape, chunks=shape if 0 in shape else "auto", dtype="f4", attributes={"i": i}
        )
        arr[...] = data
        expect[arr.path] = data
    if consolidated:
        zarr.consolidate_metadata(str(tmp_path / "h.zarr"))
    src = assert_matches_zarr(tmp_path / "h.zarr", list(expect))
    assert sorted(src.keys()) == ["model/layer.0/b", "model/layer.0/zero", "model/w", "scalar"]
    assert src.attributes["title"] == "t"
    # The directory, its zarr.json and (consolidated) the same tensors.
    assert sorted(zt.open(tmp_path / "h.zarr" / "zarr.json").keys()) == sorted(expect)
    assert zt.detect(tmp_path / "h.zarr") == "zarr"


def zarr_order(path) -> list[str]:
    """zarr-python's arrays, in the order it yields them (depth first)."""
    group = zarr.open_group(str(path), mode="r")
    return [name for name, node in group.members(max_depth=None) if isinstance(node, zarr.Array)]


def reorder_consolidated(path, fmt, order):
    """Rewrite the consolidated metadata's keys in `order` (node paths)."""
    meta_path = path / ("zarr.json" if fmt == 3 else ".zmetadata")
    meta = json.loads(meta_path.read_text())
    table = meta["consolidated_metadata"]["metadata"] if fmt == 3 else meta["metadata"]
    node = (lambda k: k) if fmt == 3 else (lambda k: k.rsplit("/.", 1)[0] if "/." in k else "")
    keys = sorted(table, key=lambda k: order.index(node(k)) if node(k) in order else -1)
    rebuilt = {k: table[k] for k in keys}
    if fmt == 3:
        meta["consolidated_metadata"]["metadata"] = rebuilt
    else:
        meta["metadata"] = rebuilt
    meta_path.write_text(json.dumps(meta))


@pytest.mark.parametrize("fmt", [3, 2])
@pytest.mark.parametrize("consolidated", [True, False])
def test_member_order_is_zarrs(tmp_path, fmt, consolidated):
    path = tmp_path / "o.zarr"
    root = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    for name in ["zeta", "a10", "B", "alpha", "a9", "mid", "Straße"]:
        root.create_array(name, shape=(2,), dtype="i2")[...] = 7
    sub = root.create_group("sub")
    for name in ["y", "X", "z"]:
        sub.create_array(name, shape=(1,), dtype="f4")[...] = 1
    if consolidated:
        zarr.consolidate_metadata(str(path))
        # zarr writes its keys case-folded in order; a store written by
        # another tool holds them in its own, which zarr-python follows.
        assert list(zt.open(path)) == zarr_order(path)
        reorder_consolidated(
            path, fmt, ["mid", "sub/z", "zeta", "sub", "B", "sub/y", "a9", "Straße", "a10", "alpha", "sub/X"]
        )
        want = zarr_order(path)
        assert want[:4] == ["mid", "zeta", "sub/z", "sub/y"]
    else:
        # Listed members come in no order of zarr's (as their reads
        # complete): zt lists them as zarr.consolidate_metadata writes them.
        copy = tmp_path / "copy.zarr"
        shutil.copytree(path, copy)
        zarr.consolidate_metadata(str(copy))
        want = zarr_order(copy)
    assert list(zt.open(path).keys()) == want
    assert_matches_zarr(path, want)


@pytest.mark.parametrize(
    "encoding",
    [{"name": "default", "separator": "."}, {"name": "v2", "separator": "/"}, {"name": "v2", "separator": "."}],
)
def test_v3_chunk_key_encodings(tmp_path, encoding):
    data = sample("i4", (5, 4))
    arr = zarr.create_array(
        str(tmp_path / "k.zarr"), shape=data.shape, chunks=(2, 2), dtype="i4", chunk_key_encoding=encoding
    )
    arr[...] = data
    assert_matches_zarr(tmp_path / "k.zarr")


def test_one_raw_chunk_is_a_view_of_its_file(tmp_path):
    data = sample("f4", (16, 8))
    write_v3(tmp_path / "v.zarr", data, chunks=(16, 8), compressors=None)
    t = zt.open(tmp_path / "v.zarr")[""]
    arr = t.numpy()
    np.testing.assert_array_equal(arr, data)
    assert not arr.flags.owndata


# ---------------------------------------------------------------- v2


@pytest.mark.parametrize("compressor", [None, "zstd", "zlib", "gzip"])
@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["|b1", "<i2", ">i4", "<u8", ">f2", "<f4", ">f8", "<c8", ">c16"])
def test_v2_bit_for_bit(tmp_path, dtype, order, compressor):
    import numcodecs

    comp = {
        None: None,
        "zstd": numcodecs.Zstd(level=1),
        "zlib": numcodecs.Zlib(level=1),
        "gzip": numcodecs.GZip(level=1),
    }[compressor]
    data = sample(dtype, (5, 7))
    arr = zarr.create_array(
        str(tmp_path / "a.zarr"),
        shape=data.shape,
        chunks=(2, 3),
        dtype=dtype,
        zarr_format=2,
        order=order,
        compressors=comp,
        fill_value=None if dtype[1] == "b" else 3,
    )
    arr[:4] = data[:4]
    assert json.loads((tmp_path / "a.zarr" / ".zarray").read_text())["order"] == order
    assert_matches_zarr(tmp_path / "a.zarr", [""])


@pytest.mark.parametrize("separator", [".", "/"])
@pytest.mark.parametrize("consolidated", [False, True])
def test_v2_groups_separators_and_fill(tmp_path, separator, consolidated):
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=2, attributes={"a": 1})
    sub = root.create_group("sub")
    enc = {"name": "v2", "separator": separator}
    x = root.create_array(
        "x", shape=(5, 5), chunks=(2, 2), dtype="f8", fill_value=np.nan, chunk_key_encoding=enc, compressors=None
    )
    x[:3, :3] = sample("f8", (3, 3))
    y = sub.create_array(
        "y", shape=(4,), chunks=(3,), dtype="i8", fill_value=None, compressors=None, chunk_key_encoding=enc
    )
    y[:3] = [1, 2, 3]
    if consolidated:
        zarr.consolidate_metadata(str(tmp_path / "g.zarr"))
    src = assert_matches_zarr(tmp_path / "g.zarr", ["x", "sub/y"])
    assert src.attributes["a"] == 1


# ------------------------------------------------------- hostile stores


def refused(path, rule, read=True):
    """Opening (and reading every array of) `path` fails citing `rule`."""
    with pytest.raises(zt.FormatError) as e:
        src = zt.open(path)
        if read:
            for name in src:
                src[name].numpy()
    assert e.value.rule == rule, e.value
    return e.value


def test_hostile_chunk_shorter_than_it_should_be(tmp_path):
    write_v3(tmp_path / "a.zarr", sample("f4", (4, 4)), chunks=(2, 2), compressors=None)
    chunk = tmp_path / "a.zarr" / "c" / "1" / "1"
    chunk.write_bytes(chunk.read_bytes()[:-1])
    refused(tmp_path / "a.zarr", "zarr.Chunk")


def test_hostile_crc32c_mismatch(tmp_path):
    write_v3(tmp_path / "a.zarr", sample("f4", (4, 4)), chunks=(2, 2), compressors=Crc32cCodec())
    chunk = tmp_path / "a.zarr" / "c" / "0" / "1"
    raw = bytearray(chunk.read_bytes())
    raw[0] ^= 1
    chunk.write_bytes(bytes(raw))
    refused(tmp_path / "a.zarr", "zarr.Checksum")


def test_hostile_the_first_bad_chunk_in_c_order_is_reported(tmp_path):
    # Chunks decode at once on the pool; of two bad chunks the error is
    # always the earlier one's, whichever fails first.
    write_v3(tmp_path / "a.zarr", sample("f4", (32, 32)), chunks=(2, 2), compressors=Crc32cCodec())
    flipped = tmp_path / "a.zarr" / "c" / "3" / "9"
    raw = bytearray(flipped.read_bytes())
    raw[0] ^= 1
    flipped.write_bytes(bytes(raw))
    short = tmp_path / "a.zarr" / "c" / "12" / "0"
    short.write_bytes(b"\0\0")
    for _ in range(5):
        assert "c/3/9" in str(refused(tmp_path / "a.zarr", "zarr.Checksum"))
    short.rename(tmp_path / "a.zarr" / "c" / "0" / "5")
    for _ in range(5):
        assert "c/0/5" in str(refused(tmp_path / "a.zarr", "zarr.Chunk"))


def sharded(tmp_path, crc=True):
    index = [BytesCodec(), Crc32cCodec()] if crc else [BytesCodec()]
    write_v3(
        tmp_path / "s.zarr",
        sample("u2", (8,)),
        chunks=(8,),
        serializer=ShardingCodec(chunk_shape=(2,), codecs=[BytesCodec()], index_codecs=index),
        compressors=None,
    )
    return tmp_path / "s.zarr" / "c" / "0"


def patch_index(shard: pathlib.Path, entries):
    """Rewrite a raw (no crc) end index of 4 inner chunks."""
    raw = bytearray(shard.read_bytes())
    index = b"".join(struct.pack("<QQ", o, n) for o, n in entries)
    raw[-len(index) :] = index
    shard.write_bytes(bytes(raw))


def test_hostile_shard_index_out_of_range(tmp_path, zt_cli):
    shard = sharded(tmp_path, crc=False)
    patch_index(shard, [(0, 4), (4, 4), (8, 4), (12, 1 << 40)])
    refused(tmp_path / "s.zarr", "zarr.Shard")
    # The CLI names the rule too (reading the chunks: a conversion).
    out = subprocess.run([zt_cli, "convert", tmp_path / "s.zarr", tmp_path / "s.npz"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("zt: error [zarr.Shard]: "), out.stderr
    assert not (tmp_path / "s.npz").exists()


def test_hostile_shard_index_overlapping(tmp_path):
    shard = sharded(tmp_path, crc=False)
    patch_index(shard, [(0, 4), (2, 4), (8, 4), (12, 4)])
    refused(tmp_path / "s.zarr", "zarr.Shard")


def test_hostile_shard_index_over_the_index(tmp_path):
    shard = sharded(tmp_path, crc=False)
    patch_index(shard, [(0, 4), (4, 4), (8, 4), (16, 4)])
    refused(tmp_path / "s.zarr", "zarr.Shard")


def test_hostile_shard_shorter_than_its_index(tmp_path):
    shard = sharded(tmp_path)
    shard.write_bytes(shard.read_bytes()[-30:])
    refused(tmp_path / "s.zarr", "zarr.Shard")


def test_hostile_shard_index_crc(tmp_path):
    shard = sharded(tmp_path)
    raw = bytearray(shard.read_bytes())
    raw[-10] ^= 0x40
    shard.write_bytes(bytes(raw))
    refused(tmp_path / "s.zarr", "zarr.Checksum")


def patch_meta(path: pathlib.Path, **fields):
    meta = json.loads(path.read_text())
    meta.update(fields)
    path.write_text(json.dumps(meta))


def test_hostile_lying_shapes(tmp_path):
    write_v3(tmp_path / "a.zarr", sample("f4", (4, 4)), chunks=(2, 2), compressors=None)
    meta = tmp_path / "a.zarr" / "zarr.json"
    # A chunk shape of another rank, a zero chunk size, a shape past u64.
    patch_meta(meta, chunk_grid={"name": "regular", "configuration": {"chunk_shape": [2]}})
    refused(tmp_path / "a.zarr", "zarr.Meta")
    patch_meta(meta, chunk_grid={"name": "regular", "configuration": {"chunk_shape": [2, 0]}})
    refused(tmp_path / "a.zarr", "zarr.Meta")
    patch_meta(
        meta,
        shape=[2**62, 2**62],
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": [2, 2]}},
    )
    refused(tmp_path / "a.zarr", "zarr.Meta")


def test_hostile_huge_shape_past_limits_is_refused_before_allocating(tmp_path):
    write_v3(tmp_path / "a.zarr", sample("f4", (4, 4)), chunks=(2, 2), compressors=None)
    patch_meta(tmp_path / "a.zarr" / "zarr.json", shape=[2**40, 2**20])
    refused(tmp_path / "a.zarr", "core.Limit", read=False)


def test_hostile_huge_chunk_past_limits(tmp_path):
    write_v3(tmp_path / "a.zarr", sample("f4", (4, 4)), chunks=(2, 2), compressors=None)
    patch_meta(
        tmp_path / "a.zarr" / "zarr.json",
        chunk_grid={"name": "regular", "configuration": {"chunk_shape": [2**20, 2**20]}},
    )
    (tmp_path / "a.zarr" / "c" / "0" / "0").write_bytes(b"\0" * 64)
    with pytest.raises(zt.FormatError) as e:
        zt.open(tmp_path / "a.zarr")[""].numpy()
    assert e.value.rule == "core.Limit"


@pytest.mark.parametrize("path", ["../outside", "a/../../outside", "/abs", "a//b", "a\\b"])
def test_hostile_consolidated_key_escaping_the_store(tmp_path, path, zt_cli):
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    root.create_array("a", shape=(2,), dtype="f4")
    zarr.consolidate_metadata(str(tmp_path / "g.zarr"))
    meta = json.loads((tmp_path / "g.zarr" / "zarr.json").read_text())
    nodes = meta["consolidated_metadata"]["metadata"]
    nodes[path] = nodes.pop("a")
    (tmp_path / "g.zarr" / "zarr.json").write_text(json.dumps(meta))
    refused(tmp_path / "g.zarr", "zarr.Key")
    out = subprocess.run([zt_cli, "ls", tmp_path / "g.zarr"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("zt: error [zarr.Key]: "), out.stderr


def test_hostile_v2_consolidated_key_escaping(tmp_path):
    root = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=2)
    root.create_array("a", shape=(2,), dtype="f4", compressors=None)
    zarr.consolidate_metadata(str(tmp_path / "g.zarr"))
    meta = json.loads((tmp_path / "g.zarr" / ".zmetadata").read_text())
    meta["metadata"]["../../x/.zarray"] = meta["metadata"].pop("a/.zarray")
    (tmp_path / "g.zarr" / ".zmetadata").write_text(json.dumps(meta))
    refused(tmp_path / "g.zarr", "zarr.Key")


def test_hostile_chunk_symlink_out_of_the_store(tmp_path):
    secret = tmp_path / "secret"
    secret.write_bytes(b"\1" * 16)
    write_v3(tmp_path / "a.zarr", sample("f4", (4,)), chunks=(2,), compressors=None)
    chunk = tmp_path / "a.zarr" / "c" / "1"
    chunk.unlink()
    os.symlink(secret, chunk)
    refused(tmp_path / "a.zarr", "zarr.Key")


def test_hostile_metadata_not_json(tmp_path):
    write_v3(tmp_path / "a.zarr", sample("f4", (4,)), chunks=(2,), compressors=None)
    (tmp_path / "a.zarr" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "array", "shape": [4')
    refused(tmp_path / "a.zarr", "zarr.Meta", read=False)


def test_hostile_gzip_bomb_is_refused_at_the_chunk_size(tmp_path):
    import gzip

    write_v3(tmp_path / "a.zarr", sample("f4", (4,)), chunks=(2,), compressors=GzipCodec())
    (tmp_path / "a.zarr" / "c" / "0").write_bytes(gzip.compress(b"\0" * (64 << 20)))
    refused(tmp_path / "a.zarr", "zarr.Chunk")


# ------------------------------------------------------- over s3 (SeaweedFS)


def s3_store(tmp_path, *, consolidated: bool) -> tuple[pathlib.Path, dict]:
    """A v3 group as zarr-python writes it: zstd chunks (one never written),
    a sharded array, a nested group, a scalar; (its directory, arrays by path)."""
    path = tmp_path / "store.zarr"
    root = zarr.open_group(str(path), mode="w", zarr_format=3, attributes={"title": "remote"})
    expect = {}
    specs = [
        # Rows 5.. never written: chunks absent, read as the fill value.
        (root, "zstd", "f4", (9, 7), np.s_[:5], dict(chunks=(4, 3), compressors=ZstdCodec(level=3))),
        (root, "sharded", "i2", (10, 12), ..., dict(chunks=(2, 3), shards=(4, 6), compressors=ZstdCodec(level=1))),
        (
            root.create_group("model").create_group("layer.0"),
            "w",
            "f8",
            (6, 5),
            ...,
            dict(chunks=(6, 5), compressors=None),
        ),
        (root, "scalar", "u8", (), ..., dict(chunks=(), compressors=None)),
    ]
    for where, name, dtype, shape, written, kw in specs:
        data = sample(dtype, shape)
        arr = where.create_array(name, shape=shape, dtype=dtype, fill_value=7, **kw)
        arr[written] = data[written]
        expect[arr.path] = arr
    if consolidated:
        zarr.consolidate_metadata(str(path))
    return path, expect


def upload_tree(s3, bucket: str, local: pathlib.Path, prefix: str) -> None:
    for f in sorted(local.rglob("*")):
        if f.is_file():
            s3.boto3().upload_file(os.fspath(f), bucket, f"{prefix}/{f.relative_to(local)}")


def test_s3_prefix_with_consolidated_metadata_bit_for_bit(s3, bucket, tmp_path):
    path, arrays = s3_store(tmp_path, consolidated=True)
    assert "consolidated_metadata" in json.loads((path / "zarr.json").read_text())
    assert (path / "sharded" / "c" / "0" / "0").is_file()  # one object per shard
    upload_tree(s3, bucket, path, "runs/store.zarr")
    for url in (f"s3://{bucket}/runs/store.zarr", f"s3://{bucket}/runs/store.zarr/zarr.json"):
        src = zt.open(url)
        assert src.format == "zarr"
        assert sorted(src.keys()) == sorted(arrays) == ["model/layer.0/w", "scalar", "sharded", "zstd"]
        assert src.attributes["title"] == "remote"
        for name, arr in arrays.items():
            want = np.asarray(arr[...])
            got = src[name].numpy()
            assert (got.dtype, got.shape) == (want.dtype, want.shape), name
            assert got.tobytes() == want.tobytes(), name
    # A slice reads the chunks it spans: in a shard, its index and those
    # inner chunks' ranges; fewer requests than the whole array.
    with zt.safe_open(f"s3://{bucket}/runs/store.zarr", framework="numpy") as f:
        for name, rows in (("sharded", np.s_[5:7]), ("zstd", np.s_[4:6])):
            before = zt.remote_stats()["gets"]
            got = f.get_slice(name)[rows]
            part = zt.remote_stats()["gets"] - before
            assert got.tobytes() == np.asarray(arrays[name][rows]).tobytes(), name
            f.get_tensor(name)
            whole = zt.remote_stats()["gets"] - before - part
            assert part < whole, (name, part, whole)


def test_s3_prefix_without_consolidated_metadata_is_listed(s3, bucket, tmp_path):
    path, arrays = s3_store(tmp_path, consolidated=False)
    assert "consolidated_metadata" not in json.loads((path / "zarr.json").read_text())
    upload_tree(s3, bucket, path, "plain/store.zarr")
    before = zt.remote_stats()["lists"]
    src = zt.open(f"s3://{bucket}/plain/store.zarr")
    # One delimited listing per group (root, model, model/layer.0), none per chunk.
    assert zt.remote_stats()["lists"] - before == 3
    assert sorted(src.keys()) == sorted(arrays) == ["model/layer.0/w", "scalar", "sharded", "zstd"]
    for name, arr in arrays.items():
        want = np.asarray(arr[...])
        assert src[name].numpy().tobytes() == want.tobytes(), name


def test_http_group_without_consolidated_metadata_is_refused(tmp_path):
    """Plain HTTP cannot list: a group there needs consolidated metadata."""
    import http.server
    import threading

    from test_remote import RangeHandler

    path, arrays = s3_store(tmp_path, consolidated=False)
    handler = type("H", (RangeHandler,), {"root": tmp_path})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/store.zarr"
        with pytest.raises(zt.FormatError, match="consolidated") as e:
            zt.open(f"{base}/zarr.json")
        assert e.value.rule == "zarr.Listing"
        zarr.consolidate_metadata(str(path))
        src = zt.open(f"{base}/zarr.json")
        for name, arr in arrays.items():
            assert src[name].numpy().tobytes() == np.asarray(arr[...]).tobytes(), name
    finally:
        server.shutdown()
        server.server_close()
