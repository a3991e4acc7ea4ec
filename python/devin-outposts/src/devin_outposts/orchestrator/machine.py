"""One session on one machine: provision (or adopt), start the worker, watch it, snapshot, tear down.

:class:`MachineSession` is a :class:`~devin_outposts.core.serving.ClaimedSession`: the claim is
renewed, the session's status watched, a worker exit confirmed and restarts counted exactly as the
worker does for a local ``devin-remote`` (docs/orchestrator.md, "Per session"). Its three hooks:

* :meth:`~MachineSession.prepare` adopts the machine a previous run of the orchestrator left for this
  session, or provisions one within ``--provision-timeout`` (a failure or a timeout ends the session as
  an infrastructure error: the claim is released at once); a ``kind=resume`` session with the
  ``snapshot`` policy gets its kept state restored;
* :meth:`~MachineSession.launch` starts ``devin-outposts worker start --session=<id>`` in the machine in
  direct-serve mode with the claim's connect token (the account token never enters a machine). A
  platform that restarts failed workers itself (a Pod) is only re-attached to;
* :meth:`~MachineSession.finish` snapshots a suspended session (``snapshot`` policy), then tears the
  machine down; a failed snapshot keeps the machine, so no state is lost (the sweep removes it once the
  session is terminated).

A :class:`MachineRun` turns the machine's status (the driver's status board, or reads) into what serving
waits on: an exit code, or a :class:`~devin_outposts.core.serving.LaunchError` when the worker cannot
start there (the platform named the same reason for ``--start-failure-grace`` seconds, or said it never
will), never came up within ``--boot-timeout``, ran that long without the session being served (its queue
entry never ``running``), or the machine vanished.

A session counts as **served** (:func:`~devin_outposts.orchestrator.plan.session_served`) once the fleet
shows its remote connected, not when the platform reports its worker ``running``: the driver back-off
counts a session that failed unserved as a start failure, whatever the platform briefly reported
(docs/orchestrator.md, "Fast failure").
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Callable, ClassVar, Optional

from devin_outposts.api.models import QueueEntry, SessionKind, SessionStatus
from devin_outposts.core.exits import ExitCode
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.serving import ClaimedSession
from devin_outposts.core.sessions import FAILED, LaunchError, SessionFleet, SessionResult
from devin_outposts.orchestrator.drivers.base import (
    Driver,
    DriverError,
    Machine,
    SessionSpec,
    Snapshot,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
)
from devin_outposts.orchestrator.drivers.status_board import StatusBoard
from devin_outposts.orchestrator.options import OrchestratorConfig, ResumePolicy
from devin_outposts.orchestrator.plan import Verdict, judge_worker, session_served

log = logging.getLogger(__name__)

#: Status reads that may fail in a row before the machine counts as lost.
STATUS_FAILURES = 5
#: Seconds a session waits on the status board with no change before it judges its machine's row again
#: (no request: the source's own listings keep the board right).
BOARD_SAFETY_LOOK = 60.0


def session_spec(claim: QueueEntry, acceptor_id: str) -> SessionSpec:
    spec = claim.spec
    return SessionSpec(
        session_id=claim.session_id,
        outpost_id=claim.metadata.outpost_id or "",
        acceptor_id=acceptor_id,
        platform=spec.platform.value if spec.platform is not None else None,
        kind=spec.kind.value if spec.kind is not None else SessionKind.NEW.value,
        network_policy=spec.network_policy.model_dump(mode="json") if spec.network_policy else None,
        remote_binary_sha=spec.remote_binary_sha,
    )


class MachineRun:
    """One start of the worker in a machine, as serving sees it (see
    :class:`~devin_outposts.core.serving.Run`).

    Its status comes from the driver's :class:`~devin_outposts.orchestrator.drivers.status_board.StatusBoard`
    while that is in sync and shows the machine (a wait for the next change, no request), else from
    :meth:`Driver.status` every ``--status-interval-secs``."""

    def __init__(
        self, session: MachineSession, *, base_restarts: int = 0, launched_at: Optional[float] = None
    ) -> None:
        self.session = session
        #: When (monotonic) this run's worker was started: board rows the source reported before then
        #: describe the worker it replaced. None: the run re-attaches to a worker already there.
        self.launched_at = launched_at
        self.driver = session.driver
        assert session.machine is not None
        self.machine = session.machine
        self.started = time.monotonic()
        self.base_restarts = base_restarts
        self.returncode: Optional[int] = None
        #: The platform restarted the worker itself (so the next launch only re-attaches).
        self.restarted_in_place = False
        self.last: Optional[WorkerStatus] = None
        self._error: Optional[LaunchError] = None
        #: The board row version last judged (0: none yet).
        self._seen = 0
        #: Since when (monotonic) the platform has named a reason for not starting the worker.
        self._failing_since: Optional[float] = None

    def describe(self) -> str:
        return f"{self.driver.name} machine {self.machine.name}"

    async def _read(self) -> WorkerStatus:
        failures = 0
        while True:
            try:
                return await self.driver.status(self.machine)
            except DriverError as exc:
                failures += 1
                if failures >= STATUS_FAILURES:
                    raise LaunchError(f"cannot read machine {self.machine.name}: {exc}") from exc
                log.warning("%s; reading again", exc, extra=self.session.log_extra)
                await asyncio.sleep(self.session.config.status_interval)

    def _booting_too_long(self) -> bool:
        return time.monotonic() - self.started > self.session.config.boot_timeout

    def _next_deadline(self) -> float:
        """Seconds until a verdict may change with no new status: the boot timeout, the start failure's
        grace, or else the board's safety look."""
        config = self.session.config
        now = time.monotonic()
        deadlines = [BOARD_SAFETY_LOOK]
        boot_left = self.started + config.boot_timeout - now
        if boot_left > 0:
            deadlines.append(boot_left)
        if self._failing_since is not None:
            deadlines.append(self._failing_since + config.start_failure_grace - now)
        served_in = self.session.served_in()
        if served_in is not None:
            deadlines.append(served_in)
        return max(0.01, min(deadlines) + 0.01)

    async def _next_status(self, first: bool) -> WorkerStatus:
        """The machine's status: at once the first time, then after the next change (board) or after
        ``--status-interval-secs`` (direct reads)."""
        board = self.session.board
        name = self.machine.name
        since = self.launched_at or 0.0
        if not first:
            if board is not None and board.row(name, since=since) is not None:
                await board.changed(name, after=self._seen, timeout=self._next_deadline())
            else:
                await asyncio.sleep(self.session.config.status_interval)
        row = board.row(name, since=since) if board is not None else None
        if row is not None:
            self._seen = row.version
            return row.status
        return await self._read()

    def _failing_for(self, status: WorkerStatus) -> float:
        """Seconds the platform has named a reason (any) in a row for a worker not yet running."""
        if not status.reason or status.state is not WorkerState.STARTING:
            self._failing_since = None
            return 0.0
        # One clock for every reason in a row: a platform that alternates them (the kubelet's ErrImagePull
        # and ImagePullBackOff) is still not starting the worker.
        if self._failing_since is None:
            self._failing_since = time.monotonic()
        return time.monotonic() - self._failing_since

    async def wait_exit(self) -> int:
        config = self.session.config
        first = True
        try:
            while True:
                status = self.last = await self._next_status(first)
                first = False
                if status.state is WorkerState.RUNNING:
                    self.session.worker_running()
                else:
                    self.session.running_since = None
                self.session.note_served()
                reading = judge_worker(
                    status,
                    machine=self.machine.name,
                    base_restarts=self.base_restarts,
                    served=self.session.served,
                    booting_too_long=self._booting_too_long(),
                    boot_timeout=config.boot_timeout,
                    latest=self.session.latest,
                    failing_for=self._failing_for(status),
                    failure_grace=config.start_failure_grace,
                )
                if reading.verdict is Verdict.GIVE_UP:
                    raise LaunchError(reading.why, reason=reading.reason)
                if reading.verdict is Verdict.RESTARTED:
                    self.restarted_in_place = True
                    self.session.running_since = None  # a new worker: its own time running
                if reading.verdict in (Verdict.EXITED, Verdict.RESTARTED):
                    self.returncode = reading.exit_code
                    return self.returncode
        except LaunchError as exc:
            self._error = exc
            self.returncode = -1
            return -1

    async def wait(self) -> int:
        if self._error is not None:
            raise self._error
        if self.returncode is None:
            await self.wait_exit()
            if self._error is not None:
                raise self._error
        assert self.returncode is not None
        return self.returncode

    async def stop(self, grace: float) -> int:
        """Stopping a machine's worker is destroying the machine (teardown is idempotent)."""
        await self.session.teardown()
        if self.returncode is None:
            self.returncode = -1
        return self.returncode


class MachineSession(ClaimedSession):
    """Serves one claimed session on a machine of ``driver``."""

    RESTART_METRIC: ClassVar[str] = "worker_restarts"
    WHAT: ClassVar[str] = "worker"

    def __init__(
        self,
        config: OrchestratorConfig,
        *,
        driver: Driver,
        claim: QueueEntry,
        acceptor_id: str,
        metrics: Metrics,
        fleet: SessionFleet,
        slot: int,
        adopt: Optional[Machine] = None,
        on_started: Optional[Callable[[MachineSession], None]] = None,
        on_served: Optional[Callable[[MachineSession], None]] = None,
        served_after: float = 30.0,
        board: Optional[StatusBoard] = None,
    ) -> None:
        # Each running session reads its status every --session-check-secs (the worker's poll interval
        # in serving): the queue watch (and its periodic full list) brings every change at once, so this
        # is only the safety net. At 500 sessions a read every 30 s was 17 GET/s; every 300 s it is 1.7.
        super().__init__(
            dataclasses.replace(config, poll_interval=config.session_check_interval),
            session_id=claim.session_id,
            acceptor_id=acceptor_id,
            metrics=metrics,
            fleet=fleet,
            claim=claim,
            slot=slot,
        )
        self.config = config
        self.driver = driver
        #: The driver's status board, when its status source runs (None: read each machine directly).
        self.board = board
        self.spec = session_spec(claim, acceptor_id)
        self.kind = claim.spec.kind or SessionKind.NEW
        self.machine: Optional[Machine] = adopt
        self.adopted = adopt is not None
        self.on_started = on_started
        self.on_served = on_served
        self.served_after = served_after
        #: The worker in the machine has been seen running (at least once).
        self.started_once = False
        #: The session has been served since it was claimed here (:meth:`serving`), at least once.
        self.served_once = False
        #: The worker is running now, as of the last status read.
        self.running_now = False
        #: Since when (monotonic) the worker has been seen running without a break (None: it is not).
        self.running_since: Optional[float] = None
        self.claimed_at = time.monotonic()
        #: Since when (monotonic) the session has been waiting for its worker: its claim, then each start.
        self.booting_since = self.claimed_at
        #: The queue said ``running`` already in the claim answer: ``served`` cannot be told from it.
        self.running_at_claim = claim.status.session_status == SessionStatus.RUNNING
        self.phases: dict[str, float] = {}
        self._torn_down = False

    @property
    def log_extra(self) -> dict[str, object]:
        return dict(self._extra)

    def _phase(self, name: str) -> None:
        self.phases.setdefault(name, time.monotonic() - self.claimed_at)

    @property
    def served(self) -> bool:
        """The session is being served: its queue entry says ``running`` (the remote connected to the
        gateway). A session that was ``running`` already when claimed (its earlier worker died, or an
        orchestrator restarted) cannot tell, and counts as served once its worker runs."""
        if self.running_at_claim:
            return self.running_now
        latest = self.latest
        return latest is not None and latest.status.session_status == SessionStatus.RUNNING

    def not_up_for(self) -> float:
        """Seconds the session has waited for its worker to run (0 while it runs)."""
        return 0.0 if self.running_now else time.monotonic() - self.booting_since

    def running_for(self) -> Optional[float]:
        """Seconds the worker has been seen running without a break (None: it is not running)."""
        return None if self.running_since is None else time.monotonic() - self.running_since

    def served_in(self) -> Optional[float]:
        """Seconds until a session ``running`` when claimed counts as served if its worker keeps running
        (None: not such a session, served already, or its worker is not running)."""
        running_for = self.running_for()
        if not self.running_at_claim or self.served_once or running_for is None:
            return None
        return self.served_after - running_for

    def note_served(self) -> None:
        """Mark the session served the first time it is (:func:`~.plan.session_served`), and say so once."""
        if self.served_once or not session_served(
            self.latest,
            acceptor_id=self.acceptor_id,
            running_at_claim=self.running_at_claim,
            running_for=self.running_for(),
            served_after=self.served_after,
        ):
            return
        self.served_once = True
        self._phase("served")
        if self.on_served is not None:
            self.on_served(self)

    def seen(self, entry: QueueEntry) -> None:
        """A fresher queue entry may show the session served."""
        self.note_served()

    def worker_running(self) -> None:
        self.running_now = True
        if self.running_since is None:
            self.running_since = time.monotonic()
        if not self.started_once:
            self.started_once = True
            self._phase("started")
            if self.on_started is not None:
                self.on_started(self)

    # --- the hooks -----------------------------------------------------------------------------------

    async def prepare(self) -> Optional[SessionResult]:
        if self.machine is not None:
            log.info(
                "adopting machine %s", self.machine.name, extra={**self._extra, "machine": self.machine.name}
            )
            return None
        try:
            self.machine = await asyncio.wait_for(
                self.driver.provision(self.spec), timeout=self.config.provision_timeout
            )
        except asyncio.TimeoutError:
            return self._infrastructure(f"provisioning took longer than {self.config.provision_timeout:g}s")
        except DriverError as exc:
            return self._infrastructure(
                f"provisioning failed: {exc}", reason=exc.reason or "provision-failed"
            )
        self._phase("provisioned")
        log.info(
            "provisioned machine %s", self.machine.name, extra={**self._extra, "machine": self.machine.name}
        )
        if self.kind is SessionKind.RESUME and self.config.resume_policy is ResumePolicy.SNAPSHOT:
            return await self._restore()
        return None

    def _infrastructure(self, detail: str, reason: str = "") -> SessionResult:
        """A failure of the machine, not of the session (counted by the orchestrator when it ends)."""
        return SessionResult(self.session_id, FAILED, detail, infrastructure=True, reason=reason)

    def _log_result(self, result: SessionResult) -> None:
        """One progress line per session: how it ended, and how long each step took."""
        steps = ", ".join(f"{name} after {seconds:.1f}s" for name, seconds in self.phases.items())
        took = time.monotonic() - self.claimed_at
        kind = (
            "infrastructure" if result.infrastructure else ("session" if result.outcome == FAILED else None)
        )
        level = logging.WARNING if result.outcome == FAILED else logging.INFO
        log.log(
            level,
            "session %s %s after %.1fs%s: %s%s",
            self.session_id,
            result.outcome,
            took,
            f" ({steps})" if steps else "",
            result.detail,
            " [infrastructure error]" if result.infrastructure else "",
            extra={**self._extra, **({"error_kind": kind} if kind else {})},
        )

    async def _restore(self) -> Optional[SessionResult]:
        assert self.machine is not None
        try:
            kept = [
                s
                for s in await self.driver.list_snapshots(self.acceptor_id, self.spec.outpost_id)
                if s.session_id == self.session_id
            ]
        except DriverError as exc:
            return self._infrastructure(f"listing snapshots failed: {exc}")
        if not kept:
            log.info("no snapshot kept for this resume; starting fresh", extra=self._extra)
            return None
        snapshot: Snapshot = max(kept, key=lambda s: s.created_at)
        try:
            await self.driver.restore(self.machine, snapshot)
        except DriverError as exc:  # the snapshot stays: a later attempt may restore it
            return self._infrastructure(f"restoring snapshot {snapshot.ref} failed: {exc}")
        log.info("restored snapshot %s", snapshot.ref, extra=self._extra)
        return None

    def _launch_spec(self, token: str, gateway_url: str) -> WorkerLaunch:
        return WorkerLaunch(
            session_id=self.session_id,
            connect_token=token,
            gateway_url=gateway_url,
            remote_binary_sha=self.spec.remote_binary_sha or self.config.remote_binary_sha,
            static_base_url=self.config.static_base_url,
            cache_dir=self.config.cache_dir,
            log_format=self.config.log_format,
            network_policy=self.spec.network_policy,
        )

    async def launch(self, token: str, gateway_url: str) -> MachineRun:
        assert self.machine is not None
        previous = self.run if isinstance(self.run, MachineRun) else None
        if self.adopted and previous is None:  # the worker a previous run started is still there
            return MachineRun(self, base_restarts=await self._restarts())
        if previous is not None and previous.restarted_in_place:
            return MachineRun(self, base_restarts=previous.last.restarts if previous.last else 0)
        launched_at = time.monotonic()
        try:
            await self.driver.start(self.machine, self._launch_spec(token, gateway_url))
        except DriverError as exc:
            why = f"starting the worker in machine {self.machine.name} failed: {exc}"
            raise LaunchError(why, reason=exc.reason or "start-failed") from exc
        self.running_now = False
        self.running_since = None
        self.booting_since = time.monotonic()
        return MachineRun(
            self, base_restarts=await self._restarts(since=launched_at), launched_at=launched_at
        )

    async def _restarts(self, since: float = 0.0) -> int:
        if not self.driver.restarts_in_place:
            return 0
        assert self.machine is not None
        row = self.board.row(self.machine.name, since=since) if self.board is not None else None
        if row is not None:
            return row.status.restarts
        try:
            return (await self.driver.status(self.machine)).restarts
        except DriverError:
            return 0

    async def finish(self, result: SessionResult) -> None:
        if self.machine is None:
            return
        suspended = result.session_status is SessionStatus.SUSPENDED
        if suspended and self.config.resume_policy is ResumePolicy.SNAPSHOT:
            try:
                snapshot = await self.driver.snapshot(self.machine)
            except DriverError as exc:
                self.metrics.inc("infrastructure_errors")
                log.error(
                    "snapshot of machine %s failed (%s); keeping the machine so nothing is lost",
                    self.machine.name,
                    exc,
                    extra={**self._extra, "error_kind": "infrastructure"},
                )
                return
            log.info("kept snapshot %s for the resume", snapshot.ref, extra=self._extra)
        await self.teardown()

    def final_exit(self, code: int) -> Optional[SessionResult]:
        """The worker in the machine cannot enforce the session's network policy (its exit 9): no restart
        can change that, so the claim goes back at once, for a machine that can (docs/network-policy.md)."""
        if code != ExitCode.NETWORK_POLICY:
            return None
        self.metrics.inc("network_policy_refusals")
        where = self.machine.name if self.machine is not None else "its machine"
        detail = (
            f"the worker on {where} cannot enforce the session's network policy (exit {code}); "
            "releasing the claim without restarts"
        )
        return SessionResult(self.session_id, FAILED, detail, refused_policy=True)

    async def teardown(self) -> None:
        if self.machine is None or self._torn_down:
            return
        try:
            await self.driver.teardown(self.machine)
        except DriverError as exc:  # the sweep collects it later
            self.metrics.inc("infrastructure_errors")
            log.error("tearing down machine %s failed: %s", self.machine.name, exc, extra=self._extra)
            return
        self._torn_down = True
        self.running_now = False
        self.running_since = None
        if self.board is not None:
            self.board.forget([self.machine.name])
        log.info(
            "tore down machine %s", self.machine.name, extra={**self._extra, "machine": self.machine.name}
        )
