"""The SSE watch stream of ``GET /opbeta/outposts/devins?watch=true``.

A stream first replays every row at or after its cursor (tombstones as ``DELETED``), oldest change first,
then sends each later change as it is committed. Live delivery is push, not polling: the store calls
:meth:`Notifier.notify` after each committed change (from whatever thread), which wakes every open stream;
each stream then reads only the rows after its own position. Idle streams send ``: keepalive`` comments,
and every stream ends after ``watch_max_duration`` (or when the server shuts down), so clients must
reconnect with the cursor of the last event they processed.

Wire format, one event::

    data: {"type":"MODIFIED","object":{...queue entry...},"cursor":"..."}
    <blank line>

Within one stream an event is never sent twice for the same ``(session_id, rev)``; across reconnects the
row at the cursor comes again (at-least-once), and clients dedup by session id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Optional

from starlette.concurrency import run_in_threadpool

from devin_outposts.sim.cursor import QueueCursor
from devin_outposts.sim.store import Store

log = logging.getLogger(__name__)

KEEPALIVE = ": keepalive\n\n"
#: Rows read from SQLite per wake-up; a backlog is replayed in batches of this size.
BATCH = 200


class Notifier:
    """Wakes the open watch streams of one event loop. ``notify`` is safe from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: set[asyncio.Event] = set()
        self.closed = False

    def subscribe(self) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters.add(event)
        return event

    def unsubscribe(self, event: asyncio.Event) -> None:
        self._waiters.discard(event)

    def notify(self) -> None:
        # RuntimeError: the loop has closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake)

    def close(self) -> None:
        """End every stream (server shutdown). Call from the loop's thread."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        for event in self._waiters:
            event.set()

    @property
    def open_streams(self) -> int:
        return len(self._waiters)


def format_event(payload: dict[str, object]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def watch_stream(
    store: Store,
    notifier: Notifier,
    *,
    account_id: str,
    outpost: Optional[str],
    cursor: Optional[QueueCursor],
    max_duration: float,
    keepalive_interval: float,
) -> AsyncIterator[str]:
    """Yield SSE chunks until ``max_duration`` passes, the server shuts down or the client goes away."""
    wake = notifier.subscribe()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_duration
    last_write = loop.time()
    emitted: dict[str, float] = {}
    position, inclusive = cursor, True
    try:
        while not notifier.closed and loop.time() < deadline:
            wake.clear()
            changes = await run_in_threadpool(
                store.changes_since,
                account_id,
                outpost=outpost,
                cursor=position,
                inclusive=inclusive,
                limit=BATCH,
            )
            inclusive = False
            for change in changes:
                position = change.cursor
                if emitted.get(change.entry.session_id) == change.cursor.rev:
                    continue
                emitted[change.entry.session_id] = change.cursor.rev
                yield format_event(change.event())
                last_write = loop.time()
            if len(changes) >= BATCH:
                continue  # more backlog to replay
            now = loop.time()
            timeout = min(deadline, last_write + keepalive_interval) - now
            if timeout > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout)
            now = loop.time()
            if not wake.is_set() and now < deadline and now >= last_write + keepalive_interval:
                yield KEEPALIVE
                last_write = now
    finally:
        notifier.unsubscribe(wake)
        log.debug("watch stream closed (account %s, outpost %s)", account_id, outpost)
