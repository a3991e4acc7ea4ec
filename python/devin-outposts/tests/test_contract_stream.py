"""The fleet API's one SSE reader and one backoff against the shared cases (python/contract/stream.yaml).

The event source runs the same cases against what it loads from the collection
(tests/eda/test_outpost_queue_contract.py), and the modules' client runs the backoff cases
(tests/unit/plugins/module_utils/test_contract.py). The collection ships the reader, the backoff and the
list-then-watch bookkeeping (api/listwatch.py, whose cases are python/contract/listwatch.yaml) as
byte-identical copies in plugins/plugin_utils/; the last tests here fail when a copy differs, or when any of
them imports anything but the standard library.
"""

from __future__ import annotations

import ast
import asyncio
import random
import sys
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from devin_outposts.api import backoff as backoff_module
from devin_outposts.api import inflate as inflate_module
from devin_outposts.api import listwatch as listwatch_module
from devin_outposts.api import stream as stream_module
from devin_outposts.api.backoff import Backoff, backoff_delay
from devin_outposts.api.client import FleetClient
from devin_outposts.api.stream import EventStreamReader, EventStreamTooLarge

import casebook

ROOT = casebook.CONTRACT_DIR.parents[1]
CASES: dict[str, list[dict[str, Any]]] = casebook.load("stream.yaml")
#: Each module and its copy in the collection (docs/eda.md, "What the source shares").
TWINS = {
    "stream": (Path(stream_module.__file__), ROOT / "plugins" / "plugin_utils" / "_fleet_stream.py"),
    "backoff": (Path(backoff_module.__file__), ROOT / "plugins" / "plugin_utils" / "_fleet_backoff.py"),
    "listwatch": (Path(listwatch_module.__file__), ROOT / "plugins" / "plugin_utils" / "_fleet_listwatch.py"),
    "inflate": (Path(inflate_module.__file__), ROOT / "plugins" / "plugin_utils" / "_fleet_inflate.py"),
}


@pytest.mark.parametrize("case", CASES["sse"], ids=lambda c: c["id"])
def test_sse_case(case: dict[str, Any]) -> None:
    casebook.judge_reader(case, EventStreamReader, EventStreamTooLarge)


def test_the_default_caps_are_1_mib() -> None:
    assert stream_module.MAX_LINE_BYTES == stream_module.MAX_EVENT_BYTES == 1 << 20


def test_comments_reach_on_comment() -> None:
    seen: list[str] = []
    EventStreamReader(on_comment=seen.append).feed(b": keepalive\n\n:x\r\n")
    assert seen == [" keepalive", "x"]


# --- the backoff --------------------------------------------------------------------------------------------


def constant(value: float) -> Callable[[], float]:
    """A random draw that always gives ``value`` (0.0: the lowest wait, 1.0: the highest)."""
    return lambda: value


def attempts(case: dict[str, Any]) -> list[tuple[int, list[float]]]:
    start = case.get("from", 0)
    return [(start + offset, bounds) for offset, bounds in enumerate(case["waits"])]


@pytest.mark.parametrize("case", CASES["backoff"], ids=lambda c: c["id"])
def test_backoff_case(case: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    base, cap = case["base"], case["cap"]
    for attempt, (low, high) in attempts(case):
        assert backoff_delay(attempt, base, cap, 0.0) == pytest.approx(low)
        assert backoff_delay(attempt, base, cap, 1.0) == pytest.approx(high)
    # The stateful Backoff of the worker's and the orchestrator's loops, from the first attempt on.
    if case.get("from", 0) == 0:
        for draw, side in ((0.0, 0), (1.0, 1)):
            backoff = Backoff(base=base, cap=cap, rng=constant(draw))
            assert [backoff.next_delay() for dummy in case["waits"]] == pytest.approx(
                [bounds[side] for bounds in case["waits"]]
            )
    # Backoff.delay(attempt): the queue feed's waits, its list-then-watch counting the attempts.
    for draw, side in ((0.0, 0), (1.0, 1)):
        backoff = Backoff(base=base, cap=cap, rng=constant(draw))
        assert [backoff.delay(attempt) for attempt, dummy in attempts(case)] == pytest.approx(
            [bounds[side] for dummy, bounds in attempts(case)]
        )
    # The fleet client's request retries.
    client = FleetClient("https://api.test.invalid", "t", backoff_base=base, backoff_max=cap)
    for draw, side in ((0.0, 0), (1.0, 1)):
        monkeypatch.setattr(random, "random", constant(draw))
        assert [client._backoff(attempt) for attempt, dummy in attempts(case)] == pytest.approx(
            [bounds[side] for dummy, bounds in attempts(case)]
        )
    monkeypatch.undo()
    asyncio.run(client.aclose())


def test_a_reset_starts_the_waits_afresh() -> None:
    backoff = Backoff(base=1, cap=60, rng=lambda: 1.0)
    assert [backoff.next_delay() for dummy in range(3)] == [1, 2, 4]
    assert not backoff.connection_lived(4.9)
    assert backoff.next_delay() == 8
    assert backoff.connection_lived(5.0)
    assert backoff.next_delay() == 1


# --- the copies the collection ships ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TWINS))
def test_the_collection_ships_an_identical_copy(name: str) -> None:
    original, copy = TWINS[name]
    assert copy.read_bytes() == original.read_bytes(), (
        f"{copy.relative_to(ROOT)} differs from {original.relative_to(ROOT)}: edit the worker package's "
        f"file, then copy it (cp {original.relative_to(ROOT)} {copy.relative_to(ROOT)})"
    )


@pytest.mark.parametrize("name", sorted(TWINS))
def test_it_imports_only_the_standard_library(name: str) -> None:
    """The event source loads the copy where neither this package nor its dependencies are installed."""
    tree = ast.parse(TWINS[name][0].read_text(encoding="utf-8"))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    }
    relative = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level]
    assert relative == []
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_the_client_reads_a_watch_chunk_by_chunk() -> None:
    """The client feeds the reader what httpx reads: an event split over many reads comes out whole."""
    body = b": keepalive\r\n\r\n" + b'data: {"type":"DELETED","object":{"metadata":{"session_id":"devin-1",'
    body += b'"outpost_id":"o"},"spec":{},"status":{"phase":"pending"}},"cursor":"c1"}\r\n\r\ndata: {"cut'

    class Pieces(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            for start in range(0, len(body), 5):
                yield body[start : start + 5]

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.params["watch"] == "true" and request.url.params["cursor"] == "c0"
        assert request.headers["Accept"] == "text/event-stream"
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=Pieces())

    async def main() -> list[Any]:
        async with FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(handle)) as client:
            return [
                (e.type.value, e.object.session_id, e.cursor) async for e in client.watch_devins(cursor="c0")
            ]

    assert asyncio.run(main()) == [("DELETED", "devin-1", "c1")]  # the cut event at the end is dropped
