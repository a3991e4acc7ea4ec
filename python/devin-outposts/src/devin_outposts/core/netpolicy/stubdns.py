"""The stub DNS inside a session's namespace: it answers for the names the policy allows, with fake
addresses, and never sends a query anywhere (docs/network-policy.md, "How a session is confined").

* An A or AAAA query for a name :func:`name_decision` allows gets that name's fake address from
  :class:`FakeAddressBook` (one pair per name, stable for the session). A connection to it is redirected to
  the shim, which maps the address back to the name and asks the egress proxy for ``CONNECT name:port``: the
  proxy resolves the name itself, so the session never learns, and never needs, a real address.
* Any other type for an allowed name (MX, TXT, HTTPS...) gets an empty answer (NOERROR, no records):
  clients then fall back to A/AAAA.
* A name the policy does not allow gets **REFUSED**, not NXDOMAIN: the name may well exist, this server
  just will not say, and a resolver does not cache a refusal as the name's non-existence. Nothing is
  forwarded, so a query for ``<secret>.attacker.example`` ends here. Each refused name is logged once.

Hand-written (RFC 1035 with ``struct``), without a dependency: only queries with one question are read, and
only the header and the question are copied into the answer (an EDNS OPT record is not echoed, which a
client must accept).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import struct
from collections.abc import Iterable
from typing import Callable, Optional, Union, cast

from .policy import Decision, Policy, normalise_host

log = logging.getLogger(__name__)

TYPE_A = 1
TYPE_AAAA = 28
CLASS_IN = 1
NOERROR, FORMERR, SERVFAIL, NOTIMP, REFUSED = 0, 1, 2, 4, 5
#: How long a client may keep a fake address: the whole session (they never change), but re-asking is cheap.
TTL_SECONDS = 300
_HEADER = struct.Struct("!HHHHHH")
_QR, _AA, _RD, _RA = 0x8000, 0x0400, 0x0100, 0x0080
#: A TCP client sends each query after a two-byte length; most idle a little between queries.
TCP_IDLE_SECONDS = 30.0
MAX_TCP_CLIENTS = 64


class FakeAddressBook:
    """A name ↔ fake address map: the n-th name asked for gets the n-th address of each pool."""

    def __init__(self, pool_v4: ipaddress.IPv4Network, pool_v6: Optional[ipaddress.IPv6Network]) -> None:
        self.pool_v4, self.pool_v6 = pool_v4, pool_v6
        self._index_of: dict[str, int] = {}
        self._names: list[str] = []
        #: Addresses 1 .. capacity of each pool (the first and last of a network are not hosts).
        self.capacity = pool_v4.num_addresses - 2

    def addresses(self, name: str) -> Optional[tuple[ipaddress.IPv4Address, Optional[ipaddress.IPv6Address]]]:
        """The fake addresses of ``name`` (a new pair the first time), None when the pool is used up."""
        name = normalise_host(name)
        index = self._index_of.get(name)
        if index is None:
            if len(self._names) >= self.capacity:
                return None
            index = len(self._names)
            self._index_of[name] = index
            self._names.append(name)
        v6 = self.pool_v6[index + 1] if self.pool_v6 is not None else None
        return self.pool_v4[index + 1], v6

    def covers(self, address: Union[ipaddress.IPv4Address, ipaddress.IPv6Address]) -> bool:
        """Whether ``address`` is in a pool (a connection there means a name, or nothing)."""
        pool = self.pool_v4 if address.version == 4 else self.pool_v6
        return pool is not None and address in pool

    def name_for(self, address: Union[ipaddress.IPv4Address, ipaddress.IPv6Address]) -> Optional[str]:
        """The name ``address`` was handed out for, None if it never was."""
        if not self.covers(address):
            return None
        pool = self.pool_v4 if address.version == 4 else self.pool_v6
        assert pool is not None
        index = int(address) - int(pool.network_address) - 1
        return self._names[index] if 0 <= index < len(self._names) else None


def name_decision(policy: Policy, name: str) -> Decision:
    """Whether the stub may answer for ``name``: the gateway's host, or a name a rule allows.

    A DNS query names no port; hostname rules allow every port, so any port asks the same question, and the
    gateway's own port asks it for the gateway's host.
    """
    name = normalise_host(name)
    if policy.gateway is not None and policy.gateway[0] == name:
        return policy.check_name(name, policy.gateway[1])
    return policy.check_name(name, 443)


class StubResolver:
    """Answers queries (bytes in, bytes out): the part of the stub DNS with no sockets."""

    def __init__(
        self,
        policy: Policy,
        book: FakeAddressBook,
        on_refused: Optional[Callable[[str, Decision], None]] = None,
    ) -> None:
        self.policy, self.book = policy, book
        self.on_refused = on_refused
        self._refused_names: set[str] = set()

    def answer(self, query: bytes) -> Optional[bytes]:
        """The response to one DNS message; None for something that is not a query at all (dropped)."""
        if len(query) < _HEADER.size:
            return None
        ident, flags, qdcount, dummy_an, dummy_ns, dummy_ar = _HEADER.unpack_from(query)
        if flags & _QR:
            return None  # a response: never answer one
        opcode = (flags >> 11) & 0xF
        if opcode != 0:
            return _response(ident, flags, b"", NOTIMP, 0)
        if qdcount != 1:
            return _response(ident, flags, b"", FORMERR, 0)
        parsed = _question(query, _HEADER.size)
        if parsed is None:
            return _response(ident, flags, b"", FORMERR, 0)
        name, qtype, qclass, end = parsed
        question = query[_HEADER.size : end]
        if qclass != CLASS_IN:
            return _response(ident, flags, question, REFUSED, 0)
        decision = name_decision(self.policy, name) if name else None
        if decision is None or not decision.allowed:
            self._note_refused(name, decision)
            return _response(ident, flags, question, REFUSED, 0)
        addresses = self.book.addresses(name)
        if addresses is None:
            log.warning("stub DNS: no fake address left for %s (%d names)", name, self.book.capacity)
            return _response(ident, flags, question, SERVFAIL, 0)
        v4, v6 = addresses
        if qtype == TYPE_A:
            return _response(ident, flags, question, NOERROR, 1, _record(TYPE_A, v4.packed))
        if qtype == TYPE_AAAA and v6 is not None:
            return _response(ident, flags, question, NOERROR, 1, _record(TYPE_AAAA, v6.packed))
        return _response(ident, flags, question, NOERROR, 0)

    def _note_refused(self, name: str, decision: Optional[Decision]) -> None:
        if name in self._refused_names:
            return
        self._refused_names.add(name)
        if self.on_refused is not None and decision is not None:
            self.on_refused(name, decision)


async def serve(
    resolver: StubResolver, udp_sockets: Iterable[socket.socket], tcp_sockets: Iterable[socket.socket]
) -> None:
    """Answer on bound sockets (``socket.socket``) until cancelled: UDP datagrams and TCP streams."""
    loop = asyncio.get_running_loop()
    transports = []
    for sock in udp_sockets:
        transport, dummy_protocol = await loop.create_datagram_endpoint(lambda: _UDPStub(resolver), sock=sock)
        transports.append(transport)
    clients = asyncio.Semaphore(MAX_TCP_CLIENTS)
    servers = [
        await asyncio.start_server(lambda r, w: _tcp_client(resolver, clients, r, w), sock=sock)
        for sock in tcp_sockets
    ]
    try:
        await asyncio.Event().wait()
    finally:
        for transport in transports:
            transport.close()
        for server in servers:
            server.close()


class _UDPStub(asyncio.DatagramProtocol):
    def __init__(self, resolver: StubResolver) -> None:
        self.resolver = resolver
        self.transport: Optional[asyncio.DatagramTransport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)  # (the selector's is not a subclass)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        response = self.resolver.answer(data)
        if response is not None and self.transport is not None:
            self.transport.sendto(response, addr)


async def _tcp_client(
    resolver: StubResolver,
    clients: asyncio.Semaphore,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    if clients.locked():
        writer.close()
        return
    async with clients:
        try:
            while True:
                size = struct.unpack("!H", await asyncio.wait_for(reader.readexactly(2), TCP_IDLE_SECONDS))[0]
                response = resolver.answer(await asyncio.wait_for(reader.readexactly(size), TCP_IDLE_SECONDS))
                if response is None:
                    break
                writer.write(struct.pack("!H", len(response)) + response)
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


def _question(message: bytes, offset: int) -> Optional[tuple[str, int, int, int]]:
    """``(name, qtype, qclass, end offset)`` of the question at ``offset``; None when malformed."""
    labels: list[str] = []
    while True:
        if offset >= len(message):
            return None
        size = message[offset]
        offset += 1
        if size == 0:
            break
        if size & 0xC0 or offset + size > len(message):
            return None  # a compression pointer in a question, or a label past the end
        try:
            labels.append(message[offset : offset + size].decode("ascii").lower())
        except UnicodeDecodeError:
            return None
        offset += size
    if offset + 4 > len(message):
        return None
    qtype, qclass = struct.unpack_from("!HH", message, offset)
    return ".".join(labels), qtype, qclass, offset + 4


def _response(
    ident: int, query_flags: int, question: bytes, rcode: int, answers: int, *records: bytes
) -> bytes:
    flags = _QR | _AA | (query_flags & _RD) | _RA | rcode
    header = _HEADER.pack(ident, flags, 1 if question else 0, answers, 0, 0)
    return header + question + b"".join(records)


def _record(rtype: int, data: bytes) -> bytes:
    # The name is a pointer to the question's (offset 12, right after the header).
    return struct.pack("!HHHIH", 0xC00C, rtype, CLASS_IN, TTL_SECONDS, len(data)) + data
