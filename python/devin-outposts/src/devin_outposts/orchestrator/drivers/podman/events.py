"""The podman driver's status source: one ``podman events`` child for every container of an acceptor id.

Reading each machine with ``podman inspect`` every ``--status-interval-secs`` starts one podman process per
container per interval (about 30 ms of CPU each): at hundreds of containers that is cores. Instead
:class:`PodmanEvents` keeps one long-running child,
``podman events --format json --filter type=container --filter label=<acceptor label>=<id>``, and maps what
it reports onto the status board (:mod:`~devin_outposts.orchestrator.drivers.status_board`):

* ``create``/``init`` → starting, ``start``/``unpause`` → running, ``remove`` → gone;
* ``died`` → ended with the event's ``ContainerExitCode``. podman 4.3 leaves that field out when the code is
  0 (the Go field is ``omitempty``), so a ``died`` without one reads *that* container once;
* ``cleanup`` of a container never seen running (a ``podman start`` that failed leaves no ``died``) reads
  that container once too. Nothing else starts a podman process while the stream flows.

Every :data:`RECONCILE_INTERVAL` seconds one ``podman ps --all`` of the acceptor's machines replaces the
board (:meth:`StatusSink.replace_all`, ``as_of`` when it began), which corrects anything the stream missed.
While that listing runs, events are held back and applied after it, in order, so an older listing never
overwrites a newer event; events older than the listing (wall clock) are dropped, as it shows them already.

A name keeps the id of its current container: the driver re-creates a machine's container on each start
(podman cannot change an environment), so the ``died``/``remove`` of the replaced container would otherwise
read as the machine's end. :meth:`PodmanEvents.expect` (called by the driver as soon as ``podman create``
returns) moves the name to the new id, and events of any other id are ignored.

When the child ends (podman 4.3 ends it, with exit code 0, each time its events file rotates), the board
loses sync at once (sessions read their machines directly meanwhile), and a new child starts after a
back-off with ``--since`` :data:`REPLAY_MARGIN` seconds before the last event it had, followed by one
listing. podman 4.3 ORs several ``label=`` filters of ``events``, so the child filters
by the acceptor label alone and every event is checked against our labels here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import json
import logging
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    DriverError,
    StatusSink,
    WorkerState,
    WorkerStatus,
    label_value,
)
from devin_outposts.orchestrator.drivers.podman.cli import PodmanCli
from devin_outposts.orchestrator.drivers.podman.objects import (
    KIND_MACHINE,
    LABEL_KIND,
    ended_status,
    ids_of,
    labels_of,
    listed_status,
    worker_status_of,
)

log = logging.getLogger(__name__)

#: Seconds between two full listings (``podman ps --all``) while the stream flows.
RECONCILE_INTERVAL = 30.0
#: A restarted child replays from this many seconds before the last event the previous one had.
REPLAY_MARGIN = 2.0
#: Back-off between two children: doubling from :data:`FIRST_RESTART`, capped at :data:`MAX_RESTART`; a
#: child that lived :data:`STEADY_CHILD` seconds resets it.
FIRST_RESTART = 0.5
MAX_RESTART = 30.0
STEADY_CHILD = 60.0
#: One event is one line of JSON; its ``Attributes`` hold every label, the image's too.
LINE_LIMIT = 4 << 20
#: What the child's stderr keeps for the log line when it ends.
STDERR_LINES = 5

_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:?\d\d)?$")


def event_time(text: str) -> Optional[float]:
    """An event's ``Time`` (RFC 3339 with nanoseconds, as podman prints it) as Unix seconds; None when
    unreadable (Python 3.9's ``fromisoformat`` reads neither ``Z`` nor nine digits)."""
    match = _RFC3339.match(text.strip())
    if match is None:
        return None
    whole, fraction, zone = match.groups()
    zone = zone or "Z"
    offset = datetime.timedelta()
    if zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        offset = sign * datetime.timedelta(hours=int(digits[:2]), minutes=int(digits[2:]))
    moment = datetime.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone(offset))
    return moment.timestamp() + (float(fraction) if fraction else 0.0)


def since_argument(unix_seconds: float) -> str:
    """``--since`` for podman: RFC 3339 in UTC, whole seconds (rounded down: a replay too early is
    harmless, one too late loses events)."""
    moment = datetime.datetime.fromtimestamp(int(unix_seconds), tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Change:
    """One thing that happened to a container: a podman event, or what the driver knows first
    (``expect``: it made a new container for the name; ``report``: its own verdict)."""

    name: str
    container_id: str
    action: str
    when: float
    exit_code: Optional[int] = None
    status: Optional[WorkerStatus] = None


EXPECT = "expect"
REPORT = "report"


class PodmanEvents:
    """The :class:`~devin_outposts.orchestrator.drivers.base.StatusSource` of every machine the
    podman driver made for one acceptor id (see the module docs). ``start_failures``: the driver's
    verdict per container name for a ``podman start`` that failed (podman's own state then still says
    ``created``); it wins over a starting status for that name."""

    def __init__(
        self,
        cli: PodmanCli,
        acceptor_id: str,
        start_failures: Mapping[str, WorkerStatus],
        *,
        reconcile_interval: float = RECONCILE_INTERVAL,
    ) -> None:
        self.cli = cli
        self.acceptor_id = acceptor_id
        self.start_failures = start_failures
        self.reconcile_interval = reconcile_interval
        self._board: Optional[StatusSink] = None
        #: The current container id and last state per machine name (what events are checked against).
        self._ids: dict[str, str] = {}
        self._states: dict[str, WorkerState] = {}
        #: Events before this (Unix seconds, when the last listing began) are shown by that listing.
        self._cutoff = 0.0
        self._last_event = 0.0
        #: Set while a listing runs: changes wait in ``_held`` and are applied after it, in order.
        self._listing = False
        self._held: list[Change] = []
        #: What the tests and the benchmark count: children started, listings taken.
        self.children = 0
        self.listings = 0

    # --- what the driver tells us ------------------------------------------------------------------

    def expect(self, name: str, container_id: str) -> None:
        """The driver made container ``container_id`` for machine ``name``: events of the container it
        replaced are stale from now on, and the machine is starting."""
        self._change(Change(name, container_id, EXPECT, time.time()))

    def report(self, name: str, status: WorkerStatus) -> None:
        """The driver's own verdict on ``name``'s current container (a start that failed)."""
        # No container id: the verdict is on whichever container the name has now.
        self._change(Change(name, "", REPORT, time.time(), status=status))

    def _change(self, change: Change) -> None:
        if self._board is None:
            return
        # At once, even while a listing runs: the driver's start returns right after this, and its session
        # then reads the row (a `remove` of the replaced container must not be what it finds). A listing
        # running now replaces the ids and may predate the change: it is applied again after it.
        self._apply_known(change)  # synchronous: only a podman event may need a read
        if self._listing:
            self._held.append(change)

    # --- the stream --------------------------------------------------------------------------------

    def attach(self, board: StatusSink) -> None:
        """Write into ``board`` from now on (:meth:`run` does; so do the unit tests)."""
        self._board = board

    async def run(self, board: StatusSink) -> None:
        self.attach(board)
        restart = FIRST_RESTART
        while True:
            began = time.monotonic()
            try:
                await self._follow_once(board)
            except DriverError as exc:
                log.warning("podman status watch: %s; reading machines one by one until it is back", exc)
            finally:
                board.lost_sync()
            restart = (
                FIRST_RESTART if time.monotonic() - began >= STEADY_CHILD else min(restart * 2, MAX_RESTART)
            )
            await asyncio.sleep(restart * random.uniform(0.8, 1.2))  # noqa: S311 - jitter, not a secret

    async def _follow_once(self, board: StatusSink) -> None:
        """One child: list, then follow and list every interval, until the child ends."""
        # The child replays from a little before the last event (or before now): the listing that
        # follows covers what happened meanwhile, and the replay closes the moment between the child's
        # start and its subscription. Events older than the listing are dropped as it shows them.
        since = (self._last_event or time.time()) - REPLAY_MARGIN
        child = await self._spawn(since)
        stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        reader = asyncio.ensure_future(self._read_events(child))
        errors = asyncio.ensure_future(self._read_stderr(child, stderr))
        try:
            await self.reconcile(board)
            while True:
                await asyncio.wait({reader}, timeout=self.reconcile_interval)
                if reader.done():
                    break
                await self.reconcile(board)
            reader.result()
        finally:
            reader.cancel()
            if child.stdout is not None and child.stdout.at_eof():
                # It ended by itself: let asyncio reap it. Killing it now would reap it behind asyncio's
                # back (Popen.send_signal polls first), which then logs an unknown child.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(child.wait()), 5.0)
            if child.returncode is None:
                await PodmanCli.kill(child)
            errors.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await errors
        said = " / ".join(stderr) or "no error output"
        if child.returncode == 0:
            # podman 4.3 ends `podman events` when its events file rotates (events_logfile_max_size, 1 MiB
            # by default): routine on a busy host, so not a warning. The next child replays the gap.
            log.info("podman events ended (its events file rotated?); starting it again")
            return
        raise DriverError(f"podman events ended (exit code {child.returncode}: {said})")

    async def _spawn(self, since: float) -> asyncio.subprocess.Process:
        args = [
            "events", "--format", "json", "--filter", "type=container",
            "--filter", f"label={LABEL_ACCEPTOR}={label_value(self.acceptor_id)}",
            "--since", since_argument(since),
        ]  # fmt: skip
        try:
            child = await asyncio.create_subprocess_exec(
                self.cli.podman,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.cli.environment(),
                limit=LINE_LIMIT,
            )
        except OSError as exc:
            raise DriverError(f"cannot run {self.cli.podman} events: {exc}") from exc
        self.children += 1
        log.debug("podman events child %d started (pid %s)", self.children, child.pid)
        return child

    @staticmethod
    async def _read_stderr(child: asyncio.subprocess.Process, lines: collections.deque[str]) -> None:
        assert child.stderr is not None
        async for raw in child.stderr:
            text = raw.decode(errors="replace").strip()
            if text:
                lines.append(text[:300])

    async def _read_events(self, child: asyncio.subprocess.Process) -> None:
        """Apply each event line until the child's output ends (it exited, or a line was too long to
        read: both end this child)."""
        assert child.stdout is not None
        while True:
            try:
                line = await child.stdout.readline()
            except ValueError:  # a line over LINE_LIMIT: the stream cannot be trusted past it
                log.warning("podman events printed a line over %d bytes; restarting it", LINE_LIMIT)
                return
            if not line:
                return
            await self.feed(line)

    async def feed(self, line: bytes) -> None:
        """One line of ``podman events --format json`` onto the board (held while a listing runs)."""
        change = self._parse(line)
        if change is None or change.when < self._cutoff:
            return
        self._last_event = max(self._last_event, change.when)
        if self._listing:
            self._held.append(change)
        else:
            await self._apply(change)

    def _parse(self, line: bytes) -> Optional[Change]:
        """One of our machines' container events, or None (not JSON, another kind, not ours)."""
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("Type") != "container":
            return None
        attributes = data.get("Attributes")
        labels = {str(k): str(v) for k, v in attributes.items()} if isinstance(attributes, dict) else {}
        if not self._ours(labels):
            return None
        when = event_time(str(data.get("Time", "")))
        code = data.get("ContainerExitCode")
        return Change(
            name=str(data.get("Name", "")),
            container_id=str(data.get("ID", "")),
            action=str(data.get("Status", "")),
            when=time.time() if when is None else when,
            exit_code=code if isinstance(code, int) else None,
        )

    def _ours(self, labels: Mapping[str, str]) -> bool:
        return (
            labels.get(LABEL_MANAGED_BY) == MANAGED_BY
            and labels.get(LABEL_KIND) == KIND_MACHINE
            and ids_of(labels)["acceptor_id"] == self.acceptor_id
        )

    # --- the board ---------------------------------------------------------------------------------

    def _put(self, name: str, status: WorkerStatus) -> None:
        assert self._board is not None
        failed = self.start_failures.get(name)
        if failed is not None and status.state is WorkerState.STARTING:
            status = failed
        self._states[name] = status.state
        self._board.put(name, status)

    def _apply_known(self, change: Change) -> bool:
        """Apply what needs no read; False when ``change`` needs its container read (see :meth:`_apply`)."""
        assert self._board is not None
        name, action = change.name, change.action
        if action in ("create", EXPECT):
            self._ids[name] = change.container_id
            self._put(name, WorkerStatus(WorkerState.STARTING, detail="container created"))
            return True
        current = self._ids.get(name)
        if change.container_id and current is None:
            self._ids[name] = change.container_id
        elif change.container_id and current != change.container_id:
            return True  # a container this name had before (replaced by the driver's start)
        if action == REPORT and change.status is not None:
            self._put(name, change.status)
        elif action == "init":
            self._put(name, WorkerStatus(WorkerState.STARTING, detail="container initialized"))
        elif action in ("start", "unpause", "restart"):
            self._put(name, WorkerStatus(WorkerState.RUNNING))
        elif action == "pause":
            self._put(name, WorkerStatus(WorkerState.RUNNING, detail="container paused"))
        elif action == "died" and change.exit_code is not None:
            self._put(name, ended_status(change.exit_code))
        elif action == "died" or (action == "cleanup" and self._states.get(name) is WorkerState.STARTING):
            return False
        elif action == "remove":
            self._ids.pop(name, None)
            self._states.pop(name, None)
            self._board.gone(name, "container removed")
        return True

    async def _apply(self, change: Change) -> None:
        if not self._apply_known(change):
            await self._read_one(change.name, change.container_id)

    async def _read_one(self, name: str, container_id: str) -> None:
        """Read the one container an event left unclear (a ``died`` without its code, a failed start)."""
        read_at = time.time()
        try:
            found = await self.cli.inspect("container", name)
        except DriverError as exc:
            log.debug("podman status watch: %s (the next listing corrects it)", exc)
            return
        if found is None or str(found.get("Id", "")) != container_id:
            return  # removed or replaced meanwhile: its own events follow
        if read_at < self._cutoff:
            return  # a listing began after this read: it is newer
        # Through the queue: a listing that began while podman answered holds it back, then drops it.
        self._change(Change(name, container_id, REPORT, read_at, status=worker_status_of(found)))

    async def reconcile(self, board: StatusSink) -> None:
        """One ``podman ps --all`` of the acceptor's machines onto the board, then the changes that
        arrived while it ran."""
        self._listing = True
        try:
            as_of, began = time.monotonic(), time.time()
            items = await self.cli.listing(
                ["ps", "--all", *self._filters()], f"list the containers of acceptor {self.acceptor_id}"
            )
            statuses: dict[str, WorkerStatus] = {}
            ids: dict[str, str] = {}
            for item in items:
                names = item.get("Names") or []
                if not names or not self._ours(labels_of(item)):
                    continue
                name = str(names[0])
                ids[name] = str(item.get("Id", ""))
                status = listed_status(item)
                failed = self.start_failures.get(name)
                statuses[name] = (
                    failed if failed is not None and status.state is WorkerState.STARTING else status
                )
            self._ids = ids
            self._states = {name: status.state for name, status in statuses.items()}
            self._cutoff = began
            board.replace_all(statuses, as_of=as_of)
            self.listings += 1
            while self._held:
                change = self._held.pop(0)
                if change.when >= self._cutoff:
                    await self._apply(change)
        finally:
            self._held.clear()
            self._listing = False

    def _filters(self) -> list[str]:
        # podman 4.3 ANDs label filters of `ps` (unlike `events`); our labels are checked here as well.
        wanted = {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_ACCEPTOR: label_value(self.acceptor_id),
            LABEL_KIND: KIND_MACHINE,
        }
        return [arg for key, value in wanted.items() for arg in ("--filter", f"label={key}={value}")]
