"""The egress proxy of one session: the only way out of the session's network namespace, checked against
its network policy (docs/network-policy.md, "The egress proxy").

It runs inside the worker's process, on the worker's event loop, and serves the connections that the shim
inside the session's namespace sends it through its doorway (:mod:`.doorway`): it has no name on the file
system, so no other process can connect to it. The protocol on each connection is a plain HTTP proxy:

* ``CONNECT host:port HTTP/1.1``: ``200 Connection established`` and a tunnel; ``403 Forbidden`` (the rule
  and the reason in the body and in an ``X-Devin-Egress-Denied`` header, one line each) when the policy
  denies it; ``502 Bad Gateway`` when it allows it but no allowed address answers; ``400 Bad Request`` for
  anything malformed. Once the tunnel is open, the client's first bytes are peeked before any of them is
  sent on: a TLS ClientHello's server name must be the CONNECT host, a plain HTTP request's ``Host`` must
  be it (a tunnel to an IP address takes any name, or none: the rule that allowed it is about that address,
  and that address is where the bytes go), and anything else (SSH, a database protocol) passes as raw TCP.
  A refused peek ends the tunnel: the upstream has seen a connection and none of the client's bytes; a
  refused plain HTTP request is answered ``403`` inside the tunnel first (a refused ClientHello cannot be
  answered). Bytes from the upstream reach the client at once, so a protocol whose server speaks first
  works. A plain HTTP request in a tunnel goes on alone (:mod:`.http1`: ``Connection: close``, its body,
  nothing after it).
* Absolute-form plain HTTP (``GET http://host[:port]/path HTTP/1.1``): the same checks on the URL's host
  (and its ``Host`` header, if any, must name the same host), then the request is sent on in origin-form,
  without its ``Proxy-*`` headers and with ``Connection: close`` (:mod:`.request`), with its body and
  nothing after it (:mod:`.http1`); the upstream's answer is relayed back.

Names are resolved here and only after :meth:`Policy.check_name` allowed them, so a query for a denied
name is never sent; the proxy connects only to addresses :meth:`Policy.check_address` allows (the
rebinding guard), in the resolver's order, never to an address the client gave for a name.

Bytes move with backpressure and half-closes, by splice(2) once a direction carries more than a little
(:mod:`.relay`). A client that sends no request head within ``head_timeout`` is dropped; a head is at most
16 KiB, a peek at most :data:`peek.MAX_PEEK_BYTES <devin_outposts.core.netpolicy.peek.MAX_PEEK_BYTES>`.

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
import socket
import sys
from collections.abc import Awaitable, Sequence
from typing import Callable, Optional, Union

from devin_outposts.core.netpolicy import http1, peek, relay
from devin_outposts.core.netpolicy.policy import (
    DEFAULT_DENY,
    Decision,
    IPAddress,
    Policy,
    ip_literal,
    normalise_host,
)
from devin_outposts.core.netpolicy.request import (
    MAX_HEAD_BYTES,
    BadRequest,
    Destination,
    parse_request,
    printable,
)

__all__ = ["Destination", "EgressProxy", "Observer", "ProxyError", "Resolver"]

log = logging.getLogger(__name__)

#: The rule a decision names when the first bytes of a tunnel ask for another host than its CONNECT.
PEEK_RULE = "the CONNECT host"
#: How long, and for how many bytes, a refused client's remaining request is read before the connection
#: closes (closing on unread bytes would reset it, and the client could lose the answer).
LINGER_SECONDS = 1.0
LINGER_BYTES = 64 * 1024

#: The send buffer of the socket towards the client. A Unix socket's default (wmem_default, about 208 KiB)
#: makes the proxy wake for every few hundred KiB a client reads; 4 MiB let a bulk download through the
#: proxy run as fast as a direct one (benchmarks/egress_proxy.py). It bounds, it does not allocate: only
#: the bytes a client has not read yet take memory.
CLIENT_SEND_BUFFER = 4 << 20
#: SO_SNDBUFFORCE (Linux): the size above without net.core.wmem_max's cap, where the process may (root).
_SO_SNDBUFFORCE = getattr(socket, "SO_SNDBUFFORCE", 32)

Address = Union[str, IPAddress]
#: ``resolve(host, port)``: the addresses of ``host``, in the order to try them.
Resolver = Callable[[str, int], Awaitable[Sequence[Address]]]
#: ``observer(decision, destination, session_id, outpost_id)``: told each connection's verdict.
Observer = Callable[[Decision, Destination, str, str], None]


class ProxyError(Exception):
    """The proxy cannot start (started twice, or not on Linux)."""


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
    """One session's egress proxy behind a doorway (:mod:`.doorway`): ``await start()`` gives the launcher's
    end, then ``await close()``."""

    def __init__(
        self,
        policy: Policy,
        *,
        session_id: str,
        outpost_id: str,
        resolve: Optional[Resolver] = None,
        observer: Optional[Observer] = None,
        connect_timeout: float = 10.0,
        head_timeout: float = 10.0,
    ) -> None:
        self.policy = policy
        self.session_id = session_id
        self.outpost_id = outpost_id
        self.resolve: Resolver = resolve or _getaddrinfo
        self.observer = observer
        #: How long resolving a name, and then connecting to one address, may take.
        self.connect_timeout = connect_timeout
        #: How long a client may take to send its request head (then it is dropped without an answer).
        self.head_timeout = head_timeout
        #: Connections allowed and denied so far (each connection counts once).
        self.allowed = 0
        self.denied = 0
        self._doorway: Optional[socket.socket] = None
        self._acceptor: Optional[asyncio.Task[None]] = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self) -> socket.socket:
        """Open a new doorway and serve what comes through it; the launcher's end, which the caller hands to
        exactly one launcher (``pass_fds``) and then closes. Only one doorway per proxy."""
        if self._doorway is not None:
            raise ProxyError(f"the egress proxy of session {self.session_id} is already started")
        if sys.platform == "linux":
            from devin_outposts.core.netpolicy import doorway  # Linux only

            proxy_end, launcher_end = doorway.pair()
            self._doorway = proxy_end
            self._acceptor = asyncio.ensure_future(self._accept(proxy_end))
            log.debug("network policy: session %s: egress proxy started", self.session_id)
            return launcher_end
        else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
            raise ProxyError("The egress proxy's doorway is a Unix socket pair: Linux only")

    async def close(self) -> None:
        """Close the doorway and end every open connection and tunnel (idempotent)."""
        if self._acceptor is not None:
            self._acceptor.cancel()
            await asyncio.gather(self._acceptor, return_exceptions=True)
            self._acceptor = None
        if self._doorway is not None:
            self._doorway.close()  # connections sent but not yet received are closed with it
            self._doorway = None
        handlers = list(self._handlers)
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    async def _accept(self, proxy_end: socket.socket) -> None:
        """Serve each connection the doorway brings, each by a task of its own, until the other end has
        closed (the launcher and the shim have ended); open tunnels stay until they end or :meth:`close`."""
        if sys.platform != "linux":  # start() refused already
            return
        else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
            from devin_outposts.core.netpolicy import doorway

            while True:
                try:
                    connections, ended = doorway.receive(proxy_end)
                except BlockingIOError:
                    await doorway.ready(proxy_end)
                    continue
                except OSError as exc:  # out of descriptors, say: wait instead of spinning
                    log.warning("network policy: session %s: could not receive: %s", self.session_id, exc)
                    await asyncio.sleep(0.5)
                    continue
                for connection in connections:
                    _enlarge_send_buffer(connection)
                    handler = asyncio.ensure_future(self._handle(connection))
                    self._handlers.add(handler)
                    handler.add_done_callback(self._handlers.discard)
                if ended:
                    log.debug("network policy: session %s: the doorway's other end closed", self.session_id)
                    return

    # --- one client connection -------------------------------------------------------------------------

    async def _handle(self, client: socket.socket) -> None:
        opened = [client]  # closed when done, the upstream's socket too once connected
        try:
            received = await self._read_head(client)
            if received is None:
                return
            head, rest = received
            try:
                request = parse_request(head)
            except BadRequest as exc:
                raise _Answer("400 Bad Request", str(exc)) from exc
            if request.refusal is not None:
                raise _Answer("403 Forbidden", decision=request.refusal, destination=request.destination)
            if not request.tunnel:
                http1.body_framing(request.forwarded)  # a body of unsure length is a 400 before connecting
            upstream, decision = await self._open(request.destination)
            opened.append(upstream)
            if request.tunnel:
                await self._tunnel(request.destination, decision, client, upstream, rest)
            else:
                self._verdict(decision, request.destination)
                await _one_request(client, upstream, request.forwarded, rest)
        except BadRequest as exc:
            await _answer(client, _Answer("400 Bad Request", str(exc)))
        except _Answer as answer:
            if answer.decision is not None and answer.destination is not None:
                self._verdict(answer.decision, answer.destination)
            await _answer(client, answer)
        except OSError:
            pass  # a side went away: nothing to tell it
        finally:
            for sock in opened:
                sock.close()

    async def _read_head(self, client: socket.socket) -> Optional[tuple[bytes, bytes]]:
        """The request head up to its blank line, and what came after it; None when the client sent
        nothing in time or closed."""
        loop = asyncio.get_running_loop()

        async def until_blank_line() -> Optional[tuple[bytes, bytes]]:
            data = b""
            while True:
                end = data.find(b"\r\n\r\n")
                if end >= 0:
                    return data[: end + 4], data[end + 4 :]
                if len(data) > MAX_HEAD_BYTES:
                    raise _Answer(
                        "400 Bad Request", f"the request head is longer than {MAX_HEAD_BYTES} bytes"
                    )
                more = await loop.sock_recv(client, MAX_HEAD_BYTES + 4 - len(data) + 1)
                if not more:
                    return None
                data += more

        try:
            return await asyncio.wait_for(until_blank_line(), self.head_timeout)
        except asyncio.TimeoutError:
            log.debug("network policy: session %s: a client sent no request in time", self.session_id)
            return None

    async def _open(self, destination: Destination) -> tuple[socket.socket, Decision]:
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
            try:
                verdict = self.policy.check_address(host, port, address)
            except ValueError:  # a resolver that answered something other than an address
                verdict = Decision(False, DEFAULT_DENY, f"{printable(str(address))} is not an IP address")
            if not verdict.allowed:
                refusal = refusal or verdict
                continue
            try:
                return await self._connect(str(address), port), verdict
            except (OSError, asyncio.TimeoutError) as exc:
                failures.append(f"{address}: {exc or 'timed out'}")
        if failures:
            detail = f"could not connect to {destination}: {'; '.join(failures)}"
            raise _Answer("502 Bad Gateway", detail, decision, destination)
        if refusal is not None:
            raise _Answer("403 Forbidden", decision=refusal, destination=destination)
        raise _Answer("502 Bad Gateway", f"{host} has no address", decision, destination)

    async def _connect(self, address: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        upstream = socket.socket(family, socket.SOCK_STREAM)
        try:
            upstream.setblocking(False)
            # The client's own writes decide when bytes go; the relay adds no Nagle delay of its own.
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            loop = asyncio.get_running_loop()
            await asyncio.wait_for(loop.sock_connect(upstream, (address, port)), self.connect_timeout)
        except BaseException:
            upstream.close()
            raise
        return upstream

    async def _tunnel(
        self,
        destination: Destination,
        decision: Decision,
        client: socket.socket,
        upstream: socket.socket,
        rest: bytes,
    ) -> None:
        """After the 200: the upstream's bytes flow at once; the client's wait for the peek's verdict. A
        refused plain HTTP request is answered 403 inside the tunnel (a refused ClientHello cannot be
        answered: the connection closes); an allowed one goes on alone (:mod:`.http1`)."""
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(client, b"HTTP/1.1 200 Connection established\r\n\r\n")
        downstream = asyncio.ensure_future(relay.pipe(upstream, client))
        try:
            first, opening, refusal = await self._peek(destination, client, rest)
            if refusal is not None:
                self._verdict(refusal, destination)
                if opening is peek.Opening.HTTP:
                    await _stop(downstream)
                    await _answer(client, _Answer("403 Forbidden", decision=refusal, destination=destination))
                return
            if opening is peek.Opening.HTTP:
                end = first.index(b"\r\n\r\n") + 4  # the peek found the Host: the head is whole
                try:
                    head = http1.close_after(first[:end])
                except BadRequest as exc:
                    self._verdict(Decision(False, PEEK_RULE, str(exc)), destination)
                    await _stop(downstream)
                    await _answer(client, _Answer("400 Bad Request", str(exc)))
                    return
                self._verdict(decision, destination)
                await http1.send_one(client, upstream, head, first[end:], downstream)
                return
            self._verdict(decision, destination)
            if first:
                await loop.sock_sendall(upstream, first)
            await _both_ways(client, upstream, downstream)
        finally:
            downstream.cancel()
            await asyncio.gather(downstream, return_exceptions=True)

    async def _peek(
        self, destination: Destination, client: socket.socket, data: bytes
    ) -> tuple[bytes, object, Optional[Decision]]:
        """The client's first bytes (empty: it ended without any), what they start (:class:`peek.Opening`,
        or :data:`peek.MORE` when they ended before it was clear), and a refusal if they name another host."""
        while True:
            opening = peek.opening(data)
            if opening is peek.Opening.RAW:
                return data, opening, None
            try:
                if opening is peek.Opening.TLS:
                    name = peek.tls_server_name(data)
                elif opening is peek.Opening.HTTP:
                    name = peek.http_host(data)
                else:
                    name = peek.MORE
            except peek.PeekError as exc:
                return data, opening, Decision(False, PEEK_RULE, f"{exc}, in a tunnel to {destination}")
            if name is not peek.MORE:
                return data, opening, _check_peeked(destination, opening, name)
            if len(data) >= peek.MAX_PEEK_BYTES:
                reason = f"no name in the first {len(data)} bytes to {destination}"
                return data, opening, Decision(False, PEEK_RULE, reason)
            more = await asyncio.get_running_loop().sock_recv(client, peek.MAX_PEEK_BYTES - len(data))
            if not more:
                if isinstance(opening, peek.Opening):  # a TLS or HTTP head begun and never finished
                    return (
                        data,
                        opening,
                        Decision(False, PEEK_RULE, f"the client ended inside its {opening.value} head"),
                    )
                return data, opening, None  # a few bytes that start nothing with a name in it ("PING")
            data += more

    def _verdict(self, decision: Decision, destination: Destination) -> None:
        if decision.allowed:
            self.allowed += 1
            log.debug("network policy: session %s (outpost %s): allowed %s by %s: %s", self.session_id,
                      self.outpost_id, destination, decision.rule, decision.reason)  # fmt: skip
        else:
            self.denied += 1
            log.warning("network policy: session %s (outpost %s): denied %s by %s: %s", self.session_id,
                        self.outpost_id, destination, decision.rule, printable(decision.reason))  # fmt: skip
        if self.observer is not None:
            self.observer(decision, destination, self.session_id, self.outpost_id)


# --- the pieces ----------------------------------------------------------------------------------------


def _check_peeked(destination: Destination, opening: object, name: object) -> Optional[Decision]:
    what = "TLS server name" if opening is peek.Opening.TLS else "HTTP Host"
    if ip_literal(destination.host) is not None:
        # A tunnel to an address was allowed for that address (an ipv4/ipv6 rule, or the gateway), and that
        # address is where the bytes go, whatever name they carry; TLS to an address often carries none.
        return None
    if not isinstance(name, str) or normalise_host(name) != destination.host:
        return Decision(False, PEEK_RULE, f"the {what} {printable(str(name))} is not {destination.host}")
    return None


async def _one_request(client: socket.socket, upstream: socket.socket, head: bytes, rest: bytes) -> None:
    """An absolute-form request: the head the proxy rewrote, its body, nothing after it (:mod:`.http1`)."""
    downstream = asyncio.ensure_future(relay.pipe(upstream, client))
    try:
        await http1.send_one(client, upstream, head, rest, downstream)
    finally:
        await _stop(downstream)


async def _stop(task: asyncio.Future[int]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _both_ways(
    client: socket.socket, upstream: socket.socket, downstream: Optional[asyncio.Future[int]] = None
) -> None:
    """Relay both directions until both have ended (each end passed on as a half-close), or until one
    side breaks (then both end: the caller closes the sockets)."""
    directions = [
        downstream or asyncio.ensure_future(relay.pipe(upstream, client)),
        asyncio.ensure_future(relay.pipe(client, upstream)),
    ]
    try:
        for finished in asyncio.as_completed(directions):
            await finished
    finally:
        for direction in directions:
            direction.cancel()
        await asyncio.gather(*directions, return_exceptions=True)


async def _answer(client: socket.socket, answer: _Answer) -> None:
    """Send the answer, then read what the client still sends (for a while) before the caller closes."""
    extra = ""
    if answer.decision is not None and not answer.decision.allowed:
        text = printable(f"{answer.decision.rule}: {answer.decision.reason}")
        extra = f"X-Devin-Egress-Denied: {text}\r\n"
        body = f"network policy: denied by {text}\n"
    else:
        body = f"{printable(answer.detail)}\n"
    payload = body.encode("utf-8", "replace")
    head = (
        f"HTTP/1.1 {answer.status}\r\nContent-Type: text/plain; charset=utf-8\r\n{extra}"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, asyncio.TimeoutError):
        await loop.sock_sendall(client, head.encode("utf-8", "replace") + payload)
        client.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(_discard(client, LINGER_BYTES), LINGER_SECONDS)


async def _discard(client: socket.socket, limit: int) -> None:
    loop = asyncio.get_running_loop()
    while limit > 0:
        data = await loop.sock_recv(client, min(limit, 16384))
        if not data:
            return
        limit -= len(data)


def _enlarge_send_buffer(connection: socket.socket) -> None:
    try:
        connection.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, CLIENT_SEND_BUFFER)
    except OSError:  # not root: the kernel caps it at net.core.wmem_max
        with contextlib.suppress(OSError):
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CLIENT_SEND_BUFFER)


async def _getaddrinfo(host: str, port: int) -> list[Address]:
    """The system resolver's addresses for ``host`` (TCP), without duplicates, in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
