"""A queue row (``sessions``) as the parts of the store read it: the wire view, the cursor, the change a
watcher gets, and the lookups by session id that the queue, the gateway and the records share.

Why a module of its own: the queue, the gateway's part and the records all read session rows; keeping the
row's views here lets each part depend on the rows, not on another part.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any, Optional

from devin_outposts.api.models import QueueEntry
from devin_outposts_sim.errors import SESSION_NOT_FOUND, NotFound
from devin_outposts_sim.state.cursor import QueueCursor


@dataclass(frozen=True)
class Change:
    """One row as a watcher sees it: ``DELETED`` for a tombstone, else ``MODIFIED``."""

    wire: dict[str, Any]
    deleted: bool
    cursor: QueueCursor
    account_id: str = ""

    @property
    def entry(self) -> QueueEntry:
        return QueueEntry.model_validate(self.wire)

    @property
    def session_id(self) -> str:
        return self.cursor.session_id

    @property
    def type(self) -> str:
        return "DELETED" if self.deleted else "MODIFIED"

    def event(self) -> dict[str, Any]:
        return {"type": self.type, "object": self.wire, "cursor": self.cursor.encode()}


@dataclass(frozen=True)
class QueuePage:
    """A page of the queue list; ``wire_items`` as sent, ``items`` as the client's model."""

    wire_items: list[dict[str, Any]]
    cursor: QueueCursor
    has_next_page: bool
    total: int

    @property
    def items(self) -> list[QueueEntry]:
        return [QueueEntry.model_validate(item) for item in self.wire_items]

    def to_wire(self) -> dict[str, Any]:
        return {
            "items": self.wire_items,
            "cursor": self.cursor.encode(),
            "has_next_page": self.has_next_page,
            "total": self.total,
        }


def row_cursor(row: sqlite3.Row) -> QueueCursor:
    return QueueCursor(float(row["rev"]), str(row["session_id"]))


def row_wire(
    row: sqlite3.Row, *, connect_token: Optional[str] = None, gateway_url: Optional[str] = None
) -> dict[str, Any]:
    """A queue row as the wire shows it (docs/fleet-api.md §3), built directly from the row.

    Why not through the client's model: validating and dumping a pydantic model per row was most of
    the cost of a list page and of every watch event. python/devin-outposts-sim/tests/test_sim_wire.py checks
    that this is exactly what ``QueueEntry.model_validate(...).to_wire()`` gives, so nothing drifts from the
    model.
    """
    policy = row["network_policy"]
    deadline = row["claim_deadline"]
    return {
        "metadata": {
            "session_id": row["session_id"],
            "outpost_id": row["outpost_id"],
            "created_at": int(row["created_at"]),
            "updated_at": int(row["rev"]),
        },
        "spec": {
            "kind": row["kind"],
            "platform": row["platform"],
            "remote_binary_sha": row["remote_binary_sha"],
            "network_policy": json.loads(policy) if policy is not None else None,
        },
        "status": {
            "phase": row["phase"],
            "acceptor_id": row["acceptor_id"],
            "claim_deadline": int(deadline) if deadline is not None else None,
            "session_status": row["session_status"],
            "connect_token": connect_token,
            "gateway_url": gateway_url,
        },
    }


def entry_from_row(
    row: sqlite3.Row, *, connect_token: Optional[str] = None, gateway_url: Optional[str] = None
) -> QueueEntry:
    return QueueEntry.model_validate(row_wire(row, connect_token=connect_token, gateway_url=gateway_url))


def row_change(row: sqlite3.Row) -> Change:
    return Change(row_wire(row), bool(row["deleted"]), row_cursor(row), str(row["account_id"]))


def session_row(conn: sqlite3.Connection, session_id: str) -> Optional[sqlite3.Row]:
    """The row of ``session_id``, tombstoned or not, or None."""
    row: Optional[sqlite3.Row] = conn.execute(
        "SELECT * FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    return row


def live_row(conn: sqlite3.Connection, account_id: Optional[str], session_id: str) -> sqlite3.Row:
    """The live (not tombstoned) row, visible to ``account_id`` (None = any account), else 404."""
    row = session_row(conn, session_id)
    if row is None or row["deleted"] or (account_id is not None and row["account_id"] != account_id):
        raise NotFound(SESSION_NOT_FOUND)
    return row


def reload_row(conn: sqlite3.Connection, session_id: str) -> sqlite3.Row:
    """The row of a session this transaction has just read or written (it exists)."""
    row = session_row(conn, session_id)
    assert row is not None
    return row
