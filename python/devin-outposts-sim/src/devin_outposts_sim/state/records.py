"""What the simulator records for tests: the claim history and a full view of queue rows."""

from __future__ import annotations

from typing import Any, Optional

from devin_outposts_sim.state.db import Database
from devin_outposts_sim.state.rows import row_cursor, row_wire


class Records:
    """Read-only views for the admin API (``store.records``): nothing here changes state (except lazy
    claim expiry)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def claim_history(
        self,
        *,
        session_id: Optional[str] = None,
        outpost_id: Optional[str] = None,
        acceptor_id: Optional[str] = None,
        account_id: Optional[str] = None,
    ) -> list[dict[str, Any]]:
        """Every claim, renewal, release, expiry and tombstone of a claim, oldest first."""
        where, params = ["1 = 1"], []
        for column, value in (
            ("session_id", session_id),
            ("outpost_id", outpost_id),
            ("acceptor_id", acceptor_id),
            ("account_id", account_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        with self._db.read() as conn:
            rows = conn.execute(
                f"SELECT * FROM claim_history WHERE {' AND '.join(where)} ORDER BY seq", params
            ).fetchall()
        return [dict(row) for row in rows]

    def admin_sessions(
        self,
        *,
        outpost_id: Optional[str] = None,
        session_id: Optional[str] = None,
        include_deleted: bool = False,
    ) -> list[dict[str, Any]]:
        """The simulator's full view of queue rows, tombstones included on request."""
        where, params = ["1 = 1"], []
        if outpost_id is not None:
            where.append("outpost_id = ?")
            params.append(outpost_id)
        if session_id is not None:
            where.append("session_id = ?")
            params.append(session_id)
        if not include_deleted:
            where.append("deleted = 0")
        with self._db.snapshot() as conn:
            rows = conn.execute(
                f"SELECT * FROM sessions WHERE {' AND '.join(where)} ORDER BY rev, session_id", params
            ).fetchall()
        return [
            {
                "entry": row_wire(row),
                "account_id": row["account_id"],
                "deleted": bool(row["deleted"]),
                "rev": row["rev"],
                "cursor": row_cursor(row).encode(),
                "claim_deadline": row["claim_deadline"],
                "claim_chain": row["claim_chain"],
                # When the session ended (suspended or terminated), and when its row is (or was) due to
                # be tombstoned for it; None while it has not ended, or when ended sessions stay.
                "ended_at": row["ended_at"],
                "tombstone_at": self._db.tombstone_at(row["ended_at"]),
                # The end the brain announced whose status write still lags (``status_lag``), or None.
                "ending": (
                    None
                    if row["ending_status"] is None
                    else {"session_status": row["ending_status"], "at": row["ending_at"]}
                ),
            }
            for row in rows
        ]
