"""Soak: a few real workers for an hour with a 10 s claim TTL, sessions of random length, and faults.

Set-up: one ``devin-outposts-sim serve`` process (``--claim-ttl 10``; other settings default), a
fault-injecting HTTP proxy (``_faultproxy.py``) between the workers and the simulator's fleet API, and
``--workers`` (4) real ``devin-outposts worker start`` processes (token in the environment, JSON logs,
metrics on a loopback port) whose ``--api-url`` is the proxy. The remote is the marker ``/bin/sh`` script
of ``_harness.py``: it records its start in a file and exits 0 when the benchmark, playing the brain,
has marked its session ``terminated``. Binary downloads go to the simulator directly: the faults are
the fleet API's.

The brain (this script, through the admin API, which the faults never touch) enqueues sessions at random
(a Poisson process of rate ``load * workers / mean length``) and ends each one when its length (uniform
in ``--min-length``..``--max-length``) has passed since its remote first started. A remote that starts
again for a session that has already ended is told to exit at once, as a real remote does when it
connects to a finished session. By default a session stays ``pending`` while it is served (as with any
remote that never connects to the gateway), so only the worker's renewals keep its claim alive: that is
what the short TTL tests. With ``--mark-running`` the brain marks it ``running`` once its remote starts,
as it would for a real remote; the simulator then never expires its claim.

Every ``--fault-interval`` seconds (180) one fault is injected, in rotation:

1. **SSE drops**: every open watch stream is cut (a reset in the middle of the stream), three times,
   two seconds apart;
2. **API outage**: the proxy refuses connections and resets open ones for ``--outage-secs`` (30);
3. **burst of 500s**: every request is answered 500 for ``--burst-secs`` (5);
4. **kill -9** of a worker (always the same one, ``--kill-worker``, so the others run the whole soak and
   their memory can be compared from start to end), restarted ``--restart-delay`` seconds (2) later with
   the same data directory and so the same acceptor id, as systemd would restart it. Its remote is left
   running, as after a crash; the restarted worker must stop it and take its session back.

A worker that exits on its own is counted as a crash and restarted the same way.

After ``--duration`` (3600 s; ``--quick``: 300 s, a fault every 60 s), enqueues and faults stop, and the
workers get up to ``--max-length`` + 180 s to serve what is left before they are stopped (SIGTERM).
Reported:

* **expired claims on live sessions**: ``expire`` records in the simulator's claim history between a
  session's first claim and the moment the brain ended it, each attributed to the fault whose window
  (from its start to its end plus one TTL) it fell in, or to none;
* **double serves**: two remotes of one session, started by different workers, seen alive at the same
  moment (the remotes are polled every ``--tick`` seconds), and the *possible* ones: a remote started
  before another worker's remote of the session was seen dead (an overlap shorter than a poll, or a
  handover within one poll: the polls cannot tell); also claims that overlap another acceptor's
  claim in the claim history (the simulator letting two in), sessions claimed by more than one worker
  (after an expiry, or a stale copy claimed and released at once: not a double serve by itself) and
  claims of sessions already ended;
* **lost sessions**: enqueued, but never served by the end of the drain; and claims never released;
* **queue wait** (enqueue request sent -> first claim record) p50/p90/p99/max, for sessions enqueued in
  quiet periods (the baseline) and in fault windows (start to end plus 10 s);
* **worker memory**: VmRSS from ``/proc`` every ``--rss-interval`` seconds, median of the first and of
  the last ``min(600 s, duration / 4)`` of each worker process that lived through the whole soak, and of
  each quarter of the soak (growth that levels off is warm-up);
* the faults injected (how many of each, streams cut, 500s answered), the workers' own counters
  (``/metrics``) and the warnings, errors and tracebacks in their logs.

Run: ``.venv/bin/python benchmarks/soak.py [--quick] [--duration SECS] [--json FILE|-]``.
The figures are measurements, not assertions: the exit code is 0 unless the benchmark itself broke.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from _faultproxy import FaultProxy
from devin_outposts.core.processes import process_alive
from devin_outposts_sim.admin_client import SimAdmin, SimAdminError
from devin_outposts_sim.testing import SimProcess

from _harness import (
    METRICS_LINE,
    BenchError,
    BenchSim,
    Worker,
    analyse_claims,
    end_marker_session,
    in_work_dir,
    publish_marker_remote,
    reporter,
    summarize,
    write_json,
)

Out = Callable[[str], None]
FAULTS = ("sse_drop", "outage", "burst_500", "kill_9")
SSE_DROPS = 3
SSE_DROP_GAP = 2.0
#: A session enqueued this long after a fault ended still counts as enqueued in its window.
FAULT_WAKE = 10.0
COUNTERS = (
    "sessions_claimed_total",
    "sessions_served_total",
    "sessions_failed_total",
    "claim_conflicts_total",
    "renewals_total",
    "renewal_failures_total",
    "watch_reconnects_total",
    "remote_restarts_total",
    "api_errors_total",
)


# --- workers that can be killed and restarted ---------------------------------------------------------


class SoakWorker(Worker):
    """A harness worker that is restarted after ``kill -9`` like a systemd unit.

    A restart appends to the same log, where the metrics port of the previous process is still written:
    the port is looked for only in what this process wrote.
    """

    def __init__(self, sim: BenchSim, name: str, *args: str) -> None:
        super().__init__(sim, name, *args)
        self.log_offset = 0
        self.incarnation = 0
        self.killed_at: Optional[float] = None  #: set while a killed process waits for its restart

    def start(self) -> SoakWorker:
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._port = None
        self._terminated = False
        self.incarnation += 1
        super().start()
        return self

    def metrics_port(self) -> Optional[int]:
        if self._port is None:
            with contextlib.suppress(OSError), open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                found = METRICS_LINE.search(log.read().decode(errors="replace"))
                if found:
                    self._port = int(found.group(1))
        return self._port

    def kill9(self) -> None:
        """SIGKILL the worker process only: its remote lives on, as after a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    @property
    def workdir(self) -> Path:
        return self.root / "work"

    def counters(self) -> dict[str, float]:
        body = self._get("/metrics")
        if body is None:
            return {}
        found: dict[str, float] = {}
        for line in body.splitlines():
            for name in COUNTERS:
                if line.startswith(f"devin_outposts_worker_{name}"):
                    with contextlib.suppress(ValueError, IndexError):
                        found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return found


# --- the run's records ----------------------------------------------------------------------------


@dataclass
class Remote:
    pid: int
    session_id: str
    owner: str  #: the worker whose working directory it runs in
    started: float
    died: Optional[float] = None


@dataclass
class Fault:
    kind: str
    start: float
    end: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Soak:
    """Everything the brain saw and did, for the report."""

    sent_at: dict[str, float] = field(default_factory=dict)
    length: dict[str, float] = field(default_factory=dict)
    remotes: dict[int, Remote] = field(default_factory=dict)
    by_session: dict[str, list[int]] = field(default_factory=dict)
    end_due: dict[str, float] = field(default_factory=dict)
    ended_at: dict[str, float] = field(default_factory=dict)
    double_serves: dict[str, tuple[float, list[str]]] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    rss: dict[tuple[str, int], list[tuple[float, int]]] = field(default_factory=dict)
    counters: dict[tuple[str, int], dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


# --- the brain ----------------------------------------------------------------------------------------


class Brain:
    """Enqueues, notices remote starts and deaths, ends sessions, injects faults, samples memory."""

    def __init__(
        self,
        args: argparse.Namespace,
        sim: BenchSim,
        proxy: FaultProxy,
        workers: Sequence[SoakWorker],
        runs: Path,
        say: Out,
    ) -> None:
        self.args = args
        self.sim = sim
        self.admin = sim.admin
        self.proxy = proxy
        self.workers = workers
        self.runs = runs
        self.say = say
        self.record = Soak()
        self.rng = random.Random(args.seed)
        self.live: set[int] = set()
        self.seen_files: set[str] = set()
        self.actions: list[tuple[float, str, int]] = []  # (when, action, fault index)
        self.restart_due: dict[str, float] = {}
        self.next_rss = 0.0

    # sessions ---------------------------------------------------------------------------------------

    def arrivals(self, start: float) -> Iterator[tuple[float, float]]:
        """(enqueue time, session length) pairs: Poisson arrivals at the configured load."""
        mean = (self.args.min_length + self.args.max_length) / 2
        rate = self.args.load * len(self.workers) / mean
        at = start
        while True:
            at += self.rng.expovariate(rate)
            yield at, self.rng.uniform(self.args.min_length, self.args.max_length)

    def enqueue(self, length: float) -> None:
        sent = time.time()
        sid = self.admin.enqueue(self.sim.outpost_id).session_id
        self.record.sent_at[sid] = sent
        self.record.length[sid] = length

    def owner_of(self, pid: int) -> str:
        try:
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:
            return "?"
        for worker in self.workers:
            if cwd == worker.workdir or worker.workdir in cwd.parents:
                return worker.root.name
        return "?"

    def scan_remotes(self) -> None:
        """New marker files are new remotes; a remote of an ended session is told to exit at once."""
        with os.scandir(self.runs) as entries:
            names = [entry.name for entry in entries if entry.name not in self.seen_files]
        for name in names:
            self.seen_files.add(name)
            sid, pid_text = name.rsplit(".", 1)
            pid = int(pid_text)
            started = os.stat(self.runs / name).st_mtime
            remote = Remote(pid, sid, self.owner_of(pid), started)
            self.record.remotes[pid] = remote
            self.record.by_session.setdefault(sid, []).append(pid)
            self.live.add(pid)
            if sid in self.record.ended_at:
                self.end_remote(sid, pid)
            elif sid not in self.record.end_due:
                self.record.end_due[sid] = started + self.record.length.get(sid, self.args.min_length)
                if self.args.mark_running:
                    self.admin_call(self.admin.set_status, sid, "running")

    def check_liveness(self, now: float) -> None:
        alive_by_session: dict[str, set[str]] = {}
        for pid in list(self.live):
            remote = self.record.remotes[pid]
            if not process_alive(pid) or is_zombie(pid):
                remote.died = now
                self.live.discard(pid)
                continue
            if remote.owner != "?":  # its cwd could not be read: it died at once
                alive_by_session.setdefault(remote.session_id, set()).add(remote.owner)
        for sid, owners in alive_by_session.items():
            if len(owners) > 1 and sid not in self.record.double_serves:
                self.record.double_serves[sid] = (now, sorted(owners))
                self.say(f"  DOUBLE SERVE: session {sid} runs on {', '.join(sorted(owners))}")

    def end_due_sessions(self, now: float) -> None:
        for sid, due in list(self.record.end_due.items()):
            if due > now or sid in self.record.ended_at:
                continue
            self.record.ended_at[sid] = time.time()
            alive = [pid for pid in self.record.by_session.get(sid, []) if pid in self.live]
            if not alive:  # its worker was killed and its remote stopped: the session ends anyway
                self.admin_call(self.admin.set_status, sid, "terminated")
            for pid in alive:
                self.end_remote(sid, pid)

    def end_remote(self, sid: str, pid: int) -> None:
        try:
            end_marker_session(self.admin, self.runs, sid, pid)
        except (BenchError, SimAdminError, OSError) as exc:
            self.record.errors.append(f"ending {sid} (pid {pid}): {exc}")

    def admin_call(self, method: Callable[..., Any], *args: Any) -> None:
        try:
            method(*args)
        except SimAdminError as exc:
            self.record.errors.append(f"{method.__name__}{args}: {exc}")

    # faults -----------------------------------------------------------------------------------------

    def schedule_faults(self, start: float, end: float) -> None:
        at, index = start + self.args.fault_interval, 0
        while at < end:
            kind = FAULTS[index % len(FAULTS)]
            self.record.faults.append(Fault(kind, at, at))
            fault = len(self.record.faults) - 1
            if kind == "sse_drop":
                for drop in range(SSE_DROPS):
                    self.actions.append((at + drop * SSE_DROP_GAP, "drop", fault))
            elif kind == "outage":
                self.actions += [(at, "down", fault), (at + self.args.outage_secs, "up", fault)]
            elif kind == "burst_500":
                self.actions += [(at, "fail", fault), (at + self.args.burst_secs, "unfail", fault)]
            else:
                self.actions.append((at, "kill", fault))
            at += self.args.fault_interval
            index += 1
        self.actions.sort()

    def run_actions(self, now: float, *, final: bool = False) -> None:
        while self.actions and (final or self.actions[0][0] <= now):
            dummy_when, action, index = self.actions.pop(0)
            fault = self.record.faults[index]
            if final and action in ("drop", "down", "fail", "kill"):
                continue  # the soak is over: only undo what is still in force
            fault.end = max(fault.end, time.time())
            if action == "drop":
                fault.detail["streams_cut"] = fault.detail.get("streams_cut", 0) + self.proxy.drop_streams()
            elif action == "down":
                fault.detail["connections_reset"] = self.proxy.go_down()
            elif action == "up":
                self.proxy.come_back()
            elif action == "fail":
                fault.detail["before"] = self.proxy.counts["injected_500"]
                self.proxy.set_failing(True)
            elif action == "unfail":
                self.proxy.set_failing(False)
                time.sleep(0.05)  # the proxy's loop applies it: count what the burst answered
                before = fault.detail.pop("before", 0)
                fault.detail["answered_500"] = self.proxy.counts["injected_500"] - before
            elif action == "kill":
                worker = self.workers[self.args.kill_worker % len(self.workers)]
                fault.detail["worker"] = worker.root.name
                self.sample_worker(worker, time.time())  # its last memory and counters
                worker.kill9()
                worker.killed_at = time.time()
                self.restart_due[worker.root.name] = time.time() + self.args.restart_delay
                fault.end = self.restart_due[worker.root.name]
            self.say(f"  {time.strftime('%H:%M:%S')} fault {index + 1} {fault.kind}: {action} {fault.detail}")

    def supervise_workers(self, now: float) -> None:
        """Restart killed workers when due, and crashed ones (an exit nobody asked for) as systemd would."""
        for worker in self.workers:
            name = worker.root.name
            if name in self.restart_due:
                if now >= self.restart_due[name]:
                    del self.restart_due[name]
                    worker.killed_at = None
                    worker.start()
                continue
            if worker.proc is not None and worker.proc.poll() is not None:
                self.record.crashes.append(
                    {
                        "worker": name,
                        "at": time.time(),
                        "exit_code": worker.proc.returncode,
                        "log_tail": worker.log_tail(15),
                    }
                )
                self.say(f"  worker {name} EXITED with {worker.proc.returncode}; restarting it")
                self.restart_due[name] = now + self.args.restart_delay

    # memory and counters ----------------------------------------------------------------------------

    def sample_worker(self, worker: SoakWorker, now: float) -> None:
        if worker.proc is None or worker.proc.poll() is not None:
            return
        key = (worker.root.name, worker.incarnation)
        with contextlib.suppress(OSError, BenchError):
            self.record.rss.setdefault(key, []).append((now, worker.rss_kib()))
        counters = worker.counters()
        if counters:
            self.record.counters[key] = counters

    def sample(self, now: float) -> None:
        if now < self.next_rss:
            return
        self.next_rss = now + self.args.rss_interval
        for worker in self.workers:
            self.sample_worker(worker, time.time())

    # the loop ---------------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self.run_actions(now)
        self.supervise_workers(now)
        self.scan_remotes()
        self.check_liveness(time.time())
        self.end_due_sessions(time.time())
        self.sample(now)

    def run(self) -> tuple[float, float]:
        """The soak, then the drain; returns (start, end of the soak proper) as wall-clock times."""
        start = time.time()
        end = start + self.args.duration
        self.schedule_faults(start, end)
        arrivals = self.arrivals(start)
        next_at, next_length = next(arrivals)
        last_report = start
        while True:
            now = time.time()
            if now >= end:
                break
            while next_at <= now:
                self.admin_call(self.enqueue, next_length)
                next_at, next_length = next(arrivals)
            self.tick(now)
            if now - last_report >= 60:
                last_report = now
                self.progress(now - start)
            time.sleep(self.args.tick)
        self.run_actions(time.time(), final=True)  # the proxy is up and answering when the drain starts
        self.drain()
        return start, end

    def progress(self, elapsed: float) -> None:
        served = len(self.record.ended_at)
        self.say(f"  {time.strftime('%H:%M:%S')} {elapsed:5.0f}s: enqueued {len(self.record.sent_at)}, "
                 f"ended {served}, remotes live {len(self.live)}, double serves "
                 f"{len(self.record.double_serves)}, crashes {len(self.record.crashes)}")  # fmt: skip

    def drain(self) -> None:
        deadline = time.time() + self.args.max_length + 180
        while time.time() < deadline:
            now = time.time()
            self.tick(now)
            pending = [sid for sid in self.record.sent_at if sid not in self.record.ended_at]
            if not pending and not self.live and not self.restart_due:
                return
            time.sleep(self.args.tick)


def is_zombie(pid: int) -> bool:
    """An exited remote whose parent (a killed worker) is gone is reaped by init; until then it is a
    zombie, which no longer serves anything."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# --- analysis -------------------------------------------------------------------------------------


def fault_for(faults: Sequence[Fault], at: float, slack: float) -> str:
    """The most recent fault whose window [start, end + slack] contains ``at``."""
    found = "none"
    for fault in faults:
        if fault.start <= at <= fault.end + slack:
            found = fault.kind
    return found


def rss_growth(
    record: Soak, start: float, end: float, window: float, interval: float
) -> list[dict[str, Any]]:
    rows = []
    for (name, incarnation), samples in sorted(record.rss.items()):
        if not samples or samples[0][0] > start + window or samples[-1][0] < end - 2 * interval:
            continue  # did not live through the whole soak (killed, or started late)
        first = [kib for at, kib in samples if at <= start + window]
        last = [kib for at, kib in samples if end - window <= at <= end]
        if not first or not last:
            continue
        before, after = statistics.median(first) / 1024, statistics.median(last) / 1024
        # the median of each quarter of the soak: growth that levels off is warm-up, not a leak
        quarter = (end - start) / 4
        quarters = []
        for q in range(4):
            part = [kib for at, kib in samples if start + q * quarter <= at <= start + (q + 1) * quarter]
            quarters.append(statistics.median(part or [0]) / 1024)
        rows.append({"worker": name, "incarnation": incarnation, "first_mib": before, "last_mib": after,
                     "growth_mib": after - before, "growth_pct": 100 * (after - before) / before,
                     "max_mib": max(kib for dummy, kib in samples) / 1024,
                     "quarters_mib": quarters})  # fmt: skip
    return rows


def possible_overlaps(record: Soak) -> list[str]:
    """Sessions where a remote of one worker started before another worker's remote of the same session
    was seen dead: a double serve, unless the first one died within one poll before the second started
    (the polls every ``--tick`` seconds cannot tell)."""
    found = []
    for sid, pids in record.by_session.items():
        remotes = sorted((record.remotes[pid] for pid in pids), key=lambda r: r.started)
        for index, later in enumerate(remotes):
            if any(
                earlier.owner not in ("?", later.owner)
                and (earlier.died is None or earlier.died > later.started)
                for earlier in remotes[:index]
            ):
                found.append(sid)
                break
    return found


def analyse(args: argparse.Namespace, record: Soak, records: list[dict[str, Any]], start: float,
            end: float, proxy_counts: dict[str, int]) -> dict[str, Any]:  # fmt: skip
    found = analyse_claims(records, record.ended_at)
    ttl = args.claim_ttl
    expired_live: Counter[str] = Counter()
    expired_other = 0
    for rec in records:
        if rec["action"] != "expire":
            continue
        sid, at = rec["session_id"], float(rec["at"])
        first = found.first_claim_at.get(sid, math.inf)
        if first <= at < record.ended_at.get(sid, math.inf):
            expired_live[fault_for(record.faults, at, ttl)] += 1
        else:
            expired_other += 1
    acceptors: dict[str, set[str]] = {}
    last_action: dict[str, str] = {}
    for rec in records:
        if rec["action"] in ("claim", "renew"):
            acceptors.setdefault(rec["session_id"], set()).add(rec["acceptor_id"])
        last_action[rec["session_id"]] = rec["action"]
    enqueued = set(record.sent_at)
    started = {sid for sid in record.by_session if record.by_session[sid]}
    restarts: Counter[str] = Counter()
    for pids in record.by_session.values():
        owners = [record.remotes[pid].owner for pid in pids]
        if len(pids) > 1:
            restarts["same worker" if len(set(owners)) == 1 else "another worker"] += 1
    waits: dict[str, list[float]] = {"quiet": [], "fault": []}
    for sid, sent in record.sent_at.items():
        if sid in found.first_claim_at:
            in_fault = fault_for(record.faults, sent, FAULT_WAKE) != "none"
            waits["fault" if in_fault else "quiet"].append(found.first_claim_at[sid] - sent)
    all_waits = waits["quiet"] + waits["fault"]
    window = min(600.0, args.duration / 4)
    counters: Counter[str] = Counter()
    for values in record.counters.values():
        counters.update({name: int(value) for name, value in values.items()})
    fault_counts = Counter(fault.kind for fault in record.faults)
    return {
        "duration_s": end - start,
        "workers": args.workers,
        "claim_ttl_s": ttl,
        "tick_s": args.tick,
        "sessions": {
            "enqueued": len(enqueued),
            "ended": len(set(record.ended_at) & enqueued),
            "lost": len(enqueued - started),
            "claims_never_released": sum(1 for a in last_action.values() if a in ("claim", "renew")),
        },
        "expired_claims_on_live_sessions": {"total": sum(expired_live.values()), **expired_live},
        "expired_claims_otherwise": expired_other,
        "double_serves": len(record.double_serves),
        "double_serve_sessions": {sid: owners for sid, (dummy, owners) in record.double_serves.items()},
        "double_serves_possible": possible_overlaps(record),
        "claims_overlapping_another_acceptor": found.overlapping,
        "sessions_claimed_by_several_workers": sum(1 for names in acceptors.values() if len(names) > 1),
        "claims_of_ended_sessions": found.reclaimed_after_end,
        "remote_started_again": dict(restarts),
        "queue_wait": {
            "all": summarize(all_waits),
            "quiet": summarize(waits["quiet"]),
            "fault": summarize(waits["fault"]),
        },
        "faults": {kind: fault_counts.get(kind, 0) for kind in FAULTS},
        "fault_log": [
            {"kind": f.kind, "at_s": f.start - start, "secs": f.end - f.start, **f.detail}
            for f in record.faults
        ],
        "proxy": proxy_counts,
        "rss_window_s": window,
        "rss": rss_growth(record, start, end, window, args.rss_interval),
        "worker_counters": dict(counters),
        "crashes": record.crashes,
        "brain_errors": record.errors[:10],
    }


def log_summary(workers: Sequence[SoakWorker]) -> dict[str, Any]:
    """Levels, tracebacks and the most frequent warnings/errors in the workers' JSON logs."""
    levels: Counter[str] = Counter()
    messages: Counter[str] = Counter()
    tracebacks = 0
    for worker in workers:
        with contextlib.suppress(OSError), open(worker.log_path, errors="replace") as log:
            for line in log:
                if "Traceback (most recent call last)" in line:
                    tracebacks += 1
                if not line.startswith("{"):
                    continue
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    level = str(entry.get("level", "?"))
                    levels[level] += 1
                    if level in ("warning", "error", "critical"):
                        messages[f"{level}: {shorten(str(entry.get('msg', '')))}"] += 1
    return {"levels": dict(levels), "tracebacks": tracebacks, "top": messages.most_common(8)}


def shorten(message: str) -> str:
    """A message without its ids, so that one kind of warning is counted as one."""
    words = []
    for word in message.split():
        if word.startswith(("devin-", "outpost_env-")) or any(ch.isdigit() for ch in word):
            word = "#"
        words.append(word)
    return " ".join(words)[:140]


# --- the report -----------------------------------------------------------------------------------


def fmt_wait(fig: dict[str, float]) -> str:
    if not fig["n"]:
        return "no samples"
    return " ".join(f"{key} {fig[key]:.2f}s" for key in ("p50", "p90", "p99", "max")) + f" (n={fig['n']})"


def report(result: dict[str, Any], say: Out) -> None:
    s = result["sessions"]
    say("")
    say(f"soak: {result['workers']} workers, {result['duration_s']:.0f} s, "
        f"claim TTL {result['claim_ttl_s']:g} s")  # fmt: skip
    say(f"sessions: enqueued {s['enqueued']}, ended by the brain {s['ended']}, lost {s['lost']}, "
        f"claims never released {s['claims_never_released']}")  # fmt: skip
    expired = result["expired_claims_on_live_sessions"]
    by_fault = ", ".join(f"{k} {v}" for k, v in expired.items() if k != "total") or "-"
    say(f"expired claims on live sessions: {expired['total']} (by fault window: {by_fault}); "
        f"other expiries {result['expired_claims_otherwise']}")  # fmt: skip
    say(f"double serves (remotes of two workers seen alive at once): {result['double_serves']}; "
        f"possible (a remote started before another worker's was seen dead, polls "
        f"{result['tick_s']:g} s apart): {len(result['double_serves_possible'])}; "
        f"claims overlapping another's: {result['claims_overlapping_another_acceptor']}")  # fmt: skip
    say(f"sessions claimed by more than one worker: {result['sessions_claimed_by_several_workers']}; "
        f"remote started again {result['remote_started_again'] or '{}'}; claims of ended sessions "
        f"{result['claims_of_ended_sessions']}")  # fmt: skip
    wait = result["queue_wait"]
    say("queue wait (enqueue -> first claim):")
    for key, label in (("quiet", "quiet periods (baseline)"), ("fault", "in fault windows"), ("all", "all")):
        say(f"  {label:26s} {fmt_wait(wait[key])}")
    say("faults injected: " + ", ".join(f"{k} {v}" for k, v in result["faults"].items())
        + f"; proxy {result['proxy']}")  # fmt: skip
    for fault in result["fault_log"]:
        extra = {k: v for k, v in fault.items() if k not in ("kind", "at_s", "secs")}
        say(f"  at {fault['at_s']:6.0f}s {fault['kind']:9s} {fault['secs']:5.1f}s {extra or ''}")
    say(f"worker memory (VmRSS, median of the first vs the last {result['rss_window_s']:.0f} s):")
    for row in result["rss"]:
        say(f"  {row['worker']}#{row['incarnation']}: {row['first_mib']:.1f} -> {row['last_mib']:.1f} MiB "
            f"({row['growth_mib']:+.1f} MiB, {row['growth_pct']:+.1f} %), "
            f"max {row['max_mib']:.1f} MiB; by quarter "
            + " / ".join(f"{mib:.1f}" for mib in row["quarters_mib"]))  # fmt: skip
    if not result["rss"]:
        say("  no worker process lived through the whole soak")
    say(f"worker counters (summed over processes): {result['worker_counters']}")
    logs = result["logs"]
    say(f"worker logs: {logs['levels']}, tracebacks {logs['tracebacks']}")
    for message, count in logs["top"]:
        say(f"  {count:5d} x {message}")
    say(f"worker crashes (exits nobody asked for): {len(result['crashes'])}")
    for crash in result["crashes"]:
        say(f"  {crash['worker']} exit {crash['exit_code']}:\n{crash['log_tail']}")
    for error in result["brain_errors"]:
        say(f"  benchmark: {error}")


# --- main -----------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--duration", type=float, default=3600.0, help="seconds of soak before the drain (3600)")
    add("--quick", action="store_true", help="300 s with a fault every 60 s (a validation run)")
    add("--workers", type=int, default=4, help="worker processes (4)")
    add("--claim-ttl", type=float, default=10.0, help="the simulator's claim TTL, seconds (10)")
    add("--min-length", type=float, default=5.0, help="shortest session, seconds (5)")
    add("--max-length", type=float, default=60.0, help="longest session, seconds (60)")
    add("--load", type=float, default=0.75, help="arrival rate as a share of the workers' capacity (0.75)")
    add("--fault-interval", type=float, default=180.0, help="seconds between faults (180)")
    add("--outage-secs", type=float, default=30.0, help="length of an API outage (30)")
    add("--burst-secs", type=float, default=5.0, help="length of a burst of 500s (5)")
    add("--restart-delay", type=float, default=2.0, help="seconds before a killed worker is restarted (2)")
    add("--kill-worker", type=int, default=-1, help="index of the worker that kill -9 hits (-1: the last)")
    add("--mark-running", action="store_true", help="mark a session running once its remote starts")
    add("--rss-interval", type=float, default=30.0, help="seconds between memory samples (30; quick 5)")
    add("--tick", type=float, default=0.25, help="seconds between the brain's polls (0.25)")
    add("--seed", type=int, default=1, help="seed of arrivals and session lengths (1)")
    add("--keep", metavar="DIR", help="keep the simulator's and workers' files under DIR")
    add("--json", metavar="FILE", help="also write the figures as JSON ('-' = stdout)")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.fault_interval, args.rss_interval = 300.0, 60.0, 5.0
    if args.fault_interval <= max(args.outage_secs, args.burst_secs, SSE_DROPS * SSE_DROP_GAP):
        parser.error("--fault-interval must be longer than every fault")
    if not 0 < args.min_length <= args.max_length or args.workers < 1 or args.load <= 0:
        parser.error("need 0 < --min-length <= --max-length, --workers >= 1 and --load > 0")
    return args


@contextlib.contextmanager
def soak_sim(root: Path, claim_ttl: float) -> Iterator[BenchSim]:
    """A simulator process with the soak's claim TTL (other settings default) and one linux outpost."""
    workdir = root / "sim"
    workdir.mkdir(parents=True)
    proc = SimProcess(workdir / "sim.db", workdir=workdir, claim_ttl=claim_ttl)
    proc.start()
    try:
        outpost = proc.admin.create_outpost("soak", "linux")
        yield BenchSim(proc, outpost.outpost_id, outpost.name, proc.create_token("machine"), workdir)
    finally:
        proc.close()


def soak(args: argparse.Namespace, root: Path, say: Out) -> dict[str, Any]:
    with soak_sim(root, args.claim_ttl) as sim:
        runs = root / "runs"
        publish_marker_remote(sim.admin, runs)
        proxy = FaultProxy("127.0.0.1", sim.proc.port).start()
        workers = [SoakWorker(sim, f"w{index}", "--log-format", "json") for index in range(args.workers)]
        for worker in workers:
            worker.env["DEVIN_API_URL"] = proxy.url  # the fleet API through the proxy; downloads direct
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.wait_ready(timeout=120)
            say(f"{len(workers)} workers ready; soak of {args.duration:.0f} s starts "
                f"{time.strftime('%H:%M:%S')}")  # fmt: skip
            brain = Brain(args, sim, proxy, workers, runs, say)
            start, end = brain.run()
            for worker in workers:
                brain.sample_worker(worker, time.time())
        finally:
            proxy_counts = dict(proxy.counts)  # before close() resets what is still open
            for worker in workers:
                worker.terminate()
            for worker in workers:
                worker.stop()
            proxy.close()
        with SimAdmin(sim.proc.url, sim.proc.admin_token, timeout=120) as admin:
            records = admin.claims(outpost_id=sim.outpost_id)
        result = analyse(args, brain.record, records, start, end, proxy_counts)
        result["logs"] = log_summary(workers)
        return result


def main() -> int:
    args = parse_args()
    say = reporter(args.json)

    say(f"soak: {args.workers} workers, {args.duration:.0f} s, claim TTL {args.claim_ttl:g} s, sessions "
        f"{args.min_length:g}-{args.max_length:g} s at load {args.load:g} (seed {args.seed}), a fault every "
        f"{args.fault_interval:g} s: {', '.join(FAULTS)}")  # fmt: skip
    try:
        result = in_work_dir(args.keep, "devin-bench-soak-", lambda root: soak(args, root, say))
    except (BenchError, SimAdminError, OSError, RuntimeError) as exc:
        say(f"benchmark broke: {exc}")
        return 1
    report(result, say)
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
