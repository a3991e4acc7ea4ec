"""``worker start`` options: one table gives the flags, the environment variables and the config.

Every option is declared once in :data:`OPTIONS`: its flag(s), its environment variable, how its text is
turned into a value (type, bounds, choices), its default and its help. :func:`add_start_arguments` builds
the argument parser from the table and :func:`build_config` resolves each option as *flag, then
environment variable, then default*, exactly like ``devin worker start`` (docs/fleet-api.md §7.1), into
a validated :class:`WorkerConfig`. The official CLI's flags and variables keep their names and defaults;
our additions use ``DEVIN_WORKER_*`` variables so a systemd environment file can set everything without
putting anything on the command line. A bad value raises :class:`ConfigError` (exit code 2) with one line
that names the flag.

python/devin-outposts/tests/test_worker_docs.py holds docs/worker.md to this table, and the role's environment
template is checked against the variables here.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts.api.client import DEFAULT_API_URL, normalize_api_url
from devin_outposts.core import platform
from devin_outposts.core.identity import IdentityError, validate_acceptor_id
from devin_outposts.core.tokenfile import (
    ENV_TOKEN,
    ENV_TOKEN_FD,
    ENV_TOKEN_FILE,
    TokenSourceError,
    token_from_source,
)

DEFAULT_CACHE_DIR = "~/.devin/worker/cache"
DEFAULT_STATIC_BASE_URL = "https://static.devin.ai/devin-rs/remote/"
SHA_RE = re.compile(r"[0-9a-f]{6,40}")

ENV_DIRECT_TOKEN = "DEVIN_REMOTE_SESSION_TOKEN"  # noqa: S105
ENV_GATEWAY = "DEVIN_OUTPOST_GATEWAY_URL"


class ConfigError(ValueError):
    """An option has an unusable value."""


@dataclass(frozen=True)
class MetricsAddr:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


# --- parsers: text -> value, or ConfigError naming the flag ------------------------------------------


def _number(
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


def _bool(name: str, raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        text = raw.strip().lower()
        if text not in choices:
            raise ConfigError(f"{name} must be {' or '.join(choices)}, got {raw!r}")
        return text

    return parse


def _url(*schemes: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        text = raw.strip()
        if not text.startswith(tuple(f"{scheme}://" for scheme in schemes)):
            allowed = " or ".join(f"{scheme}://" for scheme in schemes)
            raise ConfigError(f"{name} must start with {allowed}, got {raw!r}")
        return text

    return parse


def _api_url(name: str, raw: str) -> str:
    try:
        return normalize_api_url(raw)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _static_url(name: str, raw: str) -> str:
    text = _url("http", "https")(name, raw)
    return text if text.endswith("/") else text + "/"


def _path(name: str, raw: str) -> Path:
    r"""A state or cache directory: absolute; on Windows with a drive or share, ``\\?\`` when long."""
    try:
        return platform.current().config_path(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from exc


def _workdir(name: str, raw: str) -> Path:
    try:
        return platform.current().config_path(raw, state=False)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from exc


def validate_sha(value: str, source: str) -> str:
    text = value.strip().lower()
    if not SHA_RE.fullmatch(text):
        raise ConfigError(f"{source} must be a 6-40 character hex git SHA, got {value!r}")
    return text


def _sha(name: str, raw: str) -> str:
    return validate_sha(raw, name)


def _acceptor(name: str, raw: str) -> str:
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


def _stripped(name: str, raw: str) -> str:
    return raw.strip()


def _text(name: str, raw: str) -> str:
    return raw


#: The value parsers other option tables (the orchestrator's) build on.
number, boolean, choice, url, api_url, static_url, path, sha, acceptor, stripped, text = (
    _number, _bool, _choice, _url, _api_url, _static_url, _path, _sha, _acceptor, _stripped, _text
)


# --- the table -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One ``worker start`` option. ``name`` is its :class:`WorkerConfig` field."""

    name: str
    flags: tuple[str, ...]
    help: str
    group: str  # "official" (same as `devin worker start`), "ours" or "tuning"
    env: Optional[str] = None
    parse: Callable[[str, str], Any] = _text
    #: A switch: ``--flag`` / ``--no-flag`` (or only ``--flag`` when ``negatable`` is False).
    switch: bool = False
    negatable: bool = True
    choices: Optional[tuple[str, ...]] = None

    @property
    def flag(self) -> str:
        return self.flags[0]


_N = _number
OPTIONS: tuple[Option, ...] = (
    # Options of `devin worker start` (same names, variables and defaults).
    Option("outpost", ("--outpost",), "outpost to serve, by name or id", "official", parse=_stripped),
    Option("session_id", ("--session", "--session-id"), "claim and serve this one session, then exit",
           "official", parse=_stripped),
    Option("acceptor_id", ("--acceptor-id",), "stable worker identity (default: generated once and stored "
           "in the data directory)", "official", env="DEVIN_WORKER_ACCEPTOR_ID", parse=_acceptor),
    Option("token", ("--token",), f"API token. Prefer the {ENV_TOKEN} environment variable: argv is "
           "visible to every user of the machine.", "official", env=ENV_TOKEN),
    Option("once", ("--once",), "exit after one session", "official", switch=True, negatable=False),
    Option("api_url", ("--api-url",), f"Devin API base URL (default {DEFAULT_API_URL})", "official",
           env="DEVIN_API_URL", parse=_api_url),
    Option("cache_dir", ("--cache-dir",), f"devin-remote binary cache (default {DEFAULT_CACHE_DIR}); its "
           "parent is the worker data directory", "official", env="DEVIN_WORKER_CACHE_DIR", parse=_path),
    Option("static_base_url", ("--static-base-url",), f"where devin-remote is published (default "
           f"{DEFAULT_STATIC_BASE_URL})", "official", env="DEVIN_WORKER_STATIC_BASE_URL", parse=_static_url),
    Option("gateway_url", ("--gateway-url",), "gateway URL used when a claim carries none", "official",
           env=ENV_GATEWAY, parse=_url("ws", "wss", "http", "https")),
    Option("remote_binary_sha", ("--remote-binary-sha",), "devin-remote SHA when the session pins none "
           "(default latest)", "official", env="DEVIN_WORKER_REMOTE_SHA", parse=_sha),
    Option("pty_bridge_port", ("--pty-bridge-port",), "fixed PTY bridge port (default a free port per "
           "session)", "official", env="DEVIN_PTY_BRIDGE_PORT", parse=_N(int, 1, 65535)),
    Option("poll_interval", ("--poll-interval-secs",), "seconds between queue polls and session status "
           "checks (default 5)", "official", parse=_N(float, 0.05)),
    # Our additions.
    Option("max_sessions", ("--max-sessions",), "concurrent sessions, each in its own working directory "
           "(default 1)", "ours", env="DEVIN_WORKER_MAX_SESSIONS", parse=_N(int, 1)),
    Option("workdir", ("--workdir",), "sessions' working directory, repos under <workdir>/repos (default "
           "the current directory)", "ours", env="DEVIN_WORKER_WORKDIR", parse=_workdir),
    Option("watch", ("--watch",), "follow the queue with the SSE watch (default) or poll it (--no-watch)",
           "ours", env="DEVIN_WORKER_WATCH", parse=_bool, switch=True),
    Option("claim_spread", ("--claim-spread",), "spread the workers of an outpost over its oldest pending "
           "sessions instead of sending all of them at the oldest one (default; --no-claim-spread: "
           "strictly oldest first)", "ours", env="DEVIN_WORKER_CLAIM_SPREAD", parse=_bool, switch=True),
    Option("drain_timeout", ("--drain-timeout",), "seconds running sessions may finish after SIGTERM before "
           "they are stopped and released (default 30)", "ours", env="DEVIN_WORKER_DRAIN_TIMEOUT",
           parse=_N(float, 0)),
    Option("metrics_addr", ("--metrics-addr",), "serve /metrics and /healthz on HOST:PORT (default off)",
           "ours", env="DEVIN_WORKER_METRICS_ADDR", parse=lambda name, raw: parse_metrics_addr(raw)),
    Option("log_format", ("--log-format",), "log format (default text)", "ours",
           env="DEVIN_WORKER_LOG_FORMAT", parse=_choice("text", "json"), choices=("text", "json")),
    Option("log_level", ("--log-level",), "log level (default info)", "ours", env="DEVIN_WORKER_LOG_LEVEL",
           parse=_choice("debug", "info", "warning", "error"), choices=("debug", "info", "warning", "error")),
    # Tuning (the defaults suit production; tests shorten them).
    Option("restart_limit", ("--restart-limit",), "restarts of a failing devin-remote before giving up (5)",
           "tuning", parse=_N(int, 0)),
    Option("stop_grace", ("--stop-grace-secs",), "seconds between SIGTERM and SIGKILL (10)", "tuning",
           parse=_N(float, 0)),
    Option("renew_margin", ("--renew-margin-secs",), "renew a claim at least this long before it expires "
           "(60)", "tuning", parse=_N(float, 0)),
    Option("confirm_reads", ("--confirm-reads",), "status reads after devin-remote exits 0 (5)", "tuning",
           parse=_N(int, 1)),
    Option("confirm_interval", ("--confirm-interval-secs",), "seconds between those reads (1)", "tuning",
           parse=_N(float, 0)),
    Option("backoff_max", ("--backoff-max-secs",), "longest retry backoff (60)", "tuning",
           parse=_N(float, 0.01)),
)
#: Read from the environment only (no flag): direct-serve mode and what sessions are given.
ENV_ONLY: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "direct_token": (ENV_DIRECT_TOKEN, _text),
    "chrome_path": ("DEVIN_CHROME_PATH", _text),
    "desktop": ("DEVIN_OUTPOST_DESKTOP", _text),
}
_GROUPS = {
    "official": "options of `devin worker start`",
    "ours": "devin-outposts additions",
    "tuning": "tuning (defaults suit production)",
}


@dataclass(frozen=True)
class WorkerConfig:
    """Everything ``worker start`` needs, validated. Secrets are excluded from ``repr``."""

    api_url: str = DEFAULT_API_URL
    token: Optional[str] = field(default=None, repr=False)
    outpost: Optional[str] = None
    session_id: Optional[str] = None
    acceptor_id: Optional[str] = None
    once: bool = False
    cache_dir: Path = field(default_factory=lambda: Path(DEFAULT_CACHE_DIR).expanduser())
    static_base_url: str = DEFAULT_STATIC_BASE_URL
    gateway_url: Optional[str] = None
    remote_binary_sha: Optional[str] = None
    pty_bridge_port: Optional[int] = None
    poll_interval: float = 5.0
    max_sessions: int = 1
    workdir: Path = field(default_factory=Path.cwd)
    watch: bool = True
    #: Spread claims over the oldest pending rows by rendezvous hashing (``--no-claim-spread``: strictly
    #: the oldest row first, as every worker did before; kept for comparison and as an escape hatch).
    claim_spread: bool = True
    drain_timeout: float = 30.0
    metrics_addr: Optional[MetricsAddr] = None
    log_format: str = "text"
    log_level: str = "info"
    restart_limit: int = 5
    stop_grace: float = 10.0
    renew_margin: float = 60.0
    confirm_reads: int = 5
    confirm_interval: float = 1.0
    backoff_max: float = 60.0
    #: Direct-serve mode: the pre-claimed connect token from ``DEVIN_REMOTE_SESSION_TOKEN``.
    direct_token: Optional[str] = field(default=None, repr=False)
    chrome_path: Optional[str] = None
    desktop: Optional[str] = None

    @property
    def data_dir(self) -> Path:
        """The worker data directory: the cache dir's parent (docs/fleet-api.md §7.3)."""
        return self.cache_dir.parent

    @property
    def sessions_dir(self) -> Path:
        return self.data_dir / "sessions"

    @property
    def direct(self) -> bool:
        return self.direct_token is not None

    def slot_dir(self, slot: int) -> Path:
        """The working directory of slot ``slot``: the workdir itself with one slot, else ``slot-<n>``."""
        if self.max_sessions == 1:
            return self.workdir
        return self.workdir / f"slot-{slot}"


def add_start_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``worker start`` flags, from :data:`OPTIONS`. Every default is ``None``, so that
    :func:`build_config` can tell "not given" from a value and fall back to the environment."""
    add_table_arguments(parser, OPTIONS, _GROUPS)


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


def build_config(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> WorkerConfig:
    """Resolve flags, environment and defaults into a validated :class:`WorkerConfig`."""
    env = os.environ if environ is None else environ
    values = resolve_table(OPTIONS, args, env)
    for name, (variable, parse) in ENV_ONLY.items():
        text = env.get(variable)
        if text:
            values[name] = parse(variable, text)
    if getattr(args, "token", None) is None and not values.get("direct_token"):
        # Not in direct-serve mode, which needs no account token: never read a descriptor it was not for.
        try:
            from_source = token_from_source(env)
        except TokenSourceError as exc:
            raise ConfigError(str(exc)) from None
        if from_source is not None:
            values["token"] = from_source
    config = WorkerConfig(**values)
    _check_modes(config)
    return config


def _check_modes(config: WorkerConfig) -> None:
    if config.session_id is not None and not config.session_id:
        raise ConfigError("--session cannot be empty")
    if config.direct:
        if not config.session_id:
            raise ConfigError(f"{ENV_DIRECT_TOKEN} is set (direct-serve mode): --session is required")
        if not config.gateway_url:
            raise ConfigError(f"{ENV_DIRECT_TOKEN} is set (direct-serve mode): {ENV_GATEWAY} is required")
    elif not config.token:
        raise ConfigError(
            f"no API token: set {ENV_TOKEN}, {ENV_TOKEN_FD} or {ENV_TOKEN_FILE} (a service-user token with "
            "the account.outposts.machine scope)"
        )
    if config.max_sessions > 1 and config.pty_bridge_port is not None:
        raise ConfigError("--pty-bridge-port gives every session the same port: use it with --max-sessions 1")
    if config.max_sessions > 1 and (config.session_id or config.once):
        raise ConfigError("--max-sessions cannot be combined with --session or --once (one session only)")


def parse_start_args(argv: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> WorkerConfig:
    """Parse ``worker start`` arguments (for tests and embedding)."""
    parser = argparse.ArgumentParser(prog="devin-outposts worker start")
    add_start_arguments(parser)
    return build_config(parser.parse_args(list(argv)), environ)


def _check_table() -> None:
    """Every option is a config field, and every config field comes from the table (import-time guard)."""
    declared = {option.name for option in OPTIONS} | set(ENV_ONLY)
    config_fields = {item.name for item in fields(WorkerConfig)}
    if declared != config_fields:
        raise RuntimeError(f"options and WorkerConfig differ: {sorted(declared ^ config_fields)}")


_check_table()
