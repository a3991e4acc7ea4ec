"""The orchestrator (``devin-outposts orchestrate --driver process``): queue drain, start latency, API cost,
and the memory and CPU of holding many live sessions, each beside a baseline from the same run.

Everything runs as real processes on this machine: ``devin-outposts-sim serve`` (a fresh SQLite file and one
``linux`` outpost per scenario, default settings: claim TTL 300 s), an HTTP relay (``_faultproxy.py``, no
faults injected) between the client under test and the simulator's fleet API that counts every request by
route and the watch streams open, and the client under test with its token in the environment, its metrics
on a loopback port and its tuning at the production defaults (status reads every 2 s, session status polls
every 5 s). The benchmark plays the brain through the simulator's admin API, which the relay never sees.

**Run 1: a queue of ``--sessions`` (200) drained at ``--concurrency`` (50).** The brain enqueues them all at
once and ends each session as soon as its remote has started.

* *orchestrator*: ``orchestrate --driver process --max-concurrent 50 --state-dir <tmp> --static-base-url
  <sim> --api-url <relay>``. With ``--worker real`` (the default) each session machine runs a real
  ``devin-outposts worker start --session <id>`` that downloads and checksum-verifies the harness's marker
  remote (``_harness.py``: a ``/bin/sh`` ``devin-remote`` that creates ``<runs>/<session>.<pid>`` when it
  starts and exits 0 when told); the brain marks the session ``terminated`` and tells the remote to exit, so
  the worker exits 0 and the orchestrator confirms, releases and tears the machine down. With ``--worker
  hold`` each machine runs a ``/bin/sh`` script instead of the worker (``--driver-opt worker_command=...``)
  that records its start the same way and holds until SIGTERM; the brain ends the session with
  ``end_session(sid, "terminated")`` and the orchestrator stops the machine on seeing it.
* *baseline*: the same sessions, remote and brain, served by ``--baseline-workers`` (1) long-lived
  ``devin-outposts worker start --max-sessions <concurrency / workers>`` processes (the capacity is the
  same; the sessions run as local remotes, no machine per session).

Reported for both: **drain time** (first enqueue sent -> last ``release`` in the simulator's claim
history); **queue wait** p50/p90/p99/max from the enqueue request to the first claim record, and to the
remote's start (its marker file's mtime: for the orchestrator that is claim + machine + worker start +
download and verify + remote start); the **fleet API requests per session** (relayed requests from the
first enqueue to the last release, divided by the sessions; by route in ``--json``); the **CPU per
session**: the client's own CPU plus that of the children it reaped (``cutime + cstime``: for the
orchestrator every machine's worker and remote, for the baseline its remotes) over the drain, divided by
the sessions; the peak VmRSS of each machine's Python worker; how many sessions
were started more than once; the peak of machines at once (sampled every ``--tick``); and, after the last
release, **leaked machines**: entries left in the machines directory and processes left working under
the run's directory once the machines directory emptied (or 60 s passed), and again after the orchestrator
was stopped. The ratio orchestrator / baseline is printed beside each figure.

**Run 2: ``--live`` (500) sessions held live at once on one watch connection.** ``--worker hold`` only: 500
real Python workers (about 40 MiB VmRSS and 0.35 s of CPU each, as run 1 measures: some 20 GiB and 170
CPU-seconds) do not fit a 2-core, 24 GiB machine that others share, so the figure is the orchestrator's own
cost, not its workers'. The orchestrator runs with
``--max-concurrent 500``. Baseline in the same run: the same process idle with 0 sessions. Over a steady
window (``--window``, 60 s; quick 15 s) after a settle time: the orchestrator's VmRSS (median of samples
every second), its threads and open file descriptors, its CPU seconds (``utime + stime`` from ``/proc``)
as a percentage of one core, how long its event-loop thread ran and how long it waited for a CPU
(``/proc/<pid>/schedstat``: on a shared machine a busy neighbour shows up there, not as our CPU), the time
``/healthz`` takes to answer (the event loop's lag), the simulator's CPU, the fleet API requests per second
and the watch streams open at the relay (sampled; should be 1). Then RSS per live session ((live - idle)
/ sessions), the time to fill 500 slots, and the same leak checks after the brain ends all 500.

Run: ``.venv/bin/python benchmarks/orchestrator.py [--quick] [--worker real|hold] [--json FILE|-]``.
``--quick`` is a validation run (50 sessions at 10, 100 live, 15 s windows). The figures are measurements,
not assertions: the exit code is 0 unless the benchmark itself broke. Everything it starts is stopped and
its temporary directory removed at the end (``--keep DIR`` keeps the files).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional

from _faultproxy import FaultProxy
from devin_outposts_sim.admin_client import SimAdminError

from _harness import (
    CLOCK_TICKS,
    BenchError,
    BenchSim,
    Worker,
    analyse_claims,
    bench_sim,
    cpu_seconds_of,
    end_marker_session,
    in_work_dir,
    ms,
    publish_marker_remote,
    reporter,
    running_workers,
    summarize,
    wait_until,
    worker_command,
    write_json,
)

Out = Callable[[str], None]
REPO = Path(__file__).resolve().parent.parent
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024
ENDERS = 8  #: threads of the brain that end sessions

HOLD_WORKER = """#!/bin/sh
# benchmark stand-in for `devin-outposts worker start --session <id>`: record the start, hold until SIGTERM
# (the drivers pass --session=<id>; --session <id> is taken too)
sid=unknown
while [ $# -gt 0 ]; do
    case "$1" in
        --session) sid=$2 ;;
        --session=*) sid=${{1#--session=}} ;;
    esac
    shift
done
: > "{runs}/$sid.$$"
exec sleep 2147483647
"""


# --- processes ------------------------------------------------------------------------------------------


class Orchestrator(Worker):
    """``devin-outposts orchestrate --driver process`` in its own process group and directory, its fleet
    API through ``api_url`` (the relay), metrics on a loopback port (the harness worker's readiness and
    ``/proc`` readings apply as they are)."""

    def __init__(self, sim: BenchSim, name: str, api_url: str, *args: str) -> None:
        super().__init__(sim, name)
        self.state_dir = self.root / "state"
        # devin-outposts (or python -m devin_outposts), without "worker start"
        command = worker_command()[:-2]
        self.argv = [
            *command, "orchestrate",
            "--outpost", sim.outpost_name,
            "--driver", "process",
            "--state-dir", str(self.state_dir),
            "--static-base-url", sim.admin.static_base_url,
            "--api-url", api_url,
            "--metrics-addr", "127.0.0.1:0",
            *args,
        ]  # fmt: skip
        self.env.update(DEVIN_OUTPOSTS_TOKEN=sim.proc.create_token("orchestrator"), DEVIN_API_URL=api_url)

    @property
    def machines_dir(self) -> Path:
        return self.state_dir / "process" / "machines"

    def machines(self) -> list[str]:
        try:
            return os.listdir(self.machines_dir)
        except FileNotFoundError:
            return []

    def fetch(self, path: str, timeout: float = 30.0) -> Optional[str]:
        """GET ``path`` from the metrics server, waiting up to ``timeout`` s (its event loop may lag)."""
        port = self.metrics_port()
        if port is None:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as response:
                return str(response.read().decode())
        except (urllib.error.URLError, OSError):
            return None

    def healthz_latency(self) -> float:
        """Seconds ``/healthz`` takes to answer: the lag of the orchestrator's event loop (NaN: no answer
        within 30 s)."""
        start = time.monotonic()
        return time.monotonic() - start if self.fetch("/healthz") is not None else math.nan

    def loop_thread_times(self) -> tuple[float, float]:
        """Seconds the main thread (the event loop) has run on a CPU and waited for one (``schedstat``)."""
        run_ns, wait_ns = Path(f"/proc/{self.pid}/schedstat").read_text().split()[:2]
        return int(run_ns) / 1e9, int(wait_ns) / 1e9

    def metric(self, name: str) -> float:
        """The sum of ``outposts_<name>`` over its label sets (NaN when unreadable)."""
        body = self.fetch("/metrics")
        if body is None:
            return math.nan
        total = 0.0
        for line in body.splitlines():
            if line.startswith(f"outposts_{name}{{") or line.startswith(f"outposts_{name} "):
                with contextlib.suppress(ValueError, IndexError):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    def proc_status(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise BenchError(f"no {field} for pid {self.pid}")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))


def pids_working_under(root: Path, exclude: Sequence[int] = ()) -> list[int]:
    """Live processes whose working directory is ``root`` or below it (zombies are not counted)."""
    base = str(root.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), *exclude):
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd")
            if cwd == base or cwd.startswith(base + os.sep):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
    return found


class CpuTracker:
    """CPU seconds of the short-lived processes working under ``root`` (machine workers, remotes): ``/proc``
    is scanned every ``interval`` seconds and each process's last ``utime + stime`` kept, so the total is
    a lower bound (what a process used after its last sample is missed). The orchestrator's reaped-children
    times (``cutime``) do not do: the teardown signals the machine's whole process group, so its leader
    (``sh``) may die before it reaps the worker, whose CPU then goes to init (a first try counted ~0)."""

    def __init__(self, root: Path, exclude: Sequence[int], interval: float = 0.25) -> None:
        self.base = str(root.resolve())
        self.exclude = set(exclude)
        self.interval = interval
        self.last: dict[tuple[int, str], float] = {}
        #: The largest VmRSS (KiB) seen of each Python process (the workers; not ``sh`` or ``sleep``).
        self.python_rss: dict[tuple[int, str], int] = {}
        #: The last CPU seconds seen of each Python process.
        self.python_cpu: dict[tuple[int, str], float] = {}
        self.next = 0.0

    def sample(self, force: bool = False) -> None:
        if not force and time.monotonic() < self.next:
            return
        self.next = time.monotonic() + self.interval
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in self.exclude:
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                cwd = os.readlink(entry / "cwd")
                if cwd == self.base or cwd.startswith(self.base + os.sep):
                    text = (entry / "stat").read_text()
                    comm, fields = text.split("(", 1)[1].rsplit(")", 1)[0], text.rsplit(")", 1)[1].split()
                    key = (int(entry.name), fields[19])  # (pid, start time): pids get reused
                    self.last[key] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
                    # The process driver runs ``python -m devin_outposts``; not "devin-outposts": that is the
                    # orchestrator's comm, which a child has between its fork and its exec.
                    if comm.startswith("python"):
                        rss = int(fields[21]) * PAGE_KIB
                        self.python_rss[key] = max(rss, self.python_rss.get(key, 0))
                        self.python_cpu[key] = self.last[key]

    @property
    def total(self) -> float:
        return sum(self.last.values())

    @property
    def processes(self) -> int:
        return len(self.last)

    def python_peak_rss_mib(self) -> dict[str, float]:
        """Median and largest of the Python processes' peak VmRSS, MiB (NaN: none seen)."""
        peaks = sorted(self.python_rss.values())
        if not peaks:
            return {"n": 0, "median": math.nan, "max": math.nan}
        return {"n": len(peaks), "median": statistics.median(peaks) / 1024, "max": peaks[-1] / 1024}

    def python_cpu_s(self) -> dict[str, float]:
        """Median and largest CPU seconds of the Python processes seen (each a lower bound)."""
        cpus = sorted(self.python_cpu.values())
        if not cpus:
            return {"n": 0, "median": math.nan, "max": math.nan}
        return {"n": len(cpus), "median": statistics.median(cpus), "max": cpus[-1]}


def pid_of(sim: BenchSim) -> int:
    pid = sim.proc.pid
    if pid is None:
        raise BenchError("the simulator is not running")
    return pid


def kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def write_hold_worker(path: Path, runs: Path) -> Path:
    runs.mkdir(parents=True, exist_ok=True)
    path.write_text(HOLD_WORKER.format(runs=runs))
    path.chmod(0o755)
    return path


@contextlib.contextmanager
def relay(sim: BenchSim) -> Iterator[FaultProxy]:
    proxy = FaultProxy("127.0.0.1", sim.proc.port).start()
    try:
        yield proxy
    finally:
        proxy.close()


@contextlib.contextmanager
def running_orchestrator(orch: Orchestrator, extra_pids: Callable[[], list[int]]) -> Iterator[Orchestrator]:
    """Start ``orch``, wait until it is ready; at the end SIGTERM it (it detaches), SIGKILL its group,
    and SIGKILL whatever still works under its directory (machines it detached from)."""
    try:
        orch.start()
        orch.wait_ready(timeout=120)
        yield orch
    finally:
        orch.stop()
        kill_all(extra_pids())


# --- the brain ----------------------------------------------------------------------------------------


class Brain:
    """Enqueues sessions, notices remote (or hold worker) starts in ``runs``, ends sessions.

    Ending runs on ``ENDERS`` threads: telling a marker remote to exit waits until it has opened its FIFO,
    which on a loaded machine can take a while, and the brain must not hold every other session's end (or
    the enqueueing) behind it."""

    def __init__(self, sim: BenchSim, runs: Path, end: Callable[[str, int], None]) -> None:
        self.sim = sim
        self.admin = sim.admin
        self.runs = runs
        self.end_one = end
        self.enders = ThreadPoolExecutor(max_workers=ENDERS, thread_name_prefix="brain-end")
        self.ending: list[Future[None]] = []
        self.sent_at: dict[str, float] = {}
        self.started_at: dict[str, float] = {}
        self.starts: dict[str, int] = {}
        self.ended_at: dict[str, float] = {}
        self.seen: set[str] = set()

    def enqueue(self, count: int) -> None:
        for dummy in range(count):
            sent = time.time()
            self.sent_at[self.admin.enqueue(self.sim.outpost_id).session_id] = sent

    def scan(self, end_new: bool) -> int:
        """Record new starts (and end their sessions when ``end_new``); returns how many were new."""
        with os.scandir(self.runs) as entries:
            names = [entry.name for entry in entries if entry.name not in self.seen]
        for name in names:
            self.seen.add(name)
            sid, pid = name.rsplit(".", 1)
            self.starts[sid] = self.starts.get(sid, 0) + 1
            with contextlib.suppress(OSError):
                self.started_at.setdefault(sid, os.stat(self.runs / name).st_mtime)
            if end_new and sid not in self.ended_at:
                self.ended_at[sid] = time.time()
                self.end(sid, int(pid))
            elif sid in self.ended_at:  # started again after its end: a real remote would exit at once
                self.end(sid, int(pid))
        return len(names)

    def end(self, sid: str, pid: int) -> None:
        self.ending.append(self.enders.submit(self.end_one, sid, pid))
        if len(self.ending) > 64:
            self.check_ends(wait=False)

    def check_ends(self, wait: bool) -> None:
        """Raise the first error of the ends done (of all of them, once they finished, with ``wait``)."""
        for future in list(self.ending):
            if wait or future.done():
                future.result()
                self.ending.remove(future)

    def close(self) -> None:
        try:
            self.check_ends(wait=True)
        finally:
            self.enders.shutdown(wait=True, cancel_futures=True)

    def released(self) -> tuple[set[str], list[dict[str, Any]]]:
        records = self.sim.claim_records()
        return {r["session_id"] for r in records if r["action"] == "release"}, records


def end_marker(sim: BenchSim, runs: Path) -> Callable[[str, int], None]:
    def end(sid: str, pid: int) -> None:
        end_marker_session(sim.admin, runs, sid, pid)

    return end


def end_held(sim: BenchSim) -> Callable[[str, int], None]:
    def end(sid: str, pid: int) -> None:
        sim.admin.end_session(sid, "terminated")

    return end


def wait_released(
    brain: Brain, count: int, timeout: float, tick: float, observe: Callable[[], None]
) -> list[dict[str, Any]]:
    """``observe`` every ``tick`` until every session enqueued has a release record; returns the claim
    history."""
    deadline = time.monotonic() + timeout
    next_check = 0.0
    while True:
        observe()
        brain.check_ends(wait=False)
        if time.monotonic() >= next_check:
            released, records = brain.released()
            if released >= set(brain.sent_at):
                return records
            next_check = time.monotonic() + 1.0
        if time.monotonic() > deadline:
            raise BenchError(
                f"only {len(released)} of {count} sessions released after {timeout:g} s "
                f"({len(brain.started_at)} started)"
            )
        time.sleep(tick)


def drain_queue(
    brain: Brain,
    proxy: FaultProxy,
    count: int,
    timeout: float,
    tick: float,
    machines: Callable[[], int],
    tracker: CpuTracker,
    slots: Callable[[], float] = lambda: math.nan,
) -> dict[str, Any]:
    """Enqueue ``count`` sessions, end each once started, until every one was released; ``machines``
    (sampled every tick) counts the machines at that moment, ``slots`` (every 0.5 s) the sessions held,
    ``tracker`` the CPU of what runs in the machines."""
    before_counts, before_routes = proxy.snapshot()
    first_sent = time.time()
    next_slots = 0.0
    peak = 0
    peak_slots = math.nan

    def observe() -> None:
        nonlocal peak, peak_slots, next_slots
        brain.scan(end_new=True)
        peak = max(peak, machines())
        if time.monotonic() >= next_slots:
            held = slots()
            peak_slots = held if math.isnan(peak_slots) else max(peak_slots, held)
            next_slots = time.monotonic() + 0.5
        tracker.sample()

    try:
        for dummy in range(count):
            brain.enqueue(1)
            observe()  # sessions that start meanwhile are ended as promptly as later ones
        enqueued = time.time()
        records = wait_released(brain, count, timeout, tick, observe)
    finally:
        brain.close()
    after_counts, after_routes = proxy.snapshot()
    tracker.sample(force=True)
    found = analyse_claims(records, brain.ended_at)
    last_release = max(found.first_release_at.values())
    requests = after_counts.get("requests", 0) - before_counts.get("requests", 0)
    routes = {k: v - before_routes.get(k, 0) for k, v in after_routes.items() if v - before_routes.get(k, 0)}
    to_claim = [found.first_claim_at[sid] - sent for sid, sent in brain.sent_at.items()]
    to_start = [
        brain.started_at[sid] - sent for sid, sent in brain.sent_at.items() if sid in brain.started_at
    ]
    return {
        "sessions": count,
        "enqueue_s": enqueued - first_sent,
        "drain_s": last_release - first_sent,
        "wait_to_claim": summarize(to_claim),
        "wait_to_start": summarize(to_start),
        "claim_to_start": summarize(
            [brain.started_at[sid] - found.first_claim_at[sid] for sid in brain.started_at]
        ),
        "started_more_than_once": sum(1 for n in brain.starts.values() if n > 1),
        "claims_overlapping": found.overlapping,
        "claim_records": len([r for r in records if r["action"] == "claim"]),
        "requests": requests,
        "requests_per_session": requests / count,
        "routes_per_session": {k: round(v / count, 2) for k, v in sorted(routes.items())},
        "peak_machines": peak,
        "peak_sessions_held": peak_slots,
        "last_release_at": last_release,
    }


def leak_check(orch: Orchestrator, exclude: Sequence[int], timeout: float = 60.0) -> dict[str, Any]:
    """Once every claim is released: how long until the machines directory is empty (at most ``timeout``),
    and what is left then (machine entries, processes working under the machines directory)."""
    start = time.monotonic()
    with contextlib.suppress(BenchError):
        wait_until(
            lambda: not orch.machines() and not pids_working_under(orch.machines_dir, exclude),
            timeout=timeout,
            interval=0.1,
            what="the machines to be torn down",
        )
    return {
        "teardown_wait_s": time.monotonic() - start,
        "machines_left": len(orch.machines()),
        "processes_left": len(pids_working_under(orch.machines_dir, exclude))
        if orch.machines_dir.exists()
        else 0,
    }


# --- run 1 ------------------------------------------------------------------------------------------------


def run_orchestrated(args: argparse.Namespace, root: Path, say: Out) -> dict[str, Any]:
    with bench_sim(root, "drain-orchestrator") as sim, relay(sim) as proxy:
        runs = sim.root / "runs"
        if args.worker == "real":
            publish_marker_remote(sim.admin, runs)
            extra: list[str] = []
            end = end_marker(sim, runs)
        else:
            hold = write_hold_worker(sim.root / "hold-worker.sh", runs)
            extra = ["--driver-opt", f"worker_command={hold}"]
            end = end_held(sim)
        orch = Orchestrator(sim, "orch", proxy.url, "--max-concurrent", str(args.concurrency), *extra)
        sim_pid = pid_of(sim)
        with running_orchestrator(orch, lambda: pids_working_under(sim.root, [sim_pid])):
            load = os.getloadavg()
            say(f"  orchestrator ready (pid {orch.pid}); enqueueing {args.sessions} sessions")
            brain = Brain(sim, runs, end)
            cpu_before = orch.cpu_seconds()
            loop_before = orch.loop_thread_times()
            tracker = CpuTracker(orch.machines_dir.parent, [orch.pid, sim_pid])
            result = drain_queue(
                brain, proxy, args.sessions, args.timeout, args.tick, lambda: len(orch.machines()), tracker,
                lambda: orch.metric("active_workers"),
            )  # fmt: skip
            result["orchestrator_cpu_s"] = orch.cpu_seconds() - cpu_before
            loop_after = orch.loop_thread_times()
            result["loop_thread_run_s"] = loop_after[0] - loop_before[0]
            result["loop_thread_runqueue_wait_s"] = loop_after[1] - loop_before[1]
            result["children_cpu_s"] = tracker.total
            result["children_seen"] = tracker.processes
            result["machine_worker_peak_rss_mib"] = tracker.python_peak_rss_mib()
            result["machine_worker_cpu_s"] = tracker.python_cpu_s()
            result["orchestrator_rss_mib"] = orch.rss_kib() / 1024
            result["cpu_with_children_s"] = result["orchestrator_cpu_s"] + tracker.total
            result["load_before"] = load
            result["load_after"] = os.getloadavg()
            result["leaks_after_release"] = leak_check(orch, [orch.pid, sim_pid])
            result["start_seconds_metric_mean"] = orch.metric("session_start_seconds_sum") / max(
                1.0, orch.metric("session_start_seconds_count")
            )
            result["infrastructure_errors"] = orch.metric("infrastructure_errors_total")
            result["sessions_failed"] = orch.metric("sessions_failed_total")
        result["machines_left_after_stop"] = len(orch.machines())
        left = pids_working_under(sim.root, [sim_pid])
        result["processes_left_after_stop"] = len(left)
        kill_all(left)
        result["worker"] = args.worker
        return result


def run_baseline(args: argparse.Namespace, root: Path, say: Out) -> dict[str, Any]:
    per = max(1, math.ceil(args.concurrency / args.baseline_workers))
    with bench_sim(root, "drain-baseline") as sim, relay(sim) as proxy:
        runs = sim.root / "runs"
        publish_marker_remote(sim.admin, runs)
        workers = [Worker(sim, f"w{i}", "--max-sessions", str(per)) for i in range(args.baseline_workers)]
        for worker in workers:
            worker.env["DEVIN_API_URL"] = proxy.url
        sim_pid = pid_of(sim)
        try:
            with running_workers(workers):
                load = os.getloadavg()
                say(f"  {len(workers)} worker(s) with --max-sessions {per} ready; enqueueing {args.sessions}")
                brain = Brain(sim, runs, end_marker(sim, runs))
                cpu_before = sum(w.cpu_seconds() for w in workers)
                tracker = CpuTracker(sim.root / "workers", [sim_pid, *(w.pid for w in workers)])
                result = drain_queue(brain, proxy, args.sessions, args.timeout, args.tick, lambda: 0, tracker)
                result["worker_cpu_s"] = sum(w.cpu_seconds() for w in workers) - cpu_before
                result["children_cpu_s"] = tracker.total
                result["children_seen"] = tracker.processes
                result["worker_rss_mib"] = sum(w.rss_kib() for w in workers) / 1024
                result["cpu_with_children_s"] = result["worker_cpu_s"] + tracker.total
                result["load_before"] = load
                result["load_after"] = os.getloadavg()
                exclude = [sim_pid, *(w.pid for w in workers)]
                start = time.monotonic()
                with contextlib.suppress(BenchError):
                    wait_until(lambda: not pids_working_under(sim.root, exclude), timeout=60, what="remotes")
                result["leaks_after_release"] = {
                    "teardown_wait_s": time.monotonic() - start,
                    "machines_left": 0,
                    "processes_left": len(pids_working_under(sim.root, exclude)),
                }
        finally:
            left = pids_working_under(sim.root, [sim_pid])
            kill_all(left)
        result["processes_left_after_stop"] = len(left)
        result["baseline_workers"] = args.baseline_workers
        result["max_sessions_each"] = per
        return result


# --- run 2 ------------------------------------------------------------------------------------------------


def sample_window(orch: Orchestrator, proxy: FaultProxy, sim_pid: int, seconds: float) -> dict[str, Any]:
    """Sample the orchestrator every second for ``seconds``: RSS, threads, fds, streams; CPU and requests
    over the whole window."""
    rss: list[int] = []
    threads: list[int] = []
    fds: list[int] = []
    streams: list[int] = []
    lags: list[float] = []
    start = time.monotonic()
    cpu0, sim_cpu0 = orch.cpu_seconds(), cpu_seconds_of(sim_pid)
    run0, wait0 = orch.loop_thread_times()
    counts0, routes0 = proxy.snapshot()
    while time.monotonic() - start < seconds:
        orch._check_alive()
        rss.append(orch.rss_kib())
        threads.append(orch.proc_status("Threads"))
        fds.append(orch.open_fds())
        streams.append(proxy.open_streams())
        lags.append(orch.healthz_latency())
        time.sleep(1.0)
    elapsed = time.monotonic() - start
    cpu, sim_cpu = orch.cpu_seconds() - cpu0, cpu_seconds_of(sim_pid) - sim_cpu0
    run1, wait1 = orch.loop_thread_times()
    counts1, routes1 = proxy.snapshot()
    answered = [lag for lag in lags if not math.isnan(lag)]
    return {
        "healthz_s": summarize(answered),
        "healthz_unanswered": len(lags) - len(answered),
        "loop_thread_run_pct": 100 * (run1 - run0) / elapsed,
        "loop_thread_runqueue_wait_pct": 100 * (wait1 - wait0) / elapsed,
        "window_s": elapsed,
        "rss_mib": statistics.median(rss) / 1024,
        "rss_max_mib": max(rss) / 1024,
        "threads": statistics.median(threads),
        "open_fds": statistics.median(fds),
        "watch_streams_min": min(streams),
        "watch_streams_max": max(streams),
        "cpu_s": cpu,
        "cpu_pct": 100 * cpu / elapsed,
        "cpu_s_per_min": 60 * cpu / elapsed,
        "sim_cpu_pct": 100 * sim_cpu / elapsed,
        "requests_per_s": (counts1.get("requests", 0) - counts0.get("requests", 0)) / elapsed,
        "routes_per_s": {
            k: round((v - routes0.get(k, 0)) / elapsed, 2)
            for k, v in sorted(routes1.items())
            if v - routes0.get(k, 0)
        },
    }


def run_live(args: argparse.Namespace, root: Path, say: Out) -> dict[str, Any]:
    with bench_sim(root, "live") as sim, relay(sim) as proxy:
        runs = sim.root / "runs"
        hold = write_hold_worker(sim.root / "hold-worker.sh", runs)
        orch = Orchestrator(
            sim,
            "orch",
            proxy.url,
            "--max-concurrent",
            str(args.live),
            "--driver-opt",
            f"worker_command={hold}",
        )
        sim_pid = pid_of(sim)
        result: dict[str, Any] = {"sessions": args.live}
        with running_orchestrator(orch, lambda: pids_working_under(sim.root, [sim_pid])):
            time.sleep(args.settle)
            say(f"  idle orchestrator (pid {orch.pid}): sampling {args.window:g} s")
            result["load_idle"] = os.getloadavg()
            result["idle"] = sample_window(orch, proxy, sim_pid, args.window)
            brain = Brain(sim, runs, end_held(sim))
            first = time.time()
            brain.enqueue(args.live)
            result["enqueue_s"] = time.time() - first
            deadline = time.monotonic() + args.timeout
            while len(brain.started_at) < args.live:
                brain.scan(end_new=False)
                orch._check_alive()
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"only {len(brain.started_at)} of {args.live} sessions live after {args.timeout:g} s"
                    )
                time.sleep(args.tick)
            result["fill_s"] = max(brain.started_at.values()) - first
            result["wait_to_start"] = summarize([brain.started_at[s] - t for s, t in brain.sent_at.items()])
            say(f"  {args.live} sessions live after {result['fill_s']:.1f} s; settling {args.settle:g} s, "
                f"then sampling {args.window:g} s")  # fmt: skip
            time.sleep(args.settle)
            result["load_live"] = os.getloadavg()
            result["live"] = sample_window(orch, proxy, sim_pid, args.window)
            result["live"]["active_workers"] = orch.metric("active_workers")
            result["live"]["hold_processes"] = len(pids_working_under(orch.machines_dir, [orch.pid, sim_pid]))
            say(f"  ending {args.live} sessions")
            ended = time.time()
            for sid in brain.sent_at:
                brain.ended_at[sid] = time.time()
                sim.admin.end_session(sid, "terminated")
            wait_until(
                lambda: brain.released()[0] >= set(brain.sent_at),
                timeout=args.timeout,
                interval=1.0,
                what="every live session to be released",
            )
            result["release_all_s"] = time.time() - ended
            brain.close()
            result["leaks_after_release"] = leak_check(orch, [orch.pid, sim_pid])
        result["machines_left_after_stop"] = len(orch.machines())
        left = pids_working_under(sim.root, [sim_pid])
        result["processes_left_after_stop"] = len(left)
        kill_all(left)
        return result


# --- the report -----------------------------------------------------------------------------------------


def ratio(a: float, b: float) -> str:
    if not b or math.isnan(a) or math.isnan(b):
        return "n/a"
    return f"x{a / b:.2f}"


def fmt_ms(fig: dict[str, float]) -> str:
    if not fig["n"]:
        return "no answers"
    return " ".join(f"{key} {ms(fig[key])}" for key in ("p50", "p99", "max"))


def fmt_s(fig: dict[str, float]) -> str:
    if not fig["n"]:
        return "no samples"
    return " ".join(f"{key} {fig[key]:.2f}s" for key in ("p50", "p90", "p99", "max"))


def report_drain(orch: dict[str, Any], base: Optional[dict[str, Any]], say: Out) -> None:
    say("")
    say(f"run 1: {orch['sessions']} sessions, orchestrator worker: "
        + ("real `devin-outposts worker start --session` + marker remote" if orch["worker"] == "real"
           else "hold script (no real worker)"))  # fmt: skip
    for fig in (orch, base):
        if fig:
            fig["cpu_per_session_s"] = fig["cpu_with_children_s"] / fig["sessions"]
    rows = [
        ("enqueueing all sessions (the brain)", "enqueue_s", None),
        ("drain (first enqueue -> last release)", "drain_s", None),
        ("queue wait -> claim p50", "wait_to_claim", "p50"),
        ("queue wait -> claim p99", "wait_to_claim", "p99"),
        ("queue wait -> started p50", "wait_to_start", "p50"),
        ("queue wait -> started p99", "wait_to_start", "p99"),
        ("claim -> started p50", "claim_to_start", "p50"),
        ("fleet API requests per session", "requests_per_session", None),
        ("CPU per session (with its processes)", "cpu_per_session_s", None),
    ]
    say(f"  {'':40s} {'orchestrator':>14s} {'baseline':>14s} {'ratio':>8s}")
    for label, key, sub in rows:
        a = orch[key][sub] if sub else orch[key]
        b = (base[key][sub] if sub else base[key]) if base else math.nan
        unit = "" if key == "requests_per_session" else " s"  # the rest are seconds
        say(f"  {label:40s} {a:12.2f}{unit:2s} {b:12.2f}{unit:2s} {ratio(a, b):>8s}")
    say(
        f"  orchestrator: wait -> started {fmt_s(orch['wait_to_start'])}; peak machines "
        f"{orch['peak_machines']}, peak sessions held (active_workers, every 0.5 s) "
        f"{orch['peak_sessions_held']:g}; "
        f"started more than once {orch['started_more_than_once']}; "
        f"overlapping claims {orch['claims_overlapping']}; claim records {orch['claim_records']}"
    )
    leaks = orch["leaks_after_release"]
    say(
        f"  leaked machines: {leaks['machines_left']} machine dirs and {leaks['processes_left']} processes "
        f"{leaks['teardown_wait_s']:.1f} s after the last release; after the orchestrator stopped: "
        f"{orch['machines_left_after_stop']} dirs, {orch['processes_left_after_stop']} processes"
    )
    say(f"  orchestrator CPU during the drain {orch['orchestrator_cpu_s']:.1f} s, its machines' processes "
        f"(sampled) {orch['children_cpu_s']:.1f} s over {orch['children_seen']}; infrastructure errors "
        f"{orch['infrastructure_errors']:g}; sessions failed {orch['sessions_failed']:g}; "
        f"session_start_seconds mean (metric) {orch['start_seconds_metric_mean']:.2f} s")  # fmt: skip
    say(f"  the orchestrator's event-loop thread ran {orch['loop_thread_run_s']:.1f} s and waited for a CPU "
        f"{orch['loop_thread_runqueue_wait_s']:.1f} s of the drain (schedstat)")  # fmt: skip
    peak = orch["machine_worker_peak_rss_mib"]
    cpu = orch["machine_worker_cpu_s"]
    if peak["n"]:
        say(f"  each machine's Python worker: VmRSS peak {peak['median']:.1f} MiB (median of {peak['n']} "
            f"seen, max {peak['max']:.1f}), CPU {cpu['median']:.2f} s (median, max {cpu['max']:.2f}; both "
            f"sampled every 0.25 s: lower bounds)")  # fmt: skip
    say(f"  the orchestrator's VmRSS at the end {orch['orchestrator_rss_mib']:.1f} MiB")
    say(f"  orchestrator requests per session by route: {orch['routes_per_session']}")
    if base:
        say(f"  baseline: {base['baseline_workers']} worker(s) x --max-sessions {base['max_sessions_each']}; "
            f"wait -> started {fmt_s(base['wait_to_start'])}; worker CPU {base['worker_cpu_s']:.1f} s, "
            f"remotes (sampled) {base['children_cpu_s']:.1f} s; worker VmRSS "
            f"{base['worker_rss_mib']:.1f} MiB; remotes left "
            f"{base['leaks_after_release']['processes_left']}; started more than once "
            f"{base['started_more_than_once']}")  # fmt: skip
        say(f"  baseline requests per session by route: {base['routes_per_session']}")


def report_live(live: dict[str, Any], say: Out) -> None:
    idle, held = live["idle"], live["live"]
    n = live["sessions"]
    say("")
    say(f"run 2: {n} live sessions held by the hold script (not real workers), one orchestrator")
    say(f"  filled {n} slots in {live['fill_s']:.1f} s (enqueue took {live['enqueue_s']:.1f} s); "
        f"wait -> started {fmt_s(live['wait_to_start'])}")  # fmt: skip
    say(f"  {'':38s} {'live':>12s} {'idle (baseline)':>16s} {'ratio':>8s}")
    for label, key, fmt in (
        ("RSS median (MiB)", "rss_mib", "{:12.1f}"),
        ("RSS max (MiB)", "rss_max_mib", "{:12.1f}"),
        ("CPU % of one core", "cpu_pct", "{:12.2f}"),
        ("CPU s per minute", "cpu_s_per_min", "{:12.2f}"),
        ("threads", "threads", "{:12.0f}"),
        ("open fds", "open_fds", "{:12.0f}"),
        ("fleet API requests/s", "requests_per_s", "{:12.2f}"),
        ("simulator CPU %", "sim_cpu_pct", "{:12.2f}"),
        ("event loop thread on CPU %", "loop_thread_run_pct", "{:12.2f}"),
        ("event loop thread waiting for a CPU %", "loop_thread_runqueue_wait_pct", "{:12.2f}"),
    ):
        a, b = fmt.format(held[key]), fmt.format(idle[key])
        say(f"  {label:38s} {a} {b:>16s} {ratio(held[key], idle[key]):>8s}")
    per = (held["rss_mib"] - idle["rss_mib"]) * 1024 / n
    say(f"  RSS per live session: {per:.1f} KiB; watch streams open at the relay: "
        f"{held['watch_streams_min']}-{held['watch_streams_max']} (idle {idle['watch_streams_min']}-"
        f"{idle['watch_streams_max']}); active_workers {held['active_workers']:g}; hold processes "
        f"{held['hold_processes']}")  # fmt: skip
    say(f"  /healthz answer time (event loop lag), live: {fmt_ms(held['healthz_s'])}, "
        f"{held['healthz_unanswered']} unanswered in 30 s; idle: {fmt_ms(idle['healthz_s'])}")  # fmt: skip
    say(f"  live requests/s by route: {held['routes_per_s']}")
    leaks = live["leaks_after_release"]
    say(
        f"  ended all {n}: released in {live['release_all_s']:.1f} s; leaked {leaks['machines_left']} "
        f"machine dirs, {leaks['processes_left']} processes ({leaks['teardown_wait_s']:.1f} s after); "
        f"after stop "
        f"{live['machines_left_after_stop']} dirs, {live['processes_left_after_stop']} processes"
    )


# --- main -----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="50 sessions at 10, 100 live, 15 s windows (a validation run)")
    add("--sessions", type=int, default=200, help="run 1: sessions to drain (200)")
    add(
        "--concurrency",
        type=int,
        default=50,
        help="run 1: --max-concurrent, and the baseline's capacity (50)",
    )
    add(
        "--worker",
        choices=("real", "hold"),
        default="real",
        help="run 1: what each machine runs: a real worker + marker remote, or the hold script (real)",
    )
    add("--baseline-workers", type=int, default=1, help="run 1: worker processes of the baseline (1)")
    add("--live", type=int, default=500, help="run 2: sessions held live at once (500)")
    add("--window", type=float, default=60.0, help="run 2: seconds of each steady-state window (60)")
    add("--settle", type=float, default=10.0, help="run 2: seconds before each window (10)")
    add("--tick", type=float, default=0.05, help="seconds between the brain's polls (0.05)")
    add("--timeout", type=float, default=900.0, help="seconds a drain or a fill may take (900)")
    add("--only", choices=("drain", "live"), help="run one part only")
    add("--no-baseline", action="store_true", help="run 1 without the baseline")
    add("--keep", metavar="DIR", help="keep the simulators' and processes' files under DIR")
    add("--json", metavar="FILE", help="also write the figures as JSON ('-' = stdout)")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.concurrency, args.live, args.window, args.settle = 50, 10, 100, 15.0, 5.0
    if min(args.sessions, args.concurrency, args.live, args.baseline_workers) < 1:
        parser.error("--sessions, --concurrency, --live and --baseline-workers must be at least 1")
    return args


def commit() -> str:
    git = shutil.which("git")
    if git is None:
        return "?"
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        argv = [git, "-C", str(REPO), "rev-parse", "--short", "HEAD"]
        return subprocess.run(argv, capture_output=True, check=True, text=True).stdout.strip()
    return "?"


def bench(args: argparse.Namespace, root: Path, say: Out) -> dict[str, Any]:
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": commit(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_at_start": os.getloadavg(),
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "keep")},
    }
    if args.only in (None, "drain"):
        say(f"run 1 (orchestrator, --worker {args.worker}) {time.strftime('%H:%M:%S')}")
        result["drain_orchestrator"] = run_orchestrated(args, root, say)
        if not args.no_baseline:
            say(f"run 1 (baseline) {time.strftime('%H:%M:%S')}")
            result["drain_baseline"] = run_baseline(args, root, say)
        report_drain(result["drain_orchestrator"], result.get("drain_baseline"), say)
    if args.only in (None, "live"):
        say(f"run 2 ({args.live} live) {time.strftime('%H:%M:%S')}")
        result["live"] = run_live(args, root, say)
        report_live(result["live"], say)
    result["load_at_end"] = os.getloadavg()
    return result


def main() -> int:
    args = parse_args()
    say = reporter(args.json)

    say(f"orchestrator benchmark {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, commit {commit()}, "
        f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}: run 1 {args.sessions} "
        f"sessions at {args.concurrency} (--worker {args.worker}), run 2 {args.live} live, "
        f"{args.window:g} s windows")  # fmt: skip
    try:
        result = in_work_dir(args.keep, "devin-bench-orch-", lambda root: bench(args, root, say))
    except (BenchError, SimAdminError, OSError, RuntimeError) as exc:
        say(f"benchmark broke: {exc}")
        return 1
    say("")
    say(f"machine load at the end: {' '.join(f'{x:.2f}' for x in result['load_at_end'])}")
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
