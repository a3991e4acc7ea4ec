r"""The POSIX behaviour (Linux, macOS): :class:`HostPlatform`, which :class:`~.windows.Windows` overrides
where Windows differs, and what both share (the variables a session inherits, secret names, the
``devin-remote`` build suffixes). :mod:`devin_outposts.core.platform` says which one runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform as stdlib_platform
import re
import signal
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Callable, Optional
from urllib.parse import urlsplit

from devin_outposts import privacy

log = logging.getLogger(__name__)

#: What a session inherits from the worker's environment on every OS (docs/fleet-api.md §6.2).
PASSTHROUGH = ("PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "TZ")
#: Proxy settings a session needs to reach the network the way the worker does (docs/security.md): passed
#: on, both spellings, unless the URL carries a user name or password (then the session gets none).
PROXY_PASSTHROUGH = (
    "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
    "http_proxy", "https_proxy", "all_proxy", "no_proxy",
)  # fmt: skip
#: What the desktop stream needs on Linux/X11 and Wayland.
DESKTOP_PASSTHROUGH = ("DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY")
_ARCHES = {"x86_64": "x64", "amd64": "x64", "x64": "x64", "aarch64": "arm64", "arm64": "arm64"}
_SUFFIXES = {
    ("linux", "x64"): "linux_x64",
    ("linux", "arm64"): "linux_arm64",
    ("macos", "arm64"): "macos_arm64",
    ("windows", "x64"): "windows_x64.exe",
}


#: A variable whose name says it holds a credential never reaches a Windows session, wherever it came from.
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
)
#: The proxy variables whose URL may carry credentials.
PROXY_NAMES = frozenset(["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "FTP_PROXY"])
#: The launcher (:meth:`HostPlatform.gated_argv`): ``$0`` is the program, ``$@`` its arguments. It execs
#: through ``env`` to drop what shells add to the environment of what they run (dash and bash export
#: ``PWD``, bash ``SHLVL`` and ``_``): the session's environment stays exactly the one the worker built.
_SHELL, _ENV = "/bin/sh", "/usr/bin/env"
_LAUNCHER = (
    'read -r go_ahead || exit 125; [ "$go_ahead" = go ] || exit 125; '
    f'exec {_ENV} -u PWD -u OLDPWD -u SHLVL -u _ "$0" "$@" </dev/null'
)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential (``GITHUB_TOKEN``,
    ``AWS_SECRET_ACCESS_KEY``, ``DEVIN_OUTPOSTS_TOKEN``, ...)."""
    return SECRET_NAME.search(name.upper()) is not None


def has_credentials(url: str) -> bool:
    """Whether a proxy URL carries a user name or password (then no session gets it)."""
    try:
        parts = urlsplit(url.strip() if "://" in url else f"http://{url.strip()}")
    except ValueError:
        return True  # unparsable: do not guess
    return parts.username is not None or parts.password is not None


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
        #: Signal handlers :meth:`install_stop_handler` replaced through ``signal.signal`` (where the event
        #: loop cannot take them), to be put back by :meth:`remove_stop_handler`.
        self._replaced_handlers: dict[int, Any] = {}

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
        for name in PASSTHROUGH + DESKTOP_PASSTHROUGH + PROXY_PASSTHROUGH:
            value = source.get(name)
            if value is None or value == "":
                continue
            if name.upper() in PROXY_NAMES and has_credentials(value):
                continue
            env[name] = value
        return env

    # --- the worker's own process --------------------------------------------------------------------

    def hide_environment(self) -> bool:
        """Keep this process's environment (the account token) from the sessions it starts.

        Sessions run as the worker's user, and a process may read ``/proc/<pid>/environ`` and the memory
        of any dumpable process of its user; clearing ``os.environ`` would not help, because that file
        shows the environment the process started with. On Linux, ``prctl(PR_SET_DUMPABLE, 0)`` makes
        both readable to root only (and stops core dumps); a session's own ``devin-remote`` is dumpable
        again, because ``execve`` resets the flag. Returns whether it was done: elsewhere nothing is
        (docs/security.md, "What a session can reach").
        """
        if self.name != "linux":
            return False
        done = privacy.make_undumpable()
        if not done:
            log.warning("not undumpable: sessions of this user can read this process's environment")
        return done

    # --- configured directories ----------------------------------------------------------------------

    def config_path(self, raw: str, *, state: bool = True) -> Path:
        """A directory given in a flag or the environment: ``$VAR`` and ``~`` expanded, made absolute.
        ``state`` is False for a working directory (Windows spells the two differently)."""
        return Path(os.path.expandvars(raw)).expanduser().absolute()

    # --- processes ----------------------------------------------------------------------------------

    def process_group_options(self) -> dict[str, Any]:
        """``create_subprocess_exec`` options that start the remote in a process group of its own."""
        return {"start_new_session": True}

    def gated_argv(self, argv: list[str]) -> Optional[list[str]]:
        """The command line of a launcher that runs ``argv`` only once the worker says so, else None.

        The launcher is a POSIX shell that reads one line from its standard input (a pipe from the worker)
        and, when the line is ``go``, replaces itself with ``argv`` (``exec``: same pid, same process group,
        same start time) with its standard input from ``/dev/null``. When the pipe closes first, because
        the worker died, it exits with 125 and ``argv`` never runs. See :mod:`devin_outposts.worker.spawn`.
        None on a system without ``/bin/sh`` and ``/usr/bin/env`` (the remote is then started directly).
        """
        if not (os.access(_SHELL, os.X_OK) and os.access(_ENV, os.X_OK)):
            return None
        return [_SHELL, "-c", _LAUNCHER, *argv]

    async def request_stop(self, proc: Any, pid: int) -> bool:
        """Ask the remote ``proc`` (pid ``pid``, leader of its group) and its group to stop: the graceful
        half of a stop (SIGTERM here). False when the request could not be delivered; the caller stops the
        group by force (:meth:`signal_group` with ``kill``) after the grace period either way."""
        self.signal_group(proc, pid, kill=False)
        return True

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

    def unlock(self, handle: IO[bytes]) -> None:
        """Let go of the lock :meth:`lock` took, before ``handle`` is closed (closing drops an ``flock``)."""
        return

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
        """Route the stop signals to ``handler`` on ``loop``: through the loop where it can take them,
        else (Windows' proactor loop, which has no ``add_signal_handler``) through ``signal.signal``, which
        only the main thread may call; the Windows service host sends its stops by itself."""
        for signum in self.stop_signals():
            try:
                loop.add_signal_handler(signum, handler, signum)
            except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
                with contextlib.suppress(ValueError, OSError):
                    previous = signal.signal(signum, lambda s, f: loop.call_soon_threadsafe(handler, s))
                    self._replaced_handlers.setdefault(signum, previous)

    def remove_stop_handler(self, loop: asyncio.AbstractEventLoop) -> None:
        for signum in self.stop_signals():
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(signum)
        # A handler left behind would call into a closed loop on the next Ctrl-C.
        for signum, previous in list(self._replaced_handlers.items()):
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            del self._replaced_handlers[signum]

    def signal_name(self, signum: int) -> str:
        with contextlib.suppress(ValueError):
            return signal.Signals(signum).name
        return f"signal {signum}"


class Posix(HostPlatform):
    """Linux and macOS."""
