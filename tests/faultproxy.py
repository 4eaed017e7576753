"""A fault-injecting HTTP proxy of the tests' own, on 127.0.0.1, in front
of any of the suite's object-storage emulators (SeaweedFS, Azurite,
fake-gcs-server).

It forwards every request unchanged, the ``Host`` header included (S3's
SigV4 signs it), and answers it with the upstream's status, headers and
body, except where the test's ``decide(request)`` names a fault:

- ``500`` / ``503``: that status with an S3-style error body (every
  backend's client retries a 5xx by its status, whatever the body says),
  the request not forwarded;
- ``reset``: the connection closed with a TCP reset before any response;
- ``short``: the upstream's head (its full ``Content-Length``) and half
  its body, then the connection closed;
- ``stall``: the head and half the body, then nothing until the proxy
  stops (the client's idle timeout must give up on it);
- ``stall_head``: nothing at all until the proxy stops.

Stalled handlers wait on an event set when the proxy stops, never on a
sleep. ``first_attempts`` makes the usual predicate: a fault for the first
attempt of each distinct request, so every request is retried exactly
once, deterministically.

``host`` (fake-gcs-server, whose XML-API routes answer only its public
host) sends the upstream's own ``Host`` instead of the client's; never for
S3, whose signature covers it.
"""

from __future__ import annotations

import http.client
import http.server
import re
import socket
import struct
import threading
import urllib.parse
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """What ``decide`` sees of a request."""

    method: str
    path: str  # with the query
    range: str | None

    @property
    def query(self) -> str:
        return urllib.parse.urlsplit(self.path).query

    @property
    def is_listing(self) -> bool:
        """A listing in any of the three APIs: S3's ListObjectsV2, Azure's
        List Blobs, GCS's JSON objects.list."""
        split = urllib.parse.urlsplit(self.path)
        return self.method == "GET" and (
            "list-type=" in split.query
            or "comp=list" in split.query
            or re.fullmatch(r"/storage/v1/b/[^/]+/o", split.path) is not None
        )

    @property
    def is_read(self) -> bool:
        """A GET of an object's bytes (not a listing)."""
        return self.method == "GET" and not self.is_listing


FAULTS = ("500", "503", "reset", "short", "stall", "stall_head")

_HOP_HEADERS = ("connection", "keep-alive", "proxy-connection", "transfer-encoding", "content-length")


def _range_end(header: str | None) -> str | None:
    """What a retry of a ranged GET keeps of its ``Range``: a body resumed
    from where it stopped asks for ``bytes=<where>-<end>``, the same end."""
    if header is None or not header.startswith("bytes=") or "," in header:
        return header
    return header.split("-", 1)[1] if not header.startswith("bytes=-") else header


def first_attempts(fault: str, which=lambda r: r.is_read):
    """A ``decide`` giving ``fault`` to the first attempt of every distinct
    request ``which`` selects (method, path with query, the end of its
    range), and nothing to its retries, a body resumed from where it was
    cut off included."""
    seen: set[tuple[str, str, str | None]] = set()
    lock = threading.Lock()

    def decide(request: Request) -> str | None:
        if not which(request):
            return None
        key = (request.method, request.path, _range_end(request.range))
        with lock:
            first = key not in seen
            seen.add(key)
        return fault if first else None

    return decide


class FaultProxy:
    """Forwards to ``upstream`` (``http://127.0.0.1:PORT``), injecting the
    fault ``decide(request)`` names (``None``: forward). ``faulted`` lists
    ``(fault, request)`` in the order they were injected."""

    def __init__(self, upstream: str, decide, host: bool = False):
        target = urllib.parse.urlsplit(upstream)
        self.faulted: list[tuple[str, Request]] = []
        self.requests: list[Request] = []
        self.released = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(self.command, self.path, self.headers.get("Range"))
                fault = decide(request)
                proxy.requests.append(request)
                self.close_connection = True
                if fault is not None:
                    assert fault in FAULTS, fault
                    proxy.faulted.append((fault, request))
                if fault in ("500", "503"):
                    code = "SlowDown" if fault == "503" else "InternalError"
                    payload = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                    self.send_response(int(fault))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if fault == "reset":
                    # SO_LINGER 0: close() sends RST, not FIN.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                if fault == "stall_head":
                    proxy.released.wait()
                    return
                status, reason, headers, data = self.forward(request, body)
                self.send_response(status, reason)
                for name, value in headers:
                    if name.lower() not in _HOP_HEADERS:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                if self.command == "HEAD":
                    return
                if fault in ("short", "stall"):
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    if fault == "stall":
                        proxy.released.wait()
                    return
                self.wfile.write(data)

            def forward(self, request: Request, body: bytes):
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    conn.putrequest(request.method, request.path, skip_host=not host, skip_accept_encoding=True)
                    for name, value in self.headers.items():
                        if host and name.lower() == "host":
                            continue
                        if name.lower() not in _HOP_HEADERS or name.lower() == "content-length":
                            conn.putheader(name, value)
                    conn.endheaders(body or None)
                    reply = conn.getresponse()
                    return reply.status, reply.reason, reply.getheaders(), reply.read()
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_one

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def kinds(self) -> list[str]:
        return [fault for fault, _ in self.faulted]
