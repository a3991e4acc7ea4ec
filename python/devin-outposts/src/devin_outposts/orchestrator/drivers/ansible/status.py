"""The ``ansible`` driver's status source: every session unit of every host read by ONE ad-hoc run.

Reading one machine costs a whole ansible-runner run (an ``ansible`` process, a connection, a module):
one per machine every ``--status-interval-secs`` was by far the most expensive status read of any driver.
:class:`AnsibleStatusSource` instead reads every machine of its acceptor id with one ad-hoc run every
``status_interval`` seconds: ``systemctl show`` of all the session units of each host at once, the hosts in
parallel (``--forks``). So the cost is one run per interval whatever the number of machines, and a worker
that dies while its session stays live is seen within one interval (a session that ends is seen sooner,
through its queue entry). After a worker is started the machine is read again within
:data:`STARTED_READ_DELAY` seconds (one run for every start of that moment), so a unit that fails at once is
not left for a whole interval.

What one run cannot tell is not guessed: a host that did not answer keeps its machines' last statuses,
until it was unreachable :data:`~.driver.UNREACHABLE_LIMIT` runs in a row (then its machines are gone, as
for :meth:`~.driver.AnsibleDriver.status`); a run that produced no answer at all (ansible-runner broken,
every host hung until ``status_timeout``) keeps every last status too and is retried sooner, and only the
third such run in a row breaks the stream (sessions then read their machines directly, each read a run of
its own, until a run answers again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, MutableSet
from typing import Any, Optional, Protocol

from devin_outposts.orchestrator.drivers.ansible import _run
from devin_outposts.orchestrator.drivers.ansible.records import MachineRecords
from devin_outposts.orchestrator.drivers.ansible.units import parse_unit_state, parse_units, unit_of
from devin_outposts.orchestrator.drivers.base import StatusSink, WorkerState, WorkerStatus

log = logging.getLogger(__name__)

#: Seconds after a worker's start before its machine is read (its unit comes up meanwhile, and the starts
#: of a burst share the run).
STARTED_READ_DELAY = 5.0
#: Hosts read at once in one run.
MAX_FORKS = 50
#: Seconds before the next run after one that answered nothing, doubled up to the status interval.
RETRY_PAUSE = 5.0
#: The inventory variable that carries a host's session units into the one command line.
UNITS_VAR = "devin_outposts_status_units"


class ReadingDriver(Protocol):
    """What the source needs of the ``ansible`` driver (:class:`~.driver.AnsibleDriver`)."""

    @property
    def sources(self) -> MutableSet[AnsibleStatusSource]:
        """The sources running on the driver (told of each start)."""

    @property
    def records(self) -> MachineRecords:
        """The driver's record of each machine."""

    @property
    def unreachable_limit(self) -> int:
        """Unanswered runs in a row after which an unreachable host's machines are gone."""

    async def read_units(self, hosts: Mapping[str, Mapping[str, Any]], *, forks: int) -> _run.RunResult:
        """One ad-hoc run of ``systemctl show`` of each host's units, on every host at once."""


class AnsibleStatusSource:
    """Every machine of ``acceptor_id`` on one ``ansible`` driver, read by one run per interval."""

    def __init__(self, driver: ReadingDriver, acceptor_id: str, *, interval: float) -> None:
        self.driver = driver
        self.acceptor_id = acceptor_id
        self.interval = interval
        self._board: Optional[StatusSink] = None
        #: What this source last wrote per machine (what a host that did not answer keeps).
        self._last: dict[str, WorkerStatus] = {}
        #: When (monotonic) each machine's worker was last started: a run that began before then
        #: describes the worker it replaced.
        self._started: dict[str, float] = {}
        self._unanswered: dict[str, int] = {}
        #: Runs in a row that answered nothing at all.
        self._broken = 0
        self._soon = asyncio.Event()
        #: Runs made (what tests and the benchmark count).
        self.runs = 0

    async def run(self, board: StatusSink) -> None:
        self._board = board
        self.driver.sources.add(self)
        pause = RETRY_PAUSE
        try:
            while True:
                if await self.read_all(board):
                    pause = RETRY_PAUSE
                    await self._next_run()
                    continue
                if self._broken >= self.driver.unreachable_limit:
                    board.lost_sync()  # sessions read their machines themselves until a run answers
                await asyncio.sleep(min(pause, self.interval))
                pause *= 2
        finally:
            self.driver.sources.discard(self)
            self._board = None

    async def _next_run(self) -> None:
        """Wait the interval, or less once a worker was started (then a short delay, shared by a burst)."""
        try:
            await asyncio.wait_for(self._soon.wait(), self.interval)
        except asyncio.TimeoutError:
            return
        await asyncio.sleep(min(STARTED_READ_DELAY, self.interval))
        self._soon.clear()

    def started(self, name: str, acceptor_id: str) -> None:
        """The driver started ``name``'s worker: its row says so now, and it is read soon."""
        if self._board is None or acceptor_id != self.acceptor_id:
            return
        self._started[name] = time.monotonic()
        status = WorkerStatus(WorkerState.STARTING, detail="worker started; reading its unit")
        self._last[name] = status
        self._board.put(name, status)
        self._soon.set()

    async def read_all(self, board: StatusSink) -> bool:
        """One run over every machine, written to ``board``; False when the run answered nothing (the
        last statuses are written again then, until that happened ``unreachable_limit`` times in a row:
        then nothing is, and :meth:`run` breaks the stream)."""
        as_of = time.monotonic()
        statuses: dict[str, WorkerStatus] = {}
        hosts: dict[str, dict[str, Any]] = {}
        for record in self.driver.records.of_acceptor(self.acceptor_id, skip_unreadable=True):
            name = str(record["name"])
            unit = unit_of(str(record["session_id"]))
            if not record.get("host"):
                statuses[name] = WorkerStatus(WorkerState.STARTING, detail="provisioning")
            elif unit is None:  # no worker can be started for it (start refuses the id)
                statuses[name] = WorkerStatus(WorkerState.STARTING, detail="no session unit for this id")
            else:
                entry = hosts.setdefault(str(record["host"]), {"vars": record["host_vars"], "units": {}})
                entry["units"][unit] = name
        answered = not hosts or await self._read_hosts(hosts, statuses)
        self._broken = 0 if answered else self._broken + 1
        if self._broken >= self.driver.unreachable_limit:
            return False
        # A worker started while the run ran: what the run saw is its predecessor; its own row is newer.
        meanwhile = {name for name, at in self._started.items() if at >= as_of}
        for name in meanwhile:
            statuses.pop(name, None)
        self._started = {name: self._started[name] for name in meanwhile}
        self._last = {**statuses, **{name: self._last[name] for name in meanwhile if name in self._last}}
        board.replace_all(statuses, as_of=as_of)
        return answered

    async def _read_hosts(
        self, hosts: Mapping[str, Mapping[str, Any]], statuses: dict[str, WorkerStatus]
    ) -> bool:
        """Run ``systemctl show`` of each host's units on every host at once; the statuses go to
        ``statuses``. False when no host answered at all (the run itself failed)."""
        self.runs += 1
        result = await self.driver.read_units(
            {
                host: {**entry["vars"], UNITS_VAR: " ".join(sorted(entry["units"]))}
                for host, entry in hosts.items()
            },
            forks=min(len(hosts), MAX_FORKS),
        )
        if not any(result.host_results(host) for host in hosts):  # the run itself failed: no news
            log.warning("the status run answered nothing: %s", result.failure())
            for entry in hosts.values():
                for name in entry["units"].values():
                    if name in self._last:
                        statuses[name] = self._last[name]
            return False
        for host, entry in hosts.items():
            events = result.host_results(host)
            units: Mapping[str, str] = entry["units"]
            answers = [e for e in events if e["event"] == "runner_on_ok"]
            if answers:
                self._unanswered.pop(host, None)
                blocks = parse_units(str((answers[-1].get("res") or {}).get("stdout", "")), list(units))
                for unit, name in units.items():
                    if unit in blocks:
                        statuses[name] = parse_unit_state(blocks[unit])
                    elif name in self._last:
                        statuses[name] = self._last[name]
                continue
            unreachable = any(e["event"] == "runner_on_unreachable" for e in events)
            count = self._unanswered[host] = self._unanswered.get(host, 0) + 1
            limit = self.driver.unreachable_limit
            if count <= limit:  # a host given up is not logged again at each run
                self._log_unanswered(host, result, count)
            for name in units.values():
                if unreachable and count >= limit:
                    detail = f"{host} unreachable {limit} times in a row"
                    statuses[name] = WorkerStatus(WorkerState.MISSING, detail=detail)
                elif name in self._last:
                    statuses[name] = self._last[name]
        return True

    @staticmethod
    def _log_unanswered(host: str, result: _run.RunResult, count: int) -> None:
        level = logging.WARNING if count > 1 else logging.INFO
        log.log(
            level, "could not read the session units on %s (%d in a row): %s", host, count, result.failure()
        )
