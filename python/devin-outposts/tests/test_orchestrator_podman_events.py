"""The podman driver's status watch and fast failure, for real (``orchestrate --driver podman``).

The orchestrator runs podman through a wrapper (the driver option ``podman``) that appends each argv to a
file before it runs the real podman: the tests count what the orchestrator asked of podman from that file,
and find its ``podman events`` child among the processes of the machine. Everything else is observed state
as in test_orchestrator_podman_loop.py: the simulator's claim history and connections, ``podman ps`` and
``podman volume ls`` by the test's acceptor label, the orchestrator's log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from pathlib import Path

import pytest
from test_orchestrator_podman import PODMAN, needs_podman, podman, session_image
from test_orchestrator_podman_loop import Loop, loop

from devin_outposts.orchestrator.drivers.base import machine_name
from devin_outposts_sim.remote import tools

from worker_fakes import WorkerProcess

__all__ = ["loop", "session_image"]  # the fixtures, shared with the loop's tests


class Calls:
    """What the orchestrator asked of podman, one argv per line (the wrapper's log)."""

    def __init__(self, tmp: Path) -> None:
        self.log = tmp / "podman-calls.log"
        self.wrapper = tmp / "podman-wrapper.sh"
        self.wrapper.write_text(f'#!/bin/sh\necho "$*" >> {self.log}\nexec {PODMAN} "$@"\n')
        self.wrapper.chmod(self.wrapper.stat().st_mode | stat.S_IXUSR)
        self.log.touch()

    def lines(self, start: int = 0) -> list[str]:
        return self.log.read_text().splitlines()[start:]

    def mark(self) -> int:
        return len(self.lines())


@pytest.fixture
def calls(tmp_path: Path) -> Calls:
    return Calls(tmp_path)


def watching(
    h: Loop, calls: Calls, *args: str, name: str = "orch", reconcile: float = 300.0, max_concurrent: int = 5
) -> WorkerProcess:
    """An orchestrator on the status watch. ``reconcile``: seconds between its listings (long by default,
    so that what a test sees within a minute came by the event stream); the sweep, which lists on its
    own, every 600 s (after its first pass)."""
    return h.orchestrator(
        "--machine-status", "watch", "--gc-interval", "600",
        "--driver-opt", f"podman={calls.wrapper}",
        "--driver-opt", f"reconcile_interval={reconcile:g}",
        *args, name=name, max_concurrent=max_concurrent,
    )  # fmt: skip


def events_children(parent: int) -> list[int]:
    """The ``podman events`` processes whose parent is ``parent`` (the wrapper execs podman in place)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == parent and b"events" in argv[1:3]:
            found.append(int(entry.name))
    return found


def kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def calls_over_three(h: Loop, calls: Calls, start: int) -> list[str]:
    """The podman calls from line ``start`` until there are three."""
    h.wait(lambda: len(calls.lines(start)) >= 3, "three podman calls", timeout=60)
    return calls.lines(start)


def quiet_window(h: Loop, calls: Calls) -> list[str]:
    """Three podman calls in a row with no ``podman events`` started among them (up to three tries)."""
    window = calls_over_three(h, calls, calls.mark())
    for dummy in range(2):
        if not any(line.startswith("events ") for line in window):
            break
        window = calls_over_three(h, calls, calls.mark())
    return window


def nothing_left(h: Loop) -> None:
    """Every container and volume of the test's acceptor gone. A session released for an infrastructure
    error is claimed again after the 60 s cooldown, even once terminated (then its new machine is torn
    down at once): the bound covers that round."""
    h.wait(lambda: not h.containers() and not h.volumes(), "every container and volume removed", timeout=150)


def container_of(h: Loop, session_id: str) -> str:
    name = machine_name("outpost-worker", session_id)
    assert name in h.containers()
    return name


@needs_podman
def test_steady_state_asks_podman_nothing_per_container_and_an_outside_removal_ends_the_session(
    loop: Loop, calls: Calls
) -> None:
    h = loop
    watching(h, calls, reconcile=2.0)
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(4)]
    h.wait(lambda: all(h.sim.admin.connections(s) for s in sessions), "every session to be served")
    # Steady state: the listings every 2 s are the only podman calls, one `ps` each, whatever the number
    # of containers (polling would be an `inspect` per container per --status-interval-secs, 0.2 s here).
    # podman 4.3's `podman events` exits when its events file rotates (1 MiB; other tests' containers fill
    # it too): a window in which the child was restarted (sessions read directly meanwhile) is taken again.
    window = quiet_window(h, calls)
    assert all(line.startswith("ps --all --filter") for line in window), window

    # Removed from outside: the stream's `died` (with podman's exit code, 137 for its SIGKILL) ends the
    # worker and the restart finds no container, or its `remove` comes first ("container removed" is
    # the stream's word; a direct read says "container gone"). Either way the claim goes back.
    gone, *rest = sessions
    podman("rm", "--force", "--time", "0", container_of(h, gone))
    h.wait(lambda: h.released(gone), "the removed container's session to be released", timeout=60)
    # The reason is logged with the session's end, which may come just after the release is seen.
    h.wait(
        lambda: any(
            why in h.processes[0].log() for why in ("worker exited with 137", "vanished (container removed)")
        ),
        "the reason in the log",
    )
    assert all(not h.released(s) for s in rest)
    for sid in sessions:
        h.sim.admin.end_session(sid, "terminated")
    h.wait(lambda: all(h.released(s) for s in sessions), "every claim released")
    nothing_left(h)


@needs_podman
def test_a_killed_event_stream_is_restarted_and_relisted_and_misses_no_end(loop: Loop, calls: Calls) -> None:
    h = loop
    orch = watching(h, calls)
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(2)]
    h.wait(lambda: all(h.sim.admin.connections(s) for s in sessions), "both sessions to be served")
    [child] = h.wait(lambda: events_children(orch.pid), "the podman events child")
    start = calls.mark()
    kill([child])
    # Gone while the stream is down: the board is out of sync (sessions read their machines meanwhile),
    # then the new child's listing says so too. Either way the session ends.
    podman("rm", "--force", "--time", "0", container_of(h, sessions[0]))
    h.wait(lambda: events_children(orch.pid) not in ([], [child]), "a new podman events child")
    h.wait(lambda: h.released(sessions[0]), "the removed container's session to be released", timeout=60)
    restarted = [i for i, line in enumerate(calls.lines(start)) if line.startswith("events ")]
    assert len(restarted) == 1
    assert "--since" in calls.lines(start)[restarted[0]]
    # The listing after the restart (listings are 300 s apart: no other since the kill). Not "after the
    # events line": the two wrappers log concurrently, in either order.
    h.wait(
        lambda: any(line.startswith("ps --all") for line in calls.lines(start)), "a listing after the restart"
    )
    # The new stream follows the other machine: its removal ends its session (listings are 300 s apart).
    podman("rm", "--force", "--time", "0", container_of(h, sessions[1]))
    h.wait(
        lambda: h.released(sessions[1]), "the second removed container's session to be released", timeout=60
    )
    for sid in sessions:
        h.sim.admin.end_session(sid, "terminated")
    nothing_left(h)


@needs_podman
def test_a_worker_command_missing_from_the_image_releases_the_session_at_once_with_the_reason(
    loop: Loop, calls: Calls
) -> None:
    h = loop
    orch = watching(h, calls, "--driver-opt", "worker_command=/no/such/worker", max_concurrent=1)
    sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
    # Bounded only to show it is not the 300 s boot timeout: the container exits 127 at once.
    h.wait(lambda: h.released(sid), "the claim to be released", timeout=90)
    assert "exec-failed (exit 127: the worker command is not in the image)" in orch.log()
    assert h.sim.admin.connections(sid) == []  # no worker ever ran
    h.sim.admin.end_session(sid, "terminated")  # or the orchestrator claims it again and again
    nothing_left(h)


@needs_podman
def test_an_image_gone_after_start_up_releases_the_session_at_once_with_the_pull_error(
    loop: Loop, calls: Calls
) -> None:
    h = loop
    # check() refuses an image podman does not have: this one is there at start-up (a second name of the
    # session image), then removed. Pulling it again asks a registry on this machine's port 443, where
    # nothing listens: podman's three quick retries, then its error.
    vanishing = f"localhost/outposts-vanishing-{os.urandom(4).hex()}:1"
    podman("tag", h.image, vanishing)
    try:
        orch = watching(h, calls, "--driver-opt", f"image={vanishing}", max_concurrent=1)
        h.wait(lambda: events_children(orch.pid), "the orchestrator to be up (its events child)")
        podman("rmi", vanishing)  # only this name: the session image keeps its own
        sid = h.sim.admin.enqueue(h.outpost.outpost_id).session_id
        h.wait(lambda: h.released(sid), "the claim to be released", timeout=90)
        assert f"Could not create container {machine_name('outpost-worker', sid)}: " in orch.log()
        assert "(pull-error)" in orch.log()
        assert h.sim.admin.connections(sid) == []
        h.sim.admin.end_session(sid, "terminated")
        nothing_left(h)
    finally:
        podman("rmi", vanishing, check=False)


@needs_podman
def test_a_restarted_orchestrator_adopts_its_containers_and_follows_them_by_the_stream(
    loop: Loop, calls: Calls
) -> None:
    h = loop
    first = watching(h, calls, name="first")
    sessions = [h.sim.admin.enqueue(h.outpost.outpost_id).session_id for dummy in range(2)]
    h.wait(lambda: all(h.sim.admin.connections(s) for s in sessions), "both sessions to be served")
    orphans = events_children(first.pid)
    first.kill9()
    kill(orphans)  # a killed orchestrator's events child ends on its next write; this test does not wait
    second = watching(h, calls, name="second")
    h.wait(lambda: second.log().count("adopting machine") == 2, "both machines to be adopted")
    h.wait(lambda: events_children(second.pid), "the new orchestrator's events child")
    podman("rm", "--force", "--time", "0", container_of(h, sessions[0]))
    h.wait(lambda: h.released(sessions[0]), "the removed container's session to be released", timeout=60)
    h.sim.admin.add_calls(sessions[1], [tools.run("echo still-here")])
    [call] = h.sim.admin.wait_calls(sessions[1], timeout=60)
    assert call["result"]["output"] == "still-here\n"
    for sid in sessions:
        h.sim.admin.end_session(sid, "terminated")
    nothing_left(h)
    assert len(h.sim.admin.connections(sessions[1])) == 1  # adopted and kept serving, never restarted
