"""The one interface every orchestrator driver implements, and the values that cross it.

A *driver* makes and destroys the machines sessions run on: a local process (``process``), a container
(``podman``), a Pod (``kubernetes``) or whatever the user's playbook creates (``ansible``). It knows
nothing of the queue, of claims or of the account token: the orchestrator claims, renews and releases,
and hands the driver only what a machine needs (docs/orchestrator.md, "Drivers"):

1. :meth:`Driver.provision` makes the machine for one session (labelled with its acceptor id, outpost and
   session id, so :meth:`Driver.list_owned` finds it again after a restart);
2. :meth:`Driver.restore` (``kind=resume`` with the ``snapshot`` policy) puts a kept state back into it;
3. :meth:`Driver.start` starts ``devin-outposts worker start --session=<id>`` in it in direct-serve mode,
   with the per-session connect token in the environment (never argv), replacing a worker already there;
4. :meth:`Driver.status` says whether that worker is still running, and its exit code once it ended
   (or why it cannot start); a driver that can follow all its machines as one stream offers
   :meth:`Driver.status_source` too (:mod:`~devin_outposts.orchestrator.drivers.status_board`);
5. :meth:`Driver.snapshot` keeps the session's state (its state dir and its ``repos/`` workdir) when a
   suspended session may come back;
6. :meth:`Driver.teardown` destroys the machine and everything made for it (idempotent: a machine that
   is already gone is not an error).

Every method is a coroutine; a driver that calls blocking tools runs them in a thread or a subprocess.
A driver raises :class:`DriverError` for a failure it understood (one line, no secret in it); the
orchestrator counts those as infrastructure errors, apart from session failures.

A driver declares its options once, as an :class:`OptionTable` of :class:`DriverOption` rows (name,
kind, default, bounds, docs, its own check): every driver reads and refuses options alike, and the docs'
option tables are rendered from the same rows.
"""

from __future__ import annotations

import abc
import asyncio
import copy
import enum
import hashlib
import json
import math
import re
import shlex
import time
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, Protocol

from devin_outposts.core.config import truth
from devin_outposts.core.netpolicy.confinement import ENV_SESSION_NETWORK_POLICY

#: Where a session machine's worker keeps its state, relative to the machine's root. Snapshots keep
#: exactly these two: the worker data dir (per-session state dir, binary cache) and the repos workdir.
MACHINE_DATA_DIR = "worker"
MACHINE_WORKDIR = "repos"

#: The labels every driver puts on what it creates (as labels, tags, or a metadata file). The keys follow
#: Cognition's operator; ``managed-by`` names us, so the operator and we never collect each other's pods.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "devin-outposts-orchestrator"
LABEL_SESSION = "outposts.cognition.com/session-id"
LABEL_OUTPOST = "outposts.cognition.com/pool"
LABEL_ACCEPTOR = "outposts.devin.ai/acceptor-id"

_UNSAFE = re.compile(r"[^a-z0-9-]+")


class DriverError(Exception):
    """A machine could not be made, started, read or destroyed. The message is one line, without secrets;
    ``reason`` is the platform's short name for the cause when the driver knows it (``pull-error``)."""

    def __init__(self, message: str = "", *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


def fnv1a32(text: str) -> str:
    """The 32-bit FNV-1a hash of ``text`` as 8 hex digits (what the operator suffixes its names with)."""
    value = 0x811C9DC5
    for byte in text.encode():
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"{value:08x}"


def machine_name(prefix: str, session_id: str, limit: int = 63) -> str:
    """A deterministic DNS-label name for ``session_id``: ``<prefix>-<sanitised id>-<hash>``.

    Lower-case letters, digits and ``-`` only, at most ``limit`` characters, starting and ending with an
    alphanumeric. When the name carries the id as it is (a ``devin-<hex>`` id does), the id alone keeps it
    apart from every other session's and the hash is the 32-bit FNV-1a the operator uses. When the id had
    to change (upper case, other characters, cut to fit), ids that sanitise alike must still differ, and 32
    bits can be collided on purpose: the hash is then 64 bits of the id's SHA-256 (16 hex digits), or the
    FNV-1a where ``limit`` leaves no room. Drivers still check, before using a name, that what has it is
    this session's (:func:`name_taken`).
    """
    sanitised = _UNSAFE.sub("-", session_id.lower()).strip("-")
    suffix = fnv1a32(session_id)
    room = limit - len(prefix) - len(suffix) - 2
    if room < 1:
        raise ValueError(f"prefix {prefix!r} leaves no room for the session id within {limit} characters")
    if sanitised[:room].strip("-") != session_id:
        strong = hashlib.sha256(session_id.encode()).hexdigest()[:16]
        if limit - len(prefix) - len(strong) - 2 >= 1:
            suffix = strong
            room = limit - len(prefix) - len(suffix) - 2
    middle = sanitised[:room].strip("-") or "session"
    return f"{prefix}-{middle}-{suffix}"


def name_taken(what: str, session_id: str) -> DriverError:
    """The error for a machine name held by another session (two ids whose names collide): never reused,
    since that would stop the other session's worker."""
    return DriverError(f"{what} already belongs to session {session_id!r}; not reusing it for another one")


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value (at most 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at
    both ends). Values that needed changing get a hash suffix, so they stay distinct."""
    if re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    body = re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:54].strip("-._") or "x"
    return f"{body}-{digest}"


@dataclass(frozen=True)
class SessionSpec:
    """What a driver is told about the session a machine is for (all of it from the claimed queue entry)."""

    session_id: str
    outpost_id: str
    acceptor_id: str
    platform: Optional[str] = None
    kind: str = "new"
    network_policy: Optional[Mapping[str, Any]] = None
    remote_binary_sha: Optional[str] = None

    def labels(self) -> dict[str, str]:
        """The labels of everything made for this session (values made label-safe)."""
        return {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_SESSION: label_value(self.session_id),
            LABEL_OUTPOST: label_value(self.outpost_id),
            LABEL_ACCEPTOR: label_value(self.acceptor_id),
        }


@dataclass(frozen=True)
class WorkerLaunch:
    """How to start the worker inside a machine: direct-serve mode for one pre-claimed session.

    The connect token is the only credential a machine ever gets (never the account token); drivers put
    :meth:`environment` into the worker's environment (a 0600 file, a Secret, a process environment),
    never into argv or a log line.
    """

    session_id: str
    connect_token: str = field(repr=False)
    gateway_url: str
    remote_binary_sha: Optional[str] = None
    static_base_url: Optional[str] = None
    #: The worker's ``--cache-dir`` inside the machine; ``None``: the driver's own choice.
    cache_dir: Optional[str] = None
    log_format: str = "text"
    #: The session's ``spec.network_policy`` (the wire dict), for the worker to enforce: a direct-serve
    #: worker never sees the claim.
    network_policy: Optional[Mapping[str, Any]] = None

    def environment(self) -> dict[str, str]:
        env = {
            "DEVIN_REMOTE_SESSION_TOKEN": self.connect_token,
            "DEVIN_OUTPOST_GATEWAY_URL": self.gateway_url,
            "DEVIN_WORKER_LOG_FORMAT": self.log_format,
        }
        if self.remote_binary_sha:
            env["DEVIN_WORKER_REMOTE_SHA"] = self.remote_binary_sha
        if self.static_base_url:
            env["DEVIN_WORKER_STATIC_BASE_URL"] = self.static_base_url
        if self.cache_dir:
            env["DEVIN_WORKER_CACHE_DIR"] = self.cache_dir
        if self.network_policy is not None:
            env[ENV_SESSION_NETWORK_POLICY] = json.dumps(dict(self.network_policy), separators=(",", ":"))
        return env

    def arguments(self) -> list[str]:
        """The worker's arguments after the command (``devin-outposts`` or ``python -m devin_outposts``).
        The id is glued to its option: an id such as ``-x`` or ``--help`` must not read as an option."""
        return ["worker", "start", f"--session={self.session_id}"]


@dataclass
class Machine:
    """One machine a driver made for one session; ``ref`` is the driver's own handle (a directory, a
    container or Pod name, an inventory host)."""

    name: str
    session_id: str
    outpost_id: str
    acceptor_id: str
    created_at: float = field(default_factory=time.time)
    ref: str = ""
    #: Driver-specific facts worth keeping (pid, host address, ...); never a secret.
    details: dict[str, Any] = field(default_factory=dict)


class WorkerState(str, enum.Enum):
    __str__ = str.__str__

    STARTING = "starting"  # provisioned, the worker not (yet) running: counts against the boot timeout
    RUNNING = "running"
    EXITED = "exited"  # the worker ended; ``exit_code`` says how
    MISSING = "missing"  # the machine is gone
    FAILED = "failed"  # the worker cannot start there (``reason`` says why): no wait will change it


@dataclass(frozen=True)
class WorkerStatus:
    state: WorkerState
    exit_code: Optional[int] = None
    #: Restarts the platform did by itself (a Pod's ``restartPolicy: OnFailure``); 0 elsewhere.
    restarts: int = 0
    detail: str = ""
    #: Why the worker is not starting, as the platform names it (``ErrImagePull``, ``Unschedulable``,
    #: ``pull-error``): set with :attr:`WorkerState.FAILED`, or with ``STARTING`` while the platform
    #: still retries. A reason that lasts ``--start-failure-grace`` seconds fails the session
    #: (docs/orchestrator.md, "Fast failure").
    reason: str = ""


@dataclass(frozen=True)
class Snapshot:
    """A session's kept state, made by :meth:`Driver.snapshot`, until the session is terminated, the
    snapshot TTL passes, or it is restored."""

    session_id: str
    outpost_id: str
    acceptor_id: str
    created_at: float
    ref: str


@dataclass(frozen=True)
class DriverContext:
    """What the orchestrator gives every driver besides its own options."""

    #: The orchestrator's own directory (private, 0700): drivers keep their files under
    #: ``<state_dir>/<driver name>/``.
    state_dir: Path
    #: The worker command inside a machine, before :meth:`WorkerLaunch.arguments` (for the ``process``
    #: driver: this Python's ``-m devin_outposts``; images and hosts have ``devin-outposts`` on PATH).
    worker_command: tuple[str, ...] = ("devin-outposts",)
    #: Seconds a machine may take from provisioning to a running worker before it is given up.
    boot_timeout: float = 300.0


# --- options: how a driver declares what it is configured with ---------------------------------------
#
# A driver's options reach it as one mapping (``--driver-config FILE`` in JSON or YAML, then each
# ``--driver-opt KEY=VALUE`` over it), so a value may be text where a number, a flag, a list or a mapping
# is meant: every kind's reader accepts both. Each driver declares its options once, as an
# :class:`OptionTable` of :class:`DriverOption` rows; the table refuses unknown keys, reads every value,
# and words every refusal alike (``unknown podman driver option imag; known: ...``, ``kubernetes driver
# option lease_duration must be a number of seconds, got 'soon'``). The docs' option tables are the same
# rows (:meth:`OptionTable.markdown`; a test compares them).


class OptionProblem(ValueError):
    """What is wrong with one option's value, as the end of a sentence that starts with the option
    (``must be positive, got '0'``); :meth:`OptionTable.read` names the driver and the option."""


class OptionKind(enum.Enum):
    """How an option's value is read (each kind takes text as well as the JSON or YAML type)."""

    TEXT = "text"
    NUMBER = "number"
    INTEGER = "integer"
    SECONDS = "seconds"
    FLAG = "flag"
    #: Shell words (a command line), split as ``sh`` would.
    WORDS = "words"
    #: Several names: a list, or text split on commas and spaces.
    NAMES = "names"
    #: A mapping, or a JSON object as text (what ``--driver-opt KEY={...}`` gives).
    MAPPING = "mapping"
    #: A local path, made absolute (``~`` expanded).
    PATH = "path"
    #: A local path that must exist.
    FILE = "file"


def _read_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise OptionProblem(f"must be text, got {type(value).__name__}")
    return str(value).strip()


def _number_reader(kind: type[float] | type[int], what: str) -> Callable[[Any], float]:
    def read(value: Any) -> float:
        text = str(value).strip()
        try:
            if isinstance(value, bool):
                raise ValueError(text)
            number = kind(text)
        except ValueError:
            raise OptionProblem(f"must be {what}, got {text!r}") from None
        if not math.isfinite(number):
            raise OptionProblem(f"must be {what}, got {text!r}")
        return number

    return read


def _read_flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    flag = truth(str(value))  # the words every yes/no option accepts (core/config.py)
    if flag is None:
        raise OptionProblem(f"must be true or false, got {value!r}")
    return flag


def _read_words(value: Any) -> tuple[str, ...]:
    try:
        return tuple(shlex.split(_read_text(value)))
    except ValueError as exc:  # an unclosed quote
        raise OptionProblem(f"must be shell words: {exc}") from None


def _read_names(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, (list, tuple)) else re.split(r"[\s,]+", str(value))
    return tuple(str(item).strip() for item in items if str(item).strip())


def _read_mapping(value: Any) -> Mapping[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise OptionProblem("must be a mapping (a JSON object as text)") from None
    if not isinstance(value, Mapping):
        raise OptionProblem(f"must be a mapping, got {type(value).__name__}")
    return value


def _read_path(value: Any) -> Path:
    return Path(_read_text(value)).expanduser().absolute()


def _read_file(value: Any) -> Path:
    path = _read_path(value)
    if not path.exists():
        raise OptionProblem(f": {path} does not exist")
    return path


_READERS: dict[OptionKind, Callable[[Any], Any]] = {
    OptionKind.TEXT: _read_text,
    OptionKind.NUMBER: _number_reader(float, "a number"),
    OptionKind.INTEGER: _number_reader(int, "a number"),
    OptionKind.SECONDS: _number_reader(float, "a number of seconds"),
    OptionKind.FLAG: _read_flag,
    OptionKind.WORDS: _read_words,
    OptionKind.NAMES: _read_names,
    OptionKind.MAPPING: _read_mapping,
    OptionKind.PATH: _read_path,
    OptionKind.FILE: _read_file,
}


@dataclass(frozen=True)
class DriverOption:
    """One option of a driver: its name, kind, default, bounds and docs, and any check of its own.

    A value that is absent, ``null`` or blank text is *not set*: the option takes :attr:`default` (a
    driver may compute a default from its context where this is ``None``; :attr:`default_doc` then
    says what it is).
    """

    name: str
    kind: OptionKind
    #: The meaning, as the docs' options table shows it (Markdown).
    doc: str
    default: Any = None
    #: The docs' "default" cell when :attr:`default` does not say it (a computed or a platform default).
    default_doc: Optional[str] = None
    required: bool = False
    #: Bounds of a number: ``above`` is excluded (``above=0``: positive), ``minimum`` is included.
    above: Optional[float] = None
    minimum: Optional[float] = None
    #: A word that sets the option to ``None``, past its default (``none`` lifts a limit).
    lift: Optional[str] = None
    #: A check of the read value that may also convert it; raises :class:`OptionProblem`.
    parse: Optional[Callable[[Any], Any]] = None

    def read(self, value: Any) -> Any:
        """The option's value from ``value`` as given; raises :class:`OptionProblem`."""
        if value is None or (isinstance(value, str) and not value.strip()):
            if self.required:
                raise OptionProblem("is required")
            return copy.copy(self.default)
        if self.lift is not None and isinstance(value, str) and value.strip().lower() == self.lift:
            return None
        result = _READERS[self.kind](value)
        if self.above is not None and result <= self.above:
            limit = "positive" if self.above == 0 else f"more than {self.above:g}"
            raise OptionProblem(f"must be {limit}, got {str(value).strip()!r}")
        if self.minimum is not None and result < self.minimum:
            raise OptionProblem(f"must be at least {self.minimum:g}, got {str(value).strip()!r}")
        return self.parse(result) if self.parse is not None else result

    def shown_default(self) -> str:
        """The docs' "default" cell."""
        if self.default_doc is not None:
            return self.default_doc
        if self.required:
            return "(required)"
        value = self.default
        if value is None or value == ():
            return "none"
        if isinstance(value, bool):
            return f"`{str(value).lower()}`"
        if isinstance(value, float):
            return f"`{value:g}`"
        if isinstance(value, Mapping):
            return f"`{json.dumps(dict(value))}`"
        return f"`{value}`"


class OptionTable(Mapping[str, DriverOption]):
    """A driver's options, by name, in the order the docs list them."""

    def __init__(self, driver: str, *rows: DriverOption) -> None:
        self.driver = driver
        self._rows = {row.name: row for row in rows}
        if len(self._rows) != len(rows):
            raise ValueError(f"the {driver} driver declares an option twice")

    def __getitem__(self, name: str) -> DriverOption:
        return self._rows[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def error(self, name: str, problem: str) -> DriverError:
        """The one-line error for option ``name``: ``<driver> driver option <name> <problem>``."""
        joint = "" if problem[:1] in (":", ".") else " "
        return DriverError(f"{self.driver} driver option {name}{joint}{problem}")

    def read(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Every declared option's value from ``options`` (its default where not set). An unknown key
        or a bad value raises :class:`DriverError` naming the driver and the option."""
        unknown = sorted(str(key) for key in options if key not in self._rows)
        if unknown:
            raise DriverError(f"unknown {self.driver} driver option {unknown[0]}; known: {', '.join(self)}")
        values = {}
        for name, row in self._rows.items():
            try:
                values[name] = row.read(options.get(name))
            except OptionProblem as exc:
                raise self.error(name, str(exc)) from None
        return values

    def markdown(self) -> str:
        """The docs' options table (docs/orchestrator*.md hold exactly this; a test compares)."""
        lines = ["| option | default | meaning |", "|---|---|---|"]
        lines += [f"| `{row.name}` | {row.shown_default()} | {row.doc} |" for row in self._rows.values()]
        return "\n".join(lines) + "\n"


class StatusSink(Protocol):
    """Where a :class:`StatusSource` writes (the orchestrator's
    :class:`~devin_outposts.orchestrator.drivers.status_board.StatusBoard`)."""

    def replace_all(self, statuses: Mapping[str, WorkerStatus], *, as_of: float) -> None:
        """A full listing, taken at ``as_of`` (monotonic, when the listing began)."""

    def put(self, name: str, status: WorkerStatus) -> None:
        """One machine's status changed (by its :attr:`Machine.name`)."""

    def gone(self, name: str, detail: str = "deleted") -> None:
        """One machine was deleted."""

    def lost_sync(self) -> None:
        """The stream broke: nothing on the board is trusted until the next listing."""


class StatusSource(Protocol):
    """A driver's one stream of its machines' statuses (:meth:`Driver.status_source`)."""

    async def run(self, board: StatusSink) -> None:
        """List, then follow, forever (until cancelled): :meth:`StatusSink.replace_all` after each
        listing, :meth:`StatusSink.put` or :meth:`StatusSink.gone` per event, and
        :meth:`StatusSink.lost_sync` as soon as the stream breaks (then list again, with a back-off)."""


class Leadership(Protocol):
    """Leader election for orchestrators that share an acceptor id across hosts (a Kubernetes Lease).

    ``async with`` waits until this process leads and keeps leading in the background; :attr:`lost` is set
    when the lead is lost, and the orchestrator must stop acting at once."""

    lost: asyncio.Event

    async def __aenter__(self) -> Any:
        """Wait until leading."""

    async def __aexit__(self, *exc: object) -> None:
        """Give the lead up."""


class Driver(abc.ABC):
    """Makes, starts, watches and destroys session machines. Subclasses set :attr:`name` and
    :attr:`option_table`.

    A driver is made with :meth:`from_options`: the common :class:`DriverContext` and its own options (a
    mapping from ``--driver-config FILE`` and ``--driver-opt KEY=VALUE``), read by its
    :attr:`option_table`, which raises :class:`DriverError` naming the driver and the option: a bad
    configuration fails at start-up, before any claim.
    """

    name: ClassVar[str]
    #: The driver's options, declared once (:class:`OptionTable`).
    option_table: ClassVar[OptionTable]
    #: True when the platform restarts a failed worker by itself (a Pod with ``restartPolicy:
    #: OnFailure``): the orchestrator then counts :attr:`WorkerStatus.restarts` instead of calling
    #: :meth:`start` again after a non-zero exit.
    restarts_in_place: ClassVar[bool] = False
    #: The OS of the machines this driver makes (``None``: whatever the user's playbook makes). Only
    #: sessions and outposts of this platform are claimed.
    platform: Optional[str] = "linux"

    @classmethod
    @abc.abstractmethod
    def from_options(cls, context: DriverContext, options: Mapping[str, Any]) -> Driver:
        """The driver, from its options as :attr:`option_table` reads them (unknown ones are refused)."""

    async def check(self) -> None:
        """Start-up checks (the tool is installed, the cluster answers); raises :class:`DriverError`."""
        return None

    @abc.abstractmethod
    async def provision(self, spec: SessionSpec) -> Machine:
        """Make the machine for ``spec`` (idempotent per session: an existing one is returned)."""

    @abc.abstractmethod
    async def start(self, machine: Machine, launch: WorkerLaunch) -> None:
        """Start the worker in ``machine``, replacing one already there (after a re-claim)."""

    @abc.abstractmethod
    async def status(self, machine: Machine) -> WorkerStatus:
        """The worker's state in ``machine``."""

    @abc.abstractmethod
    async def teardown(self, machine: Machine) -> None:
        """Destroy ``machine`` and what was made for it (secrets, work dirs). Gone already: no error."""

    @abc.abstractmethod
    async def list_owned(self, acceptor_id: str, outpost_id: str) -> list[Machine]:
        """Every machine this driver made for ``acceptor_id`` on ``outpost_id``, live or not."""

    @abc.abstractmethod
    async def snapshot(self, machine: Machine) -> Snapshot:
        """Keep ``machine``'s session state (state dir and ``repos/``) for a later resume."""

    @abc.abstractmethod
    async def restore(self, machine: Machine, snapshot: Snapshot) -> None:
        """Put ``snapshot`` into a freshly provisioned ``machine`` (before :meth:`start`); the snapshot
        is consumed."""

    @abc.abstractmethod
    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        """Every snapshot this driver keeps for ``acceptor_id`` on ``outpost_id``."""

    @abc.abstractmethod
    async def delete_snapshot(self, snapshot: Snapshot) -> None:
        """Drop ``snapshot`` (gone already: no error)."""

    async def sweep_orphans(self, acceptor_id: str, outpost_id: str, live_sessions: Container[str]) -> int:
        """Remove what this driver made besides machines and snapshots (per-session secrets) for sessions
        not in ``live_sessions``; returns how many. Drivers that make nothing else keep this default.
        ``live_sessions`` is asked at each decision (the orchestrator passes a live view: a session claimed
        while the sweep runs is live at once)."""
        return 0

    def status_source(self, acceptor_id: str) -> Optional[StatusSource]:
        """The driver's one stream of the statuses of every machine it made for ``acceptor_id`` (a
        list-and-watch, an event stream), or None: then each session reads its machine with
        :meth:`status` every ``--status-interval-secs`` (the default)."""
        return None

    def leadership(self, acceptor_id: str) -> Optional[Leadership]:
        """Leader election beyond the state-dir lock, or None (the default: one host, one lock)."""
        return None

    async def aclose(self) -> None:
        """Release the driver's own resources (clients, connections). Machines are left as they are."""
        return None
