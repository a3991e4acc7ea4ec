"""A ``devin-remote`` download is refused by its ``Content-Length``, and a signal stops it (issue 37, S7).

A 3 GB download was written to disk up to the 1 GiB cap before it was refused (``Content-Length`` was
ignored), and it delayed shutdown by about 29 s: the drain waited for sessions being prepared as for running
ones, and stopping a session did not stop its download. A real worker serves one session of
:class:`fault_fleet.FaultFleet` from a :class:`worker_fakes.DistServer` whose binary download stalls after
its first bytes; the assertions are on the cache directory, the worker's exit and log, and what the fleet saw.
"""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path

from fault_fleet import FaultFleet
from test_worker_malformed import TOKEN, wait_serving, worker_args, worker_env

from worker_fakes import SUFFIX, DistServer, FakeRemote, WorkerProcess

SID = "devin-download"
BINARY = f"devin-remote_abc1234_{SUFFIX}"


def cache_dir(tmp_path: Path) -> Path:
    """The worker's cache directory (``worker_args``), made before the worker starts, as a host has it."""
    cache = tmp_path / "data" / "cache"
    cache.mkdir(parents=True, mode=0o700)
    return cache


def parts(cache: Path) -> list[int]:
    """The sizes of the download's temporary files in ``cache``."""
    sizes = []
    for path in cache.glob(".*.part"):
        with contextlib.suppress(OSError):  # removed meanwhile
            sizes.append(path.stat().st_size)
    return sizes


def test_a_download_announced_over_the_cap_is_refused_before_a_byte_is_written(
    tmp_path: Path, remote: FakeRemote
) -> None:
    cache = cache_dir(tmp_path)
    before = cache.stat().st_mtime_ns
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        dist.stalls[BINARY] = (3_000_000_000, bytes(4 << 20))  # 3 GB announced, 4 MiB sent, then a stall
        fleet.enqueue(SID)
        args = worker_args(tmp_path, dist.url, "--once")
        worker = WorkerProcess(args, worker_env(fleet.url), tmp_path / "worker.log").start()
        try:
            assert worker.wait(30) == 7  # the one session failed: its binary was refused
        finally:
            worker.stop()
        assert fleet.calls("POST", f"/{SID}/release")  # released for a worker that can fetch it
    log = worker.log()
    refusal = f"its Content-Length is 3000000000 bytes, more than the {1 << 30}-byte cap on devin-remote"
    assert len([line for line in log.splitlines() if refusal in line]) == 1, log
    assert "Traceback" not in log, log
    assert list(cache.iterdir()) == []
    # No file was ever made in the cache directory: making and removing one changes its mtime.
    assert cache.stat().st_mtime_ns == before
    assert remote.runs() == []


def test_sigterm_stops_a_download_in_progress_at_once(tmp_path: Path, remote: FakeRemote) -> None:
    cache = cache_dir(tmp_path)
    with FaultFleet(TOKEN) as fleet, DistServer("abc1234", remote.script) as dist:
        dist.stalls[BINARY] = (64 << 20, bytes(1 << 20))  # 64 MiB announced, 1 MiB sent, then a stall
        fleet.enqueue(SID)
        args = worker_args(tmp_path, dist.url, "--drain-timeout", "30")
        worker = WorkerProcess(args, worker_env(fleet.url), tmp_path / "worker.log").start()
        try:
            wait_serving(worker, lambda: any(parts(cache)), "the download to be under way")
            signalled = time.monotonic()
            worker.signal(signal.SIGTERM)
            code = worker.wait(20)
            took = time.monotonic() - signalled
        finally:
            worker.stop()
        assert fleet.calls("POST", f"/{SID}/release")
    log = worker.log()
    assert code == 0, log
    # The drain gives running sessions 30 s; one still being prepared is stopped at once.
    assert took < 5, f"the worker took {took:.1f}s to end after SIGTERM:\n{log[-3000:]}"
    assert f"session {SID}: stopped while being prepared" in log
    assert parts(cache) == []  # the temporary file went with the download
    assert not (cache / BINARY).exists()
    assert remote.runs() == []
    assert "Traceback" not in log, log
