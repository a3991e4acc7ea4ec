"""The simulator's hot queries are answered from indexes: SQLite's own plan of each, on a populated file.

Every request first checks for due expiries; workers list ``?outpost=&phase=pending`` and their
orchestrators ``?phase=claimed&acceptor_id=``; every watch stream replays from a cursor; the shared watch
feed reads every change after a revision. A plan that scans the ``sessions`` table (or sorts it) makes
the cost of each of those grow with the number of sessions ever queued, which is what made a claim storm
expensive. The queries checked are the store's own SQL constants.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devin_outposts_sim.state import db, queue
from devin_outposts_sim.state.store import Store

ACCT = "acct-default"


@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Store:
    store = Store(str(tmp_path_factory.mktemp("plans") / "sim.db"))
    outposts = [store.accounts.create_outpost(ACCT, f"o{i}").outpost_id for i in range(3)]
    for index in range(300):
        sid = store.queue.enqueue(outposts[index % 3]).session_id
        if index % 4 == 0:
            store.queue.claim(ACCT, sid, f"w{index % 5}", ttl=300, gateway_url="ws://g")
        if index % 7 == 0:
            store.queue.set_session_status(sid, "running")
        if index % 11 == 0:
            store.queue.tombstone(sid)
    return store


def plan(store: Store, sql: str, params: list[object]) -> list[str]:
    with store.db.read() as conn:
        return [str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


def assert_indexed(store: Store, sql: str, params: list[object]) -> None:
    steps = plan(store, sql, params)
    assert any("USING" in step and "INDEX" in step for step in steps), steps
    assert not any(step.startswith("SCAN sessions") for step in steps), steps
    assert not any("TEMP B-TREE FOR ORDER BY" in step for step in steps), steps


def list_sql(outpost: bool, phase: bool, acceptor: bool, cursor: bool) -> tuple[str, str, list[object]]:
    where, params = queue.list_filter(
        ACCT, "outpost_env-x" if outpost else None, "pending" if phase else None, "w1" if acceptor else None
    )
    if cursor:
        where += queue.CURSOR_TERM.format(op=">=")
        params = [*params, 1_781_050_000.0, "devin-x"]
    return queue.LIST_SQL.format(where=where), queue.COUNT_SQL.format(where=where), params


def searched(steps: list[str]) -> str:
    """The search terms of a one-step plan, without spaces: ``outpost_id=?ANDdeleted=?...``."""
    assert len(steps) == 1, steps
    return steps[0].replace(" ", "")


@pytest.mark.parametrize(
    ("outpost", "phase", "acceptor", "cursor", "index", "terms"),
    [
        # a worker's list, and its next page: the filter and the cursor are the index search
        (True, True, False, False, "sessions_by_outpost_phase", ["outpost_id=?", "deleted=?", "phase=?"]),
        (True, True, False, True, "sessions_by_outpost_phase", ["phase=?", "(rev,session_id)>"]),
        # an outpost's whole queue from a cursor
        (True, False, False, True, "sessions_by_outpost_rev", ["outpost_id=?", "(rev,session_id)>"]),
        # an orchestrator's claims (?phase=claimed&acceptor_id=, no outpost)
        (False, True, True, False, "sessions_by_acceptor", ["acceptor_id=?"]),
        # an account's whole queue from a cursor
        (False, False, False, True, "sessions_by_rev", ["account_id=?", "(rev,session_id)>"]),
    ],
)
def test_queue_lists_and_totals_search_an_index_by_every_filter(
    populated: Store, outpost: bool, phase: bool, acceptor: bool, cursor: bool, index: str, terms: list[str]
) -> None:
    select, count, params = list_sql(outpost, phase, acceptor, cursor)
    assert_indexed(populated, select, [*params, 101])
    for sql, args in ((select, [*params, 101]), (count, params)):
        steps = plan(populated, sql, args)
        assert index in steps[0], steps
        assert all(term in searched(steps) for term in terms), steps


@pytest.mark.parametrize("outpost", [True, False])
@pytest.mark.parametrize("op", [">=", ">"])
def test_watch_replays_seek_to_their_cursor(populated: Store, outpost: bool, op: str) -> None:
    template = queue.REPLAY_OUTPOST_SQL if outpost else queue.REPLAY_ACCOUNT_SQL
    sql = template.format(cursor=queue.CURSOR_TERM.format(op=op))
    steps = plan(populated, sql, ["outpost_env-x" if outpost else ACCT, 1_781_050_000.0, "devin-x", 200])
    assert_indexed(populated, sql, ["x", 1.0, "x", 200])
    # The cursor is part of the index search, not a filter applied to every row before it.
    assert "(rev,session_id)>" in searched(steps), steps


def test_the_watch_feed_reads_only_changes_after_its_revision(populated: Store) -> None:
    steps = plan(populated, queue.CHANGES_AFTER_SQL, [1_781_050_000.0, 200])
    assert_indexed(populated, queue.CHANGES_AFTER_SQL, [1.0, 200])
    assert "rev>?" in searched(steps), steps


@pytest.mark.parametrize(
    ("sql", "index"),
    [
        (db.EXPIRE_SQL, "sessions_expirable"),
        (db.ENDINGS_SQL, "sessions_by_ending"),
        (db.SWEEP_ENDED_SQL, "sessions_ended"),
    ],
)
def test_expiry_lagging_statuses_and_ended_sessions_look_only_at_candidates(
    populated: Store, sql: str, index: str
) -> None:
    steps = plan(populated, sql, [1_781_050_000.0])
    assert any(index in s for s in steps), steps
    assert not any(step.startswith("SCAN sessions") for step in steps), steps


def test_the_check_every_request_makes_uses_the_partial_indexes(populated: Store) -> None:
    steps = plan(populated, db.DUE_SQL, [1_781_050_000.0, 1_781_050_000.0, 1_781_049_940.0])
    assert any("sessions_expirable" in step for step in steps), steps
    assert any("sessions_by_ending" in step for step in steps), steps
    assert any("sessions_ended" in step for step in steps), steps
    assert not any(step.startswith("SCAN sessions") for step in steps), steps


def test_an_old_database_gets_the_indexes_on_open(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    Store(path).close()
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX sessions_by_outpost_phase")  # as schema version 1 had it
    conn.execute("CREATE INDEX sessions_by_outpost ON sessions (outpost_id, deleted, phase)")
    conn.commit()
    conn.close()
    reopened = Store(path)
    try:
        with reopened.db.read() as conn2:
            names = {row[0] for row in conn2.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    finally:
        reopened.close()
    assert "sessions_by_outpost_phase" in names
    assert "sessions_by_outpost" not in names
