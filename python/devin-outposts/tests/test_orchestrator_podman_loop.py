"""``devin-outposts orchestrate --driver podman`` for real: the orchestrator's loop with the podman driver.

A real orchestrator process claims sessions on the simulator and runs each in a container of the session
image (test_orchestrator_podman.py builds it); the worker there downloads the simulator's stand-in
``devin-remote``, which connects over the host's loopback (``network=host``). Assertions are on observed
state: the simulator's claim history and gateway connections, ``podman ps``/``podman volume ls`` by the
test's acceptor label (sampled while the sessions run), and the files the sessions wrote.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from test_orchestrator_podman import needs_podman, podman, session_image
from test_orchestrator_process import _metrics, _value, free_port

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers.base import LABEL_ACCEPTOR, DriverContext, SessionSpec, machine_name
from devin_outposts.orchestrator.drivers.podman import PodmanDriver
from devin_outposts_sim.remote import tools
from devin_outposts_sim.testing import SimHandle, run_sim

from worker_fakes import WorkerProcess, wait_for

__all__ = ["session_image"]  # the module-scoped fixture, shared with the driver's own tests

KEPT = "kept/notes.txt"


@dataclass
class Loop:
    sim: SimHandle
    tmp: Path
    token: str = field(repr=False)
    outpost: Outpost
    image: str
    acceptor: str
    processes: list[WorkerProcess] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVIN_", "PYTEST_"))}
        env.update(DEVIN_OUTPOSTS_TOKEN=self.token, DEVIN_API_URL=self.sim.url, LANG="C.UTF-8", TZ="UTC")
        return env

    def orchestrator(self, *args: str, name: str = "orch", max_concurrent: int = 5) -> WorkerProcess:
        base = [
            "--outpost", self.outpost.name, "--driver", "podman", "--max-concurrent", str(max_concurrent),
            "--state-dir", str(self.tmp / "state"), "--acceptor-id", self.acceptor,
            "--static-base-url", self.sim.static_base_url,
            "--poll-interval-secs", "0.5", "--status-interval-secs", "0.2", "--confirm-interval-secs", "0.2",
            "--gc-interval", "1", "--backoff-max-secs", "2", "--stop-grace-secs", "5",
            "--driver-opt", f"image={self.image}", "--driver-opt", "network=host",
            "--driver-opt", "stop_grace=2", "--driver-opt", "memory=512m",
        ]  # fmt: skip
        process = WorkerProcess(
            [*base, *args], self.env(), self.tmp / f"{name}.log", command=("orchestrate",)
        )
        self.processes.append(process)
        return process.start()

    def logs(self) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log()[-6000:]}" for p in self.processes)

    def wait(self, predicate: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        try:
            return wait_for(predicate, timeout=timeout, interval=0.2, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def containers(self) -> list[str]:
        label = f"label={LABEL_ACCEPTOR}={self.acceptor}"
        return podman("ps", "--all", "--filter", label, "--format", "{{.Names}}").stdout.split()

    def volumes(self) -> list[str]:
        label = f"label={LABEL_ACCEPTOR}={self.acceptor}"
        return podman("volume", "ls", "--filter", label, "--format", "{{.Name}}").stdout.split()

    def claims(self, session_id: str, action: Optional[str] = None) -> list[dict[str, Any]]:
        records = self.sim.admin.claims(session_id=session_id)
        return [r for r in records if action is None or r["action"] == action]

    def released(self, session_id: str) -> bool:
        return bool(self.claims(session_id, "release"))


@pytest.fixture
def loop(session_image: str, tmp_path: Path) -> Iterator[Loop]:
    with run_sim(claim_ttl=20, watch_max_duration=5, keepalive_interval=0.5, sweep_interval=0.05) as sim:
        outpost = sim.admin.create_outpost("podman-fleet", "linux")
        acceptor = f"podman-loop-{os.urandom(4).hex()}"
        h = Loop(sim, tmp_path, sim.create_token("orchestrator"), outpost, session_image, acceptor)
        try:
            yield h
        finally:
            for process in h.processes:
                process.stop()
            # Whatever a failed test left: removed by the test's label, so nothing outlives it.
            for name in h.containers():
                podman("rm", "--force", "--time", "1", name, check=False)
            for name in h.volumes():
                podman("volume", "rm", name, check=False)


@needs_podman
def test_twenty_sessions_at_five_at_a_time_in_containers_served_once_leaving_nothing(loop: Loop) -> None:
    h = loop
    h.orchestrator(max_concurrent=5)
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(20)]
    ended: set[str] = set()
    most = 0
    deadline = time.monotonic() + 200
    while len(ended) < len(sessions):
        assert time.monotonic() < deadline, f"only {len(ended)} of 20 sessions ended\n{h.logs()}"
        most = max(most, len(h.containers()))
        for sid in sessions:
            if sid not in ended and h.sim.admin.connections(sid):
                h.sim.admin.end_session(sid, "terminated")
                ended.add(sid)
        time.sleep(0.2)
    h.wait(lambda: all(h.released(sid) for sid in sessions), "every claim released", timeout=90)
    h.wait(lambda: not h.containers() and not h.volumes(), "every container and volume removed", timeout=60)
    assert 1 <= most <= 5
    for sid in sessions:
        assert {c["acceptor_id"] for c in h.claims(sid, "claim")} == {h.acceptor}
        [conn] = h.sim.admin.connections(sid)  # served exactly once
        assert conn["cwd"] == "/var/lib/devin-worker/repos"  # in a container
    assert not any(h.token in line for line in h.processes[0].log().splitlines())
    assert [p for p in (h.tmp / "state" / "podman").rglob("*") if p.is_file()] == []


@needs_podman
def test_a_suspended_session_resumes_from_its_snapshot_under_the_orchestrator(loop: Loop) -> None:
    h = loop
    h.orchestrator("--resume-policy", "snapshot", max_concurrent=2)
    sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    h.wait(lambda: h.sim.admin.connections(sid), "the session to be served")
    h.sim.admin.add_calls(sid, [tools.write(KEPT, "before the suspend\n")])
    assert h.sim.admin.wait_calls(sid, timeout=60)[0]["result"]["ok"] is True
    h.sim.admin.end_session(sid, "suspended")
    h.wait(lambda: h.released(sid), "the claim released after the suspend")
    h.wait(lambda: not h.containers(), "the container removed")
    assert len(h.volumes()) == 2  # the kept state volume and its snapshot marker

    h.sim.admin.tombstone(sid)
    h.sim.admin.enqueue(h.outpost.outpost_id, session_id=sid, kind="resume")
    h.wait(lambda: len(h.sim.admin.connections(sid)) == 2, "the resumed session to be served")
    h.sim.admin.add_calls(sid, [tools.read(KEPT)])
    result = h.sim.admin.wait_calls(sid, timeout=60)[-1]["result"]
    assert (result["ok"], result["output"]) == (True, "before the suspend\n")
    h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: not h.containers() and not h.volumes(), "everything removed", timeout=60)


@needs_podman
def test_after_kill_9_a_restarted_orchestrator_adopts_the_running_containers(loop: Loop) -> None:
    h = loop
    first = h.orchestrator(name="first")
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(2)]
    h.wait(lambda: all(h.sim.admin.connections(s) for s in sessions), "both sessions to be served")
    first.kill9()
    running = podman("ps", "--filter", f"label={LABEL_ACCEPTOR}={h.acceptor}", "--format", "{{.Names}}")
    assert len(running.stdout.split()) == 2  # the containers outlive their orchestrator
    second = h.orchestrator(name="second")
    h.wait(lambda: second.log().count("adopting machine") == 2, "both machines to be adopted")
    h.sim.admin.add_calls(sessions[0], [tools.run("echo still-here")])
    [call] = h.sim.admin.wait_calls(sessions[0], timeout=60)
    assert call["result"]["output"] == "still-here\n"
    for sid in sessions:
        h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: all(h.released(s) for s in sessions), "both claims released")
    h.wait(lambda: not h.containers() and not h.volumes(), "everything removed", timeout=60)
    for sid in sessions:
        assert len(h.sim.admin.connections(sid)) == 1, sid  # kept serving; never started again


@needs_podman
def test_a_leaked_container_of_a_gone_session_is_collected(loop: Loop) -> None:
    h = loop
    driver = PodmanDriver.from_options(DriverContext(state_dir=h.tmp / "other"), {"image": h.image})
    leaked = asyncio.run(driver.provision(SessionSpec("devin-long-gone", h.outpost.outpost_id, h.acceptor)))
    assert h.containers() == [leaked.name]
    h.orchestrator()
    h.wait(lambda: not h.containers() and not h.volumes(), "the leaked machine to be collected")
    # The sweep logs the collection after the teardown returns: wait for the line, do not race it.
    h.wait(lambda: "collected machine " + leaked.name in h.processes[0].log(), "the collection to be logged")


@needs_podman
def test_a_failed_provision_releases_the_claim_at_once(loop: Loop) -> None:
    h = loop
    sid = f"devin-in-the-way-{os.urandom(3).hex()}"
    name = machine_name("outpost-worker", sid)
    # A container that is not ours holds the machine's name: provisioning fails, and must not touch it.
    podman("create", "--name", name, "--label", f"{LABEL_ACCEPTOR}={h.acceptor}", h.image)
    h.orchestrator()
    h.sim.admin.enqueue(h.outpost.outpost_id, session_id=sid)
    h.wait(lambda: h.released(sid), "the claim to be released")
    assert h.sim.admin.connections(sid) == []  # no worker ever ran
    assert h.sim.admin.session(sid)["entry"]["status"]["phase"] == "pending"
    # The reason is logged with the session's end, which may come just after the release is seen.
    h.wait(lambda: "provisioning failed" in h.processes[0].log(), "the reason in the log")
    assert h.containers() == [name]  # the stranger is still there, untouched


@needs_podman
def test_a_healthy_run_never_warns_that_machines_are_not_coming_up(loop: Loop) -> None:
    h = loop
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(2)]
    port = free_port()
    # Both slots are taken by the first claims, while both containers are still being made: the first
    # sweep (right after recovery) sees capacity full and no worker up yet, which is how a run starts.
    orch = h.orchestrator("--metrics-addr", f"127.0.0.1:{port}", max_concurrent=2)
    h.wait(lambda: all(h.sim.admin.connections(s) for s in sessions), "both sessions to be served")
    metrics = h.wait(lambda: _metrics(port), "/metrics")
    assert _value(metrics, "outposts_reconciliations_total") >= 1
    assert "capacity is full" not in orch.log()
    for sid in sessions:
        h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: not h.containers() and not h.volumes(), "everything removed", timeout=60)
