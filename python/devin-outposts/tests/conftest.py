"""Fixtures shared by the worker tests of this folder (the helpers they build on are in worker_fakes.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from worker_fakes import FakeRemote, kill_pids


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[FakeRemote]:
    """A fake ``devin-remote`` under ``tmp_path / "remote"``; every run it recorded is killed at the end
    (a worker that crashed, or a stop a test broke on purpose, may leave one running)."""
    fake = FakeRemote(tmp_path / "remote")
    try:
        yield fake
    finally:
        kill_pids(run["pid"] for run in fake.runs())
