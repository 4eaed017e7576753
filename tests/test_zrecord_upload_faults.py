"""A zrecord store whose upload fails partway (issue 37) against a real S3
server (SeaweedFS, the ``s3`` fixture) behind the suite's fault-injecting
proxy (``faultproxy.py``): the store's shards go up first and ``meta.zr``
last, and a failure anywhere withdraws what the upload had put, so the
prefix holds nothing of the failed store (only what was there before), the
error names the object that failed, and no multipart upload stays open
(checked with the server's own ListObjectsV2 and ListMultipartUploads).
"""

from __future__ import annotations

import os
import urllib.parse

import numpy as np
import pytest
from faultproxy import FaultProxy

RNG = np.random.default_rng(37)
SMALL = RNG.integers(0, 1 << 40, size=(40_000, 4), dtype=np.int64)  # 4 shards, one PUT each
# 2 shards of 6 MiB: multipart in 5 MiB parts, S3's smallest but the last.
LARGE = RNG.integers(0, 1 << 40, size=(2 * 6 * (1 << 20) // 32, 4), dtype=np.int64)


def keys_under(client, bucket: str, prefix: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def open_uploads(client, bucket: str) -> list[str]:
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def put_of(name: str, part: int | None = None):
    """A proxy ``decide`` failing (500) the PUT of the store's object
    ``name``, or only its multipart part ``part``."""

    def decide(request):
        split = urllib.parse.urlsplit(request.path)
        if request.method != "PUT" or not split.path.endswith("/" + name):
            return None
        number = urllib.parse.parse_qs(split.query).get("partNumber")
        return "500" if part is None or number == [str(part)] else None

    return decide


def create(url: str, endpoint: str | None, spool, rows=SMALL, shards: int = 4, **options):
    from zt.zrecord import Dense

    storage = {"max_retries": 0, "spool": os.fspath(spool), **options}
    if endpoint is not None:
        storage["endpoint"] = endpoint
    with Dense.create(url, np.int64, (4,), data_shards=shards, storage_options=storage) as store:
        store.append(rows)


def assert_published(url: str, rows) -> None:
    from zt.zrecord import Dense

    with Dense.open(url) as back:
        assert back[np.arange(len(rows))].tobytes() == rows.tobytes()


@pytest.mark.parametrize(
    "fails, part, shards",
    [
        ("data_2.zr", None, 4),  # one PUT per shard: the third fails
        ("data_1.zr", 2, 2),  # multipart shards: the second one's second part fails
        ("meta.zr", None, 4),  # the last object: every shard is up
    ],
)
def test_a_store_failing_mid_upload_leaves_nothing_under_its_prefix(s3, bucket, tmp, fails, part, shards):
    client = s3.boto3()
    url = f"s3://{bucket}/made/rows.zr"
    rows, options = (SMALL, {}) if part is None else (LARGE, {"part_size": 5 << 20})
    with FaultProxy(s3.endpoint, put_of(fails, part)) as proxy:
        with pytest.raises(OSError) as failure:
            create(url, proxy.endpoint, tmp, rows, shards, **options)
    assert proxy.kinds() == ["500"], proxy.faulted
    assert f"{url}/{fails}" in str(failure.value), failure.value
    assert keys_under(client, bucket, "made/") == []
    assert open_uploads(client, bucket) == []
    # The server reachable again, the same store publishes.
    create(url, None, tmp, rows, shards, **options)
    names = [f"data_{i}.zr" for i in range(shards)] + ["meta.zr"]
    assert keys_under(client, bucket, "made/") == [f"made/rows.zr/{n}" for n in names]
    assert_published(url, rows)


def test_what_was_under_the_prefix_before_stays(s3, bucket, tmp):
    client = s3.boto3()
    client.put_object(Bucket=bucket, Key="made/rows.zr/README", Body=b"kept")
    url = f"s3://{bucket}/made/rows.zr"
    with FaultProxy(s3.endpoint, put_of("data_3.zr")) as proxy:
        with pytest.raises(OSError):
            create(url, proxy.endpoint, tmp)
    assert proxy.kinds() == ["500"]
    assert keys_under(client, bucket, "made/") == ["made/rows.zr/README"]
    assert client.get_object(Bucket=bucket, Key="made/rows.zr/README")["Body"].read() == b"kept"


def test_a_failed_withdrawal_names_what_it_left(s3, bucket, tmp):
    """The server gone for deletes too (every DELETE fails): the error says
    which objects are left, newest first, and nothing was published."""
    client = s3.boto3()
    url = f"s3://{bucket}/made/rows.zr"
    fail_put = put_of("data_2.zr")

    def decide(request):
        # object_store deletes on S3 by DeleteObjects (POST ?delete).
        deleting = request.method == "DELETE" or (request.method == "POST" and request.query == "delete")
        return "500" if deleting else fail_put(request)

    with FaultProxy(s3.endpoint, decide) as proxy:
        with pytest.raises(OSError) as failure:
            create(url, proxy.endpoint, tmp)
    assert proxy.kinds() == ["500", "500", "500"], proxy.faulted
    message = str(failure.value)
    assert f"{url}/data_2.zr" in message
    assert f"left: {url}/data_1.zr, {url}/data_0.zr" in message, message
    assert keys_under(client, bucket, "made/") == ["made/rows.zr/data_0.zr", "made/rows.zr/data_1.zr"]
    assert open_uploads(client, bucket) == []


def deletes_fail(fail_put):
    """A ``decide`` failing every delete (the server gone for them) and
    what ``fail_put`` fails."""

    def decide(request):
        # object_store deletes on S3 by DeleteObjects (POST ?delete).
        deleting = request.method == "DELETE" or (request.method == "POST" and request.query == "delete")
        return "500" if deleting else fail_put(request)

    return decide


def leftover_journals(spool) -> list:
    return sorted((spool / "zt-uploads").glob("*.leftover"))


def test_what_a_failed_withdrawal_left_is_deleted_by_the_next_publish(s3, bucket, tmp):
    """The objects a failed store could not delete are journaled with the
    versions it put; the next publish to the prefix deletes those (and only
    those) first, so a store of fewer shards opens instead of finding the
    failed one's ``data_2.zr`` (``UnexpectedShard``)."""
    from zt.zrecord import Dense

    client = s3.boto3()
    client.put_object(Bucket=bucket, Key="made/rows.zr/README", Body=b"kept")
    url = f"s3://{bucket}/made/rows.zr"
    with FaultProxy(s3.endpoint, deletes_fail(put_of("data_3.zr"))) as proxy:
        with pytest.raises(OSError) as failure:
            create(url, proxy.endpoint, tmp)
    assert proxy.kinds() == ["500"] * 4, proxy.faulted
    assert "the next publish to this prefix deletes them" in str(failure.value), failure.value
    left = ["made/rows.zr/README"] + [f"made/rows.zr/data_{i}.zr" for i in range(3)]
    assert keys_under(client, bucket, "made/") == left
    assert len(leftover_journals(tmp)) == 1

    fewer = SMALL[:25_000]
    create(url, None, tmp, fewer, shards=2)
    names = ["README", "data_0.zr", "data_1.zr", "meta.zr"]
    assert keys_under(client, bucket, "made/") == [f"made/rows.zr/{n}" for n in names]
    assert client.get_object(Bucket=bucket, Key="made/rows.zr/README")["Body"].read() == b"kept"
    assert leftover_journals(tmp) == []
    with Dense.open(url) as back:
        assert back.data_shards == 2
        assert back[np.arange(len(fewer))].tobytes() == fewer.tobytes()


def test_a_leftover_replaced_since_is_not_deleted(s3, bucket, tmp):
    """A journaled object someone wrote again since (another ETag) is not
    this journal's to delete: it stays, its entry is dropped, and the store
    published beside it reports the stranger (``UnexpectedShard``)."""
    from zt.zrecord import Dense

    client = s3.boto3()
    url = f"s3://{bucket}/made/rows.zr"
    with FaultProxy(s3.endpoint, deletes_fail(put_of("data_3.zr"))) as proxy:
        with pytest.raises(OSError):
            create(url, proxy.endpoint, tmp)
    client.put_object(Bucket=bucket, Key="made/rows.zr/data_2.zr", Body=b"someone else's")
    create(url, None, tmp, SMALL[:25_000], shards=2)
    names = ["data_0.zr", "data_1.zr", "data_2.zr", "meta.zr"]
    assert keys_under(client, bucket, "made/") == [f"made/rows.zr/{n}" for n in names]
    assert client.get_object(Bucket=bucket, Key="made/rows.zr/data_2.zr")["Body"].read() == b"someone else's"
    assert leftover_journals(tmp) == []
    with pytest.raises(Exception, match="data_2.zr"):
        Dense.open(url)
