r"""The Windows behaviour: :class:`Windows` (never run on Windows here: docs/windows-worker.md), and the
helpers behind it: which variables a session inherits (:func:`windows_session_env`) and how a configured
directory is checked and spelt (:func:`windows_state_path`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ntpath
import signal
import subprocess
import sys
import types
from collections.abc import Awaitable, Mapping
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Callable, Optional

from devin_outposts.core.platform.posix import (
    PASSTHROUGH,
    PROXY_NAMES,
    HostPlatform,
    SharedDirectoryError,
    has_credentials,
    is_secret_name,
)

log = logging.getLogger(__name__)

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
#: Where Windows keeps the machine-wide ("system") environment variables.
WINDOWS_ENVIRONMENT_KEY = r"SYSTEM\CurrentControlSet\Control\Session Manager\Environment"
#: The worker's own configuration (and the spawn-contract names, which the worker sets itself).
WORKER_PREFIX = "DEVIN_"
#: ``CreateDirectoryW`` refuses paths of MAX_PATH (260) minus 12 characters or more without ``\\?\``.
WINDOWS_DIR_LIMIT = 248
#: What the worker appends to its data directory: ``\sessions\`` + an id of up to 100 characters (paths.py)
#: + ``\.remote.pid.tmp``, with room to spare. A data directory longer than the limit minus this gets
#: the ``\\?\`` prefix.
WINDOWS_STATE_HEADROOM = 140
#: A working directory holds ``slot-<n>\repos\<repo>``; it cannot have the prefix at all.
WINDOWS_WORKDIR_HEADROOM = 48
_VERBATIM = "\\\\?\\"

# Process creation (winbase.h), so that the options are built and tested without the Windows API.
CREATE_NEW_CONSOLE = 0x00000010
DETACHED_PROCESS = 0x00000008
STARTF_USESHOWWINDOW = 0x00000001
SW_HIDE = 0
#: Seconds the Ctrl-C helper (:mod:`.console_stop`) may take: a Python start-up, slower under Wine.
CONSOLE_STOP_TIMEOUT = 20.0

#: Runs the Ctrl-C helper's command line: (exit code, its last stderr line).
ConsoleHelper = Callable[[list[str]], Awaitable[tuple[int, str]]]


def hidden_console_startupinfo() -> Any:
    """``STARTUPINFO`` that keeps the console a remote gets (``CREATE_NEW_CONSOLE``) out of sight; off
    Windows (tests) a plain object with the same two fields."""
    startupinfo: Any = getattr(subprocess, "STARTUPINFO", types.SimpleNamespace)
    return startupinfo(dwFlags=STARTF_USESHOWWINDOW, wShowWindow=SW_HIDE)


def console_stop_argv(pid: int) -> list[str]:
    """The helper's command line: the base interpreter (a venv's ``python.exe`` is a launcher that
    would start it as a child of its own) running :mod:`.console_stop` by path, isolated."""
    from devin_outposts.core.platform import console_stop

    python = getattr(sys, "_base_executable", None) or sys.executable
    return [python, "-I", str(Path(console_stop.__file__)), str(pid)]


async def run_console_helper(argv: list[str]) -> tuple[int, str]:
    """Run the Ctrl-C helper without a console (``DETACHED_PROCESS``, so that it may attach to the
    remote's); its exit code and last stderr line. ``asyncio.TimeoutError`` after
    :data:`CONSOLE_STOP_TIMEOUT` (the helper is killed)."""
    helper = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        creationflags=DETACHED_PROCESS,
    )
    try:
        dummy, err = await asyncio.wait_for(helper.communicate(), CONSOLE_STOP_TIMEOUT)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError, OSError):
            helper.kill()
        await helper.wait()
        raise
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return helper.returncode if helper.returncode is not None else -1, (lines[-1][:500] if lines else "")


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
        if upper in PROXY_NAMES and has_credentials(value):
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


class Windows(HostPlatform):
    """Windows Server and desktop Windows (never run on Windows here: docs/windows-worker.md).

    ``msvcrt_module``, ``machine_env`` and ``console_helper`` stand in for the real ``msvcrt`` module,
    the registry's system environment and the Ctrl-C helper's process in tests on Linux.
    """

    windows = True

    def __init__(
        self,
        system: Optional[str] = "windows",
        machine: Optional[str] = None,
        *,
        msvcrt_module: Optional[ModuleType] = None,
        machine_env: Optional[Callable[[], Mapping[str, str]]] = None,
        console_helper: Optional[ConsoleHelper] = None,
    ) -> None:
        super().__init__(system, machine)
        self._msvcrt = msvcrt_module
        self._machine_env = machine_env or _read_machine_env
        self._console_helper = console_helper or run_console_helper

    def inherited_env(self, source: Mapping[str, str]) -> dict[str, str]:
        return windows_session_env(source, self._machine_env())

    def config_path(self, raw: str, *, state: bool = True) -> Path:
        # ntpath.expandvars knows %VAR% as well as $VAR; expanduser uses USERPROFILE.
        text = ntpath.expanduser(ntpath.expandvars(raw.strip()))
        if state:
            return Path(windows_state_path(text))
        return Path(windows_state_path(text, headroom=WINDOWS_WORKDIR_HEADROOM, verbatim=False))

    def process_group_options(self) -> dict[str, Any]:
        # A hidden console of its own: the Ctrl-C helper attaches to it and reaches the remote and what it
        # started (the whole console), even from a service, which has no console to share with the remote.
        # No CREATE_NEW_PROCESS_GROUP: it would turn Ctrl-C off in the remote (see console_stop.py).
        return {"creationflags": CREATE_NEW_CONSOLE, "startupinfo": hidden_console_startupinfo()}

    def gated_argv(self, argv: list[str]) -> Optional[list[str]]:
        return None  # no shell to exec from, and no orphan is ever killed here (kill_orphan_group)

    async def request_stop(self, proc: Any, pid: int) -> bool:
        """Ctrl-C to the remote's own console, through the helper attached to it
        (:mod:`.console_stop`). Never ``os.kill``: without a shared console CPython raises
        ``SystemError`` and terminates the remote at once. A failure is logged, once, and the caller
        terminates the remote after the grace period."""
        try:
            code, detail = await self._console_helper(console_stop_argv(pid))
        except asyncio.TimeoutError:
            code, detail = -1, f"the helper did not finish in {CONSOLE_STOP_TIMEOUT:.0f}s"
        except OSError as exc:
            code, detail = -1, f"the helper could not be started: {exc}"
        if code == 0 or getattr(proc, "returncode", None) is not None:
            return True  # sent, or there was no one left to send it to (the remote exited meanwhile)
        log.warning(
            "could not send Ctrl-C to the console of devin-remote pid %d (%s); it will be terminated after "
            "the stop grace period",
            pid,
            detail or f"the helper exited with {code}",
            extra={"pid": pid},
        )
        return False

    def signal_group(self, proc: Any, pid: int, *, kill: bool) -> None:
        # Only the forced stop happens here (TerminateProcess, the remote alone). The graceful request is
        # request_stop: a helper process the worker awaits.
        if kill and proc is not None:
            with contextlib.suppress(ProcessLookupError, OSError):
                proc.kill()

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
