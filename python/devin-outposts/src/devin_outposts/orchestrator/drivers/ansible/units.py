"""The worker role's session unit on a host: its name, and its state as ``systemctl show`` tells it.

Shared by :meth:`~.driver.AnsibleDriver.status` (one unit per run) and the status source (every unit of a
host in one command, :mod:`.status`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Optional

from devin_outposts.orchestrator.drivers.base import WorkerState, WorkerStatus

#: The session unit of the worker role's one-session mode, and the ids the role accepts.
SESSION_UNIT = "devin-outposts-session@{}.service"
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
#: What is read of a unit (``Id`` names each block when several units are read at once).
SHOW = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "ExecMainCode",
    "ExecMainStatus",
    "ExecMainStartTimestampMonotonic",
)


def unit_of(session_id: str) -> Optional[str]:
    """The session unit of ``session_id``, or None for an id no unit can be named after."""
    if not SESSION_ID.fullmatch(session_id) or session_id.endswith("."):
        return None
    return SESSION_UNIT.format(session_id)


def show_command(units: str) -> str:
    """The command that shows ``units`` (one unit, or several space-separated)."""
    return f"systemctl show --property={','.join(SHOW)} {units}"


def parse_unit_state(show: str) -> WorkerStatus:
    """The worker's state from ``systemctl show`` of its unit (``Type=simple``, ``RemainAfterExit=yes``)."""
    props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    detail = f"{active}/{sub} result={props.get('Result', '?')}"
    if props.get("LoadState") != "loaded" or active in ("activating", "reloading"):
        return WorkerStatus(WorkerState.STARTING, detail=detail)
    if active in ("active", "deactivating") and sub != "exited":
        return WorkerStatus(WorkerState.RUNNING, detail=detail)
    started = props.get("ExecMainStartTimestampMonotonic", "0") not in ("", "0")
    if active == "inactive" and not started:
        return WorkerStatus(WorkerState.STARTING, detail=detail)
    status = int(props["ExecMainStatus"]) if props.get("ExecMainStatus", "").isdigit() else 1
    # ExecMainCode is a siginfo code: 1 exited (status: exit code), 2 killed, 3 dumped (status: signal).
    code = status if props.get("ExecMainCode", "1") == "1" else 128 + status
    return WorkerStatus(WorkerState.EXITED, exit_code=code, detail=detail)


def parse_units(show: str, units: Sequence[str]) -> dict[str, str]:
    """``systemctl show`` of several units: one block of ``KEY=VALUE`` lines per unit, blank-line apart, in
    the order asked; each block by its unit (its ``Id``, else its place)."""
    blocks = [block.strip() for block in show.strip().split("\n\n") if block.strip()]
    found: dict[str, str] = {}
    for index, block in enumerate(blocks):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        unit = props.get("Id") or (units[index] if index < len(units) else "")
        if unit in units:
            found[unit] = block
    return found
