"""One outpost an orchestrator process serves: its claim loop, its sessions, its sweep and its metrics.

An orchestrator serves every ``--outpost`` it is given (docs/orchestrator.md, "Several outposts"). Each
one is an :class:`OutpostRunner` with what is its own:

* the :class:`~devin_outposts.core.pool.SessionPool` of its sessions, sized by its own cap
  (``--outpost NAME=CAP``, else ``--max-concurrent``) and joined to the process's
  :class:`~devin_outposts.core.pool.SharedCap` (``--max-concurrent``), so that neither cap is passed;
* the :class:`~devin_outposts.core.claiming.ClaimLoop` with its
  :class:`~devin_outposts.orchestrator.queue.MachineHost`: the outpost resolved, its restart recovery
  (``phase=claimed&acceptor_id=<mine>`` on this outpost), its own queue watch;
* the :class:`~devin_outposts.orchestrator.sweep.Sweeper` over what the driver made for this outpost;
* its :class:`~devin_outposts.core.metrics.Metrics`, labelled ``outpost``, and its ``/healthz`` state.

What the process has once stays with the :class:`~devin_outposts.orchestrator.runner.Orchestrator`:
the state directory's lock, the acceptor id, the driver (and its Lease), the ``/metrics`` server and the
status board every outpost's sessions read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Optional

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetAuthError, FleetError
from devin_outposts.core.claiming import ClaimLoop, health_report
from devin_outposts.core.exits import ExitCode, ProgramExit
from devin_outposts.core.metrics import HealthReport
from devin_outposts.core.pool import SessionPool, SharedCap
from devin_outposts.orchestrator.drivers.base import Driver, Machine
from devin_outposts.orchestrator.drivers.status_board import StatusBoard
from devin_outposts.orchestrator.machine import MachineSession
from devin_outposts.orchestrator.metrics import outpost_metrics
from devin_outposts.orchestrator.options import OrchestratorConfig, OutpostSpec
from devin_outposts.orchestrator.queue import MachineHost, describe_error, detach_sessions
from devin_outposts.orchestrator.sweep import Sweeper

log = logging.getLogger(__name__)

AUTH_HINT = "(check DEVIN_OUTPOSTS_TOKEN and its scopes)"
#: The pool's drain timeout: never reached, since a stopping orchestrator detaches its sessions.
DETACH_DRAIN = 3600.0


class OutpostRunner:
    """Serves one outpost in an orchestrator process (see the module's docstring)."""

    def __init__(
        self, config: OrchestratorConfig, spec: OutpostSpec, *, shared: SharedCap, named: bool = False
    ) -> None:
        self.spec = spec
        #: The process's config narrowed to this outpost: its name, and its cap as ``max_concurrent``.
        self.config = config.for_outpost(spec)
        self.metrics = outpost_metrics(spec.outpost)
        self.metrics.set("max_concurrent", self.config.max_concurrent)
        self.pool = SessionPool(
            self.config.max_concurrent, self.metrics, drain_timeout=DETACH_DRAIN, shared=shared
        )
        #: Errors that end the run name the outpost (when the process serves several).
        self._prefix = f"outpost {spec.outpost}: " if named else ""
        self.acceptor_id = config.acceptor_id or ""
        self.driver: Optional[Driver] = None
        self.client: Optional[FleetClient] = None
        self.host: Optional[MachineHost] = None
        self.queue: Optional[ClaimLoop] = None
        self.sweeper: Optional[Sweeper] = None

    # --- what the sweep, /healthz and the orchestrator read ----------------------------------------------

    @property
    def following(self) -> Optional[ClaimLoop]:
        return self.queue

    @property
    def outpost_id(self) -> Optional[str]:
        """The outpost's id, once resolved."""
        return self.host.outpost_id if self.host is not None else None

    @property
    def adoptable(self) -> Mapping[str, Machine]:
        """Machines found at start-up, by session, until recovery has taken back its claims."""
        return self.host.adoptable if self.host is not None else {}

    @property
    def sessions(self) -> list[MachineSession]:
        return [r.server for r in self.pool.running.values() if isinstance(r.server, MachineSession)]

    def health(self) -> HealthReport:
        return health_report(self.pool, self.queue, ready=self.queue is not None and self.queue.ready)

    # --- the run ---------------------------------------------------------------------------------------

    def stop(self) -> None:
        """No more claims; detach every running session (machines and claims stay)."""
        detach_sessions(self.pool)
        if self.queue is not None:
            self.queue.stop_feed()

    def refuse(self, error: FleetAuthError) -> None:
        """Another outpost's claim loop saw the token refused: the same token serves this one, so stop
        as that one does (running sessions stopped and released, as far as the API still lets us)."""
        self.pool.fail(error)
        if self.queue is not None:
            self.queue.stop_feed()

    async def run(
        self, *, driver: Driver, client: FleetClient, acceptor_id: str, board: Optional[StatusBoard]
    ) -> None:
        """Serve the outpost until drained; an error that ends it is a :class:`ProgramExit`."""
        self.driver, self.client, self.acceptor_id = driver, client, acceptor_id
        self.host = MachineHost(
            self.config,
            driver=driver,
            client=client,
            pool=self.pool,
            metrics=self.metrics,
            acceptor_id=acceptor_id,
            board=board,
        )
        self.queue = ClaimLoop(self.config, client, self.pool, self.metrics, acceptor_id, self.host)
        self.sweeper = Sweeper(self)
        sweep_task = asyncio.ensure_future(self.sweeper.run())
        if self.pool.draining:  # stopped before the claim loop existed
            self.queue.stop_feed()
        try:
            await self.queue.run()
        except FleetAuthError as exc:
            raise ProgramExit(ExitCode.AUTH, f"{self._prefix}{exc} {AUTH_HINT}") from exc
        except FleetError as exc:
            raise ProgramExit(ExitCode.ERROR, f"{self._prefix}{exc}") from exc
        except ProgramExit as exc:
            if self._prefix:
                raise ProgramExit(exc.code, f"{self._prefix}{exc}") from exc
            raise
        except Exception as exc:  # a bug: exit non-zero with one line, never hang
            log.debug("the claim loop stopped", exc_info=True)
            raise ProgramExit(
                ExitCode.ERROR,
                f"{self._prefix}the claim loop stopped on an unexpected error ({describe_error(exc)}); "
                "running sessions keep their machines and claims for the next start",
            ) from exc
        finally:
            sweep_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sweep_task
