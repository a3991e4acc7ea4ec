"""Machine status from one stream per driver (orchestrator/drivers/status_board.py).

The board's own rules first (a listing marks what it no longer shows as gone, unless the stream showed it
after the listing began; waiters wake on a change or a lost sync), then the orchestrator with a scripted
driver whose status source lists every machine: sessions read nothing directly while the board is in sync,
fall back to direct reads while it is not, and a platform that names a reason for not starting a worker
gets the session released after ``--start-failure-grace`` seconds, with that reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
from orchestrator_fakes import Running, ScriptedDriver, ScriptedSource, orchestrators, released

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers.base import WorkerState, WorkerStatus
from devin_outposts.orchestrator.drivers.status_board import StatusBoard
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for

RUNNING = WorkerStatus(WorkerState.RUNNING)
EXITED = WorkerStatus(WorkerState.EXITED, exit_code=0)


def test_a_listing_marks_unlisted_machines_gone_but_not_ones_made_while_it_ran() -> None:
    board = StatusBoard()
    assert board.row("m-1") is None  # nothing trusted before the first listing
    board.replace_all({"m-1": RUNNING, "m-2": RUNNING}, as_of=time.monotonic())
    listing_began = time.monotonic()
    board.put("m-3", RUNNING)  # the stream shows a machine made while the next listing runs
    board.replace_all({"m-1": RUNNING}, as_of=listing_began)
    row1, row2, row3 = board.row("m-1"), board.row("m-2"), board.row("m-3")
    assert row1 is not None and row1.status == RUNNING
    assert row2 is not None and row2.status.state is WorkerState.MISSING
    assert row3 is not None and row3.status == RUNNING
    # A machine reported gone and still unlisted is dropped by the next listing; a deletion of a machine
    # the board does not hold (torn down and forgotten) adds nothing.
    board.replace_all({"m-1": RUNNING}, as_of=time.monotonic())
    assert board.row("m-2") is None
    board.gone("m-9")
    assert board.row("m-9") is None
    assert len(board) == 2


def test_waiters_wake_on_a_change_or_a_lost_sync_and_not_on_an_unchanged_status() -> None:
    async def scenario() -> list[str]:
        board = StatusBoard()
        board.replace_all({"m-1": RUNNING}, as_of=time.monotonic())
        row = board.row("m-1")
        assert row is not None
        woke: list[str] = []

        async def wait(label: str, after: int) -> None:
            began = time.monotonic()
            await board.changed("m-1", after=after, timeout=5)
            woke.append(f"{label}:{time.monotonic() - began < 1}")

        waiter = asyncio.ensure_future(wait("change", row.version))
        await asyncio.sleep(0.05)
        board.put("m-1", RUNNING)  # the same status: nobody wakes
        await asyncio.sleep(0.05)
        assert not waiter.done()
        board.put("m-1", EXITED)
        await waiter
        latest = board.row("m-1")
        assert latest is not None and latest.status == EXITED
        waiter = asyncio.ensure_future(wait("sync", latest.version))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        board.lost_sync()
        await waiter
        assert board.row("m-1") is None  # out of sync: nothing is trusted
        return woke

    assert asyncio.run(scenario()) == ["change:True", "sync:True"]


@pytest.fixture
def start(sim: SimHandle, outpost: Outpost, tmp_path: Path) -> Iterator[Callable[..., Running]]:
    with orchestrators(
        sim,
        tmp_path / "state",
        outpost=outpost.name,
        max_concurrent=3,
        acceptor_id="orch-board",
        gc_interval=30.0,
    ) as run:
        yield run


def test_sessions_wait_on_the_stream_and_read_directly_only_while_it_is_out_of_sync(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running]
) -> None:
    ended: set[str] = set()
    driver = ScriptedDriver(lambda sid, starts: EXITED if sid in ended else RUNNING)
    driver.source = ScriptedSource(driver)
    orch = start(driver)
    sids = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(3)]
    wait_for(lambda: len(driver.machines) == 3, timeout=20, what="three machines")
    time.sleep(1.0)  # 20 status intervals: polling would have read each machine about 20 times
    with driver.lock:
        in_sync_reads = dict(driver.status_reads)
    # At most the first look of each launch (the stream may not have shown the machine yet).
    assert all(in_sync_reads.get(sid, 0) <= 1 for sid in sids), in_sync_reads
    assert driver.source.listings >= 5

    driver.source.broken.set()  # out of sync: sessions read their machines themselves
    wait_for(
        lambda: all(driver.status_reads.get(sid, 0) >= 5 for sid in sids), timeout=10, what="direct reads"
    )
    driver.source.broken.clear()
    time.sleep(0.3)
    with driver.lock:
        resynced = dict(driver.status_reads)
    time.sleep(0.5)
    with driver.lock:
        assert driver.status_reads == resynced  # in sync again: no more direct reads

    # A worker's end reaches its session through the stream alone: the session is still live, so the
    # orchestrator starts its worker again.
    ended.add(sids[0])
    wait_for(lambda: driver.starts(sids[0]) >= 2, timeout=20, what="the exit seen and the worker restarted")
    with driver.lock:
        assert driver.status_reads.get(sids[0], 0) <= resynced.get(sids[0], 0) + 1
    assert orch.orchestrator.board.listings >= 5


def test_a_worker_the_platform_cannot_start_is_released_after_the_grace_with_its_reason(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    driver = ScriptedDriver(
        lambda sid, starts: WorkerStatus(
            WorkerState.STARTING, detail='pulling image "registry.test/nope"', reason="ImagePullBackOff"
        )
    )
    driver.source = ScriptedSource(driver)
    orch = start(driver, start_failure_grace=0.5, max_concurrent=1)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    began = time.monotonic()
    wait_for(lambda: released(sim, sid), timeout=20, what="the release")
    took = time.monotonic() - began
    result = wait_for(
        lambda: next((r for r in orch.orchestrator.results if r.session_id == sid), None),
        timeout=10,
        what="the result",
    )
    assert result.infrastructure and result.reason == "ImagePullBackOff"
    assert "did not start: ImagePullBackOff" in result.detail
    assert took < 25  # far inside the 30 s boot timeout: the grace, not the boot timeout, ended it
    wait_for(lambda: sid in driver.torn_down, timeout=10, what="the teardown")
    assert any("ImagePullBackOff" in r.getMessage() for r in caplog.records)
