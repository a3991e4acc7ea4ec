# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""Run each integration target's playbook against a live fleet simulator.

For every ``tests/integration/targets/<target>``: start a simulator on a free port, issue tokens, set up
what the target needs (outposts, 250 queued sessions, claims, organizations), run ``ansible-playbook``
with the collection on ``ANSIBLE_COLLECTIONS_PATH`` (a temporary ``ansible_collections/devin/outposts``
symlink to this checkout), then assert on the exit code, the play recap and the simulator's state.

Secrets reach the playbook as an extra-vars file (mode 0600), never on the command line, and the test
fails if a token shows up in the playbook's output.

Run: ``.venv/bin/pytest tests/integration/test_targets.py`` (``-k session_info`` for one target).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from prerequisites import import_or_cannot_run, tool

httpx, sim_testing = import_or_cannot_run("httpx", "devin_outposts_sim.testing", why="the simulator is not installed")

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "tests" / "integration" / "targets"
RECAP = re.compile(
    r"^localhost\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)",
    re.MULTILINE,
)
PLAYBOOK_TIMEOUT = 600


class Context:
    """What a target's setup and check see: the simulator, its tokens and the playbook's variables."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.orchestrator_token = sim.create_token("orchestrator")
        self.machine_token = sim.create_token("machine")
        self.vars: dict[str, Any] = {
            "devin_api_url": sim.url,
            "devin_orchestrator_token": self.orchestrator_token,
            "devin_machine_token": self.machine_token,
        }
        self.env: dict[str, str] = {}
        auth = {"Authorization": f"Bearer {self.orchestrator_token}"}
        self.http = httpx.Client(base_url=sim.url, headers=auth)

    def outposts(self) -> dict[str, dict[str, Any]]:
        """The account's outposts by name, read through the fleet API (first page: tests keep it short)."""
        response = self.http.get("/opbeta/outposts/outposts", params={"first": 100})
        response.raise_for_status()
        body = response.json()
        assert not body["has_next_page"]
        return {item["spec"]["name"]: item for item in body["items"]}

    def claim(self, session_id: str, acceptor_id: str) -> None:
        path = f"/opbeta/outposts/devins/{session_id}/claim"
        response = self.http.post(path, json={"acceptor_id": acceptor_id})
        response.raise_for_status()

    def close(self) -> None:
        self.http.close()


# --- per-target setup and checks ---------------------------------------------------------------------


def setup_outpost(ctx: Context) -> None:
    pass


def check_outpost(ctx: Context, output: str) -> None:
    outposts = ctx.outposts()
    assert sorted(outposts) == ["keep-me"], outposts
    assert outposts["keep-me"]["spec"]["platform"] == "windows"
    assert "[WARNING]: Recreating outpost gpu-h200" in output


def setup_outpost_info(ctx: Context) -> None:
    rhel = ctx.sim.admin.create_outpost("rhel", "linux", "RHEL 9 VMs")
    mac = ctx.sim.admin.create_outpost("mac-minis", "macos")
    ctx.vars["outpost_info_rhel_id"] = rhel.outpost_id
    ctx.vars["outpost_info_mac_id"] = mac.outpost_id
    # An outpost of another account must never be visible.
    ctx.sim.admin.create_outpost("rhel-elsewhere", "linux", account="acct-other")


def check_outpost_info(ctx: Context, output: str) -> None:
    assert sorted(ctx.outposts()) == ["mac-minis", "rhel"]


SESSIONS_ON_A = 250
CLAIMED_ON_A = 3
SESSIONS_ON_B = 5


def setup_session_info(ctx: Context) -> None:
    a = ctx.sim.admin.create_outpost("queue-a", "linux")
    b = ctx.sim.admin.create_outpost("queue-b", "windows")
    on_a = [ctx.sim.admin.enqueue(a.outpost_id).session_id for dummy in range(SESSIONS_ON_A)]
    for index in range(SESSIONS_ON_B):
        ctx.sim.admin.enqueue(b.outpost_id, platform="windows", session_id=f"devin-b{index:03d}")
    for session_id in on_a[:CLAIMED_ON_A]:
        ctx.claim(session_id, "orch-1")
    ctx.vars.update(
        session_info_a_id=a.outpost_id,
        session_info_b_id=b.outpost_id,
        session_info_claimed=on_a[:CLAIMED_ON_A],
        session_info_total_a=SESSIONS_ON_A,
        session_info_claimed_a=CLAIMED_ON_A,
        session_info_total_b=SESSIONS_ON_B,
    )


def check_session_info(ctx: Context, output: str) -> None:
    # An info module changes nothing: the claims are still held by orch-1 and nothing was added.
    rows = ctx.sim.admin.sessions(outpost_id=ctx.vars["session_info_a_id"])
    assert len(rows) == SESSIONS_ON_A
    claims = ctx.sim.admin.claims(acceptor_id="orch-1")
    assert len(claims) == CLAIMED_ON_A


def setup_default_platform(ctx: Context) -> None:
    ctx.vars["default_platform_org_id"] = ctx.sim.admin.default_org()
    target = ctx.sim.admin.create_outpost("default-target", "linux")
    ctx.vars["default_platform_outpost_id"] = target.outpost_id


def check_default_platform(ctx: Context, output: str) -> None:
    org_id = ctx.vars["default_platform_org_id"]
    response = ctx.http.get(f"/v3beta1/organizations/{org_id}/default-platform")
    response.raise_for_status()
    assert response.json() == {
        "platform": None,
        "outpost_pool_id": ctx.vars["default_platform_outpost_id"],
        "outpost_pool_name": "default-target",
    }


def setup_default_platform_info(ctx: Context) -> None:
    ctx.vars["default_platform_info_org_id"] = ctx.sim.admin.default_org()
    target = ctx.sim.admin.create_outpost("info-target", "macos")
    ctx.vars["default_platform_info_outpost_id"] = target.outpost_id


def check_default_platform_info(ctx: Context, output: str) -> None:
    pass


ORGANIZATION_FILLERS = 105


def setup_organization_info(ctx: Context) -> None:
    admin = ctx.sim.admin
    research = [admin.create_org(name="Research")]
    admin.create_org(name="Platform")
    # Enough organizations for a second page of the module's 100 (the default organization is the first).
    for index in range(ORGANIZATION_FILLERS):
        admin.create_org(name=f"Team {index:03d}")
    research.append(admin.create_org(name="Research"))  # on the second page
    admin.create_org()  # unnamed: the simulator names it
    # Organizations of another account must never be listed.
    admin.create_org(account="acct-other", name="Research")
    admin.create_org(account="acct-other", name="Elsewhere")
    ctx.vars["organization_info_expected"] = [
        {"org_id": org["org_id"], "name": org["name"]} for org in admin.orgs(account="acct-default")
    ]
    ctx.vars["organization_info_research_ids"] = research


def check_organization_info(ctx: Context, output: str) -> None:
    listed = ctx.sim.admin.orgs(account="acct-default")
    assert len(listed) == ORGANIZATION_FILLERS + 5
    assert [org["name"] for org in listed][:3] == ["Default organization", "Research", "Platform"]
    assert listed[-1]["name"] == f"Organization {ORGANIZATION_FILLERS + 5}"
    # An info module changes nothing.
    expected = [{"org_id": org["org_id"], "name": org["name"]} for org in listed]
    assert ctx.vars["organization_info_expected"] == expected


LOOKUP_FILLERS = 120


def setup_lookup_outpost_id(ctx: Context) -> None:
    # Created first, so that the outposts the target looks up are on the second page of the list.
    for index in range(LOOKUP_FILLERS):
        ctx.sim.admin.create_outpost(f"filler-{index:03d}", "linux")
    ids = {name: ctx.sim.admin.create_outpost(name, "linux").outpost_id for name in ("gpu-h200", "rhel")}
    ctx.vars["lookup_outpost_id_ids"] = ids
    # The lookup reads its connection options from the environment when they are not given.
    ctx.env["DEVIN_API_URL"] = ctx.sim.url + "/"
    ctx.env["DEVIN_OUTPOSTS_TOKEN"] = ctx.machine_token


def check_lookup_outpost_id(ctx: Context, output: str) -> None:
    response = ctx.http.get("/opbeta/outposts/outposts", params={"first": 100})
    response.raise_for_status()
    assert response.json()["total"] == LOOKUP_FILLERS + 2
    assert "[WARNING]: No outpost named missing-on-purpose exists" in output


SETUPS: dict[str, tuple[Callable[[Context], None], Callable[[Context, str], None]]] = {
    "outpost": (setup_outpost, check_outpost),
    "outpost_info": (setup_outpost_info, check_outpost_info),
    "session_info": (setup_session_info, check_session_info),
    "default_platform": (setup_default_platform, check_default_platform),
    "default_platform_info": (setup_default_platform_info, check_default_platform_info),
    "lookup_outpost_id": (setup_lookup_outpost_id, check_lookup_outpost_id),
    "organization_info": (setup_organization_info, check_organization_info),
}


def test_every_target_has_a_setup() -> None:
    on_disk = sorted(p.name for p in TARGETS.iterdir() if (p / "tasks" / "main.yml").is_file())
    assert on_disk == sorted(SETUPS)


# --- running a target ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def collections_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("collections")
    (base / "ansible_collections" / "devin").mkdir(parents=True)
    (base / "ansible_collections" / "devin" / "outposts").symlink_to(ROOT, target_is_directory=True)
    return base


def parse_recap(output: str) -> Optional[dict[str, int]]:
    match = RECAP.search(output)
    return {key: int(value) for key, value in match.groupdict().items()} if match else None


def run_target(target: str, ctx: Context, collections_path: Path, workdir: Path) -> tuple[int, str]:
    vars_file = workdir / "vars.json"
    vars_file.write_text(json.dumps(ctx.vars))
    vars_file.chmod(0o600)
    inventory = workdir / "inventory.ini"
    inventory.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    playbook = workdir / "site.yml"
    playbook.write_text(
        f"- name: Run the {target} integration target\n"
        "  hosts: localhost\n"
        "  gather_facts: false\n"
        "  roles:\n"
        f"    - role: {TARGETS / target}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DEVIN_"))}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(collections_path),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_LOCAL_TEMP=str(workdir / "tmp"),
        ANSIBLE_HOME=str(workdir / "ansible-home"),
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_DEPRECATION_WARNINGS="0",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    env.update(ctx.env)
    argv = [tool("ansible-playbook"), "-i", str(inventory), str(playbook), "-e", f"@{vars_file}"]
    proc = subprocess.run(  # noqa: S603
        argv, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=PLAYBOOK_TIMEOUT, check=False,
    )
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


@pytest.mark.parametrize("target", sorted(SETUPS))
def test_target(target: str, collections_path: Path, tmp_path: Path) -> None:
    setup, check = SETUPS[target]
    with sim_testing.run_sim() as sim:
        ctx = Context(sim)
        try:
            setup(ctx)
            rc, output = run_target(target, ctx, collections_path, tmp_path)
            print(output)  # shown by pytest on failure, or always with -s
            assert rc == 0, output
            recap = parse_recap(output)
            assert recap is not None, output
            assert (recap["failed"], recap["unreachable"]) == (0, 0), output
            assert recap["ok"] >= 3, output
            for secret in (ctx.orchestrator_token, ctx.machine_token):
                assert secret not in output, "a token leaked into the playbook output"
            check(ctx, output)
        finally:
            ctx.close()
