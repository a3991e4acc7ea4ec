"""The gateway's and the brain's state: connect-token checks, remote connections and scripted tool calls.

The simulated brain appends tool calls to a session; a ``devin-remote`` connected through the gateway
with the session's connect token takes them one at a time, in order, and posts each result. Calls move
through ``queued`` -> ``delivered`` (to one connection) -> ``done``; calls still queued when the brain ends
the session become ``cancelled``. A call delivered to a connection that never answered goes back to
``queued`` when a *newer* connection of the session connects (the remote was restarted), so a restarted
remote picks up where the old one stopped. Only the newest connection of a session gets work: an older
one still asking is answered 409 (superseded).

Connecting marks the session ``running`` (what the real brain does once the remote is up), unless it is
already ``suspended`` or ``terminated`` (or the brain ended it and the written status still lags, see
:meth:`Gateway.end_session`); then the answer says the session is over. Every gateway call
checks the connect token first: it is valid while its acceptor holds the session (see
:meth:`Gateway.check_connect_token`).

A tombstoned session's remote is told first, as at the end of a session: the holder's tokens get the end
notice (``end: true`` on connect, ``{"type": "end"}`` from ``next``, results of delivered calls still
taken) until a remote has been told or ``notice_until`` passed, and 401 after that (see
:meth:`~devin_outposts_sim.state.db.Database.tombstone_locked`).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from dataclasses import dataclass
from typing import Any, Callable, Optional

from devin_outposts.api.models import QueueEntry
from devin_outposts_sim.errors import Conflict, Invalid, NotFound, Unauthorized
from devin_outposts_sim.state.db import ENDED_STATUSES, Database, token_fingerprint, token_hash
from devin_outposts_sim.state.rows import entry_from_row, live_row, reload_row, session_row

INVALID_CONNECT_TOKEN = "Invalid connect token"  # noqa: S105 - an error message, not a secret
SUPERSEDED = "This connection was superseded by a newer connection of the session"
CALL_STATES = ("queued", "delivered", "done", "cancelled")
MAX_INFO_CHARS = 256 * 1024
MAX_RESULT_CHARS = 4 * 1024 * 1024


def _call_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["call_id"],
        "seq": row["seq"],
        "session_id": row["session_id"],
        "tool": row["tool"],
        "args": json.loads(row["args"]),
        "state": row["state"],
        "created_at": row["created_at"],
        "delivered_at": row["delivered_at"],
        "completed_at": row["completed_at"],
        "connection_id": row["connection_id"],
        "attempts": row["attempts"],
        "result": json.loads(row["result"]) if row["result"] is not None else None,
    }


def _connection_view(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "connection_id": row["connection_id"],
        "session_id": row["session_id"],
        "at": row["at"],
        "last_seen": row["last_seen"],
        "acceptor_id": row["acceptor_id"],
        "chain": row["chain"],
        "token_fingerprint": row["token_fingerprint"],
        **json.loads(row["info"]),
    }


def _remote_status(row: sqlite3.Row) -> str:
    """The session's status as its remote is told it: an end the brain announced counts at once, even
    while the written ``session_status`` still lags it; a tombstoned session that had not ended is over
    (``terminated``)."""
    status = str(row["ending_status"] or row["session_status"])
    if row["deleted"] and status not in ENDED_STATUSES:
        return "terminated"
    return status


@dataclass(frozen=True)
class _Holder:
    """Whose token a gateway request carries; ``notice``: only to be told the session is over (its row
    was tombstoned), never to be given work."""

    acceptor_id: str
    chain: int
    notice: bool


class Gateway:
    """Connect tokens as the gateway sees them, remote connections, and the brain's tool calls
    (``store.gateway``)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._call_listeners: list[Callable[[], None]] = []

    def add_call_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every committed change to tool calls or connections."""
        self._call_listeners.append(callback)

    def remove_call_listener(self, callback: Callable[[], None]) -> None:
        if callback in self._call_listeners:
            self._call_listeners.remove(callback)

    def _calls_changed(self) -> None:
        for callback in list(self._call_listeners):
            callback()

    # --- connect tokens ---------------------------------------------------------------------------

    def _token_holder(self, conn: sqlite3.Connection, session_id: str, token: str) -> Optional[_Holder]:
        """Who ``token`` belongs to, if the gateway accepts it for ``session_id`` now: a token of the
        acceptor that holds the live session (whichever of its claims issued it), or, for a tombstoned
        session, a token of its last holder whose end notice is still due."""
        found = conn.execute(
            "SELECT t.acceptor_id, t.chain, t.revoked_at, t.notice_until, s.deleted, s.phase, "
            "s.acceptor_id AS holder FROM connect_tokens t JOIN sessions s ON s.session_id = t.session_id "
            "WHERE t.token_hash = ? AND t.session_id = ?",
            (token_hash(token), session_id),
        ).fetchone()
        if found is None:
            return None
        holder = _Holder(str(found["acceptor_id"]), int(found["chain"]), notice=bool(found["deleted"]))
        if holder.notice:
            notice_until = found["notice_until"]
            return holder if notice_until is not None and notice_until > self._db.clock() else None
        live = found["revoked_at"] is None and found["phase"] == "claimed"
        return holder if live and found["holder"] == found["acceptor_id"] else None

    def check_connect_token(self, session_id: str, token: str) -> bool:
        """True while ``token`` may serve ``session_id``: its acceptor holds the live session. (A
        tombstoned session's token that is still to be told the end is not valid; see
        :meth:`accepts_token`.)"""
        with self._db.snapshot() as conn:
            holder = self._token_holder(conn, session_id, token)
            return holder is not None and not holder.notice

    def accepts_token(self, session_id: str, token: str) -> bool:
        """True when the gateway answers a request with ``token`` instead of 401: while it is valid, or
        while it is still to be told that its tombstoned session is over."""
        with self._db.snapshot() as conn:
            return self._token_holder(conn, session_id, token) is not None

    def _gateway_auth(
        self, conn: sqlite3.Connection, session_id: str, token: str
    ) -> tuple[sqlite3.Row, _Holder]:
        """The session row and the token's holder, after expiring due claims (a bad token is a 401)."""
        self._db.expire_locked(conn, self._db.clock())
        holder = self._token_holder(conn, session_id, token)
        if holder is None:
            raise Unauthorized(INVALID_CONNECT_TOKEN)
        return reload_row(conn, session_id), holder

    def _told_the_end(self, conn: sqlite3.Connection, holder: _Holder, token: str) -> None:
        """A remote of a tombstoned session has been told it is over: its token is refused from now on."""
        if holder.notice:
            conn.execute(
                "UPDATE connect_tokens SET notice_until = NULL WHERE token_hash = ?", (token_hash(token),)
            )

    # --- the gateway (the remote's side) ------------------------------------------------------------

    def remote_connect(self, session_id: str, token: str, info: dict[str, Any]) -> dict[str, Any]:
        """Record a remote connection; mark the session running unless it is over. (The connection of
        a remote told at once that its tombstoned session is over is recorded too, for the record.)"""
        encoded = json.dumps(info)
        if len(encoded) > MAX_INFO_CHARS:
            raise Invalid(f"the connection info must be at most {MAX_INFO_CHARS} characters of JSON")
        with self._db.tx() as conn:
            row, holder = self._gateway_auth(conn, session_id, token)
            now = self._db.clock()
            status = _remote_status(row)
            ended = status in ENDED_STATUSES
            if ended:
                self._told_the_end(conn, holder, token)
            elif status != "running":
                rev = self._db.next_rev(conn, now)
                conn.execute(
                    "UPDATE sessions SET session_status = 'running', rev = ? WHERE session_id = ?",
                    (rev, session_id),
                )
                status = "running"
            cur = conn.execute(
                "INSERT INTO remote_connections (session_id, at, last_seen, acceptor_id, chain, "
                "token_fingerprint, info) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    now,
                    now,
                    holder.acceptor_id,
                    holder.chain,
                    token_fingerprint(token),
                    encoded,
                ),
            )
            connection_id = cur.lastrowid
            if not holder.notice:
                conn.execute(
                    "UPDATE tool_calls SET state = 'queued', connection_id = NULL, delivered_at = NULL "
                    "WHERE session_id = ? AND state = 'delivered'",
                    (session_id,),
                )
        self._calls_changed()
        return {"connection_id": connection_id, "session_status": status, "end": ended}

    def remote_next(self, session_id: str, token: str, connection_id: int) -> Optional[dict[str, Any]]:
        """The next answer for a remote: the end of the session, the next call, or None (no work yet)."""
        with self._db.tx() as conn:
            row, holder = self._gateway_auth(conn, session_id, token)
            status = _remote_status(row)
            if status in ENDED_STATUSES:
                self._told_the_end(conn, holder, token)
                return {"type": "end", "session_status": status}
            latest = conn.execute(
                "SELECT MAX(connection_id) AS latest FROM remote_connections WHERE session_id = ?",
                (session_id,),
            ).fetchone()["latest"]
            if latest != connection_id:
                raise Conflict(SUPERSEDED)
            now = self._db.clock()
            conn.execute(
                "UPDATE remote_connections SET last_seen = ? WHERE connection_id = ?", (now, connection_id)
            )
            call = conn.execute(
                "SELECT * FROM tool_calls WHERE session_id = ? AND state = 'queued' ORDER BY seq LIMIT 1",
                (session_id,),
            ).fetchone()
            if call is None:
                return None
            conn.execute(
                "UPDATE tool_calls SET state = 'delivered', delivered_at = ?, connection_id = ?, "
                "attempts = attempts + 1 WHERE seq = ?",
                (now, connection_id, call["seq"]),
            )
        self._calls_changed()
        return {
            "type": "call",
            "call": {"id": call["call_id"], "tool": call["tool"], "args": json.loads(call["args"])},
        }

    def remote_result(
        self, session_id: str, token: str, connection_id: int, call_id: str, result: dict[str, Any]
    ) -> dict[str, Any]:
        """Store the result of a call delivered to ``connection_id``; anything else is a 404/409."""
        encoded = json.dumps(result)
        if len(encoded) > MAX_RESULT_CHARS:
            raise Invalid(f"a result must be at most {MAX_RESULT_CHARS} characters of JSON")
        with self._db.tx() as conn:
            self._gateway_auth(conn, session_id, token)
            call = conn.execute(
                "SELECT * FROM tool_calls WHERE call_id = ? AND session_id = ?", (call_id, session_id)
            ).fetchone()
            if call is None:
                raise NotFound("Unknown tool call")
            if call["state"] != "delivered" or call["connection_id"] != connection_id:
                raise Conflict(f"Tool call {call_id} is not awaiting a result from this connection")
            conn.execute(
                "UPDATE tool_calls SET state = 'done', completed_at = ?, result = ? WHERE seq = ?",
                (self._db.clock(), encoded, call["seq"]),
            )
        self._calls_changed()
        return {"id": call_id, "state": "done"}

    # --- the brain (admin side) ---------------------------------------------------------------------

    def add_calls(self, session_id: str, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """Append validated ``(tool, args)`` calls to a live session; returns them with their ids."""
        with self._db.tx() as conn:
            now = self._db.clock()
            self._db.expire_locked(conn, now)
            live_row(conn, None, session_id)
            seqs = []
            for tool, args in calls:
                cur = conn.execute(
                    "INSERT INTO tool_calls (call_id, session_id, tool, args, state, created_at) "
                    "VALUES (?, ?, ?, ?, 'queued', ?)",
                    (f"call_{secrets.token_hex(8)}", session_id, tool, json.dumps(args), now),
                )
                seqs.append(cur.lastrowid)
            rows = conn.execute(
                f"SELECT * FROM tool_calls WHERE seq IN ({','.join('?' * len(seqs))}) ORDER BY seq", seqs
            ).fetchall()
        self._calls_changed()
        return [_call_view(row) for row in rows]

    def _known_session(self, conn: sqlite3.Connection, session_id: str) -> None:
        if session_row(conn, session_id) is None:
            raise NotFound("Session not found")

    def session_calls(self, session_id: str) -> list[dict[str, Any]]:
        """Every call of a session (tombstoned sessions too), oldest first, with results and timings."""
        with self._db.read() as conn:
            self._known_session(conn, session_id)
            rows = conn.execute("SELECT * FROM tool_calls WHERE session_id = ? ORDER BY seq", (session_id,))
            return [_call_view(row) for row in rows.fetchall()]

    def session_connections(self, session_id: str) -> list[dict[str, Any]]:
        """Every remote connection of a session, oldest first: what the remote reported on connect."""
        with self._db.read() as conn:
            self._known_session(conn, session_id)
            rows = conn.execute(
                "SELECT * FROM remote_connections WHERE session_id = ? ORDER BY connection_id", (session_id,)
            )
            return [_connection_view(row) for row in rows.fetchall()]

    def end_session(self, session_id: str, session_status: str, *, lag: float = 0.0) -> QueueEntry:
        """The brain ends a session: set ``suspended``/``terminated``, cancel calls not yet delivered.
        Connected remotes are told to exit at their next request (long polls wake at once).

        With ``lag`` > 0 the remotes are told now but ``session_status`` is written ``lag`` seconds
        later (the real status update can lag the remote's exit, docs/fleet-api.md §5): the entry returned,
        and every read until then, still shows the old status.
        """
        if session_status not in ENDED_STATUSES:
            raise Invalid("session_status must be suspended or terminated")
        with self._db.tx() as conn:
            now = self._db.clock()
            self._db.expire_locked(conn, now)
            row = live_row(conn, None, session_id)
            if lag > 0:
                conn.execute(
                    "UPDATE sessions SET ending_status = ?, ending_at = ? WHERE session_id = ?",
                    (session_status, now + lag, session_id),
                )
            else:
                self._db.write_status_locked(conn, row, session_status, now)
            conn.execute(
                "UPDATE tool_calls SET state = 'cancelled', completed_at = ? "
                "WHERE session_id = ? AND state = 'queued'",
                (now, session_id),
            )
            entry = entry_from_row(reload_row(conn, session_id))
        self._calls_changed()
        return entry
