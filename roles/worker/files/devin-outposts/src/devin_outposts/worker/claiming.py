"""Queue mode: restart recovery, then claiming the oldest claimable session whenever a slot is free.

:class:`QueueMode` drives a :class:`~devin_outposts.worker.runner.Worker` (which owns the slots, the
sessions, the signals and the metrics) through one run of ``worker start`` without ``--session``:

1. resolve the outpost and check its platform (exit 6 on a mismatch, before any claim);
2. restart recovery: list ``phase=claimed&acceptor_id=<mine>`` on the outpost and take each session back
   by re-claiming it (a renewal, for a fresh connect token), releasing what no slot can hold;
3. start the :class:`~devin_outposts.worker.queue.QueueFeed` and, whenever it or a finished session wakes
   the loop, claim the oldest claimable row. Each attempt asks the feed afresh, so the row is judged on
   its current copy (phase, session_status, acceptor, deadline) and never from a list built before an
   earlier attempt's round trip. A 409 counts as a conflict, sets the row aside for a while and waits a
   short random pause (so the losers of one race do not all stampede the next row together, and the
   winners' claims reach the feed first) before the next attempt; a 404 forgets the row; other API
   errors back off with jitter (1 s doubling to ``--backoff-max-secs``); 401/403 end the worker
   (exit 3). ``--once`` stops claiming after its first claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from typing import TYPE_CHECKING, Callable, Optional

from devin_outposts.client import FleetClient
from devin_outposts.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.worker.binary import BinaryStore, host_os
from devin_outposts.worker.exits import EXIT_AUTH, EXIT_OK, WorkerExit
from devin_outposts.worker.outposts import check_platform, entry_platform_ok, resolve_outpost
from devin_outposts.worker.queue import QueueFeed, oldest_first
from devin_outposts.worker.retrying import Backoff, Stopped, retry_transient
from devin_outposts.worker.session import release_claim

if TYPE_CHECKING:
    from devin_outposts.worker.runner import Worker

log = logging.getLogger(__name__)

#: The pause after the n-th conflict in a row is uniform in [0, CONFLICT_PAUSE * 2**(n-1)], capped at
#: CONFLICT_PAUSE_CAP: long enough for the winner's claim to reach the watch, short next to a claim.
CONFLICT_PAUSE = 0.05
CONFLICT_PAUSE_CAP = 0.4


def conflict_pause(conflicts: int, rng: Callable[[], float] = random.random) -> float:
    return rng() * min(CONFLICT_PAUSE * 2.0 ** min(conflicts - 1, 16), CONFLICT_PAUSE_CAP)


class ClaimOutcome(str, enum.Enum):
    """What one turn of :meth:`QueueMode.claim_next` came to."""

    CLAIMED = "claimed"  # a session was claimed and started
    IDLE = "idle"  # nothing to claim now
    DEFER = "defer"  # a row is there, but another worker should have the first go at it
    ERROR = "error"  # the API failed: back off
    FATAL = "fatal"  # the token was refused: stop


class QueueMode:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        #: After a DEFER outcome: seconds until the deferred row may be claimed.
        self.defer: Optional[float] = None

    async def recover(self, client: FleetClient, binaries: BinaryStore, outpost_id: str) -> None:
        """Take back the sessions this acceptor still holds (a worker restarted after a crash).

        Safe to run again after a failure half-way: sessions already taken back are being served and
        are skipped, never released.
        """
        w = self.worker
        held = (await client.list_all_devins(outpost=outpost_id, phase="claimed", acceptor_id=w.acceptor_id))[
            0
        ]
        for entry in oldest_first(e for e in held if e.status.acceptor_id in (None, w.acceptor_id)):
            sid = entry.session_id
            if sid in w.active:
                continue
            if entry.is_finished or w.free_slot() is None or w.draining:
                why = f"already {entry.status.session_status}" if entry.is_finished else "no free slot"
                log.info(
                    "releasing session %s held from before the restart (%s)",
                    sid,
                    why,
                    extra={"session_id": sid},
                )
                await release_claim(client, sid, w.acceptor_id, {"session_id": sid})
                continue
            try:
                claim = await client.claim(sid, w.acceptor_id)  # a renewal: fresh connect token
            except (FleetConflict, FleetNotFound) as exc:
                log.info("could not take back session %s: %s", sid, exc, extra={"session_id": sid})
                continue
            w.metrics.inc("sessions_claimed")
            log.info("took back session %s after a restart", sid, extra={"session_id": sid})
            w.start_session(claim, client, binaries)

    async def run_queue(self, client: FleetClient, binaries: BinaryStore) -> int:
        w = self.worker
        try:
            outpost = await retry_transient(
                lambda: resolve_outpost(client, w.config.outpost),
                backoff=Backoff(cap=w.config.backoff_max),
                pause=self.pause,
            )
        except Stopped:
            return EXIT_OK  # stopped before it ever claimed anything
        check_platform(outpost)
        log.info(
            "worker %s serving outpost %s (%s) on %s: %d slot(s), %s, workdir %s",
            w.acceptor_id,
            outpost.name,
            outpost.outpost_id,
            host_os(),
            w.config.max_sessions,
            "watching the queue" if w.config.watch else f"polling every {w.config.poll_interval:g}s",
            w.config.workdir,
            extra={"outpost": outpost.outpost_id, "acceptor_id": w.acceptor_id},
        )
        w.metrics.labels["outpost"] = outpost.outpost_id
        recovery = Backoff(cap=w.config.backoff_max)
        while not w.draining:
            try:
                await self.recover(client, binaries, outpost.outpost_id)
                break
            except FleetAuthError:
                raise
            except FleetError as exc:
                w.metrics.inc("api_errors")
                await self.sleep(recovery.next_delay(), f"{exc}")
        w.feed = QueueFeed(
            client,
            outpost.outpost_id,
            w.acceptor_id,
            watch=w.config.watch,
            poll_interval=w.config.poll_interval,
            backoff_max=w.config.backoff_max,
            metrics=w.metrics,
            on_update=w.route,
            spread=w.config.claim_spread,
        )
        w.feed.changed = w.kick
        if not w.draining:
            w.feed_task = asyncio.ensure_future(w.feed.run())
            w.feed_task.add_done_callback(lambda t: w.kick.set())
        w.ready = True
        try:
            await self.claim_loop(client, binaries)
        finally:
            if w.feed_task is not None:
                w.feed_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await w.feed_task
            await w.wait_for_sessions()
        if w.fatal is not None:
            raise WorkerExit(EXIT_AUTH, f"{w.fatal} (check DEVIN_OUTPOSTS_TOKEN and its scopes)")
        if w.config.once and w.results:
            return w.exit_for(w.results[-1])
        return EXIT_OK

    async def sleep(self, seconds: float, why: str) -> None:
        log.warning("%s; retrying in %.1fs", why, seconds)
        await self.pause(seconds)

    async def pause(self, seconds: float) -> bool:
        return await self.worker.pause(seconds)

    async def claim_loop(self, client: FleetClient, binaries: BinaryStore) -> None:
        w = self.worker
        assert w.feed is not None
        backoff = Backoff(cap=w.config.backoff_max)
        claimed_once = False
        while not w.draining:
            w.reap()
            if w.fatal is not None:
                return
            if w.feed_task is not None and w.feed_task.done():
                error = None if w.feed_task.cancelled() else w.feed_task.exception()
                if isinstance(error, FleetAuthError):
                    w.fatal = error
                    return
                log.error("the queue feed stopped (%r); restarting it", error)
                await self.sleep(backoff.next_delay(), "queue feed stopped")
                w.feed_task = asyncio.ensure_future(w.feed.run())
                w.feed_task.add_done_callback(lambda t: w.kick.set())
                continue
            wakeup = w.feed.next_wakeup()
            if w.config.once and claimed_once:
                if not w.active:
                    return
            elif w.free_slot() is not None:
                outcome = await self.claim_next(client, binaries)
                if outcome is ClaimOutcome.CLAIMED:
                    claimed_once = True
                    backoff.reset()
                    continue
                if outcome is ClaimOutcome.ERROR:
                    await self.sleep(backoff.next_delay(), "claiming failed")
                    continue
                if outcome is ClaimOutcome.FATAL:
                    return
                if outcome is ClaimOutcome.DEFER and self.defer is not None:
                    wakeup = self.defer if wakeup is None else min(wakeup, self.defer)
            w.kick.clear()
            if w.is_draining():  # a signal may have come while we were claiming
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(w.kick.wait(), timeout=wakeup)

    async def give_back(self, client: FleetClient, session_id: str, why: str) -> None:
        """Release a claim we will not serve. Never raises: a failed release leaves a claim that expires."""
        w = self.worker
        log.info("releasing session %s at once (%s)", session_id, why, extra={"session_id": session_id})
        assert w.feed is not None
        w.feed.discard(session_id)
        await release_claim(client, session_id, w.acceptor_id, {"session_id": session_id})

    async def claim_next(self, client: FleetClient, binaries: BinaryStore) -> ClaimOutcome:
        """Claim the row this worker should take now. On DEFER, :attr:`defer` says when to look again."""
        w = self.worker
        self.defer = None
        assert w.feed is not None
        conflicts = 0
        while not w.is_draining():  # a method: the flag changes while claims are awaited
            choice = w.feed.next_claim(exclude=w.active)
            if choice is None:
                return ClaimOutcome.IDLE
            if choice.wait > 0:
                self.defer = choice.wait
                return ClaimOutcome.DEFER
            entry = choice.entry
            sid = entry.session_id
            if not entry_platform_ok(entry):
                log.warning(
                    "not claiming session %s: it wants platform %s, this machine runs %s",
                    sid,
                    entry.spec.platform,
                    host_os(),
                    extra={"session_id": sid},
                )
                w.feed.penalize(sid, 3600)
                continue
            try:
                claim = await client.claim(sid, w.acceptor_id)
            except FleetConflict:
                w.metrics.inc("claim_conflicts")
                log.debug("session %s was claimed by another worker", sid, extra={"session_id": sid})
                w.feed.penalize(sid, max(2 * w.config.poll_interval, 5.0))
                conflicts += 1
                await asyncio.sleep(conflict_pause(conflicts))
                continue
            except FleetNotFound as exc:
                log.info("giving up on session %s: %s", sid, exc, extra={"session_id": sid})
                w.feed.discard(sid)
                continue
            except FleetAuthError as exc:
                w.fatal = exc
                return ClaimOutcome.FATAL
            except FleetError as exc:
                w.metrics.inc("api_errors")
                log.warning("%s", exc, extra={"session_id": sid})
                return ClaimOutcome.ERROR
            w.metrics.inc("sessions_claimed")
            if w.draining or claim.is_finished:
                # A signal arrived while the claim was in flight, or the session ended after the
                # feed's last word on it (watch lag): give it straight back.
                why = "draining" if w.draining else f"session already {claim.status.session_status}"
                await self.give_back(client, sid, why)
                if w.draining:
                    return ClaimOutcome.IDLE
                continue
            w.start_session(claim, client, binaries)
            return ClaimOutcome.CLAIMED
        return ClaimOutcome.IDLE
