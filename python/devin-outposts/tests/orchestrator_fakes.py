"""Test helpers for the orchestrator: a scripted driver, an in-process orchestrator on its own thread, and
a factory of those against the simulator."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts.orchestrator.drivers.base import (
    Driver,
    DriverContext,
    DriverError,
    Machine,
    SessionSpec,
    Snapshot,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    machine_name,
)
from devin_outposts.orchestrator.drivers.status_board import StatusBoard, StatusSource
from devin_outposts.orchestrator.options import OrchestratorConfig
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts_sim.testing import SimHandle

Script = Callable[[str, int], WorkerStatus]


def released(sim: SimHandle, session_id: str) -> bool:
    """The simulator's claim history has a release of ``session_id``."""
    return any(r["action"] == "release" for r in sim.admin.claims(session_id=session_id))


class ScriptedDriver(Driver):
    """Machines in memory; ``script(session_id, starts)`` answers status reads."""

    name = "scripted"

    def __init__(self, script: Script, *, provision_delay: float = 0.0, fail_provision: bool = False) -> None:
        self.script = script
        self.provision_delay = provision_delay
        self.fail_provision = fail_provision
        self.machines: dict[str, Machine] = {}
        self.launches: dict[str, list[WorkerLaunch]] = {}
        self.torn_down: list[str] = []
        self.lock = threading.Lock()
        #: Direct status reads, by session (what a status source saves).
        self.status_reads: dict[str, int] = {}
        #: The status source :meth:`status_source` offers (None: the driver has none).
        self.source: Optional[ScriptedSource] = None

    @classmethod
    def from_options(cls, context: DriverContext, options: Mapping[str, Any]) -> ScriptedDriver:
        """A driver whose every worker runs (the tests that script more construct it directly)."""
        return cls(lambda sid, starts: WorkerStatus(WorkerState.RUNNING))

    async def provision(self, spec: SessionSpec) -> Machine:
        await asyncio.sleep(self.provision_delay)
        if self.fail_provision:
            raise DriverError("no capacity in the test cloud")
        machine = Machine(
            machine_name("m", spec.session_id), spec.session_id, spec.outpost_id, spec.acceptor_id
        )
        with self.lock:
            self.machines[spec.session_id] = machine
        return machine

    async def start(self, machine: Machine, launch: WorkerLaunch) -> None:
        with self.lock:
            self.launches.setdefault(machine.session_id, []).append(launch)

    def starts(self, session_id: str) -> int:
        with self.lock:
            return len(self.launches.get(session_id, []))

    def status_source(self, acceptor_id: str) -> Optional[StatusSource]:
        return self.source

    async def status(self, machine: Machine) -> WorkerStatus:
        with self.lock:
            self.status_reads[machine.session_id] = self.status_reads.get(machine.session_id, 0) + 1
        if machine.session_id not in self.machines:
            return WorkerStatus(WorkerState.MISSING)
        return self.script(machine.session_id, self.starts(machine.session_id))

    async def teardown(self, machine: Machine) -> None:
        with self.lock:
            if self.machines.pop(machine.session_id, None) is not None:
                self.torn_down.append(machine.session_id)

    async def list_owned(self, acceptor_id: str, outpost_id: str) -> list[Machine]:
        with self.lock:
            return [
                m
                for m in self.machines.values()
                if m.acceptor_id == acceptor_id and m.outpost_id == outpost_id
            ]

    async def snapshot(self, machine: Machine) -> Snapshot:
        raise DriverError("no snapshots here")

    async def restore(self, machine: Machine, snapshot: Snapshot) -> None:
        raise DriverError("no snapshots here")

    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        return []

    async def delete_snapshot(self, snapshot: Snapshot) -> None:
        return None


class ScriptedSource:
    """A status stream over a :class:`ScriptedDriver`: lists every machine from the script every
    ``interval`` seconds (the board changes only when a status does), until told to break."""

    def __init__(self, driver: ScriptedDriver, interval: float = 0.05) -> None:
        self.driver = driver
        self.interval = interval
        #: While set, the stream is broken: the board is out of sync and nothing is listed.
        self.broken = threading.Event()
        self.listings = 0

    async def run(self, board: StatusBoard) -> None:
        while True:
            if self.broken.is_set():
                board.lost_sync()
            else:
                as_of = time.monotonic()
                with self.driver.lock:
                    machines = list(self.driver.machines.values())
                statuses = {
                    m.name: self.driver.script(m.session_id, self.driver.starts(m.session_id))
                    for m in machines
                }
                board.replace_all(statuses, as_of=as_of)
                self.listings += 1
            await asyncio.sleep(self.interval)


class Running:
    """An in-process orchestrator on its own thread and event loop."""

    def __init__(self, orchestrator: Orchestrator) -> None:
        self.orchestrator = orchestrator
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.code: Optional[int] = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        async def main() -> int:
            self.loop = asyncio.get_running_loop()
            return await self.orchestrator.run()

        try:
            self.code = asyncio.run(main())
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        if self.loop is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.orchestrator.stop)
        self.thread.join(30)
        assert not self.thread.is_alive(), "the orchestrator did not stop"


#: The tuning the tests' in-process orchestrators share: loops of a few tens of milliseconds, so that a
#: scripted status change, a release or a sweep is seen at once; boots are never timed out by accident.
TEST_TUNING: Mapping[str, Any] = {
    "driver": "process", "status_interval": 0.05, "poll_interval": 0.2, "confirm_interval": 0.05,
    "confirm_reads": 2, "gc_interval": 0.2, "backoff_max": 1.0, "boot_timeout": 30.0,
}  # fmt: skip


@contextlib.contextmanager
def orchestrators(sim: SimHandle, state_dir: Path, **defaults: Any) -> Iterator[Callable[..., Running]]:
    """Start orchestrators against ``sim`` on their own threads: ``start(driver, **overrides)`` runs one
    with :data:`TEST_TUNING`, then ``defaults`` (the test file's outpost, acceptor id, caps...), then the
    call's ``overrides``, as :class:`OrchestratorConfig` options. Every one started is stopped on exit."""
    token = sim.create_token("orchestrator")
    started: list[Running] = []

    def start(driver: Driver, **overrides: Any) -> Running:
        options: dict[str, Any] = {
            **TEST_TUNING,
            "state_dir": state_dir,
            "api_url": sim.url,
            "token": token,
            **defaults,
            **overrides,
        }
        running = Running(Orchestrator(OrchestratorConfig(**options), driver=driver))
        started.append(running)
        return running

    try:
        yield start
    finally:
        for running in started:
            running.stop()
