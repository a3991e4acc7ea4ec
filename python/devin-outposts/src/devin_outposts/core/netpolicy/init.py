"""The first process of a session's process namespace (pid 1 there), forked by the launcher
(docs/network-policy.md, "Processes").

It mounts a ``/proc`` of the new namespace (in a mount namespace of its own, so the launcher keeps the
host's), starts the session, reaps every orphan, and ends when the session ends: the kernel then kills
whatever the session left running in the namespace, so nothing of a session outlives it. Inside, the
session sees its own processes only, and no pid of the worker, the launcher, the shim or another session
means anything to ``kill``.

It talks to the launcher through two pipes:

* ``control`` (launcher → init): two bytes each, ``f<signum>`` (pass that signal on to the session, it
  reached the launcher alone) or ``c<signum>`` (consume it: it was sent to the whole process group, so the
  session has it already). Init keeps SIGTERM, SIGINT and SIGHUP blocked, which is what lets the launcher
  tell the two cases apart: a signal sent to the group stays pending here.
* ``status`` (init → launcher): the session's ``Popen`` return code as text, or ``E`` and why it could not
  be started.

Signals from outside the namespace that init does not handle are not delivered to it (the kernel protects
a namespace's first process), except SIGKILL, which ends the namespace.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Callable, NoReturn

from . import entry

assert sys.platform == "linux"  # process namespaces are Linux's (mypy skips the rest elsewhere)

#: The signals the launcher passes on when they reach it alone (and that init keeps blocked).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
FORWARD, CONSUME = b"f", b"c"
_PR_SET_PDEATHSIG = 1
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    enter_session: Callable[[], None],
    control: int,
    status: int,
) -> NoReturn:
    """Be the namespace's first process (never returns). ``enter_session`` runs in the session's child
    before ``exec`` (its user namespace and ids)."""
    code = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # Dies with the launcher. (getppid() is 0 here: the launcher is outside this namespace. A launcher
        # that died before this line closed the control pipe, which ends init below, and the namespace.)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED))
        _own_proc(libc)
        wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *dummy: None)

        def child_setup() -> None:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, set(FORWARDED))
            enter_session()

        try:
            session = subprocess.Popen(list(argv), env=dict(env), cwd=cwd, preexec_fn=child_setup)  # noqa: S603
        except (OSError, subprocess.SubprocessError) as exc:
            _report(status, "E" + f"cannot start {argv[0]}: {exc}")
        else:
            _report(status, str(_serve(session.pid, control, wake_read)))
        code = 0
    except BaseException:  # a forked child must never return into the launcher's code
        with suppress(Exception):
            import traceback

            traceback.print_exc()
    os._exit(code)


def _own_proc(libc: ctypes.CDLL) -> None:
    """A ``/proc`` of this process namespace, in a mount namespace of its own; where the host does not
    allow it (a container whose ``/proc`` has paths masked), the session keeps the host's ``/proc``, in
    which it still cannot read another process's environment or memory (they are in other user
    namespaces) nor signal one (their pids mean nothing in this namespace)."""
    entry.unshare(entry.CLONE_NEWNS, "mount, for /proc")
    libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)


def _serve(session: int, control: int, wake: int) -> int:
    """Pass signals on, reap, until the session has ended; its return code (as ``Popen`` gives it)."""
    held: list[int] = []
    while True:
        reaped = _reap(session)
        if reaped is not None:
            return reaped
        readable, dummy_w, dummy_x = select.select([control, wake], [], [])
        if wake in readable:
            with suppress(BlockingIOError):
                os.read(wake, 512)
        if control in readable:
            data = os.read(control, 2)
            if len(data) < 2:
                os._exit(1)  # the launcher is gone: so is the session, with this namespace
            if data[:1] == FORWARD:
                held.append(data[1])
            else:
                _consume(data[1])
        for signum in held:
            with suppress(ProcessLookupError):
                os.kill(session, signum)
        held.clear()


def _reap(session: int) -> int | None:
    """Reap every ended child; the session's return code once it is among them."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == session:
            found = os.waitstatus_to_exitcode(status)


def _consume(signum: int) -> None:
    with suppress(OSError, ValueError):
        signal.sigtimedwait([signum], 0)


def _report(status: int, text: str) -> None:
    with suppress(OSError):
        os.write(status, text.encode("utf-8", "replace")[:4000])
    with suppress(OSError):
        os.close(status)
