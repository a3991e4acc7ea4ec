"""The fleet client's deadlines (issue 37, S5), against answers that drip (httpx.MockTransport).

An answer that sends a byte at a time never trips a per-read timeout. Each request now has a total deadline
(``deadline``), the watch an idle one (no event and no keepalive for ``watch_idle_timeout``), and
``cut_requests`` ends every request in flight, and every one to come, within a few seconds: what a second
signal gives the releases. The real programs against a dripping server: ``test_slow_drip.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, Callable

import httpx
import pytest

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetConnectionError, FleetCutShort

PAGE = b'{"items": [], "cursor": "c0", "has_next_page": false}'


class Drip(httpx.AsyncByteStream):
    """A body that sends ``chunk`` every ``every`` seconds, for ever (until the client closes it)."""

    def __init__(self, chunk: bytes = b" ", every: float = 0.02) -> None:
        self.chunk = chunk
        self.every = every
        self.sent = 0
        self.closed = False
        #: Set once the first chunk went out: the client is reading the answer. Made on the test's loop.
        self.started: asyncio.Event | None = None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            yield self.chunk
            self.sent += 1
            if self.started is not None:
                self.started.set()
            await asyncio.sleep(self.every)

    async def reading(self) -> None:
        """Wait until the client has read the first chunk."""
        self.started = asyncio.Event()
        if self.sent:
            return
        await self.started.wait()

    async def aclose(self) -> None:
        self.closed = True


class Server:
    """Answers each request with ``answer(request)``; counts the requests."""

    def __init__(self, answer: Callable[[httpx.Request], httpx.Response]) -> None:
        self.answer = answer
        self.requests: list[str] = []
        self.asked = asyncio.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        self.asked.set()
        return self.answer(request)


def client(server: Server, **kwargs: Any) -> FleetClient:
    kwargs.setdefault("backoff_base", 0.0)
    return FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(server), **kwargs)


def dripping(drip: Drip) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(200, headers={"Content-Length": "100000"}, stream=drip)


def test_a_dripping_answer_fails_at_the_total_deadline_and_is_retried() -> None:
    drip = Drip()
    server = Server(dripping(drip))

    async def go() -> None:
        async with client(server, deadline=0.3, retries=1) as fleet:
            await fleet.list_devins(outpost="outpost_env-1")

    expected = r"list sessions on outpost outpost_env-1: no complete answer within 0\.3s"
    with pytest.raises(FleetConnectionError, match=expected):
        asyncio.run(go())
    assert len(server.requests) == 2  # sent again once (a read timeout would be too), then given up
    assert drip.sent > 5  # it did drip all along: each read got its byte


def test_a_request_not_safe_to_replay_is_not_sent_again_after_its_deadline() -> None:
    server = Server(dripping(Drip()))

    async def go() -> None:
        async with client(server, deadline=0.2) as fleet:
            await fleet.create_outpost("rhel", platform="linux")

    with pytest.raises(FleetConnectionError, match=r"no complete answer within 0\.2s"):
        asyncio.run(go())
    assert server.requests == ["POST /opbeta/outposts/outposts"]


def test_cut_requests_ends_a_request_in_flight_and_refuses_the_next_ones() -> None:
    drip = Drip()
    server = Server(dripping(drip))

    async def go() -> tuple[float, BaseException, BaseException]:
        async with client(server, deadline=60.0) as fleet:
            release = asyncio.ensure_future(fleet.release("devin-1", "w1"))
            await drip.reading()
            started = time.monotonic()
            fleet.cut_requests(0.2)
            first = await asyncio.gather(release, return_exceptions=True)
            took = time.monotonic() - started
            later = await asyncio.gather(fleet.get_devin("devin-1"), return_exceptions=True)
        return took, first[0], later[0]

    took, first, later = asyncio.run(go())
    assert isinstance(first, FleetCutShort), first
    assert str(first) == "Could not release session devin-1: cut short: the program is stopping"
    assert 0.1 < took < 30  # cut at the moment given, far before the request's own 60 s
    assert isinstance(later, FleetCutShort), later
    assert server.requests == ["POST /opbeta/outposts/devins/devin-1/release"]  # the later one never sent


def test_a_cut_ends_the_wait_before_a_retry() -> None:
    """A 503 that asks for a minute's wait (Retry-After: 60): the cut ends the wait, and no retry is sent."""
    server = Server(
        lambda request: httpx.Response(503, headers={"Retry-After": "60"}, json={"detail": "busy"})
    )

    async def go() -> tuple[float, BaseException]:
        async with client(server) as fleet:
            claim = asyncio.ensure_future(fleet.claim("devin-1", "w1"))
            await asyncio.wait_for(server.asked.wait(), 30)
            started = time.monotonic()
            fleet.cut_requests(0.0)
            [error] = await asyncio.gather(claim, return_exceptions=True)
        return time.monotonic() - started, error

    took, error = asyncio.run(go())
    assert isinstance(error, FleetCutShort), error
    assert took < 30
    assert len(server.requests) == 1


def test_a_caller_cancelled_cancels_its_request_at_once() -> None:
    drip = Drip()
    server = Server(dripping(drip))

    async def go() -> None:
        async with client(server, deadline=60.0) as fleet:
            listing = asyncio.ensure_future(fleet.list_devins())
            await drip.reading()
            listing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await listing
            sent = drip.sent
            await asyncio.sleep(0.2)
            assert drip.sent <= sent + 1  # nobody reads it any more
            assert drip.closed

    asyncio.run(go())


@pytest.mark.parametrize(
    "chunk", [b"d", b": keepalive-that-never-ends"], ids=["a byte of an event", "a comment never ended"]
)
def test_a_watch_that_drips_without_an_event_or_keepalive_fails_at_its_idle_deadline(chunk: bytes) -> None:
    drip = Drip(chunk)
    server = Server(
        lambda request: httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=drip)
    )

    async def go() -> None:
        async with client(server, watch_idle_timeout=0.3) as fleet:
            async for dummy in fleet.watch_devins(outpost="outpost_env-1"):
                pytest.fail("no event was sent")

    with pytest.raises(FleetConnectionError, match=r"watch stream: no event and no keepalive for 0\.3s"):
        asyncio.run(go())
    assert drip.sent > 5


def test_keepalives_keep_a_quiet_watch_open() -> None:
    drip = Drip(b": keepalive\n\n", every=0.05)
    server = Server(
        lambda request: httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=drip)
    )

    async def go() -> None:
        async with client(server, watch_idle_timeout=0.3) as fleet:
            watch = fleet.watch_devins(outpost="outpost_env-1")
            reading = asyncio.ensure_future(watch.__anext__())
            await asyncio.sleep(1.0)
            assert not reading.done()  # more than three idle deadlines, and still open
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)

    asyncio.run(go())
    assert drip.sent >= 10
