"""How long a connect token lasts: for the session's life, not for one claim (issue 24, points 24 and 25).

* A tombstone tells the session's remote first, as the end of a session does: the holder's tokens are
  answered with the end notice (``end: true`` on connect, ``{"type": "end"}`` from ``next``; results of
  calls already delivered are still taken) until a remote has been told, or one claim TTL has passed, and
  only then refused. The stand-in therefore exits 0, not 3 ("the gateway rejected the connect token").
* A re-claim by the same acceptor after its claim lapsed (before the session ran) keeps the tokens of its
  earlier claim valid: the k8s operator keeps the claim-time token in the pod's Secret (contract 4.3,
  "issued with a TTL covering the maximum session lifetime"). They stop working when the session's life
  ends: a release, a takeover by another acceptor, or a tombstone.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from sim_support import SteppingClock

from devin_outposts.api.models import QueueEntry
from devin_outposts_sim.errors import Unauthorized
from devin_outposts_sim.remote import tools
from devin_outposts_sim.state.store import Store
from devin_outposts_sim.testing import SimHandle, claim_session, standin_process, token_fingerprint

QUEUE = "/opbeta/outposts/devins"
ACCT = "acct-default"


def _gateway_base(claimed: QueueEntry) -> str:
    url = claimed.status.gateway_url or ""
    return "http://" + url[len("ws://") :] + f"/sessions/{claimed.session_id}"


def _connect(claimed: QueueEntry, token: Optional[str] = None) -> httpx.Response:
    token = token or claimed.connect_token_value() or ""
    return httpx.post(
        _gateway_base(claimed) + "/connect",
        json={"pid": 1, "cwd": "/w", "env": {}},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )


def _release(handle: SimHandle, api_token: str, sid: str, acceptor: str) -> httpx.Response:
    return httpx.post(
        f"{handle.url}{QUEUE}/{sid}/release",
        json={"acceptor_id": acceptor},
        headers={"Authorization": f"Bearer {api_token}"},
        timeout=10,
    )


# --- point 24: a tombstone tells the remote first ----------------------------------------------------


@pytest.mark.parametrize("how", ["tombstone", "outpost deleted"])
def test_tombstoning_a_running_session_tells_its_remote_which_exits_0(
    sim: SimHandle, machine_token: str, tmp_path: Path, how: str
) -> None:
    outpost_id = sim.admin.create_outpost("tomb", "linux").outpost_id
    sid = sim.admin.enqueue(outpost_id).session_id
    claimed = claim_session(sim.url, machine_token, sid, "worker-1")
    workdir = tmp_path / "work"
    workdir.mkdir()
    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        sim.admin.wait_connection(sid, timeout=20)
        assert sim.admin.session(sid)["entry"]["status"]["session_status"] == "running"
        if how == "tombstone":
            sim.admin.tombstone(sid)
        else:
            orchestrator = httpx.delete(
                f"{sim.url}/opbeta/outposts/outposts/{outpost_id}",
                headers={"Authorization": f"Bearer {sim.create_token('orchestrator')}"},
                timeout=10,
            )
            assert orchestrator.status_code == 200
        code = remote.wait(20)
    assert code == 0, remote.stderr
    assert "the session is terminated; exiting" in remote.stdout + remote.stderr
    # Told once, the token is refused from then on, at the gateway and by the admin check.
    assert _connect(claimed).status_code == 401
    assert not sim.admin.check_connect_token(sid, claimed.connect_token_value() or "")
    assert [r["action"] for r in sim.admin.claims(session_id=sid)] == ["claim", "tombstone"]


def test_a_remote_busy_with_a_call_when_its_session_is_tombstoned_reports_it_and_exits_0(
    sim: SimHandle, machine_token: str, tmp_path: Path
) -> None:
    outpost_id = sim.admin.create_outpost("busy", "linux").outpost_id
    sid = sim.admin.enqueue(outpost_id).session_id
    claimed = claim_session(sim.url, machine_token, sid, "worker-1")
    workdir = tmp_path / "work"
    workdir.mkdir()
    flag = tmp_path / "go"
    with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
        sim.admin.add_calls(sid, [tools.run(f"while [ ! -e {flag} ]; do sleep 0.05; done; echo done")])
        deadline = time.monotonic() + 20
        while sim.admin.calls(sid)[0]["state"] != "delivered":
            assert time.monotonic() < deadline, "the call was never delivered"
            time.sleep(0.05)
        sim.admin.tombstone(sid)  # while the remote runs the call, not in a long poll
        flag.touch()
        code = remote.wait(20)
    assert code == 0, remote.stderr
    [call] = sim.admin.calls(sid)
    assert call["state"] == "done"
    assert call["result"]["output"].strip() == "done"


def test_a_remote_that_starts_after_the_tombstone_is_told_the_end_at_connect() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    outpost_id = store.accounts.create_outpost(ACCT, "late").outpost_id
    sid = store.queue.enqueue(outpost_id).session_id
    token = store.queue.claim(ACCT, sid, "w1", ttl=30, gateway_url="ws://g").connect_token_value() or ""
    store.queue.tombstone(sid)
    assert not store.gateway.check_connect_token(sid, token)  # it may no longer serve the session
    assert store.gateway.accepts_token(sid, token)  # but the gateway tells its remote the end
    hello = store.gateway.remote_connect(sid, token, {"pid": 1})
    assert (hello["end"], hello["session_status"]) == (True, "terminated")
    assert not store.gateway.accepts_token(sid, token)  # told: refused from now on
    with pytest.raises(Unauthorized):
        store.gateway.remote_connect(sid, token, {"pid": 1})
    store.close()


def test_the_end_notice_of_a_tombstoned_session_lasts_one_claim_ttl() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    outpost_id = store.accounts.create_outpost(ACCT, "ttl").outpost_id
    sid = store.queue.enqueue(outpost_id).session_id
    token = store.queue.claim(ACCT, sid, "w1", ttl=30, gateway_url="ws://g").connect_token_value() or ""
    connection = int(store.gateway.remote_connect(sid, token, {"pid": 1})["connection_id"])
    store.queue.set_session_status(sid, "suspended")
    store.queue.tombstone(sid)
    clock.now += 29.9
    assert store.gateway.accepts_token(sid, token)
    clock.now += 0.1
    assert not store.gateway.accepts_token(sid, token)
    with pytest.raises(Unauthorized):
        store.gateway.remote_next(sid, token, connection)
    store.close()


def test_a_tombstone_tells_an_ended_session_its_own_status() -> None:
    store = Store(":memory:")
    outpost_id = store.accounts.create_outpost(ACCT, "own").outpost_id
    sid = store.queue.enqueue(outpost_id).session_id
    token = store.queue.claim(ACCT, sid, "w1", ttl=30, gateway_url="ws://g").connect_token_value() or ""
    connection = int(store.gateway.remote_connect(sid, token, {"pid": 1})["connection_id"])
    store.queue.set_session_status(sid, "suspended")
    store.queue.tombstone(sid)
    assert store.gateway.remote_next(sid, token, connection) == {"type": "end", "session_status": "suspended"}
    store.close()


def test_a_session_queued_again_after_its_tombstone_does_not_accept_the_old_tokens() -> None:
    store = Store(":memory:")
    outpost_id = store.accounts.create_outpost(ACCT, "again").outpost_id
    sid = store.queue.enqueue(outpost_id).session_id
    token = store.queue.claim(ACCT, sid, "w1", ttl=30, gateway_url="ws://g").connect_token_value() or ""
    store.queue.tombstone(sid)
    store.queue.enqueue(outpost_id, sid, kind="resume")
    store.queue.claim(ACCT, sid, "w1", ttl=30, gateway_url="ws://g")
    assert not store.gateway.accepts_token(sid, token)
    assert not store.gateway.check_connect_token(sid, token)
    store.close()


# --- point 25: a re-claim after a lapse keeps the earlier tokens ---------------------------------------


def _lapse(handle: SimHandle, sid: str) -> None:
    """Wait until the claim of ``sid`` has expired back to the queue (an ``expire`` record)."""
    deadline = time.monotonic() + 20
    while "expire" not in [r["action"] for r in handle.admin.claims(session_id=sid)]:
        assert time.monotonic() < deadline, "the claim never lapsed"
        time.sleep(0.05)


def test_a_reclaim_after_a_lapse_keeps_the_first_token_valid_for_the_remote(
    make_sim: Any, tmp_path: Path
) -> None:
    handle: SimHandle = make_sim(claim_ttl=0.5, sweep_interval=0.05)
    api_token = handle.create_token("machine")
    sid = handle.admin.enqueue(handle.admin.create_outpost("lapse", "linux").outpost_id).session_id
    first = claim_session(handle.url, api_token, sid, "operator-1")
    _lapse(handle, sid)  # the operator was away; the session never ran
    second = claim_session(handle.url, api_token, sid, "operator-1")
    assert second.connect_token_value() != first.connect_token_value()
    first_token = first.connect_token_value() or ""
    assert handle.admin.check_connect_token(sid, first_token)
    workdir = tmp_path / "work"
    workdir.mkdir()
    # The pod still has the first token in its Secret: its remote connects with it and serves.
    with standin_process(workdir, first, state_dir=tmp_path / "state") as remote:
        connection = handle.admin.wait_connection(sid, timeout=20)
        assert connection["token_fingerprint"] == token_fingerprint(first_token)
        handle.admin.add_calls(sid, [tools.run("echo served")])
        [call] = handle.admin.wait_calls(sid, timeout=20)
        assert call["result"]["output"].strip() == "served"
        handle.admin.end_session(sid, "terminated")
        code = remote.wait(20)
    assert code == 0, remote.stderr
    assert _release(handle, api_token, sid, "operator-1").status_code == 200
    # The session's life is over: the first token (and the second) stop working.
    for claimed in (first, second):
        assert _connect(claimed).status_code == 401
        assert not handle.admin.check_connect_token(sid, claimed.connect_token_value() or "")
    actions = [r["action"] for r in handle.admin.claims(session_id=sid)]
    assert actions == ["claim", "expire", "claim", "release"]


def test_after_a_lapse_and_reclaim_a_tombstone_ends_the_first_token_too(make_sim: Any) -> None:
    handle: SimHandle = make_sim(claim_ttl=0.5, sweep_interval=0.05)
    api_token = handle.create_token("machine")
    sid = handle.admin.enqueue(handle.admin.create_outpost("lapse2", "linux").outpost_id).session_id
    first = claim_session(handle.url, api_token, sid, "operator-1")
    _lapse(handle, sid)
    claim_session(handle.url, api_token, sid, "operator-1")
    hello = _connect(first)
    assert hello.status_code == 200, hello.text
    assert hello.json()["end"] is False
    handle.admin.tombstone(sid)
    told = _connect(first)
    assert (told.status_code, told.json()["end"]) == (200, True)  # the end notice, once
    assert _connect(first).status_code == 401
    assert not handle.admin.check_connect_token(sid, first.connect_token_value() or "")


def test_a_takeover_by_another_acceptor_after_a_lapse_still_ends_the_first_tokens(make_sim: Any) -> None:
    handle: SimHandle = make_sim(claim_ttl=0.5, sweep_interval=0.05)
    api_token = handle.create_token("machine")
    sid = handle.admin.enqueue(handle.admin.create_outpost("other", "linux").outpost_id).session_id
    first = claim_session(handle.url, api_token, sid, "operator-1")
    _lapse(handle, sid)
    taken = claim_session(handle.url, api_token, sid, "operator-2")
    assert _connect(first).status_code == 401
    assert _release(handle, api_token, sid, "operator-2").status_code == 200
    claim_session(handle.url, api_token, sid, "operator-1")  # back to the first acceptor: still revoked
    assert _connect(first).status_code == 401
    assert _connect(taken).status_code == 401


def test_between_the_lapse_and_the_reclaim_the_token_is_not_valid() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    outpost_id = store.accounts.create_outpost(ACCT, "gap").outpost_id
    sid = store.queue.enqueue(outpost_id).session_id
    token = store.queue.claim(ACCT, sid, "w1", ttl=30, gateway_url="ws://g").connect_token_value() or ""
    clock.now += 30
    assert store.queue.expire_claims() == 1
    assert not store.gateway.check_connect_token(sid, token)  # nobody holds the session
    store.queue.claim(ACCT, sid, "w1", ttl=30, gateway_url="ws://g")
    assert store.gateway.check_connect_token(sid, token)
    store.close()
