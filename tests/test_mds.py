"""MosaicML MDS shards read as zrecord sources (issue 38): every column of
datasets written by streaming's own MDSWriter (0.13.0), read by
Dense/Ragged.open_mds, equals what streaming's own reader decodes, sample
for sample and byte for byte (tests/data/mds/make_mds.py wrote the shards
and expected.npz); zstd shards without their raw files; and hostile
indexes and shards refused with rule zrecord.Mds."""

from __future__ import annotations

import json
import pathlib
import shutil
import struct

import numpy as np
import pytest

from zt import FormatError
from zt.loader import BLOCK_SHUFFLE, DataLoader, Sampler
from zt.zrecord import Dense, Ragged

DATA = pathlib.Path(__file__).parent / "data" / "mds"
N = 41
RAGGED = {"tokens": 1, "image": 2, "any": 1, "blob": 1, "text": 1}
DENSE = {"fixed": (2, 3), "label": (), "u16": (), "f64": ()}


@pytest.fixture(scope="module")
def expected():
    return dict(np.load(DATA / "expected.npz"))


def _ragged_expected(expected, name, column):
    values = expected[f"{name}/{column}/values"]
    shapes = expected[f"{name}/{column}/shapes"]
    key = f"{name}/{column}/dtype"
    dtype = np.dtype(str(expected[key])) if key in expected else np.dtype(np.uint8)
    out, at = [], 0
    for shape in shapes:
        n = int(np.prod(shape)) * dtype.itemsize
        out.append(values[at : at + n].view(dtype).reshape(tuple(shape)))
        at += n
    assert at == len(values)
    return out


@pytest.mark.parametrize("name", ["plain", "zstd"])
@pytest.mark.parametrize("column", list(RAGGED))
def test_ragged_columns_equal_streamings_reader(expected, name, column):
    want = _ragged_expected(expected, name, column)
    with Ragged.open_mds(DATA / name, column, ndim=RAGGED[column]) as ds:
        assert len(ds) == N
        assert ds.ndim == RAGGED[column]
        got = ds[list(range(N))]
        for a, b in zip(got, want):
            assert a.shape == b.shape and a.dtype.itemsize * a.size == b.nbytes
            assert a.tobytes() == b.tobytes()
            if column not in ("blob", "text"):
                assert a.dtype == b.dtype
        # Any order, repeats included.
        order = [40, 0, 17, 17, 3]
        assert [r.tobytes() for r in ds[order]] == [want[i].tobytes() for i in order]


@pytest.mark.parametrize("name", ["plain", "zstd"])
@pytest.mark.parametrize("column", list(DENSE))
def test_dense_columns_equal_streamings_reader(expected, name, column):
    want = expected[f"{name}/{column}/values"]
    if column == "fixed":
        want = _ragged_expected(expected, name, column)
        want = np.stack(want)
    with Dense.open_mds(DATA / name / "index.json", column) as ds:
        assert len(ds) == N and ds.item_shape == DENSE[column]
        got = ds[list(range(N))]
        assert got.shape == (N, *DENSE[column])
        assert got.tobytes() == np.ascontiguousarray(want).astype(got.dtype).tobytes()
        assert got.dtype == {"label": np.int64, "u16": np.uint16, "f64": np.float64, "fixed": np.float32}[column]


@pytest.mark.parametrize("name", ["single", "single-zstd"])
def test_runs_of_adjacent_samples_of_a_one_column_dataset(name):
    """A token dataset's shape (one fixed-size column: consecutive samples'
    values lie back to back in a shard, so a gather copies each run of them
    at once): every gather, runs within and across shards, reversed,
    repeated and block-shuffled, equals what streaming's reader decodes."""
    want = np.load(DATA / "expected-single.npz")[name]
    n = len(want)
    index = json.loads((DATA / name / "index.json").read_text())
    assert len(index["shards"]) > 2, "runs must cross shards"
    first = index["shards"][0]["samples"]
    plans = [
        np.arange(n),
        np.arange(first - 5, first + 7),  # one run over a shard's end
        np.arange(n)[::-1],
        np.array([5, 6, 7, 7, 8, first, first + 1, 3, 4, n - 1]),
        np.random.default_rng(1).permutation(n),
    ]
    sampler = Sampler(n, 40, BLOCK_SHUFFLE, 3, rank=0, world_size=1, block_size=8)
    plans += [sampler.batch(k) for k in range(8)]
    with Dense.open_mds(DATA / name, "tokens") as ds:
        assert len(ds) == n and ds.item_shape == (16,)
        for idx in plans:
            assert np.array_equal(ds[idx], want[idx]), idx
        with DataLoader({"t": ds}, batch_size=40, mode=BLOCK_SHUFFLE, block_size=8, seed=3, workers=2) as dl:
            for k in range(8):
                assert np.array_equal(dl.next()["t"], want[sampler.batch(k)])


def test_an_mds_column_feeds_the_dataloader(expected):
    want = _ragged_expected(expected, "plain", "tokens")
    labels = expected["plain/label/values"]
    tokens = Ragged.open_mds(DATA / "plain", "tokens")
    label = Dense.open_mds(DATA / "plain", "label")
    with DataLoader({"tokens": tokens, "label": label}, batch_size=8, seed=2, workers=2) as dl:
        for _ in range(6):
            batch = dl.next()
            for t, lab in zip(batch["tokens"], batch["label"].tolist()):
                i = int(np.flatnonzero(labels == lab)[0])
                assert t.tobytes() == want[i].tobytes()
    tokens.close()
    label.close()


def test_wrong_kind_or_column_is_refused():
    with pytest.raises(ValueError, match="use Dense.open_mds"):
        Ragged.open_mds(DATA / "plain", "label")
    with pytest.raises(ValueError, match="use Ragged.open_mds"):
        Dense.open_mds(DATA / "plain", "tokens")
    with pytest.raises(FormatError, match=r'no column "nope".*zrecord\.Mds'):
        Ragged.open_mds(DATA / "plain", "nope")


# -- hostile indexes and shards -------------------------------------------------------


@pytest.fixture
def copy(tmp_path):
    out = tmp_path / "d"
    shutil.copytree(DATA / "plain", out)
    return out


def _edit_index(path: pathlib.Path, edit) -> None:
    index = json.loads((path / "index.json").read_text())
    edit(index)
    (path / "index.json").write_text(json.dumps(index))


def _refused(path, match, column="tokens", at_gather=False):
    # A refusal is the file's FormatError, citing the rule.
    if at_gather:
        with Ragged.open_mds(path, column) as ds:
            with pytest.raises(FormatError, match=match):
                ds[list(range(len(ds)))]
    else:
        with pytest.raises(FormatError, match=match):
            Ragged.open_mds(path, column)


def test_lying_indexes_are_refused(copy):
    def shard0(**kw):
        def edit(index):
            index["shards"][0].update(kw)

        return edit

    cases = [
        (shard0(samples=10_000), "does not hold the 10000 samples"),
        (shard0(raw_data={"basename": "../plain/shard.00000.mds", "bytes": 3691}), "no plain file basename"),
        (shard0(raw_data={"basename": "shard.00000.mds", "bytes": 1 << 40}), "no size under 4 GiB"),
        (shard0(raw_data={"basename": "shard.00000.mds", "bytes": 10}), "the index says 10"),
        (shard0(format="json"), 'format is not "mds"'),
        (shard0(column_sizes=[None] * 8), "column lists of different lengths"),
        (lambda i: i.update(version=1), "index version is not 2"),
        (lambda i: i.update(shards=[]), "no shards"),
    ]
    for edit, match in cases:
        shutil.copy(DATA / "plain" / "index.json", copy / "index.json")
        _edit_index(copy, edit)
        _refused(copy, rf"{match}.*rule zrecord\.Mds")
    (copy / "index.json").write_text("{not json")
    _refused(copy, r"not JSON.*rule zrecord\.Mds")
    (copy / "index.json").write_bytes(b" " * (65 << 20))
    _refused(copy, r"limit of an index")


def test_a_fixed_size_the_encoding_does_not_have_is_refused(copy):
    def edit(index):
        names = index["shards"][0]["column_names"]
        index["shards"][0]["column_sizes"][names.index("fixed")] = 4

    _edit_index(copy, edit)
    with pytest.raises(FormatError, match="has size Some"):
        Dense.open_mds(copy, "fixed")


def test_lying_shards_are_refused_when_gathered(copy):
    shard = copy / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    # Sample 3's end offset past the file.
    struct.pack_into("<I", data, 4 + 4 * 4, len(data) + 100)
    shard.write_bytes(bytes(data))
    _refused(copy, r"sample 3: bytes .* are not in its samples", at_gather=True)
    # A sample whose tokens' shape does not fit its bytes.
    data = bytearray((DATA / "plain" / "shard.00000.mds").read_bytes())
    begin = struct.unpack_from("<I", data, 4)[0]
    index = json.loads((copy / "index.json").read_text())["shards"][0]
    variable = [n for n, s in zip(index["column_names"], index["column_sizes"]) if s is None]
    sizes = struct.unpack_from(f"<{len(variable)}I", data, begin)
    names, fixed = index["column_names"], index["column_sizes"]
    at = begin + 4 * len(variable)
    for n, f in zip(names, fixed):
        if n == "tokens":
            break
        at += f if f is not None else sizes[variable.index(n)]
    assert data[at] >> 2 == 1  # rank 1
    data[at + 1] = 255  # first dim
    shard.write_bytes(bytes(data))
    _refused(copy, r"sample 0: shape \[255\] does not fit", at_gather=True)
    # Rank 1 records opened as rank 2.
    shutil.copy(DATA / "plain" / "shard.00000.mds", shard)
    with Ragged.open_mds(copy, "tokens", ndim=2) as ds:
        with pytest.raises(FormatError, match="rank 1, the column's records have rank 2"):
            ds[0]
    # A shard cut short, and a missing one.
    shard.write_bytes(data[:100])
    _refused(copy, r"100 bytes, the index says")
    shard.unlink()
    _refused(copy, r"the shard is missing")


def test_compressed_shards_checked(tmp_path):
    out = tmp_path / "z"
    shutil.copytree(DATA / "zstd", out)
    z = out / "shard.00000.mds.zstd"
    z.write_bytes(z.read_bytes()[:-20])
    _refused(out, r"not a zstd stream|decompresses to")
    shutil.copy(DATA / "zstd" / "shard.00000.mds.zstd", z)

    def gz(index):
        index["shards"][0]["compression"] = "gz:9"

    _edit_index(out, gz)
    _refused(out, r"compression Some\(\"gz:9\"\): zt decompresses zstd shards")


# ------------------------------------------------ object storage


def _upload(s3, bucket, name: str) -> str:
    """The fixture directory ``name`` put under a prefix with boto3."""
    client = s3.boto3()
    for f in sorted((DATA / name).iterdir()):
        client.upload_file(str(f), bucket, f"mds/{name}/{f.name}")
    return f"s3://{bucket}/mds/{name}"


@pytest.mark.parametrize("name", ["plain", "zstd"])
def test_every_column_in_object_storage_equals_streamings_reader(expected, s3, bucket, name):
    """The same shards on SeaweedFS: the prefix listed once, raw shards read
    by ranges per gather (zstd-only shards fetched and decompressed at
    open), every column equal to what streaming's reader decoded."""
    import zt

    before = zt.remote_stats()["gets"]
    _every_column_equals_streamings(expected, name, _upload(s3, bucket, name))
    assert zt.remote_stats()["gets"] > before


def _every_column_equals_streamings(expected, name: str, url: str) -> None:
    """Every column of fixture ``name`` at ``url`` gathered in an order with
    repeats, equal to what streaming's reader decoded."""
    order = [40, 0, 17, 17, 3, *range(N)]
    for column, ndim in RAGGED.items():
        want = _ragged_expected(expected, name, column)
        with Ragged.open_mds(url, column, ndim=ndim) as ds:
            assert len(ds) == N and ds.ndim == ndim
            assert [r.tobytes() for r in ds[order]] == [want[i].tobytes() for i in order]
    for column, shape in DENSE.items():
        want = expected[f"{name}/{column}/values"]
        if column == "fixed":
            want = np.stack(_ragged_expected(expected, name, column))
        with Dense.open_mds(url + "/index.json", column) as ds:
            assert len(ds) == N and ds.item_shape == shape
            got = ds[order]
            assert got.tobytes() == np.ascontiguousarray(want[order]).astype(got.dtype).tobytes()


@pytest.fixture(params=["gs", "az"])
def emulated(request):
    """A fresh fake-gcs-server bucket or Azurite container, and a function
    putting a fixture directory under it with the emulator's own client
    (never zt), giving its URL."""
    cloud = request.param
    server = request.getfixturevalue("gcs" if cloud == "gs" else "azure")
    name = request.getfixturevalue("gcs_bucket" if cloud == "gs" else "azure_container")

    def upload(fixture: str) -> str:
        for f in sorted((DATA / fixture).iterdir()):
            server.put(name, f"mds/{fixture}/{f.name}", f.read_bytes())
        return f"{cloud}://{name}/mds/{fixture}"

    return upload


def test_mds_on_gcs_and_azure_equals_streamings_reader(expected, emulated):
    """The same shards on fake-gcs-server and Azurite (as binidx is tested):
    raw shards read by ranges, zstd-only shards fetched at open, a
    one-column dataset's runs; every value what streaming's reader decoded,
    through gathers and the DataLoader."""
    for name in ("plain", "zstd"):
        _every_column_equals_streamings(expected, name, emulated(name))
    want = np.load(DATA / "expected-single.npz")["single"]
    with Dense.open_mds(emulated("single"), "tokens") as ds:
        assert np.array_equal(ds[np.arange(len(want))[::-1]], want[::-1])
        kw = dict(batch_size=30, mode=BLOCK_SHUFFLE, block_size=8, seed=3, workers=2, rank=0, world_size=1)
        with DataLoader({"t": ds}, **kw) as dl:
            sampler = Sampler(len(want), 30, BLOCK_SHUFFLE, 3, rank=0, world_size=1, block_size=8)
            for k in range(6):
                assert np.array_equal(dl.next()["t"], want[sampler.batch(k)])


def test_a_remote_mds_column_feeds_the_dataloader(expected, s3, bucket):
    url = _upload(s3, bucket, "plain")
    want = _ragged_expected(expected, "plain", "tokens")
    labels = expected["plain/label/values"]
    with Ragged.open_mds(url, "tokens") as tokens, Dense.open_mds(url, "label") as label:
        with DataLoader({"tokens": tokens, "label": label}, batch_size=8, seed=2, workers=2) as dl:
            for _ in range(6):
                batch = dl.next()
                for t, lab in zip(batch["tokens"], batch["label"].tolist()):
                    i = int(np.flatnonzero(labels == lab)[0])
                    assert t.tobytes() == want[i].tobytes()


def test_a_remote_shard_that_lies_or_is_missing_is_refused(s3, bucket):
    url = _upload(s3, bucket, "plain")
    data = (DATA / "plain" / "shard.00003.mds").read_bytes()
    s3.boto3().put_object(Bucket=bucket, Key="mds/plain/shard.00003.mds", Body=data[:-7])
    with pytest.raises(FormatError, match=r"zrecord\.Mds"):
        Ragged.open_mds(url, "tokens")
    # A sample count other than the index's (the tables are fetched
    # together after the listing).
    count = struct.unpack_from("<I", data)[0]
    patched = struct.pack("<I", count + 1) + data[4:]
    s3.boto3().put_object(Bucket=bucket, Key="mds/plain/shard.00003.mds", Body=patched)
    with pytest.raises(FormatError, match=r"zrecord\.Mds") as e:
        Ragged.open_mds(url, "tokens")
    assert f"does not hold the {count} samples" in str(e.value)
    s3.boto3().delete_object(Bucket=bucket, Key="mds/plain/shard.00003.mds")
    with pytest.raises(FormatError, match=r"zrecord\.Mds") as e:
        Ragged.open_mds(url, "tokens")
    assert "the shard is missing" in str(e.value)
