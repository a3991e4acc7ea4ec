"""Driver options: every driver declares them in one table and reads and refuses them alike.

Each driver is made the way the orchestrator makes it (``driver_class(name).from_options``) from options
as ``--driver-config`` and ``--driver-opt`` give them; what is asserted is the driver that results, or the
one line it refuses with. The docs' option tables are compared with the declarations.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from devin_outposts.orchestrator.drivers import DRIVERS, driver_class
from devin_outposts.orchestrator.drivers.ansible.options import OPTIONS as ANSIBLE_OPTIONS
from devin_outposts.orchestrator.drivers.base import (
    DriverContext,
    DriverError,
    DriverOption,
    OptionKind,
    OptionTable,
)
from devin_outposts.orchestrator.drivers.kubernetes.options import OPTIONS as KUBERNETES_OPTIONS
from devin_outposts.orchestrator.drivers.podman.options import OPTIONS as PODMAN_OPTIONS
from devin_outposts.orchestrator.drivers.process import OPTIONS as PROCESS_OPTIONS
from devin_outposts.orchestrator.options import parse_args

DOCS = Path(__file__).resolve().parents[3] / "docs"
#: Each driver's table, and the page that documents it.
TABLES = {
    "process": (PROCESS_OPTIONS, "orchestrator.md"),
    "podman": (PODMAN_OPTIONS, "orchestrator-podman.md"),
    "kubernetes": (KUBERNETES_OPTIONS, "orchestrator-kubernetes.md"),
    "ansible": (ANSIBLE_OPTIONS, "orchestrator-ansible.md"),
}
#: Per driver: one option of each kind the drivers share, where it has one.
SECONDS = {
    "process": "stop_grace",
    "podman": "stop_grace",
    "kubernetes": "delete_timeout",
    "ansible": "status_timeout",
}
ENV = {"DEVIN_OUTPOSTS_TOKEN": "tok-1"}
FLAGS = {"podman": "init", "kubernetes": "state_volume", "ansible": "keep_artifacts"}


def required_options(name: str, tmp_path: Path) -> dict[str, Any]:
    """What the driver needs besides its defaults to be made at all."""
    if name == "kubernetes":
        return {"image": "registry.example/worker:1"}
    if name == "ansible":
        playbook = tmp_path / "play.yml"
        playbook.write_text("- hosts: localhost\n  tasks: []\n")
        return {"provision_playbook": str(playbook), "teardown_playbook": str(playbook)}
    return {}


def configuration(driver: object) -> dict[str, Any]:
    """What a driver was configured with: its plain attributes and its option dataclasses."""
    plain = (str, int, float, bool, tuple, dict, Path, type(None))
    return {
        key: value
        for key, value in vars(driver).items()
        if isinstance(value, plain) or dataclasses.is_dataclass(value)
    }


def refusal(name: str, tmp_path: Path, **options: Any) -> str:
    with pytest.raises(DriverError) as caught:
        driver_class(name).from_options(
            DriverContext(state_dir=tmp_path), {**required_options(name, tmp_path), **options}
        )
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_every_driver_has_a_table_under_its_name() -> None:
    assert set(TABLES) == set(DRIVERS)
    for name, (table, dummy_page) in TABLES.items():
        assert table.driver == name
        assert driver_class(name).option_table is table


@pytest.mark.parametrize("name", sorted(TABLES))
def test_the_docs_table_is_the_declaration(name: str) -> None:
    table, page = TABLES[name]
    expected = table.markdown()
    assert expected in (DOCS / page).read_text(), f"docs/{page} should hold the {name} table:\n{expected}"


@pytest.mark.parametrize("name", sorted(TABLES))
def test_an_unknown_option_is_refused_naming_the_driver_and_the_known_ones(name: str, tmp_path: Path) -> None:
    table = TABLES[name][0]
    message = refusal(name, tmp_path, imagee="x")
    assert message == f"unknown {name} driver option imagee; known: {', '.join(table)}"


@pytest.mark.parametrize("name", sorted(SECONDS))
def test_a_bad_number_is_refused_alike(name: str, tmp_path: Path) -> None:
    key = SECONDS[name]
    assert refusal(name, tmp_path, **{key: "soon"}) == (
        f"{name} driver option {key} must be a number of seconds, got 'soon'"
    )
    assert refusal(name, tmp_path, **{key: True}) == (
        f"{name} driver option {key} must be a number of seconds, got 'True'"
    )


@pytest.mark.parametrize("name", sorted(FLAGS))
def test_a_bad_flag_is_refused_alike(name: str, tmp_path: Path) -> None:
    key = FLAGS[name]
    assert refusal(name, tmp_path, **{key: "maybe"}) == (
        f"{name} driver option {key} must be true or false, got 'maybe'"
    )


@pytest.mark.parametrize("name", sorted(TABLES))
def test_blank_text_is_the_default(name: str, tmp_path: Path) -> None:
    # --driver-opt key= (or null in the file) means "not set", for every option of every driver.
    blanks = {key: " " for key in TABLES[name][0] if key not in required_options(name, tmp_path)}
    context = DriverContext(state_dir=tmp_path)
    plain = driver_class(name).from_options(context, required_options(name, tmp_path))
    for unset in (blanks, dict.fromkeys(blanks)):
        made = driver_class(name).from_options(context, {**required_options(name, tmp_path), **unset})
        assert configuration(made) == configuration(plain)


def test_options_from_the_command_line_reach_the_driver_as_text(tmp_path: Path) -> None:
    command = ["--outpost", "o", "--driver", "podman"]
    config = parse_args(
        [
            *command,
            "--driver-opt",
            "cpus=1.5",
            "--driver-opt",
            "init=no",
            "--driver-opt",
            "memory=none",
            "--driver-opt",
            "cap_add=net_raw, chown",
        ],
        ENV,
    )
    context = DriverContext(state_dir=tmp_path)
    driver: Any = driver_class("podman").from_options(context, config.driver_options)
    settings = driver.settings
    assert (settings.limits.cpus, settings.limits.memory, settings.limits.pids_limit) == (1.5, None, 4096)
    assert settings.init is False
    assert settings.cap_add == ("NET_RAW", "CHOWN")
    bad = parse_args([*command, "--driver-opt", "pids_limit=0"], ENV)
    with pytest.raises(DriverError, match=r"^podman driver option pids_limit must be positive, got '0'$"):
        driver_class("podman").from_options(context, bad.driver_options)


# --- the table itself ------------------------------------------------------------------------------------

TABLE = OptionTable(
    "demo",
    DriverOption("name", OptionKind.TEXT, "a name", required=True),
    DriverOption("size", OptionKind.INTEGER, "a size", default=4, above=0, lift="none"),
    DriverOption("ratio", OptionKind.NUMBER, "a ratio", default=0.5, minimum=0),
    DriverOption("labels", OptionKind.MAPPING, "labels", default={}),
    DriverOption("words", OptionKind.WORDS, "a command", default_doc="the context's"),
    DriverOption("where", OptionKind.FILE, "a file"),
)


KNOWN = "name, size, ratio, labels, words, where"


def read(**options: Any) -> dict[str, Any]:
    return TABLE.read({"name": "n", **options})


def test_the_table_reads_each_kind_from_text_or_its_own_type(tmp_path: Path) -> None:
    assert read() == {"name": "n", "size": 4, "ratio": 0.5, "labels": {}, "words": None, "where": None}
    assert read(size="8", ratio=2, labels='{"a": "b"}')["labels"] == {"a": "b"}
    assert read(size=" None ")["size"] is None
    assert read(words="python3 -m 'a b'")["words"] == ("python3", "-m", "a b")
    assert read(where=str(tmp_path))["where"] == tmp_path
    first, second = read(), read()
    assert first["labels"] is not second["labels"]  # a default is never shared between reads


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": ""}, "demo driver option name is required"),
        ({"size": "1.5"}, "demo driver option size must be a number, got '1.5'"),
        ({"size": 0}, "demo driver option size must be positive, got '0'"),
        ({"ratio": "-0.5"}, "demo driver option ratio must be at least 0, got '-0.5'"),
        ({"ratio": "nan"}, "demo driver option ratio must be a number, got 'nan'"),
        ({"labels": "x"}, "demo driver option labels must be a mapping (a JSON object as text)"),
        ({"labels": ["x"]}, "demo driver option labels must be a mapping, got list"),
        ({"words": "'open"}, "demo driver option words must be shell words: No closing quotation"),
        ({"name": ["x"]}, "demo driver option name must be text, got list"),
        ({"where": "/nonexistent/x"}, "demo driver option where: /nonexistent/x does not exist"),
        ({"zz": 1, "nme": "x"}, f"unknown demo driver option nme; known: {KNOWN}"),
    ],
)
def test_the_table_refuses_in_one_shape(options: dict[str, Any], message: str) -> None:
    with pytest.raises(DriverError) as caught:
        read(**options)
    assert str(caught.value) == message


def test_the_docs_table_shows_each_default() -> None:
    assert TABLE.markdown().splitlines() == [
        "| option | default | meaning |",
        "|---|---|---|",
        "| `name` | (required) | a name |",
        "| `size` | `4` | a size |",
        "| `ratio` | `0.5` | a ratio |",
        f"| `labels` | `{json.dumps({})}` | labels |",
        "| `words` | the context's | a command |",
        "| `where` | none | a file |",
    ]


def test_an_option_declared_twice_is_a_mistake() -> None:
    with pytest.raises(ValueError, match="declares an option twice"):
        OptionTable("demo", DriverOption("a", OptionKind.TEXT, "a"), DriverOption("a", OptionKind.FLAG, "b"))
