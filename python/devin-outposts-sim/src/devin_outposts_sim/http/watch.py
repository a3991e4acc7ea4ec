"""The SSE watch stream of ``GET /opbeta/outposts/devins?watch=true``.

A stream first replays every row at or after its cursor (tombstones as ``DELETED``), oldest change first,
then sends each later change as it is committed. Idle streams send ``: keepalive`` comments, and every
stream ends after ``watch_max_duration`` (or when the server shuts down), so clients must reconnect with
the cursor of the last event they processed.

Live delivery is push, and shared: the store calls :meth:`ChangeFeed.notify` after each committed change
(from whatever thread). The feed then reads the new changes from SQLite **once**, serialises each one
**once** into its SSE bytes, keeps the recent ones, and wakes every open stream; each stream sends the
events of its account (and outpost) that it has not sent yet. Why: with one read and one serialisation per
stream, the cost of a change grew with the number of open streams (a fleet of 50 workers has 50), and the
simulator spent most of a claim storm serving idle watchers. A stream that falls behind the feed's
window, or has just connected, reads its backlog from SQLite itself.

Wire format, one event::

    data: {"type":"MODIFIED","object":{...queue entry...},"cursor":"..."}
    <blank line>

Within one stream an event is never sent twice for the same ``(session_id, rev)``; across reconnects the
row at the cursor comes again (at-least-once), and clients dedup by session id.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Optional

from starlette.concurrency import run_in_threadpool

from devin_outposts_sim.state.cursor import QueueCursor
from devin_outposts_sim.state.rows import Change
from devin_outposts_sim.state.store import Store

log = logging.getLogger(__name__)

KEEPALIVE = b": keepalive\n\n"
#: Rows read from SQLite per read; a backlog is replayed in batches of this size.
BATCH = 200
#: Events the feed keeps for streams that are a little behind; older ones are read from SQLite again.
FEED_WINDOW = 20000


class Notifier:
    """Wakes the waiters of one event loop (watch streams, gateway long polls).

    ``notify`` is safe from any thread; ``wake`` and ``close`` are for the loop's own thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: set[asyncio.Event] = set()
        self.closed = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def subscribe(self) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters.add(event)
        return event

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._waiters.discard(event)

    def notify(self) -> None:
        # RuntimeError: the loop has closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.wake)

    def close(self) -> None:
        """End every stream (server shutdown)."""
        self.closed = True
        self.wake()

    def wake(self) -> None:
        for event in self._waiters:
            event.set()

    @property
    def open_streams(self) -> int:
        return len(self._waiters)


def format_event(payload: dict[str, object]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def encode_change(change: Change) -> bytes:
    return format_event(change.event()).encode()


@dataclass(frozen=True)
class FeedEvent:
    """One committed change, serialised once for every stream."""

    rev: float
    account_id: str
    outpost_id: str
    session_id: str
    cursor: QueueCursor
    data: bytes


def _feed_events(changes: list[Change]) -> list[FeedEvent]:
    return [
        FeedEvent(
            rev=change.cursor.rev,
            account_id=change.account_id,
            outpost_id=str(change.wire["metadata"]["outpost_id"]),
            session_id=change.session_id,
            cursor=change.cursor,
            data=encode_change(change),
        )
        for change in changes
    ]


class ChangeFeed:
    """Every committed queue change of this process, read and serialised once for all watch streams.

    ``events`` holds the changes with a revision above ``floor`` and at most ``head``, in revision order
    (revisions are unique). Only the loop's thread changes them, in one step with no ``await`` in it, so
    a stream that copies them sees a consistent window. While no stream is open the feed reads nothing
    and goes out of sync (``synced`` False); the first stream that needs it brings it back.
    """

    def __init__(self, store: Store, notifier: Notifier, window: int = FEED_WINDOW) -> None:
        self.store = store
        self.notifier = notifier
        self.window = window
        self.events: list[FeedEvent] = []
        self.revs: list[float] = []
        self.floor = 0.0
        self.head = 0.0
        self.synced = False
        self._pump: Optional[asyncio.Future[None]] = None
        self._again = False

    def notify(self) -> None:
        """A change was committed (any thread)."""
        with contextlib.suppress(RuntimeError):
            self.notifier.loop.call_soon_threadsafe(self.kick)

    def kick(self) -> None:
        """Read what was committed since the last read (loop thread); reads never overlap."""
        if self.notifier.closed or (not self.synced and not self.notifier.open_streams):
            return  # nobody watches: nothing to read until someone does
        if self._pump is not None and not self._pump.done():
            self._again = True
            return
        self._pump = asyncio.ensure_future(self._read_all())

    async def _read_all(self) -> None:
        try:
            while True:
                self._again = False
                if not self.synced:
                    if not self.notifier.open_streams:
                        return  # nobody watches: read nothing until someone does
                    dummy, head = await run_in_threadpool(self.store.queue.changes_after, None)
                    self.events, self.revs = [], []
                    self.floor = self.head = head
                    self.synced = True
                elif not self.notifier.open_streams:
                    self.synced = False
                    self.events, self.revs = [], []
                    return
                else:
                    read = await run_in_threadpool(self._read_once, self.head)
                    events, head = read
                    self._append(events, head if len(events) < BATCH else events[-1].rev)
                    if len(events) >= BATCH:
                        self._again = True
                self.notifier.wake()
                if not self._again or self.notifier.closed:
                    return
        except Exception:  # the next change tries again; streams meanwhile read SQLite themselves
            log.exception("the watch feed could not read the queue")
            self.synced = False

    def close(self) -> None:
        """Stop reading (server shutdown; the notifier ends the streams)."""
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()

    def _read_once(self, after: float) -> tuple[list[FeedEvent], float]:
        """The changes after ``after`` and the head, serialised (in a worker thread)."""
        changes, head = self.store.queue.changes_after(after, BATCH)
        return _feed_events(changes), head

    def _append(self, events: list[FeedEvent], head: float) -> None:
        self.events.extend(events)
        self.revs.extend(event.rev for event in events)
        self.head = max(self.head, head)
        excess = len(self.events) - self.window
        if excess > 0:
            self.floor = self.revs[excess - 1]
            del self.events[:excess]
            del self.revs[:excess]

    def covers(self, seen: float) -> bool:
        """Whether every change after ``seen`` is here (or will be, as the feed reads on)."""
        return self.synced and seen >= self.floor

    def after(self, seen: float) -> tuple[list[FeedEvent], float]:
        """The events after ``seen`` and the head they reach (no ``await``: a consistent copy)."""
        return self.events[bisect.bisect_right(self.revs, seen) :], self.head


async def watch_stream(
    store: Store,
    notifier: Notifier,
    feed: ChangeFeed,
    *,
    account_id: str,
    outpost: Optional[str],
    cursor: Optional[QueueCursor],
    max_duration: float,
    keepalive_interval: float,
) -> AsyncIterator[bytes]:
    """Yield SSE chunks until ``max_duration`` passes, the server shuts down or the client goes away."""
    wake = notifier.subscribe()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_duration
    last_write = loop.time()
    emitted: dict[str, float] = {}
    position, inclusive = cursor, True
    #: Every change at or below this revision has been sent or did not concern this stream.
    seen: Optional[float] = None
    try:
        while not notifier.closed and loop.time() < deadline:
            wake.clear()
            if seen is None or not feed.covers(seen):
                # Connecting, or behind the feed's window: read the backlog from SQLite.
                replay = functools.partial(
                    store.queue.replay, account_id, outpost=outpost, cursor=position, inclusive=inclusive,
                    limit=BATCH,
                )  # fmt: skip
                changes, head = await run_in_threadpool(replay)
                inclusive = False
                for change in changes:
                    position = change.cursor
                    if emitted.get(change.session_id) == change.cursor.rev:
                        continue
                    emitted[change.session_id] = change.cursor.rev
                    yield encode_change(change)
                    last_write = loop.time()
                if len(changes) >= BATCH:
                    continue  # more backlog to replay
                seen = head
                if not feed.synced:
                    feed.kick()  # the feed sleeps while nobody watches; it wakes this stream when it is back
            else:
                events, reached = feed.after(seen)
                for event in events:
                    if event.account_id != account_id:
                        continue
                    if outpost is not None and event.outpost_id != outpost:
                        continue
                    position = event.cursor
                    if emitted.get(event.session_id) == event.rev:
                        continue
                    emitted[event.session_id] = event.rev
                    yield event.data
                    last_write = loop.time()
                seen = max(seen, reached)
            if feed.synced and (not feed.covers(seen) or feed.head > seen):
                # The feed read more while this stream was sending, or moved its window past it (then
                # the replay above reads the backlog; its head is at least the feed's, so no busy loop).
                continue
            now = loop.time()
            timeout = min(deadline, last_write + keepalive_interval) - now
            if timeout > 0 and not wake.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout)
            now = loop.time()
            if not wake.is_set() and now < deadline and now >= last_write + keepalive_interval:
                yield KEEPALIVE
                last_write = now
    finally:
        notifier.unsubscribe(wake)
        log.debug("watch stream closed (account %s, outpost %s)", account_id, outpost)
