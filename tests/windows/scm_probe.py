# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The service manager as the windows stage sees it: run by the Windows CPython under Wine, with pywin32.

Wine 8's ``sc.exe`` has ``query`` but no ``queryex`` (no process id, no service-specific exit code), so the
stage reads service states through the same API a Windows tool would (``QueryServiceStatusEx``,
``ControlService``). Each command prints JSON lines on stdout:

* ``status NAME``: one status;
* ``watch NAME [--stop | --control CODE] [--second-stop] [--until STATES] [--timeout SECONDS]``: with ``--stop``,
  send STOP first (with ``--control``, that control code: 128 is the service host's "stop now");
  then one line per change of state or checkpoint until the service reaches one of ``--until`` (comma-separated;
  default STOPPED), and a last line ``{"timeout": true}`` if it does not. ``--second-stop`` sends another STOP at the first STOP_PENDING
  and reports what the service manager answered (``{"second_stop": <error code or 0>}``);
* ``config NAME``: the service's binary path, account and start type.

Every status line has ``state`` (RUNNING, STOP_PENDING, ...), ``checkpoint``, ``wait_hint``, ``exit_code`` (the
Win32 exit code), ``specific`` (the service-specific exit code) and ``t`` (seconds since the probe started).
"""

from __future__ import annotations

import json
import sys
import time

import pywintypes  # type: ignore[import-not-found]  # pylint: disable=import-error
import win32service  # type: ignore[import-not-found]  # pylint: disable=import-error

STATES = {
    win32service.SERVICE_STOPPED: "STOPPED",
    win32service.SERVICE_START_PENDING: "START_PENDING",
    win32service.SERVICE_STOP_PENDING: "STOP_PENDING",
    win32service.SERVICE_RUNNING: "RUNNING",
    win32service.SERVICE_CONTINUE_PENDING: "CONTINUE_PENDING",
    win32service.SERVICE_PAUSE_PENDING: "PAUSE_PENDING",
    win32service.SERVICE_PAUSED: "PAUSED",
}
STARTED = time.monotonic()


def emit(row):
    print(json.dumps(row), flush=True)


def status(handle):
    raw = win32service.QueryServiceStatusEx(handle)
    return {
        "state": STATES.get(raw["CurrentState"], str(raw["CurrentState"])),
        "checkpoint": raw["CheckPoint"],
        "wait_hint": raw["WaitHint"],
        "exit_code": raw["Win32ExitCode"],
        "specific": raw["ServiceSpecificExitCode"],
        "pid": raw["ProcessId"],
        "t": round(time.monotonic() - STARTED, 2),
    }


def stop(handle, control=win32service.SERVICE_CONTROL_STOP):
    """Send STOP (or another control); the error code the service manager answers with (0 when it took it)."""
    try:
        win32service.ControlService(handle, control)
    except pywintypes.error as exc:
        return exc.winerror
    return 0


def watch(handle, args):
    until = (args[args.index("--until") + 1] if "--until" in args else "STOPPED").split(",")
    timeout = float(args[args.index("--timeout") + 1]) if "--timeout" in args else 120.0
    if "--stop" in args:
        emit({"stop": stop(handle)})
    if "--control" in args:
        emit({"control": stop(handle, int(args[args.index("--control") + 1]))})
    second_stop = "--second-stop" in args
    last = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = status(handle)
        key = (row["state"], row["checkpoint"])
        if key != last:
            emit(row)
            last = key
        if second_stop and row["state"] == "STOP_PENDING":
            emit({"second_stop": stop(handle)})
            second_stop = False
        if row["state"] in until:
            return 0
        time.sleep(0.1)
    emit({"timeout": True})
    return 1


def config(handle):
    raw = win32service.QueryServiceConfig(handle)
    emit({"binary_path": raw[3], "account": raw[7], "start_type": raw[1], "display_name": raw[8]})
    return 0


def main(argv):
    command, name, rest = argv[0], argv[1], argv[2:]
    manager = win32service.OpenSCManager(None, None, win32service.SC_MANAGER_ALL_ACCESS)
    handle = win32service.OpenService(manager, name, win32service.SERVICE_ALL_ACCESS)
    if command == "status":
        emit(status(handle))
        return 0
    if command == "watch":
        return watch(handle, rest)
    if command == "config":
        return config(handle)
    emit({"error": "unknown command " + command})
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
