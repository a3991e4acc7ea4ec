"""The orchestrator: claim first, then a fresh machine per session, through one driver.

:class:`Orchestrator` runs the core claim loop with machines instead of local remotes
(docs/orchestrator.md):

1. start-up: the state dir (private) and its lock (two orchestrators on one state dir never both act;
   the ``kubernetes`` driver adds a Lease for replicas on different nodes), the acceptor id (generated
   once and kept there), the driver (its options checked, its tool or cluster reached);
2. one :class:`~devin_outposts.orchestrator.outpost.OutpostRunner` per ``--outpost``, all at once, each
   with its own session pool under its own cap, and all of them under ``--max-concurrent``
   (:class:`~devin_outposts.core.pool.SharedCap`); the driver's one status source feeds them all. For
   each outpost:
3. the outpost is resolved and its platform checked against the driver's machines;
4. recovery: the sessions this acceptor holds there (``phase=claimed&acceptor_id=<mine>``) are taken back
   by re-claiming, each with the machine the driver finds for it adopted as it is; sessions no slot can
   hold are released, and machines nobody holds any more are left to the first sweep;
5. the queue is followed and claimed oldest first up to the caps
   (:class:`~devin_outposts.core.claiming.ClaimLoop`); its host,
   :class:`~devin_outposts.orchestrator.queue.MachineHost`, makes each claim a
   :class:`~devin_outposts.orchestrator.machine.MachineSession` in the outpost's
   :class:`~devin_outposts.core.pool.SessionPool`;
6. every ``--gc-interval`` seconds a sweep (:mod:`devin_outposts.orchestrator.sweep`) removes machines
   no session of ours runs on, expired or finished snapshots and orphaned secrets, and warns when every
   slot is taken but no worker is running;
7. SIGTERM/SIGINT: no more claims (a claim or a list in flight is cancelled); running sessions keep their
   machines and claims (they are *detached*) and the orchestrator exits; the next start adopts them. A
   second signal is the same, and also cuts every request to the fleet API still in flight (a session's
   status read, a claim given back) to a few seconds, so the orchestrator ends however the API behaves.

Exit codes are the worker's (:class:`~devin_outposts.core.exits.ExitCode`): 2 bad options, 3 token
refused, 4 outpost not found, 6 platform mismatch, 8 state dir locked by another orchestrator, 1 anything
else (a driver that cannot start). One outpost's loop that ends ends the others' (a refused token, an
error); ``/healthz`` answers the worst outpost's state and lists each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Mapping
from typing import Callable, Optional

from devin_outposts.api.client import FleetClient, tls_context
from devin_outposts.core import platform
from devin_outposts.core.exits import ExitCode, ProgramExit
from devin_outposts.core.identity import FileLock, IdentityError, LockedError, load_or_create_acceptor_id
from devin_outposts.core.logs import register_secret
from devin_outposts.core.metrics import Health, HealthReport, Metrics, MetricsServer, serve_metrics
from devin_outposts.core.paths import SharedDirectoryError, make_private_dir
from devin_outposts.core.pool import SharedCap, requests_after_stop
from devin_outposts.core.sessions import SessionResult
from devin_outposts.orchestrator.drivers import driver_class
from devin_outposts.orchestrator.drivers.base import Driver, DriverContext, DriverError, Machine
from devin_outposts.orchestrator.drivers.status_board import StatusBoard, StatusSource
from devin_outposts.orchestrator.machine import MachineSession
from devin_outposts.orchestrator.metrics import OutpostsMetrics
from devin_outposts.orchestrator.options import MachineStatus, OrchestratorConfig
from devin_outposts.orchestrator.outpost import AUTH_HINT, OutpostRunner
from devin_outposts.orchestrator.queue import describe_error

log = logging.getLogger(__name__)

LOCK_FILE = "orchestrator.lock"
#: How bad each ``/healthz`` state is, for the worst of several outposts'; a state not named here (one
#: added later) ranks by whether it is healthy.
_BADNESS = {
    Health.OK: 0,
    Health.STARTING: 1,
    Health.BACKING_OFF: 2,
    Health.DRAINING: 3,
    Health.FEED_STOPPED: 4,
    Health.UNAUTHORIZED: 5,
}


def _badness(state: Health) -> tuple[bool, int]:
    return (not state.healthy, _BADNESS.get(state, 3))


class Orchestrator:
    def __init__(
        self,
        config: OrchestratorConfig,
        *,
        client_factory: Optional[Callable[[OrchestratorConfig], FleetClient]] = None,
        driver: Optional[Driver] = None,
    ) -> None:
        self.config = config
        self._client_factory = client_factory or (
            lambda c: FleetClient(c.api_url, c.token, verify=self._tls())
        )
        self.driver = driver
        if not config.outposts:  # options refuse it; a config made in code must name one too
            raise ProgramExit(ExitCode.USAGE, "--outpost is required (or DEVIN_ORCHESTRATOR_OUTPOST)")
        #: ``--max-concurrent``: every outpost's sessions together.
        self.cap = SharedCap(config.max_concurrent)
        several = len(config.outposts) > 1
        #: One per ``--outpost``, in the order given.
        self.outposts = [
            OutpostRunner(config, spec, shared=self.cap, named=several) for spec in config.outposts
        ]
        self.acceptor_id = config.acceptor_id or ""
        self.client: Optional[FleetClient] = None
        #: Every machine's latest status, kept by the driver's status source (``--machine-status watch``).
        self.board = StatusBoard()
        #: The driver's leader election was lost: the run ends non-zero (a supervisor restarts it).
        self.lost_lead = False
        #: Stopped (a signal, the lead lost): no more claims, even from an outpost not started yet.
        self.stopping = False
        #: A stop signal came (a second one cuts the requests to the fleet API short).
        self.signalled = False
        self._lead_watch: Optional[asyncio.Task[None]] = None
        self._ssl: Optional[ssl.SSLContext] = None

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = tls_context()
        return self._ssl

    # --- what /healthz, the tests and the benchmark read ----------------------------------------------

    @property
    def metrics(self) -> Metrics:
        """The first outpost's metrics (the only one's, usually); ``/metrics`` shows every outpost's."""
        return self.outposts[0].metrics

    @property
    def outpost_id(self) -> Optional[str]:
        """The first outpost's id, once resolved."""
        return self.outposts[0].outpost_id

    @property
    def adoptable(self) -> Mapping[str, Machine]:
        """Machines found at start-up, by session, until recovery has taken back its claims."""
        return {sid: m for outpost in self.outposts for sid, m in outpost.adoptable.items()}

    @property
    def results(self) -> list[SessionResult]:
        """How each session that ended here ended, in order (outpost by outpost)."""
        return [result for outpost in self.outposts for result in outpost.pool.results]

    @property
    def sessions(self) -> list[MachineSession]:
        return [session for outpost in self.outposts for session in outpost.sessions]

    def health(self) -> HealthReport:
        """The worst of the outposts' states (an outpost whose feed stopped makes the process unhealthy).
        One outpost: its own report, as before. Several: each one's too, by the outpost as configured."""
        reports = [outpost.health() for outpost in self.outposts]
        worst = max(reports, key=lambda report: _badness(report.state))
        if len(reports) == 1:
            return worst
        each = {o.spec.outpost: {"status": r.state.value, **r.detail} for o, r in zip(self.outposts, reports)}
        return HealthReport(worst.state, {"outposts": each})

    # --- signals -------------------------------------------------------------------------------------

    def on_signal(self, signum: int) -> None:
        name = platform.current().signal_name(signum)
        if self.signalled and self.client is not None:
            within = requests_after_stop(self.config.stop_grace)
            log.warning(
                "%s again: requests to the fleet API get %.0fs more, then the orchestrator exits",
                name,
                within,
            )
            self.client.cut_requests(within)
        else:
            log.info(
                "%s: no new claims; %d running session(s) keep their machines for the next start",
                name,
                len(self.sessions),
            )
        self.signalled = True
        self.stop()

    def stop(self) -> None:
        """No more claims; detach every running session (machines and claims stay)."""
        self.stopping = True
        for outpost in self.outposts:
            outpost.stop()

    # --- the run -------------------------------------------------------------------------------------

    def _make_driver(self) -> Driver:
        if self.driver is not None:
            return self.driver
        try:
            cls = driver_class(self.config.driver)
            context = DriverContext(
                state_dir=self.config.state_dir,
                worker_command=("devin-outposts",),
                boot_timeout=self.config.boot_timeout,
            )
            return cls.from_options(context, self.config.driver_options)
        except DriverError as exc:
            raise ProgramExit(ExitCode.USAGE, str(exc)) from exc

    def _lock(self) -> FileLock:
        try:
            make_private_dir(self.config.state_dir)
            lock = FileLock(self.config.state_dir / LOCK_FILE, "the orchestrator state directory")
            lock.acquire()
            if not self.acceptor_id:
                self.acceptor_id = load_or_create_acceptor_id(self.config.state_dir)
        except LockedError as exc:
            raise ProgramExit(ExitCode.LOCKED, str(exc)) from exc
        except (IdentityError, SharedDirectoryError) as exc:
            raise ProgramExit(ExitCode.USAGE, str(exc)) from exc
        except OSError as exc:
            raise ProgramExit(ExitCode.ERROR, f"Could not prepare {self.config.state_dir}: {exc}") from exc
        return lock

    async def run(self) -> int:
        register_secret(self.config.token)
        loop = asyncio.get_running_loop()
        lock = self._lock()
        metrics_server: Optional[MetricsServer] = None
        status_task: Optional[asyncio.Task[None]] = None
        try:
            self.driver = self._make_driver()
            try:
                await self.driver.check()
            except DriverError as exc:
                why = f"the {self.driver.name} driver cannot start: {exc}"
                raise ProgramExit(ExitCode.ERROR, why) from exc
            metrics_server = await serve_metrics(
                OutpostsMetrics([outpost.metrics for outpost in self.outposts]),
                self.health,
                self.config.metrics_addr,
            )
            platform.current().install_stop_handler(loop, self.on_signal)
            self.client = self._client_factory(self.config)
            async with contextlib.AsyncExitStack() as stack:
                if not await self._lead(stack):
                    return ExitCode.OK  # stopped while waiting to lead
                status_task = self._follow_machines()
                await self._serve_outposts()
            fatal = next((o.pool.fatal for o in self.outposts if o.pool.fatal is not None), None)
            if fatal is not None:
                raise ProgramExit(ExitCode.AUTH, f"{fatal} {AUTH_HINT}")
            if self.lost_lead:
                why = "lost the leader election; sessions were left to the new leader"
                raise ProgramExit(ExitCode.ERROR, why)
            return ExitCode.OK
        finally:
            platform.current().remove_stop_handler(loop)
            if status_task is not None:
                status_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await status_task
            if metrics_server is not None:
                await metrics_server.close()
            if self.client is not None:
                await self.client.aclose()
            if self.driver is not None:
                with contextlib.suppress(Exception):
                    await self.driver.aclose()
            lock.release()

    async def _serve_outposts(self) -> None:
        """Run every outpost's claim loop until all have ended. The first to end ends the others: a stop
        detaches every session, a refused token (the same token serves them all) stops them as it stops
        its own, and an error ends the run, every session detached; the first error is raised."""
        assert self.driver is not None
        assert self.client is not None
        tasks = {
            asyncio.ensure_future(
                outpost.run(
                    driver=self.driver, client=self.client, acceptor_id=self.acceptor_id, board=self.board
                )
            ): outpost
            for outpost in self.outposts
        }
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            if pending:
                self._end_others(next(iter(done)), tasks)
                await asyncio.wait(pending)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        errors = [
            r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)
        ]
        if errors:
            raise errors[0]

    def _end_others(
        self, first: asyncio.Task[None], tasks: Mapping[asyncio.Task[None], OutpostRunner]
    ) -> None:
        fatal = tasks[first].pool.fatal
        for task, outpost in tasks.items():
            if task is first:
                continue
            if fatal is not None and not first.cancelled() and first.exception() is None:
                outpost.refuse(fatal)
            else:
                outpost.stop()

    def _follow_machines(self) -> Optional[asyncio.Task[None]]:
        """Start the driver's status source (``--machine-status watch``), or None: sessions then read
        their machines one by one."""
        assert self.driver is not None
        if self.config.machine_status is not MachineStatus.WATCH:
            return None
        source = self.driver.status_source(self.acceptor_id)
        if source is None:
            return None
        log.info("following every %s machine's status with one watch", self.driver.name)
        return asyncio.ensure_future(self._run_status_source(source))

    async def _run_status_source(self, source: StatusSource) -> None:
        """A source ends only when cancelled; one that fails all the same is one log line and a restart
        (sessions read their machines directly meanwhile: the board is out of sync)."""
        pause = 1.0
        while True:
            try:
                await source.run(self.board)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in a source must not stop the orchestrator
                log.warning("the machine status watch stopped (%s); restarting it", describe_error(exc))
                log.debug("the machine status watch stopped", exc_info=True)
            self.board.lost_sync()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 30.0)

    async def _lead(self, stack: contextlib.AsyncExitStack) -> bool:
        """Take the driver's lead when it elects one; False when stopped before leading."""
        assert self.driver is not None
        leadership = self.driver.leadership(self.acceptor_id)
        if leadership is None:
            return True
        log.info("waiting to lead acceptor id %s (another orchestrator may hold it)", self.acceptor_id)
        acquire = asyncio.ensure_future(stack.enter_async_context(leadership))
        while not acquire.done():
            if self.stopping:
                acquire.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await acquire
                return False
            await asyncio.wait({acquire}, timeout=0.5)
        acquire.result()  # a failure to reach the cluster ends the run here
        log.info("leading acceptor id %s", self.acceptor_id)
        self._lead_watch = asyncio.ensure_future(self._watch_lead(leadership.lost))
        stack.callback(self._lead_watch.cancel)
        return True

    async def _watch_lead(self, lost: asyncio.Event) -> None:
        await lost.wait()
        self.lost_lead = True
        log.error("lost the leader election: no more claims; running sessions are left to the new leader")
        self.stop()
