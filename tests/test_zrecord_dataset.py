"""Datasets of many record stores (``zt.zrecord.concat``, ``open`` of a
manifest, ``open_many``): read as one sequence equal to the stores' records
end to end, through the DataLoader too, locally and from ``s3://``; a store
changed or missing since the manifest was written is refused with its
rule."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import zt
from zt.loader import CYCLIC, DataLoader, Sampler
from zt.zrecord import Dense, Ragged, concat

ROW = (2, 3)


def _dense_store(path, first: int, n: int, codec: str = "raw") -> np.ndarray:
    rows = (np.arange(first, first + n, dtype=np.int32)[:, None, None] * 10 + np.arange(6).reshape(ROW)).astype(
        np.int32
    )
    with Dense.create(path, np.int32, ROW, codec=codec, data_shards=2) as ds:
        if n:
            ds.append(rows)
    return rows


def _ragged_store(path, first: int, n: int) -> list[np.ndarray]:
    records = [np.arange((first + i) % 7 + 1, dtype=np.int64) + first + i for i in range(n)]
    with Ragged.create(path, np.int64, ndim=1, codec="zstd") as ds:
        ds.append(records)
    return records


@pytest.fixture
def dense_parts(tmp):
    parts = [tmp / "data" / f"part-{i:05d}" for i in range(4)]
    (tmp / "data").mkdir()
    counts = [30, 0, 17, 45]
    rows = [_dense_store(p, sum(counts[:i]), n) for i, (p, n) in enumerate(zip(parts, counts))]
    return parts, np.concatenate(rows)


def test_a_manifest_opens_its_stores_as_one_sequence(tmp, dense_parts):
    parts, rows = dense_parts
    manifest = tmp / "data" / "train.json"
    assert concat(parts, manifest) == len(rows) == 92
    listed = json.loads(manifest.read_text())
    assert listed["format"] == "zrecord-dataset" and listed["version"] == 1
    assert [s["path"] for s in listed["stores"]] == [p.name for p in parts]  # relative: the dataset moves whole
    assert [s["records"] for s in listed["stores"]] == [30, 0, 17, 45]
    with Dense.open(manifest) as ds:
        assert len(ds) == 92 and ds.dtype == np.int32 and ds.item_shape == ROW
        idxs = np.random.default_rng(0).permutation(92)
        np.testing.assert_array_equal(ds[idxs], rows[idxs])
        np.testing.assert_array_equal(ds[91], rows[91])
        with pytest.raises(IndexError):
            ds[92]
    moved = tmp / "moved"
    shutil.move(tmp / "data", moved)
    with Dense.open(moved / "train.json") as ds:
        np.testing.assert_array_equal(ds[[0, 50, 91]], rows[[0, 50, 91]])


def test_open_many_and_the_dataloader_read_the_dataset(dense_parts):
    parts, rows = dense_parts
    with Dense.open_many(parts) as ds:
        sampler = Sampler(len(rows), 8, CYCLIC, seed=5, rank=0, world_size=1)
        with DataLoader({"x": ds}, batch_size=8, mode=CYCLIC, seed=5, workers=2, rank=0, world_size=1) as dl:
            for _ in range(20):
                np.testing.assert_array_equal(next(dl)["x"], rows[sampler.next()])


def test_ragged_stores_read_as_one(tmp):
    paths = [tmp / "r0", tmp / "r1"]
    records = _ragged_store(paths[0], 0, 11) + _ragged_store(paths[1], 11, 6)
    concat(paths, tmp / "r.json")
    with Ragged.open(tmp / "r.json") as ds:
        assert len(ds) == 17
        for i, got in zip([16, 0, 11, 10, 3], ds[[16, 0, 11, 10, 3]]):
            np.testing.assert_array_equal(got, records[i])


def test_a_changed_or_missing_store_is_refused_with_its_rule(tmp, dense_parts):
    parts, _ = dense_parts
    manifest = tmp / "data" / "train.json"
    concat(parts, manifest)
    shutil.rmtree(parts[2])
    _dense_store(parts[2], 0, 17, codec="zstd")  # rebuilt: same count, other bytes
    with pytest.raises(zt.FormatError, match="changed since the manifest was written") as e:
        Dense.open(manifest)
    assert e.value.rule == "zrecord.DatasetStore"
    shutil.rmtree(parts[2])
    with pytest.raises(zt.FormatError, match="is missing") as e:
        Dense.open(manifest)
    assert e.value.rule == "zrecord.DatasetStore"


def test_stores_of_different_schemas_are_refused_and_no_manifest_is_written(tmp, dense_parts):
    parts, _ = dense_parts
    _ragged_store(tmp / "tokens", 0, 3)
    with pytest.raises(zt.FormatError) as e:
        concat([parts[0], tmp / "tokens"], tmp / "bad.json")
    assert e.value.rule == "zrecord.DatasetStore"
    assert not (tmp / "bad.json").exists()
    (tmp / "garbage.json").write_text('{"format": "zrecord-dataset", "version": 99, "stores": []}')
    with pytest.raises(zt.FormatError) as e:
        Dense.open(tmp / "garbage.json")
    assert e.value.rule == "zrecord.DatasetManifest"


def test_a_dataset_in_object_storage(tmp, s3, bucket):
    rows = []
    urls = [f"s3://{bucket}/ds/part-{i}" for i in range(3)]
    for i, url in enumerate(urls):
        rows.append(_dense_store(url, 10 * i, 10))
    rows = np.concatenate(rows)
    manifest = f"s3://{bucket}/ds/train.json"
    assert concat(urls, manifest) == 30
    listed = json.loads(s3.boto3().get_object(Bucket=bucket, Key="ds/train.json")["Body"].read())
    assert [s["path"] for s in listed["stores"]] == ["part-0", "part-1", "part-2"]
    with Dense.open(manifest) as ds:
        idxs = np.array([29, 0, 15, 14, 9, 10])
        np.testing.assert_array_equal(ds[idxs], rows[idxs])
        # The loader fetches a remote dataset's steps ahead, each store's
        # part of a batch apart, and the gathers take them.
        sampler = Sampler(len(ds), 7, CYCLIC, seed=5, rank=0, world_size=1)
        with DataLoader({"x": ds}, batch_size=7, mode=CYCLIC, seed=5, workers=2, rank=0, world_size=1) as dl:
            for _ in range(9):
                np.testing.assert_array_equal(dl.next()["x"], rows[sampler.next()])


def test_stores_and_a_dataset_in_azure(tmp, azure, azure_container):
    # Record stores go through the same object layer on every scheme:
    # built locally, uploaded on close (Azurite takes object_store's uploads).
    urls = [f"az://{azure_container}/ds/part-{i}" for i in range(2)]
    rows = np.concatenate([_dense_store(url, 10 * i, 10) for i, url in enumerate(urls)])
    manifest = f"az://{azure_container}/ds/train.json"
    assert concat(urls, manifest) == 20
    with Dense.open(manifest) as ds:
        idxs = np.array([19, 0, 10, 9])
        np.testing.assert_array_equal(ds[idxs], rows[idxs])
    with Dense.open(urls[1]) as ds:
        np.testing.assert_array_equal(ds[[0, 9]], rows[[10, 19]])
