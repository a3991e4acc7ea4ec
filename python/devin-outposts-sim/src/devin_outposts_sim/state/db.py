"""The SQLite layer under the simulator's store: schema, transactions, revisions and change listeners,
and the claim expiry that every read and write applies first.

:class:`Database` is shared by every part of :class:`~devin_outposts_sim.state.store.Store` (accounts,
the queue, the gateway's records, ...): each part holds it and runs its statements through
:meth:`Database.tx`, :meth:`Database.snapshot` or :meth:`Database.read`.

One connection, guarded by a lock, in autocommit mode; every write runs inside ``BEGIN IMMEDIATE`` so
two writers (threads here, or a second process on the same file) can never interleave a
compare-and-swap. File databases use WAL with ``synchronous=NORMAL``: a committed transaction survives a
``kill -9`` of the simulator. ``:memory:`` is for tests.

Revisions: every change to a queue row gets a new ``rev``, a float that is the wall clock in Unix seconds
unless that would not be strictly greater than the last one, in which case it is the last one plus a
microsecond. The last revision is stored in ``meta``, so revisions keep increasing across restarts (and a
clock that steps backwards) and cursors issued before a restart stay valid.
"""

from __future__ import annotations

import hashlib
import math
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, Optional

SCHEMA_VERSION = 4
_REV_STEP = 1e-6
#: The platform of a queue entry whose outpost uses the default platform (``spec.platform: null``). Only
#: the outpost's platform is nullable (docs/fleet-api.md §3): entries always name a concrete one, which
#: clients filter on. Devin's default machine is Ubuntu and ``linux_x64`` is the first ``devin-remote`` build,
#: so the default platform is ``linux``. (The organization default-platform API names a hosted platform
#: label or an outpost, not an OS, so it cannot decide this.)
DEFAULT_PLATFORM = "linux"
#: The grace a claim gets when its session stops running, for a claim made before ``claim_ttl`` was
#: recorded (a database from schema version 1): the contract's usual claim TTL.
FALLBACK_CLAIM_TTL = 300.0
#: The session statuses that end a session (contract 3.4): its remote is told to exit, and its queue row
#: is tombstoned ``tombstone_after`` seconds later.
ENDED_STATUSES = ("suspended", "terminated")
#: Seconds between a session's end and the tombstone of its queue row, unless configured otherwise
#: (docs/simulator.md, "Ended sessions"). The real sweeper's delay is undocumented; a minute is well past
#: a few seconds of status lag and a worker's status re-reads and release, and short enough that a client
#: that claims every pending row stops serving an ended session within a minute.
DEFAULT_TOMBSTONE_AFTER = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS accounts (
    account_id TEXT PRIMARY KEY, default_org_id TEXT, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS api_tokens (
    token_hash TEXT PRIMARY KEY, account_id TEXT NOT NULL, scopes TEXT NOT NULL, label TEXT,
    created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS orgs (
    org_id TEXT PRIMARY KEY, account_id TEXT NOT NULL, default_platform TEXT,
    default_outpost_id TEXT, created_at REAL NOT NULL, name TEXT, seq INTEGER);
CREATE TABLE IF NOT EXISTS outposts (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, outpost_id TEXT NOT NULL UNIQUE, account_id TEXT NOT NULL,
    name TEXT NOT NULL, platform TEXT, description TEXT, allowed_org_ids TEXT, created_at REAL NOT NULL,
    UNIQUE (account_id, name));
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, account_id TEXT NOT NULL, outpost_id TEXT NOT NULL,
    kind TEXT NOT NULL, platform TEXT, remote_binary_sha TEXT, network_policy TEXT,
    phase TEXT NOT NULL, acceptor_id TEXT, claim_deadline REAL, claim_chain INTEGER,
    session_status TEXT NOT NULL, created_at REAL NOT NULL, rev REAL NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS sessions_by_rev ON sessions (account_id, rev, session_id);
CREATE TABLE IF NOT EXISTS claim_history (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, session_id TEXT NOT NULL,
    account_id TEXT NOT NULL, outpost_id TEXT NOT NULL, action TEXT NOT NULL, acceptor_id TEXT,
    token_fingerprint TEXT, claim_deadline REAL, chain INTEGER, reason TEXT);
CREATE INDEX IF NOT EXISTS claim_history_by_session ON claim_history (session_id, seq);
CREATE TABLE IF NOT EXISTS connect_tokens (
    token_hash TEXT PRIMARY KEY, session_id TEXT NOT NULL, acceptor_id TEXT NOT NULL,
    chain INTEGER NOT NULL, issued_at REAL NOT NULL, revoked_at REAL, revoked_reason TEXT);
CREATE INDEX IF NOT EXISTS connect_tokens_by_session ON connect_tokens (session_id, revoked_at);
CREATE TABLE IF NOT EXISTS dist_artifacts (
    sha TEXT NOT NULL, suffix TEXT NOT NULL, content BLOB NOT NULL, published_sha256 TEXT NOT NULL,
    created_at REAL NOT NULL, PRIMARY KEY (sha, suffix));
CREATE TABLE IF NOT EXISTS dist_latest (suffix TEXT PRIMARY KEY, sha TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS remote_connections (
    connection_id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL, at REAL NOT NULL,
    last_seen REAL NOT NULL, acceptor_id TEXT, chain INTEGER, token_fingerprint TEXT, info TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS remote_connections_by_session ON remote_connections (session_id, connection_id);
CREATE TABLE IF NOT EXISTS tool_calls (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, call_id TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL,
    tool TEXT NOT NULL, args TEXT NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL,
    delivered_at REAL, connection_id INTEGER, attempts INTEGER NOT NULL DEFAULT 0, completed_at REAL,
    result TEXT);
CREATE INDEX IF NOT EXISTS tool_calls_by_session ON tool_calls (session_id, state, seq);
"""

#: Columns of ``sessions`` added after schema version 1. They are added by ``ALTER TABLE`` on every open
#: (when missing), so a database written by an older simulator keeps its state and its cursors.
#: ``claim_ttl``: the TTL of the current claim or renewal, the grace a claim gets when its session stops
#: running (see :meth:`Database.write_status_locked`). ``ending_status``/``ending_at``: the status the
#: brain ended the session with, and when it is to be written, while it lags the end notice (the
#: simulator's ``status_lag``; see :meth:`Database.apply_endings_locked`).
#: ``ended_at`` (schema version 4): when ``session_status`` became ``suspended`` or ``terminated`` (null
#: while the session has not ended); the row is tombstoned ``tombstone_after`` seconds later.
ADDED_SESSION_COLUMNS = (
    ("claim_ttl", "REAL"),
    ("ending_status", "TEXT"),
    ("ending_at", "REAL"),
    ("ended_at", "REAL"),
)
#: Columns of ``connect_tokens`` added in schema version 4. ``notice_until``: a tombstoned session's
#: holder's token is still answered with the end notice (never work) until then, or until its remote has
#: been told (see :meth:`Database.tombstone_locked`).
ADDED_TOKEN_COLUMNS = (("notice_until", "REAL"),)
#: A claim that :meth:`Database.expire_locked` returns to the queue once its deadline passes. The
#: expiry queries spell it exactly so, which lets SQLite use the partial index ``sessions_expirable``.
#: Columns of ``orgs`` added in schema version 3, by ``ALTER TABLE`` like :data:`ADDED_SESSION_COLUMNS`.
#: ``name``: the organization's name (``GET /v3/enterprise/organizations``); ``seq``: its place in the
#: creation order, which that list pages over (``after``/``end_cursor``). Rows of an older database get both
#: in :meth:`Database._upgrade` (see :func:`backfill_orgs`).
ADDED_ORG_COLUMNS = (("name", "TEXT"), ("seq", "INTEGER"))
#: The name of the organization created with an account.
DEFAULT_ORG_NAME = "Default organization"
EXPIRABLE = "phase = 'claimed' AND deleted = 0 AND session_status != 'running'"
#: A live row of an ended session, which :meth:`Database.sweep_ended_locked` tombstones once it ended
#: ``tombstone_after`` ago; spelled exactly so in the queries, for the partial index ``sessions_ended``.
ENDED = "deleted = 0 AND ended_at IS NOT NULL"

#: The indexes of the hot queries (run on every open, after the added columns exist; see
#: python/devin-outposts-sim/tests/test_sim_query_plans.py, which checks that none of those queries scans
#: a table):
#:
#: * ``sessions_by_change``: the watch feed reads every change after a revision;
#: * ``sessions_by_outpost_rev`` / ``sessions_by_rev``: watch replays and lists of one outpost / of an
#:   account, in ``(rev, session_id)`` order from a cursor;
#: * ``sessions_by_outpost_phase``: a worker's ``?outpost=&phase=pending`` list and its ``total``;
#: * ``sessions_by_acceptor``: an orchestrator's ``?phase=claimed&acceptor_id=`` list;
#: * ``sessions_expirable``, ``sessions_by_ending``, ``sessions_ended`` (partial): what every request
#:   checks first, claims due to expire, lagging statuses due to be written and ended sessions due to be
#:   tombstoned; only the few candidate rows are in them, so the check costs little;
#: * ``claim_history_by_outpost``: the admin claim history of an outpost (benchmarks read it);
#: * ``orgs_by_account``: an account's organizations in creation order from a cursor (their list).
#:
#: Two indexes of schema version 1 are dropped: ``(outpost_id, deleted, phase)`` is a prefix of
#: ``sessions_by_outpost_phase``, and ``(phase, claim_deadline)`` held every running claim as well.
INDEXES = f"""
DROP INDEX IF EXISTS sessions_by_outpost;
DROP INDEX IF EXISTS sessions_by_deadline;
CREATE INDEX IF NOT EXISTS sessions_by_change ON sessions (rev);
CREATE INDEX IF NOT EXISTS sessions_by_outpost_rev ON sessions (outpost_id, rev, session_id);
CREATE INDEX IF NOT EXISTS sessions_by_outpost_phase
    ON sessions (outpost_id, deleted, phase, rev, session_id);
CREATE INDEX IF NOT EXISTS sessions_by_acceptor ON sessions (acceptor_id, rev, session_id);
CREATE INDEX IF NOT EXISTS sessions_expirable ON sessions (claim_deadline) WHERE {EXPIRABLE};
CREATE INDEX IF NOT EXISTS sessions_by_ending ON sessions (ending_at) WHERE ending_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_ended ON sessions (ended_at) WHERE {ENDED};
CREATE INDEX IF NOT EXISTS claim_history_by_outpost ON claim_history (outpost_id, seq);
CREATE UNIQUE INDEX IF NOT EXISTS orgs_by_account ON orgs (account_id, seq);
"""
#: Is anything due: a claim to expire, a lagging status to write or an ended session to tombstone (``?``:
#: now, now, and the end time at or before which a session is due, ``now - tombstone_after``)?
DUE_SQL = (
    f"SELECT 1 FROM sessions WHERE {EXPIRABLE} AND claim_deadline <= ? "
    "UNION ALL SELECT 1 FROM sessions WHERE ending_at IS NOT NULL AND ending_at <= ? "
    f"UNION ALL SELECT 1 FROM sessions WHERE {ENDED} AND ended_at <= ? LIMIT 1"
)
#: The claims due to expire (``?``: now), oldest deadline first.
EXPIRE_SQL = (
    f"SELECT * FROM sessions WHERE {EXPIRABLE} AND claim_deadline <= ? ORDER BY claim_deadline, session_id"
)
#: The lagging statuses due to be written (``?``: now).
ENDINGS_SQL = "SELECT * FROM sessions WHERE ending_at IS NOT NULL AND ending_at <= ? ORDER BY ending_at"
#: The ended sessions due to be tombstoned (``?``: ``now - tombstone_after``), the earliest end first.
SWEEP_ENDED_SQL = f"SELECT * FROM sessions WHERE {ENDED} AND ended_at <= ? ORDER BY ended_at, session_id"

#: Tables wiped by :meth:`Database.reset` (``meta`` survives so revisions keep increasing). The
#: ``dist_*`` tables hold published ``devin-remote`` artifacts (the built-in stand-in is not stored);
#: ``remote_connections`` and ``tool_calls`` are the gateway's and the brain's records.
DATA_TABLES = (
    "accounts",
    "api_tokens",
    "orgs",
    "outposts",
    "sessions",
    "claim_history",
    "connect_tokens",
    "dist_artifacts",
    "dist_latest",
    "remote_connections",
    "tool_calls",
)


def next_org_seq(conn: sqlite3.Connection) -> int:
    """The ``seq`` of a new organization: greater than every earlier one, before a reset too (kept in
    ``meta``, which a reset does not wipe), so an ``end_cursor`` issued before a reset never skips new
    organizations. Call it inside a write transaction."""
    row = conn.execute(
        "SELECT MAX(COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'last_org_seq'), 0), "
        "COALESCE((SELECT MAX(seq) FROM orgs), 0)) AS top"
    ).fetchone()
    seq = int(row["top"]) + 1
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last_org_seq', ?)", (str(seq),))
    return seq


def backfill_orgs(conn: sqlite3.Connection) -> None:
    """Give the organizations of a schema-2 database a ``seq`` (their creation order) and a name, as
    :meth:`~devin_outposts_sim.state.accounts.Accounts.create_org` would have: the account's default
    organization is :data:`DEFAULT_ORG_NAME`, another one ``Organization <its place in the account>``."""
    missing = conn.execute(
        "SELECT org_id FROM orgs WHERE seq IS NULL ORDER BY created_at, rowid"
    ).fetchall()
    for row in missing:
        conn.execute("UPDATE orgs SET seq = ? WHERE org_id = ?", (next_org_seq(conn), row["org_id"]))
    conn.execute(
        "UPDATE orgs SET name = CASE WHEN org_id IN (SELECT default_org_id FROM accounts) THEN ? "
        "ELSE 'Organization ' || (SELECT COUNT(*) FROM orgs o WHERE o.account_id = orgs.account_id "
        "AND o.seq <= orgs.seq) END WHERE name IS NULL",
        (DEFAULT_ORG_NAME,),
    )


def check_tombstone_after(value: Any) -> Optional[float]:
    """``tombstone_after`` as a number of seconds, or None (ended sessions are never tombstoned); anything
    but a positive finite number or None is a :class:`ValueError` naming the setting."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("tombstone_after must be a positive number of seconds, or null for never")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("tombstone_after must be a positive number of seconds, or null for never")
    return seconds


def token_hash(token: str) -> str:
    """How tokens are stored: only their SHA-256, never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_fingerprint(token: str) -> str:
    """The short, non-secret id of a connect token recorded in the claim history (16 hex digits).

    Tests compute it from a claim response's ``connect_token`` to match history records.
    """
    return token_hash(token)[:16]


class Database:
    """Connection, transactions, revisions, change notification and claim expiry: what every part of the
    store shares. Thread-safe: one connection behind one lock (:attr:`lock`)."""

    def __init__(
        self,
        path: str = ":memory:",
        *,
        clock: Callable[[], float] = time.time,
        tombstone_after: Optional[float] = DEFAULT_TOMBSTONE_AFTER,
    ) -> None:
        self.path = path
        #: The wall clock (tests pass a fake one); every part reads "now" from it.
        self.clock = clock
        self._tombstone_after = check_tombstone_after(tombstone_after)
        #: Guards :attr:`conn`; held for each statement or transaction.
        self.lock = threading.RLock()
        self._listeners: list[Callable[[], None]] = []
        self._changed = False
        self.conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
        self.conn.row_factory = sqlite3.Row
        if path != ":memory:" and not path.startswith("file::memory:"):
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("PRAGMA busy_timeout=30000")
        with self.lock:
            self.conn.executescript(SCHEMA)
            self._upgrade()
            self.conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('last_rev', '0')")
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'last_rev'").fetchone()
            stored = float(row["value"])
            top = self.conn.execute("SELECT MAX(rev) AS top FROM sessions").fetchone()["top"]
            self._last_rev = max(stored, float(top or 0.0))

    def _upgrade(self) -> None:
        """Bring a database of an older schema version (or a new one) up to :data:`SCHEMA_VERSION`."""
        conn = self.conn
        columns = {str(row["name"]) for row in conn.execute("PRAGMA table_info(sessions)")}
        for name, declaration in ADDED_SESSION_COLUMNS:
            if name not in columns:
                conn.execute(f"ALTER TABLE sessions ADD COLUMN {name} {declaration}")
        token_columns = {str(row["name"]) for row in conn.execute("PRAGMA table_info(connect_tokens)")}
        for name, declaration in ADDED_TOKEN_COLUMNS:
            if name not in token_columns:
                conn.execute(f"ALTER TABLE connect_tokens ADD COLUMN {name} {declaration}")
        org_columns = {str(row["name"]) for row in conn.execute("PRAGMA table_info(orgs)")}
        for name, declaration in ADDED_ORG_COLUMNS:
            if name not in org_columns:
                conn.execute(f"ALTER TABLE orgs ADD COLUMN {name} {declaration}")
        backfill_orgs(conn)
        conn.executescript(INDEXES)
        # Schema version 1 queued sessions of a default-platform outpost with a null platform.
        conn.execute("UPDATE sessions SET platform = ? WHERE platform IS NULL", (DEFAULT_PLATFORM,))
        # Before schema version 4 the end time was not kept: a session that had ended counts as ended at
        # its last change.
        conn.execute(
            "UPDATE sessions SET ended_at = rev WHERE ended_at IS NULL AND deleted = 0 "
            "AND session_status IN (?, ?)",
            ENDED_STATUSES,
        )
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )

    # --- lifecycle and listeners ---------------------------------------------------------------------

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from whatever thread committed) after every committed queue change."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

    def now(self) -> float:
        return self.clock()

    @property
    def tombstone_after(self) -> Optional[float]:
        """Seconds after its end at which an ended session's row is tombstoned; None: never."""
        return self._tombstone_after

    @tombstone_after.setter
    def tombstone_after(self, value: Optional[float]) -> None:
        self._tombstone_after = check_tombstone_after(value)

    def ended_cutoff(self, now: float) -> float:
        """Sessions that ended at or before this time are due to be tombstoned (-inf: none ever is)."""
        after = self._tombstone_after
        return -math.inf if after is None else now - after

    def tombstone_at(self, ended_at: Optional[float]) -> Optional[float]:
        """When a session that ended at ``ended_at`` is (or was) due to be tombstoned."""
        after = self._tombstone_after
        return None if ended_at is None or after is None else float(ended_at) + after

    # --- transactions --------------------------------------------------------------------------------

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``); listeners run after a commit that changed rows."""
        with self.lock:
            self._changed = False
            self.conn.execute("BEGIN IMMEDIATE")
            committed = False
            try:
                # Another process may share the file: take the last revision from the database, now
                # that this transaction holds the write lock.
                self.reload_last_rev()
                yield self.conn
                self.conn.execute("COMMIT")
                committed = True
            finally:
                # An error in the block, or the generator closed while suspended: nothing is kept.
                if not committed:
                    self.conn.execute("ROLLBACK")
                    self.reload_last_rev()
            changed, self._changed = self._changed, False
        if changed:
            for callback in list(self._listeners):
                callback()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """Statements outside any transaction (each one sees the latest commit); no claim expiry."""
        with self.lock:
            yield self.conn

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction (one consistent view) in which no claim is void and no lagging status is
        overdue, as with :meth:`tx`, but without taking the write lock unless something is due.

        Why: reads (lists, gets, watch replays, connect-token checks) are most of the traffic. Taking
        SQLite's write lock for each of them (``BEGIN IMMEDIATE`` only to run the expiry) serialised
        them behind every writer, of this process and of any other on the file.
        """
        with self.lock:
            now = self.clock()
            if self.conn.execute(DUE_SQL, (now, now, self.ended_cutoff(now))).fetchone() is not None:
                with self.tx() as conn:
                    self.expire_locked(conn, now)
            self.conn.execute("BEGIN")
            try:
                # Another process may share the file: a head cursor made in here must be current.
                self.reload_last_rev()
                yield self.conn
            finally:
                self.conn.execute("COMMIT")  # a read transaction: this only ends the snapshot

    def reload_last_rev(self) -> None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = 'last_rev'").fetchone()
        self._last_rev = max(self._last_rev, float(row["value"]))

    def next_rev(self, conn: sqlite3.Connection, now: float) -> float:
        """A revision strictly greater than every earlier one; marks the transaction as a change."""
        rev = max(now, self._last_rev + _REV_STEP)
        if rev <= self._last_rev:  # pragma: no cover - float guard
            rev = self._last_rev + 2 * _REV_STEP
        self._last_rev = rev
        conn.execute("UPDATE meta SET value = ? WHERE key = 'last_rev'", (repr(rev),))
        self._changed = True
        return rev

    @property
    def last_rev(self) -> float:
        return self._last_rev

    def reset(self, also: tuple[str, ...] = ()) -> None:
        """Delete every account, token, outpost, session and record, and the tables ``also`` names (the
        parts that keep tables of their own), in one transaction (test isolation)."""
        with self.tx() as conn:
            for table in DATA_TABLES + also:
                conn.execute(f"DELETE FROM {table}")
            self._changed = True

    # --- claim expiry (used by every queue read and write) -------------------------------------------

    def revoke_tokens(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        now: float,
        reason: str,
        *,
        except_acceptor: Optional[str] = None,
    ) -> None:
        """Revoke the session's tokens (all, or all but those of ``except_acceptor``)."""
        conn.execute(
            "UPDATE connect_tokens SET revoked_at = ?, revoked_reason = ? "
            "WHERE session_id = ? AND revoked_at IS NULL AND acceptor_id IS NOT ?",
            (now, reason, session_id, except_acceptor),
        )

    def record_claim(
        self,
        conn: sqlite3.Connection,
        row: sqlite3.Row,
        action: str,
        now: float,
        *,
        acceptor_id: Optional[str] = None,
        fingerprint: Optional[str] = None,
        deadline: Optional[float] = None,
        chain: Optional[int] = None,
        reason: Optional[str] = None,
    ) -> int:
        cur = conn.execute(
            "INSERT INTO claim_history (at, session_id, account_id, outpost_id, action, acceptor_id, "
            "token_fingerprint, claim_deadline, chain, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                now,
                row["session_id"],
                row["account_id"],
                row["outpost_id"],
                action,
                acceptor_id,
                fingerprint,
                deadline,
                chain,
                reason,
            ),
        )
        seq = cur.lastrowid
        assert seq is not None
        return seq

    def expire_locked(self, conn: sqlite3.Connection, now: float) -> int:
        """Return expired claims to the queue, except those whose session is ``running``.

        Lagging statuses that are due are written first: a session that stopped running is judged by
        its status from then on (and gets its grace, see :meth:`write_status_locked`). Then ended
        sessions that are due are tombstoned (:meth:`sweep_ended_locked`), so no answer shows a row the
        service would have removed.

        The tokens of an expired claim are not revoked: they stop working because nobody holds the
        session, and work again if the same acceptor claims it again (contract 4.3: a connect token is
        issued for the session's lifetime, and the k8s operator keeps the claim-time token in the pod's
        Secret). A claim by another acceptor revokes them (:meth:`~devin_outposts_sim.state.queue.Queue.
        claim_wire`).
        """
        self.apply_endings_locked(conn, now)
        self.sweep_ended_locked(conn, now)
        rows = conn.execute(EXPIRE_SQL, (now,)).fetchall()
        for row in rows:
            rev = self.next_rev(conn, now)
            conn.execute(
                "UPDATE sessions SET phase = 'pending', acceptor_id = NULL, claim_deadline = NULL, "
                "claim_chain = NULL, claim_ttl = NULL, rev = ? WHERE session_id = ?",
                (rev, row["session_id"]),
            )
            self.record_claim(
                conn,
                row,
                "expire",
                now,
                acceptor_id=row["acceptor_id"],
                deadline=row["claim_deadline"],
                chain=row["claim_chain"],
                reason="claim deadline passed",
            )
        return len(rows)

    def sweep_ended_locked(self, conn: sqlite3.Connection, now: float) -> int:
        """Tombstone the rows of sessions that ended ``tombstone_after`` ago or more (contract 3.4: an
        upstream sweeper tombstones the rows ended sessions leave behind); returns how many."""
        if self._tombstone_after is None:
            return 0
        rows = conn.execute(SWEEP_ENDED_SQL, (self.ended_cutoff(now),)).fetchall()
        for row in rows:
            reason = f"the session ended ({row['session_status']}) {self._tombstone_after:g}s ago"
            self.tombstone_locked(conn, row, now, reason)
        return len(rows)

    def write_status_locked(
        self, conn: sqlite3.Connection, row: sqlite3.Row, status: str, now: float
    ) -> None:
        """Set ``session_status`` (a queue change). When a claimed session stops running, its claim
        lasts at least one claim TTL from now.

        Why: a claim may outlive its deadline while the session runs (it stays with its worker). Were it
        voided the instant the session stopped running, the holder's connect tokens would be revoked
        before the remote got the end notice (its pending long poll would get 401, docs/fleet-api.md §6.6 says
        tokens cover the session's lifetime) and the holder's release would get 409, although contract
        4.2 has the remote told first, then the worker confirm the status and release. The grace gives
        the holder that time; a holder that never releases loses the claim when the grace runs out.
        """
        deadline = row["claim_deadline"]
        if (
            row["phase"] == "claimed"
            and deadline is not None
            and row["session_status"] == "running"
            and status != "running"
        ):
            ttl = row["claim_ttl"] if row["claim_ttl"] is not None else FALLBACK_CLAIM_TTL
            deadline = max(float(deadline), now + float(ttl))
        rev = self.next_rev(conn, now)
        # The end time: kept from the first end (suspended, then terminated), cleared by a status that
        # is not an end (the session runs again).
        ended_at = None
        if status in ENDED_STATUSES:
            ended_at = row["ended_at"] if row["ended_at"] is not None else now
        # A status written now replaces a lagging one that was still to come.
        conn.execute(
            "UPDATE sessions SET session_status = ?, claim_deadline = ?, ending_status = NULL, "
            "ending_at = NULL, ended_at = ?, rev = ? WHERE session_id = ?",
            (status, deadline, ended_at, rev, row["session_id"]),
        )

    def apply_endings_locked(self, conn: sqlite3.Connection, now: float) -> None:
        """Write the lagging statuses that are due (the brain ended those sessions ``status_lag`` ago)."""
        rows = conn.execute(ENDINGS_SQL, (now,)).fetchall()
        for row in rows:
            self.write_status_locked(conn, row, str(row["ending_status"]), now)

    def tombstone_locked(self, conn: sqlite3.Connection, row: sqlite3.Row, now: float, reason: str) -> None:
        """Soft-delete a queue row: it leaves lists, answers 404, and watchers get a DELETED event.

        The remote is told first, as at the end of a session: the holder's tokens are revoked, but the
        gateway still answers them with the end notice (``notice_until``: one claim TTL from now) until
        a remote has been told (:class:`~devin_outposts_sim.state.gateway.Gateway`). Were they simply
        revoked, a running remote's next request would get 401 and it would exit as rejected (3), not
        as ended (0). Other tokens of the session are revoked outright.
        """
        rev = self.next_rev(conn, now)
        conn.execute(
            "UPDATE sessions SET deleted = 1, ending_status = NULL, ending_at = NULL, rev = ? "
            "WHERE session_id = ?",
            (rev, row["session_id"]),
        )
        if row["phase"] == "claimed":
            ttl = row["claim_ttl"] if row["claim_ttl"] is not None else FALLBACK_CLAIM_TTL
            conn.execute(
                "UPDATE connect_tokens SET revoked_at = ?, revoked_reason = 'tombstoned', notice_until = ? "
                "WHERE session_id = ? AND revoked_at IS NULL AND acceptor_id = ?",
                (now, now + float(ttl), row["session_id"], row["acceptor_id"]),
            )
            self.record_claim(
                conn,
                row,
                "tombstone",
                now,
                acceptor_id=row["acceptor_id"],
                deadline=row["claim_deadline"],
                chain=row["claim_chain"],
                reason=reason,
            )
        self.revoke_tokens(conn, row["session_id"], now, "tombstoned")
