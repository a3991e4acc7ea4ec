# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""Helpers for the EDA tests: the source loaded as ansible-rulebook loads it, and a runner that collects its
events from a background task."""

from __future__ import annotations

import asyncio
import os
import runpy
import time
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import pytest_asyncio

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "extensions" / "eda" / "plugins" / "event_source" / "outpost_queue.py"
#: CI (CI=true) must run every test: there, a missing tool fails instead of skipping.
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def source() -> dict[str, Any]:
    """The source's globals, loaded with runpy.run_path as ansible-rulebook does (not as a package)."""
    return runpy.run_path(str(SOURCE))


class Collector:
    """``main(queue, args)`` of the source in a background task; the events it sent, in order."""

    def __init__(self, main: Callable[..., Any], args: dict[str, Any]) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.events: list[dict[str, Any]] = []
        self.task = asyncio.ensure_future(main(self.queue, args))

    def _drain(self) -> None:
        while not self.queue.empty():
            self.events.append(self.queue.get_nowait())

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0) -> dict[str, Any]:
        """The first event (collected so far or to come) matching ``predicate``; fails after ``timeout``."""
        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            self._drain()
            for event in self.events[checked:]:
                if predicate(event["outpost_queue"]):
                    return event["outpost_queue"]
            checked = len(self.events)
            if self.task.done():
                self.task.result()  # raises the source's error
                pytest.fail("the source returned on its own")
            if time.monotonic() > deadline:
                pytest.fail(f"no matching event within {timeout:g}s; got {[e['outpost_queue'] for e in self.events]}")
            await asyncio.sleep(0.05)

    def changes(self) -> list[dict[str, Any]]:
        """The change events (not queue_depth) collected so far."""
        self._drain()
        return [e["outpost_queue"] for e in self.events if e["outpost_queue"]["type"] != "queue_depth"]

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):  # the test already judged the source's outcome
            pass


@pytest_asyncio.fixture
async def collect(source: dict[str, Any]) -> Any:
    """``collect(args)``: start the source; every collector is stopped at the end of the test."""
    started: list[Collector] = []

    def start(args: dict[str, Any], main: Optional[Callable[..., Any]] = None) -> Collector:
        collector = Collector(main or source["main"], args)
        started.append(collector)
        return collector

    yield start
    for collector in started:
        await collector.stop()


@pytest.fixture
def watching(sim: Any) -> Callable[..., Any]:
    """``await watching(count)``: wait until the in-process simulator has ``count`` open watch streams, i.e.
    the sources started in this test follow the queue."""

    async def wait(count: int = 1, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while sim.runtime.notifier.open_streams < count:
            if time.monotonic() > deadline:
                pytest.fail(f"fewer than {count} watch streams opened within {timeout:g}s")
            await asyncio.sleep(0.02)

    return wait
