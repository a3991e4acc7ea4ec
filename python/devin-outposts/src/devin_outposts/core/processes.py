"""The record of a running ``devin-remote`` and stopping one that a killed predecessor left behind.

A worker writes ``<state>.remote.pid`` (pid, process group and kernel start time) beside the session's
state directory ``<state>`` for each remote it starts (:mod:`devin_outposts.worker.spawn`): beside it, not
in it, because the session writes its state directory, and a record it could forge would have the worker
stop a process of its choice. A worker restarted after ``kill -9`` reads it before it
starts a new remote for the same session, and the orchestrator's ``process`` driver reads it when it
tears down a machine whose worker could not stop its remote: both stop the recorded group, but only while
the recorded pid still has the recorded start time, so a reused pid is never signalled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Optional

from devin_outposts.core import platform

log = logging.getLogger(__name__)

PIDFILE = "remote.pid"


def record_path(state_dir: Path) -> Path:
    """Where the record of ``state_dir``'s remote is: ``<state_dir>.remote.pid``, in the same parent."""
    return state_dir.parent / f"{state_dir.name}.{PIDFILE}"


def start_time(pid: int) -> Optional[str]:
    """The kernel's start time of ``pid`` where the platform knows it (Linux), else None."""
    return platform.current().process_start_time(pid)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` exists (a process we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_remote_record(state_dir: Path, pid: int) -> None:
    """Record the remote ``pid`` (the leader of its own process group) in ``state_dir``, atomically."""
    record = {"pid": pid, "pgid": pid, "started": start_time(pid)}
    path = record_path(state_dir)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def forget_remote_record(state_dir: Path) -> None:
    with contextlib.suppress(OSError):
        record_path(state_dir).unlink()


def reap_stale_remote(state_dir: Path) -> bool:
    """Kill the process group of a remote left by a previous worker for this session, if it still runs.

    Only acts when the recorded pid still has the recorded start time (Linux), so a reused pid is never
    signalled. Returns True when something was killed.
    """
    path = record_path(state_dir)
    try:
        record = json.loads(path.read_text())
        pid, pgid, started = int(record["pid"]), int(record["pgid"]), record.get("started")
    except (OSError, ValueError, KeyError, TypeError):
        return False
    killed = False
    if started is not None and start_time(pid) == started and process_alive(pid):
        log.warning("stopping devin-remote pid %d left behind by a previous worker", pid, extra={"pid": pid})
        killed = platform.current().kill_orphan_group(pgid)
    forget_remote_record(state_dir)
    return killed
