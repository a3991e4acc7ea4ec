"""The version is written once, in ``devin_outposts/__init__.py``; everything else reads it from there.

``pyproject.toml`` takes it dynamically (so the wheel's metadata carries it), the command prints it, and
the simulator's distribution and the collection (galaxy.yml) carry the same number, so that a release is
one coherent set. The worker role installs the wheel of that version.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import devin_outposts
import devin_outposts_sim

ROOT = Path(__file__).resolve().parents[3]


def test_the_version_is_declared_once() -> None:
    for pyproject in ROOT.glob("python/*/pyproject.toml"):
        text = pyproject.read_text()
        assert 'dynamic = ["version"]' in text, pyproject
        assert not re.search(r"(?m)^version\s*=\s*\"", text), f"{pyproject} writes a version of its own"


def test_metadata_command_simulator_and_collection_agree() -> None:
    version = devin_outposts.__version__
    assert importlib.metadata.version("devin-outposts") == version
    assert importlib.metadata.version("devin-outposts-sim") == version
    assert devin_outposts_sim.__version__ == version
    galaxy = re.search(r"(?m)^version:\s*(\S+)", (ROOT / "galaxy.yml").read_text())
    assert galaxy is not None and galaxy.group(1) == version


def test_the_command_prints_that_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "devin_outposts", "--version"], capture_output=True, text=True, check=True
    )
    assert devin_outposts.__version__ in out.stdout + out.stderr
