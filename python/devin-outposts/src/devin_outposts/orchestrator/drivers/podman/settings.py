"""The podman driver's options: what a session container may use, and how podman is run.

Every option is checked when the driver is made (:meth:`Settings.from_options`), so a bad configuration
fails at start-up with one line naming the option (docs/orchestrator-podman.md, "Options").

A session container gets limits by default (:data:`DEFAULT_LIMITS`: 2 CPUs, 4 GiB of memory, 4096
processes); each can be set, or lifted with ``none``. It never gets a capability unless ``cap_add`` names
it: the worker and what a session runs need none.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from devin_outposts.orchestrator.drivers.base import DriverError, option_text

DEFAULT_IMAGE = "localhost/devin-outposts-session:latest"
OPTIONS = (
    "image",
    "network",
    "cpus",
    "memory",
    "pids_limit",
    "cap_add",
    "user",
    "init",
    "worker_command",
    "podman",
    "stop_grace",
    "command_timeout",
)
#: Network modes podman knows by name; anything else must be an existing podman network.
BUILTIN_NETWORKS = ("bridge", "host", "none", "private", "slirp4netns", "pasta")
MEMORY = re.compile(r"[0-9]+(\.[0-9]+)?\s*([kmgt]i?b?|b)?", re.IGNORECASE)
CAPABILITY = re.compile(r"(CAP_)?[A-Z][A-Z_]*")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
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


def option_number(options: Mapping[str, Any], key: str, kind: type[float] | type[int]) -> Optional[float]:
    text = option_text(options, key)
    if text is None:
        return None
    try:
        value = kind(text)
    except ValueError:
        raise DriverError(f"podman driver option {key} must be a number, got {text!r}") from None
    if value <= 0:
        raise DriverError(f"podman driver option {key} must be positive, got {text!r}")
    return value


def option_bool(options: Mapping[str, Any], key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise DriverError(f"podman driver option {key} must be true or false, got {value!r}")


def _lifted(options: Mapping[str, Any], key: str) -> bool:
    return str(options.get(key, "")).strip().lower() == NO_LIMIT


def limits_from(options: Mapping[str, Any]) -> Limits:
    """The limits: each option's value, :data:`DEFAULT_LIMITS` where it is not set, none where it is
    ``none``."""
    memory: Optional[str] = DEFAULT_LIMITS.memory
    if _lifted(options, "memory"):
        memory = None
    elif option_text(options, "memory") is not None:
        memory = str(option_text(options, "memory")).strip()
        if not MEMORY.fullmatch(memory):
            raise DriverError(
                f"podman driver option memory must be a size such as 2g or 512m, or none, got {memory!r}"
            )
    cpus: Optional[float] = DEFAULT_LIMITS.cpus
    if _lifted(options, "cpus"):
        cpus = None
    elif option_text(options, "cpus") is not None:
        cpus = option_number(options, "cpus", float)
    pids: Optional[int] = DEFAULT_LIMITS.pids_limit
    if _lifted(options, "pids_limit"):
        pids = None
    elif option_text(options, "pids_limit") is not None:
        number = option_number(options, "pids_limit", int)
        pids = int(number) if number is not None else None
    return Limits(cpus=cpus, memory=memory, pids_limit=pids)


def capabilities_from(options: Mapping[str, Any]) -> tuple[str, ...]:
    """``cap_add``: capability names (a list, or text split on commas and spaces), upper-cased."""
    value = options.get("cap_add")
    if value is None:
        return ()
    items = value if isinstance(value, (list, tuple)) else re.split(r"[\s,]+", str(value))
    names = tuple(str(item).strip().upper() for item in items if str(item).strip())
    for name in names:
        if not CAPABILITY.fullmatch(name) or name in ("ALL", "CAP_ALL"):
            raise DriverError(f"podman driver option cap_add names no single capability: {name!r}")
    return names


@dataclass(frozen=True)
class Settings:
    """The driver's options, checked."""

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

    @classmethod
    def from_options(cls, options: Mapping[str, Any], worker_command: Sequence[str]) -> Settings:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise DriverError(f"unknown podman driver option {unknown[0]}; known: {', '.join(OPTIONS)}")
        command_text = option_text(options, "worker_command")
        command = tuple(shlex.split(command_text)) if command_text else tuple(worker_command)
        if not command:
            raise DriverError("podman driver option worker_command is empty")
        return cls(
            image=option_text(options, "image", DEFAULT_IMAGE) or DEFAULT_IMAGE,
            network=option_text(options, "network"),
            limits=limits_from(options),
            cap_add=capabilities_from(options),
            user=option_text(options, "user"),
            init=option_bool(options, "init", True),
            worker_command=command,
            podman=option_text(options, "podman", "podman") or "podman",
            stop_grace=option_number(options, "stop_grace", float) or 10.0,
            command_timeout=option_number(options, "command_timeout", float) or 120.0,
        )
