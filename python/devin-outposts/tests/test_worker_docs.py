"""docs/worker.md documents every ``worker start`` flag, every environment variable the worker reads and
every exit code: a new flag, variable or exit code without documentation fails here."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from devin_outposts.core import exits
from devin_outposts.worker.options import ENV_PREFIX, OPTIONS, add_start_arguments

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "python/devin-outposts/src/devin_outposts"
DOC = (ROOT / "docs/worker.md").read_text()
WORKER_SOURCES = [
    *(SRC / "worker").rglob("*.py"),
    *(SRC / "core").rglob("*.py"),  # the machinery the worker runs on (the orchestrator's too)
    SRC / "cli/worker.py",
]


def test_every_flag_is_documented() -> None:
    parser = argparse.ArgumentParser()
    add_start_arguments(parser)
    flags = {flag for action in parser._actions for flag in action.option_strings} - {"-h", "--help"}
    assert len(flags) > 20, flags  # the parser was really read
    missing = sorted(flag for flag in flags if f"`{flag}" not in DOC and f"/ `{flag}`" not in DOC)
    assert not missing, f"flags missing from docs/worker.md: {missing}"


def test_every_environment_variable_is_documented() -> None:
    names = {option.env for option in OPTIONS if option.env}  # the shared rows spell theirs from a prefix
    for source in WORKER_SOURCES:
        names |= set(re.findall(r'"(DEVIN_[A-Z_]+)"', source.read_text()))
    names.discard(ENV_PREFIX)
    assert "DEVIN_OUTPOSTS_TOKEN" in names and len(names) > 15, names
    missing = sorted(name for name in names if f"`{name}`" not in DOC)
    assert not missing, f"variables missing from docs/worker.md: {missing}"


def test_every_exit_code_is_in_the_table() -> None:
    codes = {int(code) for code in exits.ExitCode}
    assert {0, 3, 6, 8} <= codes, codes
    table = DOC[DOC.index("## Exit codes") :]
    table = table[: table.index("\n## ")]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert codes <= documented, f"exit codes missing from docs/worker.md: {sorted(codes - documented)}"
