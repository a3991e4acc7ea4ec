"""The orchestrator's loop with a scripted driver, against the in-process simulator.

The driver here makes no machines: it records what the orchestrator asks of it and answers status reads
from a script, so that boot timeouts, restart limits, exits while the session is live and provisioning
failures can be driven exactly. What is asserted is observed state: the simulator's claim history and
queue entries, the driver's record of calls, and the orchestrator's metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest
from orchestrator_fakes import Running, ScriptedDriver, orchestrators, released

from devin_outposts.api.client import FleetClient
from devin_outposts.api.errors import FleetError
from devin_outposts.api.models import Outpost
from devin_outposts.core.claiming import ClaimLoop
from devin_outposts.core.config import ConfigError
from devin_outposts.core.exits import ExitCode, ProgramExit
from devin_outposts.orchestrator.drivers.base import (
    DriverContext,
    DriverError,
    WorkerState,
    WorkerStatus,
)
from devin_outposts.orchestrator.drivers.process import ProcessDriver
from devin_outposts.orchestrator.options import OrchestratorConfig, parse_args
from devin_outposts.orchestrator.runner import Orchestrator
from devin_outposts.orchestrator.sweep import _LiveSessions
from devin_outposts_sim.testing import SimHandle

from worker_fakes import wait_for


@pytest.fixture
def start(sim: SimHandle, outpost: Outpost, tmp_path: Path) -> Iterator[Callable[..., Running]]:
    with orchestrators(
        sim, tmp_path / "state", outpost=outpost.name, max_concurrent=2, acceptor_id="orch-unit"
    ) as run:
        yield run


def test_a_machine_that_never_boots_is_given_up_and_its_claim_released(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    driver = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.STARTING, detail="image pulling"))
    caplog.set_level(logging.WARNING)
    orch = start(driver, boot_timeout=0.6, max_concurrent=1)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    wait_for(lambda: released(sim, sid), timeout=20, what="the release")
    wait_for(lambda: sid in driver.torn_down, timeout=10, what="the teardown")
    results = wait_for(
        lambda: [r for r in orch.orchestrator.results if r.session_id == sid], timeout=10, what="the result"
    )
    first = results[0]
    assert first.infrastructure
    assert orch.orchestrator.metrics.counters["infrastructure_errors"] >= 1
    assert orch.orchestrator.metrics.counters["workers_given_up"] == 0
    assert "did not come up within 0.6s (image pulling)" in first.detail
    assert any("capacity is full" in r.getMessage() for r in caplog.records)


def test_a_worker_failing_past_the_restart_limit_is_given_up_and_released(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running]
) -> None:
    driver = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.EXITED, exit_code=3))
    orch = start(driver, restart_limit=2)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    wait_for(lambda: released(sim, sid), timeout=30, what="the release")
    assert driver.starts(sid) == 3  # the first start and two restarts
    wait_for(lambda: orch.orchestrator.metrics.counters["workers_given_up"] == 1, timeout=5, what="given up")
    assert orch.orchestrator.metrics.counters["worker_restarts"] == 2
    assert sid in driver.torn_down


def test_a_worker_that_cannot_enforce_the_network_policy_is_released_at_once_without_restarts(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    """Exit 9 (the machine's worker cannot confine the session): a restart cannot help, so the claim goes
    back on the first exit, counted, with one line naming the machine, and the machine is torn down."""
    driver = ScriptedDriver(
        lambda sid, starts: WorkerStatus(WorkerState.EXITED, exit_code=int(ExitCode.NETWORK_POLICY))
    )
    caplog.set_level(logging.WARNING)
    orch = start(driver, restart_limit=3)
    sid = sim.admin.enqueue(
        outpost.outpost_id, network_policy={"enabled": True, "allow": [{"hostname": "github.com"}]}
    ).session_id
    wait_for(lambda: released(sim, sid), timeout=30, what="the release")
    wait_for(lambda: sid in driver.torn_down, timeout=10, what="the teardown")
    assert driver.starts(sid) == 1
    [launch] = driver.launches[sid]
    assert launch.network_policy == {
        "enabled": True,
        "allow": [{"hostname": "github.com", "ipv4": None, "ipv6": None}],
    }
    counters = orch.orchestrator.metrics.counters
    assert (
        counters["network_policy_refusals"],
        counters["worker_restarts"],
        counters["workers_given_up"],
    ) == (
        1,
        0,
        0,
    )
    lines = [
        r.getMessage()
        for r in caplog.records
        if "cannot enforce the session's network policy" in r.getMessage()
    ]
    assert len(lines) == 1 and sid in lines[0], lines


def test_an_exit_0_while_the_session_is_live_restarts_the_worker_with_a_fresh_token(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running]
) -> None:
    def script(sid: str, starts: int) -> WorkerStatus:
        if starts == 1:
            return WorkerStatus(WorkerState.EXITED, exit_code=0)
        return WorkerStatus(WorkerState.RUNNING)

    driver = ScriptedDriver(script)
    orch = start(driver)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    sim.admin.set_status(sid, "running")
    wait_for(lambda: driver.starts(sid) == 2, timeout=20, what="the second start")
    first, second = driver.launches[sid]
    assert first.connect_token != second.connect_token  # re-claimed for a fresh token
    assert sim.admin.check_connect_token(sid, second.connect_token)
    assert not released(sim, sid)
    sim.admin.set_status(sid, "terminated")
    wait_for(lambda: released(sim, sid), timeout=20, what="the release")
    assert sid in driver.torn_down
    assert orch.orchestrator.metrics.histograms["session_start_seconds"].count == 1


def test_the_machine_gets_the_connect_token_and_never_the_account_token(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running]
) -> None:
    driver = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.RUNNING))
    orch = start(driver, static_base_url="https://static.example/remote/", remote_binary_sha="abc1234")
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    wait_for(lambda: driver.starts(sid) == 1, timeout=20, what="the start")
    [launch] = driver.launches[sid]
    env, argv = launch.environment(), launch.arguments()
    account_token = orch.orchestrator.config.token
    assert account_token and account_token not in json.dumps(env) and account_token not in argv
    assert env["DEVIN_REMOTE_SESSION_TOKEN"] == launch.connect_token
    assert launch.connect_token not in " ".join(argv)  # never argv
    assert env["DEVIN_WORKER_REMOTE_SHA"] == "abc1234"
    assert env["DEVIN_WORKER_STATIC_BASE_URL"] == "https://static.example/remote/"
    assert argv == ["worker", "start", f"--session={sid}"]
    assert launch.connect_token not in repr(launch)


def test_a_provisioning_failure_or_timeout_releases_at_once(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running]
) -> None:
    never = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.RUNNING), provision_delay=5)
    orch = start(never, provision_timeout=0.3, max_concurrent=1)
    slow = sim.admin.enqueue(outpost.outpost_id).session_id
    wait_for(lambda: released(sim, slow), timeout=10, what="the release after the timeout")
    result = wait_for(
        lambda: next((r for r in orch.orchestrator.results if r.session_id == slow), None),
        timeout=10,
        what="the result",
    )
    assert result.infrastructure and "longer than 0.3s" in result.detail
    orch.stop()
    failing = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.RUNNING), fail_provision=True)
    orch = start(failing, max_concurrent=1)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    wait_for(lambda: released(sim, sid), timeout=10, what="the release after the failure")
    result = wait_for(
        lambda: next((r for r in orch.orchestrator.results if r.session_id == sid), None),
        timeout=10,
        what="the result",
    )
    assert result.infrastructure and "no capacity in the test cloud" in result.detail
    assert orch.orchestrator.metrics.counters["infrastructure_errors"] >= 1


def test_a_claim_loop_that_dies_ends_the_run_non_zero_with_its_sessions_detached(
    sim: SimHandle, outpost: Outpost, start: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No error may leave the orchestrator alive but not claiming: if the loop ends on one all the same,
    the run ends at once with exit code 1, its sessions left running and their claims held."""
    real_loop = ClaimLoop.claim_loop
    driver = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.RUNNING))

    async def dies(self: ClaimLoop) -> None:
        claiming = asyncio.ensure_future(real_loop(self))
        # Until the session's machine is started, not only claimed: on a loaded machine the claim loop died
        # while the session was still being provisioned, and the run ended before any start.
        while not self.pool.running or not driver.launches:  # noqa: ASYNC110 - no event to wait on here
            await asyncio.sleep(0.05)
        claiming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await claiming
        raise RuntimeError("a bug in the claim loop")

    monkeypatch.setattr(ClaimLoop, "claim_loop", dies)
    sid = sim.admin.enqueue(outpost.outpost_id).session_id
    orch = start(driver)
    wait_for(lambda: not orch.thread.is_alive(), timeout=30, what="the run to end")
    assert isinstance(orch.error, ProgramExit) and orch.error.code == ExitCode.ERROR
    assert "the claim loop stopped on an unexpected error (RuntimeError: a bug in the claim loop)" in str(
        orch.error
    )
    assert driver.starts(sid) == 1
    assert sid in driver.machines and not driver.torn_down  # detached: the next start adopts it
    assert not released(sim, sid)


class Redirector:
    """Answers every request with a 307 to ``target``, and records what reached ``target``."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Target(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(dict(self.headers))
                self.send_response(200)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                return None

        self.target = ThreadingHTTPServer(("127.0.0.1", 0), Target)
        target_url = f"http://localhost:{self.target.server_address[1]}"

        class Redirect(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(307)
                self.send_header("Location", target_url + self.path)
                self.end_headers()

            do_POST = do_GET

            def log_message(self, *args: Any) -> None:
                return None

        self.origin = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
        self.url = f"http://127.0.0.1:{self.origin.server_address[1]}"
        for server in (self.target, self.origin):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.target, self.origin):
            server.shutdown()
            server.server_close()


def test_the_token_never_follows_a_redirect_to_another_host(tmp_path: Path) -> None:
    redirector = Redirector()
    try:

        async def ask() -> None:
            async with FleetClient(redirector.url, "tok-secret-1234", retries=0) as client:
                await client.get_devin("devin-1")

        with pytest.raises(FleetError, match="redirected to"):
            asyncio.run(ask())
        config = OrchestratorConfig(
            outpost="o", driver="process", api_url=redirector.url, token="tok-secret-1234",
            state_dir=tmp_path / "state", backoff_max=0.1,
        )  # fmt: skip
        driver = ScriptedDriver(lambda sid, starts: WorkerStatus(WorkerState.RUNNING))
        with pytest.raises(ProgramExit) as failure:
            asyncio.run(Orchestrator(config, driver=driver).run())
        assert failure.value.code == ExitCode.ERROR
        assert "redirected to" in str(failure.value)
        assert redirector.seen == []  # nothing, with or without the token, reached the other host
    finally:
        redirector.close()


# --- options -------------------------------------------------------------------------------------------

ENV = {"DEVIN_OUTPOSTS_TOKEN": "tok-1"}


def test_options_come_from_flags_then_the_environment() -> None:
    env = {**ENV, "DEVIN_ORCHESTRATOR_OUTPOST": "fleet", "DEVIN_ORCHESTRATOR_DRIVER": "podman",
           "DEVIN_ORCHESTRATOR_MAX_CONCURRENT": "7"}  # fmt: skip
    config = parse_args(["--driver", "process"], env)
    assert (config.outpost, config.driver, config.max_concurrent) == ("fleet", "process", 7)
    assert config.token == "tok-1" and "tok-1" not in repr(config)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--driver", "process"], ENV, "--outpost is required"),
        (["--outpost", "o"], ENV, "--driver is required"),
        (["--outpost", "o", "--driver", "process"], {}, "no API token"),
        (["--outpost", "o", "--driver", "process", "--max-concurrent", "0"], ENV, "--max-concurrent must be"),
        (["--outpost", "o", "--driver", "process", "--driver-opt", "novalue"], ENV, "KEY=VALUE"),
    ],
)
def test_bad_options_fail_with_one_line_naming_the_flag(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(argv, env)


def test_driver_options_come_from_the_file_and_the_flags_win(tmp_path: Path) -> None:
    path = tmp_path / "driver.json"
    path.write_text(json.dumps({"stop_grace": "3", "root": str(tmp_path / "machines")}))
    config = parse_args(
        [
            "--outpost",
            "o",
            "--driver",
            "process",
            "--driver-config",
            str(path),
            "--driver-opt",
            "stop_grace=4",
        ],
        ENV,
    )
    assert config.driver_options == {"stop_grace": "4", "root": str(tmp_path / "machines")}
    driver = ProcessDriver.from_options(DriverContext(state_dir=tmp_path), config.driver_options)
    assert driver.stop_grace == 4.0 and driver.root == tmp_path / "machines"
    with pytest.raises(DriverError, match="unknown process driver option imagee"):
        ProcessDriver.from_options(DriverContext(state_dir=tmp_path), {"imagee": "x"})
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_args(["--outpost", "o", "--driver", "process", "--driver-config", str(path)], ENV)


def test_every_option_is_in_the_docs_with_its_variable() -> None:
    from devin_outposts.orchestrator.options import OPTIONS

    docs = (Path(__file__).resolve().parents[3] / "docs" / "orchestrator.md").read_text()
    for option in OPTIONS:
        assert f"`{option.flag}" in docs, option.flag
        if option.env:
            assert f"`{option.env}`" in docs, option.env


def test_the_sweeps_live_sessions_include_one_claimed_while_it_runs() -> None:
    """The sweep hands the driver a live view, not a copy: a session that joins the pool after the sweep
    started (its provision is making objects the sweep is looking at) is live at once."""
    running: dict[str, object] = {"devin-a": object()}
    live = _LiveSessions(running.keys(), {"devin-kept"})
    assert "devin-a" in live and "devin-kept" in live and "devin-b" not in live
    running["devin-b"] = object()  # claimed while the sweep runs
    assert "devin-b" in live
    del running["devin-a"]
    assert "devin-a" not in live
