"""The orchestrator's decisions (orchestrator/plan.py), each held to a table of cases.

Every row is what the orchestrator observed (a machine's status read, a session's queue entry, a
snapshot's age) and what it must decide. The loops that read the world and act on these decisions are
tested end to end in test_orchestrator_unit.py, test_orchestrator_faults.py and the drivers' loop tests.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest

from devin_outposts.api.models import QueueEntry
from devin_outposts.orchestrator.drivers.base import Snapshot, WorkerState, WorkerStatus
from devin_outposts.orchestrator.options import ResumePolicy
from devin_outposts.orchestrator.plan import (
    MachineSweep,
    Verdict,
    WorkerReading,
    capacity_stuck,
    judge_worker,
    session_served,
    snapshot_expired,
    snapshot_unneeded,
    sweep_machine,
)

ME = "orch-1"


def entry(session_status: Optional[str] = "pending", acceptor_id: Optional[str] = None) -> QueueEntry:
    status: dict[str, Any] = {"phase": "claimed" if acceptor_id else "pending", "acceptor_id": acceptor_id}
    if session_status is not None:
        status["session_status"] = session_status
    return QueueEntry.model_validate(
        {"metadata": {"session_id": "devin-1", "outpost_id": "o", "created_at": 1}, "status": status}
    )


RUNNING = WorkerStatus(WorkerState.RUNNING)
STARTING = WorkerStatus(WorkerState.STARTING, detail="image pulling")

# (status read, base restarts, served, booting too long, latest entry) -> reading
WORKER_CASES: list[tuple[str, WorkerStatus, int, bool, bool, Optional[QueueEntry], WorkerReading]] = [
    ("starting, in time", STARTING, 0, False, False, None, WorkerReading(Verdict.WAIT)),
    ("starting, too long", STARTING, 0, False, True, None, WorkerReading(
        Verdict.GIVE_UP, why="the worker in machine m-1 did not come up within 30s (image pulling)",
        reason="boot-timeout")),
    ("starting, too long, no detail", WorkerStatus(WorkerState.STARTING), 0, False, True, None, WorkerReading(
        Verdict.GIVE_UP, why="the worker in machine m-1 did not come up within 30s (starting)",
        reason="boot-timeout")),
    ("running, served", RUNNING, 0, True, True, None, WorkerReading(Verdict.WAIT)),
    ("running, not served yet, in time", RUNNING, 0, False, False, entry(), WorkerReading(Verdict.WAIT)),
    ("running, never served", RUNNING, 0, False, True, entry("pending", ME), WorkerReading(
        Verdict.GIVE_UP, why="the worker in machine m-1 has run for 30s without the session being served "
        "(session_status still pending)", reason="not-served")),
    ("running, never served, no entry read", RUNNING, 0, False, True, None, WorkerReading(
        Verdict.GIVE_UP, why="the worker in machine m-1 has run for 30s without the session being served "
        "(session_status still unknown)", reason="not-served")),
    ("restarted in place, with its code", WorkerStatus(WorkerState.RUNNING, exit_code=3, restarts=2), 1, True,
     False, None, WorkerReading(Verdict.RESTARTED, 3)),
    ("restarted in place, no code", WorkerStatus(WorkerState.RUNNING, restarts=1), 0, False, True, None,
     WorkerReading(Verdict.RESTARTED, 1)),
    ("restarts seen before this launch", WorkerStatus(WorkerState.RUNNING, restarts=2), 2, True, False, None,
     WorkerReading(Verdict.WAIT)),
    ("exited 0", WorkerStatus(WorkerState.EXITED, exit_code=0), 0, True, False, None,
     WorkerReading(Verdict.EXITED, 0)),
    ("exited, code unknown", WorkerStatus(WorkerState.EXITED), 0, False, True, None,
     WorkerReading(Verdict.EXITED, 1)),
    ("vanished", WorkerStatus(WorkerState.MISSING, detail="pod deleted"), 0, True, False, None, WorkerReading(
        Verdict.GIVE_UP, why="machine m-1 vanished (pod deleted)", reason="missing")),
    ("vanished, no detail", WorkerStatus(WorkerState.MISSING), 0, False, False, None, WorkerReading(
        Verdict.GIVE_UP, why="machine m-1 vanished (gone)", reason="missing")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("status", "base", "served", "too_long", "latest", "expected"),
    [case[1:] for case in WORKER_CASES],
    ids=[case[0] for case in WORKER_CASES],
)
def test_what_a_status_read_of_a_machine_means(
    status: WorkerStatus,
    base: int,
    served: bool,
    too_long: bool,
    latest: Optional[QueueEntry],
    expected: WorkerReading,
) -> None:
    reading = judge_worker(
        status,
        machine="m-1",
        base_restarts=base,
        served=served,
        booting_too_long=too_long,
        boot_timeout=30.0,
        latest=latest,
    )
    assert reading == expected


PULLING = WorkerStatus(WorkerState.STARTING, detail='image "nope" not found', reason="ErrImagePull")
UNPLACED = WorkerStatus(WorkerState.STARTING, reason="Unschedulable")

# (status read, seconds its reason has been named, booting too long) -> reading; the grace is 30 s
FAILING_CASES: list[tuple[str, WorkerStatus, float, bool, WorkerReading]] = [
    ("cannot start, at once", WorkerStatus(WorkerState.FAILED, detail="no such image", reason="pull-error"),
     0.0, False, WorkerReading(Verdict.GIVE_UP, why="the worker in machine m-1 cannot start: pull-error (no "
                               "such image)", reason="pull-error")),
    ("cannot start, no reason given", WorkerStatus(WorkerState.FAILED), 0.0, False, WorkerReading(
        Verdict.GIVE_UP, why="the worker in machine m-1 cannot start: failed", reason="failed")),
    ("a reason, within its grace", PULLING, 29.9, False, WorkerReading(Verdict.WAIT)),
    ("a reason, past its grace", PULLING, 30.0, False, WorkerReading(
        Verdict.GIVE_UP, why='the worker in machine m-1 did not start: ErrImagePull (image "nope" not found) '
        "for 30s", reason="ErrImagePull")),
    ("a reason without detail, past its grace", UNPLACED, 45.0, False, WorkerReading(
        Verdict.GIVE_UP, why="the worker in machine m-1 did not start: Unschedulable for 45s",
        reason="Unschedulable")),
    ("a reason, boot timeout first", UNPLACED, 5.0, True, WorkerReading(
        Verdict.GIVE_UP, why="the worker in machine m-1 did not come up within 30s (starting)",
        reason="Unschedulable")),
    ("no reason, however long", STARTING, 100.0, False, WorkerReading(Verdict.WAIT)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("status", "failing_for", "too_long", "expected"),
    [case[1:] for case in FAILING_CASES],
    ids=[case[0] for case in FAILING_CASES],
)
def test_a_worker_that_cannot_start_is_given_up_after_its_grace(
    status: WorkerStatus, failing_for: float, too_long: bool, expected: WorkerReading
) -> None:
    reading = judge_worker(
        status,
        machine="m-1",
        base_restarts=0,
        served=False,
        booting_too_long=too_long,
        boot_timeout=30.0,
        latest=None,
        failing_for=failing_for,
        failure_grace=30.0,
    )
    assert reading == expected


START_FRESH, SNAPSHOT = ResumePolicy.START_FRESH, ResumePolicy.SNAPSHOT

# (session's entry, policy) -> what the sweep does with the machine
MACHINE_CASES: list[tuple[str, Optional[QueueEntry], ResumePolicy, MachineSweep]] = [
    ("session gone", None, SNAPSHOT, MachineSweep("its session is gone")),
    ("terminated", entry("terminated", ME), SNAPSHOT, MachineSweep("its session is terminated")),
    ("suspended, start fresh", entry("suspended"), START_FRESH, MachineSweep("its session is suspended")),
    ("suspended, snapshot", entry("suspended"), SNAPSHOT,
     MachineSweep("its session is suspended; its state was kept as a snapshot", snapshot_first=True)),
    ("claimed by another", entry("running", "orch-2"), SNAPSHOT,
     MachineSweep("its session is claimed by another acceptor")),
    ("our claim lapsed", entry("running", ME), START_FRESH,
     MachineSweep("no session of this orchestrator runs on it")),
    ("pending, unclaimed", entry("pending"), START_FRESH,
     MachineSweep("no session of this orchestrator runs on it")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("seen", "policy", "expected"),
    [case[1:] for case in MACHINE_CASES],
    ids=[case[0] for case in MACHINE_CASES],
)
def test_what_the_sweep_does_with_a_machine_no_session_runs_on(
    seen: Optional[QueueEntry], policy: ResumePolicy, expected: MachineSweep
) -> None:
    assert sweep_machine(seen, acceptor_id=ME, policy=policy) == expected


def snapshot(created_at: float) -> Snapshot:
    return Snapshot("devin-1", "o", ME, created_at, "ref-1")


@pytest.mark.parametrize(
    ("created_at", "ttl", "expected"),
    [
        (0.0, None, None),  # no TTL: kept until its session is terminated
        (900.0, 600.0, None),  # 100 s old
        (300.0, 600.0, "older than the snapshot TTL (600s)"),
        (399.0, 600.5, "older than the snapshot TTL (600.5s)"),
    ],
)
def test_a_snapshot_past_its_ttl_goes_whatever_its_session(
    created_at: float, ttl: Optional[float], expected: Optional[str]
) -> None:
    assert snapshot_expired(snapshot(created_at), ttl=ttl, now=1000.0) == expected


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        (None, "its session is gone"),
        (entry("terminated"), "its session is terminated"),
        (entry("suspended"), None),  # its resume will restore it
        (entry("running", ME), None),  # resumed here or elsewhere: kept until terminated
        (entry("pending"), None),
    ],
    ids=["gone", "terminated", "suspended", "running", "pending"],
)
def test_a_snapshot_is_kept_until_nobody_can_resume_from_it(
    seen: Optional[QueueEntry], expected: Optional[str]
) -> None:
    assert snapshot_unneeded(seen) == expected


@pytest.mark.parametrize(
    ("slot_free", "not_up_for", "stuck"),
    [
        (False, [31.0, 40.0], True),  # full, and no worker has run for half the boot timeout
        (False, [31.0, 10.0], False),  # one is still within its patience
        (False, [31.0, 0.0], False),  # one runs
        (True, [31.0, 40.0], False),  # a free slot: capacity is not full
        (False, [], False),  # nothing runs at all
    ],
)
def test_capacity_is_stuck_only_when_every_slot_waits_past_its_patience(
    slot_free: bool, not_up_for: list[float], stuck: bool
) -> None:
    assert capacity_stuck(slot_free=slot_free, not_up_for=not_up_for, patience=30.0) is stuck


# (latest entry, running when claimed, seconds its worker has run without a break) -> served, for the
# driver back-off; served_after is 30 s
SERVED_CASES: list[tuple[str, Optional[QueueEntry], bool, Optional[float], bool]] = [
    ("no entry read yet", None, False, 5.0, False),
    ("worker running, entry still pending", entry("pending", ME), False, 600.0, False),
    ("entry running: the remote connected", entry("running", ME), False, 0.5, True),
    ("entry running, worker no longer running", entry("running", ME), False, None, True),
    ("entry running under another acceptor", entry("running", "orch-2"), False, 5.0, False),
    ("entry running, no acceptor on it", entry("running"), False, 5.0, True),
    ("entry suspended", entry("suspended", ME), False, 5.0, False),
    ("running when claimed, worker ran a moment", entry("running", ME), True, 0.3, False),
    ("running when claimed, worker not running", entry("running", ME), True, None, False),
    ("running when claimed, worker ran long enough", entry("running", ME), True, 30.0, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("latest", "at_claim", "running_for", "expected"),
    [case[1:] for case in SERVED_CASES],
    ids=[case[0] for case in SERVED_CASES],
)
def test_session_served(
    latest: Optional[QueueEntry], at_claim: bool, running_for: Optional[float], expected: bool
) -> None:
    assert (
        session_served(
            latest, acceptor_id=ME, running_at_claim=at_claim, running_for=running_for, served_after=30.0
        )
        is expected
    )
