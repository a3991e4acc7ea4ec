"""The worker's "re-read the final status" path, against a simulator whose status lags the remote's exit.

Contract 3.4: the status update can lag the remote's exit by a few seconds, so re-read it a few times.
Contract 4.2: on session end the remote exits 0; the worker confirms ``suspended``/``terminated`` and
releases the claim. With ``status_lag`` the simulator tells the stand-in ``devin-remote`` that the
session ended (it exits 0) and writes ``session_status`` only ``LAG`` seconds later, so right after the
exit the worker reads ``running``. A worker that gave up on the first read would take the exit for a
crash of a live session and restart the remote (a second gateway connection). The lag is inside the
worker's confirm window (``CONFIRM_READS`` reads ``CONFIRM_INTERVAL`` apart), so the worker must wait for
the status, then release. Every assertion is on observed state: the claim history, the gateway's
connection records, the queue entry.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devin_outposts_sim.testing import SimHandle, run_sim

from worker_fakes import WorkerProcess, alive, kill_pids_working_under, pids_working_under, wait_for

LAG = 2.0
CONFIRM_READS = 5
CONFIRM_INTERVAL = 1.0  # reads at 0, 1, 2, 3 and 4 s after the exit: the status lands at about 2 s
DESKTOP = ("DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY")


@pytest.fixture
def lagging_sim(tmp_path: Path) -> Iterator[SimHandle]:
    # A claim TTL well above the renewal period, so a slow machine cannot hand the session to anyone else.
    with run_sim(
        claim_ttl=15, watch_max_duration=5, keepalive_interval=0.5, sweep_interval=0.05, status_lag=LAG
    ) as sim:
        yield sim
    leftovers: list[int] = []
    try:
        wait_for(lambda: not pids_working_under(tmp_path), timeout=20, what="stand-ins to exit")
    except AssertionError:
        leftovers = kill_pids_working_under(tmp_path)
    assert not leftovers, f"processes outlived their worker: {leftovers}"


def start_worker(sim: SimHandle, tmp: Path, outpost: str, *extra: str) -> WorkerProcess:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("DEVIN_", "PYTEST_")) and k not in DESKTOP
    }
    env.update(DEVIN_OUTPOSTS_TOKEN=sim.create_token("machine"), DEVIN_API_URL=sim.url)
    args = [
        "--outpost", outpost, "--static-base-url", sim.static_base_url,
        "--cache-dir", str(tmp / "w1" / "data" / "cache"), "--workdir", str(tmp / "w1" / "work"),
        "--poll-interval-secs", "0.5", "--stop-grace-secs", "5", "--backoff-max-secs", "2",
        "--drain-timeout", "1",
        "--confirm-reads", str(CONFIRM_READS), "--confirm-interval-secs", str(CONFIRM_INTERVAL),
        *extra,
    ]  # fmt: skip
    return WorkerProcess(args, env, tmp / "w1.log").start()


def test_the_worker_waits_for_a_lagging_status_then_releases_without_restarting_the_remote(
    lagging_sim: SimHandle, tmp_path: Path
) -> None:
    sim = lagging_sim
    outpost = sim.admin.create_outpost("rhel", "linux")
    # The shebang names this interpreter, so the stand-in runs the same Python as the test.
    sim.admin.publish_standin_variant("status-lag", python=sys.executable, latest=True)
    worker = start_worker(sim, tmp_path, outpost.name)
    try:
        sid = sim.admin.enqueue(outpost.outpost_id).session_id
        conn = sim.admin.wait_connection(sid, timeout=60)
        ending_from = time.time()
        ended = sim.admin.end_session(sid, "terminated")
        assert ended.status.session_status == "running"  # the status lags: the remote is told first

        def released() -> list[dict[str, Any]]:
            return [r for r in sim.admin.claims(session_id=sid) if r["action"] == "release"]

        try:
            [release] = wait_for(released, timeout=60, interval=0.1, what="the release")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{worker.log()[-4000:]}") from None
        wait_for(lambda: not alive(conn["pid"]), timeout=20, what="the stand-in to exit")
    finally:
        worker.stop()
    log = worker.log()
    # Served exactly once, and released by its holder (renewals aside).
    holder = conn["acceptor_id"]
    actions = [(r["action"], r["acceptor_id"]) for r in sim.admin.claims(session_id=sid)]
    assert [a for a in actions if a[0] != "renew"] == [("claim", holder), ("release", holder)]
    # The remote was not restarted: one gateway connection, and the worker never called the exit a crash.
    assert len(sim.admin.connections(sid)) == 1, log
    assert "restarting" not in log, log
    # The worker released only once it had read the final status, which was written LAG after the end.
    assert float(release["at"]) >= ending_from + LAG, log
    final = sim.admin.session(sid)
    assert final["entry"]["status"]["session_status"] == "terminated"
    assert final["entry"]["status"]["phase"] == "pending"
    assert final["ending"] is None
