"""How the orchestrator follows its outpost's queue: the core claim loop, with machines.

:class:`MachineHost` is the orchestrator's :class:`~devin_outposts.core.claiming.SessionHost`: the
:class:`~devin_outposts.core.claiming.ClaimLoop` claims, and the host gives each claim a
:class:`~devin_outposts.orchestrator.machine.MachineSession` on a machine of the driver. Where the
orchestrator's rules differ from the worker's (docs/orchestrator.md, "The loop"):

* restart recovery adopts the machines a previous run left, and keeps every session whose machine is
  still there even over ``--max-concurrent`` (the pool then offers no slot until fewer sessions run than
  the cap);
* no single reply stops the claim loop: any error in a claim turn is one log line and a retry, any error
  in recovery a :class:`~devin_outposts.api.errors.FleetError` that recovery retries;
* a claim loop that ends on an error all the same detaches every running session first, so that the run
  ends at once (exit 1) instead of waiting on sessions nobody stops;
* a driver that keeps failing to start workers holds new claims back (:mod:`.backoff`): the host counts
  each session that failed without being served (``start_failures{reason}``), whatever the platform
  briefly reported of its worker, and a session served ends the back-off.

One host per outpost served (:class:`~devin_outposts.orchestrator.outpost.OutpostRunner`). The host keeps
what it learns (the outpost, the machines to adopt) to itself; the outpost's runner and sweep read it from
here.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Optional

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetError
from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts.core.claiming import KeepOverCap
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.pool import SessionPool
from devin_outposts.core.sessions import SessionResult
from devin_outposts.orchestrator.backoff import DriverBackoff
from devin_outposts.orchestrator.drivers.base import Driver, DriverError, Machine
from devin_outposts.orchestrator.drivers.status_board import StatusBoard
from devin_outposts.orchestrator.machine import MachineSession
from devin_outposts.orchestrator.options import OrchestratorConfig

log = logging.getLogger(__name__)


def describe_error(exc: BaseException) -> str:
    """One line for an unexpected error: its type and the start of its message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def debugging() -> bool:
    """Tracebacks of unexpected errors go to the log at debug level only (one line otherwise)."""
    return log.isEnabledFor(logging.DEBUG)


def detach_sessions(pool: SessionPool) -> None:
    """No more claims; every running session is detached: its machine and claim stay for the next start."""
    for running in pool.running.values():
        running.server.request_detach()
    pool.start_drain()


def start_failure_reason(result: SessionResult, session: MachineSession) -> str:
    """The label of a session that failed unserved: the platform's reason, else what failed."""
    if result.reason:
        return result.reason
    if result.gave_up:
        return "worker-exited"  # it exited past the restart limit, never having served
    return "provision-failed" if session.machine is None else "start-failed"


class MachineHost:
    """Runs each claimed session on a machine of ``driver``."""

    def __init__(
        self,
        config: OrchestratorConfig,
        *,
        driver: Driver,
        client: FleetClient,
        pool: SessionPool,
        metrics: Metrics,
        acceptor_id: str,
        board: Optional[StatusBoard] = None,
    ) -> None:
        self.config = config
        self.driver = driver
        #: The driver's status board (machine statuses from its status source), shared by every session.
        self.board = board
        self.client = client
        self.pool = pool
        self.metrics = metrics
        self.acceptor_id = acceptor_id
        #: The outpost served, once resolved.
        self.outpost: Optional[Outpost] = None
        #: Machines found at start-up, by session, while recovery takes back its claims.
        self.adoptable: dict[str, Machine] = {}
        #: The sessions running, by id (to tell, when one ends, whether its worker ever ran).
        self.sessions: dict[str, MachineSession] = {}
        #: Holds new claims back while the driver keeps failing to start workers.
        self.backoff = DriverBackoff()

    @property
    def outpost_id(self) -> Optional[str]:
        return self.outpost.outpost_id if self.outpost is not None else None

    # --- the SessionHost ---------------------------------------------------------------------------

    @property
    def machine_platform(self) -> Optional[str]:
        return self.driver.platform  # None (the ansible driver): the platform is not known, nothing refused

    def announce(self, outpost: Outpost) -> None:
        self.outpost = outpost
        log.info(
            "orchestrator %s serving outpost %s (%s) with the %s driver: up to %d sessions, resume policy %s",
            self.acceptor_id,
            outpost.name,
            outpost.outpost_id,
            self.driver.name,
            self.config.max_sessions,
            self.config.resume_policy,
            extra={"outpost": outpost.outpost_id, "acceptor_id": self.acceptor_id},
        )
        self.metrics.labels["pool_id"] = outpost.outpost_id

    @contextlib.asynccontextmanager
    async def recovery(self, outpost_id: str) -> AsyncIterator[KeepOverCap]:
        """Find the machines a previous run left; the claim loop then takes back our claims, keeping each
        session whose machine is still there even over the caps (the outpost's own and
        ``--max-concurrent``: a restart with a lower cap must not evict live sessions; claiming simply waits
        until fewer sessions run than the caps).

        Any failure is a :class:`FleetError`, which the claim loop retries: a reply that could not be
        read (or any other surprise) must not end the run with every adopted machine left alone.
        """
        try:
            machines = await self.driver.list_owned(self.acceptor_id, outpost_id)
        except DriverError as exc:  # without the list, a held session could get a second machine
            raise FleetError("list this orchestrator's machines", str(exc)) from exc
        self.adoptable = {m.session_id: m for m in machines if m.session_id not in self.pool.held}
        try:
            yield self.adoptable.__contains__
            self._warn_over_cap()
        except FleetError:
            raise
        except Exception as exc:  # one bad reply must not stop the orchestrator
            raise FleetError("take back this orchestrator's sessions", describe_error(exc)) from exc
        finally:
            self.adoptable.clear()

    def _warn_over_cap(self) -> None:
        pool = self.pool
        over = len(pool.running) - pool.size
        if over > 0:
            log.warning(
                "%d sessions of outpost %s taken back, %d more than its cap %d: every one keeps its machine; "
                "no new claim until fewer than %d run",
                len(pool.running),
                self.outpost_id or "?",
                over,
                pool.size,
                pool.size,
            )

    def session_for(self, claim: QueueEntry, slot: int) -> MachineSession:
        session = MachineSession(
            self.config,
            driver=self.driver,
            claim=claim,
            acceptor_id=self.acceptor_id,
            metrics=self.metrics,
            fleet=self.client,
            slot=slot,
            adopt=self.adoptable.pop(claim.session_id, None),
            on_started=self._worker_started,
            on_served=self._session_served,
            served_after=self.backoff.schedule.served_after,
            board=self.board,
        )
        self.sessions[claim.session_id] = session
        self.backoff.claimed(claim.session_id)
        self.metrics.set("active_workers", len(self.pool.running) + 1)
        return session

    def _worker_started(self, session: MachineSession) -> None:
        created = session.claim.metadata.created_at if session.claim else None
        if created is not None and not session.adopted:
            self.metrics.observe("session_start_seconds", max(0.0, time.time() - created))
        log.info(
            "session %s: worker running on %s",
            session.session_id,
            session.machine.name if session.machine else "?",
            extra={"session_id": session.session_id},
        )

    def _session_served(self, session: MachineSession) -> None:
        if self.backoff.succeeded():
            log.info(
                "session %s is served on a %s machine: claiming again",
                session.session_id,
                self.driver.name,
                extra={"session_id": session.session_id, "outpost": self.outpost_id or "?"},
            )
            self.metrics.set("driver_backoff_seconds", 0)
            self.pool.wake()  # every free slot may claim now

    def finished(self, result: SessionResult) -> None:
        self.metrics.set("active_workers", len(self.pool.running))
        if result.infrastructure:
            self.metrics.inc("infrastructure_errors")
        elif result.gave_up:
            self.metrics.inc("workers_given_up")
        session = self.sessions.pop(result.session_id, None)
        if session is None:
            return
        session.note_served()  # a last look: a served session is never a start failure
        if session.served_once:
            return
        # A start failure: failed (an infrastructure error, or its worker given up past the restart limit)
        # without ever being served, whatever the platform reported of its worker meanwhile. A session
        # stopped, lost, or ended while its worker was starting says nothing of the platform.
        if not (result.infrastructure or result.gave_up):
            self.backoff.ended(result.session_id)
            return
        reason = start_failure_reason(result, session)
        self.metrics.inc_labelled("start_failures", (reason,))
        if self.backoff.failed(result.session_id, reason):
            pause = self.backoff.pause
            self.metrics.inc("driver_backoffs")
            self.metrics.set("driver_backoff_seconds", round(pause, 1))
            log.warning(
                "the %s driver failed to start %d workers in a row (last: %s): no new claims for %.1fs, "
                "then one session to try",
                self.driver.name,
                self.backoff.failures,
                reason,
                pause,
                extra={"outpost": self.outpost_id or "?", "error_kind": "infrastructure"},
            )

    def claim_pause(self) -> float:
        return self.backoff.claim_pause()

    def pause_report(self) -> Optional[Mapping[str, object]]:
        state = self.backoff.state()
        if state is None:
            return None
        until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=state.remaining)
        return {
            "driver": self.driver.name,
            "reason": state.reason,
            "failures": state.failures,
            "pause_seconds": round(state.pause, 1),
            # When the pause ends; then one session is claimed (``probe``) and claiming waits on it.
            "until": until.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "probe": state.probe,
        }

    def claim_failed(self, error: Exception) -> bool:
        """No single reply may stop the claim loop: one log line, and a retry after the backoff."""
        outpost = self.outpost_id or "?"
        log.error(
            "claiming a session of outpost %s failed on an unexpected error: %s",
            outpost,
            describe_error(error),
            exc_info=error if debugging() else None,
            extra={"outpost": outpost},
        )
        return True

    def loop_failed(self) -> None:
        """The run ends at once: every running session keeps its machine and claim for the next start."""
        detach_sessions(self.pool)
