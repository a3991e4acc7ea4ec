"""Worker identity: the persisted acceptor id and the locks that keep two workers apart.

The acceptor id is the worker's name in every claim, renewal and restart recovery, so it must be stable
across restarts and never shared by two running workers (docs/fleet-api.md §1 and §5.5):

* it is generated once (``<host>-<12 hex>``) and stored in ``<data>/acceptor_id`` with mode 0600, then
  reused on every start;
* the data directory is locked with an exclusive, non-blocking ``flock`` on ``<data>/worker.lock`` for the
  whole life of the worker, so a second worker on the same data directory (and therefore the same stored
  id) refuses to start with one clear line instead of fighting over claims;
* the working directory is locked the same way (``<workdir>/.devin-outposts-worker.lock``), because two
  workers sharing checkouts race on them.

The kernel drops an ``flock`` when its process dies, so a ``kill -9`` never leaves a stale lock behind. On
Windows the lock is an ``msvcrt.locking`` byte-range lock on byte 0 (the platform module), which Windows also
drops with the process; :meth:`FileLock.release` unlocks it before closing, as msvcrt asks.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from pathlib import Path
from typing import IO, Optional

from devin_outposts.core import platform
from devin_outposts.core.paths import make_private_dir

ACCEPTOR_FILE = "acceptor_id"
DATA_LOCK_FILE = "worker.lock"
WORKDIR_LOCK_FILE = ".devin-outposts-worker.lock"
_ACCEPTOR_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


class LockedError(RuntimeError):
    """Another worker already holds the lock."""


class IdentityError(ValueError):
    """The stored or given acceptor id is unusable."""


def validate_acceptor_id(value: str) -> str:
    text = value.strip()
    if not _ACCEPTOR_RE.fullmatch(text):
        raise IdentityError(
            f"invalid acceptor id {value!r}: use 1-128 characters of letters, digits and . _ : @ -, "
            "starting with a letter or digit"
        )
    return text


def generate_acceptor_id() -> str:
    host = re.sub(r"[^a-z0-9-]", "-", socket.gethostname().lower()).strip("-")[:40] or "worker"
    return f"{host}-{uuid.uuid4().hex[:12]}"


def load_or_create_acceptor_id(data_dir: Path) -> str:
    """The acceptor id stored in ``data_dir``, generating and storing one (0600) on first use."""
    make_private_dir(data_dir)
    path = data_dir / ACCEPTOR_FILE
    try:
        return validate_acceptor_id(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        pass
    except IdentityError as exc:
        raise IdentityError(f"{path}: {exc}; delete the file to generate a new id") from exc
    acceptor_id = generate_acceptor_id()
    tmp = path.with_name(f".{ACCEPTOR_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, f"{acceptor_id}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    platform.current().make_private(tmp)
    try:
        # link() fails if another process created the file meanwhile: then its id wins.
        os.link(tmp, path)
    except FileExistsError:
        return validate_acceptor_id(path.read_text(encoding="utf-8"))
    except OSError:
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return acceptor_id


class FileLock:
    """An exclusive, non-blocking lock on a file, held until :meth:`release` or process exit."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._handle: Optional[IO[bytes]] = None

    def acquire(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+b")  # noqa: SIM115 - kept open while the lock is held
        try:
            platform.current().lock(handle)
        except OSError as exc:
            handle.close()
            raise LockedError(
                f"another worker is already using {self.what} {self.path.parent} (lock {self.path} is "
                "held); give each worker its own --cache-dir and --workdir"
            ) from exc
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n".encode())
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            try:
                platform.current().unlock(self._handle)  # Windows wants it before the close
            finally:
                self._handle.close()  # closing drops an flock
                self._handle = None

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()
