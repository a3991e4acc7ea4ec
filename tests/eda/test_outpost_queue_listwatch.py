# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The event source's loop against the shared list-then-watch cases (python/contract/listwatch.yaml).

The worker's queue feed runs the same cases (python/devin-outposts/tests/test_contract_listwatch.py). The
source is loaded as ansible-rulebook loads it (runpy.run_path), so its loop follows what it loaded from the
collection's plugins/plugin_utils/_fleet_listwatch.py. Each case's server is a small HTTP server on a real
socket that answers each request as the step says; the runner gives the loop a clock of its own (how long each
stream lived) and a sleep that records, and checks the requests sent, the cursor of each and the waits before.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Optional
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import pytest

import casebook

ROOT = Path(__file__).resolve().parents[2]
CASES: list[dict[str, Any]] = casebook.load("listwatch.yaml")


def answer_bytes(answer: dict[str, Any]) -> bytes:
    """The whole HTTP answer of a step (the connection closes after it)."""
    headers = {"Content-Type": "application/json", "Connection": "close"}
    if "status" in answer:
        status, body = answer["status"], json.dumps({"detail": "scripted"}).encode()
    elif "page" in answer:
        items = [casebook.pending_entry(sid) for sid in answer["page"]["sessions"]]
        page = {"items": items, "cursor": answer["page"]["cursor"], "has_next_page": False}
        status, body = 200, json.dumps(page).encode()
    else:
        status, headers["Content-Type"] = 200, "text/event-stream"
        events = [
            {"type": "MODIFIED", "object": casebook.pending_entry(sid), "cursor": cursor}
            for sid, cursor in answer["events"]
        ]
        body = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events)
        if answer["end"] == "malformed":
            body += b"data: []\n\n"
    # A broken stream promises more than it sends, then closes: the client's read fails mid-body.
    length = len(body) + (100 if answer.get("end") == "broken" else 0)
    headers["Content-Length"] = str(length)
    head = [f"HTTP/1.1 {status} Scripted"] + [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class Script:
    """The server of one case, its clock and its record of what the loop did."""

    def __init__(self, steps: list[dict[str, Any]]) -> None:
        self.steps = list(steps)
        self.now = 1000.0
        self.waited = 0.0
        #: (request, cursor, seconds waited before it), one per request.
        self.sent: list[tuple[str, Optional[str], float]] = []
        self.task: Optional[asyncio.Task[Any]] = None
        self.url = ""
        self._server: Optional[asyncio.AbstractServer] = None

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waited += seconds
        await asyncio.sleep(0)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            query = dict(parse_qsl(urlsplit(head.decode("latin-1").split(" ", 2)[1]).query))
            kind = "watch" if query.get("watch") == "true" else "list"
            self.sent.append((kind, query.get("cursor"), self.waited))
            self.waited = 0.0
            answer = self.steps.pop(0)["answer"] if self.steps else "stop"
            if answer == "stop":
                assert self.task is not None
                self.task.cancel()  # the case is over: the loop ends in the middle of this request
                return
            self.now += answer.get("lived", 0)
            writer.write(answer_bytes(answer))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def play(source: dict[str, Any], case: dict[str, Any]) -> Script:
    script = Script(case["steps"])
    await script.start()
    try:
        async with aiohttp.ClientSession() as http:
            options = source["Options"]({"api_url": script.url, "token": "cog_contract_token"}, environ={})
            queue_source = source["QueueSource"](options, asyncio.Queue(), sleep=script.sleep)
            queue_source.http = http
            queue_source.listwatch.clock = script.clock
            script.task = asyncio.ensure_future(queue_source.follow(case.get("resume")))
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(script.task, 30)
    finally:
        await script.stop()
    return script


@pytest.mark.asyncio
@pytest.mark.parametrize("case", casebook.cases_for("listwatch.yaml", "eda"), ids=lambda c: c["id"])
async def test_listwatch_case(source: dict[str, Any], case: dict[str, Any]) -> None:
    script = await play(source, case)
    assert not script.steps, f"{len(script.steps)} step(s) never reached; sent {script.sent}"
    assert len(script.sent) == len(case["steps"]), script.sent
    for number, (step, (kind, cursor, waited)) in enumerate(zip(case["steps"], script.sent)):
        assert (kind, cursor) == (step["request"], step["cursor"]), (number, script.sent)
        wanted = step.get("wait", 0)
        low, high = wanted if isinstance(wanted, list) else (wanted, wanted)
        assert low - 0.01 <= waited <= high + 0.01, (number, waited, wanted)


def test_the_source_follows_the_collections_listwatch(source: dict[str, Any]) -> None:
    """What the source's loop follows is plugins/plugin_utils/'s code, not a copy of its own."""
    loaded = source["_listwatch"]
    assert Path(loaded.__file__) == ROOT / "plugins" / "plugin_utils" / "_fleet_listwatch.py"
    assert source["ListWatch"] is loaded.ListWatch
