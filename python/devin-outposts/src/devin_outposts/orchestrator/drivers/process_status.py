"""How the ``process`` driver learns that a worker ended without reading its machine on a timer.

A worker's end is a process's end, and a process's end can be awaited: no session needs to look at its
machine every ``--status-interval-secs``.

* A worker this process started is awaited through a **pidfd** (Linux 5.3+: ``os.pidfd_open`` and the
  event loop's reader, no thread) and reaped by its :class:`subprocess.Popen`. Where there is no pidfd, a
  thread parked in ``waitpid`` per worker does it, as asyncio's own child watcher would on Python 3.11 (one
  thread per worker: hundreds at hundreds of sessions, hence the pidfd first).
* A worker an earlier orchestrator started (adopted after a restart: not our child, so not ours to reap)
  is awaited through a pidfd too, opened after its record's start time was checked, so a reused pid is
  never followed; elsewhere its machine is read every :data:`ADOPTED_POLL` seconds.
* :class:`ProcessStatusSource` is the driver's :class:`~.base.StatusSource`: it lists every machine
  of its acceptor id (files only, no process started) every :data:`RECONCILE_INTERVAL` seconds, follows each
  running worker, and is told of each start and each end by the driver at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import threading
import time
from collections.abc import Iterable, MutableSet
from typing import Callable, Optional, Protocol

from devin_outposts.orchestrator.drivers.base import StatusSink, WorkerState, WorkerStatus

#: Seconds between two listings of every machine (a safety net: starts and ends are reported at once).
RECONCILE_INTERVAL = 30.0
#: Seconds between two reads of an adopted worker's machine where no pidfd can await its end.
ADOPTED_POLL = 10.0


#: ``os.pidfd_open`` where this Python has it (Linux only; looked up so that every platform type-checks).
_PIDFD_OPEN: Optional[Callable[[int], int]] = getattr(os, "pidfd_open", None)


@functools.cache
def pidfd_works() -> bool:
    """Whether this kernel and Python give pidfds (Linux 5.3+, Python 3.9+ on Linux)."""
    if _PIDFD_OPEN is None:
        return False
    try:
        fd = _PIDFD_OPEN(os.getpid())
    except OSError:  # ENOSYS on older kernels, EPERM under some seccomp profiles
        return False
    os.close(fd)
    return True


def open_pidfd(pid: int) -> Optional[int]:
    """A pidfd of ``pid``, or None (no pidfd on this host, or the process is gone)."""
    if _PIDFD_OPEN is None or not pidfd_works():
        return None
    try:
        return _PIDFD_OPEN(pid)
    except OSError:
        return None


async def readable(fd: int) -> None:
    """Return once ``fd`` is readable (a pidfd: once its process ended), without a thread."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def woke() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, woke)
    try:
        await ended
    finally:
        loop.remove_reader(fd)


async def child_ended(proc: subprocess.Popen[bytes]) -> None:
    """Return once our child ``proc`` ended, and reap it."""
    fd = open_pidfd(proc.pid)
    if fd is None:
        await _parked_wait(proc)
    else:
        try:
            await readable(fd)
        finally:
            os.close(fd)
    proc.poll()


async def _parked_wait(proc: subprocess.Popen[bytes]) -> None:
    """Where there is no pidfd: one thread parked in ``waitpid`` for ``proc``."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def woke() -> None:
        if not ended.done():
            ended.set_result(None)

    def wait() -> None:
        proc.wait()
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(woke)

    threading.Thread(target=wait, name=f"process-driver-wait-{proc.pid}", daemon=True).start()
    await ended


class FollowingDriver(Protocol):
    """What the source needs of the ``process`` driver (:class:`~.process.ProcessDriver`)."""

    @property
    def sources(self) -> MutableSet[ProcessStatusSource]:
        """The sources running on the driver (told of each start and end)."""

    def machine_names(self, acceptor_id: str) -> Iterable[str]:
        """The names of every machine made for ``acceptor_id``."""

    def read_status(self, name: str) -> WorkerStatus:
        """A machine's status, read at once (files and ``/proc`` only)."""

    def follow(self, name: str, acceptor_id: str) -> None:
        """Await the end of ``name``'s running worker, once."""


class ProcessStatusSource:
    """Every machine of ``acceptor_id`` on one ``process`` driver, as one stream (module docs)."""

    def __init__(
        self, driver: FollowingDriver, acceptor_id: str, *, reconcile_interval: float = RECONCILE_INTERVAL
    ) -> None:
        self.driver = driver
        self.acceptor_id = acceptor_id
        self.reconcile_interval = reconcile_interval
        self._board: Optional[StatusSink] = None

    async def run(self, board: StatusSink) -> None:
        self._board = board
        self.driver.sources.add(self)
        try:
            while True:
                self.reconcile()
                await asyncio.sleep(self.reconcile_interval)
        finally:
            self.driver.sources.discard(self)
            self._board = None

    def reconcile(self) -> None:
        """List every machine of the acceptor id and follow each running worker. No await in here: no
        start or end can come between a machine's read and the listing's end, so none is lost or stale."""
        board = self._board
        if board is None:
            return
        as_of = time.monotonic()
        statuses = {}
        for name in self.driver.machine_names(self.acceptor_id):
            status = statuses[name] = self.driver.read_status(name)
            if status.state is WorkerState.RUNNING:
                self.driver.follow(name, self.acceptor_id)
        board.replace_all(statuses, as_of=as_of)

    def report(self, name: str, acceptor_id: str, status: WorkerStatus) -> None:
        """The driver saw ``name``'s worker start or end: its status now."""
        if self._board is not None and acceptor_id == self.acceptor_id:
            self._board.put(name, status)
