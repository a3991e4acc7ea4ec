# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT

"""Helpers for the EDA tests: the source loaded as ansible-rulebook loads it, and a runner that collects its
events from a background task."""

from __future__ import annotations

import asyncio
import os
import runpy
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
import pytest_asyncio
import yaml

from prerequisites import cannot_run

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "extensions" / "eda" / "plugins" / "event_source" / "outpost_queue.py"


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

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
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
                pytest.fail(
                    f"no matching event within {timeout:g}s; got {[e['outpost_queue'] for e in self.events]}"
                )
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


# --- ansible-rulebook ---------------------------------------------------------------------------------------


def _rulebook_missing() -> str:
    binary = Path(sys.executable).parent / "ansible-rulebook"
    if not binary.exists() and shutil.which("ansible-rulebook") is None:
        return "needs ansible-rulebook (pip install ansible-rulebook; scripts/bootstrap.sh installs it)"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "needs Java 17 (apt-get install openjdk-17-jre-headless; scripts/bootstrap.sh installs it)"
    return ""


@pytest.fixture
def rulebook_tools() -> str:
    missing = _rulebook_missing()
    if missing:
        cannot_run(f"the rulebook tests cannot run: {missing}")
    binary = Path(sys.executable).parent / "ansible-rulebook"
    return str(binary) if binary.exists() else str(shutil.which("ansible-rulebook"))


class Rulebook:
    """One ``ansible-rulebook`` process; stopped (SIGTERM, then SIGKILL) when the test ends."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_until(self, predicate: Callable[[], Any], what: str, timeout: float = 120.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(
                    f"ansible-rulebook exited ({self.proc.returncode}) before {what}:\n{self.text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} within {timeout:g}s; ansible-rulebook's log:\n{self.text()[-4000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait(timeout=20)


@pytest.fixture
def run_rulebook(rulebook_tools: str, tmp_path: Path) -> Iterator[Callable[..., Rulebook]]:
    started: list[Rulebook] = []
    link = ROOT / ".cache" / "collections" / "ansible_collections" / "devin" / "outposts"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(ROOT)

    def start(name: str, variables: dict[str, Any], inventory: str, api_url: str, token: str) -> Rulebook:
        vars_file = tmp_path / f"{name}.vars.yml"
        vars_file.write_text(yaml.safe_dump(variables), encoding="utf-8")
        inventory_file = tmp_path / f"{name}.inventory.yml"
        inventory_file.write_text(inventory, encoding="utf-8")
        env = {
            key: value
            for key, value in os.environ.items()
            if key in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "JAVA_HOME", "USER", "LOGNAME")
        }
        env.update(
            PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
            # This checkout as devin.outposts (scripts/lib.sh makes the link), never a stale installed copy.
            ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".cache" / "collections"),
            ANSIBLE_HOME=str(tmp_path / "ansible-home"),
            ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
            ANSIBLE_NOCOLOR="1",
            # The token reaches the source and the playbooks through the environment only.
            DEVIN_API_URL=api_url,
            DEVIN_OUTPOSTS_TOKEN=token,
        )
        argv = [
            rulebook_tools,
            "--rulebook",
            f"devin.outposts.{name}",
            "-i",
            str(inventory_file),
            "--vars",
            str(vars_file),
            "-v",
        ]
        rulebook = Rulebook(argv, env, tmp_path / f"{name}.log")
        started.append(rulebook)
        return rulebook

    yield start
    for rulebook in started:
        rulebook.stop()
