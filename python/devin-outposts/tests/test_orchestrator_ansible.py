"""The orchestrator's ``ansible`` driver without a test host: its options, how it reads a unit's state, the
environment of its runs, and real ansible-runner runs of small local playbooks (provision reporting a host,
start with the connect token, teardown, failed provisions). tests/orchestrator/test_ansible_nspawn.py runs the
example playbooks on a real systemd host."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from orchestrator_fakes import Running

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers import driver_class
from devin_outposts.orchestrator.drivers.ansible import AnsibleDriver, parse_unit_state
from devin_outposts.orchestrator.drivers.ansible._run import RunResult, runner_environment
from devin_outposts.orchestrator.drivers.ansible.records import MachineRecords, machine_of
from devin_outposts.orchestrator.drivers.ansible.status import AnsibleStatusSource
from devin_outposts.orchestrator.drivers.base import (
    DriverContext,
    DriverError,
    Machine,
    SessionSpec,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    machine_name,
)
from devin_outposts.orchestrator.drivers.status_board import StatusBoard
from devin_outposts.orchestrator.options import OrchestratorConfig
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for

pytest.importorskip(
    "ansible_runner", reason="the ansible driver needs ansible-runner (devin-outposts[ansible])"
)

CONNECT_TOKEN = "connect-token-7f3a9c1e5b2d4f6a8c0e"
ACCOUNT_TOKEN = "account-token-0b1c2d3e4f5a6b7c8d9e"

PROVISION = """
- name: Provision
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Report the host
      ansible.builtin.set_stats:
        data:
          devin_outposts_machine:
            host: "{{ devin_outposts_machine_name }}"
            vars: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}"}
        aggregate: false
"""
# A stand-in for the collection's start playbook: it keeps what the role would get, in a file of the test.
START = """
- name: Start
  hosts: all
  gather_facts: false
  tasks:
    - name: Keep the token as the role would (no_log)
      ansible.builtin.copy:
        content: "{{ lookup('ansible.builtin.file', devin_outposts_orchestrator_token_file) }}"
        dest: "{{ out }}/token"
        mode: "0600"
      no_log: true
    - name: Keep the other variables
      ansible.builtin.copy:
        content: >-
          {{ {'session': devin_outposts_worker_session_id, 'gateway': devin_outposts_worker_gateway_url,
              'host': inventory_hostname, 'outpost': devin_outposts_outpost_id,
              'policy': devin_outposts_worker_session_network_policy | default(None)} | to_json }}
        dest: "{{ out }}/start.json"
        mode: "0600"
"""
TEARDOWN = """
- name: Teardown
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Record what the teardown was given
      ansible.builtin.copy:
        content: "{{ {'machine': devin_outposts_machine, 'session': devin_outposts_session_id} | to_json }}"
        dest: "{{ out }}/teardown-{{ devin_outposts_machine_name }}.json"
        mode: "0600"
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return path


@pytest.fixture
def playbooks(tmp_path: Path) -> dict[str, Path]:
    out = tmp_path / "out"
    out.mkdir()
    return {
        "out": out,
        "provision": _write(tmp_path / "provision.yml", PROVISION),
        "start": _write(tmp_path / "start.yml", START),
        "teardown": _write(tmp_path / "teardown.yml", TEARDOWN),
        "failing": _write(
            tmp_path / "failing.yml",
            "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
            "    - ansible.builtin.fail: {msg: no capacity left}\n",
        ),
        "silent": _write(tmp_path / "silent.yml", "- hosts: localhost\n  gather_facts: false\n  tasks: []\n"),
        "vars": _write(tmp_path / "vars.yml", f"out: {out}\n"),
    }


def _driver(tmp_path: Path, playbooks: dict[str, Path], **options: Any) -> AnsibleDriver:
    base = {
        "provision_playbook": str(playbooks["provision"]),
        "teardown_playbook": str(playbooks["teardown"]),
        "start_playbook": str(playbooks["start"]),
        "extra_vars_file": str(playbooks["vars"]),
    }
    return AnsibleDriver.from_options(DriverContext(state_dir=tmp_path / "state"), {**base, **options})


POLICY = {"enabled": True, "allow": [{"hostname": "github.com"}]}
SPEC = SessionSpec(
    session_id="devin-0a1b2c", outpost_id="outpost_env-1", acceptor_id="orch-1", platform="linux"
)


def _secrets_in(root: Path) -> list[str]:
    return [
        f"{path}: {name}"
        for path in root.rglob("*")
        if path.is_file()
        for name, value in (("connect token", CONNECT_TOKEN), ("account token", ACCOUNT_TOKEN))
        if value.encode() in path.read_bytes()
    ]


# --- options -----------------------------------------------------------------------------------------


def test_the_registry_loads_the_driver() -> None:
    assert driver_class("ansible") is AnsibleDriver


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"provison_playbook": "x"}, "unknown ansible driver option provison_playbook; known: provision_"),
        ({"teardown_playbook": "{teardown}"}, "driver option provision_playbook is required"),
        (
            {"provision_playbook": "/nonexistent.yml"},
            "driver option provision_playbook: /nonexistent.yml does not exist",
        ),
        ({"env": {"DEVIN_OUTPOSTS_TOKEN": "x"}}, "driver option env may not set DEVIN_OUTPOSTS_TOKEN"),
        ({"env": ["A=1"]}, "driver option env must be a mapping"),
        ({"status_timeout": "soon"}, "driver option status_timeout must be a number of seconds"),
        ({"start_timeout": 0}, "driver option start_timeout must be positive"),
        ({"keep_artifacts": "maybe"}, "driver option keep_artifacts must be true or false"),
        ({"machine_prefix": "Bad_Prefix"}, "driver option machine_prefix must be"),
        ({"machine_name_length": "12"}, "driver option machine_name_length 12 is too short"),
    ],
)
def test_bad_options_are_refused_with_one_line(
    tmp_path: Path, playbooks: dict[str, Path], options: dict[str, Any], message: str
) -> None:
    base: dict[str, Any] = {
        "provision_playbook": str(playbooks["provision"]),
        "teardown_playbook": str(playbooks["teardown"]),
    }
    if "teardown_playbook" in options:
        base = {"teardown_playbook": str(playbooks["teardown"])}
        options = {}
    with pytest.raises(DriverError) as caught:
        AnsibleDriver.from_options(DriverContext(state_dir=tmp_path), {**base, **options})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# --- the unit's state ------------------------------------------------------------------------------


def _show(**props: str) -> str:
    base = {
        "LoadState": "loaded",
        "ExecMainCode": "0",
        "ExecMainStatus": "0",
        "ExecMainStartTimestampMonotonic": "0",
    }
    return "\n".join(f"{k}={v}" for k, v in {**base, **props}.items())


@pytest.mark.parametrize(
    ("show", "state", "code"),
    [
        (_show(LoadState="not-found", ActiveState="inactive", SubState="dead"), WorkerState.STARTING, None),
        (_show(ActiveState="inactive", SubState="dead"), WorkerState.STARTING, None),
        (_show(ActiveState="activating", SubState="start"), WorkerState.STARTING, None),
        (
            _show(ActiveState="active", SubState="running", ExecMainStartTimestampMonotonic="5"),
            WorkerState.RUNNING,
            None,
        ),
        (
            _show(
                ActiveState="active",
                SubState="exited",
                ExecMainCode="1",
                ExecMainStatus="0",
                ExecMainStartTimestampMonotonic="5",
            ),
            WorkerState.EXITED,
            0,
        ),
        (
            _show(
                ActiveState="failed",
                SubState="failed",
                Result="exit-code",
                ExecMainCode="1",
                ExecMainStatus="7",
                ExecMainStartTimestampMonotonic="5",
            ),
            WorkerState.EXITED,
            7,
        ),
        (
            _show(
                ActiveState="failed",
                SubState="failed",
                Result="signal",
                ExecMainCode="2",
                ExecMainStatus="9",
                ExecMainStartTimestampMonotonic="5",
            ),
            WorkerState.EXITED,
            137,
        ),
    ],
)
def test_unit_states(show: str, state: WorkerState, code: int | None) -> None:
    status = parse_unit_state(show)
    assert (status.state, status.exit_code) == (state, code)


# --- the runs' environment -------------------------------------------------------------------------


def test_runs_get_no_token_from_the_orchestrator_environment() -> None:
    env = runner_environment(
        {"CLOUD_REGION": "eu"},
        base={
            "PATH": "/usr/bin",
            "HOME": "/root",
            "DEVIN_OUTPOSTS_TOKEN": ACCOUNT_TOKEN,
            "DEVIN_API_URL": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
            "ANSIBLE_COLLECTIONS_PATH": "/c",
        },
    )
    assert sorted(env) == ["ANSIBLE_COLLECTIONS_PATH", "CLOUD_REGION", "HOME", "PATH"]
    assert env["PATH"].endswith(":/usr/bin") and env["PATH"] != "/usr/bin"


# --- real runs on localhost ------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_session_from_provision_to_teardown(
    tmp_path: Path, playbooks: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVIN_OUTPOSTS_TOKEN", ACCOUNT_TOKEN)
    driver = _driver(tmp_path, playbooks, keep_artifacts="true")
    out = playbooks["out"]
    launch = WorkerLaunch(
        session_id=SPEC.session_id,
        connect_token=CONNECT_TOKEN,
        gateway_url="wss://gw.example",
        network_policy=POLICY,
    )

    async def scenario() -> tuple[Any, ...]:
        machine = await driver.provision(SPEC)
        again = await driver.provision(SPEC)
        owned = await driver.list_owned("orch-1", "outpost_env-1")
        others = await driver.list_owned("orch-2", "outpost_env-1")
        await driver.start(machine, launch)
        await driver.teardown(machine)
        await driver.teardown(machine)  # gone already: no error, no second run
        return machine, again, owned, others, await driver.list_owned("orch-1", "outpost_env-1")

    machine, again, owned, others, after = asyncio.run(scenario())
    assert machine.ref == machine.name and machine.name.startswith("devin-devin-0a1b2c-")
    assert again.name == machine.name and again.created_at == machine.created_at
    assert [m.name for m in owned] == [machine.name] and others == [] and after == []
    # The start playbook got the token through its file, and the session's variables.
    assert (out / "token").read_text() == CONNECT_TOKEN
    assert json.loads((out / "start.json").read_text()) == {
        "session": SPEC.session_id,
        "gateway": "wss://gw.example",
        "host": machine.name,
        "outpost": "outpost_env-1",
        "policy": POLICY,
    }
    # The teardown got the host the provision reported, once.
    teardowns = list(out.glob("teardown-*.json"))
    assert [json.loads(p.read_text())["machine"]["host"] for p in teardowns] == [machine.name]
    state = tmp_path / "state" / "ansible"
    assert list((state / "secrets").iterdir()) == [], "the token file outlived the start"
    # One run per phase: the second provision found the record, the second teardown found nothing.
    phases = sorted(p.name.split("-")[1] for p in (state / "artifacts" / machine.name).iterdir())
    assert phases == ["provision", "start", "teardown"], phases
    assert list(state.rglob("job_events/*.json")), "the runs wrote no events to search"
    assert _secrets_in(tmp_path / "state") == []
    assert (state / "machines").stat().st_mode & 0o777 == 0o700


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("playbook", "reason"),
    [
        ("failing", "the provision playbook failed: task "),
        ("silent", "the provision playbook did not report its host"),
    ],
)
def test_a_failed_provision_is_torn_down_and_forgotten(
    tmp_path: Path, playbooks: dict[str, Path], playbook: str, reason: str
) -> None:
    driver = _driver(tmp_path, playbooks, provision_playbook=str(playbooks[playbook]))

    async def scenario() -> list[Any]:
        with pytest.raises(DriverError) as caught:
            await driver.provision(SPEC)
        assert reason in str(caught.value) and "\n" not in str(caught.value)
        return await driver.list_owned("orch-1", "outpost_env-1")

    assert asyncio.run(scenario()) == []
    teardowns = [json.loads(p.read_text()) for p in playbooks["out"].glob("teardown-*.json")]
    assert teardowns == [{"machine": {}, "session": SPEC.session_id}]
    assert os.listdir(tmp_path / "state" / "ansible" / "machines") == []


def test_snapshots_are_refused(tmp_path: Path, playbooks: dict[str, Path]) -> None:
    driver = _driver(tmp_path, playbooks)

    async def scenario() -> None:
        machine = machine_of(
            {"name": "m", "session_id": "s", "outpost_id": "o", "acceptor_id": "a", "created_at": 0}
        )
        with pytest.raises(DriverError, match="does not snapshot; use resume policy start_fresh"):
            await driver.snapshot(machine)
        assert await driver.list_snapshots("a", "o") == []
        assert (await driver.status(machine)).state is WorkerState.MISSING

    asyncio.run(scenario())


def test_leftovers_of_a_killed_orchestrator_are_swept(tmp_path: Path, playbooks: dict[str, Path]) -> None:
    driver = _driver(tmp_path, playbooks)
    secrets_dir = tmp_path / "state" / "ansible" / "secrets"
    runs_dir = tmp_path / "state" / "ansible" / "runs"
    secrets_dir.mkdir(parents=True)
    (runs_dir / "20261204T000000-start-abc123-x").mkdir(parents=True)
    old = secrets_dir / "devin-m.0001.token"
    old.write_text(CONNECT_TOKEN)
    os.utime(old, (1, 1))
    fresh = secrets_dir / "devin-n.0002.token"
    fresh.write_text(CONNECT_TOKEN)

    async def scenario() -> tuple[int, list[str]]:
        # A periodic sweep spares files as young as a run in flight; the start-up check removes everything.
        swept = await driver.sweep_orphans("orch-1", "outpost_env-1", set())
        left = sorted(p.name for p in secrets_dir.iterdir())
        await driver.check()
        return swept, left

    swept, left = asyncio.run(scenario())
    assert (swept, left) == (1, ["devin-n.0002.token"])
    assert list(secrets_dir.iterdir()) == []
    assert list(runs_dir.iterdir()) == []


@pytest.mark.timeout(300)
def test_an_unreachable_host_is_an_error_then_missing(tmp_path: Path, playbooks: dict[str, Path]) -> None:
    # A host on a closed local port: ssh fails at once, as for a machine destroyed behind our back.
    unreachable = _write(
        tmp_path / "unreachable.yml",
        PROVISION.replace(
            'vars: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}"}',
            "vars: {ansible_host: 127.0.0.1, ansible_port: 1}",
        ),
    )
    driver = _driver(tmp_path, playbooks, provision_playbook=str(unreachable))
    launch = WorkerLaunch(
        session_id="devin/../x", connect_token=CONNECT_TOKEN, gateway_url="wss://gw.example"
    )

    async def scenario() -> tuple[list[str], Any]:
        machine = await driver.provision(SPEC)
        with pytest.raises(DriverError, match=r"session id 'devin/\.\./x' cannot name a systemd unit"):
            await driver.start(machine, launch)
        errors = []
        for dummy in range(2):
            with pytest.raises(DriverError) as caught:
                await driver.status(machine)
            errors.append(str(caught.value))
        return errors, await driver.status(machine)

    errors, third = asyncio.run(scenario())
    assert all("unreachable on devin-devin-0a1b2c-" in e for e in errors), errors
    assert third.state is WorkerState.MISSING, third
    # The bad id was refused before any token file was written.
    assert not (tmp_path / "state" / "ansible" / "secrets").exists()


# --- the status source: every machine read by one run ----------------------------------------------------

# Three hosts: box-a holds two sessions' units, box-b one, box-away is never reachable.
PROVISION_BOXES = """
- name: Provision onto shared hosts
  hosts: localhost
  gather_facts: false
  vars:
    here: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}"}
    away: {ansible_host: 127.0.0.1, ansible_port: 1}
    box: "{{ {'1': 'box-a', '2': 'box-a', '3': 'box-b'}.get(devin_outposts_session_id[-1], 'box-away') }}"
  tasks:
    - name: Report the host
      ansible.builtin.set_stats:
        data:
          devin_outposts_machine: {host: "{{ box }}", vars: "{{ away if box == 'box-away' else here }}"}
        aggregate: false
"""
# A stand-in for `systemctl show` on the hosts: each unit's state from a file of the test (absent: not
# found), in the order asked, blank-line apart, as systemd prints several units; every call logged.
SYSTEMCTL = """#!/bin/sh
echo "$*" >> "$FAKE_UNITS/calls.log"
shift 2
first=1
for unit in "$@"; do
  [ "$first" = 1 ] || echo
  first=0
  echo "Id=$unit"
  if [ -f "$FAKE_UNITS/$unit" ]; then cat "$FAKE_UNITS/$unit"
  else printf 'LoadState=not-found\\nActiveState=inactive\\nSubState=dead\\n'; fi
done
"""
RUNNING = "LoadState=loaded\nActiveState=active\nSubState=running\nExecMainStartTimestampMonotonic=5\n"
STOPPED = (
    "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\nExecMainCode=1\n"
    "ExecMainStatus=3\nExecMainStartTimestampMonotonic=5\n"
)


class CountingAnsibleDriver(AnsibleDriver):
    """The real driver, counting the direct status reads (each one a whole run)."""

    direct_reads = 0

    async def status(self, machine: Machine) -> WorkerStatus:
        type(self).direct_reads += 1
        return await super().status(machine)


def _unit(units: Path, session_id: str, state: str) -> None:
    (units / f"devin-outposts-session@{session_id}.service").write_text(state)


async def _row(board: StatusBoard, name: str, done: Any) -> WorkerStatus:
    for dummy in range(1200):  # at most 120 s (each read is an ansible run): only shows nothing hangs
        row = board.row(name)
        if row is not None and done(row.status):
            return row.status
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name}: {board.row(name)}")


@pytest.mark.timeout(300)
def test_one_run_reads_every_machine_and_a_stopped_unit_ends_its_worker(
    tmp_path: Path, playbooks: dict[str, Path]
) -> None:
    fakebin, units = tmp_path / "bin", tmp_path / "units"
    fakebin.mkdir()
    units.mkdir()
    (fakebin / "systemctl").write_text(SYSTEMCTL)
    (fakebin / "systemctl").chmod(0o755)
    provision = _write(tmp_path / "boxes.yml", PROVISION_BOXES)
    path = os.pathsep.join([str(fakebin), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    driver = CountingAnsibleDriver.from_options(
        DriverContext(state_dir=tmp_path / "state"),
        {
            "provision_playbook": str(provision),
            "teardown_playbook": str(playbooks["teardown"]),
            "start_playbook": str(playbooks["start"]),
            "extra_vars_file": str(playbooks["vars"]),
            "env": {"PATH": path, "FAKE_UNITS": str(units)},
            "status_interval": "1",
        },
    )
    sids = ["devin-s1", "devin-s2", "devin-s3", "devin-s4"]
    source = driver.status_source("orch-1")
    assert isinstance(source, AnsibleStatusSource)

    async def scenario() -> dict[str, Any]:
        board = StatusBoard()
        task = asyncio.ensure_future(source.run(board))
        machines = {sid: await driver.provision(replace(SPEC, session_id=sid)) for sid in sids}
        for sid in sids[:3]:
            _unit(units, sid, RUNNING)
            await driver.start(machines[sid], WorkerLaunch(sid, CONNECT_TOKEN, "wss://gw.example"))
        log = units / "calls.log"
        runs, mark = source.runs, len(log.read_text().splitlines()) if log.exists() else 0
        seen = {}
        for sid in sids[:3]:
            seen[sid] = await _row(board, machines[sid].name, lambda s: s.state is WorkerState.RUNNING)
        # The calls since every machine was made (three start runs later: a run under way now began after).
        calls_running = log.read_text().splitlines()[mark:]
        runs = source.runs - runs + 1
        _unit(units, "devin-s2", STOPPED)  # the worker died; its session is still live
        stopped = await _row(board, machines["devin-s2"].name, lambda s: s.state is WorkerState.EXITED)
        away = await _row(board, machines["devin-s4"].name, lambda s: s.state is WorkerState.MISSING)
        others = [board.row(machines[sid].name) for sid in ("devin-s1", "devin-s3")]
        task.cancel()
        for machine in machines.values():
            await driver.teardown(machine)
        return {
            "seen": seen, "calls": calls_running, "runs": runs, "stopped": stopped, "away": away,
            "others": others,
        }  # fmt: skip

    found = asyncio.run(scenario())
    assert {s.state for s in found["seen"].values()} == {WorkerState.RUNNING}
    assert (found["stopped"].state, found["stopped"].exit_code) == (WorkerState.EXITED, 3)
    assert [r.status.state for r in found["others"] if r is not None] == [WorkerState.RUNNING] * 2
    assert (found["away"].detail) == "box-away unreachable 3 times in a row", found["away"]
    # Each run is one call of systemctl per host, with every unit of that host: box-a's two in one call.
    calls = found["calls"]
    box_a = " ".join(f"devin-outposts-session@devin-s{i}.service" for i in (1, 2))
    assert calls and all(c.endswith(box_a) or c.endswith("@devin-s3.service") for c in calls), calls
    # The two hosts of a run are called at once, so the log read above may cut the last run between them.
    per_host = (sum(c.endswith(box_a) for c in calls), sum(c.endswith("@devin-s3.service") for c in calls))
    assert abs(per_host[0] - per_host[1]) <= 1, per_host
    assert len(calls) <= 2 * found["runs"]
    assert CountingAnsibleDriver.direct_reads == 0  # no machine was read on its own


# A stand-in start playbook that counts its runs (each one a worker started on the host).
START_COUNTED = (
    START
    + """    - name: Count the starts
      ansible.builtin.shell: echo start >> {{ out }}/starts.log
      changed_when: true
"""
)


@pytest.mark.timeout(300)
def test_a_unit_that_stopped_ends_its_worker_and_the_session_starts_another(
    tmp_path: Path, playbooks: dict[str, Path], sim: SimHandle, outpost: Outpost
) -> None:
    fakebin, units = tmp_path / "bin", tmp_path / "units"
    fakebin.mkdir()
    units.mkdir()
    (fakebin / "systemctl").write_text(SYSTEMCTL)
    (fakebin / "systemctl").chmod(0o755)
    path = os.pathsep.join([str(fakebin), str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    options = {
        "provision_playbook": str(playbooks["provision"]),
        "teardown_playbook": str(playbooks["teardown"]),
        "start_playbook": str(_write(tmp_path / "start-counted.yml", START_COUNTED)),
        "extra_vars_file": str(playbooks["vars"]),
        "env": {"PATH": path, "FAKE_UNITS": str(units)},
        "status_interval": "1",
    }
    driver = CountingAnsibleDriver.from_options(DriverContext(state_dir=tmp_path / "state"), options)
    CountingAnsibleDriver.direct_reads = 0
    sid = "devin-unit-stops"
    _unit(units, sid, RUNNING)
    # A boot timeout past the test's: only the unit's stop can start a second worker.
    config = OrchestratorConfig(
        outpost=outpost.name, driver="ansible", max_concurrent=1, state_dir=tmp_path / "state",
        acceptor_id="orch-1", api_url=sim.url, token=sim.create_token("orchestrator"), status_interval=0.05,
        poll_interval=0.2, confirm_interval=0.05, confirm_reads=2, gc_interval=30.0, backoff_max=1.0,
        boot_timeout=600.0,
    )  # fmt: skip
    orch = Running(Orchestrator(config, driver=driver))
    try:
        sim.admin.enqueue(outpost.outpost_id, session_id=sid)
        starts = playbooks["out"] / "starts.log"
        machine = machine_name("devin", sid)
        board = orch.orchestrator.board
        wait_for(starts.exists, timeout=120, what="the worker started")
        wait_for(
            lambda: (row := board.row(machine)) is not None and row.status.state is WorkerState.RUNNING,
            timeout=120,
            what="the unit seen running",
        )
        _unit(units, sid, STOPPED)  # the worker died; the session is still in the queue
        wait_for(lambda: len(starts.read_text().splitlines()) >= 2, timeout=120, what="a second start")
        _unit(units, sid, RUNNING)  # the second worker runs
    finally:
        orch.stop()
    assert CountingAnsibleDriver.direct_reads == 0  # the session never read its machine on its own


class ScriptedReader:
    """The ansible driver as its status source sees it, with scripted runs: each answer is a mapping of
    host -> the ``systemctl show`` output (or ``None``: unreachable); ``{}``: a run that answered nothing."""

    unreachable_limit = 3

    def __init__(self, root: Path, answers: list[dict[str, Any]]) -> None:
        self.sources: set[AnsibleStatusSource] = set()
        self.records = MachineRecords(root)
        self.answers = answers
        self.during_run: list[Any] = []

    async def read_units(self, hosts: Any, *, forks: int) -> RunResult:
        for action in self.during_run:
            action()
        self.during_run = []
        events = [
            {
                "event": "runner_on_ok" if show is not None else "runner_on_unreachable",
                "event_data": {
                    "host": host,
                    "res": {"stdout": show} if show is not None else {"msg": "down"},
                },
            }
            for host, show in self.answers.pop(0).items()
        ]
        return RunResult(
            "successful" if events else "failed", 0 if events else 1, Path("/nonexistent"), events
        )


def test_the_source_keeps_what_a_run_cannot_tell_and_ignores_what_a_start_made_stale(tmp_path: Path) -> None:
    running = "Id=devin-outposts-session@devin-{}.service\n" + RUNNING
    stopped = "Id=devin-outposts-session@devin-{}.service\n" + STOPPED
    reader = ScriptedReader(
        tmp_path,
        [
            {"host-a": running.format(1), "host-b": running.format(2)},
            {"host-a": stopped.format(1), "host-b": None},  # host-b unreachable: m2 keeps its status
            {},  # nothing answered: every status kept
            {"host-a": stopped.format(1), "host-b": running.format(2)},  # m1 restarted meanwhile
        ],
    )
    for number, host in ((1, "host-a"), (2, "host-b")):
        reader.records.write(
            {"name": f"m{number}", "session_id": f"devin-{number}", "outpost_id": "o",
             "acceptor_id": "orch-1", "created_at": 0.0, "session": {}, "host": host, "host_vars": {}}
        )  # fmt: skip
    source = AnsibleStatusSource(reader, "orch-1", interval=3600)

    async def scenario() -> list[Any]:
        board = StatusBoard()
        task = asyncio.ensure_future(source.run(board))  # its first run, then an hour's wait
        await asyncio.sleep(0.1)
        seen = [(board.row("m1"), board.row("m2"))]
        for dummy in range(2):
            answered = await source.read_all(board)
            seen.append((answered, board.row("m1"), board.row("m2"), board.synced))
        reader.during_run.append(lambda: source.started("m1", "orch-1"))
        seen.append((await source.read_all(board), board.row("m1"), board.row("m2")))
        task.cancel()
        return seen

    first, unreachable, nothing, restarted = asyncio.run(scenario())
    assert [r.status.state for r in first] == [WorkerState.RUNNING] * 2
    answered, m1, m2, synced = unreachable
    assert (answered, m1.status.exit_code, m2.status.state, synced) == (True, 3, WorkerState.RUNNING, True)
    answered, m1, m2, synced = nothing
    assert (answered, m1.status.exit_code, m2.status.state, synced) == (False, 3, WorkerState.RUNNING, True)
    # The run saw the worker m1's start replaced: its row stays the new worker's, not the old one's exit.
    answered, m1, m2 = restarted
    assert (answered, m1.status.state, m2.status.state) == (True, WorkerState.STARTING, WorkerState.RUNNING)
