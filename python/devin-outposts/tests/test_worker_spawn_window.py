"""The window between a remote's start and its pid record (issue 24, point 10).

The worker recorded ``remote.pid`` just after ``devin-remote`` had started: fork to record took 4.4 ms at
p50 and 9.8 ms at most, and a worker killed in between (19 of 20 trials) left a remote that its successor
could not find, so two remotes of one session ran at once. Now the remote cannot run before its record
exists: the worker starts a launcher that waits for the worker's go-ahead, records the launcher's pid
(which ``exec`` keeps for the remote), then lets it become ``devin-remote``; a launcher whose worker died
first exits without starting anything.

``DEVIN_OUTPOSTS_TEST_RECORD_DELAY`` (a test hook: seconds to wait between the fork and the record) makes
the window wide enough to hit every time, without changing what happens in it. The test watches for the
worker's child process, SIGKILLs the worker as soon as it exists, starts a successor on the same data
directory, and checks on ``/proc`` and the fake remote's records that exactly one remote of the session
runs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_worker_sim import Harness, running_harness, wait

from devin_outposts.core import platform
from devin_outposts.worker.spawn import GO_AHEAD

from worker_fakes import alive

DELAY = "DEVIN_OUTPOSTS_TEST_RECORD_DELAY"


def children_of(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (from ``/proc/<n>/stat``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def remote_children(pid: int) -> list[int]:
    """The children of ``pid`` that are starting or running ``devin-remote`` (its path is in their argv)."""
    found = []
    for child in children_of(pid):
        with contextlib.suppress(OSError):
            if b"devin-remote_" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with running_harness(tmp_path) as h:
        yield h


def test_a_worker_killed_between_fork_and_record_leaves_no_remote_behind(harness: Harness) -> None:
    h = harness
    first = h.worker("w1", env=h.env(**{DELAY: "5"}))
    sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    forked = wait(h, lambda: remote_children(first.pid), "the worker to fork the remote's process")[0]
    first.kill9()  # inside the window: the remote's process exists, its record does not yet

    second = h.worker("w1")  # the successor, on the same data directory (same acceptor id), no delay
    ours = wait(
        h,
        lambda: [run for run in h.remote.runs(sid) if run["pid"] != forked and alive(run["pid"])],
        "the successor to serve the session",
    )[0]
    # Exactly one remote of the session runs: the successor's. The process the killed worker forked either
    # never became a remote or was found and stopped.
    wait(h, lambda: not alive(forked), f"pid {forked}, forked by the killed worker, to be gone")
    running = [run["pid"] for run in h.remote.runs(sid) if alive(run["pid"])]
    assert running == [ours["pid"]], f"remotes of {sid} running at once: {running}\n{h.logs()}"
    h.sim.admin.set_status(sid, "terminated")
    wait(h, lambda: h.released(sid), "the release")
    second.stop()
    assert not alive(ours["pid"])


# --- the launcher itself ---------------------------------------------------------------------------------


def _launch(argv: list[str], env: dict[str, str], go: bool) -> subprocess.CompletedProcess[bytes]:
    gated = platform.Posix("linux", "x86_64").gated_argv(argv)
    assert gated is not None
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(gated, stdin=read_end, stdout=subprocess.PIPE, env=env)
    os.close(read_end)
    if go:
        os.write(write_end, GO_AHEAD)
    os.close(write_end)  # as the worker's death would
    out = proc.communicate(timeout=20)[0]
    return subprocess.CompletedProcess(gated, proc.returncode, out)


def test_the_launcher_without_its_go_ahead_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = _launch(["/usr/bin/touch", str(marker)], {"PATH": "/usr/bin:/bin"}, go=False)
    assert result.returncode == 125
    assert not marker.exists()


def test_the_launcher_passes_the_environment_unchanged() -> None:
    env = {"PATH": "/usr/bin:/bin", "DEVIN_OUTPOST_SESSION_ID": "devin-1", "LANG": "C.UTF-8"}
    result = _launch(["/usr/bin/env"], env, go=True)
    assert result.returncode == 0
    assert dict(line.split("=", 1) for line in result.stdout.decode().splitlines()) == env


def test_the_remote_keeps_the_launchers_pid_and_gets_no_stdin(tmp_path: Path) -> None:
    script = "import os, sys; print(os.getpid(), os.getpgid(0), repr(sys.stdin.read()))"
    gated = platform.Posix("linux", "x86_64").gated_argv([sys.executable, "-c", script])
    assert gated is not None
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(gated, stdin=read_end, stdout=subprocess.PIPE, start_new_session=True)
    os.close(read_end)
    os.write(write_end, GO_AHEAD + b"more input the remote must not see\n")
    os.close(write_end)
    out = proc.communicate(timeout=20)[0].decode().split()
    assert out == [str(proc.pid), str(proc.pid), "''"]
