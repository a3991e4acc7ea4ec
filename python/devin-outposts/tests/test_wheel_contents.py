"""What worker hosts receive: the built wheel of devin-outposts holds the client and the worker, nothing else.

The wheel is built the way ``make build`` and the worker role build it (pip, no dependencies). A simulator
module, a test helper or a test in it would reach every worker host; this test lists the wheel and fails on
any of them, and checks that what the worker needs is there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
#: Not for worker hosts: the simulator (its own distribution), test helpers, tests.
FORBIDDEN = ("devin_outposts_sim", "/sim/", "testing", "pytest", "conftest", "tests/", "test_", "fakes")
NEEDED = (
    "devin_outposts/__init__.py",
    "devin_outposts/py.typed",
    "devin_outposts/api/client.py",
    "devin_outposts/worker/runner.py",
    "devin_outposts/core/claiming.py",
    "devin_outposts/core/platform/__init__.py",
    "devin_outposts/core/platform/windows.py",
    "devin_outposts/core/platform/console_stop.py",  # run by path to stop a Windows remote
    "devin_outposts/worker/windows/service.py",
    "devin_outposts/worker/windows/envfile.py",
    "devin_outposts/cli/worker.py",
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    # From a copy, as the role and make build do: setuptools writes build/ beside the source, and another
    # build of this checkout (a Molecule scenario's role, make build) may be running at the same time.
    source = tmp_path_factory.mktemp("source") / "devin-outposts"
    shutil.copytree(
        PROJECT, source, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "tests")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--no-input", "--wheel-dir", str(out), str(source)],
        check=True, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(build)},
    )  # fmt: skip
    (found,) = out.glob("devin_outposts-*-py3-none-any.whl")
    return found


def test_the_wheel_holds_no_simulator_and_no_test_helper(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    offenders = [name for name in names if any(word in name for word in FORBIDDEN)]
    assert offenders == [], offenders
    packages = {name.split("/", 1)[0] for name in names if not name.startswith("devin_outposts-")}
    assert packages == {"devin_outposts"}


def test_the_wheel_holds_what_the_worker_needs(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(NEEDED) <= names, set(NEEDED) - names
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    lines = text.splitlines()
    requires = sorted(line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:"))
    # What a worker host installs; the orchestrator's kubernetes and ansible drivers add lightkube and
    # ansible-runner only as extras.
    plain = [r for r in requires if "extra ==" not in r and "sys_platform" not in r]
    assert [r.split(">")[0].split("<")[0] for r in plain] == ["httpx", "pydantic"], requires
    # The Windows service host's pywin32, on Windows hosts only (docs/windows-worker.md).
    assert [r for r in requires if "sys_platform" in r] == ['pywin32>=306; sys_platform == "win32"'], requires
    extras = sorted(r for r in requires if "extra ==" in r)
    assert extras == [
        'ansible-runner>=2.3; extra == "ansible"',
        'lightkube<1,>=0.22; extra == "kubernetes"',
    ], requires
