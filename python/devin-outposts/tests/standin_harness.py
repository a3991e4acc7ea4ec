"""The simulator's real stand-in ``devin-remote`` behind real ``devin-outposts worker start`` processes: the
harness of the tests that drive sessions as the brain (test_worker_standin.py, test_worker_network_policy.py).

A worker downloads the stand-in from the simulator's distribution (``--static-base-url``), verifies it and
runs it for every claimed session; the stand-in connects to the simulator's gateway with the connect token
and executes the tool calls a test scripts. The harness stops every worker a test started and fails the
test if a stand-in outlived its worker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from devin_outposts.api.models import Outpost
from devin_outposts_sim.testing import SimHandle, run_sim

from worker_fakes import WorkerProcess, kill_pids_working_under, pids_working_under, wait_for

CANARY = "canary-secret-that-must-not-reach-a-session"
CHROME = "/usr/bin/google-chrome"
#: What the contract lets through from the worker's environment; the test sets each one.
PASSTHROUGH = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "TZ")
REQUIRED = (
    "DEVIN_OUTPOST_GATEWAY_URL",
    "DEVIN_OUTPOST_CONNECT_TOKEN",
    "DEVIN_OUTPOST_SESSION_ID",
    "DEVIN_REMOTE_STATE_DIR",
)
#: The worker's environment may not set these: they would pass through (desktop stream) and make the
#: expected set depend on the machine the test runs on.
DESKTOP = ("DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY")


#: An interpreter every session can run (the system's; this venv's may live under /root).
SESSION_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
#: The ids a root worker's confined sessions run as in these tests (core/netpolicy/session_ids.py).
SESSION_UID_RANGE = "300000-300199"


@dataclass
class Harness:
    sim: SimHandle
    tmp: Path
    token: str
    outpost: Outpost
    standin_sha: str
    workers: list[WorkerProcess] = field(default_factory=list)
    #: The workers' PATH (default: this process's).
    path: Optional[str] = None

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DEVIN_", "PYTEST_")) and k not in DESKTOP
        }
        tmpdir = self.tmp / "tmpdir"
        tmpdir.mkdir(exist_ok=True)
        env.update(
            DEVIN_OUTPOSTS_TOKEN=self.token,
            DEVIN_API_URL=self.sim.url,
            DEVIN_CHROME_PATH=CHROME,
            WORKER_TEST_CANARY=CANARY,
            PATH=self.path or os.environ.get("PATH", "/usr/bin:/bin"),
            HOME=os.environ.get("HOME", str(self.tmp)),
            USER=os.environ.get("USER", "tester"),
            LOGNAME=os.environ.get("LOGNAME", "tester"),
            TMPDIR=str(tmpdir),
            LANG="C.UTF-8",
            TZ="UTC",
        )
        if os.geteuid() == 0:  # a root worker's confined sessions run as ids of their own
            env["DEVIN_WORKER_SESSION_UID_RANGE"] = SESSION_UID_RANGE
        return env

    def worker(
        self,
        name: str,
        *args: str,
        prefix: tuple[str, ...] = (),
        python: str = sys.executable,
        env: Optional[dict[str, str]] = None,
    ) -> WorkerProcess:
        base = [
            "--outpost", self.outpost.name, "--static-base-url", self.sim.static_base_url,
            "--cache-dir", str(self.tmp / name / "data" / "cache"),
            "--workdir", str(self.tmp / name / "work"),
            "--poll-interval-secs", "0.5", "--confirm-interval-secs", "0.1", "--stop-grace-secs", "5",
            "--backoff-max-secs", "2", "--drain-timeout", "1",
        ]  # fmt: skip
        process = WorkerProcess(
            [*base, *args],
            {**self.env(), **(env or {})},
            self.tmp / f"{name}.log",
            prefix=prefix,
            python=python,
        )
        self.workers.append(process)
        return process.start()

    def claims(self, session_id: str, action: Optional[str] = None) -> list[dict[str, Any]]:
        records = self.sim.admin.claims(session_id=session_id)
        return [r for r in records if action is None or r["action"] == action]

    def released(self, session_id: str) -> bool:
        return bool(self.claims(session_id, "release"))

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path.name}\n{w.log()[-4000:]}" for w in self.workers)

    def wait(self, predicate: Any, what: str, timeout: float = 60.0) -> Any:
        try:
            return wait_for(predicate, timeout=timeout, interval=0.1, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()}") from None

    def connection(self, session_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """The first gateway connection of the session (the stand-in's report about itself)."""
        found = self.wait(lambda: self.sim.admin.connections(session_id), f"{session_id} to connect", timeout)
        return dict(found[0])

    def calls_done(self, session_id: str, timeout: float = 90.0) -> list[dict[str, Any]]:
        try:
            return self.sim.admin.wait_calls(session_id, timeout=timeout)
        except Exception as exc:  # SimAdminError after the timeout: add the workers' logs to the failure
            raise AssertionError(f"{exc}\n{self.logs()}") from None


@contextlib.contextmanager
def running_harness(tmp_path: Path) -> Iterator[Harness]:
    """A simulator with an outpost and a published stand-in; on the way out every worker is stopped, and it
    fails if a stand-in outlived its worker. (Each test module's ``harness`` fixture is this.)"""
    # A claim TTL well above the renewal period: on a loaded machine a late renewal must not hand a live
    # session to another worker, which would make "served exactly once" a matter of luck.
    with run_sim(claim_ttl=15, watch_max_duration=5, keepalive_interval=0.5, sweep_interval=0.05) as sim:
        outpost = sim.admin.create_outpost("rhel", "linux")
        # Its shebang names the system's interpreter: a launcher (a pyenv shim behind /usr/bin/env) would add
        # variables of its own to the environment the stand-in reports, and a confined session of a root
        # worker runs as a uid of its own, which cannot reach an interpreter under /root.
        sha = sim.admin.publish_standin_variant("worker-e2e", python=SESSION_PYTHON, latest=True)
        h = Harness(sim, tmp_path, sim.create_token("machine"), outpost, sha)
        try:
            yield h
        finally:
            for worker in h.workers:
                worker.stop()
            # A stopped worker has stopped its stand-ins; give their exit a moment, then kill leftovers.
            leftovers: list[int] = []
            try:
                wait_for(lambda: not pids_working_under(tmp_path), timeout=20, what="stand-ins to exit")
            except AssertionError:
                leftovers = kill_pids_working_under(tmp_path)
    assert not leftovers, f"processes outlived their workers: {leftovers}"
