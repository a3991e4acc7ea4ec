r"""Everything the worker and the orchestrator do differently per operating system, in one place.

The rest of the worker asks :func:`current` instead of testing ``os.name`` or ``sys.platform``:

* the OS as an outpost platform name, and the ``devin-remote`` build suffix (docs/fleet-api.md §8);
* keeping the worker's own environment (its token) from the sessions of its user
  (:meth:`HostPlatform.hide_environment`);
* which variables a session inherits (§6.2, plus proxy URLs without credentials; on Windows the system
  environment, §7.5, minus anything that looks like a secret: :func:`windows_session_env`);
* how a configured directory is checked and spelled (Windows: drive letters, UNC shares, and the ``\\?\``
  prefix for paths that would pass ``MAX_PATH``: :func:`windows_state_path`);
* how a remote is started in a process group of its own (on Windows: a hidden console of its own), and how
  it is stopped: asked (:meth:`HostPlatform.request_stop`: SIGTERM; on Windows Ctrl-C to its console
  through the helper :mod:`.console_stop`), then killed after the grace period;
* the exclusive, non-blocking file lock behind the data-dir and workdir locks (``flock``; ``msvcrt.locking``
  on Windows, unlocked explicitly before the file is closed);
* directory privacy (POSIX modes; on Windows the role sets ACLs) and directory fsync;
* how SIGTERM/SIGINT (POSIX) or Ctrl-Break/Ctrl-C (Windows console, and the service host) reach the
  worker;
* the kernel start time of a process, to tell an orphaned remote from a reused pid (Linux only).

:class:`Posix` and :class:`Windows` are plain classes, so tests on Linux can switch to the Windows
behaviour with :func:`use` and check environment building, suffixes, paths, locks and signal mapping.
What calls a Windows API (``msvcrt``, ``winreg``, the Ctrl-C helper's process and its ``kernel32``) is
reached through a module or a callable the :class:`Windows` constructor (or :func:`.console_stop.main`)
accepts, so tests hand it fakes; on Linux nothing of it runs against the real API (docs/windows-worker.md,
"What has run, and what has not"; the Wine stage runs it).

:mod:`.posix` holds :class:`HostPlatform` (the POSIX behaviour) and :class:`Posix`; :mod:`.windows` holds
:class:`Windows` and its helpers; :mod:`.console_stop` is the Ctrl-C helper, a stdlib-only script. Import
them from here.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from devin_outposts.core.platform.posix import (
    DESKTOP_PASSTHROUGH,
    PASSTHROUGH,
    PROXY_PASSTHROUGH,
    SECRET_NAME,
    HostPlatform,
    Posix,
    SharedDirectoryError,
    UnsupportedHost,
    is_secret_name,
)
from devin_outposts.core.platform.windows import (
    WINDOWS_DIR_LIMIT,
    WINDOWS_ENVIRONMENT_KEY,
    WINDOWS_PASSTHROUGH,
    WINDOWS_STATE_HEADROOM,
    WINDOWS_WORKDIR_HEADROOM,
    WORKER_PREFIX,
    Windows,
    windows_session_env,
    windows_state_path,
)

__all__ = [
    "DESKTOP_PASSTHROUGH",
    "PASSTHROUGH",
    "PROXY_PASSTHROUGH",
    "SECRET_NAME",
    "WINDOWS_DIR_LIMIT",
    "WINDOWS_ENVIRONMENT_KEY",
    "WINDOWS_PASSTHROUGH",
    "WINDOWS_STATE_HEADROOM",
    "WINDOWS_WORKDIR_HEADROOM",
    "WORKER_PREFIX",
    "HostPlatform",
    "Posix",
    "SharedDirectoryError",
    "UnsupportedHost",
    "Windows",
    "current",
    "host_os",
    "is_secret_name",
    "use",
    "windows_session_env",
    "windows_state_path",
]


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
