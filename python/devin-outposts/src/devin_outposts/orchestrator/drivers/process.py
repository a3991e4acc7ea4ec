"""The ``process`` driver: each session's worker is a local process in a directory of its own.

For tests, demos and single machines: no isolation beyond a directory and a process group, so run it
only where every session may see every other. A machine is ``<root>/machines/<name>/``:

* ``machine.json``: its labels (session, outpost, acceptor id) and creation time, so a restarted
  orchestrator finds it again;
* ``worker/``: the worker's data dir (its ``cache/`` and the session's state dir) and ``repos/``, its
  working directory: the two things a snapshot keeps;
* ``worker.pid``: the process group leader's pid and start time (a reused pid is never signalled),
  written by the leader (``sh``) itself before it runs the worker, so that no worker runs unrecorded even
  if the orchestrator is killed right after starting it; ``worker.exit``: its exit code, written by the
  leader too, so that an orchestrator that did not start the worker (it restarted meanwhile) still learns
  how it ended (``exec-failed <code>`` when the worker command could not be run at all: missing, not
  executable); ``worker.log``: its output.

The worker runs ``<worker_command> worker start --session=<id>`` in direct-serve mode. Its environment is
built from scratch: ``PATH HOME USER LOGNAME LANG TZ TMPDIR`` and the launch's variables; the connect
token is in the environment only, never in argv. Each worker leads its own session (``setsid``), so it
outlives an orchestrator that is stopped or killed; teardown stops it (SIGTERM twice: the worker then
stops its ``devin-remote`` at once; SIGKILL after the grace) and removes the directory.

Snapshots move ``worker/`` and ``repos/`` to ``<root>/snapshots/<name>/``; restore moves them back.

Status: each worker's end is awaited (a pidfd, or a thread where there is none), not read on a timer, and
reported to the driver's status source, which also lists every machine now and then
(:mod:`.process_status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

from devin_outposts.core import platform
from devin_outposts.core.paths import make_private_dir
from devin_outposts.core.processes import process_alive, reap_stale_remote
from devin_outposts.orchestrator.drivers.base import (
    MACHINE_DATA_DIR,
    MACHINE_WORKDIR,
    Driver,
    DriverContext,
    DriverError,
    DriverOption,
    Machine,
    OptionKind,
    OptionTable,
    SessionSpec,
    Snapshot,
    WorkerLaunch,
    WorkerState,
    WorkerStatus,
    machine_name,
    name_taken,
)
from devin_outposts.orchestrator.drivers.process_status import (
    ADOPTED_POLL,
    RECONCILE_INTERVAL,
    ProcessStatusSource,
    child_ended,
    open_pidfd,
    readable,
)

META = "machine.json"
PIDFILE = "worker.pid"
EXITFILE = "worker.exit"
LOGFILE = "worker.log"
SNAPSHOT_META = "snapshot.json"
#: The worker's ``--session-hide`` and ``--session-uid-range`` (worker/options.py): what a confined session
#: must not see, and a root worker's ids for its sessions.
ENV_SESSION_HIDE, ENV_SESSION_UID_RANGE = "DEVIN_WORKER_SESSION_HIDE", "DEVIN_WORKER_SESSION_UID_RANGE"
#: What a worker's environment may take from ours (the rest is the launch's own variables).
PASSTHROUGH = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR")
#: The group leader. It records its own pid (and, on Linux, its start time, field 22 of /proc/<pid>/stat)
#: *before* it runs the worker, so no worker ever runs without a record: an orchestrator killed the moment
#: after it started one leaves its successor a record to adopt the worker by. Then it runs the worker and
#: records its exit code, or ``exec-failed <code>`` when sh could not run the worker command at all (126 or
#: 127 and the command is not a runnable file: a worker's own exit 127 stays an exit). Both records are
#: written atomically (a temporary file, then mv).
WRAPPER = (
    'st=$(s=$(cat "/proc/$$/stat" 2>/dev/null) && set -- ${s##*") "} && shift 19 && printf %s "$1"); '
    'if [ -n "$st" ]; then rec=$(printf \'{"pid": %s, "started": "%s"}\' "$$" "$st"); '
    'else rec=$(printf \'{"pid": %s, "started": null}\' "$$"); fi; '
    'printf "%s" "$rec" > worker.pid.tmp && mv worker.pid.tmp worker.pid || exit 70; '
    '"$@"; code=$?; rec=$code; '
    'if [ "$code" -eq 126 ] || [ "$code" -eq 127 ]; then case $1 in */*) [ -f "$1" ] && [ -x "$1" ];; '
    '*) command -v -- "$1" >/dev/null 2>&1;; esac || rec="exec-failed $code"; fi; '
    'printf "%s" "$rec" > worker.exit.tmp && mv worker.exit.tmp worker.exit; exit "$code"'
)
#: The reason a worker that could not be run is FAILED with (docs/orchestrator.md, "Fast failure").
EXEC_FAILED = "exec-failed"
OPTIONS = OptionTable(
    "process",
    DriverOption(
        "root",
        OptionKind.PATH,
        "the directory of the machines and the snapshots",
        default_doc="`<state-dir>/process`",
    ),
    DriverOption(
        "worker_command",
        OptionKind.WORDS,
        "the worker command, before `worker start --session=<id>` (shell words)",
        default_doc="this Python's `-m devin_outposts`",
    ),
    DriverOption(
        "stop_grace",
        OptionKind.SECONDS,
        "seconds between SIGTERM and SIGKILL when a worker is stopped",
        default=10.0,
    ),
    DriverOption(
        "reconcile_interval",
        OptionKind.SECONDS,
        "seconds between two listings of every machine by the status source (workers' starts and ends "
        "reach it at once: the listing is a safety net)",
        default=RECONCILE_INTERVAL,
        above=0,
    ),
)


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _runnable(command: str) -> bool:
    return shutil.which(command) is not None or os.path.isfile(command)


def _spawn(argv: list[str], cwd: Path, env: Mapping[str, str], log_fd: int) -> subprocess.Popen[bytes]:
    """Start a worker's group leader. A plain Popen, not asyncio's (which forks alike): its end is awaited
    by :func:`.process_status.child_ended`, with a pidfd where there is one, instead of by asyncio 3.11's
    child watcher and its one thread per child."""
    return subprocess.Popen(  # noqa: S603 (our own sh wrapper and the configured worker command)
        argv,
        cwd=str(cwd),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=log_fd,
        start_new_session=True,
    )


def _zombie(pid: int) -> bool:
    """``pid`` ended and waits to be reaped (Linux ``/proc``; elsewhere never said). An adopted worker's
    end is seen before whoever reaps it (init, a subreaper) has done so."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = text.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] == "Z"


class ProcessDriver(Driver):
    name = "process"
    option_table = OPTIONS

    def __init__(
        self,
        root: Path,
        worker_command: tuple[str, ...],
        *,
        stop_grace: float = 10.0,
        reconcile_interval: float = RECONCILE_INTERVAL,
    ) -> None:
        self.root = root
        self.machines_dir = root / "machines"
        self.snapshots_dir = root / "snapshots"
        self.worker_command = worker_command
        self.stop_grace = stop_grace
        self.reconcile_interval = reconcile_interval
        #: Workers this process started, so that they are reaped (no zombies) when they exit.
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        #: The status sources running on this driver (told of each start and end at once).
        self.sources: set[ProcessStatusSource] = set()
        #: Machines whose worker's end is awaited and will be reported, by the token of that wait (a
        #: worker stopped on purpose is dropped first: its end is no news, and must not reach a row that
        #: already describes its successor).
        self._followed: dict[str, object] = {}
        self._waits: set[asyncio.Task[None]] = set()
        #: Machines whose worker is being stopped on purpose (a listing meanwhile must not follow it again).
        self._stopping: set[str] = set()

    @classmethod
    def from_options(cls, context: DriverContext, options: Mapping[str, Any]) -> ProcessDriver:
        if os.name == "nt":  # not sys.platform: mypy's win32 pass would call the rest unreachable
            raise DriverError("the process driver needs a POSIX host (process groups, sh)")
        values = OPTIONS.read(options)
        root = values["root"] or context.state_dir / cls.name
        command = values["worker_command"] or (sys.executable, "-m", "devin_outposts")
        return cls(
            root, command, stop_grace=values["stop_grace"], reconcile_interval=values["reconcile_interval"]
        )

    def status_source(self, acceptor_id: str) -> ProcessStatusSource:
        return ProcessStatusSource(self, acceptor_id, reconcile_interval=self.reconcile_interval)

    async def aclose(self) -> None:
        """Stop awaiting workers' ends (the workers run on: an orchestrator that starts again adopts them)."""
        for task in list(self._waits):
            task.cancel()
        self._followed.clear()

    async def check(self) -> None:
        try:
            make_private_dir(self.root)
            make_private_dir(self.machines_dir)
            make_private_dir(self.snapshots_dir)
        except OSError as exc:
            raise DriverError(f"cannot use {self.root}: {exc}") from exc
        if not _runnable(self.worker_command[0]):
            raise DriverError(f"the worker command {self.worker_command[0]!r} is not found")

    # --- machines ------------------------------------------------------------------------------------

    def _dir(self, name: str) -> Path:
        return self.machines_dir / name

    async def provision(self, spec: SessionSpec) -> Machine:
        name = machine_name("outpost-worker", spec.session_id)
        path = self._dir(name)
        meta = _read_json(path / META)
        if meta is not None:
            if (meta.get("session_id"), meta.get("acceptor_id"), meta.get("outpost_id")) != (
                spec.session_id,
                spec.acceptor_id,
                spec.outpost_id,
            ):
                raise name_taken(f"machine directory {path}", str(meta.get("session_id")))
            return self._machine(name, meta)
        try:
            make_private_dir(self.machines_dir)
            path.mkdir(mode=0o700, exist_ok=True)
            (path / MACHINE_DATA_DIR).mkdir(mode=0o700, exist_ok=True)
            (path / MACHINE_WORKDIR).mkdir(mode=0o700, exist_ok=True)
            meta = {
                "labels": spec.labels(),
                "session_id": spec.session_id,
                "outpost_id": spec.outpost_id,
                "acceptor_id": spec.acceptor_id,
                "created_at": time.time(),
            }
            _write_json(path / META, meta)
        except OSError as exc:
            raise DriverError(f"cannot make machine directory {path}: {exc}") from exc
        return self._machine(name, meta)

    def _machine(self, name: str, meta: Mapping[str, Any]) -> Machine:
        return Machine(
            name=name,
            session_id=str(meta.get("session_id", "")),
            outpost_id=str(meta.get("outpost_id", "")),
            acceptor_id=str(meta.get("acceptor_id", "")),
            created_at=float(meta.get("created_at", 0.0)),
            ref=str(self._dir(name)),
        )

    def _environment(self, path: Path, launch: WorkerLaunch) -> dict[str, str]:
        env = {key: os.environ[key] for key in PASSTHROUGH if os.environ.get(key)}
        env.update(launch.environment())
        # Each machine has its own data dir (a shared one would be locked by the first worker).
        env["DEVIN_WORKER_CACHE_DIR"] = str(path / MACHINE_DATA_DIR / "cache")
        env["DEVIN_WORKER_WORKDIR"] = str(path / MACHINE_WORKDIR)
        # A confined session sees neither the other machines nor the orchestrator's own files (its state
        # directory: every machine is in it), and a root orchestrator's sessions run as ids of their own
        # (docs/network-policy.md, "Sessions apart from each other").
        hidden = [str(self.root.parent), *filter(None, os.environ.get(ENV_SESSION_HIDE, "").split(","))]
        env[ENV_SESSION_HIDE] = ",".join(hidden)
        if os.environ.get(ENV_SESSION_UID_RANGE):
            env[ENV_SESSION_UID_RANGE] = os.environ[ENV_SESSION_UID_RANGE]
        return env

    async def start(self, machine: Machine, launch: WorkerLaunch) -> None:
        path = self._dir(machine.name)
        if not (path / META).is_file():
            raise DriverError(f"machine {machine.name} does not exist")
        await self._stop_worker(path)
        for stale in (EXITFILE, PIDFILE):
            with contextlib.suppress(FileNotFoundError):
                (path / stale).unlink()
        argv = ["/bin/sh", "-c", WRAPPER, "worker", *self.worker_command, *launch.arguments()]
        try:
            log_fd = os.open(path / LOGFILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                proc = _spawn(argv, path, self._environment(path, launch), log_fd)
            finally:
                os.close(log_fd)
        except OSError as exc:
            raise DriverError(f"cannot start the worker in {machine.name}: {exc}") from exc
        self._children[machine.name] = proc  # its record is its own (WRAPPER)
        self._await_end(machine.name, machine.acceptor_id, child_ended(proc))
        # The new worker's first row: rows from before this start describe the worker it replaced.
        self._report(machine.name, machine.acceptor_id)

    # --- following workers' ends ----------------------------------------------------------------------

    def _await_end(self, name: str, acceptor_id: str, ended: Coroutine[Any, Any, None]) -> None:
        """Await ``ended`` (a coroutine) in a task of its own, then report ``name``'s status, unless the
        worker was stopped on purpose meanwhile (:meth:`_stop_worker`)."""
        token = object()
        self._followed[name] = token
        task = asyncio.ensure_future(ended)
        self._waits.add(task)

        def done(task: asyncio.Task[None]) -> None:
            self._waits.discard(task)
            if task.cancelled():
                return
            task.exception()  # retrieved: a failed wait still ends in a fresh read of the machine
            if self._followed.get(name) is token:
                del self._followed[name]
                self._report(name, acceptor_id)

        task.add_done_callback(done)

    def _report(self, name: str, acceptor_id: str) -> None:
        if self.sources:
            status = self.read_status(name)
            for source in list(self.sources):
                source.report(name, acceptor_id, status)

    def follow(self, name: str, acceptor_id: str) -> None:
        """Await the end of ``name``'s running worker (one this process did not start: adopted), once."""
        if name in self._followed or name in self._stopping:
            return
        path = self._dir(name)
        pid = self._leader(path)
        if pid is None:
            return
        fd = open_pidfd(pid)
        if fd is not None:
            if self._leader(path) != pid:  # it ended, or the pid was reused, before the pidfd was open
                os.close(fd)
                self._report(name, acceptor_id)
                return
            self._await_end(name, acceptor_id, self._pidfd_closed(fd))
            return
        self._await_end(name, acceptor_id, self._polled_end(path))

    @staticmethod
    async def _pidfd_closed(fd: int) -> None:
        try:
            await readable(fd)
        finally:
            os.close(fd)

    async def _polled_end(self, path: Path) -> None:
        """Where there is no pidfd: the machine read every ADOPTED_POLL seconds until its worker is gone."""
        while True:
            if (
                path.name not in self._followed
                or self.read_status(path.name).state is not WorkerState.RUNNING
            ):
                return
            await asyncio.sleep(ADOPTED_POLL)

    def _leader(self, path: Path) -> Optional[int]:
        """The worker's group leader when it still runs (same pid, same start time). A leader this process
        started a moment ago may not have written its record yet: it is known by its process handle."""
        record = _read_json(path / PIDFILE)
        if record is None:
            child = self._children.get(path.name)
            return child.pid if child is not None and child.returncode is None else None
        try:
            pid = int(record["pid"])
        except (KeyError, TypeError, ValueError):
            return None
        self._reap(path.name)
        if not process_alive(pid) or _zombie(pid):
            return None
        started = record.get("started")
        if started is not None and platform.current().process_start_time(pid) != started:
            return None  # the pid was reused
        return pid

    def _reap(self, name: str) -> None:
        """Reap a worker this process started once it ended, and forget it."""
        proc = self._children.get(name)
        if proc is not None and proc.poll() is not None:
            del self._children[name]

    async def status(self, machine: Machine) -> WorkerStatus:
        return self.read_status(machine.name)

    def machine_names(self, acceptor_id: str) -> Iterator[str]:
        """The names of every machine made for ``acceptor_id`` (all outposts)."""
        if not self.machines_dir.is_dir():
            return
        for path in sorted(self.machines_dir.iterdir()):
            meta = _read_json(path / META)
            if meta and meta.get("acceptor_id") == acceptor_id:
                yield path.name

    def read_status(self, name: str) -> WorkerStatus:
        """:meth:`status` without a coroutine (a few small files and ``/proc``): what the status source
        lists machines with."""
        path = self._dir(name)
        if not (path / META).is_file():
            return WorkerStatus(WorkerState.MISSING, detail="machine directory gone")
        exit_text = None
        with contextlib.suppress(OSError):
            exit_text = (path / EXITFILE).read_text().strip()
        if exit_text and exit_text.startswith(EXEC_FAILED):
            what = "not found" if exit_text.endswith("127") else "not executable"
            return WorkerStatus(
                WorkerState.FAILED,
                detail=f"the worker command {self.worker_command[0]!r} cannot be run ({what})",
                reason=EXEC_FAILED,
            )
        if exit_text:
            try:
                return WorkerStatus(WorkerState.EXITED, exit_code=int(exit_text))
            except ValueError:
                return WorkerStatus(WorkerState.EXITED, exit_code=1, detail=f"bad exit record {exit_text!r}")
        if self._leader(path) is not None:
            return WorkerStatus(WorkerState.RUNNING)
        if (path / PIDFILE).exists():  # started, gone, and no exit record: it was killed
            return WorkerStatus(WorkerState.EXITED, exit_code=128 + 9, detail="killed (no exit record)")
        return WorkerStatus(WorkerState.STARTING, detail="no worker started yet")

    async def _stop_worker(self, path: Path) -> None:
        self._followed.pop(path.name, None)  # an end we cause is no news (the wait still reaps a child)
        self._stopping.add(path.name)
        try:
            await self._stop_leader(path)
        finally:
            self._stopping.discard(path.name)

    async def _stop_leader(self, path: Path) -> None:
        pid = self._leader(path)
        if pid is not None:
            # Twice: the worker's first signal drains, the second stops its devin-remote at once.
            for dummy in range(2):
                platform.current().signal_group(None, pid, kill=False)
                await asyncio.sleep(0.05)
            deadline = time.monotonic() + self.stop_grace
            while process_alive(pid) and not _zombie(pid) and time.monotonic() < deadline:
                self._reap(path.name)
                await asyncio.sleep(0.05)
            platform.current().signal_group(None, pid, kill=True)
            self._reap(path.name)
        # A devin-remote the worker could not stop (it was killed) runs in its own group.
        sessions = path / MACHINE_DATA_DIR / "sessions"
        if sessions.is_dir():
            for state_dir in sessions.iterdir():
                if state_dir.is_dir() and not state_dir.is_symlink():
                    await asyncio.to_thread(reap_stale_remote, state_dir)

    async def teardown(self, machine: Machine) -> None:
        path = self._dir(machine.name)
        if not path.exists():
            return
        await self._stop_worker(path)
        try:
            await asyncio.to_thread(shutil.rmtree, path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise DriverError(f"cannot remove machine directory {path}: {exc}") from exc

    async def list_owned(self, acceptor_id: str, outpost_id: str) -> list[Machine]:
        if not self.machines_dir.is_dir():
            return []
        found = []
        for path in sorted(self.machines_dir.iterdir()):
            meta = _read_json(path / META)
            if meta and meta.get("acceptor_id") == acceptor_id and meta.get("outpost_id") == outpost_id:
                found.append(self._machine(path.name, meta))
        return found

    # --- snapshots -----------------------------------------------------------------------------------

    async def snapshot(self, machine: Machine) -> Snapshot:
        path = self._dir(machine.name)
        await self._stop_worker(path)
        target = self.snapshots_dir / machine.name
        try:
            make_private_dir(self.snapshots_dir)
            if target.exists():  # an older snapshot of this session: the newer state wins
                await asyncio.to_thread(shutil.rmtree, target)
            target.mkdir(mode=0o700)
            for part in (MACHINE_DATA_DIR, MACHINE_WORKDIR):
                if (path / part).exists():
                    os.replace(path / part, target / part)
            created = time.time()
            _write_json(
                target / SNAPSHOT_META,
                {
                    "session_id": machine.session_id,
                    "outpost_id": machine.outpost_id,
                    "acceptor_id": machine.acceptor_id,
                    "created_at": created,
                },
            )
        except OSError as exc:
            raise DriverError(f"cannot keep a snapshot of {machine.name}: {exc}") from exc
        return Snapshot(machine.session_id, machine.outpost_id, machine.acceptor_id, created, str(target))

    def _ours(self, source: Path) -> bool:
        return source.parent == self.snapshots_dir and source.is_dir() and not source.is_symlink()

    async def restore(self, machine: Machine, snapshot: Snapshot) -> None:
        source, path = Path(snapshot.ref), self._dir(machine.name)
        if not self._ours(source):
            raise DriverError(f"snapshot {snapshot.ref} is not one of ours")
        try:
            for part in (MACHINE_DATA_DIR, MACHINE_WORKDIR):
                if (source / part).exists():
                    if (path / part).exists():
                        await asyncio.to_thread(shutil.rmtree, path / part)
                    os.replace(source / part, path / part)
            await asyncio.to_thread(shutil.rmtree, source)
        except OSError as exc:
            raise DriverError(f"cannot restore snapshot {snapshot.ref}: {exc}") from exc

    async def list_snapshots(self, acceptor_id: str, outpost_id: str) -> list[Snapshot]:
        if not self.snapshots_dir.is_dir():
            return []
        found = []
        for path in sorted(self.snapshots_dir.iterdir()):
            meta = _read_json(path / SNAPSHOT_META)
            if meta and meta.get("acceptor_id") == acceptor_id and meta.get("outpost_id") == outpost_id:
                found.append(
                    Snapshot(
                        str(meta["session_id"]),
                        outpost_id,
                        acceptor_id,
                        float(meta.get("created_at", 0.0)),
                        str(path),
                    )
                )
        return found

    async def delete_snapshot(self, snapshot: Snapshot) -> None:
        path = Path(snapshot.ref)
        if path.parent != self.snapshots_dir:  # never remove a path the server or a file named
            raise DriverError(f"snapshot {snapshot.ref} is not one of ours")
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(shutil.rmtree, path)
