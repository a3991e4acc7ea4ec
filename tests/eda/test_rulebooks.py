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
import sys
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
