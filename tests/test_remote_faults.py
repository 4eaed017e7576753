"""Object-storage faults against a real S3 server (SeaweedFS, the ``s3``
fixture) seen through a proxy of the test's own on 127.0.0.1 that forwards
every request unchanged (SigV4 signatures included: the Host header is
passed through) except those it is told to fail with a 500.

A multipart upload whose part fails is aborted; when the abort fails too,
its upload id stays in the journal and the next write from the machine
aborts it, so no parts stay on the server (checked with the server's own
ListMultipartUploads). Retries are counted in ``zt.remote_stats()``.
"""

from __future__ import annotations

import os
import threading
import urllib.parse

import numpy as np
import pytest
from faultproxy import FaultProxy

import zt


class FaultyProxy(FaultProxy):
    """The suite's fault proxy (``faultproxy.FaultProxy``) answering 500
    (S3's InternalError, not forwarded) to each request for which
    ``fail(method, path)`` is true; ``failed`` lists those ``(method,
    path)``."""

    def __init__(self, upstream: str, fail):
        super().__init__(upstream, lambda r: "500" if fail(r.method, r.path) else None)

    @property
    def failed(self) -> list[tuple[str, str]]:
        return [(r.method, r.path) for _, r in self.faulted]


def journal(spool) -> list:
    return sorted((spool / "zt-uploads").glob("*.upload"))


def test_an_upload_whose_abort_fails_is_aborted_by_the_next_write(s3, bucket, tmp):
    spool = tmp / "spool"
    spool.mkdir()
    client = s3.boto3()
    url = f"s3://{bucket}/faults/m.safetensors"

    def fail(method: str, path: str) -> bool:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
        second_part = method == "PUT" and query.get("partNumber") == ["2"]
        abort = method == "DELETE" and "uploadId" in query
        return second_part or abort

    # S3's smallest parts (5 MiB, the last excepted): 3 parts and a bit.
    arrays = {"w": np.arange((15 << 20) // 4, dtype=np.float32)}
    with FaultyProxy(s3.endpoint, fail) as proxy:
        options = {
            "endpoint": proxy.endpoint,
            "part_size": 5 << 20,
            "concurrency": 1,
            "max_retries": 0,
            "spool": os.fspath(spool),
        }
        with pytest.raises(OSError) as failure:
            zt.numpy.save_file(arrays, url, storage_options=options)
    assert "aborting the upload failed too" in str(failure.value), failure.value
    assert [m for m, _ in proxy.failed] == ["PUT", "DELETE"], proxy.failed
    # Nothing published; the upload is open on the server and its id kept.
    assert client.list_objects_v2(Bucket=bucket, Prefix="faults/")["KeyCount"] == 0
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["faults/m.safetensors"]
    kept = journal(spool)
    assert len(kept) == 1
    assert kept[0].read_text().split("\n")[:2] == [url, uploads[0]["UploadId"]]

    # The next write to the prefix, the server reachable again, aborts it.
    zt.numpy.save_file(
        {"x": np.ones(3, np.float32)},
        f"s3://{bucket}/faults/next.safetensors",
        storage_options={"spool": os.fspath(spool)},
    )
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert journal(spool) == []
    listed = client.list_objects_v2(Bucket=bucket, Prefix="faults/")
    assert [o["Key"] for o in listed["Contents"]] == ["faults/next.safetensors"]


def test_a_part_size_s3_refuses_is_refused_before_anything_goes_up(s3, bucket, tmp):
    """S3 refuses parts under 5 MiB (but the last) only when the upload is
    completed, after every byte went up: zt refuses the option for an S3
    upload before a request is sent, whatever the file's size."""
    client = s3.boto3()
    arrays = {"w": np.arange((1 << 20) // 4, dtype=np.float32)}
    with FaultyProxy(s3.endpoint, lambda method, path: False) as proxy:
        options = {"endpoint": proxy.endpoint, "part_size": (5 << 20) - 1, "spool": os.fspath(tmp)}
        for small in ({}, {"w": np.ones(3, np.float32)}):
            with pytest.raises(ValueError, match="below the 5 MiB") as refused:
                zt.numpy.save_file(small or arrays, f"s3://{bucket}/small-parts/m.safetensors", storage_options=options)
            assert f"s3://{bucket}/small-parts/m.safetensors" in str(refused.value)
        assert proxy.requests == []
    assert client.list_objects_v2(Bucket=bucket, Prefix="small-parts/")["KeyCount"] == 0
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")
    # Reads may use small parts: a ranged GET has no minimum.
    zt.numpy.save_file(arrays, f"s3://{bucket}/small-parts/m.safetensors", storage_options={"part_size": 5 << 20})
    got = zt.numpy.load_file(f"s3://{bucket}/small-parts/m.safetensors", storage_options={"part_size": 64 << 10})
    assert got["w"].tobytes() == arrays["w"].tobytes()


def test_retries_are_counted_beside_requests(s3, bucket, tmp):
    # The first GET of each open fails with a 500; object_store retries it.
    seen: set[str] = set()
    lock = threading.Lock()

    def fail(method: str, path: str) -> bool:
        with lock:
            first = method == "GET" and path not in seen
            seen.add(path)
        return first

    w = np.arange(16, dtype=np.float32)
    zt.numpy.save_file({"w": w}, f"s3://{bucket}/r/m.safetensors")
    with FaultyProxy(s3.endpoint, fail) as proxy:
        before = zt.remote_stats()
        got = zt.numpy.load_file(f"s3://{bucket}/r/m.safetensors", storage_options={"endpoint": proxy.endpoint})
        after = zt.remote_stats()
    assert got["w"].tobytes() == w.tobytes()
    moved = {k: after[k] - before[k] for k in after}
    assert proxy.failed
    assert moved["retries"] >= len(proxy.failed), (moved, proxy.failed)
    assert moved["gets"] >= 1


# A directory checkpoint (DCP, TensorDict's memmap directory) written under
# a prefix (issue 43): its index (`.metadata`, `meta.json`) goes up after
# every file it names, so an upload failing partway must leave no index
# naming missing or replaced files, and an error naming the object.


def checkpoint_arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"layers.{i}.w": rng.standard_normal((64, 32), dtype=np.float32) for i in range(3)}


def keys_under(client, bucket: str, prefix: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


def failing_put(name: str):
    """A proxy predicate failing every PUT of an object whose key ends with
    `/name` (a single PUT: the files are below the part size)."""
    return lambda method, path: method == "PUT" and urllib.parse.urlsplit(path).path.endswith("/" + name)


def write_dcp(src, url: str, endpoint: str | None = None) -> int:
    options = {"max_retries": 0} if endpoint is None else {"endpoint": endpoint, "max_retries": 0}
    return zt.convert(src, url, format="dcp", dcp_files=3, storage_options=options)


def assert_reads(url: str, arrays: dict[str, np.ndarray]) -> None:
    got = zt.numpy.load_file(url)
    assert sorted(got) == sorted(arrays)
    for name, want in arrays.items():
        assert got[name].tobytes() == want.tobytes(), name


@pytest.mark.parametrize(
    "kwargs, index, fails",
    [
        ({"format": "dcp", "dcp_files": 3}, ".metadata", "__0_1.distcp"),
        ({"format": "tensordict"}, "meta.json", "layers/1/w.memmap"),
    ],
)
def test_a_directory_upload_failing_partway_leaves_no_index(s3, bucket, tmp, kwargs, index, fails):
    arrays = checkpoint_arrays(0)
    src = tmp / "m.safetensors"
    zt.numpy.save_file(arrays, src)
    url = f"s3://{bucket}/run/step-1"
    client = s3.boto3()
    with FaultyProxy(s3.endpoint, failing_put(fails)) as proxy:
        options = {"endpoint": proxy.endpoint, "max_retries": 0}
        with pytest.raises(OSError) as failure:
            zt.convert(src, url, storage_options=options, **kwargs)
    assert [m for m, _ in proxy.failed] == ["PUT"], proxy.failed
    assert f"{url}/{fails}" in str(failure.value), failure.value
    keys = keys_under(client, bucket, "run/")
    assert f"run/step-1/{index}" not in keys, keys
    assert f"run/step-1/{fails}" not in keys, keys
    with pytest.raises((zt.FormatError, OSError)):
        zt.open(url + "/")
    # The server reachable again, the same write publishes a checkpoint.
    zt.convert(src, url, **kwargs)
    assert_reads(url + "/", arrays)


def test_a_failed_rewrite_keeps_the_earlier_checkpoint_or_withdraws_its_index(s3, bucket, tmp):
    """An earlier checkpoint (one `.distcp`) under the prefix: a rewrite in
    three files failing on a new file leaves the earlier one reading as it
    was; failing on the file it replaces (`__0_0.distcp`, after the earlier
    `.metadata` was withdrawn) leaves no `.metadata` at all, rather than one
    naming a replaced file."""
    old, new = checkpoint_arrays(1), checkpoint_arrays(2)
    old_src, new_src = tmp / "old.safetensors", tmp / "new.safetensors"
    zt.numpy.save_file(old, old_src)
    zt.numpy.save_file(new, new_src)
    url = f"s3://{bucket}/run/latest"
    client = s3.boto3()
    zt.convert(old_src, url, format="dcp", dcp_files=1)
    assert keys_under(client, bucket, "run/") == ["run/latest/.metadata", "run/latest/__0_0.distcp"]

    with FaultyProxy(s3.endpoint, failing_put("__0_2.distcp")) as proxy:
        with pytest.raises(OSError) as failure:
            write_dcp(new_src, url, proxy.endpoint)
    assert proxy.failed and f"{url}/__0_2.distcp" in str(failure.value), failure.value
    assert "run/latest/.metadata" in keys_under(client, bucket, "run/")
    assert_reads(url + "/", old)

    with FaultyProxy(s3.endpoint, failing_put("__0_0.distcp")) as proxy:
        with pytest.raises(OSError) as failure:
            write_dcp(new_src, url, proxy.endpoint)
    assert proxy.failed and f"{url}/__0_0.distcp" in str(failure.value), failure.value
    keys = keys_under(client, bucket, "run/")
    assert "run/latest/.metadata" not in keys, keys
    with pytest.raises((zt.FormatError, OSError)):
        zt.open(url + "/")

    write_dcp(new_src, url)
    assert_reads(url + "/", new)
