# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The windows stage's fixtures: one simulator, one Wine prefix, and the worker role's Windows install in it.

* ``fleet``: the fleet simulator on this machine's loopback (the Linux side), an outpost of platform ``windows``
  and a machine token; it publishes the Windows stand-in remote (``devin-remote-standin.exe``) for
  ``windows_x64.exe``;
* ``wine``: a copy of the prefix that scripts/windows/setup.sh made, its server and service manager running;
* ``installed``: what the role does, in that prefix: its expressions and templates rendered by Ansible
  (role_render.py), the wheels copied where the role copies them, each instance's venv made and the package
  installed with the role's own command lines, and each service registered with ``sc create`` and the role's
  ImagePath. Two instances, ``main`` and ``second``.

At the end, one line per case (``windows case: <name>: <result>``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prerequisites import ROOT  # type: ignore[import-not-found]
from role_render import render  # type: ignore[import-not-found]
from wine import BASE_PYTHON, STANDIN_EXE, STANDIN_SCRIPT, WHEELS, Wine, require_setup  # type: ignore[import-not-found]

from devin_outposts_sim.testing import SimHandle, run_sim

TOKEN_PROBE = r"C:\devin-outposts-tests\scm_probe.py"
WINDOWS_ROOT = r"C:\ProgramData\devin-outposts"
INSTANCES = ("main", "second")
#: Seconds a drain lasts: long enough for the service manager to see a few 2 s checkpoints.
DRAIN_TIMEOUT = 6
_CASES: list[tuple[str, str, float]] = []


@dataclass
class Fleet:
    sim: SimHandle
    outpost: Any
    token: str
    standin_sha: str
    #: The sessions the cases enqueued and have not ended yet.
    sessions: list[str]


@pytest.fixture(scope="session")
def fleet() -> Iterator[Fleet]:
    # Claims outlive a worker's restart (the restart case takes one back); the stream ends often enough.
    with run_sim(claim_ttl=60, watch_max_duration=10, keepalive_interval=2, sweep_interval=0.05) as sim:
        outpost = sim.admin.create_outpost("windows-stage", "windows")
        sha = sim.admin.publish_remote(STANDIN_EXE.read_bytes(), suffixes=["windows_x64.exe"], latest=True)
        yield Fleet(sim, outpost, sim.create_token("machine"), sha, [])


@pytest.fixture(scope="session")
def wine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wine]:
    require_setup()
    prefix = Wine.copy_of_template(tmp_path_factory.mktemp("windows"))
    for source, target in (
        (ROOT / "tests" / "windows" / "scm_probe.py", TOKEN_PROBE),
        (ROOT / "python" / "devin-outposts-sim" / "src" / "devin_outposts_sim" / "remote" / "standin.py", STANDIN_SCRIPT),
    ):  # fmt: skip
        prefix.path(target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, prefix.path(target))
    prefix.start()
    try:
        yield prefix
    finally:
        prefix.stop()


@dataclass
class Instance:
    """One installed instance: its resolved row (the role's fields), and its service in ``wine``."""

    wine: Wine
    row: dict[str, Any]

    @property
    def service(self) -> str:
        return str(self.row["service"])

    @property
    def venv_python(self) -> str:
        return str(self.row["venv_python"])

    @property
    def env_file(self) -> Path:
        return self.wine.path(self.row["env_file"])

    def log(self) -> str:
        path = self.wine.path(self.row["logs_dir"]) / "worker.log"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def probe(self, *argv: str, timeout: float = 180) -> list[dict[str, Any]]:
        return self.wine.probe(self.venv_python, argv[0], self.service, *argv[1:], timeout=timeout)

    def status(self) -> dict[str, Any]:
        return self.probe("status")[-1]

    def start(self) -> list[dict[str, Any]]:
        """``net start``, then the states until RUNNING or STOPPED (a worker that exits at once)."""
        self.wine.run("net", "start", self.service, check=False)
        return self.probe("watch", "--until", "RUNNING,STOPPED", "--timeout", "120")

    def wait_stopped(self, timeout: float = 120) -> list[dict[str, Any]]:
        return self.probe("watch", "--timeout", str(timeout))

    def stop(self, *extra: str, timeout: float = 120) -> list[dict[str, Any]]:
        """STOP through the service manager, then every state until STOPPED."""
        return self.probe("watch", "--stop", *extra, "--timeout", str(timeout), timeout=timeout + 60)

    def ensure_stopped(self) -> None:
        if self.status()["state"] != "STOPPED":
            self.stop()

    @contextlib.contextmanager
    def running(self) -> Iterator[Instance]:
        """Started (it must reach RUNNING), and stopped again whatever happens inside."""
        started = [row["state"] for row in self.start() if "state" in row]
        assert started[-1] == "RUNNING", started
        try:
            yield self
        finally:
            self.ensure_stopped()


def _wheel(out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-input", "--quiet",
         "--wheel-dir", str(out), str(ROOT / "python" / "devin-outposts")],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = out.glob("devin_outposts-*-py3-none-any.whl")
    return wheel


@pytest.fixture(scope="session")
def installed(wine: Wine, fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Instance]:
    out = tmp_path_factory.mktemp("windows-role")
    wheel = _wheel(out / "wheel")
    version = wheel.name.split("-")[1]
    rows = render(out / "render", {
        "devin_outposts_worker_token": fleet.token,
        "devin_outposts_worker_api_url": fleet.sim.url,
        # Always the simulator's: never the real distribution.
        "devin_outposts_worker_static_base_url": fleet.sim.static_base_url,
        "devin_outposts_worker_windows_root": WINDOWS_ROOT,
        "devin_outposts_worker_windows_python": BASE_PYTHON,
        "_devin_outposts_worker_windows_python_exe": BASE_PYTHON,
        "_devin_outposts_common_bundled_version": version,
        "devin_outposts_worker_wheelhouse": "wheelhouse",
        "devin_outposts_worker_drain_timeout": DRAIN_TIMEOUT,
        "devin_outposts_worker_instances": [{"name": name, "outpost": fleet.outpost.name} for name in INSTANCES],
    })  # fmt: skip
    # What the role's copy tasks put on the host: the wheel, and the wheelhouse (the air-gapped path: no index).
    wheels_dir = wine.path(WINDOWS_ROOT + r"\wheels")
    wheels_dir.mkdir(parents=True)
    shutil.copyfile(wheel, wheels_dir / wheel.name)
    shutil.copytree(WHEELS, wine.path(WINDOWS_ROOT + r"\wheelhouse"))
    instances = {}
    for name, row in rows.items():
        for key in ("instance_dir", "state_dir", "logs_dir", "workdir"):
            wine.path(row[key]).mkdir(parents=True, exist_ok=True)
        wine.run(*row["venv_argv"])
        wine.run(*row["pip_argv"])
        dummy, text = wine.run(*row["read_argv"])
        assert f"version={version}" in text, text
        assert f"base={BASE_PYTHON}" in text, text  # so the ImagePath rendered with it is the role's
        shutil.copyfile(row["service_host_py"], wine.path(row["host_script"]))
        shutil.copyfile(row["worker_env"], wine.path(row["env_file"]))
        wine.run(
            "sc", "create", row["service"], "binPath=", row["image_path"], "DisplayName=", row["display_name"]
        )
        instances[name] = Instance(wine, row)
    return instances


def wait_for(predicate: Any, *, timeout: float, what: str, interval: float = 0.5) -> Any:
    """Poll ``predicate`` until it returns something true (bounded: the bound only catches a hang)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        result = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
        if hasattr(report, "wasxfail") and report.passed:
            result = "XPASS"
        _CASES.append((item.name, result, report.duration))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _CASES:
        return
    terminalreporter.section("windows cases")
    for name, result, seconds in _CASES:
        terminalreporter.write_line(f"windows case: {name}: {result} ({seconds:.0f} s)")
