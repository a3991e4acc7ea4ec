"""The orchestrator role's systemd unit and environment file, rendered by Ansible from the role's templates
with its defaults and private vars (no host needed); the Molecule ``orchestrator`` scenario runs them for real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from local_play import run_local_play

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "orchestrator"
TOKEN = "unit-test-token-61be0f"


@pytest.fixture(autouse=True)
def _collection_link() -> None:
    if not (ROOT / ".cache/collections/ansible_collections/devin/outposts").exists():
        pytest.fail("run through scripts/test.sh (scripts/lib.sh links the checkout into .cache/collections)")


def render(tmp_path: Path, role_vars: dict[str, Any]) -> dict[str, str]:
    """The unit and the env file for ``role_vars`` (over the role's defaults and vars/main.yml)."""
    unit_template = ROLE / "templates" / "devin-outposts-orchestrator.service.j2"
    env_template = ROLE / "templates" / "orchestrator.env.j2"
    content = (
        f"{{{{ {{'unit': lookup('ansible.builtin.template', '{unit_template}'), "
        f"'env': lookup('ansible.builtin.template', '{env_template}')}} | to_json }}}}"
    )
    # The role's own first task, which resolves the token (the variable, else DEVIN_OUTPOSTS_TOKEN) under no_log.
    resolve_token = next(task for task in yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
                         if task["name"].startswith("Resolve the token"))  # fmt: skip
    play = [{
        "name": "Render the orchestrator's unit and environment file", "hosts": "localhost",
        "connection": "local", "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [resolve_token, {"name": "Render", "no_log": True, "ansible.builtin.copy": {
            "content": content, "dest": str(tmp_path / "out.json"), "mode": "0600"}}],
    }]  # fmt: skip
    output = run_local_play(tmp_path, play, role_vars)
    assert TOKEN not in output
    rendered: dict[str, str] = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    return rendered


def directives(unit: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))


BASE = {"devin_outposts_orchestrator_outpost": "build-pool", "devin_outposts_orchestrator_token": TOKEN}


def test_the_unit_has_no_argument_and_no_secret_and_keeps_sessions_on_restart(tmp_path: Path) -> None:
    out = render(tmp_path, BASE)
    unit = directives(out["unit"])
    assert unit["ExecStart"] == "/opt/devin-outposts-orchestrator/venv/bin/devin-outposts orchestrate"
    assert unit["KillMode"] == "process"
    assert unit["EnvironmentFile"] == "/etc/devin-outposts-orchestrator/orchestrator.env"
    # The token is the orchestrator's standard input (issue 24, point 2), never in its environment.
    assert unit["StandardInput"] == "file:/etc/devin-outposts-orchestrator/orchestrator.token"
    assert unit["StandardOutput"] == "journal"
    assert unit["Environment"] == "DEVIN_OUTPOSTS_TOKEN_FD=0"
    assert unit["NoNewPrivileges"] == "true" and unit["ProtectControlGroups"] == "true"
    assert TOKEN not in out["unit"]


def test_the_env_file_carries_every_option_quoted_and_no_token(tmp_path: Path) -> None:
    role_vars = {
        **BASE,
        "devin_outposts_orchestrator_driver": "kubernetes",
        "devin_outposts_orchestrator_driver_config": {"namespace": "x"},
        "devin_outposts_orchestrator_snapshot_ttl": 0,
        "devin_outposts_orchestrator_metrics_addr": "127.0.0.1:9464",
        "devin_outposts_orchestrator_env": {"EXTRA": 'a "quoted" \\ value', "DEVIN_API_URL": "http://ignored"},
        "devin_outposts_orchestrator_api_url": "https://api.example.com",
    }
    lines = [line for line in render(tmp_path, role_vars)["env"].splitlines() if not line.startswith("#")]
    env = dict(line.split("=", 1) for line in lines)
    assert env["DEVIN_ORCHESTRATOR_DRIVER"] == '"kubernetes"'
    assert env["DEVIN_ORCHESTRATOR_DRIVER_CONFIG"] == '"/etc/devin-outposts-orchestrator/driver.json"'
    assert env["DEVIN_ORCHESTRATOR_METRICS_ADDR"] == '"127.0.0.1:9464"'
    assert "DEVIN_ORCHESTRATOR_SNAPSHOT_TTL" not in env  # 0: keep until terminated, the command's default
    assert "DEVIN_ORCHESTRATOR_ACCEPTOR_ID" not in env  # empty: generated and kept in the state dir
    assert env["EXTRA"] == '"a \\"quoted\\" \\\\ value"'
    assert env["DEVIN_API_URL"] == '"https://api.example.com"'  # devin_outposts_orchestrator_env cannot replace it
    assert not {"DEVIN_OUTPOSTS_TOKEN", "DEVIN_OUTPOSTS_TOKEN_FD", "DEVIN_OUTPOSTS_TOKEN_FILE"} & set(env), sorted(env)
    assert TOKEN not in "\n".join(lines)


def test_the_podman_driver_leaves_out_what_would_stop_podman(tmp_path: Path) -> None:
    unit = directives(render(tmp_path, {**BASE, "devin_outposts_orchestrator_driver": "podman"})["unit"])
    conflicts = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["_devin_outposts_orchestrator_podman_conflicts"]
    assert not set(conflicts) & set(unit), sorted(set(conflicts) & set(unit))
    assert unit["KillMode"] == "process" and unit["UMask"] == "0027"


def test_several_outposts_render_as_one_list_with_their_caps(tmp_path: Path) -> None:
    """devin_outposts_orchestrator_outposts: one orchestrator for several outposts, each cap where one is given."""
    outposts = [{"outpost": "alpha", "max_concurrent": 2}, {"outpost": "beta"},
                {"outpost": "gamma", "max_concurrent": 3}]  # fmt: skip
    role_vars = {**BASE, "devin_outposts_orchestrator_outpost": "", "devin_outposts_orchestrator_outposts": outposts,
                 "devin_outposts_orchestrator_max_concurrent": 4}  # fmt: skip
    out = render(tmp_path, role_vars)
    env = dict(line.split("=", 1) for line in out["env"].splitlines() if not line.startswith("#"))
    assert env["DEVIN_ORCHESTRATOR_OUTPOST"] == '"alpha=2,beta,gamma=3"'
    assert env["DEVIN_ORCHESTRATOR_MAX_CONCURRENT"] == '"4"'
    assert "claims sessions of alpha=2,beta,gamma=3 " in out["unit"]
    # The single outpost, as before.
    lines = render(tmp_path, BASE)["env"].splitlines()
    assert '"build-pool"' == dict(line.split("=", 1) for line in lines if not line.startswith("#"))[
        "DEVIN_ORCHESTRATOR_OUTPOST"]  # fmt: skip
