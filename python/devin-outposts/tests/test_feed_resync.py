"""The queue feed's periodic list: when it comes, and what the claims do while it is in flight (core/feed.py).

A fleet that started together has its watch streams ended by the server at the same moment; if each feed
listed on its stream's end, the whole fleet would list at once, slow the API for everyone and leave every
worker blind for the same seconds. So the feed ends its stream itself when its own (jittered) list is due,
and a spreading feed offers no row while a list that will replace its picture is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Optional

import pytest

from devin_outposts.api.errors import FleetConnectionError
from devin_outposts.api.listwatch import ListWatch
from devin_outposts.api.models import QueueEntry, WatchEvent
from devin_outposts.core import feed as feed_module
from devin_outposts.core.feed import QueueFeed

OUTPOST = "outpost_env-resync"


def entry(sid: str, created: int, *, holder: Optional[str] = None) -> QueueEntry:
    status: dict[str, Any] = {"phase": "pending", "session_status": "pending"}
    if holder:
        status = {
            "phase": "claimed",
            "acceptor_id": holder,
            "claim_deadline": 4e9,
            "session_status": "running",
        }
    return QueueEntry.model_validate(
        {
            "metadata": {
                "session_id": sid,
                "outpost_id": OUTPOST,
                "created_at": created,
                "updated_at": created,
            },
            "spec": {"kind": "new", "platform": "linux"},
            "status": status,
        }
    )


class Server:
    """A queue whose watch streams never end on their own; each list answers with the next scripted
    picture, once ``release`` lets it (a list the test holds in flight), or fails when scripted so."""

    def __init__(self, pictures: list[Any]) -> None:
        self.pictures = list(pictures)
        self.lists = 0
        #: The cursor each watch was opened from, and how many streams have been closed since.
        self.watches: list[Optional[str]] = []
        self.streams_closed = 0
        self.release: dict[int, asyncio.Event] = {}
        self.listing = asyncio.Event()

    async def list_all_devins(self, **kwargs: Any) -> tuple[list[QueueEntry], Optional[str]]:
        self.lists += 1
        number = self.lists
        self.listing.set()
        gate = self.release.get(number)
        if gate is not None:
            await gate.wait()
        picture = self.pictures.pop(0)
        if isinstance(picture, Exception):
            raise picture
        return picture, f"list-{number}"

    async def watch_devins(
        self, *, outpost: Optional[str] = None, cursor: Optional[str] = None
    ) -> AsyncIterator[WatchEvent]:
        self.watches.append(cursor)
        try:
            await asyncio.Event().wait()  # a stream the server would end only minutes later
            yield  # type: ignore[misc]  # never reached: it makes this an async generator, as the client's is
        finally:
            self.streams_closed += 1


@contextlib.asynccontextmanager
async def following(feed: QueueFeed) -> AsyncIterator[None]:
    """The feed's loop runs inside the block, and is cancelled when the block ends (whatever happens)."""
    task = asyncio.create_task(feed.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(predicate: Any, what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def test_resync_in_counts_down_from_the_last_list() -> None:
    now = [100.0]
    listwatch = ListWatch(lambda attempt: 0.0, resync_interval=30.0, clock=lambda: now[0])
    assert listwatch.resync_in() is None  # nothing listed yet: the first list comes first anyway
    listwatch.listed("c1")
    now[0] += 12.0
    assert listwatch.resync_in() == pytest.approx(18.0)
    now[0] += 40.0
    assert listwatch.resync_in() == 0.0
    assert ListWatch(lambda attempt: 0.0).resync_in() is None  # no periodic list: the server's end decides


def test_the_feed_ends_its_own_stream_when_its_periodic_list_is_due() -> None:
    async def main() -> None:
        server = Server([[entry("a", 1)], [entry("a", 1)], [entry("a", 1)]])
        feed = QueueFeed(server, OUTPOST, "me")  # type: ignore[arg-type]
        feed.listwatch.resync_interval = 0.05
        async with following(feed):
            await until(lambda: server.lists >= 3, "a third list")
        # Each stream was opened from its list's cursor and closed by the feed before the next list
        # (the server's streams never end on their own here).
        assert server.watches[:2] == ["list-1", "list-2"]
        assert server.streams_closed >= 2

    asyncio.run(main())


def test_the_resync_jitter_spreads_a_fleet_over_half_the_interval() -> None:
    feeds = [QueueFeed(object(), OUTPOST, f"w{n}") for n in range(400)]  # type: ignore[arg-type]
    intervals = [feed.listwatch.resync_interval or 0.0 for feed in feeds]
    low = feed_module.RESYNC_INTERVAL * (1 - feed_module.RESYNC_JITTER)
    assert all(low <= value <= feed_module.RESYNC_INTERVAL for value in intervals)
    # 400 draws over [150 s, 300 s]: both ends of the window are reached, not one moment for all.
    assert min(intervals) < low + 15 and max(intervals) > feed_module.RESYNC_INTERVAL - 15


def relisting_feed(second_list: Any) -> tuple[Server, QueueFeed, list[int]]:
    server = Server([[entry("a", 1)], second_list])
    server.release[2] = asyncio.Event()
    woken: list[int] = []
    feed = QueueFeed(server, OUTPOST, "me", spread=True, on_change=lambda: woken.append(1))  # type: ignore[arg-type]
    feed.listwatch.resync_interval = 0.05
    return server, feed, woken


def test_a_spreading_feed_offers_no_row_while_a_relist_is_in_flight() -> None:
    async def main() -> None:
        # While the second list is in flight, another worker claims "a" and "b" is enqueued.
        server, feed, woken = relisting_feed([entry("a", 1, holder="peer"), entry("b", 2)])
        async with following(feed):
            await until(lambda: server.lists == 2, "the periodic list")
            oldest = feed.next_candidate()
            assert oldest is not None and oldest.session_id == "a"  # the picture being replaced
            assert feed.relisting
            assert feed.next_claim() is None  # "a" still looks free here: no claim is chosen on it
            before = len(woken)
            server.release[2].set()
            await until(lambda: not feed.relisting, "the end of the list")
            assert len(woken) > before  # the claim loop is woken to look again
            choice = feed.next_claim()
            assert choice is not None and choice.entry.session_id == "b"

    asyncio.run(main())


def test_a_failed_relist_lifts_the_hold_and_wakes_the_claim_loop() -> None:
    async def main() -> None:
        server, feed, woken = relisting_feed(FleetConnectionError("list sessions", "ConnectError: refused"))
        async with following(feed):
            await until(lambda: server.lists == 2, "the periodic list")
            assert feed.next_claim() is None
            before = len(woken)
            server.release[2].set()
            await until(lambda: not feed.relisting, "the failed list")
            assert len(woken) > before
            choice = feed.next_claim()  # the picture we had: claims go on (an outage fails them anyway)
            assert choice is not None and choice.entry.session_id == "a"

    asyncio.run(main())


def test_the_first_list_holds_nothing_back() -> None:
    async def main() -> None:
        server = Server([[entry("a", 1)]])
        server.release[1] = asyncio.Event()
        feed = QueueFeed(server, OUTPOST, "me", spread=True)  # type: ignore[arg-type]
        async with following(feed):
            await until(lambda: server.lists == 1, "the first list")
            assert (
                not feed.relisting
            )  # no picture to replace: nothing is held back, there is just nothing yet
            server.release[1].set()
            await until(lambda: feed.synced, "the first picture")
            choice = feed.next_claim()
            assert choice is not None and choice.entry.session_id == "a"

    asyncio.run(main())
