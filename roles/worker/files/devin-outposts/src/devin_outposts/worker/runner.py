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
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import httpx

from devin_outposts.client import FleetClient
from devin_outposts.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.models import Outpost, QueueEntry
from devin_outposts.worker.binary import BinaryStore, host_os
from devin_outposts.worker.config import WorkerConfig
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
from devin_outposts.worker.queue import Backoff, QueueFeed, oldest_first
from devin_outposts.worker.session import FAILED, INTERRUPTED, LOST, SERVED, SessionResult, SessionServer
from devin_outposts.worker.spawn import reap_stale_remote

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_CONFLICT = 5
EXIT_PLATFORM = 6
EXIT_SESSION_FAILED = 7
EXIT_LOCKED = 8

#: Seconds a session that failed on this worker is not offered to it again (times its failure count).
FAILED_SESSION_COOLDOWN = 60.0
HARD_STOP_GRACE = 0.5


class WorkerExit(Exception):
    """Ends the worker with ``code`` after printing ``message`` as one line."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


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
        self._feed_task: Optional[asyncio.Task[None]] = None
        self._failures: dict[str, int] = {}
        self._results: list[SessionResult] = []
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
            except IdentityError as exc:
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
                return await self._run_queue(client, binaries)
            except FleetAuthError as exc:
                raise WorkerExit(EXIT_AUTH, f"{exc} (check DEVIN_OUTPOSTS_TOKEN and its scopes)") from exc
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
        if self._feed_task is not None and self._feed_task.done() and not self.draining:
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

    def _is_draining(self) -> bool:
        return self.draining

    def start_drain(self) -> None:
        self.draining = True
        self.metrics.set("draining", 1)
        if self._feed_task is not None:
            self._feed_task.cancel()
        self.kick.set()

    # --- direct-serve and single-session modes ----------------------------------------------------

    def _exit_for(self, result: SessionResult) -> int:
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
        await self._wait_for_sessions()
        return self._results[-1]

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
        return self._exit_for(await self._serve_one(server))

    async def _run_session(self, client: FleetClient, binaries: BinaryStore) -> int:
        sid = self.config.session_id
        assert sid is not None
        try:
            entry = await client.get_devin(sid)
        except FleetNotFound as exc:
            raise WorkerExit(EXIT_NOT_FOUND, str(exc)) from exc
        if self.config.outpost:
            outpost = await self._resolve_outpost(client)
            if entry.metadata.outpost_id != outpost.outpost_id:
                raise WorkerExit(
                    EXIT_NOT_FOUND,
                    f"session {sid} is queued on outpost {entry.metadata.outpost_id}, "
                    f"not on {self.config.outpost}",
                )
            self._check_platform(outpost, entry)
        else:
            self._check_platform(await client.find_outpost(entry.metadata.outpost_id), entry)
        if entry.is_finished and entry.status.acceptor_id != self.acceptor_id:
            log.info(
                "session %s is already %s; nothing to serve",
                sid,
                entry.status.session_status,
                extra={"session_id": sid},
            )
            return EXIT_OK
        try:
            claim = await client.claim(sid, self.acceptor_id)
        except FleetConflict as exc:
            raise WorkerExit(EXIT_CONFLICT, f"{exc} (held by another acceptor)") from exc
        except FleetNotFound as exc:
            raise WorkerExit(EXIT_NOT_FOUND, str(exc)) from exc
        self.metrics.inc("sessions_claimed")
        server = self._server_for(claim, client, binaries, 0)
        return self._exit_for(await self._serve_one(server))

    # --- outposts and platforms -------------------------------------------------------------------

    async def _resolve_outpost(self, client: FleetClient) -> Outpost:
        wanted = self.config.outpost
        if wanted:
            outpost = await client.find_outpost(wanted)
            if outpost is None:
                raise WorkerExit(
                    EXIT_NOT_FOUND, f"Could not find outpost {wanted}: no outpost has this name or id"
                )
            return outpost
        outposts = await client.list_all_outposts()
        if len(outposts) == 1:
            log.info("--outpost not given; serving the account's only outpost %s", outposts[0].name)
            return outposts[0]
        if not outposts:
            raise WorkerExit(EXIT_NOT_FOUND, "the account has no outposts; create one or pass --outpost")
        if sys.stdin.isatty() and sys.stderr.isatty():
            return await asyncio.to_thread(_prompt_outpost, outposts)
        names = ", ".join(sorted(o.name for o in outposts))
        raise WorkerExit(EXIT_USAGE, f"--outpost is required: the account has several outposts ({names})")

    def _check_platform(self, outpost: Optional[Outpost], entry: Optional[QueueEntry] = None) -> None:
        here = host_os()
        platform = outpost.spec.platform if outpost is not None else None
        if platform is None and entry is not None:
            platform = entry.spec.platform
        if platform is not None and platform.value != here:
            name = outpost.name if outpost is not None else "the session's outpost"
            raise WorkerExit(
                EXIT_PLATFORM,
                f"outpost {name} serves {platform.value} sessions but this machine runs {here}; run the "
                "worker on a matching machine or use an outpost for this platform",
            )

    def _entry_platform_ok(self, entry: QueueEntry) -> bool:
        platform = entry.spec.platform
        return platform is None or platform.value == host_os()

    # --- queue mode -------------------------------------------------------------------------------

    def _server_for(
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

    def _free_slot(self) -> Optional[int]:
        used = {active.slot for active in self.active.values()}
        for slot in range(self.config.max_sessions):
            if slot not in used:
                return slot
        return None

    def _start(self, claim: QueueEntry, client: FleetClient, binaries: BinaryStore) -> None:
        slot = self._free_slot()
        assert slot is not None
        server = self._server_for(claim, client, binaries, slot)
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

    def _route(self, session_id: str, entry: Optional[QueueEntry]) -> None:
        active = self.active.get(session_id)
        if active is not None:
            active.server.notify(entry)

    def _reap(self) -> None:
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
            self._results.append(result)
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

    async def _wait_for_sessions(self) -> None:
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
            self._reap()

    async def _recover(self, client: FleetClient, binaries: BinaryStore, outpost_id: str) -> None:
        """Take back the sessions this acceptor still holds (a worker restarted after a crash)."""
        held = (
            await client.list_all_devins(outpost=outpost_id, phase="claimed", acceptor_id=self.acceptor_id)
        )[0]
        for entry in oldest_first(e for e in held if e.status.acceptor_id in (None, self.acceptor_id)):
            sid = entry.session_id
            if entry.is_finished or self._free_slot() is None or self.draining:
                why = f"already {entry.status.session_status}" if entry.is_finished else "no free slot"
                log.info(
                    "releasing session %s held from before the restart (%s)",
                    sid,
                    why,
                    extra={"session_id": sid},
                )
                with contextlib.suppress(FleetNotFound, FleetConflict):
                    await client.release(sid, self.acceptor_id)
                continue
            try:
                claim = await client.claim(sid, self.acceptor_id)  # a renewal: fresh connect token
            except (FleetConflict, FleetNotFound) as exc:
                log.info("could not take back session %s: %s", sid, exc, extra={"session_id": sid})
                continue
            self.metrics.inc("sessions_claimed")
            log.info("took back session %s after a restart", sid, extra={"session_id": sid})
            self._start(claim, client, binaries)

    async def _run_queue(self, client: FleetClient, binaries: BinaryStore) -> int:
        outpost = await self._resolve_outpost(client)
        self._check_platform(outpost)
        log.info(
            "worker %s serving outpost %s (%s) on %s: %d slot(s), %s, workdir %s",
            self.acceptor_id,
            outpost.name,
            outpost.outpost_id,
            host_os(),
            self.config.max_sessions,
            "watching the queue" if self.config.watch else f"polling every {self.config.poll_interval:g}s",
            self.config.workdir,
            extra={"outpost": outpost.outpost_id, "acceptor_id": self.acceptor_id},
        )
        self.metrics.labels["outpost"] = outpost.outpost_id
        recovery = Backoff(cap=self.config.backoff_max)
        while not self.draining:
            try:
                await self._recover(client, binaries, outpost.outpost_id)
                break
            except FleetAuthError:
                raise
            except FleetError as exc:
                self.metrics.inc("api_errors")
                await self._sleep(recovery.next_delay(), f"{exc}")
        self.feed = QueueFeed(
            client,
            outpost.outpost_id,
            self.acceptor_id,
            watch=self.config.watch,
            poll_interval=self.config.poll_interval,
            backoff_max=self.config.backoff_max,
            metrics=self.metrics,
            on_update=self._route,
        )
        self.feed.changed = self.kick
        if not self.draining:
            self._feed_task = asyncio.ensure_future(self.feed.run())
            self._feed_task.add_done_callback(lambda t: self.kick.set())
        self.ready = True
        try:
            await self._claim_loop(client, binaries)
        finally:
            if self._feed_task is not None:
                self._feed_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._feed_task
            await self._wait_for_sessions()
        if self.fatal is not None:
            raise WorkerExit(EXIT_AUTH, f"{self.fatal} (check DEVIN_OUTPOSTS_TOKEN and its scopes)")
        if self.config.once and self._results:
            return self._exit_for(self._results[-1])
        return EXIT_OK

    async def _sleep(self, seconds: float, why: str) -> None:
        log.warning("%s; retrying in %.1fs", why, seconds)
        self.kick.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._until_drain(), timeout=seconds)

    async def _until_drain(self) -> None:
        while not self.draining:
            self.kick.clear()
            await self.kick.wait()

    async def _claim_loop(self, client: FleetClient, binaries: BinaryStore) -> None:
        assert self.feed is not None
        backoff = Backoff(cap=self.config.backoff_max)
        claimed_once = False
        while not self.draining:
            self._reap()
            if self.fatal is not None:
                return
            if self._feed_task is not None and self._feed_task.done():
                error = None if self._feed_task.cancelled() else self._feed_task.exception()
                if isinstance(error, FleetAuthError):
                    self.fatal = error
                    return
                log.error("the queue feed stopped (%r); restarting it", error)
                await self._sleep(backoff.next_delay(), "queue feed stopped")
                self._feed_task = asyncio.ensure_future(self.feed.run())
                self._feed_task.add_done_callback(lambda t: self.kick.set())
                continue
            if self.config.once and claimed_once:
                if not self.active:
                    return
            elif self._free_slot() is not None:
                outcome = await self._claim_next(client, binaries)
                if outcome == "claimed":
                    claimed_once = True
                    backoff.reset()
                    continue
                if outcome == "error":
                    await self._sleep(backoff.next_delay(), "claiming failed")
                    continue
                if outcome == "fatal":
                    return
            self.kick.clear()
            if self._is_draining():  # a signal may have come while we were claiming
                break
            wakeup = self.feed.next_wakeup()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.kick.wait(), timeout=wakeup)

    async def _claim_next(self, client: FleetClient, binaries: BinaryStore) -> str:
        """Claim the oldest claimable session: ``claimed``, ``idle``, ``error`` (back off) or ``fatal``."""
        assert self.feed is not None
        for entry in self.feed.candidates(exclude=self.active):
            sid = entry.session_id
            if not self._entry_platform_ok(entry):
                log.warning(
                    "not claiming session %s: it wants platform %s, this machine runs %s",
                    sid,
                    entry.spec.platform,
                    host_os(),
                    extra={"session_id": sid},
                )
                self.feed.penalize(sid, 3600)
                continue
            try:
                claim = await client.claim(sid, self.acceptor_id)
            except FleetConflict:
                self.metrics.inc("claim_conflicts")
                log.debug("session %s was claimed by another worker", sid, extra={"session_id": sid})
                self.feed.penalize(sid, max(2 * self.config.poll_interval, 5.0))
                continue
            except FleetNotFound:
                self.feed.discard(sid)
                continue
            except FleetAuthError as exc:
                self.fatal = exc
                return "fatal"
            except FleetError as exc:
                self.metrics.inc("api_errors")
                log.warning("%s", exc, extra={"session_id": sid})
                return "error"
            self.metrics.inc("sessions_claimed")
            if self.draining or claim.is_finished:
                # A signal arrived while the claim was in flight, or our copy of the row was stale and
                # the session is already over: give it straight back.
                why = "draining" if self.draining else f"session already {claim.status.session_status}"
                log.info("releasing session %s at once (%s)", sid, why, extra={"session_id": sid})
                self.feed.discard(sid)
                await client.release(sid, self.acceptor_id)
                if self.draining:
                    return "idle"
                continue
            self._start(claim, client, binaries)
            return "claimed"
        return "idle"


def _prompt_outpost(outposts: list[Outpost]) -> Outpost:
    ordered = sorted(outposts, key=lambda o: o.name)
    print("Outposts of this account:", file=sys.stderr)
    for number, outpost in enumerate(ordered, 1):
        platform = outpost.spec.platform.value if outpost.spec.platform else "default"
        print(f"  {number}. {outpost.name} ({outpost.outpost_id}, {platform})", file=sys.stderr)
    while True:
        print("Serve which outpost? [number] ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline()
        if not answer:
            raise WorkerExit(EXIT_USAGE, "no outpost chosen; pass --outpost")
        with contextlib.suppress(ValueError):
            choice = int(answer.strip())
            if 1 <= choice <= len(ordered):
                return ordered[choice - 1]
