"""``orchestrate --outposts-file``: the outposts one orchestrator serves, listed in a JSON or YAML file.

The file is a list of ``{outpost: NAME, max_concurrent: CAP}`` (docs/orchestrator.md, "Several outposts");
its outposts come first, then ``--outpost``'s. What is asserted is the config that results, the one-line
refusal (and, through the command itself, exit code 2 without a traceback), and, once, the claims the
simulator records when one orchestrator serves both outposts of a file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from orchestrator_fakes import Running, ScriptedDriver

from devin_outposts.core.config import ConfigError
from devin_outposts.orchestrator.drivers.base import WorkerState, WorkerStatus
from devin_outposts.orchestrator.options import OutpostSpec, parse_args
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for

TOKEN = "tok-from-the-environment"
ENV = {"DEVIN_OUTPOSTS_TOKEN": TOKEN}
GPU_AND_CPU = """\
# the fleet's pools
- outpost: gpu-fleet
  max_concurrent: 2
- outpost: cpu-fleet
"""


def write(tmp_path: Path, text: str, name: str = "outposts.yml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def parse(path: Path, *flags: str, env: Optional[dict[str, str]] = None) -> tuple[OutpostSpec, ...]:
    return parse_args(["--driver", "process", "--outposts-file", str(path), *flags], env or ENV).outposts


def refusal(path: Path, *flags: str) -> str:
    """The one line the config is refused with."""
    with pytest.raises(ConfigError) as caught:
        parse(path, *flags)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


# --- what the file gives --------------------------------------------------------------------------------


def test_a_yaml_or_json_list_gives_the_outposts_in_its_order_then_the_flags(tmp_path: Path) -> None:
    yaml_file = write(tmp_path, GPU_AND_CPU)
    assert parse(yaml_file) == (OutpostSpec("gpu-fleet", 2), OutpostSpec("cpu-fleet", None))
    json_file = write(
        tmp_path, json.dumps([{"outpost": "b", "max_concurrent": 3}, {"outpost": "a"}]), "o.json"
    )
    assert parse(json_file) == (OutpostSpec("b", 3), OutpostSpec("a"))
    # A cap given as null is no cap; names are read as the flag reads them (surrounding space dropped).
    assert parse(write(tmp_path, "- {outpost: ' c ', max_concurrent: null}\n", "c.yml")) == (
        OutpostSpec("c"),
    )
    # With --outpost (or its variable), the file's come first, then the flag's.
    assert parse(yaml_file, "--outpost", "edge=1") == (
        OutpostSpec("gpu-fleet", 2),
        OutpostSpec("cpu-fleet"),
        OutpostSpec("edge", 1),
    )
    env = {**ENV, "DEVIN_ORCHESTRATOR_OUTPOST": "edge"}
    assert [str(spec) for spec in parse(yaml_file, env=env)] == ["gpu-fleet=2", "cpu-fleet", "edge"]


def test_the_variable_names_the_file_and_the_caps_are_each_outposts(tmp_path: Path) -> None:
    path = write(tmp_path, GPU_AND_CPU)
    env = {**ENV, "DEVIN_ORCHESTRATOR_OUTPOSTS_FILE": str(path), "DEVIN_ORCHESTRATOR_MAX_CONCURRENT": "3"}
    config = parse_args(["--driver", "process"], env)
    assert config.outposts_file == path
    # Each outpost's own cap, never above the process's; without one, the process's.
    assert [config.for_outpost(spec).max_concurrent for spec in config.outposts] == [2, 3]
    # The flag wins over the variable, as every option's does.
    other = write(tmp_path, "- outpost: edge\n", "other.yml")
    assert parse_args(["--driver", "process", "--outposts-file", str(other)], env).outposts == (
        OutpostSpec("edge"),
    )


def test_the_token_never_comes_from_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "- outpost: gpu-fleet\n  token: secret-in-a-file\n")
    message = refusal(path)
    assert (
        message == f"--outposts-file {path}, entry 1: unknown key 'token' (only outpost and max_concurrent)"
    )
    assert "secret-in-a-file" not in message
    # A file without it: the token is the environment's.
    assert (
        parse_args(["--driver", "process", "--outposts-file", str(write(tmp_path, GPU_AND_CPU))], ENV).token
        == TOKEN
    )


# --- what the file is refused for -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # The other shape one may reach for is named, with what to write instead.
        ("outposts:\n  - outpost: gpu-fleet\n",
         "must be a list of {outpost: NAME, max_concurrent: CAP}, not a mapping (write the list itself)"),
        ("gpu-fleet\n", "must be a list of {outpost: NAME, max_concurrent: CAP}, got text"),
        ("[]\n", "lists no outpost"),
        ("", "lists no outpost"),
        ("# nothing yet\n", "lists no outpost"),
        ("- gpu-fleet\n", "entry 1: must be a mapping {outpost: NAME, max_concurrent: CAP}, got text"),
        ("- outpost: a\n- outpost: b\n  max_concurrent: 2\n  region: eu\n", "entry 2: unknown key 'region'"),
        ("- max_concurrent: 2\n", "entry 1: outpost must be a name or id without commas, '=' or spaces, got "
         "nothing"),
        ("- outpost: 2024\n", "outpost must be a name or id without commas, '=' or spaces, got a number"),
        ("- outpost: 'a,b'\n", "outpost must be a name or id without commas"),
        ("- outpost: 'gpu fleet'\n", "outpost must be a name or id without commas"),
        ("- outpost: a\n  max_concurrent: 0\n", "entry 1: max_concurrent must be a whole number >= 1, got 0"),
        ("- outpost: a\n  max_concurrent: '2'\n", "max_concurrent must be a whole number >= 1, got '2'"),
        ("- outpost: a\n  max_concurrent: 1.5\n", "max_concurrent must be a whole number >= 1, got 1.5"),
        ("- outpost: a\n  max_concurrent: true\n", "max_concurrent must be a whole number >= 1, got True"),
        ("- outpost: a\n- outpost: b\n- outpost: a\n", "names 'a' twice"),
        ("- outpost: a\n  max_concurrent: [\n", "neither JSON nor YAML: "),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_in_one_line_naming_the_file(tmp_path: Path, text: str, error: str) -> None:
    path = write(tmp_path, text)
    message = refusal(path)
    assert message.startswith(f"--outposts-file {path}"), message
    assert error in message, message


def test_an_outpost_in_the_file_and_in_the_flag_or_its_variable_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, GPU_AND_CPU)
    expected = f"--outpost and --outposts-file {path} both name 'cpu-fleet'"
    assert refusal(path, "--outpost", "edge", "--outpost", "cpu-fleet=1") == expected
    with pytest.raises(ConfigError, match="both name 'gpu-fleet'"):
        parse(path, env={**ENV, "DEVIN_ORCHESTRATOR_OUTPOST": "gpu-fleet"})


def test_a_file_that_cannot_be_read_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yml"
    assert refusal(missing) == f"--outposts-file {missing}: No such file or directory"
    assert refusal(tmp_path) == f"--outposts-file {tmp_path}: Is a directory"
    binary = tmp_path / "binary.yml"
    binary.write_bytes(b"- outpost: \xff\xfe\n")
    assert refusal(binary) == f"--outposts-file {binary}: not UTF-8 text"


def test_the_command_exits_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    """The command itself, as a user meets it: a bad file is exit code 2 and one line naming it."""
    bad_yaml = write(tmp_path, "- outpost: a\n  max_concurrent: [\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVIN_", "PYTEST_"))}
    env.update(ENV, DEVIN_ORCHESTRATOR_OUTPOSTS_FILE=str(bad_yaml))
    for args in (["--outposts-file", str(tmp_path / "missing.yml")], []):
        result = subprocess.run(
            [sys.executable, "-m", "devin_outposts", "orchestrate", "--driver", "process", *args],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 2, (result.returncode, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        [line] = result.stderr.strip().splitlines()
        assert "--outposts-file" in line and (
            str(tmp_path / "missing.yml") in line or str(bad_yaml) in line
        ), line


def test_no_outpost_from_the_file_or_the_flag_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--outpost is required .* or a list of them in --outposts-file"):
        parse_args(["--driver", "process"], ENV)


# --- served -------------------------------------------------------------------------------------------------


def test_one_orchestrator_claims_a_session_of_each_outpost_its_file_lists(
    sim: SimHandle, tmp_path: Path
) -> None:
    """The file alone names the outposts: a session queued on each is claimed by the one acceptor (the
    simulator's claim history)."""
    outposts = {name: sim.admin.create_outpost(name, "linux") for name in ("gpu-fleet", "cpu-fleet")}
    path = write(tmp_path, GPU_AND_CPU)
    env = {**ENV, "DEVIN_OUTPOSTS_TOKEN": sim.create_token("orchestrator"), "DEVIN_API_URL": sim.url}
    flags = [
        "--driver", "process", "--outposts-file", str(path), "--state-dir", str(tmp_path / "state"),
        "--acceptor-id", "orch-outposts-file", "--poll-interval-secs", "0.2",
        "--status-interval-secs", "0.05", "--gc-interval", "0.2", "--backoff-max-secs", "1",
    ]  # fmt: skip
    driver = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.RUNNING))
    running = Running(Orchestrator(parse_args(flags, env), driver=driver))
    try:
        sessions = {
            name: sim.admin.enqueue(outpost.outpost_id).session_id for name, outpost in outposts.items()
        }

        def each_claimed() -> Optional[dict[str, list[dict[str, Any]]]]:
            """Each outpost's session's claim records, once every one has one."""
            now = {name: [r for r in sim.admin.claims(session_id=sid) if r["action"] == "claim"]
                   for name, sid in sessions.items()}  # fmt: skip
            return now if all(now.values()) else None

        # Generous: it only shows "not the 300 s boot timeout".
        history = wait_for(each_claimed, timeout=60, interval=0.1, what="a claim of each outpost's session")
        for name, records in history.items():
            assert [r["acceptor_id"] for r in records] == ["orch-outposts-file"], (name, records)
            assert {r["outpost_id"] for r in records} == {outposts[name].outpost_id}, (name, records)
    finally:
        running.stop()
    assert running.error is None, running.error
