# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The event source devin.outposts.outpost_queue against answers that drip (issue 37, S5).

A ``200`` that promises a long body and sends it a byte at a time never trips a per-read timeout. A list has a
total deadline (``timeout``); a watch, meant to stay open, has an idle one: no event and no keepalive for 4 x
``timeout`` reconnects it, however many bytes came meanwhile. Whatever drips, the source returns within 5 s of
being cancelled, as ansible-rulebook cancels it when it stops. The fake fleet API is the one of
``test_outpost_queue_hostile.py``, with a dripping reply scripted in.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web
from test_outpost_queue_hostile import FAST, LOGGER, FakeFleet, Reply, fleet

__all__ = ["fleet"]

pytestmark = pytest.mark.asyncio

#: What the issue's server promised, and how slowly it sent it (faster here, so that the test's server
#: notices the client's hang-up soon; still far inside any per-read timeout).
LENGTH = 100_000
EVERY = 0.1


class Drip:
    """A reply that sends ``chunk`` every EVERY seconds until the client hangs up: a JSON body of LENGTH bytes
    for a list, or a stream for a watch. Records what it sent."""

    def __init__(self, chunk: bytes = b" ", content_type: str = "application/json") -> None:
        self.chunk = chunk
        self.content_type = content_type
        self.sent = 0
        self.hung_up = asyncio.Event()
        self.started = asyncio.Event()

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": self.content_type}
        if self.content_type == "application/json":
            headers["Content-Length"] = str(LENGTH)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        try:
            while self.sent < LENGTH:
                await response.write(self.chunk)
                self.sent += len(self.chunk)
                self.started.set()
                await asyncio.sleep(EVERY)
        except ConnectionError:
            self.hung_up.set()
        return response


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("place", ["list", "watch"])
async def test_the_source_returns_within_5_seconds_of_being_cancelled_while_a_request_drips(
    fleet: FakeFleet, collect: Any, place: str
) -> None:
    drip = Drip(b" ", "application/json") if place == "list" else Drip(b"d", "text/event-stream")
    reply: Reply = drip
    (fleet.lists if place == "list" else fleet.watches).append(reply)
    events = collect({"api_url": fleet.url, **FAST})
    await asyncio.wait_for(drip.started.wait(), 30)
    assert not events.task.done()
    events.task.cancel()
    done, dummy = await asyncio.wait({events.task}, timeout=5)
    assert events.task in done, "the source was still running 5 s after it was cancelled"
    assert events.task.cancelled()
    assert 0 < drip.sent < LENGTH  # cancelled in the middle of the dripping reply
    await asyncio.wait_for(drip.hung_up.wait(), 30)  # and the connection went with it


async def test_a_list_that_drips_ends_at_its_total_deadline_and_is_sent_again(
    fleet: FakeFleet, collect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    drip = Drip()
    fleet.lists.append(drip)
    events = collect({"api_url": fleet.url, **FAST, "timeout": 0.5})
    await events.wait_for(lambda e: e.get("session_id") == "devin-listed" and e["type"] == "LISTED")
    assert fleet.requests["list"] == 2
    assert 0 < drip.sent < LENGTH
    assert warnings(caplog) == []  # sent again within the request's own retries


async def test_a_watch_that_drips_without_an_event_or_keepalive_is_reconnected(
    fleet: FakeFleet, collect: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Each read gets a byte well within its timeout (1 s here), but no line ever ends: after 4 x timeout
    without an event or a keepalive the source hangs up, and the next watch brings the change."""
    drip = Drip(b"d", "text/event-stream")
    fleet.watches.append(drip)
    events = collect({"api_url": fleet.url, **FAST, "timeout": 0.25})
    await events.wait_for(lambda e: e.get("session_id") == "devin-watched")
    logged = warnings(caplog)
    assert logged[:1] == [
        "Could not watch sessions: no event and no keepalive for 1s; reconnecting in "
        + logged[0].rsplit("reconnecting in ", 1)[-1]
    ], logged
    assert fleet.requests["watch"] == 2
    assert drip.sent > 1 / EVERY  # it dripped for more than a second: only the idle deadline could end it
    await asyncio.wait_for(drip.hung_up.wait(), 30)
