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
* every :data:`RESYNC_INTERVAL` seconds the watch is re-seeded by a full list, a level-based safety net;
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

Spreading (``spread=True``, the worker's default): when every worker of an outpost goes for the same
oldest row, one wins and all the others get a 409, and each 409 counts against the account's rate
limits. :meth:`QueueFeed.next_claim` therefore keeps oldest-first as the rule but shares the oldest rows
out between the *contenders*: this worker and the other acceptors seen on the outpost (claiming a row,
or giving one back) in the last :data:`PEER_MEMORY` seconds that hold no claim now, i.e. are probably
idle, in one order every worker computes alike (:func:`contender_order`, a hash).

* The matching: the *i*-th contender takes the *i*-th oldest claimable row, at once. A contender that
  claims its row leaves the matching together with that row, so every other pair stays as it was, and
  a worker one event behind still picks the same row: collisions come only from views that disagree
  about which contenders are idle. Penalised rows still count in the positions (others do not know of
  our penalties); a worker whose own row is penalised looks further.
* A worker whose session ended waits (at most :data:`ECHO_WAIT` from when its slot fell free) for the
  watch to show its claim given back: until then the others do not count it idle.
* A worker the others do not count (:attr:`QueueFeed.known_to_peers`: its own claim not seen on the
  watch in the last :data:`PEER_MEMORY` seconds; or it holds other claims) takes a random row among
  the spare rows beyond the matched ones once it has seen any other acceptor.
* After a 409 (:meth:`QueueFeed.lost_race`) the worker knows it is in a crowd its view does not show:
  it picks a random row among the spare rows beyond the matched ones (:func:`scatter_width`) at a
  random moment (:data:`SCATTER_PAUSE`, doubling per further 409 up to :data:`SCATTER_PAUSE_CAP`), and
  keeps that choice until someone else takes the row. Its own claim on the watch ends the streak.
* The head (the oldest claimable row): a worker without a row of its own takes it once the head's
  contender has had ``min(rank, SPREAD_MAX_RANK) * SPREAD_STEP`` seconds since the row became the head
  (rank: its place in the order; :data:`SPREAD_MAX_RANK` for a worker the others do not count).

Fairness bound: when any contender is idle, the head is claimed no later than ``SPREAD_MAX_RANK *
SPREAD_STEP`` seconds (2 s) after it became the head; rows behind it go in age order to the matched
contenders, and only a crowd after a 409 takes spare rows out of order. With a single worker (no idle
peer seen, no 409) the order is exactly oldest-first. A fleet that starts together knows no peer until
each has claimed once; a worker that has seen nobody makes its first claim at a random moment within
:data:`FIRST_CLAIM_JITTER` (the oldest row still), so that most of such a fleet sees someone claim, and
scatters, first.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import logging
import random
import time
from collections.abc import AsyncIterator, Collection, Iterable
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from devin_outposts.api import listwatch as listwatch_module
from devin_outposts.api.errors import FleetAuthError, FleetError, FleetProtocolError
from devin_outposts.api.listwatch import ListWatch, Step, relist_after
from devin_outposts.api.models import Phase, QueueEntry, WatchEvent, WatchEventType
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.retrying import Backoff

log = logging.getLogger(__name__)

RESYNC_INTERVAL = 300.0
#: The longest wait between attempts to reach a failing API: an idle worker notices a recovered API
#: within this many seconds (each attempt is one request; jitter spreads a fleet's attempts).
FEED_BACKOFF_CAP = 5.0
#: After a few clean stream ends in a row that came at once without an event, each reconnect waits this
#: long (the one list-then-watch's pacing, api/listwatch.py).
QUICK_END_PAUSE = listwatch_module.QUICK_END_PAUSE
#: Seconds past ``claim_deadline`` before an expired claim of another worker is tried (clock skew).
EXPIRY_SLACK = 1.0
#: Spreading: how long a worker without a row of its own leaves the head to the head's contender, per
#: place in the order. Long enough for that contender's claim to reach our watch (a claim round trip
#: plus an SSE event), short enough not to matter next to a session.
SPREAD_STEP = 0.25
#: Places beyond this wait no longer: a head whose first few contenders are gone is claimed within 2 s.
SPREAD_MAX_RANK = 8
#: Seconds an acceptor seen on the outpost counts as a peer. Idle peers are only known from their past
#: claims and releases, so a long memory keeps a quiet outpost spread; a peer that has gone away costs
#: at most a deferral of SPREAD_STEP per place on the head while it was matched to it.
PEER_MEMORY = 600.0
#: A worker without a matched row scatters over the spare rows: first over four rows per acceptor it
#: knows of (at least 32), doubling after each further 409, at most this many rows.
SCATTER_MAX = 1024
#: The scattered claim waits a random part of this many seconds, doubling after each further 409 up to
#: SCATTER_PAUSE_CAP: a crowd of workers that lost the same race comes back spread out in time too.
SCATTER_PAUSE = 0.5
SCATTER_PAUSE_CAP = 4.0
#: Seconds after the last 409 that a worker still counts itself in a crowd (unless it claimed since).
STREAK_MEMORY = 30.0
#: A worker that has seen no other acceptor on the outpost yet may be alone, or one of a fleet that
#: started together, where every worker would go for the first row at once. Its first claim waits a
#: random part of this many seconds (still the oldest row): the fleet's first claims come spread out,
#: and the later ones see the winner's claim and that they are not alone. Once per start.
FIRST_CLAIM_JITTER = 1.0
#: A worker whose session has ended waits at most this long (from when its slot fell free) for the
#: watch to show its claim given back, i.e. for the others to count it idle, before claiming its row.
ECHO_WAIT = 1.0


def rendezvous_score(acceptor_id: str, session_id: str) -> int:
    """A stable pseudo-random score of ``(acceptor, session)``: the same on every worker and platform."""
    digest = hashlib.blake2b(f"{acceptor_id}\0{session_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def contender_order(acceptor_id: str, outpost_id: str) -> int:
    """Where an acceptor stands among an outpost's idle contenders: the same on every worker. A hash
    rather than the name, so that no naming scheme puts one site's workers always first."""
    return rendezvous_score(acceptor_id, outpost_id)


def scatter_width(streak: int, acceptors: int) -> int:
    """How many spare rows a worker without a matched row chooses among (0 before any 409)."""
    if streak <= 0:
        return 0
    return min(max(32, 4 * acceptors) << min(streak - 1, 16), SCATTER_MAX)


@dataclass(frozen=True)
class ClaimChoice:
    """The row to claim next, and how many seconds to wait before claiming it (0: now)."""

    entry: QueueEntry
    wait: float


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
    ) -> None:
        self.client = client
        self.outpost_id = outpost_id
        self.acceptor_id = acceptor_id
        self.watch = watch
        self.poll_interval = poll_interval
        self.backoff = Backoff(cap=min(backoff_max, FEED_BACKOFF_CAP))
        #: When to list, where to watch from, how long to wait (``api/listwatch.py``).
        self.listwatch = ListWatch(self.backoff.delay, resync_interval=RESYNC_INTERVAL)
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
        #: Other acceptors seen holding a claim on this outpost -> when (monotonic), most recent last.
        self._peers: dict[str, float] = {}
        #: session_id -> when (monotonic) it became claimable in our view: a deferral counts from there.
        self._claimable_since: dict[str, float] = {}
        #: The oldest claimable row in our view and when (monotonic) it became the oldest.
        self._head: tuple[str, float] = ("", 0.0)
        self._order_keys: dict[str, int] = {}
        #: When (monotonic) the watch last showed a claim of ours: the other workers count us from then.
        self._seen_self: Optional[float] = None
        #: 409s in a row (lost_race) and when the last came; a claim of ours on the watch resets it.
        self._streak = 0
        self._streak_at = 0.0
        #: Our claims as the watch shows them (the others judge us busy by these, not by our pool).
        self._ours_on_watch: set[str] = set()
        #: A scattered choice (session_id, when to claim it), kept until it is taken or gone.
        self._plan: Optional[tuple[str, float]] = None
        #: When (monotonic) a worker that saw nobody else may make its first claim (FIRST_CLAIM_JITTER);
        #: None until drawn, 0.0 once it has claimed, lost a race or met a peer before drawing.
        self._first_claim_at: Optional[float] = None

    # --- the picture ------------------------------------------------------------------------------

    def upsert(self, entry: QueueEntry) -> None:
        sid = entry.session_id
        holder = entry.status.acceptor_id
        previous = self.entries.get(sid)
        if previous is not None and previous.status.phase == Phase.CLAIMED:
            # A peer that gives a row back (its session ended, or a release) is idle now: seen as such
            # at once, not only at its next claim, so that workers learn each other after one session.
            was = previous.status.acceptor_id
            if was and was != self.acceptor_id and was != holder:
                self._see_peer(was)
        if entry.is_finished and holder != self.acceptor_id:
            # Never claimable again unless the server says otherwise (a resume is a new event): an ended
            # row is not kept, or the picture grows with every session the outpost ever served.
            self.entries.pop(sid, None)
        else:
            self.entries[sid] = entry
        if entry.status.phase == Phase.CLAIMED and holder == self.acceptor_id:
            self._seen_self = time.monotonic()  # the others see it too: they count us as a contender
            self._streak = 0
            self._first_claim_at = 0.0
        if entry.status.phase == Phase.CLAIMED and holder == self.acceptor_id and not entry.is_finished:
            self._ours_on_watch.add(sid)
        elif sid in self._ours_on_watch:
            self._ours_on_watch.discard(sid)
            self.on_change()  # the others now count us idle too: our matched row is ours to claim
        if entry.status.phase == Phase.CLAIMED and holder and holder != self.acceptor_id:
            self._see_peer(holder)
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

    def _see_peer(self, acceptor_id: str) -> None:
        self._order(acceptor_id)
        self._peers.pop(acceptor_id, None)  # re-insert: the dict stays ordered by when we last saw them
        self._peers[acceptor_id] = time.monotonic()

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
        if session_id in self._ours_on_watch:
            self._ours_on_watch.discard(session_id)
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
        window = self._oldest(1, exclude)
        return window[0] if window else None

    def _oldest(self, count: int, exclude: Collection[str], *, skip_blocked: bool = True) -> list[QueueEntry]:
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
            if not skip_blocked or not self._blocked(sid, exclude, mono):  # not ours, not cooling down
                found.append(current)
        for item in stepped_over:
            heapq.heappush(self._pending, item)
        expired = [
            self.entries[sid]
            for sid, expiry in self._foreign.items()
            if expiry <= now and (not skip_blocked or not self._blocked(sid, exclude, mono))
        ]
        expired = [e for e in expired if self.claimable(e, now)]
        if expired:
            found = oldest_first(found + expired)[:count]
        return found

    def _idle_peers(self) -> list[str]:
        """The peers seen on the outpost in the last :data:`PEER_MEMORY` seconds that hold no claim now."""
        mono = time.monotonic()
        for peer, seen in list(self._peers.items()):  # oldest first: stop at the first one to keep
            if mono - seen <= PEER_MEMORY:
                break
            del self._peers[peer]
        now = self.clock()
        busy = {self.entries[sid].status.acceptor_id for sid, expiry in self._foreign.items() if expiry > now}
        return [peer for peer in self._peers if peer not in busy]

    def contenders(self) -> list[str]:
        """The acceptors that may claim a row now: this one and the peers that are probably idle, in the
        order every worker ranks them (:func:`contender_order`)."""
        idle = sorted(self._idle_peers(), key=self._order)
        return [self.acceptor_id, *idle]

    def _order(self, acceptor_id: str) -> int:
        key = self._order_keys.get(acceptor_id)
        if key is None:
            key = self._order_keys[acceptor_id] = contender_order(acceptor_id, self.outpost_id)
        return key

    @property
    def known_to_peers(self) -> bool:
        """Whether the other workers have seen this one claim lately (they count it as a contender)."""
        return self._seen_self is not None and time.monotonic() - self._seen_self <= PEER_MEMORY

    def lost_race(self, session_id: str, seconds: float) -> None:
        """Our claim of ``session_id`` got a 409: set the row aside and remember that we are in a crowd."""
        self.penalize(session_id, seconds)
        self._streak += 1
        self._streak_at = time.monotonic()
        self._plan = None
        self._first_claim_at = 0.0

    def streak(self) -> int:
        """409s in a row lately (reset by a claim of ours on the watch, forgotten after STREAK_MEMORY)."""
        if self._streak and time.monotonic() - self._streak_at > STREAK_MEMORY:
            self._streak = 0
        return self._streak

    def next_claim(
        self, exclude: Collection[str] = (), *, looking_since: Optional[float] = None, conflicts: int = 0
    ) -> Optional[ClaimChoice]:
        """The row this worker should claim next and when (None when nothing is claimable).

        Without spreading it is :meth:`next_candidate`, at once; so it is with spreading while no idle
        peer is known and no claim of ours lost a race (a lone worker: strictly oldest first). Else the
        module docstring's matching decides. ``conflicts`` is how many 409s in a row the caller has just
        had (the feed also counts them, :meth:`lost_race`); ``looking_since`` is when the caller's slot
        fell free (``time.monotonic()``; None: now), from which the wait for our release's echo counts.
        """
        if not self.spread:
            first = self.next_candidate(exclude)
            return ClaimChoice(first, 0.0) if first is not None else None
        streak = max(conflicts, self.streak())
        idle = self._idle_peers()
        if not idle and not streak and (not self._peers or self.known_to_peers):
            # Alone (nobody seen), or known to peers that are all busy: strictly the oldest row. A worker
            # that sees others claim but has never been seen itself is one of a crowd (a fleet that
            # started together): it takes a spare row at random below.
            self._plan = None
            first = self.next_candidate(exclude)
            return ClaimChoice(first, self._first_claim_wait()) if first is not None else None
        mono = time.monotonic()
        # The others count us among the idle contenders once the watch shows none of our claims; a
        # claim we still hold (a worker with several slots) keeps us busy in their eyes.
        known = self.known_to_peers and not (self._ours_on_watch & set(exclude))
        insiders = len(idle) + (1 if known else 0)
        width = scatter_width(max(1, streak), len(self._peers) + 1)
        rows = self._oldest(insiders + width, exclude, skip_blocked=False)
        if not rows:
            self._plan = None
            return None
        usable = [not self._blocked(row.session_id, exclude, mono) for row in rows]
        rank = SPREAD_MAX_RANK
        if known:
            mine = self._order(self.acceptor_id)
            keys = self._order_keys  # every peer's key was computed when it was first seen
            rank = sum(1 for peer in idle if keys[peer] < mine)
            if rank < len(rows) and usable[rank]:
                self._plan = None
                # The row matched to us, nobody else's; but until the watch shows that our last claim
                # was given back, the others do not count us, and one of them would pick the same row.
                looking = mono if looking_since is None else min(looking_since, mono)
                echo = looking + ECHO_WAIT - mono if self._ours_on_watch - set(exclude) else 0.0
                return ClaimChoice(rows[rank], max(0.0, echo))
        spare = [row for row, ok in zip(rows[insiders:], usable[insiders:]) if ok][:width]
        if spare:
            return self._scattered(spare, streak, mono)
        return self._head_choice(rows[0], usable[0], rank, mono)

    def _first_claim_wait(self) -> float:
        """Seconds before a worker that has seen nobody else makes its first claim (0 afterwards)."""
        mono = time.monotonic()
        if self._first_claim_at is None:
            if not self.spread or self._peers or self._seen_self is not None:
                self._first_claim_at = 0.0  # not a fleet's first moment: it knows who is there
            else:
                self._first_claim_at = mono + random.uniform(0.0, FIRST_CLAIM_JITTER)  # noqa: S311
        return max(0.0, self._first_claim_at - mono)

    def _scattered(self, spare: list[QueueEntry], streak: int, mono: float) -> ClaimChoice:
        """A row beyond the matched ones for a worker the others do not count (or whose own row is
        gone): after a 409, a random one among ``spare`` at a random moment, kept until it is taken."""
        if self._plan is not None:
            sid, at = self._plan
            for row in spare:
                if row.session_id == sid:
                    return ClaimChoice(row, max(0.0, at - mono))
        # S311: spreading load, not a secret.
        row = random.choice(spare)  # noqa: S311
        if not streak:  # other workers the rest do not count may be looking too: a random spare row
            self._plan = None
            return ClaimChoice(row, 0.0)
        pause = random.uniform(0.0, min(SCATTER_PAUSE * 2.0 ** (streak - 1), SCATTER_PAUSE_CAP))  # noqa: S311
        self._plan = (row.session_id, mono + pause)
        return ClaimChoice(row, pause)

    def _head_choice(self, head: QueueEntry, usable: bool, rank: int, mono: float) -> Optional[ClaimChoice]:
        """No row of our own: the oldest row, once its matched contender has had ``rank`` steps."""
        if not usable:
            return None
        sid = head.session_id
        if self._head[0] != sid:
            self._head = (sid, mono)
        since = self._claimable_since.get(sid)
        if since is None:  # another worker's expired claim: claimable since it expired
            expiry = self._foreign.get(sid)
            since = mono - max(0.0, self.clock() - expiry) if expiry is not None else mono
        start = max(since, self._head[1])
        return ClaimChoice(head, max(0.0, start + min(max(rank, 1), SPREAD_MAX_RANK) * SPREAD_STEP - mono))

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
        events = self.client.watch_devins(outpost=self.outpost_id, cursor=self.cursor)
        async for event in events:
            self.apply(event)
