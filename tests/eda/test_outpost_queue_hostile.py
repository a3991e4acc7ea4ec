# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The event source devin.outposts.outpost_queue against slow, malformed and hostile replies.

A list that arrives in pieces goes through a relay in front of the fleet simulator that forwards the
simulator's answers in 16 KiB pieces with pauses (a TLS record is at most 16 KiB). Malformed replies come from
a small fake fleet API (an aiohttp web server in the test) that answers each request from a script, then
well. Each malformed case checks what docs/eda.md promises: the source keeps running, logs one line that names
the operation, and later delivers a good event; no malformed entry becomes an event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter, deque
from collections.abc import Awaitable
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from aiohttp import web

from devin_outposts_sim.testing import SimHandle

pytestmark = pytest.mark.asyncio

LOGGER = "devin.outposts.outpost_queue"
OUTPOST = "outpost_env-fake"
OUTPOSTS_PATH = "/opbeta/outposts/outposts"
QUEUE_PATH = "/opbeta/outposts/devins"
#: Quick retries, so a test does not wait on the backoff (its cap is tested on its own).
FAST = {"token": "cog_fake", "queue_depth_interval": 0, "backoff_initial": 0.01, "backoff_max": 0.05}
#: Deeper than json.loads can go (it raises RecursionError, not ValueError).
DEEP = b"[" * 100_000 + b"]" * 100_000

Reply = Callable[[web.Request], Awaitable[web.StreamResponse]]


def queue_entry(session_id: Any, created_at: Any = 1781050000, **metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "session_id": session_id,
            "outpost_id": OUTPOST,
            "created_at": created_at,
            "updated_at": created_at,
            **metadata,
        },
        "spec": {"kind": "new", "platform": "linux"},
        "status": {"phase": "pending", "session_status": "pending"},
    }


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def page(items: list[Any]) -> bytes:
    return json.dumps({"items": items, "cursor": "c1", "has_next_page": False}).encode()


class FakeFleet:
    """A fleet API on 127.0.0.1. Each list (or watch) request takes the next reply of ``lists`` (or
    ``watches``); with the script empty it answers well: the list returns ``listed`` and the watch sends
    ``watched`` as MODIFIED events, then keepalives for a second, then ends (as the API's streams do)."""

    def __init__(self) -> None:
        self.lists: deque[Reply] = deque()
        self.watches: deque[Reply] = deque()
        self.listed = [queue_entry("devin-listed")]
        self.watched = [queue_entry("devin-watched")]
        self.requests: Counter[str] = Counter()
        #: Set by :meth:`flood`: the bytes written before the client hung up, and whether it hung up at all.
        self.flood_written = 0
        self.flood_hung_up = asyncio.Event()
        self.url = ""
        self._runner: Optional[web.AppRunner] = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(OUTPOSTS_PATH, self._outposts)
        app.router.add_get(QUEUE_PATH, self._queue)
        self._runner = web.AppRunner(app, handler_cancellation=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _outposts(self, request: web.Request) -> web.StreamResponse:
        self.requests["outposts"] += 1
        item = {"metadata": {"outpost_id": OUTPOST}, "spec": {"name": "fake"}}
        return web.json_response({"items": [item], "has_next_page": False, "end_cursor": None})

    async def _queue(self, request: web.Request) -> web.StreamResponse:
        kind = "watch" if request.query.get("watch") == "true" else "list"
        self.requests[kind] += 1
        script = self.watches if kind == "watch" else self.lists
        if script:
            return await script.popleft()(request)
        return await (self.good_watch(request) if kind == "watch" else self.good_list(request))

    async def good_list(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=page(self.listed), content_type="application/json")

    async def good_watch(self, request: web.Request, before: bytes = b"") -> web.StreamResponse:
        response = await self._open_stream(request)
        try:
            await response.write(before)
            for entry in self.watched:
                await response.write(sse({"type": "MODIFIED", "object": entry, "cursor": "c2"}))
            for dummy in range(10):
                await asyncio.sleep(0.1)
                await response.write(b": keepalive\n\n")
        except ConnectionError:  # the source hung up (it does after a malformed event)
            pass
        return response

    @staticmethod
    async def _open_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response

    # --- scripted replies ---

    @staticmethod
    def answer(status: int, body: bytes) -> Reply:
        async def reply(request: web.Request) -> web.StreamResponse:
            return web.Response(status=status, body=body, content_type="application/json")

        return reply

    def stream(self, before: bytes) -> Reply:
        """A watch that sends ``before`` first, then goes on as a good one."""

        async def reply(request: web.Request) -> web.StreamResponse:
            return await self.good_watch(request, before)

        return reply

    def flood(self, line: bytes, count: int) -> Reply:
        """A watch that sends one event of ``count`` lines (``line`` each) and never ends it: after the lines
        it sends only comments (keepalives, which add nothing to the event) until the client hangs up."""

        async def reply(request: web.Request) -> web.StreamResponse:
            response = await self._open_stream(request)
            batch = max(1, (1 << 20) // len(line))
            try:
                for start in range(0, count, batch):
                    chunk = line * min(batch, count - start)
                    await response.write(chunk)
                    self.flood_written += len(chunk)
                while True:
                    await asyncio.sleep(0.02)
                    await response.write(b": still here\n")
            except ConnectionError:
                self.flood_hung_up.set()
            return response

        return reply


@pytest_asyncio.fixture
async def fleet() -> Any:
    server = FakeFleet()
    await server.start()
    yield server
    await server.stop()


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


# --- a list that arrives in pieces (issue 24, point 5) -----------------------------------------------------


class Relay:
    """A TCP relay to ``upstream`` that forwards the answers in ``piece``-byte writes with a pause after each,
    so that a reply of more than one piece reaches the client in several network reads."""

    def __init__(self, upstream: str, piece: int = 16 << 10, pause: float = 0.005) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.piece = piece
        self.pause = pause
        #: How many pieces of the full size were forwarded: each is followed by more of the same reply.
        self.full_pieces = 0
        self.url = ""
        self._server: Optional[asyncio.AbstractServer] = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            await asyncio.gather(
                self._pump(reader, up_writer, 1 << 16, 0.0),
                self._pump(up_reader, writer, self.piece, self.pause),
                return_exceptions=True,
            )
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, piece: int, pause: float
    ) -> None:
        try:
            while True:
                data = await src.read(piece)
                if not data:
                    break
                dst.write(data)
                await dst.drain()
                if pause:
                    self.full_pieces += len(data) == piece
                    await asyncio.sleep(pause)
        except ConnectionError:
            pass
        finally:
            dst.close()


async def test_a_list_that_arrives_in_16_kib_pieces_is_read_whole(
    sim: SimHandle, machine_token: str, collect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    outpost = sim.admin.create_outpost("eda-pieces", "linux")
    queued = {sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(100)}
    relay = Relay(sim.url)
    await relay.start()
    try:
        events = collect({"api_url": relay.url, "token": machine_token, "queue_depth_interval": 0})
        for sid in queued:
            await events.wait_for(lambda e, sid=sid: e.get("session_id") == sid)
        listed = [e for e in events.changes() if e["type"] == "LISTED"]
        assert sorted(e["session_id"] for e in listed) == sorted(queued)
        assert relay.full_pieces >= 2  # the list of 100 entries really came in three pieces or more
        assert warnings(caplog) == []  # read whole the first time, not after retries
    finally:
        await relay.stop()


# --- malformed replies (issue 24, points 8 and 9) ----------------------------------------------------------


LIST_BODIES = {
    "an array": b"[]",
    "deep nesting": b'{"items": ' + DEEP + b"}",
    "not JSON": b'{"items": [',
    "items that are not a list": b'{"items": {"a": 1}, "has_next_page": false}',
    "a cursor that is an object": b'{"items": [], "cursor": {"a": 1}, "has_next_page": false}',
    "more than 8 MiB": page([queue_entry(f"devin-{n:06d}", note="x" * 1024) for n in range(9000)]),
}


@pytest.mark.parametrize("case", sorted(LIST_BODIES))
async def test_a_malformed_list_is_logged_once_and_listed_again(
    fleet: FakeFleet, collect: Any, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    fleet.lists.append(fleet.answer(200, LIST_BODIES[case]))
    events = collect({"api_url": fleet.url, **FAST})
    await events.wait_for(lambda e: e.get("session_id") == "devin-listed" and e["type"] == "LISTED")
    assert not events.task.done()
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert logged[0].startswith("Could not list sessions: malformed reply"), logged
    await events.wait_for(lambda e: e.get("session_id") == "devin-watched")
    assert fleet.requests["list"] == 2
    assert [e["session_id"] for e in events.changes()] == ["devin-listed", "devin-watched"]


BAD_ENTRIES = {
    "a session_id that is a list": (queue_entry(["devin-a"]), "session_id"),
    "an empty session_id": (queue_entry(""), "session_id"),
    "a created_at that is a word": (queue_entry("devin-abc", created_at="abc"), "created_at"),
    "a created_at of 1e400": (queue_entry("devin-inf", created_at=float("inf")), "created_at"),
    "metadata that is a string": ({"metadata": "devin-x", "status": {}}, "metadata"),
    "an entry that is a number": (7, "not an object"),
    "an outpost_id that is a list": (queue_entry("devin-o", outpost_id=[OUTPOST]), "outpost_id"),
}


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
async def test_a_malformed_entry_in_a_list_is_skipped_with_one_line(
    fleet: FakeFleet, collect: Any, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    bad, problem = BAD_ENTRIES[case]
    body = page([bad, queue_entry("devin-listed")]).replace(b"Infinity", b"1e400")
    fleet.lists.append(fleet.answer(200, body))
    events = collect({"api_url": fleet.url, **FAST})
    await events.wait_for(lambda e: e.get("session_id") == "devin-listed" and e["type"] == "LISTED")
    await events.wait_for(lambda e: e.get("session_id") == "devin-watched")
    assert not events.task.done()
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert "Skipped 1 malformed queue entry in the reply to list sessions" in logged[0], logged
    assert problem in logged[0], logged
    assert [e["session_id"] for e in events.changes()] == ["devin-listed", "devin-watched"]


WATCH_REPLIES: dict[str, Callable[[FakeFleet], Reply]] = {
    "a 404": lambda f: f.answer(404, b'{"detail": "Not Found"}'),
    "a 404 with deep nesting": lambda f: f.answer(404, DEEP),
    "a line over 1 MiB": lambda f: f.stream(b"data: " + b"x" * (2 << 20) + b"\n\n"),
    "a comment over 1 MiB": lambda f: f.stream(b": " + b"x" * (2 << 20) + b"\n\n"),
    "deep nesting": lambda f: f.stream(b"data: " + DEEP + b"\n\n"),
    "an event that is an array": lambda f: f.stream(b"data: []\n\n"),
    "an event that is not UTF-8": lambda f: f.stream(b"data: \xff\xfe{}\n\n"),
    "a session_id that is a list": lambda f: f.stream(
        sse({"type": "MODIFIED", "object": queue_entry(["devin-a"]), "cursor": "c9"})
    ),
    "a created_at that is a word": lambda f: f.stream(
        sse({"type": "MODIFIED", "object": queue_entry("devin-abc", created_at="abc"), "cursor": "c9"})
    ),
    "a cursor that is a list": lambda f: f.stream(
        sse({"type": "MODIFIED", "object": queue_entry("devin-c"), "cursor": ["c9"]})
    ),
    "an event without an object": lambda f: f.stream(sse({"type": "MODIFIED", "cursor": "c9"})),
}


@pytest.mark.parametrize("case", sorted(WATCH_REPLIES))
async def test_a_malformed_watch_is_logged_once_and_the_source_lists_again(
    fleet: FakeFleet, collect: Any, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    fleet.watches.append(WATCH_REPLIES[case](fleet))
    events = collect({"api_url": fleet.url, **FAST})
    await events.wait_for(lambda e: e.get("session_id") == "devin-watched")
    assert not events.task.done()
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert logged[0].startswith("Could not watch sessions"), logged
    assert "listing the queue again" in logged[0], logged
    assert fleet.requests["list"] == 2  # the picture was listed again before the next watch
    assert [e["session_id"] for e in events.changes()] == ["devin-listed", "devin-watched"]


FLOODS = {
    # 64 lines of 1 MB: each line is under the line cap, the event is 64 MB.
    "data lines of 1 MB": (b"data: " + b"x" * 1_000_000 + b"\n", 64),
    # Empty data lines: no content, but each is buffered (a line feed each, as the SSE rules say).
    "empty data lines": (b"data:\n", 3_000_000),
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", sorted(FLOODS))
async def test_an_event_is_capped_by_what_it_buffers(
    fleet: FakeFleet, collect: Any, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    line, count = FLOODS[case]
    fleet.watches.append(fleet.flood(line, count))
    events = collect({"api_url": fleet.url, **FAST})
    # The flood never ends its event: the good event can only come if the source gave up that stream.
    await events.wait_for(lambda e: e.get("session_id") == "devin-watched", timeout=60)
    assert fleet.flood_hung_up.is_set()
    if len(line) > 1000:  # 64 MB is more than the kernel's buffers hold: the source stopped reading early
        assert fleet.flood_written < len(line) * count, fleet.flood_written
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert "a watch event is larger than" in logged[0], logged


async def test_an_entry_with_a_bad_created_at_does_not_stop_queue_depth(
    fleet: FakeFleet, collect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fleet.listed = [queue_entry("devin-abc", created_at="abc"), queue_entry("devin-listed")]
    fleet.watched = []
    events = collect({"api_url": fleet.url, **FAST, "queue_depth_interval": 1})
    first = await events.wait_for(lambda e: e["type"] == "queue_depth")
    second = await events.wait_for(lambda e: e["type"] == "queue_depth" and e["time"] > first["time"])
    for depth in (first, second):
        assert (depth["pending"], depth["oldest_pending_session_id"]) == (1, "devin-listed")
    assert "devin-abc" not in [e["session_id"] for e in events.changes()]
    logged = warnings(caplog)
    assert len(logged) == 1 and "created_at 'abc' is not a finite number" in logged[0], logged


# --- the reconnect backoff (issue 24, point 9) -------------------------------------------------------------


async def test_the_backoff_with_default_options_never_passes_5_seconds(source: dict[str, Any]) -> None:
    queue_source = source["QueueSource"](source["Options"]({"token": "t"}), asyncio.Queue())
    delays = [queue_source.backoff(attempt) for attempt in range(40) for dummy in range(20)]
    assert max(delays) <= 5.0
    assert max(delays) > 4.0  # it does reach the cap: the wait still grows
    assert len(set(delays)) > 1  # jitter
    # Not set, backoff_max follows a larger backoff_initial rather than refusing it.
    assert source["Options"]({"token": "t", "backoff_initial": 10}).backoff_max == 10


async def test_an_outage_is_retried_with_waits_capped_at_5_seconds(
    source: dict[str, Any], fleet: FakeFleet
) -> None:
    """The waits the source asks for while the API answers 503 (a sleep function is injected, so the test
    waits on nothing): they grow, never pass 5 s, and the first good answer gets its events."""
    for dummy in range(12):
        fleet.lists.append(fleet.answer(503, b'{"detail": "down"}'))
    asked: list[float] = []

    async def sleep(delay: float) -> None:
        asked.append(delay)
        await asyncio.sleep(0)

    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    options = source["Options"]({"api_url": fleet.url, "token": "t", "queue_depth_interval": 0})
    task = asyncio.ensure_future(source["QueueSource"](options, queue, sleep=sleep).run())
    try:
        event = await asyncio.wait_for(queue.get(), 30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert event["outpost_queue"]["session_id"] == "devin-listed"
    assert fleet.requests["list"] == 13
    assert len(asked) == 12
    assert max(asked) <= 5.0
    assert asked[-1] > 2.0  # the waits grew towards the cap
