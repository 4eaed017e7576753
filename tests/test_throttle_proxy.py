"""The benchmark proxy's per-connection cap (`harness/throttle_proxy.py`,
`Proxy(conn_rate=)`), which the capped whole-model rows of
`results/remote.md` rest on: each connection is paced to the cap on its
own (two connections together each get about the cap, not half of it),
and bytes pass through unchanged. Timed by the wall clock with generous
bounds; nothing sleeps here but the proxy's own pacing."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.throttle_proxy import Proxy

BODY = os.urandom(2 << 20)
CAP = 8 << 20  # bytes a second per connection: BODY in 0.25 s


class _Upstream(socketserver.ThreadingTCPServer):
    """Answers each line a connection sends with BODY (a stand-in server:
    the proxy only forwards bytes)."""

    daemon_threads = True
    allow_reuse_address = True

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            while self.rfile.readline():
                self.wfile.write(BODY)
                self.wfile.flush()


@pytest.fixture
def proxy():
    upstream = _Upstream(("127.0.0.1", 0), _Upstream.Handler)
    serving = threading.Thread(target=upstream.serve_forever, daemon=True)
    serving.start()
    host, port = upstream.server_address
    # The shared link far above two connections' caps, no first-byte wait:
    # only the per-connection cap paces.
    p = Proxy(f"http://{host}:{port}", rate=1 << 30, first_byte=0.0, conn_rate=CAP)
    try:
        yield p
    finally:
        p.stop()
        upstream.shutdown()
        upstream.server_close()


def fetch(port: int) -> tuple[bytes, float]:
    """One request over a fresh connection: the response and its time."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        start = time.monotonic()
        s.sendall(b"GET\n")
        got = bytearray()
        while len(got) < len(BODY):
            chunk = s.recv(1 << 20)
            assert chunk, "the proxy closed the connection early"
            got += chunk
        return bytes(got), time.monotonic() - start


def test_each_connection_gets_the_cap_and_bytes_pass_unchanged(proxy):
    port = proxy.ports[0]
    nominal = len(BODY) / CAP
    alone, alone_s = fetch(port)
    assert alone == BODY
    # Paced: not faster than the cap allows (less the 50 ms the pacing may
    # catch up on late wake-ups), whatever the machine's load.
    assert alone_s >= nominal - 0.06, alone_s
    with ThreadPoolExecutor(2) as pool:
        pair = list(pool.map(fetch, [port, port]))
    assert all(body == BODY for body, _ in pair)
    # Two at once: each at about its own cap, as alone; a cap shared by the
    # connections would take twice as long.
    together = max(s for _, s in pair)
    assert together >= nominal - 0.06, together
    assert together < 1.4 * max(alone_s, nominal), (together, alone_s)
    counted = proxy.snapshot()[0]
    assert counted["responses"] == 3 and counted["bytes"] == 3 * len(BODY), counted
