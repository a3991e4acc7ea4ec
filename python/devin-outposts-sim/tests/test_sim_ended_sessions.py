"""Ended sessions leave the queue: a session that is ``suspended`` or ``terminated`` is tombstoned
``tombstone_after`` seconds after its end (watchers get ``DELETED``; ``GET``, claim and release answer 404).

Contract 3.4: "Released suspended/terminated sessions leave phase=pending rows behind until an upstream
sweeper tombstones them (DELETED)". Without the sweep, a client that claims every pending row (the Vercel
sandbox orchestrator does: claim, spawn, exit 0, release) claimed one ended session over and over, forever
(issue 24, point 23).
"""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest
from sim_support import SteppingClock

from devin_outposts.api.models import QueueEntry
from devin_outposts_sim.state.store import Store
from devin_outposts_sim.testing import SimHandle, claim_session, sim_process, standin_process

QUEUE = "/opbeta/outposts/devins"
ACCT = "acct-default"


def _store(tombstone_after: Any = 60.0) -> tuple[Store, SteppingClock, str]:
    clock = SteppingClock(1_781_050_000.0)
    store = Store(":memory:", clock=clock, tombstone_after=tombstone_after)
    outpost_id = store.accounts.create_outpost(ACCT, "ended").outpost_id
    return store, clock, outpost_id


def _actions(store: Store, sid: str) -> list[str]:
    return [r["action"] for r in store.records.claim_history(session_id=sid)]


def _gone(store: Store, sid: str) -> bool:
    """GET, claim and release of ``sid`` all answer 404, and its last change is a tombstone."""
    from devin_outposts_sim.errors import NotFound

    for attempt in (
        lambda: store.queue.get_entry(ACCT, sid),
        lambda: store.queue.claim(ACCT, sid, "w9", ttl=30, gateway_url="ws://g"),
        lambda: store.queue.release(ACCT, sid, "w9"),
    ):
        with pytest.raises(NotFound):
            attempt()
    [change] = [c for c in store.queue.changes_since(ACCT) if c.session_id == sid]
    return change.deleted


# --- the rule, on a clock the test moves ----------------------------------------------------------------


@pytest.mark.parametrize("status", ["terminated", "suspended"])
def test_a_released_ended_session_is_tombstoned_once_the_delay_after_its_end_has_passed(status: str) -> None:
    store, clock, outpost_id = _store(60.0)
    sid = store.queue.enqueue(outpost_id).session_id
    token = store.queue.claim(ACCT, sid, "w1", ttl=300, gateway_url="ws://g").connect_token_value() or ""
    store.gateway.remote_connect(sid, token, {"pid": 1})
    clock.now += 5
    store.gateway.end_session(sid, status)  # the end: the delay counts from here
    clock.now += 2
    store.queue.release(ACCT, sid, "w1")
    clock.now += 57.5  # 59.5 s after the end: still there, a pending row of an ended session
    assert store.queue.expire_claims() == 0
    entry = store.queue.get_entry(ACCT, sid)
    assert (entry.status.phase, entry.status.session_status) == ("pending", status)
    assert store.records.admin_sessions(session_id=sid)[0]["tombstone_at"] == pytest.approx(clock.now + 0.5)
    clock.now += 0.5  # 60 s after the end
    assert _gone(store, sid)
    assert _actions(store, sid) == ["claim", "release"]  # no claim was held: nothing more recorded
    [row] = store.records.admin_sessions(session_id=sid, include_deleted=True)
    assert row["deleted"] is True
    assert row["entry"]["status"]["session_status"] == status  # DELETED carries the last state
    store.close()


def test_every_request_applies_a_due_tombstone_first_so_no_answer_shows_the_row() -> None:
    store, clock, outpost_id = _store(10.0)
    sid = store.queue.enqueue(outpost_id, session_status="terminated").session_id  # ended at enqueue
    other = store.queue.enqueue(outpost_id).session_id
    clock.now += 10
    # No sweep has run: the list, its total and a claim already see the tombstone.
    page = store.queue.list_entries(ACCT, first=10, outpost=outpost_id)
    assert [e.session_id for e in page.items] == [other]
    assert page.total == 1
    assert _gone(store, sid)
    store.close()


def test_a_claimed_ended_session_is_tombstoned_too_and_its_holder_gets_404_on_release() -> None:
    store, clock, outpost_id = _store(30.0)
    sid = store.queue.enqueue(outpost_id).session_id
    store.queue.claim(ACCT, sid, "w1", ttl=300, gateway_url="ws://g")
    store.queue.set_session_status(sid, "running")
    store.queue.set_session_status(sid, "terminated")
    clock.now += 30  # within the end grace of the claim, but the session ended 30 s ago
    assert _gone(store, sid)  # release answers 404, which the contract says to treat as released
    history = store.records.claim_history(session_id=sid)
    assert [r["action"] for r in history] == ["claim", "tombstone"]
    assert "ended" in history[-1]["reason"]
    store.close()


def test_a_session_that_runs_again_is_not_tombstoned() -> None:
    store, clock, outpost_id = _store(10.0)
    sid = store.queue.enqueue(outpost_id).session_id
    store.queue.set_session_status(sid, "suspended")
    clock.now += 5
    store.queue.set_session_status(sid, "running")  # woken up before the sweep
    clock.now += 3600
    assert store.queue.get_entry(ACCT, sid).status.session_status == "running"
    assert store.records.admin_sessions(session_id=sid)[0]["tombstone_at"] is None
    store.queue.set_session_status(sid, "terminated")  # a new end: the delay counts from here
    clock.now += 9.9
    assert store.queue.get_entry(ACCT, sid).status.session_status == "terminated"
    clock.now += 0.1
    assert _gone(store, sid)
    store.close()


def test_a_suspended_then_terminated_session_counts_from_its_first_end() -> None:
    store, clock, outpost_id = _store(10.0)
    sid = store.queue.enqueue(outpost_id).session_id
    store.queue.set_session_status(sid, "suspended")
    clock.now += 6
    store.queue.set_session_status(sid, "terminated")
    clock.now += 4
    assert _gone(store, sid)
    store.close()


def test_a_resume_entry_may_be_queued_once_the_suspended_entry_is_gone() -> None:
    store, clock, outpost_id = _store(10.0)
    sid = store.queue.enqueue(outpost_id).session_id
    store.queue.set_session_status(sid, "suspended")
    clock.now += 10  # no sweep has run: the enqueue applies the due tombstone first
    resumed = store.queue.enqueue(outpost_id, sid, kind="resume")
    assert (resumed.spec.kind, resumed.status.session_status) == ("resume", "pending")
    clock.now += 3600  # the new entry has not ended: it stays
    assert store.queue.get_entry(ACCT, sid).spec.kind == "resume"
    store.close()


def test_without_a_delay_ended_sessions_stay() -> None:
    store, clock, outpost_id = _store(None)
    sid = store.queue.enqueue(outpost_id, session_status="terminated").session_id
    clock.now += 10 * 365 * 86400
    assert store.queue.get_entry(ACCT, sid).status.session_status == "terminated"
    assert store.records.admin_sessions(session_id=sid)[0]["tombstone_at"] is None
    store.close()


def test_the_delay_can_be_changed_while_running_and_applies_to_sessions_already_ended() -> None:
    store, clock, outpost_id = _store(3600.0)
    sid = store.queue.enqueue(outpost_id, session_status="terminated").session_id
    clock.now += 20
    assert store.queue.get_entry(ACCT, sid)
    store.db.tombstone_after = 15.0
    assert _gone(store, sid)
    store.close()


def test_the_end_time_survives_a_restart(tmp_path: Path) -> None:
    clock = SteppingClock(1_781_050_000.0)
    path = str(tmp_path / "sim.db")
    store = Store(path, clock=clock, tombstone_after=60.0)
    outpost_id = store.accounts.create_outpost(ACCT, "restart").outpost_id
    sid = store.queue.enqueue(outpost_id).session_id
    store.queue.set_session_status(sid, "terminated")
    store.close()
    clock.now += 60
    reopened = Store(path, clock=clock, tombstone_after=60.0)
    assert _gone(reopened, sid)
    reopened.close()


@pytest.mark.parametrize("bad", [0, -1, math.nan, "x", True])
def test_the_delay_must_be_a_positive_number_of_seconds_or_none(bad: Any) -> None:
    with pytest.raises(ValueError, match="tombstone_after"):
        Store(":memory:", tombstone_after=bad)


# --- over HTTP, with real processes -----------------------------------------------------------------


def _serve_once(handle: SimHandle, token: str, sid: str, workdir: Path, state: Path) -> Optional[int]:
    """One turn of a client like the Vercel one: claim, run the remote until it exits, release. None when
    the claim is refused with 404 (the session was tombstoned between the list and the claim)."""
    try:
        claimed: QueueEntry = claim_session(handle.url, token, sid, "vercel-like")
    except httpx.HTTPStatusError as exc:
        if exc.response.status_code != 404:
            raise
        return None
    with standin_process(workdir, claimed, state_dir=state) as remote:
        code = remote.wait(30)
    released = httpx.post(
        f"{handle.url}{QUEUE}/{sid}/release",
        json={"acceptor_id": "vercel-like"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert released.status_code in (200, 404), released.text  # 404: tombstoned meanwhile (released)
    return code


def test_a_client_that_claims_every_pending_row_stops_serving_an_ended_session_once_it_is_tombstoned(
    make_sim: Any, watch: Any, tmp_path: Path
) -> None:
    handle: SimHandle = make_sim(tombstone_after=2.0, sweep_interval=0.05, watch_max_duration=120)
    token = handle.create_token("machine")
    outpost_id = handle.admin.create_outpost("vercel", "linux").outpost_id
    client = httpx.Client(base_url=handle.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    sid = handle.admin.enqueue(outpost_id).session_id
    cursor = client.get(QUEUE, params={"outpost": outpost_id}).json()["cursor"]
    workdir = tmp_path / "work"
    workdir.mkdir()
    with watch(token, handle=handle, outpost=outpost_id, cursor=cursor) as stream:
        # The session is served once and ended by the brain while its remote runs.
        claimed = claim_session(handle.url, token, sid, "vercel-like")
        with standin_process(workdir, claimed, state_dir=tmp_path / "state") as remote:
            handle.admin.wait_connection(sid, timeout=20)
            handle.admin.end_session(sid, "terminated")
            assert remote.wait(30) == 0, remote.stderr
        client.post(f"{QUEUE}/{sid}/release", json={"acceptor_id": "vercel-like"})
        # The client keeps claiming every pending row, as the Vercel one does, until none is left.
        turns = 0
        while True:
            pending = client.get(QUEUE, params={"outpost": outpost_id, "phase": "pending"}).json()["items"]
            if not pending:
                break
            assert turns < 200, f"the ended session is still pending after {turns} more claims"
            assert [e["metadata"]["session_id"] for e in pending] == [sid]
            assert pending[0]["status"]["session_status"] == "terminated"
            assert _serve_once(handle, token, sid, workdir, tmp_path / "state") in (0, None)
            turns += 1
        deleted = stream.until(lambda e: e["type"] == "DELETED")[-1]
    assert deleted["object"]["metadata"]["session_id"] == sid
    assert deleted["object"]["status"]["session_status"] == "terminated"
    assert client.get(f"{QUEUE}/{sid}").status_code == 404
    claims = [r for r in handle.admin.claims(session_id=sid) if r["action"] == "claim"]
    for dummy in range(3):  # the client's next turns find nothing, and a direct claim is 404
        assert client.get(QUEUE, params={"outpost": outpost_id, "phase": "pending"}).json()["items"] == []
        again = client.post(f"{QUEUE}/{sid}/claim", json={"acceptor_id": "vercel-like"})
        assert again.status_code == 404
        assert again.json() == {"detail": "Session not found in queue"}
    assert [r for r in handle.admin.claims(session_id=sid) if r["action"] == "claim"] == claims
    assert handle.admin.session(sid)["deleted"] is True
    client.close()


def test_the_admin_api_sets_the_delay_and_a_reset_restores_the_configured_one(make_sim: Any) -> None:
    handle: SimHandle = make_sim(tombstone_after=3600.0)
    assert handle.admin.config()["tombstone_after"] == 3600.0
    assert handle.admin.set_tombstone_after(0.5)["tombstone_after"] == 0.5
    outpost_id = handle.admin.create_outpost("o").outpost_id
    sid = handle.admin.enqueue(outpost_id, session_status="terminated").session_id
    time.sleep(0.6)
    assert handle.admin.session(sid)["deleted"] is True
    assert handle.admin.set_tombstone_after(None)["tombstone_after"] is None
    handle.admin.reset()
    assert handle.admin.config()["tombstone_after"] == 3600.0


@pytest.mark.parametrize("bad", [0, -2, "soon", True, [1]])
def test_the_admin_api_refuses_a_bad_delay(make_sim: Any, bad: Any) -> None:
    from devin_outposts_sim.admin_client import SimAdminError

    handle: SimHandle = make_sim()
    with pytest.raises(SimAdminError) as raised:
        handle.admin.set_tombstone_after(bad)
    assert raised.value.status == 422
    assert "tombstone_after" in raised.value.detail


def test_sim_serve_takes_the_delay_from_its_flag_and_its_environment(tmp_path: Path) -> None:
    with sim_process(tmp_path / "a.db", tombstone_after=1.5) as proc:
        assert proc.admin.config()["tombstone_after"] == 1.5
    with sim_process(tmp_path / "b.db", env={"DEVIN_SIM_TOMBSTONE_AFTER": "never"}) as proc:
        assert proc.admin.config()["tombstone_after"] is None
    with sim_process(tmp_path / "c.db") as proc:
        assert proc.admin.config()["tombstone_after"] == 60.0
    for value in ("0", "-1", "soon", "nan"):
        argv = ["serve", "--db", ":memory:", "--tombstone-after", value]
        bad = subprocess.run(
            [sys.executable, "-m", "devin_outposts_sim", *argv],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert bad.returncode == 2, (value, bad.stderr)
        assert "tombstone" in bad.stderr


# --- a database of schema version 3 ---------------------------------------------------------------

SCHEMA_3_SESSIONS = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY, account_id TEXT NOT NULL, outpost_id TEXT NOT NULL,
    kind TEXT NOT NULL, platform TEXT, remote_binary_sha TEXT, network_policy TEXT,
    phase TEXT NOT NULL, acceptor_id TEXT, claim_deadline REAL, claim_chain INTEGER,
    session_status TEXT NOT NULL, created_at REAL NOT NULL, rev REAL NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0, claim_ttl REAL, ending_status TEXT, ending_at REAL);
CREATE TABLE connect_tokens (
    token_hash TEXT PRIMARY KEY, session_id TEXT NOT NULL, acceptor_id TEXT NOT NULL,
    chain INTEGER NOT NULL, issued_at REAL NOT NULL, revoked_at REAL, revoked_reason TEXT);
INSERT INTO meta VALUES ('schema_version', '3'), ('last_rev', '1000.5');
INSERT INTO sessions
    (session_id, account_id, outpost_id, kind, platform, phase, session_status, created_at, rev)
VALUES
    ('devin-ended', 'acct-default', 'outpost_env-x', 'new', 'linux', 'pending', 'terminated', 900, 1000.0),
    ('devin-running', 'acct-default', 'outpost_env-x', 'new', 'linux', 'pending', 'running', 900, 1000.5);
"""


def test_an_older_database_counts_a_session_that_had_ended_as_ended_at_its_last_change(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v3.db"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_3_SESSIONS)
    conn.close()
    clock = SteppingClock(1059.0)
    store = Store(str(path), clock=clock, tombstone_after=60.0)
    try:
        [ended] = store.records.admin_sessions(session_id="devin-ended")
        assert (ended["ended_at"], ended["tombstone_at"]) == (1000.0, 1060.0)
        assert store.queue.get_entry(ACCT, "devin-ended").status.session_status == "terminated"
        clock.now = 1060.0
        assert _gone(store, "devin-ended")
        clock.now = 1_781_050_000.0
        assert store.queue.get_entry(ACCT, "devin-running").status.session_status == "running"
    finally:
        store.close()
