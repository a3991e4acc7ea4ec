"""A wrong token fails the worker role's preflight with the server's message, on the oldest and the newest
ansible-core, and never shows the token.

The issue: "a wrong token fails preflight with the server's message on 2.16 and on the newest core (no
censored result), and no token appears in the output". The role reads the outposts on the controller
(``devin.outposts.outpost_info`` delegated to localhost, ``roles/worker/tasks/preflight.yml``) before it
installs anything. For ansible-core 2.16 and the newest core of ``CORE_VERSIONS`` (``scripts/lib.sh``), this
runs the role with ``ansible-playbook`` from that core's venv (``core_venv`` of ``scripts/lib.sh``, cached
under ``.cache/core-matrix/<core>/venv`` and shared with ``scripts/core-matrix.sh``) on this machine
(``localhost``, ``connection: local``) against the simulator of the ``sim`` fixture, with a token the
simulator never issued. It checks that the play fails at that task with ``401 Invalid token``, that nothing is
censored, that the token is nowhere in the output (at ``-vvv``), and that nothing was changed. A control run
with a valid token passes the same preflight, so the failure is the token's.

Safety: the run is not in check mode (the outpost check runs either way), but the role's install, configure
and service phases cannot run, even if the preflight let a wrong token through: the play runs only the tasks
tagged ``devin_outposts_worker_preflight`` (each phase of the role is tagged), and every path the role would
write to is under ``tmp_path``. A test-only module (``library/pretend_os.py``) reports Debian with systemd, so
the OS check passes on a machine without systemd (such as a container), as in ``test_preflight.py``.

The venvs need Python 3.11 and 3.12 (``core_python_version``; pyenv's are found) and PyPI the first time. When
a venv cannot be made this test is skipped on a developer's machine and fails in CI (``CI=true``).

Run: ``.venv/bin/python -m pytest tests/roles/test_preflight_cores.py``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest
import yaml

from core_venvs import IN_CI, NEWEST, OLDEST, VENV_TIMEOUT, core_venv

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
OUTPOST = "preflight-cores"
FAILING_TASK = "Read the outposts on the controller"
#: The role's no_log tasks before the outpost check: their results are the only censored ones (the second is
#: skipped here: no devin_outposts_worker_create_outpost).
RESOLVE_TASK = "Resolve the token (devin_outposts_worker_token, else the controller's DEVIN_OUTPOSTS_TOKEN)"
NO_LOG_TASKS = {RESOLVE_TASK, "Find the instances that would get the token that creates the outposts"}
RECAP = re.compile(
    r"^localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE
)


@pytest.fixture(scope="module")
def collections_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ansible_collections/devin/outposts`` -> this checkout: the collection under test is this worktree."""
    base = tmp_path_factory.mktemp("collections")
    (base / "ansible_collections" / "devin").mkdir(parents=True)
    (base / "ansible_collections" / "devin" / "outposts").symlink_to(ROOT, target_is_directory=True)
    return base


def run_role(venv: Path, token: str, sim: SimHandle, collections: Path, work: Path) -> tuple[int, str]:
    """The worker role's preflight on this machine with ``token``; returns the exit code and the output."""
    host = work / "host"
    python = str(venv / "bin" / "python")
    user = "dotest-preflight-cores"
    role_vars = {
        "devin_outposts_worker_api_url": sim.url,
        "devin_outposts_worker_instances": [{"name": "main", "outpost": OUTPOST}],
        "devin_outposts_worker_python": python,
        "devin_outposts_worker_user": user,
        "devin_outposts_worker_group": user,
        "devin_outposts_worker_install_dir": str(host / "opt"),
        "devin_outposts_worker_config_dir": str(host / "etc"),
        "devin_outposts_worker_data_dir": str(host / "var"),
        "devin_outposts_worker_workdir_root": str(host / "srv"),
        "devin_outposts_worker_controller_cache_dir": str(host / "controller-cache"),
    }
    play = [{
        "name": "The worker role with a token", "hosts": "localhost", "connection": "local",
        "gather_facts": False, "vars": role_vars,
        "pre_tasks": [{"name": "Pretend", "pretend_os": {"facts": SYSTEMD_DEBIAN}, "tags": ["always"]}],
        "roles": [{"role": "devin.outposts.worker"}],
    }]  # fmt: skip
    (work / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    # The token reaches the play through a 0600 vars file, never argv (it must not show in a process list).
    secrets_file = work / "token.json"
    secrets_file.write_text(json.dumps({"devin_outposts_worker_token": token}))
    secrets_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "DEVIN_", "VIRTUAL_ENV"))}
    env.update(
        PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]),
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_LIBRARY=str(LIBRARY),
        ANSIBLE_HOME=str(work / "ansible-home"),
        ANSIBLE_LOCAL_TEMP=str(work / "ansible-tmp"),
        ANSIBLE_REMOTE_TEMP=str(work / "ansible-remote-tmp"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    command = [
        str(venv / "bin" / "ansible-playbook"), "-i", "localhost,", "-vvv",
        "--tags", "devin_outposts_worker_preflight",
        "-e", f"ansible_python_interpreter={python}", "-e", f"@{secrets_file}", str(work / "play.yml"),
    ]  # fmt: skip
    done = subprocess.run(
        command, env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=PLAYBOOK_TIMEOUT, check=False,
    )  # fmt: skip
    # Nothing of the role on this machine: none of its directories, no service user or group.
    assert not host.exists(), sorted(str(p) for p in host.rglob("*"))
    assert subprocess.run(["getent", "passwd", user], capture_output=True, check=False).returncode == 2
    assert subprocess.run(["getent", "group", user], capture_output=True, check=False).returncode == 2
    return done.returncode, done.stdout


def recap(output: str) -> tuple[int, int, int, int]:
    match = RECAP.search(output)
    assert match, output[-3000:]
    ok, changed, unreachable, failed = (int(value) for value in match.groups())
    return ok, changed, unreachable, failed


@pytest.mark.timeout(VENV_TIMEOUT + 2 * PLAYBOOK_TIMEOUT)
@pytest.mark.parametrize("core", [OLDEST, NEWEST], ids=[f"core-{OLDEST}", f"core-{NEWEST}"])
def test_a_wrong_token_fails_preflight_with_the_servers_message(
    core: str, sim: SimHandle, collections_path: Path, tmp_path: Path
) -> None:
    venv = core_venv(core)
    version = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import ansible; print(ansible.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert version.startswith(core + "."), version
    sim.admin.create_outpost(OUTPOST, "linux")
    good = sim.create_token("machine")
    wrong = "cog_" + secrets.token_hex(24)  # a well-formed token the simulator never issued
    assert sim.store.accounts.authenticate(wrong) is None

    (tmp_path / "wrong").mkdir()
    rc, out = run_role(venv, wrong, sim, collections_path, tmp_path / "wrong")
    print(out)  # shown by pytest on failure
    assert rc == 2, out[-3000:]
    assert f"ansible-playbook [core {version}]" in out, out[:500]
    # It failed at the outpost check, with the simulator's 401 and its detail, before any change.
    assert f"TASK [devin.outposts.worker : {FAILING_TASK}]" in out, out[-3000:]
    assert "Could not list outposts: 401 Invalid token" in out, out[-3000:]
    assert '"http_status": 401' in out, out[-3000:]
    assert recap(out)[1:] == (0, 0, 1), out[-3000:]  # changed, unreachable, failed
    assert "Refuse an outpost that is missing or not for Linux" not in out  # it stopped at the failing task
    # Nothing censored but the no_log task that resolves the token, and the token nowhere (not even at -vvv,
    # which prints the module's arguments).
    censored = {task.split("]", 1)[0] for task in out.split("TASK [")[1:] if "censored" in task.lower()}
    assert f"devin.outposts.worker : {RESOLVE_TASK}" in censored, out[-3000:]
    assert censored <= {f"devin.outposts.worker : {task}" for task in NO_LOG_TASKS}, censored
    assert wrong not in out
    assert wrong[len("cog_"):] not in out
    assert good not in out
    # The simulator was only read: no outpost created, no session claimed.
    assert [o.spec.name for o in sim.store.accounts.list_outposts("acct-default", 100).items] == [OUTPOST]
    assert sim.admin.claims() == []

    # The control: the same play with a valid token passes the whole preflight (and changes nothing).
    (tmp_path / "good").mkdir()
    rc, out = run_role(venv, good, sim, collections_path, tmp_path / "good")
    assert rc == 0, out[-3000:]
    assert "Could not list outposts" not in out
    assert recap(out)[1:] == (0, 0, 0), out[-3000:]  # changed, unreachable, failed
    assert good not in out
