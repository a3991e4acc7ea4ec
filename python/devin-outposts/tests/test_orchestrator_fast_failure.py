"""A driver that keeps failing to start workers backs off (orchestrator/backoff.py).

The schedule first, as pure functions on a fake clock: no pause before the third start failure in a
row, then 10 s doubling to 300 s (jittered by at most a fifth), one probe session after each pause, the
failures of sessions already starting not counted against the platform twice, and a session served
ending it all. Then the orchestrator with a scripted driver against the simulator: sessions whose
workers never start (a reason on ``starting``, provisioning failures) at ``--max-concurrent 5`` make it
back off (``/healthz`` and ``/metrics`` say so, with the reason), its claims stay bounded and never
take a failed session again first (the simulator's claim history), and a healthy platform ends the
back-off once a session is served. test_orchestrator_backoff_served.py holds what served means.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import pytest
from orchestrator_fakes import Running, ScriptedDriver, ScriptedSource, orchestrators

from devin_outposts.api.models import Outpost
from devin_outposts.core.config import MetricsAddr
from devin_outposts.orchestrator import backoff
from devin_outposts.orchestrator.backoff import PROBE_RECHECK, BackoffSchedule, DriverBackoff
from devin_outposts.orchestrator.drivers.base import WorkerState, WorkerStatus
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for

ACCEPTOR = "orch-fast-failure"
#: The test's schedule: the default's shape (3 in a row, doubling, capped) in fractions of a second.
FAST = BackoffSchedule(threshold=3, first=0.5, cap=2.0, jitter=0.2)


def claims_allowed(schedule: BackoffSchedule, slots: int, elapsed: float) -> int:
    """The most claims ``schedule`` allows in the first ``elapsed`` seconds of an orchestrator with
    ``slots`` slots on a platform where no session is served: every slot, one more for each failure
    before the one that starts the first pause, and one probe for each pause over by then, every pause
    at its shortest (jitter shortens each by at most ``schedule.jitter``)."""
    claims = slots + schedule.threshold - 1
    step, paused = 1, 0.0
    while True:
        paused += schedule.pause(step, 1.0)
        if paused > elapsed:
            return claims
        claims += 1
        step += 1


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_backoff(clock: FakeClock, draw: float = 0.0) -> DriverBackoff:
    return DriverBackoff(BackoffSchedule(), clock=clock, draw=lambda: draw)


# --- the schedule ------------------------------------------------------------------------------------


def test_the_pauses_double_from_10_s_to_the_300_s_cap_and_jitter_only_shortens_them() -> None:
    schedule = BackoffSchedule()
    assert [schedule.pause(step, 0.0) for step in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert schedule.pause(10_000, 0.0) == 300  # no overflow after a week of failures
    assert schedule.pause(1, 0.999) == pytest.approx(8.002)
    assert schedule.pause(6, 0.5) == pytest.approx(270)


def test_one_or_two_failures_do_not_pause_a_driver_that_then_starts_a_worker() -> None:
    clock = FakeClock()
    state = make_backoff(clock)
    assert not state.failed("s1", "ErrImagePull")
    assert not state.failed("s2", "ErrImagePull")
    assert state.claim_pause() == 0 and state.state() is None
    assert not state.succeeded()  # nothing to end, and the count starts afresh
    assert not state.failed("s3", "ErrImagePull")
    assert not state.failed("s4", "ErrImagePull")
    assert state.claim_pause() == 0


def test_a_run_of_failures_pauses_then_probes_with_one_session_and_escalates_on_its_failure() -> None:
    clock = FakeClock()
    state = make_backoff(clock)
    for sid in ("s1", "s2"):
        state.failed(sid, "ErrImagePull")
    assert state.failed("s3", "Unschedulable")  # the third in a row: the first pause
    assert state.claim_pause() == 10
    report = state.state()
    assert report is not None
    assert (report.reason, report.failures, report.pause, report.remaining, report.probe) == (
        "Unschedulable",
        3,
        10,
        10,
        None,
    )
    clock.now += 4
    assert state.claim_pause() == 6
    # Sessions that were starting when the back-off began fail too: that adds no pause.
    assert not state.failed("s4", "ErrImagePull")
    assert not state.failed("s5", "ErrImagePull")
    assert state.claim_pause() == 6 and state.failures == 5
    state.claimed("early")  # taken back at start-up during the pause: not the probe
    clock.now += 6
    assert state.claim_pause() == 0  # the pause is over: one session may be claimed
    state.claimed("probe-1")
    state.claimed("second")  # the claim loop claims no second one; if anything did, it is no probe
    assert state.probe == "probe-1"
    assert state.claim_pause() == PROBE_RECHECK  # claiming waits on the probe
    assert not state.failed("second", "ErrImagePull")
    assert state.claim_pause() == PROBE_RECHECK
    pauses = []
    for step in range(2, 8):
        assert state.failed(state.probe or "", "ErrImagePull")  # the probe failed: a longer pause
        pauses.append(state.claim_pause())
        clock.now += state.claim_pause()
        state.claimed(f"probe-{step}")
    assert pauses == [20, 40, 80, 160, 300, 300]


def test_a_session_served_ends_the_back_off_and_a_probe_that_ends_otherwise_is_replaced() -> None:
    clock = FakeClock()
    state = make_backoff(clock, draw=0.5)
    for sid in ("s1", "s2", "s3"):
        state.failed(sid, "pull-error")
    assert state.claim_pause() == pytest.approx(9.0)  # 10 s shortened by half the jitter
    clock.now += 9
    state.claimed("p1")
    state.ended("p1")  # stopped while it booted: it says nothing of the platform
    assert state.claim_pause() == 0  # the next claim is the probe
    state.claimed("p2")
    report = state.state()
    assert report is not None and report.probe == "p2"
    assert state.succeeded()  # a session served (the probe, or one that was starting all along)
    assert state.claim_pause() == 0 and state.state() is None and state.failures == 0
    assert not state.failed("s4", "pull-error")  # one failure after a success: no pause


# --- the orchestrator --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Observed:
    """``/healthz`` and ``/metrics`` of an orchestrator, and its claims in the simulator."""

    def __init__(self, sim: SimHandle, port: int) -> None:
        self.sim = sim
        self.base = f"http://127.0.0.1:{port}"

    def health(self) -> tuple[int, dict[str, Any]]:
        response = httpx.get(f"{self.base}/healthz", timeout=5)
        return response.status_code, response.json()

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"{self.base}/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            series, value = line.rsplit(" ", 1)
            if series.split("{", 1)[0] != name:
                continue
            if all(f'{key}="{wanted}"' in series for key, wanted in labels.items()):
                return float(value)
        return 0.0

    def claimed(self) -> list[str]:
        """The sessions our claim POSTs took (renewals aside), in order."""
        records = self.sim.admin.claims(acceptor_id=ACCEPTOR)
        return [r["session_id"] for r in records if r["action"] == "claim"]

    def backing_off(self) -> Optional[tuple[int, dict[str, Any]]]:
        """``/healthz``'s answer while it says ``backing off``, else None."""
        answer = self.health()
        return answer if answer[1]["status"] == "backing off" else None

    def released(self, session_id: str) -> bool:
        return any(r["action"] == "release" for r in self.sim.admin.claims(session_id=session_id))


@pytest.fixture
def start(
    sim: SimHandle, outpost: Outpost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., tuple[Running, Observed]]]:
    monkeypatch.setattr(backoff, "SCHEDULE", FAST)
    with orchestrators(
        sim,
        tmp_path / "state",
        outpost=outpost.name,
        max_concurrent=5,
        acceptor_id=ACCEPTOR,
        gc_interval=30.0,
        start_failure_grace=0.3,
    ) as orchestrator:

        def run(driver: ScriptedDriver, **overrides: Any) -> tuple[Running, Observed]:
            port = free_port()
            options: dict[str, Any] = {"metrics_addr": MetricsAddr("127.0.0.1", port), **overrides}
            return orchestrator(driver, **options), Observed(sim, port)

        yield run


@pytest.mark.timeout(120)
def test_workers_that_never_start_back_the_driver_off_until_a_session_is_served(
    sim: SimHandle, outpost: Outpost, start: Callable[..., tuple[Running, Observed]]
) -> None:
    healthy = threading.Event()

    def script(sid: str, starts: int) -> WorkerStatus:
        if healthy.is_set():
            return WorkerStatus(WorkerState.RUNNING)
        return WorkerStatus(
            WorkerState.STARTING, detail='pulling "registry.test/nope"', reason="ErrImagePull"
        )

    driver = ScriptedDriver(script)
    driver.source = ScriptedSource(driver)
    orch, seen = start(driver)
    failing = [sim.admin.enqueue(outpost.outpost_id).session_id for unused in range(10)]

    status, body = wait_for(seen.backing_off, timeout=30, what="/healthz to say backing off")
    # 200: a liveness probe must not restart a process that is right to wait (docs/orchestrator.md).
    assert status == 200
    assert body["driver"] == "scripted" and body["reason"] == "ErrImagePull" and body["failures"] >= 3
    assert body["until"].endswith("Z") and body["pause_seconds"] > 0
    assert seen.metric("outposts_driver_backoffs_total") >= 1
    assert seen.metric("outposts_driver_backoff_seconds") > 0

    # Every session is tried once, by a probe after each pause once the back-off began: never more
    # claims than the five slots, the two failures before the third, and one per pause.
    wait_for(lambda: all(seen.released(sid) for sid in failing), timeout=60, what="every session tried")
    wait_for(
        lambda: seen.metric("outposts_start_failures_total", reason="ErrImagePull") >= 10,
        timeout=30,
        what="ten start failures counted",
    )
    claims = seen.claimed()
    pauses = seen.metric("outposts_driver_backoffs_total")
    # None taken twice: a failed session waits (ClaimLoop's failed-session cool-down) while others queue.
    assert sorted(claims) == sorted(failing)
    assert seen.metric("outposts_start_failures_total", reason="ErrImagePull") == 10
    assert len(claims) <= 5 + FAST.threshold - 1 + pauses, (claims, pauses)
    # One pause per failed probe after the first: the sessions starting when it began added none.
    assert pauses <= 1 + len(claims) - 5, (claims, pauses)
    assert seen.health()[1]["status"] == "backing off"
    assert orch.orchestrator.results and all(r.reason == "ErrImagePull" for r in orch.orchestrator.results)

    # The platform works again: the next probe's worker runs and serves its session (the test's brain marks
    # each started session running, as a remote connecting would), the back-off ends, every slot claims.
    healthy.set()
    fresh = [sim.admin.enqueue(outpost.outpost_id).session_id for unused in range(4)]
    served: set[str] = set()

    def serve_started() -> bool:
        for sid in fresh:
            if sid not in served and driver.starts(sid):
                sim.admin.set_status(sid, "running")
                served.add(sid)
        return served == set(fresh)

    wait_for(serve_started, timeout=30, what="the fresh sessions claimed and served")
    wait_for(lambda: len(driver.machines) == 4, timeout=30, what="four machines with running workers")
    assert seen.health() == (200, {"status": "ok"})
    assert seen.metric("outposts_driver_backoff_seconds") == 0
    assert seen.claimed().count(fresh[0]) == 1


@pytest.mark.timeout(120)
def test_provisioning_failures_back_off_with_their_own_reason(
    sim: SimHandle, outpost: Outpost, start: Callable[..., tuple[Running, Observed]]
) -> None:
    driver = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.RUNNING), fail_provision=True)
    driver.source = ScriptedSource(driver)
    orch, seen = start(driver, max_concurrent=2)
    sessions = [sim.admin.enqueue(outpost.outpost_id).session_id for unused in range(6)]
    status, body = wait_for(seen.backing_off, timeout=30, what="/healthz to say backing off")
    assert status == 200 and body["reason"] == "provision-failed"
    assert seen.metric("outposts_start_failures_total", reason="provision-failed") >= 3
    assert seen.metric("outposts_infrastructure_errors_total") >= 3
    claims = seen.claimed()
    assert len(claims) <= 2 + FAST.threshold - 1 + seen.metric("outposts_driver_backoffs_total")
    assert len(set(claims)) == len(claims) and set(claims) <= set(sessions)
    assert not driver.machines
    assert all(r.infrastructure for r in orch.orchestrator.results)
