"""Spreading the claims of an outpost's workers over its oldest rows (``spread=True``, the worker's default).

When every worker of an outpost goes for the same oldest row, one wins and all the others get a 409, and
each 409 counts against the account's rate limits. :class:`ClaimSpreader` therefore keeps oldest-first
as the rule but shares the oldest rows out between the *contenders*: this worker and the other acceptors
seen on the outpost (claiming a row, or giving one back) in the last :data:`PEER_MEMORY` seconds that
hold no claim now, i.e. are probably idle, in one order every worker computes alike
(:func:`contender_order`, a hash). The queue feed (:mod:`devin_outposts.core.feed`) keeps the picture
of the rows and asks the spreader which one to claim, and when; the spreader sees the rows only through
:class:`SpreadView`.

* The matching: the *i*-th contender takes the *i*-th oldest claimable row, at once. A contender that
  claims its row leaves the matching together with that row, so every other pair stays as it was, and
  a worker one event behind still picks the same row: collisions come only from views that disagree
  about which contenders are idle. Penalised rows still count in the positions (others do not know of
  our penalties); a worker whose own row is penalised looks further.
* A worker whose session ended waits (at most :data:`ECHO_WAIT` from when its slot fell free) for the
  watch to show its claim given back: until then the others do not count it idle.
* The crowd: a worker the others do not count (:attr:`ClaimSpreader.known_to_peers`: its own claim not
  seen on the watch in the last :data:`PEER_MEMORY` seconds, or it holds other claims), or whose own
  row is set aside, takes a *spare* row (beyond the matched ones) once it has seen any other acceptor.
  Such workers cannot see each other, so each claims at its own moment: for each spare row, a hash of
  (worker, row) places it in the crowd's window (:func:`crowd_window`: :data:`CROWD_STEP` per acceptor
  seen, shared out over the spare rows), counted from when the row became claimable, and it takes the
  row whose moment comes first. A crowd of U workers so claims a row about every window/U seconds
  instead of all at once; with as many spare rows as workers they spread over the rows at once.
* After a 409 (:meth:`ClaimSpreader.lost_race`) the worker knows the crowd is bigger than it looks: the
  window doubles per 409 in a row and counts from the 409. Its own claim on the watch ends the streak
  (so does :data:`STREAK_MEMORY` without a 409).
* The head (the oldest claimable row): a worker without a row of its own takes it once the head's
  contender has had ``min(rank, SPREAD_MAX_RANK) * SPREAD_STEP`` seconds since the row became the head
  (rank: its place in the order; :data:`SPREAD_MAX_RANK` for a worker the others do not count); from
  the last place on, at its own moment in the crowd's window on top.

Fairness: rows go in age order to the matched contenders, at once; only the crowd takes spare rows out
of order, and only rows nobody is matched to. A head whose contender has gone away is claimed by the
next contenders within ``rank * SPREAD_STEP`` seconds, by the crowd within ``SPREAD_MAX_RANK *
SPREAD_STEP`` seconds (2 s) plus the first of its moments. With a single worker (no peer seen, no 409)
the order is exactly oldest-first. A fleet that starts together knows no peer until each has claimed
once; a worker that has seen nobody makes its first claim at a random moment within
:data:`FIRST_CLAIM_JITTER` (the oldest row still), so that most of such a fleet sees someone claim, and
joins the crowd, first. A deployment that knows how many workers start together says so
(``fleet_size``, ``--fleet-size``): until its first claim shows, each then is one of the crowd from the
start, its window sized for at least that many workers.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Optional, Protocol

from devin_outposts.api.models import Phase, QueueEntry

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
#: A worker without a matched row chooses among at most this many spare rows (beyond the matched ones).
SPARE_MAX = 1024
#: The crowd's window: the workers without a matched row spread their claims of the spare rows over
#: ``CROWD_STEP`` seconds per acceptor seen on the outpost (the crowd's size as far as this worker can
#: tell), shared out over the spare rows, doubled after each 409 in a row (the crowd is bigger than it
#: looks), at most CROWD_WINDOW_CAP. Each worker's moment for each row is a hash of the two, so a
#: crowd of U workers claims a row about every window/U seconds, not all at once.
CROWD_STEP = 0.15
CROWD_WINDOW_CAP = 120.0
#: The crowd's size is estimated from whom the claims come from (:meth:`ClaimSpreader.crowd`): the
#: workers nobody counts cannot be seen, but the share of claims made by acceptors never seen before
#: says how many there are beyond those seen. The counts are halved once they reach this many claims,
#: so that the estimate follows a fleet that grows or shrinks.
CLAIM_SAMPLE = 64
#: The estimate starts as if this many claims had come from acceptors never seen before.
NEWCOMER_PRIOR = 4.0
#: At most this many acceptors are assumed (the window's cap bounds the wait anyway).
CROWD_MAX = 4096
#: Each STREAK_MEMORY seconds without a 409 count one 409 of the streak off (a claim of ours on the watch
#: ends it at once): a worker of a crowd that sees rows claimed by others, and so rarely tries, keeps its
#: window.
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


def crowd_window(acceptors: int, streak: int, spare: int) -> float:
    """Seconds over which the workers without a matched row spread their claims of ``spare`` rows."""
    window = CROWD_STEP * max(1, acceptors) * 2.0 ** min(max(0, streak), 16) / max(1, spare)
    return min(window, CROWD_WINDOW_CAP)


def hash_fraction(acceptor_id: str, session_id: str) -> float:
    """Where in the crowd's window this acceptor claims this row: in [0, 1), the same on every run."""
    return rendezvous_score(acceptor_id, session_id) / 2.0**64


@dataclass(frozen=True)
class ClaimChoice:
    """The row to claim next, how many seconds to wait before claiming it (0: now), and which rule chose
    it (``oldest``, ``matched``, ``spare`` or ``head``: for the debug log and the fleet model)."""

    entry: QueueEntry
    wait: float
    why: str = "oldest"


class SpreadView(Protocol):
    """What the spreader needs to know of the rows (the queue feed's picture)."""

    def next_candidate(self, exclude: Collection[str] = ()) -> Optional[QueueEntry]:
        """The oldest claimable row that is neither excluded nor penalised."""

    def oldest(self, count: int, exclude: Collection[str], *, skip_blocked: bool = True) -> list[QueueEntry]:
        """Up to ``count`` claimable rows, oldest first (with ``skip_blocked=False`` also the excluded
        and penalised ones: every worker counts them in the matching)."""

    def blocked(self, session_id: str, exclude: Collection[str], mono: float) -> bool:
        """Whether this worker sets ``session_id`` aside (excluded, or penalised until later)."""

    def busy_acceptors(self) -> set[str]:
        """The other acceptors holding a live claim on the outpost now."""

    def claimable_since(self, session_id: str, mono: float) -> float:
        """When (monotonic) ``session_id`` became claimable in this view."""


class ClaimSpreader:
    """One worker's side of the spreading on one outpost: its peers, its 409s, its pending choice."""

    def __init__(self, acceptor_id: str, outpost_id: str, fleet_size: Optional[int] = None) -> None:
        self.acceptor_id = acceptor_id
        self.outpost_id = outpost_id
        #: How many workers the deployment says start together on this outpost (``--fleet-size``; None:
        #: unknown). Until this worker's first claim shows on the watch, it is one of that many: it does
        #: not take the oldest row as if alone, and its crowd is at least that big (:meth:`crowd`).
        self.fleet_size = fleet_size if fleet_size and fleet_size > 1 else None
        #: Other acceptors seen holding a claim on this outpost -> when (monotonic), most recent last.
        self._peers: dict[str, float] = {}
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
        #: Claims by other acceptors seen on the watch, and how many of them came from one never seen
        #: before (halved at CLAIM_SAMPLE): the crowd's size beyond the acceptors seen.
        self._claims_seen = 0.0
        self._claims_by_newcomers = 0.0
        #: session_id -> hash_fraction(us, it), for the spare rows we have weighed (cleared when large).
        self._fractions: dict[str, float] = {}
        #: When (monotonic) a worker that saw nobody else may make its first claim (FIRST_CLAIM_JITTER);
        #: None until drawn, 0.0 once it has claimed, lost a race or met a peer before drawing.
        self._first_claim_at: Optional[float] = None

    # --- what the watch shows ---------------------------------------------------------------------

    def observe(self, previous: Optional[QueueEntry], entry: QueueEntry) -> bool:
        """Learn from a row's new copy; True when the others now count us idle (look again)."""
        sid = entry.session_id
        holder = entry.status.acceptor_id
        claimed = entry.status.phase == Phase.CLAIMED
        if claimed and holder and holder != self.acceptor_id:
            fresh = (
                previous is None
                or previous.status.phase != Phase.CLAIMED
                or previous.status.acceptor_id != holder
            )
            if fresh:  # a claim, not a renewal: who made it?
                self._count_claim(newcomer=holder not in self._peers)
        if previous is not None and previous.status.phase == Phase.CLAIMED:
            # A peer that gives a row back (its session ended, or a release) is idle now: seen as such
            # at once, not only at its next claim, so that workers learn each other after one session.
            was = previous.status.acceptor_id
            if was and was != self.acceptor_id and was != holder:
                self._see_peer(was)
        if claimed and holder == self.acceptor_id:
            self._seen_self = time.monotonic()  # the others see it too: they count us as a contender
            self._streak = 0
            self._first_claim_at = 0.0
        if claimed and holder and holder != self.acceptor_id:
            self._see_peer(holder)
        if claimed and holder == self.acceptor_id and not entry.is_finished:
            self._ours_on_watch.add(sid)
            return False
        return self.forget(sid)

    def forget(self, session_id: str) -> bool:
        """The row is no longer our claim on the watch (or gone); True when it was (look again)."""
        if session_id not in self._ours_on_watch:
            return False
        self._ours_on_watch.discard(session_id)
        return True  # the others now count us idle too: our matched row is ours to claim

    def _count_claim(self, *, newcomer: bool) -> None:
        self._claims_seen += 1
        self._claims_by_newcomers += 1 if newcomer else 0
        if self._claims_seen >= CLAIM_SAMPLE:
            self._claims_seen /= 2
            self._claims_by_newcomers /= 2

    def _see_peer(self, acceptor_id: str) -> None:
        self._order(acceptor_id)
        self._peers.pop(acceptor_id, None)  # re-insert: the dict stays ordered by when we last saw them
        self._peers[acceptor_id] = time.monotonic()

    def _order(self, acceptor_id: str) -> int:
        key = self._order_keys.get(acceptor_id)
        if key is None:
            key = self._order_keys[acceptor_id] = contender_order(acceptor_id, self.outpost_id)
        return key

    def idle_peers(self, busy: Collection[str]) -> list[str]:
        """The peers seen on the outpost in the last :data:`PEER_MEMORY` seconds not in ``busy``."""
        mono = time.monotonic()
        for peer, seen in list(self._peers.items()):  # oldest first: stop at the first one to keep
            if mono - seen <= PEER_MEMORY:
                break
            del self._peers[peer]
        return [peer for peer in self._peers if peer not in busy]

    def contenders(self, busy: Collection[str]) -> list[str]:
        """The acceptors that may claim a row now: this one and the peers that are probably idle, in the
        order every worker ranks them (:func:`contender_order`)."""
        idle = sorted(self.idle_peers(busy), key=self._order)
        return [self.acceptor_id, *idle]

    @property
    def known_to_peers(self) -> bool:
        """Whether the other workers have seen this one claim lately (they count it as a contender)."""
        return self._seen_self is not None and time.monotonic() - self._seen_self <= PEER_MEMORY

    def lost_race(self) -> None:
        """Our claim got a 409: remember that we are in a crowd."""
        self._streak += 1
        self._streak_at = time.monotonic()
        self._first_claim_at = 0.0

    def streak(self) -> int:
        """409s in a row lately (reset by a claim of ours on the watch; one forgotten per STREAK_MEMORY)."""
        if self._streak:
            quiet = int((time.monotonic() - self._streak_at) // STREAK_MEMORY)
            if quiet > 0:
                self._streak = max(0, self._streak - quiet)
                self._streak_at += quiet * STREAK_MEMORY
        return self._streak

    # --- the choice -------------------------------------------------------------------------------

    def choose(
        self,
        view: SpreadView,
        exclude: Collection[str] = (),
        *,
        looking_since: Optional[float] = None,
        conflicts: int = 0,
    ) -> Optional[ClaimChoice]:
        """The row this worker should claim next and when (None when nothing is claimable).

        While no idle peer is known and no claim of ours lost a race (a lone worker) it is the oldest
        row: strictly oldest first. Else the module docstring's matching decides. ``conflicts`` is how
        many 409s in a row the caller has just had (:meth:`lost_race` counts them too);
        ``looking_since`` is when the caller's slot fell free (``time.monotonic()``; None: now), from
        which the wait for our release's echo counts.
        """
        streak = max(conflicts, self.streak())
        idle = self.idle_peers(view.busy_acceptors())
        alone = not self._peers and not self._starting_in_a_fleet()
        if not idle and not streak and (alone or self.known_to_peers):
            # Alone (nobody seen), or known to peers that are all busy: strictly the oldest row. A worker
            # that sees others claim but has never been seen itself is one of a crowd (a fleet that
            # started together): it takes a spare row below, at its moment in the crowd's window.
            first = view.next_candidate(exclude)
            return ClaimChoice(first, self._first_claim_wait()) if first is not None else None
        mono = time.monotonic()
        # The others count us among the idle contenders once the watch shows none of our claims; a
        # claim we still hold (a worker with several slots) keeps us busy in their eyes.
        known = self.known_to_peers and not (self._ours_on_watch & set(exclude))
        insiders = len(idle) + (1 if known else 0)
        rows = view.oldest(insiders + SPARE_MAX, exclude, skip_blocked=False)
        if not rows:
            return None
        usable = [not view.blocked(row.session_id, exclude, mono) for row in rows]
        rank = SPREAD_MAX_RANK
        if known:
            mine = self._order(self.acceptor_id)
            keys = self._order_keys  # every peer's key was computed when it was first seen
            rank = sum(1 for peer in idle if keys[peer] < mine)
            if rank < len(rows) and usable[rank]:
                # The row matched to us, nobody else's; but until the watch shows that our last claim
                # was given back, the others do not count us, and one of them would pick the same row.
                looking = mono if looking_since is None else min(looking_since, mono)
                echo = looking + ECHO_WAIT - mono if self._ours_on_watch - set(exclude) else 0.0
                return ClaimChoice(rows[rank], max(0.0, echo), "matched")
        # While idle contenders are in view, they take the rows (at once, by the matching), and a row
        # looks spare mostly because our view lags theirs; the crowd then leaves each spare row to them
        # for the head's steps and spreads over the widest window: the workers that have not
        # claimed lately are silent, so however many of them there are, the claims cannot tell
        # (in the fleet model, 990 silent workers behind 10 busy ones). Without any idle contender in
        # view the rows would wait for the crowd: its window is then sized by the estimate.
        spare = [row for row, ok in zip(rows[insiders:], usable[insiders:]) if ok]
        if spare:
            crowd = CROWD_MAX if idle else self.crowd()
            defer = SPREAD_MAX_RANK * SPREAD_STEP if insiders else 0.0
            return self._spare_choice(view, spare, crowd, streak, mono, defer)
        # The head left over: its matched contender may be gone (a dead worker's expired claim), so the
        # crowd's window is the estimate's, not the widest: a takeover must not wait minutes.
        return self._head_choice(view, rows[0], usable[0], rank, self.crowd(), streak, mono)

    def _first_claim_wait(self) -> float:
        """Seconds before a worker that has seen nobody else makes its first claim (0 afterwards)."""
        mono = time.monotonic()
        if self._first_claim_at is None:
            if self._peers or self._seen_self is not None:
                self._first_claim_at = 0.0  # not a fleet's first moment: it knows who is there
            else:
                self._first_claim_at = mono + random.uniform(0.0, FIRST_CLAIM_JITTER)  # noqa: S311
        return max(0.0, self._first_claim_at - mono)

    def _fraction(self, session_id: str) -> float:
        fraction = self._fractions.get(session_id)
        if fraction is None:
            if len(self._fractions) > 4 * SPARE_MAX:
                self._fractions.clear()  # rows long gone; the ones still spare are hashed again
            fraction = self._fractions[session_id] = hash_fraction(self.acceptor_id, session_id)
        return fraction

    def crowd(self) -> int:
        """How many workers are looking at the outpost, as far as this one can tell: the acceptors seen
        lately (this one included), divided by the share of claims that came from acceptors seen already.

        If the claims come from the workers alike, a claim comes from one never seen before with the
        share of the crowd not seen yet. The estimate starts as if :data:`NEWCOMER_PRIOR` claims had
        come from newcomers already (against a quarter of one from a known worker): the first claims of
        a fleet that has just started would otherwise be weighed with a crowd of a few, and hundreds
        of its workers would go for the same rows. After n claims, all by newcomers, the estimate is
        about 4 (n + 1)(n + 4.25); a small fleet, whose claims soon come from known workers, falls back
        near its size (the prior weighs less as claims are seen, at most 64 of them). With a
        ``fleet_size`` from the deployment, the estimate is at least that until this worker's first
        claim shows on the watch (a fleet that has just started: nobody has seen anybody yet).
        """
        known = len(self._peers) + 1
        prior = NEWCOMER_PRIOR
        unseen_share = (self._claims_by_newcomers + prior) / (self._claims_seen + prior + 0.25)
        estimate = max(known, round(known / max(1.0 - unseen_share, known / CROWD_MAX)))
        if self._starting_in_a_fleet():
            estimate = max(estimate, self.fleet_size or 0)  # the deployment's word, until we have claimed
        return min(CROWD_MAX, estimate)

    def _starting_in_a_fleet(self) -> bool:
        """A deployment said several workers start together, and this one has not claimed yet."""
        return self.fleet_size is not None and self._seen_self is None

    def _spare_choice(
        self, view: SpreadView, spare: list[QueueEntry], crowd: int, streak: int, mono: float, defer: float
    ) -> ClaimChoice:
        """A row beyond the matched ones for a worker the others do not count (or whose own row is gone):
        the spare row whose moment comes first, each row's moment being its place in the crowd's window
        (a hash of this worker and the row) from when the row became claimable, or from our last 409."""
        window = crowd_window(crowd, streak, len(spare))
        floor = self._streak_at if streak else 0.0
        best: Optional[tuple[float, QueueEntry]] = None
        for row in spare:
            sid = row.session_id
            at = max(view.claimable_since(sid, mono) + defer, floor) + self._fraction(sid) * window
            if best is None or at < best[0]:
                best = (at, row)
        assert best is not None
        return ClaimChoice(best[1], max(0.0, best[0] - mono), "spare")

    def _head_choice(
        self,
        view: SpreadView,
        head: QueueEntry,
        usable: bool,
        rank: int,
        crowd: int,
        streak: int,
        mono: float,
    ) -> Optional[ClaimChoice]:
        """No row of our own: the oldest row, once its matched contender has had ``rank`` steps; from
        the last step on, each worker at its own moment in the crowd's window (the crowd would otherwise
        claim the head together, all at once, when its contender's claim is slow to show)."""
        if not usable:
            return None
        sid = head.session_id
        if self._head[0] != sid:
            self._head = (sid, mono)
        start = max(view.claimable_since(sid, mono), self._head[1])
        at = start + min(max(rank, 1), SPREAD_MAX_RANK) * SPREAD_STEP
        if rank >= SPREAD_MAX_RANK:
            at += self._fraction(sid) * crowd_window(crowd, streak, 1)
        return ClaimChoice(head, max(0.0, at - mono), "head")
