"""A slow object store in front of a fast one: a TCP proxy on 127.0.0.1 that
forwards every byte unchanged, waits `first_byte` seconds before the first
byte of each response, and caps the bandwidth of all its responses together
(one token bucket shared by every connection and port), counting what it
served. `conn_rate` also caps each connection on its own, as S3 serves one
connection at about 85-90 MB/s whatever the link: a client's speed then
depends on how many requests it keeps in flight.

Requests pass through byte for byte (the Host header a client signed with
SigV4 reaches the server as signed, and the server checks the signature
against it), so any S3 client works: point it at `endpoint(port)`.

Each listening port is counted apart (give each rank a port of its own to
learn what each fetched). A control port answers one JSON line of the
counters to every connection, so other processes can read them:
`read_counters(proxy.control)`.

Runs in a thread of the calling process (its own asyncio loop); `stop()`
closes it. Nothing else is started.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

CHUNK = 64 << 10
# How far a connection's pacing may catch up on late wake-ups (seconds).
CONN_SLACK = 0.050


class _Bucket:
    """Bandwidth shared by every response: each chunk is sent at the end of
    its slot on one virtual clock (first come, first served). `slack`: how
    far the clock may lag behind now, so that a sender woken late by a busy
    loop catches up (the per-connection cap: one connection's chunks come
    one after another, and each late wake-up would otherwise lower its
    rate below the cap); 0 keeps an idle link from saving up a burst."""

    def __init__(self, rate: float, slack: float = 0.0):
        self.rate, self.next, self.slack = rate, 0.0, slack

    async def take(self, n: int) -> None:
        now = time.monotonic()
        self.next = max(now - self.slack, self.next) + n / self.rate
        if self.next > now:
            await asyncio.sleep(self.next - now)


class Proxy:
    def __init__(
        self,
        upstream: str,
        ports: int = 1,
        rate: float = 64 << 20,
        first_byte: float = 0.020,
        conn_rate: float = 0.0,
    ):
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.rate, self.first_byte, self.conn_rate = rate, first_byte, conn_rate
        self.counters = [{"bytes": 0, "responses": 0, "requests_bytes": 0} for _ in range(ports)]
        self.ports: list[int] = []
        self.control = 0
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="throttle-proxy", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(ports), self._loop).result(10)

    def endpoint(self, index: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"

    def snapshot(self) -> list[dict]:
        return json.loads(json.dumps(self.counters))

    def stop(self) -> None:
        async def close():
            for s in self._servers:
                s.close()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # -- in the loop's thread

    async def _start(self, ports: int) -> None:
        self._bucket = _Bucket(self.rate)
        for index in range(ports):
            server = await asyncio.start_server(lambda r, w, index=index: self._connection(r, w, index), "127.0.0.1", 0)
            self._servers.append(server)
            self.ports.append(server.sockets[0].getsockname()[1])
        control = await asyncio.start_server(self._control, "127.0.0.1", 0)
        self._servers.append(control)
        self.control = control.sockets[0].getsockname()[1]

    async def _control(self, reader, writer) -> None:
        writer.write(json.dumps(self.counters).encode() + b"\n")
        await writer.drain()
        writer.close()

    async def _connection(self, client_r, client_w, index: int) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        # A request seen and its response not yet started: the next byte
        # from the server is a response's first.
        waiting = asyncio.Event()
        counter = self.counters[index]
        own = _Bucket(self.conn_rate, slack=CONN_SLACK) if self.conn_rate > 0 else None

        async def upward():
            while data := await client_r.read(CHUNK):
                counter["requests_bytes"] += len(data)
                waiting.set()
                server_w.write(data)
                await server_w.drain()
            if server_w.can_write_eof():
                server_w.write_eof()

        async def downward():
            while data := await server_r.read(CHUNK):
                if waiting.is_set():
                    waiting.clear()
                    counter["responses"] += 1
                    await asyncio.sleep(self.first_byte)
                    if own is not None:
                        own.next = time.monotonic()  # no credit saved up between responses
                if own is not None:
                    await own.take(len(data))
                await self._bucket.take(len(data))
                counter["bytes"] += len(data)
                client_w.write(data)
                await client_w.drain()

        up, down = asyncio.ensure_future(upward()), asyncio.ensure_future(downward())
        try:
            await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
            # The client closed its side: let the last response finish; the
            # server closed: the connection is done.
            if down.done():
                up.cancel()
            else:
                await asyncio.wait([down], timeout=60)
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for t in (up, down):
                t.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            for w in (client_w, server_w):
                w.close()
            self._tasks.discard(task)


def read_counters(control_port: int) -> list[dict]:
    """The counters of a proxy, from any process (its control port)."""
    with socket.create_connection(("127.0.0.1", control_port), timeout=10) as s:
        data = b""
        while not data.endswith(b"\n"):
            more = s.recv(65536)
            if not more:
                break
            data += more
    return json.loads(data)
