"""The option-table machinery both programs use, and the rows ``worker start`` and ``orchestrate`` share.

An option is declared once, as an :class:`Option` row: its flag(s), its environment variable, how its text
becomes a value (one of the parsers here: type, bounds, choices), its help and its group in ``--help``. A
program's table of rows gives its argument parser (:func:`add_table_arguments`) and its values, resolved
as *flag, then environment variable, then default* (:func:`resolve_table`); a bad value raises
:class:`ConfigError` (exit code 2) with one line that names the flag. The defaults are the programs' config
dataclasses' (``WorkerConfig``, ``OrchestratorConfig``).

:func:`shared_option` gives the rows both programs declare the same way (:data:`SHARED_OPTIONS`): the same
flag, parser and help, in each program's own group and, where the variable is per program, with its own
prefix (``DEVIN_WORKER_WATCH``, ``DEVIN_ORCHESTRATOR_WATCH``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts.api.client import DEFAULT_API_URL, normalize_api_url
from devin_outposts.core import platform
from devin_outposts.core.identity import IdentityError, validate_acceptor_id

SHA_RE = re.compile(r"[0-9a-f]{6,40}")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """An option has an unusable value."""


@dataclass(frozen=True)
class MetricsAddr:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


# --- parsers: text -> value, or ConfigError naming the flag ------------------------------------------


def number(
    kind: type, minimum: float, maximum: Optional[float] = None
) -> Callable[[str, str], Any]:
    def parse(name: str, raw: str) -> Any:
        try:
            value = kind(raw)
        except ValueError as exc:
            what = "an integer" if kind is int else "a number"
            raise ConfigError(f"{name} must be {what}, got {raw!r}") from exc
        if math.isnan(value) or value < minimum or (maximum is not None and value > maximum):
            bound = f"between {minimum:g} and {maximum:g}" if maximum is not None else f"at least {minimum:g}"
            raise ConfigError(f"{name} must be {bound}, got {raw!r}")
        return value

    return parse


def boolean(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        text = raw.strip().lower()
        if text not in choices:
            raise ConfigError(f"{name} must be {' or '.join(choices)}, got {raw!r}")
        return text

    return parse


def url(*schemes: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        text = raw.strip()
        if not text.startswith(tuple(f"{scheme}://" for scheme in schemes)):
            allowed = " or ".join(f"{scheme}://" for scheme in schemes)
            raise ConfigError(f"{name} must start with {allowed}, got {raw!r}")
        return text

    return parse


def api_url(name: str, raw: str) -> str:
    try:
        return normalize_api_url(raw)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def static_url(name: str, raw: str) -> str:
    text = url("http", "https")(name, raw)
    return text if text.endswith("/") else text + "/"


def path(name: str, raw: str) -> Path:
    r"""A state or cache directory: absolute; on Windows with a drive or share, ``\\?\`` when long."""
    try:
        return platform.current().config_path(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from exc


def workdir(name: str, raw: str) -> Path:
    try:
        return platform.current().config_path(raw, state=False)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from exc


def validate_sha(value: str, source: str) -> str:
    text = value.strip().lower()
    if not SHA_RE.fullmatch(text):
        raise ConfigError(f"{source} must be a 6-40 character hex git SHA, got {value!r}")
    return text


def sha(name: str, raw: str) -> str:
    return validate_sha(raw, name)


def acceptor(name: str, raw: str) -> str:
    try:
        return validate_acceptor_id(raw)
    except IdentityError as exc:
        raise ConfigError(str(exc)) from exc


def parse_metrics_addr(raw: str) -> MetricsAddr:
    host, sep, port_text = raw.strip().rpartition(":")
    if not sep:
        host, port_text = "", raw.strip()
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - ":8080" means every interface, like the operator
    try:
        port = int(port_text)
    except ValueError as exc:
        raise ConfigError(f"--metrics-addr must be HOST:PORT, got {raw!r}") from exc
    if not 0 <= port <= 65535:
        raise ConfigError(f"--metrics-addr port must be 0-65535, got {raw!r}")
    return MetricsAddr(host, port)


def stripped(name: str, raw: str) -> str:
    return raw.strip()


def text(name: str, raw: str) -> str:
    return raw


# --- rows -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One option of a program. ``name`` is its config field."""

    name: str
    flags: tuple[str, ...]
    help: str
    group: str  # the section of ``--help`` it is listed in (the program's table names them)
    env: Optional[str] = None
    parse: Callable[[str, str], Any] = text
    #: A switch: ``--flag`` / ``--no-flag`` (or only ``--flag`` when ``negatable`` is False).
    switch: bool = False
    negatable: bool = True
    choices: Optional[tuple[str, ...]] = None

    @property
    def flag(self) -> str:
        return self.flags[0]

    def of(self, group: str, *, env_prefix: Optional[str] = None) -> Option:
        """This row in ``group``; a per-program variable (``{prefix}_WATCH``) gets ``env_prefix``."""
        env = self.env
        if env is not None and env_prefix is not None:
            env = env.format(prefix=env_prefix)
        return dataclasses.replace(self, group=group, env=env)


#: The rows both programs declare the same way. ``{prefix}`` in a variable is the program's
#: (``DEVIN_WORKER``, ``DEVIN_ORCHESTRATOR``); the group is set by :func:`shared_option`.
SHARED_OPTIONS: dict[str, Option] = {
    row.name: row
    for row in (
        Option("api_url", ("--api-url",), f"Devin API base URL (default {DEFAULT_API_URL})", "",
               env="DEVIN_API_URL", parse=api_url),
        Option("watch", ("--watch",), "follow the queue with the SSE watch (default) or poll it (--no-watch)",
               "", env="{prefix}_WATCH", parse=boolean, switch=True),
        Option("metrics_addr", ("--metrics-addr",), "serve /metrics and /healthz on HOST:PORT (default off)",
               "", env="{prefix}_METRICS_ADDR", parse=lambda name, raw: parse_metrics_addr(raw)),
        Option("log_format", ("--log-format",), "log format (default text)", "", env="{prefix}_LOG_FORMAT",
               parse=choice("text", "json"), choices=("text", "json")),
        Option("log_level", ("--log-level",), "log level (default info)", "", env="{prefix}_LOG_LEVEL",
               parse=choice(*LOG_LEVELS), choices=LOG_LEVELS),
        Option("renew_margin", ("--renew-margin-secs",), "renew a claim at least this long before it expires "
               "(60)", "", parse=number(float, 0)),
        Option("confirm_interval", ("--confirm-interval-secs",), "seconds between those reads (1)", "",
               parse=number(float, 0)),
        Option("backoff_max", ("--backoff-max-secs",), "longest retry backoff (60)", "",
               parse=number(float, 0.01)),
    )
}  # fmt: skip


def shared_option(name: str, group: str, env_prefix: str) -> Option:
    """The shared row ``name`` (:data:`SHARED_OPTIONS`) as a program declares it: in its ``group``, with
    its variable prefix."""
    return SHARED_OPTIONS[name].of(group, env_prefix=env_prefix)


# --- tables ----------------------------------------------------------------------------------------------


def _raw(option: Option, args: argparse.Namespace, environ: Mapping[str, str]) -> Optional[Any]:
    """The flag's value, else the environment variable's (blank counts as unset), else None."""
    value = getattr(args, option.name, None)
    if value is not None:
        return value
    if option.env is not None:
        text = environ.get(option.env)
        if text is not None and text.strip() != "":
            return text
    return None


def add_table_arguments(
    parser: argparse.ArgumentParser, table: Sequence[Option], groups: Mapping[str, str]
) -> None:
    """Flags from an option table. Every default is ``None``, so that :func:`resolve_table` can tell
    "not given" from a value and fall back to the environment."""
    sections = {key: parser.add_argument_group(title) for key, title in groups.items()}
    for option in table:
        help_text = f"{option.help} (env {option.env})" if option.env else option.help
        kwargs: dict[str, Any] = {"dest": option.name, "default": None, "help": help_text}
        if option.switch:
            kwargs["action"] = argparse.BooleanOptionalAction if option.negatable else "store_true"
        elif option.choices:
            kwargs["choices"] = option.choices
        sections[option.group].add_argument(*option.flags, **kwargs)


def resolve_table(
    table: Sequence[Option], args: argparse.Namespace, env: Mapping[str, str]
) -> dict[str, Any]:
    """Each option of ``table`` given as a flag or in the environment, parsed (flag first)."""
    values: dict[str, Any] = {}
    for option in table:
        raw = _raw(option, args, env)
        if raw is None:
            continue
        if isinstance(raw, bool):  # a switch given on the command line
            values[option.name] = raw
        else:
            values[option.name] = option.parse(option.flag, str(raw))
    return values
