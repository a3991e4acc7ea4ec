# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""What the pytest tests under tests/ need from this machine, and the one rule for when it is missing: the
test is skipped on a developer's machine, and fails in CI (``CI=true``), where a green run must mean that every
test ran. scripts/lib.sh has the same rule for whole stages (``in_ci``, ``cannot_run``).

The test modules import this module by name: pytest puts tests/ on ``sys.path`` when it loads
tests/conftest.py.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

#: The words scripts/lib.sh's ``in_ci`` accepts.
IN_CI = os.environ.get("CI", "") in ("true", "TRUE", "True", "1", "yes")
ROOT = Path(__file__).resolve().parents[1]
TEST_HOSTS = ROOT / "scripts" / "test-hosts"
#: The test-host cache: the same default as scripts/test-hosts/*.sh.
TEST_HOSTS_CACHE = Path(os.environ.get("DEVIN_OUTPOSTS_TEST_HOSTS", "/var/tmp/devin-outposts-test-hosts"))  # noqa: S108


def cannot_run(reason: str) -> NoReturn:
    """Skip the test (fail it in CI): ``reason`` says what is missing."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a test that cannot run fails in CI instead of being skipped)",
                    pytrace=False)
    pytest.skip(reason)


def tool(name: str) -> str:
    """The command ``name``: the one beside this Python (the dev venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        cannot_run(f"{name} is not installed (requirements-dev.txt; scripts/bootstrap.sh installs it)")
    return found


def import_or_cannot_run(*names: str, why: str) -> list[ModuleType]:
    """The modules ``names``, imported at a test module's top; without one of them the whole module is skipped
    (in CI the ImportError fails its collection)."""
    try:
        return [importlib.import_module(name) for name in names]
    except ImportError as exc:
        if IN_CI:
            raise
        pytest.skip(f"{why}: {exc}", allow_module_level=True)


def nspawn_host_missing() -> str:
    """What a systemd-nspawn test host (scripts/test-hosts/nspawn-host.sh) lacks here; empty when nothing."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn)"
    for tool in ("systemd-nspawn", "nsenter", "socat", "ssh"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    for path in (
        TEST_HOSTS_CACHE / "rootfs-bookworm" / ".devin-outposts-rootfs",
        TEST_HOSTS_CACHE / "ssh" / "id_ed25519",
        TEST_HOSTS_CACHE / "wheelhouse-py311",
    ):
        if not path.exists():
            return f"needs the test-host images ({path} is missing): run scripts/test-hosts/build-images.sh"
    return ""
