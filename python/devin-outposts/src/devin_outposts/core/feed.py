"""Following one outpost's queue: list, then watch from the final cursor, with reconnects.

:class:`QueueFeed` keeps an up-to-date picture of the outpost's entries and tells the runner which
sessions may be claimed (docs/fleet-api.md §4 and §5):

* a full list (all phases) seeds the picture and yields the cursor the watch starts from;
* every ``MODIFIED``/``DELETED`` event is upserted by ``session_id`` (delivery is at least once, so a
  duplicate is harmless) and its cursor is kept for the next reconnect;
* the stream ends by design after a few minutes (or seconds): a clean end is reconnected at once from
  the last cursor, however short the stream lived; only an error backs off, 1 s, 2 s, 4 s ... up to
  :data:`FEED_BACKOFF_CAP` seconds, with jitter. Any failure but an outage (a rejected cursor, 400/422,
  a malformed event, an unexpected answer) re-lists;
* every :data:`RESYNC_INTERVAL` seconds (less up to :data:`RESYNC_JITTER` of it, drawn once per feed) the
  watch is re-seeded by a full list, a level-based safety net. The feed ends its stream itself when that
  list is due: the server ends together the streams of a fleet that connected together, and lists made
  on those ends would come as one wave of the whole fleet's lists (see :data:`RESYNC_JITTER`);
* while such a re-list is in flight, a spreading feed offers no row (:meth:`QueueFeed.next_claim`): its
  picture is about to be replaced by a fresher one, and claims chosen on the old one collide;
* with ``watch=False`` the queue is re-listed every poll interval instead.

Those decisions (when to list, where to resume, when to wait and how long) are the fleet API's one
list-then-watch bookkeeping, :class:`~devin_outposts.api.listwatch.ListWatch`, which the event source
``devin.outposts.outpost_queue`` follows too; this module does the I/O and keeps the picture.

Claimable means: ``phase=pending`` and ``session_status`` neither ``suspended`` nor ``terminated``, or
claimed by another acceptor whose ``claim_deadline`` has passed (its claim returns to the queue). The
runner takes them oldest first: ``created_at``, then ``session_id``, one at a time through
:meth:`QueueFeed.next_candidate`, which judges the feed's *current* copy of each row. It keeps pending rows
in a heap (pruned lazily) and other acceptors' claims in a small map, so a queue event costs O(log n)
instead of a sort of the whole outpost.

Spreading (``spread=True``, the worker's default) is :mod:`devin_outposts.core.spread`: with it,
:meth:`QueueFeed.next_claim` shares the oldest rows out between the outpost's idle workers instead of
sending every one of them at the oldest row; without it, the order is exactly oldest-first.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import time
from collections.abc import AsyncIterator, Collection, Iterable
from typing import Callable, Optional, Protocol

from devin_outposts.api import listwatch as listwatch_module
from devin_outposts.api.errors import FleetAuthError, FleetError, FleetProtocolError
from devin_outposts.api.listwatch import ListWatch, Step, relist_after
from devin_outposts.api.models import Phase, QueueEntry, WatchEvent, WatchEventType
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.retrying import Backoff
from devin_outposts.core.spread import ClaimChoice, ClaimSpreader

log = logging.getLogger(__name__)

RESYNC_INTERVAL = 300.0
#: Each feed lists again up to this share of RESYNC_INTERVAL sooner (drawn once), and ends its stream for
#: it: a fleet that started together would otherwise send every worker's full list in the same second,
#: every 300 s. In the fleet model, 1,000 workers listing at once slowed the simulator's answers and
#: blinded every worker for the same seconds, and each wave set off a storm of 409s (docs/worker.md).
RESYNC_JITTER = 0.5
#: The longest wait between attempts to reach a failing API: an idle worker notices a recovered API
#: within this many seconds (each attempt is one request; jitter spreads a fleet's attempts).
FEED_BACKOFF_CAP = 5.0
#: After a few clean stream ends in a row that came at once without an event, each reconnect waits this
#: long (the one list-then-watch's pacing, api/listwatch.py).
QUICK_END_PAUSE = listwatch_module.QUICK_END_PAUSE
#: Seconds past ``claim_deadline`` before an expired claim of another worker is tried (clock skew).
EXPIRY_SLACK = 1.0


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
    ) -> tuple[list[QueueEntry], Optional[str]]:
        """One page of the outpost's queue entries and the cursor of the next (None on the last)."""

    def watch_devins(
        self, *, outpost: Optional[str] = None, cursor: Optional[str] = None
    ) -> AsyncIterator[WatchEvent]:
        """The outpost's queue changes as they happen, from ``cursor`` on."""


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
        spread: bool = False,
        on_change: Optional[Callable[[], None]] = None,
        fleet_size: Optional[int] = None,
    ) -> None:
        self.client = client
        self.outpost_id = outpost_id
        self.acceptor_id = acceptor_id
        self.watch = watch
        self.poll_interval = poll_interval
        self.backoff = Backoff(cap=min(backoff_max, FEED_BACKOFF_CAP))
        #: When to list, where to watch from, how long to wait (``api/listwatch.py``).
        resync = RESYNC_INTERVAL * (1.0 - random.uniform(0.0, RESYNC_JITTER))  # noqa: S311 (spreading load)
        self.listwatch = ListWatch(self.backoff.delay, resync_interval=resync)
        self.metrics = metrics or Metrics()
        self.on_update = on_update
        self.clock = clock
        self.entries: dict[str, QueueEntry] = {}
        #: Called when a row may have become claimable (the owner's loop should look again).
        self.on_change = on_change or (lambda: None)
        self.synced = False
        self._penalties: dict[str, float] = {}
        # Rows seen pending, oldest on top. An item whose row is no longer pending is dropped when it
        # reaches the top; a row that turns pending again is pushed again (``_in_heap`` avoids duplicates).
        self._pending: list[tuple[tuple[int, str], str]] = []
        self._in_heap: set[str] = set()
        self._compact_at = 64
        #: session_id -> when another acceptor's claim of it expires.
        self._foreign: dict[str, float] = {}
        self.spread = spread
        #: Whom this worker has seen on the outpost, and which row it should claim (core/spread.py).
        self.spreader = ClaimSpreader(acceptor_id, outpost_id, fleet_size)
        #: session_id -> when (monotonic) it became claimable in our view: a deferral counts from there.
        self._claimable_since: dict[str, float] = {}
        #: A list that will replace a picture we already had is in flight (see next_claim).
        self.relisting = False

    # --- the picture ------------------------------------------------------------------------------

    def upsert(self, entry: QueueEntry) -> None:
        sid = entry.session_id
        holder = entry.status.acceptor_id
        if self.spreader.observe(self.entries.get(sid), entry):
            self.on_change()  # the others now count us idle too: our matched row is ours to claim
        if entry.is_finished and holder != self.acceptor_id:
            # Never claimable again unless the server says otherwise (a resume is a new event): an ended
            # row is not kept, or the picture grows with every session the outpost ever served.
            self.entries.pop(sid, None)
        else:
            self.entries[sid] = entry
        if entry.status.phase == Phase.PENDING and not entry.is_finished:
            self._claimable_since.setdefault(sid, time.monotonic())
        else:
            self._claimable_since.pop(sid, None)
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
            self.on_change()

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
        if self.spreader.forget(session_id):
            self.on_change()
        if self.on_update:
            self.on_update(session_id, None)

    def replace_all(self, entries: Iterable[QueueEntry]) -> None:
        fresh = {entry.session_id: entry for entry in entries}
        for gone in set(self.entries) - set(fresh):
            self.remove(gone)
        for entry in fresh.values():
            self.upsert(entry)
        self.synced = True
        self.on_change()

    @property
    def cursor(self) -> Optional[str]:
        """Where the next watch starts: the cursor of the last event applied, else of the last list."""
        return self.listwatch.cursor

    def apply(self, event: WatchEvent) -> None:
        if event.type == WatchEventType.DELETED:
            self.remove(event.object.session_id)
        else:  # MODIFIED, or a type we do not know yet: the object is still the freshest copy we have
            self.upsert(event.object)
        self.listwatch.event(event.cursor)

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
        self._claimable_since.pop(session_id, None)

    def _drop_expired_penalties(self) -> None:
        # Most penalised rows are claimed by the winner and never offered again, so they are not met
        # by _blocked; without this the map would grow and a run-out penalty would wake the loop at once.
        mono = time.monotonic()
        for sid, until in list(self._penalties.items()):
            if until <= mono:
                del self._penalties[sid]

    def blocked(self, session_id: str, exclude: Collection[str], mono: float) -> bool:
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
        window = self.oldest(1, exclude)
        return window[0] if window else None

    def oldest(self, count: int, exclude: Collection[str], *, skip_blocked: bool = True) -> list[QueueEntry]:
        """Up to ``count`` claimable rows, oldest first, skipping ``exclude`` and penalised rows (or not:
        the matching counts rows as every worker sees them, whatever this one has set aside)."""
        now, mono = self.clock(), time.monotonic()
        found: list[QueueEntry] = []
        stepped_over: list[tuple[tuple[int, str], str]] = []
        while self._pending and len(found) < count:
            item = heapq.heappop(self._pending)
            sid = item[1]
            current = self.entries.get(sid)
            if current is None or current.status.phase != Phase.PENDING or current.is_finished:
                self._in_heap.discard(sid)
                continue
            stepped_over.append(item)
            if not skip_blocked or not self.blocked(sid, exclude, mono):  # not ours, not cooling down
                found.append(current)
        for item in stepped_over:
            heapq.heappush(self._pending, item)
        expired = [
            self.entries[sid]
            for sid, expiry in self._foreign.items()
            if expiry <= now and (not skip_blocked or not self.blocked(sid, exclude, mono))
        ]
        expired = [e for e in expired if self.claimable(e, now)]
        if expired:
            found = oldest_first(found + expired)[:count]
        return found

    def busy_acceptors(self) -> set[str]:
        """The other acceptors whose claims on the outpost have not expired."""
        now = self.clock()
        return {
            self.entries[sid].status.acceptor_id or ""
            for sid, expiry in self._foreign.items()
            if expiry > now
        }

    def claimable_since(self, session_id: str, mono: float) -> float:
        """When (monotonic) ``session_id`` became claimable in our view (an expired claim of another
        worker: when it expired)."""
        since = self._claimable_since.get(session_id)
        if since is not None:
            return since
        expiry = self._foreign.get(session_id)
        return mono - max(0.0, self.clock() - expiry) if expiry is not None else mono

    # --- spreading (core/spread.py) ----------------------------------------------------------------

    def contenders(self) -> list[str]:
        """This worker and the peers that are probably idle, in the order every worker ranks them."""
        return self.spreader.contenders(self.busy_acceptors())

    @property
    def known_to_peers(self) -> bool:
        """Whether the other workers have seen this one claim lately (they count it as a contender)."""
        return self.spreader.known_to_peers

    def lost_race(self, session_id: str, seconds: float) -> None:
        """Our claim of ``session_id`` got a 409: set the row aside and remember that we are in a crowd."""
        self.penalize(session_id, seconds)
        self.spreader.lost_race()

    def streak(self) -> int:
        """409s in a row lately (reset by a claim of ours on the watch)."""
        return self.spreader.streak()

    def next_claim(
        self, exclude: Collection[str] = (), *, looking_since: Optional[float] = None, conflicts: int = 0
    ) -> Optional[ClaimChoice]:
        """The row this worker should claim next and when (None when nothing is claimable).

        Without spreading it is :meth:`next_candidate`, at once; with it, :meth:`ClaimSpreader.choose`
        decides (core/spread.py), which is the same while this worker is alone.
        """
        if not self.spread:
            first = self.next_candidate(exclude)
            return ClaimChoice(first, 0.0) if first is not None else None
        if self.relisting:
            # The picture is about to be replaced: rows another worker claimed since the stream closed
            # still look free here, and the deferrals have counted blind time. The list's end wakes us.
            return None
        return self.spreader.choose(self, exclude, looking_since=looking_since, conflicts=conflicts)

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
        self.relisting = self.synced
        try:
            entries, cursor = await self.client.list_all_devins(outpost=self.outpost_id)
        except BaseException:
            if self.relisting:
                self.relisting = False
                self.on_change()  # claims go on from the picture we have (an outage fails them anyway)
            raise
        self.relisting = False
        self.replace_all(entries)
        self.listwatch.listed(cursor)

    async def run(self) -> None:
        """Follow the queue until cancelled. Raises :class:`FleetAuthError`; every other error is retried.

        A stream the server ends cleanly is normal (streams are bounded in time), so the watch is
        reopened at once from the last cursor, however short it lived; only a stream that keeps ending
        at once without an event is paced (:data:`QUICK_END_PAUSE`), so a misbehaving server cannot
        make the worker spin. Errors back off with jitter up to :data:`FEED_BACKOFF_CAP` seconds, so an
        idle worker notices a recovered API within a few seconds. :class:`ListWatch` decides each step.
        """
        listwatch = self.listwatch
        while True:
            try:
                if not self.watch or listwatch.next_step() is Step.LIST:
                    await self._list()
                    if not self.watch:
                        listwatch.polled()
                        await asyncio.sleep(self.poll_interval)
                        continue
                listwatch.watching()
                await self._stream()
            except FleetAuthError:
                raise
            except FleetError as exc:
                relist = relist_after(exc.status, malformed=isinstance(exc, FleetProtocolError))
                delay = listwatch.failed(relist)
                self._count_reconnect()
                log.warning("%s; retrying in %.1fs", exc, delay, extra={"outpost": self.outpost_id})
            else:
                delay = listwatch.ended()
                self._count_reconnect()
                lived = listwatch.lived or 0.0
                log.debug("watch stream ended after %.1fs; reconnecting in %.1fs", lived, delay)
            if delay > 0:
                await asyncio.sleep(delay)

    def _count_reconnect(self) -> None:
        if self.listwatch.lived is not None:  # a watch was open (not a failed list)
            self.metrics.inc("watch_reconnects")

    async def _stream(self) -> None:
        """Apply the stream's events until the server ends it, or until the periodic list is due (no
        timeout when there is no periodic list)."""
        try:
            await asyncio.wait_for(self._follow(), timeout=self.listwatch.resync_in())
        except asyncio.TimeoutError:
            log.debug("ending the watch stream: the periodic list is due", extra={"outpost": self.outpost_id})

    async def _follow(self) -> None:
        events = self.client.watch_devins(outpost=self.outpost_id, cursor=self.cursor)
        async for event in events:
            self.apply(event)
