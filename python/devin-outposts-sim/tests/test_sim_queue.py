"""The queue list: filters, page sizes, keyset cursors with boundary overlap, tombstones, get-one."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from devin_outposts.api.models import Outpost, QueueList
from devin_outposts_sim.state.store import Store
from devin_outposts_sim.testing import SimHandle

QUEUE = "/opbeta/outposts/devins"


def _ids(page: dict[str, Any]) -> list[str]:
    return [item["metadata"]["session_id"] for item in page["items"]]


def _decode(cursor: str) -> str:
    return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()


def test_list_envelope_and_entry_shape(sim: SimHandle, api, machine_token: str, outpost: Outpost) -> None:
    sim.admin.enqueue(outpost.outpost_id, session_id="devin-abc", remote_binary_sha="1a2b3c4")
    page = api(machine_token).get(QUEUE).json()
    assert set(page) == {"items", "cursor", "has_next_page", "total"}
    assert page["total"] == 1
    assert page["has_next_page"] is False
    parsed = QueueList.model_validate(page)  # the client's own model accepts it
    entry = parsed.items[0]
    assert entry.metadata.session_id == "devin-abc"
    assert entry.metadata.outpost_id == outpost.outpost_id
    assert isinstance(page["items"][0]["metadata"]["created_at"], int)
    assert isinstance(page["items"][0]["metadata"]["updated_at"], int)
    assert page["items"][0]["spec"] == {
        "kind": "new",
        "platform": "linux",
        "remote_binary_sha": "1a2b3c4",
        "network_policy": None,
    }
    assert page["items"][0]["status"] == {
        "phase": "pending",
        "acceptor_id": None,
        "claim_deadline": None,
        "session_status": "pending",
        "connect_token": None,
        "gateway_url": None,
    }


def test_enqueue_defaults_and_overrides(sim: SimHandle, outpost: Outpost) -> None:
    entry = sim.admin.enqueue(outpost.outpost_id)
    assert entry.session_id.startswith("devin-")
    assert entry.spec.platform == "linux"  # the outpost's
    resume = sim.admin.enqueue(
        outpost.outpost_id,
        kind="resume",
        platform="windows",
        session_status="suspended",
        network_policy={"enabled": True, "allow": [{"hostname": "*.github.com"}]},
    )
    wire = resume.to_wire()
    assert wire["spec"]["kind"] == "resume"
    assert wire["spec"]["platform"] == "windows"
    assert wire["spec"]["network_policy"]["allow"][0]["hostname"] == "*.github.com"
    assert wire["status"]["session_status"] == "suspended"


def test_entries_of_a_default_platform_outpost_carry_a_concrete_platform(
    sim: SimHandle, api, machine_token: str
) -> None:
    # Only the outpost's platform is nullable (docs/fleet-api.md §3); clients filter entries on a concrete
    # one.
    default = sim.admin.create_outpost("anyos")  # spec.platform null: the default platform
    assert default.spec.platform is None
    sid = sim.admin.enqueue(default.outpost_id).session_id
    client = api(machine_token)
    assert client.get(f"{QUEUE}/{sid}").json()["spec"]["platform"] == "linux"
    [listed] = client.get(QUEUE, params={"outpost": default.outpost_id}).json()["items"]
    assert listed["spec"]["platform"] == "linux"
    assert sim.admin.session(sid)["entry"]["spec"]["platform"] == "linux"
    claimed = client.post(f"{QUEUE}/{sid}/claim", json={"acceptor_id": "w1"}).json()
    assert claimed["spec"]["platform"] == "linux"
    # An explicit platform still wins over the default.
    assert sim.admin.enqueue(default.outpost_id, platform="macos").spec.platform == "macos"


def test_a_database_with_null_entry_platforms_is_repaired_on_open(tmp_path: Path) -> None:
    # A database written before the default was resolved at enqueue: its null platforms become concrete.
    path = str(tmp_path / "old.db")
    store = Store(path)
    oid = store.accounts.create_outpost("acct-default", "old").outpost_id
    sid = store.queue.enqueue(oid).session_id
    with store.db.tx() as conn:
        conn.execute("UPDATE sessions SET platform = NULL WHERE session_id = ?", (sid,))
    store.close()
    reopened = Store(path)
    try:
        assert reopened.queue.get_entry("acct-default", sid).spec.platform == "linux"
    finally:
        reopened.close()


def test_enqueue_refuses_a_live_duplicate_and_an_unknown_outpost(sim: SimHandle, outpost: Outpost) -> None:
    from devin_outposts_sim.admin_client import SimAdminError

    sim.admin.enqueue(outpost.outpost_id, session_id="devin-dup")
    with pytest.raises(SimAdminError) as conflict:
        sim.admin.enqueue(outpost.outpost_id, session_id="devin-dup")
    assert conflict.value.status == 409
    with pytest.raises(SimAdminError) as missing:
        sim.admin.enqueue("outpost_env-nope")
    assert missing.value.status == 404


def test_filters(sim: SimHandle, api, machine_token: str, outpost: Outpost) -> None:
    client = api(machine_token)
    other = sim.admin.create_outpost("other").outpost_id
    a = sim.admin.enqueue(outpost.outpost_id).session_id
    b = sim.admin.enqueue(outpost.outpost_id).session_id
    c = sim.admin.enqueue(other).session_id
    client.post(f"{QUEUE}/{a}/claim", json={"acceptor_id": "w1"})
    client.post(f"{QUEUE}/{c}/claim", json={"acceptor_id": "w2"})

    assert set(_ids(client.get(QUEUE).json())) == {a, b, c}
    assert set(_ids(client.get(QUEUE, params={"outpost": outpost.outpost_id}).json())) == {a, b}
    assert set(_ids(client.get(QUEUE, params={"pool": outpost.outpost_id}).json())) == {a, b}  # legacy name
    assert _ids(client.get(QUEUE, params={"phase": "pending"}).json()) == [b]
    assert set(_ids(client.get(QUEUE, params={"phase": "claimed"}).json())) == {a, c}
    assert _ids(client.get(QUEUE, params={"acceptor_id": "w2"}).json()) == [c]
    both = {"phase": "claimed", "acceptor_id": "w1", "outpost": outpost.outpost_id}
    assert _ids(client.get(QUEUE, params=both).json()) == [a]
    assert _ids(client.get(QUEUE, params={"outpost": "outpost_env-unknown"}).json()) == []


def test_invalid_phase_is_422(sim: SimHandle, api, machine_token: str) -> None:
    response = api(machine_token).get(QUEUE, params={"phase": "running"})
    assert response.status_code == 422
    assert "phase" in response.json()["detail"]


@pytest.mark.parametrize("first", ["0", "201", "-5", "x", ""])
def test_first_out_of_range_is_422(sim: SimHandle, api, machine_token: str, first: str) -> None:
    response = api(machine_token).get(QUEUE, params={"first": first})
    assert response.status_code == 422
    assert "first" in response.json()["detail"]


def test_default_page_size_is_100_and_200_is_the_maximum(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    for _dummy in range(201):
        sim.store.queue.enqueue(outpost.outpost_id)
    client = api(machine_token)
    assert len(client.get(QUEUE).json()["items"]) == 100
    assert len(client.get(QUEUE, params={"first": 200}).json()["items"]) == 200


@pytest.mark.parametrize(
    "cursor",
    [
        "not-base64!!",
        base64.b64encode(b"v2:1.0:x").decode(),
        base64.b64encode(b"v1:abc:x").decode(),
        base64.b64encode(b"v1:nan").decode(),
        base64.b64encode(b"v1:-1.0").decode(),
        base64.b64encode(b"\xff\xfe").decode(),
        base64.b64encode(b"o1:3").decode(),
    ],
)
def test_garbage_cursor_is_422(sim: SimHandle, api, machine_token: str, cursor: str) -> None:
    client = api(machine_token)
    for params in ({"cursor": cursor}, {"cursor": cursor, "watch": "true"}):
        response = client.get(QUEUE, params=params)
        assert response.status_code == 422
        assert response.json() == {"detail": "Invalid cursor"}


def test_docs_style_cursor_without_id_is_accepted(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    sim.admin.enqueue(outpost.outpost_id)
    cursor = base64.b64encode(b"v1:1781050000.0").decode()  # "djE6MTc4MTA1MDAwMC4w", the docs' example
    assert cursor == "djE6MTc4MTA1MDAwMC4w"
    page = api(machine_token).get(QUEUE, params={"cursor": cursor}).json()
    assert len(page["items"]) == 1  # every row is after 2026-06-09


def test_cursor_is_opaque_base64_of_v1_rev_and_id(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    for _dummy in range(3):
        sim.admin.enqueue(outpost.outpost_id)
    page = api(machine_token).get(QUEUE, params={"first": 2}).json()
    prefix, rev, session_id = _decode(page["cursor"]).split(":")
    assert prefix == "v1"
    assert float(rev) >= page["items"][-1]["metadata"]["updated_at"]
    assert session_id == page["items"][-1]["metadata"]["session_id"]


def test_boundary_row_reappears_on_the_next_page(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    created = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(5)]
    client = api(machine_token)
    first = client.get(QUEUE, params={"first": 3}).json()
    assert _ids(first) == created[:3]
    assert first["has_next_page"] is True  # the page was full
    second = client.get(QUEUE, params={"first": 3, "cursor": first["cursor"]}).json()
    assert _ids(second) == created[2:5]  # created[2] again: the >= boundary
    assert second["has_next_page"] is True
    third = client.get(QUEUE, params={"first": 3, "cursor": second["cursor"]}).json()
    assert _ids(third) == [created[4]]
    assert third["has_next_page"] is False


def _traverse(client, first: int, **filters: Any) -> tuple[list[str], dict[str, dict[str, Any]], str, int]:
    """Follow cursors to the end; returns every id in order seen, the upserted set, the final cursor."""
    order: list[str] = []
    upserted: dict[str, dict[str, Any]] = {}
    cursor = None
    pages = 0
    while True:
        params = {"first": first, **filters, **({"cursor": cursor} if cursor else {})}
        page = client.get(QUEUE, params=params).json()
        pages += 1
        assert pages < 1000, "the traversal never ended"
        for item in page["items"]:
            order.append(item["metadata"]["session_id"])
            upserted[item["metadata"]["session_id"]] = item
        if not page["has_next_page"]:
            return order, upserted, page["cursor"], pages
        assert page["cursor"] != cursor, "the cursor did not advance"
        cursor = page["cursor"]


@pytest.mark.parametrize("first", [1, 2, 7, 50, 200])
def test_full_traversal_sees_every_row_and_upsert_dedups(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, first: int
) -> None:
    # 60 rows enqueued back to back: most share a wall-clock second, yet all paginate.
    created = [sim.store.queue.enqueue(outpost.outpost_id).session_id for dummy in range(60)]
    updated = {
        e["metadata"]["updated_at"]
        for e in api(machine_token).get(QUEUE, params={"first": 200}).json()["items"]
    }
    assert len(updated) < 60  # many rows share one wire updated_at
    order, upserted, _dummy_cursor, pages = _traverse(api(machine_token), first)
    assert set(order) == set(created)
    assert list(upserted) == created  # exactly the set, in queue order
    repeats = len(order) - len(created)
    if first > 1:
        assert repeats == pages - 1  # every later page starts with the previous page's last row
    else:
        # first=1 cannot repeat and advance at once: the boundary is skipped while rows follow it, and
        # the final request returns the last row again with has_next_page false.
        assert (repeats, pages) == (1, 61)


def test_rows_modified_during_traversal_are_seen_with_their_latest_state(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    created = [sim.store.queue.enqueue(outpost.outpost_id).session_id for dummy in range(10)]
    client = api(machine_token)
    page = client.get(QUEUE, params={"first": 4}).json()
    seen = {item["metadata"]["session_id"]: item for item in page["items"]}
    # The first row is claimed mid-traversal: it moves to the end and comes again, fresher.
    client.post(f"{QUEUE}/{created[0]}/claim", json={"acceptor_id": "w1"})
    cursor = page["cursor"]
    while True:
        page = client.get(QUEUE, params={"first": 4, "cursor": cursor}).json()
        seen.update({item["metadata"]["session_id"]: item for item in page["items"]})
        if not page["has_next_page"]:
            break
        cursor = page["cursor"]
    assert set(seen) == set(created)
    assert seen[created[0]]["status"]["phase"] == "claimed"


def test_total_counts_matching_rows_at_or_after_the_cursor(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    for _dummy in range(5):
        sim.admin.enqueue(outpost.outpost_id)
    client = api(machine_token)
    first = client.get(QUEUE, params={"first": 2}).json()
    assert first["total"] == 5
    second = client.get(QUEUE, params={"first": 2, "cursor": first["cursor"]}).json()
    assert second["total"] == 4  # rows at or after the cursor: the boundary row and the three after it


def test_empty_list_still_returns_a_cursor_at_the_head(
    sim: SimHandle, api, machine_token: str, outpost: Outpost, watch
) -> None:
    old = sim.admin.enqueue(outpost.outpost_id).session_id
    sim.admin.tombstone(old)
    page = api(machine_token).get(QUEUE).json()
    assert page["items"] == []
    assert page["cursor"]
    # Watching from it replays nothing of the history: the first event is the next change.
    new = sim.admin.enqueue(outpost.outpost_id).session_id
    with watch(machine_token, cursor=page["cursor"]) as stream:
        event = stream.next_event()
    assert event is not None
    assert event["object"]["metadata"]["session_id"] == new
    assert event["type"] == "MODIFIED"


def test_get_one_entry(sim: SimHandle, api, machine_token: str, outpost: Outpost) -> None:
    entry = sim.admin.enqueue(outpost.outpost_id)
    response = api(machine_token).get(f"{QUEUE}/{entry.session_id}")
    assert response.status_code == 200
    assert response.json() == entry.to_wire()


def test_tombstoned_rows_leave_the_list_and_get_is_404(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    client = api(machine_token)
    keep = sim.admin.enqueue(outpost.outpost_id).session_id
    gone = sim.admin.enqueue(outpost.outpost_id).session_id
    deleted = sim.admin.tombstone(gone)
    assert deleted.session_id == gone
    assert _ids(client.get(QUEUE).json()) == [keep]
    assert client.get(QUEUE).json()["total"] == 1
    response = client.get(f"{QUEUE}/{gone}")
    assert response.status_code == 404
    assert response.json() == {"detail": "Session not found in queue"}
    missing = client.get(f"{QUEUE}/devin-never-existed")
    assert missing.status_code == 404
    assert missing.json() == {"detail": "Session not found in queue"}


def test_a_tombstoned_session_can_be_enqueued_again(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    sim.admin.tombstone(sid)
    again = sim.admin.enqueue(outpost.outpost_id, session_id=sid, kind="resume")
    assert again.to_wire()["spec"]["kind"] == "resume"
    assert api(machine_token).get(f"{QUEUE}/{sid}").status_code == 200


def test_unknown_session_status_values_pass_through(
    sim: SimHandle, api, machine_token: str, outpost: Outpost
) -> None:
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    sim.admin.set_status(sid, "hibernating")
    assert api(machine_token).get(f"{QUEUE}/{sid}").json()["status"]["session_status"] == "hibernating"
