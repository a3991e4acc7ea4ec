"""Everything the worker does differently per operating system, in one place.

The rest of the worker asks :func:`current` instead of testing ``os.name`` or ``sys.platform``:

* the OS as an outpost platform name, and the ``devin-remote`` build suffix (docs/fleet-api.md §8);
* which variables of the worker's environment a session inherits (§6.2; Windows also passes its system
  environment, §7.5);
* how a remote is started in a process group of its own, and how that group is stopped;
* the exclusive, non-blocking file lock behind the data-dir and workdir locks;
* directory privacy (POSIX modes; on Windows the role sets ACLs) and directory fsync;
* how SIGTERM/SIGINT (POSIX) or Ctrl-Break/Ctrl-C (Windows console, and the service host) reach the
  worker;
* the kernel start time of a process, to tell an orphaned remote from a reused pid (Linux only).

:class:`Posix` and :class:`Windows` are plain classes, so tests on Linux can switch to the Windows
behaviour with :func:`use` and check environment building, suffixes and signal mapping. The Windows
branches that call Windows APIs (``msvcrt``, ``CTRL_BREAK_EVENT``) are only exercised on Windows hosts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform as stdlib_platform
import signal
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Callable, Optional

#: What a session inherits from the worker's environment on every OS (docs/fleet-api.md §6.2).
PASSTHROUGH = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "TZ")
#: What the desktop stream needs on Linux/X11 and Wayland.
DESKTOP_PASSTHROUGH = ("DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY")
#: "The Windows system environment" (§7.5): what Windows programs need to start at all. Matched without
#: regard to case, as Windows does.
WINDOWS_PASSTHROUGH = (
    "SYSTEMROOT",
    "SYSTEMDRIVE",
    "WINDIR",
    "COMSPEC",
    "PATHEXT",
    "TEMP",
    "TMP",
    "USERPROFILE",
    "USERNAME",
    "USERDOMAIN",
    "APPDATA",
    "LOCALAPPDATA",
    "PROGRAMDATA",
    "PROGRAMFILES",
    "PROGRAMFILES(X86)",
    "PROGRAMW6432",
    "COMMONPROGRAMFILES",
    "COMMONPROGRAMFILES(X86)",
    "COMPUTERNAME",
    "HOMEDRIVE",
    "HOMEPATH",
    "NUMBER_OF_PROCESSORS",
    "OS",
    "PROCESSOR_ARCHITECTURE",
    "PSMODULEPATH",
    "PUBLIC",
)
_ARCHES = {"x86_64": "x64", "amd64": "x64", "x64": "x64", "aarch64": "arm64", "arm64": "arm64"}
_SUFFIXES = {
    ("linux", "x64"): "linux_x64",
    ("linux", "arm64"): "linux_arm64",
    ("macos", "arm64"): "macos_arm64",
    ("windows", "x64"): "windows_x64.exe",
}


class UnsupportedHost(Exception):
    """No devin-remote build exists for this OS/architecture."""


class SharedDirectoryError(PermissionError):
    """A directory the worker would keep secrets in can be written by other users."""


def _os_name(system: str) -> str:
    system = system.lower()
    if system.startswith("linux"):
        return "linux"
    if system in ("darwin", "macos"):
        return "macos"
    if system in ("win32", "cygwin", "windows"):
        return "windows"
    return system


class HostPlatform:
    """The POSIX behaviour; :class:`Windows` overrides what differs."""

    windows = False

    def __init__(self, system: Optional[str] = None, machine: Optional[str] = None) -> None:
        self.name = _os_name(system or sys.platform)
        self.machine = (machine or stdlib_platform.machine()).lower()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.machine!r})"

    # --- what the outpost and the distribution call this machine -------------------------------------

    def binary_suffix(self) -> str:
        """The ``devin-remote`` build suffix of this OS/architecture (docs/fleet-api.md §8)."""
        arch = _ARCHES.get(self.machine, self.machine)
        suffix = _SUFFIXES.get((self.name, arch))
        if suffix is None:
            raise UnsupportedHost(f"no devin-remote build is published for {self.name}/{self.machine}")
        return suffix

    # --- the session's environment ------------------------------------------------------------------

    def inherited_env(self, source: Mapping[str, str]) -> dict[str, str]:
        """What a session inherits from ``source`` (the worker's environment): nothing else."""
        env: dict[str, str] = {}
        for name in PASSTHROUGH + DESKTOP_PASSTHROUGH:
            value = source.get(name)
            if value is not None and value != "":
                env[name] = value
        return env

    # --- processes ----------------------------------------------------------------------------------

    def process_group_options(self) -> dict[str, Any]:
        """``create_subprocess_exec`` options that start the remote in a process group of its own."""
        return {"start_new_session": True}

    def signal_group(self, proc: Any, pid: int, *, kill: bool) -> None:
        """Ask the group led by ``pid`` to stop (SIGTERM), or kill it (SIGKILL)."""
        if sys.platform != "win32":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL if kill else signal.SIGTERM)

    def kill_orphan_group(self, pgid: int) -> bool:
        """Kill the group of a remote a killed worker left behind; True when a signal was sent."""
        if sys.platform == "win32":
            killed = False
        else:
            try:
                os.killpg(pgid, signal.SIGKILL)
                killed = True
            except (ProcessLookupError, PermissionError):
                killed = False
        return killed

    def process_start_time(self, pid: int) -> Optional[str]:
        """The kernel's start time of ``pid`` (Linux ``/proc``), else None: a pid alone can be reused."""
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return text.rsplit(")", 1)[1].split()[19]

    # --- files ----------------------------------------------------------------------------------------

    def lock(self, handle: IO[bytes]) -> None:
        """An exclusive, non-blocking lock on an open file; OSError when another process holds it."""
        if sys.platform != "win32":
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            raise OSError("fcntl locks do not exist on Windows")

    def make_private(self, path: Path) -> None:
        """Give a directory (or file) the worker just created to its owner alone."""
        os.chmod(path, 0o700 if path.is_dir() else 0o600)

    def check_not_shared(self, path: Path) -> None:
        """Refuse a directory that another user could write to or that belongs to another user."""
        info = os.stat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise SharedDirectoryError(f"refusing to use {path}: it is not a directory")
        if sys.platform != "win32" and info.st_uid not in (os.geteuid(), 0):
            raise SharedDirectoryError(
                f"refusing to use {path}: it belongs to another user (uid {info.st_uid}); give the worker "
                "a data directory of its own (the parent of --cache-dir)"
            )
        if info.st_mode & 0o022:
            raise SharedDirectoryError(
                f"refusing to use {path}: other users can write to it (mode "
                f"{stat.S_IMODE(info.st_mode):04o}); give the worker a data directory of its own (the "
                "parent of --cache-dir), e.g. --cache-dir /var/lib/devin-worker/cache"
            )

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- signals ----------------------------------------------------------------------------------------

    def stop_signals(self) -> tuple[int, ...]:
        """The signals that ask the worker to drain (a second one stops it)."""
        return (signal.SIGTERM, signal.SIGINT)

    def install_stop_handler(self, loop: asyncio.AbstractEventLoop, handler: Callable[[int], None]) -> None:
        for signum in self.stop_signals():
            try:
                loop.add_signal_handler(signum, handler, signum)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                with contextlib.suppress(ValueError):
                    signal.signal(signum, lambda s, f: loop.call_soon_threadsafe(handler, s))

    def remove_stop_handler(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in self.stop_signals():
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)

    def signal_name(self, signum: int) -> str:
        with contextlib.suppress(ValueError):
            return signal.Signals(signum).name
        return f"signal {signum}"


class Posix(HostPlatform):
    """Linux and macOS."""


class Windows(HostPlatform):
    """Windows Server and desktop Windows (never run here: see docs/worker.md, "Windows")."""

    windows = True

    def inherited_env(self, source: Mapping[str, str]) -> dict[str, str]:
        env = super().inherited_env(source)
        by_upper = {key.upper(): key for key in source}
        for name in WINDOWS_PASSTHROUGH:
            key = by_upper.get(name)
            if key is not None:
                env[key] = source[key]
        return env

    def process_group_options(self) -> dict[str, Any]:
        return {"creationflags": 0x00000200}  # CREATE_NEW_PROCESS_GROUP: Ctrl-Break reaches only it

    def signal_group(self, proc: Any, pid: int, *, kill: bool) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            if kill:
                proc.kill()  # TerminateProcess
            else:
                proc.send_signal(getattr(signal, "CTRL_BREAK_EVENT", signal.SIGTERM))

    def kill_orphan_group(self, pgid: int) -> bool:
        return False  # no start time to check a pid against: leave it rather than hit the wrong process

    def process_start_time(self, pid: int) -> Optional[str]:
        return None

    def lock(self, handle: IO[bytes]) -> None:
        if sys.platform == "win32":
            import msvcrt

            handle.seek(0)
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        else:
            raise OSError("msvcrt locks exist only on Windows")

    def make_private(self, path: Path) -> None:
        return  # ACLs on the data directories are set by the role (docs/windows.md)

    def check_not_shared(self, path: Path) -> None:
        if not path.is_dir():
            raise SharedDirectoryError(f"refusing to use {path}: it is not a directory")

    def fsync_dir(self, path: Path) -> None:
        return  # directories cannot be opened for fsync on Windows; NTFS journals the rename

    def stop_signals(self) -> tuple[int, ...]:
        return tuple(
            getattr(signal, name) for name in ("SIGINT", "SIGBREAK", "SIGTERM") if hasattr(signal, name)
        )


def _detect() -> HostPlatform:
    return Windows() if sys.platform in ("win32", "cygwin") else Posix()


_current: HostPlatform = _detect()


def current() -> HostPlatform:
    """The platform the worker runs on (or the one a test switched to)."""
    return _current


@contextlib.contextmanager
def use(host: HostPlatform) -> Iterator[HostPlatform]:
    """Act as ``host`` inside the block (tests of the other OS's behaviour)."""
    global _current
    previous, _current = _current, host
    try:
        yield host
    finally:
        _current = previous
