"""The simulated gateway (HTTP long-poll under the claim's ``gateway_url``) and the brain API.

The gateway accepts a connect token only while its acceptor holds the session (a tombstoned session's
remote is told the end first); every other token is a 401. These
tests speak the gateway protocol directly; test_sim_remote_standin.py runs the stand-in ``devin-remote``.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import httpx
import pytest

from devin_outposts.api.models import Outpost, QueueEntry
from devin_outposts_sim.admin_client import SimAdminError
from devin_outposts_sim.remote import tools
from devin_outposts_sim.testing import SimHandle, claim_session


class Gateway:
    """A raw client of one session's gateway endpoints."""

    def __init__(self, claimed: QueueEntry, token: Optional[str] = None) -> None:
        url = claimed.status.gateway_url or ""
        assert url.startswith("ws://")
        self.base = "http://" + url[len("ws://") :] + f"/sessions/{claimed.session_id}"
        self.token = token if token is not None else claimed.connect_token_value()
        self.connection: Optional[int] = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def connect(self, **info: Any) -> httpx.Response:
        body = {"pid": 1, "cwd": "/w", "env": {"PATH": "/bin"}, **info}
        response = httpx.post(self.base + "/connect", json=body, headers=self._headers(), timeout=10)
        if response.status_code == 200:
            self.connection = response.json()["connection_id"]
        return response

    def next(self, wait: float = 0.0, connection: Optional[int] = None) -> httpx.Response:
        params = {"connection_id": connection or self.connection or 0, "wait": wait}
        return httpx.get(self.base + "/next", params=params, headers=self._headers(), timeout=wait + 10)

    def result(self, call_id: str, connection: Optional[int] = None, **result: Any) -> httpx.Response:
        body = {"exit_code": 0, "output": "", **result}
        params = {"connection_id": connection or self.connection or 0}
        return httpx.post(
            f"{self.base}/calls/{call_id}/result",
            json=body,
            params=params,
            headers=self._headers(),
            timeout=10,
        )


@pytest.fixture
def session(sim: SimHandle, outpost: Outpost) -> str:
    return sim.admin.enqueue(outpost.outpost_id).session_id


@pytest.fixture
def claimed(sim: SimHandle, machine_token: str, session: str) -> QueueEntry:
    return claim_session(sim.url, machine_token, session, "worker-1")


def test_gateway_url_is_derived_from_the_simulator_url(sim: SimHandle, claimed: QueueEntry) -> None:
    assert claimed.status.gateway_url == "ws://" + sim.url[len("http://") :] + "/gateway"


def test_connect_with_a_valid_token_marks_the_session_running_and_records_the_connection(
    sim: SimHandle, claimed: QueueEntry, session: str
) -> None:
    assert sim.admin.session(session)["entry"]["status"]["session_status"] == "pending"
    gw = Gateway(claimed)
    answer = gw.connect(pid=4242, cwd="/work", env={"A": "1"}, version="abc123")
    assert answer.status_code == 200
    assert answer.json()["session_status"] == "running"
    assert answer.json()["end"] is False
    assert sim.admin.session(session)["entry"]["status"]["session_status"] == "running"
    [conn] = sim.admin.connections(session)
    assert (conn["pid"], conn["cwd"], conn["env"], conn["version"]) == (4242, "/work", {"A": "1"}, "abc123")
    assert conn["acceptor_id"] == "worker-1"
    assert conn["connection_id"] == gw.connection


@pytest.mark.parametrize("token", ["", "ct_not-a-token", "cog_an_api_token_is_not_a_connect_token"])
def test_missing_or_unknown_tokens_are_401(claimed: QueueEntry, token: str) -> None:
    gw = Gateway(claimed, token=token)
    for response in (gw.connect(), gw.next(), gw.result("call_x")):
        assert response.status_code == 401
        assert response.json() == {"detail": "Invalid connect token"}


def test_a_token_is_stale_after_release(sim: SimHandle, claimed: QueueEntry, machine_token: str) -> None:
    gw = Gateway(claimed)
    assert gw.connect().status_code == 200
    released = httpx.post(
        f"{sim.url}/opbeta/outposts/devins/{claimed.session_id}/release",
        json={"acceptor_id": "worker-1"},
        headers={"Authorization": f"Bearer {machine_token}"},
    )
    assert released.status_code == 200
    assert gw.next().status_code == 401
    assert gw.connect().status_code == 401


def test_renewal_keeps_old_tokens_and_a_takeover_makes_them_stale(make_sim: Any, wait_until: Any) -> None:
    handle: SimHandle = make_sim(claim_ttl=0.5)
    token = handle.create_token("machine")
    sid = handle.admin.enqueue(handle.admin.create_outpost("rhel", "linux").outpost_id).session_id
    first = claim_session(handle.url, token, sid, "worker-1")

    def renew_keeping_the_first() -> Optional[QueueEntry]:
        # Renew, then ask at once: the claim lasts 0.5 s, which a loaded machine can spend between two
        # requests (a lapsed claim's tokens do not work); another round renews again.
        renewal = claim_session(handle.url, token, sid, "worker-1")
        return renewal if handle.admin.check_connect_token(sid, first.connect_token_value() or "") else None

    renewed = wait_until(renew_keeping_the_first)  # same chain: the first token outlives the renewal
    assert renewed.connect_token_value() != first.connect_token_value()

    def take_over() -> Optional[QueueEntry]:
        # Not running: the claim lapses at its deadline and another acceptor may take the session.
        try:
            return claim_session(handle.url, token, sid, "worker-2")
        except httpx.HTTPStatusError:
            return None

    taken = wait_until(take_over)
    for stale in (first, renewed):
        assert Gateway(stale).connect().status_code == 401

    def connect_as_the_new_holder() -> bool:
        # The new holder's token connects while its claim lasts (renewed first, for the loaded-machine case).
        claim_session(handle.url, token, sid, "worker-2")
        return Gateway(taken).connect().status_code == 200

    assert wait_until(connect_as_the_new_holder)
    for stale in (first, renewed):
        assert Gateway(stale).connect().status_code == 401


def test_a_token_of_another_session_is_401(
    sim: SimHandle, claimed: QueueEntry, outpost: Outpost, machine_token: str
) -> None:
    other = claim_session(
        sim.url, machine_token, sim.admin.enqueue(outpost.outpost_id).session_id, "worker-1"
    )
    foreign = Gateway(claimed, token=other.connect_token_value())
    assert foreign.connect().status_code == 401
    assert Gateway(other).connect().status_code == 200


def test_a_tombstone_tells_the_remote_the_end_then_makes_the_token_stale(
    sim: SimHandle, claimed: QueueEntry
) -> None:
    gw = Gateway(claimed)
    assert gw.connect().status_code == 200
    sim.admin.tombstone(claimed.session_id)
    assert not sim.admin.check_connect_token(claimed.session_id, gw.token or "")
    told = gw.next()
    assert told.status_code == 200
    assert told.json() == {"type": "end", "session_status": "terminated"}
    assert gw.next().status_code == 401
    assert gw.connect().status_code == 401


def test_an_expired_claim_on_a_running_session_stays_with_its_worker(make_sim: Any) -> None:
    handle: SimHandle = make_sim(claim_ttl=0.3)
    token = handle.create_token("machine")
    sid = handle.admin.enqueue(handle.admin.create_outpost("rhel", "linux").outpost_id).session_id
    claimed = claim_session(handle.url, token, sid, "worker-1")
    gw = Gateway(claimed)
    assert gw.connect().status_code == 200  # the session is running now
    assert gw.next(wait=0.6).json() == {"type": "idle"}  # well past the deadline
    with pytest.raises(httpx.HTTPStatusError) as raised:
        claim_session(handle.url, token, sid, "worker-2")
    assert raised.value.response.status_code == 409
    assert gw.next().status_code == 200  # the token is still good
    assert [r["action"] for r in handle.admin.claims(session_id=sid)] == ["claim"]


def test_next_hands_out_calls_in_order_and_takes_their_results(sim: SimHandle, claimed: QueueEntry) -> None:
    gw = Gateway(claimed)
    gw.connect()
    added = sim.admin.add_calls(
        claimed.session_id, [tools.run("echo 1"), tools.write("a.txt", "x"), tools.read("a.txt")]
    )
    assert [c["state"] for c in added] == ["queued"] * 3
    for expected in added:
        answer = gw.next().json()
        assert answer["type"] == "call"
        assert answer["call"]["id"] == expected["id"]
        assert answer["call"]["tool"] == expected["tool"]
        assert answer["call"]["args"] == expected["args"]
        assert gw.result(expected["id"], exit_code=3, output="out", duration=0.1).status_code == 200
    assert gw.result(added[0]["id"]).status_code == 409  # a second result
    assert gw.result("call_unknown").status_code == 404
    calls = sim.admin.calls(claimed.session_id)
    assert [c["state"] for c in calls] == ["done"] * 3
    first = calls[0]
    assert first["result"]["exit_code"] == 3
    assert first["result"]["output"] == "out"
    assert first["created_at"] <= first["delivered_at"] <= first["completed_at"]
    assert gw.next().json() == {"type": "idle"}


def poll_while(sim: SimHandle, gw: Gateway, action: Any) -> httpx.Response:
    """Open a 30 s long poll, run ``action()`` once the poll waits, and return the poll's answer. Had the
    poll not been woken, its answer would be ``idle`` (after 30 s): the assertions are on the answer."""
    answers: list[httpx.Response] = []
    poll = threading.Thread(target=lambda: answers.append(gw.next(wait=30)))
    hub = sim.runtime.gateway
    assert hub is not None
    waiting = hub.open_streams
    poll.start()
    try:
        for dummy in range(1000):
            if hub.open_streams > waiting:
                break
            threading.Event().wait(0.01)
        action()
    finally:
        poll.join(timeout=40)
    [answer] = answers
    return answer


def test_a_long_poll_wakes_when_the_brain_adds_a_call(sim: SimHandle, claimed: QueueEntry) -> None:
    gw = Gateway(claimed)
    gw.connect()
    added: list[dict[str, Any]] = []
    answer = poll_while(
        sim, gw, lambda: added.extend(sim.admin.add_calls(claimed.session_id, [tools.run("true")]))
    )
    assert answer.json() == {
        "type": "call",
        "call": {"id": added[0]["id"], "tool": "run", "args": {"command": "true"}},
    }


def test_a_long_poll_wakes_when_the_session_ends(sim: SimHandle, claimed: QueueEntry) -> None:
    gw = Gateway(claimed)
    gw.connect()
    answer = poll_while(sim, gw, lambda: sim.admin.set_status(claimed.session_id, "suspended"))
    assert answer.json() == {"type": "end", "session_status": "suspended"}


def test_a_long_poll_wakes_when_the_claim_is_released(
    sim: SimHandle, claimed: QueueEntry, machine_token: str
) -> None:
    gw = Gateway(claimed)
    gw.connect()

    def release() -> None:
        httpx.post(
            f"{sim.url}/opbeta/outposts/devins/{claimed.session_id}/release",
            json={"acceptor_id": "worker-1"},
            headers={"Authorization": f"Bearer {machine_token}"},
        ).raise_for_status()

    assert poll_while(sim, gw, release).status_code == 401


def test_a_long_poll_without_work_answers_idle(claimed: QueueEntry) -> None:
    gw = Gateway(claimed)
    gw.connect()
    assert gw.next(wait=0.2).json() == {"type": "idle"}


@pytest.mark.parametrize("status", ["suspended", "terminated"])
def test_ending_a_session_tells_the_remote_and_cancels_queued_calls(
    sim: SimHandle, claimed: QueueEntry, status: str
) -> None:
    gw = Gateway(claimed)
    gw.connect()
    sim.admin.add_calls(claimed.session_id, [tools.run("true"), tools.run("false")])
    delivered = gw.next().json()["call"]
    entry = sim.admin.end_session(claimed.session_id, status)
    assert entry.status.session_status == status
    assert gw.next(wait=5).json() == {"type": "end", "session_status": status}
    states = [c["state"] for c in sim.admin.calls(claimed.session_id)]
    assert states == ["delivered", "cancelled"]
    assert gw.result(delivered["id"]).status_code == 200  # a call in flight may still report
    again = gw.connect()  # a restarted remote learns at once that the session is over
    assert again.json()["end"] is True
    assert sim.admin.session(claimed.session_id)["entry"]["status"]["session_status"] == status


def test_a_newer_connection_supersedes_and_gets_the_unfinished_call(
    sim: SimHandle, claimed: QueueEntry
) -> None:
    old, new = Gateway(claimed), Gateway(claimed)
    old.connect()
    [call] = sim.admin.add_calls(claimed.session_id, [tools.run("true")])
    assert old.next().json()["call"]["id"] == call["id"]
    new.connect()  # the remote was restarted before it answered
    assert old.next().status_code == 409
    assert old.result(call["id"]).status_code == 409
    redelivered = new.next().json()
    assert redelivered["call"]["id"] == call["id"]
    assert new.result(call["id"]).status_code == 200
    [done] = sim.admin.calls(claimed.session_id)
    assert (done["attempts"], done["connection_id"]) == (2, new.connection)
    assert len(sim.admin.connections(claimed.session_id)) == 2


def test_wait_calls_and_wait_connection(sim: SimHandle, claimed: QueueEntry) -> None:
    assert sim.admin.wait_calls(claimed.session_id, timeout=0.1) == []  # nothing scripted: complete
    sim.admin.add_calls(claimed.session_id, [tools.read("x")])
    with pytest.raises(SimAdminError, match="1 of 1 calls not done"):
        sim.admin.wait_calls(claimed.session_id, timeout=0.2)
    with pytest.raises(SimAdminError, match="0 of 1 connections"):
        sim.admin.wait_connection(claimed.session_id, timeout=0.2)
    gw = Gateway(claimed)
    served = threading.Thread(target=lambda: (gw.connect(), gw.result(gw.next().json()["call"]["id"])))
    served.start()
    try:
        assert sim.admin.wait_connection(claimed.session_id, timeout=20)["pid"] == 1
        [call] = sim.admin.wait_calls(claimed.session_id, timeout=20)
    finally:
        served.join(timeout=20)
    assert call["state"] == "done"


@pytest.mark.parametrize(
    ("calls", "detail"),
    [
        ([], "non-empty list"),
        ([{"tool": "rm"}], "tool must be one of"),
        ([{"tool": "run"}], "command is required"),
        ([{"tool": "run", "command": ""}], "must not be empty"),
        ([{"tool": "run", "command": "x", "timeout": 0}], "timeout"),
        ([{"tool": "run", "command": "x", "shell": True}], "unknown argument"),
        ([{"tool": "write", "path": "a", "content": 5}], "wrong type"),
        ([{"tool": "edit", "path": "a", "old": "", "new": "b"}], "old must not be empty"),
        (["run"], "JSON object"),
    ],
)
def test_bad_calls_are_422(sim: SimHandle, session: str, calls: list[Any], detail: str) -> None:
    with pytest.raises(SimAdminError, match=detail) as raised:
        sim.admin.add_calls(session, calls)
    assert raised.value.status == 422


def test_brain_routes_need_the_admin_token_and_a_known_session(sim: SimHandle, session: str) -> None:
    response = httpx.post(f"{sim.url}/_sim/sessions/{session}/calls", json={"calls": [tools.read("x")]})
    assert response.status_code == 401
    for call in (
        lambda: sim.admin.add_calls("devin-nope", [tools.read("x")]),
        lambda: sim.admin.calls("devin-nope"),
        lambda: sim.admin.connections("devin-nope"),
        lambda: sim.admin.end_session("devin-nope"),
    ):
        with pytest.raises(SimAdminError) as raised:
            call()
        assert raised.value.status == 404
    with pytest.raises(SimAdminError) as raised:
        sim.admin.end_session(session, "running")
    assert raised.value.status == 422
