"""The orchestrator against faults, for real: ``devin-outposts orchestrate --driver process`` processes.

* a claim answer the client cannot read (a deadline of ``1e400``, nesting deeper than any decoder's
  recursion limit), from a hostile proxy in front of the simulator (:mod:`fault_proxy`): one log line,
  the loop keeps claiming, ``/healthz`` stays up and SIGTERM still ends the process cleanly.

Every assertion is on observed state: the simulator's claim history and gateway connections, the
machines directory, ``/healthz``, the process's exit code and its log.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from fault_proxy import FaultProxy, deep_nesting, huge_deadline
from test_orchestrator_process import Harness, free_port, harness

from devin_outposts.orchestrator.drivers.base import DriverError, SessionSpec, fnv1a32, machine_name
from devin_outposts.orchestrator.drivers.process import ProcessDriver
from devin_outposts_sim.remote import tools

from worker_fakes import pids_working_under

__all__ = ["harness"]


def _health(port: int) -> Any:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", [huge_deadline, deep_nesting], ids=["deadline-1e400", "deep-nesting"])
def test_an_unreadable_claim_answer_is_one_log_line_and_the_loop_keeps_claiming(
    harness: Harness, fault: Callable[[bytes], bytes]
) -> None:
    h = harness
    port = free_port()
    with FaultProxy(h.sim.url) as proxy:
        orch = h.orchestrator("--metrics-addr", f"127.0.0.1:{port}", api_url=proxy.url)
        first = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
        h.wait(lambda: h.connections(first), "the first session to be served")
        proxy.inject("/claim", fault)
        hit = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
        h.wait(lambda: proxy.injected, "the unreadable claim answer to be sent")
        later = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
        # The loop goes on: the next session is claimed and served, and so, once its claim is back in
        # the queue, is the one whose claim answer could not be read.
        h.wait(lambda: h.connections(later), "a session queued after the fault to be served", timeout=60)
        h.wait(lambda: h.connections(hit), "the session of the unreadable answer to be served", timeout=90)
        assert h.wait(lambda: _health(port), "/healthz") == (200, {"status": "ok"})
        h.sim.admin.add_calls(first, [tools.run("echo still-served")])
        [call] = h.sim.admin.wait_calls(first, timeout=60)
        assert call["result"]["output"] == "still-served\n"
        orch.signal(signal.SIGTERM)
        assert orch.wait(30) == 0
    log = orch.log()
    assert "Traceback" not in log
    failures = [line for line in log.splitlines() if f"claim session {hit}" in line or "unexpected" in line]
    assert len(failures) == 1, log


@pytest.mark.timeout(240)
def test_a_restart_with_a_lower_max_concurrent_keeps_every_live_session_and_waits_to_claim(
    harness: Harness,
) -> None:
    h = harness
    first = h.orchestrator(name="at-five", max_concurrent=5)
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(5)]
    h.wait(lambda: all(h.connections(s) for s in sessions), "five sessions to be served", timeout=90)
    first.signal(signal.SIGTERM)  # what changing a Deployment's cap does: a restart
    assert first.wait(30) == 0
    second = h.orchestrator(name="at-two", max_concurrent=2)
    h.wait(lambda: second.log().count("adopting machine") == 5, "the five machines to be adopted")
    queued = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    # Every live session keeps its machine, its claim and its worker: nothing was released or torn down.
    for sid in sessions:
        h.sim.admin.add_calls(sid, [tools.run(f"echo {sid}")])
        [call] = h.sim.admin.wait_calls(sid, timeout=60)
        assert call["result"]["output"] == f"{sid}\n"
    assert not any(h.released(sid) for sid in sessions)
    assert len(h.machines()) == 5
    assert all(len(h.connections(sid)) == 1 for sid in sessions)  # never started again
    # Over the cap nothing is claimed: the queued session waits until fewer than two run.
    assert h.claims(queued) == []
    for sid in sessions[:3]:
        h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: all(h.released(sid) for sid in sessions[:3]), "three sessions to end")
    assert h.claims(queued) == []  # two still run: the cap is full
    h.sim.admin.end_session(sessions[3], "terminated")
    h.wait(lambda: h.connections(queued), "the queued session to be served once one slot is free")
    assert len(h.connections(sessions[4])) == 1


def colliding_ids() -> tuple[str, str]:
    """Two session ids whose machine names were equal: the same letters in other cases (the name keeps
    them lower-cased) and the same 32-bit FNV-1a hash, found by a birthday search."""
    base = "devin-collide-abcdefghijklmnopqrstuvw"
    seen: dict[str, str] = {}
    for n in range(1 << len(base)):
        sid = "".join(c.upper() if n >> i & 1 and c.isalpha() else c for i, c in enumerate(base))
        digest = fnv1a32(sid)
        if digest in seen and seen[digest] != sid:
            return seen[digest], sid
        seen[digest] = sid
    raise AssertionError("no collision found")


@pytest.mark.timeout(180)
def test_session_ids_that_look_like_options_or_collide_are_each_served_once(harness: Harness) -> None:
    h = harness
    one, two = colliding_ids()
    # The simulator refuses ids that start with "-"; the proxy shows two of its sessions under them.
    shown = {"devin-dash-x": "-x", "devin-dash-help": "--help", one: one, two: two}
    with FaultProxy(h.sim.url) as proxy:
        for real, name in shown.items():
            proxy.alias(real, name)
            h.sim.admin.enqueue(h.outpost.outpost_id, session_id=real)
        orch = h.orchestrator(api_url=proxy.url)
        for sid in shown:
            h.wait(lambda sid=sid: h.connections(sid), f"session {shown[sid]} to be served", timeout=90)
        for sid in shown:  # each worker serves its own session; none was stopped by another's
            h.sim.admin.add_calls(sid, [tools.run("echo served")])
            [call] = h.sim.admin.wait_calls(sid, timeout=60)
            assert call["result"]["output"] == "served\n", shown[sid]
        assert len(h.machines()) == 4
        for sid in shown:
            assert len(h.connections(sid)) == 1, shown[sid]
            assert len(h.claims(sid, "claim")) == 1, shown[sid]  # never given up and claimed again
            assert not h.released(sid), shown[sid]
        assert "-x" in orch.log() and "--help" in orch.log()


def test_provision_never_reuses_the_machine_directory_of_another_session(tmp_path: Path) -> None:
    """The check behind every name: a directory that has this session's machine name but another
    session's labels (two ids whose names collide) is never handed out, so its worker is never stopped."""
    driver = ProcessDriver(tmp_path / "process", ("true",))
    mine = SessionSpec(session_id="devin-mine", outpost_id="outpost_env-1", acceptor_id="orch-a")
    theirs = SessionSpec(session_id="devin-theirs", outpost_id="outpost_env-1", acceptor_id="orch-a")
    taken = Path(asyncio.run(driver.provision(mine)).ref)
    # What a colliding id's provision left there: the same directory, labelled with the other session.
    meta = json.loads((taken / "machine.json").read_text())
    (taken / "machine.json").write_text(json.dumps({**meta, "session_id": theirs.session_id}))
    with pytest.raises(DriverError, match=r"already belongs to session 'devin-theirs'"):
        asyncio.run(driver.provision(mine))
    assert json.loads((taken / "machine.json").read_text())["session_id"] == "devin-theirs"


@pytest.mark.timeout(180)
def test_a_worker_that_runs_but_never_serves_is_given_up_at_the_boot_timeout(harness: Harness) -> None:
    h = harness
    hung = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    # The machines' worker command: the real worker, except for one session, where it just hangs.
    command = h.tmp / "worker-or-hang"
    command.write_text(
        f'#!/bin/sh\ncase "$*" in *{hung}*) exec sleep 3600 ;; esac\n'
        f'exec {sys.executable} -m devin_outposts "$@"\n'
    )
    command.chmod(0o755)
    orch = h.orchestrator(
        "--boot-timeout", "6", "--driver-opt", f"worker_command={command}", max_concurrent=1
    )
    h.wait(lambda: h.claims(hung, "claim"), "the hanging session to be claimed")
    queued = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    # Its worker runs and serves nothing: it is given up, its claim released and its machine removed,
    # and the slot serves the next session.
    h.wait(lambda: h.released(hung), "the hanging session's claim to be released", timeout=60)
    h.wait(lambda: h.connections(queued), "the next session to be served in the freed slot", timeout=60)
    assert h.connections(hung) == []
    assert [p.name for p in h.machines()] == [machine_name("outpost-worker", queued)]
    assert not [pid for pid in pids_working_under(h.tmp) if "sleep" in _comm(pid)]
    assert "without the session being served" in orch.log()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


#: Loaded by the first orchestrator of the test below (PYTHONPATH): it SIGKILLs itself the moment its
#: first worker's process exists, before it can note anything about it: a kill in that window, every time.
DIE_AFTER_SPAWN = """
import os, signal, subprocess
class _SpawnThenDie(subprocess.Popen):
    def __init__(self, args, *more, **kwargs):
        super().__init__(args, *more, **kwargs)
        if list(args)[:2] == ["/bin/sh", "-c"]:  # the process driver's worker group leader
            os.kill(os.getpid(), signal.SIGKILL)
subprocess.Popen = _SpawnThenDie
"""


@pytest.mark.timeout(180)
def test_a_worker_started_just_before_the_orchestrator_was_killed_is_adopted(harness: Harness) -> None:
    h = harness
    hooks = h.tmp / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(DIE_AFTER_SPAWN)
    first = h.orchestrator(name="killed", extra_env={"PYTHONPATH": str(hooks)})
    sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    assert first.wait(60) == -signal.SIGKILL  # killed right after starting the session's worker
    h.wait(lambda: h.connections(sid), "the orphaned worker to serve the session")
    second = h.orchestrator("--boot-timeout", "8", name="successor")
    # The successor finds the worker it could not have started itself, and keeps it: not given up.
    h.wait(
        lambda: "worker running on" in second.log() or "did not come up" in second.log(),
        "the successor to judge the adopted machine",
    )
    assert "adopting machine" in second.log()
    assert "did not come up" not in second.log()
    h.sim.admin.add_calls(sid, [tools.run("echo adopted")])
    [call] = h.sim.admin.wait_calls(sid, timeout=60)
    assert call["result"]["output"] == "adopted\n"
    assert len(h.connections(sid)) == 1 and not h.released(sid)
    h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: h.released(sid), "the claim to be released")
    h.wait(lambda: not h.machines(), "the machine to be torn down")
