"""The worker end to end against the fleet simulator, as a real ``devin-outposts worker start`` process.

The fake ``devin-remote`` (``worker_fakes.FakeRemote``) is published on a loopback distribution server
and records its argv, cwd and whole environment, so every assertion is on observed state: what the remote
saw, and the simulator's claim history (``claim``/``renew``/``release``/``expire`` records). Every process
a test starts (simulator threads, workers, remotes) is stopped by that test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest

from devin_outposts.api.models import Outpost
from devin_outposts.core import processes
from devin_outposts_sim.testing import SimHandle, run_sim

from worker_fakes import DistServer, FakeRemote, WorkerProcess, alive, kill_pids, wait_for

CANARY = "canary-secret-that-must-not-reach-a-session"
BAD_TOKEN = "cog_not_a_real_token_at_all_000000"
DIRECT_TOKEN = "ct_direct_serve_token_value"
#: The simulator's claim TTL here. The worker renews a third of the way to the deadline, so a renewal may be
#: late by about two thirds of this (minus a second: deadlines are whole seconds) before a claim expires
#: under a live worker: 6 s of margin, where a 3 s TTL left a loaded 2-core machine well under 2 s. The
#: tests that wait for a dead worker's claim to expire wait about this long, plus the worker's 1 s slack.
CLAIM_TTL = 10.0
#: How long to wait for something that follows a claim's expiry: the TTL, then as long again and 10 s more
#: for a loaded machine (these are bounds on waits, not expected durations).
AFTER_EXPIRY = 2 * CLAIM_TTL + 10
SPAWN_ENV = {
    "DEVIN_OUTPOST_GATEWAY_URL", "DEVIN_OUTPOST_CONNECT_TOKEN", "DEVIN_OUTPOST_SESSION_ID",
    "DEVIN_REMOTE_STATE_DIR", "DEVIN_PTY_BRIDGE_PORT", "DEVIN_CHROME_PATH", "DEVIN_OUTPOST_DESKTOP",
    "PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "TZ", "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY",
}  # fmt: skip


@dataclass
class Harness:
    sim: SimHandle
    dist: DistServer
    remote: FakeRemote
    tmp: Path
    token: str
    outpost: Outpost
    workers: list[WorkerProcess] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DEVIN_", "PYTEST_"))}
        env.update(
            DEVIN_OUTPOSTS_TOKEN=self.token,
            DEVIN_API_URL=self.sim.url,
            DEVIN_WORKER_STATIC_BASE_URL=self.dist.url,
            WORKER_TEST_CANARY=CANARY,
            DEVIN_CHROME_PATH="/usr/bin/google-chrome",
        )
        env.update(extra)
        return env

    def worker(
        self, name: str, *args: str, env: Optional[dict[str, str]] = None, start: bool = True
    ) -> WorkerProcess:
        base = [
            "--outpost", self.outpost.name, "--cache-dir", str(self.tmp / name / "data" / "cache"),
            "--workdir", str(self.tmp / name / "work"), "--poll-interval-secs", "0.3",
            "--confirm-interval-secs", "0.1", "--stop-grace-secs", "2", "--backoff-max-secs", "2",
            "--drain-timeout", "1",
        ]  # fmt: skip
        process = WorkerProcess([*base, *args], env or self.env(), self.tmp / f"{name}.log")
        self.workers.append(process)
        return process.start() if start else process

    def claims(self, session_id: Optional[str] = None, action: Optional[str] = None) -> list[dict[str, Any]]:
        records = self.sim.admin.claims(
            session_id=session_id, outpost_id=None if session_id else self.outpost.outpost_id
        )
        return [r for r in records if action is None or r["action"] == action]

    def released(self, session_id: str) -> bool:
        return bool(self.claims(session_id, "release"))

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name}\n{w.log()[-4000:]}" for w in self.workers)


@contextlib.contextmanager
def running_harness(tmp_path: Path) -> Iterator[Harness]:
    """A simulator, a dist server and an outpost for real workers; every worker and remote stopped after."""
    remote = FakeRemote(tmp_path / "remote")
    with (
        run_sim(
            claim_ttl=CLAIM_TTL, watch_max_duration=3, keepalive_interval=0.5, sweep_interval=0.05
        ) as sim,
        DistServer("abc1234", remote.script) as dist,
    ):
        outpost = sim.admin.create_outpost("rhel", "linux")
        h = Harness(sim, dist, remote, tmp_path, sim.create_token("machine"), outpost)
        try:
            yield h
        finally:
            for worker in h.workers:
                worker.stop()
            kill_pids(run["pid"] for run in remote.runs())


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with running_harness(tmp_path) as h:
        yield h


def wait(h: Harness, predicate: Any, what: str, timeout: float = 20.0) -> Any:
    try:
        return wait_for(predicate, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{h.logs()}") from None


# --- end to end -----------------------------------------------------------------------------------


def test_end_to_end_claim_run_terminate_release_next(harness: Harness) -> None:
    h = harness
    worker = h.worker("w1")
    first = h.sim.admin.enqueue(h.outpost.outpost_id)
    run = wait(h, lambda: h.remote.runs(first.session_id), "the remote to start")[0]

    env = run["env"]
    assert run["argv"][1:] == ["serve"]
    assert run["cwd"] == str(h.tmp / "w1" / "work")
    assert set(env) <= SPAWN_ENV, set(env) - SPAWN_ENV
    assert env["DEVIN_OUTPOST_SESSION_ID"] == first.session_id
    assert env["DEVIN_OUTPOST_GATEWAY_URL"].endswith("/gateway")
    assert env["DEVIN_CHROME_PATH"] == "/usr/bin/google-chrome"
    assert env["DEVIN_REMOTE_STATE_DIR"] == str(h.tmp / "w1" / "data" / "sessions" / first.session_id)
    assert oct(os.stat(env["DEVIN_REMOTE_STATE_DIR"]).st_mode & 0o777) == "0o700"
    assert int(env["DEVIN_PTY_BRIDGE_PORT"]) > 0
    values = "\n".join(env.values())
    assert h.token not in values
    assert CANARY not in values
    assert h.sim.admin.check_connect_token(first.session_id, env["DEVIN_OUTPOST_CONNECT_TOKEN"])
    assert env["DEVIN_OUTPOST_CONNECT_TOKEN"] not in " ".join(run["argv"])

    h.sim.admin.set_status(first.session_id, "terminated")
    wait(h, lambda: h.released(first.session_id), "the release")
    wait(h, lambda: run["pid"] in h.remote.stopped_pids(), "the remote to get SIGTERM")

    second = h.sim.admin.enqueue(h.outpost.outpost_id)
    wait(h, lambda: h.remote.runs(second.session_id), "the next session")
    worker.stop()
    assert worker.proc is not None
    assert worker.proc.returncode == 0
    log = worker.log()
    assert h.token not in log
    assert env["DEVIN_OUTPOST_CONNECT_TOKEN"] not in log
    assert h.released(second.session_id)  # SIGTERM drained and released it


def test_claims_are_renewed_before_the_deadline(harness: Harness) -> None:
    h = harness
    h.worker("w1")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    # Three renewals, a third of the TTL apart, carry the claim past its first deadline.
    wait(h, lambda: len(h.claims(entry.session_id, "renew")) >= 3, "three renewals", timeout=AFTER_EXPIRY)
    assert not h.claims(entry.session_id, "expire")
    assert len(h.remote.runs(entry.session_id)) == 1


def test_three_workers_serve_90_sessions_each_exactly_once(harness: Harness) -> None:
    h = harness
    for name in ("a", "b", "c"):
        h.worker(name, "--max-sessions", "2")
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(90)]

    # The brain ends every session: mark it terminated as soon as its remote runs; the worker stops it.
    def all_ended() -> bool:
        for sid in sessions:
            if (
                h.remote.runs(sid)
                and h.sim.admin.session(sid)["entry"]["status"]["session_status"] != "terminated"
            ):
                h.sim.admin.set_status(sid, "terminated")
        return all(h.released(sid) for sid in sessions)

    wait(h, all_ended, "all 90 sessions served and released", timeout=90)
    servers: set[str] = set()
    for sid in sessions:
        assert len(h.remote.runs(sid)) == 1, sid  # served exactly once
        # Claims never overlap. A worker whose picture of the queue lagged may claim a row that ended a
        # moment ago: the claim response says so, and it gives the row back at once without running it.
        holder: Optional[str] = None
        records = h.claims(sid)
        for record in records:
            if record["action"] == "claim":
                assert holder is None, records
                holder = record["acceptor_id"]
            elif record["action"] in ("release", "expire", "tombstone"):
                holder = None
        assert holder is None, records
        servers.add(h.claims(sid, "claim")[0]["acceptor_id"])
    assert len(servers) == 3  # the work was shared by all three


def wait_for_pid_record(h: Harness, run: dict[str, Any]) -> None:
    """Wait until the worker has recorded the remote's pid (``<state>.remote.pid`` beside its state
    directory).

    The stand-in reports its run as soon as it starts, a moment before its worker writes that record; a
    ``kill -9`` inside that moment leaves a remote the next worker cannot know about (docs/worker.md,
    "Restarts"), which is not what these tests are about.
    """
    record = processes.record_path(Path(run["env"]["DEVIN_REMOTE_STATE_DIR"]))
    wait(h, record.exists, "the worker to record the remote's pid")


def test_kill_9_then_restart_with_the_same_identity_takes_the_session_back(harness: Harness) -> None:
    h = harness
    worker = h.worker("w1")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    first = wait(h, lambda: h.remote.runs(entry.session_id), "the remote")[0]
    acceptor = h.claims(entry.session_id, "claim")[0]["acceptor_id"]
    wait_for_pid_record(h, first)
    worker.kill9()
    assert alive(first["pid"])  # the orphaned remote survives its worker, as after a real crash

    again = h.worker("w1")  # same data dir: same stored acceptor id
    runs = wait(
        h, lambda: len(h.remote.runs(entry.session_id)) >= 2 and h.remote.runs(entry.session_id), "take-back"
    )
    assert runs[-1]["pid"] != first["pid"]
    wait(h, lambda: not alive(first["pid"]), "the orphaned remote to be stopped")
    assert {r["acceptor_id"] for r in h.claims(entry.session_id)} == {acceptor}
    assert (h.tmp / "w1" / "data" / "acceptor_id").read_text().strip() == acceptor
    token = runs[-1]["env"]["DEVIN_OUTPOST_CONNECT_TOKEN"]
    assert h.sim.admin.check_connect_token(entry.session_id, token)
    h.sim.admin.set_status(entry.session_id, "terminated")
    wait(h, lambda: h.released(entry.session_id), "the release")
    again.stop()


def test_a_restarted_worker_stops_orphans_of_sessions_that_ended_meanwhile(harness: Harness) -> None:
    h = harness
    worker = h.worker("w1")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    orphan = wait(h, lambda: h.remote.runs(entry.session_id), "the remote")[0]
    wait_for_pid_record(h, orphan)
    worker.kill9()
    h.sim.admin.set_status(entry.session_id, "terminated")  # the session ends while no worker watches
    wait(
        h,
        lambda: not h.sim.admin.session(entry.session_id)["entry"]["status"]["acceptor_id"],
        "the TTL",
        timeout=AFTER_EXPIRY,
    )
    h.worker("w1")
    wait(h, lambda: not alive(orphan["pid"]), "the orphaned remote to be stopped")
    assert len(h.remote.runs(entry.session_id)) == 1  # not served again


def test_a_dead_workers_session_is_taken_by_another_after_the_ttl(harness: Harness) -> None:
    h = harness
    dead = h.worker("dead")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    first = wait(h, lambda: h.remote.runs(entry.session_id), "the first remote")[0]
    dead.kill9()
    kill_pids([first["pid"]])  # the whole machine died
    h.worker("other")
    runs = wait(
        h,
        lambda: len(h.remote.runs(entry.session_id)) >= 2 and h.remote.runs(entry.session_id),
        "takeover",
        timeout=AFTER_EXPIRY,
    )
    claims = h.claims(entry.session_id, "claim")
    assert len({c["acceptor_id"] for c in claims}) == 2
    assert h.claims(entry.session_id, "expire")
    assert runs[-1]["env"]["DEVIN_REMOTE_STATE_DIR"].startswith(str(h.tmp / "other"))


def test_a_second_worker_on_the_same_data_dir_refuses(harness: Harness) -> None:
    h = harness
    h.worker("w1")
    wait(h, (h.tmp / "w1" / "data" / "acceptor_id").exists, "the first worker to start")
    second = h.worker("w1-again", "--cache-dir", str(h.tmp / "w1" / "data" / "cache"))
    assert second.wait(20) == 8
    assert "another worker is already using the worker data directory" in second.log()


def test_sigterm_drains_then_stops_and_releases(harness: Harness) -> None:
    h = harness
    worker = h.worker("w1", "--drain-timeout", "1")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    run = wait(h, lambda: h.remote.runs(entry.session_id), "the remote")[0]
    worker.signal(signal.SIGTERM)
    assert worker.wait(20) == 0
    assert h.released(entry.session_id)
    assert run["pid"] in h.remote.stopped_pids()
    assert not alive(run["pid"])
    assert "no new claims" in worker.log()


def test_second_signal_stops_at_once_and_still_releases(harness: Harness) -> None:
    h = harness
    h.remote.default("ignore-term")
    worker = h.worker("w1", "--drain-timeout", "60", "--stop-grace-secs", "60")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    run = wait(h, lambda: h.remote.runs(entry.session_id), "the remote")[0]
    worker.signal(signal.SIGTERM)
    wait(h, lambda: "no new claims" in worker.log(), "the drain to start")
    worker.signal(signal.SIGINT)
    assert worker.wait(20) == 0
    assert h.released(entry.session_id)
    assert not alive(run["pid"])


def test_unauthorized_token_exits_3_with_one_line(harness: Harness) -> None:
    h = harness
    worker = h.worker("w1", env=h.env(DEVIN_OUTPOSTS_TOKEN=BAD_TOKEN))
    assert worker.wait(20) == 3
    lines = [line for line in worker.log().splitlines() if line.startswith("devin-outposts: error:")]
    assert len(lines) == 1
    assert "401" in lines[0]
    assert "Traceback" not in worker.log()
    assert BAD_TOKEN not in worker.log()


def test_platform_mismatch_exits_6_without_claiming(harness: Harness) -> None:
    h = harness
    mac = h.sim.admin.create_outpost("macs", "macos")
    h.sim.admin.enqueue(mac.outpost_id)
    worker = h.worker("w1", "--outpost", "macs")
    assert worker.wait(20) == 6
    assert "serves macos sessions but this machine runs linux" in worker.log()
    assert h.sim.admin.claims(outpost_id=mac.outpost_id) == []


def test_unknown_outpost_exits_4(harness: Harness) -> None:
    worker = harness.worker("w1", "--outpost", "nope")
    assert worker.wait(20) == 4
    assert "Could not find outpost nope" in worker.log()


def test_session_mode_serves_that_session_then_exits(harness: Harness) -> None:
    h = harness
    other = h.sim.admin.enqueue(h.outpost.outpost_id)
    target = h.sim.admin.enqueue(h.outpost.outpost_id)
    h.remote.plan(target.session_id, "exit:0")
    h.sim.admin.set_status(target.session_id, "running")
    worker = h.worker("w1", "--session", target.session_id)
    wait(h, lambda: h.remote.runs(target.session_id), "the remote")
    h.sim.admin.set_status(target.session_id, "terminated")
    assert worker.wait(30) == 0
    assert h.released(target.session_id)
    assert h.claims(other.session_id) == []


def test_session_mode_conflict_exits_5(harness: Harness) -> None:
    h = harness
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    h.worker("holder")
    wait(h, lambda: h.remote.runs(entry.session_id), "the first worker to serve it")
    worker = h.worker("w2", "--session", entry.session_id)
    assert worker.wait(20) == 5


def test_once_exits_after_one_session(harness: Harness) -> None:
    h = harness
    entries = [h.sim.admin.enqueue(h.outpost.outpost_id) for dummy in range(2)]
    a, b = sorted(entries, key=lambda e: (e.metadata.created_at, e.session_id))  # oldest first
    worker = h.worker("w1", "--once")
    wait(h, lambda: h.remote.runs(a.session_id), "the oldest session")
    h.sim.admin.set_status(a.session_id, "terminated")
    assert worker.wait(30) == 0
    assert h.claims(b.session_id) == []


def test_polling_mode_claims_and_serves(harness: Harness) -> None:
    h = harness
    h.worker("w1", "--no-watch")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    wait(h, lambda: h.remote.runs(entry.session_id), "the remote")
    h.sim.admin.tombstone(entry.session_id)
    wait(
        h, lambda: h.remote.runs(entry.session_id)[0]["pid"] in h.remote.stopped_pids(), "the remote to stop"
    )


def test_suspended_and_terminated_pending_rows_are_not_claimed(harness: Harness) -> None:
    h = harness
    done = h.sim.admin.enqueue(h.outpost.outpost_id, session_status="terminated")
    asleep = h.sim.admin.enqueue(h.outpost.outpost_id, session_status="suspended")
    live = h.sim.admin.enqueue(h.outpost.outpost_id)
    h.worker("w1")
    wait(h, lambda: h.remote.runs(live.session_id), "the live session")
    assert h.claims(done.session_id) == []
    assert h.claims(asleep.session_id) == []


def test_tampered_binary_is_refused_released_and_never_run(harness: Harness) -> None:
    h = harness
    evil = FakeRemote(h.tmp / "evil", tag="evil")
    h.dist.tamper("abc1234", evil.script)
    worker = h.worker("w1", "--once")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    assert worker.wait(30) == 7
    assert "Refusing devin-remote abc1234" in worker.log()
    assert evil.runs() == []
    assert h.remote.runs() == []
    assert h.released(entry.session_id)


def test_direct_serve_mode_never_calls_the_queue_api(harness: Harness) -> None:
    h = harness
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    h.remote.plan(entry.session_id, "exit:0")
    with DistServer("0000000", b"") as api:  # records any request; the worker must send none
        env = h.env(
            DEVIN_REMOTE_SESSION_TOKEN=DIRECT_TOKEN,
            DEVIN_OUTPOST_GATEWAY_URL="ws://127.0.0.1:9/gateway",
            DEVIN_API_URL=api.url.rsplit("/remote/", 1)[0],
        )
        del env["DEVIN_OUTPOSTS_TOKEN"]
        worker = h.worker("w1", "--session", entry.session_id, env=env)
        assert worker.wait(30) == 0
        assert api.requests == []
    run = h.remote.runs(entry.session_id)[0]
    assert run["env"]["DEVIN_OUTPOST_CONNECT_TOKEN"] == DIRECT_TOKEN
    assert run["env"]["DEVIN_OUTPOST_GATEWAY_URL"] == "ws://127.0.0.1:9/gateway"
    assert "DEVIN_REMOTE_SESSION_TOKEN" not in run["env"]
    assert h.claims(entry.session_id) == []


def test_metrics_and_healthz(harness: Harness) -> None:
    h = harness
    port_file = h.tmp / "port"
    worker = h.worker("w1", "--metrics-addr", "127.0.0.1:0", "--log-format", "json")
    entry = h.sim.admin.enqueue(h.outpost.outpost_id)
    wait(h, lambda: h.remote.runs(entry.session_id), "the remote")
    line = wait(h, lambda: [ln for ln in worker.log().splitlines() if "serving /metrics" in ln], "metrics")[0]
    port = int(json.loads(line)["msg"].rsplit(":", 1)[1])
    del port_file

    def get(path: str) -> tuple[int, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()

    status, body = get("/healthz")
    assert status == 200
    assert json.loads(body)["status"] == "ok"
    metrics = wait(h, lambda: "renewals_total" in get("/metrics")[1] and get("/metrics")[1], "metrics text")
    assert "devin_outposts_worker_sessions_claimed_total" in metrics
    assert 'devin_outposts_worker_active_sessions{acceptor_id="' in metrics
    active = [ln for ln in metrics.splitlines() if ln.startswith("devin_outposts_worker_active_sessions{")]
    assert active[0].endswith(" 1")
    for log_line in worker.log().splitlines():
        if log_line.startswith("{"):
            json.loads(log_line)  # every log line is JSON
