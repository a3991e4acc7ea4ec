"""``orchestrate`` options: one table gives the flags, the environment variables and the config.

The same rules as ``worker start`` (:mod:`devin_outposts.core.config`): each option is declared once,
resolved as *flag, then environment variable, then default*, and a bad value raises
:class:`~devin_outposts.core.config.ConfigError` (exit code 2) with one line naming the flag. The
account token comes from the environment only (``DEVIN_OUTPOSTS_TOKEN``, or its descriptor or file:
:mod:`devin_outposts.core.tokenfile`): an orchestrator is a long-running service and argv is visible to
every user of the machine. The options that matter inside a session machine (``--static-base-url``,
``--cache-dir``, ``--remote-binary-sha``) keep the worker's variables and are handed to the worker each
machine runs. The rows the worker declares too are :data:`devin_outposts.core.config.SHARED_OPTIONS`'.

Several outposts: ``--outpost`` is repeatable, each ``NAME`` or ``NAME=CAP`` (its own cap), and the
variable may list several (``a=2,b=3`` or ``"a b"``); ``--outposts-file FILE`` lists them too, as a list of
``{outpost: NAME, max_concurrent: CAP}`` (:func:`load_outposts_file`), before ``--outpost``'s; an outpost
named twice, in either or across both, is refused. ``--max-concurrent`` caps the whole process
(:func:`parse_outposts`, :func:`merge_outposts`, :attr:`OrchestratorConfig.outposts`).

A driver's own options come from ``--driver-config FILE`` (a JSON mapping, or YAML when PyYAML is
installed) and ``--driver-opt KEY=VALUE`` (repeatable; it wins over the file). The driver checks them.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from devin_outposts.core import config as co
from devin_outposts.core.config import ConfigError, MetricsAddr, Option, Program, shared_option
from devin_outposts.core.tokenfile import ENV_TOKEN
from devin_outposts.orchestrator.drivers import DRIVERS

DEFAULT_STATE_DIR = "~/.devin/orchestrator"


class ResumePolicy(str, enum.Enum):
    """What a suspended session keeps for its resume (``--resume-policy``)."""

    __str__ = str.__str__  # logs and --help show the value

    START_FRESH = "start_fresh"  # nothing: a resume starts on a fresh machine
    SNAPSHOT = "snapshot"  # its state dir and repos, restored on the resume's machine


RESUME_POLICIES = tuple(policy.value for policy in ResumePolicy)


class MachineStatus(str, enum.Enum):
    """How sessions learn their machines' status (``--machine-status``)."""

    __str__ = str.__str__

    WATCH = "watch"  # the driver's one stream of all its machines, where it has one; else POLL
    POLL = "poll"  # each session reads its machine every --status-interval-secs


MACHINE_STATUSES = tuple(mode.value for mode in MachineStatus)
_policy = co.choice(*RESUME_POLICIES)


@dataclass(frozen=True)
class OutpostSpec:
    """One outpost to serve (``--outpost NAME[=CAP]``): its name or id, and its own cap (None: only the
    process's ``--max-concurrent``)."""

    outpost: str
    max_concurrent: Optional[int] = None

    def __str__(self) -> str:
        return self.outpost if self.max_concurrent is None else f"{self.outpost}={self.max_concurrent}"


def parse_outposts(text: str) -> tuple[OutpostSpec, ...]:
    """``--outpost``'s values (joined by commas when the flag is repeated): each ``NAME`` or ``NAME=CAP``,
    separated by commas or white space; an outpost named twice is an error (two claim loops would serve
    it, each counting only its own sessions)."""
    specs: list[OutpostSpec] = []
    for item in (part for part in re.split(r"[,\s]+", text) if part):
        name, sep, cap_text = item.rpartition("=")
        if not sep:
            name, cap_text = item, ""
        cap: Optional[int] = None
        if sep:
            try:
                cap = int(cap_text)
            except ValueError:
                cap = 0
            if cap < 1 or not name:
                raise ConfigError(
                    f"--outpost must be NAME or NAME=CAP with CAP a whole number >= 1, got {item!r}"
                )
        specs.append(OutpostSpec(name, cap))
    return _each_once(specs, "--outpost")


def _each_once(specs: Sequence[OutpostSpec], source: str) -> tuple[OutpostSpec, ...]:
    """``specs``, refused if one names an outpost an earlier one names (two claim loops would serve it,
    each counting only its own sessions)."""
    names: set[str] = set()
    for spec in specs:
        if spec.outpost in names:
            raise ConfigError(f"{source} names {spec.outpost!r} twice")
        names.add(spec.outpost)
    return tuple(specs)


#: What one entry of ``--outposts-file`` may say.
OUTPOSTS_FILE_KEYS = ("outpost", "max_concurrent")
_OUTPOSTS_FILE_SHAPE = "a list of {outpost: NAME, max_concurrent: CAP}"


def load_outposts_file(path: Path) -> tuple[OutpostSpec, ...]:
    """``--outposts-file``'s outposts, in its order. The file (JSON, or YAML with PyYAML) is a list of
    ``{outpost: NAME, max_concurrent: CAP}``, the cap optional; the same names and caps as
    ``--outpost`` takes. Nothing else is read from it (no token: that comes from the environment only)."""
    source = f"--outposts-file {path}"
    data = _read_document(path, "--outposts-file")
    if isinstance(data, dict):
        # The one other shape a user may reach for: say which to write instead.
        raise ConfigError(f"{source}: must be {_OUTPOSTS_FILE_SHAPE}, not a mapping (write the list itself)")
    if data is not None and not isinstance(data, list):
        raise ConfigError(f"{source}: must be {_OUTPOSTS_FILE_SHAPE}, got {_kind(data)}")
    if not data:
        raise ConfigError(f"{source}: lists no outpost")
    return _each_once(
        [_file_entry(item, f"{source}, entry {number}") for number, item in enumerate(data, 1)], source
    )


def _file_entry(item: Any, where: str) -> OutpostSpec:
    if not isinstance(item, dict):
        raise ConfigError(
            f"{where}: must be a mapping {{outpost: NAME, max_concurrent: CAP}}, got {_kind(item)}"
        )
    unknown = [str(key) for key in item if key not in OUTPOSTS_FILE_KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (only {' and '.join(OUTPOSTS_FILE_KEYS)})")
    name = item.get("outpost")
    # The names --outpost takes: with none of its separators, so that every outpost can be named either way.
    if not isinstance(name, str) or not re.fullmatch(r"[^,=\s]+", name.strip()):
        raise ConfigError(f"{where}: outpost must be a name or id without commas, '=' or spaces, "
                          f"got {_kind(name)}")  # fmt: skip
    cap = item.get("max_concurrent")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigError(f"{where}: max_concurrent must be a whole number >= 1, got {cap!r}")
    return OutpostSpec(name.strip(), cap)


def merge_outposts(from_file: Sequence[OutpostSpec], from_flag: Sequence[OutpostSpec], path: Optional[Path]
                   ) -> tuple[OutpostSpec, ...]:  # fmt: skip
    """The outposts served: the file's, then ``--outpost``'s (or its variable's); refused if one is in
    both."""
    in_file = {spec.outpost for spec in from_file}
    for spec in from_flag:
        if spec.outpost in in_file:
            raise ConfigError(f"--outpost and --outposts-file {path} both name {spec.outpost!r}")
    return (*from_file, *from_flag)


_KINDS = {
    str: "text",
    bool: "true/false",
    int: "a number",
    float: "a number",
    list: "a list",
    dict: "a mapping",
}


def _kind(value: Any) -> str:
    """What a value of a config file is, without repeating it (a misplaced secret stays out of the logs)."""
    return "nothing" if value is None else _KINDS.get(type(value), type(value).__name__)


#: Our variables' prefix (the shared rows' ``{prefix}``).
ENV_PREFIX = Program.ORCHESTRATOR.env_prefix

_N = co.number
_O = Program.ORCHESTRATOR
OPTIONS: tuple[Option, ...] = (
    shared_option("outpost", "main", _O),
    Option("outposts_file", ("--outposts-file",), "outposts to serve, from a JSON (or YAML) list of "
           "mappings, each with outpost (a name or id) and max_concurrent (its own cap, optional); served "
           "before --outpost's", "main",
           env="DEVIN_ORCHESTRATOR_OUTPOSTS_FILE", parse=co.path),
    Option("driver", ("--driver",), "what each session runs on", "main", env="DEVIN_ORCHESTRATOR_DRIVER",
           parse=co.choice(*DRIVERS), default="", choices=tuple(DRIVERS)),
    Option("max_concurrent", ("--max-concurrent",), "sessions served at once by the whole process, over "
           "every outpost; more stay queued (default {default})", "main",
           env="DEVIN_ORCHESTRATOR_MAX_CONCURRENT", parse=_N(int, 1), default=10),
    Option("driver_config", ("--driver-config",), "the driver's options: a JSON (or YAML) mapping", "main",
           env="DEVIN_ORCHESTRATOR_DRIVER_CONFIG", parse=co.path),
    Option("state_dir", ("--state-dir",), "the orchestrator's own files (default {default})", "main",
           env="DEVIN_ORCHESTRATOR_STATE_DIR", parse=co.path, default=DEFAULT_STATE_DIR),
    shared_option("acceptor_id", "main", _O),
    shared_option("api_url", "main", _O),
    shared_option("token", "main", _O),  # from the environment only
    Option("resume_policy", ("--resume-policy",), "what a suspended session keeps for its resume: nothing "
           "(start_fresh, the default) or its state dir and repos (snapshot)", "main",
           env="DEVIN_ORCHESTRATOR_RESUME_POLICY", parse=lambda name, raw: ResumePolicy(_policy(name, raw)),
           default=ResumePolicy.START_FRESH, choices=RESUME_POLICIES),
    Option("snapshot_ttl", ("--snapshot-ttl",), "seconds a snapshot is kept (default: until the session is "
           "terminated)", "main", env="DEVIN_ORCHESTRATOR_SNAPSHOT_TTL", parse=_N(float, 1)),
    shared_option("metrics_addr", "main", _O),
    shared_option("log_format", "main", _O),
    shared_option("log_level", "main", _O),
    shared_option("watch", "main", _O),
    # Handed to the worker in each machine (the worker's own variables).
    shared_option("static_base_url", "machine", _O),
    shared_option("cache_dir", "machine", _O),
    shared_option("remote_binary_sha", "machine", _O),
    # Tuning.
    Option("provision_timeout", ("--provision-timeout",), "seconds a machine may take to be made ({default})",
           "tuning", env="DEVIN_ORCHESTRATOR_PROVISION_TIMEOUT", parse=_N(float, 1), default=600.0),
    Option("boot_timeout", ("--boot-timeout",), "seconds from a made machine to a served session ({default})",
           "tuning", env="DEVIN_ORCHESTRATOR_BOOT_TIMEOUT", parse=_N(float, 1), default=300.0),
    Option("gc_interval", ("--gc-interval",), "seconds between garbage-collection sweeps ({default})",
           "tuning", env="DEVIN_ORCHESTRATOR_GC_INTERVAL", parse=_N(float, 0.1), default=60.0),
    Option("status_interval", ("--status-interval-secs",), "seconds between machine status reads when they "
           "are read one by one ({default})", "tuning", parse=_N(float, 0.05), default=2.0),
    Option("machine_status", ("--machine-status",), "how machine status is learnt: the driver's one watch "
           "of all its machines (watch, the default) or a read per machine (poll)", "tuning",
           env="DEVIN_ORCHESTRATOR_MACHINE_STATUS",
           parse=lambda name, raw: MachineStatus(co.choice(*MACHINE_STATUSES)(name, raw)),
           default=MachineStatus.WATCH, choices=MACHINE_STATUSES),
    Option("start_failure_grace", ("--start-failure-grace",), "seconds a platform may name the same reason "
           "for not starting a worker (an image it cannot pull, a Pod it cannot place) before the session "
           "is released ({default})", "tuning", env="DEVIN_ORCHESTRATOR_START_FAILURE_GRACE",
           parse=_N(float, 0), default=30.0),
    shared_option("poll_interval", "tuning", _O),
    Option("session_check_interval", ("--session-check-secs",), "seconds between each running session's "
           "status reads, a safety net: the queue watch brings every change at once ({default})", "tuning",
           parse=_N(float, 0.05), default=300.0),
    shared_option("restart_limit", "tuning", _O),
    shared_option("renew_margin", "tuning", _O),
    shared_option("confirm_reads", "tuning", _O),
    shared_option("confirm_interval", "tuning", _O),
    shared_option("stop_grace", "tuning", _O),
    shared_option("backoff_max", "tuning", _O),
)  # fmt: skip
_GROUPS = {
    "main": "orchestrator",
    "machine": "passed to the worker in each session machine",
    "tuning": "tuning (defaults suit production)",
}
#: Each field's default, from its row.
_DEFAULT = co.table_defaults(OPTIONS)


@dataclass(frozen=True)
class OrchestratorConfig:
    """Everything ``orchestrate`` needs, validated. Secrets are excluded from ``repr``. The defaults are
    the rows' (:data:`OPTIONS`)."""

    outpost: str = _DEFAULT["outpost"]
    outposts_file: Optional[Path] = None
    #: Every outpost served: ``outposts_file``'s, then ``outpost``'s (:func:`merge_outposts`); computed
    #: from ``outpost`` alone when not given.
    outposts: tuple[OutpostSpec, ...] = ()
    driver: str = _DEFAULT["driver"]
    max_concurrent: int = _DEFAULT["max_concurrent"]
    driver_config: Optional[Path] = None
    driver_options: Mapping[str, Any] = field(default_factory=dict)
    state_dir: Path = field(default_factory=lambda: Path(DEFAULT_STATE_DIR).expanduser())
    acceptor_id: Optional[str] = None
    api_url: str = _DEFAULT["api_url"]
    token: Optional[str] = field(default=None, repr=False)
    resume_policy: ResumePolicy = _DEFAULT["resume_policy"]
    snapshot_ttl: Optional[float] = None
    metrics_addr: Optional[MetricsAddr] = None
    log_format: str = _DEFAULT["log_format"]
    log_level: str = _DEFAULT["log_level"]
    watch: bool = _DEFAULT["watch"]
    static_base_url: Optional[str] = None
    cache_dir: Optional[str] = None
    remote_binary_sha: Optional[str] = None
    provision_timeout: float = _DEFAULT["provision_timeout"]
    boot_timeout: float = _DEFAULT["boot_timeout"]
    gc_interval: float = _DEFAULT["gc_interval"]
    status_interval: float = _DEFAULT["status_interval"]
    machine_status: MachineStatus = _DEFAULT["machine_status"]
    start_failure_grace: float = _DEFAULT["start_failure_grace"]
    poll_interval: float = _DEFAULT["poll_interval"]
    session_check_interval: float = _DEFAULT["session_check_interval"]
    restart_limit: int = _DEFAULT["restart_limit"]
    renew_margin: float = _DEFAULT["renew_margin"]
    confirm_reads: int = _DEFAULT["confirm_reads"]
    confirm_interval: float = _DEFAULT["confirm_interval"]
    stop_grace: float = _DEFAULT["stop_grace"]
    backoff_max: float = _DEFAULT["backoff_max"]

    def __post_init__(self) -> None:
        # A config made in code (tests, embedding) may give the policy as its text.
        object.__setattr__(self, "resume_policy", ResumePolicy(self.resume_policy))
        object.__setattr__(self, "machine_status", MachineStatus(self.machine_status))
        if not self.outposts and self.outpost:
            object.__setattr__(self, "outposts", parse_outposts(self.outpost))

    def for_outpost(self, spec: OutpostSpec) -> OrchestratorConfig:
        """The config one outpost's claim loop, host and sweep read: that outpost only, and its cap (never
        above the process's)."""
        cap = (
            self.max_concurrent
            if spec.max_concurrent is None
            else min(spec.max_concurrent, self.max_concurrent)
        )
        return dataclasses.replace(self, outpost=spec.outpost, outposts=(spec,), max_concurrent=cap)

    # What the claim loop and serving read besides the above (the worker's names).
    @property
    def max_sessions(self) -> int:
        return self.max_concurrent

    @property
    def claim_spread(self) -> bool:
        return True

    @property
    def fleet_size(self) -> Optional[int]:
        return None  # orchestrators are few: their spreading learns them from their claims

    @property
    def once(self) -> bool:
        return False

    @property
    def gateway_url(self) -> Optional[str]:
        return None

    @property
    def interruptible_prepare(self) -> bool:
        return False  # a machine being provisioned finishes, so that the session's finish tears it down

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
        data = _read_document(path, "--driver-config")
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"--driver-config {path}: must be a mapping, got {type(data).__name__}")
        values = data or {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--driver-opt must be KEY=VALUE, got {pair!r}")
        values[key.strip()] = value
    return values


def _read_document(path: Path, flag: str) -> Any:
    """A config file's data: JSON, else YAML (when PyYAML is installed). Every way it can fail is one
    line naming ``flag`` and the file (exit code 2, no traceback)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{flag} {path}: not UTF-8 text") from None
    try:
        return json.loads(text)
    except ValueError as json_error:
        try:
            import yaml  # type: ignore[import-untyped,unused-ignore]  # optional: only for non-JSON
        except ImportError:
            raise ConfigError(f"{flag} {path}: not JSON ({json_error}); YAML needs PyYAML") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            # PyYAML's messages span lines (the context, then the problem and its mark).
            raise ConfigError(f"{flag} {path}: neither JSON nor YAML: {' '.join(str(exc).split())}") from None


def build_config(args: argparse.Namespace, environ: Optional[Mapping[str, str]] = None) -> OrchestratorConfig:
    """Resolve flags, environment and defaults into a validated :class:`OrchestratorConfig`. The token is
    the account token the environment gives: its variable, descriptor or file, never a flag."""
    env = os.environ if environ is None else environ
    values = co.resolve_table(OPTIONS, args, env)
    values["driver_options"] = load_driver_options(
        values.get("driver_config"), getattr(args, "driver_opts", None) or []
    )
    from_file = () if values.get("outposts_file") is None else load_outposts_file(values["outposts_file"])
    values["outposts"] = merge_outposts(
        from_file, parse_outposts(values.get("outpost", "")), values.get("outposts_file")
    )
    config = OrchestratorConfig(**values)
    if not config.outposts:
        raise ConfigError(
            "--outpost is required (or DEVIN_ORCHESTRATOR_OUTPOST, or a list of them in --outposts-file)"
        )
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


co.check_table(OPTIONS, OrchestratorConfig, computed=("driver_options", "outposts"))
