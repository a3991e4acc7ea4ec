"""The orchestrator for real: ``devin-outposts orchestrate --driver process`` against the simulator.

A real orchestrator process claims sessions, makes a machine (a directory and a worker process) for each,
starts ``devin-outposts worker start --session`` there in direct-serve mode, and the worker downloads,
verifies and runs the simulator's stand-in ``devin-remote``, which connects to the simulator's gateway.
Every assertion is on observed state: the simulator's claim history and gateway connections (the
stand-in's report about itself), the machines directory, the processes under the test's directory, and
the orchestrator's /metrics.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers.base import SessionSpec, machine_name
from devin_outposts.orchestrator.drivers.process import ProcessDriver
from devin_outposts_sim.remote import tools
from devin_outposts_sim.testing import SimHandle, run_sim

from netpolicy_harness import WHY_NOT, Upstream, cannot_run, client_calls_in_a_machine
from standin_harness import SESSION_PYTHON, SESSION_UID_RANGE
from worker_fakes import (
    WorkerProcess,
    kill_pids_working_under,
    metrics_from_log,
    pids_working_under,
    wait_for,
)

ACCEPTOR = "orch-test-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Harness:
    sim: SimHandle
    tmp: Path
    token: str
    outpost: Outpost
    processes: list[WorkerProcess] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.tmp / "state"

    @property
    def machines_dir(self) -> Path:
        return self.state_dir / "process" / "machines"

    def machines(self) -> list[Path]:
        if not self.machines_dir.is_dir():
            return []
        return [p for p in self.machines_dir.iterdir() if p.is_dir()]

    def env(self, api_url: Optional[str] = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVIN_", "PYTEST_"))}
        env.update(
            DEVIN_OUTPOSTS_TOKEN=self.token, DEVIN_API_URL=api_url or self.sim.url, LANG="C.UTF-8", TZ="UTC"
        )
        if os.geteuid() == 0:  # a root orchestrator's confined sessions run as ids of their own
            env["DEVIN_WORKER_SESSION_UID_RANGE"] = SESSION_UID_RANGE
        return env

    def orchestrator(
        self,
        *args: str,
        name: str = "orch",
        max_concurrent: int = 5,
        api_url: Optional[str] = None,
        extra_env: Optional[dict[str, str]] = None,
    ) -> WorkerProcess:
        """``orchestrate --driver process`` (against ``api_url``, the simulator by default)."""
        base = [
            "--outpost", self.outpost.name, "--driver", "process", "--max-concurrent", str(max_concurrent),
            "--state-dir", str(self.state_dir), "--acceptor-id", ACCEPTOR,
            "--static-base-url", self.sim.static_base_url,
            "--poll-interval-secs", "0.5", "--status-interval-secs", "0.2", "--confirm-interval-secs", "0.2",
            "--gc-interval", "1", "--backoff-max-secs", "2", "--stop-grace-secs", "5",
            "--driver-opt", "stop_grace=5",
        ]  # fmt: skip
        log_path = self.tmp / f"{name}.log"
        env = {**self.env(api_url), **(extra_env or {})}
        process = WorkerProcess([*base, *args], env, log_path, command=("orchestrate",))
        self.processes.append(process)
        return process.start()

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-6000:]}" for p in self.processes)

    def wait(self, predicate: Any, what: str, timeout: float = 60.0) -> Any:
        try:
            return wait_for(predicate, timeout=timeout, interval=0.1, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def claims(self, session_id: str, action: Optional[str] = None) -> list[dict[str, Any]]:
        return [
            r for r in self.sim.admin.claims(session_id=session_id) if action is None or r["action"] == action
        ]

    def connections(self, session_id: str) -> list[dict[str, Any]]:
        return list(self.sim.admin.connections(session_id))

    def released(self, session_id: str) -> bool:
        return bool(self.claims(session_id, "release"))


def path_without(directory: Path, program: str) -> str:
    """A PATH of one directory with every program of this one but ``program`` (links to them)."""
    directory.mkdir()
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            link = directory / name
            if name != program and not link.exists() and os.access(os.path.join(entry, name), os.X_OK):
                link.symlink_to(os.path.join(entry, name))
    return str(directory)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    # A claim TTL well above the renewal period, so that a loaded machine never hands a live session on.
    with run_sim(claim_ttl=20, watch_max_duration=5, keepalive_interval=0.5, sweep_interval=0.05) as sim:
        outpost = sim.admin.create_outpost("fleet", "linux")
        sim.admin.publish_standin_variant("orchestrated", python=SESSION_PYTHON, latest=True)
        h = Harness(sim, tmp_path, sim.create_token("orchestrator"), outpost)
        try:
            yield h
        finally:
            for process in h.processes:
                process.stop()
            leftovers = kill_pids_working_under(tmp_path)  # machines a test left detached
            if leftovers:
                time.sleep(0.2)
    assert not pids_working_under(tmp_path)


def test_twenty_sessions_at_five_at_a_time_are_each_served_once_and_leave_nothing(harness: Harness) -> None:
    h = harness
    h.orchestrator()
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(20)]
    ended: set[str] = set()
    most_machines = 0
    deadline = time.monotonic() + 100
    while len(ended) < len(sessions):
        assert time.monotonic() < deadline, f"only {len(ended)} of 20 sessions ended\n{h.logs()}"
        most_machines = max(most_machines, len(h.machines()))
        for sid in sessions:
            if sid not in ended and h.connections(sid):
                h.sim.admin.end_session(sid, "terminated")
                ended.add(sid)
        time.sleep(0.1)
    h.wait(lambda: all(h.released(sid) for sid in sessions), "every claim released", timeout=60)
    h.wait(lambda: not h.machines(), "every machine torn down", timeout=30)
    assert 1 <= most_machines <= 5
    for sid in sessions:
        claims = h.claims(sid, "claim")
        assert {c["acceptor_id"] for c in claims} == {ACCEPTOR}
        assert len(h.connections(sid)) == 1, sid  # served exactly once: one stand-in ever connected
    worker_pids = [pid for pid in pids_working_under(h.tmp) if pid != h.processes[0].pid]
    assert worker_pids == []  # no worker, stand-in or command left running


def test_a_failed_provision_releases_the_claim_at_once(harness: Harness) -> None:
    h = harness
    sid = "devin-provision-fails"
    # A file where the session's machine directory must go: making the machine fails.
    driver = ProcessDriver(h.state_dir / "process", ("true",))
    name = _machine_name(driver, sid)
    h.machines_dir.mkdir(parents=True)
    (h.machines_dir / name).write_text("in the way")
    port = free_port()
    h.orchestrator("--metrics-addr", f"127.0.0.1:{port}")
    h.sim.admin.enqueue(h.outpost.outpost_id, session_id=sid)
    h.wait(lambda: h.released(sid), "the claim to be released")
    first_claim = h.claims(sid, "claim")[0]
    release = h.claims(sid, "release")[0]
    assert release["seq"] > first_claim["seq"]
    assert h.connections(sid) == []  # no worker ever ran
    metrics = h.wait(lambda: _metrics(port), "/metrics")
    assert _value(metrics, "outposts_infrastructure_errors_total") >= 1
    assert _value(metrics, "outposts_sessions_claimed_total") >= 1
    health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert "provisioning failed" in h.processes[0].log()
    entry = h.sim.admin.session(sid)["entry"]
    assert entry["status"]["phase"] == "pending"  # back in the queue for any coordinator


def test_after_kill_9_a_restarted_orchestrator_adopts_running_sessions_and_serves_none_twice(
    harness: Harness,
) -> None:
    h = harness
    first = h.orchestrator(name="first")
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(3)]
    h.wait(lambda: all(h.connections(s) for s in sessions), "three sessions to be served")
    first.kill9()
    time.sleep(0.5)
    assert len(h.machines()) == 3  # the machines outlive their orchestrator
    h.orchestrator(name="second")
    h.wait(lambda: h.processes[1].log().count("adopting machine") == 3, "the three machines to be adopted")
    h.sim.admin.add_calls(sessions[0], [tools.run("echo still-here")])
    [call] = h.sim.admin.wait_calls(sessions[0], timeout=60)
    assert call["result"]["output"] == "still-here\n"
    for sid in sessions:
        h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: all(h.released(s) for s in sessions), "every claim released")
    h.wait(lambda: not h.machines(), "every machine torn down")
    for sid in sessions:
        assert len(h.connections(sid)) == 1, sid  # the first worker kept serving; none was started again


def test_an_adopted_worker_killed_from_outside_is_replaced_through_the_status_stream(
    harness: Harness,
) -> None:
    h = harness
    first = h.orchestrator(name="first")
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(2)]
    h.wait(lambda: all(h.connections(s) for s in sessions), "two sessions to be served")
    first.kill9()
    # Direct reads and listings once an hour: within this test a worker's end reaches its session through
    # the status stream alone (the adopted worker's pidfd).
    h.orchestrator(
        "--status-interval-secs", "3600", "--driver-opt", "reconcile_interval=3600", name="second"
    )  # fmt: skip
    h.wait(lambda: h.processes[1].log().count("adopting machine") == 2, "the two machines to be adopted")
    machine = h.machines_dir / machine_name("outpost-worker", sessions[0])
    leader = json.loads((machine / "worker.pid").read_text())["pid"]
    os.killpg(leader, signal.SIGKILL)
    h.wait(lambda: len(h.connections(sessions[0])) == 2, "a new worker to serve the session", timeout=60)
    for sid in sessions:
        h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: all(h.released(s) for s in sessions), "every claim released")
    h.wait(lambda: not h.machines(), "every machine torn down")
    assert len(h.connections(sessions[1])) == 1  # the other adopted worker served on, untouched


def test_a_leaked_machine_of_a_dead_session_is_collected(harness: Harness) -> None:
    h = harness
    dead = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    h.sim.admin.tombstone(dead)
    driver = ProcessDriver(h.state_dir / "process", ("true",))
    spec = SessionSpec(session_id=dead, outpost_id=h.outpost.outpost_id, acceptor_id=ACCEPTOR)
    machine = asyncio.run(driver.provision(spec))
    assert Path(machine.ref).is_dir()
    port = free_port()
    h.orchestrator("--metrics-addr", f"127.0.0.1:{port}")
    h.wait(lambda: not Path(machine.ref).exists(), "the leaked machine to be collected")
    metrics = h.wait(lambda: _metrics(port), "/metrics")
    assert _value(metrics, "outposts_machines_collected_total") == 1
    assert _value(metrics, "outposts_reconciliations_total") >= 1


@pytest.mark.parametrize(("policy", "kept"), [("snapshot", True), ("start_fresh", False)])
def test_a_resumed_session_finds_its_repo_under_snapshot_and_not_under_start_fresh(
    harness: Harness, policy: str, kept: bool
) -> None:
    h = harness
    h.orchestrator("--resume-policy", policy)
    sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    h.wait(lambda: h.connections(sid), "the session to be served")
    h.sim.admin.add_calls(sid, [tools.run("echo before-suspend > note.txt && pwd")])
    [wrote] = h.sim.admin.wait_calls(sid, timeout=60)
    assert wrote["result"]["exit_code"] == 0
    h.sim.admin.end_session(sid, "suspended")
    h.wait(lambda: h.released(sid), "the suspended session to be released")
    h.wait(lambda: not h.machines(), "its machine to be torn down")
    snapshots = h.state_dir / "process" / "snapshots"
    assert (snapshots.is_dir() and any(snapshots.iterdir())) == kept
    # The session comes back: its old row is swept away and a resume entry is queued.
    h.sim.admin.tombstone(sid)
    h.sim.admin.enqueue(h.outpost.outpost_id, session_id=sid, kind="resume")
    h.wait(lambda: len(h.connections(sid)) == 2, "the resumed session to be served")
    h.sim.admin.add_calls(sid, [tools.run("cat note.txt || echo missing")])
    calls = h.sim.admin.wait_calls(sid, timeout=60)
    assert calls[-1]["result"]["output"] == ("before-suspend\n" if kept else "missing\n")
    h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: not h.machines(), "the machine to be torn down")
    h.wait(lambda: not (snapshots.is_dir() and any(snapshots.iterdir())), "no snapshot left")


def test_sigterm_detaches_the_running_sessions_and_keeps_their_claims(harness: Harness) -> None:
    h = harness
    orch = h.orchestrator()
    sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    h.wait(lambda: h.connections(sid), "the session to be served")
    orch.signal(signal.SIGTERM)
    assert orch.wait(30) == 0
    assert not h.released(sid)  # the claim stays for the next start
    assert len(h.machines()) == 1  # and so does the machine, its worker still serving
    h.sim.admin.add_calls(sid, [tools.run("echo served-on")])
    [call] = h.sim.admin.wait_calls(sid, timeout=60)
    assert call["result"]["output"] == "served-on\n"


def _machine_name(driver: ProcessDriver, session_id: str) -> str:
    return machine_name("outpost-worker", session_id)


def _metrics(port: int) -> Optional[str]:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _value(metrics: str, name: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics:\n{metrics}")


def test_a_session_with_a_network_policy_is_confined_on_its_machine(harness: Harness) -> None:
    """The process driver's worker gets the session's policy (it never sees the claim) and confines the
    session: what the policy allows is reached, the rest is refused, and the denied upstream sees nothing."""
    if WHY_NOT:
        cannot_run(f"sessions cannot be confined here: {WHY_NOT}")
    h = harness
    allowed, denied = Upstream("allowed"), Upstream("denied", host="127.0.0.2")
    try:
        h.orchestrator(max_concurrent=1)
        policy = {"enabled": True, "allow": [{"ipv4": "127.0.0.1/32"}]}
        sid = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy).session_id
        plan = [
            ["proxy", "127.0.0.1", allowed.port],
            ["proxy", "127.0.0.2", denied.port],
            ["udp", "192.0.2.1", 53],
        ]
        h.sim.admin.add_calls(sid, client_calls_in_a_machine(plan, SESSION_PYTHON))
        call = h.sim.admin.wait_calls(sid, timeout=90)[-1]
        results = [json.loads(line) for line in call["result"]["output"].splitlines() if line.startswith("{")]
        assert [r.get("status") for r in results[:2]] == [200, 403], (results, h.logs())
        assert "error" in results[2], results
        assert [data.split(b"\r\n", 1)[0] for data in allowed.received] == [b"GET /from-session HTTP/1.1"]
        assert denied.received == []
        h.sim.admin.set_status(sid, "terminated")
        h.wait(lambda: h.released(sid), f"{sid} to be released")
    finally:
        allowed.close()
        denied.close()


def test_a_machine_that_cannot_confine_gives_the_session_back_at_once(harness: Harness) -> None:
    """A worker whose PATH has no ``unshare`` cannot confine: it exits 9 without starting the remote, and
    the orchestrator releases the claim on that first exit (no restarts), counts it and serves the next
    session, which has no policy, as usual."""
    h = harness
    orch = h.orchestrator(
        "--metrics-addr", "127.0.0.1:0", "--restart-limit", "3", max_concurrent=1,
        extra_env={"PATH": path_without(h.tmp / "bin", "unshare")},
    )  # fmt: skip
    policy = {"enabled": True, "allow": [{"hostname": "github.com"}]}
    refused = h.sim.admin.enqueue(h.outpost.outpost_id, network_policy=policy).session_id
    h.wait(lambda: h.released(refused), f"{refused} to be released")
    assert not h.connections(refused), "the refused session's remote must never start"
    assert [c["action"] for c in h.claims(refused)][:1] == ["claim"]
    served = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    h.wait(lambda: h.connections(served), f"{served} to be served")
    h.sim.admin.set_status(served, "terminated")
    h.wait(lambda: h.released(served), f"{served} to be released")
    log = orch.log()
    assert log.count("cannot enforce the session's network policy") == 1, log
    assert "restarting" not in log, log
    text = metrics_from_log(orch.log())
    assert re.search(r"^outposts_network_policy_refusals_total(\{[^}]*\})? 1$", text, re.M), text
    assert re.search(r"^outposts_worker_restarts_total(\{[^}]*\})? 0$", text, re.M), text
