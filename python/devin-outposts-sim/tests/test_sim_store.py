"""Store-level rules that HTTP tests cannot reach directly: revisions and the clock."""

from __future__ import annotations

from pathlib import Path

from sim_support import SteppingClock

from devin_outposts_sim.state.store import Store


def test_revisions_increase_even_when_the_clock_steps_back(tmp_path: Path) -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(str(tmp_path / "s.db"), clock=clock)
    oid = store.accounts.create_outpost("acct-default", "c").outpost_id
    first = store.queue.enqueue(oid).session_id
    cursor = store.queue.list_entries("acct-default", first=100).cursor
    clock.now -= 3600  # NTP stepped the clock back an hour
    second = store.queue.enqueue(oid).session_id
    # The change made "in the past" is still after the cursor taken before it.
    page = store.queue.list_entries("acct-default", first=100, cursor=cursor)
    assert [e.session_id for e in page.items] == [second]
    revs = [row["rev"] for row in store.records.admin_sessions()]
    assert revs == sorted(revs)
    assert len(set(revs)) == 2
    listed = {row["entry"]["metadata"]["session_id"] for row in store.records.admin_sessions()}
    assert {first, second} == listed
    store.close()


def test_revisions_continue_after_reopening_the_database(tmp_path: Path) -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(str(tmp_path / "s.db"), clock=clock)
    oid = store.accounts.create_outpost("acct-default", "c").outpost_id
    store.queue.enqueue(oid)
    head = store.queue.list_entries("acct-default", first=100).cursor
    store.close()
    clock.now -= 60
    reopened = Store(str(tmp_path / "s.db"), clock=clock)
    later = reopened.queue.enqueue(oid).session_id
    page = reopened.queue.list_entries("acct-default", first=100, cursor=head)
    assert [e.session_id for e in page.items] == [later]
    reopened.close()


def test_reset_keeps_revisions_increasing() -> None:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock)
    oid = store.accounts.create_outpost("acct-default", "c").outpost_id
    store.queue.enqueue(oid)
    head = store.queue.list_entries("acct-default", first=100).cursor
    store.reset()
    clock.now -= 10
    oid = store.accounts.create_outpost("acct-default", "c").outpost_id
    after = store.queue.enqueue(oid).session_id
    page = store.queue.list_entries("acct-default", first=100, cursor=head)
    assert [e.session_id for e in page.items] == [after]
    store.close()


def test_many_changes_in_one_second_have_distinct_ordered_revisions() -> None:
    clock = SteppingClock(1_781_050_000.25)  # the clock does not move at all
    store = Store(":memory:", clock=clock)
    oid = store.accounts.create_outpost("acct-default", "c").outpost_id
    ids = [store.queue.enqueue(oid).session_id for dummy in range(500)]
    rows = store.records.admin_sessions()
    assert [row["entry"]["metadata"]["session_id"] for row in rows] == ids
    assert len({row["rev"] for row in rows}) == 500
    assert {row["entry"]["metadata"]["updated_at"] for row in rows} == {1_781_050_000}
    seen: dict[str, None] = {}
    cursor = None
    while True:
        page = store.queue.list_entries("acct-default", first=7, cursor=cursor)
        seen.update(dict.fromkeys(e.session_id for e in page.items))
        if not page.has_next_page:
            break
        cursor = page.cursor
    assert list(seen) == ids
    store.close()


def test_claim_deadline_on_the_wire_is_whole_seconds_rounded_down() -> None:
    clock = SteppingClock(1_781_050_000.9)
    store = Store(":memory:", clock=clock)
    oid = store.accounts.create_outpost("acct-default", "c").outpost_id
    sid = store.queue.enqueue(oid).session_id
    entry = store.queue.claim("acct-default", sid, "w", ttl=300, gateway_url="ws://g")
    assert entry.status.claim_deadline == 1_781_050_300  # 1_781_050_300.9 rounded down: never late
    store.close()
