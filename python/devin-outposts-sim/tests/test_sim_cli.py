"""``devin-outposts-sim ...`` admin verbs against a running simulator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from devin_outposts.api.models import Outpost
from devin_outposts_sim.cli import main
from devin_outposts_sim.testing import SimHandle


def test_token_create_prints_a_working_token(sim: SimHandle, cli) -> None:
    result = cli("token", "create", "--scope", "machine")
    assert (result.code, result.err) == (0, "")
    token = result.out.strip()
    assert token.startswith("cog_")
    assert (
        httpx.get(
            f"{sim.url}/opbeta/outposts/devins", headers={"Authorization": f"Bearer {token}"}
        ).status_code
        == 200
    )
    result = cli("token", "create", "--scope", "orchestrator", "--account", "acct-x", "--json")
    info = json.loads(result.out)
    assert result.code == 0
    assert info["account_id"] == "acct-x"
    assert info["scopes"] == ["account.outposts.orchestrator"]


def test_enqueue_set_status_tombstone_and_claims(sim: SimHandle, cli, outpost: Outpost) -> None:
    result = cli("enqueue", "--outpost", outpost.outpost_id, "--session-id", "devin-cli1", "--kind", "resume")
    assert (result.code, result.out.strip()) == (0, "devin-cli1")
    assert sim.admin.session("devin-cli1")["entry"]["spec"]["kind"] == "resume"
    result = cli("set-status", "devin-cli1", "running", "--json")
    assert result.code == 0
    assert json.loads(result.out)["status"]["session_status"] == "running"
    result = cli("claims", "--json")
    assert (result.code, json.loads(result.out)) == (0, [])
    result = cli("tombstone", "devin-cli1")
    assert (result.code, result.out.strip()) == (0, "devin-cli1")
    assert sim.admin.session("devin-cli1")["deleted"] is True


def test_enqueue_with_a_network_policy(sim: SimHandle, cli, outpost: Outpost) -> None:
    policy = {"enabled": True, "allow": [{"ipv4": "127.0.0.1/32"}, {"hostname": "*.example.com"}]}
    result = cli("enqueue", "--outpost", outpost.outpost_id, "--network-policy", json.dumps(policy))
    assert result.code == 0
    stored = sim.admin.session(result.out.strip())["entry"]["spec"]["network_policy"]
    assert stored["enabled"] is True
    assert [{k: v for k, v in rule.items() if v is not None} for rule in stored["allow"]] == policy["allow"]
    result = cli("enqueue", "--outpost", outpost.outpost_id, "--network-policy", "{not json")
    assert result.code == 2
    assert "--network-policy is not JSON" in result.err
    result = cli("enqueue", "--outpost", outpost.outpost_id, "--network-policy", '{"enabled": "maybe"}')
    assert result.code != 0
    assert "network_policy" in result.err


def test_org_create_and_list(sim: SimHandle, cli) -> None:
    result = cli("org", "create", "--account", "acct-orgs")
    org = result.out.strip()
    assert result.code == 0
    assert org.startswith("org-")
    result = cli("org", "list", "--account", "acct-orgs", "--json")
    assert org in {o["org_id"] for o in json.loads(result.out)}


def test_org_create_with_a_name(sim: SimHandle, cli) -> None:
    result = cli("org", "create", "--account", "acct-named", "--name", "Research team", "--json")
    assert result.code == 0
    created = json.loads(result.out)
    assert (created["account_id"], created["name"]) == ("acct-named", "Research team")
    unnamed = cli("org", "create", "--account", "acct-named").out.strip()
    default = sim.admin.default_org(account="acct-named")
    result = cli("org", "list", "--account", "acct-named")
    assert result.out.splitlines() == [
        f"{default}\tacct-named\tDefault organization\tdefault",
        f"{created['org_id']}\tacct-named\tResearch team",
        f"{unnamed}\tacct-named\tOrganization 3",
    ]
    result = cli("org", "create", "--name", " ")
    assert result.code == 2
    assert result.err.strip() == (
        "devin-outposts-sim: error: Could not create an organization in account acct-default: "
        "422 name must be a non-empty string or null"
    )


def test_failures_print_one_line_and_exit_non_zero(
    sim: SimHandle, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = cli("enqueue", "--outpost", "outpost_env-missing")
    assert result.code == 4
    assert result.out == ""
    assert result.err.count("\n") == 1
    assert "404 Outpost not found" in result.err
    result = cli("tombstone", "devin-missing")
    assert result.code == 4
    monkeypatch.setenv("DEVIN_SIM_ADMIN_TOKEN", "wrong")
    result = cli("token", "create", "--scope", "machine")
    assert result.code == 3
    assert "Invalid admin token" in result.err
    assert "Bearer" not in result.err
    monkeypatch.setenv("DEVIN_SIM_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("DEVIN_SIM_ADMIN_TOKEN", sim.admin_token)
    result = cli("token", "create", "--scope", "machine")
    assert result.code == 1
    assert "unreachable" in result.err
    assert sim.admin_token not in result.err


def test_admin_token_is_never_taken_from_argv_alone(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEVIN_SIM_ADMIN_TOKEN")
    result = cli("token", "create", "--scope", "machine")
    assert result.code == 2
    assert "DEVIN_SIM_ADMIN_TOKEN" in result.err
    with pytest.raises(SystemExit):
        main(["token", "create", "--scope", "machine", "--admin-token", "x"])


def test_admin_token_file(sim: SimHandle, cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DEVIN_SIM_ADMIN_TOKEN")
    token_file = tmp_path / "admin-token"
    token_file.write_text(sim.admin_token + "\n")
    result = cli("token", "create", "--scope", "machine", "--admin-token-file", str(token_file))
    assert result.code == 0
    assert result.out.startswith("cog_")
    monkeypatch.setenv("DEVIN_SIM_ADMIN_TOKEN_FILE", str(token_file))
    assert cli("org", "create")[0] == 0
    result = cli("org", "create", "--admin-token-file", str(tmp_path / "missing"))
    assert result.code == 2
    assert "admin token file" in result.err


def test_serve_rejects_bad_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("DEVIN_SIM_ADMIN_TOKEN", "x")
    code = main(["serve", "--db", str(tmp_path / "db"), "--claim-ttl", "0"])
    assert code == 2
    assert "claim_ttl" in capsys.readouterr().err
    code = main(["serve", "--db", str(tmp_path / "db"), "--status-lag", "-1"])
    assert code == 2
    assert "status_lag" in capsys.readouterr().err


def test_the_module_entry_point_runs_the_cli(sim: SimHandle, outpost: Outpost) -> None:
    env = {"DEVIN_SIM_URL": sim.url, "DEVIN_SIM_ADMIN_TOKEN": sim.admin_token, "PATH": ""}
    argv = [sys.executable, "-m", "devin_outposts_sim", "enqueue", "--outpost", outpost.outpost_id]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith("devin-")
