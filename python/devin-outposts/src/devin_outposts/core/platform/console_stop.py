r"""Ctrl-C for a Windows remote on a console of its own: ``python -I console_stop.py <pid>``.

The worker asks a Windows ``devin-remote`` to stop with a console control event, which only a process
attached to the remote's console can generate (``GenerateConsoleCtrlEvent``). A service has no console,
and CPython's ``os.kill(pid, CTRL_BREAK_EVENT)`` then raises ``SystemError`` and falls through to
``TerminateProcess`` (cpython#87128): the remote was killed at once and the session task crashed. Instead,
the remote is started with a hidden console of its own
(:meth:`~devin_outposts.core.platform.windows.Windows.process_group_options`), and the worker runs this
file, with the interpreter it runs on, as a console-less process (``DETACHED_PROCESS``) that:

1. lets go of any console it was given (``FreeConsole``: a process can be attached to one only);
2. attaches to the remote's console (``AttachConsole(pid)``) and ignores Ctrl-C itself
   (``SetConsoleCtrlHandler(NULL, TRUE)``);
3. sends Ctrl-C to every process on that console (``GenerateConsoleCtrlEvent(CTRL_C_EVENT, 0)``): the
   remote and whatever it started that did not make a console of its own, as SIGTERM to a process group
   does on POSIX;
4. detaches and exits: 0 when the event was sent, else :data:`ATTACH_FAILED` or :data:`SEND_FAILED` with
   one line on stderr naming the call and the Windows error code, which the worker logs.

Why Ctrl-C and not Ctrl-Break: Ctrl-C is what console programs handle (Rust's ``tokio::signal::ctrl_c``,
Python's ``KeyboardInterrupt``, the stand-in remote's SIGINT), and Wine 8 cannot generate Ctrl-Break at
all (``GenerateConsoleCtrlEvent`` fails with error 6; Ctrl-C works: tried with the Wine stage's Windows
CPython). Ctrl-C cannot be sent to one process group, only to a whole console, which is why each remote
has a console of its own and no process group of its own (``CREATE_NEW_PROCESS_GROUP`` would turn Ctrl-C
off in it).

It is a separate process so that the worker never attaches to another console itself: in a console
(``--debug``) it would have to give up its own, and while attached it would get the remote's Ctrl-C.
This file imports only the standard library and nothing of this package, so the base interpreter runs
it by path in isolated mode (``-I``: no script directory on ``sys.path``, no ``PYTHON*`` variables)
whatever the venv's layout. Tests call :func:`main` with a fake ``kernel32``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Callable, Optional

CTRL_C_EVENT = 0
#: ``GenerateConsoleCtrlEvent``'s process group 0: every process attached to the caller's console.
WHOLE_CONSOLE = 0
SENT, USAGE, ATTACH_FAILED, SEND_FAILED = 0, 2, 3, 4


def send_ctrl_c(pid: int, kernel32: Any, last_error: Callable[[], int]) -> tuple[int, str]:
    """Send Ctrl-C to every process on the console of process ``pid``: (exit code, what failed)."""
    kernel32.FreeConsole()  # fails harmlessly when there is none (DETACHED_PROCESS)
    if not kernel32.AttachConsole(pid):
        return ATTACH_FAILED, f"AttachConsole({pid}) failed with Windows error {last_error()}"
    try:
        kernel32.SetConsoleCtrlHandler(None, True)  # the event reaches this process too: ignore it
        if not kernel32.GenerateConsoleCtrlEvent(CTRL_C_EVENT, WHOLE_CONSOLE):
            what = f"GenerateConsoleCtrlEvent(CTRL_C_EVENT) on the console of {pid}"
            return SEND_FAILED, f"{what} failed with Windows error {last_error()}"
    finally:
        kernel32.FreeConsole()
    return SENT, ""


def _real_kernel32() -> tuple[Any, Callable[[], int]]:
    if sys.platform == "win32":
        import ctypes

        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        return kernel32, ctypes.get_last_error
    raise OSError("console control events can only be sent on Windows")


def main(
    argv: Sequence[str], kernel32: Optional[Any] = None, last_error: Optional[Callable[[], int]] = None
) -> int:
    """``console_stop.py <pid>``; ``kernel32`` and ``last_error`` stand in for the Windows API in tests."""
    if len(argv) != 1 or not argv[0].isdigit() or int(argv[0]) <= 0:
        print("usage: console_stop.py <pid of a process on the console to stop>", file=sys.stderr)
        return USAGE
    if kernel32 is None or last_error is None:
        try:
            kernel32, last_error = _real_kernel32()
        except OSError as exc:
            print(str(exc), file=sys.stderr)
            return USAGE
    code, failure = send_ctrl_c(int(argv[0]), kernel32, last_error)
    if failure:
        print(failure, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
