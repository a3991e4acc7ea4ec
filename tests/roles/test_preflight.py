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


def run_role(tmp_path: Path, role: str, facts: dict, role_vars: dict) -> subprocess.CompletedProcess:
    play = [{
        "name": "Preflight on another OS", "hosts": "localhost", "connection": "local", "gather_facts": False,
        "tasks": [
            {"name": "Pretend", "pretend_os": {"facts": facts}},
            {"name": "Run the role", "ansible.builtin.include_role": {"name": role}, "vars": role_vars},
        ],
    }]  # fmt: skip
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play))
    env = {
        **os.environ,
        "ANSIBLE_LIBRARY": str(LIBRARY),
        "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".cache" / "collections"),
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
        "ANSIBLE_NOCOLOR": "1",
    }
    command = [
        str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "--check",
        "-e", f"ansible_python_interpreter={sys.executable}", str(playbook),
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
