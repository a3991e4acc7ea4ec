# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The event source devin.outposts.outpost_queue against the shared cases: the third runner of
python/contract/cases.yaml (the modules' client and the worker's client run the same table) and a runner of
python/contract/stream.yaml (the watch stream's framing and caps, and the backoff).

The source is loaded as ansible-rulebook loads it (runpy.run_path), so what runs here is what it loaded from
the collection's plugins/plugin_utils/: the one SSE reader and the one backoff. Each contract case scripts
the server's answers on a real socket (a small HTTP server in the test, so aiohttp reads them as it reads the
API) and states the result or error, the requests sent and the waits between retries; this runner turns the
source's dicts and errors into the case's terms.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver

import casebook

ROOT = Path(__file__).resolve().parents[2]
CASES: list[dict[str, Any]] = casebook.load("cases.yaml")
STREAM_CASES: dict[str, list[dict[str, Any]]] = casebook.load("stream.yaml")
EDA_CASES = casebook.cases_for("cases.yaml", "eda")
REASONS = {
    200: "OK",
    204: "No Content",
    302: "Found",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
}


class ScriptedServer:
    """An HTTP/1.1 server on 127.0.0.1 that answers each request with the case's next reply, then closes the
    connection. ``{connection: refused}`` is played by :class:`ScriptedResolver` before any connection."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []
        self.port = 0
        self._server: Optional[asyncio.AbstractServer] = None

    @property
    def url(self) -> str:
        return f"http://fleet.test:{self.port}"

    async def __aenter__(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target = head.decode("latin-1").split(" ", 2)[:2]
            parts = urlsplit(target)
            self.requests.append(
                {"method": method, "path": parts.path, "query": dict(parse_qsl(parts.query))}
            )
            if self.replies:  # else an unexpected request: no answer (the case fails on the requests sent)
                writer.write(self._response(self.replies.pop(0)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @staticmethod
    def _response(reply: dict[str, Any]) -> bytes:
        headers = {k: casebook.header_value(v) for k, v in (reply.get("headers") or {}).items()}
        if "raw" in reply:
            body = str(reply["raw"]).encode()
        else:
            body = json.dumps(reply["body"]).encode()
            headers.setdefault("Content-Type", "application/json")
        headers.update({"Content-Length": str(len(body)), "Connection": "close"})
        status = reply["status"]
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}"] + [
            f"{k}: {v}" for k, v in headers.items()
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ScriptedResolver(AbstractResolver):
    """Resolves ``fleet.test`` to the scripted server, or, when the next reply is ``{connection: refused}``,
    fails as a refused connection does: before anything is sent, with an error aiohttp never retries itself
    (it sends an idempotent request again once after the server closed a connection without an answer)."""

    def __init__(self, server: ScriptedServer) -> None:
        self.server = server

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[Any]:
        replies = self.server.replies
        if replies and replies[0].get("connection") == "refused":
            replies.pop(0)
            self.server.requests.append({"method": "GET", "path": "(refused)", "query": {}})
            raise OSError(111, "Connection refused")
        address = {"hostname": host, "host": "127.0.0.1", "port": self.server.port}
        return [{**address, "family": socket.AF_INET, "proto": 0, "flags": socket.AI_NUMERICHOST}]

    async def close(self) -> None:
        pass


async def call(source: dict[str, Any], queue_source: Any, name: str, args: dict[str, Any]) -> Any:
    """The operation ``name`` on the event source, its answer in the cases' terms."""
    if name == "list_outposts":
        return list(
            await queue_source.list_outposts(page_size=args.get("page_size", source["MAX_PAGE_SIZE"]))
        )
    if name == "list_sessions":
        entries, cursor = await queue_source.list_sessions(
            outpost=args.get("outpost"),
            phase=args.get("phase"),
            acceptor_id=args.get("acceptor_id"),
            page_size=args.get("page_size", source["MAX_PAGE_SIZE"]),
            cursor=args.get("cursor"),
        )
        return {
            "sessions": [e["metadata"]["session_id"] for e in entries],
            "phases": [(e.get("status") or {}).get("phase") for e in entries],
            "cursor": cursor,
        }
    if name == "defaults":
        options = source["Options"]({"token": "cog_contract_token"}, environ={})
        return {
            "api_url": options.api_url,
            "timeout": options.timeout,
            "max_page_size": source["MAX_PAGE_SIZE"],
        }
    if name == "phases":
        return list(source["PHASES"])
    if name == "normalize_api_url":
        return source["normalize_api_url"](args["url"])
    if name == "outpost_names":
        return [bool(source["OUTPOST_NAME"].match(value)) for value in args["names"]]
    if name == "outpost_ids":
        return [value.startswith(source["OUTPOST_ID_PREFIX"]) for value in args["values"]]
    if name == "boolean_words":
        return [read_boolean(source, value) for value in args["values"]]
    raise AssertionError(f"the event source's runner does not know the operation {name!r}")


def read_boolean(source: dict[str, Any], value: str) -> Optional[bool]:
    """The source's reader of a boolean option (validate_certs, emit_listed) on one text; None: refused."""
    try:
        return bool(source["Options"]({"token": "t", "emit_listed": value}, environ={}).emit_listed)
    except source["OptionError"]:
        return None


async def run_case(
    source: dict[str, Any], case: dict[str, Any]
) -> tuple[Any, Any, ScriptedServer, list[float]]:
    """The case's call on a source whose requests reach the scripted server: result, error, server, waits."""
    sleeps: list[float] = []

    async def record(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0)

    async with ScriptedServer(case.get("replies") or []) as server:
        connector = aiohttp.TCPConnector(resolver=ScriptedResolver(server), use_dns_cache=False)
        async with aiohttp.ClientSession(connector=connector) as http:
            options = source["Options"]({"api_url": server.url, "token": "cog_contract_token"}, environ={})
            queue_source = source["QueueSource"](options, asyncio.Queue(), sleep=record)
            queue_source.http = http
            result, error = None, None
            try:
                result = await call(source, queue_source, case["call"], case.get("args") or {})
            except source["FleetError"] as exc:
                error = {"status": exc.status, "message": str(exc)}
            except ValueError as exc:  # refused before any request (an option error is a ValueError too)
                error = {"status": None, "message": str(exc)}
    return result, error, server, sleeps


@pytest.mark.asyncio
@pytest.mark.parametrize("case", EDA_CASES, ids=lambda c: c["id"])
async def test_contract_case(source: dict[str, Any], case: dict[str, Any]) -> None:
    result, error, server, sleeps = await run_case(source, case)
    casebook.judge_call(
        case,
        "eda",
        result=result,
        error=error,
        requests=server.requests,
        sleeps=sleeps,
        unasked=len(server.replies),
    )


def test_every_case_the_source_can_make_is_run() -> None:
    """The source lists and watches: every case of a list is one of its cases too."""
    lists = [c["id"] for c in CASES if c["call"] in ("list_outposts", "list_sessions") and c not in EDA_CASES]
    assert lists == []


# --- the watch stream and the backoff (python/contract/stream.yaml) -----------------------------------------


@pytest.mark.parametrize("case", STREAM_CASES["sse"], ids=lambda c: c["id"])
def test_sse_case(source: dict[str, Any], case: dict[str, Any]) -> None:
    casebook.judge_reader(case, source["EventStreamReader"], source["EventStreamTooLarge"])


def constant(value: float) -> Callable[[], float]:
    return lambda: value


@pytest.mark.parametrize("case", STREAM_CASES["backoff"], ids=lambda c: c["id"])
def test_backoff_case(source: dict[str, Any], case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The lowest and highest wait of each attempt: of the formula the source loaded (its list requests'
    retries use it with the other clients' parameters) and of its loop's backoff (backoff_initial and
    backoff_max being the case's base and cap, when the options allow them: backoff_max may not be below
    backoff_initial)."""
    first = case.get("from", 0)
    attempts = range(first, first + len(case["waits"]))
    for side in (0, 1):
        waits = [
            source["backoff_delay"](attempt, case["base"], case["cap"], float(side)) for attempt in attempts
        ]
        assert waits == pytest.approx([bounds[side] for bounds in case["waits"]]), waits
    if case["cap"] >= case["base"]:
        args = {"token": "t", "backoff_initial": case["base"], "backoff_max": case["cap"]}
        queue_source = source["QueueSource"](source["Options"](args, environ={}), asyncio.Queue())
        for side in (0, 1):
            monkeypatch.setattr(random, "random", constant(float(side)))
            waits = [queue_source.backoff(attempt) for attempt in attempts]
            assert waits == pytest.approx([bounds[side] for bounds in case["waits"]]), waits


def test_the_source_runs_the_collections_reader_and_backoff(source: dict[str, Any]) -> None:
    """What the source loaded is plugins/plugin_utils/'s code, not a copy of its own."""
    reader_file = source["_stream"].__file__
    backoff_file = source["_backoff"].__file__
    assert Path(reader_file) == ROOT / "plugins" / "plugin_utils" / "_fleet_stream.py"
    assert Path(backoff_file) == ROOT / "plugins" / "plugin_utils" / "_fleet_backoff.py"
    assert source["EventStreamReader"] is source["_stream"].EventStreamReader
    assert source["backoff_delay"] is source["_backoff"].backoff_delay
