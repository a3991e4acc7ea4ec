"""The file system a session sees (docs/network-policy.md, "What a session sees of the host").

The launcher builds it in its own mount namespace (:mod:`.entry`), before the session starts; the session
cannot undo any of it (it has no capability over that namespace, and mounts it would inherit into one of
its own are locked). In order:

1. **Sources first.** Each directory or file the session keeps (:attr:`View.writable`, :attr:`View.readonly`)
   is opened (``O_PATH``) before anything is covered, since covering may hide its path.
2. **Frozen parents.** A hidden path that does not exist yet (``/var/lib/lxd`` on a host without LXD) could
   appear while the session runs, with a socket in it. Its nearest existing parent is *frozen*: covered by a
   tmpfs that holds each of the parent's entries as they are now (bound back, recursively). An entry made
   later on the host does not appear; one the session makes lives in that tmpfs only.
3. **Covers.** Each hidden path that exists is covered: a directory by an empty tmpfs, anything else by
   ``/dev/null``. ``/run`` is always covered whole: the host's sockets live there (systemd, D-Bus, the
   container engines, libvirt, snapd, k3s, CRI-O, nscd, and whatever is installed later), so they are
   hidden whether or not they exist when the session starts. A directory on the way to something the
   session keeps that the session's uid could not search is covered too (a root worker's ``/root``).
4. **Binds.** Each kept source is bound at its own path (a mount point is made inside a cover when the path
   is covered; never on the host's file system); ``/tmp`` and ``/var/tmp`` are the session's own
   (``tmp`` and ``var-tmp`` in its state directory), ``/dev/shm`` a fresh tmpfs.
5. **Read-only.** Every mount is made read-only, recursively; then the writable binds, ``/dev`` and
   ``/proc`` are made writable again (a device is no file to change, and a session's own ``/proc`` entries
   are written to make its user namespace).

What the session can then change on the host: its working directory and its state directory, nothing else.
What it can read: what its uid could read before, less everything hidden.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

assert sys.platform == "linux"  # mount namespaces are Linux's (mypy skips the rest elsewhere)

log = logging.getLogger("devin_outposts.sandbox")

#: Always covered whole, whatever the worker says: where the host's services keep their sockets.
ALWAYS_HIDDEN = ("/run", "/var/run")
#: Host services whose sockets live outside ``/run`` (hidden by default; frozen parents when missing).
OUTSIDE_RUN = ("/var/lib/lxd", "/var/snap/lxd", "/var/lib/incus", "/var/lib/kubelet")
#: Never hidden, never a session's own to write (a home of ``/``, a worker started in ``/`` without
#: ``--workdir``): the session could not run, or would write the host's system.
SYSTEM_PATHS = frozenset(
    (
        "/",
        "/usr",
        "/etc",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        "/var",
        "/proc",
        "/sys",
        "/dev",
        "/boot",
    )
)
#: Where the launcher writes the files it binds over the host's (``/etc/hosts``...): inside the ``/run``
#: cover, so the session can read them and not change them.
LAUNCHER_FILES = "/run/devin-outposts-session"
#: The session's own ``/tmp`` and ``/var/tmp``: these directories of its state directory.
PRIVATE_TMP = (("/tmp", "tmp"), ("/var/tmp", "var-tmp"))  # noqa: S108 (the session's own, from its state dir)

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
_MS_REMOUNT, _MS_BIND, _MS_REC = 0x20, 0x1000, 0x4000
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_NS_GET_USERNS = 0xB701
_SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and aarch64 (asm-generic)
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_MOUNT_ATTR_RDONLY = 0x1


class ViewError(RuntimeError):
    """The session's view could not be made; the session must not start."""


@dataclass(frozen=True)
class View:
    """What the session sees: every path absolute (the worker gives them; the launcher adds its own)."""

    #: Covered (a tmpfs, or /dev/null for a file); frozen parents for the missing ones.
    hide: Sequence[str] = ()
    #: Bound at their own paths, writable (the session's working and state directories).
    writable: Sequence[str] = ()
    #: Bound at their own paths, read-only (the ``devin-remote`` binary in a covered cache).
    readonly: Sequence[str] = ()
    #: The session's state directory, whose ``tmp`` and ``var-tmp`` become ``/tmp`` and ``/var/tmp``.
    state_dir: str = ""
    #: Files of the launcher's, bound read-only over the host's (``/etc/hosts`` → its text).
    files: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Made:
    """What :func:`apply` did (the launcher logs it at debug level; the tests read it)."""

    frozen: list[str] = field(default_factory=list)
    covered: list[str] = field(default_factory=list)
    bound: list[str] = field(default_factory=list)


def apply(view: View, session_uid: int, session_gids: Iterable[int]) -> Made:
    """Build the view in this process's mount namespace (see the module's docstring). ``session_uid`` and
    ``session_gids`` are the session's ids as this namespace sees the host's files (to find directories it
    could not search). Raises :class:`ViewError`."""
    check_own_mount_namespace()
    made = Made()
    gids = set(session_gids)
    for path in view.writable:
        if os.path.realpath(path) in SYSTEM_PATHS:
            raise ViewError(f"{path} cannot be a session's own directory (give the worker a --workdir)")
    binds = _binds(view)
    sources = {target: _open_path(source) for target, source, dummy in binds}
    try:
        hidden = [os.path.realpath(p) for p in dict.fromkeys([*ALWAYS_HIDDEN, *OUTSIDE_RUN, *view.hide])]
        hidden = [p for p in hidden if p not in SYSTEM_PATHS]  # (a home of /: hiding it hides everything)
        missing = [p for p in hidden if not os.path.lexists(p)]
        for parent in _outermost_last({_existing_parent(p) for p in missing} - {"/"}):
            _freeze(parent)
            made.frozen.append(parent)
        blocked = {_blocked_ancestor(target, session_uid, gids) for target, dummy, dummy_w in binds}
        covers = [p for p in hidden if os.path.lexists(p)] + sorted(p for p in blocked if p)
        for path in _outermost_only(covers):
            _cover(path)
            made.covered.append(path)
        _place_files(view.files)
        writable_mounts = []
        ours = [*covers, *(target for target, dummy in PRIVATE_TMP if view.state_dir)]
        for target, dummy_source, writable in sorted(binds, key=lambda b: b[0].count("/")):
            _mount_point(target, os.path.isdir(f"/proc/self/fd/{sources[target]}"), ours)
            _mount(f"/proc/self/fd/{sources[target]}", target, None, _MS_BIND | _MS_REC)
            made.bound.append(target)
            if writable:
                writable_mounts.append(target)
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")  # noqa: S108 (a fresh one)
    finally:
        for descriptor in sources.values():
            os.close(descriptor)
    _read_only("/")
    for path in ["/dev", "/proc", *writable_mounts]:
        _writable(path)
    return made


def _place_files(files: Mapping[str, str]) -> None:
    """Write each file into :data:`LAUNCHER_FILES` (in the ``/run`` cover) and bind it over its target."""
    os.makedirs(LAUNCHER_FILES, mode=0o755, exist_ok=True)
    for index, (target, text) in enumerate(sorted(files.items())):
        if not os.path.isfile(target):
            continue  # nothing of the host's to replace
        placed = os.path.join(LAUNCHER_FILES, f"{index}-{os.path.basename(target)}")
        with open(placed, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(placed, 0o644)
        _mount(placed, target, None, _MS_BIND)


def _binds(view: View) -> list[tuple[str, str, bool]]:
    """``(target, source, writable)`` for every bind: the private tmp directories, then the kept paths."""
    binds: list[tuple[str, str, bool]] = []
    if view.state_dir:
        binds += [(target, os.path.join(view.state_dir, name), True) for target, name in PRIVATE_TMP]
    binds += [(os.path.realpath(p), os.path.realpath(p), True) for p in view.writable]
    binds += [(os.path.realpath(p), os.path.realpath(p), False) for p in view.readonly]
    return list({target: (target, source, w) for target, source, w in binds}.values())


def check_own_mount_namespace() -> None:
    """Refuse (:class:`ViewError`) unless this mount namespace was made in this user namespace, which is not
    the host's: covering a path in the host's mount namespace would hide it from the host."""
    whole = False
    try:
        whole = Path("/proc/self/uid_map").read_text().split() == ["0", "0", "4294967295"]
        with open("/proc/self/ns/mnt", "rb") as mount_ns:
            owner = fcntl.ioctl(mount_ns.fileno(), _NS_GET_USERNS)
        try:
            owned = os.fstat(owner).st_ino == os.stat("/proc/self/ns/user").st_ino
        finally:
            os.close(owner)
    except PermissionError:
        owned = False  # owned by an ancestor of this user namespace
    except OSError as exc:
        raise ViewError(f"cannot tell who owns this mount namespace: {exc}") from exc
    if whole or not owned:
        raise ViewError("refusing to change a mount namespace that is not the launcher's own")


def _open_path(path: str) -> int:
    try:
        return os.open(path, _O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise ViewError(f"cannot open {path} for the session: {exc.strerror}") from exc


def _existing_parent(path: str) -> str:
    parent = os.path.dirname(path)
    while not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    return parent


def _outermost_only(paths: Iterable[str]) -> list[str]:
    """``paths`` without those inside another one (a cover over a parent hides its children already)."""
    chosen: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(path == c or path.startswith(c.rstrip("/") + "/") for c in chosen):
            chosen.append(path)
    return chosen


def _outermost_last(paths: Iterable[str]) -> list[str]:
    """Deepest first: freezing a parent binds its children back with whatever covers them already."""
    return sorted(paths, key=lambda p: -p.count("/"))


def _blocked_ancestor(target: str, uid: int, gids: set[int]) -> str:
    """The outermost directory on the way to ``target`` that ``uid`` (with ``gids``) could not search, or
    "" (ACLs are not read: a directory that only an ACL opens is covered, which loses nothing)."""
    path = "/"
    for part in [p for p in target.split("/") if p][:-1]:
        path = os.path.join(path, part)
        try:
            info = os.stat(path)
        except OSError:
            return ""
        if info.st_uid == uid:
            bit = stat.S_IXUSR
        elif info.st_gid in gids:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return path
    return ""


def _freeze(parent: str) -> None:
    """Cover ``parent`` by a tmpfs holding its entries as they are now (see the module's docstring)."""
    descriptor = _open_path(parent)
    try:
        info = os.fstat(descriptor)
        entries = sorted(os.scandir(f"/proc/self/fd/{descriptor}"), key=lambda e: e.name)
        _mount("tmpfs", parent, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode={stat.S_IMODE(info.st_mode):o}")
        for entry in entries:
            target = os.path.join(parent, entry.name)
            try:
                if entry.is_symlink():
                    os.symlink(os.readlink(entry.path), target)
                    continue
                if entry.is_dir(follow_symlinks=False):
                    os.mkdir(target)
                else:
                    os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
                _mount(entry.path, target, None, _MS_BIND | _MS_REC)
            except (OSError, ViewError) as exc:  # hidden, then: safer, not worth refusing the session
                log.warning("%s is hidden from the session: %s", target, exc)
    finally:
        os.close(descriptor)


def _cover(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=755,size=1m")
    else:
        _mount(os.devnull, path, None, _MS_BIND)


def _mount_point(target: str, is_dir: bool, ours: Sequence[str]) -> None:
    """Make ``target`` where it is missing, but only inside a cover or the session's own ``/tmp``."""
    if os.path.lexists(target):
        return
    if not any(target.startswith(c.rstrip("/") + "/") for c in ours):
        raise ViewError(f"cannot bind {target}: it does not exist and is not inside a covered path")
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if is_dir:
        os.mkdir(target, 0o755)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))


def _read_only(path: str) -> None:
    """Every mount at or under ``path`` read-only (mount_setattr; kernels before 5.12: one remount each)."""
    error = _setattr(path, set_flags=_MOUNT_ATTR_RDONLY, clear_flags=0)
    if error == 0:
        return
    if error not in (errno.ENOSYS, errno.EPERM):
        raise ViewError(f"cannot make the session's view read-only: {os.strerror(error)}")
    for mount_point, flags in _mounts_under(path):
        _mount("none", mount_point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)


def _writable(path: str) -> None:
    """``path``'s mount (and those under it) writable again; a mount the host made read-only stays so."""
    if _setattr(path, set_flags=0, clear_flags=_MOUNT_ATTR_RDONLY) == 0:
        return
    for mount_point, flags in _mounts_under(path):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount(b"none", mount_point.encode(), None, _MS_REMOUNT | _MS_BIND | flags, None)


def _setattr(path: str, *, set_flags: int, clear_flags: int) -> int:
    class MountAttr(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]

    attr = MountAttr(set_flags, clear_flags, 0, 0)
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(
        _SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr)
    )
    return 0 if result == 0 else ctypes.get_errno()


def _mounts_under(path: str) -> list[tuple[str, int]]:
    """The mount points at or under ``path`` with the flags a remount must keep (nosuid, nodev, noexec)."""
    found: list[tuple[str, int]] = []
    prefix = path.rstrip("/") + "/"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        words = line.split()
        mount_point = words[4].encode().decode("unicode_escape")
        if mount_point != path and not mount_point.startswith(prefix):
            continue
        options = set(words[5].split(","))
        kept = (_MS_NOSUID if "nosuid" in options else 0) | (_MS_NODEV if "nodev" in options else 0)
        found.append((mount_point, kept | (_MS_NOEXEC if "noexec" in options else 0)))
    return found


def _mount(source: str, target: str, kind: str | None, flags: int, data: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.mount(
        source.encode(),
        target.encode(),
        kind.encode() if kind else None,
        flags,
        data.encode() if data else None,
    )
    if result != 0:
        error = ctypes.get_errno()
        raise ViewError(f"cannot mount over {target}: {os.strerror(error)}")
