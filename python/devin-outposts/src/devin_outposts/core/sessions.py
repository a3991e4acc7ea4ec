"""A claimed session, as the pool, the claim loop and serving share it.

* how serving a session ends: :class:`Outcome` and :class:`SessionResult`, and :class:`LaunchError` (what
  runs the session could not be made or started: infrastructure, not the session);
* why the supervision of a running launch ended, and so what happens to the session next: :class:`Stop`;
* what serving needs from the fleet client (:class:`SessionFleet`), from the program's config
  (:class:`ServeSettings`) and from one launch (:class:`Run`);
* the two claim rules serving and the claim loop both follow: :func:`release_claim` (never raises) and
  :func:`renew_delay`.

:class:`~devin_outposts.core.serving.ClaimedSession` is the serving itself.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import Any, Optional, Protocol

from devin_outposts.api.errors import FleetAuthError, FleetCutShort, FleetError
from devin_outposts.api.models import QueueEntry, SessionStatus

log = logging.getLogger(__name__)


class Outcome(str, enum.Enum):
    """How serving a session ended, as the worker counts it."""

    __str__ = str.__str__  # logs and messages show the value (Python 3.11 would show Outcome.SERVED)

    SERVED = "served"  # the session ended (terminated, suspended or gone) and the claim was released
    FAILED = "failed"  # the remote failed past the restart limit, the binary was refused, ...
    LOST = "lost"  # another worker holds the claim now: the remote was stopped, nothing released
    INTERRUPTED = "interrupted"  # the worker stopped it (drain timeout, second signal) and released
    DETACHED = "detached"  # left running, claim kept, for the next start to adopt (orchestrator)


SERVED, FAILED, LOST, INTERRUPTED = Outcome.SERVED, Outcome.FAILED, Outcome.LOST, Outcome.INTERRUPTED
DETACHED = Outcome.DETACHED


class Stop(str, enum.Enum):
    """Why the supervision of a running launch ended (what the status checks, renewals and the owner
    decided), and so what happens to the session next."""

    __str__ = str.__str__

    EXITED = "exited"  # it exited on its own: confirm the status, maybe launch again
    TERMINATED = "terminated"  # session_status is terminated: stop it, release
    GONE = "gone"  # the queue entry vanished (404): stop it, release
    LOST = "lost"  # the claim is another acceptor's: stop it, do not release
    LAPSED = "lapsed"  # the deadline passed unrenewed on a session not running: stop, do not release
    STOPPED = "stopped"  # the owner asked (drain timeout, second signal): stop, release
    DETACHED = "detached"  # the owner leaves it running (orchestrator shutdown): no stop, no release
    FATAL = "fatal"  # the token was refused: stop everything


class LaunchError(Exception):
    """What runs the session could not be made or started (infrastructure, not the session).
    ``reason`` names the platform's cause when it gave one (``ErrImagePull``, ``Unschedulable``)."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


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


class ServeSettings(Protocol):
    """The tunables serving reads (both the worker's and the orchestrator's configs have them)."""

    @property
    def restart_limit(self) -> int:
        """Launches after the first before giving up."""

    @property
    def stop_grace(self) -> float:
        """Seconds between asking a launch to stop and forcing it."""

    @property
    def renew_margin(self) -> float:
        """Renew at least this long before the claim expires."""

    @property
    def confirm_reads(self) -> int:
        """Status reads after an exit 0."""

    @property
    def confirm_interval(self) -> float:
        """Seconds between those reads."""

    @property
    def poll_interval(self) -> float:
        """Seconds between status checks while a launch runs."""

    @property
    def gateway_url(self) -> Optional[str]:
        """The gateway when a claim carries none."""

    @property
    def interruptible_prepare(self) -> bool:
        """A stop (a signal, the drain) cuts a session's prepare short and the session ends unlaunched: the
        worker's prepare only downloads ``devin-remote``, which is safe to abandon; the orchestrator's
        provisions a machine, which must finish to be torn down."""


class Run(Protocol):
    """One launch of what serves the session (a ``devin-remote`` process, a worker in a machine)."""

    @property
    def returncode(self) -> Optional[int]:
        """The exit code once it ended, else None."""

    def describe(self) -> str:
        """A few words for the log: "pid 1234", "container outpost-worker-..."."""

    async def wait_exit(self) -> int:
        """Wait until it exits (cancellable, no clean-up)."""

    async def wait(self) -> int:
        """Wait until it exits, then clean up after it; the exit code."""

    async def stop(self, grace: float) -> int:
        """Ask it to stop, force it after ``grace`` seconds; the exit code."""


@dataclass
class SessionResult:
    session_id: str
    outcome: Outcome
    detail: str
    session_status: Optional[SessionStatus] = None
    refused_binary: bool = False
    #: The session's network policy is enabled and cannot be enforced where it was to run.
    refused_policy: bool = False
    #: The session is over for good (terminated, or its entry gone): its state can go.
    finished: bool = False
    #: What runs the session failed (a machine not made, not booted): not the session's fault.
    infrastructure: bool = False
    #: The launch kept failing past the restart limit and the session was given up.
    gave_up: bool = False
    #: The platform's name for why what runs the session could not start (:class:`LaunchError`).
    reason: str = ""


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
        except FleetCutShort as exc:  # past what a second signal left the requests: no further attempt
            log.warning("%s", exc, extra=extra)
            break
        except FleetError as exc:
            log.warning("%s (attempt %d of %d)", exc, attempt + 1, attempts, extra=extra)
            if attempt + 1 < attempts:
                await asyncio.sleep(0.5 * (attempt + 1))
    log.error("giving up releasing session %s; its claim will expire on its own", session_id, extra=extra)
    return False


#: The share of a claim's remaining time by which a renewal may come early (see :func:`renew_delay`).
RENEW_JITTER = 0.1


def renew_delay(remaining: float, margin: float, jitter: float = 0.0) -> float:
    """Seconds to wait before renewing a claim that expires in ``remaining`` seconds.

    Renew ``margin`` seconds before the deadline, but never later than when two thirds of the remaining
    time have passed nor sooner than one third: a 300 s claim with a 60 s margin renews after 200 s, a 3 s
    test claim after 1 s. ``jitter`` (0 to 1, a fresh random number per renewal) brings the renewal
    forward by up to :data:`RENEW_JITTER` of the remaining time (never before the one-third point): claims
    taken in one burst (an orchestrator's start, a queue filled at once) would otherwise be renewed in
    one burst at every turn, for as long as they run. Earlier is always safe; later never happens.
    """
    if remaining <= 0:
        return 0.0
    wait = max(min(remaining - margin, remaining * 2 / 3), remaining / 3)
    wait -= min(1.0, max(0.0, jitter)) * min(wait - remaining / 3, remaining * RENEW_JITTER)
    return max(wait, 0.05)
