"""Fixtures of the simulator's own tests. ``sim``, ``outpost``, ``make_sim`` and the rest come from the
simulator's pytest plugin (devin_outposts_sim.testing.pytest_plugin, loaded by its ``pytest11`` entry
point)."""

from __future__ import annotations

import pytest
from sim_support import Cli, CliResult

from devin_outposts_sim.cli import main
from devin_outposts_sim.testing import SimHandle


@pytest.fixture
def cli(sim: SimHandle, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``cli(*argv)``: ``devin-outposts-sim <argv>`` in process against ``sim``, found the way a user's
    shell gives it (``DEVIN_SIM_URL`` and ``DEVIN_SIM_ADMIN_TOKEN``, no token file); the exit code and the
    output."""
    monkeypatch.setenv("DEVIN_SIM_URL", sim.url)
    monkeypatch.setenv("DEVIN_SIM_ADMIN_TOKEN", sim.admin_token)
    monkeypatch.delenv("DEVIN_SIM_ADMIN_TOKEN_FILE", raising=False)

    def run(*argv: str) -> CliResult:
        code = main([*argv])
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run
