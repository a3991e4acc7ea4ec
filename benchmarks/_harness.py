"""What the benchmarks share: a simulator per scenario, real worker processes, a marker remote, percentiles.

* :func:`bench_sim` starts ``devin-outposts-sim serve`` as its own process (as users run it) on a fresh
  SQLite file, with one ``linux`` outpost and a machine token.
* :class:`Worker` runs ``devin-outposts worker start`` with the token in its environment (never argv),
  its own data, cache and working directories, and ``--metrics-addr 127.0.0.1:0``, so that readiness
  (``/healthz``) and counters (``/metrics``) can be read; it also reads the process's RSS and CPU time
  from ``/proc``.
* :func:`publish_marker_remote` publishes a tiny ``/bin/sh`` ``devin-remote`` that creates
  ``<runs>/<session_id>.<pid>`` when it starts, so that the benchmark sees each remote start on the file
  system without adding load to the simulator. It then blocks reading a FIFO of its own and exits 0
  when :func:`end_marker_session`, after marking the session terminated, writes to it (as a real remote
  exits when its session ends). SIGTERM from the worker kills it (no trap: traps around a blocking
  ``wait`` are racy in dash). A FIFO costs one ``mkfifo`` and no busy loop.
* :func:`write_json` writes a run's figures for every benchmark's ``--json FILE|-``; :func:`without_nan`
  turns a figure without samples into null first, where a benchmark has such figures.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TextIO, TypeVar

from devin_outposts.core.processes import process_alive
from devin_outposts_sim import testing
from devin_outposts_sim.admin_client import SimAdmin
from devin_outposts_sim.testing import SimProcess

METRICS_LINE = re.compile(r"serving /metrics and /healthz on [^\s:]+:(\d+)")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

MARKER_REMOTE = """#!/bin/sh
# benchmark devin-remote: record this start, then exit 0 once the benchmark writes to our FIFO
me="${{DEVIN_OUTPOST_SESSION_ID}}.$$"
mkfifo "{ends}/$me" || exit 1
: > "{runs}/$me"
read -r line < "{ends}/$me"
exit 0
"""


T = TypeVar("T")


def in_work_dir(keep: Optional[str], prefix: str, body: Callable[[Path], T]) -> T:
    """Run ``body`` in the directory ``keep`` (made here; it must not exist, so no earlier run is mixed in)
    or, without it, in a temporary directory removed afterwards."""
    if keep:
        root = Path(keep)
        root.mkdir(parents=True, exist_ok=False)
        return body(root)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmpdir:
        return body(Path(tmpdir))


class BenchError(Exception):
    """The benchmark itself broke (a worker died, something never happened): not a measured figure."""


def wait_until(
    predicate: Callable[[], Any], *, timeout: float, interval: float = 0.05, what: str = "a condition"
) -> Any:
    """Poll ``predicate`` until it returns something truthy; :class:`BenchError` after ``timeout`` s."""
    try:
        return testing.wait_until(predicate, timeout=timeout, interval=interval, what=what)
    except TimeoutError as exc:
        raise BenchError(str(exc)) from None


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default), ``fraction`` in [0, 1]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """``n``, ``p50``, ``p90``, ``p99``, ``min``, ``max`` and ``mean`` of ``values`` (seconds in and out)."""
    return {
        "n": len(values),
        "p50": percentile(values, 0.50),
        "p90": percentile(values, 0.90),
        "p99": percentile(values, 0.99),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
        "mean": sum(values) / len(values) if values else math.nan,
    }


def without_nan(value: Any) -> Any:
    """NaN (a figure with no samples) as null, in dicts and lists too: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_nan(item) for item in value]
    return value


def write_json(result: Any, target: str) -> None:
    """The figures of a run as indented JSON, for ``--json FILE|-``: to stdout for ``-`` (the report then
    goes to stderr), otherwise to the file ``target``, ending in a newline. Anything JSON has no type
    for (a path, an option's value) is written as its ``str``."""
    text = json.dumps(result, indent=2, default=str)
    if target == "-":
        print(text)
    else:
        Path(target).write_text(text + "\n")


def reporter(json_target: Optional[str]) -> Callable[[str], None]:
    """The ``say`` of a benchmark's report: one line, flushed, to stdout; to stderr when ``--json -`` puts
    the figures on stdout (so that they stay parseable)."""
    stream: TextIO = sys.stderr if json_target == "-" else sys.stdout

    def say(line: str) -> None:
        print(line, file=stream, flush=True)

    return say


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def cpu_seconds_of(pid: int) -> float:
    """utime + stime of a process from ``/proc/<pid>/stat`` (fields 14 and 15), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class ClaimAnalysis:
    """What the claim history says about each session's claims (see :func:`analyse_claims`)."""

    overlapping: int = 0  #: claims made while another acceptor held the session: the simulator let two in
    reclaimed_live: int = 0  #: sessions claimed again, after a release, before they were marked ended
    reclaimed_after_end: int = 0  #: sessions claimed again after they were marked ended (stale copies)
    first_claim_at: dict[str, float] = field(default_factory=dict)
    first_release_at: dict[str, float] = field(default_factory=dict)


def analyse_claims(records: Sequence[dict[str, Any]], ended_at: dict[str, float]) -> ClaimAnalysis:
    """Walk the claim history (oldest first). ``ended_at``: when the benchmark sent each session's
    ``terminated``; a later claim of that session acted on a stale copy of the queue."""
    result = ClaimAnalysis()
    holder: dict[str, str] = {}
    live_again: set[str] = set()
    after_end: set[str] = set()
    for record in records:
        sid, action, at = record["session_id"], record["action"], float(record["at"])
        if action == "claim":
            if holder.get(sid) not in (None, record["acceptor_id"]):
                result.overlapping += 1
            holder[sid] = record["acceptor_id"]
            if sid not in result.first_claim_at:
                result.first_claim_at[sid] = at
            elif at < ended_at.get(sid, math.inf):
                live_again.add(sid)
            else:
                after_end.add(sid)
        elif action in ("release", "expire", "tombstone"):
            holder.pop(sid, None)
            if action == "release" and sid in result.first_claim_at:
                result.first_release_at.setdefault(sid, at)
    result.reclaimed_live, result.reclaimed_after_end = len(live_again), len(after_end)
    return result


# --- the simulator ------------------------------------------------------------------------------


@dataclass
class BenchSim:
    proc: SimProcess
    outpost_id: str
    outpost_name: str
    token: str
    root: Path

    @property
    def admin(self) -> SimAdmin:
        return self.proc.admin

    def claim_records(self, session_id: Optional[str] = None) -> list[dict[str, Any]]:
        if session_id is not None:
            return self.admin.claims(session_id=session_id)
        return self.admin.claims(outpost_id=self.outpost_id)

    def first(self, session_id: str, action: str) -> Optional[dict[str, Any]]:
        return next((r for r in self.claim_records(session_id) if r["action"] == action), None)

    def wait_record(self, session_id: str, action: str, timeout: float = 60.0) -> dict[str, Any]:
        record: dict[str, Any] = wait_until(
            lambda: self.first(session_id, action),
            timeout=timeout,
            interval=0.02,
            what=f"a {action} record of session {session_id}",
        )
        return record


@contextlib.contextmanager
def bench_sim(root: Path, name: str, **options: Any) -> Iterator[BenchSim]:
    """A simulator process on ``<root>/<name>/sim.db`` with one linux outpost; default settings unless
    ``options`` (:class:`SimProcess` keywords, e.g. ``env``) say otherwise."""
    workdir = root / name
    workdir.mkdir(parents=True)
    proc = SimProcess(workdir / "sim.db", workdir=workdir, **options)
    proc.start()
    try:
        outpost = proc.admin.create_outpost(f"bench-{name}", "linux")
        yield BenchSim(proc, outpost.outpost_id, outpost.name, proc.create_token("machine"), workdir)
    finally:
        proc.close()


def fifo_dir(runs: Path) -> Path:
    return runs.with_name(f"{runs.name}-fifos")


def publish_marker_remote(admin: SimAdmin, runs: Path) -> str:
    """Publish the marker remote (see the module docstring) as ``latest``; returns its SHA."""
    runs.mkdir(parents=True, exist_ok=True)
    fifo_dir(runs).mkdir(exist_ok=True)
    script = MARKER_REMOTE.format(runs=runs, ends=fifo_dir(runs))
    return admin.publish_remote(script.encode(), latest=True)


def remote_starts(runs: Path) -> dict[str, list[int]]:
    """Session id -> the pids of the marker remotes started for it."""
    found: dict[str, list[int]] = {}
    with os.scandir(runs) as entries:
        for entry in entries:
            sid, pid = entry.name.rsplit(".", 1)
            found.setdefault(sid, []).append(int(pid))
    return found


def wait_remote_start(runs: Path, session_id: str, timeout: float = 60.0) -> int:
    """Wait for the marker file of ``session_id`` (a directory listing every 2 ms touches neither the
    worker nor the simulator); returns the remote's pid."""
    prefix = f"{session_id}."

    def started() -> Optional[int]:
        names = [name for name in os.listdir(runs) if name.startswith(prefix)]
        return int(names[0].rsplit(".", 1)[1]) if names else None

    pid: int = wait_until(
        started, timeout=timeout, interval=0.002, what=f"the remote of session {session_id} to start"
    )
    return pid


def end_marker_session(admin: SimAdmin, runs: Path, session_id: str, pid: int) -> None:
    """Mark the session terminated, then tell its marker remote to exit 0, as a real one would."""
    admin.set_status(session_id, "terminated")
    fifo = fifo_dir(runs) / f"{session_id}.{pid}"
    deadline = time.monotonic() + 30
    while True:
        try:  # non-blocking: fails with ENXIO until the remote has the FIFO open for reading
            handle = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if not process_alive(pid):
                return  # the worker stopped it first: nothing to tell
            if time.monotonic() > deadline:
                raise BenchError(f"the remote of session {session_id} never opened its FIFO") from exc
            time.sleep(0.001)
    try:
        with contextlib.suppress(BrokenPipeError):  # the worker stopped it in the meantime
            os.write(handle, b"end\n")
    finally:
        os.close(handle)
        fifo.unlink(missing_ok=True)


# --- workers ------------------------------------------------------------------------------------


def worker_command() -> list[str]:
    # DEVIN_OUTPOSTS_BENCH_WORKER: another installation's devin-outposts, e.g. a venv holding only the
    # package and its runtime dependencies, as the worker role installs it (the dev .venv has many more).
    other = os.environ.get("DEVIN_OUTPOSTS_BENCH_WORKER")
    if other:
        return [other, "worker", "start"]
    script = Path(sys.executable).with_name("devin-outposts")
    if script.exists():
        return [str(script), "worker", "start"]
    return [sys.executable, "-m", "devin_outposts", "worker", "start"]


class Worker:
    """One ``devin-outposts worker start`` process in its own process group and directories."""

    def __init__(self, sim: BenchSim, name: str, *args: str, metrics: bool = True) -> None:
        self.root = sim.root / "workers" / name
        self.root.mkdir(parents=True)
        self.log_path = self.root / "worker.log"
        self.argv = [
            *worker_command(),
            "--outpost", sim.outpost_name,
            "--cache-dir", str(self.root / "data" / "cache"),
            "--workdir", str(self.root / "work"),
            "--static-base-url", sim.admin.static_base_url,
            *(["--metrics-addr", "127.0.0.1:0"] if metrics else []),
            *args,
        ]  # fmt: skip
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DEVIN_")}
        self.env.update(DEVIN_OUTPOSTS_TOKEN=sim.token, DEVIN_API_URL=sim.proc.url)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._port: Optional[int] = None
        self._terminated = False

    def start(self) -> Worker:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        return self

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise BenchError("the worker has not been started")
        return self.proc.pid

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise BenchError(
                f"worker {self.root.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
            )

    def metrics_port(self) -> Optional[int]:
        if self._port is None:
            with contextlib.suppress(OSError):
                found = METRICS_LINE.search(self.log_path.read_text(errors="replace"))
                if found:
                    self._port = int(found.group(1))
        return self._port

    def _get(self, path: str) -> Optional[str]:
        port = self.metrics_port()
        if port is None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return str(response.read().decode())
        except (urllib.error.URLError, OSError):
            return None

    def is_ready(self) -> bool:
        """``/healthz`` says ``ok``: the outpost is resolved and the queue feed has started."""
        self._check_alive()
        body = self._get("/healthz")
        return body is not None and '"ok"' in body

    def wait_ready(self, timeout: float = 120.0) -> None:
        wait_until(self.is_ready, timeout=timeout, interval=0.1, what=f"worker {self.root.name} to be ready")

    def is_quiet(self, window: float = 1.0) -> bool:
        """No CPU time used over ``window`` seconds (for a worker without metrics: it has settled)."""
        self._check_alive()
        before = self.cpu_seconds()
        time.sleep(window)
        return self.cpu_seconds() == before

    def counter(self, name: str) -> float:
        """The sum of ``devin_outposts_worker_<name>`` over its label sets (0 when unreadable)."""
        body = self._get("/metrics") or ""
        total = 0.0
        for line in body.splitlines():
            if line.startswith(f"devin_outposts_worker_{name}"):
                with contextlib.suppress(ValueError, IndexError):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def rss_kib(self) -> int:
        """VmRSS from ``/proc/<pid>/status``, in KiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise BenchError(f"no VmRSS for pid {self.pid}")

    def cpu_seconds(self) -> float:
        return cpu_seconds_of(self.pid)

    def terminate(self) -> None:
        """One SIGTERM: the worker drains and releases (a second one would stop its sessions at once)."""
        if self.proc is not None and self.proc.poll() is None and not self._terminated:
            self._terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM (the worker drains and releases), then SIGKILL its whole process group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def running_workers(workers: Sequence[Worker], ready_timeout: float = 180.0) -> Iterator[Sequence[Worker]]:
    """Start ``workers``, wait until every one is ready, and stop them all at the end of the block."""
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            if "--metrics-addr" in worker.argv:
                worker.wait_ready(timeout=ready_timeout)
            else:
                wait_until(worker.is_quiet, timeout=ready_timeout, interval=0, what="the worker to settle")
        yield workers
    finally:
        for worker in workers:
            worker.terminate()  # all drain at once, not one after another
        for worker in workers:
            worker.stop()
