"""Following one outpost's queue: list, then watch from the final cursor, with reconnects.

:class:`QueueFeed` keeps an up-to-date picture of the outpost's entries and tells the runner which
sessions may be claimed (contract sections 3.3 and 3.4):

* a full list (all phases) seeds the picture and yields the cursor the watch starts from;
* every ``MODIFIED``/``DELETED`` event is upserted by ``session_id`` (delivery is at least once, so a
  duplicate is harmless) and its cursor is kept for the next reconnect;
* the stream ends by design after a few minutes: a connection that lived 5 s or more is reconnected at
  once and resets the backoff; a failed or short-lived one waits 1 s, 2 s, 4 s ... up to 60 s, with
  jitter, and reconnects with the last cursor. A rejected cursor (400/422 or a malformed event) re-lists;
* every :data:`RESYNC_INTERVAL` seconds the watch is re-seeded by a full list, a level-based safety net;
* with ``watch=False`` the queue is re-listed every poll interval instead.

Claimable means: ``phase=pending`` and ``session_status`` neither ``suspended`` nor ``terminated``, or
claimed by another acceptor whose ``claim_deadline`` has passed (its claim returns to the queue). The
runner takes them oldest first: ``created_at``, then ``session_id``, one at a time through
:meth:`QueueFeed.next_candidate`, which judges the feed's *current* copy of each row. It keeps pending rows
in a heap (pruned lazily) and other acceptors' claims in a small map, so a queue event costs O(log n)
instead of a sort of the whole outpost.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import time
from collections.abc import AsyncIterator, Collection, Iterable
from typing import Callable, Optional, Protocol

from devin_outposts.errors import FleetAuthError, FleetError, FleetInvalid, FleetProtocolError
from devin_outposts.models import Phase, QueueEntry, WatchEvent, WatchEventType
from devin_outposts.worker.metrics import Metrics

log = logging.getLogger(__name__)

RESYNC_INTERVAL = 300.0
#: Seconds past ``claim_deadline`` before an expired claim of another worker is tried (clock skew).
EXPIRY_SLACK = 1.0


class Backoff:
    """Exponential backoff with jitter: attempt *n* waits in ``[d/2, d]``, ``d = min(cap, base * 2**n)``.

    :meth:`connection_lived` resets it after a connection that lived at least ``reset_after`` seconds.
    """

    def __init__(
        self,
        base: float = 1.0,
        cap: float = 60.0,
        reset_after: float = 5.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.base = base
        self.cap = max(cap, 0.0)
        self.reset_after = reset_after
        self.attempt = 0
        self._rng = rng

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * (2 ** min(self.attempt, 32)))
        self.attempt += 1
        return float(ceiling / 2 + self._rng() * ceiling / 2)

    def reset(self) -> None:
        self.attempt = 0

    def connection_lived(self, seconds: float) -> bool:
        """Reset when the connection lived long enough; returns True when it did."""
        if seconds >= self.reset_after:
            self.reset()
            return True
        return False


class QueueSource(Protocol):
    """What the feed needs from the fleet client."""

    async def list_all_devins(
        self,
        *,
        outpost: Optional[str] = None,
        phase: Optional[str] = None,
        acceptor_id: Optional[str] = None,
        first: int = 100,
        cursor: Optional[str] = None,
    ) -> tuple[list[QueueEntry], Optional[str]]: ...

    def watch_devins(
        self, *, outpost: Optional[str] = None, cursor: Optional[str] = None
    ) -> AsyncIterator[WatchEvent]: ...


def age_key(entry: QueueEntry) -> tuple[int, str]:
    """The claiming order: oldest ``created_at`` first, then ``session_id``."""
    return (entry.metadata.created_at or 0, entry.session_id)


def oldest_first(entries: Iterable[QueueEntry]) -> list[QueueEntry]:
    return sorted(entries, key=age_key)


class QueueFeed:
    """The claimable sessions of one outpost, kept current by list-then-watch or by polling."""

    def __init__(
        self,
        client: QueueSource,
        outpost_id: str,
        acceptor_id: str,
        *,
        watch: bool = True,
        poll_interval: float = 5.0,
        backoff_max: float = 60.0,
        metrics: Optional[Metrics] = None,
        on_update: Optional[Callable[[str, Optional[QueueEntry]], None]] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.outpost_id = outpost_id
        self.acceptor_id = acceptor_id
        self.watch = watch
        self.poll_interval = poll_interval
        self.backoff = Backoff(cap=backoff_max)
        self.metrics = metrics or Metrics()
        self.on_update = on_update
        self.clock = clock
        self.entries: dict[str, QueueEntry] = {}
        self.changed = asyncio.Event()
        self.cursor: Optional[str] = None
        self.synced = False
        self._penalties: dict[str, float] = {}
        self._last_list = 0.0
        # Rows seen pending, oldest on top. An item whose row is no longer pending is dropped when it
        # reaches the top; a row that turns pending again is pushed again (``_in_heap`` avoids duplicates).
        self._pending: list[tuple[tuple[int, str], str]] = []
        self._in_heap: set[str] = set()
        self._compact_at = 64
        #: session_id -> when another acceptor's claim of it expires.
        self._foreign: dict[str, float] = {}

    # --- the picture ------------------------------------------------------------------------------

    def upsert(self, entry: QueueEntry) -> None:
        sid = entry.session_id
        self.entries[sid] = entry
        expiry = self._expiry(entry)
        if expiry is None:
            self._foreign.pop(sid, None)
        else:
            self._foreign[sid] = expiry
        if entry.status.phase == Phase.PENDING and not entry.is_finished and sid not in self._in_heap:
            heapq.heappush(self._pending, (age_key(entry), sid))
            self._in_heap.add(sid)
            if len(self._pending) > 2 * self._compact_at:
                self._compact()
        if self.on_update:
            self.on_update(entry.session_id, entry)
        if self.claimable(entry) or expiry is not None:
            self.changed.set()

    def _compact(self) -> None:
        """Rebuild the heap from the rows pending now (amortised O(1) per push).

        A worker whose slots stay busy never calls next_candidate, so nothing else prunes the heap.
        """
        self._pending = [
            (age_key(e), e.session_id)
            for e in self.entries.values()
            if e.status.phase == Phase.PENDING and not e.is_finished
        ]
        heapq.heapify(self._pending)
        self._in_heap = {item[1] for item in self._pending}
        self._compact_at = max(len(self._pending), 64)

    def remove(self, session_id: str) -> None:
        self.discard(session_id)
        if self.on_update:
            self.on_update(session_id, None)

    def replace_all(self, entries: Iterable[QueueEntry]) -> None:
        fresh = {entry.session_id: entry for entry in entries}
        for gone in set(self.entries) - set(fresh):
            self.remove(gone)
        for entry in fresh.values():
            self.upsert(entry)
        self.synced = True
        self.changed.set()

    def apply(self, event: WatchEvent) -> None:
        if event.type == WatchEventType.DELETED:
            self.remove(event.object.session_id)
        else:  # MODIFIED, or a type we do not know yet: the object is still the freshest copy we have
            self.upsert(event.object)
        if event.cursor:
            self.cursor = event.cursor

    def _expiry(self, entry: QueueEntry) -> Optional[float]:
        """When a claim held by another acceptor expires (None when it is not such a claim)."""
        status = entry.status
        if status.phase != Phase.CLAIMED or status.acceptor_id == self.acceptor_id or entry.is_finished:
            return None
        if status.claim_deadline is None:
            return None
        return float(status.claim_deadline) + EXPIRY_SLACK

    def claimable(self, entry: QueueEntry, now: Optional[float] = None) -> bool:
        if entry.is_finished:
            return False
        if entry.status.phase == Phase.PENDING:
            return True
        expiry = self._expiry(entry)
        return expiry is not None and expiry <= (self.clock() if now is None else now)

    def penalize(self, session_id: str, seconds: float) -> None:
        """Do not offer ``session_id`` for ``seconds`` (after a conflict or a failure)."""
        self._penalties[session_id] = time.monotonic() + seconds

    def discard(self, session_id: str) -> None:
        """Forget ``session_id`` until the server tells us about it again."""
        self.entries.pop(session_id, None)
        self._foreign.pop(session_id, None)

    def _drop_expired_penalties(self) -> None:
        # Most penalised rows are claimed by the winner and never offered again, so they are not met
        # by _blocked; without this the map would grow and a run-out penalty would wake the loop at once.
        mono = time.monotonic()
        for sid, until in list(self._penalties.items()):
            if until <= mono:
                del self._penalties[sid]

    def _blocked(self, session_id: str, exclude: Collection[str], mono: float) -> bool:
        until = self._penalties.get(session_id)
        if until is not None and until <= mono:
            del self._penalties[session_id]
            until = None
        return until is not None or session_id in exclude

    def next_candidate(self, exclude: Collection[str] = ()) -> Optional[QueueEntry]:
        """The oldest claimable row right now, judged on the current copy (None when there is none).

        Called again before every claim attempt, so a row another worker claimed, or that ended, while
        an earlier attempt was in flight is never tried on an old copy.
        """
        now, mono = self.clock(), time.monotonic()
        best: Optional[QueueEntry] = None
        stepped_over: list[tuple[tuple[int, str], str]] = []
        while self._pending:
            sid = self._pending[0][1]
            current = self.entries.get(sid)
            if current is None or current.status.phase != Phase.PENDING or current.is_finished:
                heapq.heappop(self._pending)
                self._in_heap.discard(sid)
                continue
            if self._blocked(sid, exclude, mono):  # ours already, or cooling down after a conflict
                stepped_over.append(heapq.heappop(self._pending))
                continue
            best = current
            break
        for item in stepped_over:
            heapq.heappush(self._pending, item)
        for sid, expiry in list(self._foreign.items()):
            if expiry > now or self._blocked(sid, exclude, mono):
                continue
            current = self.entries[sid]
            if self.claimable(current, now) and (best is None or age_key(current) < age_key(best)):
                best = current
        return best

    def candidates(self, exclude: Iterable[str] = ()) -> list[QueueEntry]:
        """Every claimable row, sorted: a full view for inspection (the claim loop uses next_candidate)."""
        now = self.clock()
        self._drop_expired_penalties()
        skip = set(exclude) | set(self._penalties)
        return oldest_first(
            e for e in self.entries.values() if e.session_id not in skip and self.claimable(e, now)
        )

    def next_wakeup(self) -> Optional[float]:
        """Seconds until a penalty or a foreign claim runs out (None when nothing is waiting)."""
        self._drop_expired_penalties()
        waits = [until - time.monotonic() for until in self._penalties.values()]
        now = self.clock()
        waits.extend(expiry - now for expiry in self._foreign.values() if expiry > now)
        return max(0.0, min(waits)) if waits else None

    # --- following the server ---------------------------------------------------------------------

    async def _list(self) -> None:
        entries, cursor = await self.client.list_all_devins(outpost=self.outpost_id)
        self.replace_all(entries)
        self.cursor = cursor
        self._last_list = time.monotonic()

    async def run(self) -> None:
        """Follow the queue until cancelled. Raises :class:`FleetAuthError`; every other error is retried."""
        need_list = True
        while True:
            started: Optional[float] = None
            error: Optional[FleetError] = None
            try:
                if need_list or not self.watch or time.monotonic() - self._last_list > RESYNC_INTERVAL:
                    await self._list()
                    need_list = False
                    if not self.watch:
                        self.backoff.reset()
                        await asyncio.sleep(self.poll_interval)
                        continue
                started = time.monotonic()
                await self._stream()
            except FleetAuthError:
                raise
            except (FleetProtocolError, FleetInvalid) as exc:
                need_list = True  # the cursor or the stream is unusable: start again from a list
                error = exc
            except FleetError as exc:
                error = exc
            lived = time.monotonic() - started if started is not None else 0.0
            if self.backoff.connection_lived(lived) and error is None:
                delay = 0.0  # a healthy stream ended by the server: reconnect at once
            else:
                delay = self.backoff.next_delay()
            if error is not None:
                log.warning("%s; retrying in %.1fs", error, delay, extra={"outpost": self.outpost_id})
            else:
                log.debug("watch stream ended after %.1fs; reconnecting in %.1fs", lived, delay)
            if started is not None:
                self.metrics.inc("watch_reconnects")
            await asyncio.sleep(delay)

    async def _stream(self) -> None:
        events = self.client.watch_devins(outpost=self.outpost_id, cursor=self.cursor)
        async for event in events:
            self.apply(event)
