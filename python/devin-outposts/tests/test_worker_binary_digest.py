"""A cached ``devin-remote`` that a session altered is never run (issue 37, "the worker's binary cache").

An unconfined session runs as the worker's user and can rewrite the binary cache, so the worker hashes a
cached binary before every start and compares it with the published digest. An altered file is removed
with one warning that names it and downloaded again (verified); if that fails, the session fails with one
line that says why. A real worker serves sessions of :class:`fault_fleet.FaultFleet`; the test alters the
cache between starts, as such a session would, and asserts on which fake remote ran, on the file's digest
and on the log.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from fault_fleet import FaultFleet
from test_worker_malformed import TOKEN, wait_serving, worker_args, worker_env

from devin_outposts.worker.binary import BinaryStore

from worker_fakes import SUFFIX, DistServer, FakeRemote, WorkerProcess, sha256_hex

BINARY = f"devin-remote_abc1234_{SUFFIX}"


class Served:
    """A real worker on a fault fleet and a distribution serving the good remote; ``evil`` is what a session
    writes over the cached binary."""

    def __init__(self, tmp_path: Path, remote: FakeRemote, fleet: FaultFleet, dist: DistServer) -> None:
        self.remote = remote
        self.fleet = fleet
        self.dist = dist
        self.evil = FakeRemote(tmp_path / "evil", tag="evil")
        self.cached = tmp_path / "data" / "cache" / BINARY
        args = worker_args(tmp_path, dist.url, "--no-watch")  # the fault fleet sends no watch events
        self.worker = WorkerProcess(args, worker_env(fleet.url), tmp_path / "worker.log").start()

    def serve(self, sid: str) -> None:
        """Queue ``sid``, wait for a remote (either) to run it, end it and wait for its release."""
        self.fleet.enqueue(sid)

        def released() -> Any:
            return self.fleet.calls("POST", f"/{sid}/release")

        def ran() -> Any:
            return self.remote.runs(sid) or self.evil.runs(sid) or released()

        wait_serving(self.worker, ran, f"{sid} served")
        self.fleet.set_status(sid, "terminated")
        wait_serving(self.worker, lambda: self.fleet.calls("POST", f"/{sid}/release"), f"{sid} released")

    def alter(self) -> None:
        """What an unconfined session can do: write over the cached binary (still executable)."""
        self.cached.write_bytes(self.evil.script)
        os.chmod(self.cached, 0o755)  # noqa: S103 - an executable, as the cache holds it

    def warnings_naming_the_file(self) -> list[str]:
        lines = self.worker.log().splitlines()
        return [line for line in lines if "WARNING" in line and f"{self.cached} was altered" in line]

    def stop(self) -> str:
        self.worker.signal(signal.SIGTERM)
        assert self.worker.wait(30) == 0
        return self.worker.log()


def test_a_binary_altered_between_two_sessions_is_fetched_again(tmp_path: Path, remote: FakeRemote) -> None:
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        served = Served(tmp_path, remote, fleet, dist)
        try:
            served.serve("devin-first")
            served.alter()
            served.serve("devin-second")
            log = served.stop()
        finally:
            served.worker.stop()
        assert dist.count(BINARY) == 2  # the first download, and the one after the alteration
    assert served.evil.runs() == []
    assert [run["tag"] for run in remote.runs("devin-second")] == ["good"]
    assert sha256_hex(served.cached.read_bytes()) == sha256_hex(remote.script)
    assert len(served.warnings_naming_the_file()) == 1, log
    assert "Traceback" not in log, log


def test_a_binary_altered_and_not_fetched_again_fails_the_session(tmp_path: Path, remote: FakeRemote) -> None:
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        served = Served(tmp_path, remote, fleet, dist)
        try:
            served.serve("devin-first")
            served.alter()
            dist.fail_statuses = [503]  # the next download (the digest is known from the first)
            served.serve("devin-second")
            log = served.stop()
        finally:
            served.worker.stop()
    assert served.evil.runs() == []
    assert remote.runs("devin-second") == []
    assert not served.cached.exists()  # removed, not left for a later start
    assert len(served.warnings_naming_the_file()) == 1, log
    failed = f"session devin-second failed: Refusing the cached devin-remote {served.cached}: it was altered "
    failed += "("
    lines = [line for line in log.splitlines() if failed in line]
    assert len(lines) == 1, log
    assert (
        lines[0]
        .split(failed, 1)[1]
        .split(" session_id=")[0]
        .endswith(f"), and downloading it again failed: Could not download {dist.url}{BINARY}: HTTP 503")
    )


def test_a_binary_altered_while_its_session_runs_is_not_restarted(tmp_path: Path, remote: FakeRemote) -> None:
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        served = Served(tmp_path, remote, fleet, dist)
        try:
            fleet.enqueue("devin-restarted")
            worker = served.worker
            first = wait_serving_run(served, "devin-restarted")
            served.alter()
            os.kill(first["pid"], signal.SIGKILL)  # the remote dies: the worker starts it again
            wait_serving(
                worker,
                lambda: len(remote.runs("devin-restarted")) > 1 or served.evil.runs(),
                "the restart",
            )
            log = served.stop()
        finally:
            served.worker.stop()
    assert served.evil.runs() == []
    assert [run["tag"] for run in remote.runs("devin-restarted")] == ["good", "good"]
    assert sha256_hex(served.cached.read_bytes()) == sha256_hex(remote.script)
    assert len(served.warnings_naming_the_file()) == 1, log


def wait_serving_run(served: Served, sid: str) -> dict[str, object]:
    wait_serving(served.worker, lambda: served.remote.runs(sid), f"{sid} served")
    return served.remote.runs(sid)[0]


def test_a_symlink_in_place_of_the_cached_binary_counts_as_altered(tmp_path: Path) -> None:
    """A session could point the cache at a file it keeps rewriting: a good copy when hashed, something else
    when run. The cache entry must be a regular file of the worker's own."""
    good = b"#!/bin/sh\necho good\n"

    async def scenario(dist: DistServer) -> Path:
        store = BinaryStore(tmp_path / "cache", dist.url)
        try:
            path = await store.ensure("abc1234")
            decoy = tmp_path / "decoy"
            decoy.write_bytes(good)  # the right digest, for now
            path.unlink()
            path.symlink_to(decoy)
            again = await store.ensure("abc1234")
            assert store.verification_failures == 1
            return again
        finally:
            await store.aclose()

    with DistServer("abc1234", good) as dist:
        path = asyncio.run(scenario(dist))
        assert dist.count(BINARY) == 2
    assert not path.is_symlink()
    assert path.read_bytes() == good
