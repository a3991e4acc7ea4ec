"""The orchestrator: claim first, then a fresh machine per session, through one driver.

:class:`Orchestrator` runs the core claim loop with machines instead of local remotes
(docs/orchestrator.md):

1. start-up: the state dir (private) and its lock (two orchestrators on one state dir never both act;
   the ``kubernetes`` driver adds a Lease for replicas on different nodes), the acceptor id (generated
   once and kept there), the driver (its options checked, its tool or cluster reached);
2. the outpost is resolved and its platform checked against the driver's machines;
3. recovery: the sessions this acceptor holds (``phase=claimed&acceptor_id=<mine>``) are taken back by
   re-claiming, each with the machine the driver finds for it adopted as it is; sessions no slot can hold
   are released, and machines nobody holds any more are left to the first sweep;
4. the queue is followed and claimed oldest first up to ``--max-concurrent``
   (:class:`~devin_outposts.core.claiming.ClaimLoop`); its host,
   :class:`~devin_outposts.orchestrator.queue.MachineHost`, makes each claim a
   :class:`~devin_outposts.orchestrator.machine.MachineSession` in the
   :class:`~devin_outposts.core.pool.SessionPool`;
5. every ``--gc-interval`` seconds a sweep (:mod:`devin_outposts.orchestrator.sweep`) removes machines
   no session of ours runs on, expired or finished snapshots and orphaned secrets, and warns when every
   slot is taken but no worker is running;
6. SIGTERM/SIGINT: no more claims; running sessions keep their machines and claims (they are
   *detached*) and the orchestrator exits; the next start adopts them. A second signal is the same.

Exit codes are the worker's (:class:`~devin_outposts.core.exits.ExitCode`): 2 bad options, 3 token
refused, 4 outpost not found, 6 platform mismatch, 8 state dir locked by another orchestrator, 1 anything
else (a driver that cannot start).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Mapping
from typing import Callable, Optional

from devin_outposts.api.client import FleetClient, tls_context
from devin_outposts.api.errors import FleetAuthError, FleetError
from devin_outposts.core import platform
from devin_outposts.core.claiming import ClaimLoop, health_report
from devin_outposts.core.exits import ExitCode, ProgramExit
from devin_outposts.core.identity import FileLock, IdentityError, LockedError, load_or_create_acceptor_id
from devin_outposts.core.logs import register_secret
from devin_outposts.core.metrics import HealthReport, MetricsServer, serve_metrics
from devin_outposts.core.paths import SharedDirectoryError, make_private_dir
from devin_outposts.core.pool import SessionPool
from devin_outposts.core.sessions import SessionResult
from devin_outposts.orchestrator.drivers import driver_class
from devin_outposts.orchestrator.drivers.base import Driver, DriverContext, DriverError, Machine
from devin_outposts.orchestrator.drivers.status_board import StatusBoard, StatusSource
from devin_outposts.orchestrator.machine import MachineSession
from devin_outposts.orchestrator.metrics import orchestrator_metrics
from devin_outposts.orchestrator.options import MachineStatus, OrchestratorConfig
from devin_outposts.orchestrator.queue import MachineHost, describe_error, detach_sessions
from devin_outposts.orchestrator.sweep import Sweeper

log = logging.getLogger(__name__)

LOCK_FILE = "orchestrator.lock"
AUTH_HINT = "(check DEVIN_OUTPOSTS_TOKEN and its scopes)"
#: The pool's drain timeout: never reached, since a stopping orchestrator detaches its sessions.
DETACH_DRAIN = 3600.0


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
        self.metrics = orchestrator_metrics()
        self.metrics.set("max_concurrent", config.max_concurrent)
        self.pool = SessionPool(config.max_concurrent, self.metrics, drain_timeout=DETACH_DRAIN)
        self.acceptor_id = config.acceptor_id or ""
        self.host: Optional[MachineHost] = None
        self.queue: Optional[ClaimLoop] = None
        self.client: Optional[FleetClient] = None
        self.sweeper: Optional[Sweeper] = None
        #: Every machine's latest status, kept by the driver's status source (``--machine-status watch``).
        self.board = StatusBoard()
        #: The driver's leader election was lost: the run ends non-zero (a supervisor restarts it).
        self.lost_lead = False
        self._lead_watch: Optional[asyncio.Task[None]] = None
        self._ssl: Optional[ssl.SSLContext] = None

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = tls_context()
        return self._ssl

    # --- what /healthz, the tests and the benchmark read ----------------------------------------------

    @property
    def following(self) -> Optional[ClaimLoop]:
        return self.queue

    @property
    def outpost_id(self) -> Optional[str]:
        """The outpost served, once resolved."""
        return self.host.outpost_id if self.host is not None else None

    @property
    def adoptable(self) -> Mapping[str, Machine]:
        """Machines found at start-up, by session, until recovery has taken back its claims."""
        return self.host.adoptable if self.host is not None else {}

    @property
    def results(self) -> list[SessionResult]:
        """How each session that ended here ended, in order."""
        return self.pool.results

    @property
    def sessions(self) -> list[MachineSession]:
        return [r.server for r in self.pool.running.values() if isinstance(r.server, MachineSession)]

    def health(self) -> HealthReport:
        return health_report(self.pool, self.queue, ready=self.queue is not None and self.queue.ready)

    # --- signals -------------------------------------------------------------------------------------

    def on_signal(self, signum: int) -> None:
        name = platform.current().signal_name(signum)
        log.info(
            "%s: no new claims; %d running session(s) keep their machines for the next start",
            name,
            len(self.pool.running),
        )
        self.stop()

    def stop(self) -> None:
        """No more claims; detach every running session (machines and claims stay)."""
        detach_sessions(self.pool)
        if self.queue is not None:
            self.queue.stop_feed()

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
        sweep_task: Optional[asyncio.Task[None]] = None
        status_task: Optional[asyncio.Task[None]] = None
        try:
            self.driver = self._make_driver()
            try:
                await self.driver.check()
            except DriverError as exc:
                why = f"the {self.driver.name} driver cannot start: {exc}"
                raise ProgramExit(ExitCode.ERROR, why) from exc
            self.metrics.labels = {}
            metrics_server = await serve_metrics(self.metrics, self.health, self.config.metrics_addr)
            platform.current().install_stop_handler(loop, self.on_signal)
            self.client = self._client_factory(self.config)
            async with contextlib.AsyncExitStack() as stack:
                if not await self._lead(stack):
                    return ExitCode.OK  # stopped while waiting to lead
                status_task = self._follow_machines()
                self.host = MachineHost(
                    self.config,
                    driver=self.driver,
                    client=self.client,
                    pool=self.pool,
                    metrics=self.metrics,
                    acceptor_id=self.acceptor_id,
                    board=self.board,
                )
                self.queue = ClaimLoop(
                    self.config, self.client, self.pool, self.metrics, self.acceptor_id, self.host
                )
                self.sweeper = Sweeper(self)
                sweep_task = asyncio.ensure_future(self.sweeper.run())
                if self.pool.draining:
                    self.queue.stop_feed()
                try:
                    await self.queue.run()
                except FleetAuthError as exc:
                    raise ProgramExit(ExitCode.AUTH, f"{exc} {AUTH_HINT}") from exc
                except FleetError as exc:
                    raise ProgramExit(ExitCode.ERROR, str(exc)) from exc
                except ProgramExit:
                    raise
                except Exception as exc:  # a bug: exit non-zero with one line, never hang
                    log.debug("the claim loop stopped", exc_info=True)
                    raise ProgramExit(
                        ExitCode.ERROR,
                        f"the claim loop stopped on an unexpected error ({describe_error(exc)}); running "
                        "sessions keep their machines and claims for the next start",
                    ) from exc
            if self.pool.fatal is not None:
                raise ProgramExit(ExitCode.AUTH, f"{self.pool.fatal} {AUTH_HINT}")
            if self.lost_lead:
                why = "lost the leader election; sessions were left to the new leader"
                raise ProgramExit(ExitCode.ERROR, why)
            return ExitCode.OK
        finally:
            platform.current().remove_stop_handler(loop)
            for task in (sweep_task, status_task):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if metrics_server is not None:
                await metrics_server.close()
            if self.client is not None:
                await self.client.aclose()
            if self.driver is not None:
                with contextlib.suppress(Exception):
                    await self.driver.aclose()
            lock.release()

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
            if self.pool.draining:
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
