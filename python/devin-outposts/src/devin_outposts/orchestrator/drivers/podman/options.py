"""The podman driver's options: what a session container may use, and how podman is run.

One table (:data:`OPTIONS`) declares them; every option is checked when the driver is made
(:meth:`Settings.from_options`), so a bad configuration fails at start-up with one line naming the driver
and the option (docs/orchestrator-podman.md, "Options", is the same table).

A session container gets limits by default (:data:`DEFAULT_LIMITS`: 2 CPUs, 4 GiB of memory, 4096
processes); each can be set, or lifted with ``none``. It never gets a capability unless ``cap_add`` names
it: the worker and what a session runs need none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from devin_outposts.orchestrator.drivers.base import (
    DriverOption,
    OptionKind,
    OptionProblem,
    OptionTable,
)

DEFAULT_IMAGE = "localhost/devin-outposts-session:latest"
#: Network modes podman knows by name; anything else must be an existing podman network.
BUILTIN_NETWORKS = ("bridge", "host", "none", "private", "slirp4netns", "pasta")
MEMORY = re.compile(r"[0-9]+(\.[0-9]+)?\s*([kmgt]i?b?|b)?", re.IGNORECASE)
CAPABILITY = re.compile(r"(CAP_)?[A-Z][A-Z_]*")
#: The value that lifts a limit.
NO_LIMIT = "none"


@dataclass(frozen=True)
class Limits:
    """What one session container may use; ``None``: podman's own default (none for CPU and memory)."""

    cpus: Optional[float] = None
    memory: Optional[str] = None
    pids_limit: Optional[int] = None

    def arguments(self) -> list[str]:
        args: list[str] = []
        if self.cpus is not None:
            args += ["--cpus", f"{self.cpus:g}"]
        if self.memory is not None:
            args += ["--memory", self.memory]
        if self.pids_limit is not None:
            args += ["--pids-limit", str(self.pids_limit)]
        return args


#: The limits of a session container when the options set none.
DEFAULT_LIMITS = Limits(cpus=2.0, memory="4g", pids_limit=4096)


def _memory(size: str) -> str:
    if not MEMORY.fullmatch(size):
        raise OptionProblem(f"must be a size such as 2g or 512m, or none, got {size!r}")
    return size


def _capabilities(names: tuple[str, ...]) -> tuple[str, ...]:
    """Capability names, upper-cased; ``ALL`` is refused (every container starts from none)."""
    upper = tuple(name.upper() for name in names)
    for name in upper:
        if not CAPABILITY.fullmatch(name) or name in ("ALL", "CAP_ALL"):
            raise OptionProblem(f"names no single capability: {name!r}")
    return upper


OPTIONS = OptionTable(
    "podman",
    DriverOption(
        "image",
        OptionKind.TEXT,
        'the session image (see "The image"); `check()` fails when podman does not have it',
        default=DEFAULT_IMAGE,
    ),
    DriverOption(
        "network",
        OptionKind.TEXT,
        "`--network` of every container: `host`, `none`, `bridge`, `slirp4netns`, `pasta`, or the name of an "
        "existing podman network (checked at start-up). Sessions must reach the gateway (`wss://...`) and "
        "the `devin-remote` distribution",
        default_doc="podman's default",
    ),
    DriverOption(
        "cpus",
        OptionKind.NUMBER,
        "`--cpus` (a positive number; `1.5` → `HostConfig.NanoCpus` 1500000000); `none`: no limit",
        default=DEFAULT_LIMITS.cpus,
        above=0,
        lift=NO_LIMIT,
    ),
    DriverOption(
        "memory",
        OptionKind.TEXT,
        "`--memory` (`512m`, `2g`, bytes); `none`: no limit",
        default=DEFAULT_LIMITS.memory,
        lift=NO_LIMIT,
        parse=_memory,
    ),
    DriverOption(
        "pids_limit",
        OptionKind.INTEGER,
        "`--pids-limit` (a positive integer); `none`: podman's own (2048)",
        default=DEFAULT_LIMITS.pids_limit,
        above=0,
        lift=NO_LIMIT,
    ),
    DriverOption(
        "cap_add",
        OptionKind.NAMES,
        "capabilities given back (`--cap-add`; a list, or names separated by commas or spaces, e.g. "
        "`NET_RAW`). Every container starts from `--cap-drop ALL`",
        default=(),
        parse=_capabilities,
    ),
    DriverOption("user", OptionKind.TEXT, "`--user`", default_doc="the image's (`devin`, uid 1000)"),
    DriverOption("init", OptionKind.FLAG, "`--init` (needs catatonit on the host)", default=True),
    DriverOption(
        "worker_command",
        OptionKind.WORDS,
        'the command, after our `/bin/sh` entrypoint (see "The worker\'s environment"), before '
        "`worker start --session=<id>` (shell words)",
        default_doc="`devin-outposts`",
    ),
    DriverOption("podman", OptionKind.TEXT, "the podman executable", default="podman"),
    DriverOption(
        "stop_grace",
        OptionKind.SECONDS,
        "seconds between SIGTERM and SIGKILL when a worker is stopped (`--stop-timeout`, `rm --time`)",
        default=10.0,
        above=0,
    ),
    DriverOption(
        "command_timeout",
        OptionKind.SECONDS,
        "seconds any one podman command may take; a step the orchestrator cancels kills its podman call",
        default=120.0,
        above=0,
    ),
    DriverOption(
        "reconcile_interval",
        OptionKind.SECONDS,
        "seconds between two listings (`podman ps --all`) that correct the status watch (`--machine-status "
        'watch`: one `podman events` child; see "Machine status")',
        default=30.0,
        above=0,
    ),
)


@dataclass(frozen=True)
class Settings:
    """The driver's options, read by :data:`OPTIONS`."""

    image: str = DEFAULT_IMAGE
    network: Optional[str] = None
    limits: Limits = DEFAULT_LIMITS
    cap_add: tuple[str, ...] = ()
    user: Optional[str] = None
    init: bool = True
    worker_command: tuple[str, ...] = ("devin-outposts",)
    podman: str = "podman"
    stop_grace: float = 10.0
    command_timeout: float = 120.0
    reconcile_interval: float = 30.0

    @classmethod
    def from_options(cls, options: Mapping[str, Any], worker_command: Sequence[str]) -> Settings:
        values = OPTIONS.read(options)
        command = values["worker_command"] or tuple(worker_command)
        if not command:
            raise OPTIONS.error("worker_command", "is empty")
        pids = values["pids_limit"]
        return cls(
            image=values["image"],
            network=values["network"],
            limits=Limits(cpus=values["cpus"], memory=values["memory"], pids_limit=pids),
            cap_add=values["cap_add"],
            user=values["user"],
            init=values["init"],
            worker_command=command,
            podman=values["podman"],
            stop_grace=values["stop_grace"],
            command_timeout=values["command_timeout"],
            reconcile_interval=values["reconcile_interval"],
        )
