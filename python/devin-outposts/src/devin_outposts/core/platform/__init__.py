r"""Everything the worker does differently per operating system, in one place.

The rest of the worker asks :func:`current` instead of testing ``os.name`` or ``sys.platform``:

* the OS as an outpost platform name, and the ``devin-remote`` build suffix (docs/fleet-api.md §8);
* keeping the worker's own environment (its token) from the sessions of its user
  (:meth:`HostPlatform.hide_environment`);
* which variables a session inherits (§6.2, plus proxy URLs without credentials; on Windows the system
  environment, §7.5, minus anything that looks like a secret: :func:`windows_session_env`);
* how a configured directory is checked and spelled (Windows: drive letters, UNC shares, and the ``\\?\``
  prefix for paths that would pass ``MAX_PATH``: :func:`windows_state_path`);
* how a remote is started in a process group of its own, and how that group is stopped;
* the exclusive, non-blocking file lock behind the data-dir and workdir locks (``flock``; ``msvcrt.locking``
  on Windows, unlocked explicitly before the file is closed);
* directory privacy (POSIX modes; on Windows the role sets ACLs) and directory fsync;
* how SIGTERM/SIGINT (POSIX) or Ctrl-Break/Ctrl-C (Windows console, and the service host) reach the
  worker;
* the kernel start time of a process, to tell an orphaned remote from a reused pid (Linux only).

:class:`Posix` and :class:`Windows` are plain classes, so tests on Linux can switch to the Windows
behaviour with :func:`use` and check environment building, suffixes, paths, locks and signal mapping.
What calls a Windows API (``msvcrt``, ``winreg``, ``CTRL_BREAK_EVENT``) is reached through a module or a
reader the :class:`Windows` constructor accepts, so tests hand it fakes; on Linux nothing of it has ever
run against the real API (docs/windows-worker.md, "What has never run").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ntpath
import os
import platform as stdlib_platform
import re
import signal
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
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
#: The per-process variables Windows gives every process (profile, temp, machine identity): a Windows session
#: takes them from the worker's environment, and the machine-wide variables from the registry
#: (:func:`windows_session_env`). Matched without regard to case, as Windows does.
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


#: Where Windows keeps the machine-wide ("system") environment variables.
WINDOWS_ENVIRONMENT_KEY = r"SYSTEM\CurrentControlSet\Control\Session Manager\Environment"
#: A variable whose name says it holds a credential never reaches a Windows session, wherever it came from.
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
)
#: The worker's own configuration (and the spawn-contract names, which the worker sets itself).
WORKER_PREFIX = "DEVIN_"
_PROXY_NAMES = frozenset(["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "FTP_PROXY"])
#: ``CreateDirectoryW`` refuses paths of MAX_PATH (260) minus 12 characters or more without ``\\?\``.
WINDOWS_DIR_LIMIT = 248
#: What the worker appends to its data directory: ``\sessions\`` + an id of up to 100 characters (paths.py)
#: + ``\.remote.pid.tmp``, with room to spare. A data directory longer than the limit minus this gets
#: the ``\\?\`` prefix.
WINDOWS_STATE_HEADROOM = 140
#: A working directory holds ``slot-<n>\repos\<repo>``; it cannot have the prefix at all.
WINDOWS_WORKDIR_HEADROOM = 48
_VERBATIM = "\\\\?\\"
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


def _has_credentials(url: str) -> bool:
    try:
        parts = urlsplit(url.strip() if "://" in url else f"http://{url.strip()}")
    except ValueError:
        return True  # unparsable: do not guess
    return parts.username is not None or parts.password is not None


def _strip_pywin32_dirs(path_value: str) -> str:
    """``Path`` without the ``pywin32_system32`` directory the service launcher prepends for its own DLLs."""
    entries = [entry for entry in path_value.split(";") if entry]
    kept = [entry for entry in entries if ntpath.basename(entry.rstrip("\\/")).lower() != "pywin32_system32"]
    return ";".join(kept)


def windows_session_env(process_env: Mapping[str, str], machine_env: Mapping[str, str]) -> dict[str, str]:
    """What a session inherits on Windows: "the Windows system environment" (docs/fleet-api.md §7.5).

    That is the machine-wide variables (``machine_env``: the registry's system environment, as every new
    process gets it) plus the per-process variables Windows sets (:data:`WINDOWS_PASSTHROUGH` and the
    spawn contract's :data:`PASSTHROUGH`, from ``process_env``, which win). Never the rest of the worker's
    own environment: the service host loads ``worker.env`` (token, proxy, ``DEVIN_*`` options) into it.
    Then, whatever the source, these are dropped: ``DEVIN_*`` (the worker's options; it sets the
    spawn-contract variables itself), names that say they hold a credential (:func:`is_secret_name`), a
    proxy URL with a user name or password in it, and empty values. Names are compared without regard to
    case, as Windows does, and the first spelling seen is kept.
    """
    merged: dict[str, tuple[str, str]] = {}  # upper-case name -> (name as spelt, value)
    for name, value in machine_env.items():
        merged.setdefault(name.upper(), (name, value))
    wanted = {name.upper() for name in PASSTHROUGH + WINDOWS_PASSTHROUGH}
    for name, value in process_env.items():
        upper = name.upper()
        if upper in wanted:
            spelt = merged.get(upper, (name, ""))[0]
            merged[upper] = (spelt, value)
    env: dict[str, str] = {}
    for upper, (name, value) in merged.items():
        if not value or not name or "=" in name or upper.startswith(WORKER_PREFIX) or is_secret_name(upper):
            continue
        if upper in _PROXY_NAMES and _has_credentials(value):
            continue
        if upper == "PATH":
            value = _strip_pywin32_dirs(value)
        env[name] = value
    return env


def windows_state_path(raw: str, *, headroom: int = WINDOWS_STATE_HEADROOM, verbatim: bool = True) -> str:
    r"""A configured Windows directory (state, cache, workdir), checked and spelt for the worker.

    * ``%VAR%`` and ``~`` are expanded by the caller (options.py), never here;
    * it must be absolute: a drive letter and a root (``D:\devin\state``, ``d:/devin/state``) or a UNC
      share (``\\server\share\dir``). ``D:state`` (relative to drive D's current directory) and
      ``\state`` (relative to the current drive) are refused: a service's current drive and directory are
      not the operator's;
    * it is normalised (``/`` to ``\``, ``.`` and ``..`` resolved, the drive letter upper case);
    * when it is so long that a session's files under it would pass ``MAX_PATH``, it gets the ``\\?\``
      (or ``\\?\UNC\``) prefix, which lifts the limit for every file API whatever the machine's
      ``LongPathsEnabled`` setting; an already prefixed path is kept as it is. With ``verbatim=False``
      (a working directory: Windows cannot start a process in a directory of ``MAX_PATH`` or more, prefix
      or not) such a path is refused instead.
    """
    text = raw.strip()
    if text.startswith(_VERBATIM) and verbatim:
        return text
    if "\x00" in text:
        raise ValueError("the path contains a NUL character")
    drive, rest = ntpath.splitdrive(text)
    if not drive or not rest.startswith(("\\", "/")):
        raise ValueError(
            f"{raw!r} is not an absolute Windows path: give a drive and a root (C:\\ProgramData\\...) or a "
            "UNC share (\\\\server\\share\\...)"
        )
    if len(drive) == 2 and drive[1] == ":":
        drive = drive.upper()
    path = ntpath.normpath(drive + rest)
    if len(path) + headroom < WINDOWS_DIR_LIMIT:
        return path
    if not verbatim:
        raise ValueError(
            f"{raw!r} is too long: a working directory must be shorter than {WINDOWS_DIR_LIMIT - headroom} "
            "characters on Windows"
        )
    if path.startswith("\\\\"):
        return _VERBATIM + "UNC\\" + path[2:]
    return _VERBATIM + path


def _import_msvcrt() -> ModuleType:
    if sys.platform == "win32":
        import msvcrt

        return msvcrt
    raise OSError("msvcrt locks exist only on Windows")


def _read_machine_env(registry: Optional[ModuleType] = None) -> dict[str, str]:
    """The registry's system environment, ``REG_EXPAND_SZ`` values expanded as Windows expands them for a
    new process; {} off Windows or when the key cannot be read. ``registry`` stands in for ``winreg``."""
    if registry is None and sys.platform == "win32":
        import winreg

        registry = winreg
    if registry is None:
        return {}
    env: dict[str, str] = {}
    try:
        with registry.OpenKey(registry.HKEY_LOCAL_MACHINE, WINDOWS_ENVIRONMENT_KEY) as key:
            index = 0
            while True:
                try:
                    name, value, kind = registry.EnumValue(key, index)
                except OSError:  # no more values
                    break
                index += 1
                if not isinstance(value, str):
                    continue
                if kind == registry.REG_EXPAND_SZ:
                    env[name] = registry.ExpandEnvironmentStrings(value)
                elif kind == registry.REG_SZ:
                    env[name] = value
    except OSError:
        return {}  # unreadable: the per-process variables alone
    return env


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
            if name.upper() in _PROXY_NAMES and _has_credentials(value):
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


class Windows(HostPlatform):
    """Windows Server and desktop Windows (never run on Windows here: docs/windows-worker.md).

    ``msvcrt_module`` and ``machine_env`` stand in for the real ``msvcrt`` module and the registry's
    system environment in tests on Linux.
    """

    windows = True

    def __init__(
        self,
        system: Optional[str] = "windows",
        machine: Optional[str] = None,
        *,
        msvcrt_module: Optional[ModuleType] = None,
        machine_env: Optional[Callable[[], Mapping[str, str]]] = None,
    ) -> None:
        super().__init__(system, machine)
        self._msvcrt = msvcrt_module
        self._machine_env = machine_env or _read_machine_env

    def inherited_env(self, source: Mapping[str, str]) -> dict[str, str]:
        return windows_session_env(source, self._machine_env())

    def config_path(self, raw: str, *, state: bool = True) -> Path:
        # ntpath.expandvars knows %VAR% as well as $VAR; expanduser uses USERPROFILE.
        text = ntpath.expanduser(ntpath.expandvars(raw.strip()))
        if state:
            return Path(windows_state_path(text))
        return Path(windows_state_path(text, headroom=WINDOWS_WORKDIR_HEADROOM, verbatim=False))

    def process_group_options(self) -> dict[str, Any]:
        return {"creationflags": 0x00000200}  # CREATE_NEW_PROCESS_GROUP: Ctrl-Break reaches only it

    def gated_argv(self, argv: list[str]) -> Optional[list[str]]:
        return None  # no shell to exec from, and no orphan is ever killed here (kill_orphan_group)

    def signal_group(self, proc: Any, pid: int, *, kill: bool) -> None:
        if kill:
            with contextlib.suppress(ProcessLookupError, OSError):
                proc.kill()  # TerminateProcess
            return
        try:
            proc.send_signal(getattr(signal, "CTRL_BREAK_EVENT", signal.SIGTERM))
        except ProcessLookupError:
            pass
        except OSError as exc:
            # GenerateConsoleCtrlEvent needs a console shared with the remote, which a service does not have
            # (docs/windows-worker.md, "What has never run"): the remote is then killed after the grace.
            log.warning(
                "could not send Ctrl-Break to devin-remote pid %d (%s); it will be terminated after the stop "
                "grace period",
                pid,
                exc,
                extra={"pid": pid},
            )

    def kill_orphan_group(self, pgid: int) -> bool:
        return False  # no start time to check a pid against: leave it rather than hit the wrong process

    def process_start_time(self, pid: int) -> Optional[str]:
        return None

    def _locking(self) -> ModuleType:
        return self._msvcrt if self._msvcrt is not None else _import_msvcrt()

    def lock(self, handle: IO[bytes]) -> None:
        # A mandatory byte-range lock on byte 0, taken without waiting (LK_NBLCK; LK_LOCK would retry for
        # 10 s). Windows frees it when the process dies, so a killed worker leaves no stale lock.
        module = self._locking()
        handle.seek(0)
        module.locking(handle.fileno(), module.LK_NBLCK, 1)

    def unlock(self, handle: IO[bytes]) -> None:
        # msvcrt asks for the region to be unlocked before the file is closed; it starts where the file
        # position is, which writing the pid has moved.
        module = self._locking()
        handle.seek(0)
        with contextlib.suppress(OSError):
            module.locking(handle.fileno(), module.LK_UNLCK, 1)

    def make_private(self, path: Path) -> None:
        return  # ACLs on the instance directory are set by the role (docs/windows-worker.md)

    def check_not_shared(self, path: Path) -> None:
        if not path.is_dir():
            raise SharedDirectoryError(f"refusing to use {path}: it is not a directory")

    def fsync_dir(self, path: Path) -> None:
        return  # directories cannot be opened for fsync on Windows; NTFS journals the rename

    def stop_signals(self) -> tuple[int, ...]:
        # SIGBREAK is Ctrl-Break in a console (and what a parent's CTRL_BREAK_EVENT raises); the service
        # host turns SERVICE_CONTROL_STOP/PRESHUTDOWN into the same drain (worker/windows/service.py).
        return tuple(
            getattr(signal, name) for name in ("SIGINT", "SIGBREAK", "SIGTERM") if hasattr(signal, name)
        )


def _detect() -> HostPlatform:
    return Windows() if sys.platform in ("win32", "cygwin") else Posix()


_current: HostPlatform = _detect()


def current() -> HostPlatform:
    """The platform the worker runs on (or the one a test switched to)."""
    return _current


def host_os() -> str:
    """This machine's OS as an outpost platform name: ``linux``, ``macos`` or ``windows``."""
    return current().name


@contextlib.contextmanager
def use(host: HostPlatform) -> Iterator[HostPlatform]:
    """Act as ``host`` inside the block (tests of the other OS's behaviour)."""
    global _current
    previous, _current = _current, host
    try:
        yield host
    finally:
        _current = previous
