"""The podman objects of a machine, as the driver names, labels and reads them.

Constants (mount points, label keys, kinds), the labels' helpers (the exact ids are URL-encoded in one
label, since label-safe values may be hashed), podman's answers (:class:`Result`), the env-file format,
and a container's state read as its worker's (:func:`worker_status_of`).
Everything the driver acts on is checked against these labels in Python (:func:`owned_by`): podman's
label filters only narrow a listing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
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
    DriverError,
    WorkerState,
    WorkerStatus,
    label_value,
)

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
#: The connect token's secret: made for one ``podman create`` and removed right after (podman has copied
#: it into the container by then), mounted at ``/run/secrets/<TOKEN_TARGET>`` (0400, the worker's uid).
KIND_TOKEN = "token"  # noqa: S105 - a label value, not a secret
TOKEN_VARIABLE = "DEVIN_REMOTE_SESSION_TOKEN"  # noqa: S105 - a variable name
TOKEN_TARGET = "session-token"  # noqa: S105 - a file name
TOKEN_SECRET_PREFIX = "outpost-session-token-"  # noqa: S105 - a name prefix
TOKEN_SECRET = re.compile(TOKEN_SECRET_PREFIX + "[0-9a-f]{16}")
#: The container's entrypoint before the worker command: it hands the token file to the worker in its
#: environment, so the token is in no container configuration `podman inspect` shows.
TOKEN_ENTRYPOINT = (
    f"if [ -r /run/secrets/{TOKEN_TARGET} ]; then {TOKEN_VARIABLE}=$(cat /run/secrets/{TOKEN_TARGET}) "
    f'|| exit 78; export {TOKEN_VARIABLE}; fi; exec "$@"'
)
#: What podman writes to stderr when the container or volume asked for does not exist (its exit code,
#: 125, is the one of every other failure too).
NOT_FOUND_TEXT = (
    "no such container",
    "no such volume",
    "no such object",
    "not found",
    "no container with name",
    "no volume with name",
    "no such secret",
)
#: The reasons a worker cannot start in podman (docs/orchestrator-podman.md, "Fast failure").
REASON_PULL_ERROR = "pull-error"
REASON_INVALID_IMAGE = "invalid-image"
REASON_EXEC_FAILED = "exec-failed"
REASON_START_ERROR = "start-error"
#: What podman 4.3 writes to stderr for each of them (lower case; the first reason that matches wins).
FAILURE_TEXT = (
    (REASON_INVALID_IMAGE, ("invalid reference format", "repository name must be lowercase")),
    (
        REASON_PULL_ERROR,
        (
            "initializing source",
            "pinging container registry",
            "manifest unknown",
            "unable to pull",
            "reading manifest",
            "requested access to the resource is denied",
            "short-name resolution",
        ),
    ),
    (
        REASON_EXEC_FAILED,
        (
            "attempted to invoke a command that was not found",
            "permission denied: oci permission denied",
            "executable file not found",
            "exec format error",
        ),
    ),
    (REASON_START_ERROR, ("oci runtime error", "runc create failed", "crun: ", "unable to start container")),
)
#: Attempts at a listing that failed because an object in it vanished meanwhile (``podman volume ls``
#: inspects every volume it lists: one removed by a concurrent teardown fails the whole listing).
LIST_ATTEMPTS = 3


@dataclass(frozen=True)
class Result:
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
        return self.code != 0 and any(marker in self.stderr.lower() for marker in NOT_FOUND_TEXT)


def parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text or "null")
    except ValueError as exc:
        raise DriverError(f"cannot read podman's answer to {what}: {exc}") from None


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    """An inspected or listed object's labels (podman puts them in different places, sometimes null)."""
    labels = obj.get("Labels")
    if labels is None:
        config = obj.get("Config")
        labels = config.get("Labels") if isinstance(config, Mapping) else None
    if not isinstance(labels, Mapping):
        return {}
    return {str(key): str(value) for key, value in labels.items()}


def ids_label(session_id: str, outpost_id: str, acceptor_id: str) -> str:
    """The exact ids as one label value. URL-encoded: ``podman volume create --label`` parses its value
    as CSV, so a comma or a quote in an id would split or break it."""
    return urlencode({"acceptor_id": acceptor_id, "outpost_id": outpost_id, "session_id": session_id})


def ids_of(labels: Mapping[str, str]) -> dict[str, str]:
    data = parse_qs(labels.get(LABEL_IDS, ""), keep_blank_values=True)
    # Fall back on the label-safe values (equal to the ids unless they needed hashing).
    fallback = {"session_id": LABEL_SESSION, "outpost_id": LABEL_OUTPOST, "acceptor_id": LABEL_ACCEPTOR}
    return {key: (data.get(key) or [labels.get(label, "")])[0] for key, label in fallback.items()}


def created_at_of(labels: Mapping[str, str], fallback: float = 0.0) -> float:
    try:
        return float(labels.get(LABEL_CREATED, fallback))
    except ValueError:
        return fallback


def our_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """Ours among a container's labels (podman adds the image's own, which are not carried over)."""
    return {
        key: value for key, value in labels.items() if key.startswith(("outposts.", "app.kubernetes.io/"))
    }


def owner_filters(acceptor_id: str, outpost_id: str, kind: str) -> list[str]:
    """``--filter`` arguments for our objects of ``kind``. They only narrow the listing: podman 4.3 ANDs
    label filters for containers but ORs them for volumes, so every listing is checked by
    :func:`owned_by` as well."""
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


def owned_by(labels: Mapping[str, str], acceptor_id: str, outpost_id: str, kind: str) -> bool:
    """The test :func:`owner_filters` stands for, in Python: what we act on never rests on podman's
    filter semantics."""
    ids = ids_of(labels)
    return (
        labels.get(LABEL_MANAGED_BY) == MANAGED_BY
        and labels.get(LABEL_KIND) == kind
        and ids["acceptor_id"] == acceptor_id
        and ids["outpost_id"] == outpost_id
    )


def env_file_text(env: Mapping[str, str]) -> str:
    lines = []
    for key, value in env.items():
        # podman's env-file format is one KEY=VALUE per line, taken literally: a line break cannot be
        # carried. The value itself is never named in the error (it may be the token).
        if "\n" in value or "\r" in value or "\0" in value:
            raise DriverError(f"the worker's environment variable {key} holds a line break or NUL")
        lines.append(f"{key}={value}\n")
    return "".join(lines)


def worker_status_of(container: Optional[Mapping[str, Any]]) -> WorkerStatus:
    """The worker's state from ``podman inspect`` of its container (``None``: there is no container)."""
    if container is None:
        return WorkerStatus(WorkerState.MISSING, detail="container gone")
    raw_state = container.get("State")
    state: Mapping[str, Any] = raw_state if isinstance(raw_state, dict) else {}
    return status_of_state(
        state.get("Status"), state.get("ExitCode"), oom_killed=bool(state.get("OOMKilled"))
    )


def listed_status(item: Mapping[str, Any]) -> WorkerStatus:
    """The worker's state from one entry of ``podman ps --all --format json`` (``State``, ``ExitCode``;
    a listing does not say whether the kernel killed it for memory)."""
    return status_of_state(item.get("State"), item.get("ExitCode"))


def status_of_state(state: Any, exit_code: Any, *, oom_killed: bool = False) -> WorkerStatus:
    """A container's state name (``created``, ``running``, ``exited``...) read as its worker's."""
    status = str(state or "").lower()
    if status in ("created", "configured", "initialized"):
        return WorkerStatus(WorkerState.STARTING, detail=f"container {status}")
    if status in ("running", "paused", "stopping"):
        return WorkerStatus(WorkerState.RUNNING, detail="" if status == "running" else f"container {status}")
    if status in ("exited", "stopped"):
        try:
            code = int(exit_code if exit_code is not None else 1)
        except (TypeError, ValueError):
            code = 1
        return ended_status(code, oom_killed=oom_killed)
    if status == "removing":
        return WorkerStatus(WorkerState.MISSING, detail="container being removed")
    # A state this driver does not know: not running, not ended; the boot timeout bounds it.
    return WorkerStatus(WorkerState.STARTING, detail=f"container state {status or 'unknown'}")


def ended_status(code: int, *, oom_killed: bool = False) -> WorkerStatus:
    """The worker's end from its container's exit code. 125-127 are never the worker's own codes
    (core/exits.py stops at 9; a signal gives 128+n): they say the worker never ran, and no restart in
    the same image can change that, so the session is released at once with the reason (FAILED)."""
    cannot_run = CANNOT_RUN_EXITS.get(code)
    if cannot_run is not None:
        reason, why = cannot_run
        return WorkerStatus(WorkerState.FAILED, exit_code=code, reason=reason, detail=f"exit {code}: {why}")
    return WorkerStatus(
        WorkerState.EXITED, exit_code=code, detail="killed for lack of memory" if oom_killed else ""
    )


#: Exit codes of a container whose worker never ran: what podman (125) and our ``/bin/sh`` entrypoint
#: (126, 127: POSIX's "found but not executable" and "not found") exit with, and the reason they become.
CANNOT_RUN_EXITS = {
    125: (REASON_START_ERROR, "the container's runtime could not run it"),
    126: (REASON_EXEC_FAILED, "the worker command is not executable in the image"),
    127: (REASON_EXEC_FAILED, "the worker command is not in the image"),
}


def failure_of(result: Result) -> str:
    """The reason a failed ``podman create`` or ``podman start`` names (:data:`FAILURE_TEXT`), or ``""``
    when its error is not one that a retry of the same machine cannot fix (then it is a plain error)."""
    text = result.stderr.lower()
    for reason, markers in FAILURE_TEXT:
        if any(marker in text for marker in markers):
            return reason
    return ""


class PodmanFailure(DriverError):
    """A machine that cannot be made or started for a reason podman named (:func:`failure_of`); the
    reason leads the message, and is :attr:`reason` for a caller that carries it on."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(f"{message} ({reason})", reason=reason)
