"""The queue of sessions (``devins``): enqueue, list, changes for watchers, claim, release, history.

Claims are a compare-and-swap inside one ``BEGIN IMMEDIATE`` transaction, so exactly one of any number
of concurrent claimers wins. Every operation first returns expired claims to the queue (unless the
session is ``running``), so no answer ever shows a claim that is already void, whether or not the
background sweeper has run yet.

Connect tokens: each claim or renewal issues a fresh token. Every token issued to an acceptor is valid
while that acceptor holds the session: through renewals, and again after a claim that lapsed (before the
session ran) is claimed again by the same acceptor. A release or a takeover by another acceptor revokes
them; a tombstone revokes them once the remote has been told of the end
(:meth:`~devin_outposts_sim.state.db.Database.tombstone_locked`). The end of a session does not: a claimed
session that stops running keeps its claim for at least one more claim TTL
(:meth:`~devin_outposts_sim.state.db.Database.write_status_locked`), so the remote hears of the end and the
holder can release.

Ended sessions: a session that has been ``suspended`` or ``terminated`` for ``tombstone_after`` seconds is
tombstoned (:meth:`~devin_outposts_sim.state.db.Database.sweep_ended_locked`), as the upstream sweeper
does (contract 3.4).
:meth:`~devin_outposts_sim.state.gateway.Gateway.check_connect_token` answers the question a gateway
asks.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import sqlite3
from typing import Any, Optional

from pydantic import ValidationError

from devin_outposts.api.models import NetworkPolicy, QueueEntry
from devin_outposts_sim.errors import (
    ALREADY_CLAIMED,
    NOT_CLAIMED_BY_ACCEPTOR,
    OUTPOST_NOT_FOUND,
    Conflict,
    Invalid,
    NotFound,
)
from devin_outposts_sim.state.cursor import QueueCursor
from devin_outposts_sim.state.db import (
    DEFAULT_PLATFORM,
    ENDED_STATUSES,
    Database,
    token_fingerprint,
    token_hash,
)
from devin_outposts_sim.state.rows import (
    Change,
    QueuePage,
    entry_from_row,
    live_row,
    reload_row,
    row_change,
    row_cursor,
    row_wire,
    session_row,
)

_STATUS_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")

# The hot queries, kept here so python/devin-outposts-sim/tests/test_sim_query_plans.py can check SQLite's
# plan of each.
#: A page of the queue list (``{where}``: :func:`list_filter`, plus the cursor term) and its total.
LIST_SQL = "SELECT * FROM sessions WHERE {where} ORDER BY rev, session_id LIMIT ?"
COUNT_SQL = "SELECT COUNT(*) AS n FROM sessions WHERE {where}"
#: The cursor term of a list (``>=``: the boundary row repeats) and of a replay (``>`` after the first).
#: A row value, so that SQLite seeks the index to the cursor instead of scanning up to it.
CURSOR_TERM = " AND (rev, session_id) {op} (?, ?)"
#: A watch stream's backlog: one outpost's changes, or an account's.
REPLAY_OUTPOST_SQL = "SELECT * FROM sessions WHERE outpost_id = ?{cursor} ORDER BY rev, session_id LIMIT ?"
REPLAY_ACCOUNT_SQL = "SELECT * FROM sessions WHERE account_id = ?{cursor} ORDER BY rev, session_id LIMIT ?"
#: The watch feed: every change after a revision.
CHANGES_AFTER_SQL = "SELECT * FROM sessions WHERE rev > ? ORDER BY rev LIMIT ?"


def list_filter(
    account_id: str, outpost: Optional[str], phase: Optional[str], acceptor_id: Optional[str]
) -> tuple[str, list[Any]]:
    """The ``WHERE`` clause and parameters of a queue list (without its cursor term).

    With an outpost, the caller has checked that it is the account's, so no ``account_id`` term: the
    list and its ``total`` come from the index ``sessions_by_outpost_phase`` (or ``_rev``).
    """
    if outpost is not None:
        where, params = ["outpost_id = ?", "deleted = 0"], [outpost]
    elif acceptor_id is not None:
        where, params = ["acceptor_id = ?", "account_id = ?", "deleted = 0"], [acceptor_id, account_id]
        acceptor_id = None
    else:
        where, params = ["account_id = ?", "deleted = 0"], [account_id]
    for column, value in (("phase", phase), ("acceptor_id", acceptor_id)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    return " AND ".join(where), params


def validate_session_status(value: Any) -> str:
    """Any lowercase word: the four known values, or an unknown one to test enum tolerance."""
    if not isinstance(value, str) or not _STATUS_RE.match(value):
        raise Invalid(
            "session_status must be a lowercase word such as pending, running, suspended, terminated"
        )
    return value


class Queue:
    """Queue rows, claims, the claim history and connect tokens (``store.queue``)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def expire_claims(self) -> int:
        """The sweeper's work: write due lagging statuses, tombstone ended sessions that are due and
        expire due claims, now; returns how many claims went back to the queue."""
        with self._db.tx() as conn:
            return self._db.expire_locked(conn, self._db.clock())

    # --- admin-side changes (the "brain" enqueueing and updating sessions) ----------------------------

    def enqueue(self, outpost_id: str, session_id: Optional[str] = None, **options: Any) -> QueueEntry:
        """:meth:`enqueue_wire`, as the client's model."""
        return QueueEntry.model_validate(self.enqueue_wire(outpost_id, session_id, **options))

    def enqueue_wire(
        self,
        outpost_id: str,
        session_id: Optional[str] = None,
        *,
        kind: str = "new",
        platform: Optional[str] = None,
        remote_binary_sha: Optional[str] = None,
        session_status: str = "pending",
        network_policy: Optional[dict[str, Any]] = None,
    ) -> dict[str, Any]:
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
        with self._db.tx() as conn:
            now = self._db.clock()
            self._db.expire_locked(conn, now)  # an entry due to be tombstoned is gone: it may be replaced
            outpost = conn.execute("SELECT * FROM outposts WHERE outpost_id = ?", (outpost_id,)).fetchone()
            if outpost is None:
                raise NotFound(OUTPOST_NOT_FOUND)
            existing = session_row(conn, session_id)
            if existing is not None and not existing["deleted"]:
                raise Conflict(f"Session {session_id} is already queued on outpost {existing['outpost_id']}")
            rev = self._db.next_rev(conn, now)
            conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            # Nothing of the earlier entry's claims carries over, not even the end notice of its tokens.
            conn.execute(
                "UPDATE connect_tokens SET revoked_at = COALESCE(revoked_at, ?), "
                "revoked_reason = COALESCE(revoked_reason, 'requeued'), notice_until = NULL "
                "WHERE session_id = ?",
                (now, session_id),
            )
            conn.execute(
                "INSERT INTO sessions (session_id, account_id, outpost_id, kind, platform, "
                "remote_binary_sha, network_policy, phase, session_status, created_at, rev, ended_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)",
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
                    now if session_status in ENDED_STATUSES else None,
                ),
            )
            return row_wire(reload_row(conn, session_id))

    def set_session_status(self, session_id: str, session_status: str) -> QueueEntry:
        return QueueEntry.model_validate(self.set_session_status_wire(session_id, session_status))

    def set_session_status_wire(self, session_id: str, session_status: str) -> dict[str, Any]:
        validate_session_status(session_status)
        with self._db.tx() as conn:
            now = self._db.clock()
            self._db.expire_locked(conn, now)
            row = live_row(conn, None, session_id)
            self._db.write_status_locked(conn, row, session_status, now)
            return row_wire(reload_row(conn, session_id))

    def tombstone(self, session_id: str, reason: str = "tombstoned by the admin API") -> QueueEntry:
        with self._db.tx() as conn:
            now = self._db.clock()
            self._db.expire_locked(conn, now)
            row = live_row(conn, None, session_id)
            self._db.tombstone_locked(conn, row, now, reason)
            return entry_from_row(reload_row(conn, session_id))

    # --- reads --------------------------------------------------------------------------------------

    def get_entry(self, account_id: str, session_id: str) -> QueueEntry:
        return QueueEntry.model_validate(self.get_entry_wire(account_id, session_id))

    def get_entry_wire(self, account_id: str, session_id: str) -> dict[str, Any]:
        with self._db.snapshot() as conn:
            return row_wire(live_row(conn, account_id, session_id))

    def head_cursor(self) -> QueueCursor:
        """A cursor just past every change so far: a watch from it replays nothing."""
        return QueueCursor(math.nextafter(self._db.last_rev, math.inf), "")

    def _outpost_of(self, conn: sqlite3.Connection, account_id: str, outpost_id: str) -> bool:
        """Whether ``outpost_id`` names an outpost of ``account_id``.

        Entries of an outpost all belong to the outpost's account, so once this holds, queries of the
        outpost's rows need no ``account_id`` term and can be answered from an index alone.
        """
        found = conn.execute(
            "SELECT 1 FROM outposts WHERE outpost_id = ? AND account_id = ?", (outpost_id, account_id)
        ).fetchone()
        return found is not None

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
        where, params = list_filter(account_id, outpost, phase, acceptor_id)
        if cursor is not None:
            where += CURSOR_TERM.format(op=">=")
            params.extend([cursor.rev, cursor.session_id])
        with self._db.snapshot() as conn:
            if outpost is not None and not self._outpost_of(conn, account_id, outpost):
                rows, total = [], 0  # an unknown outpost, or another account's: an empty list
            else:
                total = conn.execute(COUNT_SQL.format(where=where), params).fetchone()["n"]
                rows = conn.execute(LIST_SQL.format(where=where), [*params, first + 1]).fetchall()
            head = self.head_cursor()
        if cursor is not None and first == 1 and len(rows) > 1 and row_cursor(rows[0]) == cursor:
            rows = rows[1:]
        page = rows[:first]
        stuck = cursor is not None and len(page) == 1 and row_cursor(page[0]) == cursor
        has_next = len(page) == first and not stuck
        return QueuePage(
            wire_items=[row_wire(row) for row in page],
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
        changes, dummy_head = self.replay(
            account_id, outpost=outpost, cursor=cursor, inclusive=inclusive, limit=limit
        )
        return changes

    def replay(
        self,
        account_id: str,
        *,
        outpost: Optional[str] = None,
        cursor: Optional[QueueCursor] = None,
        inclusive: bool = True,
        limit: int = 200,
    ) -> tuple[list[Change], float]:
        """:meth:`changes_since` and the head revision of the same snapshot: when fewer than ``limit``
        rows come back, every change up to the head has been seen (a watch stream then follows the
        shared feed from there)."""
        params: list[Any] = [outpost] if outpost is not None else [account_id]
        term = ""
        if cursor is not None:
            term = CURSOR_TERM.format(op=">=" if inclusive else ">")
            params.extend([cursor.rev, cursor.session_id])
        sql = (REPLAY_OUTPOST_SQL if outpost is not None else REPLAY_ACCOUNT_SQL).format(cursor=term)
        with self._db.snapshot() as conn:
            head = self._db.last_rev
            if outpost is not None and not self._outpost_of(conn, account_id, outpost):
                return [], head
            rows = conn.execute(sql, [*params, limit]).fetchall()
        return [row_change(row) for row in rows], head

    def changes_after(self, rev: Optional[float], limit: int = 200) -> tuple[list[Change], float]:
        """Every account's changes with a revision above ``rev``, oldest first, and the head revision
        (every change at or below it is in the list, unless the list is ``limit`` long). ``rev=None``
        reads only the head.

        The watch feed's read: no claim expiry (an event shows a row as it was committed; expiries are
        changes of their own), and no write lock.
        """
        with self._db.read() as conn:
            self._db.reload_last_rev()
            head = self._db.last_rev
            if rev is None:
                return [], head
            rows = conn.execute(CHANGES_AFTER_SQL, (rev, limit)).fetchall()
        return [row_change(row) for row in rows], head

    # --- claim and release --------------------------------------------------------------------------

    def certainly_claimed_by_another(self, account_id: str, session_id: str, acceptor_id: str) -> bool:
        """True when a claim by ``acceptor_id`` would be refused with 409 right now: another acceptor
        holds a claim that is not due to expire (its deadline is ahead, or the session runs; a due
        lagging status would only extend it). Then :meth:`claim_wire` would answer the same 409.

        Why: in a claim storm most claims lose, and answering each loser with a write transaction
        (and a trip to the thread pool) made the losers most of the simulator's work. This is one
        read by primary key, made on the caller's thread. It never waits: when the store is busy, it
        answers False and the caller takes the ordinary path.
        """
        if not self._db.lock.acquire(blocking=False):
            return False
        try:
            row = session_row(self._db.conn, session_id)
        finally:
            self._db.lock.release()
        if row is None or row["deleted"] or row["account_id"] != account_id or row["phase"] != "claimed":
            return False
        if row["acceptor_id"] in (None, acceptor_id):
            return False
        now = self._db.clock()
        tombstone_at = self._db.tombstone_at(row["ended_at"])
        if tombstone_at is not None and tombstone_at <= now:
            return False  # an ended session due to be tombstoned: the full path answers 404
        deadline = row["claim_deadline"]
        return row["session_status"] == "running" or (deadline is not None and deadline > now)

    def claim(
        self, account_id: str, session_id: str, acceptor_id: str, *, ttl: float, gateway_url: str
    ) -> QueueEntry:
        """:meth:`claim_wire`, as the client's model."""
        wire = self.claim_wire(account_id, session_id, acceptor_id, ttl=ttl, gateway_url=gateway_url)
        return QueueEntry.model_validate(wire)

    def claim_wire(
        self, account_id: str, session_id: str, acceptor_id: str, *, ttl: float, gateway_url: str
    ) -> dict[str, Any]:
        """Claim, or renew when ``acceptor_id`` already holds the claim. Returns the entry with a fresh
        ``connect_token`` and the ``gateway_url``. Another live holder is a 409; no entry is a 404."""
        with self._db.tx() as conn:
            now = self._db.clock()
            self._db.expire_locked(conn, now)
            row = live_row(conn, account_id, session_id)
            holder = row["acceptor_id"] if row["phase"] == "claimed" else None
            if holder is not None and holder != acceptor_id:
                raise Conflict(ALREADY_CLAIMED)
            token = f"ct_{secrets.token_urlsafe(32)}"
            fingerprint = token_fingerprint(token)
            deadline = now + ttl
            if holder == acceptor_id:
                chain = int(row["claim_chain"])
                self._db.record_claim(
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
                # A new claim. Another acceptor's tokens end here; the claimant's own from a claim that
                # lapsed stay valid (contract 4.3: tokens outlive the claim; see Database.expire_locked).
                self._db.revoke_tokens(conn, session_id, now, "superseded", except_acceptor=acceptor_id)
                chain = self._db.record_claim(
                    conn,
                    row,
                    "claim",
                    now,
                    acceptor_id=acceptor_id,
                    fingerprint=fingerprint,
                    deadline=deadline,
                )
                conn.execute("UPDATE claim_history SET chain = ? WHERE seq = ?", (chain, chain))
            rev = self._db.next_rev(conn, now)
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
            return row_wire(reload_row(conn, session_id), connect_token=token, gateway_url=gateway_url)

    def release(self, account_id: str, session_id: str, acceptor_id: str) -> QueueEntry:
        return QueueEntry.model_validate(self.release_wire(account_id, session_id, acceptor_id))

    def release_wire(self, account_id: str, session_id: str, acceptor_id: str) -> dict[str, Any]:
        """Return a claimed session to the queue; only its current holder may (else 409)."""
        with self._db.tx() as conn:
            now = self._db.clock()
            self._db.expire_locked(conn, now)
            row = live_row(conn, account_id, session_id)
            if row["phase"] != "claimed" or row["acceptor_id"] != acceptor_id:
                raise Conflict(NOT_CLAIMED_BY_ACCEPTOR)
            self._db.record_claim(
                conn,
                row,
                "release",
                now,
                acceptor_id=acceptor_id,
                deadline=row["claim_deadline"],
                chain=row["claim_chain"],
            )
            self._db.revoke_tokens(conn, session_id, now, "released")
            rev = self._db.next_rev(conn, now)
            conn.execute(
                "UPDATE sessions SET phase = 'pending', acceptor_id = NULL, claim_deadline = NULL, "
                "claim_chain = NULL, claim_ttl = NULL, rev = ? WHERE session_id = ?",
                (rev, session_id),
            )
            return row_wire(reload_row(conn, session_id))
