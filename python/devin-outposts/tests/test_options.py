"""Each option written once (core/config.py): the rows both programs declare, their defaults in the docs and
the roles, the one reader of yes/no words and the one reader of the account token.

A row the worker and the orchestrator both declare must come from ``SHARED_OPTIONS``; a default that the
docs' option tables or the roles' defaults spell differently from its row fails here, and so does a word
that the simulator's query parameters read differently from the programs' switches.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from devin_outposts.cli.common import API_OPTIONS, client_from
from devin_outposts.core.config import (
    FALSE_WORDS,
    SHARED_OPTIONS,
    TRUE_WORDS,
    ConfigError,
    Option,
    Program,
    shown,
    truth,
)
from devin_outposts.orchestrator import options as orchestrator_options
from devin_outposts.orchestrator.drivers.base import DriverOption, OptionKind, OptionTable
from devin_outposts.worker import options as worker_options
from devin_outposts_sim.errors import Invalid
from devin_outposts_sim.http import validate

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "cog_options_token_0123456789"
TABLES = {Program.WORKER: worker_options.OPTIONS, Program.ORCHESTRATOR: orchestrator_options.OPTIONS}
DOCS = {Program.WORKER: ROOT / "docs/worker.md", Program.ORCHESTRATOR: ROOT / "docs/orchestrator.md"}
ROLE_DEFAULTS = {
    Program.WORKER: ROOT / "roles/worker/defaults/main.yml",
    Program.ORCHESTRATOR: ROOT / "roles/orchestrator/defaults/main.yml",
}
#: Role variables named like an option whose default the role chooses for itself, and why.
ROLE_CHOICES = {
    # a system service's state lives under /var/lib, not in a user's home
    (Program.ORCHESTRATOR, "state_dir"),
}


def literal_default(option: Option) -> bool:
    """A default that the docs and the roles write as a value (not a switch's, not "none" or "computed")."""
    return option.default not in (None, "") and not isinstance(option.default, bool)


# --- each shared row declared once -------------------------------------------------------------------------


def test_every_option_both_programs_declare_is_one_shared_row() -> None:
    worker = {option.name: option for option in worker_options.OPTIONS}
    orchestrator = {option.name: option for option in orchestrator_options.OPTIONS}
    both = worker.keys() & orchestrator.keys()
    assert both == set(SHARED_OPTIONS), sorted(both ^ set(SHARED_OPTIONS))
    assert len(both) >= 18, both  # the 17 rows the worker and the orchestrator used to copy, and the token
    for name in both:
        row = SHARED_OPTIONS[name]
        assert worker[name] == row.of(Program.WORKER, worker[name].group), name
        assert orchestrator[name] == row.of(Program.ORCHESTRATOR, orchestrator[name].group), name


def test_no_flag_or_variable_is_declared_twice_outside_the_shared_rows() -> None:
    def spelled(table: tuple[Option, ...]) -> dict[str, str]:
        return {word: option.name for option in table for word in (*option.flags, option.env) if word}

    worker, orchestrator = spelled(worker_options.OPTIONS), spelled(orchestrator_options.OPTIONS)
    for word in worker.keys() & orchestrator.keys():
        assert worker[word] == orchestrator[word] and worker[word] in SHARED_OPTIONS, word


@pytest.mark.parametrize("program", list(Program))
def test_every_config_default_is_its_rows(program: Program) -> None:
    worker = program is Program.WORKER
    config = worker_options.WorkerConfig() if worker else orchestrator_options.OrchestratorConfig()
    checked = 0
    for option in TABLES[program]:
        value = getattr(config, option.name)
        if isinstance(value, Path) and option.default is None:
            continue  # computed: the worker's working directory is the current one
        if isinstance(value, Path):  # a directory: the row says it as text
            assert value == Path(option.default).expanduser(), option.name
        else:
            assert value == option.default, option.name
        checked += 1
    assert checked >= len(TABLES[program]) - 1 > 25


@pytest.mark.parametrize("program", list(Program))
def test_help_shows_each_default_from_its_row(program: Program) -> None:
    for option in TABLES[program]:
        assert "{" not in option.help_text and "None" not in option.help_text, option.name
        if "{default}" in option.help:
            assert shown(option.default) in option.help_text, option.name
    renew = next(option for option in TABLES[program] if option.name == "renew_margin")
    assert renew.help_text.endswith("(60)")


# --- the docs' tables and the roles' defaults ---------------------------------------------------------------


def documented_rows(doc: Path) -> dict[str, dict[str, str]]:
    """Every row of the doc's option tables (those whose first column is ``Flag``), by each flag it names:
    its cells by column title."""
    rows: dict[str, dict[str, str]] = {}
    header: list[str] = []
    for line in doc.read_text().splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if not header:
            header = cells
            continue
        if header[0] != "Flag" or set("".join(cells)) <= {"-"}:
            continue
        row = dict(zip(header, cells))
        for flag in re.findall(r"`(--[a-z][a-z-]*)", cells[0]):
            rows[flag] = row
    return rows


@pytest.mark.parametrize("program", list(Program))
def test_the_docs_tables_give_each_rows_variable_and_default(program: Program) -> None:
    documented = documented_rows(DOCS[program])
    checked = 0
    for option in TABLES[program]:
        if not option.flags:
            assert f"`{option.env}`" in DOCS[program].read_text(), option.env
            continue
        row = documented[option.flag]
        environment = row.get("Environment", "")
        if option.env:
            assert f"`{option.env}`" in environment, (option.flag, environment)
        else:
            assert environment in ("", "—"), (option.flag, environment)
        if literal_default(option):
            assert row["Default"].strip("`") == shown(option.default), (option.flag, row["Default"])
            checked += 1
    assert checked >= 12, checked  # the tables were really read


@pytest.mark.parametrize("program", list(Program))
def test_the_roles_defaults_are_the_rows(program: Program) -> None:
    defaults = yaml.safe_load(ROLE_DEFAULTS[program].read_text())
    prefix = f"devin_outposts_{program.value}_"
    checked = 0
    for option in TABLES[program]:
        value: Any = defaults.get(prefix + option.name)
        if value in (None, "") or not literal_default(option) or (program, option.name) in ROLE_CHOICES:
            continue  # not set by the role, or left to the program
        if isinstance(value, str) and "{{" in value:  # a template that falls back to the default
            assert f"'{shown(option.default)}'" in value, (option.name, value)
        else:
            assert value == option.default, (prefix + option.name, value, option.default)
        checked += 1
    assert checked >= 5, checked


# --- one reader of yes/no words ---------------------------------------------------------------------------


def test_the_yes_no_words() -> None:
    for word in TRUE_WORDS:
        assert truth(word) is True and truth(f" {word.upper()} ") is True
    for word in FALSE_WORDS:
        assert truth(word) is False and truth(word.title()) is False
    for word in ("", "maybe", "y", "2", "enabled"):
        assert truth(word) is None


def test_switches_and_driver_flags_read_the_same_words() -> None:
    table = OptionTable("test", DriverOption("flag", OptionKind.FLAG, "a flag", default=False))
    for word, expected in [*((w, True) for w in TRUE_WORDS), *((w, False) for w in FALSE_WORDS)]:
        env = {"DEVIN_OUTPOSTS_TOKEN": TOKEN, "DEVIN_WORKER_WATCH": word.upper()}
        assert worker_options.parse_start_args([], env).watch is expected
        assert table.read({"flag": word})["flag"] is expected
    with pytest.raises(ConfigError, match="true or false"):
        worker_options.parse_start_args([], {"DEVIN_OUTPOSTS_TOKEN": TOKEN, "DEVIN_WORKER_WATCH": "maybe"})


def test_the_simulators_query_words_are_the_programs() -> None:
    """The simulator may not import core (it uses devin_outposts.api only), so it keeps a copy."""
    assert set(TRUE_WORDS) == validate.TRUE_WORDS
    assert set(FALSE_WORDS) == validate.FALSE_WORDS
    for word in TRUE_WORDS:
        assert validate.query_bool(word.upper(), "watch") is True
    for word in FALSE_WORDS:
        assert validate.query_bool(word, "watch") is False
    with pytest.raises(Invalid, match="watch must be true or false"):
        validate.query_bool("maybe", "watch")


# --- one reader of the account token ----------------------------------------------------------------------


def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return str(path)


def test_the_command_line_client_reads_url_and_token_from_the_environment() -> None:
    env = {"DEVIN_API_URL": "http://127.0.0.1:9/", "DEVIN_OUTPOSTS_TOKEN": TOKEN}
    args = argparse.Namespace(api_url=None, token=None)
    client = client_from(args, env)
    try:
        assert client.api_url == "http://127.0.0.1:9"
        assert client._http.headers["Authorization"] == f"Bearer {TOKEN}"
    finally:
        asyncio.run(client.aclose())


def test_every_reader_of_the_token_takes_it_from_a_file(tmp_path: Path) -> None:
    env = {"DEVIN_OUTPOSTS_TOKEN_FILE": token_file(tmp_path)}
    assert worker_options.parse_start_args(["--outpost", "o"], env).token == TOKEN
    assert orchestrator_options.parse_args(["--outpost", "o", "--driver", "process"], env).token == TOKEN
    client = client_from(argparse.Namespace(api_url="http://127.0.0.1:9", token=None), env)
    try:
        assert client._http.headers["Authorization"] == f"Bearer {TOKEN}"
    finally:
        asyncio.run(client.aclose())
    assert [option.name for option in API_OPTIONS] == ["api_url", "token"]


def test_every_reader_of_the_token_refuses_two_sources(tmp_path: Path) -> None:
    env = {"DEVIN_OUTPOSTS_TOKEN_FILE": token_file(tmp_path), "DEVIN_OUTPOSTS_TOKEN": "cog_other"}
    with pytest.raises(ConfigError, match="set only one of"):
        worker_options.parse_start_args(["--outpost", "o"], env)
    with pytest.raises(ConfigError, match="set only one of"):
        orchestrator_options.parse_args(["--outpost", "o", "--driver", "process"], env)
    with pytest.raises(ConfigError, match="set only one of"):
        client_from(argparse.Namespace(api_url=None, token=None), env)


def test_the_orchestrator_reads_a_descriptor_and_never_takes_a_token_flag() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, f"{TOKEN}\n".encode())
    os.close(write_end)
    env = {"DEVIN_OUTPOSTS_TOKEN_FD": str(read_end)}
    config = orchestrator_options.parse_args(["--outpost", "o", "--driver", "process"], env)
    assert config.token == TOKEN
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(read_end)
    with pytest.raises(SystemExit):
        orchestrator_options.parse_args(["--outpost", "o", "--driver", "process", "--token", TOKEN], {})
