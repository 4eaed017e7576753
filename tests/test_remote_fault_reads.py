"""Reads through faults (issue 37), the same tests against all three
object-storage emulators the suite starts on 127.0.0.1: SeaweedFS (S3),
fake-gcs-server (GCS) and Azurite (Azure), each behind the suite's
fault-injecting proxy (``faultproxy.py``).

Each fault hits the first attempt of every request it applies to, so every
request is retried exactly once, and ends as the README promises: a model
read back bit for bit against the safetensors library after 500s, 503s
(SlowDown), connection resets, bodies cut short and bodies stalled past
``idle_timeout``; a zrecord store's listing cut off or stalled is listed
again and the store's gathers equal the local store's; a server that stalls
every response is ``OSError`` within ``(max_retries + 1) × idle_timeout``
and the backoff. Retries are counted in ``zt.remote_stats()``.

Objects are put with each server's own API (boto3, fake-gcs-server's JSON
API, Azure's REST API), never through zt. Every fault is injected for every
backend: the proxy forwards bytes, so none depends on the server.
"""

from __future__ import annotations

import os
import pathlib
import time
from dataclasses import dataclass

import numpy as np
import pytest
import safetensors.numpy
from faultproxy import FaultProxy, first_attempts

import zt

RNG = np.random.default_rng(37_2)
IDLE = 0.5  # seconds: idle_timeout for the stall tests


@dataclass
class Backend:
    """One bucket or container of an emulator, addressed through a proxy."""

    scheme: str
    upstream: str  # the server's endpoint, what the proxy forwards to
    root: str
    put: object  # put(key, bytes) with the server's own API

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.root}/{key}"

    def options(self, proxy: FaultProxy, **more) -> dict:
        """Storage options sending this backend's requests to ``proxy``."""
        endpoint = proxy.endpoint
        if self.scheme == "az":
            # Azurite's blob endpoint is path style: the account is in it.
            endpoint += "/" + self.upstream.rsplit("/", 1)[1]
        return {"endpoint": endpoint, **more}

    def proxy(self, decide) -> FaultProxy:
        origin = "/".join(self.upstream.split("/")[:3])
        return FaultProxy(origin, decide, host=self.scheme == "gs")


@pytest.fixture(params=["s3", "gs", "az"])
def backend(request) -> Backend:
    if request.param == "s3":
        s3, bucket = request.getfixturevalue("s3"), request.getfixturevalue("bucket")
        client = s3.boto3()
        return Backend("s3", s3.endpoint, bucket, lambda k, b: client.put_object(Bucket=bucket, Key=k, Body=b))
    if request.param == "gs":
        gcs, bucket = request.getfixturevalue("gcs"), request.getfixturevalue("gcs_bucket")
        return Backend("gs", gcs.endpoint, bucket, lambda k, b: gcs.put(bucket, k, b))
    azure, container = request.getfixturevalue("azure"), request.getfixturevalue("azure_container")
    return Backend("az", azure.endpoint, container, lambda k, b: azure.put(container, k, b))


def model(tmp: pathlib.Path) -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    """2 MiB of safetensors: its middle lies past the head and tail an open
    fetches, so the load makes ranged GETs of its own."""
    arrays = {
        "embed": RNG.standard_normal((512, 1024)).astype(np.float32),
        "bias": RNG.integers(-9, 9, size=7).astype(np.int64),
    }
    path = tmp / "model.safetensors"
    safetensors.numpy.save_file(arrays, os.fspath(path))
    return path, safetensors.numpy.load_file(os.fspath(path))


def moved(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


@pytest.mark.parametrize("fault", ["500", "503", "reset", "short", "stall"])
def test_a_model_reads_back_bit_for_bit_through_faults(backend, tmp, fault):
    path, want = model(tmp)
    url = backend.url("m/model.safetensors")
    backend.put("m/model.safetensors", path.read_bytes())
    with backend.proxy(first_attempts(fault)) as proxy:
        before = zt.remote_stats()
        got = zt.numpy.load_file(url, storage_options=backend.options(proxy, idle_timeout=IDLE))
        after = zt.remote_stats()
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes(), name
    assert proxy.faulted and all(kind == fault for kind in proxy.kinds())
    assert moved(before, after)["retries"] >= len(proxy.faulted), (moved(before, after), proxy.faulted)


def store(tmp: pathlib.Path, backend: Backend):
    """A zrecord store of 4 shards built locally, put under the backend's
    prefix object by object; the local store's path and the records."""
    from zt.zrecord import Ragged

    records = [RNG.integers(0, 1 << 20, size=int(n), dtype=np.int32) for n in RNG.integers(1, 300, size=200)]
    local = tmp / "rows.zr"
    with Ragged.create(local, np.int32, 1, codec="zstd") as s:
        s.append(records)
    for f in sorted(local.iterdir()):
        backend.put(f"s/rows.zr/{f.name}", f.read_bytes())
    return local, records


@pytest.mark.parametrize("fault", ["500", "reset", "short", "stall"])
def test_a_listing_cut_off_or_stalled_is_listed_again(backend, tmp, fault):
    from zt.zrecord import Ragged

    local, records = store(tmp, backend)
    idxs = RNG.permutation(len(records))[:64]
    with backend.proxy(first_attempts(fault, lambda r: r.is_listing)) as proxy:
        before = zt.remote_stats()
        with Ragged.open(backend.url("s/rows.zr"), storage_options=backend.options(proxy, idle_timeout=IDLE)) as remote:
            values, offsets, _ = remote.gather_packed(idxs)
        after = zt.remote_stats()
    assert proxy.kinds() == [fault], proxy.faulted
    assert proxy.faulted[0][1].is_listing
    assert moved(before, after)["retries"] >= 1
    with Ragged.open(local) as want:
        lv, lo, _ = want.gather_packed(idxs)
    assert values.tobytes() == lv.tobytes() and offsets.tolist() == lo.tolist()


def test_a_server_that_stalls_every_response_is_oserror_in_bounded_time(backend, tmp):
    path, _ = model(tmp)
    backend.put("m/model.safetensors", path.read_bytes())
    retries, idle = 1, 0.3
    with backend.proxy(lambda r: "stall_head" if r.is_read else None) as proxy:
        start = time.monotonic()
        with pytest.raises(OSError):
            zt.numpy.load_file(
                backend.url("m/model.safetensors"),
                storage_options=backend.options(proxy, idle_timeout=idle, max_retries=retries),
            )
        took = time.monotonic() - start
    # Each attempt abandoned after `idle`; the backoff between them is
    # object_store's (from 100 ms, at most doubling per retry), bounded.
    assert len(proxy.faulted) >= retries + 1
    assert took < (retries + 1) * idle + 5, took
