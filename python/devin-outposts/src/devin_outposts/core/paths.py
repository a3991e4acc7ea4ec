"""Turning server-provided ids into file-system paths without letting them escape their parent.

Session ids come from the fleet API, and a hostile or buggy server must not be able to make the worker
write outside its data directory (``../../etc``), into a dot-file, onto a Windows device name, or through
a planted symlink. :func:`safe_component` maps any id to one safe path component:

* an id of ``[A-Za-z0-9][A-Za-z0-9._-]*`` up to :data:`MAX_COMPONENT` characters, that is not a Windows
  reserved device name and does not end in a dot, is used unchanged (real ids such as
  ``devin-0123abcd`` are readable on disk);
* anything else is *encoded*: the allowed characters are kept, the rest become ``_``, the result is cut
  short and a hash of the original id is appended. Encoded names always start with ``_``, which unchanged
  names never do, so two different ids can never share a directory.

:func:`child_dir` then joins the component to its parent, refuses a symlink in its place and checks that
the resolved path is directly inside the resolved parent.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from devin_outposts.core import platform
from devin_outposts.core.platform import SharedDirectoryError

MAX_COMPONENT = 100
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_DISALLOWED = re.compile(r"[^A-Za-z0-9._-]")
_WINDOWS_RESERVED = frozenset(
    ["CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"]
    + [f"COM{i}" for i in range(10)]
    + [f"LPT{i}" for i in range(10)]
)


class UnsafePathError(ValueError):
    """A path built from a server-provided id would leave its parent directory."""


def _is_plain(value: str) -> bool:
    if len(value) > MAX_COMPONENT or not _PLAIN.fullmatch(value) or value.endswith("."):
        return False
    return value.split(".", 1)[0].upper() not in _WINDOWS_RESERVED


def safe_component(value: str) -> str:
    """A single, safe path component for ``value`` (unchanged when it already is one)."""
    if _is_plain(value):
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    readable = _DISALLOWED.sub("_", value).strip("._")[:48]
    return f"_{readable}_{digest}" if readable else f"_{digest}"


def child_dir(parent: Path, value: str) -> Path:
    """``parent / safe_component(value)``, verified to stay directly inside ``parent``.

    Raises :class:`UnsafePathError` when the child exists as a symlink or would resolve elsewhere.
    """
    base = parent.resolve()
    child = base / safe_component(value)
    if os.path.islink(child):
        raise UnsafePathError(f"refusing to use {child}: it is a symlink")
    resolved = child.resolve()
    if resolved.parent != base:
        raise UnsafePathError(f"refusing to use {child}: it resolves outside {base}")
    return resolved


def make_private_dir(path: Path) -> Path:
    """Create ``path`` for the worker alone, or check the directory that is already there.

    Only a directory this call creates is made private. One that exists may be shared (``/tmp``, a home
    directory) and is not ours to change: it is refused when another user could write to it or owns it
    (:meth:`~devin_outposts.core.platform.HostPlatform.check_not_shared`). Missing parents are created
    with the default mode, like ``mkdir -p``.
    """
    try:
        path.mkdir(mode=0o700)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return make_private_dir(path)
    except FileExistsError:
        platform.current().check_not_shared(path)
        return path
    platform.current().make_private(path)  # we created it: private whatever the umask
    return path


__all__ = ["SharedDirectoryError", "UnsafePathError", "child_dir", "make_private_dir", "safe_component"]
