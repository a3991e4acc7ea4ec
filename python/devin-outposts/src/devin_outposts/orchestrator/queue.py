"""How the orchestrator follows its outpost's queue: the worker's queue mode, with machines.

:class:`OrchestratorQueue` is :class:`~devin_outposts.core.claiming.QueueMode` with three differences
(docs/orchestrator.md, "The loop"):

* restart recovery adopts the machines a previous run left, and keeps every session whose machine is
  still there even over ``--max-concurrent`` (:class:`OrchestratorPool` then offers no slot until fewer
  sessions run than the cap);
* no single reply stops the claim loop: any error in a claim turn is one log line and a retry, any error
  in recovery a :class:`~devin_outposts.api.errors.FleetError` that recovery retries;
* a claim loop that ends on an error all the same detaches every running session first, so that the run
  ends at once (exit 1) instead of waiting on sessions nobody stops.
"""

from __future__ import annotations

import logging
from typing import Optional, Protocol

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetConflict, FleetError, FleetNotFound
from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts.core.claiming import ClaimOutcome, QueueMode
from devin_outposts.core.feed import oldest_first
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.pool import SessionPool
from devin_outposts.core.serving import SessionResult, release_claim
from devin_outposts.orchestrator.drivers.base import Driver, DriverError, Machine
from devin_outposts.orchestrator.machine import MachineSession
from devin_outposts.orchestrator.options import OrchestratorConfig

log = logging.getLogger(__name__)


class QueueOwner(Protocol):
    """What the queue reads of the orchestrator (:class:`~.runner.Orchestrator`)."""

    config: OrchestratorConfig
    driver: Optional[Driver]
    pool: OrchestratorPool
    metrics: Metrics
    acceptor_id: str
    outpost_id: Optional[str]
    adoptable: dict[str, Machine]

    def session_for(self, claim: QueueEntry, slot: int) -> MachineSession:
        """The machine session for a claim."""

    def finished(self, result: SessionResult) -> None:
        """A session ended."""

    def stop(self) -> None:
        """No more claims; detach every running session."""


def describe_error(exc: BaseException) -> str:
    """One line for an unexpected error: its type and the start of its message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def debugging() -> bool:
    """Tracebacks of unexpected errors go to the log at debug level only (one line otherwise)."""
    return log.isEnabledFor(logging.DEBUG)


class OrchestratorPool(SessionPool):
    """The session pool, where sessions taken back after a restart may outnumber the slots (the cap was
    lowered): a slot is free only while fewer sessions run than ``size``."""

    def free_slot(self) -> Optional[int]:
        if len(self.running) >= self.size:
            return None
        return super().free_slot()

    def spare_slot(self) -> int:
        """The lowest slot number no session uses, beyond ``size`` if need be (for a session over the cap)."""
        used = {running.slot for running in self.running.values()}
        return next(slot for slot in range(len(used) + 1) if slot not in used)


class OrchestratorQueue(QueueMode):
    """Queue mode whose restart recovery adopts the machines a previous run left."""

    def __init__(self, orchestrator: QueueOwner, client: FleetClient) -> None:
        config = orchestrator.config
        driver = orchestrator.driver
        assert driver is not None
        super().__init__(
            config,
            client,
            orchestrator.pool,
            orchestrator.metrics,
            orchestrator.acceptor_id,
            orchestrator.session_for,
            machine_platform=driver.platform,
            check_platforms=driver.platform is not None,
        )
        self.orchestrator = orchestrator
        self.outpost: Optional[Outpost] = None

    def _announce(self, outpost: Outpost) -> None:
        self.outpost = outpost
        self.orchestrator.outpost_id = outpost.outpost_id
        assert self.orchestrator.driver is not None
        log.info(
            "orchestrator %s serving outpost %s (%s) with the %s driver: up to %d sessions, resume policy %s",
            self.acceptor_id,
            outpost.name,
            outpost.outpost_id,
            self.orchestrator.driver.name,
            self.config.max_sessions,
            self.orchestrator.config.resume_policy,
            extra={"outpost": outpost.outpost_id, "acceptor_id": self.acceptor_id},
        )
        self.metrics.labels["pool_id"] = outpost.outpost_id

    async def recover(self, outpost_id: str) -> None:
        """Find the machines a previous run left, then take back our claims with them.

        Any failure is a :class:`FleetError`, which :meth:`QueueMode.run` retries: a reply that could not
        be read (or any other surprise) must not end the run with every adopted machine left alone.
        """
        assert self.orchestrator.driver is not None
        try:
            machines = await self.orchestrator.driver.list_owned(self.acceptor_id, outpost_id)
        except DriverError as exc:  # without the list, a held session could get a second machine
            raise FleetError("list this orchestrator's machines", str(exc)) from exc
        self.orchestrator.adoptable = {
            m.session_id: m for m in machines if m.session_id not in self.pool.held
        }
        try:
            await self._take_back(outpost_id)
        except FleetError:
            raise
        except Exception as exc:  # one bad reply must not stop the orchestrator
            raise FleetError("take back this orchestrator's sessions", describe_error(exc)) from exc
        finally:
            self.orchestrator.adoptable.clear()

    async def _take_back(self, outpost_id: str) -> None:
        """Take back the sessions this acceptor holds. Unlike the worker's recovery, a session whose
        machine is still there is kept even over ``--max-concurrent`` (a restart with a lower cap must not
        evict live sessions): claiming simply waits until fewer sessions run than the cap. A held session
        with no machine is taken back only into a free slot, else released; a finished one is released.
        Safe to run again after a failure half-way: sessions already taken back are skipped."""
        client, me, pool = self.client, self.acceptor_id, self.orchestrator.pool
        held = (await client.list_all_devins(outpost=outpost_id, phase="claimed", acceptor_id=me))[0]
        for entry in oldest_first(e for e in held if e.status.acceptor_id in (None, me)):
            sid = entry.session_id
            if sid in pool.held:
                continue
            slot = pool.free_slot()
            if slot is None and sid in self.orchestrator.adoptable:  # live: kept even over the cap
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
                claim = await client.claim(sid, me)  # a renewal: fresh connect token
            except (FleetConflict, FleetNotFound) as exc:
                log.info("could not take back session %s: %s", sid, exc, extra={"session_id": sid})
                continue
            self.metrics.inc("sessions_claimed")
            log.info("took back session %s after a restart", sid, extra={"session_id": sid})
            self._start(claim, slot)
        over = len(pool.running) - pool.size
        if over > 0:
            log.warning(
                "%d sessions taken back, %d more than --max-concurrent %d: every one keeps its machine; "
                "no new claim until fewer than %d run",
                len(pool.running),
                over,
                pool.size,
                pool.size,
            )

    async def claim_next(self) -> ClaimOutcome:
        """One claim turn; any error in it (a claim answer that cannot be read, a bug) is one log line and
        a retry after the backoff, never the end of the loop. A claim whose answer was lost stays ours on
        the server until its deadline, then returns to the queue."""
        try:
            return await super().claim_next()
        except Exception as exc:  # no single reply may stop the claim loop
            self.metrics.inc("api_errors")
            outpost = self.outpost.outpost_id if self.outpost is not None else "?"
            log.error(
                "claiming a session of outpost %s failed on an unexpected error: %s",
                outpost,
                describe_error(exc),
                exc_info=debugging(),
                extra={"outpost": outpost},
            )
            return ClaimOutcome.ERROR

    async def claim_loop(self) -> None:
        """The claim loop; if it ends on an error all the same, every running session is detached (kept
        running, its claim held, for the next start to adopt) so that the run can end at once."""
        try:
            await super().claim_loop()
        except BaseException:
            self.orchestrator.stop()
            raise

    def _finished(self, result: SessionResult) -> None:
        super()._finished(result)
        self.orchestrator.finished(result)
