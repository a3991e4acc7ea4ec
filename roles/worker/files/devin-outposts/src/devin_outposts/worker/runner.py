"""The worker's main loop: modes, slots, restart recovery, signals and exit codes.

:class:`Worker` runs one of three modes (contract sections 2.1, 3.5 and 4.3):

* **queue** (the default, and ``--once``): resolve the outpost, check its platform, take back the sessions
  this acceptor still holds (restart recovery), then follow the queue and claim the oldest claimable
  session whenever a slot is free; ``--once`` stops claiming after the first claim and exits with its
  result;
* **session** (``--session ID``): claim that one session (a renewal when we hold it already), serve it,
  exit;
* **direct** (``DEVIN_REMOTE_SESSION_TOKEN`` set): serve the session with the given token and gateway and
  never call the fleet API.

SIGTERM/SIGINT stop claiming and give running sessions ``--drain-timeout`` seconds to end on their own;
then their remotes are stopped and their claims released. A second signal stops them at once (still
releasing). 401/403 end the worker with exit code 3 and one line; other API errors back off with jitter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

import httpx

from devin_outposts.client import FleetClient
from devin_outposts.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.models import QueueEntry
from devin_outposts.worker.binary import BinaryStore
from devin_outposts.worker.claiming import QueueMode
from devin_outposts.worker.config import WorkerConfig
from devin_outposts.worker.exits import (
    EXIT_AUTH,
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_LOCKED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_SESSION_FAILED,
    EXIT_USAGE,
    WorkerExit,
)
from devin_outposts.worker.identity import (
    DATA_LOCK_FILE,
    WORKDIR_LOCK_FILE,
    FileLock,
    IdentityError,
    LockedError,
    load_or_create_acceptor_id,
)
from devin_outposts.worker.logs import register_secret
from devin_outposts.worker.metrics import Metrics, MetricsServer
from devin_outposts.worker.outposts import check_platform, resolve_outpost
from devin_outposts.worker.paths import SharedDirectoryError, make_private_dir
from devin_outposts.worker.queue import QueueFeed
from devin_outposts.worker.retrying import Backoff, Stopped, retry_transient
from devin_outposts.worker.session import FAILED, INTERRUPTED, LOST, SERVED, SessionResult, SessionServer
from devin_outposts.worker.spawn import reap_stale_remote

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds a session that failed on this worker is not offered to it again (times its failure count).
FAILED_SESSION_COOLDOWN = 60.0
HARD_STOP_GRACE = 0.5


@dataclass
class _Active:
    server: SessionServer
    task: asyncio.Task[SessionResult]
    slot: int


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
        self.active: dict[str, _Active] = {}
        #: Wakes the main loop (queue changes, finished sessions, signals). Made in :meth:`run`, on the loop
        #: that uses it: on Python 3.9 an Event binds to the loop current when it is created.
        self.kick: asyncio.Event
        self.draining = False
        self.hard_stop = False
        self.signal_number: Optional[int] = None
        self.fatal: Optional[FleetAuthError] = None
        self.feed: Optional[QueueFeed] = None
        self.feed_task: Optional[asyncio.Task[None]] = None
        self._failures: dict[str, int] = {}
        self.results: list[SessionResult] = []
        self.ready = False
        self._ssl: Optional[ssl.SSLContext] = None

    def _tls(self) -> ssl.SSLContext:
        """One TLS context for the fleet API and the binary downloads (each context costs megabytes).

        It trusts ``DEVIN_CA_BUNDLE`` when set, else httpx's defaults (certifi, ``SSL_CERT_FILE``/``DIR``).
        """
        if self._ssl is None:
            bundle = os.environ.get("DEVIN_CA_BUNDLE") or True
            self._ssl = httpx.create_ssl_context(verify=bundle, trust_env=True)
        return self._ssl

    # --- entry point ------------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until done; returns the exit code. Raises :class:`WorkerExit` for a one-line failure."""
        self.kick = asyncio.Event()
        locks: list[FileLock] = []
        metrics_server: Optional[MetricsServer] = None
        client: Optional[FleetClient] = None
        binaries = self._binaries
        register_secret(self.config.token)
        register_secret(self.config.direct_token)
        try:
            try:
                # The data dir first, so that it is created private (or an existing one is checked)
                # before the lock file, the acceptor id or any session state goes into it.
                make_private_dir(self.config.data_dir)
                locks.append(
                    FileLock(self.config.data_dir / DATA_LOCK_FILE, "the worker data directory").acquire()
                )
                self.config.workdir.mkdir(parents=True, exist_ok=True)
                locks.append(
                    FileLock(self.config.workdir / WORKDIR_LOCK_FILE, "the working directory").acquire()
                )
                if not self.config.direct and not self.acceptor_id:
                    self.acceptor_id = load_or_create_acceptor_id(self.config.data_dir)
                await asyncio.to_thread(self._reap_orphans)
            except LockedError as exc:
                raise WorkerExit(EXIT_LOCKED, str(exc)) from exc
            except (IdentityError, SharedDirectoryError) as exc:
                raise WorkerExit(EXIT_USAGE, str(exc)) from exc
            except OSError as exc:
                raise WorkerExit(EXIT_ERROR, f"Could not prepare the worker directories: {exc}") from exc
            if binaries is None:
                http = httpx.AsyncClient(
                    timeout=httpx.Timeout(60.0, connect=10.0), follow_redirects=True, verify=self._tls()
                )
                binaries = BinaryStore(
                    self.config.cache_dir, self.config.static_base_url, http=http, owns_http=True
                )
            self.metrics.labels = {"acceptor_id": self.acceptor_id} if self.acceptor_id else {}
            if self.config.metrics_addr is not None:
                metrics_server = MetricsServer(
                    self.metrics, self.health, self.config.metrics_addr.host, self.config.metrics_addr.port
                )
                try:
                    await metrics_server.start()
                except OSError as exc:
                    raise WorkerExit(
                        EXIT_USAGE, f"Could not serve metrics on {self.config.metrics_addr}: {exc}"
                    ) from exc
            self._install_signals()
            if self.config.direct:
                return await self._run_direct(binaries)
            client = self._client_factory(self.config)
            try:
                if self.config.session_id:
                    return await self._run_session(client, binaries)
                return await QueueMode(self).run_queue(client, binaries)
            except FleetAuthError as exc:
                raise WorkerExit(EXIT_AUTH, f"{exc} (check DEVIN_OUTPOSTS_TOKEN and its scopes)") from exc
            except FleetError as exc:  # an answer that retrying cannot change, e.g. 400/422
                raise WorkerExit(EXIT_ERROR, str(exc)) from exc
        finally:
            self._remove_signals()
            if metrics_server is not None:
                await metrics_server.close()
            if client is not None:
                await client.aclose()
            if binaries is not None and self._binaries is None:
                await binaries.aclose()
            for lock in reversed(locks):
                lock.release()

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

    def health(self) -> tuple[bool, str]:
        if self.fatal is not None:
            return False, "unauthorized"
        if self.feed_task is not None and self.feed_task.done() and not self.draining:
            return False, "queue feed stopped"
        if self.draining:
            return True, "draining"
        return True, "ok" if self.ready else "starting"

    # --- signals ----------------------------------------------------------------------------------

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, self.on_signal, signum)
            except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
                with contextlib.suppress(ValueError):
                    signal.signal(signum, lambda s, f: loop.call_soon_threadsafe(self.on_signal, s))

    def _remove_signals(self) -> None:
        with contextlib.suppress(Exception):
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if not self.draining:
            self.signal_number = signum
            self.start_drain()
            log.info(
                "%s: no new claims; %d running session(s) get %.0fs to finish (send it again to stop now)",
                name,
                len(self.active),
                self.config.drain_timeout,
            )
        else:
            log.warning("%s again: stopping all sessions now and releasing their claims", name)
            self.hard_stop = True
            for active in self.active.values():
                active.server.request_stop(HARD_STOP_GRACE)
        self.kick.set()

    def is_draining(self) -> bool:
        return self.draining

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` or until a drain starts; True when the worker is not draining."""
        self.kick.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._until_drain(), timeout=seconds)
        return not self.draining

    async def _until_drain(self) -> None:
        while not self.draining:
            self.kick.clear()
            await self.kick.wait()

    def start_drain(self) -> None:
        self.draining = True
        self.metrics.set("draining", 1)
        if self.feed_task is not None:
            self.feed_task.cancel()
        self.kick.set()

    # --- direct-serve and single-session modes ----------------------------------------------------

    def exit_for(self, result: SessionResult) -> int:
        if self.fatal is not None:
            raise WorkerExit(EXIT_AUTH, f"{self.fatal} (check DEVIN_OUTPOSTS_TOKEN and its scopes)")
        if result.outcome == SERVED:
            return EXIT_OK
        if result.outcome == INTERRUPTED:
            return 128 + (self.signal_number or signal.SIGTERM)
        return EXIT_SESSION_FAILED

    async def _serve_one(self, server: SessionServer) -> SessionResult:
        task = asyncio.ensure_future(server.serve())
        self.active[server.session_id] = _Active(server, task, server.slot)
        task.add_done_callback(lambda t: self.kick.set())
        self.metrics.set("active_sessions", len(self.active))
        self.ready = True
        await self.wait_for_sessions()
        return self.results[-1]

    async def _run_direct(self, binaries: BinaryStore) -> int:
        assert self.config.session_id is not None
        log.info(
            "direct-serve mode: serving session %s without the queue API",
            self.config.session_id,
            extra={"session_id": self.config.session_id},
        )
        server = SessionServer(
            self.config,
            session_id=self.config.session_id,
            acceptor_id=self.acceptor_id,
            binaries=binaries,
            metrics=self.metrics,
            cwd=self.config.slot_dir(0),
        )
        return self.exit_for(await self._serve_one(server))

    async def _run_session(self, client: FleetClient, binaries: BinaryStore) -> int:
        sid = self.config.session_id
        assert sid is not None
        try:
            return await self._claim_and_serve_session(client, binaries, sid)
        except Stopped:
            log.info("stopped before session %s was claimed", sid, extra={"session_id": sid})
            return 128 + (self.signal_number or signal.SIGTERM)

    async def _claim_and_serve_session(self, client: FleetClient, binaries: BinaryStore, sid: str) -> int:
        def retrying(operation: Callable[[], Awaitable[T]]) -> Awaitable[T]:
            # Each step gets its own backoff: an outage at start-up is waited out, one line per try.
            backoff = Backoff(cap=self.config.backoff_max)
            return retry_transient(operation, backoff=backoff, pause=self.pause, extra={"session_id": sid})

        try:
            entry = await retrying(lambda: client.get_devin(sid))
        except FleetNotFound as exc:
            raise WorkerExit(EXIT_NOT_FOUND, str(exc)) from exc
        if self.config.outpost:
            wanted = self.config.outpost
            outpost = await retrying(lambda: resolve_outpost(client, wanted))
            if entry.metadata.outpost_id != outpost.outpost_id:
                raise WorkerExit(
                    EXIT_NOT_FOUND,
                    f"session {sid} is queued on outpost {entry.metadata.outpost_id}, "
                    f"not on {self.config.outpost}",
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
            return EXIT_OK
        try:
            claim = await retrying(lambda: client.claim(sid, self.acceptor_id))
        except FleetConflict as exc:
            raise WorkerExit(EXIT_CONFLICT, f"{exc} (held by another acceptor)") from exc
        except FleetNotFound as exc:
            raise WorkerExit(EXIT_NOT_FOUND, str(exc)) from exc
        self.metrics.inc("sessions_claimed")
        server = self.server_for(claim, client, binaries, 0)
        return self.exit_for(await self._serve_one(server))

    # --- queue mode -------------------------------------------------------------------------------

    def server_for(
        self, claim: QueueEntry, client: FleetClient, binaries: BinaryStore, slot: int
    ) -> SessionServer:
        return SessionServer(
            self.config,
            session_id=claim.session_id,
            acceptor_id=self.acceptor_id,
            binaries=binaries,
            metrics=self.metrics,
            cwd=self.config.slot_dir(slot),
            fleet=client,
            claim=claim,
            slot=slot,
        )

    def free_slot(self) -> Optional[int]:
        used = {active.slot for active in self.active.values()}
        for slot in range(self.config.max_sessions):
            if slot not in used:
                return slot
        return None

    def start_session(self, claim: QueueEntry, client: FleetClient, binaries: BinaryStore) -> None:
        slot = self.free_slot()
        assert slot is not None
        server = self.server_for(claim, client, binaries, slot)
        task = asyncio.ensure_future(server.serve())
        task.add_done_callback(lambda t: self.kick.set())
        self.active[claim.session_id] = _Active(server, task, slot)
        self.metrics.set("active_sessions", len(self.active))
        log.info(
            "claimed session %s (slot %d)",
            claim.session_id,
            slot,
            extra={"session_id": claim.session_id, "slot": slot},
        )

    def route(self, session_id: str, entry: Optional[QueueEntry]) -> None:
        active = self.active.get(session_id)
        if active is not None:
            active.server.notify(entry)

    def reap(self) -> None:
        for sid, active in list(self.active.items()):
            if not active.task.done():
                continue
            del self.active[sid]
            self.metrics.set("active_sessions", len(self.active))
            try:
                result = active.task.result()
            except Exception as exc:  # a bug: keep serving the other sessions
                log.exception("serving session %s crashed", sid, extra={"session_id": sid})
                result = SessionResult(sid, FAILED, f"internal error: {exc}")
            self.results.append(result)
            if self.feed is not None:  # our copy is stale now: wait for the server's next word on it
                self.feed.discard(sid)
            if active.server.fatal is not None:
                self.fatal = active.server.fatal
            if result.outcome == SERVED:
                self.metrics.inc("sessions_served")
            elif result.outcome in (FAILED, LOST):
                self.metrics.inc("sessions_failed")
                count = self._failures[sid] = self._failures.get(sid, 0) + 1
                if self.feed is not None:
                    self.feed.penalize(sid, FAILED_SESSION_COOLDOWN * count)

    async def wait_for_sessions(self) -> None:
        """Wait for every active session, stopping them when the drain timeout or a second signal comes."""
        drain_deadline: Optional[float] = None
        loop = asyncio.get_running_loop()
        while self.active:
            if self.draining and drain_deadline is None:
                drain_deadline = loop.time() + self.config.drain_timeout
            if self.fatal is not None or (drain_deadline is not None and loop.time() >= drain_deadline):
                for active in self.active.values():
                    if not active.server.stopping:
                        active.server.request_stop(HARD_STOP_GRACE if self.hard_stop else None)
            self.kick.clear()
            timeout = None if drain_deadline is None else max(0.0, drain_deadline - loop.time())
            if timeout is not None and timeout <= 0:
                timeout = None  # the stop was requested above: the sessions end within their grace
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout=timeout)
            self.reap()
