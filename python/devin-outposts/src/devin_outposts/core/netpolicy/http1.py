"""One plain HTTP/1 request through the egress proxy, and nothing after it (docs/network-policy.md, "What is
checked").

The policy judges a plain HTTP request by its host: the URL's (absolute-form), or the ``Host`` a tunnel's
first bytes carry. On a keep-alive connection the next request could name another host, and a server that
routes by ``Host`` (a reverse proxy, a CDN, a shared web host) would take it there. So the proxy sends on
exactly one request per plain-HTTP connection: its head with ``Connection: close`` (the upstream ends the
connection after its answer), its body as its framing says (``Content-Length``, or chunked up to the last
chunk and its trailers), and none of the client's bytes after it. Those are read and dropped until the
client ends, which is passed on to the upstream as a half-close. A client that sends a second request on
the connection gets no answer to it, then the end of the connection; HTTP clients then open a new one,
which is checked again.

A head whose body length cannot be told for sure (``Transfer-Encoding`` other than chunked, or with a
``Content-Length``; ``Content-Length`` values that disagree) is refused as a :class:`~.request.BadRequest`:
a proxy and a server that read it differently are how requests are smuggled past a check.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any, Optional, Union

from devin_outposts.core.netpolicy.request import BadRequest

#: Headers dropped from a tunnel's request head before ``Connection: close`` is added.
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-connection"))
#: The longest chunk-size line or trailer line read.
MAX_LINE_BYTES = 8192
#: How long a client may keep its side open once the upstream's answer has reached it.
LINGER_SECONDS = 5.0
_READ_BYTES = 65536


class Chunked:
    """The body is chunked (RFC 9112, 7.1)."""


CHUNKED = Chunked()
#: A request body's framing: its length in bytes, or :data:`CHUNKED`.
Framing = Union[int, Chunked]


def body_framing(head: bytes) -> Framing:
    """How long the body after a request ``head`` is. Raises :class:`BadRequest` when that is not sure."""
    lengths: set[str] = set()
    codings: list[str] = []
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, dummy_colon, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            lengths.update(part.strip() for part in value.split(","))
        elif name == "transfer-encoding":
            codings += [part.strip().lower() for part in value.split(",") if part.strip()]
    if codings:
        if lengths or codings[-1] != "chunked":
            raise BadRequest("a request body whose length cannot be told (Transfer-Encoding)")
        return CHUNKED
    if not lengths:
        return 0
    if len(lengths) > 1 or not all(length.isdigit() for length in lengths):
        raise BadRequest("a request with Content-Length values that are not one number")
    return int(lengths.pop())


def close_after(head: bytes) -> bytes:
    """A tunnel's request ``head`` (up to its blank line) without its hop-by-hop headers and with
    ``Connection: close``. Raises :class:`BadRequest` when its body's length is not sure."""
    body_framing(head)
    lines = head.decode("latin-1").split("\r\n")
    kept = [lines[0]]
    kept += [line for line in lines[1:] if line and line.partition(":")[0].strip().lower() not in _HOP_BY_HOP]
    return "\r\n".join([*kept, "Connection: close", "", ""]).encode("latin-1")


async def send_one(
    client: socket.socket, upstream: socket.socket, head: bytes, rest: bytes, downstream: asyncio.Future[int]
) -> None:
    """Send ``head`` (ending with ``Connection: close``) and its body (``rest``, then what the client sends)
    to the upstream; drop whatever the client sends after it. Returns once ``downstream`` (the relay of the
    upstream's answer to the client) has ended and the client has ended too, or once it had
    :data:`LINGER_SECONDS` to."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(upstream, head)
    source = _Source(client, rest)
    with contextlib.suppress(_ClientEnded):
        await _send_body(source, upstream, body_framing(head))
    discard = asyncio.ensure_future(_drop_until_end(client))
    try:
        either: set[asyncio.Future[Any]] = {discard, downstream}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if discard.done():
            discard.result()
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)  # the client ended: so does the request
            await downstream
            return
        downstream.result()  # the answer is through: the client ends next
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(discard), LINGER_SECONDS)
    finally:
        discard.cancel()
        await asyncio.gather(discard, return_exceptions=True)


class _ClientEnded(Exception):
    """The client ended (or broke) inside the request's body."""


class _Source:
    """The client's bytes: those already read, then the socket's."""

    def __init__(self, sock: socket.socket, buffered: bytes) -> None:
        self.sock = sock
        self.buffer = bytearray(buffered)

    async def fill(self) -> None:
        data = await asyncio.get_running_loop().sock_recv(self.sock, _READ_BYTES)
        if not data:
            raise _ClientEnded()
        self.buffer += data

    async def line(self) -> bytes:
        while (end := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > MAX_LINE_BYTES:
                raise _ClientEnded()  # not a chunked body: send no more of it
            await self.fill()
        line = bytes(self.buffer[: end + 1])
        del self.buffer[: end + 1]
        return line

    async def take(self, count: int) -> bytes:
        while len(self.buffer) < count:
            await self.fill()
        taken = bytes(self.buffer[:count])
        del self.buffer[:count]
        return taken

    async def forward(self, count: int, sink: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while count:
            if not self.buffer:
                await self.fill()
            piece = bytes(self.buffer[:count])
            del self.buffer[:count]
            await loop.sock_sendall(sink, piece)
            count -= len(piece)


async def _send_body(source: _Source, upstream: socket.socket, framing: Framing) -> None:
    """Send the body on. A chunked body is read strictly (CRLF line ends, hex sizes, CRLF after each
    chunk's data); at the first byte that breaks that, nothing more is sent: the upstream then holds a cut
    body, never bytes that the two of us could read as another request."""
    if isinstance(framing, int):
        await source.forward(framing, upstream)
        return
    loop = asyncio.get_running_loop()
    while True:
        line = await source.line()
        size = _chunk_size(line)
        if size is None:
            raise _ClientEnded()
        await loop.sock_sendall(upstream, line)
        if size == 0:
            break
        await source.forward(size, upstream)
        if await source.take(2) != b"\r\n":
            raise _ClientEnded()
        await loop.sock_sendall(upstream, b"\r\n")
    while True:  # the trailer section, up to its blank line
        line = await source.line()
        if not line.endswith(b"\r\n"):
            raise _ClientEnded()
        await loop.sock_sendall(upstream, line)
        if line == b"\r\n":
            return


def _chunk_size(line: bytes) -> Optional[int]:
    if not line.endswith(b"\r\n"):
        return None
    digits = line[:-2].split(b";", 1)[0].strip(b" \t")
    if not digits or len(digits) > 16 or any(byte not in b"0123456789abcdefABCDEF" for byte in digits):
        return None
    return int(digits, 16)


async def _drop_until_end(client: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError):
        while await loop.sock_recv(client, _READ_BYTES):
            pass
