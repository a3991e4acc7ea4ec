"""``orchestrate`` options: one table gives the flags, the environment variables and the config.

The same rules as ``worker start`` (:mod:`devin_outposts.core.config`): each option is declared once,
resolved as *flag, then environment variable, then default*, and a bad value raises
:class:`~devin_outposts.core.config.ConfigError` (exit code 2) with one line naming the flag. The
account token comes from ``DEVIN_OUTPOSTS_TOKEN`` only: an orchestrator is a long-running service and
argv is visible to every user of the machine. The options that matter inside a session machine
(``--static-base-url``, ``--cache-dir``, ``--remote-binary-sha``) keep the worker's variables and are
handed to the worker each machine runs.

A driver's own options come from ``--driver-config FILE`` (a JSON mapping, or YAML when PyYAML is
installed) and ``--driver-opt KEY=VALUE`` (repeatable; it wins over the file). The driver checks them.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from devin_outposts.api.client import DEFAULT_API_URL
from devin_outposts.core import config as co
from devin_outposts.core.config import ConfigError, MetricsAddr, Option, shared_option
from devin_outposts.core.tokenfile import ENV_TOKEN
from devin_outposts.orchestrator.drivers import DRIVERS

DEFAULT_STATE_DIR = "~/.devin/orchestrator"


class ResumePolicy(str, enum.Enum):
    """What a suspended session keeps for its resume (``--resume-policy``)."""

    __str__ = str.__str__  # logs and --help show the value

    START_FRESH = "start_fresh"  # nothing: a resume starts on a fresh machine
    SNAPSHOT = "snapshot"  # its state dir and repos, restored on the resume's machine


RESUME_POLICIES = tuple(policy.value for policy in ResumePolicy)
_policy = co.choice(*RESUME_POLICIES)
#: Our variables' prefix (the shared rows' ``{prefix}``).
ENV_PREFIX = "DEVIN_ORCHESTRATOR"

_N = co.number
OPTIONS: tuple[Option, ...] = (
    Option("outpost", ("--outpost",), "outpost to serve, by name or id", "main",
           env="DEVIN_ORCHESTRATOR_OUTPOST", parse=co.stripped),
    Option("driver", ("--driver",), "what each session runs on", "main", env="DEVIN_ORCHESTRATOR_DRIVER",
           parse=co.choice(*DRIVERS), choices=tuple(DRIVERS)),
    Option("max_concurrent", ("--max-concurrent",), "sessions served at once; more stay queued (default 10)",
           "main", env="DEVIN_ORCHESTRATOR_MAX_CONCURRENT", parse=_N(int, 1)),
    Option("driver_config", ("--driver-config",), "the driver's options: a JSON (or YAML) mapping", "main",
           env="DEVIN_ORCHESTRATOR_DRIVER_CONFIG", parse=co.path),
    Option("state_dir", ("--state-dir",), f"the orchestrator's own files (default {DEFAULT_STATE_DIR})",
           "main", env="DEVIN_ORCHESTRATOR_STATE_DIR", parse=co.path),
    Option("acceptor_id", ("--acceptor-id",), "stable orchestrator identity (default: generated once and "
           "stored in the state directory)", "main", env="DEVIN_ORCHESTRATOR_ACCEPTOR_ID", parse=co.acceptor),
    shared_option("api_url", "main", ENV_PREFIX),
    Option("resume_policy", ("--resume-policy",), "what a suspended session keeps for its resume: nothing "
           "(start_fresh, the default) or its state dir and repos (snapshot)", "main",
           env="DEVIN_ORCHESTRATOR_RESUME_POLICY", parse=lambda name, raw: ResumePolicy(_policy(name, raw)),
           choices=RESUME_POLICIES),
    Option("snapshot_ttl", ("--snapshot-ttl",), "seconds a snapshot is kept (default: until the session is "
           "terminated)", "main", env="DEVIN_ORCHESTRATOR_SNAPSHOT_TTL", parse=_N(float, 1)),
    shared_option("metrics_addr", "main", ENV_PREFIX),
    shared_option("log_format", "main", ENV_PREFIX),
    shared_option("log_level", "main", ENV_PREFIX),
    shared_option("watch", "main", ENV_PREFIX),
    # Handed to the worker in each machine (the worker's own variables).
    Option("static_base_url", ("--static-base-url",), "where devin-remote is published", "machine",
           env="DEVIN_WORKER_STATIC_BASE_URL", parse=co.static_url),
    Option("cache_dir", ("--cache-dir",), "the worker's binary cache inside each machine", "machine",
           env="DEVIN_WORKER_CACHE_DIR", parse=co.stripped),
    Option("remote_binary_sha", ("--remote-binary-sha",), "devin-remote SHA when the session pins none",
           "machine", env="DEVIN_WORKER_REMOTE_SHA", parse=co.sha),
    # Tuning.
    Option("provision_timeout", ("--provision-timeout",), "seconds a machine may take to be made (600)",
           "tuning", env="DEVIN_ORCHESTRATOR_PROVISION_TIMEOUT", parse=_N(float, 1)),
    Option("boot_timeout", ("--boot-timeout",), "seconds from a made machine to a served session (300)",
           "tuning", env="DEVIN_ORCHESTRATOR_BOOT_TIMEOUT", parse=_N(float, 1)),
    Option("gc_interval", ("--gc-interval",), "seconds between garbage-collection sweeps (60)", "tuning",
           env="DEVIN_ORCHESTRATOR_GC_INTERVAL", parse=_N(float, 0.1)),
    Option("status_interval", ("--status-interval-secs",), "seconds between machine status reads (2)",
           "tuning", parse=_N(float, 0.05)),
    Option("poll_interval", ("--poll-interval-secs",), "seconds between queue polls with --no-watch (5)",
           "tuning", parse=_N(float, 0.05)),
    Option("session_check_interval", ("--session-check-secs",), "seconds between each running session's "
           "status reads; the watch reports changes sooner (30)", "tuning", parse=_N(float, 0.05)),
    Option("restart_limit", ("--restart-limit",), "restarts of a failing worker before giving up (5)",
           "tuning", parse=_N(int, 0)),
    shared_option("renew_margin", "tuning", ENV_PREFIX),
    Option("confirm_reads", ("--confirm-reads",), "status reads after a worker exits 0 (5)", "tuning",
           parse=_N(int, 1)),
    shared_option("confirm_interval", "tuning", ENV_PREFIX),
    Option("stop_grace", ("--stop-grace-secs",), "seconds a stopped machine's worker gets (10)", "tuning",
           parse=_N(float, 0)),
    shared_option("backoff_max", "tuning", ENV_PREFIX),
)
_GROUPS = {
    "main": "orchestrator",
    "machine": "passed to the worker in each session machine",
    "tuning": "tuning (defaults suit production)",
}


@dataclass(frozen=True)
class OrchestratorConfig:
    """Everything ``orchestrate`` needs, validated. Secrets are excluded from ``repr``."""

    outpost: str = ""
    driver: str = ""
    max_concurrent: int = 10
    driver_config: Optional[Path] = None
    driver_options: Mapping[str, Any] = field(default_factory=dict)
    state_dir: Path = field(default_factory=lambda: Path(DEFAULT_STATE_DIR).expanduser())
    acceptor_id: Optional[str] = None
    api_url: str = DEFAULT_API_URL
    token: Optional[str] = field(default=None, repr=False)
    resume_policy: ResumePolicy = ResumePolicy.START_FRESH
    snapshot_ttl: Optional[float] = None
    metrics_addr: Optional[MetricsAddr] = None
    log_format: str = "text"
    log_level: str = "info"
    watch: bool = True
    static_base_url: Optional[str] = None
    cache_dir: Optional[str] = None
    remote_binary_sha: Optional[str] = None
    provision_timeout: float = 600.0
    boot_timeout: float = 300.0
    gc_interval: float = 60.0
    status_interval: float = 2.0
    poll_interval: float = 5.0
    session_check_interval: float = 30.0
    restart_limit: int = 5
    renew_margin: float = 60.0
    confirm_reads: int = 5
    confirm_interval: float = 1.0
    stop_grace: float = 10.0
    backoff_max: float = 60.0

    def __post_init__(self) -> None:
        # A config made in code (tests, embedding) may give the policy as its text.
        object.__setattr__(self, "resume_policy", ResumePolicy(self.resume_policy))

    # What the claim loop and serving read besides the above (the worker's names).
    @property
    def max_sessions(self) -> int:
        return self.max_concurrent

    @property
    def claim_spread(self) -> bool:
        return True

    @property
    def once(self) -> bool:
        return False

    @property
    def gateway_url(self) -> Optional[str]:
        return None

    @property
    def workdir(self) -> Path:
        return self.state_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    co.add_table_arguments(parser, OPTIONS, _GROUPS)
    parser.add_argument(
        "--driver-opt",
        dest="driver_opts",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one driver option (repeatable; wins over --driver-config)",
    )


def load_driver_options(path: Optional[Path], pairs: Sequence[str]) -> dict[str, Any]:
    """The driver's options: the file's mapping, then each ``KEY=VALUE`` over it."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--driver-config {path}: {exc.strerror or exc}") from exc
        values = _parse_mapping(text, path)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--driver-opt must be KEY=VALUE, got {pair!r}")
        values[key.strip()] = value
    return values


def _parse_mapping(text: str, path: Path) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as json_error:
        try:
            import yaml  # type: ignore[import-untyped,unused-ignore]  # optional: only for non-JSON
        except ImportError:
            raise ConfigError(f"--driver-config {path}: not JSON ({json_error}); YAML needs PyYAML") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--driver-config {path}: neither JSON nor YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--driver-config {path}: must be a mapping, got {type(data).__name__}")
    return data


def build_config(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> OrchestratorConfig:
    env = os.environ if environ is None else environ
    values = co.resolve_table(OPTIONS, args, env)
    token = env.get(ENV_TOKEN, "").strip()
    if token:
        values["token"] = token
    values["driver_options"] = load_driver_options(
        values.get("driver_config"), getattr(args, "driver_opts", None) or []
    )
    config = OrchestratorConfig(**values)
    if not config.outpost:
        raise ConfigError("--outpost is required (or DEVIN_ORCHESTRATOR_OUTPOST)")
    if not config.driver:
        raise ConfigError(f"--driver is required: one of {', '.join(DRIVERS)} (or DEVIN_ORCHESTRATOR_DRIVER)")
    if not config.token:
        raise ConfigError(f"no API token: set {ENV_TOKEN} (a token with the account.outposts scopes)")
    return config


def parse_args(argv: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> OrchestratorConfig:
    """Parse ``orchestrate`` arguments (for tests and embedding)."""
    parser = argparse.ArgumentParser(prog="devin-outposts orchestrate")
    add_arguments(parser)
    return build_config(parser.parse_args(list(argv)), environ)


def _check_table() -> None:
    declared = {option.name for option in OPTIONS} | {"driver_options", "token"}
    config_fields = {item.name for item in fields(OrchestratorConfig)}
    if declared != config_fields:
        raise RuntimeError(f"options and OrchestratorConfig differ: {sorted(declared ^ config_fields)}")


_check_table()
