"""The egress proxy of one session: the only way out of the session's network namespace, checked against
its network policy (docs/network-policy.md, "The egress proxy").

It runs inside the worker's process, on the worker's event loop, and listens on a Unix socket
(``<session dir>/egress.sock``, mode 0600) that the shim inside the session's namespace connects to. The
protocol on that socket is a plain HTTP proxy:

* ``CONNECT host:port HTTP/1.1``: ``200 Connection established`` and a tunnel; ``403 Forbidden`` (the rule
  and the reason in the body and in an ``X-Devin-Egress-Denied`` header, one line each) when the policy
  denies it; ``502 Bad Gateway`` when it allows it but no allowed address answers; ``400 Bad Request`` for
  anything malformed. Once the tunnel is open, the client's first bytes are peeked before any of them is
  sent on: a TLS ClientHello's server name must be the CONNECT host (no server name is accepted only when
  the CONNECT host is an IP address), a plain HTTP request's ``Host`` must be it, and anything else (SSH,
  a database protocol) passes as raw TCP. A refused peek closes both sides: the upstream has seen a
  connection and none of the client's bytes. Bytes from the upstream reach the client at once, so a
  protocol whose server speaks first works.
* Absolute-form plain HTTP (``GET http://host[:port]/path HTTP/1.1``): the same checks on the URL's host
  (and its ``Host`` header, if any, must name the same host), then the request is sent on in origin-form,
  without its ``Proxy-*`` headers and with ``Connection: close``, and the rest is relayed both ways.

Names are resolved here and only after :meth:`Policy.check_name` allowed them, so a query for a denied
name is never sent; the proxy connects only to addresses :meth:`Policy.check_address` allows (the
rebinding guard), in the resolver's order, never to an address the client gave for a name.

Each connection gets one verdict: a refusal (403, or a refused peek) is *denied*; a tunnel or a request
sent on, or one the policy allowed but no upstream answered (502), is *allowed*. The verdict goes to
``observer(decision, destination, session_id, outpost_id)`` (for example :meth:`Metrics.count_egress
<devin_outposts.core.metrics.Metrics.count_egress>`) and to the log: a denial at WARNING, one line
(``network policy: session <sid> (outpost <oid>): denied <host>:<port> by <rule>: <reason>``), an allowed
connection at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import stat
import sys
from collections.abc import Awaitable, Sequence
from typing import Callable, NamedTuple, Optional, Union
from urllib.parse import urlsplit

from devin_outposts.core.netpolicy import peek
from devin_outposts.core.netpolicy.policy import Decision, IPAddress, Policy, ip_literal, normalise_host

log = logging.getLogger(__name__)

#: The longest request head (request line and headers) the proxy reads.
MAX_HEAD_BYTES = 16 * 1024
#: How much one read of a tunnel takes at most; the stream buffers hold a few of these before the
#: reading side pauses (backpressure).
CHUNK_BYTES = 256 * 1024
#: The peek's own name in a decision.
PEEK_RULE = "the CONNECT host"
REQUEST_HOST_RULE = "the request's host"

Address = Union[str, IPAddress]
#: ``resolve(host, port)``: the addresses of ``host``, in the order to try them.
Resolver = Callable[[str, int], Awaitable[Sequence[Address]]]


class Destination(NamedTuple):
    """Where a client asked to go: a name or an IP literal (normalised), and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


#: ``observer(decision, destination, session_id, outpost_id)``: told each connection's verdict.
Observer = Callable[[Decision, Destination, str, str], None]


class ProxyError(Exception):
    """The proxy cannot start (its socket path is taken, or cannot be bound)."""


class _Answer(Exception):
    """Ends a request before any tunnel with an HTTP status; for 403 and 502 also the connection's verdict
    (the decision and where the client asked to go)."""

    def __init__(
        self,
        status: str,
        detail: str = "",
        decision: Optional[Decision] = None,
        destination: Optional[Destination] = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.decision = decision
        self.destination = destination


class EgressProxy:
    """One session's egress proxy on a Unix socket: ``await start()``, then ``await close()``."""

    def __init__(
        self,
        policy: Policy,
        *,
        session_id: str,
        outpost_id: str,
        socket_path: Union[str, os.PathLike[str]],
        resolve: Optional[Resolver] = None,
        observer: Optional[Observer] = None,
        connect_timeout: float = 10.0,
        head_timeout: float = 10.0,
    ) -> None:
        self.policy = policy
        self.session_id = session_id
        self.outpost_id = outpost_id
        self.socket_path = os.fspath(socket_path)
        self.resolve: Resolver = resolve or _getaddrinfo
        self.observer = observer
        self.connect_timeout = connect_timeout
        #: How long a client may take to send its request head (then it is dropped without an answer).
        self.head_timeout = head_timeout
        #: Connections allowed and denied so far (each connection counts once).
        self.allowed = 0
        self.denied = 0
        self._listener: Optional[socket.socket] = None
        self._acceptor: Optional[asyncio.Task[None]] = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._socket_inode: Optional[tuple[int, int]] = None

    async def start(self) -> None:
        """Listen on :attr:`socket_path` (0600 from the moment it appears). A stale socket left there by a
        dead process is replaced; anything else there (a file, a live socket) is a :class:`ProxyError`."""
        _remove_stale_socket(self.socket_path)
        listener = _unix_socket()
        # Bound under a temporary name, made 0600, then renamed into place: no moment at which the socket
        # exists with the umask's mode (changing the umask would change it for every thread).
        temporary = os.path.join(os.path.dirname(self.socket_path) or ".", f".{secrets.token_hex(4)}")
        try:
            listener.bind(temporary)
            os.chmod(temporary, 0o600)
            os.rename(temporary, self.socket_path)
            listener.listen(128)
            listener.setblocking(False)
        except OSError as exc:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise ProxyError(
                f"Could not listen on {self.socket_path} for session {self.session_id}: {exc}"
            ) from exc
        info = os.stat(self.socket_path)
        self._socket_inode = (info.st_dev, info.st_ino)
        self._listener = listener
        self._acceptor = asyncio.ensure_future(self._accept(listener))
        log.debug("network policy: session %s: egress proxy on %s", self.session_id, self.socket_path)

    async def close(self) -> None:
        """Stop listening, end every open connection and tunnel, and remove the socket (if still ours)."""
        if self._acceptor is not None:
            self._acceptor.cancel()
            await asyncio.gather(self._acceptor, return_exceptions=True)
            self._acceptor = None
        if self._listener is not None:
            self._listener.close()  # connections still in its backlog are reset
            self._listener = None
        handlers = list(self._handlers)
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        with contextlib.suppress(OSError):
            info = os.stat(self.socket_path)
            if (info.st_dev, info.st_ino) == self._socket_inode:
                os.unlink(self.socket_path)

    async def _accept(self, listener: socket.socket) -> None:
        """Accept clients, each served by a task of its own (an accept loop of our own, not
        ``asyncio.start_unix_server``: close() then holds every accepted connection and can end it)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                connection, dummy_address = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, say: wait instead of spinning
                log.warning(
                    "network policy: session %s: could not accept a connection: %s", self.session_id, exc
                )
                await asyncio.sleep(0.5)
                continue
            handler = asyncio.ensure_future(self._handle(connection))
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)

    # --- one client connection -------------------------------------------------------------------------

    async def _handle(self, connection: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=connection, limit=CHUNK_BYTES)
        except OSError:
            connection.close()
            return
        opened = [writer]  # the streams to close when done, the upstream's once connected
        try:
            head = await self._read_head(reader)
            if head is None:
                return
            await self._serve_request(head, reader, writer, opened)
        except _Answer as answer:
            if answer.decision is not None and answer.destination is not None:
                self._verdict(answer.decision, answer.destination)
            await self._answer(writer, answer)
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to tell it
        finally:
            for stream in opened:
                stream.transport.abort()

    async def _read_head(self, reader: asyncio.StreamReader) -> Optional[bytes]:
        """The request head up to its blank line; None when the client sent nothing in time or closed."""
        try:
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_timeout)
        except asyncio.TimeoutError:
            log.debug("network policy: session %s: a client sent no request in time", self.session_id)
            return None
        except asyncio.IncompleteReadError:
            return None
        except asyncio.LimitOverrunError as exc:
            raise _Answer(
                "400 Bad Request", f"the request head is longer than {MAX_HEAD_BYTES} bytes"
            ) from exc

    async def _serve_request(
        self,
        head: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        opened: list[asyncio.StreamWriter],
    ) -> None:
        """Answer one request head (the upstream's stream, once connected, is added to ``opened``)."""
        if len(head) > MAX_HEAD_BYTES:
            raise _Answer("400 Bad Request", f"the request head is longer than {MAX_HEAD_BYTES} bytes")
        request_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _Answer("400 Bad Request", "the request line is not METHOD TARGET HTTP/1.x")
        method, target, dummy_version = parts
        if method == "CONNECT":
            destination = _connect_destination(target)
            up_reader, up_writer, decision = await self._open(destination, opened)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await self._tunnel(destination, decision, reader, writer, up_reader, up_writer)
            return
        destination, origin_form = _absolute_form(target)
        forwarded = _forwarded_head(method, origin_form, header_lines, destination)
        up_reader, up_writer, decision = await self._open(destination, opened)
        self._verdict(decision, destination)
        up_writer.write(forwarded)
        await _relay_both(reader, writer, up_reader, up_writer)

    async def _open(
        self, destination: Destination, opened: list[asyncio.StreamWriter]
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Decision]:
        """Check the name, resolve it, connect to the first allowed address that answers."""
        host, port = destination
        decision = self.policy.check_name(host, port)
        if not decision.allowed:
            raise _Answer("403 Forbidden", decision=decision, destination=destination)
        literal = ip_literal(host)
        addresses: Sequence[Address]
        if literal is not None:
            addresses = [literal]
        else:
            try:
                addresses = await asyncio.wait_for(self.resolve(host, port), self.connect_timeout)
            except (OSError, asyncio.TimeoutError) as exc:
                detail = f"could not resolve {host}: {exc or 'timed out'}"
                raise _Answer("502 Bad Gateway", detail, decision, destination) from exc
        refusal: Optional[Decision] = None
        failures: list[str] = []
        for address in addresses:
            verdict = self.policy.check_address(host, port, address)
            if not verdict.allowed:
                refusal = refusal or verdict
                continue
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(str(address), port, limit=CHUNK_BYTES), self.connect_timeout
                )
            except (OSError, asyncio.TimeoutError) as exc:
                failures.append(f"{address}: {exc or 'timed out'}")
                continue
            opened.append(up_writer)
            return up_reader, up_writer, verdict
        if failures:
            detail = f"could not connect to {destination}: {'; '.join(failures)}"
            raise _Answer("502 Bad Gateway", detail, decision, destination)
        if refusal is not None:
            raise _Answer("403 Forbidden", decision=refusal, destination=destination)
        raise _Answer("502 Bad Gateway", f"{host} has no address", decision, destination)

    async def _tunnel(
        self,
        destination: Destination,
        decision: Decision,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        """After the 200: the upstream's bytes flow at once; the client's wait for the peek's verdict."""
        downstream = asyncio.ensure_future(_relay(up_reader, writer))
        try:
            first, refusal = await self._peek(destination, reader)
            if refusal is not None:
                self._verdict(refusal, destination)
                return
            self._verdict(decision, destination)
            if first:
                up_writer.write(first)
                await _relay(reader, up_writer)
            elif up_writer.can_write_eof():
                up_writer.write_eof()  # the client ended without a byte
            await downstream
        finally:
            downstream.cancel()

    async def _peek(
        self, destination: Destination, reader: asyncio.StreamReader
    ) -> tuple[bytes, Optional[Decision]]:
        """The client's first bytes (empty: it ended without any), and a refusal if they name another host."""
        data = b""
        while True:
            opening = peek.opening(data)
            if opening is peek.Opening.RAW:
                return data, None
            try:
                if opening is peek.Opening.TLS:
                    name = peek.tls_server_name(data)
                elif opening is peek.Opening.HTTP:
                    name = peek.http_host(data)
                else:
                    name = peek.MORE
            except peek.PeekError as exc:
                return data, Decision(False, PEEK_RULE, f"{exc}, in a tunnel to {destination}")
            if name is not peek.MORE:
                return data, self._check_peeked(destination, opening, name)
            if len(data) >= peek.MAX_PEEK_BYTES:
                return data, Decision(
                    False, PEEK_RULE, f"no name in the first {len(data)} bytes to {destination}"
                )
            more = await reader.read(peek.MAX_PEEK_BYTES - len(data))
            if not more:
                return data, (
                    None if not data else Decision(False, PEEK_RULE, "the client ended mid-handshake")
                )
            data += more

    @staticmethod
    def _check_peeked(destination: Destination, opening: object, name: object) -> Optional[Decision]:
        what = "TLS server name" if opening is peek.Opening.TLS else "HTTP Host"
        if name is None and ip_literal(destination.host) is not None:
            return None  # TLS to an IP address carries no server name
        if not isinstance(name, str) or normalise_host(name) != destination.host:
            return Decision(False, PEEK_RULE, f"the {what} {_printable(str(name))} is not {destination.host}")
        return None

    # --- verdicts and answers --------------------------------------------------------------------------

    def _verdict(self, decision: Decision, destination: Destination) -> None:
        if decision.allowed:
            self.allowed += 1
            log.debug("network policy: session %s (outpost %s): allowed %s by %s: %s", self.session_id,
                      self.outpost_id, destination, decision.rule, decision.reason)  # fmt: skip
        else:
            self.denied += 1
            log.warning("network policy: session %s (outpost %s): denied %s by %s: %s", self.session_id,
                        self.outpost_id, destination, decision.rule, _printable(decision.reason))  # fmt: skip
        if self.observer is not None:
            self.observer(decision, destination, self.session_id, self.outpost_id)

    async def _answer(self, writer: asyncio.StreamWriter, answer: _Answer) -> None:
        extra = ""
        if answer.decision is not None and not answer.decision.allowed:
            text = _printable(f"{answer.decision.rule}: {answer.decision.reason}")
            extra = f"X-Devin-Egress-Denied: {text}\r\n"
            body = f"network policy: denied by {text}\n"
        else:
            body = f"{_printable(answer.detail)}\n"
        payload = body.encode("utf-8", "replace")
        writer.write(
            f"HTTP/1.1 {answer.status}\r\nContent-Type: text/plain; charset=utf-8\r\n{extra}"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode("utf-8", "replace")
            + payload
        )
        with contextlib.suppress(ConnectionError):
            await writer.drain()


# --- the pieces ----------------------------------------------------------------------------------------


async def _getaddrinfo(host: str, port: int) -> list[Address]:
    """The system resolver's addresses for ``host`` (TCP), without duplicates, in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _unix_socket() -> socket.socket:
    if sys.platform == "win32":  # keeps the module importable there
        raise ProxyError("The egress proxy listens on a Unix socket: Linux only")
    else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
        return socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)


def _remove_stale_socket(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ProxyError(f"Could not listen on {path}: it exists and is not a socket")
    with _unix_socket() as probe:
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.unlink(path)  # nobody listens: left by a process that died
            return
        except OSError as exc:
            raise ProxyError(f"Could not listen on {path}: {exc}") from exc
    raise ProxyError(f"Could not listen on {path}: another process is listening on it")


def _connect_destination(target: str) -> Destination:
    try:
        host, port = peek.split_host_port(target)
    except peek.PeekError as exc:
        raise _Answer("400 Bad Request", f"CONNECT {target}: {exc}") from exc
    if not host or port is None:
        raise _Answer("400 Bad Request", f"CONNECT {target}: the target must be host:port")
    return Destination(normalise_host(host), port)


def _absolute_form(target: str) -> tuple[Destination, str]:
    """An absolute-form ``http://`` target: where it goes, and the target in origin-form."""
    parts = urlsplit(target)
    if parts.scheme.lower() != "http" or not parts.netloc or "@" in parts.netloc:
        raise _Answer("400 Bad Request", "only CONNECT and absolute-form http:// requests are proxied")
    try:
        host, port = peek.split_host_port(parts.netloc, 80)
    except peek.PeekError as exc:
        raise _Answer("400 Bad Request", f"{target}: {exc}") from exc
    origin_form = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(normalise_host(host), port or 80), origin_form


def _forwarded_head(
    method: str, origin_form: str, header_lines: list[str], destination: Destination
) -> bytes:
    """The request head sent upstream; its Host header, if any, must name the URL's host."""
    kept: list[str] = []
    for line in header_lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise _Answer("400 Bad Request", "a header line without a colon")
        lowered = name.strip().lower()
        if lowered == "host":
            try:
                named = normalise_host(peek.split_host_port(value)[0])
            except peek.PeekError as exc:
                raise _Answer("400 Bad Request", f"Host: {exc}") from exc
            if named != destination.host:
                reason = f"the Host header {_printable(named)} is not the URL's host {destination.host}"
                refusal = Decision(False, REQUEST_HOST_RULE, reason)
                raise _Answer("403 Forbidden", decision=refusal, destination=destination)
        if lowered in ("connection", "keep-alive", "proxy-connection", "proxy-authorization", "host"):
            continue
        kept.append(line)
    host = f"[{destination.host}]" if ":" in destination.host else destination.host
    if destination.port != 80:
        host += f":{destination.port}"
    lines = [f"{method} {origin_form} HTTP/1.1", f"Host: {host}", *kept, "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


async def _relay(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends, then half-close ``sink``; waits on the sink's
    buffer (drain) so that a slow reader slows the writer down instead of filling memory."""
    try:
        while True:
            data = await source.read(CHUNK_BYTES)
            if not data:
                break
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof() and not sink.is_closing():
            sink.write_eof()
    except OSError:
        sink.transport.abort()


async def _relay_both(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    downstream = asyncio.ensure_future(_relay(up_reader, writer))
    try:
        await _relay(reader, up_writer)
        await downstream
    finally:
        downstream.cancel()


def _printable(text: str) -> str:
    """``text`` on one line: control characters escaped (what a client sent must not forge a log line)."""
    return "".join(char if char.isprintable() else f"\\x{ord(char):02x}" for char in text)
