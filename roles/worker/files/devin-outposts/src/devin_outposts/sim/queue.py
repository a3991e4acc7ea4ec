"""The queue of sessions (``devins``): enqueue, list, changes for watchers, claim, release, history.

Claims are a compare-and-swap inside one ``BEGIN IMMEDIATE`` transaction, so exactly one of any number
of concurrent claimers wins. Every operation first returns expired claims to the queue (unless the
session is ``running``), so no answer ever shows a claim that is already void, whether or not the
background sweeper has run yet.

Connect tokens: each claim or renewal issues a fresh token. All tokens issued to the current holder since
its claim began (its *claim chain*) stay valid while that chain lasts; release, expiry, a tombstone or a
takeover by another acceptor revokes them. The end of a session does not: a claimed session that stops
running keeps its claim for at least one more claim TTL (:meth:`StoreBase._write_status_locked`), so the
remote hears of the end and the holder can release.
:meth:`~devin_outposts.sim.gateway_store.GatewayStore.check_connect_token` answers the question a gateway
asks.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import sqlite3
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import ValidationError

from devin_outposts.models import NetworkPolicy, QueueEntry
from devin_outposts.sim.cursor import QueueCursor
from devin_outposts.sim.db import DEFAULT_PLATFORM, StoreBase, token_fingerprint, token_hash
from devin_outposts.sim.errors import (
    ALREADY_CLAIMED,
    NOT_CLAIMED_BY_ACCEPTOR,
    OUTPOST_NOT_FOUND,
    SESSION_NOT_FOUND,
    Conflict,
    Invalid,
    NotFound,
)

_STATUS_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


@dataclass(frozen=True)
class Change:
    """One row as a watcher sees it: ``DELETED`` for a tombstone, else ``MODIFIED``."""

    entry: QueueEntry
    deleted: bool
    cursor: QueueCursor

    @property
    def type(self) -> str:
        return "DELETED" if self.deleted else "MODIFIED"

    def event(self) -> dict[str, Any]:
        return {"type": self.type, "object": self.entry.to_wire(), "cursor": self.cursor.encode()}


@dataclass(frozen=True)
class QueuePage:
    items: list[QueueEntry]
    cursor: QueueCursor
    has_next_page: bool
    total: int

    def to_wire(self) -> dict[str, Any]:
        return {
            "items": [item.to_wire() for item in self.items],
            "cursor": self.cursor.encode(),
            "has_next_page": self.has_next_page,
            "total": self.total,
        }


def row_cursor(row: sqlite3.Row) -> QueueCursor:
    return QueueCursor(float(row["rev"]), str(row["session_id"]))


def entry_from_row(
    row: sqlite3.Row, *, connect_token: Optional[str] = None, gateway_url: Optional[str] = None
) -> QueueEntry:
    spec: dict[str, Any] = {
        "kind": row["kind"],
        "platform": row["platform"],
        "remote_binary_sha": row["remote_binary_sha"],
    }
    if row["network_policy"] is not None:
        spec["network_policy"] = json.loads(row["network_policy"])
    deadline = row["claim_deadline"]
    return QueueEntry.model_validate(
        {
            "metadata": {
                "session_id": row["session_id"],
                "outpost_id": row["outpost_id"],
                "created_at": int(row["created_at"]),
                "updated_at": int(row["rev"]),
            },
            "spec": spec,
            "status": {
                "phase": row["phase"],
                "acceptor_id": row["acceptor_id"],
                "claim_deadline": int(deadline) if deadline is not None else None,
                "session_status": row["session_status"],
                "connect_token": connect_token,
                "gateway_url": gateway_url,
            },
        }
    )


def validate_session_status(value: Any) -> str:
    """Any lowercase word: the four known values, or an unknown one to test enum tolerance."""
    if not isinstance(value, str) or not _STATUS_RE.match(value):
        raise Invalid(
            "session_status must be a lowercase word such as pending, running, suspended, terminated"
        )
    return value


class QueueStore(StoreBase):
    """Queue rows, claims, the claim history and connect tokens."""

    def _session_row(self, conn: sqlite3.Connection, session_id: str) -> Optional[sqlite3.Row]:
        row: Optional[sqlite3.Row] = conn.execute(
            "SELECT * FROM sessions WHERE session_id = ?", (session_id,)
        ).fetchone()
        return row

    def _live_row(self, conn: sqlite3.Connection, account_id: Optional[str], session_id: str) -> sqlite3.Row:
        """The live (not tombstoned) row, visible to ``account_id`` (None = any account), else 404."""
        row = self._session_row(conn, session_id)
        if row is None or row["deleted"] or (account_id is not None and row["account_id"] != account_id):
            raise NotFound(SESSION_NOT_FOUND)
        return row

    def _reload(self, conn: sqlite3.Connection, session_id: str) -> sqlite3.Row:
        row = self._session_row(conn, session_id)
        assert row is not None
        return row

    # --- admin-side changes (the "brain" enqueueing and updating sessions) ----------------------------

    def enqueue(
        self,
        outpost_id: str,
        session_id: Optional[str] = None,
        *,
        kind: str = "new",
        platform: Optional[str] = None,
        remote_binary_sha: Optional[str] = None,
        session_status: str = "pending",
        network_policy: Optional[dict[str, Any]] = None,
    ) -> QueueEntry:
        """Queue a session on an outpost (of any account). ``platform`` defaults to the outpost's, and
        for an outpost of the default platform (null) to :data:`DEFAULT_PLATFORM`: an entry always
        names a concrete platform.

        A live entry with the same id is a 409; a tombstoned one is replaced (a ``resume`` entry for a
        session whose earlier entry was swept away).
        """
        validate_session_status(session_status)
        policy_json = None
        if network_policy is not None:
            try:
                policy_json = json.dumps(NetworkPolicy.model_validate(network_policy).to_wire())
            except ValidationError as exc:
                raise Invalid(f"network_policy is invalid: {exc.errors()[0]['msg']}") from exc
        session_id = session_id or f"devin-{secrets.token_hex(16)}"
        with self._tx() as conn:
            now = self._clock()
            outpost = conn.execute("SELECT * FROM outposts WHERE outpost_id = ?", (outpost_id,)).fetchone()
            if outpost is None:
                raise NotFound(OUTPOST_NOT_FOUND)
            existing = self._session_row(conn, session_id)
            if existing is not None and not existing["deleted"]:
                raise Conflict(f"Session {session_id} is already queued on outpost {existing['outpost_id']}")
            rev = self._next_rev(conn, now)
            conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            conn.execute(
                "INSERT INTO sessions (session_id, account_id, outpost_id, kind, platform, "
                "remote_binary_sha, network_policy, phase, session_status, created_at, rev) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
                (
                    session_id,
                    outpost["account_id"],
                    outpost_id,
                    kind,
                    platform or outpost["platform"] or DEFAULT_PLATFORM,
                    remote_binary_sha,
                    policy_json,
                    session_status,
                    now,
                    rev,
                ),
            )
            return entry_from_row(self._reload(conn, session_id))

    def set_session_status(self, session_id: str, session_status: str) -> QueueEntry:
        validate_session_status(session_status)
        with self._tx() as conn:
            now = self._clock()
            self._expire_locked(conn, now)
            row = self._live_row(conn, None, session_id)
            self._write_status_locked(conn, row, session_status, now)
            return entry_from_row(self._reload(conn, session_id))

    def tombstone(self, session_id: str, reason: str = "tombstoned by the admin API") -> QueueEntry:
        with self._tx() as conn:
            now = self._clock()
            self._expire_locked(conn, now)
            row = self._live_row(conn, None, session_id)
            self._tombstone_locked(conn, row, now, reason)
            return entry_from_row(self._reload(conn, session_id))

    # --- reads --------------------------------------------------------------------------------------

    def get_entry(self, account_id: str, session_id: str) -> QueueEntry:
        with self._tx() as conn:
            self._expire_locked(conn, self._clock())
            return entry_from_row(self._live_row(conn, account_id, session_id))

    def head_cursor(self) -> QueueCursor:
        """A cursor just past every change so far: a watch from it replays nothing."""
        return QueueCursor(math.nextafter(self._last_rev, math.inf), "")

    def list_entries(
        self,
        account_id: str,
        *,
        first: int,
        outpost: Optional[str] = None,
        phase: Optional[str] = None,
        acceptor_id: Optional[str] = None,
        cursor: Optional[QueueCursor] = None,
    ) -> QueuePage:
        """Keyset page over ``(rev, session_id)`` with a ``>=`` boundary (the boundary row repeats).

        ``has_next_page`` means "the page was full". A full page's cursor is its last row; otherwise the
        cursor is the head, so a watch started from it replays nothing already listed. With
        ``first=1`` the boundary row is skipped when more rows follow it, else no page could advance.
        """
        where = ["account_id = ?", "deleted = 0"]
        params: list[Any] = [account_id]
        for column, value in (("outpost_id", outpost), ("phase", phase), ("acceptor_id", acceptor_id)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if cursor is not None:
            where.append("(rev > ? OR (rev = ? AND session_id >= ?))")
            params.extend([cursor.rev, cursor.rev, cursor.session_id])
        clause = " AND ".join(where)
        with self._tx() as conn:
            self._expire_locked(conn, self._clock())
            total = conn.execute(f"SELECT COUNT(*) AS n FROM sessions WHERE {clause}", params).fetchone()["n"]
            rows = conn.execute(
                f"SELECT * FROM sessions WHERE {clause} ORDER BY rev, session_id LIMIT ?",
                [*params, first + 1],
            ).fetchall()
            head = self.head_cursor()
        if cursor is not None and first == 1 and len(rows) > 1 and row_cursor(rows[0]) == cursor:
            rows = rows[1:]
        page = rows[:first]
        stuck = cursor is not None and len(page) == 1 and row_cursor(page[0]) == cursor
        has_next = len(page) == first and not stuck
        return QueuePage(
            items=[entry_from_row(row) for row in page],
            cursor=row_cursor(page[-1]) if has_next else head,
            has_next_page=has_next,
            total=int(total),
        )

    def changes_since(
        self,
        account_id: str,
        *,
        outpost: Optional[str] = None,
        cursor: Optional[QueueCursor] = None,
        inclusive: bool = True,
        limit: int = 200,
    ) -> list[Change]:
        """Rows (tombstones included) at (``inclusive``) or after ``cursor``, oldest change first."""
        where = ["account_id = ?"]
        params: list[Any] = [account_id]
        if outpost is not None:
            where.append("outpost_id = ?")
            params.append(outpost)
        if cursor is not None:
            where.append(f"(rev > ? OR (rev = ? AND session_id {'>=' if inclusive else '>'} ?))")
            params.extend([cursor.rev, cursor.rev, cursor.session_id])
        with self._tx() as conn:
            self._expire_locked(conn, self._clock())
            rows = conn.execute(
                f"SELECT * FROM sessions WHERE {' AND '.join(where)} ORDER BY rev, session_id LIMIT ?",
                [*params, limit],
            ).fetchall()
        return [Change(entry_from_row(row), bool(row["deleted"]), row_cursor(row)) for row in rows]

    # --- claim and release --------------------------------------------------------------------------

    def claim(
        self, account_id: str, session_id: str, acceptor_id: str, *, ttl: float, gateway_url: str
    ) -> QueueEntry:
        """Claim, or renew when ``acceptor_id`` already holds the claim. Returns the entry with a fresh
        ``connect_token`` and the ``gateway_url``. Another live holder is a 409; no entry is a 404."""
        with self._tx() as conn:
            now = self._clock()
            self._expire_locked(conn, now)
            row = self._live_row(conn, account_id, session_id)
            holder = row["acceptor_id"] if row["phase"] == "claimed" else None
            if holder is not None and holder != acceptor_id:
                raise Conflict(ALREADY_CLAIMED)
            token = f"ct_{secrets.token_urlsafe(32)}"
            fingerprint = token_fingerprint(token)
            deadline = now + ttl
            if holder == acceptor_id:
                chain = int(row["claim_chain"])
                self._record(
                    conn,
                    row,
                    "renew",
                    now,
                    acceptor_id=acceptor_id,
                    fingerprint=fingerprint,
                    deadline=deadline,
                    chain=chain,
                )
            else:
                self._revoke_tokens(conn, session_id, now, "superseded")
                chain = self._record(
                    conn,
                    row,
                    "claim",
                    now,
                    acceptor_id=acceptor_id,
                    fingerprint=fingerprint,
                    deadline=deadline,
                )
                conn.execute("UPDATE claim_history SET chain = ? WHERE seq = ?", (chain, chain))
            rev = self._next_rev(conn, now)
            conn.execute(
                "UPDATE sessions SET phase = 'claimed', acceptor_id = ?, claim_deadline = ?, "
                "claim_chain = ?, claim_ttl = ?, rev = ? WHERE session_id = ?",
                (acceptor_id, deadline, chain, ttl, rev, session_id),
            )
            conn.execute(
                "INSERT INTO connect_tokens (token_hash, session_id, acceptor_id, chain, issued_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (token_hash(token), session_id, acceptor_id, chain, now),
            )
            return entry_from_row(
                self._reload(conn, session_id), connect_token=token, gateway_url=gateway_url
            )

    def release(self, account_id: str, session_id: str, acceptor_id: str) -> QueueEntry:
        """Return a claimed session to the queue; only its current holder may (else 409)."""
        with self._tx() as conn:
            now = self._clock()
            self._expire_locked(conn, now)
            row = self._live_row(conn, account_id, session_id)
            if row["phase"] != "claimed" or row["acceptor_id"] != acceptor_id:
                raise Conflict(NOT_CLAIMED_BY_ACCEPTOR)
            self._record(
                conn,
                row,
                "release",
                now,
                acceptor_id=acceptor_id,
                deadline=row["claim_deadline"],
                chain=row["claim_chain"],
            )
            self._revoke_tokens(conn, session_id, now, "released")
            rev = self._next_rev(conn, now)
            conn.execute(
                "UPDATE sessions SET phase = 'pending', acceptor_id = NULL, claim_deadline = NULL, "
                "claim_chain = NULL, claim_ttl = NULL, rev = ? WHERE session_id = ?",
                (rev, session_id),
            )
            return entry_from_row(self._reload(conn, session_id))
