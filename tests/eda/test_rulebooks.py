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
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from devin_outposts_sim.testing import SimHandle

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "tests" / "eda" / "playbooks"


@pytest.mark.timeout(300)
def test_provision_per_session_runs_the_playbooks_for_each_session(
    sim: SimHandle, machine_token: str, run_rulebook: Callable[..., Any], tmp_path: Path
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
        {
            "all": {
                "hosts": {
                    "localhost": {
                        "ansible_connection": "local",
                        "record_dir": str(records),
                        "ansible_python_interpreter": sys.executable,
                    }
                }
            }
        }
    )
    rulebook = run_rulebook("provision_per_session", variables, inventory, sim.url, machine_token)
    policy = {"enabled": True, "allow": [{"hostname": "*.example.com"}]}
    later = sim.admin.enqueue(
        outpost.outpost_id, remote_binary_sha="abc1234", network_policy=policy
    ).session_id
    for sid in (early, later):
        rulebook.wait_until(lambda sid=sid: (records / f"{sid}.json").exists(), f"a machine for {sid}")
    record = json.loads((records / f"{later}.json").read_text())
    on_the_wire = sim.admin.session(later)["entry"]["spec"]["network_policy"]  # the API's own form of it
    assert on_the_wire["allow"][0]["hostname"] == "*.example.com"
    assert record == {
        "machine": later,
        "session_id": later,
        "outpost_id": outpost.outpost_id,
        "platform": "linux",
        "kind": "new",
        "network_policy": on_the_wire,
        "remote_binary_sha": "abc1234",
    }
    sim.admin.end_session(later)
    rulebook.wait_until((records / f"{later}.torn-down").exists, f"the teardown of {later}")
    assert not (records / f"{later}.json").exists()
    assert (records / f"{early}.json").exists()  # still waiting: untouched
    assert sorted(p.name for p in records.iterdir()) == sorted([f"{early}.json", f"{later}.torn-down"])
    assert machine_token not in rulebook.text()


# --- The inventory: what ansible-rulebook hands to run_playbook --------------------------------------------------
#
# ansible-rulebook copies what -i names into each run_playbook action's private runner directory: a file alone
# (the group_vars/ and host_vars/ beside it stay behind), a directory whole (ansible_rulebook.util.create_inventory
# in 1.3.2). docs/eda.md must therefore give a directory, and this test runs its command line as written.

EDA_DOC = ROOT / "docs" / "eda.md"


def documented_command(rulebook: str) -> list[str]:
    """docs/eda.md's ``ansible-rulebook --rulebook devin.outposts.<rulebook> ...`` line, split as the shell does."""
    lines = [
        line for line in EDA_DOC.read_text().splitlines()
        if line.startswith("ansible-rulebook ") and f"devin.outposts.{rulebook} " in line
    ]  # fmt: skip
    assert len(lines) == 1, lines
    return shlex.split(lines[0].split("#", 1)[0])


def lay_out_inventory(site: Path, argument: str, hosts: dict[str, Any], group_vars: dict[str, Any],
                      host_vars: dict[str, Any]) -> None:
    """The inventory as a user keeps it for ``-i <argument>``: a directory holding hosts.yml, group_vars/ and
    host_vars/; or an inventory file with group_vars/ and host_vars/ beside it (where ansible-playbook reads
    them)."""
    target = site / argument
    if argument.endswith("/") or not target.suffix:
        target.mkdir(parents=True)
        hosts_file, base = target / "hosts.yml", target
    else:
        hosts_file, base = target, target.parent
    hosts_file.write_text(yaml.safe_dump(hosts))
    (base / "group_vars").mkdir()
    (base / "group_vars" / "all.yml").write_text(yaml.safe_dump(group_vars))
    (base / "host_vars").mkdir()
    (base / "host_vars" / "localhost.yml").write_text(yaml.safe_dump(host_vars))


@pytest.mark.parametrize("rulebook", ["provision_per_session", "autoscale_workers"])
def test_the_documented_commands_give_ansible_rulebook_an_inventory_directory(rulebook: str) -> None:
    argv = documented_command(rulebook)
    argument = argv[argv.index("-i") + 1]
    assert argument.endswith("/"), f"docs/eda.md: {' '.join(argv)}: -i must name the inventory directory"


@pytest.mark.timeout(300)
def test_group_vars_and_host_vars_reach_the_playbook_with_the_documented_invocation(
    sim: SimHandle, machine_token: str, rulebook_tools: str, tmp_path: Path
) -> None:
    """docs/eda.md's provision_per_session command, run as written in a directory laid out for it: the provision
    playbook gets a group_vars setting and a host_vars setting of the inventory."""
    outpost = sim.admin.create_outpost("eda-inventory", "linux")
    session = sim.admin.enqueue(outpost.outpost_id).session_id
    site = tmp_path / "site"
    site.mkdir()
    records = tmp_path / "records"
    records.mkdir()
    argv = documented_command("provision_per_session")
    lay_out_inventory(
        site, argv[argv.index("-i") + 1],
        hosts={"all": {"hosts": {"localhost": {"ansible_connection": "local",
                                               "ansible_python_interpreter": sys.executable}}}},
        group_vars={"record_dir": str(records), "from_group_vars": "a group_vars setting"},
        host_vars={"from_host_vars": "a host_vars setting"},
    )  # fmt: skip
    vars_file = site / argv[argv.index("--vars") + 1]
    vars_file.write_text(yaml.safe_dump({
        "provision_outpost": "eda-inventory",
        "provision_playbook": str(PLAYBOOKS / "record_inventory_vars.yml"),
        "teardown_playbook": str(PLAYBOOKS / "record_teardown.yml"),
        "provision_cursor_file": str(tmp_path / "cursor" / "provision.json"),
    }))  # fmt: skip
    link = ROOT / ".cache" / "collections" / "ansible_collections" / "devin" / "outposts"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "JAVA_HOME")}
    env.update(
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        ANSIBLE_NOCOLOR="1",
        DEVIN_API_URL=sim.url,
        DEVIN_OUTPOSTS_TOKEN=machine_token,
        # Where the playbook writes when group_vars did not reach it: the test then sees "missing" at once
        # instead of waiting for a record that never comes.
        EDA_TEST_FALLBACK_DIR=str(records),
    )
    assert argv[0] == "ansible-rulebook"
    log = tmp_path / "rulebook.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [rulebook_tools, *argv[1:], "-v"], cwd=site, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        record = records / f"{session}.json"
        deadline = time.monotonic() + 120
        while not record.exists():
            assert proc.poll() is None, f"ansible-rulebook exited ({proc.returncode}):\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no record within 120 s:\n{log.read_text()[-4000:]}"
            time.sleep(0.2)
        time.sleep(0.2)  # the copy module writes in place
        assert json.loads(record.read_text()) == {
            "group_vars": "a group_vars setting", "host_vars": "a host_vars setting",
        }  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)
    assert machine_token not in log.read_text()
