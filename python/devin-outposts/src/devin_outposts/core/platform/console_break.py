r"""Ctrl-Break for a remote on a console of its own: ``python -I console_break.py <pid>`` (Windows).

The worker asks a Windows ``devin-remote`` to stop with ``CTRL_BREAK_EVENT``, which only a process
attached to the remote's console can generate (``GenerateConsoleCtrlEvent``). A service has no console,
and CPython's ``os.kill(pid, CTRL_BREAK_EVENT)`` then raises ``SystemError`` and falls through to
``TerminateProcess`` (cpython#87128), so the remote would be killed at once. Instead, the remote is
started with a hidden console and a process group of its own
(:meth:`~devin_outposts.core.platform.windows.Windows.process_group_options`), and the worker runs this
file, with the interpreter it runs on, as a console-less process (``DETACHED_PROCESS``) that:

1. lets go of any console it was given (``FreeConsole``: a process can be attached to one only);
2. attaches to the remote's console (``AttachConsole(pid)``);
3. sends Ctrl-Break to the remote's process group (``GenerateConsoleCtrlEvent(CTRL_BREAK_EVENT, pid)``),
   which holds the remote and whatever it started that did not make a group of its own; this process is
   not in that group, so the event does not reach it;
4. detaches and exits: 0 when the event was sent, else :data:`ATTACH_FAILED` or :data:`SEND_FAILED` with
   one line on stderr naming the call and the Windows error code, which the worker logs.

It is a separate process so that the worker never attaches to another console itself: in a console
(``--debug``) it would have to give up its own, and while attached it would share the remote's events.
This file imports only the standard library and nothing of this package, so the base interpreter runs
it by path in isolated mode (``-I``: no script directory on ``sys.path``, no ``PYTHON*`` variables)
whatever the venv's layout. Tests call :func:`main` with a fake ``kernel32``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

CTRL_BREAK_EVENT = 1
SENT, USAGE, ATTACH_FAILED, SEND_FAILED = 0, 2, 3, 4


def send_ctrl_break(pid: int, kernel32: Any, last_error: Callable[[], int]) -> tuple[int, str]:
    """Send Ctrl-Break to the process group ``pid`` on that process's console: (exit code, what failed)."""
    kernel32.FreeConsole()  # fails harmlessly when there is none (DETACHED_PROCESS)
    if not kernel32.AttachConsole(pid):
        return ATTACH_FAILED, f"AttachConsole({pid}) failed with Windows error {last_error()}"
    try:
        if not kernel32.GenerateConsoleCtrlEvent(CTRL_BREAK_EVENT, pid):
            return (
                SEND_FAILED,
                f"GenerateConsoleCtrlEvent(CTRL_BREAK_EVENT, {pid}) failed with Windows error {last_error()}",
            )
    finally:
        kernel32.FreeConsole()
    return SENT, ""


def _real_kernel32() -> tuple[Any, Callable[[], int]]:
    if sys.platform == "win32":
        import ctypes

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        return kernel32, ctypes.get_last_error
    raise OSError("Ctrl-Break can only be sent on Windows")


def main(
    argv: Sequence[str], kernel32: Optional[Any] = None, last_error: Optional[Callable[[], int]] = None
) -> int:
    """``console_break.py <pid>``; ``kernel32`` and ``last_error`` stand in for the Windows API in tests."""
    if len(argv) != 1 or not argv[0].isdigit() or int(argv[0]) <= 0:
        print("usage: console_break.py <pid of a process group leader>", file=sys.stderr)
        return USAGE
    if kernel32 is None or last_error is None:
        try:
            kernel32, last_error = _real_kernel32()
        except OSError as exc:
            print(str(exc), file=sys.stderr)
            return USAGE
    code, failure = send_ctrl_break(int(argv[0]), kernel32, last_error)
    if failure:
        print(failure, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
