"""The ansible driver's own files under ``<state_dir>/ansible/``: one record per machine, and the sweep of
what runs left behind.

Playbook-made hosts carry no labels the driver could query, so it keeps one record per machine in
``machines/<name>.json`` (0600 files in a 0700 directory): the session it is for, the host the provision
playbook reported and that host's connection variables. :meth:`~.driver.AnsibleDriver.list_owned` reads
them; a record is written before the provision playbook runs, so a host it half made is still found and
torn down.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

from devin_outposts.orchestrator.drivers.base import DriverError, Machine


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner may enter (made if missing)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def machine_of(record: Mapping[str, Any]) -> Machine:
    """The machine a record describes (``ref``: its host, once the provision playbook reported one)."""
    return Machine(
        name=str(record["name"]),
        session_id=str(record["session_id"]),
        outpost_id=str(record["outpost_id"]),
        acceptor_id=str(record["acceptor_id"]),
        created_at=float(record["created_at"]),
        ref=str(record.get("host") or ""),
        details={"host": record.get("host"), "host_vars": dict(record.get("host_vars") or {})},
    )


class MachineRecords:
    """The records in ``<root>/machines/``, one JSON file per machine name."""

    def __init__(self, root: Path) -> None:
        self.directory = root / "machines"

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.json"

    def read(self, name: str) -> Optional[dict[str, Any]]:
        """The record of machine ``name``, or None when there is none."""
        try:
            data = json.loads(self.path(name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise DriverError(f"Could not read the record of machine {name}: {exc}") from None
        return data if isinstance(data, dict) else None

    def require(self, machine: Machine, what: str) -> dict[str, Any]:
        """The record of a provisioned machine (one with a host); ``what`` words the error."""
        record = self.read(machine.name)
        if record is None or not record.get("host"):
            raise DriverError(
                f"Could not {what} machine {machine.name}: it was not provisioned (no record or no host)"
            )
        return record

    def write(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` whole (a temporary file, then a rename), 0600 from its creation on."""
        path = self.path(str(record["name"]))
        private_dir(path.parent)
        temporary = path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=1)
        os.replace(temporary, path)

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(name).unlink()

    def owned(self, acceptor_id: str, outpost_id: str) -> list[dict[str, Any]]:
        """The records of ``acceptor_id`` on ``outpost_id``, by machine name."""
        return [record for record in self.of_acceptor(acceptor_id) if record["outpost_id"] == outpost_id]

    def of_acceptor(self, acceptor_id: str, *, skip_unreadable: bool = False) -> list[dict[str, Any]]:
        """The records of ``acceptor_id`` on every outpost, by machine name. ``skip_unreadable``: a record
        that cannot be read is left out instead of raising (a listing that comes again soon)."""
        found = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else ():
            try:
                record = self.read(path.stem)
            except DriverError:
                if skip_unreadable:
                    continue
                raise
            if record and record["acceptor_id"] == acceptor_id:
                found.append(record)
        return found


def sweep_files(directories: Iterable[Path], older_than: float) -> int:
    """Remove the entries of ``directories`` not changed for ``older_than`` seconds; returns how many."""
    removed = 0
    now = time.time()
    for directory in directories:
        for path in directory.iterdir() if directory.is_dir() else ():
            with contextlib.suppress(FileNotFoundError):
                if now - path.stat().st_mtime < older_than:
                    continue
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink()
                removed += 1
    return removed
