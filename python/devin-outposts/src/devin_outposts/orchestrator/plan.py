"""The orchestrator's decisions, as pure functions: what it observed goes in, what to do comes out.

The code around them reads the world (the driver, the fleet API) and acts, in the order it always has:
a machine's status is read, then judged; a session's queue entry is fetched only when a decision needs it.
What is decided from what was read is here, and python/devin-outposts/tests/test_orchestrator_plan.py
holds each decision to a table of cases (docs/orchestrator.md, "The loop" and "Garbage collection"):

* :func:`judge_worker`: what one status read of a session's machine means: wait, the worker exited, the
  platform restarted it in place, or give up (it never came up, it runs without the session being served,
  or the machine vanished);
* :func:`sweep_machine`: what the sweep does with a machine no session of ours runs on: collect it, after
  keeping a suspended session's state as a snapshot under the ``snapshot`` policy, and why;
* :func:`snapshot_expired` and :func:`snapshot_unneeded`: whether the sweep drops a snapshot, and why;
* :func:`capacity_stuck`: whether every slot is held by a session whose worker does not come up;
* :func:`session_served`: whether a session has been served, for the driver back-off.

What to claim is decided in core, for both programs: :meth:`~devin_outposts.core.feed.QueueFeed.next_claim`,
and restart recovery in :class:`~devin_outposts.core.claiming.ClaimLoop` with
:meth:`~devin_outposts.orchestrator.queue.MachineHost.recovery`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from devin_outposts.api.models import QueueEntry, SessionStatus
from devin_outposts.orchestrator.drivers.base import Snapshot, WorkerState, WorkerStatus
from devin_outposts.orchestrator.options import ResumePolicy


class Verdict(str, enum.Enum):
    """What one status read of a session's machine means."""

    __str__ = str.__str__

    WAIT = "wait"  # read it again after --status-interval-secs
    EXITED = "exited"  # the worker ended with ``exit_code``: serving confirms the status, maybe relaunches
    RESTARTED = "restarted"  # the platform restarted a failed worker itself (a Pod): re-attach, do not start
    GIVE_UP = "give up"  # an infrastructure error (``why``): release the claim, tear the machine down


@dataclass(frozen=True)
class WorkerReading:
    verdict: Verdict
    #: The worker's exit code (EXITED, RESTARTED; 1 when the platform did not say).
    exit_code: int = 0
    #: Why the session is given up (GIVE_UP): a sentence, and the short cause a metric counts by.
    why: str = ""
    reason: str = ""


WAIT = WorkerReading(Verdict.WAIT)


def judge_worker(
    status: WorkerStatus,
    *,
    machine: str,
    base_restarts: int,
    served: bool,
    booting_too_long: bool,
    boot_timeout: float,
    latest: Optional[QueueEntry],
    failing_for: float = 0.0,
    failure_grace: float = 30.0,
) -> WorkerReading:
    """Judge one status read of the worker in ``machine``. ``base_restarts`` is the platform's restart
    count when this launch began; ``served``: the session's queue entry says ``running`` (as of
    ``latest``); ``booting_too_long``: more than ``boot_timeout`` seconds since the launch;
    ``failing_for``: seconds the platform has named the same reason for not starting the worker
    (``status.reason`` while ``starting``), given up at ``failure_grace``."""
    if status.state is WorkerState.FAILED:
        return WorkerReading(
            Verdict.GIVE_UP,
            why=f"the worker in machine {machine} cannot start: {_cause(status)}",
            reason=status.reason or "failed",
        )
    if status.state is WorkerState.RUNNING:
        if status.restarts > base_restarts:
            return WorkerReading(Verdict.RESTARTED, status.exit_code if status.exit_code else 1)
        if not served and booting_too_long:
            seen = latest.status.session_status if latest else "unknown"
            return WorkerReading(
                Verdict.GIVE_UP,
                why=f"the worker in machine {machine} has run for {boot_timeout:g}s without the session "
                f"being served (session_status still {seen})",
                reason="not-served",
            )
        return WAIT
    if status.state is WorkerState.EXITED:
        return WorkerReading(Verdict.EXITED, status.exit_code if status.exit_code is not None else 1)
    if status.state is WorkerState.MISSING:
        return WorkerReading(
            Verdict.GIVE_UP, why=f"machine {machine} vanished ({status.detail or 'gone'})", reason="missing"
        )
    if status.reason and failing_for >= failure_grace:
        return WorkerReading(
            Verdict.GIVE_UP,
            why=f"the worker in machine {machine} did not start: {_cause(status)} "
            f"for {_seconds(failing_for)}",
            reason=status.reason,
        )
    if booting_too_long:
        return WorkerReading(
            Verdict.GIVE_UP,
            why=f"the worker in machine {machine} did not come up within {boot_timeout:g}s "
            f"({status.detail or status.state})",
            reason=status.reason or "boot-timeout",
        )
    return WAIT


def _seconds(seconds: float) -> str:
    """``45s``, or ``0.3s`` below ten seconds (a test's short grace must not read as ``0s``)."""
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"


def _cause(status: WorkerStatus) -> str:
    """``reason (detail)``, or whichever of the two the platform gave."""
    if status.reason and status.detail and status.reason not in status.detail:
        return f"{status.reason} ({status.detail})"
    return status.detail or status.reason or str(status.state)


@dataclass(frozen=True)
class MachineSweep:
    """The sweep collects a machine no session of ours runs on; ``snapshot_first``: keep its state."""

    why: str
    snapshot_first: bool = False


def sweep_machine(entry: Optional[QueueEntry], *, acceptor_id: str, policy: ResumePolicy) -> MachineSweep:
    """A machine of ours that no running session of ours is on (nor about to be adopted), given its
    session's queue entry (None: gone)."""
    if entry is None:
        return MachineSweep("its session is gone")
    status = entry.status
    if status.session_status in (SessionStatus.TERMINATED, SessionStatus.SUSPENDED):
        why = f"its session is {status.session_status}"
    elif status.acceptor_id not in (None, acceptor_id):
        why = "its session is claimed by another acceptor"
    else:
        why = "no session of this orchestrator runs on it"
    if status.session_status == SessionStatus.SUSPENDED and policy is ResumePolicy.SNAPSHOT:
        return MachineSweep(f"{why}; its state was kept as a snapshot", snapshot_first=True)
    return MachineSweep(why)


def snapshot_expired(snapshot: Snapshot, *, ttl: Optional[float], now: float) -> Optional[str]:
    """Why a snapshot no running session uses goes whatever its session's state (the TTL passed), else
    None: then its session's entry decides (:func:`snapshot_unneeded`)."""
    if ttl is not None and now - snapshot.created_at > ttl:
        return f"older than the snapshot TTL ({ttl:g}s)"
    return None


def snapshot_unneeded(entry: Optional[QueueEntry]) -> Optional[str]:
    """Why nobody will resume from a snapshot, given its session's queue entry (None: gone); None keeps it."""
    if entry is None:
        return "its session is gone"
    if entry.status.session_status == SessionStatus.TERMINATED:
        return "its session is terminated"
    return None


def capacity_stuck(*, slot_free: bool, not_up_for: Sequence[float], patience: float) -> bool:
    """Every slot is taken and no session's worker has run for ``patience`` seconds (the share of
    ``--boot-timeout`` after which machines count as not coming up; machines still being made do not)."""
    return not slot_free and bool(not_up_for) and all(waited > patience for waited in not_up_for)


def session_served(
    latest: Optional[QueueEntry],
    *,
    acceptor_id: str,
    running_at_claim: bool,
    running_for: Optional[float],
    served_after: float,
) -> bool:
    """Whether a session counts as served, for the driver back-off (docs/orchestrator.md, "Fast failure"),
    given the freshest copy of its queue entry (``latest``) and how long its worker has been seen running
    without a break (``running_for``, None: not running). Served is what the fleet shows: the entry says
    ``running``, held by us, though the claim's answer did not (``running_at_claim``): the remote connected
    to the gateway. A worker the platform reports running is not enough (a container runs for a moment
    before ``exec`` of a worker missing from its image fails). A session ``running`` already when claimed
    (an earlier worker died, a restart took it back) cannot be told by its entry: its worker must have run
    for ``served_after`` seconds."""
    if running_at_claim:
        return running_for is not None and running_for >= served_after
    if latest is None or latest.status.session_status != SessionStatus.RUNNING:
        return False
    return latest.status.acceptor_id in (None, acceptor_id)
