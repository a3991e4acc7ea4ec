"""Fault tests of the worker: simulator restarts, dropped streams, bursts of 500s, a hostile server.

Workers run either as subprocesses (restart tests) or in-process on the test's event loop, with the
fleet client's transport wrapped to inject faults. Assertions are on observed state: the simulator's
claim history and what the fake ``devin-remote`` recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Callable, Optional
from urllib.parse import unquote

import httpx
import pytest

from devin_outposts.api.client import FleetClient
from devin_outposts.worker.options import WorkerConfig
from devin_outposts.worker.runner import Worker
from devin_outposts_sim.testing import run_sim, sim_process

from worker_fakes import DistServer, FakeRemote, WorkerProcess, wait_for

TOKEN = "cog_fault_test_account_token"
HOSTILE_CONNECT = "ct_hostile_token"
#: The simulator's claim TTL in these tests. The worker renews a third of the way to the deadline, so this
#: leaves a renewal about 6 s to be late, or to be retried after a fault, before the claim expires under a
#: live worker (3 and 5 s TTLs left a loaded 2-core machine 1 to 3 s). No test here waits for an expiry.
TTL = 10.0


class FaultyTransport(httpx.AsyncBaseTransport):
    """Forwards to the real server, except that it answers 500 to the next ``fail`` requests, and to every
    request while ``fail_until`` is set and returns false."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.fail = 0
        self.fail_until: Optional[Callable[[], bool]] = None
        self.failed = 0
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(f"{request.method} {request.url.path}")
        if self.fail > 0 or (self.fail_until is not None and not self.fail_until()):
            self.fail = max(0, self.fail - 1)
            self.failed += 1
            return httpx.Response(500, json={"detail": "injected fault"})
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def in_process(
    config: WorkerConfig,
    scenario: Callable[[Worker], Awaitable[None]],
    transport: Optional[httpx.AsyncBaseTransport] = None,
) -> tuple[int, Worker]:
    """Run a worker on this thread's event loop while ``scenario`` drives the test; then SIGTERM it."""

    async def main() -> tuple[int, Worker]:
        factory = (
            (lambda c: FleetClient(c.api_url, c.token, transport=transport, backoff_max=0.2))
            if transport
            else None
        )
        worker = Worker(config, client_factory=factory)
        task = asyncio.ensure_future(worker.run())
        try:
            await scenario(worker)
        finally:
            if not task.done():
                worker.on_signal(signal.SIGTERM)
        return await asyncio.wait_for(task, 30), worker

    return asyncio.run(main())


async def until(predicate: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    return await asyncio.to_thread(wait_for, predicate, timeout, 0.05, what)


def make_config(tmp: Path, api_url: str, static: str, **overrides: Any) -> WorkerConfig:
    options: dict[str, Any] = {
        "api_url": api_url,
        "token": TOKEN,
        "outpost": "rhel",
        "cache_dir": tmp / "data" / "cache",
        "workdir": tmp / "work",
        "static_base_url": static,
        "poll_interval": 0.3,
        "confirm_interval": 0.1,
        "stop_grace": 2.0,
        "backoff_max": 1.0,
        "drain_timeout": 1.0,
        **overrides,
    }
    return WorkerConfig(**options)


# --- the simulator goes away ----------------------------------------------------------------------


def test_simulator_restart_during_watch(tmp_path: Path, remote: FakeRemote) -> None:
    with (
        sim_process(tmp_path / "sim.db", claim_ttl=TTL, keepalive_interval=0.3, sweep_interval=0.05) as sim,
        DistServer("abc1234", remote.script) as dist,
    ):
        outpost = sim.admin.create_outpost("rhel", "linux")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIN_")}
        env.update(DEVIN_OUTPOSTS_TOKEN=sim.create_token("machine"), DEVIN_API_URL=sim.url)
        args = ["--outpost", "rhel", "--cache-dir", str(tmp_path / "data" / "cache"), "--workdir",
                str(tmp_path / "work"), "--static-base-url", dist.url, "--backoff-max-secs", "1",
                "--poll-interval-secs", "0.3", "--drain-timeout", "1"]  # fmt: skip
        worker = WorkerProcess(args, env, tmp_path / "worker.log").start()
        try:
            first = sim.admin.enqueue(outpost.outpost_id)
            wait_for(lambda: remote.runs(first.session_id), what="the first session")
            sim.restart()  # graceful: streams end, connections refused for a moment
            second = sim.admin.enqueue(outpost.outpost_id)
            sim.admin.set_status(first.session_id, "terminated")
            wait_for(lambda: remote.runs(second.session_id), 30, what=f"the second session\n{worker.log()}")
            sim.restart(kill=True)  # SIGKILL: no goodbye on the stream
            sim.admin.set_status(second.session_id, "terminated")
            third = sim.admin.enqueue(outpost.outpost_id)
            wait_for(lambda: remote.runs(third.session_id), 30, what=f"the third session\n{worker.log()}")
            assert worker.proc is not None
            assert worker.proc.poll() is None  # it never crashed
            for entry in (first, second, third):
                assert (
                    len([c for c in sim.admin.claims(session_id=entry.session_id) if c["action"] == "claim"])
                    == 1
                )
        finally:
            worker.stop()


def test_streams_dropped_every_second_lose_no_session(tmp_path: Path, remote: FakeRemote) -> None:
    with (
        run_sim(claim_ttl=TTL, watch_max_duration=1, keepalive_interval=0.2, sweep_interval=0.05) as sim,
        DistServer("abc1234", remote.script) as dist,
    ):
        outpost = sim.admin.create_outpost("rhel", "linux")
        config = make_config(tmp_path, sim.url, dist.url, token=sim.create_token("machine"), max_sessions=4)
        sessions: list[str] = []

        async def scenario(worker: Worker) -> None:
            for _attempt in range(4):
                sessions.append((await asyncio.to_thread(sim.admin.enqueue, outpost.outpost_id)).session_id)
                await asyncio.sleep(1.2)  # one stream ends between enqueues
            await until(lambda: all(remote.runs(s) for s in sessions), "all sessions")

        code, worker = in_process(config, scenario)
        assert code == 0
        assert worker.metrics.counters["watch_reconnects"] >= 3
        assert worker.metrics.counters["sessions_claimed"] == 4
        for sid in sessions:
            assert [c["action"] for c in sim.admin.claims(session_id=sid)].count("claim") == 1


def test_bursts_of_500s_back_off_and_never_crash(tmp_path: Path, remote: FakeRemote) -> None:
    with (
        run_sim(claim_ttl=TTL, watch_max_duration=1, keepalive_interval=0.2, sweep_interval=0.05) as sim,
        DistServer("abc1234", remote.script) as dist,
    ):
        outpost = sim.admin.create_outpost("rhel", "linux")
        transport = FaultyTransport()
        config = make_config(tmp_path, sim.url, dist.url, token=sim.create_token("machine"))

        async def scenario(worker: Worker) -> None:
            await until(lambda: worker.ready, "the worker to start")
            transport.fail = 25  # a burst while idle: lists and watch reconnects fail
            entry = await asyncio.to_thread(sim.admin.enqueue, outpost.outpost_id)
            await until(lambda: remote.runs(entry.session_id), "the session despite the burst")
            # A burst while serving: everything fails until a renewal has failed too (with a 10 s TTL a
            # burst of a fixed size could pass before the next renewal). The claim must survive it.
            burst_start = transport.failed
            transport.fail_until = lambda: worker.metrics.counters.get("renewal_failures", 0) >= 1
            await until(lambda: worker.metrics.counters.get("renewal_failures", 0) >= 1, "a renewal to fail")
            transport.fail_until = None
            assert transport.failed > burst_start
            await asyncio.to_thread(sim.admin.set_status, entry.session_id, "terminated")
            await until(
                lambda: any(c["action"] == "release" for c in sim.admin.claims(session_id=entry.session_id)),
                "the release",
            )
            claims = sim.admin.claims(session_id=entry.session_id)
            assert not [c for c in claims if c["action"] == "expire"], claims
            assert len(remote.runs(entry.session_id)) == 1

        code, worker = in_process(config, scenario, transport)
        assert code == 0
        assert transport.failed > 25
        assert worker.metrics.counters["renewal_failures"] >= 1
        assert worker.metrics.counters["sessions_served"] == 1


def test_unauthorized_mid_run_exits_3(tmp_path: Path, remote: FakeRemote) -> None:
    with (
        run_sim(claim_ttl=TTL, watch_max_duration=1, keepalive_interval=0.2, sweep_interval=0.05) as sim,
        DistServer("abc1234", remote.script) as dist,
    ):
        sim.admin.create_outpost("rhel", "linux")
        transport = FaultyTransport()
        config = make_config(tmp_path, sim.url, dist.url, token=sim.create_token("machine"))

        async def scenario(worker: Worker) -> None:
            await until(lambda: worker.ready, "the worker to start")
            original = transport.handle_async_request

            async def deny(request: httpx.Request) -> httpx.Response:
                return httpx.Response(401, json={"detail": "Invalid token"})

            transport.handle_async_request = deny  # type: ignore[method-assign]
            del original
            await until(lambda: worker.fatal is not None, "the worker to notice the 401")
            await until(lambda: not worker.health().healthy, "/healthz to report it")

        from devin_outposts.core.exits import ProgramExit

        with pytest.raises(ProgramExit, match="401") as caught:
            in_process(config, scenario, transport)
        assert caught.value.code == 3


# --- a hostile server -----------------------------------------------------------------------------


class HostileFleet:
    """A fleet API (httpx MockTransport) whose only session id tries to escape the state dir."""

    SESSION = "../../escape"

    def __init__(self) -> None:
        self.status = "pending"
        self.holder: Optional[str] = None
        self.calls: list[str] = []

    def entry(self, **status: Any) -> dict[str, Any]:
        return {
            "metadata": {"session_id": self.SESSION, "outpost_id": "outpost_env-h", "created_at": 1},
            "spec": {"kind": "new", "platform": "linux"},
            "status": {
                "phase": "claimed" if self.holder else "pending",
                "acceptor_id": self.holder,
                "claim_deadline": 4102444800 if self.holder else None,
                "session_status": self.status,
                **status,
            },
        }

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = unquote(request.url.raw_path.decode().split("?", 1)[0])
        self.calls.append(f"{request.method} {path}")
        if path == "/opbeta/outposts/outposts":
            outpost = {
                "metadata": {"outpost_id": "outpost_env-h"},
                "spec": {"name": "rhel", "platform": None},
            }
            return httpx.Response(200, json={"items": [outpost], "has_next_page": False})
        if path == "/opbeta/outposts/devins":
            items = [] if request.url.params.get("phase") == "claimed" else [self.entry()]
            return httpx.Response(200, json={"items": items, "cursor": "c", "has_next_page": False})
        prefix = f"/opbeta/outposts/devins/{self.SESSION}"
        if path == f"{prefix}/claim":
            self.holder = json.loads(request.content)["acceptor_id"]
            return httpx.Response(
                200, json=self.entry(connect_token=HOSTILE_CONNECT, gateway_url="ws://h/gw")
            )
        if path == f"{prefix}/release":
            self.holder = None
            return httpx.Response(200, json=self.entry())
        if path == prefix:
            return httpx.Response(200, json=self.entry())
        return httpx.Response(404, json={"detail": "no"})


def test_hostile_session_id_cannot_escape_the_state_dir(tmp_path: Path, remote: FakeRemote) -> None:
    fleet = HostileFleet()
    remote.default("marker:ran")
    with DistServer("abc1234", remote.script) as dist:
        config = make_config(tmp_path / "w", "http://fleet.invalid", dist.url, watch=False)

        async def scenario(worker: Worker) -> None:
            await until(lambda: remote.runs(fleet.SESSION), "the remote")
            fleet.status = "terminated"
            await until(
                lambda: f"POST /opbeta/outposts/devins/{fleet.SESSION}/release" in fleet.calls, "release"
            )

        code = in_process(config, scenario, httpx.MockTransport(fleet.handle))[0]
    assert code == 0
    state = Path(remote.runs(fleet.SESSION)[0]["env"]["DEVIN_REMOTE_STATE_DIR"])
    sessions = (tmp_path / "w" / "data" / "sessions").resolve()
    assert state.parent == sessions
    assert state.name.startswith("_")
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "w" / "escape").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["remote", "w"]
