"""The worker: directories, identity, locks, signals, metrics, and the dispatch to one of three modes.

:class:`Worker` runs one of three modes (docs/fleet-api.md §7.1, §5.6 and §6.6), each of which drives the
one :class:`~devin_outposts.core.pool.SessionPool`:

* **queue** (the default, and ``--once``): :class:`~devin_outposts.core.claiming.ClaimLoop`, with a
  :class:`~devin_outposts.worker.session.WorkerHost` for what runs each claim, resolves the outpost,
  takes back the sessions this acceptor still holds, then follows the queue and claims whenever a slot is
  free; ``--once`` stops claiming after the first claim and exits with its result;
* **session** (``--session ID``): claim that one session (a renewal when we hold it already), serve it,
  exit;
* **direct** (``DEVIN_REMOTE_SESSION_TOKEN`` set): serve the session with the given token and gateway and
  never call the fleet API.

The first SIGTERM/SIGINT (Ctrl-Break on Windows) stops claiming (a claim or a list in flight is cancelled)
and gives running sessions ``--drain-timeout`` seconds to end on their own; then their remotes are stopped
and their claims released. A second signal stops them at once (still releasing), and cuts every request to
the fleet API to a few seconds (:func:`~devin_outposts.core.pool.requests_after_stop`), so the worker ends
within ``--stop-grace-secs`` however the API behaves. 401/403 end the worker with exit code 3 and one line;
other API errors back off with jitter.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Coroutine
from typing import Any, Callable, Optional, TypeVar

import httpx

from devin_outposts.api.client import FleetClient, tls_context
from devin_outposts.api.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.api.models import QueueEntry
from devin_outposts.core import platform
from devin_outposts.core.claiming import ClaimLoop, health
from devin_outposts.core.exits import ExitCode, ProgramExit
from devin_outposts.core.identity import (
    DATA_LOCK_FILE,
    WORKDIR_LOCK_FILE,
    FileLock,
    IdentityError,
    LockedError,
    load_or_create_acceptor_id,
)
from devin_outposts.core.logs import register_secret
from devin_outposts.core.metrics import Health, Metrics, MetricsServer, serve_metrics
from devin_outposts.core.outposts import check_platform, resolve_outpost
from devin_outposts.core.paths import SharedDirectoryError, make_private_dir
from devin_outposts.core.pool import SessionPool, requests_after_stop
from devin_outposts.core.processes import reap_stale_remote
from devin_outposts.core.retrying import Backoff, Stopped, retry_transient
from devin_outposts.core.sessions import release_claim
from devin_outposts.worker.binary import BinaryStore
from devin_outposts.worker.options import WorkerConfig
from devin_outposts.worker.session import INTERRUPTED, SERVED, SessionResult, SessionServer, WorkerHost

log = logging.getLogger(__name__)

T = TypeVar("T")
AUTH_HINT = "(check DEVIN_OUTPOSTS_TOKEN and its scopes)"


class Worker:
    def __init__(
        self,
        config: WorkerConfig,
        *,
        client_factory: Optional[Callable[[WorkerConfig], FleetClient]] = None,
        binaries: Optional[BinaryStore] = None,
    ) -> None:
        self.config = config
        self._client_factory = client_factory or (
            lambda c: FleetClient(c.api_url, c.token, verify=self._tls())
        )
        self._binaries = binaries
        self.metrics = Metrics()
        self.metrics.set("max_sessions", config.max_sessions)
        self.acceptor_id = config.acceptor_id or ""
        self.pool = SessionPool(config.max_sessions, self.metrics, drain_timeout=config.drain_timeout)
        self.signal_number: Optional[int] = None
        #: How the drain's log line says to stop at once (the Windows service host has its own way).
        self.stop_now_hint = "send it again to stop now"
        self.queue: Optional[ClaimLoop] = None
        self._serving_one = False
        self._ssl: Optional[ssl.SSLContext] = None
        #: The fleet client while the worker runs (a second signal cuts its requests short).
        self.client: Optional[FleetClient] = None

    # --- what the tests, /healthz and the benchmarks read ----------------------------------------------

    @property
    def ready(self) -> bool:
        return self._serving_one or (self.queue is not None and self.queue.ready)

    @property
    def fatal(self) -> Optional[FleetAuthError]:
        return self.pool.fatal

    @property
    def draining(self) -> bool:
        return self.pool.draining

    @property
    def results(self) -> list[SessionResult]:
        return self.pool.results

    def health(self) -> Health:
        return health(self.pool, self.queue, ready=self.ready)

    def _tls(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = tls_context()
        return self._ssl

    # --- entry point ---------------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until done; returns the exit code. Raises :class:`ProgramExit` for a one-line failure."""
        locks: list[FileLock] = []
        metrics_server: Optional[MetricsServer] = None
        client: Optional[FleetClient] = None
        binaries = self._binaries
        register_secret(self.config.token)
        register_secret(self.config.direct_token)
        loop = asyncio.get_running_loop()
        try:
            locks = await self._prepare()
            if binaries is None:
                http = httpx.AsyncClient(
                    timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=True, verify=self._tls()
                )
                binaries = BinaryStore(
                    self.config.cache_dir, self.config.static_base_url, http=http, owns_http=True
                )
            self.metrics.labels = {"acceptor_id": self.acceptor_id} if self.acceptor_id else {}
            metrics_server = await serve_metrics(self.metrics, self.health, self.config.metrics_addr)
            platform.current().install_stop_handler(loop, self.on_signal)
            if self.config.direct:
                return await self._run_direct(binaries)
            client = self.client = self._client_factory(self.config)
            try:
                if self.config.session_id:
                    return await self._run_session(client, binaries)
                return await self._run_queue(client, binaries)
            except FleetAuthError as exc:
                raise ProgramExit(ExitCode.AUTH, f"{exc} {AUTH_HINT}") from exc
            except FleetError as exc:  # an answer that retrying cannot change, e.g. 400/422
                raise ProgramExit(ExitCode.ERROR, str(exc)) from exc
        finally:
            platform.current().remove_stop_handler(loop)
            if metrics_server is not None:
                await metrics_server.close()
            if client is not None:
                await client.aclose()
            if binaries is not None and self._binaries is None:
                await binaries.aclose()
            for lock in reversed(locks):
                lock.release()

    async def _prepare(self) -> list[FileLock]:
        """The data dir (private), the locks, the acceptor id; orphaned remotes stopped."""
        locks: list[FileLock] = []
        try:
            # The data dir first, so that it is created private (or an existing one is checked)
            # before the lock file, the acceptor id or any session state goes into it.
            make_private_dir(self.config.data_dir)
            data_lock = FileLock(self.config.data_dir / DATA_LOCK_FILE, "the worker data directory")
            locks.append(data_lock.acquire())
            self.config.workdir.mkdir(parents=True, exist_ok=True)
            workdir_lock = FileLock(self.config.workdir / WORKDIR_LOCK_FILE, "the working directory")
            locks.append(workdir_lock.acquire())
            if not self.config.direct and not self.acceptor_id:
                self.acceptor_id = load_or_create_acceptor_id(self.config.data_dir)
            await asyncio.to_thread(self._reap_orphans)
        except (LockedError, IdentityError, SharedDirectoryError, OSError) as exc:
            for lock in reversed(locks):
                lock.release()
            if isinstance(exc, LockedError):
                raise ProgramExit(ExitCode.LOCKED, str(exc)) from exc
            if isinstance(exc, (IdentityError, SharedDirectoryError)):
                raise ProgramExit(ExitCode.USAGE, str(exc)) from exc
            raise ProgramExit(ExitCode.ERROR, f"Could not prepare the worker directories: {exc}") from exc
        return locks

    def _reap_orphans(self) -> None:
        """Stop every remote a killed predecessor left running on this data directory.

        We hold the data-dir lock, so no live worker owns them; a session we take back starts a fresh
        remote, and one we do not (finished, or lost meanwhile) must not keep running with its token.
        """
        sessions = self.config.sessions_dir
        if not sessions.is_dir():
            return
        for state_dir in sessions.iterdir():
            if state_dir.is_dir() and not state_dir.is_symlink() and reap_stale_remote(state_dir):
                log.warning("stopped an orphaned devin-remote in %s", state_dir)

    # --- signals -----------------------------------------------------------------------------------------

    def on_signal(self, signum: int) -> None:
        name = platform.current().signal_name(signum)
        if not self.pool.draining:
            self.signal_number = signum
            self.start_drain()
            log.info(
                "%s: no new claims; %d running session(s) get %.0fs to finish (%s)",
                name,
                len(self.pool.running),
                self.config.drain_timeout,
                self.stop_now_hint,
            )
        else:
            within = requests_after_stop(self.config.stop_grace)
            log.warning(
                "%s again: stopping all sessions now and releasing their claims (requests to the fleet API "
                "get %.0fs more)",
                name,
                within,
            )
            if self.client is not None:
                self.client.cut_requests(within)
            self.pool.stop_now()

    def start_drain(self) -> None:
        """Stop claiming; running sessions get the drain timeout."""
        self.pool.start_drain()
        if self.queue is not None:
            self.queue.stop_feed()

    # --- the modes -------------------------------------------------------------------------------------

    def _exit_for(self, result: SessionResult) -> int:
        if self.fatal is not None:
            raise ProgramExit(ExitCode.AUTH, f"{self.fatal} {AUTH_HINT}")
        if result.outcome == SERVED:
            return ExitCode.OK
        if result.outcome == INTERRUPTED:
            return self._interrupted_code()
        if result.refused_policy:  # the orchestrator that started us releases it at once, no restarts
            return ExitCode.NETWORK_POLICY
        return ExitCode.SESSION_FAILED

    def _interrupted_code(self) -> int:
        return 128 + (self.signal_number or 15)  # 15: SIGTERM, also where the OS has no such signal

    def server_for(
        self, claim: Optional[QueueEntry], slot: int, binaries: BinaryStore, client: Optional[FleetClient]
    ) -> SessionServer:
        session_id = claim.session_id if claim is not None else self.config.session_id
        assert session_id is not None
        return SessionServer(
            self.config,
            session_id=session_id,
            acceptor_id=self.acceptor_id,
            binaries=binaries,
            metrics=self.metrics,
            cwd=self.config.slot_dir(slot),
            fleet=client,
            claim=claim,
            slot=slot,
        )

    async def _serve_one(self, server: SessionServer) -> int:
        self.pool.start(server)
        self._serving_one = True
        await self.pool.drain()
        return self._exit_for(self.pool.results[-1])

    async def _run_queue(self, client: FleetClient, binaries: BinaryStore) -> int:
        host = WorkerHost(
            self.config,
            acceptor_id=self.acceptor_id,
            metrics=self.metrics,
            server_for=lambda claim, slot: self.server_for(claim, slot, binaries, client),
        )
        self.queue = ClaimLoop(self.config, client, self.pool, self.metrics, self.acceptor_id, host)
        if self.pool.draining:  # a signal came before the claim loop existed
            self.queue.stop_feed()
        await self.queue.run()
        if self.fatal is not None:
            raise ProgramExit(ExitCode.AUTH, f"{self.fatal} {AUTH_HINT}")
        if self.config.once and self.pool.results:
            return self._exit_for(self.pool.results[-1])
        return ExitCode.OK

    async def _run_direct(self, binaries: BinaryStore) -> int:
        assert self.config.session_id is not None
        log.info(
            "direct-serve mode: serving session %s without the queue API",
            self.config.session_id,
            extra={"session_id": self.config.session_id},
        )
        return await self._serve_one(self.server_for(None, 0, binaries, None))

    async def _run_session(self, client: FleetClient, binaries: BinaryStore) -> int:
        sid = self.config.session_id
        assert sid is not None
        try:
            claim = await self._claim_session(client, sid)
        except Stopped:
            log.info("stopped before session %s was claimed", sid, extra={"session_id": sid})
            return self._interrupted_code()
        if claim is None:
            return ExitCode.OK
        return await self._serve_one(self.server_for(claim, 0, binaries, client))

    async def _claim_session(self, client: FleetClient, sid: str) -> Optional[QueueEntry]:
        """Check and claim ``--session``: its claim, or None when it is already over (nothing to serve)."""

        def retrying(operation: Callable[[], Coroutine[Any, Any, T]]) -> Awaitable[T]:
            # Each step gets its own backoff: an outage at start-up is waited out, one line per try. A
            # signal cancels the step in flight (Stopped).
            backoff = Backoff(cap=self.config.backoff_max)
            extra = {"session_id": sid}
            pool = self.pool
            return retry_transient(
                lambda: pool.unless_draining(operation()), backoff=backoff, pause=pool.pause, extra=extra
            )

        try:
            entry = await retrying(lambda: client.get_devin(sid))
        except FleetNotFound as exc:
            raise ProgramExit(ExitCode.NOT_FOUND, str(exc)) from exc
        if self.config.outpost:
            wanted = self.config.outpost
            outpost = await retrying(lambda: resolve_outpost(client, wanted))
            if entry.metadata.outpost_id != outpost.outpost_id:
                raise ProgramExit(
                    ExitCode.NOT_FOUND,
                    f"session {sid} is queued on outpost {entry.metadata.outpost_id}, not on {wanted}",
                )
            check_platform(outpost, entry)
        else:
            outpost_id = entry.metadata.outpost_id
            check_platform(await retrying(lambda: client.find_outpost(outpost_id)), entry)
        if entry.is_finished and entry.status.acceptor_id != self.acceptor_id:
            log.info(
                "session %s is already %s; nothing to serve",
                sid,
                entry.status.session_status,
                extra={"session_id": sid},
            )
            return None
        try:
            claim = await retrying(lambda: client.claim(sid, self.acceptor_id))
        except Stopped:  # a claim cancelled by the signal, or whose answer was lost, may have been made
            await release_claim(client, sid, self.acceptor_id, {"session_id": sid})
            raise
        except FleetConflict as exc:
            raise ProgramExit(ExitCode.CONFLICT, f"{exc} (held by another acceptor)") from exc
        except FleetNotFound as exc:
            raise ProgramExit(ExitCode.NOT_FOUND, str(exc)) from exc
        self.metrics.inc("sessions_claimed")
        return claim
