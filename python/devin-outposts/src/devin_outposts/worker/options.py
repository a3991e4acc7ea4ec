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
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts.api.client import DEFAULT_API_URL
from devin_outposts.core.config import (
    ConfigError,
    MetricsAddr,
    Option,
    acceptor,
    add_table_arguments,
    boolean,
    number,
    path,
    resolve_table,
    sha,
    shared_option,
    static_url,
    stripped,
    text,
    url,
    workdir,
)
from devin_outposts.core.tokenfile import (
    ENV_TOKEN,
    ENV_TOKEN_FD,
    ENV_TOKEN_FILE,
    TokenSourceError,
    token_from_source,
)

DEFAULT_CACHE_DIR = "~/.devin/worker/cache"
DEFAULT_STATIC_BASE_URL = "https://static.devin.ai/devin-rs/remote/"

ENV_DIRECT_TOKEN = "DEVIN_REMOTE_SESSION_TOKEN"  # noqa: S105
ENV_GATEWAY = "DEVIN_OUTPOST_GATEWAY_URL"
#: Our variables' prefix (the shared rows' ``{prefix}``).
ENV_PREFIX = "DEVIN_WORKER"


_N = number
OPTIONS: tuple[Option, ...] = (
    # Options of `devin worker start` (same names, variables and defaults).
    Option("outpost", ("--outpost",), "outpost to serve, by name or id", "official", parse=stripped),
    Option("session_id", ("--session", "--session-id"), "claim and serve this one session, then exit",
           "official", parse=stripped),
    Option("acceptor_id", ("--acceptor-id",), "stable worker identity (default: generated once and stored "
           "in the data directory)", "official", env="DEVIN_WORKER_ACCEPTOR_ID", parse=acceptor),
    Option("token", ("--token",), f"API token. Prefer the {ENV_TOKEN} environment variable: argv is "
           "visible to every user of the machine.", "official", env=ENV_TOKEN),
    Option("once", ("--once",), "exit after one session", "official", switch=True, negatable=False),
    shared_option("api_url", "official", ENV_PREFIX),
    Option("cache_dir", ("--cache-dir",), f"devin-remote binary cache (default {DEFAULT_CACHE_DIR}); its "
           "parent is the worker data directory", "official", env="DEVIN_WORKER_CACHE_DIR", parse=path),
    Option("static_base_url", ("--static-base-url",), f"where devin-remote is published (default "
           f"{DEFAULT_STATIC_BASE_URL})", "official", env="DEVIN_WORKER_STATIC_BASE_URL", parse=static_url),
    Option("gateway_url", ("--gateway-url",), "gateway URL used when a claim carries none", "official",
           env=ENV_GATEWAY, parse=url("ws", "wss", "http", "https")),
    Option("remote_binary_sha", ("--remote-binary-sha",), "devin-remote SHA when the session pins none "
           "(default latest)", "official", env="DEVIN_WORKER_REMOTE_SHA", parse=sha),
    Option("pty_bridge_port", ("--pty-bridge-port",), "fixed PTY bridge port (default a free port per "
           "session)", "official", env="DEVIN_PTY_BRIDGE_PORT", parse=_N(int, 1, 65535)),
    Option("poll_interval", ("--poll-interval-secs",), "seconds between queue polls and session status "
           "checks (default 5)", "official", parse=_N(float, 0.05)),
    # Our additions.
    Option("max_sessions", ("--max-sessions",), "concurrent sessions, each in its own working directory "
           "(default 1)", "ours", env="DEVIN_WORKER_MAX_SESSIONS", parse=_N(int, 1)),
    Option("workdir", ("--workdir",), "sessions' working directory, repos under <workdir>/repos (default "
           "the current directory)", "ours", env="DEVIN_WORKER_WORKDIR", parse=workdir),
    shared_option("watch", "ours", ENV_PREFIX),
    Option("claim_spread", ("--claim-spread",), "spread the workers of an outpost over its oldest pending "
           "sessions instead of sending all of them at the oldest one (default; --no-claim-spread: "
           "strictly oldest first)", "ours", env="DEVIN_WORKER_CLAIM_SPREAD", parse=boolean, switch=True),
    Option("drain_timeout", ("--drain-timeout",), "seconds running sessions may finish after SIGTERM before "
           "they are stopped and released (default 30)", "ours", env="DEVIN_WORKER_DRAIN_TIMEOUT",
           parse=_N(float, 0)),
    shared_option("metrics_addr", "ours", ENV_PREFIX),
    shared_option("log_format", "ours", ENV_PREFIX),
    shared_option("log_level", "ours", ENV_PREFIX),
    # Tuning (the defaults suit production; tests shorten them).
    Option("restart_limit", ("--restart-limit",), "restarts of a failing devin-remote before giving up (5)",
           "tuning", parse=_N(int, 0)),
    Option("stop_grace", ("--stop-grace-secs",), "seconds between SIGTERM and SIGKILL (10)", "tuning",
           parse=_N(float, 0)),
    shared_option("renew_margin", "tuning", ENV_PREFIX),
    Option("confirm_reads", ("--confirm-reads",), "status reads after devin-remote exits 0 (5)", "tuning",
           parse=_N(int, 1)),
    shared_option("confirm_interval", "tuning", ENV_PREFIX),
    shared_option("backoff_max", "tuning", ENV_PREFIX),
)
#: Read from the environment only (no flag): direct-serve mode and what sessions are given.
ENV_ONLY: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "direct_token": (ENV_DIRECT_TOKEN, text),
    "chrome_path": ("DEVIN_CHROME_PATH", text),
    "desktop": ("DEVIN_OUTPOST_DESKTOP", text),
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
