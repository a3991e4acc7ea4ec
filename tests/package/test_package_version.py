"""The bundled package's version is written in two places; a release must bump both together.

``pyproject.toml`` is what the worker role reads (to pin the wheel it installs) and ``__version__`` is what
``devin-outposts --version`` prints. If they drift, the role would install one version and report another.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import devin_outposts

PYPROJECT = Path(__file__).resolve().parents[2] / "roles/worker/files/devin-outposts/pyproject.toml"


def pyproject_version() -> str:
    match = re.search(r'^version = "([^"]+)"$', PYPROJECT.read_text(), re.MULTILINE)
    assert match, f"no version line in {PYPROJECT}"
    return match.group(1)


def test_pyproject_and_dunder_version_agree() -> None:
    assert devin_outposts.__version__ == pyproject_version()


def test_the_command_prints_that_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "devin_outposts", "--version"], capture_output=True, text=True, check=True
    )
    assert pyproject_version() in out.stdout + out.stderr
