"""The shim inside a session's namespace: the two listeners that lead every TCP connection to the egress
proxy through the session's doorway (:mod:`.doorway`), the only way out (docs/network-policy.md, "How a
session is confined").

* 127.0.0.1:3128 (:data:`~.namespace.EXPLICIT_PORT`), the explicit proxy the session's ``HTTPS_PROXY`` names:
  each connection's bytes go to the egress proxy as they are, both ways; the egress proxy speaks HTTP proxy
  with the client itself.
* 127.0.0.1:3129 and [::1]:3129 (:data:`~.namespace.TRANSPARENT_PORT`), where the namespace's nat table
  redirects every other TCP connection: the shim learns where it was going (``SO_ORIGINAL_DST``), then which
  name that was: the stub DNS's name for a fake address, the gateway for the host's loopback, the IP
  literal itself when the policy allows that address, else what the first bytes ask for (TLS SNI, HTTP
  ``Host``), else the IP literal. Only that last case waits for the client's first bytes: a protocol whose
  server speaks first (SSH, SMTP) starts at once wherever the destination is known. It sends ``CONNECT
  name:port`` to the egress proxy; on ``200`` it sends the bytes it read ahead and pipes. On anything else it
  logs one line and, when the client started a plain HTTP request, answers it with the egress proxy's own
  answer (``403 Forbidden`` with its ``X-Devin-Egress-Denied`` line); any other client is closed (no
  answer is possible in TLS or an unknown protocol).

Limits: at most :attr:`Limits.connections` connections at once (the next ones are closed at once), bounded
waits for the first bytes and for the proxy's answer, and flow control both ways (a reader waits for its
writer to drain). An established tunnel has no idle timeout: a session's gateway connection idles for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import struct
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .peek import (
    MAX_PEEK_BYTES,
    MORE,
    Opening,
    PeekError,
    http_host,
    looks_like_tls,
    opening,
    tls_server_name,
)
from .policy import IPAddress, Policy
from .stubdns import FakeAddressBook

assert sys.platform == "linux"  # SO_ORIGINAL_DST is netfilter's (mypy skips the rest elsewhere)

from .doorway import Opener  # noqa: E402 (Linux only, as this module)

log = logging.getLogger(__name__)

_HTTP_METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE")
#: The most read at once, and the longest answer head to a CONNECT (the proxy's are a few lines).
CHUNK = 65536
#: ``SO_ORIGINAL_DST`` (linux/netfilter_ipv4.h), ``IP6T_SO_ORIGINAL_DST`` (linux/netfilter_ipv6/ip6_tables.h).
SO_ORIGINAL_DST = 80
_IPPROTO_IPV6 = 41


@dataclass(frozen=True)
class Limits:
    #: Connections (both listeners together) served at once.
    connections: int = 1024
    #: How long a redirected connection to an address the policy does not allow waits for its first bytes
    #: (a name in them may be allowed) before it is sent on as that address (and refused); and how long a
    #: refused one waits for them to tell whether it can be answered in HTTP.
    first_bytes_seconds: float = 1.0
    #: How long the rest of a ClientHello or an HTTP head may take once it started.
    peek_seconds: float = 10.0
    #: Opening a connection to the egress proxy, and its answer to a CONNECT (it connects upstream first).
    connect_seconds: float = 5.0
    reply_seconds: float = 60.0


class Shim:
    """Serves both listeners of one session; a connection to the egress proxy is opened for each one."""

    def __init__(
        self,
        egress: Opener,
        book: FakeAddressBook,
        loopback_gateway: Optional[tuple[str, int]] = None,
        limits: Limits = Limits(),
        policy: Optional[Policy] = None,
        destination_of: Optional[Callable[[Any], tuple[IPAddress, int]]] = None,
    ) -> None:
        #: Opens a connection to the session's egress proxy (through its doorway).
        self.egress = egress
        self.book = book
        self.loopback_gateway = loopback_gateway
        self.limits = limits
        #: The session's policy: an address it allows is asked for as that address, without waiting.
        self.policy = policy
        #: Where a redirected connection was going (``SO_ORIGINAL_DST``; a test without a nat table gives
        #: its own).
        self.destination_of = destination_of or original_destination
        self._slots = asyncio.Semaphore(limits.connections)

    async def explicit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A connection to the explicit proxy port: piped to the egress proxy as it is."""
        async with self._slot(writer) as admitted:
            if not admitted:
                return
            upstream = await self._open_egress(writer)
            if upstream is not None:
                await pipe_both(reader, writer, *upstream)

    async def transparent(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A redirected connection: ``CONNECT`` the name it meant, then pipe."""
        async with self._slot(writer) as admitted:
            if not admitted:
                return
            try:
                address, port = self.destination_of(writer.get_extra_info("socket"))
            except OSError:
                writer.close()  # a direct connection to this port, not a redirected one
                return
            if address.is_loopback or self.book.covers(address):
                target = self._known_name(address)
                if target is None:
                    log.warning(
                        "egress: a connection to %s:%d is closed: no name was handed out for it",
                        address,
                        port,
                    )
                    return
                await self._connect_and_pipe(target, port, b"", reader, writer)
            elif self.policy is not None and self.policy.check_name(str(address), port).allowed:
                await self._connect_and_pipe(str(address), port, b"", reader, writer)
            else:
                ahead = await self._read_ahead(reader)
                name = _peeked_name(ahead) or str(address)
                await self._connect_and_pipe(name, port, ahead, reader, writer)

    def _known_name(self, address: IPAddress) -> Optional[str]:
        """The name behind a fake address, or the gateway's for the host's loopback (the nat table redirects
        loopback only on the gateway's port, and only when the gateway is on the host's loopback)."""
        if address.is_loopback:
            return self.loopback_gateway[0] if self.loopback_gateway else None
        return self.book.name_for(address)

    async def _read_ahead(self, reader: asyncio.StreamReader) -> bytes:
        """The first bytes: until a ClientHello or an HTTP head is complete, or until it is clear they are
        neither."""
        try:
            ahead = await asyncio.wait_for(reader.read(MAX_PEEK_BYTES), self.limits.first_bytes_seconds)
        except asyncio.TimeoutError:
            return b""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.peek_seconds
        while ahead and len(ahead) < MAX_PEEK_BYTES and _peek(ahead) is MORE:
            try:
                wanted = MAX_PEEK_BYTES - len(ahead)
                more = await asyncio.wait_for(reader.read(wanted), deadline - loop.time())
            except asyncio.TimeoutError:
                break
            if not more:
                break
            ahead += more
        return ahead

    async def _connect_and_pipe(
        self, host: str, port: int, ahead: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        upstream = await self._open_egress(writer)
        if upstream is None:
            return
        up_reader, up_writer = upstream
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
        up_writer.write(request.encode("ascii", "replace"))
        try:
            head = await asyncio.wait_for(up_reader.readuntil(b"\r\n\r\n"), self.limits.reply_seconds)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            log.warning("egress: CONNECT %s: no answer from the egress proxy", authority)
            _close(writer, up_writer)
            return
        status, reason = _reply_status(head)
        if status != 200:
            log.warning("egress: CONNECT %s refused (%s)", authority, reason)
            await self._answer_refused(head, ahead, reader, writer, up_reader)
            _close(writer, up_writer)
            return
        if ahead:
            up_writer.write(ahead)
        await pipe_both(reader, writer, up_reader, up_writer)

    async def _answer_refused(
        self,
        head: bytes,
        ahead: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
    ) -> None:
        """Pass the egress proxy's answer on to a client that started a plain HTTP request (it was made for
        an HTTP client: status, ``X-Devin-Egress-Denied``, a one-line body, ``Connection: close``)."""
        if not ahead:
            ahead = await self._read_ahead(reader)
        if opening(ahead) is not Opening.HTTP:
            return
        try:
            body = await asyncio.wait_for(up_reader.read(CHUNK), self.limits.reply_seconds)
        except (asyncio.TimeoutError, OSError):
            body = b""
        with contextlib.suppress(OSError, asyncio.TimeoutError):
            writer.write(head + body)
            await writer.drain()
            writer.write_eof()
            # Read what the client still sends (its request's body) for a while: closing on unread bytes
            # would reset the connection, and the client could lose the answer.
            await asyncio.wait_for(_drop_until_end(reader), self.limits.first_bytes_seconds)

    async def _open_egress(
        self, client: asyncio.StreamWriter
    ) -> Optional[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        try:
            sock = await asyncio.wait_for(self.egress.open(), self.limits.connect_seconds)
            return await asyncio.open_unix_connection(sock=sock, limit=CHUNK)
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("egress: cannot reach the egress proxy: %s", exc or "timed out")
            client.close()
            return None

    @contextlib.asynccontextmanager
    async def _slot(self, writer: asyncio.StreamWriter) -> AsyncIterator[bool]:
        if self._slots.locked():
            log.warning("egress: %d connections already open; closing a new one", self.limits.connections)
            writer.close()
            yield False
            return
        async with self._slots:
            try:
                yield True
            finally:
                writer.close()


async def pipe_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until both sides are done; an end of file is passed on as one (half-close), an error
    on either side ends both."""
    first = asyncio.ensure_future(_copy(reader, up_writer))
    second = asyncio.ensure_future(_copy(up_reader, writer))
    try:
        pending: set[asyncio.Future[bool]] = {first, second}
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if not all(task.result() for task in done):
                break
    finally:
        for task in (first, second):
            task.cancel()
        _close(writer, up_writer)


async def serve(shim: Shim, explicit: Iterable[socket.socket], transparent: Iterable[socket.socket]) -> None:
    """Serve the listeners (bound, listening sockets) until cancelled."""
    servers = [await asyncio.start_server(shim.explicit, sock=sock, limit=CHUNK) for sock in explicit]
    servers += [await asyncio.start_server(shim.transparent, sock=sock, limit=CHUNK) for sock in transparent]
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            server.close()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Copy until end of file (True: passed on as a half-close) or an error (False)."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        return True
    except (ConnectionError, OSError):
        return False


async def _drop_until_end(reader: asyncio.StreamReader) -> None:
    while await reader.read(CHUNK):
        pass


def original_destination(sock: Any) -> tuple[IPAddress, int]:
    """Where a redirected connection was going (``SO_ORIGINAL_DST`` of a ``socket.socket`` or asyncio's
    ``TransportSocket``); OSError when it was not redirected."""
    if sock.family == socket.AF_INET6:
        raw = sock.getsockopt(_IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        return ipaddress.IPv6Address(raw[8:24]), struct.unpack_from("!H", raw, 2)[0]
    raw = sock.getsockopt(socket.IPPROTO_IP, SO_ORIGINAL_DST, 16)
    return ipaddress.IPv4Address(raw[4:8]), struct.unpack_from("!H", raw, 2)[0]


def _peek(ahead: bytes) -> object:
    """What the bytes so far ask for: a name, None (nothing to learn), or :data:`MORE`."""
    try:
        if looks_like_tls(ahead):
            return tls_server_name(ahead)
        kind = _http_start(ahead)
        if kind is True:
            return http_host(ahead)
        return MORE if kind is MORE else None
    except PeekError:
        return None


def _peeked_name(ahead: bytes) -> Optional[str]:
    found = _peek(ahead) if ahead else None
    return found if isinstance(found, str) and found else None


def _http_start(ahead: bytes) -> object:
    """True when ``ahead`` starts an HTTP request, :data:`MORE` when it may still, else False."""
    for method in _HTTP_METHODS:
        token = method + b" "
        if ahead.startswith(token):
            return True
        if token.startswith(ahead):
            return MORE
    return False


def _reply_status(head: bytes) -> tuple[int, str]:
    lines = head.decode("latin-1").split("\r\n")
    words = lines[0].split(" ", 2)
    status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    denied = next(
        (
            line.split(":", 1)[1].strip()
            for line in lines[1:]
            if line.lower().startswith("x-devin-egress-denied:")
        ),
        "",
    )
    return status, denied or lines[0].strip()


def _close(*writers: asyncio.StreamWriter) -> None:
    for writer in writers:
        with contextlib.suppress(Exception):
            writer.close()
