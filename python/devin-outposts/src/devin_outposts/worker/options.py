"""``worker start`` options: one table gives the flags, the environment variables and the config.

Every option is declared once in :data:`OPTIONS`: its flag(s), its environment variable, how its text is
turned into a value (type, bounds, choices), its default and its help. The rows the orchestrator has too
(``--outpost``, ``--acceptor-id``, the token, the API URL, the tuning, ...) are declared in
:data:`devin_outposts.core.config.SHARED_OPTIONS` and only placed here. :func:`add_start_arguments` builds
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
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from devin_outposts.core.config import (
    DEFAULT_CACHE_DIR,
    ConfigError,
    MetricsAddr,
    Option,
    Program,
    add_table_arguments,
    boolean,
    check_table,
    choice,
    number,
    resolve_table,
    shared_option,
    stripped,
    table_defaults,
    url,
    workdir,
)
from devin_outposts.core.netpolicy import session_ids
from devin_outposts.core.netpolicy.confinement import ENV_SESSION_NETWORK_POLICY, EnforcementMode
from devin_outposts.core.tokenfile import ENV_DIRECT_TOKEN, ENV_TOKEN, ENV_TOKEN_FD, ENV_TOKEN_FILE

ENV_GATEWAY = "DEVIN_OUTPOST_GATEWAY_URL"
#: Our variables' prefix (the shared rows' ``{prefix}``).
ENV_PREFIX = Program.WORKER.env_prefix


def _json_object(name: str, raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{name} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a JSON object, got {type(value).__name__}")
    return value


def _id_range(name: str, raw: str) -> Optional[str]:
    if not raw.strip():
        return None
    try:
        session_ids.parse_range(raw)
    except session_ids.IdRangeError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    return raw.strip()


def _absolute_paths(name: str, raw: str) -> tuple[str, ...]:
    paths = tuple(part.strip() for part in raw.split(",") if part.strip())
    for path in paths:
        if not os.path.isabs(path):
            raise ConfigError(f"{name}: {path!r} is not an absolute path")
    return paths


_N = number
_W = Program.WORKER
ENFORCEMENT_MODES = tuple(mode.value for mode in EnforcementMode)
_mode = choice(*ENFORCEMENT_MODES)
OPTIONS: tuple[Option, ...] = (
    # Options of `devin worker start` (same names, variables and defaults).
    shared_option("outpost", "official", _W),
    Option("session_id", ("--session", "--session-id"), "claim and serve this one session, then exit",
           "official", parse=stripped),
    shared_option("acceptor_id", "official", _W),
    shared_option("token", "official", _W),
    Option("once", ("--once",), "exit after one session", "official", default=False, switch=True,
           negatable=False),
    shared_option("api_url", "official", _W),
    shared_option("cache_dir", "official", _W),
    shared_option("static_base_url", "official", _W),
    Option("gateway_url", ("--gateway-url",), "gateway URL used when a claim carries none", "official",
           env=ENV_GATEWAY, parse=url("ws", "wss", "http", "https")),
    shared_option("remote_binary_sha", "official", _W),
    Option("pty_bridge_port", ("--pty-bridge-port",), "fixed PTY bridge port (default a free port per "
           "session)", "official", env="DEVIN_PTY_BRIDGE_PORT", parse=_N(int, 1, 65535)),
    shared_option("poll_interval", "official", _W),
    # Our additions.
    Option("max_sessions", ("--max-sessions",), "concurrent sessions, each in its own working directory "
           "(default {default})", "ours", env="DEVIN_WORKER_MAX_SESSIONS", parse=_N(int, 1), default=1),
    Option("workdir", ("--workdir",), "sessions' working directory, repos under <workdir>/repos (default "
           "the current directory)", "ours", env="DEVIN_WORKER_WORKDIR", parse=workdir),
    shared_option("watch", "ours", _W),
    Option("claim_spread", ("--claim-spread",), "spread the workers of an outpost over its oldest pending "
           "sessions instead of sending all of them at the oldest one (default; --no-claim-spread: "
           "strictly oldest first)", "ours", env="DEVIN_WORKER_CLAIM_SPREAD", parse=boolean, default=True,
           switch=True),
    Option("fleet_size", ("--fleet-size",), "how many workers start together on the outpost, when the "
           "deployment knows: their first claims are spread as among that many (default: learned from the "
           "claims seen)", "ours", env="DEVIN_WORKER_FLEET_SIZE", parse=_N(int, 1)),
    Option("drain_timeout", ("--drain-timeout",), "seconds running sessions may finish after SIGTERM before "
           "they are stopped and released (default {default})", "ours", env="DEVIN_WORKER_DRAIN_TIMEOUT",
           parse=_N(float, 0), default=30.0),
    Option("network_policy", ("--network-policy",), "sessions with an enabled network policy: enforce it "
           "(the default; a host that cannot releases them) or ignore it and run them unfiltered with a "
           "warning (unsafe)", "ours", env="DEVIN_WORKER_NETWORK_POLICY",
           parse=lambda name, raw: EnforcementMode(_mode(name, raw)), default=EnforcementMode.ENFORCE,
           choices=ENFORCEMENT_MODES),
    Option("session_uid_range", ("--session-uid-range",), "a root worker's ids for its confined sessions, "
           "START-END, each session its own uid and gid (default: root's ranges in /etc/subuid and "
           "/etc/subgid; none: a root worker refuses them)", "ours", env="DEVIN_WORKER_SESSION_UID_RANGE",
           parse=_id_range),
    Option("session_hide", ("--session-hide",), "a path confined sessions must not see, besides the worker's "
           "own directories and /run (repeatable; the variable lists them separated by commas)", "ours",
           env="DEVIN_WORKER_SESSION_HIDE", parse=_absolute_paths, repeatable=True),
    shared_option("metrics_addr", "ours", _W),
    shared_option("log_format", "ours", _W),
    shared_option("log_level", "ours", _W),
    # Tuning (the defaults suit production; tests shorten them).
    shared_option("restart_limit", "tuning", _W),
    shared_option("stop_grace", "tuning", _W),
    shared_option("renew_margin", "tuning", _W),
    shared_option("confirm_reads", "tuning", _W),
    shared_option("confirm_interval", "tuning", _W),
    shared_option("backoff_max", "tuning", _W),
    # Read from the environment only (no flag, so not in --help).
    Option("direct_token", (), "the connect token of a session claimed for this worker: direct-serve mode",
           "env", env=ENV_DIRECT_TOKEN),
    Option("chrome_path", (), "a Chrome for the sessions' browser tools", "env", env="DEVIN_CHROME_PATH"),
    Option("desktop", (), "passed to every session", "env", env="DEVIN_OUTPOST_DESKTOP"),
    Option("session_network_policy", (), "direct-serve mode: the session's spec.network_policy, as JSON (the "
           "orchestrator sets it)", "env", env=ENV_SESSION_NETWORK_POLICY, parse=_json_object),
)  # fmt: skip
_GROUPS = {
    "official": "options of `devin worker start`",
    "ours": "devin-outposts additions",
    "tuning": "tuning (defaults suit production)",
}
#: Each field's default, from its row.
_DEFAULT = table_defaults(OPTIONS)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything ``worker start`` needs, validated. Secrets are excluded from ``repr``. The defaults are
    the rows' (:data:`OPTIONS`)."""

    api_url: str = _DEFAULT["api_url"]
    token: Optional[str] = field(default=None, repr=False)
    outpost: Optional[str] = None
    session_id: Optional[str] = None
    acceptor_id: Optional[str] = None
    once: bool = _DEFAULT["once"]
    cache_dir: Path = field(default_factory=lambda: Path(DEFAULT_CACHE_DIR).expanduser())
    static_base_url: str = _DEFAULT["static_base_url"]
    gateway_url: Optional[str] = None
    remote_binary_sha: Optional[str] = None
    pty_bridge_port: Optional[int] = None
    poll_interval: float = _DEFAULT["poll_interval"]
    max_sessions: int = _DEFAULT["max_sessions"]
    workdir: Path = field(default_factory=Path.cwd)
    watch: bool = _DEFAULT["watch"]
    #: Share the oldest pending rows out between the outpost's idle workers (``--no-claim-spread``: strictly
    #: the oldest row first, as every worker did before; kept for comparison and as an escape hatch).
    claim_spread: bool = _DEFAULT["claim_spread"]
    #: How many workers start together on the outpost (``--fleet-size``), a hint for the spreading.
    fleet_size: Optional[int] = None
    drain_timeout: float = _DEFAULT["drain_timeout"]
    network_policy: EnforcementMode = _DEFAULT["network_policy"]
    #: A root worker's ids for its confined sessions (``--session-uid-range``, START-END), as given.
    session_uid_range: Optional[str] = None
    #: Paths confined sessions must not see, besides the worker's own (``--session-hide``).
    session_hide: Optional[tuple[str, ...]] = None
    metrics_addr: Optional[MetricsAddr] = None
    log_format: str = _DEFAULT["log_format"]
    log_level: str = _DEFAULT["log_level"]
    restart_limit: int = _DEFAULT["restart_limit"]
    stop_grace: float = _DEFAULT["stop_grace"]
    renew_margin: float = _DEFAULT["renew_margin"]
    confirm_reads: int = _DEFAULT["confirm_reads"]
    confirm_interval: float = _DEFAULT["confirm_interval"]
    backoff_max: float = _DEFAULT["backoff_max"]
    #: Direct-serve mode: the pre-claimed connect token from ``DEVIN_REMOTE_SESSION_TOKEN``.
    direct_token: Optional[str] = field(default=None, repr=False)
    chrome_path: Optional[str] = None
    desktop: Optional[str] = None
    #: Direct-serve mode: the session's ``spec.network_policy`` (the orchestrator's machines get it so).
    session_network_policy: Optional[dict[str, Any]] = None

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

    @property
    def interruptible_prepare(self) -> bool:
        """A signal's drain stops a session still being prepared (downloading ``devin-remote``) at once:
        nothing of it runs yet, and its claim is released for another worker (issue 37, S7)."""
        return True

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
    """Resolve flags, environment and defaults into a validated :class:`WorkerConfig`. The token is
    ``--token``, else the account token the environment gives (its variable, descriptor or file; in
    direct-serve mode, which needs none, the variable only)."""
    env = os.environ if environ is None else environ
    config = WorkerConfig(**resolve_table(OPTIONS, args, env))
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


check_table(OPTIONS, WorkerConfig)
