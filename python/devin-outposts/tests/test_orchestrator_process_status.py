"""The ``process`` driver's status source: workers' ends awaited, not read on a timer.

The driver on its own with a status board (workers it started, workers it adopted, workers that cannot be
run), then an orchestrator in this process with ten sessions whose workers are a holding script. Every
assertion is on observed state: board rows, the driver's ``status()`` calls counted by a subclass, the
starts it was asked for, the threads of this process, the claims the simulator recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from orchestrator_fakes import Running

from devin_outposts.api.models import Outpost
from devin_outposts.orchestrator.drivers.base import (
    Machine,
    SessionSpec,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    machine_name,
)
from devin_outposts.orchestrator.drivers.process import ProcessDriver
from devin_outposts.orchestrator.drivers.process_status import ProcessStatusSource, pidfd_works
from devin_outposts.orchestrator.drivers.status_board import StatusBoard
from devin_outposts.orchestrator.options import OrchestratorConfig
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts_sim.testing import SimHandle

from worker_fakes import kill_pids_working_under, wait_for

ACCEPTOR = "orch-procans"
#: Holds until SIGTERM, as a worker serving a session would (the session is never served: nothing connects).
HOLD = "#!/bin/sh\ntrap 'exit 0' TERM\nsleep 3600 &\nwait\n"


class CountingDriver(ProcessDriver):
    """The real driver, counting the direct status reads and the starts sessions ask for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.reads: dict[str, int] = {}
        self.started: dict[str, int] = {}

    async def status(self, machine: Machine) -> WorkerStatus:
        with self.lock:
            self.reads[machine.session_id] = self.reads.get(machine.session_id, 0) + 1
        return await super().status(machine)

    async def start(self, machine: Machine, launch: WorkerLaunch) -> None:
        with self.lock:
            self.started[machine.session_id] = self.started.get(machine.session_id, 0) + 1
        await super().start(machine, launch)

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        with self.lock:
            return dict(self.reads), dict(self.started)


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    # What a test left running (sessions detach at the orchestrator's stop); killed until none is left.
    wait_for(lambda: not kill_pids_working_under(tmp_path), timeout=30, what="no process left")


def script(path: Path, text: str, mode: int = 0o755) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def leader(driver: ProcessDriver, name: str) -> int:
    """The pid the machine's leader recorded. It writes the record itself once started, which can come
    just after the board shows the machine running (it did on a loaded machine): wait for it, whole."""

    def record() -> Optional[dict[str, Any]]:
        try:
            found: dict[str, Any] = json.loads((driver.machines_dir / name / "worker.pid").read_text())
        except (OSError, ValueError):
            return None
        return found

    return int(wait_for(record, what=f"{name}/worker.pid")["pid"])


async def started(driver: ProcessDriver, session_id: str) -> Machine:
    machine = await driver.provision(SessionSpec(session_id, "outpost-1", ACCEPTOR))
    await driver.start(machine, WorkerLaunch(session_id, "connect-token", "wss://gateway.invalid"))
    return machine


async def row_until(board: StatusBoard, name: str, done: Callable[[WorkerStatus], bool]) -> WorkerStatus:
    for dummy in range(400):  # at most 20 s: only shows that nothing hangs
        row = board.row(name)
        if row is not None and done(row.status):
            return row.status
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name}: {board.row(name)}")


def ended(status: WorkerStatus) -> bool:
    return status.state is not WorkerState.RUNNING


def test_the_stream_reports_starts_and_ends_of_its_own_workers_without_a_thread_each(workdir: Path) -> None:
    hold = script(workdir / "hold.sh", HOLD)
    driver = CountingDriver(workdir / "process", (str(hold),), stop_grace=2)
    # No listing after the first: only the starts and the ends themselves can reach the board.
    source = ProcessStatusSource(driver, ACCEPTOR, reconcile_interval=3600)

    async def scenario() -> tuple[list[WorkerStatus], WorkerStatus, int, int]:
        board = StatusBoard()
        task = asyncio.ensure_future(source.run(board))
        await asyncio.sleep(0)
        threads = threading.active_count()
        machines = [await started(driver, f"devin-{i}") for i in range(20)]
        grown = threading.active_count() - threads
        running = [await row_until(board, m.name, lambda s: s.state is WorkerState.RUNNING) for m in machines]
        os.killpg(leader(driver, machines[0].name), signal.SIGKILL)  # killed from outside
        end = await row_until(board, machines[0].name, ended)
        for machine in machines:
            await driver.teardown(machine)
        task.cancel()
        await driver.aclose()
        return running, end, grown, board.listings

    running, end, grown, listings = asyncio.run(scenario())
    assert {s.state for s in running} == {WorkerState.RUNNING}
    assert (end.state, end.exit_code) == (WorkerState.EXITED, 128 + 9), end
    assert listings == 1 and driver.counts()[0] == {}  # the end came from the process, not from a read
    if pidfd_works():
        assert grown == 0, f"{grown} threads for 20 workers"  # asyncio 3.11's watcher parks one per child


def test_a_restarted_driver_follows_the_workers_it_adopts(workdir: Path) -> None:
    hold = script(workdir / "hold.sh", HOLD)
    first = ProcessDriver(workdir / "process", (str(hold),), stop_grace=2)

    async def start_two() -> list[Machine]:
        machines = [await started(first, "devin-a"), await started(first, "devin-b")]
        for machine in machines:  # each leader recorded itself (what a successor adopts it by)
            await asyncio.to_thread(wait_for, (first.machines_dir / machine.name / "worker.pid").exists)
        await first.aclose()  # the orchestrator stops; its workers run on
        return machines

    machines = asyncio.run(start_two())
    second = CountingDriver(workdir / "process", (str(hold),), stop_grace=2)
    source = ProcessStatusSource(second, ACCEPTOR, reconcile_interval=3600)

    async def adopt() -> tuple[WorkerStatus, WorkerStatus, int]:
        board = StatusBoard()
        task = asyncio.ensure_future(source.run(board))
        for machine in machines:
            await row_until(board, machine.name, lambda s: s.state is WorkerState.RUNNING)
        # The worker ends by itself (an exit record) and by a kill (none): both reach the board.
        os.kill(leader(second, machines[0].name), signal.SIGTERM)
        os.killpg(leader(second, machines[1].name), signal.SIGKILL)
        exited = await row_until(board, machines[0].name, ended)
        killed = await row_until(board, machines[1].name, ended)
        for machine in machines:
            await second.teardown(machine)
        task.cancel()
        await second.aclose()
        return exited, killed, board.listings

    exited, killed, listings = asyncio.run(adopt())
    assert (exited.state, killed.state) == (WorkerState.EXITED, WorkerState.EXITED)
    assert (killed.exit_code, killed.detail) == (128 + 9, "killed (no exit record)")
    assert listings == 1 and second.counts()[0] == {}


@pytest.mark.parametrize("program", ["missing", "not-executable"])
def test_a_worker_command_that_cannot_run_fails_with_exec_failed(workdir: Path, program: str) -> None:
    command = workdir / "bin" / "devin-outposts"
    command.parent.mkdir()
    if program == "not-executable":
        script(command, HOLD, mode=0o644)
    driver = ProcessDriver(workdir / "process", (str(command),), stop_grace=2)
    source = ProcessStatusSource(driver, ACCEPTOR, reconcile_interval=3600)

    async def scenario() -> tuple[WorkerStatus, WorkerStatus]:
        board = StatusBoard()
        task = asyncio.ensure_future(source.run(board))
        machine = await started(driver, "devin-x")
        streamed = await row_until(board, machine.name, lambda s: s.state is not WorkerState.RUNNING)
        read = await driver.status(machine)
        await driver.teardown(machine)
        task.cancel()
        return streamed, read

    streamed, read = asyncio.run(scenario())
    assert streamed == read
    assert (read.state, read.reason) == (WorkerState.FAILED, "exec-failed"), read
    assert ("not found" if program == "missing" else "not executable") in read.detail


def test_a_worker_that_exits_127_itself_is_an_exit_not_an_exec_failure(workdir: Path) -> None:
    command = script(workdir / "worker.sh", "#!/bin/sh\nexit 127\n")
    driver = ProcessDriver(workdir / "process", (str(command),), stop_grace=2)

    async def scenario() -> WorkerStatus:
        machine = await started(driver, "devin-y")
        for dummy in range(400):
            status = await driver.status(machine)
            if status.state is not WorkerState.RUNNING:
                break
            await asyncio.sleep(0.05)
        await driver.teardown(machine)
        await driver.aclose()
        return status

    status = asyncio.run(scenario())
    assert (status.state, status.exit_code, status.reason) == (WorkerState.EXITED, 127, "")


# --- an orchestrator in this process -----------------------------------------------------------------


@pytest.fixture
def orchestrate(sim: SimHandle, outpost: Outpost, workdir: Path) -> Iterator[Callable[..., Running]]:
    token = sim.create_token("orchestrator")
    runs: list[Running] = []

    def run(driver: ProcessDriver, **overrides: Any) -> Running:
        options: dict[str, Any] = {
            "outpost": outpost.name, "driver": "process", "max_concurrent": 10,
            "state_dir": workdir / "state", "acceptor_id": ACCEPTOR, "api_url": sim.url, "token": token,
            "status_interval": 0.05, "poll_interval": 0.2, "confirm_interval": 0.05, "confirm_reads": 2,
            "gc_interval": 30.0, "backoff_max": 1.0, "boot_timeout": 120.0, **overrides,
        }  # fmt: skip
        running = Running(Orchestrator(OrchestratorConfig(**options), driver=driver))
        runs.append(running)
        return running

    yield run
    for running in runs:
        running.stop()


def live_leaders(driver: ProcessDriver, count: int) -> Optional[dict[str, int]]:
    """Machine name -> the pid of its running worker, once ``count`` workers run."""
    found = {}
    for path in driver.machines_dir.iterdir() if driver.machines_dir.is_dir() else ():
        if driver.read_status(path.name).state is WorkerState.RUNNING and (path / "worker.pid").exists():
            found[path.name] = leader(driver, path.name)
    return found if len(found) == count else None


def test_ten_sessions_wait_on_their_workers_ends_and_never_read_their_machines(
    sim: SimHandle, outpost: Outpost, workdir: Path, orchestrate: Callable[..., Running]
) -> None:
    hold = script(workdir / "hold.sh", HOLD)
    driver = CountingDriver(workdir / "state" / "process", (str(hold),), stop_grace=2)
    orchestrate(driver)
    sids = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(10)]
    leaders = wait_for(lambda: live_leaders(driver, 10), timeout=60, what="ten running workers")
    time.sleep(1.0)  # 20 status intervals: polling would have read each machine about 20 times
    reads, starts = driver.counts()
    assert reads == {}, reads  # each session waits on its row: the start reported it
    assert starts == dict.fromkeys(sids, 1)

    name = next(iter(leaders))
    sid = next(s for s in sids if machine_name("outpost-worker", s) == name)
    os.killpg(leaders[name], signal.SIGKILL)  # the worker killed from outside: its session starts another
    wait_for(lambda: driver.counts()[1][sid] >= 2, timeout=30, what="the worker started again")
    assert driver.counts()[0].get(sid, 0) <= 1


def test_a_worker_command_that_cannot_run_releases_the_session_at_once(
    sim: SimHandle, outpost: Outpost, workdir: Path, orchestrate: Callable[..., Running]
) -> None:
    command = script(workdir / "devin-outposts", HOLD, mode=0o644)  # a file (check passes) not executable
    driver = CountingDriver(workdir / "state" / "process", (str(command),), stop_grace=2)
    orch = orchestrate(driver)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    began = time.monotonic()
    result: Optional[Any] = wait_for(
        lambda: next((r for r in orch.orchestrator.results if r.session_id == sid), None),
        timeout=110,
        what="the session's result",
    )
    took = time.monotonic() - began
    assert result is not None and result.infrastructure and result.reason == "exec-failed", result
    assert "not executable" in result.detail
    wait_for(
        lambda: any(r["action"] == "release" for r in sim.admin.claims(session_id=sid)),
        timeout=30,
        what="the claim released",
    )
    assert took < 60  # far inside the 120 s boot timeout: the failure, not the timeout, ended it
