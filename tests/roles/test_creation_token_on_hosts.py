"""The worker role refuses to write onto a host the token it creates outposts with (the orchestrator scope).

The issue: the README's first deployment put the orchestrator-scope token on the worker hosts; "the role should
refuse, or at least warn loudly, when it is about to write a token it used for creating outposts onto a worker
host". With ``devin_outposts_worker_create_outpost`` the role creates the outposts on the controller with
``devin_outposts_worker_controller_token``, else ``devin_outposts_worker_token`` (else the controller's
``DEVIN_OUTPOSTS_TOKEN``), and each instance's environment file gets the instance's ``token``, else that same
``devin_outposts_worker_token``. When the two are the same token, preflight now fails, before the outposts are
created and before anything is installed, unless ``devin_outposts_worker_allow_orchestrator_token`` is set.

Each case runs the role with ``ansible-playbook`` on this machine (``connection: local``) against the simulator
of the ``sim`` fixture, not in check mode (the outpost creation is what must not happen), and observes the
simulator (was the outpost created?) and the output (the refusal, and never the token). Safety: only the tasks
tagged ``devin_outposts_worker_preflight`` run (each phase of the role is tagged), so the install, configure and
service phases cannot run even if the refusal let the token through, and every path the role would write to is
under ``tmp_path``. A test-only module (``library/pretend_os.py``) reports Debian with systemd. The Molecule
scenario ``absent`` makes the same refusal on a real host and finds no environment file written there.

Run: ``.venv/bin/python -m pytest tests/roles/test_creation_token_on_hosts.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from core_venvs import IN_CI, NEWEST, OLDEST, core_venv

try:
    from devin_outposts_sim.testing import SimHandle
except ImportError as exc:
    if IN_CI:
        raise
    pytest.skip(f"the simulator is not installed: {exc}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = Path(__file__).resolve().parent / "library"
PLAYBOOK_TIMEOUT = 300
SYSTEMD_DEBIAN = {
    "system": "Linux", "os_family": "Debian", "distribution": "Debian", "distribution_version": "12.8",
    "distribution_major_version": "12", "service_mgr": "systemd", "architecture": "x86_64",
}  # fmt: skip
REFUSAL = "would get the token that devin_outposts_worker_create_outpost creates the outposts with"
OPT_OUT_NOTE = "devin_outposts_worker_allow_orchestrator_token is true"


def run_role(
    sim: SimHandle, work: Path, role_vars: dict[str, Any], secret_vars: dict[str, Any], env_token: Optional[str],
    core: str = "dev",
) -> tuple[int, str]:
    """The worker role's preflight on this machine; ``secret_vars`` reach it through a 0600 vars file (never
    argv), ``env_token`` as the controller's DEVIN_OUTPOSTS_TOKEN; ``core``: ``dev`` (this venv's ansible-core)
    or a core of core_venvs.py. Returns the exit code and the output."""
    playbook = Path(sys.executable).with_name("ansible-playbook") if core == "dev" else core_venv(core) / "bin" / "ansible-playbook"
    python = str(playbook.with_name("python"))
    host = work / "host"
    user = "dotest-creation-token"
    all_vars = {
        "devin_outposts_worker_api_url": sim.url,
        "devin_outposts_worker_create_outpost": True,
        "devin_outposts_worker_python": sys.executable,
        "devin_outposts_worker_user": user,
        "devin_outposts_worker_group": user,
        "devin_outposts_worker_install_dir": str(host / "opt"),
        "devin_outposts_worker_config_dir": str(host / "etc"),
        "devin_outposts_worker_data_dir": str(host / "var"),
        "devin_outposts_worker_workdir_root": str(host / "srv"),
        "devin_outposts_worker_controller_cache_dir": str(host / "controller-cache"),
        **role_vars,
    }
    play = [{
        "name": "The worker role creating its outposts", "hosts": "localhost", "connection": "local",
        "gather_facts": False, "vars": all_vars,
        "pre_tasks": [{"name": "Pretend", "pretend_os": {"facts": SYSTEMD_DEBIAN}, "tags": ["always"]}],
        "roles": [{"role": "devin.outposts.worker"}],
    }]  # fmt: skip
    (work / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    secrets_file = work / "secrets.json"
    secrets_file.write_text(json.dumps(secret_vars))
    secrets_file.chmod(0o600)
    collections = work / "collections"
    (collections / "ansible_collections" / "devin").mkdir(parents=True)
    (collections / "ansible_collections" / "devin" / "outposts").symlink_to(ROOT, target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DEVIN_"))}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_LIBRARY=str(LIBRARY),
        ANSIBLE_HOME=str(work / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(work / "ansible-tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    if env_token is not None:
        env["DEVIN_OUTPOSTS_TOKEN"] = env_token
    command = [
        str(playbook), "-i", "localhost,", "-v", "--tags", "devin_outposts_worker_preflight",
        "-e", f"ansible_python_interpreter={python}", "-e", f"@{secrets_file}", str(work / "play.yml"),
    ]  # fmt: skip
    done = subprocess.run(
        command, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=PLAYBOOK_TIMEOUT, check=False,
    )  # fmt: skip
    # Nothing of the role on this machine: none of its directories (no environment file), no service user.
    assert not host.exists(), sorted(str(p) for p in host.rglob("*"))
    assert subprocess.run(["getent", "passwd", user], capture_output=True, check=False).returncode == 2
    return done.returncode, done.stdout


def outposts(sim: SimHandle) -> list[str]:
    return sorted(o.spec.name for o in sim.store.accounts.list_outposts("acct-default", 100).items)


def instances(*names: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"name": name, "outpost": f"pool-{name}", **extra} for name in names]


@pytest.mark.timeout(600 + 2 * PLAYBOOK_TIMEOUT)
@pytest.mark.parametrize(
    ("given", "core"),
    [("environment", "dev"), ("variable", "dev"), ("environment", OLDEST), ("environment", NEWEST)],
    ids=["environment", "variable", f"environment-core-{OLDEST}", f"environment-core-{NEWEST}"],
)
def test_the_one_token_is_refused_on_the_hosts(sim: SimHandle, tmp_path: Path, given: str, core: str) -> None:
    """One token, orchestrator scope, from the controller's DEVIN_OUTPOSTS_TOKEN or devin_outposts_worker_token:
    it would create the outposts and be written to every instance's environment file. Also on the oldest and the
    newest supported ansible-core (the comparison is a Jinja loop)."""
    orchestrator = sim.create_token("orchestrator")
    secret_vars = {"devin_outposts_worker_token": orchestrator} if given == "variable" else {}
    env_token = orchestrator if given == "environment" else None
    rc, out = run_role(sim, tmp_path, {"devin_outposts_worker_instances": instances("main", "b")}, secret_vars,
                       env_token, core)  # fmt: skip
    assert rc == 2, out[-3000:]
    assert f"instances main, b {REFUSAL}" in out, out[-3000:]
    assert "TASK [devin.outposts.worker : Create the outposts that do not exist yet" not in out, out[-3000:]
    assert orchestrator not in out
    assert outposts(sim) == []  # refused before the creation


@pytest.mark.timeout(2 * PLAYBOOK_TIMEOUT)
def test_an_instance_token_equal_to_the_creation_token_is_refused(sim: SimHandle, tmp_path: Path) -> None:
    """The creation has its own token, the hosts a machine token, but one instance's own token is the creation
    token: that instance alone is named."""
    orchestrator, machine = sim.create_token("orchestrator"), sim.create_token("machine")
    secret_vars = {
        "devin_outposts_worker_controller_token": orchestrator,
        "devin_outposts_worker_token": machine,
        "devin_outposts_worker_instances": [*instances("main"), *instances("b", token=orchestrator)],
    }
    rc, out = run_role(sim, tmp_path, {}, secret_vars, None)
    assert rc == 2, out[-3000:]
    assert f"instances b {REFUSAL}" in out, out[-3000:]
    assert orchestrator not in out and machine not in out
    assert outposts(sim) == []


@pytest.mark.timeout(2 * PLAYBOOK_TIMEOUT)
def test_a_machine_token_on_the_hosts_and_the_orchestrator_token_for_the_creation(
    sim: SimHandle, tmp_path: Path
) -> None:
    """The control: the hosts get a machine token, the creation uses the controller token; preflight passes and
    creates the outposts."""
    orchestrator, machine = sim.create_token("orchestrator"), sim.create_token("machine")
    secret_vars = {"devin_outposts_worker_controller_token": orchestrator, "devin_outposts_worker_token": machine}
    rc, out = run_role(sim, tmp_path, {"devin_outposts_worker_instances": instances("main", "b")}, secret_vars,
                       None)  # fmt: skip
    assert rc == 0, out[-3000:]
    assert REFUSAL not in out and OPT_OUT_NOTE not in out
    assert orchestrator not in out and machine not in out
    assert outposts(sim) == ["pool-b", "pool-main"]


@pytest.mark.timeout(2 * PLAYBOOK_TIMEOUT)
def test_the_opt_out_writes_it_anyway_and_says_so(sim: SimHandle, tmp_path: Path) -> None:
    orchestrator = sim.create_token("orchestrator")
    rc, out = run_role(sim, tmp_path, {"devin_outposts_worker_instances": instances("main"),
                                       "devin_outposts_worker_allow_orchestrator_token": True}, {}, orchestrator)  # fmt: skip
    assert rc == 0, out[-3000:]
    assert REFUSAL not in out
    assert OPT_OUT_NOTE in out, out[-3000:]
    assert orchestrator not in out
    assert outposts(sim) == ["pool-main"]
