"""The simulator's state: one SQLite database (a file by default, ``:memory:`` for tests).

:class:`Store` is thread-safe and synchronous; the HTTP layer calls it from a thread pool. It holds one
:class:`~devin_outposts_sim.state.db.Database` and the parts that work on it, each a small class of its
own; their public methods are the simulator's whole behaviour, so tests can use them directly::

    store = Store(":memory:")
    token = store.accounts.create_token("acct-default", [MACHINE_SCOPE])
    outpost = store.accounts.create_outpost("acct-default", "rhel", "linux")
    entry = store.queue.enqueue(outpost.outpost_id)
    claimed = store.queue.claim("acct-default", entry.session_id, "worker-1", ttl=300, gateway_url="ws://x")
    assert store.gateway.check_connect_token(entry.session_id, claimed.connect_token_value() or "")

Why parts instead of one class that inherits them all: a caller names the part it uses, each part's
dependencies are its constructor's arguments (the database; no part calls another), and no part can
override another's method by accident. The parts share the database object itself, so a call costs what
it did before: no extra query, transaction or lock.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from devin_outposts_sim.state.accounts import (
    DEFAULT_ACCOUNT,
    MACHINE_SCOPE,
    ORCHESTRATOR_SCOPE,
    Accounts,
    Principal,
)
from devin_outposts_sim.state.cli_dist import CLI_TABLES, CliDist
from devin_outposts_sim.state.db import DEFAULT_TOMBSTONE_AFTER, Database, token_fingerprint
from devin_outposts_sim.state.dist import RemoteDist
from devin_outposts_sim.state.gateway import Gateway
from devin_outposts_sim.state.queue import Queue
from devin_outposts_sim.state.records import Records
from devin_outposts_sim.state.rows import Change, QueuePage


class Store:
    """Accounts, tokens, organizations, outposts, the queue, claims and their history, the gateway's
    connections, the brain's tool calls, the published ``devin-remote`` artifacts and the published
    Devin CLI artifacts: one part each, over one database."""

    def __init__(
        self,
        path: str = ":memory:",
        *,
        clock: Callable[[], float] = time.time,
        tombstone_after: Optional[float] = DEFAULT_TOMBSTONE_AFTER,
    ) -> None:
        #: The connection, transactions, revisions, change listeners, claim expiry and the tombstones of
        #: ended sessions (``tombstone_after`` seconds after their end; None: never).
        self.db = Database(path, clock=clock, tombstone_after=tombstone_after)
        #: Accounts, API tokens, organizations, outposts, the organization default platform.
        self.accounts = Accounts(self.db)
        #: Queue entries: enqueue, lists, watch replays and feed, claim, release, status, tombstones.
        self.queue = Queue(self.db)
        #: Connect-token checks, remote connections, the brain's tool calls and session ends.
        self.gateway = Gateway(self.db)
        #: The claim history and the admin view of queue rows.
        self.records = Records(self.db)
        #: The published ``devin-remote`` artifacts and ``latest`` pointers.
        self.dist = RemoteDist(self.db)
        #: The published Devin CLI artifacts.
        self.cli_dist = CliDist(self.db)

    @property
    def path(self) -> str:
        return self.db.path

    def close(self) -> None:
        self.db.close()

    def reset(self) -> None:
        """Delete every account, token, outpost, session, record and artifact (test isolation)."""
        self.accounts.forget_tokens()
        self.db.reset(also=CLI_TABLES)
        self.accounts.forget_tokens()  # a request that looked a token up meanwhile cached a wiped one


__all__ = [
    "DEFAULT_ACCOUNT",
    "MACHINE_SCOPE",
    "ORCHESTRATOR_SCOPE",
    "Change",
    "Principal",
    "QueuePage",
    "Store",
    "token_fingerprint",
]
