"""How a session ends: the end notice reaches the remote before anything is revoked, the holder can still
release, and (with ``status_lag``) the status may lag the remote's exit, as on the real service.

Contract 4.2: on session end the remote is told and exits 0, then the worker confirms the status and
releases. Contract 4.3: connect tokens cover the session's lifetime. A claim that outlived its deadline
while the session ran must therefore not be voided (nor its tokens revoked) the instant the session stops
running: it gets a grace of one claim TTL from that moment (docs/simulator.md, "Choices where the contract
is silent").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sim_support import SteppingClock

from devin_outposts_sim.state.store import Store
from devin_outposts_sim.testing import SimHandle, claim_session, standin_process

QUEUE = "/opbeta/outposts/devins"
ACCT = "acct-default"


def _running_claim(store: Store, clock: SteppingClock, ttl: float = 300.0) -> tuple[str, str, int]:
    """A claimed session whose remote connected (so it is ``running``); its id, token and connection."""
    oid = store.accounts.create_outpost(ACCT, "end").outpost_id
    sid = store.queue.enqueue(oid).session_id
    token = store.queue.claim(ACCT, sid, "w1", ttl=ttl, gateway_url="ws://g").connect_token_value()
    assert token
    connected = store.gateway.remote_connect(sid, token, {"pid": 1})
    assert store.queue.get_entry(ACCT, sid).status.session_status == "running"
    return sid, token, int(connected["connection_id"])


def _actions(store: Store, sid: str) -> list[str]:
    return [r["action"] for r in store.records.claim_history(session_id=sid)]


@pytest.mark.parametrize("status", ["terminated", "suspended"])
def test_ending_a_session_past_its_deadline_keeps_the_claim_and_tokens_for_the_end_notice(
    status: str,
) -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    sid, token, connection = _running_claim(store, clock)
    clock.now += 400  # well past the deadline; allowed while the session runs
    assert store.queue.expire_claims() == 0
    store.gateway.end_session(sid, status)
    assert store.queue.expire_claims() == 0
    # The remote's pending long poll is answered with the end notice, not a 401.
    assert store.gateway.check_connect_token(sid, token)
    assert store.gateway.remote_next(sid, token, connection) == {"type": "end", "session_status": status}
    # The holder confirms the status and releases: 200, not 409.
    entry = store.queue.get_entry(ACCT, sid)
    assert (entry.status.phase, entry.status.acceptor_id) == ("claimed", "w1")
    released = store.queue.release(ACCT, sid, "w1")
    assert released.status.phase == "pending"
    assert _actions(store, sid) == ["claim", "release"]
    assert not store.gateway.check_connect_token(sid, token)  # released: now the tokens go
    store.close()


def test_the_grace_after_the_end_is_one_claim_ttl_then_the_claim_expires() -> None:
    clock = SteppingClock(1_781_050_000.0)
    # The ended row must outlive the grace (300 s), so no tombstone of ended sessions (default: 60 s).
    store = Store(":memory:", clock=clock, tombstone_after=None)
    sid, token, dummy = _running_claim(store, clock, ttl=300.0)
    clock.now += 400
    ended_at = clock.now
    store.gateway.end_session(sid, "terminated")
    assert store.queue.get_entry(ACCT, sid).status.claim_deadline == int(ended_at + 300)
    clock.now = ended_at + 299.5
    assert store.queue.expire_claims() == 0
    assert store.gateway.check_connect_token(sid, token)
    clock.now = ended_at + 300
    assert store.queue.expire_claims() == 1  # a holder that never released: the claim lapses after the grace
    assert not store.gateway.check_connect_token(sid, token)
    entry = store.queue.get_entry(ACCT, sid)
    assert (entry.status.phase, entry.status.acceptor_id) == ("pending", None)
    assert _actions(store, sid) == ["claim", "expire"]
    store.close()


def test_a_claim_still_within_its_deadline_also_gets_a_full_ttl_after_the_end() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    sid, token, dummy = _running_claim(store, clock, ttl=300.0)
    clock.now += 299  # one second left when the session ends
    store.queue.set_session_status(sid, "suspended")  # the admin lever follows the same rule
    clock.now += 10
    assert store.queue.expire_claims() == 0
    assert store.gateway.check_connect_token(sid, token)
    store.close()


def test_a_session_never_running_still_expires_at_its_deadline() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    oid = store.accounts.create_outpost(ACCT, "never").outpost_id
    sid = store.queue.enqueue(oid).session_id
    token = store.queue.claim(ACCT, sid, "w1", ttl=300, gateway_url="ws://g").connect_token_value() or ""
    clock.now += 300
    assert store.queue.expire_claims() == 1
    assert not store.gateway.check_connect_token(sid, token)
    store.close()


def test_the_stand_in_exits_0_and_the_release_succeeds_when_a_long_session_ends(
    make_sim: Any, tmp_path: Path, wait_until: Any
) -> None:
    # A short TTL: this test is about a session that outlives its claim deadline while it runs.
    handle: SimHandle = make_sim(claim_ttl=3, sweep_interval=0.05)
    token = handle.create_token("machine")
    sid = handle.admin.enqueue(handle.admin.create_outpost("long", "linux").outpost_id).session_id
    claimed = claim_session(handle.url, token, sid, "w1")
    workdir = tmp_path / "work"
    workdir.mkdir()
    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        handle.admin.wait_connection(sid, timeout=20)
        deadline = handle.admin.session(sid)["claim_deadline"]
        wait_until(lambda: time.time() > deadline + 0.2, timeout=20)
        handle.store.queue.expire_claims()  # the sweeper has certainly looked at it: still claimed (running)
        assert handle.admin.session(sid)["entry"]["status"]["acceptor_id"] == "w1"
        handle.admin.end_session(sid, "terminated")
        assert remote.wait(20) == 0, remote.stderr
    response = httpx.post(
        f"{handle.url}{QUEUE}/{sid}/release",
        json={"acceptor_id": "w1"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert [r["action"] for r in handle.admin.claims(session_id=sid)] == ["claim", "release"]


# --- the status lag -------------------------------------------------------------------------------------


def test_with_a_status_lag_the_remote_is_told_first_and_the_status_written_later() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    sid, token, connection = _running_claim(store, clock)
    ended_at = clock.now
    returned = store.gateway.end_session(sid, "terminated", lag=2.0)
    assert returned.status.session_status == "running"  # not written yet
    # The remote is told at once, and so is a remote that connects again meanwhile.
    assert store.gateway.remote_next(sid, token, connection) == {
        "type": "end",
        "session_status": "terminated",
    }
    assert store.gateway.remote_connect(sid, token, {"pid": 2})["end"] is True
    [view] = store.records.admin_sessions(session_id=sid)
    assert view["ending"] == {"session_status": "terminated", "at": ended_at + 2.0}
    clock.now = ended_at + 1.9
    assert store.queue.get_entry(ACCT, sid).status.session_status == "running"
    clock.now = ended_at + 2.0
    entry = store.queue.get_entry(ACCT, sid)  # any read writes a due status first
    assert entry.status.session_status == "terminated"
    assert entry.metadata.updated_at == int(ended_at + 2.0)
    assert store.records.admin_sessions(session_id=sid)[0]["ending"] is None
    assert store.queue.release(ACCT, sid, "w1").status.phase == "pending"
    assert _actions(store, sid) == ["claim", "release"]
    store.close()


def test_a_lagging_status_is_written_by_the_sweep_and_gets_the_grace() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    sid, token, dummy = _running_claim(store, clock, ttl=300.0)
    clock.now += 400  # past the deadline while running
    store.gateway.end_session(sid, "suspended", lag=2.0)
    clock.now += 2.0
    assert store.queue.expire_claims() == 0  # the status is written, and the claim gets its grace
    [view] = store.records.admin_sessions(session_id=sid)
    assert view["entry"]["status"]["session_status"] == "suspended"
    assert view["claim_deadline"] == clock.now + 300.0
    assert store.gateway.check_connect_token(sid, token)
    store.close()


def test_a_status_set_during_the_lag_replaces_the_lagging_one() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    sid, dummy, dummy_connection = _running_claim(store, clock)
    store.gateway.end_session(sid, "terminated", lag=2.0)
    store.queue.set_session_status(sid, "suspended")
    clock.now += 5
    assert store.queue.get_entry(ACCT, sid).status.session_status == "suspended"
    store.close()


def test_a_tombstone_during_the_lag_drops_the_lagging_status() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    sid, dummy, dummy_connection = _running_claim(store, clock)
    store.gateway.end_session(sid, "terminated", lag=2.0)
    store.queue.tombstone(sid)
    clock.now += 5
    store.queue.expire_claims()
    [view] = store.records.admin_sessions(session_id=sid, include_deleted=True)
    assert view["deleted"] is True
    assert view["ending"] is None
    assert view["entry"]["status"]["session_status"] == "running"  # its last state before removal
    store.close()


def test_watchers_get_the_lagging_status_when_it_falls_due_without_any_request(
    make_sim: Any, watch: Any
) -> None:
    # No sweeper to speak of: the end route schedules the write, so a watcher hears of it on time.
    handle: SimHandle = make_sim(status_lag=0.5, sweep_interval=3600)
    token = handle.create_token("machine")
    sid = handle.admin.enqueue(handle.admin.create_outpost("lag", "linux").outpost_id).session_id
    handle.admin.set_status(sid, "running")
    cursor = handle.admin.session(sid)["cursor"]
    with watch(token, handle=handle, cursor=cursor) as stream:
        stream.until(lambda e: e["object"]["status"]["session_status"] == "running")
        assert handle.admin.end_session(sid).status.session_status == "running"
        events = stream.until(lambda e: e["object"]["status"]["session_status"] != "running")
    assert events[-1]["object"]["status"]["session_status"] == "terminated"
    assert handle.admin.config()["status_lag"] == 0.5


def test_sim_serve_takes_a_status_lag(tmp_path: Path) -> None:
    from devin_outposts_sim.testing import sim_process

    with sim_process(tmp_path / "sim.db", status_lag=1.5) as proc:
        assert proc.admin.config()["status_lag"] == 1.5
