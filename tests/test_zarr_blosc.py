"""zarr's `blosc` codec (issue 42): arrays zarr-python 3.1 (pinned) writes
with its BloscCodec (v3) and numcodecs' Blosc compressor (v2), every cname
zt reads (lz4, lz4hc, blosclz, zstd) under every shuffle (noshuffle,
byte shuffle, bitshuffle), read through zt and compared bit for bit with
what zarr-python reads; frames that lie are refused citing zarr.* rules."""

from __future__ import annotations

import json

import numpy as np
import pytest

import zt

zarr = pytest.importorskip("zarr")
numcodecs = pytest.importorskip("numcodecs")
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec  # noqa: E402

RNG = np.random.default_rng(7)
CNAMES = ["lz4", "lz4hc", "blosclz", "zstd"]
SHUFFLES = ["noshuffle", "shuffle", "bitshuffle"]
DTYPES = ["bool", "u1", "i2", "i4", "f2", "f4", "f8", "i8", "c16"]


def sample(dtype: str, shape) -> np.ndarray:
    """Values with runs (so every codec compresses something) and noise."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return RNG.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        noise = RNG.integers(info.min, info.max, size=shape, endpoint=True, dtype=dt)
        return np.where(RNG.random(shape) < 0.5, dt.type(3), noise).astype(dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    return np.round(RNG.standard_normal(shape), 2).astype(dt)


def assert_matches_zarr(path) -> zt.Source:
    """zt reads every array under `path` exactly as zarr-python does."""
    node = zarr.open(str(path), mode="r")
    arrays = {"": node} if isinstance(node, zarr.Array) else dict(node.arrays())
    src = zt.open(path)
    assert sorted(src.keys()) == sorted(arrays)
    for name, arr in arrays.items():
        want = np.asarray(arr[...])
        got = src[name].numpy()
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert got.tobytes() == want.tobytes(), name
    return src


def write(path, data, chunks, zarr_format=3, written=None, **kw):
    arr = zarr.create_array(str(path), shape=data.shape, chunks=chunks, dtype=data.dtype, zarr_format=zarr_format, **kw)
    box = written if written is not None else ...
    arr[box] = data[box]
    return arr


def chunk_codec(path, key="c/0/0"):
    """The cname and shuffle flags of one stored chunk's Blosc header."""
    header = (path / key).read_bytes()[:16]
    return header[2] >> 5, header[2] & 0b101


@pytest.mark.parametrize("shuffle", SHUFFLES)
@pytest.mark.parametrize("cname", CNAMES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_v3_blosc_every_cname_shuffle_and_dtype(tmp_path, dtype, cname, shuffle):
    data = sample(dtype, (37, 29))
    # Ragged edge chunks, one chunk never written (the fill value).
    path = tmp_path / "a.zarr"
    write(path, data, (16, 16), written=np.s_[:32, :], compressors=BloscCodec(cname=cname, shuffle=shuffle))
    codec = json.loads((path / "zarr.json").read_text())["codecs"][-1]
    assert codec["name"] == "blosc" and codec["configuration"]["cname"] == cname
    assert codec["configuration"]["shuffle"] == shuffle
    assert chunk_codec(path)[0] == {"blosclz": 0, "lz4": 1, "lz4hc": 1, "zstd": 4}[cname]
    assert_matches_zarr(path)


@pytest.mark.parametrize("shuffle", SHUFFLES)
@pytest.mark.parametrize("cname", CNAMES)
def test_v3_blosc_many_blocks_per_chunk(tmp_path, cname, shuffle):
    """A 256 KiB chunk in several Blosc blocks (the blocksize asked for is
    a floor: c-blosc picks at least what its clevel wants)."""
    data = sample("f4", (256, 512))
    path = tmp_path / "a.zarr"
    write(path, data, (128, 512), compressors=BloscCodec(cname=cname, shuffle=shuffle, blocksize=4096, clevel=9))
    header = (path / "c/0/0").read_bytes()[:16]
    nbytes, blocksize = (int.from_bytes(header[i : i + 4], "little") for i in (4, 8))
    assert nbytes == 256 * 1024 and nbytes // blocksize >= 4
    assert_matches_zarr(path)


def test_v3_blosc_with_typesize_other_than_the_dtype_and_crc32c(tmp_path):
    data = sample("f8", (64, 10))
    path = tmp_path / "a.zarr"
    write(path, data, (32, 10), compressors=[BloscCodec(cname="lz4", shuffle="shuffle", typesize=4), Crc32cCodec()])
    assert_matches_zarr(path)


def test_v3_blosc_inside_shards(tmp_path):
    data = sample("i4", (64, 48))
    path = tmp_path / "a.zarr"
    write(
        path,
        data,
        (32, 48),
        serializer=ShardingCodec(
            chunk_shape=(8, 16),
            codecs=[BytesCodec(), BloscCodec(cname="zstd", shuffle="bitshuffle")],
        ),
        compressors=None,
    )
    src = assert_matches_zarr(path)
    np.testing.assert_array_equal(src[""].numpy(), data)


def test_v3_default_blosc_codec_reads(tmp_path):
    data = sample("f4", (100,))
    write(tmp_path / "a.zarr", data, (30,), compressors=BloscCodec())
    assert zt.open(tmp_path / "a.zarr")[""].numpy().tobytes() == data.tobytes()


@pytest.mark.parametrize("shuffle", [numcodecs.Blosc.NOSHUFFLE, numcodecs.Blosc.SHUFFLE, numcodecs.Blosc.BITSHUFFLE])
@pytest.mark.parametrize("cname", CNAMES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_v2_blosc_compressor(tmp_path, cname, shuffle, order):
    data = sample("i2", (21, 13, 3))
    path = tmp_path / "a.zarr"
    write(path, data, (8, 8, 2), zarr_format=2, order=order, compressors=numcodecs.Blosc(cname=cname, shuffle=shuffle))
    meta = json.loads((path / ".zarray").read_text())
    assert meta["compressor"]["id"] == "blosc" and meta["compressor"]["cname"] == cname
    assert_matches_zarr(path)


def test_v2_default_blosc_reads(tmp_path):
    data = sample("f4", (4,))
    write(tmp_path / "b.zarr", data, (2,), zarr_format=2, compressors=numcodecs.Blosc())
    assert json.loads((tmp_path / "b.zarr" / ".zarray").read_text())["compressor"]["id"] == "blosc"
    assert_matches_zarr(tmp_path / "b.zarr")


# ------------------------------------------------------- refused


def refused(path, rule) -> zt.FormatError:
    with pytest.raises(zt.FormatError) as e:
        src = zt.open(path)
        for name in src:
            src[name].numpy()
    assert e.value.rule == rule, e.value
    return e.value


@pytest.mark.parametrize("cname", ["zlib"])  # numcodecs' blosc has no snappy to write with
def test_blosc_with_a_codec_zt_does_not_build_is_refused_by_name(tmp_path, cname):
    """Frames whose blocks that codec compressed are refused naming it; a
    frame blosc stored uncompressed (memcpyed: too small or incompressible
    to gain) needs no codec and reads."""
    path, small = tmp_path / "a.zarr", tmp_path / "small.zarr"
    compressors = BloscCodec(cname=cname, shuffle="shuffle")
    write(path, np.arange(4096, dtype="f4"), (4096,), compressors=compressors)
    flags = (path / "c" / "0").read_bytes()[2]
    assert flags >> 5 == 3 and not flags & 0x02
    err = refused(path, "zarr.Codec")
    assert cname in str(err)
    write(small, sample("f4", (8,)), (8,), compressors=compressors)
    assert (small / "c" / "0").read_bytes()[2] & 0x02  # memcpyed
    assert_matches_zarr(small)


def test_blosc_chunk_cut_short_is_refused(tmp_path):
    path = tmp_path / "a.zarr"
    write(path, sample("f4", (64,)), (64,), compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    chunk = path / "c" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-3])
    assert "compressed bytes" in str(refused(path, "zarr.Chunk"))
    chunk.write_bytes(b"\x02\x01\x21")
    assert "header" in str(refused(path, "zarr.Chunk"))


def test_blosc_frame_claiming_more_than_the_chunk_is_refused(tmp_path):
    path = tmp_path / "a.zarr"
    write(path, sample("f4", (64,)), (64,), compressors=BloscCodec(cname="zstd", shuffle="noshuffle"))
    chunk = path / "c" / "0"
    frame = bytearray(chunk.read_bytes())
    frame[4:8] = (1 << 30).to_bytes(4, "little")  # 1 GiB for a 256-byte chunk
    chunk.write_bytes(bytes(frame))
    assert "past the chunk's 256 bytes" in str(refused(path, "zarr.Chunk"))


def test_blosc_frame_holding_less_than_the_chunk_is_refused(tmp_path):
    """A valid frame of another, smaller chunk in this chunk's place."""
    small = tmp_path / "small.zarr"
    write(small, sample("f4", (16,)), (16,), compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    path = tmp_path / "a.zarr"
    write(path, sample("f4", (64,)), (64,), compressors=BloscCodec(cname="lz4", shuffle="shuffle"))
    (path / "c" / "0").write_bytes((small / "c" / "0").read_bytes())
    refused(path, "zarr.Chunk")


def test_blosc_frame_with_corrupt_blocks_is_refused(tmp_path):
    path = tmp_path / "a.zarr"
    data = sample("f4", (4096,))
    write(path, data, (4096,), compressors=BloscCodec(cname="lz4", shuffle="shuffle", blocksize=1024))
    chunk = path / "c" / "0"
    frame = bytearray(chunk.read_bytes())
    nblocks = 16
    # Every block's start offset pointed past the frame's end.
    for i in range(nblocks):
        frame[16 + 4 * i : 20 + 4 * i] = (len(frame) + 100).to_bytes(4, "little")
    chunk.write_bytes(bytes(frame))
    refused(path, "zarr.Chunk")
