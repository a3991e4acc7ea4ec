"""Entering a session's namespaces: the launcher's first step (docs/network-policy.md, "How a session is
confined").

:func:`enter` moves this process into fresh user, mount and IPC namespaces (and a network namespace when the
session's policy is enforced) and makes it root of the new user namespace, with every capability there and
none outside. Its ids there:

* **0** is this process's own uid and gid outside (the worker's user): the launcher keeps what the worker
  can reach on the host's file system, which it needs to open the session's directories;
* **1**, only when the session has an id of its own (``session_ids``, a root worker's session: see
  :mod:`.session_ids`), is that uid and gid outside. The session runs as 1, so it has none of root's power
  over the host's files.

The maps are written by a helper forked before the ``unshare``, which stays in the host's namespaces: a
process loses its capabilities over its old user namespace when it leaves it, and a map of more than one
line needs ``CAP_SETUID``/``CAP_SETGID`` there (the worker is root whenever ``session_ids`` are given).
For a single line the process's own id is enough, and ``setgroups`` is denied first, as the kernel wants.

Why not ``unshare(1)``: it maps one id only (or needs ``newuidmap`` and ``/etc/subuid``). Why not
``os.unshare``: it exists from Python 3.12 only. The launcher calls this before anything starts a thread
(a process with threads cannot enter a new user namespace).
"""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import suppress
from typing import NamedTuple, Optional

assert sys.platform == "linux"  # namespaces are Linux's (mypy skips the rest elsewhere)

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
_MS_REC, _MS_PRIVATE = 0x4000, 0x40000
#: The session's uid and gid inside the launcher's user namespace when it has ids of its own.
SESSION_INSIDE_ID = 1


class NamespaceError(RuntimeError):
    """The namespaces could not be made, or their ids not mapped; the message says which call refused."""


class Ids(NamedTuple):
    """A uid and a gid (outside: the host's)."""

    uid: int
    gid: int


def enter(session_ids: Optional[Ids], *, network: bool) -> Ids:
    """Enter fresh namespaces (see the module's docstring); the ids outside of what the launcher is now (0).
    Raises :class:`NamespaceError`."""
    own = Ids(os.geteuid(), os.getegid())
    go_read, go_write = os.pipe()
    done_read, done_write = os.pipe()
    mapper = os.fork()
    if mapper == 0:  # the helper: still in the host's namespaces
        code = 1
        try:
            os.close(go_write)
            os.close(done_read)
            if os.read(go_read, 1) == b"u":
                _write_maps(os.getppid(), own, session_ids)
                os.write(done_write, b"ok")
                code = 0
        except BaseException as exc:  # a forked child never returns into the launcher's code
            with suppress(OSError):
                os.write(done_write, str(exc).encode("utf-8", "replace")[:1000] or b"?")
        finally:
            os._exit(code)
    os.close(go_read)
    os.close(done_write)
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | (CLONE_NEWNET if network else 0)
    libc = _libc()
    try:
        if libc.unshare(flags) != 0:
            error = ctypes.get_errno()
            raise NamespaceError(
                f"unshare(user, mount, ipc{', net' if network else ''}): {os.strerror(error)}"
            )
        os.write(go_write, b"u")
        answer = _read_all(done_read)
    finally:
        os.close(go_write)
        os.close(done_read)
        os.waitpid(mapper, 0)
    if answer != b"ok":
        raise NamespaceError(
            f"cannot map the session's ids: {answer.decode('utf-8', 'replace') or 'no answer'}"
        )
    # Mounts made here must never reach the host's namespace (a user namespace's copy already makes shared
    # mounts slaves; private also keeps the host's later mounts out of the session's view).
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        error = ctypes.get_errno()
        raise NamespaceError(f"cannot make the session's mounts private: {os.strerror(error)}")
    return own


def unshare(flags: int, what: str) -> None:
    """``unshare(2)`` for this process (a later one: the session's pid or mount namespace)."""
    if _libc().unshare(flags) != 0:
        error = ctypes.get_errno()
        raise NamespaceError(f"unshare({what}): {os.strerror(error)}")


def map_self(outside_uid: int, outside_gid: int, inside: Ids) -> None:
    """After ``unshare(CLONE_NEWUSER)`` by this (unprivileged) process: map ``inside`` to the ids it had
    (one line each, ``setgroups`` denied first)."""
    for path, text in (
        ("/proc/self/setgroups", "deny"),
        ("/proc/self/uid_map", f"{inside.uid} {outside_uid} 1"),
        ("/proc/self/gid_map", f"{inside.gid} {outside_gid} 1"),
    ):
        descriptor = os.open(path, os.O_WRONLY)
        try:
            os.write(descriptor, text.encode())
        finally:
            os.close(descriptor)


def _write_maps(pid: int, own: Ids, session_ids: Optional[Ids]) -> None:
    uid_map, gid_map = f"0 {own.uid} 1\n", f"0 {own.gid} 1\n"
    if session_ids is not None:
        uid_map += f"{SESSION_INSIDE_ID} {session_ids.uid} 1\n"
        gid_map += f"{SESSION_INSIDE_ID} {session_ids.gid} 1\n"
    else:
        _write(f"/proc/{pid}/setgroups", "deny")  # an unprivileged writer's gid_map needs it
    _write(f"/proc/{pid}/uid_map", uid_map)
    _write(f"/proc/{pid}/gid_map", gid_map)


def _write(path: str, text: str) -> None:
    try:
        descriptor = os.open(path, os.O_WRONLY)
        try:
            os.write(descriptor, text.encode())
        finally:
            os.close(descriptor)
    except OSError as exc:
        raise NamespaceError(f"writing {text.strip()!r} to {path}: {exc.strerror}") from exc


def _read_all(descriptor: int) -> bytes:
    chunks: list[bytes] = []
    while True:
        chunk = os.read(descriptor, 4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)
