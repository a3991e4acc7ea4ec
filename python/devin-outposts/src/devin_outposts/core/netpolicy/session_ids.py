"""The uid and gid each confined session of a **root** worker runs as (docs/network-policy.md, "Who a session
is").

A session confined by a root worker must not keep root's power over the host's files (``/etc/shadow``, the
worker's own installation). So it runs as a uid and gid of its own, leased for as long as it runs from a
range nobody else uses:

* ``--session-uid-range START-END`` (``DEVIN_WORKER_SESSION_UID_RANGE``), the same numbers as gids; else
* root's subordinate ranges in ``/etc/subuid`` and ``/etc/subgid`` (the ones ``usermod --add-subuids``
  writes; the first range of each).

No range: the worker refuses sessions whose policy is enforced, with one line saying how to fix it. A lease
is an exclusive ``flock`` on ``/run/devin-outposts/session-ids/<uid>``: every root worker of the host takes
its ids there, and a worker killed with ``kill -9`` gives its leases back by dying. A uid that any process
still runs as (a session left by such a worker, before its successor stopped it) is skipped.

A non-root worker's sessions run as the worker's own uid: it has no other to give them. They are kept
apart by namespaces instead (docs/network-policy.md says what that leaves shared).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, Optional

LOCK_DIR = Path("/run/devin-outposts/session-ids")
SUBUID, SUBGID = Path("/etc/subuid"), Path("/etc/subgid")
#: Ids below this are never given to a session (system users and the usual human ones).
LOWEST = 65536


class IdRangeError(ValueError):
    """A range that cannot be used (said in one line)."""


class IdRange(NamedTuple):
    """``size`` uids from ``uid``, and as many gids from ``gid``."""

    uid: int
    gid: int
    size: int

    def describe(self) -> str:
        return f"uids {self.uid}-{self.uid + self.size - 1}, gids {self.gid}-{self.gid + self.size - 1}"


class Lease:
    """One session's ids, held until :meth:`release` (or the worker's death)."""

    def __init__(self, uid: int, gid: int, lock: int) -> None:
        self.uid, self.gid = uid, gid
        self._lock: Optional[int] = lock

    def release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def parse_range(text: str) -> IdRange:
    """``START-END`` (inclusive), both at or above :data:`LOWEST`."""
    first, dash, last = text.strip().partition("-")
    try:
        start, end = int(first), int(last)
    except ValueError:
        raise IdRangeError(f"{text!r} is not START-END") from None
    if not dash or end < start:
        raise IdRangeError(f"{text!r} is not START-END with END >= START")
    if start < LOWEST or end > 0xFFFFFFFE:
        raise IdRangeError(f"{text!r}: session ids must lie within {LOWEST}-4294967294")
    return IdRange(start, start, end - start + 1)


def configured_range(option: Optional[str], user: str = "root") -> Optional[IdRange]:
    """The range to lease from: the option's, else ``user``'s first subordinate ranges (uid and gid), else
    None."""
    if option:
        return parse_range(option)
    uids, gids = _subordinate(SUBUID, user), _subordinate(SUBGID, user)
    if uids is None or gids is None:
        return None
    count = min(uids[1], gids[1])
    if uids[0] < LOWEST or gids[0] < LOWEST or count < 1:
        return None
    return IdRange(uids[0], gids[0], count)


def lease(id_range: IdRange, lock_dir: Path = LOCK_DIR) -> Lease:
    """The first free ids of the range; :class:`IdRangeError` when all are taken."""
    if sys.platform == "win32":
        raise IdRangeError("session ids are leased on POSIX hosts only")
    else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
        import fcntl

        lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        busy = _uids_in_use()
        for offset in range(id_range.size):
            uid, gid = id_range.uid + offset, id_range.gid + offset
            if uid in busy:
                continue
            descriptor = os.open(lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                continue
            return Lease(uid, gid, descriptor)
        raise IdRangeError(f"every id of the session range ({id_range.describe()}) is in use")


def _subordinate(path: Path, user: str) -> Optional[tuple[int, int]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        words = line.strip().split(":")
        if len(words) == 3 and words[0] in (user, str(_uid_of(user))):
            try:
                return int(words[1]), int(words[2])
            except ValueError:
                continue
    return None


def _uid_of(user: str) -> int:
    if sys.platform == "win32":
        return -1
    else:  # an else, so that neither of mypy's platform passes calls the rest unreachable
        import pwd

        try:
            uid: int = pwd.getpwnam(user).pw_uid
        except KeyError:
            return -1
        return uid


def _uids_in_use() -> set[int]:
    """Every real, effective, saved and file-system uid a process of this host runs with."""
    found: set[int] = set()
    for status in _statuses():
        for line in status.splitlines():
            if line.startswith("Uid:"):
                found.update(int(word) for word in line.split()[1:])
                break
    return found


def _statuses() -> Iterator[str]:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                yield Path(entry.path, "status").read_text()
            except OSError:
                continue
