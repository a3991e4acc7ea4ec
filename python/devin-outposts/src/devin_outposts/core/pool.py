"""The session pool: the slots, the sessions running in them, the drain, and the one wake-up event.

Every mode drives one :class:`SessionPool`: the claim loop (:mod:`devin_outposts.core.claiming`) fills
its slots from the queue, the worker's ``--session`` and direct-serve modes start one session in it. The
pool knows nothing of the queue or the fleet API; it runs :class:`~devin_outposts.core.serving.ClaimedSession`
objects (the worker's local remotes, the orchestrator's machines), which do.

Several pools may share a :class:`SharedCap` (the orchestrator's outposts, each a pool with its own cap,
under one cap for the whole process): a pool then offers a slot only while both have room, and a claim
in flight holds its place (:meth:`SessionPool.reserving`), so that two pools' claims cannot both take
the process's last slot.

The wake-up event is the pool's alone. Anything that may change what the owner of the pool should do
next calls :meth:`SessionPool.wake` (a session finished, the queue changed, a signal came); the owner's
loop calls :meth:`SessionPool.wait`, which returns at once when a wake came since the last wait, so a wake
that arrives while the loop is busy is never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Collection, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

from devin_outposts.api.errors import FleetAuthError
from devin_outposts.api.models import QueueEntry
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.retrying import Stopped
from devin_outposts.core.serving import ClaimedSession
from devin_outposts.core.sessions import FAILED, LOST, SERVED, SessionResult

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Grace between SIGTERM and SIGKILL for a remote stopped by a second signal.
HARD_STOP_GRACE = 0.5


def requests_after_stop(stop_grace: float) -> float:
    """Seconds a second signal leaves every request to the fleet API still to end, the releases included
    (``FleetClient.cut_requests``): half the stop grace, at least 1 s (a release is still worth a try) and
    at most 5 s, so that the program ends within its stop grace (docs/worker.md, "Signals and shutdown")."""
    return max(1.0, min(5.0, stop_grace / 2))


@dataclass
class _Running:
    server: ClaimedSession
    task: asyncio.Task[SessionResult]
    slot: int


class SharedCap:
    """A cap over several pools' sessions together (the orchestrator's ``--max-concurrent`` over its
    outposts): sessions running and claims in flight count, in every pool that joined."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pools: list[SessionPool] = []

    def in_use(self) -> int:
        return sum(len(pool.running) + pool.reserved for pool in self.pools)

    def full(self) -> bool:
        return self.in_use() >= self.size

    def freed(self, by: SessionPool) -> None:
        """A place may have come free: the other pools' loops look again (one may be waiting on it)."""
        for pool in self.pools:
            if pool is not by:
                pool.wake()


class SessionPool:
    """``size`` slots of sessions, the drain, and the wake-up event of the loop that fills them."""

    def __init__(
        self, size: int, metrics: Metrics, *, drain_timeout: float, shared: Optional[SharedCap] = None
    ) -> None:
        self.size = size
        #: The cap this pool shares with others, if any (:meth:`free_slot` asks it too).
        self.shared = shared
        if shared is not None:
            shared.pools.append(self)
        #: Claims in flight (:meth:`reserving`): they count against the shared cap.
        self.reserved = 0
        self.metrics = metrics
        self.drain_timeout = drain_timeout
        self.running: dict[str, _Running] = {}
        self.results: list[SessionResult] = []
        #: Set by the first signal (no new sessions) and by a refused token.
        self.draining = False
        #: Set by a second signal: running sessions are stopped at once.
        self.hard_stop = False
        #: A refused token (401/403), from a claim or from a session: everything stops.
        self.fatal: Optional[FleetAuthError] = None
        #: Called with each finished session's result (queue mode cools failed sessions down).
        self.on_finished: Optional[Callable[[SessionResult], None]] = None
        # Made on first use, on the running loop: on Python 3.9 an Event binds to the loop current
        # when it is created.
        self._event: Optional[asyncio.Event] = None
        self._drain_event: Optional[asyncio.Event] = None

    # --- the wake-up event -------------------------------------------------------------------------

    @property
    def _wake_event(self) -> asyncio.Event:
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def wake(self) -> None:
        """Something changed: the loop waiting in :meth:`wait` should look again."""
        self._wake_event.set()

    async def wait(self, timeout: Optional[float] = None) -> None:
        """Wait for a wake (or ``timeout`` seconds); returns at once if one came since the last wait."""
        event = self._wake_event
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=timeout)
        event.clear()

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` unless a drain starts first; True when the pool is not draining."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while not self.draining and loop.time() < deadline:
            await self.wait(deadline - loop.time())
        return not self.draining

    @property
    def _drained(self) -> asyncio.Event:
        """Set when the drain starts (for :meth:`unless_draining`; :meth:`wait` clears the wake-up event)."""
        if self._drain_event is None:
            self._drain_event = asyncio.Event()
            if self.draining:
                self._drain_event.set()
        return self._drain_event

    async def unless_draining(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` (an API call made to claim: the outpost, the list of held sessions, a claim), cancelled
        when a drain starts, which then raises :class:`~devin_outposts.core.retrying.Stopped`: a first signal
        starts the drain at once, however long the API takes to answer. A claim cancelled so may have been
        made: the caller gives it back."""
        if self.draining:
            work.close()
            raise Stopped("a drain started")
        task = asyncio.ensure_future(work)
        drained = asyncio.ensure_future(self._drained.wait())
        try:
            await asyncio.wait({task, drained}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            drained.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # its connection closed before the caller goes on
            raise Stopped("a drain started")
        return task.result()

    def is_draining(self) -> bool:
        """The same as :attr:`draining`; a method, so that type checkers do not assume a loop's test of
        it still holds after an ``await`` (a signal may come meanwhile)."""
        return self.draining

    # --- slots ---------------------------------------------------------------------------------------

    def free_slot(self) -> Optional[int]:
        """The lowest free slot, or None. Sessions taken back after a restart may outnumber the slots (the
        orchestrator keeps every live one when the cap was lowered): no slot is free until fewer run."""
        if len(self.running) >= self.size:
            return None
        if self.shared is not None and self.shared.full():
            return None
        used = {running.slot for running in self.running.values()}
        for slot in range(self.size):
            if slot not in used:
                return slot
        return None

    def spare_slot(self) -> int:
        """The lowest slot number no session uses, beyond ``size`` if need be (a session kept over the
        cap)."""
        used = {running.slot for running in self.running.values()}
        return next(slot for slot in range(len(used) + 1) if slot not in used)

    @contextlib.contextmanager
    def reserving(self) -> Iterator[None]:
        """Hold a place under the shared cap while a claim is in flight (its slot came from
        :meth:`free_slot`): another pool asking meanwhile sees it taken. The claim's session starts (or
        the claim is given up) before anything else runs on the loop, so the place passes straight to it."""
        self.reserved += 1
        try:
            yield
        finally:
            self.reserved -= 1
            if self.shared is not None:
                self.shared.freed(self)

    @property
    def held(self) -> Collection[str]:
        """The sessions running here (the queue must not offer them again)."""
        return self.running.keys()

    def start(self, server: ClaimedSession) -> None:
        """Run ``server`` in its slot; the pool wakes when it finishes."""
        task = asyncio.ensure_future(server.serve())
        task.add_done_callback(lambda t: self.wake())
        self.running[server.session_id] = _Running(server, task, server.slot)
        self.metrics.set("active_sessions", len(self.running))

    def route(self, session_id: str, entry: Optional[QueueEntry]) -> None:
        """A fresher copy of a running session's queue entry (``None``: it was deleted)."""
        running = self.running.get(session_id)
        if running is not None:
            running.server.notify(entry)

    def reap(self) -> list[SessionResult]:
        """Collect the sessions that finished: count them, remember a refused token, return them."""
        finished = []
        for sid, running in list(self.running.items()):
            if not running.task.done():
                continue
            del self.running[sid]
            self.metrics.set("active_sessions", len(self.running))
            try:
                result = running.task.result()
            except Exception as exc:  # a bug: keep serving the other sessions
                log.exception("serving session %s crashed", sid, extra={"session_id": sid})
                result = SessionResult(sid, FAILED, f"internal error: {exc}")
            if running.server.fatal is not None:
                self.fail(running.server.fatal)
            if result.outcome == SERVED:
                self.metrics.inc("sessions_served")
            elif result.outcome in (FAILED, LOST):
                self.metrics.inc("sessions_failed")
            self.results.append(result)
            finished.append(result)
            if self.on_finished is not None:
                self.on_finished(result)
        if finished and self.shared is not None:
            self.shared.freed(self)
        return finished

    # --- stopping ------------------------------------------------------------------------------------

    def fail(self, error: FleetAuthError) -> None:
        """The token was refused: stop claiming; the running sessions are stopped by :meth:`drain`."""
        if self.fatal is None:
            self.fatal = error
        self.start_drain()

    def start_drain(self) -> None:
        """No new sessions; running ones may finish within the drain timeout."""
        if not self.draining:
            self.draining = True
            self.metrics.set("draining", 1)
        if self._drain_event is not None:
            self._drain_event.set()
        self.wake()

    def stop_now(self) -> None:
        """A second signal: stop every running session at once (their claims are still released)."""
        self.hard_stop = True
        for running in self.running.values():
            running.server.request_stop(HARD_STOP_GRACE)
        self.wake()

    async def drain(self) -> None:
        """Wait for every running session; stop them at the drain deadline, a second signal or a
        refused token. Returns when none is left."""
        loop = asyncio.get_running_loop()
        deadline: Optional[float] = None
        self.reap()
        while self.running:
            if self.draining:
                for running in self.running.values():
                    running.server.drain_started()  # a session still being prepared may stop now
            if self.draining and deadline is None:
                deadline = loop.time() + self.drain_timeout
            if self.fatal is not None or (deadline is not None and loop.time() >= deadline):
                for running in self.running.values():
                    if not running.server.stopping:
                        running.server.request_stop(HARD_STOP_GRACE if self.hard_stop else None)
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            if timeout is not None and timeout <= 0:
                timeout = None  # the stop was requested above: the sessions end within their grace
            await self.wait(timeout)
            self.reap()
