"""The driver back-off holds on real podman for an image whose worker cannot run (issue 37, point 10).

A bad image rollout, as it looks on podman: the session image with the worker off ``PATH`` (a one-line
Containerfile layer over this checkout's session image). Each container starts (its ``/bin/sh``
entrypoint runs, and podman reports the container running), then ``exec devin-outposts`` fails with 127.
A real ``devin-outposts orchestrate --driver podman`` process with the documented schedule (3 start
failures in a row, then 10 s, doubling) and 25 sessions queued: its claims, counted in the simulator's
claim history every half second for at least ``WINDOW`` seconds, stay within what the schedule allows, and
``/healthz`` and the ``driver_backoff_seconds`` gauge show the pause. Before the fix the container's moment
of running reset the back-off: 37 claims in 90 s, the gauge at 0 and ``/healthz`` ``ok`` throughout.
test_orchestrator_backoff_served.py holds the same rule on the shared code with no container.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from test_orchestrator_fast_failure import Observed, claims_allowed
from test_orchestrator_podman import needs_podman, podman, session_image
from test_orchestrator_podman_loop import Loop, loop
from test_orchestrator_process import free_port

from devin_outposts.orchestrator.backoff import BackoffSchedule

__all__ = ["loop", "session_image"]  # the fixtures, shared with the driver's other tests

SESSIONS = 25
SLOTS = 5
#: Seconds the sessions stay queued at the least: past the first pause and its probe.
WINDOW = 45.0
#: The documented schedule (docs/orchestrator.md, "Fast failure"), which the orchestrator process runs.
DOCUMENTED = BackoffSchedule()


@pytest.fixture(scope="module")
def workerless_image(session_image: str) -> Iterator[str]:
    """The session image with ``PATH`` that misses the worker's venv (``cat``, which the entrypoint uses
    for the token, is still found): the container runs, the worker cannot."""
    image = f"localhost/devin-outposts-session-noworker:{session_image.rsplit(':', 1)[1]}"
    with tempfile.TemporaryDirectory() as context:
        containerfile = Path(context) / "Containerfile"
        containerfile.write_text(f"FROM {session_image}\nENV PATH=/usr/local/bin:/usr/bin:/bin\n")
        podman("build", "--quiet", "--network", "none", "--pull=never", "-f", str(containerfile), "-t", image,
               context)  # fmt: skip
    yield image
    podman("rmi", image, check=False)  # a layer of metadata; the session image is pruned as before


def health(seen: Observed) -> Optional[tuple[int, dict[str, Any]]]:
    try:
        return seen.health()
    except (httpx.HTTPError, ValueError):  # not listening yet
        return None


def gauge(seen: Observed) -> float:
    try:
        return seen.metric("outposts_driver_backoff_seconds")
    except httpx.HTTPError:
        return 0.0


@needs_podman
def test_an_image_whose_worker_cannot_run_backs_the_driver_off(loop: Loop, workerless_image: str) -> None:
    h = loop
    h.image = workerless_image
    port = free_port()
    seen = Observed(h.sim, port)
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(SESSIONS)]
    began = time.monotonic()
    orch = h.orchestrator("--metrics-addr", f"127.0.0.1:{port}", max_concurrent=SLOTS)

    def claims() -> list[str]:
        return [r["session_id"] for r in h.sim.admin.claims(acceptor_id=h.acceptor) if r["action"] == "claim"]

    paused: Optional[dict[str, Any]] = None  # /healthz's body while it said backing off
    most_gauge = 0.0
    over: list[tuple[int, int, int]] = []  # (seconds, claims, allowed) whenever more than allowed
    while True:
        elapsed = time.monotonic() - began
        if elapsed >= WINDOW and (over or (paused is not None and most_gauge > 0)):
            break
        assert elapsed < 240, f"no pause shown in 240 s\n{h.logs()}"
        count = len(claims())
        allowed = claims_allowed(DOCUMENTED, SLOTS, time.monotonic() - began)
        if count > allowed:
            over.append((round(elapsed), count, allowed))
        answer = health(seen)
        if answer is not None and answer[1]["status"] == "backing off":
            assert answer[0] == 200, answer
            paused = answer[1]
        most_gauge = max(most_gauge, gauge(seen))
        time.sleep(0.5)

    assert not over, (
        f"claims over what the schedule allows (seconds, claims, allowed): first {over[0]}, last {over[-1]}; "
        f"/healthz said backing off: {paused is not None}, gauge at most {most_gauge}\n{h.logs()}"
    )
    taken = claims()
    elapsed = time.monotonic() - began
    assert len(taken) <= claims_allowed(DOCUMENTED, SLOTS, elapsed), (len(taken), elapsed)
    assert set(taken) <= set(sessions)
    assert paused is not None
    assert paused["driver"] == "podman" and paused["reason"] == "exec-failed", paused
    assert paused["failures"] >= DOCUMENTED.threshold and paused["pause_seconds"] > 0, paused
    assert seen.metric("outposts_start_failures_total", reason="exec-failed") >= DOCUMENTED.threshold
    assert seen.metric("outposts_driver_backoffs_total") >= 1
    assert not any(h.sim.admin.connections(sid) for sid in sessions)  # no worker ever served
    assert "exec-failed" in orch.log()
    print(f"{len(taken)} claims of {SESSIONS} queued sessions in {elapsed:.0f} s; pause {paused}")
