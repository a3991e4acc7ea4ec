"""The podman driver's status mapping and status source, without podman: lines as podman 4.3 prints them
(``podman events --format json``, ``podman ps --format json``, its errors) go in, the board's rows and the
podman calls made come out. The real thing runs in test_orchestrator_podman_events.py."""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Callable, Optional

import pytest

from devin_outposts.orchestrator.drivers.base import (
    LABEL_ACCEPTOR,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    DriverError,
    Machine,
    SessionSpec,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
)
from devin_outposts.orchestrator.drivers.podman import PodmanDriver
from devin_outposts.orchestrator.drivers.podman.cli import PodmanCli
from devin_outposts.orchestrator.drivers.podman.events import PodmanEvents, event_time, since_argument
from devin_outposts.orchestrator.drivers.podman.objects import (
    KIND_MACHINE,
    LABEL_KIND,
    LABEL_STATE_VOLUME,
    PodmanFailure,
    Result,
    failure_of,
    ids_label,
    listed_status,
)
from devin_outposts.orchestrator.drivers.podman.options import Settings
from devin_outposts.orchestrator.drivers.status_board import StatusBoard

ACCEPTOR = "acc-1"
NAME = "outpost-worker-devin-1-abcdef12"
LABELS = {
    LABEL_MANAGED_BY: MANAGED_BY,
    LABEL_KIND: KIND_MACHINE,
    LABEL_ACCEPTOR: ACCEPTOR,
    "outposts.devin.ai/ids": ids_label("devin-1", "out-1", ACCEPTOR),
}
#: What podman 4.3.1 printed on this machine (docs/orchestrator-podman.md, "Machine status").
NOT_FOUND = (
    'Error: runc: runc create failed: unable to start container process: exec: "nonexist-in-path": '
    "executable file not found in $PATH: OCI runtime attempted to invoke a command that was not found"
)
NOT_EXECUTABLE = (
    'Error: runc: runc create failed: unable to start container process: exec: "/etc/hostname": permission '
    "denied: OCI permission denied"
)
PULL = (
    "Error: initializing source docker://localhost/i27-not-there:1: pinging container registry localhost: "
    'Get "https://localhost/v2/": dial tcp 127.0.0.1:443: connect: connection refused'
)


def now_text(offset: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def event(
    action: str, container_id: str, *, code: Optional[int] = None, offset: float = 0.0, **labels: str
) -> bytes:
    data: dict[str, Any] = {
        "ID": container_id,
        "Name": NAME,
        "Status": action,
        "Time": now_text(offset),
        "Type": "container",
        "Attributes": {**LABELS, **labels},
    }
    if code is not None:
        data["ContainerExitCode"] = code
    return json.dumps(data).encode() + b"\n"


class FakeCli(PodmanCli):
    """Answers ``ps`` with ``listed`` and ``container inspect`` with ``inspected``; counts both."""

    def __init__(self) -> None:
        super().__init__("podman-not-run")
        self.listed: list[dict[str, Any]] = []
        self.inspected: Optional[dict[str, Any]] = None
        self.during_listing: Optional[Callable[[], Any]] = None
        self.calls: list[str] = []

    async def listing(self, args: Iterable[str], what: str) -> list[dict[str, Any]]:
        self.calls.append("ps")
        if self.during_listing is not None:
            await self.during_listing()
        return self.listed

    async def inspect(self, kind: str, name: str) -> Optional[dict[str, Any]]:
        self.calls.append(f"{kind} inspect {name}")
        return self.inspected


def source_on(
    board: StatusBoard, failures: Optional[dict[str, WorkerStatus]] = None
) -> tuple[PodmanEvents, FakeCli]:
    cli = FakeCli()
    source = PodmanEvents(cli, ACCEPTOR, failures if failures is not None else {})
    source.attach(board)
    return source, cli


def state_of(board: StatusBoard) -> tuple[WorkerState, Optional[int], str]:
    row = board.row(NAME)
    assert row is not None
    return row.status.state, row.status.exit_code, row.status.reason


def test_event_times_as_podman_prints_them() -> None:
    assert event_time("2026-12-05T06:38:11.259838582Z") == pytest.approx(1796452691.259838582)
    assert event_time("2026-12-05T07:38:11.5+01:00") == pytest.approx(1796452691.5)
    assert event_time("2026-12-05T06:38:11Z") == 1796452691.0
    assert event_time("yesterday") is None
    assert since_argument(1796452691.9) == "2026-12-05T06:38:11Z"


def test_a_replaced_container_s_end_is_not_the_machine_s_and_a_died_without_code_reads_that_one() -> None:
    board = StatusBoard()
    board.replace_all({}, as_of=0.0)
    source, cli = source_on(board)

    async def scenario() -> None:
        await source.feed(event("create", "old"))
        await source.feed(event("start", "old"))
        assert state_of(board)[0] is WorkerState.RUNNING
        source.expect(NAME, "new")  # the driver's start re-created it
        await source.feed(event("died", "old", code=137))
        await source.feed(event("remove", "old"))
        assert state_of(board)[0] is WorkerState.STARTING
        await source.feed(event("create", "new"))
        await source.feed(event("start", "new"))
        assert state_of(board)[0] is WorkerState.RUNNING
        assert cli.calls == []  # nothing read while the stream says it all
        # podman 4.3 leaves ContainerExitCode out when it is 0: that one container is read, once.
        cli.inspected = {"Id": "new", "State": {"Status": "exited", "ExitCode": 0}}
        await source.feed(event("died", "new"))
        assert state_of(board) == (WorkerState.EXITED, 0, "")
        await source.feed(event("cleanup", "new"))
        assert cli.calls == [f"container inspect {NAME}"]
        await source.feed(event("remove", "new"))
        assert state_of(board)[0] is WorkerState.MISSING

    asyncio.run(scenario())


def test_events_of_other_machines_are_ignored() -> None:
    board = StatusBoard()
    board.replace_all({}, as_of=0.0)
    source, dummy = source_on(board)

    async def scenario() -> None:
        await source.feed(event("create", "a", **{LABEL_KIND: "state"}))
        await source.feed(
            event("create", "b", **{"outposts.devin.ai/ids": ids_label("devin-1", "out-1", "other")})
        )
        await source.feed(b"not json\n")

    asyncio.run(scenario())
    assert len(board) == 0


def test_a_listing_never_overwrites_a_newer_event_and_older_events_are_dropped() -> None:
    board = StatusBoard()
    source, cli = source_on(board)
    cli.listed = [{"Names": [NAME], "Id": "c1", "State": "running", "ExitCode": 0, "Labels": LABELS}]

    async def died_meanwhile() -> None:
        await source.feed(event("died", "c1", code=3))  # while the listing runs: held, then applied

    cli.during_listing = died_meanwhile

    async def scenario() -> None:
        await source.reconcile(board)
        assert board.synced
        assert state_of(board) == (WorkerState.EXITED, 3, "")
        await source.feed(event("start", "c1", offset=-60))  # before the listing: it shows that already
        assert state_of(board) == (WorkerState.EXITED, 3, "")

    asyncio.run(scenario())


def test_a_container_made_while_a_listing_runs_is_starting_at_once_and_after_it() -> None:
    """Seen in a loaded run: the replaced container's `remove` had made the row `missing`, a listing was
    running when the driver made the new one, and its session read `missing` (and gave up)."""
    board = StatusBoard()
    source, cli = source_on(board)

    async def made_meanwhile() -> None:
        source.expect(NAME, "new")
        assert state_of(board)[0] is WorkerState.STARTING  # at once, not after the listing
        await source.feed(event("remove", "old"))  # late: not the container the name has any more

    async def scenario() -> None:
        await source.reconcile(board)
        await source.feed(event("create", "old"))
        await source.feed(event("remove", "old"))
        assert state_of(board)[0] is WorkerState.MISSING
        cli.during_listing = made_meanwhile  # this listing ran between the old one's removal and the create
        await source.reconcile(board)
        assert state_of(board)[0] is WorkerState.STARTING
        await source.feed(event("start", "new"))
        assert state_of(board)[0] is WorkerState.RUNNING

    asyncio.run(scenario())


def test_exit_codes_125_to_127_and_a_failed_start_are_failures_with_a_reason() -> None:
    board = StatusBoard()
    board.replace_all({}, as_of=0.0)
    failed = WorkerStatus(WorkerState.FAILED, reason="exec-failed", detail="OCI runtime ...")
    failures: dict[str, WorkerStatus] = {}
    source, cli = source_on(board, failures)

    async def scenario() -> None:
        await source.feed(event("create", "c1"))
        await source.feed(event("start", "c1"))
        await source.feed(event("died", "c1", code=127))
        assert state_of(board) == (WorkerState.FAILED, 127, "exec-failed")
        source.expect(NAME, "c2")
        failures[NAME] = failed  # the driver's `podman start` failed: podman still says "created"
        source.report(NAME, failed)
        assert state_of(board)[2] == "exec-failed"
        cli.inspected = {"Id": "c2", "State": {"Status": "created"}}
        await source.feed(event("cleanup", "c2"))  # a failed start's only event after create
        assert state_of(board) == (WorkerState.FAILED, None, "exec-failed")

    asyncio.run(scenario())
    assert listed_status({"State": "exited", "ExitCode": 126}).reason == "exec-failed"
    assert listed_status({"State": "exited", "ExitCode": 125}).reason == "start-error"
    assert listed_status({"State": "exited", "ExitCode": 137}).state is WorkerState.EXITED


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        (NOT_FOUND, "exec-failed"),
        (NOT_EXECUTABLE, "exec-failed"),
        (PULL, "pull-error"),
        ("Error: invalid reference format", "invalid-image"),
        ("Error: container outpost-worker-x: no such container", ""),
    ],
)
def test_podman_s_errors_name_their_reason(stderr: str, reason: str) -> None:
    assert failure_of(Result(125, "", stderr)) == reason


class ScriptedCli(PodmanCli):
    """Every podman call succeeds (a machine's container inspects as ``created``) but ``start``."""

    def __init__(self, start_error: str) -> None:
        super().__init__("podman-not-run")
        self.start_error = start_error

    async def run(self, *args: str, what: str, stdin: Optional[bytes] = None) -> Result:
        if args[:2] == ("container", "inspect"):
            labels = {**LABELS, LABEL_STATE_VOLUME: "outpost-state-x"}
            return Result(
                0,
                json.dumps([{"Id": "c1", "Config": {"Labels": labels}, "State": {"Status": "created"}}]),
                "",
            )
        if args[0] == "start":
            return Result(125, "", self.start_error)
        if args[0] == "create" and "i27-not-there" in " ".join(args):
            return Result(125, "", PULL)
        return Result(0, "1000\n" if args[0] == "run" else "c1\n", "")


def driver_with(cli: PodmanCli, tmp_path: Path) -> PodmanDriver:
    driver = PodmanDriver(tmp_path)
    driver.cli = cli
    driver.volumes.cli = cli
    driver.secrets.cli = cli
    return driver


def test_a_start_podman_refuses_is_a_failed_status_not_an_error(tmp_path: Path) -> None:
    driver = driver_with(ScriptedCli(NOT_FOUND), tmp_path)
    machine = Machine(NAME, "devin-1", "out-1", ACCEPTOR, 0.0, NAME)
    launch = WorkerLaunch("devin-1", "connect-token", "wss://gateway.invalid")

    async def scenario() -> WorkerStatus:
        await driver.start(machine, launch)
        return await driver.status(machine)

    status = asyncio.run(scenario())
    assert (status.state, status.reason) == (WorkerState.FAILED, "exec-failed")
    assert "OCI runtime attempted to invoke a command that was not found" in status.detail
    other = driver_with(ScriptedCli("Error: something podman has never said"), tmp_path)
    with pytest.raises(DriverError, match="something podman has never said"):
        asyncio.run(other.start(machine, launch))


def test_a_pull_error_at_provision_names_its_reason(tmp_path: Path) -> None:
    driver = driver_with(ScriptedCli(""), tmp_path)
    driver.settings = Settings(image="localhost/i27-not-there:1")
    driver.image = driver.settings.image

    class Gone(ScriptedCli):
        async def run(self, *args: str, what: str, stdin: Optional[bytes] = None) -> Result:
            if args[:2] == ("container", "inspect"):
                return Result(125, "", "Error: no such container")
            return await super().run(*args, what=what, stdin=stdin)

    driver.cli = driver.volumes.cli = driver.secrets.cli = Gone("")
    with pytest.raises(PodmanFailure) as failure:
        asyncio.run(driver.provision(SessionSpec("devin-1", "out-1", ACCEPTOR)))
    assert failure.value.reason == "pull-error"
    assert str(failure.value).endswith("(pull-error)")
