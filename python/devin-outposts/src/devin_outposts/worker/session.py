"""Serving one claimed session: binary, launch, renewal, status watching, restarts, release.

:class:`SessionServer` owns a session from the moment it is claimed until its claim is released
(docs/fleet-api.md §4, §5 and §6.2):

1. the per-session state dir ``<data>/sessions/<id>`` (0700; the id sanitised) and the slot's working
   directory are prepared, and a remote left behind by a killed predecessor is stopped;
2. the ``devin-remote`` SHA is resolved and the verified binary fetched; a checksum mismatch is refused,
   reported and the claim released so another worker can try;
3. ``devin-remote serve`` runs with exactly the spawn-contract environment;
4. while it runs the claim is renewed by re-claiming before ``claim_deadline`` and ``session_status`` is
   checked every poll interval (and at once when the queue watch reports a change): ``terminated`` or a
   vanished entry stops the remote; a renewal answered 409 means the claim was lost: stop, do not release;
5. exit 0: ``suspended``/``terminated`` is confirmed by re-reading a few times, then the claim is released.
   Exit 0 while the session is still live, or a non-zero exit, restarts the remote (with the freshest
   connect token) up to the restart limit; past it the claim is released and the session counts as failed.

In direct-serve mode there is no fleet client: the remote runs with the given token, is restarted on a
non-zero exit, and claim, renewal and release stay with the orchestrator.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Protocol

from devin_outposts.api.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.api.models import Phase, QueueEntry, SessionStatus
from devin_outposts.worker.binary import BinaryError, BinaryStore, VerificationError
from devin_outposts.worker.logs import forget_secret, register_secret
from devin_outposts.worker.metrics import Metrics
from devin_outposts.worker.options import WorkerConfig
from devin_outposts.worker.paths import child_dir, make_private_dir
from devin_outposts.worker.spawn import RemoteProcess, build_session_env, free_port, reap_stale_remote

log = logging.getLogger(__name__)


class Outcome(str, enum.Enum):
    """How serving a session ended, as the worker counts it."""

    __str__ = str.__str__  # logs and messages show the value (Python 3.11 would show Outcome.SERVED)

    SERVED = "served"  # the session ended (terminated, suspended or gone) and the claim was released
    FAILED = "failed"  # the remote failed past the restart limit, the binary was refused, ...
    LOST = "lost"  # another worker holds the claim now: the remote was stopped, nothing released
    INTERRUPTED = "interrupted"  # the worker stopped it (drain timeout, second signal) and released


SERVED, FAILED, LOST, INTERRUPTED = Outcome.SERVED, Outcome.FAILED, Outcome.LOST, Outcome.INTERRUPTED


class Stop(str, enum.Enum):
    """Why the supervision of a running remote ended (what the status checks, renewals and the worker
    decided), and so what happens to the session next."""

    __str__ = str.__str__  # logs and messages show the value (Python 3.11 would show Outcome.SERVED)

    EXITED = "exited"  # the remote exited on its own: confirm the status, maybe restart
    TERMINATED = "terminated"  # session_status is terminated: stop the remote, release
    GONE = "gone"  # the queue entry vanished (404): stop the remote, release
    LOST = "lost"  # the claim is another acceptor's: stop the remote, do not release
    LAPSED = "lapsed"  # the deadline passed unrenewed on a session not running: stop, do not release
    STOPPED = "stopped"  # the worker asked (drain timeout, second signal): stop, release
    FATAL = "fatal"  # the token was refused: stop everything


class SessionFleet(Protocol):
    """What serving a session needs from the fleet client (docstring bodies, not ``...``: the pep8 test
    of ansible-core 2.16-2.18 reports one-line stubs as E704)."""

    async def claim(self, session_id: str, acceptor_id: str) -> QueueEntry:
        """Claim or renew ``session_id`` for ``acceptor_id``."""

    async def release(
        self, session_id: str, acceptor_id: str, *, missing_ok: bool = True
    ) -> Optional[QueueEntry]:
        """Release the claim; a claim already gone counts as released when ``missing_ok``."""

    async def get_devin(self, session_id: str) -> QueueEntry:
        """The session's queue entry."""


@dataclass
class SessionResult:
    session_id: str
    outcome: Outcome
    detail: str
    session_status: Optional[str] = None
    refused_binary: bool = False
    #: The session is over for good (terminated, or its entry gone): its state dir can go.
    finished: bool = False


async def release_claim(
    fleet: SessionFleet, session_id: str, acceptor_id: str, extra: dict[str, Any], attempts: int = 3
) -> bool:
    """Release a claim, retrying transient errors; never raises. True when the claim is known released.

    A worker must never die because a release failed: the claim then simply expires at its deadline
    and the session returns to the queue on its own. So every error ends in one log line.
    """
    for attempt in range(attempts):
        try:
            await fleet.release(session_id, acceptor_id, missing_ok=True)
            log.info("released session %s", session_id, extra=extra)
            return True
        except FleetAuthError as exc:
            log.error("%s", exc, extra=extra)
            return False
        except FleetError as exc:
            log.warning("%s (attempt %d of %d)", exc, attempt + 1, attempts, extra=extra)
            if attempt + 1 < attempts:
                await asyncio.sleep(0.5 * (attempt + 1))
    log.error(
        "giving up releasing session %s; its claim will expire on its own", session_id, extra=extra
    )
    return False


def renew_delay(remaining: float, margin: float) -> float:
    """Seconds to wait before renewing a claim that expires in ``remaining`` seconds.

    Renew ``margin`` seconds before the deadline, but never later than when two thirds of the remaining
    time have passed nor sooner than one third: a 300 s claim with a 60 s margin renews after 200 s, a 3 s
    test claim after 1 s.
    """
    if remaining <= 0:
        return 0.0
    wait = max(min(remaining - margin, remaining * 2 / 3), remaining / 3)
    return max(wait, 0.05)


class SessionServer:
    """Serves one session. ``claim`` is the claim response (``None`` in direct-serve mode)."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        session_id: str,
        acceptor_id: str,
        binaries: BinaryStore,
        metrics: Metrics,
        cwd: Path,
        fleet: Optional[SessionFleet] = None,
        claim: Optional[QueueEntry] = None,
        slot: int = 0,
    ) -> None:
        self.config = config
        self.session_id = session_id
        self.acceptor_id = acceptor_id
        self.binaries = binaries
        self.metrics = metrics
        self.cwd = cwd
        self.fleet = fleet
        self.claim = claim
        self.slot = slot
        self.remote: Optional[RemoteProcess] = None
        self.fatal: Optional[FleetAuthError] = None
        self._stop_grace: Optional[float] = None
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._renew_now = asyncio.Event()
        self._ended: Optional[Stop] = None  # TERMINATED, GONE or LOST, once known
        self._latest: Optional[QueueEntry] = claim
        self._tokens: list[str] = []
        self._extra = {"session_id": session_id, "slot": slot}
        self._poll_soon = False

    # --- signals from outside ---------------------------------------------------------------------

    def notify(self, entry: Optional[QueueEntry]) -> None:
        """A fresher copy of our entry from the queue watch (``None``: it was deleted)."""
        if entry is not None:
            self._latest = entry
        self._wake.set()
        if entry is None:
            self._poll_soon = True

    def request_stop(self, grace: Optional[float] = None) -> None:
        """Stop the remote (SIGTERM, SIGKILL after ``grace``) and release the claim."""
        self._stop_grace = self.config.stop_grace if grace is None else grace
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # --- the session ------------------------------------------------------------------------------

    def _token(self) -> Optional[str]:
        if self.config.direct:
            return self.config.direct_token
        return self.claim.connect_token_value() if self.claim else None

    def _remember_token(self) -> None:
        token = self._token()
        if token:
            register_secret(token)
            self._tokens.append(token)

    async def serve(self) -> SessionResult:
        self._remember_token()
        renewer: Optional[asyncio.Task[None]] = None
        result = SessionResult(self.session_id, FAILED, "not started")
        try:
            make_private_dir(self.config.sessions_dir)
            state_dir = make_private_dir(child_dir(self.config.sessions_dir, self.session_id))
            self.cwd.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(reap_stale_remote, state_dir)
            if self.fleet is not None and not self.config.direct:
                renewer = asyncio.ensure_future(self._renew_loop())
            result = await self._serve(state_dir)
            if result.finished:  # a suspended session keeps its state for a resume
                shutil.rmtree(state_dir, ignore_errors=True)
        except FleetAuthError as exc:
            self.fatal = exc
            result = SessionResult(self.session_id, FAILED, str(exc))
        except (OSError, ValueError) as exc:
            result = SessionResult(
                self.session_id, FAILED, f"Could not prepare session {self.session_id}: {exc}"
            )
        finally:
            if self.remote is not None and self.remote.returncode is None:
                await self.remote.stop(
                    self._stop_grace if self._stop_grace is not None else self.config.stop_grace
                )
            if renewer is not None:
                renewer.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await renewer
            if result.outcome != LOST:
                await self._release()
            for token in self._tokens:
                forget_secret(token)
        if self.fatal is not None and result.outcome != FAILED:
            result = SessionResult(self.session_id, FAILED, str(self.fatal))
        self._log_result(result)
        return result

    def _log_result(self, result: SessionResult) -> None:
        level = logging.INFO if result.outcome == SERVED else logging.WARNING
        log.log(level, "session %s %s: %s", self.session_id, result.outcome, result.detail, extra=self._extra)

    async def _release(self) -> None:
        if self.fleet is None or self.config.direct:
            return
        await release_claim(self.fleet, self.session_id, self.acceptor_id, self._extra)

    async def _serve(self, state_dir: Path) -> SessionResult:
        gateway = (self.claim.status.gateway_url if self.claim else None) or self.config.gateway_url
        if not gateway:
            return SessionResult(
                self.session_id, FAILED, "the claim carried no gateway_url and --gateway-url is not set"
            )
        if not self._token():
            return SessionResult(self.session_id, FAILED, "the claim response carried no connect_token")
        try:
            spec_sha = self.claim.spec.remote_binary_sha if self.claim else None
            sha, source = await self.binaries.resolve_sha(spec_sha, self.config.remote_binary_sha)
            downloads = self.binaries.downloads
            binary = await self.binaries.ensure(sha)
            self.metrics.inc("binary_downloads", self.binaries.downloads - downloads)
        except VerificationError as exc:
            self.metrics.inc("binary_verification_failures")
            log.error("%s", exc, extra=self._extra)
            return SessionResult(self.session_id, FAILED, str(exc), refused_binary=True)
        except BinaryError as exc:
            return SessionResult(self.session_id, FAILED, str(exc), refused_binary=True)
        log.info(
            "serving session %s with devin-remote %s (%s)",
            self.session_id,
            sha,
            source,
            extra={**self._extra, "sha": sha},
        )
        restarts = 0
        while True:
            if self._stop.is_set():  # stopped while the binary was being fetched, or between restarts
                return SessionResult(self.session_id, INTERRUPTED, "stopped by the worker")
            token = self._token()
            assert token is not None
            env = build_session_env(
                gateway_url=(self.claim.status.gateway_url if self.claim else None) or gateway,
                connect_token=token,
                session_id=self.session_id,
                state_dir=state_dir,
                pty_bridge_port=self.config.pty_bridge_port or free_port(),
                chrome_path=self.config.chrome_path,
                desktop=self.config.desktop,
            )
            self.remote = await RemoteProcess.start(
                binary, cwd=self.cwd, env=env, state_dir=state_dir, session_id=self.session_id
            )
            log.info(
                "devin-remote started (pid %d)",
                self.remote.pid,
                extra={**self._extra, "pid": self.remote.pid},
            )
            why = await self._supervise(self.remote)
            if why is not Stop.EXITED:
                grace = self._stop_grace if self._stop_grace is not None else self.config.stop_grace
                await self.remote.stop(grace)
                if why is Stop.FATAL and self.fatal is not None:
                    raise self.fatal
                return self._ended_result(why)
            code = await self.remote.wait()
            log.info("devin-remote exited with %d", code, extra={**self._extra, "exit_code": code})
            finished = await self._confirm_finished(reads=self.config.confirm_reads if code == 0 else 1)
            if finished is not None:
                return finished
            if self._stop.is_set():
                return SessionResult(self.session_id, INTERRUPTED, "stopped by the worker")
            if self.fatal is not None:
                raise self.fatal
            restarts += 1
            if restarts > self.config.restart_limit:
                detail = (
                    f"devin-remote exited with {code} and was restarted {self.config.restart_limit} "
                    "times; giving up and releasing the claim"
                )
                return SessionResult(self.session_id, FAILED, detail)
            self.metrics.inc("remote_restarts")
            reason = "exited 0 while the session is still live" if code == 0 else f"exited with {code}"
            log.warning(
                "devin-remote %s; restarting (%d of %d)",
                reason,
                restarts,
                self.config.restart_limit,
                extra={**self._extra, "attempt": restarts},
            )
            if self.fleet is not None and not self.config.direct:
                self._renew_now.set()  # a fresh connect token for the new remote
            await self._pause(min(0.5 * restarts, 5.0))
            if self._ended is not None:
                return self._ended_result(self._ended)
            if self._stop.is_set():
                return SessionResult(self.session_id, INTERRUPTED, "stopped by the worker")

    def _ended_result(self, why: Stop) -> SessionResult:
        sid = self.session_id
        if why is Stop.LOST:
            return SessionResult(sid, LOST, "the claim was lost to another worker; remote stopped")
        if why is Stop.LAPSED:
            return SessionResult(
                sid, LOST, "the claim expired while the fleet API could not be reached; remote stopped"
            )
        if why is Stop.GONE:
            return SessionResult(sid, SERVED, "entry gone", finished=True)
        if why is Stop.TERMINATED:
            terminated = SessionStatus.TERMINATED.value
            return SessionResult(sid, SERVED, "session terminated", terminated, finished=True)
        return SessionResult(sid, INTERRUPTED, "stopped by the worker")

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    # --- while the remote runs --------------------------------------------------------------------

    def _evaluate(self, entry: QueueEntry) -> Optional[Stop]:
        status = entry.status
        if status.session_status == SessionStatus.TERMINATED:
            return Stop.TERMINATED
        if status.phase == Phase.CLAIMED and status.acceptor_id not in (None, self.acceptor_id):
            return Stop.LOST
        if status.phase == Phase.PENDING:
            self._renew_now.set()  # our claim fell back to the queue: take it again
        return None

    async def _check_status(self) -> Optional[Stop]:
        if self.fleet is None or self.config.direct:
            return None
        try:
            entry = await self.fleet.get_devin(self.session_id)
        except FleetNotFound:
            return Stop.GONE
        except FleetAuthError as exc:
            self.fatal = exc
            return Stop.FATAL
        except FleetError as exc:
            log.warning("%s; checking again later", exc, extra=self._extra)
            return None
        self._latest = entry
        return self._evaluate(entry)

    async def _supervise(self, remote: RemoteProcess) -> Stop:
        """Wait until the remote exits (EXITED) or must be stopped (any other :class:`Stop`)."""
        exited = asyncio.ensure_future(remote.proc.wait())
        stop = asyncio.ensure_future(self._stop.wait())
        next_check = time.monotonic() + self.config.poll_interval
        # The watch may have reported a change while the binary was fetched or the remote was being
        # started: that notice is still flagged, so the latest known state is judged before the first
        # wait. The flag is cleared only right before the state is judged, so a notice that arrives at
        # any other moment is seen on the next turn instead of waiting for the next status poll.
        try:
            while True:
                if self._ended is not None:
                    return self._ended
                if self.fatal is not None:
                    return Stop.FATAL
                why: Optional[Stop] = None
                if self._wake.is_set():
                    self._wake.clear()
                    if self._poll_soon:  # the entry was deleted: ask the server what became of it
                        self._poll_soon = False
                        why = await self._check_status()
                        next_check = time.monotonic() + self.config.poll_interval
                    elif self._latest is not None:
                        why = self._evaluate(self._latest)
                else:
                    wake = asyncio.ensure_future(self._wake.wait())
                    timeout = max(0.0, next_check - time.monotonic())
                    done = (
                        await asyncio.wait(
                            {exited, stop, wake}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                        )
                    )[0]
                    wake.cancel()
                    if exited in done:
                        return Stop.EXITED
                    if stop in done:
                        return Stop.STOPPED
                    if wake in done:
                        continue  # judged at the top of the next turn
                    self._poll_soon = False
                    why = await self._check_status()
                    next_check = time.monotonic() + self.config.poll_interval
                if why is not None:
                    self._ended = why if why is not Stop.FATAL else None
                    return why
        finally:
            stop.cancel()
            if not exited.done():
                exited.cancel()

    async def _confirm_finished(self, reads: int) -> Optional[SessionResult]:
        """After an exit: the final result when the session is over, else ``None`` (still live)."""
        if self._ended is not None:
            return self._ended_result(self._ended)
        if self.fleet is None or self.config.direct:
            if reads > 1:  # exit 0 in direct-serve mode: the orchestrator confirms and releases
                return SessionResult(self.session_id, SERVED, "devin-remote exited 0")
            return None
        for attempt in range(reads):
            try:
                entry = await self.fleet.get_devin(self.session_id)
            except FleetNotFound:
                return self._ended_result(Stop.GONE)
            except FleetAuthError as exc:
                self.fatal = exc
                raise
            except FleetError as exc:
                log.warning("%s", exc, extra=self._extra)
            else:
                status = entry.status.session_status
                if status in (SessionStatus.SUSPENDED, SessionStatus.TERMINATED):
                    detail, finished = f"session {status}", status == SessionStatus.TERMINATED
                    return SessionResult(self.session_id, SERVED, detail, status.value, finished=finished)
                if self._evaluate(entry) is Stop.LOST:
                    self._ended = Stop.LOST
                    return self._ended_result(Stop.LOST)
            if attempt + 1 < reads:
                await self._pause(self.config.confirm_interval)
        return None

    def _claim_lapsed(self) -> bool:
        """Whether our claim may be another worker's by now: past its deadline, on a session that is not
        ``running``. The fleet keeps an expired claim on a running session with its worker (see
        docs/fleet-api.md), so only then is serving on worth the risk of a second remote."""
        deadline = self.claim.status.claim_deadline if self.claim else None
        if deadline is None or time.time() < deadline:
            return False
        latest = self._latest or self.claim
        return latest is None or latest.status.session_status != SessionStatus.RUNNING

    async def _renew_loop(self) -> None:
        assert self.fleet is not None
        failures = 0
        while True:
            deadline = self.claim.status.claim_deadline if self.claim else None
            remaining = (deadline - time.time()) if deadline is not None else self.config.renew_margin * 2
            wait = renew_delay(remaining, self.config.renew_margin)
            if failures:
                wait = min(wait, 2.0 * failures, 10.0)
                if deadline is not None:  # look again when the claim runs out, at the latest
                    wait = min(wait, max(0.0, deadline - time.time()))
            self._renew_now.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._renew_now.wait(), timeout=wait)
            try:
                entry = await self.fleet.claim(self.session_id, self.acceptor_id)
            except FleetConflict as exc:
                log.warning("%s: the claim was lost", exc, extra=self._extra)
                self._ended = Stop.LOST
                self._wake.set()
                return
            except FleetNotFound:
                self._ended = Stop.GONE
                self._wake.set()
                return
            except FleetAuthError as exc:
                self.fatal = exc
                self._wake.set()
                return
            except FleetError as exc:
                failures += 1
                self.metrics.inc("renewal_failures")
                if self._claim_lapsed():
                    log.warning(
                        "%s; the claim has expired and the session is not running, so the queue may "
                        "give it to another worker: stopping the remote",
                        exc,
                        extra=self._extra,
                    )
                    self._ended = Stop.LAPSED
                    self._wake.set()
                    return
                log.warning("%s; renewing again soon", exc, extra=self._extra)
                continue
            failures = 0
            self.claim = entry
            self._latest = entry
            self._remember_token()
            self.metrics.inc("renewals")
            log.debug("renewed the claim until %s", entry.status.claim_deadline, extra=self._extra)
            if entry.status.session_status == SessionStatus.TERMINATED:
                self._wake.set()
