"""Deadlines that signals can always cut (issue 37, S5): a slow-drip reply against real processes.

A ``200`` with ``Content-Length: 100000`` and then one byte every 10 s (:class:`fault_fleet.Drip`) never
trips a per-read timeout. On the startup list of held sessions it hung ``devin-outposts worker start`` and
``devin-outposts orchestrate``, and two SIGTERMs later both were still alive (45 s and 30 s later). On a
claim, on the release a second signal still makes, or on the orchestrator's status read of a session, it
held them as long.

Now a drain (the first signal) cancels what the claim loop waits for from the API, every request has a total
deadline, and a second signal cuts every request still to end to a few seconds (docs/worker.md, "Signals
and shutdown"). The programs run for real against :class:`fault_fleet.FaultFleet`; assertions are on the
process (gone before a generous bound after the signal, its exit code), its log and what the server saw.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from fault_fleet import Drip, FaultFleet

from worker_fakes import DistServer, FakeRemote, WorkerProcess, kill_pids_working_under, wait_for

TOKEN = "cog_slow_drip_test_token"
SID = "devin-drip"
#: ``--stop-grace-secs`` of both programs here (the default): the documented stop grace.
STOP_GRACE = 10
#: How long after its last signal a program may take to be gone before the test fails: the stop grace and
#: as much again for a loaded machine. Today's code was still there after 45 s, and would be for days.
BOUND = 2 * STOP_GRACE


def program_env(api_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVIN_", "PYTEST_"))}
    # The process driver checks that the worker command (devin-outposts) is on PATH.
    path = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env.update(DEVIN_OUTPOSTS_TOKEN=TOKEN, DEVIN_API_URL=api_url, PATH=path)
    return env


def start(program: str, tmp_path: Path, api_url: str, static_url: str, *extra: str) -> WorkerProcess:
    """``worker start`` or ``orchestrate --driver process`` against ``api_url``."""
    common = ["--outpost", "rhel", "--static-base-url", static_url, "--backoff-max-secs", "0.3",
              "--poll-interval-secs", "0.3", "--stop-grace-secs", str(STOP_GRACE), *extra]  # fmt: skip
    if program == "worker":
        args = ["--cache-dir", str(tmp_path / "data" / "cache"), "--workdir", str(tmp_path / "work")]
        command: tuple[str, ...] = ("worker", "start")
    else:
        args = ["--driver", "process", "--state-dir", str(tmp_path / "state"), "--acceptor-id", "orch-drip"]
        command = ("orchestrate",)
    log = tmp_path / f"{program}.log"
    return WorkerProcess([*common, *args], program_env(api_url), log, command=command).start()


def wait_logged(process: WorkerProcess, text: str, what: str) -> None:
    wait_for(lambda: text in process.log(), 30, what=f"{what}\n{process.log()[-3000:]}")


@pytest.mark.parametrize("program", ["worker", "orchestrator"])
def test_a_dripping_startup_list_never_holds_up_a_sigterm(tmp_path: Path, program: str) -> None:
    """The issue's case: the list of held sessions drips. One SIGTERM now ends either program (nothing
    runs, so nothing is left to drain), where two SIGTERMs left both alive."""
    with FaultFleet(TOKEN) as fleet:
        fleet.faults["recovery"].append(Drip())
        process = start(program, tmp_path, fleet.url, "http://127.0.0.1:9")
        try:
            wait_for(lambda: fleet.dripping("recovery"), 30, what=f"the list to drip\n{process.log()}")
            process.signal(signal.SIGTERM)
            code = process.wait(BOUND)
        finally:
            process.stop()
    log = process.log()
    assert code == 0, log[-3000:]
    assert "SIGTERM: no new claims" in log, log[-3000:]
    assert "stopped before the sessions held from before the restart were listed" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert TOKEN not in log
    # The list was still dripping when the signal came: the client had read its first bytes, not all.
    [drip] = fleet.dripping("recovery")
    assert drip["sent"] < Drip().length


def test_a_dripping_claim_is_cancelled_by_the_first_sigterm_and_given_back(tmp_path: Path) -> None:
    """A claim in flight when the signal comes is cancelled (its answer may never come) and released."""
    with FaultFleet(TOKEN) as fleet:
        fleet.enqueue(SID)
        fleet.faults["claim"].append(Drip())
        worker = start("worker", tmp_path, fleet.url, "http://127.0.0.1:9")
        try:
            wait_for(lambda: fleet.dripping("claim"), 30, what=f"the claim to drip\n{worker.log()}")
            worker.signal(signal.SIGTERM)
            code = worker.wait(BOUND)
        finally:
            worker.stop()
    log = worker.log()
    assert code == 0, log[-3000:]
    assert f"releasing session {SID} at once (draining)" in log, log[-3000:]
    assert fleet.calls("POST", f"/{SID}/release")
    assert "Traceback" not in log, log[-3000:]


def test_a_dripping_release_after_a_second_sigterm_is_cut_within_the_stop_grace(
    tmp_path: Path, remote: FakeRemote
) -> None:
    """The worker drains a running session (600 s); a second SIGTERM stops its remote and releases its
    claim, and that release drips: it is cut a few seconds later and the worker ends."""
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        fleet.enqueue(SID)
        worker = start("worker", tmp_path, fleet.url, dist.url, "--drain-timeout", "600")
        try:
            wait_for(lambda: remote.runs(SID), 60, what=f"the session to be served\n{worker.log()}")
            fleet.faults["release"].append(Drip())
            worker.signal(signal.SIGTERM)
            wait_logged(worker, "1 running session(s) get 600s", "the drain to start")
            assert worker.proc is not None and worker.proc.poll() is None  # draining: the session runs on
            worker.signal(signal.SIGTERM)
            wait_for(lambda: fleet.dripping("release"), 30, what=f"the release to drip\n{worker.log()}")
            code = worker.wait(BOUND)
        finally:
            worker.stop()
    log = worker.log()
    assert code == 0, log[-3000:]
    assert "SIGTERM again: stopping all sessions now" in log, log[-3000:]
    [run] = remote.runs(SID)
    assert run["pid"] in remote.stopped_pids()  # the remote was stopped, then the release was tried
    assert f"Could not release session {SID}: cut short: the program is stopping" in log, log[-3000:]
    assert f"giving up releasing session {SID}" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    [drip] = fleet.dripping("release")
    assert drip["sent"] < Drip().length


def test_a_dripping_status_read_after_a_second_sigterm_is_cut_within_the_stop_grace(
    tmp_path: Path, remote: FakeRemote
) -> None:
    """The orchestrator's first SIGTERM detaches a session whose status read drips: the read holds the
    session's task (up to the request's own deadline); the second SIGTERM cuts it, and the orchestrator
    ends."""
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        fleet.enqueue(SID)
        orchestrator = start("orchestrator", tmp_path, fleet.url, dist.url, "--session-check-secs", "0.3")
        try:
            wait_for(lambda: remote.runs(SID), 60, what=f"the session to be served\n{orchestrator.log()}")
            fleet.faults["get"].extend([Drip()] * 4)  # the read and its three retries: all drip
            wait_for(lambda: fleet.dripping("get"), 30, what=f"the status read to drip\n{orchestrator.log()}")
            orchestrator.signal(signal.SIGTERM)
            wait_logged(orchestrator, "1 running session(s) keep their machines", "the first signal's line")
            assert orchestrator.proc is not None and orchestrator.proc.poll() is None  # held by the read
            orchestrator.signal(signal.SIGTERM)
            code = orchestrator.wait(BOUND)
        finally:
            orchestrator.stop()
            kill_pids_working_under(tmp_path)  # the detached machine's worker (and its remote) stay up
    log = orchestrator.log()
    assert code == 0, log[-3000:]
    assert "SIGTERM again: requests to the fleet API get 5s more" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    drips = fleet.dripping("get")
    assert drips and all(drip["sent"] < Drip().length for drip in drips)
    assert not fleet.calls("POST", f"/{SID}/release")  # detached: the claim stays for the next start
