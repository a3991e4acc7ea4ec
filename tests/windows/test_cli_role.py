# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The cli role's Windows path (devin.exe: install, checksum, upgrade, removal), run by ansible-playbook
under Wine.

What is real: the role's own tasks, conditions, expressions, block/rescue/always and handler, as
``ansible-playbook`` runs them (connection local, the play given Windows facts by
tests/roles/library/pretend_os); the download from the simulator's CLI distribution and its published
``.sha256``; ``devin.exe --version``, run by Wine (devin.exe is a Windows executable built here from
cli_standin.c, one per version); the machine PATH in Wine's registry; a Wine service (dummy_service.c) that
the handler restarts.

What stands in: each ``ansible.windows`` module the path uses, by a test-only Python module of the same name
(collection/ansible_collections/ansible/windows, first on ANSIBLE_COLLECTIONS_PATH; its README.md), acting on
the Wine prefix: the real ones are PowerShell over WinRM, which Wine cannot give. docs/windows.md lists what
Wine cannot run. The cases share conftest.py's prefix; each one brings the install to the state it starts
from.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prerequisites import ROOT, cannot_run  # type: ignore[import-not-found]
from wine import Wine  # type: ignore[import-not-found]

from conftest import Fleet  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(600)
HERE = Path(__file__).resolve().parent
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
MINGW = "x86_64-w64-mingw32-gcc"
#: The role's default install directory, kept: the test runs what a user gets.
INSTALL_DIR = r"C:\Program Files\devin-cli"
SERVICE = "DevinOutpostsCliTest"
SERVICE_DIR = r"C:\devin-outposts-tests\cli-service"
MACHINE_ENV = r"HKLM\System\CurrentControlSet\Control\Session Manager\Environment"
WINDOWS_FACTS = {
    "system": "Win32NT", "os_family": "Windows", "distribution": "Microsoft Windows Server 2022 Datacenter",
    "architecture": "64-bit", "architecture2": "x86_64",
}  # fmt: skip
VERSION_A, VERSION_B, VERSION_TAMPERED, VERSION_WRONG, VERSION_PINNED = (
    "1.4.0",
    "1.5.2",
    "1.6.0",
    "1.7.0",
    "1.8.0",
)


@dataclass
class Run:
    rc: int
    output: str

    @property
    def recap(self) -> dict[str, int]:
        """The host's PLAY RECAP counters (ok, changed, failed, ...)."""
        match = re.search(r"^winhost\s*:\s*(.*)$", self.output, re.MULTILINE)
        assert match, self.output
        return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(1))}


@dataclass
class CliHost:
    """The Wine prefix as the role's Windows host, the simulator's CLI distribution, a way to run the role."""

    wine: Wine
    fleet: Fleet
    work: Path
    builds: dict[str, bytes]

    def exe(self, reports: str) -> bytes:
        """A devin.exe stand-in that reports ``reports`` for --version (built once per version)."""
        if reports not in self.builds:
            out = self.work / f"devin-{reports}.exe"
            subprocess.run([MINGW, "-O2", "-s", "-o", str(out), f'-DCLI_VERSION="{reports}"',
                            str(HERE / "cli_standin.c")], check=True)  # fmt: skip
            self.builds[reports] = out.read_bytes()
        return self.builds[reports]

    def publish(self, version: str, *, reports: str = "", tampered: bool = False) -> None:
        self.fleet.sim.admin.publish_cli(
            version, content=self.exe(reports or version), platforms=["windows-x64"], tampered=tampered
        )

    def play(self, version: str = "", *, state: str = "present", check: bool = False, **extra: Any) -> Run:
        """``ansible-playbook`` applying devin.outposts.cli to the Windows host (here, connection local)."""
        settings = {
            "devin_outposts_cli_state": state, "devin_outposts_cli_version": version,
            "devin_outposts_cli_base_url": self.fleet.sim.admin.cli_base_url,
            "devin_outposts_cli_restart_services": [SERVICE], **extra,
        }  # fmt: skip
        playbook = [{
            "name": "The cli role on a Windows host (a Wine prefix)", "hosts": "windows",
            "gather_facts": False,
            "pre_tasks": [{"name": "Windows facts (ansible.windows.setup needs WinRM)",
                           "pretend_os": {"facts": WINDOWS_FACTS}}],
            "roles": [{"role": "devin.outposts.cli"}],
        }]  # fmt: skip
        inventory = {"windows": {"hosts": {"winhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}  # fmt: skip
        (self.work / "site.yml").write_text(yaml.safe_dump(playbook, sort_keys=False))
        (self.work / "inventory.yml").write_text(yaml.safe_dump(inventory))
        (self.work / "settings.yml").write_text(yaml.safe_dump(settings))
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DEVIN_", "PIP_", "ANSIBLE_"))
        }
        env.update(
            # The stand-ins first: they take the place of ansible.windows; devin.outposts is this checkout.
            ANSIBLE_COLLECTIONS_PATH=f"{HERE / 'collection'}:{ROOT / '.cache' / 'collections'}",
            ANSIBLE_LIBRARY=str(ROOT / "tests" / "roles" / "library"),
            DEVIN_OUTPOSTS_TEST_WINEPREFIX=str(self.wine.prefix),
            ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="False",
        )  # fmt: skip
        done = subprocess.run(
            [ANSIBLE_PLAYBOOK, "-i", "inventory.yml", "-e", "@settings.yml", "site.yml",
             *(["--check"] if check else [])],
            cwd=self.work, env=env, capture_output=True, text=True, timeout=480, check=False,
        )  # fmt: skip
        return Run(done.returncode, done.stdout + done.stderr)

    def installed(self, version: str) -> Run:
        """Install ``version`` unless the stable path already reports it (the state a case starts from)."""
        if self.reports(INSTALL_DIR + r"\devin.exe") != f"devin {version}":
            self.publish(version)
            run = self.play(version)
            assert run.rc == 0, run.output
            return run
        return Run(0, "")

    def reports(self, windows_path: str) -> str:
        """What the program at ``windows_path`` prints for --version, run by Wine ("" if it is missing)."""
        if not self.wine.path(windows_path).exists():
            return ""
        dummy, text = self.wine.run(windows_path, "--version")
        return text.strip()

    def machine_path(self) -> list[str]:
        """The machine PATH as a new Windows process sees it (Wine builds it from the registry)."""
        dummy, text = self.wine.run("cmd", "/c", "echo %PATH%")
        return text.strip().split(";")

    def service_log(self) -> list[str]:
        path = self.wine.path(SERVICE_DIR + r"\events.log")
        return path.read_text().split() if path.exists() else []


@pytest.fixture(scope="module")
def host(wine: Wine, fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliHost]:
    if shutil.which(MINGW) is None:
        cannot_run(f"{MINGW} is missing: run scripts/windows/setup.sh")
    work = tmp_path_factory.mktemp("cli-role")
    # Ansible finds this checkout as devin.outposts (scripts/lib.sh's ensure_env makes the same link).
    link = ROOT / ".cache" / "collections" / "ansible_collections" / "devin" / "outposts"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT)
    # The service "that runs the CLI": a real Wine service, which logs each start and stop.
    service_exe = wine.path(SERVICE_DIR + r"\service.exe")
    service_exe.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([MINGW, "-O2", "-s", "-municode", "-o", str(service_exe), str(HERE / "dummy_service.c")],
                   check=True)  # fmt: skip
    image_path = f'"{SERVICE_DIR}\\service.exe" {SERVICE_DIR}\\events.log'
    wine.run("sc", "create", SERVICE, "binPath=", image_path)
    wine.run("net", "start", SERVICE)
    try:
        yield CliHost(wine, fleet, work, {})
    finally:
        wine.run("net", "stop", SERVICE, check=False)
        wine.run("sc", "delete", SERVICE, check=False)


def test_install_a_version(host: CliHost) -> None:
    """devin.exe in <install_dir>\\<version>\\ and at the stable path, reporting the version under Wine; the
    install directory on the machine PATH; a second run changes nothing."""
    host.play(state="absent")
    host.publish(VERSION_A)
    first = host.play(VERSION_A)
    assert first.rc == 0, first.output
    assert first.recap["changed"] > 0, first.output
    assert host.reports(rf"{INSTALL_DIR}\{VERSION_A}\devin.exe") == f"devin {VERSION_A}"
    assert host.reports(rf"{INSTALL_DIR}\devin.exe") == f"devin {VERSION_A}"
    served = host.fleet.sim.admin.cli_dist()["artifacts"]
    (artifact,) = [a for a in served if a["version"] == VERSION_A and a["platform"] == "windows-x64"]
    installed = host.wine.path(rf"{INSTALL_DIR}\{VERSION_A}\devin.exe").read_bytes()
    assert hashlib.sha256(installed).hexdigest() == artifact["sha256"]
    assert INSTALL_DIR in host.machine_path()
    assert not host.wine.path(INSTALL_DIR + r"\.staging").exists()
    again = host.play(VERSION_A)
    assert again.rc == 0, again.output
    assert again.recap["changed"] == 0, again.output


def test_upgrade_to_another_version(host: CliHost) -> None:
    """The stable path reports the new version, the old version's directory is gone, and the handler restarted
    the service that runs the CLI (its own log shows a stop and a start)."""
    host.installed(VERSION_A)
    events_before = host.service_log()
    host.publish(VERSION_B)
    run = host.play(VERSION_B)
    assert run.rc == 0, run.output
    assert host.reports(rf"{INSTALL_DIR}\devin.exe") == f"devin {VERSION_B}"
    assert host.reports(rf"{INSTALL_DIR}\{VERSION_B}\devin.exe") == f"devin {VERSION_B}"
    assert not host.wine.path(rf"{INSTALL_DIR}\{VERSION_A}").exists()
    assert (
        "RUNNING HANDLER [devin.outposts.cli : Restart the Windows services that run the devin CLI]"
        in run.output
    )
    assert host.service_log()[len(events_before) :] == ["stop", "start"]
    assert host.machine_path().count(INSTALL_DIR) == 1


def test_a_tampered_artifact_is_refused(host: CliHost) -> None:
    """The published .sha256 does not match: the role's one line, the installed CLI left as it was, no staging
    directory and no directory for the refused version."""
    host.installed(VERSION_B)
    stable_before = host.wine.path(INSTALL_DIR + r"\devin.exe").read_bytes()
    events_before = host.service_log()
    host.publish(VERSION_TAMPERED, tampered=True)
    run = host.play(VERSION_TAMPERED)
    assert run.rc != 0
    assert run.recap["failed"] == 1, run.output
    url = f"{host.fleet.sim.admin.cli_base_url}{VERSION_TAMPERED}/devin-windows-x64.exe"
    line = (
        f"Could not install the devin CLI {VERSION_TAMPERED} (windows-x64) from {url}: "
        f"The checksum for {url} did not match"
    )
    assert line in run.output
    assert "the installed CLI was left as it was" in run.output
    assert host.wine.path(INSTALL_DIR + r"\devin.exe").read_bytes() == stable_before
    assert host.reports(rf"{INSTALL_DIR}\devin.exe") == f"devin {VERSION_B}"
    assert host.reports(rf"{INSTALL_DIR}\{VERSION_B}\devin.exe") == f"devin {VERSION_B}"
    assert not host.wine.path(rf"{INSTALL_DIR}\{VERSION_TAMPERED}").exists()
    assert not host.wine.path(INSTALL_DIR + r"\.staging").exists()
    assert host.service_log() == events_before  # no handler: nothing changed


def test_a_binary_reporting_another_version_is_refused(host: CliHost) -> None:
    """The download's checksum matches, but the binary says it is another version: the role's assert refuses
    it (the binary was run by Wine), and nothing is installed."""
    host.installed(VERSION_B)
    stable_before = host.wine.path(INSTALL_DIR + r"\devin.exe").read_bytes()
    host.publish(VERSION_WRONG, reports=VERSION_A)
    run = host.play(VERSION_WRONG)
    assert run.rc != 0
    assert run.recap["failed"] == 1, run.output
    assert (
        f"the downloaded binary reports 'devin {VERSION_A}' for --version (exit 0), "
        f"not version {VERSION_WRONG}" in run.output
    )
    assert host.wine.path(INSTALL_DIR + r"\devin.exe").read_bytes() == stable_before
    assert not host.wine.path(rf"{INSTALL_DIR}\{VERSION_WRONG}").exists()
    assert not host.wine.path(INSTALL_DIR + r"\.staging").exists()


def test_pinned_checksums_come_before_the_published_one(host: CliHost) -> None:
    """devin_outposts_cli_checksums: the installed binary's digest (win_stat) matching the pin changes
    nothing; a download is checked against the pin, not the published .sha256 (which matches here)."""
    host.installed(VERSION_B)
    stable_before = host.wine.path(INSTALL_DIR + r"\devin.exe").read_bytes()
    pin_b = hashlib.sha256(host.exe(VERSION_B)).hexdigest()
    same = host.play(VERSION_B, devin_outposts_cli_checksums={"x64": pin_b.upper()})
    assert same.rc == 0, same.output
    assert same.recap["changed"] == 0, same.output
    host.publish(VERSION_PINNED)
    run = host.play(VERSION_PINNED, devin_outposts_cli_checksums={"x64": pin_b})
    assert run.rc != 0
    assert run.recap["failed"] == 1, run.output
    assert f"devin-windows-x64.exe did not match '{pin_b}'" in run.output
    assert re.search(r"Fetch the published checksum\] \*+\nskipping: \[winhost\]", run.output), run.output
    assert host.wine.path(INSTALL_DIR + r"\devin.exe").read_bytes() == stable_before
    assert not host.wine.path(rf"{INSTALL_DIR}\{VERSION_PINNED}").exists()


def test_state_absent_removes_the_cli_and_the_path_entry(host: CliHost) -> None:
    host.installed(VERSION_B)
    path_before = [item for item in host.machine_path() if item != INSTALL_DIR]
    run = host.play(state="absent")
    assert run.rc == 0, run.output
    assert not host.wine.path(INSTALL_DIR).exists()
    assert host.machine_path() == path_before
    dummy, query = host.wine.run("reg", "query", MACHINE_ENV, "/v", "PATH")
    assert "devin-cli" not in query
    again = host.play(state="absent")
    assert again.rc == 0, again.output
    assert again.recap["changed"] == 0, again.output


def test_check_mode_on_a_host_without_the_cli_changes_nothing(host: CliHost) -> None:
    """--check on a host without the CLI: the run reports what it would change, and nothing is on disk or on
    the machine PATH afterwards (the published checksum is still fetched: its task has check_mode: false)."""
    host.play(state="absent")
    path_before = host.machine_path()
    host.publish(VERSION_A)
    run = host.play(VERSION_A, check=True)
    assert run.rc == 0, run.output
    assert run.recap["changed"] > 0, run.output
    assert not host.wine.path(INSTALL_DIR).exists()
    assert host.machine_path() == path_before
