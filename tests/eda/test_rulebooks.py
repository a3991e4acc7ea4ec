# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The example rulebooks, run by ansible-rulebook against the fleet simulator.

ansible-rulebook (PyPI) needs Java 17; without it (or without ansible-rulebook) these tests are skipped on a
developer's machine and fail in CI. Each test asserts on what the rulebook's playbook did (files it wrote, the
units on a test host, the simulator's claims), never on ansible-rulebook's output text.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from devin_outposts_sim.testing import SimHandle

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "tests" / "eda" / "playbooks"
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _rulebook_missing() -> str:
    binary = Path(sys.executable).parent / "ansible-rulebook"
    if not binary.exists() and shutil.which("ansible-rulebook") is None:
        return "needs ansible-rulebook (pip install ansible-rulebook; scripts/bootstrap.sh installs it)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "needs Java 17 (apt-get install openjdk-17-jre-headless; scripts/bootstrap.sh installs it)"
    return ""


@pytest.fixture
def rulebook_tools() -> str:
    missing = _rulebook_missing()
    if missing:
        if IN_CI:
            pytest.fail(f"the rulebook tests cannot run: {missing}")
        pytest.skip(missing)
    binary = Path(sys.executable).parent / "ansible-rulebook"
    return str(binary) if binary.exists() else str(shutil.which("ansible-rulebook"))


class Rulebook:
    """One ``ansible-rulebook`` process; stopped (SIGTERM, then SIGKILL) when the test ends."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(  # noqa: S603 - a fixed command, no shell
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until(self, predicate: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"ansible-rulebook exited ({self.proc.returncode}) before {what}:\n{self.text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:g}s; ansible-rulebook's log:\n{self.text()[-4000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=20)


@pytest.fixture
def run_rulebook(rulebook_tools: str, tmp_path: Path) -> Iterator[Callable[..., Rulebook]]:
    started: list[Rulebook] = []
    link = ROOT / ".cache" / "collections" / "ansible_collections" / "devin" / "outposts"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT)

    def start(name: str, variables: dict[str, Any], inventory: str, api_url: str, token: str) -> Rulebook:
        vars_file = tmp_path / f"{name}.vars.yml"
        vars_file.write_text(yaml.safe_dump(variables), encoding="utf-8")
        inventory_file = tmp_path / f"{name}.inventory.yml"
        inventory_file.write_text(inventory, encoding="utf-8")
        env = {
            key: value for key, value in os.environ.items()
            if key in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "JAVA_HOME", "USER", "LOGNAME")
        }
        env.update(
            PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
            # This checkout as devin.outposts (scripts/lib.sh makes the link), never a stale installed copy.
            ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"),
            ANSIBLE_HOME=str(tmp_path / "ansible-home"),
            ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
            ANSIBLE_NOCOLOR="1",
            # The token reaches the source and the playbooks through the environment only.
            DEVIN_API_URL=api_url,
            DEVIN_OUTPOSTS_TOKEN=token,
        )
        argv = [rulebook_tools, "--rulebook", f"devin.outposts.{name}", "-i", str(inventory_file),
                "--vars", str(vars_file), "-v"]
        rulebook = Rulebook(argv, env, tmp_path / f"{name}.log")
        started.append(rulebook)
        return rulebook

    yield start
    for rulebook in started:
        rulebook.stop()


@pytest.mark.timeout(300)
def test_provision_per_session_runs_the_playbooks_for_each_session(
    sim: SimHandle, machine_token: str, run_rulebook: Callable[..., Rulebook], tmp_path: Path
) -> None:
    outpost = sim.admin.create_outpost("eda-provision", "linux")
    early = sim.admin.enqueue(outpost.outpost_id).session_id  # queued before the rulebook starts: LISTED
    records = tmp_path / "records"
    records.mkdir()
    variables = {
        "provision_outpost": "eda-provision",
        "provision_playbook": str(PLAYBOOKS / "record_provision.yml"),
        "teardown_playbook": str(PLAYBOOKS / "record_teardown.yml"),
        "provision_cursor_file": str(tmp_path / "cursor" / "provision.json"),
    }
    # The playbooks' own settings come from the inventory, as a provision playbook's would.
    inventory = yaml.safe_dump(
        {"all": {"hosts": {"localhost": {"ansible_connection": "local", "record_dir": str(records),
                                         "ansible_python_interpreter": sys.executable}}}}
    )
    rulebook = run_rulebook("provision_per_session", variables, inventory, sim.url, machine_token)
    policy = {"enabled": True, "allow": [{"hostname": "*.example.com"}]}
    later = sim.admin.enqueue(outpost.outpost_id, remote_binary_sha="abc1234", network_policy=policy).session_id
    for sid in (early, later):
        rulebook.wait_until(lambda sid=sid: (records / f"{sid}.json").exists(), f"a machine for {sid}")
    record = json.loads((records / f"{later}.json").read_text())
    on_the_wire = sim.admin.session(later)["entry"]["spec"]["network_policy"]  # the API's own form of it
    assert on_the_wire["allow"][0]["hostname"] == "*.example.com"
    assert record == {
        "machine": later, "session_id": later, "outpost_id": outpost.outpost_id, "platform": "linux",
        "kind": "new", "network_policy": on_the_wire, "remote_binary_sha": "abc1234",
    }
    sim.admin.end_session(later)
    rulebook.wait_until(lambda: (records / f"{later}.torn-down").exists(), f"the teardown of {later}")
    assert not (records / f"{later}.json").exists()
    assert (records / f"{early}.json").exists()  # still waiting: untouched
    assert sorted(p.name for p in records.iterdir()) == sorted([f"{early}.json", f"{later}.torn-down"])
    assert machine_token not in rulebook.text()
