"""The latest status of every machine a driver watches, and the sessions waiting on it.

Reading each machine's status on a timer costs one request per machine per interval (a GET per Pod, a
``podman inspect`` per container): at hundreds of machines that is most of the orchestrator's work and
of the platform's load. A driver that can follow its machines as a stream instead (one list-and-watch
of its Pods, one ``podman events`` child, its own children's exits) offers a :class:`StatusSource`
(declared with the driver interface, in :mod:`~devin_outposts.orchestrator.drivers.base`);
the orchestrator runs that one source per process, it writes into a :class:`StatusBoard`, and each
session's :class:`~devin_outposts.orchestrator.machine.MachineRun` waits on its machine's row instead of
reading (docs/orchestrator.md, "Machine status").

The board is trusted only while its source says it is in sync (:attr:`StatusBoard.synced`): after a
list, until the stream breaks. Out of sync, or for a machine the stream has not shown yet (made a moment
ago), a session reads its machine directly as before, every ``--status-interval-secs``. So a source that
stops, falls behind or never starts costs requests, never a machine's end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Optional

from devin_outposts.orchestrator.drivers.base import StatusSink, StatusSource, WorkerState, WorkerStatus

__all__ = ["Row", "StatusBoard", "StatusSink", "StatusSource"]


@dataclass
class Row:
    """One machine's latest status; ``version`` grows with each change; ``seen`` is when (monotonic) the
    source last reported the machine, changed or not."""

    status: WorkerStatus
    version: int
    seen: float


class StatusBoard:
    """The latest :class:`WorkerStatus` per machine name, fed by one :class:`StatusSource` (it is the
    :class:`~devin_outposts.orchestrator.drivers.base.StatusSink` sources write to)."""

    def __init__(self) -> None:
        self._rows: dict[str, Row] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._version = 0
        self._synced = False
        #: Every status change written, and every full listing (what the benchmark and tests count).
        self.changes = 0
        self.listings = 0

    # --- what a source writes -------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """The board reflects the platform: a listing was taken and the stream since has not broken."""
        return self._synced

    def lost_sync(self) -> None:
        """The stream broke: sessions read their machines directly until the next :meth:`replace_all`
        (every waiting session is woken to do so)."""
        self._synced = False
        for name in list(self._waiters):
            self._wake(name)

    def put(self, name: str, status: WorkerStatus) -> None:
        """``name``'s status is now ``status`` (an unchanged status wakes nobody)."""
        row = self._rows.get(name)
        if row is not None and row.status == status:
            row.seen = time.monotonic()
            return
        self._version += 1
        self._rows[name] = Row(status, self._version, time.monotonic())
        self.changes += 1
        self._wake(name)

    def _wake(self, name: str) -> None:
        for waiter in self._waiters.pop(name, ()):
            if not waiter.done():
                waiter.set_result(None)

    def replace_all(self, statuses: Mapping[str, WorkerStatus], *, as_of: float) -> None:
        """A full listing taken at ``as_of`` (monotonic, when the listing *began*): each listed machine
        gets its status, and a machine on the board but not listed is gone, unless the stream showed it
        after ``as_of`` (made while the listing ran). Then the board is in sync."""
        self.listings += 1
        for name, status in statuses.items():
            self.put(name, status)
        for name, row in list(self._rows.items()):
            if name in statuses or row.seen >= as_of:
                continue
            if row.status.state is WorkerState.MISSING:
                del self._rows[name]  # reported gone before this listing: nobody waits on it any more
            else:
                self.put(name, WorkerStatus(WorkerState.MISSING, detail="not listed by the driver"))
        self._synced = True

    def gone(self, name: str, detail: str = "deleted") -> None:
        """The stream says ``name`` was deleted (a machine the board does not hold is ignored: it was
        torn down and forgotten, or never ours)."""
        if name in self._rows:
            self.put(name, WorkerStatus(WorkerState.MISSING, detail=detail))

    # --- what a session reads ------------------------------------------------------------------------

    def row(self, name: str, *, since: float = 0.0) -> Optional[Row]:
        """``name``'s latest row while the board is in sync and the source has reported the machine
        since ``since`` (monotonic: a worker just started makes older rows stale); None when it cannot
        be trusted or the stream has not shown the machine (yet)."""
        row = self._rows.get(name) if self._synced else None
        return row if row is not None and row.seen >= since else None

    async def changed(self, name: str, *, after: int, timeout: float) -> None:
        """Return once ``name``'s row is newer than version ``after``, the board loses sync, or
        ``timeout`` seconds pass (whichever comes first; the caller then looks again)."""
        row = self._rows.get(name)
        if row is not None and row.version > after:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(name, set()).add(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(name)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[name]

    def forget(self, names: Iterable[str]) -> None:
        """Drop rows nobody will read again (machines torn down)."""
        for name in names:
            self._rows.pop(name, None)

    def __len__(self) -> int:
        return len(self._rows)
