"""Unit tests of the async fleet client against scripted HTTP answers (httpx.MockTransport).

These pin the exact requests the client sends and how it reads answers: auth header, paths, query
parameters, retries, both pagination envelopes, SSE parsing and error mapping. The same client is also
exercised against the live simulator in ``test_client_sim.py``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, Callable

import httpx
import pytest

from devin_outposts.api.client import FleetClient, normalize_api_url
from devin_outposts.api.errors import (
    FleetAuthError,
    FleetConflict,
    FleetConnectionError,
    FleetInvalid,
    FleetNotFound,
    FleetProtocolError,
    FleetServerError,
)
from devin_outposts.api.models import Phase, SessionStatus

TOKEN = "cog_unit_test_token_value"


def entry(session_id: str, updated_at: int = 1781050000, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "session_id": session_id,
            "outpost_id": "outpost_env-1",
            "created_at": 1781050000,
            "updated_at": updated_at,
        },
        "spec": {"kind": "new", "platform": "linux", "remote_binary_sha": None},
        "status": {
            "phase": "pending",
            "acceptor_id": None,
            "claim_deadline": None,
            "session_status": "pending",
            **status,
        },
    }


def outpost(outpost_id: str, name: str) -> dict[str, Any]:
    return {
        "metadata": {"outpost_id": outpost_id, "account_id": "acct", "created_at": 1781050000},
        "spec": {"name": name, "platform": "linux", "description": None},
        "status": {"queue_depth": 0, "active_claims": 0},
    }


class Recorder:
    """A MockTransport handler that answers from a script and records every request."""

    def __init__(self, answers: list[httpx.Response | Callable[[httpx.Request], httpx.Response]]):
        self.answers: Iterator[Any] = iter(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = next(self.answers)
        return answer(request) if callable(answer) else answer


def make_client(recorder: Recorder, **kwargs: Any) -> FleetClient:
    kwargs.setdefault("backoff_base", 0.0)
    return FleetClient("https://api.example.test/", TOKEN, transport=httpx.MockTransport(recorder), **kwargs)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("https://api.devin.ai", "https://api.devin.ai"),
        ("https://api.devin.ai/", "https://api.devin.ai"),
        ("https://api.devin.ai/opbeta/outposts/", "https://api.devin.ai"),
        ("http://127.0.0.1:8787/opbeta", "http://127.0.0.1:8787"),
    ],
)
def test_normalize_api_url(given: str, expected: str) -> None:
    assert normalize_api_url(given) == expected


def test_normalize_api_url_rejects_other_schemes() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        normalize_api_url("ftp://api.devin.ai")


def test_list_sends_auth_and_filters() -> None:
    page_one = {"items": [entry("devin-1")], "cursor": "c1", "has_next_page": False}
    rec = Recorder([httpx.Response(200, json=page_one)])

    async def go() -> Any:
        async with make_client(rec) as client:
            return await client.list_devins(outpost="outpost_env-1", phase="pending", first=50)

    page = run(go())
    request = rec.requests[0]
    assert request.method == "GET"
    assert request.url.path == "/opbeta/outposts/devins"
    assert dict(request.url.params) == {"outpost": "outpost_env-1", "phase": "pending", "first": "50"}
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert page.items[0].session_id == "devin-1"
    assert page.cursor == "c1"


def test_list_rejects_page_size_out_of_range() -> None:
    rec = Recorder([])

    async def go() -> None:
        async with make_client(rec) as client:
            await client.list_devins(first=201)

    with pytest.raises(ValueError, match="between 1 and 200"):
        run(go())
    assert rec.requests == []


def test_list_all_follows_cursor_and_upserts_boundary_rows() -> None:
    rec = Recorder(
        [
            httpx.Response(
                200,
                json={
                    "items": [entry("devin-a"), entry("devin-b", session_status="pending")],
                    "cursor": "c1",
                    "has_next_page": True,
                },
            ),
            httpx.Response(
                200,
                json={
                    "items": [entry("devin-b", 1781050005, session_status="running"), entry("devin-c")],
                    "cursor": "c2",
                    "has_next_page": False,
                },
            ),
        ]
    )

    async def go() -> Any:
        async with make_client(rec) as client:
            return await client.list_all_devins(outpost="outpost_env-1", first=2)

    entries, cursor = run(go())
    assert [e.session_id for e in entries] == ["devin-a", "devin-b", "devin-c"]
    assert entries[1].status.session_status is SessionStatus.RUNNING  # the later copy wins
    assert cursor == "c2"
    assert "cursor" not in rec.requests[0].url.params
    assert rec.requests[1].url.params["cursor"] == "c1"


def test_list_all_refuses_a_cursor_that_does_not_advance() -> None:
    page = {"items": [entry("devin-a")], "cursor": "same", "has_next_page": True}
    rec = Recorder([httpx.Response(200, json=page), httpx.Response(200, json=page)])

    async def go() -> None:
        async with make_client(rec) as client:
            await client.list_all_devins()

    with pytest.raises(FleetProtocolError, match="did not advance"):
        run(go())


def test_list_all_outposts_follows_end_cursor() -> None:
    rec = Recorder(
        [
            httpx.Response(
                200,
                json={
                    "items": [outpost("outpost_env-1", "a")],
                    "end_cursor": "e1",
                    "has_next_page": True,
                    "total": 2,
                },
            ),
            httpx.Response(
                200,
                json={
                    "items": [outpost("outpost_env-2", "b")],
                    "end_cursor": "e2",
                    "has_next_page": False,
                    "total": 2,
                },
            ),
        ]
    )

    async def go() -> Any:
        async with make_client(rec) as client:
            return await client.list_all_outposts()

    found = run(go())
    assert [o.name for o in found] == ["a", "b"]
    assert rec.requests[0].url.path == "/opbeta/outposts/outposts"
    assert "after" not in rec.requests[0].url.params
    assert rec.requests[1].url.params["after"] == "e1"


def test_claim_posts_acceptor_and_keeps_token_secret() -> None:
    claimed = entry(
        "devin-1",
        phase="claimed",
        acceptor_id="w1",
        claim_deadline=1781050300,
        connect_token="ct_secret_value",
        gateway_url="wss://gw.example.test",
    )
    rec = Recorder([httpx.Response(200, json=claimed)])

    async def go() -> Any:
        async with make_client(rec) as client:
            return await client.claim("devin-1", "w1")

    result = run(go())
    request = rec.requests[0]
    assert request.method == "POST"
    assert request.url.path == "/opbeta/outposts/devins/devin-1/claim"
    assert json.loads(request.content) == {"acceptor_id": "w1"}
    assert request.headers["Content-Type"] == "application/json"
    assert result.status.phase is Phase.CLAIMED
    assert result.connect_token_value() == "ct_secret_value"
    assert "ct_secret_value" not in repr(result)


def test_hostile_session_id_stays_one_path_segment() -> None:
    rec = Recorder([httpx.Response(404, json={"detail": "Session not found in queue"})])

    async def go() -> None:
        async with make_client(rec) as client:
            await client.get_devin("../../outposts/x?y=1")

    with pytest.raises(FleetNotFound):
        run(go())
    assert rec.requests[0].url.raw_path.startswith(b"/opbeta/outposts/devins/..%2F..%2Foutposts%2Fx%3Fy%3D1")


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, FleetAuthError),
        (403, FleetAuthError),
        (404, FleetNotFound),
        (409, FleetConflict),
        (422, FleetInvalid),
    ],
)
def test_error_mapping_names_operation_and_detail(status: int, error: type[Exception]) -> None:
    rec = Recorder([httpx.Response(status, json={"detail": "Session is already claimed"})])

    async def go() -> None:
        async with make_client(rec) as client:
            await client.claim("devin-9", "w1")

    with pytest.raises(error) as info:
        run(go())
    assert str(info.value) == f"Could not claim session devin-9: {status} Session is already claimed"
    assert TOKEN not in str(info.value)
    assert len(rec.requests) == 1  # 4xx is never retried


def test_retries_5xx_and_429_then_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    rec = Recorder(
        [
            httpx.Response(503, json={"detail": "down"}),
            httpx.Response(429, json={"detail": "slow down"}, headers={"Retry-After": "2"}),
            httpx.Response(200, json={"items": [], "cursor": "c0", "has_next_page": False}),
        ]
    )

    async def go() -> Any:
        async with make_client(rec, retries=3) as client:
            return await client.list_devins()

    page = run(go())
    assert page.cursor == "c0"
    assert len(rec.requests) == 3
    assert sleeps[1] == 2.0  # Retry-After is honoured


def test_retries_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_sleep(delay: float) -> None:
        return None

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    rec = Recorder([httpx.Response(500, json={"detail": "boom"})] * 3)

    async def go() -> None:
        async with make_client(rec, retries=2) as client:
            await client.list_devins()

    with pytest.raises(FleetServerError, match="500 boom"):
        run(go())
    assert len(rec.requests) == 3


def test_create_is_not_replayed_after_a_server_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_sleep(delay: float) -> None:
        return None

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    rec = Recorder([httpx.Response(502, json={"detail": "bad gateway"})])

    async def go() -> None:
        async with make_client(rec, retries=3) as client:
            await client.create_outpost("gpu", platform="linux")

    with pytest.raises(FleetServerError):
        run(go())
    assert len(rec.requests) == 1


def test_connection_error_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake_sleep(delay: float) -> None:
        return None

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    rec = Recorder([refuse, refuse])

    async def go() -> None:
        async with make_client(rec, retries=1) as client:
            await client.get_outpost("outpost_env-1")

    with pytest.raises(FleetConnectionError, match="Could not get outpost outpost_env-1: ConnectError"):
        run(go())


def test_release_treats_409_and_404_as_released() -> None:
    rec = Recorder(
        [
            httpx.Response(409, json={"detail": "Session is not claimed by this acceptor"}),
            httpx.Response(404, json={"detail": "Session not found in queue"}),
            httpx.Response(409, json={"detail": "Session is not claimed by this acceptor"}),
        ]
    )

    async def go() -> None:
        async with make_client(rec) as client:
            assert await client.release("devin-1", "w1") is None
            assert await client.release("devin-1", "w1") is None
            with pytest.raises(FleetConflict):
                await client.release("devin-1", "w1", missing_ok=False)

    run(go())


def test_delete_outpost_missing_ok() -> None:
    rec = Recorder([httpx.Response(404, json={"detail": "Outpost not found"})] * 2)

    async def go() -> None:
        async with make_client(rec) as client:
            assert await client.delete_outpost("outpost_env-x", missing_ok=True) is False
            with pytest.raises(FleetNotFound):
                await client.delete_outpost("outpost_env-x")

    run(go())
    assert rec.requests[0].method == "DELETE"
    assert rec.requests[0].url.path == "/opbeta/outposts/outposts/outpost_env-x"


def test_set_default_platform_refuses_both_fields() -> None:
    rec = Recorder([])

    async def go() -> None:
        async with make_client(rec) as client:
            await client.set_default_platform("org-1", platform="linux", outpost_pool_id="outpost_env-1")

    with pytest.raises(ValueError, match="at most one"):
        run(go())
    assert rec.requests == []


def test_watch_parses_events_and_skips_keepalives() -> None:
    events = [
        {"type": "MODIFIED", "object": entry("devin-1"), "cursor": "c1"},
        {"type": "DELETED", "object": entry("devin-2"), "cursor": "c2"},
        {"type": "RESIZED", "object": entry("devin-3"), "cursor": "c3"},
    ]
    body = ": keepalive\n\n" + "".join(f"data: {json.dumps(e)}\n\n" for e in events[:2])
    body += ": keepalive\n\n" + f"data: {json.dumps(events[2])}\n\n"
    rec = Recorder([httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"})])

    async def go() -> list[Any]:
        async with make_client(rec) as client:
            return [event async for event in client.watch_devins(outpost="outpost_env-1", cursor="c0")]

    seen = run(go())
    assert [(e.type.value, e.object.session_id, e.cursor) for e in seen] == [
        ("MODIFIED", "devin-1", "c1"),
        ("DELETED", "devin-2", "c2"),
        ("RESIZED", "devin-3", "c3"),
    ]
    assert seen[2].type.known is False  # unknown event types are tolerated, not fatal
    params = rec.requests[0].url.params
    assert params["watch"] == "true"
    assert params["cursor"] == "c0"
    assert rec.requests[0].headers["Accept"] == "text/event-stream"


def test_watch_auth_failure_raises() -> None:
    rec = Recorder([httpx.Response(401, json={"detail": "Invalid token"})])

    async def go() -> None:
        async with make_client(rec) as client:
            async for _event in client.watch_devins():
                pass

    with pytest.raises(FleetAuthError, match="401 Invalid token"):
        run(go())


def test_watch_rejects_malformed_event() -> None:
    rec = Recorder([httpx.Response(200, text="data: {not json}\n\n")])

    async def go() -> None:
        async with make_client(rec) as client:
            async for _event in client.watch_devins():
                pass

    with pytest.raises(FleetProtocolError, match="malformed watch event"):
        run(go())


def test_repr_never_shows_token() -> None:
    client = FleetClient("https://api.example.test", TOKEN)
    try:
        assert TOKEN not in repr(client)
    finally:
        run(client.aclose())
