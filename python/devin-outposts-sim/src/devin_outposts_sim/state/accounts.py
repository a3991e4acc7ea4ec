"""Accounts, API tokens, organizations, outposts and the organization default platform."""

from __future__ import annotations

import json
import secrets
import sqlite3
import string
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

from devin_outposts.api.models import DefaultPlatform, Outpost, OutpostList
from devin_outposts_sim.errors import (
    ORG_NOT_FOUND,
    OUTPOST_NOT_FOUND,
    Conflict,
    Invalid,
    NotFound,
)
from devin_outposts_sim.state.cursor import encode_org_cursor, encode_outpost_cursor
from devin_outposts_sim.state.db import DEFAULT_ORG_NAME, Database, next_org_seq, token_hash

MACHINE_SCOPE = "account.outposts.machine"
ORCHESTRATOR_SCOPE = "account.outposts.orchestrator"
KNOWN_SCOPES = (MACHINE_SCOPE, ORCHESTRATOR_SCOPE)
#: A scope grants itself and everything listed here (docs/fleet-api.md §1.2: orchestrator implies machine).
IMPLIED_SCOPES = {ORCHESTRATOR_SCOPE: (MACHINE_SCOPE,)}
DEFAULT_ACCOUNT = "acct-default"
_TOKEN_ALPHABET = string.ascii_lowercase + string.digits


@dataclass(frozen=True)
class Principal:
    """Who a bearer token belongs to, and what it may do (scopes already expanded)."""

    account_id: str
    scopes: frozenset[str]

    def has(self, scope: str) -> bool:
        return scope in self.scopes


def expand_scopes(scopes: Iterable[str]) -> frozenset[str]:
    granted = set()
    for scope in scopes:
        granted.add(scope)
        granted.update(IMPLIED_SCOPES.get(scope, ()))
    return frozenset(granted)


def new_api_token() -> str:
    """``cog_`` and 48 lowercase letters and digits, the shape of a real v3 token."""
    return "cog_" + "".join(secrets.choice(_TOKEN_ALPHABET) for dummy in range(48))


class Accounts:
    """Accounts, tokens, organizations and outposts (``store.accounts``)."""

    def __init__(self, db: Database) -> None:
        self._db = db
        #: Principals of tokens seen before, by token hash. Why: every API request authenticates, and
        #: a token never changes once issued; only a reset removes tokens (and clears this). Unknown
        #: tokens are not remembered, so a token issued meanwhile (by another process on the same file
        #: too) is found at its first use.
        self._principals: dict[str, Principal] = {}

    def forget_tokens(self) -> None:
        """Drop the remembered principals (a reset wipes the tokens they belong to)."""
        self._principals.clear()

    # --- accounts and tokens --------------------------------------------------------------------------

    def _ensure_account_locked(self, conn: sqlite3.Connection, account_id: str, now: float) -> str:
        row = conn.execute(
            "SELECT default_org_id FROM accounts WHERE account_id = ?", (account_id,)
        ).fetchone()
        if row is not None:
            return str(row["default_org_id"])
        org_id = f"org-{secrets.token_hex(8)}"
        conn.execute(
            "INSERT INTO accounts (account_id, default_org_id, created_at) VALUES (?, ?, ?)",
            (account_id, org_id, now),
        )
        self._insert_org_locked(conn, account_id, org_id, DEFAULT_ORG_NAME, now)
        return org_id

    @staticmethod
    def _insert_org_locked(
        conn: sqlite3.Connection, account_id: str, org_id: str, name: Optional[str], now: float
    ) -> str:
        """Insert an organization at the end of the creation order; returns its name. Without a name it is
        ``Organization <n>``, ``n`` its place among the account's organizations (the default one is 1)."""
        seq = next_org_seq(conn)
        if name is None:
            count = conn.execute(
                "SELECT COUNT(*) AS n FROM orgs WHERE account_id = ?", (account_id,)
            ).fetchone()["n"]
            name = f"Organization {int(count) + 1}"
        conn.execute(
            "INSERT INTO orgs (org_id, account_id, name, seq, created_at) VALUES (?, ?, ?, ?, ?)",
            (org_id, account_id, name, seq, now),
        )
        return name

    def ensure_account(self, account_id: str) -> str:
        """Create the account (and its default organization) unless it exists; returns that org id."""
        with self._db.tx() as conn:
            return self._ensure_account_locked(conn, account_id, self._db.clock())

    def create_token(self, account_id: str, scopes: Iterable[str], label: Optional[str] = None) -> str:
        """Issue an API token; only its hash is stored, so this is the only time it is seen."""
        scope_list = sorted(set(scopes))
        unknown = [scope for scope in scope_list if scope not in KNOWN_SCOPES]
        if unknown:
            raise Invalid(f"unknown scope {unknown[0]!r}; known scopes: {', '.join(KNOWN_SCOPES)}")
        token = new_api_token()
        with self._db.tx() as conn:
            now = self._db.clock()
            self._ensure_account_locked(conn, account_id, now)
            conn.execute(
                "INSERT INTO api_tokens (token_hash, account_id, scopes, label, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (token_hash(token), account_id, " ".join(scope_list), label, now),
            )
        return token

    def cached_principal(self, token: str) -> Optional[Principal]:
        """The principal of a token already seen (no database access), else None: then ask
        :meth:`authenticate`."""
        return self._principals.get(token_hash(token))

    def authenticate(self, token: str) -> Optional[Principal]:
        hashed = token_hash(token)
        known = self._principals.get(hashed)
        if known is not None:
            return known
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT account_id, scopes FROM api_tokens WHERE token_hash = ?", (hashed,)
            ).fetchone()
        if row is None:
            return None
        principal = Principal(str(row["account_id"]), expand_scopes(str(row["scopes"]).split()))
        self._principals[hashed] = principal
        return principal

    # --- organizations ------------------------------------------------------------------------------

    def create_org(self, account_id: str, name: Optional[str] = None) -> dict[str, Any]:
        """Create an organization (and the account, unless it exists); returns its ``org_id``,
        ``account_id`` and ``name``. The caller has validated ``name``; names need not be unique."""
        with self._db.tx() as conn:
            now = self._db.clock()
            self._ensure_account_locked(conn, account_id, now)
            org_id = f"org-{secrets.token_hex(8)}"
            name = self._insert_org_locked(conn, account_id, org_id, name, now)
        return {"org_id": org_id, "account_id": account_id, "name": name}

    def list_orgs(self, account_id: Optional[str] = None) -> list[dict[str, Any]]:
        """Every organization (of one account, or of all), in creation order (admin use)."""
        query = (
            "SELECT o.org_id, o.account_id, o.name, (a.default_org_id = o.org_id) AS is_default FROM orgs o "
            "JOIN accounts a ON a.account_id = o.account_id"
        )
        params: tuple[Any, ...] = ()
        if account_id is not None:
            query += " WHERE o.account_id = ?"
            params = (account_id,)
        with self._db.read() as conn:
            rows = conn.execute(query + " ORDER BY o.seq", params).fetchall()
        return [
            {
                "org_id": row["org_id"],
                "account_id": row["account_id"],
                "name": row["name"],
                "default": bool(row["is_default"]),
            }
            for row in rows
        ]

    def list_org_page(self, account_id: str, first: int, after: Optional[int] = None) -> dict[str, Any]:
        """A page of ``GET /v3/enterprise/organizations``: the account's organizations in creation order,
        strictly after ``after`` (a ``seq``), as the wire envelope ``items``/``end_cursor``/``has_next_page``
        (no ``total``: the contract names only those three). ``end_cursor`` is null on an empty page."""
        with self._db.read() as conn:
            rows = conn.execute(
                "SELECT org_id, name, seq FROM orgs WHERE account_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (account_id, after or 0, first + 1),
            ).fetchall()
        page = rows[:first]
        return {
            "items": [{"org_id": row["org_id"], "name": row["name"]} for row in page],
            "end_cursor": encode_org_cursor(int(page[-1]["seq"])) if page else None,
            "has_next_page": len(rows) > first,
        }

    def _org_locked(self, conn: sqlite3.Connection, account_id: str, org_id: str) -> sqlite3.Row:
        row: Optional[sqlite3.Row] = conn.execute(
            "SELECT * FROM orgs WHERE org_id = ? AND account_id = ?", (org_id, account_id)
        ).fetchone()
        if row is None:
            raise NotFound(ORG_NOT_FOUND)
        return row

    # --- outposts -----------------------------------------------------------------------------------

    def _outpost_row(self, conn: sqlite3.Connection, account_id: str, outpost_id: str) -> sqlite3.Row:
        row: Optional[sqlite3.Row] = conn.execute(
            "SELECT * FROM outposts WHERE outpost_id = ? AND account_id = ?", (outpost_id, account_id)
        ).fetchone()
        if row is None:
            raise NotFound(OUTPOST_NOT_FOUND)
        return row

    def _outpost_model(self, conn: sqlite3.Connection, row: sqlite3.Row, now: float) -> Outpost:
        counts = conn.execute(
            "SELECT COALESCE(SUM(CASE WHEN phase = 'pending' AND session_status NOT IN "
            "('suspended', 'terminated') THEN 1 ELSE 0 END), 0) AS depth, "
            "COALESCE(SUM(CASE WHEN phase = 'claimed' AND claim_deadline > ? THEN 1 ELSE 0 END), 0) "
            "AS active FROM sessions WHERE outpost_id = ? AND deleted = 0",
            (now, row["outpost_id"]),
        ).fetchone()
        allowed = row["allowed_org_ids"]
        return Outpost.model_validate(
            {
                "metadata": {
                    "outpost_id": row["outpost_id"],
                    "account_id": row["account_id"],
                    "created_at": int(row["created_at"]),
                },
                "spec": {
                    "name": row["name"],
                    "platform": row["platform"],
                    "description": row["description"],
                    "allowed_org_ids": json.loads(allowed) if allowed is not None else None,
                },
                "status": {"queue_depth": int(counts["depth"]), "active_claims": int(counts["active"])},
            }
        )

    def create_outpost(
        self,
        account_id: str,
        name: str,
        platform: Optional[str] = None,
        description: Optional[str] = None,
        allowed_org_ids: Optional[list[str]] = None,
    ) -> Outpost:
        """Create an outpost; the caller has validated the fields. A taken name is a 409."""
        with self._db.tx() as conn:
            now = self._db.clock()
            self._ensure_account_locked(conn, account_id, now)
            taken = conn.execute(
                "SELECT outpost_id FROM outposts WHERE account_id = ? AND name = ?", (account_id, name)
            ).fetchone()
            if taken is not None:
                raise Conflict(f"An outpost named {name!r} already exists ({taken['outpost_id']})")
            for org_id in allowed_org_ids or ():
                try:
                    self._org_locked(conn, account_id, org_id)
                except NotFound:
                    raise Invalid(f"allowed_org_ids: unknown organization {org_id!r}") from None
            outpost_id = f"outpost_env-{secrets.token_hex(12)}"
            conn.execute(
                "INSERT INTO outposts (outpost_id, account_id, name, platform, description, "
                "allowed_org_ids, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    outpost_id,
                    account_id,
                    name,
                    platform,
                    description,
                    json.dumps(allowed_org_ids) if allowed_org_ids is not None else None,
                    now,
                ),
            )
            return self._outpost_model(conn, self._outpost_row(conn, account_id, outpost_id), now)

    def get_outpost(self, account_id: str, outpost_id: str) -> Outpost:
        with self._db.snapshot() as conn:
            now = self._db.clock()
            return self._outpost_model(conn, self._outpost_row(conn, account_id, outpost_id), now)

    def outpost_account(self, outpost_id: str) -> Optional[str]:
        """The account owning an outpost, or None (admin use)."""
        with self._db.read() as conn:
            row = conn.execute(
                "SELECT account_id FROM outposts WHERE outpost_id = ?", (outpost_id,)
            ).fetchone()
        return None if row is None else str(row["account_id"])

    def list_outposts(self, account_id: str, first: int, after: Optional[int] = None) -> OutpostList:
        """A page of the account's outposts in creation order, strictly after ``after`` (a ``seq``)."""
        with self._db.snapshot() as conn:
            now = self._db.clock()
            total = conn.execute(
                "SELECT COUNT(*) AS n FROM outposts WHERE account_id = ?", (account_id,)
            ).fetchone()["n"]
            rows = conn.execute(
                "SELECT * FROM outposts WHERE account_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                (account_id, after or 0, first + 1),
            ).fetchall()
            page = rows[:first]
            items = [self._outpost_model(conn, row, now) for row in page]
        return OutpostList(
            items=items,
            end_cursor=encode_outpost_cursor(int(page[-1]["seq"])) if page else None,
            has_next_page=len(rows) > first,
            total=int(total),
        )

    def delete_outpost(self, account_id: str, outpost_id: str) -> Outpost:
        """Delete an outpost and tombstone its queue entries; returns it as it was just before."""
        with self._db.tx() as conn:
            now = self._db.clock()
            self._db.expire_locked(conn, now)
            row = self._outpost_row(conn, account_id, outpost_id)
            before = self._outpost_model(conn, row, now)
            sessions = conn.execute(
                "SELECT * FROM sessions WHERE outpost_id = ? AND deleted = 0 ORDER BY rev, session_id",
                (outpost_id,),
            ).fetchall()
            for session in sessions:
                self._db.tombstone_locked(conn, session, now, "outpost deleted")
            conn.execute(
                "UPDATE orgs SET default_outpost_id = NULL WHERE default_outpost_id = ?", (outpost_id,)
            )
            conn.execute("DELETE FROM outposts WHERE outpost_id = ?", (outpost_id,))
        return before

    # --- organization default platform ----------------------------------------------------------------

    def _default_platform_locked(self, conn: sqlite3.Connection, org: sqlite3.Row) -> DefaultPlatform:
        outpost_id = org["default_outpost_id"]
        name = None
        if outpost_id is not None:
            found = conn.execute("SELECT name FROM outposts WHERE outpost_id = ?", (outpost_id,)).fetchone()
            name = None if found is None else found["name"]
        return DefaultPlatform(
            platform=org["default_platform"], outpost_pool_id=outpost_id, outpost_pool_name=name
        )

    def get_default_platform(self, account_id: str, org_id: str) -> DefaultPlatform:
        with self._db.read() as conn:
            return self._default_platform_locked(conn, self._org_locked(conn, account_id, org_id))

    def set_default_platform(
        self, account_id: str, org_id: str, platform: Optional[str], outpost_pool_id: Optional[str]
    ) -> DefaultPlatform:
        """Set one of the two (or clear both). The caller has rejected a body with both set."""
        with self._db.tx() as conn:
            self._org_locked(conn, account_id, org_id)
            if outpost_pool_id is not None:
                try:
                    self._outpost_row(conn, account_id, outpost_pool_id)
                except NotFound:
                    raise Invalid(
                        f"outpost_pool_id {outpost_pool_id!r} does not name an outpost of this account"
                    ) from None
            conn.execute(
                "UPDATE orgs SET default_platform = ?, default_outpost_id = ? WHERE org_id = ?",
                (platform, outpost_pool_id, org_id),
            )
            return self._default_platform_locked(conn, self._org_locked(conn, account_id, org_id))
