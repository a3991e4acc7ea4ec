# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The worker's Windows service host, installed as the role installs it, run as a real service under Wine.

The cases run in file order on one prefix (conftest.py), each leaving its services stopped. They read what the
service manager reports (scm_probe.py), the simulator's claim history and remote connections, and the files the
worker wrote. Bounds on waits only catch a hang (a slow Wine start is tens of seconds, not minutes).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from prerequisites import ROOT  # type: ignore[import-not-found]
from wine import STANDIN_EXE  # type: ignore[import-not-found]

from devin_outposts_sim.admin_client import SimAdminError
from devin_outposts_sim.remote import tools

from conftest import DRAIN_TIMEOUT, Fleet, Instance, wait_for  # type: ignore[import-not-found]

pytestmark = pytest.mark.timeout(600)
ERROR_SERVICE_SPECIFIC_ERROR = 1066
ERROR_SERVICE_CANNOT_ACCEPT_CTRL = 1061
EXIT_LOCKED = 8


def states(rows: list[dict[str, Any]]) -> list[str]:
    return [row["state"] for row in rows if "state" in row]


def actions(fleet: Fleet, session_id: str) -> list[str]:
    return [row["action"] for row in fleet.sim.admin.claims(session_id=session_id)]


def serve_one(fleet: Fleet) -> tuple[str, dict[str, Any]]:
    """Enqueue a session and wait for a remote to connect: its id and what the remote reported."""
    entry = fleet.sim.admin.enqueue(fleet.outpost.outpost_id)
    fleet.sessions.append(entry.session_id)
    connection = fleet.sim.admin.wait_connection(entry.session_id, timeout=180)
    return entry.session_id, connection


@pytest.fixture(autouse=True)
def no_session_left(fleet: Fleet) -> Iterator[None]:
    """Each case ends its sessions, so that no later case's worker takes one back (one slot per instance)."""
    yield
    while fleet.sessions:
        session_id = fleet.sessions.pop()
        with contextlib.suppress(SimAdminError):  # ended already
            fleet.sim.admin.end_session(session_id)


def test_start_and_stop_while_idle(installed: dict[str, Instance]) -> None:
    main = installed["main"]
    started = main.start()
    assert states(started)[-1] == "RUNNING", started
    wait_for(lambda: "serving outpost" in main.log(), timeout=120, what="the worker to serve")
    stopped = main.stop()
    assert states(stopped)[0] == "STOP_PENDING", stopped
    assert stopped[-1]["state"] == "STOPPED" and stopped[-1]["exit_code"] == 0, stopped
    assert "service control STOP" in main.log()


def test_a_session_is_served_end_to_end_with_a_windows_remote(
    installed: dict[str, Instance], fleet: Fleet
) -> None:
    main = installed["main"]
    with main.running():
        session_id, connection = serve_one(fleet)
        # The worker downloaded the .exe published for windows_x64.exe, checked it and spawned it: the stand-in
        # script that connected is the child of that .exe, whose pid the worker logged.
        cached = main.wine.path(main.row["cache_dir"]) / f"devin-remote_{fleet.standin_sha}_windows_x64.exe"
        assert cached.read_bytes() == STANDIN_EXE.read_bytes()
        assert (
            f"downloaded devin-remote {fleet.standin_sha}" in main.log() and "sha256 verified" in main.log()
        )
        spawned = re.findall(r"devin-remote started \(pid (\d+)\)", main.log())
        assert spawned and connection["ppid"] == int(spawned[-1]), (spawned, connection)
        fleet.sim.admin.add_calls(session_id, [tools.run("echo served-on-windows & ver")])
        (call,) = fleet.sim.admin.wait_calls(session_id, timeout=120)
        assert call["state"] == "done", call
        assert "served-on-windows" in json.dumps(call["result"]), call
        assert actions(fleet, session_id)[0] == "claim"


def test_the_end_of_a_session_releases_its_claim(installed: dict[str, Instance], fleet: Fleet) -> None:
    main = installed["main"]
    with main.running():
        session_id, dummy = serve_one(fleet)
        fleet.sim.admin.end_session(session_id)
        wait_for(lambda: "release" in actions(fleet, session_id), timeout=30, what="the claim's release")
    assert "crashed" not in main.log()


def test_no_token_in_the_sessions_environment_the_logs_or_the_service_configuration(
    installed: dict[str, Instance], fleet: Fleet
) -> None:
    main = installed["main"]
    with main.running():
        session_id, connection = serve_one(fleet)
        assert fleet.token not in json.dumps(connection)
        # The Windows environment of the session's commands, as cmd's `set` prints it. (The stand-in's own report
        # reads /proc/self/environ, which under Wine is the Unix side's environment of the process, not Windows'.)
        fleet.sim.admin.add_calls(session_id, [tools.run("set")])
        (call,) = fleet.sim.admin.wait_calls(session_id, timeout=120)
        assert call["state"] == "done", call
        assert fleet.token not in json.dumps(call["result"])
        output = call["result"]["output"]
        env = dict(line.split("=", 1) for line in output.splitlines() if "=" in line)
        names = [name.upper() for name in env]
        assert not [name for name in names if name.startswith("DEVIN_OUTPOSTS") or "PROXY" in name], names
        assert env.get("DEVIN_OUTPOST_SESSION_ID") == session_id, names
        assert "DEVIN_OUTPOST_CONNECT_TOKEN" not in names
    assert fleet.token not in main.log()
    (config,) = main.probe("config")
    assert config["binary_path"] == main.row["image_path"], config
    dummy, registry = main.wine.run(
        "reg", "query", r"HKLM\System\CurrentControlSet\Services" + "\\" + main.service
    )
    assert "ImagePath" in registry, registry
    for text in (json.dumps(config), registry, main.wine.path(main.row["host_script"]).read_text()):
        assert fleet.token not in text
    assert fleet.token in main.env_file.read_text()  # the only place it is


def test_stop_with_a_live_session_drains_stops_the_remote_and_releases_the_claim(
    installed: dict[str, Instance], fleet: Fleet
) -> None:
    main = installed["main"]
    with main.running():
        session_id, dummy = serve_one(fleet)
        stopped = main.stop()
    pending = [row for row in stopped if row.get("state") == "STOP_PENDING"]
    # The drain lasts DRAIN_TIMEOUT s and the host reports a new checkpoint every 2 s.
    assert len(pending) >= 2 and pending[-1]["checkpoint"] > pending[0]["checkpoint"], stopped
    assert stopped[-1]["state"] == "STOPPED" and stopped[-1]["exit_code"] == 0, stopped
    log = main.log()
    assert "crashed" not in log, log
    assert "release" in actions(fleet, session_id), actions(fleet, session_id)
    assert f"{DRAIN_TIMEOUT}" in log


def test_control_128_stops_at_once_without_the_drain_and_releases_the_claim(
    installed: dict[str, Instance], fleet: Fleet
) -> None:
    """The documented way to stop without a drain (there is no second STOP): ``sc control <service> 128``."""
    main = installed["main"]
    with main.running():
        session_id, dummy = serve_one(fleet)
        rows = main.probe("watch", "--control", "128", "--timeout", "120", timeout=180)
    assert {"control": 0} in rows, rows
    assert rows[-1]["state"] == "STOPPED" and rows[-1]["exit_code"] == 0, rows
    log = main.log()
    assert "service control 128 (stop now): stopping the sessions now" in log, log
    assert "draining, as on SIGTERM" not in log.split("service control 128")[-1]
    assert actions(fleet, session_id)[-1] == "release", actions(fleet, session_id)
    assert "crashed" not in log


def test_a_second_stop_while_draining_is_refused_and_the_docs_say_so(
    installed: dict[str, Instance], fleet: Fleet
) -> None:
    main = installed["main"]
    with main.running():
        rows = main.stop("--second-stop")
    (second,) = [row["second_stop"] for row in rows if "second_stop" in row]
    assert second == ERROR_SERVICE_CANNOT_ACCEPT_CTRL, rows
    table = (ROOT / "docs" / "windows-worker.md").read_text(encoding="utf-8")
    assert not re.search(r"a second STOP or PRESHUTDOWN while draining \| It stops now", table)


def test_a_restart_after_a_crash_takes_back_the_claimed_session(
    installed: dict[str, Instance], fleet: Fleet
) -> None:
    """The machine dies with a session claimed, comes back, and the service serves the same session again.

    Wine's service manager never notices a service process that was killed (after ``taskkill /F`` it still
    reports RUNNING, so ``net start`` is refused), so the crash is the whole Wine machine's: ``wineserver -k``
    kills the service, its remote and the service manager at once, like a power cut, and the prefix starts again.
    """
    main = installed["main"]
    with main.running():
        session_id, first = serve_one(fleet)
        main.wine.stop()  # the crash: nothing runs the drain, nothing releases the claim
        main.wine.start()
        assert main.status()["state"] == "STOPPED"
        assert states(main.start())[-1] == "RUNNING"
        again = fleet.sim.admin.wait_connection(session_id, count=2, timeout=180)
        assert again["acceptor_id"] == first["acceptor_id"], (first, again)
        fleet.sim.admin.add_calls(session_id, [tools.run("echo taken-back")])
        (call,) = fleet.sim.admin.wait_calls(session_id, timeout=120)
        assert call["state"] == "done" and "taken-back" in json.dumps(call["result"]), call
    history = actions(fleet, session_id)
    # Claimed, renewed while it ran, then claimed again by the same acceptor (a take-back is a renewing claim):
    # never released in between, and released once at the stop.
    assert history[0] == "claim" and history.count("release") == 1 and history[-1] == "release", history
    assert f"took back session {session_id} after a restart" in main.log()


def _with_env(instance: Instance, change: Any) -> str:
    """Rewrite the instance's worker.env with ``change(text)``; the original text."""
    original = instance.env_file.read_text(encoding="utf-8")
    instance.env_file.write_text(change(original), encoding="utf-8", newline="")
    return original


def _outpost(text: str, name: str) -> str:
    return re.sub(r"(?m)^DEVIN_OUTPOSTS_WORKER_OUTPOST=.*$", "DEVIN_OUTPOSTS_WORKER_OUTPOST=" + name, text)


def test_exit_codes_reach_the_service_status(installed: dict[str, Instance], fleet: Fleet) -> None:
    second = installed["second"]
    original = second.env_file.read_text(encoding="utf-8")
    try:
        # Token refused (exit 3): a clean stop (no recovery), the reason in worker.log.
        _with_env(second, lambda text: text.replace(fleet.token, "cog_" + "x" * 48))
        rows = second.start() + second.wait_stopped()
        assert rows[-1]["state"] == "STOPPED" and rows[-1]["exit_code"] == 0, rows
        assert re.search(r"exit(ing)? (with )?(code )?3|token", second.log(), re.IGNORECASE), second.log()
        # The outpost not found (exit 4) and an outpost of another platform (exit 6): clean stops, no restart.
        _with_env(second, lambda text: _outpost(original, "no-such-outpost"))
        rows = second.start() + second.wait_stopped()
        assert rows[-1]["state"] == "STOPPED" and rows[-1]["exit_code"] == 0, rows
        assert "the outpost was not found" in second.log(), second.log()
        linux = fleet.sim.admin.create_outpost("windows-stage-linux", "linux")
        _with_env(second, lambda text: _outpost(original, linux.name))
        rows = second.start() + second.wait_stopped()
        assert rows[-1]["state"] == "STOPPED" and rows[-1]["exit_code"] == 0, rows
        assert "the outpost's platform is not this machine's" in second.log(), second.log()
        # A bad worker.env (exit 2): a clean stop, the line named and no value echoed.
        _with_env(second, lambda text: original + "this line has no equals sign " + fleet.token[:8] + "\r\n")
        rows = second.start() + second.wait_stopped()
        assert rows[-1]["state"] == "STOPPED" and rows[-1]["exit_code"] == 0, rows
        assert "line" in second.log() and fleet.token[:8] not in second.log()
        # The data directory locked by another instance (exit 8): a service-specific error with the code.
        main = installed["main"]
        cache = main.row["cache_dir"]
        _with_env(
            second,
            lambda text: re.sub(
                r"(?m)^DEVIN_WORKER_CACHE_DIR=.*$",
                "DEVIN_WORKER_CACHE_DIR=" + cache.replace("\\", "\\\\"),
                original,
            ),
        )
        with main.running():
            rows = second.start() + second.wait_stopped()
        final = rows[-1]
        assert final["state"] == "STOPPED", rows
        assert (final["exit_code"], final["specific"]) == (ERROR_SERVICE_SPECIFIC_ERROR, EXIT_LOCKED), rows
    finally:
        second.env_file.write_text(original, encoding="utf-8", newline="")
        second.ensure_stopped()


def test_two_instances_serve_side_by_side(installed: dict[str, Instance], fleet: Fleet) -> None:
    main, second = installed["main"], installed["second"]
    try:
        # One slot each: main serves the first session, so only second can take the other.
        assert states(main.start())[-1] == "RUNNING"
        dummy, first = serve_one(fleet)
        assert states(second.start())[-1] == "RUNNING"
        dummy, other = serve_one(fleet)
        assert first["acceptor_id"] != other["acceptor_id"]
        assert first["acceptor_id"] in main.log() and other["acceptor_id"] in second.log()
    finally:
        main.ensure_stopped()
        second.ensure_stopped()
