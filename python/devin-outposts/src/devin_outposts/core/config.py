"""The option-table machinery both programs use, and the rows ``worker start`` and ``orchestrate`` share.

An option is declared once, as an :class:`Option` row: its flag(s), its environment variable, how its text
becomes a value (one of the parsers here: type, bounds, choices), its default, its help and its group in
``--help``. A program's table of rows gives its argument parser (:func:`add_table_arguments`), its values,
resolved as *flag, then environment variable, then default* (:func:`resolve_table`), and its config
dataclass's defaults (:func:`table_defaults`; :func:`check_table` refuses a config that differs from its
table). A bad value raises :class:`ConfigError` (exit code 2) with one line that names the flag.

The rows both programs declare are here, once (:data:`SHARED_OPTIONS`): the flag, the variable, the parser
and its bounds, the default and the help. Where the two programs differ (the worker's own variables are
``DEVIN_WORKER_*``, the orchestrator's ``DEVIN_ORCHESTRATOR_*``; the orchestrator only hands some of the
worker's options on to the worker in each machine), the row says so with a :class:`ByProgram` value.
:func:`shared_option` gives a row as one program declares it. ``--help`` shows a row's default where its
help says ``{default}``; python/devin-outposts/tests/test_options.py holds the docs' option tables and the
roles' defaults to the rows.

There is one reader of yes/no words (:func:`truth`, :data:`TRUE_WORDS`, :data:`FALSE_WORDS`): the
programs' switches and the drivers' flag options use it. The account token is read by
:func:`account_token` only (:mod:`.tokenfile`: the variable, its descriptor or its file).
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Optional, TypeVar, Union

from devin_outposts.api.transport import DEFAULT_API_URL, normalize_api_url
from devin_outposts.core import platform, tokenfile
from devin_outposts.core.identity import IdentityError, validate_acceptor_id

SHA_RE = re.compile(r"[0-9a-f]{6,40}")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: The words a yes/no value accepts, in any case and with surrounding white space: every switch's variable
#: (``DEVIN_WORKER_WATCH=off``) and every driver's flag option. The simulator's query parameters keep a
#: copy (the simulator may import ``api`` only), held to these by tests/test_options.py; the collection's
#: filter plugin and the event source, which run where this package is not installed, keep their own.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

DEFAULT_CACHE_DIR = "~/.devin/worker/cache"
DEFAULT_STATIC_BASE_URL = "https://static.devin.ai/devin-rs/remote/"

Parser = Callable[[str, str], Any]
T = TypeVar("T")


class ConfigError(ValueError):
    """An option has an unusable value."""


class Program(enum.Enum):
    """The programs built on these tables; a shared row may differ between them (:class:`ByProgram`)."""

    WORKER = "worker"
    ORCHESTRATOR = "orchestrator"

    @property
    def env_prefix(self) -> str:
        """The prefix of the program's own variables (``{prefix}`` in a row's variable)."""
        return f"DEVIN_{self.name}"


@dataclass(frozen=True)
class ByProgram(Generic[T]):
    """A part of a shared row that differs between the programs."""

    worker: T
    orchestrator: T

    def of(self, program: Program) -> T:
        return self.worker if program is Program.WORKER else self.orchestrator


@dataclass(frozen=True)
class MetricsAddr:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


# --- parsers: text -> value, or ConfigError naming the flag ------------------------------------------


def number(kind: type, minimum: float, maximum: Optional[float] = None) -> Parser:
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


def truth(text: str) -> Optional[bool]:
    """True or False for one of :data:`TRUE_WORDS` or :data:`FALSE_WORDS`; None for any other text."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


def boolean(name: str, raw: str) -> bool:
    value = truth(raw)
    if value is None:
        raise ConfigError(f"{name} must be true or false, got {raw!r}")
    return value


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


def account_token(environ: Mapping[str, str]) -> Optional[str]:
    """The account token from the environment: ``DEVIN_OUTPOSTS_TOKEN``, or its descriptor or file
    (:func:`.tokenfile.read_token`, the one reader); None when none is given."""
    try:
        return tokenfile.read_token(environ)
    except tokenfile.TokenSourceError as exc:
        raise ConfigError(str(exc)) from None


# --- rows -------------------------------------------------------------------------------------------------


def shown(value: Any) -> str:
    """A default as ``--help`` and the docs write it (``60``, not ``60.0``)."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


@dataclass(frozen=True)
class Option:
    """One option of a program. ``name`` is its config field."""

    name: str
    #: Its flags; none for a value read from the environment only.
    flags: tuple[str, ...]
    #: ``{default}`` in it is replaced by the default (:func:`shown`).
    help: str
    group: str  # the section of ``--help`` it is listed in (the program's table names them)
    env: Optional[str] = None
    parse: Parser = text
    #: The config's value when neither the flag nor the variable is given (None: none, or one the config
    #: computes, such as the current directory).
    default: Any = None
    #: A switch: ``--flag`` / ``--no-flag`` (or only ``--flag`` when ``negatable`` is False).
    switch: bool = False
    negatable: bool = True
    choices: Optional[tuple[str, ...]] = None
    #: How the variable is read when it is more than one plain variable (the token: its descriptor or file).
    read_env: Optional[Callable[[Mapping[str, str]], Optional[str]]] = None
    #: The flag may be given more than once; its values reach ``parse`` joined by commas (the variable's
    #: own text may list several too).
    repeatable: bool = False

    @property
    def flag(self) -> str:
        """What its errors are named by: its first flag, or its variable."""
        return self.flags[0] if self.flags else str(self.env)

    @property
    def help_text(self) -> str:
        return self.help.replace("{default}", shown(self.default))


@dataclass(frozen=True)
class SharedOption:
    """A row both programs declare (:data:`SHARED_OPTIONS`); :meth:`of` gives it as one of them does.
    ``{prefix}`` in a variable is the program's :attr:`Program.env_prefix`."""

    name: str
    flags: Union[tuple[str, ...], ByProgram[tuple[str, ...]]]
    help: Union[str, ByProgram[str]]
    env: Union[Optional[str], ByProgram[Optional[str]]] = None
    parse: Union[Parser, ByProgram[Parser]] = text
    default: Any = None  # or a ByProgram
    switch: bool = False
    choices: Optional[tuple[str, ...]] = None
    read_env: Optional[Callable[[Mapping[str, str]], Optional[str]]] = None
    repeatable: Union[bool, ByProgram[bool]] = False

    def of(self, program: Program, group: str) -> Option:
        def part(value: Any) -> Any:
            return value.of(program) if isinstance(value, ByProgram) else value

        env = part(self.env)
        return Option(
            self.name, part(self.flags), part(self.help), group,
            env=None if env is None else env.format(prefix=program.env_prefix),
            parse=part(self.parse), default=part(self.default), switch=self.switch, choices=self.choices,
            read_env=self.read_env, repeatable=part(self.repeatable),
        )  # fmt: skip


_W = ByProgram
_N = number
#: The rows both programs declare, each once. ``{default}`` in a help is the row's default.
SHARED_OPTIONS: dict[str, SharedOption] = {
    row.name: row
    for row in (
        # `devin worker start` reads no variable for it, and asks when it is not given; the orchestrator
        # needs it.
        SharedOption("outpost", ("--outpost",), _W(
            worker="outpost to serve, by name or id",
            orchestrator="an outpost to serve, by name or id, with its own cap as NAME=CAP (repeatable; the "
                         "variable may list several, separated by commas or spaces)",
        ), parse=stripped, env=_W(worker=None, orchestrator="{prefix}_OUTPOST"),
            default=_W(worker=None, orchestrator=""), repeatable=_W(worker=False, orchestrator=True)),
        SharedOption("acceptor_id", ("--acceptor-id",), _W(
            worker="stable worker identity (default: generated once and stored in the data directory)",
            orchestrator="stable orchestrator identity (default: generated once and stored in the state "
                         "directory)",
        ), env="{prefix}_ACCEPTOR_ID", parse=acceptor),
        # Never on the orchestrator's command line: it is a long-running service, and argv is visible to
        # every user of the machine.
        SharedOption("token", _W(worker=("--token",), orchestrator=()),
                     f"API token. Prefer the {tokenfile.ENV_TOKEN} environment variable: argv is visible to "
                     "every user of the machine.", env=tokenfile.ENV_TOKEN, read_env=account_token),
        SharedOption("api_url", ("--api-url",), "Devin API base URL (default {default})", env="DEVIN_API_URL",
                     parse=api_url, default=DEFAULT_API_URL),
        SharedOption("watch", ("--watch",), "follow the queue with the SSE watch (default) or poll it "
                     "(--no-watch)", env="{prefix}_WATCH", parse=boolean, default=True, switch=True),
        SharedOption("metrics_addr", ("--metrics-addr",), "serve /metrics and /healthz on HOST:PORT (default "
                     "off)", env="{prefix}_METRICS_ADDR", parse=lambda name, raw: parse_metrics_addr(raw)),
        SharedOption("log_format", ("--log-format",), "log format (default {default})",
                     env="{prefix}_LOG_FORMAT", parse=choice("text", "json"), default="text",
                     choices=("text", "json")),
        SharedOption("log_level", ("--log-level",), "log level (default {default})", env="{prefix}_LOG_LEVEL",
                     parse=choice(*LOG_LEVELS), default="info", choices=LOG_LEVELS),
        # The worker's options that the orchestrator hands on to the worker in each machine, in the worker's
        # variables: unset, the worker's own default applies there.
        SharedOption("static_base_url", ("--static-base-url",), _W(
            worker="where devin-remote is published (default {default})",
            orchestrator="where devin-remote is published",
        ), env="DEVIN_WORKER_STATIC_BASE_URL", parse=static_url,
            default=_W(worker=DEFAULT_STATIC_BASE_URL, orchestrator=None)),
        SharedOption("cache_dir", ("--cache-dir",), _W(
            worker="devin-remote binary cache (default {default}); its parent is the worker data directory",
            orchestrator="the worker's binary cache inside each machine",
        ), env="DEVIN_WORKER_CACHE_DIR",
            # a directory of another machine: its worker checks it, there
            parse=_W(worker=path, orchestrator=stripped),
            default=_W(worker=DEFAULT_CACHE_DIR, orchestrator=None)),
        SharedOption("remote_binary_sha", ("--remote-binary-sha",), _W(
            worker="devin-remote SHA when the session pins none (default latest)",
            orchestrator="devin-remote SHA when the session pins none",
        ), env="DEVIN_WORKER_REMOTE_SHA", parse=sha),
        # Tuning (the defaults suit production; tests shorten them).
        SharedOption("poll_interval", ("--poll-interval-secs",), _W(
            worker="seconds between queue polls and session status checks (default {default})",
            orchestrator="seconds between queue polls with --no-watch ({default})",
        ), parse=_N(float, 0.05), default=5.0),
        SharedOption("restart_limit", ("--restart-limit",), _W(
            worker="restarts of a failing devin-remote before giving up ({default})",
            orchestrator="restarts of a failing worker before giving up ({default})",
        ), parse=_N(int, 0), default=5),
        SharedOption("stop_grace", ("--stop-grace-secs",), _W(
            worker="seconds between SIGTERM and SIGKILL ({default})",
            orchestrator="seconds a stopped machine's worker gets ({default})",
        ), parse=_N(float, 0), default=10.0),
        SharedOption("renew_margin", ("--renew-margin-secs",), "renew a claim at least this long before it "
                     "expires ({default})", parse=_N(float, 0), default=60.0),
        SharedOption("confirm_reads", ("--confirm-reads",), _W(
            worker="status reads after devin-remote exits 0 ({default})",
            orchestrator="status reads after a worker exits 0 ({default})",
        ), parse=_N(int, 1), default=5),
        SharedOption("confirm_interval", ("--confirm-interval-secs",), "seconds between those reads "
                     "({default})", parse=_N(float, 0), default=1.0),
        SharedOption("backoff_max", ("--backoff-max-secs",), "longest retry backoff ({default})",
                     parse=_N(float, 0.01), default=60.0),
    )
}  # fmt: skip


def shared_option(name: str, group: str, program: Program) -> Option:
    """The shared row ``name`` (:data:`SHARED_OPTIONS`) as ``program`` declares it, in its ``group``."""
    return SHARED_OPTIONS[name].of(program, group)


# --- tables ----------------------------------------------------------------------------------------------


def table_defaults(table: Sequence[Option]) -> dict[str, Any]:
    """Each row's default, by config field: where the config dataclass takes its defaults from."""
    return {option.name: option.default for option in table}


def check_table(table: Sequence[Option], config: type, *, computed: Sequence[str] = ()) -> None:
    """Every row is a field of the ``config`` dataclass and every field a row (but the ``computed`` ones,
    which the program works out), with the row's default: an import-time guard against drift."""
    fields = {item.name: item for item in dataclasses.fields(config)}
    declared = {option.name for option in table} | set(computed)
    if declared != set(fields):
        raise RuntimeError(f"options and {config.__name__} differ: {sorted(declared ^ set(fields))}")
    for option in table:
        default = fields[option.name].default
        if default is not dataclasses.MISSING and default != option.default:
            raise RuntimeError(f"{config.__name__}.{option.name} defaults to {default!r}, its row to "
                               f"{option.default!r}")  # fmt: skip


def _raw(option: Option, args: argparse.Namespace, environ: Mapping[str, str]) -> Optional[Any]:
    """The flag's value, else the environment variable's (blank counts as unset), else None."""
    value = getattr(args, option.name, None)
    if value is not None:
        return value
    if option.read_env is not None:
        return option.read_env(environ)
    if option.env is not None:
        text = environ.get(option.env)
        if text is not None and text.strip() != "":
            return text
    return None


def add_table_arguments(
    parser: argparse.ArgumentParser, table: Sequence[Option], groups: Mapping[str, Optional[str]]
) -> None:
    """Flags from an option table, in sections titled by ``groups`` (a None title: the parser's own
    options). Every default is ``None``, so that :func:`resolve_table` can tell "not given" from a value
    and fall back to the environment."""
    sections = {key: parser.add_argument_group(title) if title else parser for key, title in groups.items()}
    for option in table:
        if not option.flags:
            continue  # from the environment only
        help_text = f"{option.help_text} (env {option.env})" if option.env else option.help_text
        kwargs: dict[str, Any] = {"dest": option.name, "default": None, "help": help_text}
        if option.switch:
            kwargs["action"] = argparse.BooleanOptionalAction if option.negatable else "store_true"
        elif option.choices:
            kwargs["choices"] = option.choices
        if option.repeatable:
            kwargs["action"] = "append"
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
        elif isinstance(raw, list):  # a repeatable flag, given that many times
            values[option.name] = option.parse(option.flag, ",".join(str(item) for item in raw))
        else:
            values[option.name] = option.parse(option.flag, str(raw))
    return values
