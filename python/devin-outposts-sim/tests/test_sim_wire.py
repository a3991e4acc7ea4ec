"""The simulator builds queue entries for the wire straight from its rows, without the client's model.

That is only right while it is exactly what the model would send: every entry (list, get, claim,
release, watch, admin) must be a fixed point of ``QueueEntry.model_validate(...).to_wire()``, the model
the client parses it with.
"""

from __future__ import annotations

from typing import Any

from devin_outposts.api.models import QueueEntry
from devin_outposts_sim.state.rows import row_wire
from devin_outposts_sim.state.store import Store

ACCT = "acct-default"


def all_rows(store: Store) -> list[Any]:
    with store.db.read() as conn:
        return list(conn.execute("SELECT * FROM sessions ORDER BY rev"))


def test_every_kind_of_row_is_sent_exactly_as_the_model_would_send_it() -> None:
    store = Store(":memory:")
    linux = store.accounts.create_outpost(ACCT, "l", "linux").outpost_id
    default = store.accounts.create_outpost(ACCT, "d").outpost_id
    store.queue.enqueue(linux)
    store.queue.enqueue(default, kind="resume", remote_binary_sha="1a2b3c4", session_status="suspended")
    policy = {"enabled": True, "allow": [{"hostname": "*.github.com"}, {"ipv4": "10.0.0.0/8"}]}
    store.queue.enqueue(linux, network_policy=policy)
    store.queue.enqueue(linux, session_status="some_future_status")  # an unknown value clients must tolerate
    claimed = store.queue.enqueue(linux).session_id
    store.queue.claim(ACCT, claimed, "w1", ttl=300.7, gateway_url="ws://g")
    gone = store.queue.enqueue(linux).session_id
    store.queue.tombstone(gone)
    rows = all_rows(store)
    assert len(rows) == 6
    for row in rows:
        wire = row_wire(row)
        assert QueueEntry.model_validate(wire).to_wire() == wire
        with_token = row_wire(row, connect_token="ct_secret", gateway_url="ws://g/gateway")
        assert QueueEntry.model_validate(with_token).to_wire() == with_token
    store.close()


def test_the_store_answers_match_their_wire_form() -> None:
    store = Store(":memory:")
    oid = store.accounts.create_outpost(ACCT, "w", "linux").outpost_id
    sid = store.queue.enqueue(oid).session_id
    claimed = store.queue.claim_wire(ACCT, sid, "w1", ttl=300, gateway_url="ws://g")
    assert claimed["status"]["connect_token"].startswith("ct_")
    assert QueueEntry.model_validate(claimed).to_wire() == claimed
    listed = store.queue.list_entries(ACCT, first=10, outpost=oid).to_wire()["items"]
    assert listed == [store.queue.get_entry_wire(ACCT, sid)]
    assert listed[0]["status"]["connect_token"] is None  # never outside the claim answer
    store.close()
