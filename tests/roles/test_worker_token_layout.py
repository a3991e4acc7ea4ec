"""Where the worker role puts an instance's token: the drop-in and the environment file, rendered by Ansible from
the role's templates with its defaults and private vars (no host needed).

Issue 24, point 2: the bundled worker's token is its standard input (``StandardInput=file:<name>.token``,
``DEVIN_OUTPOSTS_TOKEN_FD=0``) and in no environment file; the official CLI (``devin_cli``), which can read its
token from its environment only, keeps it in its 0600 environment file. The Molecule ``default`` scenario checks
the bundled layout on real hosts (``/proc/<pid>/environ``); no scenario runs the official CLI, so this is where
its layout is checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_play import run_local_play
from role_tasks import find_task  # type: ignore[import-not-found]

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "worker"
TOKEN = "unit-test-token-8d21c4"
OWN_TOKEN = "unit-test-own-token-3f9a07"


@pytest.fixture(autouse=True)
def _collection_link() -> None:
    if not (ROOT / ".cache/collections/ansible_collections/devin/outposts").exists():
        pytest.fail("run through scripts/test.sh (scripts/lib.sh links the checkout into .cache/collections)")


def render(tmp_path: Path, role_vars: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The drop-in and the env file of each instance of ``role_vars`` (over the role's defaults and vars)."""
    dropin = ROLE / "templates" / "instance.conf.j2"
    env_file = ROLE / "templates" / "worker.env.j2"
    content = (
        f"{{{{ {{'dropin': lookup('ansible.builtin.template', '{dropin}'), "
        f"'env': lookup('ansible.builtin.template', '{env_file}')}} | to_json }}}}"
    )
    # The role's own first task, which resolves the token (the variable, else DEVIN_OUTPOSTS_TOKEN) under no_log.
    resolve_token = next(task for task in yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
                         if task["name"].startswith("Resolve the token"))  # fmt: skip
    resolve_instances = {"name": "Resolve the instances", "ansible.builtin.set_fact": {
        "resolved": "{{ devin_outposts_worker_instances | devin.outposts.worker_instances({'workdir_root': "
                    "devin_outposts_worker_workdir_root, 'data_dir': devin_outposts_worker_data_dir, 'env': "
                    "devin_outposts_worker_env, 'api_url': devin_outposts_worker_api_url, 'has_token': true, "
                    "'fleet_size': devin_outposts_worker_fleet_size}) }}"}}  # fmt: skip
    play = [{
        "name": "Render the worker's drop-ins and environment files", "hosts": "localhost",
        "connection": "local", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [resolve_token, resolve_instances, {
            "name": "Render", "no_log": True, "loop": "{{ resolved }}",
            "ansible.builtin.copy": {"content": content, "dest": str(tmp_path) + "/{{ item.name }}.json",
                                     "mode": "0600"}}],
    }]  # fmt: skip
    output = run_local_play(tmp_path, play, role_vars)
    assert TOKEN not in output and OWN_TOKEN not in output
    return {
        instance["name"]: json.loads((tmp_path / f"{instance['name']}.json").read_text(encoding="utf-8"))
        for instance in role_vars["devin_outposts_worker_instances"]
    }


def directives(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


INSTANCES = {
    "devin_outposts_worker_token": TOKEN,
    "devin_outposts_worker_instances": [
        {"name": "main", "outpost": "pool"},
        {"name": "own", "outpost": "pool", "token": OWN_TOKEN},
        {"name": "cli", "outpost": "pool", "implementation": "devin_cli", "max_sessions": 1},
        {"name": "cliown", "outpost": "pool", "implementation": "devin_cli", "max_sessions": 1, "token": OWN_TOKEN},
    ],
}


def test_a_bundled_worker_gets_its_token_on_standard_input_and_in_no_environment(tmp_path: Path) -> None:
    out = render(tmp_path, INSTANCES)
    for name in ("main", "own"):
        dropin, env = directives(out[name]["dropin"]), directives(out[name]["env"])
        assert dropin["StandardInput"] == f"file:/etc/devin-outposts/{name}.token", out[name]["dropin"]
        assert dropin["StandardOutput"] == "journal"
        assert dropin["Environment"] == "DEVIN_OUTPOSTS_TOKEN_FD=0"
        assert not {"DEVIN_OUTPOSTS_TOKEN", "DEVIN_OUTPOSTS_TOKEN_FD", "DEVIN_OUTPOSTS_TOKEN_FILE"} & set(env), sorted(env)
        assert TOKEN not in out[name]["env"] + out[name]["dropin"]
        assert OWN_TOKEN not in out[name]["env"] + out[name]["dropin"]
        assert env["DEVIN_OUTPOSTS_WORKER_OUTPOST"] == '"pool"'


def test_the_official_cli_keeps_its_token_in_its_environment_file(tmp_path: Path) -> None:
    out = render(tmp_path, INSTANCES)
    for name, token in (("cli", TOKEN), ("cliown", OWN_TOKEN)):
        dropin, env = directives(out[name]["dropin"]), directives(out[name]["env"])
        assert "StandardInput" not in dropin and "Environment" not in dropin, out[name]["dropin"]
        assert env["DEVIN_OUTPOSTS_TOKEN"] == f'"{token}"'
        assert dropin["ExecStart"].startswith("/usr/local/bin/devin worker start")


def test_the_fleet_size_goes_to_the_bundled_workers_environment(tmp_path: Path) -> None:
    """``devin_outposts_worker_fleet_size`` (or an instance's ``fleet_size``) becomes DEVIN_WORKER_FLEET_SIZE of
    the bundled workers; a fleet of one says nothing, and the official CLI, which has no such option, gets none."""
    out = render(tmp_path, {
        "devin_outposts_worker_token": TOKEN,
        "devin_outposts_worker_fleet_size": 300,
        "devin_outposts_worker_instances": [
            {"name": "main", "outpost": "pool"},
            {"name": "own", "outpost": "pool", "fleet_size": 12},
            {"name": "lone", "outpost": "solo", "fleet_size": 1},
            {"name": "cli", "outpost": "pool", "implementation": "devin_cli", "max_sessions": 1},
        ],
    })  # fmt: skip
    sizes = {name: directives(out[name]["env"]).get("DEVIN_WORKER_FLEET_SIZE") for name in out}
    assert sizes == {"main": '"300"', "own": '"12"', "lone": None, "cli": None}
    # The role's own preflight passes the variable to the same filter (this test's play resolves it the same way).
    resolve = find_task(ROLE / "tasks" / "preflight.yml", "Resolve the instances")
    assert resolve["vars"]["__devin_outposts_worker_defaults"]["fleet_size"] == "{{ devin_outposts_worker_fleet_size }}"
