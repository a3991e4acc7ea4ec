"""The SSE watch: replay from a cursor, live events, dedup, keepalives, stream end and reconnect."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from devin_outposts.api.models import Outpost, WatchEvent
from devin_outposts_sim.testing import SimHandle

QUEUE = "/opbeta/outposts/devins"


def _sid(event: dict[str, Any]) -> str:
    return str(event["object"]["metadata"]["session_id"])


def test_watch_is_an_event_stream_of_single_line_events(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    headers = {"Authorization": f"Bearer {machine_token}"}
    with (
        httpx.Client(base_url=sim.url, headers=headers, timeout=15) as client,
        client.stream("GET", QUEUE, params={"watch": "true"}) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].split(";")[0] == "text/event-stream"
        lines = response.iter_lines()
        first = next(lines)
        blank = next(lines)
    assert first.startswith("data: ")
    assert blank == ""
    event = WatchEvent.model_validate_json(first[len("data: ") :])  # the client's model parses it
    assert event.type == "MODIFIED"
    assert event.object.session_id == sid
    assert event.cursor


def test_watch_without_cursor_replays_everything_including_tombstones(
    sim: SimHandle, machine_token: str, outpost: Outpost, watch
) -> None:
    a = sim.admin.enqueue(outpost.outpost_id).session_id
    b = sim.admin.enqueue(outpost.outpost_id).session_id
    sim.admin.tombstone(a)
    with watch(machine_token) as stream:
        events = [stream.next_event(), stream.next_event()]
    assert [(e["type"], _sid(e)) for e in events if e] == [("MODIFIED", b), ("DELETED", a)]


def test_watch_from_list_cursor_sends_only_later_changes(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, watch
) -> None:
    client = api(machine_token)
    old = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(3)]
    cursor = client.get(QUEUE, params={"outpost": outpost.outpost_id}).json()["cursor"]
    new = sim.admin.enqueue(outpost.outpost_id).session_id
    client.post(f"{QUEUE}/{old[1]}/claim", json={"acceptor_id": "w1"})
    sim.admin.tombstone(old[2])
    with watch(machine_token, outpost=outpost.outpost_id, cursor=cursor) as stream:
        events = stream.until(lambda e: e["type"] == "DELETED")
    assert [(e["type"], _sid(e)) for e in events] == [
        ("MODIFIED", new),
        ("MODIFIED", old[1]),
        ("DELETED", old[2]),
    ]
    assert events[1]["object"]["status"]["phase"] == "claimed"
    assert events[1]["object"]["status"]["connect_token"] is None  # never in events


def test_live_events_arrive_after_the_replay(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, watch
) -> None:
    client = api(machine_token)
    cursor = client.get(QUEUE).json()["cursor"]
    with watch(machine_token, cursor=cursor) as stream:
        sid = sim.admin.enqueue(outpost.outpost_id).session_id  # after the stream is open
        created = stream.next_event()
        client.post(f"{QUEUE}/{sid}/claim", json={"acceptor_id": "w1"})
        claimed = stream.next_event()
        client.post(f"{QUEUE}/{sid}/release", json={"acceptor_id": "w1"})
        released = stream.next_event()
        sim.admin.set_status(sid, "terminated")
        finished = stream.next_event()
        sim.admin.tombstone(sid)
        deleted = stream.next_event()
    events = [created, claimed, released, finished, deleted]
    assert all(e is not None for e in events)
    assert [e["type"] for e in events if e] == ["MODIFIED"] * 4 + ["DELETED"]
    assert [e["object"]["status"]["phase"] for e in events if e] == [
        "pending",
        "claimed",
        "pending",
        "pending",
        "pending",
    ]
    assert finished
    assert finished["object"]["status"]["session_status"] == "terminated"
    cursors = [e["cursor"] for e in events if e]
    assert len(set(cursors)) == 5  # each event has its own cursor


def test_every_event_cursor_works_as_a_list_cursor(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, watch
) -> None:
    ids = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(4)]
    with watch(machine_token) as stream:
        events = [stream.next_event() for dummy in range(4)]
    second = events[1]
    assert second is not None
    page = api(machine_token).get(QUEUE, params={"cursor": second["cursor"]}).json()
    # A list returns rows at or after the cursor: the event's own row, then the later ones.
    assert [i["metadata"]["session_id"] for i in page["items"]] == ids[1:]


def test_reconnect_with_last_event_cursor_gets_boundary_row_again_then_later_events(
    make_sim, outpost: Outpost, watch
) -> None:
    fast = make_sim(watch_max_duration=0.8, keepalive_interval=0.2)
    token = fast.create_token("machine")
    oid = fast.admin.create_outpost("w").outpost_id
    first_ids = [fast.admin.enqueue(oid).session_id for dummy in range(3)]
    with watch(token, handle=fast) as stream:
        first_run = stream.rest()  # until the server ends the stream
    assert stream.ended
    assert [_sid(e) for e in first_run] == first_ids

    later = fast.admin.enqueue(oid).session_id
    with watch(token, handle=fast, cursor=first_run[-1]["cursor"]) as stream:
        second_run = stream.until(lambda e: _sid(e) == later)
    # At-least-once: the row at the cursor comes again, nothing older does.
    assert [_sid(e) for e in second_run] == [first_ids[-1], later]
    # Upsert by session id dedups to the exact set.
    assert {_sid(e) for e in first_run + second_run} == {*first_ids, later}


def test_stream_ends_after_max_duration_with_keepalives_while_idle(make_sim, watch) -> None:
    fast = make_sim(watch_max_duration=1.0, keepalive_interval=0.1)
    token = fast.create_token("machine")
    started = time.monotonic()
    with watch(token, handle=fast) as stream:
        events = stream.rest()
        lasted = time.monotonic() - started
    assert events == []
    assert stream.ended  # the server closed it; no client timeout fired (that would raise)
    assert lasted < 15  # a bound, not a timing claim: a stream that never ended would fail here
    assert len(stream.comments) >= 2
    assert set(stream.comments) == {"keepalive"}


def test_no_keepalive_before_the_interval(make_sim, watch) -> None:
    fast = make_sim(watch_max_duration=0.5, keepalive_interval=30.0)
    token = fast.create_token("machine")
    with watch(token, handle=fast) as stream:
        assert stream.rest() == []
    assert stream.comments == []


def test_phase_and_acceptor_filters_are_ignored_when_watching(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, watch
) -> None:
    client = api(machine_token)
    a = sim.admin.enqueue(outpost.outpost_id).session_id
    b = sim.admin.enqueue(outpost.outpost_id).session_id
    client.post(f"{QUEUE}/{a}/claim", json={"acceptor_id": "w1"})
    with watch(machine_token, phase="claimed", acceptor_id="w1") as stream:
        events = [stream.next_event(), stream.next_event()]
    assert {_sid(e) for e in events if e} == {a, b}


def test_outpost_filter_is_honoured_when_watching(
    sim: SimHandle, machine_token: str, outpost: Outpost, watch
) -> None:
    other = sim.admin.create_outpost("other").outpost_id
    sim.admin.enqueue(other)
    mine = sim.admin.enqueue(outpost.outpost_id).session_id
    sim.admin.enqueue(other)
    last = sim.admin.enqueue(outpost.outpost_id).session_id
    with watch(machine_token, outpost=outpost.outpost_id) as stream:
        events = stream.until(lambda e: _sid(e) == last)
    assert [_sid(e) for e in events] == [mine, last]
    with watch(machine_token, pool=outpost.outpost_id) as stream:  # the legacy parameter name
        events = stream.until(lambda e: _sid(e) == last)
    assert [_sid(e) for e in events] == [mine, last]


def test_other_accounts_changes_are_not_streamed(sim: SimHandle, outpost: Outpost, watch) -> None:
    foreign_outpost = sim.admin.create_outpost("theirs", account="acct-other").outpost_id
    sim.admin.enqueue(foreign_outpost)
    mine = sim.admin.enqueue(outpost.outpost_id).session_id
    with watch(sim.create_token("machine")) as stream:
        event = stream.next_event()
    assert event is not None
    assert _sid(event) == mine


def test_a_stream_never_repeats_an_event_for_the_same_change(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, watch
) -> None:
    client = api(machine_token)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    with watch(machine_token) as stream:
        replayed = stream.next_event()
        for round_number in range(3):
            client.post(f"{QUEUE}/{sid}/claim", json={"acceptor_id": f"w{round_number}"})
            client.post(f"{QUEUE}/{sid}/release", json={"acceptor_id": f"w{round_number}"})
        marker = sim.admin.enqueue(outpost.outpost_id).session_id
        events = stream.until(lambda e: _sid(e) == marker)
    assert replayed is not None
    keys = [(e["object"]["metadata"]["session_id"], e["cursor"]) for e in [replayed, *events]]
    assert len(keys) == len(set(keys))
    # Level-based like the upstream mock: rapid changes to one row may be coalesced, but the last
    # event of the row always carries its final state.
    final = [e for e in events if _sid(e) == sid][-1]
    assert final["object"]["status"]["phase"] == "pending"
    assert final["object"]["status"]["acceptor_id"] is None
    assert 2 <= len(keys) <= 8


def test_claim_expiry_is_streamed_as_modified(make_sim, watch) -> None:
    fast = make_sim(claim_ttl=0.3, sweep_interval=0.05)
    token = fast.create_token("machine")
    oid = fast.admin.create_outpost("x").outpost_id
    sid = fast.admin.enqueue(oid).session_id
    headers = {"Authorization": f"Bearer {token}"}
    claimed = httpx.post(f"{fast.url}{QUEUE}/{sid}/claim", json={"acceptor_id": "w1"}, headers=headers).json()
    with watch(token, handle=fast) as stream:
        events = stream.until(lambda e: e["object"]["status"]["phase"] == "pending")
    assert events[0]["object"]["status"]["phase"] == "claimed"
    back = events[-1]
    assert back["type"] == "MODIFIED"
    assert back["object"]["status"]["acceptor_id"] is None
    assert back["object"]["status"]["claim_deadline"] is None
    assert claimed["status"]["phase"] == "claimed"


def test_client_disconnects_are_cleaned_up(sim: SimHandle, machine_token: str, watch, wait_until) -> None:
    notifier = sim.runtime.notifier
    assert notifier is not None
    assert notifier.open_streams == 0
    with watch(machine_token) as stream:
        wait_until(lambda: notifier.open_streams == 1)
        assert stream.response.status_code == 200
    wait_until(lambda: notifier.open_streams == 0)


def test_many_concurrent_watchers_all_get_the_event(
    sim: SimHandle, machine_token: str, outpost: Outpost, api, watch
) -> None:
    cursor = api(machine_token).get(QUEUE).json()["cursor"]
    received: list[str] = []
    ready = threading.Barrier(11)
    lock = threading.Lock()

    def watcher() -> None:
        with watch(machine_token, cursor=cursor) as stream:
            ready.wait(timeout=10)
            event = stream.next_event()
            with lock:
                received.append(_sid(event) if event else "ended")

    threads = [threading.Thread(target=watcher) for dummy in range(10)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=10)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    for thread in threads:
        thread.join(timeout=20)
    assert received == [sid] * 10
