# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The event source devin.outposts.outpost_queue against the fleet simulator.

The source is loaded with runpy.run_path, as ansible-rulebook loads it, and its ``main`` runs in a background
task; every assertion is on the events it put on the queue, the cursor file it wrote, or its log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import stat
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from devin_outposts_sim.testing import SimHandle, sim_process

pytestmark = pytest.mark.asyncio

DOCUMENTED = {
    "type",
    "session_id",
    "outpost_id",
    "created_at",
    "updated_at",
    "kind",
    "platform",
    "remote_binary_sha",
    "network_policy",
    "phase",
    "session_status",
    "acceptor_id",
    "claim_deadline",
    "cursor",
    "entry",
}


def claim(url: str, token: str, session_id: str, acceptor: str) -> None:
    reply = httpx.post(
        f"{url}/opbeta/outposts/devins/{session_id}/claim",
        json={"acceptor_id": acceptor},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert reply.status_code == 200, reply.text


# --- options ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "no token"),
        ({"token": "a b"}, "whitespace"),
        ({"token": "t", "api_url": "ftp://x"}, "api_url must start with"),
        ({"token": "t", "phase": "running"}, "phase must be one of"),
        ({"token": "t", "phase": []}, "phase must be one of"),
        ({"token": "t", "outpost": "bad name!"}, "outpost must be an outpost id"),
        ({"token": "t", "backoff_initial": 10, "backoff_max": 5}, "backoff_max (5) must not be smaller"),
        ({"token": "t", "backoff_initial": 0}, "backoff_initial must be a number of at least"),
        ({"token": "t", "timeout": "soon"}, "timeout must be a number"),
        ({"token": "t", "queue_depth_interval": 0.5}, "queue_depth_interval must be 0 (off) or at least 1"),
        ({"token": "t", "validate_certs": "maybe"}, "validate_certs must be true or false"),
        (
            {"token": "t", "ca_path": "/nonexistent/ca.pem"},
            "ca_path /nonexistent/ca.pem is not a readable file",
        ),
        ({"token": "t", "outposts": "x"}, "unknown option(s) outposts"),
    ],
)
async def test_a_bad_option_is_refused_before_anything_is_sent(
    source: dict[str, Any], args: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEVIN_OUTPOSTS_TOKEN", raising=False)
    # An API that cannot answer: an option error must come before any request (which would hang or retry).
    args = {"api_url": "http://192.0.2.1:9", **args}
    with pytest.raises(source["OptionError"]) as info:
        await asyncio.wait_for(source["main"](asyncio.Queue(), args), 5)
    assert message in str(info.value)


async def test_connection_options_fall_back_to_the_environment(
    source: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVIN_API_URL", "https://fleet.example.test/opbeta/outposts/")
    monkeypatch.setenv("DEVIN_OUTPOSTS_TOKEN", "cog_from_env")
    options = source["Options"]({})
    assert (options.api_url, options.token, options.validate_certs, options.timeout) == (
        "https://fleet.example.test",
        "cog_from_env",
        True,
        30.0,
    )
    assert "cog_from_env" not in repr(options)
    monkeypatch.delenv("DEVIN_API_URL")
    assert source["Options"]({"token": "x"}).api_url == "https://api.devin.ai"


async def test_the_documented_defaults_are_the_defaults(source: dict[str, Any]) -> None:
    documented = yaml.safe_load(source["DOCUMENTATION"])["options"]
    options = source["Options"]({"token": "t"}, environ={})
    defaults = {name: spec["default"] for name, spec in documented.items() if "default" in spec}
    assert defaults == {name: getattr(options, name) for name in defaults}
    assert defaults["backoff_max"] == 5  # the worker's cap for its watch reconnects


# --- events -----------------------------------------------------------------------------------------------


async def test_a_queued_session_produces_one_event_with_the_documented_fields(
    sim: SimHandle, machine_token: str, collect: Any, watching: Any
) -> None:
    outpost = sim.admin.create_outpost("eda-one", "linux")
    events = collect({"api_url": sim.url, "token": machine_token, "queue_depth_interval": 0})
    await watching()  # the source follows the queue (a LISTED event cannot come: it is empty)
    entry = sim.admin.enqueue(outpost.outpost_id, remote_binary_sha="abc1234")
    got = await events.wait_for(lambda e: e.get("session_id") == entry.session_id)
    assert set(got) == DOCUMENTED
    assert got["type"] == "MODIFIED"
    assert (got["outpost_id"], got["phase"], got["session_status"], got["kind"], got["platform"]) == (
        outpost.outpost_id,
        "pending",
        "pending",
        "new",
        "linux",
    )
    assert got["remote_binary_sha"] == "abc1234"
    assert got["acceptor_id"] is None
    assert got["created_at"] == entry.metadata.created_at
    assert got["entry"]["metadata"]["session_id"] == entry.session_id
    assert got["cursor"]
    await asyncio.sleep(0.5)
    assert [e["session_id"] for e in events.changes()] == [entry.session_id]


async def test_sessions_queued_before_the_start_are_listed(
    sim: SimHandle, machine_token: str, collect: Any, watching: Any
) -> None:
    outpost = sim.admin.create_outpost("eda-listed", "linux")
    before = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(3)]
    events = collect({"api_url": sim.url, "token": machine_token, "queue_depth_interval": 0})
    for sid in before:
        got = await events.wait_for(lambda e, sid=sid: e.get("session_id") == sid)
        assert got["type"] == "LISTED"
    after = sim.admin.enqueue(outpost.outpost_id).session_id
    await events.wait_for(lambda e: e.get("session_id") == after and e["type"] == "MODIFIED")
    assert sorted(e["session_id"] for e in events.changes()) == sorted([*before, after])

    quiet = collect(
        {"api_url": sim.url, "token": machine_token, "queue_depth_interval": 0, "emit_listed": False}
    )
    await watching(2)
    last = sim.admin.enqueue(outpost.outpost_id).session_id
    await quiet.wait_for(lambda e: e.get("session_id") == last)
    assert [e["session_id"] for e in quiet.changes()] == [last]


async def test_the_outpost_filter_takes_a_name_or_an_id(
    sim: SimHandle, machine_token: str, collect: Any, watching: Any
) -> None:
    mine = sim.admin.create_outpost("eda-mine", "linux")
    other = sim.admin.create_outpost("eda-other", "linux")
    by_name = collect(
        {"api_url": sim.url, "token": machine_token, "outpost": "eda-mine", "queue_depth_interval": 0}
    )
    by_id = collect(
        {"api_url": sim.url, "token": machine_token, "outpost": mine.outpost_id, "queue_depth_interval": 0}
    )
    await watching(2)
    noise = sim.admin.enqueue(other.outpost_id).session_id
    wanted = sim.admin.enqueue(mine.outpost_id).session_id
    for events in (by_name, by_id):
        await events.wait_for(lambda e: e.get("session_id") == wanted)
    # The noise came first: had a filter let it through, it would be collected by now.
    for events in (by_name, by_id):
        assert noise not in [e["session_id"] for e in events.changes()]
        assert {e["outpost_id"] for e in events.changes()} == {mine.outpost_id}


async def test_an_unknown_outpost_stops_the_source_with_an_error(
    source: dict[str, Any], sim: SimHandle, machine_token: str
) -> None:
    args = {"api_url": sim.url, "token": machine_token, "outpost": "no-such-outpost"}
    with pytest.raises(source["OptionError"], match="outpost no-such-outpost is not among the account's"):
        await asyncio.wait_for(source["main"](asyncio.Queue(), args), 10)


async def test_a_refused_token_stops_the_source(source: dict[str, Any], sim: SimHandle) -> None:
    args = {"api_url": sim.url, "token": "cog_not_a_token"}
    with pytest.raises(source["FleetError"], match="401"):
        await asyncio.wait_for(source["main"](asyncio.Queue(), args), 10)


async def test_the_phase_filter(sim: SimHandle, machine_token: str, collect: Any, watching: Any) -> None:
    outpost = sim.admin.create_outpost("eda-phase", "linux")
    pending = collect(
        {"api_url": sim.url, "token": machine_token, "phase": "pending", "queue_depth_interval": 0}
    )
    claimed = collect(
        {"api_url": sim.url, "token": machine_token, "phase": ["claimed"], "queue_depth_interval": 0}
    )
    everything = collect({"api_url": sim.url, "token": machine_token, "queue_depth_interval": 0})
    await watching(3)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    await pending.wait_for(lambda e: e.get("session_id") == sid)
    claim(sim.url, machine_token, sid, "eda-test")
    got = await claimed.wait_for(lambda e: e.get("session_id") == sid)
    assert (got["phase"], got["acceptor_id"]) == ("claimed", "eda-test")
    assert "connect_token" not in got["entry"]["status"]
    await everything.wait_for(lambda e: e.get("session_id") == sid and e["phase"] == "claimed")
    assert [e["phase"] for e in everything.changes()] == ["pending", "claimed"]
    assert [e["phase"] for e in pending.changes()] == ["pending"]
    assert [e["phase"] for e in claimed.changes()] == ["claimed"]


async def test_queue_depth_says_how_many_wait_and_how_long(
    sim: SimHandle, machine_token: str, collect: Any
) -> None:
    outpost = sim.admin.create_outpost("eda-depth", "linux")
    first = sim.admin.enqueue(outpost.outpost_id)
    second = sim.admin.enqueue(outpost.outpost_id)
    events = collect(
        {"api_url": sim.url, "token": machine_token, "outpost": "eda-depth", "queue_depth_interval": 1}
    )
    got = await events.wait_for(lambda e: e["type"] == "queue_depth" and e["oldest_wait_seconds"] >= 1)
    assert (got["outpost_id"], got["outpost_name"], got["pending"], got["claimed"]) == (
        outpost.outpost_id,
        "eda-depth",
        2,
        0,
    )
    # Oldest first, as workers claim: created_at (whole seconds), then the session id.
    oldest = min((first, second), key=lambda e: (e.metadata.created_at, e.session_id))
    assert got["oldest_pending_session_id"] == oldest.session_id
    assert got["idle_seconds"] == 0
    for entry in (first, second):
        claim(sim.url, machine_token, entry.session_id, "eda-depth-worker")
    got = await events.wait_for(
        lambda e: e["type"] == "queue_depth" and e["claimed"] == 2 and e["idle_seconds"] >= 1
    )
    assert (got["pending"], got["oldest_pending_session_id"], got["oldest_wait_seconds"]) == (0, None, 0.0)


# --- reconnects and the cursor ----------------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_a_simulator_restart_loses_and_repeats_no_event(tmp_path: Path, collect: Any) -> None:
    cursor_file = tmp_path / "state" / "queue.cursor"
    with sim_process(tmp_path / "sim.db", keepalive_interval=1.0) as server:
        token = server.create_token("machine")
        outpost = server.admin.create_outpost("eda-restart", "linux")
        args = {
            "api_url": server.url,
            "token": token,
            "cursor_file": str(cursor_file),
            "queue_depth_interval": 0,
            "backoff_initial": 0.2,
            "backoff_max": 1.0,
        }
        events = collect(args)
        while not cursor_file.exists():  # written after the first list: changes from here on are watched
            await asyncio.sleep(0.05)
        before = [server.admin.enqueue(outpost.outpost_id).session_id for dummy in range(3)]
        await events.wait_for(lambda e: e.get("session_id") == before[-1])
        stored_before = json.loads(cursor_file.read_text())["cursor"]
        assert stored_before == events.changes()[-1]["cursor"]

        server.restart()  # SIGTERM, then the same database and port
        after = [server.admin.enqueue(outpost.outpost_id).session_id for dummy in range(3)]
        await events.wait_for(lambda e: e.get("session_id") == after[-1], timeout=60)
        await asyncio.sleep(1.5)  # room for a repeat to show up, if the source repeated the replayed row
        changes = events.changes()
        cursors = [e["cursor"] for e in changes]
        assert [e["session_id"] for e in changes] == before + after
        assert len(set(cursors)) == len(cursors), cursors
        assert json.loads(cursor_file.read_text())["cursor"] == cursors[-1]
        await events.stop()

        # The rulebook itself restarts: what was queued while it was down comes, nothing before it again.
        down = server.admin.enqueue(outpost.outpost_id).session_id
        again = collect(args)
        await again.wait_for(lambda e: e.get("session_id") == down)
        await asyncio.sleep(1.0)
        assert [(e["session_id"], e["type"]) for e in again.changes()] == [(down, "MODIFIED")]
        assert again.changes()[0]["cursor"] not in cursors


async def test_the_cursor_file_is_private_and_written_whole(
    sim: SimHandle, machine_token: str, collect: Any, watching: Any, tmp_path: Path
) -> None:
    cursor_file = tmp_path / "eda" / "cursor.json"
    outpost = sim.admin.create_outpost("eda-file", "linux")
    events = collect(
        {
            "api_url": sim.url,
            "token": machine_token,
            "cursor_file": str(cursor_file),
            "queue_depth_interval": 0,
        }
    )
    await watching()
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    got = await events.wait_for(lambda e: e.get("session_id") == sid)
    data = json.loads(cursor_file.read_text())
    assert (data["cursor"], data["api_url"], data["outpost_id"]) == (got["cursor"], sim.url, None)
    assert stat.S_IMODE(cursor_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(cursor_file.parent.stat().st_mode) == 0o700
    assert [p.name for p in cursor_file.parent.iterdir()] == ["cursor.json"]  # no temporary file left
    assert machine_token not in cursor_file.read_text()


async def test_the_token_is_in_no_log_line_and_no_event(
    tmp_path: Path, collect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with sim_process(tmp_path / "sim.db", keepalive_interval=1.0) as server:
        token = server.create_token("machine")
        outpost = server.admin.create_outpost("eda-secret", "linux")
        events = collect(
            {
                "api_url": server.url,
                "token": token,
                "queue_depth_interval": 1,
                "backoff_initial": 0.2,
                "backoff_max": 0.5,
            }
        )
        sid = server.admin.enqueue(outpost.outpost_id).session_id
        await events.wait_for(lambda e: e.get("session_id") == sid)
        server.stop()  # the source now logs its failed reconnects
        await asyncio.sleep(2.0)
        server.start()
        later = server.admin.enqueue(outpost.outpost_id).session_id
        await events.wait_for(lambda e: e.get("session_id") == later, timeout=60)
    assert "reconnecting in" in caplog.text  # the failures were logged ...
    assert token not in caplog.text  # ... without the token
    assert token not in json.dumps(events.events)


async def test_a_refused_stored_cursor_starts_over_from_a_list(
    sim: SimHandle, machine_token: str, collect: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outpost = sim.admin.create_outpost("eda-stale", "linux")
    waiting = sim.admin.enqueue(outpost.outpost_id).session_id
    cursor_file = tmp_path / "cursor.json"
    cursor_file.write_text(
        json.dumps({"version": 1, "api_url": sim.url, "outpost_id": None, "cursor": "not-a-cursor", "seen": []})
    )
    events = collect(
        {"api_url": sim.url, "token": machine_token, "cursor_file": str(cursor_file), "queue_depth_interval": 0}
    )
    got = await events.wait_for(lambda e: e.get("session_id") == waiting)
    assert got["type"] == "LISTED"
    assert "422" in caplog.text and "listing the queue again" in caplog.text
    assert json.loads(cursor_file.read_text())["cursor"] not in (None, "not-a-cursor")
