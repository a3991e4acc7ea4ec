"""The claim loop: restart recovery, then claiming the session to take whenever a slot is free.

:class:`ClaimLoop` fills a :class:`~devin_outposts.core.pool.SessionPool` from one outpost's queue: the
worker's queue mode (``worker start`` without ``--session``, docs/worker.md, "Modes") and the
orchestrator's loop (docs/orchestrator.md, "The loop"). What runs a claimed session, and the few rules
where the two programs differ, come from a :class:`SessionHost` the loop is given (composition: the loop
never reaches into its owner, and the host never into the loop):

1. resolve the outpost (an outage is waited out) and check its platform against the host's machines
   (exit 6 on a mismatch, before any claim); :meth:`SessionHost.announce` says so;
2. restart recovery: list ``phase=claimed&acceptor_id=<mine>`` on the outpost and take each session back
   by re-claiming it (a renewal, for a fresh connect token), releasing what no slot can hold. The host
   wraps each attempt (:meth:`SessionHost.recovery`): the orchestrator finds the machines a previous run
   left, and keeps a session whose machine is still there even over the cap;
3. start the :class:`~devin_outposts.core.feed.QueueFeed` and, whenever it or a finished session wakes
   the pool, claim the row the feed offers (:meth:`~devin_outposts.core.feed.QueueFeed.next_claim`:
   oldest first, spread over the coordinators of the outpost). Each attempt asks the feed afresh, so the
   row is judged on its current copy and never from a list built before an earlier attempt's round trip.
   A 409 counts as a conflict, sets the row aside for a while and waits a short random pause before the
   next attempt; a 404 forgets the row (one log line); other API errors back off with jitter (1 s
   doubling to ``--backoff-max-secs``); 401/403 end the run (exit 3). An error no reply explains is the
   host's to judge (:meth:`SessionHost.claim_failed`): the worker ends on it, the orchestrator logs it
   and tries again. ``--once`` stops claiming after its first claim. The host may hold claims back
   (:meth:`SessionHost.claim_pause`: the orchestrator's driver keeps failing to start workers); the
   worker never does.

A drain (the first signal) cancels what the loop is waiting for from the API: the outpost, the list of
held sessions, a claim (:meth:`~devin_outposts.core.pool.SessionPool.unless_draining`; a claim cancelled so
may have been made, and is given back at once), so the drain starts however slowly the API answers.

It uses the pool's public methods only, the fleet client and the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Callable, Optional, Protocol

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.api.models import Outpost, Phase, QueueEntry
from devin_outposts.core.feed import QueueFeed, oldest_first
from devin_outposts.core.metrics import Health, HealthReport, Metrics
from devin_outposts.core.outposts import check_platform, entry_platform_ok, resolve_outpost
from devin_outposts.core.pool import SessionPool
from devin_outposts.core.retrying import Backoff, Stopped, retry_transient
from devin_outposts.core.serving import ClaimedSession
from devin_outposts.core.sessions import FAILED, LOST, SessionResult, release_claim

log = logging.getLogger(__name__)

#: The pause after the n-th conflict in a row is uniform in [0, CONFLICT_PAUSE * 2**(n-1)], capped at
#: CONFLICT_PAUSE_CAP: long enough for the winner's claim to reach the watch, short next to a claim.
CONFLICT_PAUSE = 0.05
CONFLICT_PAUSE_CAP = 0.4
#: Seconds a session that failed on this worker is not offered to it again (times its failure count).
FAILED_SESSION_COOLDOWN = 60.0

#: Which sessions held from before a restart are kept even when no slot is free (by session id).
KeepOverCap = Callable[[str], bool]


def conflict_pause(conflicts: int, rng: Callable[[], float] = random.random) -> float:
    return rng() * min(CONFLICT_PAUSE * 2.0 ** min(conflicts - 1, 16), CONFLICT_PAUSE_CAP)


class ClaimOutcome(str, enum.Enum):
    """What one turn of :meth:`ClaimLoop.claim_next` came to."""

    __str__ = str.__str__  # logs and messages show the value (Python 3.11 would show Outcome.SERVED)

    CLAIMED = "claimed"  # a session was claimed and started
    IDLE = "idle"  # nothing to claim now
    DEFER = "defer"  # a row is there, but another worker should have the first go at it
    ERROR = "error"  # the API failed: back off
    FATAL = "fatal"  # the token was refused: stop


class ClaimSettings(Protocol):
    """What the claim loop reads of its program's config (the worker's, or the orchestrator's)."""

    @property
    def outpost(self) -> Optional[str]:
        """The outpost to serve, by name or id."""

    @property
    def watch(self) -> bool:
        """Watch the queue (else poll it)."""

    @property
    def poll_interval(self) -> float:
        """Seconds between polls."""

    @property
    def backoff_max(self) -> float:
        """Longest retry backoff."""

    @property
    def claim_spread(self) -> bool:
        """Spread claims over the outpost's coordinators."""

    @property
    def fleet_size(self) -> Optional[int]:
        """How many workers start together on the outpost, as the deployment says (None: unknown)."""

    @property
    def once(self) -> bool:
        """Stop claiming after the first claim."""


class SessionHost(Protocol):
    """What runs the sessions a :class:`ClaimLoop` claims, and the rules where the worker (a local
    ``devin-remote`` per session: :class:`~devin_outposts.worker.session.WorkerHost`) and the orchestrator
    (a machine per session: :class:`~devin_outposts.orchestrator.queue.MachineHost`) differ."""

    @property
    def machine_platform(self) -> Optional[str]:
        """The OS the sessions run on, as an outpost platform name; None when it is not known (the
        ansible driver): then no outpost or session is refused for its platform."""

    def announce(self, outpost: Outpost) -> None:
        """The outpost is resolved and its platform checked: the start-up line and the metrics' labels."""

    def recovery(self, outpost_id: str) -> AbstractAsyncContextManager[KeepOverCap]:
        """Wraps one attempt at restart recovery (an attempt that fails with a
        :class:`~devin_outposts.api.errors.FleetError` is tried again after a backoff): what the host
        prepares for it, and which held sessions to keep even when no slot is free."""

    def session_for(self, claim: QueueEntry, slot: int) -> ClaimedSession:
        """What serves ``claim`` in ``slot`` (the pool runs it)."""

    def finished(self, result: SessionResult) -> None:
        """A session ended (the pool has counted it)."""

    def claim_failed(self, error: Exception) -> bool:
        """An error no fleet reply explains ended a claim turn (a bug, an answer the client could not
        read). True: it was reported, and the turn counts as failed (retried after the backoff); False:
        the claim loop ends on it."""

    def loop_failed(self) -> None:
        """The claim loop is ending on an error or a cancellation, before the pool drains."""

    def claim_pause(self) -> float:
        """Seconds to hold new claims back (0: claim when a slot is free). Asked before each claim; a
        finished session wakes the loop to ask again."""

    def pause_report(self) -> Optional[Mapping[str, object]]:
        """Why claims are held back, for ``/healthz`` (:attr:`Health.BACKING_OFF`); None when they are not."""


@contextlib.asynccontextmanager
async def keep_none(outpost_id: str) -> AsyncIterator[KeepOverCap]:
    """A :meth:`SessionHost.recovery` that prepares nothing and keeps no session over the cap."""
    yield lambda session_id: False


class ClaimLoop:
    def __init__(
        self,
        config: ClaimSettings,
        client: FleetClient,
        pool: SessionPool,
        metrics: Metrics,
        acceptor_id: str,
        host: SessionHost,
    ) -> None:
        self.config = config
        self.client = client
        self.pool = pool
        self.metrics = metrics
        self.acceptor_id = acceptor_id
        self.host = host
        #: The OS sessions run on, or None: nothing is refused for its platform.
        self.machine_platform = host.machine_platform
        self.feed: Optional[QueueFeed] = None
        self.feed_task: Optional[asyncio.Task[None]] = None
        #: Following the queue (for /healthz).
        self.ready = False
        #: After a DEFER outcome: seconds until the deferred row may be claimed.
        self.defer: Optional[float] = None
        #: When (monotonic) a free slot started looking for a row; None right after a claim. Spreading
        #: counts deferrals from here, so workers that fall free in a backlog take different rows.
        self.looking_since: Optional[float] = None
        self._failures: dict[str, int] = {}
        #: Why the last claim attempt that ended in ERROR failed (logged with the backoff).
        self.claim_error: Optional[FleetError] = None

    @property
    def feed_stopped(self) -> bool:
        return self.feed_task is not None and self.feed_task.done() and not self.pool.draining

    # --- the run -------------------------------------------------------------------------------------

    async def run(self) -> bool:
        """Serve the outpost until drained. Returns False when stopped before anything was claimed."""
        try:
            outpost = await retry_transient(
                lambda: self.pool.unless_draining(resolve_outpost(self.client, self.config.outpost)),
                backoff=Backoff(cap=self.config.backoff_max),
                pause=self.pool.pause,
            )
        except Stopped:
            return False
        if self.machine_platform is not None:
            check_platform(outpost, here=self.machine_platform)
        self.host.announce(outpost)
        recovery = Backoff(cap=self.config.backoff_max)
        while not self.pool.draining:
            try:
                await self.recover(outpost.outpost_id)
                break
            except FleetAuthError:
                raise
            except FleetError as exc:
                self.metrics.inc("api_errors")
                await self.sleep(recovery.next_delay(), f"{exc}")
        self.feed = QueueFeed(
            self.client,
            outpost.outpost_id,
            self.acceptor_id,
            watch=self.config.watch,
            poll_interval=self.config.poll_interval,
            backoff_max=self.config.backoff_max,
            metrics=self.metrics,
            on_update=self.pool.route,
            on_change=self.pool.wake,
            spread=self.config.claim_spread,
            fleet_size=self.config.fleet_size,
        )
        self.pool.on_finished = self._finished
        if not self.pool.draining:
            self._start_feed()
        self.ready = True
        try:
            await self.claim_loop()
        except BaseException:
            self.host.loop_failed()
            raise
        finally:
            self.stop_feed()
            await self._await_feed()
            await self.pool.drain()
        return True

    def _start_feed(self) -> None:
        assert self.feed is not None
        self.feed_task = asyncio.ensure_future(self.feed.run())
        self.feed_task.add_done_callback(lambda t: self.pool.wake())

    def stop_feed(self) -> None:
        """Close the watch (a drain has started): no more claims."""
        if self.feed_task is not None:
            self.feed_task.cancel()

    async def _await_feed(self) -> None:
        if self.feed_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.feed_task

    def _finished(self, result: SessionResult) -> None:
        if self.feed is None:
            return
        sid = result.session_id
        given_back = result.outcome in (FAILED, LOST)
        current = self.feed.entries.get(sid)
        ours = current is not None and current.status.acceptor_id == self.acceptor_id
        # A copy that still shows our claim (or any copy of a session that ended here) is stale: wait for
        # the server's next word on it. A session given back whose release the watch has shown already
        # keeps that copy: no further word would come, and it must be offered again after its cool-down,
        # not at the next full list of the queue.
        if not given_back or ours:
            self.feed.discard(sid)
        if given_back:
            count = self._failures[sid] = self._failures.get(sid, 0) + 1
            self.feed.penalize(sid, FAILED_SESSION_COOLDOWN * count)
        self.host.finished(result)

    async def sleep(self, seconds: float, why: str) -> None:
        log.warning("%s; retrying in %.1fs", why, seconds)
        await self.pool.pause(seconds)

    # --- restart recovery ------------------------------------------------------------------------------

    async def recover(self, outpost_id: str) -> None:
        """Take back the sessions this acceptor still holds (a program restarted, maybe after a crash).

        A held session is taken back into a free slot, or beyond the slots when the host keeps it over
        the cap (the orchestrator: its machine is still there, and a restart with a lower cap must not
        evict a live session; claiming then waits until fewer sessions run than the slots). Else it is
        released, as is a finished one. Safe to run again after a failure half-way: sessions already
        taken back are being served and are skipped, never released.
        """
        async with self.host.recovery(outpost_id) as keep_over_cap:
            await self._take_back(outpost_id, keep_over_cap)

    async def _take_back(self, outpost_id: str, keep_over_cap: KeepOverCap) -> None:
        client, me, pool = self.client, self.acceptor_id, self.pool
        listing = client.list_all_devins(outpost=outpost_id, phase=Phase.CLAIMED, acceptor_id=me)
        try:
            held = (await pool.unless_draining(listing))[0]
        except Stopped:  # a signal: what was held stays held, for the next start (or until it expires)
            log.info("stopped before the sessions held from before the restart were listed")
            return
        for entry in oldest_first(e for e in held if e.status.acceptor_id in (None, me)):
            sid = entry.session_id
            if sid in pool.held:
                continue
            slot = pool.free_slot()
            if slot is None and keep_over_cap(sid):
                slot = pool.spare_slot()
            if entry.is_finished or slot is None or pool.draining:
                why = f"already {entry.status.session_status}" if entry.is_finished else "no free slot"
                log.info(
                    "releasing session %s held from before the restart (%s)",
                    sid,
                    why,
                    extra={"session_id": sid},
                )
                await release_claim(client, sid, me, {"session_id": sid})
                continue
            try:
                with pool.reserving():  # its place under a cap shared with other pools
                    claim = await pool.unless_draining(client.claim(sid, me))  # a renewal: fresh token
            except Stopped:  # a signal came during the renewal: released, as the others are now
                await release_claim(client, sid, me, {"session_id": sid})
                continue
            except (FleetConflict, FleetNotFound) as exc:
                log.info("could not take back session %s: %s", sid, exc, extra={"session_id": sid})
                continue
            self.metrics.inc("sessions_claimed")
            log.info("took back session %s after a restart", sid, extra={"session_id": sid})
            self._start(claim, slot)

    def _start(self, claim: QueueEntry, slot: int) -> None:
        self.pool.start(self.host.session_for(claim, slot))
        log.info(
            "claimed session %s (slot %d)",
            claim.session_id,
            slot,
            extra={"session_id": claim.session_id, "slot": slot},
        )

    # --- claiming ----------------------------------------------------------------------------------------

    async def claim_loop(self) -> None:
        assert self.feed is not None
        pool = self.pool
        backoff = Backoff(cap=self.config.backoff_max)
        claimed_once = False
        while not pool.is_draining():
            pool.reap()
            if pool.fatal is not None:
                return
            if self.feed_task is not None and self.feed_task.done():
                error = None if self.feed_task.cancelled() else self.feed_task.exception()
                if isinstance(error, FleetAuthError):
                    pool.fail(error)
                    return
                log.error("the queue feed stopped (%r); restarting it", error)
                await self.sleep(backoff.next_delay(), "queue feed stopped")
                self._start_feed()
                continue
            outcome: Optional[ClaimOutcome] = None
            pause = 0.0
            if self.config.once and claimed_once:
                if not pool.running:
                    return
            elif pool.free_slot() is not None and (pause := self.host.claim_pause()) <= 0:
                outcome = await self.claim_next()
                if outcome is ClaimOutcome.CLAIMED:
                    claimed_once = True
                    backoff.reset()
                    continue
                if outcome is ClaimOutcome.ERROR:
                    # One line per failed claim: the error and the wait (claim_next does not log it).
                    await self.sleep(backoff.next_delay(), str(self.claim_error or "claiming failed"))
                    continue
                if outcome is ClaimOutcome.FATAL:
                    return
            # Asked after the attempt: a 409 in it penalised a row, and the end of that penalty must wake
            # the loop even if the watch never says more about the row (an API that answered 409 wrongly).
            wakeup = self.feed.next_wakeup()
            if outcome is ClaimOutcome.DEFER and self.defer is not None:
                wakeup = self.defer if wakeup is None else min(wakeup, self.defer)
            if pause > 0:
                wakeup = pause if wakeup is None else min(wakeup, pause)
            if pool.is_draining():  # a signal may have come while we were claiming
                break
            await pool.wait(wakeup)

    async def give_back(self, session_id: str, why: str) -> None:
        """Release a claim we will not serve. Never raises: a failed release leaves a claim that expires."""
        log.info("releasing session %s at once (%s)", session_id, why, extra={"session_id": session_id})
        assert self.feed is not None
        self.feed.discard(session_id)
        await release_claim(self.client, session_id, self.acceptor_id, {"session_id": session_id})

    async def claim_next(self) -> ClaimOutcome:
        """Claim the row this acceptor should take now. On DEFER, :attr:`defer` says when to look again.
        An error no fleet reply explains is the host's to judge (:meth:`SessionHost.claim_failed`); a
        claim whose answer was lost stays ours on the server until its deadline, then returns to the
        queue."""
        try:
            return await self._claim_turn()
        except Exception as exc:
            if not self.host.claim_failed(exc):
                raise
            self.metrics.inc("api_errors")
            return ClaimOutcome.ERROR

    async def _claim_turn(self) -> ClaimOutcome:
        assert self.feed is not None
        pool, feed = self.pool, self.feed
        self.defer = None
        conflicts = 0
        while not pool.is_draining():
            slot = pool.free_slot()
            if slot is None:
                return ClaimOutcome.IDLE
            if self.looking_since is None:
                self.looking_since = time.monotonic()
            choice = feed.next_claim(exclude=pool.held, looking_since=self.looking_since, conflicts=conflicts)
            if choice is None:
                return ClaimOutcome.IDLE
            if choice.wait > 0:
                self.defer = choice.wait
                return ClaimOutcome.DEFER
            entry = choice.entry
            sid = entry.session_id
            if self.machine_platform is not None and not entry_platform_ok(entry, self.machine_platform):
                log.warning(
                    "not claiming session %s: it wants platform %s, its machine would run %s",
                    sid,
                    entry.spec.platform,
                    self.machine_platform,
                    extra={"session_id": sid},
                )
                feed.penalize(sid, 3600)
                continue
            try:
                with pool.reserving():  # its place under a cap shared with other pools
                    claim = await pool.unless_draining(self.client.claim(sid, self.acceptor_id))
            except Stopped:  # a signal came while the claim was in flight: it may have been made
                await self.give_back(sid, "draining")
                return ClaimOutcome.IDLE
            except FleetConflict:
                self.metrics.inc("claim_conflicts")
                log.debug(
                    "session %s was claimed by another worker (chosen as %s)",
                    sid,
                    choice.why,
                    extra={"session_id": sid},
                )
                feed.lost_race(sid, max(2 * self.config.poll_interval, 5.0))  # set aside; we are in a crowd
                conflicts += 1
                await asyncio.sleep(conflict_pause(conflicts))
                continue
            except FleetNotFound as exc:
                log.info("giving up on session %s: %s", sid, exc, extra={"session_id": sid})
                feed.discard(sid)
                continue
            except FleetAuthError as exc:
                pool.fail(exc)
                return ClaimOutcome.FATAL
            except FleetError as exc:  # an outage, or an answer that breaks the contract: back off
                self.metrics.inc("api_errors")
                self.claim_error = exc
                return ClaimOutcome.ERROR
            self.metrics.inc("sessions_claimed")
            if pool.is_draining() or claim.is_finished:
                # A signal arrived while the claim was in flight, or the session ended after the
                # feed's last word on it (watch lag): give it straight back.
                why = "draining" if pool.is_draining() else f"session already {claim.status.session_status}"
                await self.give_back(sid, why)
                if pool.is_draining():
                    return ClaimOutcome.IDLE
                continue
            self._start(claim, slot)
            self.looking_since = None  # the next free slot starts looking afresh
            return ClaimOutcome.CLAIMED
        return ClaimOutcome.IDLE


def health(pool: SessionPool, loop: Optional[ClaimLoop], *, ready: bool) -> Health:
    """What ``/healthz`` says of a program that runs ``pool`` (and ``loop``, in queue mode): ``ready`` is
    whether it follows the queue (or serves its one session) yet."""
    if pool.fatal is not None:
        return Health.UNAUTHORIZED
    if loop is not None and loop.feed_stopped:
        return Health.FEED_STOPPED
    if pool.draining:
        return Health.DRAINING
    if loop is not None and loop.host.pause_report() is not None:
        return Health.BACKING_OFF
    return Health.OK if ready else Health.STARTING


def health_report(pool: SessionPool, loop: Optional[ClaimLoop], *, ready: bool) -> HealthReport:
    """:func:`health`, with why claims are held back while the host backs off."""
    state = health(pool, loop, ready=ready)
    if state is Health.BACKING_OFF and loop is not None:
        return HealthReport(state, loop.host.pause_report() or {})
    return HealthReport(state)
