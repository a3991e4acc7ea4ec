"""The ``podman`` driver: each session's worker runs in a container of its own, from an image with our
worker inside (python/devin-outposts/Containerfile; docs/orchestrator-podman.md).

What a machine is, in podman objects (every one labelled with :meth:`SessionSpec.labels` plus ours):

* a **state volume** ``outpost-state-<id>-<fnv>-<8 hex>`` mounted at ``/var/lib/devin-worker``: the worker's
  data dir (``worker/``: its binary cache and the session's state dir) and ``repos/``, the worker's
  working directory, which are what a snapshot keeps. The random suffix lets a fresh machine of a session
  live beside a snapshot of the same session;
* a **container** ``outpost-worker-<id>-<fnv>`` (:func:`machine_name`) that runs
  ``devin-outposts worker start --session=<id>`` in direct-serve mode, with podman's ``--init`` as PID 1
  (it forwards signals and reaps what the session's commands leave behind). Its labels name its state
  volume, so a restarted orchestrator finds the whole machine with one label query.

:meth:`PodmanDriver.provision` makes both, the container created but not started; podman cannot change a
container's environment, so :meth:`PodmanDriver.start` replaces it by one with the launch's environment.
That environment reaches podman through ``--env-file`` (0600, in the orchestrator's private state dir,
removed as soon as ``podman create`` returns), so the connect token is in no argv. podman itself runs
with our environment minus every ``DEVIN_*`` variable: the account token never reaches podman, and so
never a container.

**Snapshots.** Podman can neither rename a volume nor change its labels, so a snapshot is the state volume
itself plus a *marker*: an empty volume ``<state volume>-snapshot`` labelled ``kind=snapshot`` that names
it. Teardown keeps every state volume a marker names; :meth:`PodmanDriver.restore` re-creates the new
machine's container on the kept volume, then drops the marker and the machine's fresh volume; deleting a
snapshot removes both. Nothing is copied, whatever the size of ``repos/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qs, urlencode

from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    LABEL_OUTPOST,
    LABEL_SESSION,
    MACHINE_DATA_DIR,
    MACHINE_WORKDIR,
    MANAGED_BY,
    Driver,
    DriverContext,
    DriverError,
    Machine,
    SessionSpec,
    Snapshot,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    label_value,
    machine_name,
    name_taken,
    option_text,
)
from devin_outposts.worker.paths import make_private_dir

log = logging.getLogger(__name__)

#: Where the state volume is mounted in the container (the same path Cognition's operator mounts its
#: state PVC at), and the two directories in it.
MOUNT = "/var/lib/devin-worker"
DATA_DIR = f"{MOUNT}/{MACHINE_DATA_DIR}"
WORKDIR = f"{MOUNT}/{MACHINE_WORKDIR}"

#: Our labels besides :meth:`SessionSpec.labels`. ``ids`` holds the exact ids (URL-encoded), since the
#: label-safe values of :func:`label_value` may be hashed.
LABEL_KIND = "outposts.devin.ai/kind"
LABEL_IDS = "outposts.devin.ai/ids"
LABEL_CREATED = "outposts.devin.ai/created-at"
LABEL_STATE_VOLUME = "outposts.devin.ai/state-volume"
KIND_MACHINE = "machine"
KIND_STATE = "state"
KIND_SNAPSHOT = "snapshot"
MARKER_SUFFIX = "-snapshot"

DEFAULT_IMAGE = "localhost/devin-outposts-session:latest"
OPTIONS = (
    "image",
    "network",
    "cpus",
    "memory",
    "pids_limit",
    "user",
    "init",
    "worker_command",
    "podman",
    "stop_grace",
    "command_timeout",
)
#: Network modes podman knows by name; anything else must be an existing podman network.
BUILTIN_NETWORKS = ("bridge", "host", "none", "private", "slirp4netns", "pasta")
_MEMORY = re.compile(r"[0-9]+(\.[0-9]+)?\s*([kmgt]i?b?|b)?", re.IGNORECASE)
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
#: What podman writes to stderr when the container or volume asked for does not exist (its exit code,
#: 125, is the one of every other failure too).
_NOT_FOUND_TEXT = (
    "no such container",
    "no such volume",
    "no such object",
    "not found",
    "no container with name",
    "no volume with name",
)
#: Attempts at a listing that failed because an object in it vanished meanwhile (``podman volume ls``
#: inspects every volume it lists: one removed by a concurrent teardown fails the whole listing).
LIST_ATTEMPTS = 3


@dataclass(frozen=True)
class Limits:
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


@dataclass(frozen=True)
class _Result:
    code: int
    stdout: str
    stderr: str

    def error_line(self) -> str:
        """The last meaningful line of podman's stderr (its ``Error: ...``), for a one-line DriverError."""
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("Error: ")]
        text = (errors or lines or [f"exit code {self.code}"])[-1]
        return text[len("Error: ") :] if text.startswith("Error: ") else text

    def not_found(self) -> bool:
        return self.code != 0 and any(marker in self.stderr.lower() for marker in _NOT_FOUND_TEXT)


def _option_number(options: Mapping[str, Any], key: str, kind: type[float] | type[int]) -> Optional[float]:
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


def _option_bool(options: Mapping[str, Any], key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise DriverError(f"podman driver option {key} must be true or false, got {value!r}")


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text or "null")
    except ValueError as exc:
        raise DriverError(f"cannot read podman's answer to {what}: {exc}") from None


def _labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """An inspected or listed object's labels (podman puts them in different places, sometimes null)."""
    labels = obj.get("Labels")
    if labels is None:
        config = obj.get("Config")
        labels = config.get("Labels") if isinstance(config, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {str(key): str(value) for key, value in labels.items()}


def _ids_label(session_id: str, outpost_id: str, acceptor_id: str) -> str:
    """The exact ids as one label value. URL-encoded: ``podman volume create --label`` parses its value
    as CSV, so a comma or a quote in an id would split or break it."""
    return urlencode({"acceptor_id": acceptor_id, "outpost_id": outpost_id, "session_id": session_id})


def _ids(labels: Mapping[str, str]) -> dict[str, str]:
    data = parse_qs(labels.get(LABEL_IDS, ""), keep_blank_values=True)
    # Fall back on the label-safe values (equal to the ids unless they needed hashing).
    fallback = {"session_id": LABEL_SESSION, "outpost_id": LABEL_OUTPOST, "acceptor_id": LABEL_ACCEPTOR}
    return {key: (data.get(key) or [labels.get(label, "")])[0] for key, label in fallback.items()}


def _created(labels: Mapping[str, str], fallback: float = 0.0) -> float:
    try:
        return float(labels.get(LABEL_CREATED, fallback))
    except ValueError:
        return fallback


def _our_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Ours among a container's labels (podman adds the image's own, which are not carried over)."""
    return {
        key: value for key, value in labels.items() if key.startswith(("outposts.", "app.kubernetes.io/"))
    }


def _owner_filters(acceptor_id: str, outpost_id: str, kind: str) -> list[str]:
    """``--filter`` arguments for our objects of ``kind``. They only narrow the listing: podman 4.3 ANDs
    label filters for containers but ORs them for volumes, so every listing is checked by
    :func:`_owned_by` as well."""
    wanted = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_ACCEPTOR: label_value(acceptor_id),
        LABEL_OUTPOST: label_value(outpost_id),
        LABEL_KIND: kind,
    }
    args: list[str] = []
    for key, value in wanted.items():
        args += ["--filter", f"label={key}={value}"]
    return args


def _owned_by(labels: Mapping[str, str], acceptor_id: str, outpost_id: str, kind: str) -> bool:
    """The test :func:`_owner_filters` stands for, in Python: what we act on never rests on podman's
    filter semantics."""
    ids = _ids(labels)
    return (
        labels.get(LABEL_MANAGED_BY) == MANAGED_BY
        and labels.get(LABEL_KIND) == kind
        and ids["acceptor_id"] == acceptor_id
        and ids["outpost_id"] == outpost_id
    )


def _env_file_text(env: Mapping[str, str]) -> str:
    lines = []
    for key, value in env.items():
        # podman's env-file format is one KEY=VALUE per line, taken literally: a line break cannot be
        # carried. The value itself is never named in the error (it may be the token).
        if "\n" in value or "\r" in value or "\0" in value:
            raise DriverError(f"the worker's environment variable {key} holds a line break or NUL")
        lines.append(f"{key}={value}\n")
    return "".join(lines)


class PodmanDriver(Driver):
    name = "podman"

    def __init__(
        self,
        root: Path,
        *,
        image: str = DEFAULT_IMAGE,
        network: Optional[str] = None,
        limits: Limits = Limits(),
        user: Optional[str] = None,
        init: bool = True,
        worker_command: Sequence[str] = ("devin-outposts",),
        podman: str = "podman",
        stop_grace: float = 10.0,
        command_timeout: float = 120.0,
    ) -> None:
        self.root = root
        self.env_dir = root / "env"
        self.image = image
        self.network = network
        self.limits = limits
        self.user = user
        self.init = init
        self.worker_command = tuple(worker_command)
        self.podman = podman
        self.stop_grace = stop_grace
        self.command_timeout = command_timeout
        #: Env files of ``podman create`` calls in progress (the sweep removes any other one).
        self._env_files_in_use: set[Path] = set()

    @classmethod
    def from_options(cls, context: DriverContext, options: Mapping[str, Any]) -> PodmanDriver:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise DriverError(f"unknown podman driver option {unknown[0]}; known: {', '.join(OPTIONS)}")
        memory = option_text(options, "memory")
        if memory is not None and not _MEMORY.fullmatch(memory.strip()):
            raise DriverError(
                f"podman driver option memory must be a size such as 2g or 512m, got {memory!r}"
            )
        cpus = _option_number(options, "cpus", float)
        pids = _option_number(options, "pids_limit", int)
        command_text = option_text(options, "worker_command")
        command = tuple(shlex.split(command_text)) if command_text else tuple(context.worker_command)
        if not command:
            raise DriverError("podman driver option worker_command is empty")
        return cls(
            context.state_dir / cls.name,
            image=option_text(options, "image", DEFAULT_IMAGE) or DEFAULT_IMAGE,
            network=option_text(options, "network"),
            limits=Limits(
                cpus=cpus,
                memory=memory.strip() if memory else None,
                pids_limit=int(pids) if pids is not None else None,
            ),
            user=option_text(options, "user"),
            init=_option_bool(options, "init", True),
            worker_command=command,
            podman=option_text(options, "podman", "podman") or "podman",
            stop_grace=_option_number(options, "stop_grace", float) or 10.0,
            command_timeout=_option_number(options, "command_timeout", float) or 120.0,
        )

    @property
    def _grace(self) -> str:
        """The stop grace as podman's whole seconds."""
        return str(max(1, round(self.stop_grace)))

    # --- calling podman --------------------------------------------------------------------------

    def _podman_environment(self) -> dict[str, str]:
        # podman and conmon inherit this; a container gets none of it unless asked, but the account
        # token (DEVIN_OUTPOSTS_TOKEN) has no business in any process of the container stack.
        return {key: value for key, value in os.environ.items() if not key.startswith("DEVIN_")}

    async def _run(self, *args: str, what: str) -> _Result:
        """``podman <args>`` without a shell; ``what`` names the operation in errors."""
        # No argv of ours holds a secret (the token travels in the env file), so it can be logged.
        log.debug("podman %s", shlex.join(args))
        try:
            proc = await asyncio.create_subprocess_exec(
                self.podman,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._podman_environment(),
            )
        except OSError as exc:
            raise DriverError(f"cannot run {self.podman} to {what}: {exc}") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.command_timeout)
        except asyncio.TimeoutError:
            await self._kill(proc)
            raise DriverError(f"podman did not {what} within {self.command_timeout:g} s") from None
        except asyncio.CancelledError:
            # The orchestrator gave up on this step (its provision timeout, a shutdown): no podman call
            # may go on acting behind its back.
            await asyncio.shield(self._kill(proc))
            raise
        code = proc.returncode if proc.returncode is not None else -1
        return _Result(code, out.decode(errors="replace"), err.decode(errors="replace"))

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()

    async def _check(self, *args: str, what: str) -> _Result:
        result = await self._run(*args, what=what)
        if result.code != 0:
            raise DriverError(f"Could not {what}: {result.error_line()}")
        return result

    async def _inspect(self, kind: str, name: str) -> Optional[dict[str, Any]]:
        """``podman <kind> inspect <name>`` as a mapping; None when it does not exist."""
        result = await self._run(kind, "inspect", "--format", "json", name, what=f"inspect {kind} {name}")
        if result.code != 0:
            if result.not_found():
                return None
            raise DriverError(f"Could not inspect {kind} {name}: {result.error_line()}")
        data = _parse_json(result.stdout, f"{kind} inspect {name}")
        if isinstance(data, list) and data and isinstance(data[0], dict):
            return data[0]
        return None

    async def _list(self, args: Iterable[str], what: str) -> list[dict[str, Any]]:
        """A listing as mappings. One that failed because something in it was removed meanwhile (another
        session's teardown) is asked again: that object is simply not listed any more."""
        argv = [*args, "--format", "json"]
        for attempt in range(LIST_ATTEMPTS):
            result = await self._run(*argv, what=what)
            if result.code == 0 or not result.not_found() or attempt + 1 == LIST_ATTEMPTS:
                break
        if result.code != 0:
            raise DriverError(f"Could not {what}: {result.error_line()}")
        data = _parse_json(result.stdout, what)
        return [item for item in data if isinstance(item, dict)] if isinstance(data, list) else []

    # --- start-up ----------------------------------------------------------------------------------

    async def check(self) -> None:
        result = await self._run("version", "--format", "json", what="report its version")
        if result.code != 0:
            raise DriverError(f"podman is not usable: {result.error_line()}")
        exists = await self._run("image", "exists", self.image, what=f"look for image {self.image}")
        if exists.code == 1:
            raise DriverError(
                f"podman image {self.image} not found: build it (python/devin-outposts/Containerfile) "
                "or pull it, or set the driver option image"
            )
        if exists.code != 0:
            raise DriverError(f"Could not look for podman image {self.image}: {exists.error_line()}")
        if self.network and self.network not in BUILTIN_NETWORKS and ":" not in self.network:
            found = await self._run(
                "network", "exists", self.network, what=f"look for network {self.network}"
            )
            if found.code != 0:
                raise DriverError(f"podman network {self.network} not found (driver option network)")
        try:
            make_private_dir(self.root)
            make_private_dir(self.env_dir)
        except OSError as exc:
            raise DriverError(f"cannot use {self.root}: {exc}") from exc

    # --- machines ----------------------------------------------------------------------------------

    def _create_arguments(
        self, name: str, labels: Mapping[str, str], volume: str, session_id: str, env_file: Optional[Path]
    ) -> list[str]:
        args = ["create", "--name", name, "--pull", "missing"]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        args += ["--volume", f"{volume}:{MOUNT}", "--workdir", WORKDIR]
        # Stopping waits this long after SIGTERM before SIGKILL (the worker drains on the first TERM).
        args += ["--stop-timeout", self._grace]
        if self.init:
            args.append("--init")
        if self.network:
            args += ["--network", self.network]
        if self.user:
            args += ["--user", self.user]
        args += self.limits.arguments()
        if env_file is not None:
            args += ["--env-file", str(env_file)]
        args += ["--entrypoint", json.dumps(list(self.worker_command)), self.image]
        args += WorkerLaunch(session_id, "", "").arguments()
        return args

    async def provision(self, spec: SessionSpec) -> Machine:
        name = machine_name("outpost-worker", spec.session_id)
        existing = await self._inspect("container", name)
        if existing is not None:
            labels = _labels_of(existing)
            if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_MACHINE:
                raise DriverError(f"container {name} exists and is not one of ours")
            owner = _ids(labels)
            if owner["session_id"] != spec.session_id:
                raise name_taken(f"container {name}", owner["session_id"])
            if (owner["acceptor_id"], owner["outpost_id"]) != (spec.acceptor_id, spec.outpost_id):
                # Another orchestrator's machine for this session (names are per host, not per acceptor):
                # never adopted here, as its worker may still serve the session with that one's token.
                raise DriverError(
                    f"container {name} belongs to acceptor {owner['acceptor_id']} on outpost "
                    f"{owner['outpost_id']}"
                )
            return self._machine(name, labels, str(existing.get("ImageName") or self.image))
        created = round(time.time(), 3)  # what the label keeps
        ids = _ids_label(spec.session_id, spec.outpost_id, spec.acceptor_id)
        common = {**spec.labels(), LABEL_IDS: ids, LABEL_CREATED: f"{created:.3f}"}
        volume = f"{machine_name('outpost-state', spec.session_id, limit=54)}-{secrets.token_hex(4)}"
        await self._create_volume(volume, {**common, LABEL_KIND: KIND_STATE})
        labels = {**common, LABEL_KIND: KIND_MACHINE, LABEL_STATE_VOLUME: volume}
        try:
            await self._check(
                *self._create_arguments(name, labels, volume, spec.session_id, None),
                what=f"create container {name}",
            )
        except DriverError:
            with contextlib.suppress(DriverError):
                await self._remove_volume(volume)
            raise
        return self._machine(name, labels)

    def _machine(self, name: str, labels: Mapping[str, str], image: Optional[str] = None) -> Machine:
        ids = _ids(labels)
        return Machine(
            name=name,
            session_id=ids["session_id"],
            outpost_id=ids["outpost_id"],
            acceptor_id=ids["acceptor_id"],
            created_at=_created(labels),
            ref=name,
            # The image the container was made from: after an upgrade it may differ from the option.
            details={"volume": labels.get(LABEL_STATE_VOLUME, ""), "image": image or self.image},
        )

    async def _create_volume(self, name: str, labels: Mapping[str, str]) -> None:
        args = ["volume", "create"]
        for key, value in labels.items():
            args += ["--label", f"{key}={value}"]
        await self._check(*args, name, what=f"create volume {name}")

    async def _remove_volume(self, name: str) -> bool:
        """Remove volume ``name`` (gone already: False). Never ``--force``: that would also remove the
        containers using it; a volume still in use is an error."""
        result = await self._run("volume", "rm", name, what=f"remove volume {name}")
        if result.code == 0:
            return True
        if result.not_found():
            return False
        raise DriverError(f"Could not remove volume {name}: {result.error_line()}")

    async def _machine_container(self, machine: Machine) -> dict[str, Any]:
        found = await self._inspect("container", machine.name)
        if found is None:
            raise DriverError(f"machine {machine.name} does not exist (no container)")
        labels = _labels_of(found)
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_MACHINE:
            raise DriverError(f"container {machine.name} is not one of ours")
        return found

    async def _stop_and_remove(self, name: str) -> None:
        """Stop the worker (SIGTERM twice: the first drains, the second stops its devin-remote at once;
        SIGKILL after the grace) and remove the container. Gone already: nothing to do."""
        await self._run("kill", "--signal", "TERM", name, what=f"signal container {name}")
        result = await self._run(
            "rm", "--force", "--time", self._grace, name, what=f"remove container {name}"
        )
        if result.code != 0 and not result.not_found():
            raise DriverError(f"Could not remove container {name}: {result.error_line()}")

    async def _recreate(
        self, machine: Machine, labels: Mapping[str, str], volume: str, launch: Optional[WorkerLaunch]
    ) -> None:
        """Replace the machine's container by a new one on ``volume`` (with ``launch``'s environment)."""
        await self._stop_and_remove(machine.name)
        env_file = None
        if launch is not None:
            env = launch.environment()
            # The data dir must be on the state volume (a snapshot keeps it), whatever the launch says.
            env["DEVIN_WORKER_CACHE_DIR"] = f"{DATA_DIR}/cache"
            env["DEVIN_WORKER_WORKDIR"] = WORKDIR
            env_file = self._write_env_file(machine.name, env)
        try:
            await self._check(
                *self._create_arguments(machine.name, labels, volume, machine.session_id, env_file),
                what=f"create container {machine.name}",
            )
        finally:
            if env_file is not None:
                self._env_files_in_use.discard(env_file)
                with contextlib.suppress(FileNotFoundError):
                    env_file.unlink()

    def _write_env_file(self, name: str, env: Mapping[str, str]) -> Path:
        text = _env_file_text(env)
        try:
            make_private_dir(self.root)
            make_private_dir(self.env_dir)
            path = self.env_dir / f"{name}.{secrets.token_hex(4)}.env"
            # Created 0600 and exclusive: never a file someone else made, never readable by others.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self._env_files_in_use.add(path)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            raise DriverError(f"cannot write the worker's env file for {name}: {exc}") from exc
        return path

    async def start(self, machine: Machine, launch: WorkerLaunch) -> None:
        found = await self._machine_container(machine)
        labels = _labels_of(found)
        ours = _our_labels(labels)
        volume = labels.get(LABEL_STATE_VOLUME, "")
        if not volume:
            raise DriverError(f"container {machine.name} names no state volume")
        await self._recreate(machine, ours, volume, launch)
        await self._check("start", machine.name, what=f"start container {machine.name}")

    async def status(self, machine: Machine) -> WorkerStatus:
        found = await self._inspect("container", machine.name)
        if found is None:
            return WorkerStatus(WorkerState.MISSING, detail="container gone")
        raw_state = found.get("State")
        state: Mapping[str, Any] = raw_state if isinstance(raw_state, dict) else {}
        status = str(state.get("Status", "")).lower()
        if status in ("created", "configured", "initialized"):
            return WorkerStatus(WorkerState.STARTING, detail=f"container {status}")
        if status in ("running", "paused", "stopping"):
            return WorkerStatus(
                WorkerState.RUNNING, detail="" if status == "running" else f"container {status}"
            )
        if status in ("exited", "stopped"):
            try:
                code = int(state.get("ExitCode", 1))
            except (TypeError, ValueError):
                code = 1
            detail = "killed for lack of memory" if state.get("OOMKilled") else ""
            return WorkerStatus(WorkerState.EXITED, exit_code=code, detail=detail)
        if status == "removing":
            return WorkerStatus(WorkerState.MISSING, detail="container being removed")
        # A state this driver does not know: not running, not ended; the boot timeout bounds it.
        return WorkerStatus(WorkerState.STARTING, detail=f"container state {status or 'unknown'}")

    async def teardown(self, machine: Machine) -> None:
        found = await self._inspect("container", machine.name)
        volumes: set[str] = set()
        if found is not None:
            labels = _labels_of(found)
            if labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
                raise DriverError(f"container {machine.name} is not one of ours")
            if labels.get(LABEL_STATE_VOLUME):
                volumes.add(labels[LABEL_STATE_VOLUME])
            await self._stop_and_remove(machine.name)
        # Also the session's state volumes no container names any more (a provision or restore that was
        # interrupted), but never one a snapshot keeps. Listed by this session's label alone: a listing
        # of every session's volumes fails when another session's teardown removes one meanwhile.
        states, markers = await self._session_volumes(machine)
        volumes.update(str(volume.get("Name", "")) for volume in states)
        kept = {_labels_of(marker).get(LABEL_STATE_VOLUME, "") for marker in markers}
        for volume_name in sorted(volumes - kept - {""}):
            await self._remove_volume(volume_name)
        self._remove_env_files(machine.name)

    def _remove_env_files(self, name: str) -> None:
        if not self.env_dir.is_dir():
            return
        for path in self.env_dir.glob(f"{name}.*.env"):
            if path not in self._env_files_in_use:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()

    async def list_owned(self, acceptor_id: str, outpost_id: str) -> list[Machine]:
        found = []
        for item in await self._list(
            ["ps", "--all", *_owner_filters(acceptor_id, outpost_id, KIND_MACHINE)], "list containers"
        ):
            labels = _labels_of(item)
            names = item.get("Names") or []
            if not _owned_by(labels, acceptor_id, outpost_id, KIND_MACHINE) or not names:
                continue
            machine = self._machine(str(names[0]), labels, str(item.get("Image") or self.image))
            if not machine.created_at:
                with contextlib.suppress(TypeError, ValueError):
                    machine.created_at = float(item.get("Created", 0))
            found.append(machine)
        return sorted(found, key=lambda m: m.name)

    # --- snapshots ---------------------------------------------------------------------------------

    async def _volumes(self, acceptor_id: str, outpost_id: str, kind: str) -> list[dict[str, Any]]:
        listed = await self._list(
            ["volume", "ls", *_owner_filters(acceptor_id, outpost_id, kind)], f"list {kind} volumes"
        )
        return [item for item in listed if _owned_by(_labels_of(item), acceptor_id, outpost_id, kind)]

    async def _session_volumes(self, machine: Machine) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The state volumes and snapshot markers of ``machine``'s session (ours, for its acceptor and
        outpost), from one listing filtered on the session's label only (one filter: podman 4.3 ORs
        several), so that no other session's volume is looked at."""
        label = f"label={LABEL_SESSION}={label_value(machine.session_id)}"
        listed = await self._list(["volume", "ls", "--filter", label], f"list the volumes of {machine.name}")
        found: dict[str, list[dict[str, Any]]] = {KIND_STATE: [], KIND_SNAPSHOT: []}
        for item in listed:
            labels = _labels_of(item)
            if _ids(labels)["session_id"] != machine.session_id:
                continue
            for kind, items in found.items():
                if _owned_by(labels, machine.acceptor_id, machine.outpost_id, kind):
                    items.append(item)
        return found[KIND_STATE], found[KIND_SNAPSHOT]

    async def _state_volumes(self, acceptor_id: str, outpost_id: str) -> list[dict[str, Any]]:
        return await self._volumes(acceptor_id, outpost_id, KIND_STATE)

    async def _markers(self, acceptor_id: str, outpost_id: str) -> list[dict[str, Any]]:
        return await self._volumes(acceptor_id, outpost_id, KIND_SNAPSHOT)

    def _snapshot_of(self, marker: Mapping[str, Any]) -> Snapshot:
        labels = _labels_of(marker)
        ids = _ids(labels)
        return Snapshot(
            session_id=ids["session_id"],
            outpost_id=ids["outpost_id"],
            acceptor_id=ids["acceptor_id"],
            created_at=_created(labels),
            ref=labels.get(LABEL_STATE_VOLUME, ""),
        )

    async def snapshot(self, machine: Machine) -> Snapshot:
        found = await self._machine_container(machine)
        labels = _labels_of(found)
        volume = labels.get(LABEL_STATE_VOLUME, "")
        if not volume:
            raise DriverError(f"container {machine.name} names no state volume")
        # A running worker would go on writing into the kept state.
        await self._run("kill", "--signal", "TERM", machine.name, what=f"signal container {machine.name}")
        await self._check(
            "stop", "--time", self._grace, machine.name,
            what=f"stop container {machine.name}",
        )  # fmt: skip
        marker_name = volume + MARKER_SUFFIX
        # An older snapshot of this session: the newer state wins.
        for marker in await self._markers(machine.acceptor_id, machine.outpost_id):
            older = self._snapshot_of(marker)
            if older.session_id == machine.session_id and older.ref != volume:
                await self.delete_snapshot(older)
        existing = await self._inspect("volume", marker_name)
        if existing is not None:  # snapshot() again after a failure: the marker is there already
            return self._snapshot_of(existing)
        created = round(time.time(), 3)  # what the label keeps
        marker_labels = {
            key: value
            for key, value in labels.items()
            if key in (LABEL_MANAGED_BY, LABEL_SESSION, LABEL_OUTPOST, LABEL_ACCEPTOR, LABEL_IDS)
        }
        marker_labels.update(
            {LABEL_KIND: KIND_SNAPSHOT, LABEL_STATE_VOLUME: volume, LABEL_CREATED: f"{created:.3f}"}
        )
        await self._create_volume(marker_name, marker_labels)
        return Snapshot(machine.session_id, machine.outpost_id, machine.acceptor_id, created, volume)

    async def _kept_volume(self, snapshot: Snapshot) -> dict[str, str]:
        """The labels of ``snapshot``'s state volume, after checking it is ours and still a snapshot."""
        volume = await self._inspect("volume", snapshot.ref) if snapshot.ref else None
        labels = _labels_of(volume) if volume is not None else {}
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_STATE:
            raise DriverError(f"snapshot {snapshot.ref or '(none)'} is not one of ours")
        if await self._inspect("volume", snapshot.ref + MARKER_SUFFIX) is None:
            raise DriverError(f"snapshot {snapshot.ref} is gone (restored or deleted)")
        return labels

    async def restore(self, machine: Machine, snapshot: Snapshot) -> None:
        kept = await self._kept_volume(snapshot)
        if _ids(kept)["session_id"] != machine.session_id:
            raise DriverError(f"snapshot {snapshot.ref} is of another session than machine {machine.name}")
        found = await self._machine_container(machine)
        labels = _labels_of(found)
        fresh = labels.get(LABEL_STATE_VOLUME, "")
        ours = _our_labels(labels)
        ours[LABEL_STATE_VOLUME] = snapshot.ref
        # In this order, so that an interruption never leaves the kept state unnamed: the container names
        # it first, then the marker goes, then the fresh volume (an orphan the sweep collects otherwise).
        await self._recreate(machine, ours, snapshot.ref, None)
        await self._remove_volume(snapshot.ref + MARKER_SUFFIX)
        if fresh and fresh != snapshot.ref:
            await self._remove_volume(fresh)
        machine.details["volume"] = snapshot.ref

    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        found = [self._snapshot_of(marker) for marker in await self._markers(acceptor_id, outpost_id)]
        return sorted((s for s in found if s.ref), key=lambda s: (s.created_at, s.ref))

    async def delete_snapshot(self, snapshot: Snapshot) -> None:
        if not snapshot.ref:
            return
        marker = await self._inspect("volume", snapshot.ref + MARKER_SUFFIX)
        if marker is None:
            # Restored (the volume is a machine's now) or deleted already: nothing of the snapshot is left.
            return
        if _labels_of(marker).get(LABEL_MANAGED_BY) != MANAGED_BY:
            raise DriverError(f"snapshot {snapshot.ref} is not one of ours")
        volume = await self._inspect("volume", snapshot.ref)
        if volume is not None:
            labels = _labels_of(volume)
            if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or labels.get(LABEL_KIND) != KIND_STATE:
                raise DriverError(f"snapshot {snapshot.ref} is not one of ours")
            await self._remove_volume(snapshot.ref)
        await self._remove_volume(snapshot.ref + MARKER_SUFFIX)

    # --- garbage ---------------------------------------------------------------------------------

    async def sweep_orphans(self, acceptor_id: str, outpost_id: str, live_sessions: set[str]) -> int:
        """State volumes of ended sessions that no container and no snapshot names (left by an interrupted
        provision or restore), markers whose volume is gone, and env files no ``podman create`` uses."""
        removed = 0
        named = {m.details.get("volume", "") for m in await self.list_owned(acceptor_id, outpost_id)}
        markers = await self._markers(acceptor_id, outpost_id)
        kept = {_labels_of(m).get(LABEL_STATE_VOLUME, "") for m in markers}
        states = await self._state_volumes(acceptor_id, outpost_id)
        for volume in states:
            labels = _labels_of(volume)
            name = str(volume.get("Name", ""))
            if not name:
                continue
            if name in named or name in kept or _ids(labels)["session_id"] in live_sessions:
                continue
            if await self._remove_volume(name):
                removed += 1
        existing = {str(v.get("Name", "")) for v in states}
        for marker in markers:
            gone = _labels_of(marker).get(LABEL_STATE_VOLUME, "") not in existing
            if gone and await self._remove_volume(str(marker.get("Name", ""))):
                removed += 1
        if self.env_dir.is_dir():
            for path in self.env_dir.glob("*.env"):
                if path not in self._env_files_in_use:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                        removed += 1
        return removed

    async def aclose(self) -> None:
        return None
