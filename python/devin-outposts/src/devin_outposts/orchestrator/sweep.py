"""The garbage-collection sweep: what the orchestrator made and no session of ours needs any more.

Every ``--gc-interval`` seconds (and once right after restart recovery) each outpost's :class:`Sweeper`
looks at everything the driver finds under this acceptor id and that outpost (docs/orchestrator.md, "Garbage
collection"):

* **machines** no running session of ours is on: their session is gone, over, claimed by someone else,
  or our claim on it lapsed; a machine that never came up is already given up by its session (boot
  timeout), so it lands here too. A suspended session's machine is snapshotted first under the
  ``snapshot`` policy (a failed snapshot at the session's end left it there on purpose);
* **snapshots** whose session is terminated or gone, or older than ``--snapshot-ttl``;
* **orphaned per-session secrets** (the driver's :meth:`~.drivers.base.Driver.sweep_orphans`).

Each pass counts as a ``reconciliation``; a pass the driver or the API failed, as a
``reconcile_failure`` (the next pass tries again). It also warns when every slot is taken by a session
whose worker has not run for half ``--boot-timeout``: capacity is full of machines that do not come up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Container, Mapping
from typing import Optional, Protocol

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetAuthError, FleetError, FleetNotFound
from devin_outposts.api.models import QueueEntry
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.pool import SessionPool
from devin_outposts.orchestrator.drivers.base import Driver, DriverError, Machine, Snapshot
from devin_outposts.orchestrator.machine import MachineSession
from devin_outposts.orchestrator.options import OrchestratorConfig
from devin_outposts.orchestrator.plan import (
    capacity_stuck,
    snapshot_expired,
    snapshot_unneeded,
    sweep_machine,
)

log = logging.getLogger(__name__)

#: Sweeps between two "capacity full, nothing running" warnings.
STUCK_WARNING_EVERY = 5
#: The share of --boot-timeout a session's worker may take to run before it counts as not coming up.
STUCK_AFTER = 0.5


class Following(Protocol):
    @property
    def ready(self) -> bool:
        """Following the queue (recovery done)."""


class SweepOwner(Protocol):
    """What the sweep reads of the outpost it sweeps for (:class:`~.outpost.OutpostRunner`): that
    outpost's sessions only, so a machine of another outpost served by the same process is never its."""

    config: OrchestratorConfig
    driver: Optional[Driver]
    client: Optional[FleetClient]
    metrics: Metrics
    acceptor_id: str

    @property
    def outpost_id(self) -> Optional[str]:
        """The outpost served, once resolved."""

    @property
    def adoptable(self) -> Mapping[str, Machine]:
        """Machines found at start-up that recovery has not taken back yet."""

    @property
    def pool(self) -> SessionPool:
        """The sessions and their slots."""

    @property
    def following(self) -> Optional[Following]:
        """The claim loop, once it exists."""

    @property
    def sessions(self) -> list[MachineSession]:
        """The sessions running now."""


class Sweeper:
    def __init__(self, orchestrator: SweepOwner) -> None:
        self.orchestrator = orchestrator
        self.passes = 0
        self._stuck_passes = 0

    async def run(self) -> None:
        orch = self.orchestrator
        while not orch.pool.draining:
            if orch.following is not None and orch.following.ready and orch.outpost_id is not None:
                await self.sweep()
            await orch.pool.pause(orch.config.gc_interval if self.passes else 0.2)

    def _serving(self) -> set[str]:
        return set(self.orchestrator.pool.running)

    def _live(self, kept: set[str]) -> Container[str]:
        """The sessions whose objects must stay, asked at each decision: a snapshot set of the running ones
        would not know a session claimed while the sweep runs, whose objects its provision is making (a
        podman state volume was removed that way between its creation and its container's)."""
        return _LiveSessions(self.orchestrator.pool.running.keys(), kept)

    async def _entry(self, session_id: str) -> Optional[QueueEntry]:
        assert self.orchestrator.client is not None
        try:
            return await self.orchestrator.client.get_devin(session_id)
        except FleetNotFound:
            return None

    async def sweep(self) -> None:
        orch = self.orchestrator
        assert orch.driver is not None
        assert orch.outpost_id is not None
        self.passes += 1
        orch.metrics.inc("reconciliations")
        try:
            await self._machines()
            kept = await self._snapshots()
            removed = await orch.driver.sweep_orphans(orch.acceptor_id, orch.outpost_id, self._live(kept))
            if removed:
                log.info("removed %d orphaned per-session object(s)", removed)
        except FleetAuthError as exc:
            orch.pool.fail(exc)
        except (DriverError, FleetError) as exc:
            orch.metrics.inc("reconcile_failures")
            log.warning("garbage collection failed: %s; trying again next pass", exc)
        except Exception as exc:  # a reply no one foresaw must not end the sweeps for good
            orch.metrics.inc("reconcile_failures")
            log.error(
                "garbage collection failed on an unexpected error: %s: %s; trying again next pass",
                type(exc).__name__,
                " ".join(str(exc).split())[:200],
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        self._check_stuck()

    async def _machines(self) -> None:
        orch = self.orchestrator
        assert orch.driver is not None
        assert orch.outpost_id is not None
        for machine in await orch.driver.list_owned(orch.acceptor_id, orch.outpost_id):
            if machine.session_id in self._serving() or machine.session_id in orch.adoptable:
                continue
            entry = await self._entry(machine.session_id)
            plan = sweep_machine(entry, acceptor_id=orch.acceptor_id, policy=orch.config.resume_policy)
            if machine.session_id in self._serving():  # claimed again while we asked
                continue
            if plan.snapshot_first:
                await orch.driver.snapshot(machine)
            await self._collect(machine, plan.why)

    async def _collect(self, machine: Machine, why: str) -> None:
        orch = self.orchestrator
        assert orch.driver is not None
        await orch.driver.teardown(machine)
        orch.metrics.inc("machines_collected")
        log.info(
            "collected machine %s: %s",
            machine.name,
            why,
            extra={"session_id": machine.session_id, "machine": machine.name},
        )

    async def _snapshots(self) -> set[str]:
        """Drop snapshots nobody will resume; the sessions whose snapshots are kept."""
        orch = self.orchestrator
        assert orch.driver is not None
        assert orch.outpost_id is not None
        kept: set[str] = set()
        ttl = orch.config.snapshot_ttl
        for snapshot in await orch.driver.list_snapshots(orch.acceptor_id, orch.outpost_id):
            if snapshot.session_id in self._serving():
                kept.add(snapshot.session_id)
                continue
            why = snapshot_expired(snapshot, ttl=ttl, now=time.time())
            if why is None:
                why = snapshot_unneeded(await self._entry(snapshot.session_id))
            if why is None:
                kept.add(snapshot.session_id)
                continue
            await self._drop(snapshot, why)
        return kept

    async def _drop(self, snapshot: Snapshot, why: str) -> None:
        orch = self.orchestrator
        assert orch.driver is not None
        await orch.driver.delete_snapshot(snapshot)
        orch.metrics.inc("snapshots_collected")
        log.info("removed snapshot %s: %s", snapshot.ref, why, extra={"session_id": snapshot.session_id})

    def _check_stuck(self) -> None:
        """Warn when every slot is taken by a session whose worker has not run for half the boot timeout.
        Machines that are still being made (every run starts with full slots and no worker up yet, and a
        podman or Kubernetes machine takes seconds) are not "not coming up"."""
        orch = self.orchestrator
        sessions = orch.sessions
        patience = orch.config.boot_timeout * STUCK_AFTER
        waited = [session.not_up_for() for session in sessions]
        if capacity_stuck(slot_free=orch.pool.free_slot() is not None, not_up_for=waited, patience=patience):
            if self._stuck_passes % STUCK_WARNING_EVERY == 0:
                log.warning(
                    "capacity is full (%d of %d sessions) but no session's worker has run for %gs: "
                    "machines are not coming up (see the driver's errors above)",
                    len(sessions),
                    orch.config.max_concurrent,
                    patience,
                )
            self._stuck_passes += 1
        else:
            self._stuck_passes = 0


class _LiveSessions(Container[str]):
    """Running sessions (a live view of the pool's) and the sessions whose snapshots are kept."""

    def __init__(self, running: Container[str], kept: Container[str]) -> None:
        self.running = running
        self.kept = kept

    def __contains__(self, session_id: object) -> bool:
        return session_id in self.running or session_id in self.kept
