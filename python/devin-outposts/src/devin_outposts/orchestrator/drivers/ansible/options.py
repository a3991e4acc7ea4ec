"""The ``ansible`` driver's options: one table (:data:`OPTIONS`), checked before any claim.

Beyond how each value is read (:class:`~..base.DriverOption`), two checks are the driver's own: ``env``
may not hand a run a credential (the connect token reaches a host only through its 0600 file), and
``machine_prefix`` must start a DNS label.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from devin_outposts.orchestrator.drivers.ansible._run import FORBIDDEN_ENV
from devin_outposts.orchestrator.drivers.base import DriverOption, OptionKind, OptionProblem, OptionTable

#: The collection's start playbook (run by its FQCN: the collection must be on ANSIBLE_COLLECTIONS_PATH).
START_PLAYBOOK = "devin.outposts.orchestrator_session"
#: The seconds each kind of run may take, by option.
TIMEOUTS = ("provision_timeout", "start_timeout", "status_timeout", "teardown_timeout")
MACHINE_PREFIX = re.compile(r"[a-z][a-z0-9-]{0,19}")


def _environment(env: Mapping[Any, Any]) -> dict[str, str]:
    if not all(isinstance(name, str) for name in env):
        raise OptionProblem("must be a mapping of names to text")
    for name in env:
        if name in FORBIDDEN_ENV:
            raise OptionProblem(f"may not set {name}: no credential but the session's reaches a run")
    return {name: str(value) for name, value in env.items()}


def _machine_prefix(prefix: str) -> str:
    if not MACHINE_PREFIX.fullmatch(prefix):
        raise OptionProblem(f"must be 1-20 of [a-z0-9-], starting with a letter: {prefix!r}")
    return prefix


OPTIONS = OptionTable(
    "ansible",
    DriverOption("provision_playbook", OptionKind.FILE, "path of your provision playbook", required=True),
    DriverOption("teardown_playbook", OptionKind.FILE, "path of your teardown playbook", required=True),
    DriverOption(
        "start_playbook",
        OptionKind.TEXT,
        "the start playbook (a path or a collection playbook's FQCN)",
        default=START_PLAYBOOK,
    ),
    DriverOption(
        "inventory",
        OptionKind.FILE,
        "inventory of the provision and teardown runs (a file, directory or script)",
        default_doc="none (implicit localhost)",
    ),
    DriverOption(
        "extra_vars_file",
        OptionKind.FILE,
        "a YAML/JSON file of variables for every run (`-e @file`, before the session's variables)",
    ),
    DriverOption(
        "artifact_dir",
        OptionKind.PATH,
        "where each run's artifacts go, per machine",
        default_doc="`<state_dir>/ansible/artifacts`",
    ),
    DriverOption(
        "keep_artifacts",
        OptionKind.FLAG,
        "keep a machine's artifacts after its teardown (they are removed by default)",
        default=False,
    ),
    DriverOption(
        "env",
        OptionKind.MAPPING,
        'extra environment of every run (a mapping; see "The connect token")',
        default={},
        parse=_environment,
    ),
    DriverOption(
        "machine_prefix",
        OptionKind.TEXT,
        "first part of `devin_outposts_machine_name` (`[a-z][a-z0-9-]{0,19}`)",
        default="devin",
        parse=_machine_prefix,
    ),
    DriverOption(
        "machine_name_length",
        OptionKind.INTEGER,
        "the most characters of `devin_outposts_machine_name`",
        default=63,
        minimum=0,
    ),
    DriverOption(
        "provision_timeout",
        OptionKind.SECONDS,
        "seconds for the provision run",
        default_doc="the orchestrator's boot timeout (300 s)",
        above=0,
    ),
    DriverOption(
        "start_timeout",
        OptionKind.SECONDS,
        "seconds for the start run (the first one installs the worker)",
        default=600.0,
        above=0,
    ),
    DriverOption("status_timeout", OptionKind.SECONDS, "seconds for a status read", default=60.0, above=0),
    DriverOption(
        "status_interval",
        OptionKind.SECONDS,
        'seconds between two reads of every machine\'s session unit, all in one ad-hoc run (see "Status")',
        default=30.0,
        above=0,
    ),
    DriverOption(
        "teardown_timeout", OptionKind.SECONDS, "seconds for the teardown run", default=600.0, above=0
    ),
)
