"""The environment file of the worker role's one-session mode (``session.env.j2``), rendered by Ansible with
the role's defaults and private vars (no host needed): the orchestrator's ``ansible`` driver passes the
session's network policy, and the file must give it to the worker as the JSON it was, through systemd's
quoting (docs/network-policy.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from local_play import run_local_play

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "worker"
TOKEN = "unit-test-connect-token-51c0"
#: Quotes and a backslash in a value: systemd's quoting must give them back.
POLICY = {
    "enabled": True,
    "allow": [{"hostname": "*.github.com"}, {"ipv4": "10.0.0.0/8"}, {"hostname": 'a"b\\c'}],
}


@pytest.fixture(autouse=True)
def _collection_link() -> None:
    if not (ROOT / ".cache/collections/ansible_collections/devin/outposts").exists():
        pytest.fail("run through scripts/test.sh (scripts/lib.sh links the checkout into .cache/collections)")


def render(tmp_path: Path, role_vars: dict[str, Any]) -> dict[str, str]:
    """The session's environment file as systemd reads it: each variable and its unquoted value."""
    template = ROLE / "templates" / "session.env.j2"
    play = [{
        "name": "Render the session's environment file", "hosts": "localhost", "connection": "local",
        "gather_facts": False,
        "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
        "tasks": [{"name": "Render", "no_log": True, "ansible.builtin.copy": {
            "content": f"{{{{ lookup('ansible.builtin.template', '{template}') }}}}",
            "dest": str(tmp_path / "session.env"), "mode": "0600"}}],
    }]  # fmt: skip
    assert TOKEN not in run_local_play(tmp_path, play, role_vars)
    values = {}
    for line in (tmp_path / "session.env").read_text(encoding="utf-8").splitlines():
        match = re.fullmatch(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', line)
        if match:  # systemd's EnvironmentFile= double quotes: backslash escapes the next character
            values[match.group(1)] = re.sub(r"\\(.)", r"\1", match.group(2))
    return values


SESSION = {
    "devin_outposts_worker_session_id": "devin-0a1b2c",
    "devin_outposts_worker_session_token": TOKEN,
    "devin_outposts_worker_gateway_url": "wss://gw.example",
}


def test_the_sessions_policy_reaches_the_worker_as_it_was(tmp_path: Path) -> None:
    values = render(tmp_path, {**SESSION, "devin_outposts_worker_session_network_policy": POLICY})
    assert json.loads(values["DEVIN_WORKER_SESSION_NETWORK_POLICY"]) == POLICY
    assert values["DEVIN_REMOTE_SESSION_TOKEN"] == TOKEN


def test_a_session_without_a_policy_sets_no_variable(tmp_path: Path) -> None:
    values = render(tmp_path, SESSION)
    assert "DEVIN_WORKER_SESSION_NETWORK_POLICY" not in values
    assert values["DEVIN_OUTPOST_GATEWAY_URL"] == "wss://gw.example"
