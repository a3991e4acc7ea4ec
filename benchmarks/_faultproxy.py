"""A fault-injecting HTTP/1.1 reverse proxy for the soak benchmark (standard library only).

It sits between workers and the simulator and forwards each request on a connection of its own to the
simulator, streaming the answer back as it arrives (SSE included: chunked bodies are relayed chunk by
chunk). On command it:

* **drops streams**: aborts every connection that is relaying a watch stream (``watch=true``), so the
  client sees a reset in the middle of a chunked body, not a clean end;
* **goes down**: closes its listening socket (new connections are refused) and aborts every open
  connection, until it is brought back on the same port;
* **fails requests**: answers ``500 {"detail": "injected fault"}`` to every request while failing is on
  (streams already open carry on).

It understands just enough HTTP/1.1 for the worker's client (httpx): a request head, a body framed by
``Content-Length`` or chunked, and a response framed by ``Content-Length``, chunked, or the end of the
connection. It runs its own event loop in a daemon thread; the commands are safe to call from any other
thread.

Besides the totals in ``counts``, ``routes`` counts the requests it forwarded by method and path, ids
replaced by ``{id}`` and watch streams marked (``GET /opbeta/outposts/devins/{id}``, ``... (watch)``),
so a benchmark can say which calls a client makes per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

T = TypeVar("T")
HEAD_LIMIT = 1 << 20  # a request or response head (and a chunk-size line) larger than this is refused
READ_SIZE = 1 << 16
#: Seconds an idle upstream connection is reused (below uvicorn's 5 s keep-alive timeout).
UPSTREAM_IDLE_REUSE = 2.0
INJECTED_500 = b'{"detail":"injected fault"}'
RESPONSE_500 = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\n\r\n" % len(INJECTED_500)
) + INJECTED_500
RESPONSE_502 = b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class ProxyError(Exception):
    """The proxy itself could not do what it was told (not a fault it injects)."""


def parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """The start line and the headers (lower-cased names; a repeated header keeps its last value)."""
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def route_of(start: str) -> str:
    """``METHOD /path`` of a request line, the id after ``devins``/``outposts`` replaced by ``{id}`` and a
    watch stream marked ``(watch)``."""
    method, target = [*start.split(" "), "", ""][:2]
    path, dummy, query = target.partition("?")
    segments = path.split("/")
    for index in range(1, len(segments)):
        if segments[index - 1] in ("devins", "outposts") and segments[index] not in ("devins", "outposts"):
            segments[index] = "{id}"
    return f"{method} {'/'.join(segments)}" + (" (watch)" if "watch=true" in query else "")


def wants_close(headers: dict[str, str]) -> bool:
    return "close" in headers.get("connection", "").lower()


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: Optional[asyncio.StreamWriter] = None
    streaming: bool = False

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class FaultProxy:
    """``FaultProxy(upstream_host, upstream_port).start()``; then ``url``, the commands and ``counts``."""

    def __init__(
        self, upstream_host: str, upstream_port: int, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.port = port
        self.counts: Counter[str] = Counter()
        self.routes: Counter[str] = Counter()
        self._failing = False
        self._down = False
        self._connections: set[_Connection] = set()
        self._server: Optional[asyncio.AbstractServer] = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- commands (any thread) --------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._listen())
        return self

    def drop_streams(self) -> int:
        """Abort every connection relaying a watch stream; returns how many."""
        return self._call(self._drop(streams_only=True))

    def go_down(self) -> int:
        """Refuse new connections and abort every open one; returns how many were aborted."""
        return self._call(self._go_down())

    def come_back(self) -> None:
        self._call(self._come_back())

    def set_failing(self, failing: bool) -> None:
        """Answer 500 to every new request while ``failing``."""
        self._loop.call_soon_threadsafe(setattr, self, "_failing", failing)

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        """``counts`` and ``routes`` as of now (copied on the proxy's loop, so never mid-update)."""

        async def take() -> tuple[dict[str, int], dict[str, int]]:
            return dict(self.counts), dict(self.routes)

        return self._call(take())

    def open_streams(self) -> int:
        return sum(1 for conn in list(self._connections) if conn.streaming)

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._go_down(), timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running():
            self._loop.close()

    # --- on the proxy's loop ----------------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=HEAD_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]
        self._down = False

    async def _drop(self, *, streams_only: bool) -> int:
        dropped = 0
        for conn in list(self._connections):
            if conn.streaming or not streams_only:
                conn.abort()
                dropped += 1
        self.counts["streams_dropped" if streams_only else "connections_aborted"] += dropped
        return dropped

    async def _go_down(self) -> int:
        self._down = True
        if self._server is not None:
            self._server.close()
            self._server = None
        return await self._drop(streams_only=False)

    async def _come_back(self) -> None:
        if self._server is None:
            await self._listen()  # the same port: asyncio sets SO_REUSEADDR

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._down:  # accepted just before the listener closed
            writer.transport.abort()
            return
        conn = _Connection(writer)
        self._connections.add(conn)
        upstream: Optional[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = None
        last_used = 0.0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed its idle keep-alive connection
                start, headers = parse_head(head)
                body = await read_body(reader, headers)
                self.counts["requests"] += 1
                self.routes[route_of(start)] += 1
                if self._failing:
                    self.counts["injected_500"] += 1
                    writer.write(RESPONSE_500)
                    await writer.drain()
                    if wants_close(headers):
                        return
                    continue
                if upstream is not None and (
                    upstream[0].at_eof() or time.monotonic() - last_used > UPSTREAM_IDLE_REUSE
                ):
                    # The simulator (uvicorn) closes keep-alive connections idle for 5 s: a request
                    # written into one it is closing would fail as if we had injected a fault.
                    upstream[1].transport.abort()
                    upstream = None
                if upstream is None:
                    try:
                        upstream = await asyncio.open_connection(*self.upstream, limit=HEAD_LIMIT)
                    except OSError:
                        self.counts["upstream_refused"] += 1
                        writer.write(RESPONSE_502)
                        await writer.drain()
                        return
                    conn.upstream = upstream[1]
                upstream[1].write(head + body)
                await upstream[1].drain()
                method, target = [*start.split(" "), "", ""][:2]
                conn.streaming = "watch=true" in target
                keep = await relay_response(upstream[0], writer, method)
                conn.streaming = False
                last_used = time.monotonic()
                if not keep or wants_close(headers):
                    return
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            return  # an aborted connection (ours or theirs), or a malformed message: drop it
        finally:
            self._connections.discard(conn)
            conn.abort()


async def read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """A request body, as received (chunked bodies keep their framing)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            line = await reader.readuntil(b"\r\n")
            parts.append(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:  # trailers, then the empty line
                    trailer = await reader.readuntil(b"\r\n")
                    parts.append(trailer)
                    if trailer == b"\r\n":
                        return b"".join(parts)
            parts.append(await reader.readexactly(size + 2))
    length = int(headers.get("content-length", "0") or 0)
    return await reader.readexactly(length) if length else b""


async def relay_response(upstream: asyncio.StreamReader, client: asyncio.StreamWriter, method: str) -> bool:
    """Relay one response as it arrives; returns whether the connection may carry another request."""
    head = await upstream.readuntil(b"\r\n\r\n")
    client.write(head)
    start, headers = parse_head(head)
    status = int(start.split(" ", 2)[1])
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        await client.drain()
        return not wants_close(headers)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = await upstream.readuntil(b"\r\n")
            client.write(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:
                    trailer = await upstream.readuntil(b"\r\n")
                    client.write(trailer)
                    if trailer == b"\r\n":
                        break
                break
            client.write(await upstream.readexactly(size + 2))
            await client.drain()  # an SSE event reaches the client now, not when the stream ends
    elif "content-length" in headers:
        remaining = int(headers["content-length"])
        while remaining > 0:
            data = await upstream.read(min(remaining, READ_SIZE))
            if not data:
                raise asyncio.IncompleteReadError(b"", remaining)
            client.write(data)
            remaining -= len(data)
    else:  # delimited by the end of the connection
        while True:
            data = await upstream.read(READ_SIZE)
            if not data:
                break
            client.write(data)
            await client.drain()
        await client.drain()
        return False
    await client.drain()
    return not wants_close(headers)
