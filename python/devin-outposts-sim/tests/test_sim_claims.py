"""Claims: the compare-and-swap, renewal, release, expiry (with and without ``running``), the claim
history and connect-token validity."""

from __future__ import annotations

import time
from typing import Any

import pytest

from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts_sim.testing import SimHandle, token_fingerprint

QUEUE = "/opbeta/outposts/devins"


def _claim(client, sid: str, acceptor: str) -> Any:
    return client.post(f"{QUEUE}/{sid}/claim", json={"acceptor_id": acceptor})


def _release(client, sid: str, acceptor: str) -> Any:
    return client.post(f"{QUEUE}/{sid}/release", json={"acceptor_id": acceptor})


def _wait_past(sim: SimHandle, sid: str) -> None:
    """Sleep just until the claim deadline of ``sid`` has passed (the exact float, from the store)."""
    deadline = sim.admin.session(sid)["claim_deadline"]
    assert deadline is not None
    while time.time() <= deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.time()) + 0.001))


def test_claim_returns_the_claimed_entry_with_token_and_gateway(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    before = time.time()
    response = _claim(api(machine_token), sid, "worker-1")
    assert response.status_code == 200
    entry = QueueEntry.model_validate(response.json())
    assert entry.status.phase == "claimed"
    assert entry.status.acceptor_id == "worker-1"
    assert entry.status.claim_deadline is not None
    assert (
        int(before + sim.config.claim_ttl) - 1
        <= entry.status.claim_deadline
        <= int(time.time() + sim.config.claim_ttl)
    )
    token = entry.connect_token_value()
    assert token
    assert len(token) >= 32
    assert entry.status.gateway_url == f"ws://127.0.0.1:{sim.port}/gateway"


def test_connect_token_and_gateway_only_in_the_claim_response(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    token = _claim(client, sid, "w1").json()["status"]["connect_token"]
    got = client.get(f"{QUEUE}/{sid}").json()
    listed = client.get(QUEUE).json()["items"][0]
    for status in (got["status"], listed["status"]):
        assert status["phase"] == "claimed"
        assert status["connect_token"] is None
        assert status["gateway_url"] is None
    assert token not in str(client.get(QUEUE).json())
    released = _release(client, sid, "w1").json()
    assert released["status"]["connect_token"] is None


def test_configured_gateway_url(make_sim, api) -> None:
    handle = make_sim(gateway_url="wss://outpost-gateway.example")
    oid = handle.admin.create_outpost("g").outpost_id
    sid = handle.admin.enqueue(oid).session_id
    body = _claim(api(handle.create_token("machine"), handle=handle), sid, "w1").json()
    assert body["status"]["gateway_url"] == "wss://outpost-gateway.example"


def test_second_claimer_gets_409(sim: SimHandle, api, machine_token: str, outpost: Outpost) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    assert _claim(client, sid, "w1").status_code == 200
    loser = _claim(client, sid, "w2")
    assert loser.status_code == 409
    assert loser.json() == {"detail": "Session is already claimed"}
    assert client.get(f"{QUEUE}/{sid}").json()["status"]["acceptor_id"] == "w1"


def test_renewal_extends_the_deadline_and_issues_a_fresh_token(make_sim, api) -> None:
    handle = make_sim(claim_ttl=5.0)
    client = api(handle.create_token("machine"), handle=handle)
    sid = handle.admin.enqueue(handle.admin.create_outpost("r").outpost_id).session_id
    first = _claim(client, sid, "w1").json()
    exact_first = handle.admin.session(sid)["claim_deadline"]
    time.sleep(0.01)
    second = _claim(client, sid, "w1")
    assert second.status_code == 200
    renewed = second.json()
    exact_second = handle.admin.session(sid)["claim_deadline"]
    assert exact_second > exact_first
    assert renewed["status"]["claim_deadline"] >= first["status"]["claim_deadline"]
    assert renewed["status"]["connect_token"] != first["status"]["connect_token"]
    assert renewed["status"]["acceptor_id"] == "w1"
    actions = [r["action"] for r in handle.admin.claims(session_id=sid)]
    assert actions == ["claim", "renew"]


@pytest.mark.parametrize(
    "body", [{}, {"acceptor_id": ""}, {"acceptor_id": "   "}, {"acceptor_id": 5}, {"acceptor_id": None}]
)
def test_claim_and_release_need_an_acceptor_id(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, body: dict
) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    for verb in ("claim", "release"):
        response = client.post(f"{QUEUE}/{sid}/{verb}", json=body)
        assert response.status_code == 422
        assert "acceptor_id" in response.json()["detail"]
    assert client.get(f"{QUEUE}/{sid}").json()["status"]["phase"] == "pending"


def test_claim_with_a_body_that_is_not_json_is_422(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    response = api(machine_token).post(f"{QUEUE}/{sid}/claim", content=b"acceptor_id=w1")
    assert response.status_code == 422


def test_claim_and_release_of_absent_or_tombstoned_sessions_are_404(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    _claim(client, sid, "w1")
    sim.admin.tombstone(sid)
    for target in (sid, "devin-never-was"):
        for response in (_claim(client, target, "w1"), _release(client, target, "w1")):
            assert response.status_code == 404
            assert response.json() == {"detail": "Session not found in queue"}


def test_release_returns_the_session_to_the_queue(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    _claim(client, sid, "w1")
    response = _release(client, sid, "w1")
    assert response.status_code == 200
    status = response.json()["status"]
    assert (status["phase"], status["acceptor_id"], status["claim_deadline"]) == ("pending", None, None)
    assert client.get(QUEUE, params={"phase": "pending"}).json()["items"][0]["metadata"]["session_id"] == sid
    assert _claim(client, sid, "w2").status_code == 200  # claimable again, by anyone


def test_release_by_a_non_holder_or_of_an_unclaimed_session_is_409(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    unclaimed = _release(client, sid, "w1")
    assert unclaimed.status_code == 409
    assert unclaimed.json() == {"detail": "Session is not claimed by this acceptor"}
    _claim(client, sid, "w1")
    other = _release(client, sid, "w2")
    assert other.status_code == 409
    assert other.json() == {"detail": "Session is not claimed by this acceptor"}
    assert client.get(f"{QUEUE}/{sid}").json()["status"]["acceptor_id"] == "w1"
    assert _release(client, sid, "w1").status_code == 200
    assert _release(client, sid, "w1").status_code == 409  # a second release: already released


@pytest.mark.parametrize("status", ["suspended", "terminated"])
def test_finished_pending_rows_can_still_be_claimed(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, status: str
) -> None:
    # The contract says clients must not claim them; the simulator (like the upstream mock) allows it,
    # so worker tests can prove the worker skips them.
    sid = sim.admin.enqueue(outpost.outpost_id, session_status=status).session_id
    response = _claim(api(machine_token), sid, "w1")
    assert response.status_code == 200
    assert response.json()["status"]["session_status"] == status


# --- expiry ----------------------------------------------------------------------------------------------


def test_expired_claim_returns_to_the_queue(make_sim, api, wait_until) -> None:
    handle = make_sim(claim_ttl=0.3, sweep_interval=0.05)
    client = api(handle.create_token("machine"), handle=handle)
    sid = handle.admin.enqueue(handle.admin.create_outpost("e").outpost_id).session_id
    token = _claim(client, sid, "w1").json()["status"]["connect_token"]
    entry = wait_until(
        lambda: (e := client.get(f"{QUEUE}/{sid}").json())["status"]["phase"] == "pending" and e
    )
    assert entry["status"]["acceptor_id"] is None
    assert entry["status"]["claim_deadline"] is None
    assert not handle.store.gateway.check_connect_token(sid, token)
    assert _release(client, sid, "w1").status_code == 409  # the claim is gone
    assert _claim(client, sid, "w2").status_code == 200
    actions = [(r["action"], r["acceptor_id"]) for r in handle.admin.claims(session_id=sid)]
    assert actions == [("claim", "w1"), ("expire", "w1"), ("claim", "w2")]


def test_expiry_is_evaluated_lazily_on_claim_without_the_sweeper(make_sim, api) -> None:
    handle = make_sim(claim_ttl=0.3, sweep_interval=3600)
    client = api(handle.create_token("machine"), handle=handle)
    sid = handle.admin.enqueue(handle.admin.create_outpost("l").outpost_id).session_id
    _claim(client, sid, "w1")
    _wait_past(handle, sid)
    takeover = _claim(client, sid, "w2")
    assert takeover.status_code == 200
    assert takeover.json()["status"]["acceptor_id"] == "w2"


def test_expired_claim_of_a_running_session_stays_with_its_worker(make_sim, api) -> None:
    handle = make_sim(claim_ttl=0.3, sweep_interval=0.05)
    client = api(handle.create_token("machine"), handle=handle)
    sid = handle.admin.enqueue(handle.admin.create_outpost("run").outpost_id).session_id
    first_token = _claim(client, sid, "w1").json()["status"]["connect_token"]
    handle.admin.set_status(sid, "running")
    _wait_past(handle, sid)
    handle.store.queue.expire_claims()  # a sweep has certainly run after the deadline
    entry = client.get(f"{QUEUE}/{sid}").json()
    assert entry["status"]["phase"] == "claimed"
    assert entry["status"]["acceptor_id"] == "w1"
    other = _claim(client, sid, "w2")
    assert other.status_code == 409
    assert other.json() == {"detail": "Session is already claimed"}
    assert handle.store.gateway.check_connect_token(sid, first_token)  # the worker keeps serving
    renewed = _claim(client, sid, "w1")
    assert renewed.status_code == 200
    assert renewed.json()["status"]["claim_deadline"] >= entry["status"]["claim_deadline"]
    assert [r["action"] for r in handle.admin.claims(session_id=sid)] == ["claim", "renew"]


def test_a_lapsed_running_claim_returns_once_the_session_stops_running(make_sim, api, wait_until) -> None:
    handle = make_sim(claim_ttl=0.3, sweep_interval=0.05)
    client = api(handle.create_token("machine"), handle=handle)
    sid = handle.admin.enqueue(handle.admin.create_outpost("s").outpost_id).session_id
    _claim(client, sid, "w1")
    handle.admin.set_status(sid, "running")
    _wait_past(handle, sid)
    handle.admin.set_status(sid, "suspended")
    wait_until(lambda: client.get(f"{QUEUE}/{sid}").json()["status"]["phase"] == "pending")


def test_a_late_reclaim_by_the_former_holder_is_a_new_claim_that_keeps_its_earlier_tokens(
    make_sim, api
) -> None:
    handle = make_sim(claim_ttl=0.3, sweep_interval=3600)
    client = api(handle.create_token("machine"), handle=handle)
    sid = handle.admin.enqueue(handle.admin.create_outpost("late").outpost_id).session_id
    old = _claim(client, sid, "w1").json()["status"]["connect_token"]
    _wait_past(handle, sid)
    again = _claim(client, sid, "w1")
    assert again.status_code == 200
    assert [r["action"] for r in handle.admin.claims(session_id=sid)] == ["claim", "expire", "claim"]
    # Contract 4.3: tokens outlive the claim (the operator keeps the first one in the pod's Secret).
    assert handle.store.gateway.check_connect_token(sid, old)
    assert handle.store.gateway.check_connect_token(sid, again.json()["status"]["connect_token"])


# --- history and connect tokens ------------------------------------------------------------------------


def test_claim_history_records_who_did_what_with_which_token(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    t1 = _claim(client, sid, "w1").json()["status"]["connect_token"]
    t2 = _claim(client, sid, "w1").json()["status"]["connect_token"]
    _release(client, sid, "w1")
    t3 = _claim(client, sid, "w2").json()["status"]["connect_token"]
    sim.admin.tombstone(sid)
    records = sim.admin.claims(session_id=sid)
    assert [(r["action"], r["acceptor_id"]) for r in records] == [
        ("claim", "w1"),
        ("renew", "w1"),
        ("release", "w1"),
        ("claim", "w2"),
        ("tombstone", "w2"),
    ]
    assert [r["token_fingerprint"] for r in records] == [
        token_fingerprint(t1),
        token_fingerprint(t2),
        None,
        token_fingerprint(t3),
        None,
    ]
    assert records[0]["chain"] == records[1]["chain"] == records[2]["chain"] != records[3]["chain"]
    assert all(r["outpost_id"] == outpost.outpost_id and r["account_id"] == "acct-default" for r in records)
    assert [r["seq"] for r in records] == sorted(r["seq"] for r in records)
    assert all(t not in str(records) for t in (t1, t2, t3))  # fingerprints only, never tokens
    assert sim.admin.claims(acceptor_id="w2")[0]["session_id"] == sid
    assert len(sim.admin.claims(outpost_id=outpost.outpost_id)) == 5


def test_connect_tokens_are_valid_for_the_holders_claim_chain_only(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    other = sim.admin.enqueue(outpost.outpost_id).session_id
    t1 = _claim(client, sid, "w1").json()["status"]["connect_token"]
    t2 = _claim(client, sid, "w1").json()["status"]["connect_token"]
    check = sim.store.gateway.check_connect_token
    assert check(sid, t1)
    assert check(sid, t2)
    assert sim.admin.check_connect_token(sid, t2) is True
    assert not check(other, t1)  # a foreign session
    assert not check(sid, "ct_forged")
    _release(client, sid, "w1")
    assert not check(sid, t1)
    assert not check(sid, t2)
    t3 = _claim(client, sid, "w2").json()["status"]["connect_token"]
    assert check(sid, t3)
    assert not check(sid, t1)
    sim.admin.tombstone(sid)
    assert not check(sid, t3)
    assert sim.admin.check_connect_token(sid, t3) is False


def test_history_can_prove_each_session_was_served_exactly_once(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    ids = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(5)]
    for index, sid in enumerate(ids):
        _claim(client, sid, f"w{index % 2}")
        _claim(client, sid, f"w{index % 2}")  # renewals do not count as serving again
        _claim(client, sid, "intruder")  # 409: not recorded
    claims = [r for r in sim.admin.claims(outpost_id=outpost.outpost_id) if r["action"] == "claim"]
    assert sorted(r["session_id"] for r in claims) == sorted(ids)
    assert "intruder" not in {r["acceptor_id"] for r in sim.admin.claims()}


def test_a_losing_claim_is_recognised_without_a_write_exactly_when_the_full_path_would_refuse_it() -> None:
    from devin_outposts_sim.state.store import Store

    class Clock:
        now = 1_781_050_000.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    store = Store(":memory:", clock=clock)
    oid = store.accounts.create_outpost("acct-default", "fast").outpost_id
    sid = store.queue.enqueue(oid).session_id
    quick = store.queue.certainly_claimed_by_another
    assert not quick("acct-default", sid, "w2")  # not claimed: the full path claims it
    store.queue.claim("acct-default", sid, "w1", ttl=300, gateway_url="ws://g")
    assert quick("acct-default", sid, "w2")
    assert not quick("acct-default", sid, "w1")  # a renewal
    assert not quick("acct-other", sid, "w2")  # another account's: the full path answers 404
    assert not quick("acct-default", "devin-none", "w2")
    clock.now += 300
    assert not quick("acct-default", sid, "w2")  # due to expire: the full path hands it over
    clock.now -= 1
    store.queue.set_session_status(sid, "running")
    clock.now += 1000
    assert quick("acct-default", sid, "w2")  # running past its deadline: stays with its worker
    store.queue.tombstone(sid)
    assert not quick("acct-default", sid, "w2")
    # An ended session still within its claim's grace, but due to be tombstoned: the full path answers 404.
    ended = store.queue.enqueue(oid).session_id
    store.queue.claim("acct-default", ended, "w1", ttl=300, gateway_url="ws://g")
    store.queue.set_session_status(ended, "terminated")
    clock.now += 59
    assert quick("acct-default", ended, "w2")
    clock.now += 1
    assert not quick("acct-default", ended, "w2")
    store.close()
