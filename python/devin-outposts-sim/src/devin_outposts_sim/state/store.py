"""The simulator's state: one SQLite database (a file by default, ``:memory:`` for tests).

:class:`Store` is thread-safe and synchronous; the HTTP layer calls it from a thread pool. Its public
methods are the simulator's whole behaviour, so tests and a future gateway can use it directly::

    store = Store(":memory:")
    token = store.create_token("acct-default", [MACHINE_SCOPE])
    outpost = store.create_outpost("acct-default", "rhel", "linux")
    entry = store.enqueue(outpost.outpost_id)
    claimed = store.claim("acct-default", entry.session_id, "worker-1", ttl=300, gateway_url="ws://x")
    assert store.check_connect_token(entry.session_id, claimed.connect_token_value() or "")
"""

from __future__ import annotations

from devin_outposts_sim.state.accounts import (
    DEFAULT_ACCOUNT,
    MACHINE_SCOPE,
    ORCHESTRATOR_SCOPE,
    AccountStore,
    Principal,
)
from devin_outposts_sim.state.cli_dist import CliDistStore
from devin_outposts_sim.state.db import token_fingerprint
from devin_outposts_sim.state.dist import DistStore
from devin_outposts_sim.state.gateway import GatewayStore
from devin_outposts_sim.state.queue import Change, QueuePage
from devin_outposts_sim.state.records import RecordStore


class Store(AccountStore, GatewayStore, RecordStore, DistStore, CliDistStore):
    """Accounts, tokens, organizations, outposts, the queue, claims and their history, the gateway's
    connections, the brain's tool calls, the published ``devin-remote`` artifacts and the published
    Devin CLI artifacts."""


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
