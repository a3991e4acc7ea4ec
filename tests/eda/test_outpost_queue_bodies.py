# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""The event source caps a compressed reply before it inflates it (issue 37, S6).

aiohttp before 3.13.3 (ansible-rulebook accepts 3.9 and later) inflated each network read whole, so 64 KiB
of a gzip bomb became 64 MiB before the source's 8 MiB cap could look at it. The source now turns aiohttp's
decompression off and reads the raw body through the worker's decoder
(``plugins/plugin_utils/_fleet_inflate.py``). The fake fleet of test_outpost_queue_hostile.py answers with a
bomb; what the source allocated while it refused it is measured with tracemalloc, in this process where the
source runs. (aiohttp 3.13.3 and later bound their own inflation: with them the old source passed too; with
aiohttp 3.13.2 it allocated 142 MiB.)
"""

from __future__ import annotations

import functools
import logging
import tracemalloc
import zlib
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from test_outpost_queue_hostile import FAST, FakeFleet, Reply, warnings

pytestmark = pytest.mark.asyncio

#: What each bomb inflates to: 256 MiB from about 256 KiB on the wire.
BOMB_BYTES = 256 << 20
#: The most the source may allocate while it refuses a bomb: the 8 MiB cap, its copy, and room.
PEAK_BOUND = 32 << 20


@functools.cache
def bomb(prefix: bytes, fill: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = fill * ((1 << 20) // len(fill))
    parts = [packer.compress(prefix)] + [packer.compress(block) for dummy in range(BOMB_BYTES // len(block))]
    return b"".join([*parts, packer.flush()])


def gzipped(body: bytes, content_type: str) -> Reply:
    async def reply(request: web.Request) -> web.StreamResponse:
        assert request.headers.get("Accept-Encoding") == "gzip, deflate"
        headers = {"Content-Encoding": "gzip", "Content-Type": content_type}
        return web.Response(body=body, headers=headers)

    return reply


CASES = {
    "list": ("lists", bomb(b'{"items": [', b" "), "application/json",
             "Could not list sessions: malformed reply: the body is larger than 8388608 bytes"),
    "watch": ("watches", bomb(b"data: ", b"x"), "text/event-stream",
              "Could not watch sessions: malformed reply: a watch line is larger than 1048576 bytes"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_gzip_bomb_is_refused_within_bounded_memory(
    fleet: FakeFleet, collect: Any, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    script, body, content_type, line = CASES[case]
    getattr(fleet, script).append(gzipped(body, content_type))
    caplog.set_level(logging.INFO, "devin.outposts.outpost_queue")
    tracemalloc.start()
    try:
        events = collect({"api_url": fleet.url, **FAST})
        await events.wait_for(lambda e: e.get("session_id") == "devin-watched")
        dummy, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"allocated at most {peak / 2**20:.1f} MiB")  # the figure, with pytest -s
    logged = warnings(caplog)
    assert len(logged) == 1, logged
    assert logged[0].startswith(line), logged
    assert not events.task.done()
    assert peak < PEAK_BOUND, f"the source allocated up to {peak / 2**20:.0f} MiB while refusing the bomb"


@pytest_asyncio.fixture
async def fleet() -> Any:
    server = FakeFleet()
    await server.start()
    yield server
    await server.stop()


async def test_a_compressed_list_and_watch_are_read(fleet: FakeFleet, collect: Any) -> None:
    """A well-behaved server that compresses its answers is read as before."""
    listed = b'{"items": [], "cursor": "c1", "has_next_page": false}'
    fleet.lists.append(gzipped(zlib.compress(listed, wbits=16 + zlib.MAX_WBITS), "application/json"))
    entry = b'{"metadata": {"session_id": "devin-gz", "outpost_id": "o"}}'
    event = b'data: {"type": "MODIFIED", "object": ' + entry + b"}\n\n"
    fleet.watches.append(gzipped(zlib.compress(event, wbits=16 + zlib.MAX_WBITS), "text/event-stream"))
    events = collect({"api_url": fleet.url, **FAST})
    await events.wait_for(lambda e: e.get("session_id") == "devin-gz")
