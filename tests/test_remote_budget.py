"""Remote reads wait on the network, not on threads: the number of requests
in flight is the budget's (``inflight_requests``), not the CPU count's.

A proxy of the test's own on 127.0.0.1 forwards every request to the real
S3 server (SeaweedFS, the ``s3`` fixture) unchanged, adding a first-byte
latency, and counts the GETs it is serving at once. On this 2-core machine
the old gathers (one blocking request batch per rayon thread) never had
more than two shards' requests in flight; now a gather, a model load and
the DataLoader's prefetch window each go past two and never past the
budget, and every byte equals the local store's or file's.
"""

from __future__ import annotations

import http.client
import http.server
import os
import threading
import time
import urllib.parse

import numpy as np
import pytest
import safetensors.numpy

import zt

RNG = np.random.default_rng(37)
# The first-byte latency the proxy adds to every response: long enough that
# requests sent together overlap at the proxy, short enough for a test.
LATENCY = 0.05


class CountingProxy:
    """Forwards to ``upstream`` after ``LATENCY``; ``peak`` is the most GETs
    it served at once, ``gets`` how many it served."""

    def __init__(self, upstream: str):
        target = urllib.parse.urlsplit(upstream)
        self.lock = threading.Lock()
        self.active = self.peak = self.gets = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                counted = self.command == "GET"
                if counted:
                    with proxy.lock:
                        proxy.active += 1
                        proxy.gets += 1
                        proxy.peak = max(proxy.peak, proxy.active)
                try:
                    time.sleep(LATENCY)  # the latency this proxy models, not a wait for an event
                    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                    try:
                        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                        for name, value in self.headers.items():
                            if name.lower() not in ("connection", "keep-alive", "proxy-connection"):
                                conn.putheader(name, value)
                        conn.endheaders(body or None)
                        reply = conn.getresponse()
                        data = reply.read()
                    finally:
                        conn.close()
                finally:
                    if counted:
                        with proxy.lock:
                            proxy.active -= 1
                self.send_response(reply.status, reply.reason)
                for name, value in reply.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding", "content-length", "keep-alive"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                self.close_connection = True

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 256
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def reset(self) -> None:
        with self.lock:
            self.peak = self.gets = 0

    def __enter__(self) -> CountingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def proxy(s3):
    with CountingProxy(s3.env["AWS_ENDPOINT_URL"]) as p:
        yield p


def upload_dir(s3, bucket: str, local, prefix: str) -> None:
    for f in sorted(local.iterdir()):
        s3.boto3().upload_file(os.fspath(f), bucket, f"{prefix}/{f.name}")


def dense_store(tmp, s3, bucket: str) -> tuple[str, object]:
    """4,096 records of 4 KiB in 8 shards, on disk and uploaded."""
    from zt.zrecord import Dense

    rows = RNG.integers(0, 255, size=(4096, 4096), dtype=np.uint8)
    with Dense.create(tmp / "rows.zr", np.uint8, (4096,), data_shards=8) as store:
        store.append(rows)
    upload_dir(s3, bucket, tmp / "rows.zr", "rows.zr")
    return f"s3://{bucket}/rows.zr", rows


def test_a_gather_keeps_the_budget_in_flight_on_two_cores(s3, bucket, tmp, proxy):
    from zt.zrecord import Dense

    url, rows = dense_store(tmp, s3, bucket)
    options = {"endpoint": proxy.endpoint, "inflight_requests": 8}
    idxs = RNG.choice(len(rows), size=256, replace=False)
    with Dense.open(url, storage_options=options) as remote, Dense.open(tmp / "rows.zr") as local:
        proxy.reset()
        got = remote[idxs]
        assert got.tobytes() == local[idxs].tobytes() == rows[idxs].tobytes()
    # Scattered 4 KiB records: far more requests than the budget (the
    # read-amplification bound keeps them from being merged into the
    # megabytes between them), more than two at a time, never past eight.
    assert proxy.gets > 8 * 4, proxy.gets
    assert 2 < proxy.peak <= 8, proxy.peak


def test_a_model_load_shares_the_budget(s3, bucket, tmp, proxy):
    arrays = {f"w{i}": RNG.standard_normal(1 << 18).astype(np.float32) for i in range(8)}  # 8 MiB
    safetensors.numpy.save_file(arrays, os.fspath(tmp / "m.safetensors"))
    s3.boto3().upload_file(os.fspath(tmp / "m.safetensors"), bucket, "m.safetensors")
    options = {"endpoint": proxy.endpoint, "inflight_requests": 3, "part_size": 64 << 10, "concurrency": 16}
    proxy.reset()
    got = zt.numpy.load_file(f"s3://{bucket}/m.safetensors", storage_options=options)
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in arrays.items()}
    # 64 KiB parts, 16 asked for at once per read: the budget holds them to 3.
    assert proxy.gets > 3 * 8, proxy.gets
    assert 2 < proxy.peak <= 3, proxy.peak


def test_the_dataloader_fetches_its_prefetch_window_ahead(s3, bucket, tmp, proxy):
    from zt.loader import IID, DataLoader
    from zt.zrecord import Dense

    url, _ = dense_store(tmp, s3, bucket)

    def batches(store, steps=8):
        with DataLoader({"x": store}, batch_size=4, mode=IID, seed=3, workers=1, prefetch=6) as dl:
            return [next(dl)["x"].tobytes() for _ in range(steps)]

    with Dense.open(tmp / "rows.zr") as local:
        want = batches(local)
    with Dense.open(url, storage_options={"endpoint": proxy.endpoint}) as remote:
        proxy.reset()
        assert batches(remote) == want
    # One worker, a step of 4 records (at most 4 requests): more in flight
    # at once than one step has, so later steps' gathers were in flight
    # while an earlier one was being gathered.
    assert proxy.peak > 4, proxy.peak
