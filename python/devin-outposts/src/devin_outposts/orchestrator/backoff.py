"""Back-off for a driver whose workers keep failing to start: no new claims for a while.

A platform that cannot start workers (a bad image, no capacity, a broken cluster) turns every claim
into a start failure: the session is released within seconds (docs/orchestrator.md, "Fast failure"),
the slot falls free, the next row is claimed, and the orchestrator churns through the queue, holding
rows another orchestrator could serve. :class:`DriverBackoff` stops that:

* a **start failure** is a session that failed (an infrastructure error, or its worker given up after
  the restart limit) without ever being **served**: provisioning failed, the worker could not start, the
  platform named a reason, the boot timeout, a worker that ran for a moment and died. A session served is
  a **success**: the platform works, and the count starts afresh. Served means what the fleet shows, not
  what the platform briefly reported (a container is ``running`` for a moment before ``exec`` of a worker
  missing from its image fails): the session's queue entry says ``running`` (its remote connected to the
  gateway) after a claim whose answer did not; for a session ``running`` already when claimed, which the
  queue cannot tell, its worker seen running without a break for :attr:`~BackoffSchedule.served_after`
  seconds (:func:`~devin_outposts.orchestrator.plan.session_served`);
* after :attr:`BackoffSchedule.threshold` start failures in a row (3: one bad session, or one node's
  bad moment, must not stall a healthy driver) claims pause for :attr:`~BackoffSchedule.first` seconds
  (10), doubling for each further pause in the same run of failures up to :attr:`~BackoffSchedule.cap`
  (300); each pause is shortened by up to :attr:`~BackoffSchedule.jitter` (a fifth) at random, so that
  the orchestrators of a fleet on the same broken platform do not all come back at once;
* when a pause ends, **one** session is claimed (the probe) and claiming waits for its outcome: its
  being served ends the back-off (every slot claims again), its failure starts the next, longer pause.
  Sessions that were already starting when the back-off began fail or succeed as they will: a success
  ends the back-off, a failure only updates the reason (it says nothing new about the platform).

Time is read from :func:`time.monotonic` (``clock``) and jitter drawn from ``draw``; both can be
replaced, so the schedule is tested without waiting.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Callable, Optional

#: Seconds between looks while the probe session is starting (its outcome wakes the claim loop
#: anyway: a finished session wakes it, and so does a session served).
PROBE_RECHECK = 5.0


@dataclasses.dataclass(frozen=True)
class BackoffSchedule:
    """When claims pause, and for how long."""

    #: Start failures in a row before the first pause.
    threshold: int = 3
    #: Seconds of the first pause; each further pause doubles it.
    first: float = 10.0
    #: The longest pause.
    cap: float = 300.0
    #: A pause is shortened by up to this fraction of it, at random.
    jitter: float = 0.2
    #: Seconds a worker must run without a break to count as serving a session whose queue entry said
    #: ``running`` already when it was claimed (the queue cannot tell that session's serving apart).
    served_after: float = 30.0

    def pause(self, step: int, draw: float) -> float:
        """Seconds of pause number ``step`` (1 for the first) for a random ``draw`` in ``[0, 1)``."""
        nominal = min(self.cap, self.first * 2.0 ** min(max(step - 1, 0), 32))
        return nominal * (1.0 - self.jitter * draw)


#: The orchestrator's schedule (looked up when a host is made, so a test can use a faster one).
SCHEDULE = BackoffSchedule()


@dataclasses.dataclass(frozen=True)
class BackoffState:
    """What ``/healthz`` and the logs say of a back-off."""

    #: The platform's reason for the last start failure (``ErrImagePull``, ``provision-failed``...).
    reason: str
    #: Start failures in a row.
    failures: int
    #: Seconds of the current pause.
    pause: float
    #: Seconds until claiming resumes (0: a probe session is starting).
    remaining: float
    #: The probe session, once claimed.
    probe: Optional[str]


class DriverBackoff:
    """Counts start failures in a row and says how long claiming must wait (module docstring)."""

    def __init__(
        self,
        schedule: Optional[BackoffSchedule] = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.schedule = schedule or SCHEDULE
        self.clock = clock
        self.draw = draw
        #: Start failures since the last success.
        self.failures = 0
        #: Pauses in this run of failures (0: not backing off).
        self.step = 0
        #: Seconds of the current pause, and when (``clock``) it ends.
        self.pause = 0.0
        self.paused_until = 0.0
        #: The session claimed after the last pause ended, while it is starting.
        self.probe: Optional[str] = None
        self.last_reason = ""

    @property
    def backing_off(self) -> bool:
        return self.step > 0

    def claim_pause(self) -> float:
        """Seconds to wait before the next claim (0: claim now)."""
        if not self.backing_off:
            return 0.0
        remaining = self.paused_until - self.clock()
        if remaining > 0:
            return remaining
        return PROBE_RECHECK if self.probe is not None else 0.0

    def claimed(self, session_id: str) -> None:
        """A session was claimed: the first one after a pause is the probe."""
        if self.backing_off and self.probe is None and self.clock() >= self.paused_until:
            self.probe = session_id

    def succeeded(self) -> bool:
        """A session was served. True when that ended a back-off."""
        was_backing_off = self.backing_off
        self.failures = self.step = 0
        self.pause = self.paused_until = 0.0
        self.probe = None
        return was_backing_off

    def failed(self, session_id: str, reason: str) -> bool:
        """A session failed to start. True when that started a pause."""
        self.failures += 1
        self.last_reason = reason
        if not self.backing_off:
            if self.failures < self.schedule.threshold:
                return False
        elif session_id != self.probe:
            return False  # it was starting before the back-off began
        self.step += 1
        self.probe = None
        self.pause = self.schedule.pause(self.step, self.draw())
        self.paused_until = self.clock() + self.pause
        return True

    def ended(self, session_id: str) -> None:
        """A session ended neither running nor failing to start (stopped, terminated while it booted):
        if it was the probe, the next claim is the probe instead."""
        if session_id == self.probe:
            self.probe = None

    def state(self) -> Optional[BackoffState]:
        """The back-off now, or None when claims are not held back."""
        if not self.backing_off:
            return None
        remaining = max(0.0, self.paused_until - self.clock())
        return BackoffState(self.last_reason, self.failures, self.pause, remaining, self.probe)
