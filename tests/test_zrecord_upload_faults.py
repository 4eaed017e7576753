"""A zrecord store whose upload fails partway (issue 37) against real
servers behind the suite's fault-injecting proxy (``faultproxy.py``):
SeaweedFS (S3) and Azurite (Azure). The store's shards go up first and
``meta.zr`` last, and a failure anywhere withdraws what the upload had put,
so the prefix holds nothing of the failed store (only what was there
before), the error names the object that failed, and no upload stays open
(checked with each server's own listing: S3's ListObjectsV2 and
ListMultipartUploads, Azure's List Blobs). What a withdrawal could not
delete is journaled and deleted by the next publish to the prefix.

Azure differs in one way: its multipart upload is blocks committed by one
block list, and blocks never committed cannot be deleted (object_store's
abort is a no-op; Azure discards them after 7 days), so after a failed
multipart shard Azure lists the blob among its uncommitted ones; nothing is
committed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from upload_faults import Backend, backend_of, deletes_fail, leftover_journals, put_of

RNG = np.random.default_rng(37)
SMALL = RNG.integers(0, 1 << 40, size=(40_000, 4), dtype=np.int64)  # 4 shards, one PUT each
# 2 shards of 6 MiB: multipart in 5 MiB parts, S3's smallest but the last.
LARGE = RNG.integers(0, 1 << 40, size=(2 * 6 * (1 << 20) // 32, 4), dtype=np.int64)


@pytest.fixture(params=["s3", "az"])
def backend(request) -> Backend:
    return backend_of(request)


def create(backend: Backend, proxy, spool, rows=SMALL, shards: int = 4, **options):
    from zt.zrecord import Dense

    storage = {"max_retries": 0, "spool": os.fspath(spool), "endpoint": backend.endpoint(proxy), **options}
    url = backend.url("made/rows.zr")
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
def test_a_store_failing_mid_upload_leaves_nothing_under_its_prefix(backend, tmp, fails, part, shards):
    url = backend.url("made/rows.zr")
    rows, options = (SMALL, {}) if part is None else (LARGE, {"part_size": 5 << 20})
    with backend.proxy(put_of(fails, part)) as proxy:
        with pytest.raises(OSError) as failure:
            create(backend, proxy, tmp, rows, shards, **options)
    assert proxy.kinds() == ["500"], proxy.faulted
    assert f"{url}/{fails}" in str(failure.value), failure.value
    assert backend.keys("made/") == []
    # Azure's uncommitted blocks of the failed shard cannot be deleted
    # (they expire); nothing of them is committed.
    uncommitted = [f"made/rows.zr/{fails}"] if backend.scheme == "az" and part is not None else []
    assert backend.open_uploads() == uncommitted
    # The server reachable again, the same store publishes.
    create(backend, None, tmp, rows, shards, **options)
    names = [f"data_{i}.zr" for i in range(shards)] + ["meta.zr"]
    assert backend.keys("made/") == [f"made/rows.zr/{n}" for n in names]
    assert backend.open_uploads() == []
    assert_published(url, rows)


def test_what_was_under_the_prefix_before_stays(backend, tmp):
    backend.put("made/rows.zr/README", b"kept")
    with backend.proxy(put_of("data_3.zr")) as proxy:
        with pytest.raises(OSError):
            create(backend, proxy, tmp)
    assert proxy.kinds() == ["500"]
    assert backend.keys("made/") == ["made/rows.zr/README"]
    assert backend.get("made/rows.zr/README") == b"kept"


def test_a_failed_withdrawal_names_what_it_left(backend, tmp):
    """The server gone for deletes too (every delete fails): the error says
    which objects are left, newest first, and nothing was published."""
    url = backend.url("made/rows.zr")
    with backend.proxy(deletes_fail(put_of("data_2.zr"))) as proxy:
        with pytest.raises(OSError) as failure:
            create(backend, proxy, tmp)
    assert proxy.kinds() == ["500", "500", "500"], proxy.faulted
    message = str(failure.value)
    assert f"{url}/data_2.zr" in message
    assert f"left: {url}/data_1.zr, {url}/data_0.zr" in message, message
    assert backend.keys("made/") == ["made/rows.zr/data_0.zr", "made/rows.zr/data_1.zr"]
    assert backend.open_uploads() == []


def test_what_a_failed_withdrawal_left_is_deleted_by_the_next_publish(backend, tmp):
    """The objects a failed store could not delete are journaled with the
    versions it put; the next publish to the prefix deletes those (and only
    those) first, so a store of fewer shards opens instead of finding the
    failed one's ``data_2.zr`` (``UnexpectedShard``)."""
    from zt.zrecord import Dense

    backend.put("made/rows.zr/README", b"kept")
    url = backend.url("made/rows.zr")
    with backend.proxy(deletes_fail(put_of("data_3.zr"))) as proxy:
        with pytest.raises(OSError) as failure:
            create(backend, proxy, tmp)
    assert proxy.kinds() == ["500"] * 4, proxy.faulted
    assert "the next publish to this prefix deletes them" in str(failure.value), failure.value
    left = ["made/rows.zr/README"] + [f"made/rows.zr/data_{i}.zr" for i in range(3)]
    assert backend.keys("made/") == left
    assert len(leftover_journals(tmp)) == 1

    fewer = SMALL[:25_000]
    create(backend, None, tmp, fewer, shards=2)
    names = ["README", "data_0.zr", "data_1.zr", "meta.zr"]
    assert backend.keys("made/") == [f"made/rows.zr/{n}" for n in names]
    assert backend.get("made/rows.zr/README") == b"kept"
    assert leftover_journals(tmp) == []
    with Dense.open(url) as back:
        assert back.data_shards == 2
        assert back[np.arange(len(fewer))].tobytes() == fewer.tobytes()


def test_a_leftover_replaced_since_is_not_deleted(backend, tmp):
    """A journaled object someone wrote again since (another ETag) is not
    this journal's to delete: it stays, its entry is dropped, and the store
    published beside it reports the stranger (``UnexpectedShard``)."""
    from zt.zrecord import Dense

    with backend.proxy(deletes_fail(put_of("data_3.zr"))) as proxy:
        with pytest.raises(OSError):
            create(backend, proxy, tmp)
    backend.put("made/rows.zr/data_2.zr", b"someone else's")
    create(backend, None, tmp, SMALL[:25_000], shards=2)
    names = ["data_0.zr", "data_1.zr", "data_2.zr", "meta.zr"]
    assert backend.keys("made/") == [f"made/rows.zr/{n}" for n in names]
    assert backend.get("made/rows.zr/data_2.zr") == b"someone else's"
    assert leftover_journals(tmp) == []
    with pytest.raises(Exception, match="data_2.zr"):
        Dense.open(backend.url("made/rows.zr"))
