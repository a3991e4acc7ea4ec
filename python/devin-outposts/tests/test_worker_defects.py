"""Regression tests for the worker defects found under faults and at fleet scale (issue 14).

Each test failed on the code before its fix:

1. a failed release of a claim the worker gives straight back (session ended while the claim was in
   flight, or SIGTERM during a claim) crashed the worker;
2. the worker chmodded an existing, shared data directory (``--cache-dir /tmp/x`` made ``/tmp`` 0700);
3. a watch stream the server ended cleanly after less than 5 s counted as a failure and grew the backoff
   to 60 s; errors backed off up to 60 s, so an idle worker noticed a recovered API late;
4. an unreachable API, a 503 or an HTML page at start-up ended the worker with a traceback;
5. session ids ``.`` and ``..`` were claimed at the wrong URL and silently dropped;
6. replies of any size were read whole (a 200 MB SSE line, ``.sha256`` or list page).

Assertions are on observed state: the simulator's claim history, what the fake remote recorded, the
file system, the exact requests sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Callable, Optional

import httpx
import pytest
from test_worker_faults import HostileFleet, in_process, make_config, until

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetConnectionError, FleetProtocolError
from devin_outposts.api.limits import MAX_BODY_BYTES, MAX_SSE_LINE
from devin_outposts.api.models import QueueEntry, WatchEvent
from devin_outposts.core import feed as queue_module
from devin_outposts.core.exits import ProgramExit
from devin_outposts.core.feed import FEED_BACKOFF_CAP, QUICK_END_PAUSE, QueueFeed
from devin_outposts.core.paths import SharedDirectoryError, make_private_dir
from devin_outposts.worker.binary import BinaryError, BinaryStore
from devin_outposts.worker.runner import Worker
from devin_outposts_sim.testing import run_sim

from worker_fakes import DistServer, FakeRemote, WorkerProcess, wait_for

SIM_TIMINGS: dict[str, float] = {
    "claim_ttl": 20,
    "watch_max_duration": 5,
    "keepalive_interval": 0.3,
    "sweep_interval": 0.05,
}


def actions(sim: Any, session_id: str) -> list[str]:
    return [c["action"] for c in sim.admin.claims(session_id=session_id)]


class Intercept(httpx.AsyncBaseTransport):
    """Forwards to the real server; ``hooks`` may answer a request themselves or act before it goes."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.hooks: list[Callable[[httpx.Request], Optional[httpx.Response]]] = []
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(f"{request.method} {request.url.raw_path.decode().split('?')[0]}")
        for hook in self.hooks:
            answer = await asyncio.to_thread(hook, request)
            if answer is not None:
                return answer
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


# --- 1. a failed release never takes the worker down --------------------------------------------


@pytest.mark.parametrize("why", ["session ended during the claim", "SIGTERM during the claim"])
def test_a_failed_release_of_a_claim_given_back_does_not_crash_the_worker(
    tmp_path: Path, remote: FakeRemote, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    with run_sim(**SIM_TIMINGS) as sim, DistServer("abc1234", remote.script) as dist:
        outpost = sim.admin.create_outpost("rhel", "linux")
        transport = Intercept()
        config = make_config(tmp_path, sim.url, dist.url, token=sim.create_token("machine"), max_sessions=2)
        box: dict[str, Any] = {}
        first = sim.admin.enqueue(outpost.outpost_id).session_id

        def race(request: httpx.Request) -> Optional[httpx.Response]:
            path = request.url.path
            if path.endswith(f"/{first}/claim") and "raced" not in box:
                box["raced"] = True
                if why.startswith("SIGTERM"):
                    box["loop"].call_soon_threadsafe(box["worker"].on_signal, signal.SIGTERM)
                else:
                    sim.admin.set_status(first, "terminated")  # ends while the claim is in flight
            if path.endswith(f"/{first}/release"):
                return httpx.Response(500, json={"detail": "injected release failure"})
            return None

        transport.hooks.append(race)

        async def scenario(worker: Worker) -> None:
            box["worker"], box["loop"] = worker, asyncio.get_running_loop()
            await until(lambda: f"POST /opbeta/outposts/devins/{first}/release" in transport.paths, "release")
            if why.startswith("SIGTERM"):
                return
            # Still alive, and still serving: the next session is claimed and run.
            second = (await asyncio.to_thread(sim.admin.enqueue, outpost.outpost_id)).session_id
            await until(lambda: remote.runs(second), "the next session")
            box["second"] = second

        with caplog.at_level(logging.INFO):
            code, worker = in_process(config, scenario, transport)
    assert code == 0
    assert "raced" in box
    # The release was tried (and failed); the claim was left to expire, and nothing ran for it.
    assert transport.paths.count(f"POST /opbeta/outposts/devins/{first}/release") >= 1
    assert remote.runs(first) == []
    assert any("giving up releasing session" in r.getMessage() for r in caplog.records)
    if not why.startswith("SIGTERM"):
        assert worker.metrics.counters["sessions_claimed"] == 2
        assert len(remote.runs(box["second"])) == 1


# --- 2. the worker never changes the mode of a directory it did not create -----------------------


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
def test_a_shared_data_dir_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # noqa: S103 - like /tmp: the case under test
    config = make_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9/", cache_dir=shared / "cache")
    with pytest.raises(ProgramExit, match="other users can write to it") as caught:
        asyncio.run(Worker(config).run())
    assert caught.value.code == 2
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert list(shared.iterdir()) == []  # no lock file, no acceptor id left in it


@pytest.mark.skipif(os.name == "nt", reason="POSIX modes")
def test_private_dirs_are_created_0700_and_existing_ones_keep_their_mode(tmp_path: Path) -> None:
    created = make_private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(created.stat().st_mode) == 0o700
    existing = tmp_path / "existing"
    existing.mkdir()
    os.chmod(existing, 0o750)  # noqa: S103 - group-readable is fine
    assert make_private_dir(existing) == existing
    assert stat.S_IMODE(existing.stat().st_mode) == 0o750
    group_writable = tmp_path / "group"
    group_writable.mkdir()
    os.chmod(group_writable, 0o770)  # noqa: S103 - the case under test
    with pytest.raises(SharedDirectoryError, match="mode 0770"):
        make_private_dir(group_writable)
    assert stat.S_IMODE(group_writable.stat().st_mode) == 0o770
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(SharedDirectoryError, match="not a directory"):
        make_private_dir(a_file)


# --- 3. short watch streams are normal; errors back off only a little ----------------------------


def _entry(sid: str) -> QueueEntry:
    return QueueEntry.model_validate(
        {
            "metadata": {"session_id": sid, "outpost_id": "o", "created_at": 1, "updated_at": 1},
            "spec": {"kind": "new", "platform": "linux"},
            "status": {"phase": "pending", "session_status": "pending"},
        }
    )


class ScriptedSource:
    """A queue source whose watch streams follow a script: ``"event"`` (one event, then a clean end),
    ``"empty"`` (a clean end with no event) or ``"error"`` (a connection error)."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.watches = 0
        self.lists = 0

    async def list_all_devins(self, **kwargs: Any) -> tuple[list[QueueEntry], Optional[str]]:
        self.lists += 1
        return [], "c0"

    async def watch_devins(self, **kwargs: Any) -> AsyncIterator[WatchEvent]:
        if self.watches >= len(self.script):
            raise asyncio.CancelledError  # the script is over: end feed.run()
        step = self.script[self.watches]
        self.watches += 1
        if step == "error":
            raise FleetConnectionError("watch sessions", "ConnectError: refused")
        if step == "event":
            event = {"type": "MODIFIED", "object": _entry(f"s{self.watches}").to_wire()}
            yield WatchEvent.model_validate({**event, "cursor": f"c{self.watches}"})


def run_feed(script: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[list[float], ScriptedSource]:
    """Run a feed over ``script`` and return the delays it slept between watch connections."""
    delays: list[float] = []
    real_sleep = asyncio.sleep

    async def record(seconds: float) -> None:
        delays.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(queue_module.asyncio, "sleep", record)
    source = ScriptedSource(script)
    feed = QueueFeed(source, "o", "me", backoff_max=60.0)  # type: ignore[arg-type]

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await feed.run()

    asyncio.run(main())
    monkeypatch.undo()
    return delays, source


def test_a_clean_short_stream_reconnects_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    delays, source = run_feed(["event"] * 20, monkeypatch)
    assert source.watches == 20
    assert source.lists == 1  # one list, then watches from the cursor only
    assert delays == []  # never a pause: each stream ended cleanly after an event


def test_streams_that_keep_ending_empty_are_paced_not_backed_off(monkeypatch: pytest.MonkeyPatch) -> None:
    delays, dummy = run_feed(["empty"] * 10, monkeypatch)
    # The first few quick empty ends reconnect at once; then each is paced by a fixed, short pause.
    assert delays
    assert set(delays) == {QUICK_END_PAUSE}


def test_errors_back_off_to_a_few_seconds_at_most(monkeypatch: pytest.MonkeyPatch) -> None:
    delays, dummy = run_feed(["error"] * 12 + ["event"] * 3, monkeypatch)
    assert len(delays) == 12  # one backoff per error, none after the clean ends that follow
    assert max(delays) <= FEED_BACKOFF_CAP
    assert delays[-1] >= FEED_BACKOFF_CAP / 2  # it did grow to the cap


# --- 4. an API that is down at start-up is waited for, one line per try ---------------------------


def _html(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, text="<html><body>Service maintenance</body></html>")


@pytest.mark.parametrize("mode", ["queue", "session"])
def test_an_api_that_is_down_at_start_up_is_retried(
    tmp_path: Path, remote: FakeRemote, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with run_sim(**SIM_TIMINGS) as sim, DistServer("abc1234", remote.script) as dist:
        outpost = sim.admin.create_outpost("rhel", "linux")
        sid = sim.admin.enqueue(outpost.outpost_id).session_id
        transport = Intercept()
        faults = {"503": 8, "html": 4, "refused": 8}

        def outage(request: httpx.Request) -> Optional[httpx.Response]:
            if faults["503"] > 0:
                faults["503"] -= 1
                return httpx.Response(503, text="<html>503 Service Unavailable</html>")
            if faults["html"] > 0:
                faults["html"] -= 1
                return _html(request)
            if faults["refused"] > 0:
                faults["refused"] -= 1
                raise httpx.ConnectError("connection refused")
            return None

        transport.hooks.append(outage)
        overrides: dict[str, Any] = {"backoff_max": 0.2}
        if mode == "session":
            overrides["session_id"] = sid
        config = make_config(tmp_path, sim.url, dist.url, token=sim.create_token("machine"), **overrides)

        async def scenario(worker: Worker) -> None:
            await until(lambda: remote.runs(sid), "the session once the API is back")
            await asyncio.to_thread(sim.admin.set_status, sid, "terminated")
            await until(lambda: "release" in actions(sim, sid), "the release")

        with caplog.at_level(logging.WARNING):
            code = in_process(config, scenario, transport)[0]
        assert code == 0
        assert actions(sim, sid) == ["claim", "release"]
    assert sum(faults.values()) == 0
    retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert retries, "each failed try logs one line"
    assert all(r.exc_info is None for r in caplog.records), "no traceback in the log"


def test_an_unreachable_api_at_start_up_logs_one_line_per_try_and_stops_cleanly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIN_")}
    env.update(DEVIN_OUTPOSTS_TOKEN="cog_unreachable_test_token", DEVIN_API_URL="http://127.0.0.1:9")
    args = ["--outpost", "rhel", "--cache-dir", str(tmp_path / "data" / "cache"), "--workdir",
            str(tmp_path / "work"), "--backoff-max-secs", "0.3"]  # fmt: skip
    worker = WorkerProcess(args, env, tmp_path / "worker.log").start()
    try:
        wait_for(lambda: worker.log().count("retrying in") >= 3, 30, what=f"three retries\n{worker.log()}")
        assert worker.proc is not None
        assert worker.proc.poll() is None  # still running, waiting for the API
        worker.signal(signal.SIGTERM)
        assert worker.wait(20) == 0
    finally:
        worker.stop()
    log = worker.log()
    assert "Traceback" not in log
    assert "cog_unreachable_test_token" not in log
    lines = [line for line in log.splitlines() if "retrying in" in line]
    assert all("Could not list outposts" in line for line in lines), lines


# --- 5. no session id can change the request path ------------------------------------------------


@pytest.mark.parametrize("sid", [".", "..", "a/../b", "?x", "#y", "%2E%2E"])
def test_session_ids_are_one_path_segment(sid: str) -> None:
    seen: list[bytes] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path)
        return httpx.Response(404, json={"detail": "Session not found in queue"})

    async def main() -> None:
        client = FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(handle), retries=0)
        for call in (client.claim(sid, "me"), client.get_devin(sid)):
            with pytest.raises(Exception, match="404"):
                await call
        await client.aclose()

    asyncio.run(main())
    claim_path, get_path = (p.decode() for p in seen)
    assert claim_path.startswith("/opbeta/outposts/devins/") and claim_path.endswith("/claim")
    segment = claim_path[len("/opbeta/outposts/devins/") : -len("/claim")]
    assert "/" not in segment and segment not in (".", "..")
    assert get_path == f"/opbeta/outposts/devins/{segment}"


@pytest.mark.parametrize("sid", ["..", "."])
def test_dot_session_ids_are_served(tmp_path: Path, remote: FakeRemote, sid: str) -> None:
    # The simulator only issues ids that start with a letter or digit; an independent server may not.
    fleet = HostileFleet()
    fleet.SESSION = sid
    with DistServer("abc1234", remote.script) as dist:
        config = make_config(tmp_path / "w", "http://fleet.invalid", dist.url, watch=False)

        async def scenario(worker: Worker) -> None:
            await until(lambda: remote.runs(sid), f"session {sid!r} to be served")
            fleet.status = "terminated"
            await until(lambda: any(c.endswith("/release") for c in fleet.calls), "the release")

        assert in_process(config, scenario, httpx.MockTransport(fleet.handle))[0] == 0
    assert f"POST /opbeta/outposts/devins/{sid}/claim" in fleet.calls
    assert f"POST /opbeta/outposts/devins/{sid}/release" in fleet.calls
    assert len(remote.runs(sid)) == 1
    state = Path(remote.runs(sid)[0]["env"]["DEVIN_REMOTE_STATE_DIR"])
    assert state.parent == (tmp_path / "w" / "data" / "sessions").resolve()


def test_a_row_the_worker_gives_up_on_is_logged(
    tmp_path: Path, remote: FakeRemote, caplog: pytest.LogCaptureFixture
) -> None:
    with run_sim(**SIM_TIMINGS) as sim, DistServer("abc1234", remote.script) as dist:
        outpost = sim.admin.create_outpost("rhel", "linux")
        transport = Intercept()
        config = make_config(tmp_path, sim.url, dist.url, token=sim.create_token("machine"))
        sid = sim.admin.enqueue(outpost.outpost_id).session_id

        def gone(request: httpx.Request) -> Optional[httpx.Response]:
            if request.url.path.endswith(f"/{sid}/claim"):
                return httpx.Response(404, json={"detail": "Session not found in queue"})
            return None

        transport.hooks.append(gone)

        async def scenario(worker: Worker) -> None:
            await until(lambda: f"POST /opbeta/outposts/devins/{sid}/claim" in transport.paths, "the claim")
            await until(lambda: any(sid in r.getMessage() for r in caplog.records), "the log line")

        with caplog.at_level(logging.INFO):
            assert in_process(config, scenario, transport)[0] == 0
    lines = [r.getMessage() for r in caplog.records if sid in r.getMessage()]
    assert any("giving up on session" in line and "404" in line for line in lines), lines


# --- 6. replies are read within limits -----------------------------------------------------------


class EndlessStream(httpx.AsyncByteStream):
    """A body that never ends: a reader without a limit would grow until memory runs out."""

    def __init__(self, chunk: bytes) -> None:
        self.chunk = chunk
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.sent += len(self.chunk)
            yield self.chunk


def test_an_endless_list_page_fails_at_the_limit() -> None:
    stream = EndlessStream(b"x" * 65536)

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "application/json"}, stream=stream)

    async def main() -> None:
        client = FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(handle), retries=0)
        with pytest.raises(FleetProtocolError, match=f"larger than {MAX_BODY_BYTES} bytes"):
            await client.list_devins()
        await client.aclose()

    asyncio.run(main())
    assert stream.sent <= MAX_BODY_BYTES + 65536


def test_a_declared_oversized_body_is_refused_before_it_is_read() -> None:
    stream = EndlessStream(b"x" * 65536)

    def handle(request: httpx.Request) -> httpx.Response:
        headers = {"Content-Type": "application/json", "Content-Length": str(200 << 20)}
        return httpx.Response(200, headers=headers, stream=stream)

    async def main() -> None:
        client = FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(handle), retries=0)
        with pytest.raises(FleetProtocolError, match="larger than"):
            await client.get_devin("devin-1")
        await client.aclose()

    asyncio.run(main())
    assert stream.sent == 0


def test_an_endless_sse_line_fails_at_the_limit() -> None:
    stream = EndlessStream(b"data: " + b"y" * 65530)

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=stream)

    async def main() -> None:
        client = FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(handle), retries=0)
        with pytest.raises(FleetProtocolError, match=f"larger than {MAX_SSE_LINE} bytes"):
            async for dummy in client.watch_devins(outpost="o", cursor="c"):
                pass
        await client.aclose()

    asyncio.run(main())
    assert stream.sent <= MAX_SSE_LINE + 2 * 65536


def test_an_event_split_over_many_short_lines_is_bounded_too() -> None:
    stream = EndlessStream(b"data: " + b"z" * 1000 + b"\n")

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=stream)

    async def main() -> None:
        client = FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(handle), retries=0)
        with pytest.raises(FleetProtocolError, match="larger than"):
            async for dummy in client.watch_devins(outpost="o", cursor="c"):
                pass
        await client.aclose()

    asyncio.run(main())


def test_sse_lines_split_across_chunks_and_crlf_are_parsed() -> None:
    event = _entry("devin-1").to_wire()
    body = (
        b": keepalive\r\n\r\n"
        + b'data: {"type":"MODIFIED","object":'
        + httpx.Response(200, json=event).content
        + b',"cursor":"c1"}\r\n\r\n'
    )
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]  # "\r" and "\n" land in different chunks

    class Chunked(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=Chunked())

    async def main() -> list[WatchEvent]:
        client = FleetClient("http://fleet.invalid", "t", transport=httpx.MockTransport(handle), retries=0)
        events = [e async for e in client.watch_devins(outpost="o", cursor="c")]
        await client.aclose()
        return events

    events = asyncio.run(main())
    assert [(e.object.session_id, e.cursor) for e in events] == [("devin-1", "c1")]


@pytest.mark.parametrize("name", ["latest_linux_x64", "devin-remote_abc1234_linux_x64.sha256"])
def test_oversized_distribution_files_are_refused(tmp_path: Path, name: str) -> None:
    stream = EndlessStream(b"a" * 4096)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith(name):
            return httpx.Response(200, stream=stream)
        return httpx.Response(404)

    async def main() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
        store = BinaryStore(tmp_path / "cache", "http://dist.invalid/", http=http, suffix="linux_x64")
        fetch = store.latest_sha() if name.startswith("latest") else store.ensure("abc1234")
        with pytest.raises(BinaryError, match="larger than"):
            await fetch
        await http.aclose()

    asyncio.run(main())
    assert stream.sent <= 16 << 10


def test_the_limits_leave_room_for_a_full_page() -> None:
    """A full page (200 entries with network policies) fits well inside the body limit."""
    entry = _entry("devin-" + "0" * 32).to_wire()
    entry["spec"]["network_policy"] = {"enabled": True, "allow": [{"hostname": "*.example.com"}] * 50}
    page = httpx.Response(200, json={"items": [entry] * 200, "cursor": "c", "has_next_page": True}).content
    assert len(page) * 4 < MAX_BODY_BYTES
