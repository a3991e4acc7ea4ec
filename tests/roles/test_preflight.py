"""The roles refuse an operating system they do not support with one clear line, before they change anything.

Each case runs the role for real with ``ansible-playbook`` on this machine (``connection: local``, check mode
so nothing could be changed even by mistake). A test-only module (``library/pretend_os.py``) sets the facts the
preflight reads, so the role sees another operating system; the role's own fact gathering is skipped because
those facts are present, exactly as after a play's ``gather_facts``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = Path(__file__).resolve().parent / "library"

DEBIAN_WITHOUT_SYSTEMD = {
    "system": "Linux", "os_family": "Debian", "distribution": "Debian", "distribution_version": "12.8",
    "distribution_major_version": "12", "service_mgr": "sysvinit", "architecture": "x86_64",
}  # fmt: skip
ALPINE = {**DEBIAN_WITHOUT_SYSTEMD, "os_family": "Alpine", "distribution": "Alpine", "service_mgr": "openrc",
          "distribution_version": "3.20", "distribution_major_version": "3"}  # fmt: skip
MACOS = {**DEBIAN_WITHOUT_SYSTEMD, "system": "Darwin", "os_family": "Darwin", "distribution": "MacOSX",
         "service_mgr": "launchd", "architecture": "arm64"}  # fmt: skip


def run_role(
    tmp_path: Path, role: str, facts: Optional[dict], role_vars: dict, *, interpreter: str = sys.executable,
    check: bool = True, environ: Optional[dict] = None,
) -> subprocess.CompletedProcess:
    """Run ``role`` on this machine; ``facts`` (unless None) are what the preflight sees."""
    pretend = [{"name": "Pretend", "pretend_os": {"facts": facts}}] if facts is not None else []
    play = [{
        "name": "Preflight on another OS", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": pretend + [
            {"name": "Run the role", "ansible.builtin.include_role": {"name": role}, "vars": role_vars},
        ],
    }]  # fmt: skip
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play))
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DEVIN_OUTPOSTS_TOKEN", "DEVIN_API_URL")},
        **(environ or {}),
        "ANSIBLE_LIBRARY": str(LIBRARY),
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".cache" / "collections"),
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "1",
    }
    command = [
        str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,",
        *(["--check"] if check else []),
        "-e", f"ansible_python_interpreter={interpreter}", str(playbook),
    ]  # fmt: skip
    return subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(autouse=True)
def _collection_link() -> None:
    if not (ROOT / ".cache/collections/ansible_collections/devin/outposts").exists():
        pytest.fail("run through scripts/test.sh (scripts/lib.sh links the checkout into .cache/collections)")


WORKER_VARS = {
    "devin_outposts_worker_check_outpost": False,
    "devin_outposts_worker_token": "not-used-the-role-stops-in-preflight",
    "devin_outposts_worker_instances": [{"name": "main", "outpost": "o"}],
}


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (DEBIAN_WITHOUT_SYSTEMD, "runs Debian 12.8 (Debian, sysvinit)"),
        (ALPINE, "runs Alpine 3.20 (Alpine, openrc)"),
        (MACOS, "runs MacOSX 12.8 (Darwin, launchd)"),
    ],
    ids=["debian-sysvinit", "alpine", "macos"],
)
def test_worker_role_refuses_an_unsupported_os(tmp_path: Path, facts: dict, expected: str) -> None:
    done = run_role(tmp_path, "devin.outposts.worker", facts, WORKER_VARS)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "devin.outposts.worker supports Linux hosts of the Debian and RedHat families run by systemd" in out
    assert expected in out, out
    assert "Refuse an unsupported operating system" in out
    assert "changed=0" in out, out


def test_cli_role_refuses_an_unsupported_os(tmp_path: Path) -> None:
    done = run_role(tmp_path, "devin.outposts.cli", MACOS, {"devin_outposts_cli_version": "1.2.3"})
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "devin.outposts.cli supports Linux hosts; localhost runs Darwin" in out, out
    assert "changed=0" in out, out


def test_a_supported_os_passes_that_check(tmp_path: Path) -> None:
    """The control case: on Debian with systemd the OS check passes (the run stops later, at the package check,
    because the requested version is not the bundled one)."""
    facts = {**DEBIAN_WITHOUT_SYSTEMD, "service_mgr": "systemd"}
    worker_vars = {**WORKER_VARS, "devin_outposts_worker_package_version": "0.0.0-not-bundled"}
    done = run_role(tmp_path, "devin.outposts.worker", facts, worker_vars)
    out = done.stdout + done.stderr
    assert "supports Linux hosts of the Debian and RedHat families" not in out, out
    assert "is not the bundled version" in out, out


SYSTEMD_DEBIAN = {**DEBIAN_WITHOUT_SYSTEMD, "service_mgr": "systemd"}
NOT_BUNDLED = {"devin_outposts_worker_package_version": "0.0.0-not-bundled"}
ORCHESTRATOR_VARS = {
    "devin_outposts_orchestrator_outpost": "o",
    "devin_outposts_orchestrator_token": "not-used-the-role-stops-in-preflight",
    "devin_outposts_orchestrator_package_version": "0.0.0-not-bundled",
}


def test_no_token_fails_with_one_line(tmp_path: Path) -> None:
    """No devin_outposts_worker_token, no DEVIN_OUTPOSTS_TOKEN on the controller, no instance token."""
    role_vars = {**WORKER_VARS, "devin_outposts_worker_token": "", **NOT_BUNDLED}
    role_vars.pop("devin_outposts_worker_token")
    done = run_role(tmp_path, "devin.outposts.worker", SYSTEMD_DEBIAN, role_vars)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert '"msg": "no token: set devin_outposts_worker_token or DEVIN_OUTPOSTS_TOKEN on the controller"' in out \
        or "msg: 'no token: set devin_outposts_worker_token or DEVIN_OUTPOSTS_TOKEN on the controller'" in out, out
    assert "is not the bundled version" not in out, out  # it stopped at the token check


@pytest.mark.parametrize("role", ["worker", "orchestrator"])
def test_the_token_defaults_to_the_controllers_environment(tmp_path: Path, role: str) -> None:
    """With DEVIN_OUTPOSTS_TOKEN on the controller the token check passes (the run stops later, at the package
    check), and the token is printed nowhere, not even with -vvv."""
    given = {"worker": {**WORKER_VARS, **NOT_BUNDLED}, "orchestrator": ORCHESTRATOR_VARS}[role]
    role_vars = {k: v for k, v in given.items() if k != f"devin_outposts_{role}_token"}
    secret = "env-token-5f0c9e1d2b7a"
    done = run_role(tmp_path, f"devin.outposts.{role}", SYSTEMD_DEBIAN, role_vars,
                    environ={"DEVIN_OUTPOSTS_TOKEN": secret, "ANSIBLE_VERBOSITY": "3"})
    out = done.stdout + done.stderr
    assert "no token" not in out, out
    assert "is not the bundled version" in out, out
    assert secret not in out


@pytest.mark.parametrize("arg", ["--token=abc", "--token", "--tok=abc", "--to"])
def test_extra_args_refuse_a_token(tmp_path: Path, arg: str) -> None:
    role_vars = {**WORKER_VARS, "devin_outposts_worker_instances": [{"name": "main", "outpost": "o",
                                                                     "extra_args": ["--log-level=debug", arg]}]}
    done = run_role(tmp_path, "devin.outposts.worker", SYSTEMD_DEBIAN, role_vars)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "would put the token on the command line" in out, out
    assert "changed=0" in out, out


def test_validate_certs_false_is_refused_for_the_workers(tmp_path: Path) -> None:
    role_vars = {**WORKER_VARS, "devin_outposts_worker_validate_certs": False}
    done = run_role(tmp_path, "devin.outposts.worker", SYSTEMD_DEBIAN, role_vars)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "the worker always verifies TLS" in out, out


PYENV = Path.home() / ".pyenv" / "versions"


def _pyenv(version: str) -> Path:
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if not found:
        pytest.skip(f"no Python {version} under {PYENV}")
    return found[-1]


def test_python_36_is_refused_before_anything_is_changed(tmp_path: Path) -> None:
    """A host whose Python is 3.6 (here: this machine, with ansible_python_interpreter and the worker's Python
    both a pyenv 3.6, which ansible-core 2.17+ cannot run modules with). Not check mode: the role would create
    its user, group and directories if the check did not stop it first."""
    python36 = _pyenv("3.6")
    root = tmp_path / "host"
    user = "dotest-py36"
    role_vars = {
        **WORKER_VARS,
        "devin_outposts_worker_python": str(python36),
        "devin_outposts_worker_user": user,
        "devin_outposts_worker_group": user,
        "devin_outposts_worker_install_dir": str(root / "opt"),
        "devin_outposts_worker_config_dir": str(root / "etc"),
        "devin_outposts_worker_data_dir": str(root / "var"),
        "devin_outposts_worker_workdir_root": str(root / "srv"),
    }
    try:
        done = run_role(tmp_path, "devin.outposts.worker", None, role_vars, interpreter=str(python36), check=False)
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        assert f"localhost: {python36} is Python 3.6." in out, out
        assert "the worker needs Python 3.9 or newer" in out, out
        assert "Refuse a host whose Python is older than 3.9" in out, out
        assert "changed=0" in out, out
        assert not root.exists(), sorted(str(p) for p in root.rglob("*"))
        assert subprocess.run(["getent", "passwd", user], capture_output=True, check=False).returncode == 2
        assert subprocess.run(["getent", "group", user], capture_output=True, check=False).returncode == 2
    finally:  # only if the check failed to stop the role
        subprocess.run(["userdel", user], capture_output=True, check=False)
        subprocess.run(["groupdel", user], capture_output=True, check=False)


def test_python_39_passes_the_python_check(tmp_path: Path) -> None:
    """The control case: the oldest Python the worker supports passes (the run stops later, at the package
    check, in check mode)."""
    python39 = _pyenv("3.9")
    role_vars = {**WORKER_VARS, "devin_outposts_worker_python": str(python39), **NOT_BUNDLED}
    done = run_role(tmp_path, "devin.outposts.worker", SYSTEMD_DEBIAN, role_vars)
    out = done.stdout + done.stderr
    assert "the worker needs Python 3.9 or newer" not in out, out
    assert "is not the bundled version" in out, out


def test_orchestrator_role_refuses_an_unsupported_os(tmp_path: Path) -> None:
    done = run_role(tmp_path, "devin.outposts.orchestrator", MACOS, ORCHESTRATOR_VARS)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "devin.outposts.orchestrator supports Linux hosts of the Debian and RedHat families run by systemd" in out
    assert "changed=0" in out, out


@pytest.mark.parametrize(
    ("role_vars", "expected"),
    [
        ({"devin_outposts_orchestrator_token": ""},
         "no token: set devin_outposts_orchestrator_token or DEVIN_OUTPOSTS_TOKEN on the controller"),
        ({"devin_outposts_orchestrator_validate_certs": False}, "the orchestrator always verifies TLS"),
        ({"devin_outposts_orchestrator_max_concurrent": 0}, "max_concurrent, boot_timeout"),
        ({"devin_outposts_orchestrator_env": {"DEVIN_OUTPOSTS_TOKEN": "x"}}, "env must not carry DEVIN_OUTPOSTS_TOKEN"),
        ({"devin_outposts_orchestrator_env": {"DEVIN_OUTPOSTS_TOKEN_FD": "3"}}, "env must not carry DEVIN_OUTPOSTS_TOKEN"),
        ({"devin_outposts_orchestrator_driver": "docker"}, "value of devin_outposts_orchestrator_driver must be one of"),
    ],
    ids=["no-token", "validate-certs-false", "max-concurrent-0", "token-in-env", "token-fd-in-env", "unknown-driver"],
)
def test_orchestrator_role_refuses_bad_inputs_first(tmp_path: Path, role_vars: dict, expected: str) -> None:
    done = run_role(tmp_path, "devin.outposts.orchestrator", SYSTEMD_DEBIAN, {**ORCHESTRATOR_VARS, **role_vars})
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert expected in out, out
    assert "is not the bundled version" not in out, out  # it stopped before the package check
    assert "changed=0" in out, out


# Issue 24, point 2: systemd hands the token file to the bundled worker and to the orchestrator as their standard
# input (StandardInput=file:, systemd 236 or newer), so an older systemd is refused before anything changes. The
# facts carry the version as ansible-core 2.17+ gathers it; without it the role asks systemctl (252 here).
OLD_SYSTEMD = {**SYSTEMD_DEBIAN, "systemd": {"version": 219, "features": ""}}
SYSTEMD_TOO_OLD = "runs systemd 219; the {} needs systemd 236 or newer, which opens its token file as its standard input"


def test_worker_role_refuses_a_systemd_too_old_for_the_token_file(tmp_path: Path) -> None:
    done = run_role(tmp_path, "devin.outposts.worker", OLD_SYSTEMD, {**WORKER_VARS, **NOT_BUNDLED})
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert SYSTEMD_TOO_OLD.format("bundled worker") in out, out
    assert "is not the bundled version" not in out, out  # it stopped before the package check
    assert "changed=0" in out, out


def test_the_official_cli_alone_does_not_need_the_token_file(tmp_path: Path) -> None:
    """The control: an instance of the official CLI keeps its token in its environment file, so an old systemd
    passes (the run stops later, at the package check)."""
    role_vars = {**WORKER_VARS, **NOT_BUNDLED, "devin_outposts_worker_instances": [
        {"name": "main", "outpost": "o", "implementation": "devin_cli"}]}  # fmt: skip
    done = run_role(tmp_path, "devin.outposts.worker", OLD_SYSTEMD, role_vars)
    out = done.stdout + done.stderr
    assert "needs systemd 236" not in out, out
    assert "is not the bundled version" in out, out


def test_a_systemd_read_from_systemctl_passes(tmp_path: Path) -> None:
    """Without the systemd fact (ansible-core 2.16 does not gather it) the role reads ``systemctl --version``:
    this machine's systemd (252 on our Debian 12 machines) passes."""
    done = run_role(tmp_path, "devin.outposts.worker", SYSTEMD_DEBIAN, {**WORKER_VARS, **NOT_BUNDLED})
    out = done.stdout + done.stderr
    assert "TASK [devin.outposts._common : Read the version of systemd]" in out, out
    assert "needs systemd 236" not in out, out
    assert "is not the bundled version" in out, out


@pytest.mark.parametrize("name", ["DEVIN_OUTPOSTS_TOKEN", "DEVIN_OUTPOSTS_TOKEN_FD", "DEVIN_OUTPOSTS_TOKEN_FILE"])
def test_worker_role_refuses_a_token_variable_in_a_bundled_instances_env(tmp_path: Path, name: str) -> None:
    """The worker refuses two token sources at start (exit 2, no restart): the role refuses first."""
    role_vars = {**WORKER_VARS, "devin_outposts_worker_instances": [
        {"name": "main", "outpost": "o"}, {"name": "b", "outpost": "o", "env": {name: "x"}}]}  # fmt: skip
    done = run_role(tmp_path, "devin.outposts.worker", SYSTEMD_DEBIAN, role_vars)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Instances b: env must not carry DEVIN_OUTPOSTS_TOKEN, DEVIN_OUTPOSTS_TOKEN_FD or DEVIN_OUTPOSTS_TOKEN_FILE" in out, out
    assert "changed=0" in out, out


def test_orchestrator_role_refuses_a_systemd_too_old_for_the_token_file(tmp_path: Path) -> None:
    done = run_role(tmp_path, "devin.outposts.orchestrator", OLD_SYSTEMD, ORCHESTRATOR_VARS)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert SYSTEMD_TOO_OLD.format("orchestrator") in out, out
    assert "is not the bundled version" not in out, out
    assert "changed=0" in out, out
