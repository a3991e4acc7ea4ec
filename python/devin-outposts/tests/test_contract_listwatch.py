"""The worker's queue feed against the shared list-then-watch cases (python/contract/listwatch.yaml).

The event source runs the same cases (tests/eda/test_outpost_queue_listwatch.py). Each case scripts what the
server does with each request the loop sends; this runner plays it through the worker's own fleet client
(httpx.MockTransport), with a clock of its own for how long each stream lived, and checks the requests the
feed sent, the cursor of each, and what it waited before each.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any, Optional

import httpx
import pytest

from devin_outposts.api.client import FleetClient
from devin_outposts.core import feed as feed_module
from devin_outposts.core.feed import QueueFeed

import casebook

CASES: list[dict[str, Any]] = casebook.load("listwatch.yaml")
OUTPOST = "outpost_env-contract"
#: asyncio.sleep itself: the runner stands in for it in the feed, and yields to the loop with it.
REAL_SLEEP = asyncio.sleep


def stream_bytes(events: list[list[str]], end: str) -> list[bytes]:
    """The chunks of a watch stream: one event each, then a malformed one when ``end`` says so."""
    payloads = [
        {"type": "MODIFIED", "object": casebook.pending_entry(sid, OUTPOST), "cursor": cursor}
        for sid, cursor in events
    ]
    chunks = [b"data: " + json.dumps(payload).encode() + b"\n\n" for payload in payloads]
    if end == "malformed":
        chunks.append(b"data: []\n\n")
    return chunks


class Stream(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes], broken: bool) -> None:
        self.chunks = chunks
        self.broken = broken

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.broken:
            raise httpx.ReadError("the connection broke")


class Script:
    """The server of one case: answers each request as its step says, and records what the loop did."""

    def __init__(self, steps: list[dict[str, Any]]) -> None:
        self.steps = list(steps)
        self.now = 1000.0
        self.waited = 0.0
        #: (request, cursor, seconds waited before it), one per request.
        self.sent: list[tuple[str, Optional[str], float]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waited += seconds
        await REAL_SLEEP(0)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        kind = "watch" if request.url.params.get("watch") == "true" else "list"
        self.sent.append((kind, request.url.params.get("cursor"), self.waited))
        self.waited = 0.0
        assert self.steps, f"a request after the last step: {request.url}"
        answer = self.steps.pop(0)["answer"]
        if answer == "stop":
            raise asyncio.CancelledError  # the case is over: feed.run() ends
        if "status" in answer:
            return httpx.Response(answer["status"], json={"detail": "scripted"})
        if "page" in answer:
            page = answer["page"]
            items = [casebook.pending_entry(sid, OUTPOST) for sid in page["sessions"]]
            body = {"items": items, "cursor": page["cursor"], "has_next_page": False}
            return httpx.Response(200, json=body)
        self.now += answer.get("lived", 0)
        chunks = stream_bytes(answer["events"], answer["end"])
        stream = Stream(chunks, broken=answer["end"] == "broken")
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=stream)


def play(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Script:
    script = Script(case["steps"])
    monkeypatch.setattr(feed_module.asyncio, "sleep", script.sleep)

    async def main() -> None:
        transport = httpx.MockTransport(script.handle)
        client = FleetClient("https://api.test.invalid", "cog_contract_token", transport=transport)
        try:
            feed = QueueFeed(client, OUTPOST, "contract-acceptor")
            feed.listwatch.clock = script.clock
            with pytest.raises(asyncio.CancelledError):
                await feed.run()
        finally:
            await client.aclose()

    asyncio.run(main())
    monkeypatch.undo()
    return script


@pytest.mark.parametrize("case", casebook.cases_for("listwatch.yaml", "worker"), ids=lambda c: c["id"])
def test_listwatch_case(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    script = play(case, monkeypatch)
    assert not script.steps, f"{len(script.steps)} step(s) never reached; sent {script.sent}"
    for number, (step, (kind, cursor, waited)) in enumerate(zip(case["steps"], script.sent)):
        assert (kind, cursor) == (step["request"], step["cursor"]), (number, script.sent)
        wanted = step.get("wait", 0)
        low, high = wanted if isinstance(wanted, list) else (wanted, wanted)
        assert low - 0.01 <= waited <= high + 0.01, (number, waited, wanted)


def test_every_case_has_an_id_and_ends_with_a_stop() -> None:
    ids = [case["id"] for case in CASES]
    assert len(ids) == len(set(ids))
    for case in CASES:
        assert [step["answer"] for step in case["steps"]].count("stop") == 1, case["id"]
        assert case["steps"][-1]["answer"] == "stop", case["id"]
