"""The driver back-off counts what the fleet saw: a session that failed without ever being served is a start
failure, whatever the platform briefly reported of its worker (issue 37, point 10; docs/orchestrator.md,
"Fast failure"; what served means is plan.session_served, held to a table in test_orchestrator_plan.py).

Orchestrators in this process against the simulator, with the schedule scaled to fractions of a second
(``FAST``), on the code every driver shares (orchestrator/machine.py, queue.py): a scripted driver that
reports each worker running once and then failed, as podman reports a container whose ``exec`` of the
worker fails with 127, for fresh sessions and for sessions ``running`` already when claimed; and the real
``process`` driver with a worker that starts and exits at once. Each must back off: ``/healthz`` says
``backing off`` with the reason, the gauge is above 0, and the simulator's claim history stays within what
the schedule allows. Before the fix none of them backed off: a worker seen running reset the count.
test_orchestrator_podman_backoff.py runs the same with real podman and an image whose worker cannot run.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from orchestrator_fakes import Running, ScriptedDriver
from test_orchestrator_fast_failure import FAST, Observed, claims_allowed, start

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator import backoff
from devin_outposts.orchestrator.drivers.base import WorkerState, WorkerStatus
from devin_outposts.orchestrator.drivers.process import ProcessDriver
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for

__all__ = ["start"]  # the fixture, shared with the back-off's own tests

SLOTS = 5


class RunsOnce:
    """A script: each session's worker is running at its first status read, then failed with
    ``exec-failed`` (podman's container that runs for a moment before ``exec`` of the worker fails)."""

    def __init__(self) -> None:
        self.reads: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, sid: str, starts: int) -> WorkerStatus:
        with self.lock:
            self.reads[sid] = self.reads.get(sid, 0) + 1
            first = self.reads[sid] == 1
        if first:
            return WorkerStatus(WorkerState.RUNNING)
        return WorkerStatus(WorkerState.FAILED, exit_code=127, reason="exec-failed", detail="exit 127")


def assert_backed_off(seen: Observed, reason: str, began: float) -> None:
    """``/healthz`` and the gauge show the pause, the failures are counted with ``reason``, and the claims
    stay within what the schedule allows since ``began``."""
    status, body = wait_for(seen.backing_off, timeout=30, what="/healthz to say backing off")
    assert status == 200 and body["reason"] == reason and body["failures"] >= FAST.threshold, body
    assert body["pause_seconds"] > 0
    assert seen.metric("outposts_driver_backoff_seconds") > 0
    assert seen.metric("outposts_start_failures_total", reason=reason) >= FAST.threshold
    claims = seen.claimed()
    assert len(claims) <= claims_allowed(FAST, SLOTS, time.monotonic() - began), claims
    assert not any(seen.sim.admin.connections(sid) for sid in claims)  # nothing was ever served


@pytest.mark.parametrize("running_at_claim", [False, True], ids=["fresh", "running-when-claimed"])
def test_workers_running_for_a_moment_then_failing_back_the_driver_off(
    sim: SimHandle,
    outpost: Outpost,
    start: Callable[..., tuple[Running, Observed]],
    running_at_claim: bool,
) -> None:
    driver = ScriptedDriver(RunsOnce())  # no status source: every read is the script's, the first one too
    sessions = [sim.admin.enqueue(outpost.outpost_id).session_id for unused in range(12)]
    if running_at_claim:  # an earlier worker served them: the queue cannot tell ours serving
        for sid in sessions:
            sim.admin.set_status(sid, "running")
    began = time.monotonic()
    orch, seen = start(driver, max_concurrent=SLOTS)
    assert_backed_off(seen, "exec-failed", began)
    assert all(r.infrastructure and r.reason == "exec-failed" for r in orch.orchestrator.results)
    assert set(seen.claimed()) <= set(sessions)


def test_a_session_running_when_claimed_is_served_once_its_worker_runs_long_enough(
    sim: SimHandle,
    outpost: Outpost,
    start: Callable[..., tuple[Running, Observed]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other side of the rule for a session the queue cannot tell: its worker running ``served_after``
    without a break ends the back-off that its neighbours' failures started."""
    monkeypatch.setattr(backoff, "SCHEDULE", dataclasses.replace(FAST, served_after=1.0))
    healthy = threading.Event()
    failing = RunsOnce()

    def script(sid: str, starts: int) -> WorkerStatus:
        return WorkerStatus(WorkerState.RUNNING) if healthy.is_set() else failing(sid, starts)

    driver = ScriptedDriver(script)
    sessions = [sim.admin.enqueue(outpost.outpost_id).session_id for unused in range(6)]
    for sid in sessions:
        sim.admin.set_status(sid, "running")
    orch, seen = start(driver, max_concurrent=2)
    wait_for(seen.backing_off, timeout=30, what="/healthz to say backing off")
    healthy.set()
    fresh = sim.admin.enqueue(outpost.outpost_id).session_id
    sim.admin.set_status(fresh, "running")
    wait_for(lambda: seen.health() == (200, {"status": "ok"}), timeout=30, what="the back-off to end")
    assert seen.metric("outposts_driver_backoff_seconds") == 0
    assert driver.machines  # kept: their sessions are served
    assert not [r for r in orch.orchestrator.results if r.session_id in driver.machines]


def exits_at_once(path: Path) -> Path:
    """A worker command that starts and exits 3 at once, never serving."""
    path.write_text("#!/bin/sh\nexit 3\n")
    path.chmod(0o755)
    return path


def test_a_process_worker_that_exits_at_once_backs_the_driver_off(
    sim: SimHandle,
    outpost: Outpost,
    tmp_path: Path,
    start: Callable[..., tuple[Running, Observed]],
) -> None:
    driver = ProcessDriver(tmp_path / "process", (str(exits_at_once(tmp_path / "worker")),), stop_grace=2)
    sessions = [sim.admin.enqueue(outpost.outpost_id).session_id for unused in range(12)]
    began = time.monotonic()
    options: dict[str, Any] = {"max_concurrent": SLOTS, "restart_limit": 1}
    orch, seen = start(driver, **options)
    # Each session's worker exits 3, is restarted once, exits again: given up, never served.
    assert_backed_off(seen, "worker-exited", began)
    assert all(r.gave_up for r in orch.orchestrator.results), orch.orchestrator.results
    assert set(seen.claimed()) <= set(sessions)
