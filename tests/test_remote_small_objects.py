"""Small objects are downloaded once (issue 37), on each emulator the suite
starts (SeaweedFS for S3, fake-gcs-server, Azurite), counted by
``zt.remote_stats()``. An object read from its head and never
format-detected (a zrecord store's ``meta.zr``, JSON) is opened by its head
alone: a small one comes whole in one GET. An object whose size the
process knows (opened before, or listed) is opened by ranges planned on
it: a small one in one GET of all of it. Values compared bit for bit with
the reference readers (the safetensors library; the same store read
locally). Objects are put with each server's own client, never through
zt."""

from __future__ import annotations

import os

import numpy as np
import pytest
import safetensors.numpy

import zt

RNG = np.random.default_rng(3710)
HEAD = 1 << 20  # what an open asks for of an object's head


@pytest.fixture(params=["s3", "gs", "az"])
def cloud(request):
    """``(put(key, bytes), url(key))`` on a fresh bucket or container of
    one emulator."""
    scheme = request.param
    if scheme == "s3":
        server, root = request.getfixturevalue("s3"), request.getfixturevalue("bucket")
        client = server.boto3()

        def put(key: str, data: bytes) -> None:
            client.put_object(Bucket=root, Key=key, Body=data)

    else:
        server = request.getfixturevalue("gcs" if scheme == "gs" else "azure")
        root = request.getfixturevalue("gcs_bucket" if scheme == "gs" else "azure_container")

        def put(key: str, data: bytes) -> None:
            server.put(root, key, data)

    return put, lambda key: f"{scheme}://{root}/{key}"


def moved(action):
    before = zt.remote_stats()
    out = action()
    after = zt.remote_stats()
    return out, {k: after[k] - before[k] for k in after}


def test_a_small_file_opened_again_is_downloaded_once(cloud, tmp):
    put, url = cloud
    arrays = {
        "w": RNG.standard_normal((64, 300)).astype(np.float32),
        "b": RNG.standard_normal(300).astype(np.float16),
        "ids": RNG.integers(0, 1 << 30, size=5000, dtype=np.int64),
    }
    path = tmp / "small.safetensors"
    safetensors.numpy.save_file(arrays, os.fspath(path))
    data = path.read_bytes()
    assert len(data) < 256 << 10  # the tail an open of unknown size asks for holds it all
    put("m/small.safetensors", data)
    want = safetensors.numpy.load_file(os.fspath(path))
    # The first open knows no size: its head and tail (a suffix range, sent
    # together so a large file's open is one round trip) both hold the
    # whole file; Azure, which has no suffix ranges, asks for the head only.
    first = 1 if url("").startswith("az://") else 2
    for gets in (first, 1):
        got, used = moved(lambda: zt.numpy.load_file(url("m/small.safetensors")))
        assert sorted(got) == sorted(want)
        assert all(got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes() for k in want)
        assert used["gets"] == gets and used["heads"] == 0 and used["bytes_in"] == gets * len(data), used


def test_a_large_file_opened_again_fetches_head_and_tail_once(cloud, tmp):
    put, url = cloud
    arrays = {f"w{i}": RNG.standard_normal((256, 1024)).astype(np.float32) for i in range(3)}  # 3 MiB
    path = tmp / "large.safetensors"
    safetensors.numpy.save_file(arrays, os.fspath(path))
    put("m/large.safetensors", path.read_bytes())
    zt.open(url("m/large.safetensors")).close()
    # Its size known: the head and a bounded tail together (on Azure too,
    # where an unknown size costs the tail a second round trip).
    src, used = moved(lambda: zt.open(url("m/large.safetensors")))
    assert used["gets"] == 2 and used["bytes_in"] == HEAD + (256 << 10), used
    with src:
        got = src["w2"].numpy()
    assert got.tobytes() == arrays["w2"].tobytes()


def test_a_record_stores_meta_is_downloaded_once(cloud, tmp):
    from zt.zrecord import Ragged

    put, url = cloud
    records = [RNG.integers(0, 1 << 20, size=int(n), dtype=np.int32) for n in RNG.integers(1, 300, size=500)]
    local = tmp / "rows.zr"
    with Ragged.create(local, np.int32, 1, codec="raw") as store:
        store.append(records)
    for f in sorted(local.iterdir()):
        put(f"s/rows.zr/{f.name}", f.read_bytes())
    meta = (local / "meta.zr").stat().st_size
    assert meta < HEAD
    remote, used = moved(lambda: Ragged.open(url("s/rows.zr")))
    # meta.zr whole in one GET and the listing (the shards' sizes and
    # ETags): nothing fetched twice.
    assert used["gets"] == 1 and used["lists"] == 1 and used["bytes_in"] == meta, used
    idxs = RNG.permutation(len(records))[:60]
    with remote, Ragged.open(local) as here:
        assert [g.tobytes() for g in remote[idxs]] == [w.tobytes() for w in here[idxs]]


def test_an_object_replaced_by_a_smaller_one_opens_with_its_new_size(cloud, tmp):
    # The size this process learnt is stale: the tail planned on it lies
    # past the new object's end, so the open is retried as of unknown size,
    # and every byte read is the new object's.
    put, url = cloud
    large = {f"w{i}": RNG.standard_normal((256, 1024)).astype(np.float32) for i in range(3)}  # 3 MiB
    small = {"w0": RNG.standard_normal((16, 16)).astype(np.float32)}
    for name, arrays in (("large", large), ("small", small)):
        safetensors.numpy.save_file(arrays, os.fspath(tmp / f"{name}.safetensors"))
    put("m/x.safetensors", (tmp / "large.safetensors").read_bytes())
    zt.open(url("m/x.safetensors")).close()
    put("m/x.safetensors", (tmp / "small.safetensors").read_bytes())
    got = zt.numpy.load_file(url("m/x.safetensors"))
    assert sorted(got) == ["w0"] and got["w0"].tobytes() == small["w0"].tobytes()
