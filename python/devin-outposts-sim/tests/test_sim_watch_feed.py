"""The shared watch feed: each change is read and serialised once for every open stream, and a stream
that falls behind the feed's window, or connects while the feed sleeps, still gets every change."""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from typing import Any, Callable

import pytest

from devin_outposts_sim.http import watch as watch_module
from devin_outposts_sim.http.watch import ChangeFeed, Notifier, watch_stream
from devin_outposts_sim.state.store import Store
from devin_outposts_sim.testing import SimHandle

ACCT = "acct-default"


def _sid(event: dict[str, Any]) -> str:
    return str(event["object"]["metadata"]["session_id"])


def test_one_serialisation_per_change_whatever_the_number_of_streams(
    make_sim: Any, watch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle: SimHandle = make_sim()
    token = handle.create_token("machine")
    oid = handle.admin.create_outpost("feed", "linux").outpost_id
    cursor = handle.admin.session(handle.admin.enqueue(oid).session_id)["cursor"]
    with ExitStack() as stack:
        streams = [stack.enter_context(watch(token, handle=handle, cursor=cursor)) for dummy in range(10)]
        warm = handle.admin.enqueue(oid).session_id  # every stream is following the feed after this
        for stream in streams:
            stream.until(lambda e: _sid(e) == warm)
        calls: list[dict[str, object]] = []
        original: Callable[[dict[str, object]], str] = watch_module.format_event
        monkeypatch.setattr(
            watch_module, "format_event", lambda payload: calls.append(payload) or original(payload)
        )
        sid = handle.admin.enqueue(oid).session_id
        received = [stream.until(lambda e: _sid(e) == sid)[-1] for stream in streams]
    assert len({json.dumps(event, sort_keys=True) for event in received}) == 1  # the same bytes for all
    assert [_sid(payload) for payload in calls] == [sid]  # serialised once, not once per stream


async def _next_event(stream: Any) -> dict[str, Any]:
    chunk: bytes = await asyncio.wait_for(stream.__anext__(), 10)
    assert chunk.startswith(b"data: "), chunk
    event: dict[str, Any] = json.loads(chunk[len(b"data: ") :])
    return event


async def _fed(store: Store, feed: ChangeFeed) -> None:
    """Wait until the feed has read everything committed so far."""
    feed.kick()  # as the next commit would: a feed that slept until a stream opened catches up
    for dummy in range(500):
        if feed.synced and feed.head >= store.db.last_rev:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the feed never caught up")


def test_a_stream_behind_the_feed_window_reads_its_backlog_from_sqlite() -> None:
    async def scenario() -> None:
        store = Store(":memory:")
        oid = store.accounts.create_outpost(ACCT, "window").outpost_id
        notifier = Notifier(asyncio.get_running_loop())
        feed = ChangeFeed(store, notifier, window=3)
        store.db.add_listener(feed.notify)
        stream = watch_stream(
            store, notifier, feed, account_id=ACCT, outpost=oid, cursor=store.queue.head_cursor(),
            max_duration=60, keepalive_interval=60,
        )  # fmt: skip
        first = store.queue.enqueue(oid).session_id
        assert _sid(await _next_event(stream)) == first
        await _fed(store, feed)
        # The stream is not read while ten more changes come; the feed keeps only the last three.
        later = [store.queue.enqueue(oid).session_id for dummy in range(10)]
        await _fed(store, feed)
        assert len(feed.events) == 3
        got = [_sid(await _next_event(stream)) for dummy in later]
        assert got == later
        notifier.close()
        await stream.aclose()
        store.close()

    asyncio.run(scenario())


def test_the_feed_sleeps_without_streams_and_a_new_stream_misses_nothing() -> None:
    async def scenario() -> None:
        store = Store(":memory:")
        oid = store.accounts.create_outpost(ACCT, "sleep").outpost_id
        notifier = Notifier(asyncio.get_running_loop())
        feed = ChangeFeed(store, notifier)
        store.db.add_listener(feed.notify)
        first = watch_stream(
            store, notifier, feed, account_id=ACCT, outpost=None, cursor=store.queue.head_cursor(),
            max_duration=60, keepalive_interval=60,
        )  # fmt: skip
        a = store.queue.enqueue(oid).session_id
        assert _sid(await _next_event(first)) == a
        await first.aclose()  # no stream is open now
        cursor = store.queue.head_cursor()
        b = store.queue.enqueue(oid).session_id
        await asyncio.sleep(0.05)
        assert not feed.synced  # it read nothing for nobody
        second = watch_stream(
            store, notifier, feed, account_id=ACCT, outpost=None, cursor=cursor,
            max_duration=60, keepalive_interval=60,
        )  # fmt: skip
        assert _sid(await _next_event(second)) == b  # the backlog, from SQLite
        c = store.queue.enqueue(oid).session_id
        assert _sid(await _next_event(second)) == c
        await _fed(store, feed)  # the feed is back
        d = store.queue.enqueue(oid).session_id
        await _fed(store, feed)
        assert [event.session_id for event in feed.events][-1:] == [d]
        assert _sid(await _next_event(second)) == d
        notifier.close()
        await second.aclose()
        store.close()

    asyncio.run(scenario())
