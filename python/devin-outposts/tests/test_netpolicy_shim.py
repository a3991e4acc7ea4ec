"""The shim's transparent port (core/netpolicy/shim.py) on the host, without a namespace: the test gives
each connection the original destination that the nat table's redirect would have (``destination_of``),
and the shim talks through a doorway: to the real egress proxy where only its verdict matters (nothing is
connected), or netpolicy_harness's CONNECT stand-in, which routes a ``host:port`` to an upstream on
127.0.0.1 and records every request line. The tests judge by what the client got and what the stand-in and
the upstreams saw.

The waits for a client's first bytes are set to an hour here: a connection that still waited for them
would hang (and fail by the test's guard), so passing proves it did not wait.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from devin_outposts.core.netpolicy.doorway import Opener
from devin_outposts.core.netpolicy.policy import IPAddress, Policy
from devin_outposts.core.netpolicy.proxy import EgressProxy

from netpolicy_harness import ConnectServer

if not sys.platform.startswith("linux"):
    pytest.skip("the shim is Linux's (SO_ORIGINAL_DST)", allow_module_level=True)

from devin_outposts.core.netpolicy import namespace, shim, stubdns

ALLOWED_NET = "203.0.113.0/24"
POLICY = Policy.from_spec({"enabled": True, "allow": [{"hostname": "allowed.test"}, {"ipv4": ALLOWED_NET}]})
NEVER = 3600.0
GUARD_SECONDS = 30.0


class Banner:
    """A server that speaks first (as SSH does): its banner, then it echoes; records what it received."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.connections = 0
        self.port = 0
        self._server: Optional[asyncio.AbstractServer] = None

    async def start(self) -> Banner:
        self._server = await asyncio.start_server(self._one, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(b"SSH-2.0-banner\r\n")
        await writer.drain()
        while data := await reader.read(65536):
            self.received += data
            writer.write(data)
            await writer.drain()
        writer.close()

    def close(self) -> None:
        assert self._server is not None
        self._server.close()


@asynccontextmanager
async def transparent_port(
    doorway: socket.socket, destination: tuple[str, int], policy: Policy = POLICY
) -> AsyncIterator[tuple[str, int]]:
    """A shim's transparent listener on 127.0.0.1 whose every connection was "going to" ``destination``;
    ``doorway`` is the launcher's end of the egress proxy's (or its stand-in's) doorway."""
    address: IPAddress = ipaddress.ip_address(destination[0])
    book = stubdns.FakeAddressBook(namespace.FAKE_POOL_V4, None)
    the_shim = shim.Shim(
        Opener(doorway),
        book,
        limits=shim.Limits(first_bytes_seconds=NEVER, peek_seconds=NEVER),
        policy=policy,
        destination_of=lambda sock: (address, destination[1]),
    )
    server = await asyncio.start_server(the_shim.transparent, "127.0.0.1", 0)
    try:
        yield "127.0.0.1", server.sockets[0].getsockname()[1]
    finally:
        server.close()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    async def guarded() -> None:
        await asyncio.wait_for(scenario(), GUARD_SECONDS)

    asyncio.run(guarded())


async def read_all(reader: asyncio.StreamReader) -> bytes:
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


def test_a_server_that_speaks_first_is_reached_at_once_at_an_address_the_policy_allows(
    tmp_path: Path,
) -> None:
    """SSH to an allowed address: the client waits for the server's banner, so the shim must not wait for
    the client's bytes. It asks for the address itself, and the banner comes through."""

    async def scenario() -> None:
        banner = await Banner().start()
        target = f"203.0.113.5:{banner.port}"
        stand_in = ConnectServer({target: banner.port})
        try:
            async with transparent_port(stand_in.launcher_end, ("203.0.113.5", banner.port)) as listener:
                reader, writer = await asyncio.open_connection(*listener)
                assert await reader.readline() == b"SSH-2.0-banner\r\n"
                writer.write(b"SSH-2.0-client\r\n")
                assert await reader.readline() == b"SSH-2.0-client\r\n"
                writer.close()
        finally:
            stand_in.close()
            banner.close()
        assert stand_in.connects() == [f"CONNECT {target} HTTP/1.1"]
        assert bytes(banner.received) == b"SSH-2.0-client\r\n"

    run(scenario)


def test_an_address_no_rule_allows_still_waits_for_a_name_in_the_first_bytes(tmp_path: Path) -> None:
    """192.0.2.10 is not allowed by address: the shim reads the client's first bytes, and asks for the name
    they carry."""

    async def scenario() -> None:
        banner = await Banner().start()
        stand_in = ConnectServer({f"allowed.test:{banner.port}": banner.port})
        try:
            async with transparent_port(stand_in.launcher_end, ("192.0.2.10", banner.port)) as listener:
                reader, writer = await asyncio.open_connection(*listener)
                writer.write(b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
                assert await reader.readline() == b"SSH-2.0-banner\r\n"
                writer.close()
        finally:
            stand_in.close()
            banner.close()
        assert stand_in.connects() == [f"CONNECT allowed.test:{banner.port} HTTP/1.1"]

    run(scenario)


async def refused(tmp_path: Path, destination: tuple[str, int], first_bytes: bytes, **kwargs: Any) -> bytes:
    """What a client that sends ``first_bytes`` to ``destination`` gets back, the real egress proxy judging
    it with :data:`POLICY` (nothing it refuses is resolved or connected)."""
    proxy = EgressProxy(POLICY, session_id="devin-s1", outpost_id="o1")
    launcher_end = await proxy.start()
    try:
        async with transparent_port(launcher_end, destination, **kwargs) as listener:
            reader, writer = await asyncio.open_connection(*listener)
            writer.write(first_bytes)
            answer = await read_all(reader)
            writer.close()
    finally:
        await proxy.close()
        launcher_end.close()
    assert (proxy.allowed, proxy.denied) == (0, 1)
    return answer


def test_a_refused_plain_http_client_is_answered_403_with_the_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        request = b"GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n"
        answer = await refused(tmp_path, ("192.0.2.10", 80), request)
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer
        assert b"\r\nX-Devin-Egress-Denied: default deny: no rule allows denied.test\r\n" in answer
        assert answer.endswith(b"network policy: denied by default deny: no rule allows denied.test\n")

    run(scenario)


def test_a_refused_plain_http_client_at_an_address_it_resolved_is_answered_403(tmp_path: Path) -> None:
    """The name behind a fake address is known, so the shim asks at once without reading; refused, it reads
    the client's first bytes to tell whether an HTTP answer is possible. Refused here by the rebinding
    guard: the allowed name resolves to the host's loopback, and no address rule covers it."""

    async def resolve(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    async def scenario() -> None:
        policy = Policy.from_spec({"enabled": True, "allow": [{"hostname": "named.test"}]})
        fake = stubdns.FakeAddressBook(namespace.FAKE_POOL_V4, None)
        address = fake.addresses("named.test")
        assert address is not None
        proxy = EgressProxy(policy, session_id="devin-s1", outpost_id="o1", resolve=resolve)
        launcher_end = await proxy.start()
        the_shim = shim.Shim(
            Opener(launcher_end),
            fake,
            limits=shim.Limits(first_bytes_seconds=NEVER, peek_seconds=NEVER),
            policy=policy,
            destination_of=lambda sock: (address[0], 80),
        )
        server = await asyncio.start_server(the_shim.transparent, "127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
            writer.write(b"GET / HTTP/1.1\r\nHost: named.test\r\n\r\n")
            answer = await read_all(reader)
            writer.close()
        finally:
            server.close()
            await proxy.close()
            launcher_end.close()
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer
        assert b"\r\nX-Devin-Egress-Denied: " in answer and b"127.0.0.1" in answer, answer
        assert (proxy.allowed, proxy.denied) == (0, 1)

    run(scenario)


def test_a_refused_tls_client_is_closed_without_an_answer(tmp_path: Path) -> None:
    async def scenario() -> None:
        hello = b"\x16\x03\x01\x00\x05\x01\x00\x00\x01\x00"  # a (broken) ClientHello: TLS, no name in it
        assert await refused(tmp_path, ("192.0.2.10", 443), hello) == b""

    run(scenario)
