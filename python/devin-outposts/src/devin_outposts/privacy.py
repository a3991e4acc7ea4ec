"""Keeping this process's environment from the other processes of its user, before anything slow happens.

Linux lets a process read ``/proc/<pid>/environ`` (and the memory) of any *dumpable* process of its user,
and ``worker start`` and ``orchestrate`` run with the account token in their environment, next to
sessions of the same user. :func:`make_undumpable` (``prctl(PR_SET_DUMPABLE, 0)``) makes those files
root's. The command line (:func:`devin_outposts.cli.main`) calls it before it imports anything else of
ours, so the environment is hidden a few milliseconds after the interpreter starts instead of after
httpx, pydantic and ssl are loaded (216 to 334 ms, issue 24). What remains is the interpreter's own
start-up; a token given on a file descriptor (``DEVIN_OUTPOSTS_TOKEN_FD``, docs/security.md) is never
in the environment at all.

Standard library only, and nothing heavier than ``ctypes``: this module is imported first.
"""

from __future__ import annotations

import sys

#: prctl(2) option: whether the process may be ptraced by its user and its /proc files read.
PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` on Linux; whether it was done (never elsewhere). ``execve`` resets the
    flag, so the programs this process starts are dumpable again."""
    system = sys.platform  # (a plain value: both of mypy's platform runs check the rest)
    if not system.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError, ImportError):
        return False
