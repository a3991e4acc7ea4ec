"""The account token from a file descriptor or a file, so that it is never in a long-lived environment.

``DEVIN_OUTPOSTS_TOKEN`` in the environment of ``worker start`` or ``orchestrate`` can be read through
``/proc/<pid>/environ`` by every process of the same user until the process hides it, and the interpreter
has to start first (docs/security.md, "What a session can reach"). Two other ways keep it out of the
environment:

* ``DEVIN_OUTPOSTS_TOKEN_FD=N``: read the token from the open file descriptor *N* to its end, then close
  it (0, 1 and 2 are pointed at ``/dev/null`` instead). With systemd, ``StandardInput=file:/etc/...token``
  has the service manager open a root-owned 0600 file and hand it over as standard input: the service's
  user, and so its sessions, can never open the file, and the token is in no environment.
* ``DEVIN_OUTPOSTS_TOKEN_FILE=PATH``: read a file that only its owner can read or write (mode 0600 or
  0400) and that belongs to this user or root; anything else is refused. Sessions run as the worker's
  user and can read such a file too: prefer the descriptor where they run on the same machine.

At most one of ``DEVIN_OUTPOSTS_TOKEN``, ``DEVIN_OUTPOSTS_TOKEN_FD`` and ``DEVIN_OUTPOSTS_TOKEN_FILE`` may
be set. Once read from ``os.environ``, the two variables are removed from it, so that nothing this process
starts inherits a pointer to its standard input.

:func:`read_token` is the one reader of the account token in this package: both programs' option tables
(through :func:`devin_outposts.core.config.account_token`) and the command line's outpost verbs use it.
A worker in direct-serve mode (``DEVIN_REMOTE_SESSION_TOKEN`` set: it serves one session that was claimed
for it, and needs no account token) reads the plain variable only, never a descriptor or a file that was
meant for something else.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping
from typing import Optional

ENV_TOKEN = "DEVIN_OUTPOSTS_TOKEN"  # noqa: S105 - a variable name, not a secret
ENV_TOKEN_FD = "DEVIN_OUTPOSTS_TOKEN_FD"  # noqa: S105
ENV_TOKEN_FILE = "DEVIN_OUTPOSTS_TOKEN_FILE"  # noqa: S105
#: Direct-serve mode's connect token: with it set, no descriptor or file is read (see above).
ENV_DIRECT_TOKEN = "DEVIN_REMOTE_SESSION_TOKEN"  # noqa: S105
#: The most bytes read for a token (tokens are well under 1 KiB).
MAX_TOKEN_BYTES = 64 << 10


class TokenSourceError(ValueError):
    """The token's descriptor or file cannot be used; the message names the variable."""


def read_token(environ: Mapping[str, str]) -> Optional[str]:
    """The account token: from ``DEVIN_OUTPOSTS_TOKEN_FD`` or ``DEVIN_OUTPOSTS_TOKEN_FILE``
    (:func:`token_from_source`), else ``DEVIN_OUTPOSTS_TOKEN`` (surrounding white space ignored); None when
    none is set. In direct-serve mode only the variable is read. :class:`TokenSourceError` as
    :func:`token_from_source` raises it."""
    if not environ.get(ENV_DIRECT_TOKEN, "").strip():
        from_source = token_from_source(environ)
        if from_source is not None:
            return from_source
    return environ.get(ENV_TOKEN, "").strip() or None


def token_from_source(environ: Mapping[str, str]) -> Optional[str]:
    """The token from ``DEVIN_OUTPOSTS_TOKEN_FD`` or ``DEVIN_OUTPOSTS_TOKEN_FILE``; None when neither is
    set. :class:`TokenSourceError` when more than one source is set, or the one set is unusable."""
    fd_text = environ.get(ENV_TOKEN_FD, "").strip()
    path = environ.get(ENV_TOKEN_FILE, "").strip()
    values = {ENV_TOKEN: environ.get(ENV_TOKEN, "").strip(), ENV_TOKEN_FD: fd_text, ENV_TOKEN_FILE: path}
    given = [name for name, value in values.items() if value]
    if len(given) > 1:
        raise TokenSourceError(f"set only one of {', '.join(given)}")
    if fd_text:
        token = _from_fd(fd_text)
    elif path:
        token = _from_file(path)
    else:
        return None
    if environ is os.environ:  # what this process's children would inherit
        os.environ.pop(ENV_TOKEN_FD, None)
        os.environ.pop(ENV_TOKEN_FILE, None)
    return token


def _from_fd(text: str) -> str:
    try:
        fd = int(text)
    except ValueError:
        raise TokenSourceError(f"{ENV_TOKEN_FD} must be a file descriptor number, got {text!r}") from None
    if fd < 0:
        raise TokenSourceError(f"{ENV_TOKEN_FD} must be a file descriptor number, got {text!r}")
    try:
        data = _read_all(fd)
    except OSError as exc:
        raise TokenSourceError(f"{ENV_TOKEN_FD}={fd}: cannot read it: {exc.strerror or exc}") from exc
    finally:
        _release(fd)
    return _token(data, f"{ENV_TOKEN_FD}={fd}")


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > MAX_TOKEN_BYTES:
            raise OSError(f"more than {MAX_TOKEN_BYTES} bytes")
        chunks.append(chunk)


def _release(fd: int) -> None:
    """Close ``fd``; a standard descriptor is pointed at /dev/null instead, so nothing opened later takes
    its number (and a child's standard input is never the token)."""
    try:
        if fd <= 2:
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
        else:
            os.close(fd)
    except OSError:
        pass


#: Every token file this process read (absolute paths): hidden from the sessions it confines.
FILES_READ: set[str] = set()


def _from_file(path: str) -> str:
    where = f"{ENV_TOKEN_FILE}={path}"
    FILES_READ.add(os.path.abspath(path))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TokenSourceError(f"{where}: cannot open it: {exc.strerror or exc}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise TokenSourceError(f"{where}: not a regular file")
        if sys.platform != "win32":
            if info.st_mode & 0o077:
                raise TokenSourceError(
                    f"{where}: other users may read or write it (mode {stat.S_IMODE(info.st_mode):04o}); "
                    "chmod 600 it"
                )
            if info.st_uid not in (os.geteuid(), 0):
                raise TokenSourceError(f"{where}: it belongs to another user (uid {info.st_uid})")
        try:
            data = _read_all(fd)
        except OSError as exc:
            raise TokenSourceError(f"{where}: cannot read it: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return _token(data, where)


def _token(data: bytes, where: str) -> str:
    try:
        token = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise TokenSourceError(f"{where}: the token is not text") from None
    if not token:
        raise TokenSourceError(f"{where}: it holds no token")
    if any(c.isspace() for c in token):
        raise TokenSourceError(f"{where}: it holds more than one word (give the token alone)")
    return token
