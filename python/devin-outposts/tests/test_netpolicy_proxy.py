"""The egress proxy (core/netpolicy/proxy.py) with real sockets: a client on its Unix socket, upstreams on
127.0.0.1 that record every connection and every byte they receive. Each test asserts on what the client
got and what the upstreams saw, never on what the proxy says it did (its counters are checked on top).

Names are ``*.test`` and resolved by a map the test gives (it records every question); the policy and its
rebinding guard judge what the map answers, as they judge the system resolver's answers.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import hashlib
import logging
import os
import random
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from devin_outposts.core.metrics import Metrics
from devin_outposts.core.netpolicy.doorway import Opener
from devin_outposts.core.netpolicy.policy import Decision, Policy
from devin_outposts.core.netpolicy.proxy import Destination, EgressProxy, ProxyError

LOOPBACK = "127.0.0.1"
SESSION, OUTPOST = "devin-s1", "outpost_env-o1"


# --- upstreams ---------------------------------------------------------------------------------------------


@dataclass
class Seen:
    """One connection an upstream accepted: the bytes it received, and whether it has ended."""

    received: bytearray = field(default_factory=bytearray)
    got_eof: bool = False
    ended: asyncio.Event = field(default_factory=asyncio.Event)


class Upstream:
    """A TCP server on 127.0.0.1 that records what it receives. ``mode``: ``echo`` sends every byte back;
    ``http`` reads one request head and answers 200 with the head in the body, then closes; ``keepalive``
    answers every request on the connection (``served <Host>``), whatever its ``Connection`` says, as a
    server that routes by ``Host`` would; ``banner`` speaks first (as an SSH server does), then echoes."""

    def __init__(self, mode: str = "echo") -> None:
        self.mode = mode
        self.seen: list[Seen] = []
        self.port = 0
        self._server: Optional[asyncio.AbstractServer] = None

    async def start(self) -> Upstream:
        self._server = await asyncio.start_server(self._handle, LOOPBACK, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def all_ended(self) -> list[Seen]:
        """Every connection, once each has ended (the test's timeout guards a hang)."""
        for seen in self.seen:
            await seen.ended.wait()
        return self.seen

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen = Seen()
        self.seen.append(seen)
        try:
            if self.mode == "banner":
                writer.write(b"SSH-2.0-upstream\r\n")
            if self.mode == "keepalive":
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    seen.received += head
                    host = next(
                        (
                            line[5:].strip()
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"host:")
                        ),
                        b"",
                    )
                    body = b"served " + host
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
            if self.mode == "http":
                head = await reader.readuntil(b"\r\n\r\n")
                seen.received += head
                body = bytes(head)
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
                )
                writer.write(body)
                await writer.drain()
                return
            while True:
                data = await reader.read(65536)
                if not data:
                    seen.got_eof = True
                    break
                seen.received += data
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            seen.ended.set()


# --- the proxy and its client ----------------------------------------------------------------------------


class MapResolver:
    """Names to addresses, recording every name it was asked about."""

    def __init__(self, names: dict[str, Sequence[str]]) -> None:
        self.names = names
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked.append(host)
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.names[host]


@dataclass
class Harness:
    proxy: EgressProxy
    resolver: MapResolver
    verdicts: list[tuple[Decision, Destination, str, str]]
    #: The launcher's end of the proxy's doorway (what the shim holds).
    doorway: socket.socket

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = await Opener(self.doorway).open()
        return await asyncio.open_unix_connection(sock=sock)

    async def request(
        self, head: str
    ) -> tuple[str, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
        """Send a request head; the status line, the response headers, and the open streams."""
        reader, writer = await self.connect()
        writer.write(head.encode("latin-1"))
        response = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in response[1:] if line)
        return response[0], headers, reader, writer

    async def connect_tunnel(
        self, target: str
    ) -> tuple[str, dict[str, str], asyncio.StreamReader, asyncio.StreamWriter]:
        return await self.request(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n")


@contextlib.asynccontextmanager
async def proxy_for(
    tmp_path: Path,
    spec: Optional[dict[str, Any]],
    names: Optional[dict[str, Sequence[str]]] = None,
    gateway_url: Optional[str] = None,
    observer: Optional[Callable[[Decision, Destination, str, str], None]] = None,
    **options: Any,
) -> AsyncIterator[Harness]:
    verdicts: list[tuple[Decision, Destination, str, str]] = []
    resolver = MapResolver(names or {})

    def record(decision: Decision, destination: Destination, session_id: str, outpost_id: str) -> None:
        verdicts.append((decision, destination, session_id, outpost_id))
        if observer is not None:
            observer(decision, destination, session_id, outpost_id)

    proxy = EgressProxy(
        Policy.from_spec(spec, gateway_url),
        session_id=SESSION,
        outpost_id=OUTPOST,
        resolve=resolver,
        observer=record,
        **options,
    )
    launcher_end = await proxy.start()
    try:
        yield Harness(proxy, resolver, verdicts, launcher_end)
    finally:
        await proxy.close()
        launcher_end.close()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())  # type: ignore[arg-type]


async def upstream(mode: str = "echo") -> Upstream:
    return await Upstream(mode).start()


async def read_all(reader: asyncio.StreamReader) -> bytes:
    """Everything until the proxy ends the connection (a reset counts as an end)."""
    try:
        return await reader.read()
    except ConnectionResetError:
        return b""


def client_hello(server_name: Optional[str]) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


ALLOWED = {"enabled": True, "allow": [{"hostname": "api.allowed.test"}, {"ipv4": "127.0.0.1/32"}]}
NAMES = {"api.allowed.test": [LOOPBACK], "evil.test": [LOOPBACK]}


# --- what is allowed is reachable -------------------------------------------------------------------------


def test_an_allowed_cidr_is_reachable(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, {"enabled": True, "allow": [{"ipv4": "127.0.0.0/8"}]}) as harness:
            status, dummy, reader, writer = await harness.connect_tunnel(f"{LOOPBACK}:{up.port}")
            assert status == "HTTP/1.1 200 Connection established"
            writer.write(b"\x00\x01raw bytes")
            assert await reader.readexactly(11) == b"\x00\x01raw bytes"
            writer.close()
            assert [bytes(s.received) for s in await up.all_ended()] == [b"\x00\x01raw bytes"]
            assert harness.resolver.asked == []  # an IP literal is never resolved
            assert (harness.proxy.allowed, harness.proxy.denied) == (1, 0)
            assert harness.verdicts[0][0].rule == "ipv4 127.0.0.0/8"
        await up.close()

    run(scenario)


def test_an_allowed_hostname_is_reachable_with_an_ip_rule_for_its_loopback_address(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            status, dummy, reader, writer = await harness.connect_tunnel(f"api.allowed.test:{up.port}")
            assert status.startswith("HTTP/1.1 200")
            writer.write(b"GET / HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n")
            # One plain HTTP request per connection: it goes on with Connection: close (http1.py).
            request = b"GET / HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: close\r\n\r\n"
            assert await reader.readexactly(len(request)) == request
            writer.close()
            assert [bytes(s.received) for s in await up.all_ended()] == [request]
            assert harness.resolver.asked == ["api.allowed.test"]
            decision, destination, session_id, outpost_id = harness.verdicts[0]
            assert (decision.allowed, decision.rule) == (True, "ipv4 127.0.0.1/32")
            assert (str(destination), session_id, outpost_id) == (
                f"api.allowed.test:{up.port}",
                SESSION,
                OUTPOST,
            )
        await up.close()

    run(scenario)


def test_the_rebinding_guard_refuses_a_name_that_resolves_to_loopback(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        spec = {"enabled": True, "allow": [{"hostname": "api.allowed.test"}]}
        async with proxy_for(tmp_path, spec, NAMES) as harness:
            status, headers, reader, dummy = await harness.connect_tunnel(f"api.allowed.test:{up.port}")
            assert status == "HTTP/1.1 403 Forbidden"
            assert headers["X-Devin-Egress-Denied"].startswith(
                "rebinding guard: api.allowed.test resolved to 127.0.0.1"
            )
            assert b"rebinding guard" in await read_all(reader)
            assert harness.resolver.asked == ["api.allowed.test"]
        assert up.seen == []
        await up.close()

    run(scenario)


def test_the_gateway_is_always_reachable(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        names = {"gateway.devin.test": [LOOPBACK]}
        gateway = f"wss://gateway.devin.test:{up.port}/ws"
        async with proxy_for(tmp_path, {"enabled": True, "allow": []}, names, gateway) as harness:
            status, dummy, reader, writer = await harness.connect_tunnel(f"gateway.devin.test:{up.port}")
            assert status.startswith("HTTP/1.1 200")
            hello = client_hello("gateway.devin.test")
            writer.write(hello)
            assert await reader.readexactly(len(hello)) == hello
            writer.close()
            assert [bytes(s.received) for s in await up.all_ended()] == [hello]
            assert harness.verdicts[0][0].rule == "the session's gateway"
        await up.close()

    run(scenario)


def test_a_tls_client_hello_naming_the_connect_host_passes_whole(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            dummy_status, dummy, reader, writer = await harness.connect_tunnel(f"api.allowed.test:{up.port}")
            hello = client_hello("api.allowed.test")
            for at in range(0, len(hello), 7):  # in pieces: the peek waits for the whole record
                writer.write(hello[at : at + 7])
                await writer.drain()
            assert await reader.readexactly(len(hello)) == hello
            writer.close()
            assert [bytes(s.received) for s in await up.all_ended()] == [hello]
        await up.close()

    run(scenario)


def test_ssh_like_raw_bytes_pass_to_an_allowed_host_whose_server_speaks_first(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream("banner")
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            dummy_status, dummy, reader, writer = await harness.connect_tunnel(f"api.allowed.test:{up.port}")
            assert await reader.readuntil(b"\r\n") == b"SSH-2.0-upstream\r\n"  # before the client sent a byte
            writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\x00\x00\x01\x0c\x0a\x14binary")
            assert (
                await reader.readuntil(b"binary") == b"SSH-2.0-OpenSSH_9.2\r\n\x00\x00\x01\x0c\x0a\x14binary"
            )
            writer.write_eof()
            assert (
                await reader.read() == b""
            )  # the upstream saw the end and closed: the half-close went through
            seen = await up.all_ended()
            assert [bytes(s.received) for s in seen] == [
                b"SSH-2.0-OpenSSH_9.2\r\n\x00\x00\x01\x0c\x0a\x14binary"
            ]
            assert seen[0].got_eof
            writer.close()
        await up.close()

    run(scenario)


def test_a_few_raw_bytes_then_the_end_pass(tmp_path: Path) -> None:
    """Capitals that could begin an HTTP request line, then a half-close: raw bytes, not a refusal."""

    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            dummy_status, dummy, reader, writer = await harness.connect_tunnel(f"api.allowed.test:{up.port}")
            writer.write(b"PING")
            writer.write_eof()
            assert await reader.read() == b"PING"
            seen = await up.all_ended()
            assert [(bytes(s.received), s.got_eof) for s in seen] == [(b"PING", True)]
            assert harness.verdicts[-1][0].allowed
        await up.close()

    run(scenario)


def test_megabytes_both_ways_arrive_whole_and_in_order(tmp_path: Path) -> None:
    """More than relay.SPLICE_AFTER each way, so that both directions switch from copying to splice(2)."""

    async def scenario() -> None:
        up = await upstream()
        payload = bytes(random.Random(7).getrandbits(8) for dummy in range(1 << 16)) * 64  # 4 MiB
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            dummy_status, dummy, reader, writer = await harness.connect_tunnel(f"{LOOPBACK}:{up.port}")

            async def send() -> None:
                for at in range(0, len(payload), 100_000):
                    writer.write(payload[at : at + 100_000])
                    await writer.drain()
                writer.write_eof()

            sender = asyncio.ensure_future(send())
            echoed = await reader.read()
            await sender
            assert hashlib.sha256(echoed).hexdigest() == hashlib.sha256(payload).hexdigest()
            seen = await up.all_ended()
            assert len(seen) == 1 and bytes(seen[0].received) == payload and seen[0].got_eof
        await up.close()

    run(scenario)


def test_a_client_that_ends_inside_its_client_hello_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            dummy_status, dummy, reader, writer = await harness.connect_tunnel(f"api.allowed.test:{up.port}")
            writer.write(client_hello("api.allowed.test")[:40])
            writer.write_eof()
            assert await read_all(reader) == b""
            assert [bytes(s.received) for s in await up.all_ended()] == [b""]
            assert harness.verdicts[-1][0].reason == "the client ended inside its tls head"
        await up.close()

    run(scenario)


def test_tls_without_a_server_name_passes_to_an_ip_address(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            dummy_status, dummy, reader, writer = await harness.connect_tunnel(f"{LOOPBACK}:{up.port}")
            hello = client_hello(None)
            writer.write(hello)
            assert await reader.readexactly(len(hello)) == hello
            writer.close()
            assert [bytes(s.received) for s in await up.all_ended()] == [hello]
        await up.close()

    run(scenario)


@pytest.mark.parametrize(
    "first_bytes",
    [client_hello("any.name.test"), b"GET / HTTP/1.1\r\nHost: any.name.test\r\n\r\n"],
    ids=["tls", "http"],
)
def test_a_tunnel_to_an_allowed_address_takes_any_name_in_its_first_bytes(
    tmp_path: Path, first_bytes: bytes
) -> None:
    """The ipv4 rule allows the address, and the address is where the bytes go: the name a client puts in
    them (``curl --resolve``, or the shim sending a redirected connection on as its address) is not the
    policy's business. The first bytes reach the upstream."""

    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, {"enabled": True, "allow": [{"ipv4": "127.0.0.1/32"}]}) as harness:
            status, dummy, reader, writer = await harness.connect_tunnel(f"{LOOPBACK}:{up.port}")
            assert status.startswith("HTTP/1.1 200")
            writer.write(first_bytes)
            await reader.readexactly(10)  # the echo has begun: the bytes went on
            writer.close()
            [seen] = await up.all_ended()
            assert bytes(seen.received).startswith(first_bytes[:10])
            assert (harness.proxy.allowed, harness.proxy.denied) == (1, 0)
        await up.close()

    run(scenario)


# --- what is denied never reaches anything ----------------------------------------------------------------


def test_a_denied_hostname_is_never_resolved_nor_connected(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        up = await upstream()
        metrics = Metrics(labels={"outpost": "ignored-by-the-series"})
        caplog.set_level(logging.DEBUG, logger="devin_outposts.core.netpolicy.proxy")
        async with proxy_for(tmp_path, ALLOWED, NAMES, observer=metrics.count_egress) as harness:
            status, headers, reader, dummy = await harness.connect_tunnel(f"evil.test:{up.port}")
            assert status == "HTTP/1.1 403 Forbidden"
            assert headers["X-Devin-Egress-Denied"] == "default deny: no rule allows evil.test"
            assert (
                await read_all(reader)
                == b"network policy: denied by default deny: no rule allows evil.test\n"
            )
            assert harness.resolver.asked == []
            decision, destination, session_id, outpost_id = harness.verdicts[0]
            assert (decision.allowed, destination, session_id, outpost_id) == (
                False, Destination("evil.test", up.port), SESSION, OUTPOST)  # fmt: skip
            assert (harness.proxy.allowed, harness.proxy.denied) == (0, 1)
        assert up.seen == []
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert warnings == [
            f"network policy: session {SESSION} (outpost {OUTPOST}): denied evil.test:{up.port} "
            "by default deny: no rule allows evil.test"
        ]
        series = f'egress_connections_total{{outpost="{OUTPOST}",session="{SESSION}",verdict="denied"}} 1'
        assert series in metrics.render()
        metrics.forget_egress(SESSION)
        assert SESSION not in metrics.render()
        await up.close()

    run(scenario)


def test_a_direct_ip_no_rule_covers_is_denied(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        spec = {"enabled": True, "allow": [{"hostname": "api.allowed.test"}, {"ipv4": "10.0.0.0/8"}]}
        async with proxy_for(tmp_path, spec, NAMES) as harness:
            status, headers, dummy_reader, dummy = await harness.connect_tunnel(f"{LOOPBACK}:{up.port}")
            assert status == "HTTP/1.1 403 Forbidden"
            assert headers["X-Devin-Egress-Denied"] == "default deny: no ipv4 rule covers 127.0.0.1"
        assert up.seen == []
        await up.close()

    run(scenario)


@pytest.mark.parametrize("server_name", ["evil.test", None])
def test_a_client_hello_naming_another_host_closes_the_tunnel(
    tmp_path: Path, server_name: Optional[str]
) -> None:
    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            status, dummy, reader, writer = await harness.connect_tunnel(f"api.allowed.test:{up.port}")
            assert status.startswith("HTTP/1.1 200")
            writer.write(client_hello(server_name))
            assert await read_all(reader) == b""
            seen = await up.all_ended()
            assert [bytes(s.received) for s in seen] == [b""]  # connected once, and not one byte of the hello
            decision = harness.verdicts[-1][0]
            assert (decision.allowed, decision.rule) == (False, "the CONNECT host")
            assert (harness.proxy.allowed, harness.proxy.denied) == (0, 1)
        await up.close()

    run(scenario)


def test_an_http_host_other_than_the_connect_host_is_answered_403_in_the_tunnel(tmp_path: Path) -> None:
    """A plain HTTP client gets an HTTP answer with the reason (a refused ClientHello cannot get one)."""

    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            dummy_status, dummy, reader, writer = await harness.connect_tunnel(f"api.allowed.test:{up.port}")
            writer.write(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
            answer = await read_all(reader)
            assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n"), answer
            reason = "the CONNECT host: the HTTP Host evil.test is not api.allowed.test"
            assert f"\r\nX-Devin-Egress-Denied: {reason}\r\n".encode() in answer
            assert answer.endswith(f"network policy: denied by {reason}\n".encode())
            assert [bytes(s.received) for s in await up.all_ended()] == [b""]
            assert "the HTTP Host evil.test is not api.allowed.test" in harness.verdicts[-1][0].reason
        await up.close()

    run(scenario)


# --- absolute-form plain HTTP -----------------------------------------------------------------------------


def test_plain_http_absolute_form_is_forwarded_in_origin_form(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream("http")
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            reader, writer = await harness.connect()
            where = f"api.allowed.test:{up.port}"
            writer.write(
                f"GET http://{where}/path?q=1 HTTP/1.1\r\nHost: {where}\r\nProxy-Connection: keep-alive\r\n"
                "Proxy-Authorization: Basic eA==\r\nAccept: */*\r\n\r\n".encode()
            )
            response = await read_all(reader)
            assert response.startswith(b"HTTP/1.1 200 OK\r\n")
            seen = await up.all_ended()
            expected = (
                f"GET /path?q=1 HTTP/1.1\r\nHost: api.allowed.test:{up.port}\r\nAccept: */*\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            assert [bytes(s.received) for s in seen] == [expected]
            assert response.endswith(expected)
        await up.close()

    run(scenario)


@pytest.mark.parametrize(
    ("target", "host", "denied_by"),
    [
        ("http://evil.test/", None, "default deny: no rule allows evil.test"),
        ("http://api.allowed.test:{port}/", "evil.test", "the request's host: the Host header evil.test"),
    ],
)
def test_plain_http_absolute_form_denied(
    tmp_path: Path, target: str, host: Optional[str], denied_by: str
) -> None:
    async def scenario() -> None:
        up = await upstream("http")
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            head = (
                f"GET {target.format(port=up.port)} HTTP/1.1\r\n"
                + (f"Host: {host}\r\n" if host else "")
                + "\r\n"
            )
            status, headers, dummy_reader, dummy = await harness.request(head)
            assert status == "HTTP/1.1 403 Forbidden"
            assert headers["X-Devin-Egress-Denied"].startswith(denied_by)
            assert harness.resolver.asked == []
        assert up.seen == []
        await up.close()

    run(scenario)


# --- one plain HTTP request per connection (http1.py) -------------------------------------------------------


async def plain_http(
    harness: Harness, form: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection on which the next bytes are a plain HTTP request to api.allowed.test: after a CONNECT
    (``tunnel``, as the shim's transparent redirect sends) or not (``absolute``, whose first request line
    :func:`first_line` writes in absolute-form)."""
    if form == "tunnel":
        status, dummy, reader, writer = await harness.connect_tunnel(f"api.allowed.test:{port}")
        assert status.startswith("HTTP/1.1 200")
        return reader, writer
    return await harness.connect()


def first_line(form: str, port: int, method: str = "GET") -> str:
    target = f"http://api.allowed.test:{port}/first" if form == "absolute" else "/first"
    return f"{method} {target} HTTP/1.1\r\nHost: api.allowed.test:{port}\r\n"


@pytest.mark.parametrize("form", ["absolute", "tunnel"])
def test_a_second_request_on_a_plain_http_connection_never_reaches_the_upstream(
    tmp_path: Path, form: str
) -> None:
    """Only the first request of a connection is checked, so only it goes on: a second one naming another
    host, which a server that routes by Host would serve, gets no answer, and the upstream never sees it."""

    async def scenario() -> None:
        up = await upstream("keepalive")
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            reader, writer = await plain_http(harness, form, up.port)
            writer.write(f"{first_line(form, up.port)}Connection: keep-alive\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert await reader.readexactly(len(f"served api.allowed.test:{up.port}")) == (
                f"served api.allowed.test:{up.port}".encode()
            )
            writer.write(b"GET /second HTTP/1.1\r\nHost: evil.test\r\n\r\n")
            writer.write_eof()
            assert await read_all(reader) == b""  # no answer to the second request: the connection ends
            seen = await up.all_ended()
        assert len(seen) == 1
        received = bytes(seen[0].received)
        assert b"evil.test" not in received and b"/second" not in received, received
        assert received.count(b"\r\n\r\n") == 1 and b"\r\nConnection: close\r\n" in received, received
        await up.close()

    run(scenario)


@pytest.mark.parametrize("form", ["absolute", "tunnel"])
@pytest.mark.parametrize(
    ("framing", "body"),
    [
        ("Content-Length: 11\r\n", b"hello world"),
        ("Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nTrailer: t\r\n\r\n"),
    ],
)
def test_a_request_body_goes_on_whole_and_what_follows_it_does_not(
    tmp_path: Path, form: str, framing: str, body: bytes
) -> None:
    async def scenario() -> None:
        up = await upstream()  # echoes what it receives, until the end the proxy passes on
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            reader, writer = await plain_http(harness, form, up.port)
            head = f"{first_line(form, up.port, 'POST')}{framing}\r\n".encode()
            writer.write(head + body + b"GET /smuggled HTTP/1.1\r\nHost: evil.test\r\n\r\n")
            writer.write_eof()
            echoed = await read_all(reader)
            seen = await up.all_ended()
        received = bytes(seen[0].received)
        assert received.endswith(b"\r\nConnection: close\r\n\r\n" + body), received
        assert b"smuggled" not in received and echoed == received
        await up.close()

    run(scenario)


@pytest.mark.parametrize("form", ["absolute", "tunnel"])
@pytest.mark.parametrize(
    "framing",
    [
        "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        "Transfer-Encoding: gzip\r\n",
        "Content-Length: 5\r\nContent-Length: 6\r\n",
    ],
)
def test_a_request_whose_body_length_is_not_sure_is_answered_400(
    tmp_path: Path, form: str, framing: str
) -> None:
    """A proxy and a server that read a body's length differently are how requests are smuggled."""

    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            reader, writer = await plain_http(harness, form, up.port)
            writer.write(f"{first_line(form, up.port, 'POST')}{framing}\r\nhello".encode())
            answer = await read_all(reader)
            assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
            seen = await up.all_ended()
        assert all(bytes(s.received) == b"" for s in seen)  # connected for a tunnel, never a byte sent
        await up.close()

    run(scenario)


# --- malformed requests, unreachable upstreams, slow clients -----------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        "HELLO\r\n\r\n",
        "CONNECT api.allowed.test HTTP/1.1\r\n\r\n",
        "CONNECT api.allowed.test:99999 HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n",
        "GET https://api.allowed.test/ HTTP/1.1\r\n\r\n",
        "GET http://api.allowed.test/ HTTP/1.1\r\nno colon here\r\n\r\n",
    ],
)
def test_malformed_requests_are_answered_400(tmp_path: Path, head: str) -> None:
    async def scenario() -> None:
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            status, dummy_headers, dummy_reader, dummy = await harness.request(head)
            assert status == "HTTP/1.1 400 Bad Request"
            assert harness.resolver.asked == []

    run(scenario)


def test_a_request_head_longer_than_16_kib_is_answered_400(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            head = "CONNECT api.allowed.test:443 HTTP/1.1\r\n" + "X-Pad: " + "a" * 20000 + "\r\n\r\n"
            status, dummy_headers, dummy_reader, dummy = await harness.request(head)
            assert status == "HTTP/1.1 400 Bad Request"

    run(scenario)


def test_an_allowed_destination_that_does_not_answer_is_502(tmp_path: Path) -> None:
    async def scenario() -> None:
        with socket.socket() as probe:  # a port nothing listens on
            probe.bind((LOOPBACK, 0))
            port = probe.getsockname()[1]
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            status, dummy_headers, reader, dummy = await harness.connect_tunnel(f"{LOOPBACK}:{port}")
            assert status == "HTTP/1.1 502 Bad Gateway"
            assert b"could not connect" in await read_all(reader)
            status, dummy_headers, reader, dummy = await harness.connect_tunnel("nowhere.allowed.test:443")
            assert status == "HTTP/1.1 403 Forbidden"  # denied by name: never resolved
            spec_names = {**NAMES, "api.allowed.test": []}
            harness.resolver.names = spec_names
            status, dummy_headers, reader, dummy = await harness.connect_tunnel("api.allowed.test:443")
            assert status == "HTTP/1.1 502 Bad Gateway"

    run(scenario)


def test_a_client_that_sends_nothing_is_dropped(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with proxy_for(tmp_path, ALLOWED, NAMES, head_timeout=0.2) as harness:
            reader, dummy = await harness.connect()
            assert await read_all(reader) == b""

    run(scenario)


# --- the socket and its life ------------------------------------------------------------------------------


def test_close_ends_open_tunnels(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            readers = []
            for dummy_index in range(3):
                dummy_status, dummy, reader, writer = await harness.connect_tunnel(
                    f"api.allowed.test:{up.port}"
                )
                writer.write(b"hello")
                assert await reader.readexactly(5) == b"hello"
                readers.append(reader)
            idle_reader, dummy_writer = await harness.connect()  # a client still to send its request
            await harness.proxy.close()
            for reader in [*readers, idle_reader]:
                assert await read_all(reader) == b""
            assert len(await up.all_ended()) == 3
            with pytest.raises((BrokenPipeError, ConnectionResetError)):
                await harness.connect()  # the doorway is closed: nothing new comes through
        await up.close()

    run(scenario)


def test_the_proxy_has_no_name_and_takes_only_what_its_doorway_brings(tmp_path: Path) -> None:
    """Nothing is created on the file system, the doorway's ends are no one's to inherit, and what comes
    through that is not a Unix stream socket is closed unserved."""

    async def scenario() -> None:
        async with proxy_for(tmp_path, ALLOWED, NAMES) as harness:
            assert os.listdir(tmp_path) == []
            assert not harness.doorway.get_inheritable()
            datagram, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [datagram.fileno()]))]
            harness.doorway.sendmsg([b"c"], rights)
            datagram.close()
            status, dummy_headers, dummy_reader, dummy = await harness.connect_tunnel("evil.test:443")
            assert status == "HTTP/1.1 403 Forbidden"  # the proxy still serves the real ones
            with pytest.raises(ConnectionRefusedError):  # the proxy closed its copy: no one reads it
                other.send(b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n")
            other.close()
        proxy = EgressProxy(Policy.from_spec(ALLOWED), session_id=SESSION, outpost_id=OUTPOST)
        end = await proxy.start()
        try:
            with pytest.raises(ProxyError, match="already started"):
                await proxy.start()
        finally:
            end.close()
            await proxy.close()

    run(scenario)


def test_a_proxy_without_policy_passes_everything(tmp_path: Path) -> None:
    async def scenario() -> None:
        up = await upstream()
        async with proxy_for(tmp_path, None, NAMES) as harness:
            dummy_status, dummy, reader, writer = await harness.connect_tunnel(f"evil.test:{up.port}")
            writer.write(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")
            writer.close()
            assert len(await up.all_ended()) == 1
            assert harness.verdicts[0][0].rule == "no policy enforced"
        await up.close()

    run(scenario)
