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

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import pytest
from fault_fleet import OUTPOST_ID, PAYLOADS, FaultFleet

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetProtocolError, error_for_status
from devin_outposts.api.limits import MAX_SSE_LINE
from devin_outposts.api.models import parse_unix_seconds

from worker_fakes import DistServer, FakeRemote, WorkerProcess, wait_for

TOKEN = "cog_malformed_replies_test_token"
SID = "devin-malformed"


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


# --- 7. the same, one reply at a time, through the client ----------------------------------------------


def _client(handle: Callable[[httpx.Request], httpx.Response]) -> FleetClient:
    return FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(handle), retries=0)


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_every_call_fails_as_one_error_on_a_malformed_reply(payload: str) -> None:
    text = PAYLOADS[payload]
    entry = bad_entry(text)
    bodies = {
        "list": f'{{"items": [{entry}], "cursor": "c", "has_next_page": false}}',
        "entry": entry,
        "event": f'data: {{"type": "MODIFIED", "object": {entry}, "cursor": "c1"}}\n\n',
    }

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.params.get("watch") == "true":
            return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=bodies["event"])
        if request.url.path == "/opbeta/outposts/devins":
            return httpx.Response(200, content=bodies["list"])
        return httpx.Response(200, content=bodies["entry"])

    async def main() -> list[BaseException]:
        client = _client(handle)
        errors: list[BaseException] = []
        calls = [
            lambda: client.list_all_devins(outpost="o", phase="claimed", acceptor_id="me"),
            lambda: client.claim(SID, "me"),
            lambda: client.get_devin(SID),
            lambda: client.release(SID, "me"),
        ]
        for call in calls:
            try:
                await call()
            except Exception as exc:  # the point is which exception it is
                errors.append(exc)
        try:
            async for dummy in client.watch_devins(outpost="o", cursor="c"):
                pass
        except Exception as exc:
            errors.append(exc)
        await client.aclose()
        return errors

    errors = asyncio.run(main())
    assert [type(e) for e in errors] == [FleetProtocolError] * 5, errors
    for error in errors:
        assert len(str(error)) < 400, str(error)


@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("status", [409, 404, 500, 401])
def test_an_error_reply_with_a_malformed_body_keeps_its_status(payload: str, status: int) -> None:
    body = f'{{"detail": {PAYLOADS[payload]}}}'

    async def main() -> BaseException:
        client = _client(lambda request: httpx.Response(status, content=body))
        try:
            await client.claim(SID, "me")
        except Exception as exc:
            return exc
        finally:
            await client.aclose()
        raise AssertionError("the claim succeeded")

    error = asyncio.run(main())
    assert isinstance(error, error_for_status(status)), repr(error)
    assert error.status == status
    assert len(str(error)) < 400


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(1700000000, 1700000000), (1700000000123, 1700000000), (1.7e9, 1700000000), ("1700000000", 1700000000),
     ("2023-11-14T22:13:20Z", 1700000000), (None, None)],
)  # fmt: skip
def test_timestamps_in_range_still_parse(value: Any, seconds: Optional[int]) -> None:
    assert parse_unix_seconds(value) == seconds


@pytest.mark.parametrize(
    "value",
    [float("inf"), float("-inf"), float("nan"), 10**400, -(10**400), "1e400", "9" * 400, 1e300, [1], True],
    ids=lambda value: repr(value)[:12],
)
def test_timestamps_out_of_range_are_a_value_error(value: Any) -> None:
    with pytest.raises(ValueError, match="timestamp") as caught:
        parse_unix_seconds(value)
    assert len(str(caught.value)) < 100


# --- 8. the SSE reader caps what it holds ---------------------------------------------------------------


class LongStream(httpx.AsyncByteStream):
    """A body that repeats ``chunk`` up to ``limit`` bytes (counting what it sent): far past any cap."""

    def __init__(self, chunk: bytes, limit: int = 16 * MAX_SSE_LINE) -> None:
        self.chunk = chunk
        self.limit = limit
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.sent < self.limit:
            self.sent += len(self.chunk)
            yield self.chunk


#: Streams that never finish an event: each line is cheap or "empty", but the reader holds something for
#: every one of them until the event ends.
FLOODS = {
    "empty data lines": b"data:\n",
    "empty data lines, CR": b"data\r",
    "data lines of a space": b"data: \n",
    "comment lines": b":\n",
    "other fields": b"id: 1\n",
    "a line without an end": b"data: " + b"x" * 1000,
}


@pytest.mark.parametrize("line", list(FLOODS))
def test_the_sse_reader_fails_at_its_limit_whatever_the_lines_look_like(line: str) -> None:
    stream = LongStream(FLOODS[line] * (65536 // len(FLOODS[line])))

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=stream)

    async def main() -> None:
        client = _client(handle)
        with pytest.raises(FleetProtocolError, match=f"larger than {MAX_SSE_LINE} bytes"):
            async for dummy in client.watch_devins(outpost="o", cursor="c"):
                pass
        await client.aclose()

    asyncio.run(main())
    assert stream.sent <= MAX_SSE_LINE + 2 * 65536


def test_keepalives_between_events_never_add_up() -> None:
    """A stream of keepalives (each one a comment and a blank line) is not an event: it never fails."""
    event = f'data: {{"type": "MODIFIED", "object": {bad_entry("1")}, "cursor": "c9"}}\n\n'.encode()
    keepalives = b": keepalive\n\n" * (4 * MAX_SSE_LINE // 13)

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, content=keepalives + event)

    async def main() -> list[str]:
        client = _client(handle)
        cursors = [e.cursor or "" async for e in client.watch_devins(outpost="o", cursor="c")]
        await client.aclose()
        return cursors

    assert asyncio.run(main()) == ["c9"]


def vm_kib(pid: int, field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak) of ``pid`` in KiB, from ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.mark.timeout(300)
def test_a_real_worker_stays_small_under_a_flood_of_empty_data_lines(
    tmp_path: Path, remote: FakeRemote
) -> None:
    flood_bytes = 128 << 20  # 22 million empty data lines: a reader that held them all would pass +100 MiB
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        worker = WorkerProcess(
            worker_args(tmp_path, dist.url), worker_env(fleet.url), tmp_path / "worker.log"
        ).start()
        try:
            wait_serving(
                worker,
                lambda: (
                    fleet.calls("GET", "/opbeta/outposts/devins")
                    and any(r["query"].get("watch") == "true" for r in fleet.requests)
                ),
                "the first watch",
            )
            baseline = vm_kib(worker.pid, "VmRSS")
            fleet.watch = fleet.flood(b"data:\n", flood_bytes)  # the next stream (within 5 s) floods
            wait_serving(worker, lambda: fleet.floods and fleet.floods[0]["done"], "the flood to end", 240)
            fleet.watch = None
            first = fleet.floods[0]
            peak = vm_kib(worker.pid, "VmHWM")
            fleet.enqueue(SID)  # and it still serves
            wait_serving(worker, lambda: remote.runs(SID), "the session after the flood")
        finally:
            worker.stop()
    seen = f"sent {first['sent']} bytes; VmHWM {peak} KiB, VmRSS {baseline} KiB before the flood"
    assert first["client_left"], f"the worker read every empty data line: {seen}"
    assert first["sent"] <= 16 << 20, seen
    assert peak - baseline < 100 << 10, seen
    log = worker.log()
    assert "Traceback" not in log
    assert f"larger than {MAX_SSE_LINE} bytes" in log
