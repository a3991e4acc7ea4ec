"""Serving one claimed session, whatever runs it: renewal, status watching, restarts, release.

:class:`ClaimedSession` owns a session from the moment it is claimed until its claim is released
(docs/fleet-api.md §4, §5 and §6.2). What actually runs the session is a subclass's business, through
three hooks: :meth:`~ClaimedSession.prepare` (the worker fetches and verifies ``devin-remote``; the
orchestrator provisions a machine), :meth:`~ClaimedSession.launch` (start ``devin-remote serve``; start
the worker inside the machine) and :meth:`~ClaimedSession.finish` (remove a finished session's state;
snapshot and tear the machine down). The worker's :class:`~devin_outposts.worker.session.SessionServer`
and the orchestrator's machine sessions share everything else:

1. while a launch runs the claim is renewed by re-claiming before ``claim_deadline`` and
   ``session_status`` is checked every poll interval (and at once when the queue watch reports a
   change): ``terminated`` or a vanished entry stops it; a renewal answered 409 means the claim was lost:
   stop, do not release;
2. exit 0: ``suspended``/``terminated`` is confirmed by re-reading a few times, then the claim is
   released. Exit 0 while the session is still live, or a non-zero exit, launches again (with the
   freshest connect token) up to the restart limit; past it the claim is released and the session counts
   as failed. An exit that :meth:`~ClaimedSession.final_exit` names (the orchestrator's worker that cannot
   enforce the session's network policy) ends the session at once, without restarts;
3. a failure of what runs the session itself (:class:`LaunchError`: a machine that cannot be made or
   never comes up) releases the claim at once and counts as an infrastructure error.

Without a fleet client (direct-serve mode) there are no renewals, status checks or releases: claim,
renewal and release stay with the orchestrator that started us.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import random
import time
from typing import Any, ClassVar, Optional

from devin_outposts.api.errors import FleetAuthError, FleetConflict, FleetError, FleetNotFound
from devin_outposts.api.models import Phase, QueueEntry, SessionStatus
from devin_outposts.core.logs import forget_secret, register_secret
from devin_outposts.core.metrics import Metrics
from devin_outposts.core.sessions import (
    DETACHED,
    FAILED,
    INTERRUPTED,
    LOST,
    SERVED,
    LaunchError,
    Run,
    ServeSettings,
    SessionFleet,
    SessionResult,
    Stop,
    release_claim,
    renew_delay,
)

log = logging.getLogger(__name__)

#: The share of the poll interval by which each status read of a session comes early, at random.
CHECK_JITTER = 0.2


class ClaimedSession(abc.ABC):
    """Serves one claimed session. ``claim`` is the claim response (``None`` in direct-serve mode, where
    ``direct_token`` is the connect token). Subclasses implement :meth:`prepare`, :meth:`launch` and
    :meth:`finish`."""

    #: The metric counted for each launch after the first.
    RESTART_METRIC: ClassVar[str] = "remote_restarts"
    #: What the log calls one launch.
    WHAT: ClassVar[str] = "devin-remote"

    def __init__(
        self,
        settings: ServeSettings,
        *,
        session_id: str,
        acceptor_id: str,
        metrics: Metrics,
        fleet: Optional[SessionFleet] = None,
        claim: Optional[QueueEntry] = None,
        slot: int = 0,
        direct_token: Optional[str] = None,
    ) -> None:
        self.settings = settings
        self.session_id = session_id
        self.acceptor_id = acceptor_id
        self.metrics = metrics
        self.fleet = fleet
        self.claim = claim
        self.slot = slot
        self.direct_token = direct_token
        self.run: Optional[Run] = None
        self.fatal: Optional[FleetAuthError] = None
        self._stop_grace: Optional[float] = None
        self._detach = False
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._renew_now = asyncio.Event()
        self._ended: Optional[Stop] = None  # TERMINATED, GONE or LOST, once known
        self._latest: Optional[QueueEntry] = claim
        self._tokens: list[str] = []
        self._extra: dict[str, Any] = {"session_id": session_id, "slot": slot}
        self._poll_soon = False
        self._stop_failed = False  # stopping the launch raised: not tried again on the way out
        self._preparing = False

    # --- the hooks -----------------------------------------------------------------------------------

    async def prepare(self) -> Optional[SessionResult]:
        """Get ready to launch; a result ends the session before any launch (the claim is released)."""
        return None

    @abc.abstractmethod
    async def launch(self, token: str, gateway_url: str) -> Run:
        """Start what serves the session with this connect token; :class:`LaunchError` on failure."""

    async def finish(self, result: SessionResult) -> None:
        """Clean up after the session (before the claim is released); never raises."""
        return None

    def seen(self, entry: QueueEntry) -> None:
        """A fresher copy of the session's queue entry arrived (the watch, a status read, a renewal); it
        is :attr:`latest` already. The orchestrator notes a session served here."""
        del entry

    def final_exit(self, code: int) -> Optional[SessionResult]:
        """A result that ends the session at once, without restarts, when a launch exits with ``code``
        (a restart could not help); ``None``: the usual rule (confirm, restart up to the limit)."""
        del code
        return None

    # --- signals from outside ---------------------------------------------------------------------

    def notify(self, entry: Optional[QueueEntry]) -> None:
        """A fresher copy of our entry from the queue watch (``None``: it was deleted)."""
        if entry is not None:
            self._see(entry)
        self._wake.set()
        if entry is None:
            self._poll_soon = True

    def request_stop(self, grace: Optional[float] = None) -> None:
        """Stop the launch (forced after ``grace``) and release the claim."""
        self._stop_grace = self.settings.stop_grace if grace is None else grace
        self._stop.set()

    def drain_started(self) -> None:
        """The owner drains: a session still being prepared stops now when its prepare may be cut short
        (``settings.interruptible_prepare``: the worker's download); any other goes on, within the drain
        timeout."""
        if self._preparing and self.settings.interruptible_prepare and not self.stopping:
            log.info("session %s: stopped while being prepared", self.session_id, extra=self._extra)
            self.request_stop()

    def request_detach(self) -> None:
        """Leave the launch running and the claim held: the next start of the owner adopts it."""
        self._detach = True
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def latest(self) -> Optional[QueueEntry]:
        """The freshest copy of the session's queue entry seen."""
        return self._latest

    def _see(self, entry: QueueEntry) -> None:
        self._latest = entry
        self.seen(entry)

    # --- the session ------------------------------------------------------------------------------

    def _token(self) -> Optional[str]:
        if self.direct_token is not None:
            return self.direct_token
        return self.claim.connect_token_value() if self.claim else None

    def _remember_token(self) -> None:
        token = self._token()
        if token:
            register_secret(token)
            self._tokens.append(token)

    @property
    def _renews(self) -> bool:
        return self.fleet is not None and self.direct_token is None

    def _grace(self) -> float:
        return self._stop_grace if self._stop_grace is not None else self.settings.stop_grace

    async def serve(self) -> SessionResult:
        self._remember_token()
        renewer: Optional[asyncio.Task[None]] = None
        result = SessionResult(self.session_id, FAILED, "not started")
        try:
            if self._renews:
                renewer = asyncio.ensure_future(self._renew_loop())
            result = self._precheck() or await self._prepare_unless_stopped() or await self._serve()
        except FleetAuthError as exc:
            self.fatal = exc
            result = SessionResult(self.session_id, FAILED, str(exc))
        except (OSError, ValueError) as exc:
            result = SessionResult(
                self.session_id, FAILED, f"Could not prepare session {self.session_id}: {exc}"
            )
        finally:
            try:
                await self._wind_down(result, renewer)
            finally:  # whatever failed above: the claim is released, or it would be held to its deadline
                if result.outcome not in (LOST, DETACHED):
                    await self._release()
                for token in self._tokens:
                    forget_secret(token)
        if self.fatal is not None and result.outcome != FAILED:
            result = SessionResult(self.session_id, FAILED, str(self.fatal))
        self._log_result(result)
        return result

    async def _prepare_unless_stopped(self) -> Optional[SessionResult]:
        """:meth:`prepare`; with ``settings.interruptible_prepare`` a stop cancels it at once (a download
        stops, its temporary file goes) and the session ends interrupted, unlaunched."""
        if not self.settings.interruptible_prepare:
            return await self.prepare()
        self._preparing = True
        preparing = asyncio.ensure_future(self.prepare())
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({preparing, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # serve() itself was cancelled: so is what it waited for
            preparing.cancel()
            raise
        finally:
            self._preparing = False
            stopped.cancel()
        if preparing.done():
            return preparing.result()
        preparing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await preparing
        return self._interrupted()

    async def _wind_down(self, result: SessionResult, renewer: Optional[asyncio.Task[None]]) -> None:
        """Stop what still runs (unless detached), stop renewing, and clean up (:meth:`finish`)."""
        running = self.run is not None and self.run.returncode is None
        if running and result.outcome != DETACHED and not self._stop_failed:
            await self._stop_run()
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
        if result.outcome != DETACHED:
            await self.finish(result)

    async def _stop_run(self) -> None:
        """Stop the launch (forced after the grace); an error is logged, never raised, so that the claim is
        still released (a Windows remote's stop once raised ``SystemError`` here, and every claim stayed
        held to its deadline). Not tried a second time: what failed once would fail again."""
        assert self.run is not None
        try:
            await self.run.stop(self._grace())
        except Exception:
            self._stop_failed = True
            log.exception(
                "stopping %s (%s) failed; releasing the claim all the same",
                self.WHAT,
                self.run.describe(),
                extra=self._extra,
            )

    def _log_result(self, result: SessionResult) -> None:
        level = logging.INFO if result.outcome in (SERVED, DETACHED) else logging.WARNING
        log.log(level, "session %s %s: %s", self.session_id, result.outcome, result.detail, extra=self._extra)

    async def _release(self) -> None:
        if self.fleet is None or not self._renews:
            return
        await release_claim(self.fleet, self.session_id, self.acceptor_id, self._extra)

    def _interrupted(self) -> SessionResult:
        if self._detach:
            return SessionResult(self.session_id, DETACHED, "left running for the next start to adopt")
        return SessionResult(self.session_id, INTERRUPTED, "stopped on request")

    def _gateway(self) -> Optional[str]:
        return (self.claim.status.gateway_url if self.claim else None) or self.settings.gateway_url

    def _precheck(self) -> Optional[SessionResult]:
        if not self._gateway():
            return SessionResult(
                self.session_id, FAILED, "the claim carried no gateway_url and --gateway-url is not set"
            )
        if not self._token():
            return SessionResult(self.session_id, FAILED, "the claim response carried no connect_token")
        return None

    async def _serve(self) -> SessionResult:
        restarts = 0
        while True:
            if self._stop.is_set():  # stopped while preparing, or between restarts
                return self._interrupted()
            token, gateway = self._token(), self._gateway()
            assert token is not None
            assert gateway is not None
            try:
                self.run = await self.launch(token, gateway)
            except LaunchError as exc:
                return SessionResult(
                    self.session_id, FAILED, str(exc), infrastructure=True, reason=exc.reason
                )
            what = self.run.describe()
            log.info("%s started (%s)", self.WHAT, what, extra={**self._extra, "run": what})
            why = await self._supervise(self.run)
            if why is Stop.DETACHED:
                return self._interrupted()
            if why is not Stop.EXITED:
                await self._stop_run()
                if why is Stop.FATAL and self.fatal is not None:
                    raise self.fatal
                return self._ended_result(why)
            try:
                code = await self.run.wait()
            except LaunchError as exc:  # it never came up, or its machine vanished
                return SessionResult(
                    self.session_id, FAILED, str(exc), infrastructure=True, reason=exc.reason
                )
            log.info("%s exited with %d", self.WHAT, code, extra={**self._extra, "exit_code": code})
            final = self.final_exit(code)
            if final is not None:
                return final
            finished = await self._confirm_finished(reads=self.settings.confirm_reads if code == 0 else 1)
            if finished is not None:
                return finished
            if self._stop.is_set():
                return self._interrupted()
            if self.fatal is not None:
                raise self.fatal
            restarts += 1
            if restarts > self.settings.restart_limit:
                detail = (
                    f"{self.WHAT} exited with {code} and was restarted {self.settings.restart_limit} "
                    "times; giving up and releasing the claim"
                )
                return SessionResult(self.session_id, FAILED, detail, gave_up=True)
            self.metrics.inc(self.RESTART_METRIC)
            reason = "exited 0 while the session is still live" if code == 0 else f"exited with {code}"
            log.warning(
                "%s %s; restarting (%d of %d)",
                self.WHAT,
                reason,
                restarts,
                self.settings.restart_limit,
                extra={**self._extra, "attempt": restarts},
            )
            if self._renews:
                self._renew_now.set()  # a fresh connect token for the next launch
            await self._pause(min(0.5 * restarts, 5.0))
            if self._ended is not None:
                return self._ended_result(self._ended)
            if self._stop.is_set():
                return self._interrupted()

    def _ended_result(self, why: Stop) -> SessionResult:
        sid = self.session_id
        if why is Stop.LOST:
            return SessionResult(sid, LOST, f"the claim was lost to another worker; {self.WHAT} stopped")
        if why is Stop.LAPSED:
            return SessionResult(
                sid, LOST, f"the claim expired while the fleet API could not be reached; {self.WHAT} stopped"
            )
        if why is Stop.GONE:
            return SessionResult(sid, SERVED, "entry gone", finished=True)
        if why is Stop.TERMINATED:
            return SessionResult(sid, SERVED, "session terminated", SessionStatus.TERMINATED, finished=True)
        return self._interrupted()

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    # --- while it runs ----------------------------------------------------------------------------

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
        if self.fleet is None or not self._renews:
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
        self._see(entry)
        return self._evaluate(entry)

    def _check_delay(self) -> float:
        """Seconds to the next status read of the session: the poll interval, less up to a fifth at
        random, so that sessions claimed together do not read together for the rest of their lives."""
        return self.settings.poll_interval * (1.0 - CHECK_JITTER * random.random())  # noqa: S311 (spreading load)

    async def _supervise(self, run: Run) -> Stop:
        """Wait until the launch exits (EXITED) or must be stopped (any other :class:`Stop`)."""
        exited = asyncio.ensure_future(run.wait_exit())
        stop = asyncio.ensure_future(self._stop.wait())
        next_check = time.monotonic() + self._check_delay()
        # The watch may have reported a change while we were preparing or launching: that notice is
        # still flagged, so the latest known state is judged before the first wait. The flag is cleared
        # only right before the state is judged, so a notice that arrives at any other moment is seen on
        # the next turn instead of waiting for the next status poll.
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
                        next_check = time.monotonic() + self._check_delay()
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
                        return Stop.DETACHED if self._detach else Stop.STOPPED
                    if wake in done:
                        continue  # judged at the top of the next turn
                    self._poll_soon = False
                    why = await self._check_status()
                    next_check = time.monotonic() + self._check_delay()
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
        if self.fleet is None or not self._renews:
            if reads > 1:  # exit 0 in direct-serve mode: the orchestrator confirms and releases
                return SessionResult(self.session_id, SERVED, f"{self.WHAT} exited 0")
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
                self._see(entry)
                status = entry.status.session_status
                if status in (SessionStatus.SUSPENDED, SessionStatus.TERMINATED):
                    detail, finished = f"session {status}", status == SessionStatus.TERMINATED
                    return SessionResult(self.session_id, SERVED, detail, status, finished=finished)
                if self._evaluate(entry) is Stop.LOST:
                    self._ended = Stop.LOST
                    return self._ended_result(Stop.LOST)
            if attempt + 1 < reads:
                await self._pause(self.settings.confirm_interval)
        return None

    def _claim_lapsed(self) -> bool:
        """Whether our claim may be another worker's by now: past its deadline, on a session that is not
        ``running``. The fleet keeps an expired claim on a running session with its worker (see
        docs/fleet-api.md), so only then is serving on worth the risk of a second launch."""
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
            remaining = (deadline - time.time()) if deadline is not None else self.settings.renew_margin * 2
            wait = renew_delay(remaining, self.settings.renew_margin, jitter=random.random())  # noqa: S311
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
                        "give it to another worker: stopping %s",
                        exc,
                        self.WHAT,
                        extra=self._extra,
                    )
                    self._ended = Stop.LAPSED
                    self._wake.set()
                    return
                log.warning("%s; renewing again soon", exc, extra=self._extra)
                continue
            failures = 0
            self.claim = entry
            self._see(entry)
            self._remember_token()
            self.metrics.inc("renewals")
            log.debug("renewed the claim until %s", entry.status.claim_deadline, extra=self._extra)
            if entry.status.session_status == SessionStatus.TERMINATED:
                self._wake.set()
