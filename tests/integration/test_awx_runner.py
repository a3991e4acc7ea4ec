# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The user-facing playbooks run the way AWX runs a job: under ansible-runner, against the fleet simulator.

Each job gets a private data directory laid out as AWX lays it out for ansible-runner:

* ``env/envvars``: only what the "Devin Outposts" credential injects (credential_types/devin_outposts/
  injectors.yml, rendered with the credential's inputs): ``DEVIN_API_URL`` and ``DEVIN_OUTPOSTS_TOKEN``;
* ``env/extravars``: the survey's answers;
* ``inventory/``: an inventory directory (the hosts file an inventory source would give);
* ``project/``: the project checkout, here a copy of the repository's ``playbooks/``.

The collection itself comes from the process environment's collections path, as it comes from the execution
environment's image under AWX. After each job the test reads the simulator's state through the fleet API, and
it fails if a token appears in any job event or in any file under ``artifacts/`` other than ``command``,
ansible-runner's own record of the command and its environment. ``test_a_planted_token_is_found`` shows that
this check finds a token that a playbook prints.

Jobs: register_outpost twice (orchestrator token; the second run changes nothing), outpost_status (a
machine-scoped token, read-only) and decommission with ``decommission_outpost`` (the outpost_workers group is
empty here: removing workers needs systemd hosts, which the Molecule scenarios cover).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml
from jinja2.sandbox import ImmutableSandboxedEnvironment

from prerequisites import import_or_cannot_run, tool

httpx, sim_testing = import_or_cannot_run("httpx", "devin_outposts_sim.testing", why="the simulator is not installed")

ROOT = Path(__file__).resolve().parents[2]
TYPE_DIR = ROOT / "credential_types" / "devin_outposts"
#: ansible-runner's record of the command it ran, with the full environment: the one artifact allowed to
#: hold the injected token (AWX keeps the same record out of the job's events and output).
RUNNER_ENV_DUMP = "command"
JOB_TIMEOUT = 180


def injected_env(api_url: str, token: str) -> dict[str, str]:
    """What AWX injects for a "Devin Outposts" credential: injectors.yml's env, rendered with the inputs."""
    injectors = yaml.safe_load((TYPE_DIR / "injectors.yml").read_text())
    render = ImmutableSandboxedEnvironment().from_string
    inputs = {"api_url": api_url, "token": token}
    return {name: render(template).render(inputs) for name, template in injectors["env"].items()}


class Jobs:
    """Runs jobs in fresh private data directories, as AWX would, and keeps them for the token scan."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.dirs: list[Path] = []
        collections = base / "collections"
        (collections / "ansible_collections" / "devin").mkdir(parents=True)
        (collections / "ansible_collections" / "devin" / "outposts").symlink_to(
            ROOT, target_is_directory=True
        )
        # The process environment stands in for the execution environment's image: it has the collection
        # and Ansible's settings, and no Devin variable (those come only from the credential).
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DEVIN_"))}
        self.env.update(
            ANSIBLE_COLLECTIONS_PATH=str(collections),
            ANSIBLE_HOME=str(base / "ansible-home"),
            ANSIBLE_LOCAL_TEMP=str(base / "ansible-tmp"),
            ANSIBLE_DEPRECATION_WARNINGS="0",
            ANSIBLE_PYTHON_INTERPRETER=sys.executable,
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
            PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        )

    def run(
        self,
        playbook: str,
        envvars: dict[str, str],
        extravars: dict[str, Any],
        extra: Optional[dict[str, str]] = None,
    ) -> dict[str, Any]:
        """Run ``playbooks/<playbook>`` as a job; return its status, rc, events and stdout.

        ``extra``: more playbooks (name: text) for the project's ``playbooks/``, beside the repository's.
        """
        name = f"job{len(self.dirs) + 1}-{Path(playbook).stem}"
        data = self.base / name
        (data / "env").mkdir(parents=True)
        (data / "env" / "envvars").write_text(yaml.safe_dump(envvars))
        (data / "env" / "extravars").write_text(yaml.safe_dump(extravars))
        for path in (data / "env" / "envvars", data / "env" / "extravars"):
            path.chmod(0o600)
        (data / "inventory").mkdir()
        (data / "inventory" / "hosts").write_text(
            yaml.safe_dump({"all": {"children": {"outpost_workers": {"hosts": {}}}}})
        )
        shutil.copytree(ROOT / "playbooks", data / "project" / "playbooks")
        for extra_name, text in (extra or {}).items():
            (data / "project" / "playbooks" / extra_name).write_text(text)
        argv = [tool("ansible-runner"), "run", str(data), "-p", f"playbooks/{playbook}", "--ident", name]
        proc = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False
        )
        self.dirs.append(data)
        artifacts = data / "artifacts" / name
        events = [json.loads(path.read_text()) for path in sorted((artifacts / "job_events").glob("*.json"))]
        return {
            "rc": proc.returncode,
            "status": (artifacts / "status").read_text().strip() if (artifacts / "status").exists() else "",
            "events": events,
            "stdout": (artifacts / "stdout").read_text() if (artifacts / "stdout").exists() else proc.stdout,
            "runner": proc.stdout + proc.stderr,
        }


def where_secret_appears(data_dir: Path, secret: str) -> list[str]:
    """The files under ``artifacts/`` (job events included) that hold ``secret``, but runner's env dump."""
    found = []
    for path in sorted((data_dir / "artifacts").rglob("*")):
        if path.is_file() and path.name != RUNNER_ENV_DUMP and secret.encode() in path.read_bytes():
            found.append(str(path.relative_to(data_dir)))
    return found


def stats_artifact(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The job's artifact (set_stats), as AWX reads it from the playbook_on_stats event."""
    stats = [event for event in events if event.get("event") == "playbook_on_stats"]
    assert len(stats) == 1
    data: dict[str, Any] = stats[0]["event_data"].get("artifact_data", {})
    return data


def changed_tasks(events: list[dict[str, Any]]) -> list[str]:
    """The names of the tasks that reported a change, from the job's runner_on_ok events."""
    return [
        event["event_data"]["task"]
        for event in events
        if event.get("event") == "runner_on_ok" and event["event_data"]["res"].get("changed")
    ]


def assert_ok(job: dict[str, Any]) -> None:
    assert (job["rc"], job["status"]) == (0, "successful"), job["stdout"] + job["runner"]


@pytest.mark.timeout(300)
def test_register_status_decommission_as_awx_jobs(tmp_path: Path) -> None:
    jobs = Jobs(tmp_path)
    with sim_testing.run_sim() as sim:
        orchestrator_token = sim.create_token("orchestrator")
        machine_token = sim.create_token("machine")
        http = httpx.Client(base_url=sim.url, headers={"Authorization": f"Bearer {orchestrator_token}"})

        def outposts() -> dict[str, dict[str, Any]]:
            response = http.get("/opbeta/outposts/outposts", params={"first": 100})
            response.raise_for_status()
            return {item["spec"]["name"]: item for item in response.json()["items"]}

        try:
            sim.admin.create_outpost("keep-me", "windows")

            # Register outpost: the survey's answers; the orchestrator-scoped credential.
            job = jobs.run(
                "register_outpost.yml",
                injected_env(sim.url, orchestrator_token),
                {"outpost_name": "awx-gpu", "outpost_platform": "linux", "outpost_description": "from AWX"},
            )
            assert_ok(job)
            registered = outposts()
            assert sorted(registered) == ["awx-gpu", "keep-me"]
            assert registered["awx-gpu"]["spec"]["platform"] == "linux"
            assert registered["awx-gpu"]["spec"]["description"] == "from AWX"
            outpost_id = registered["awx-gpu"]["metadata"]["outpost_id"]
            assert changed_tasks(job["events"]) == ["Create the outpost, or leave it as it is"]
            # Launched again: nothing changes.
            job = jobs.run(
                "register_outpost.yml",
                injected_env(sim.url, orchestrator_token),
                {"outpost_name": "awx-gpu", "outpost_platform": "linux", "outpost_description": "from AWX"},
            )
            assert_ok(job)
            assert changed_tasks(job["events"]) == []
            assert outposts()["awx-gpu"]["metadata"]["outpost_id"] == outpost_id
            for dummy in range(3):
                sim.admin.enqueue(outpost_id)

            # Status: read-only, with a machine-scoped credential; its summary is the job's artifact.
            job = jobs.run(
                "outpost_status.yml", injected_env(sim.url, machine_token), {"outpost_name": "awx-gpu"}
            )
            assert_ok(job)
            summary = stats_artifact(job["events"])["outpost_status"]
            assert summary == [
                {
                    "name": "awx-gpu",
                    "outpost_id": outpost_id,
                    "platform": "linux",
                    "queue_depth": 3,
                    "active_claims": 0,
                }
            ]
            assert sorted(outposts()) == ["awx-gpu", "keep-me"]

            # Decommission, deleting the outpost too.
            job = jobs.run(
                "decommission.yml",
                injected_env(sim.url, orchestrator_token),
                {"decommission_outpost": "awx-gpu"},
            )
            assert_ok(job)
            assert sorted(outposts()) == ["keep-me"]
        finally:
            http.close()

    assert len(jobs.dirs) == 4
    for data_dir in jobs.dirs:
        envvars = yaml.safe_load((data_dir / "env" / "envvars").read_text())
        assert sorted(envvars) == ["DEVIN_API_URL", "DEVIN_OUTPOSTS_TOKEN"]
        for secret in (orchestrator_token, machine_token):
            assert where_secret_appears(data_dir, secret) == [], f"a token leaked in {data_dir.name}"
        # The scan covered real artifacts: job events, stdout, and runner's env dump (which holds the token).
        artifacts = data_dir / "artifacts" / data_dir.name
        assert list((artifacts / "job_events").glob("*.json"))
        assert (artifacts / "stdout").is_file()
        dump = (artifacts / RUNNER_ENV_DUMP).read_text()
        assert envvars["DEVIN_OUTPOSTS_TOKEN"] in dump


def test_a_planted_token_is_found(tmp_path: Path) -> None:
    """The leak check can fail: a playbook that prints the token is caught in its events and output."""
    jobs = Jobs(tmp_path)
    planted = "planted-" + os.urandom(8).hex()
    # A project playbook that leaks the credential, as a careless job template might.
    leak = [
        {
            "name": "Leak the token",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Print it",
                    "ansible.builtin.debug": {
                        "msg": "{{ lookup('ansible.builtin.env', 'DEVIN_OUTPOSTS_TOKEN') }}"
                    },
                }
            ],
        }
    ]
    job = jobs.run(
        "leak.yml", injected_env("http://127.0.0.1:9", planted), {}, {"leak.yml": yaml.safe_dump(leak)}
    )
    assert_ok(job)
    leaks = where_secret_appears(jobs.dirs[0], planted)
    name = jobs.dirs[0].name
    assert f"artifacts/{name}/stdout" in leaks
    assert any(leak.startswith(f"artifacts/{name}/job_events/") for leak in leaks)
