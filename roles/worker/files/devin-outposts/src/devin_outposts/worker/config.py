"""``worker start`` options: flags, environment variables and defaults turned into one typed config.

Precedence for every option is *flag, then environment variable, then default*, exactly like
``devin worker start`` (contract section 2.1). The flags and variables of the official CLI keep their
names and defaults; our additions use ``DEVIN_WORKER_*`` variables so a systemd environment file can set
everything without putting anything on the command line. :func:`build_config` validates the values and
raises :class:`ConfigError` (exit code 2) with one clear line.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from devin_outposts.client import DEFAULT_API_URL, normalize_api_url
from devin_outposts.worker.identity import IdentityError, validate_acceptor_id

DEFAULT_CACHE_DIR = "~/.devin/worker/cache"
DEFAULT_STATIC_BASE_URL = "https://static.devin.ai/devin-rs/remote/"
SHA_RE = re.compile(r"[0-9a-f]{6,40}")

ENV_TOKEN = "DEVIN_OUTPOSTS_TOKEN"  # noqa: S105 - a variable name, not a secret
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
        """The worker data directory: the cache dir's parent (contract 2.1, worker data layout)."""
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
    """The ``worker start`` flags. Defaults are ``None`` so that :func:`build_config` can apply env."""
    official = parser.add_argument_group("options of `devin worker start`")
    official.add_argument("--outpost", help="outpost to serve, by name or id")
    official.add_argument(
        "--session", "--session-id", dest="session", help="claim and serve this one session, then exit"
    )
    official.add_argument(
        "--acceptor-id",
        help="stable worker identity (env DEVIN_WORKER_ACCEPTOR_ID; default: generated once and stored "
        "in the data directory)",
    )
    official.add_argument(
        "--token",
        help=f"API token. Prefer the {ENV_TOKEN} environment variable: argv is visible to every user "
        "of the machine.",
    )
    official.add_argument("--once", action="store_true", default=None, help="exit after one session")
    official.add_argument(
        "--api-url", help=f"Devin API base URL (env DEVIN_API_URL, default {DEFAULT_API_URL})"
    )
    official.add_argument(
        "--cache-dir",
        help=f"devin-remote binary cache (env DEVIN_WORKER_CACHE_DIR, default {DEFAULT_CACHE_DIR}); its "
        "parent is the worker data directory",
    )
    official.add_argument(
        "--static-base-url",
        help=f"where devin-remote is published (env DEVIN_WORKER_STATIC_BASE_URL, default "
        f"{DEFAULT_STATIC_BASE_URL})",
    )
    official.add_argument(
        "--gateway-url", help=f"gateway URL used when a claim carries none (env {ENV_GATEWAY})"
    )
    official.add_argument(
        "--remote-binary-sha",
        help="devin-remote SHA when the session pins none (env DEVIN_WORKER_REMOTE_SHA; default latest)",
    )
    official.add_argument(
        "--pty-bridge-port",
        help="fixed PTY bridge port (env DEVIN_PTY_BRIDGE_PORT; default a free port per session)",
    )
    official.add_argument(
        "--poll-interval-secs", help="seconds between queue polls and session status checks (default 5)"
    )
    ours = parser.add_argument_group("devin-outposts additions")
    ours.add_argument(
        "--max-sessions",
        help="concurrent sessions, each in its own working directory "
        "(env DEVIN_WORKER_MAX_SESSIONS, default 1)",
    )
    ours.add_argument(
        "--workdir",
        help="sessions' working directory, repos under <workdir>/repos "
        "(env DEVIN_WORKER_WORKDIR, default the current directory)",
    )
    ours.add_argument(
        "--watch",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="follow the queue with the SSE watch (default) or poll it (--no-watch; env DEVIN_WORKER_WATCH)",
    )
    ours.add_argument(
        "--claim-spread",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="spread the workers of an outpost over its oldest pending sessions instead of sending all "
        "of them at the oldest one (default; --no-claim-spread: strictly oldest first; env "
        "DEVIN_WORKER_CLAIM_SPREAD)",
    )
    ours.add_argument(
        "--drain-timeout",
        help="seconds running sessions may finish after SIGTERM before they are stopped and released "
        "(env DEVIN_WORKER_DRAIN_TIMEOUT, default 30)",
    )
    ours.add_argument(
        "--metrics-addr",
        help="serve /metrics and /healthz on HOST:PORT (env DEVIN_WORKER_METRICS_ADDR; default off)",
    )
    ours.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="log format (env DEVIN_WORKER_LOG_FORMAT, default text)",
    )
    ours.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="log level (env DEVIN_WORKER_LOG_LEVEL, default info)",
    )
    tuning = parser.add_argument_group("tuning (defaults suit production)")
    tuning.add_argument("--restart-limit", help="restarts of a failing devin-remote before giving up (5)")
    tuning.add_argument("--stop-grace-secs", help="seconds between SIGTERM and SIGKILL (10)")
    tuning.add_argument("--renew-margin-secs", help="renew a claim at least this long before it expires (60)")
    tuning.add_argument("--confirm-reads", help="status reads after devin-remote exits 0 (5)")
    tuning.add_argument("--confirm-interval-secs", help="seconds between those reads (1)")
    tuning.add_argument("--backoff-max-secs", help="longest retry backoff (60)")


def _pick(flag: Optional[str], environ: Mapping[str, str], env: Optional[str]) -> Optional[str]:
    if flag is not None:
        return flag
    if env is not None:
        value = environ.get(env)
        if value is not None and value.strip() != "":
            return value
    return None


def _number(name: str, raw: Optional[str], default: float, *, minimum: float, integer: bool = False) -> float:
    if raw is None:
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError as exc:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{name} must be {kind}, got {raw!r}") from exc
    if math.isnan(value) or value < minimum:
        raise ConfigError(f"{name} must be at least {minimum:g}, got {raw!r}")
    return value


def _bool(name: str, raw: Optional[str]) -> Optional[bool]:
    if raw is None:
        return None
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name} must be true or false, got {raw!r}")


def validate_sha(value: str, source: str) -> str:
    text = value.strip().lower()
    if not SHA_RE.fullmatch(text):
        raise ConfigError(f"{source} must be a 6-40 character hex git SHA, got {value!r}")
    return text


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


def _url(name: str, raw: str, schemes: Sequence[str]) -> str:
    text = raw.strip()
    if not text.startswith(tuple(f"{scheme}://" for scheme in schemes)):
        raise ConfigError(f"{name} must start with {' or '.join(s + '://' for s in schemes)}, got {raw!r}")
    return text


def build_config(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> WorkerConfig:
    """Resolve flags, environment and defaults into a validated :class:`WorkerConfig`."""
    env = os.environ if environ is None else environ
    try:
        api_url = normalize_api_url(_pick(args.api_url, env, "DEVIN_API_URL") or DEFAULT_API_URL)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc

    raw_cache = _pick(args.cache_dir, env, "DEVIN_WORKER_CACHE_DIR") or DEFAULT_CACHE_DIR
    cache_dir = Path(os.path.expandvars(raw_cache)).expanduser().absolute()
    raw_workdir = _pick(args.workdir, env, "DEVIN_WORKER_WORKDIR")
    workdir = Path(raw_workdir).expanduser().absolute() if raw_workdir else Path.cwd()

    static = _url(
        "--static-base-url",
        _pick(args.static_base_url, env, "DEVIN_WORKER_STATIC_BASE_URL") or DEFAULT_STATIC_BASE_URL,
        ("http", "https"),
    )
    if not static.endswith("/"):
        static += "/"

    gateway_raw = _pick(args.gateway_url, env, ENV_GATEWAY)
    gateway = _url("--gateway-url", gateway_raw, ("ws", "wss", "http", "https")) if gateway_raw else None

    sha_raw = _pick(args.remote_binary_sha, env, "DEVIN_WORKER_REMOTE_SHA")
    sha = validate_sha(sha_raw, "--remote-binary-sha") if sha_raw else None

    port_raw = _pick(args.pty_bridge_port, env, "DEVIN_PTY_BRIDGE_PORT")
    pty_port = int(_number("--pty-bridge-port", port_raw, 0, minimum=1, integer=True)) if port_raw else None
    if pty_port is not None and pty_port > 65535:
        raise ConfigError(f"--pty-bridge-port must be 1-65535, got {port_raw!r}")

    acceptor_raw = _pick(args.acceptor_id, env, "DEVIN_WORKER_ACCEPTOR_ID")
    try:
        acceptor = validate_acceptor_id(acceptor_raw) if acceptor_raw else None
    except IdentityError as exc:
        raise ConfigError(str(exc)) from exc

    metrics_raw = _pick(args.metrics_addr, env, "DEVIN_WORKER_METRICS_ADDR")
    log_format = (_pick(args.log_format, env, "DEVIN_WORKER_LOG_FORMAT") or "text").lower()
    if log_format not in ("text", "json"):
        raise ConfigError(f"--log-format must be text or json, got {log_format!r}")
    log_level = (_pick(args.log_level, env, "DEVIN_WORKER_LOG_LEVEL") or "info").lower()
    if log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"--log-level must be debug, info, warning or error, got {log_level!r}")

    watch = (
        args.watch if args.watch is not None else _bool("DEVIN_WORKER_WATCH", env.get("DEVIN_WORKER_WATCH"))
    )
    spread = (
        args.claim_spread
        if args.claim_spread is not None
        else _bool("DEVIN_WORKER_CLAIM_SPREAD", env.get("DEVIN_WORKER_CLAIM_SPREAD"))
    )
    direct_token = env.get(ENV_DIRECT_TOKEN) or None
    session = args.session.strip() if args.session else None
    max_sessions = int(
        _number(
            "--max-sessions",
            _pick(args.max_sessions, env, "DEVIN_WORKER_MAX_SESSIONS"),
            1,
            minimum=1,
            integer=True,
        )
    )
    config = WorkerConfig(
        api_url=api_url,
        token=_pick(args.token, env, ENV_TOKEN),
        outpost=args.outpost.strip() if args.outpost else None,
        session_id=session,
        acceptor_id=acceptor,
        once=bool(args.once),
        cache_dir=cache_dir,
        static_base_url=static,
        gateway_url=gateway,
        remote_binary_sha=sha,
        pty_bridge_port=pty_port,
        poll_interval=_number("--poll-interval-secs", args.poll_interval_secs, 5.0, minimum=0.05),
        max_sessions=max_sessions,
        workdir=workdir,
        watch=True if watch is None else watch,
        claim_spread=True if spread is None else spread,
        drain_timeout=_number(
            "--drain-timeout", _pick(args.drain_timeout, env, "DEVIN_WORKER_DRAIN_TIMEOUT"), 30.0, minimum=0
        ),
        metrics_addr=parse_metrics_addr(metrics_raw) if metrics_raw else None,
        log_format=log_format,
        log_level=log_level,
        restart_limit=int(_number("--restart-limit", args.restart_limit, 5, minimum=0, integer=True)),
        stop_grace=_number("--stop-grace-secs", args.stop_grace_secs, 10.0, minimum=0),
        renew_margin=_number("--renew-margin-secs", args.renew_margin_secs, 60.0, minimum=0),
        confirm_reads=int(_number("--confirm-reads", args.confirm_reads, 5, minimum=1, integer=True)),
        confirm_interval=_number("--confirm-interval-secs", args.confirm_interval_secs, 1.0, minimum=0),
        backoff_max=_number("--backoff-max-secs", args.backoff_max_secs, 60.0, minimum=0.01),
        direct_token=direct_token,
        chrome_path=env.get("DEVIN_CHROME_PATH") or None,
        desktop=env.get("DEVIN_OUTPOST_DESKTOP") or None,
    )
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
            f"no API token: set {ENV_TOKEN} (a service-user token with the account.outposts.machine scope)"
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
