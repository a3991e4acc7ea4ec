"""Regression tests for malformed and hostile replies (issue 24, points 7 and 8, the worker's part).

7. A number past a float's range (``1e400``), an integer of 400 digits or nesting 100,000 deep in a reply
   raised ``OverflowError`` or ``RecursionError`` (not ``ValueError``) out of the client, and a real
   ``worker start`` died with a traceback: on the restart-recovery list, on a claim answer and on a 409
   body. Every reply now decodes through one path that fails as one error (``FleetProtocolError``), the
   worker logs one line and retries, and serves the session once the API behaves.
8. The SSE reader counted only what looked like content: empty ``data:`` lines counted nothing, so a
   stream of them grew the worker without bound (60 M lines: 40 to 784 MiB). It now counts every byte it
   holds for the event being read, comment and field lines included, and fails at the limit.

The worker runs as a real process against :class:`fault_fleet.FaultFleet`; assertions are on what the
server saw, what the fake ``devin-remote`` recorded, the process's state and its log.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from fault_fleet import OUTPOST_ID, PAYLOADS, FaultFleet

from worker_fakes import DistServer, FakeRemote, WorkerProcess, kill_pids, wait_for

TOKEN = "cog_malformed_replies_test_token"
SID = "devin-malformed"


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[FakeRemote]:
    fake = FakeRemote(tmp_path / "remote")
    try:
        yield fake
    finally:
        kill_pids(run["pid"] for run in fake.runs())


def worker_args(tmp_path: Path, dist_url: str, *extra: str) -> list[str]:
    return ["--outpost", "rhel", "--cache-dir", str(tmp_path / "data" / "cache"), "--workdir",
            str(tmp_path / "work"), "--static-base-url", dist_url, "--backoff-max-secs", "0.3",
            "--poll-interval-secs", "0.3", "--drain-timeout", "1", *extra]  # fmt: skip


def worker_env(api_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIN_")}
    env.update(DEVIN_OUTPOSTS_TOKEN=TOKEN, DEVIN_API_URL=api_url)
    return env


def wait_serving(worker: WorkerProcess, predicate: Callable[[], Any], what: str, timeout: float = 60) -> None:
    """Wait for ``predicate`` while the worker runs; fail at once, with its log, if the worker exits."""
    assert worker.proc is not None
    proc = worker.proc
    try:
        wait_for(lambda: proc.poll() is not None or predicate(), timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.log()[-3000:]}") from None
    assert proc.poll() is None, f"the worker exited with {proc.returncode}:\n{worker.log()[-3000:]}"


def bad_entry(payload: str) -> str:
    """A queue entry whose ``claim_deadline`` is ``payload`` (JSON text)."""
    return (
        f'{{"metadata": {{"session_id": "{SID}", "outpost_id": "{OUTPOST_ID}", "created_at": 1}}, '
        f'"spec": {{"kind": "new"}}, "status": {{"phase": "claimed", "acceptor_id": "x", '
        f'"claim_deadline": {payload}, "session_status": "pending"}}}}'
    )


#: Where a malformed reply is served: (faults by place, log lines expected).
PLACES = {
    # The restart-recovery list (twice) and the feed's first full list.
    "lists": ({"recovery": 2, "list": 1}, {f"Could not list sessions on outpost {OUTPOST_ID}: 200": 3}),
    # A claim answered 200 with a malformed body.
    "claim answer": ({"claim": 1}, {f"Could not claim session {SID}: 200": 1}),
    # A claim answered 409 with a malformed body: an ordinary lost race, logged at debug level only.
    "409 body": ({"conflict": 1}, {}),
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_malformed_replies_are_logged_and_retried_by_a_real_worker(
    tmp_path: Path, remote: FakeRemote, payload: str, place: str
) -> None:
    text = PAYLOADS[payload]
    listing = f'{{"items": [{bad_entry(text)}], "cursor": "c", "has_next_page": false}}'.encode()
    replies = {
        "recovery": (200, listing),
        "list": (200, listing),
        "claim": (200, bad_entry(text).encode()),
        "conflict": (409, f'{{"detail": "Session is already claimed", "claim_deadline": {text}}}'.encode()),
    }
    faults, expected_lines = PLACES[place]
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        fleet.enqueue(SID)
        for where, count in faults.items():
            fleet.faults["claim" if where == "conflict" else where] = [replies[where]] * count
        worker = WorkerProcess(
            worker_args(tmp_path, dist.url), worker_env(fleet.url), tmp_path / "worker.log"
        ).start()
        try:
            wait_serving(worker, lambda: remote.runs(SID), "the session to be served")
            served = {k.replace("claim", "conflict") if place == "409 body" else k: v
                      for k, v in fleet.served.items() if v}  # fmt: skip
            assert served == faults
            fleet.set_status(SID, "terminated")
            wait_serving(worker, lambda: fleet.calls("POST", f"/{SID}/release"), "the release", 30)
            worker.signal(signal.SIGTERM)
            assert worker.wait(30) == 0
        finally:
            worker.stop()
    log = worker.log()
    assert "Traceback" not in log, log[-3000:]
    assert TOKEN not in log
    assert len(remote.runs(SID)) == 1
    lines = log.splitlines()
    for text_in_line, count in expected_lines.items():  # one line per malformed reply
        assert len([line for line in lines if text_in_line in line]) == count, "\n".join(lines)
    assert all(len(line) < 1000 for line in lines), "a malformed value was copied into the log whole"
