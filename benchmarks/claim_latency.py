"""Benchmark the worker: claim latency, time to a running remote, fleet throughput, idle footprint.

Everything runs in one go against simulators this script starts (``devin-outposts-sim serve`` processes
with default settings, one fresh SQLite file per scenario) and real ``devin-outposts worker start``
processes (token in the environment, never on argv):

1. **enqueue -> claimed**, SSE watch (the default) against polling (``--no-watch``,
   ``--poll-interval-secs 5``). The clock starts just before the enqueue request is sent (so the
   enqueue's own round trip, printed separately, is included) and stops at the ``at`` of the session's
   ``claim`` record in the simulator's claim history. The benchmark learns that the claim happened from
   the remote's marker file (a file-system poll every 2 ms), then reads the record once: nothing polls
   the simulator or the worker while a claim is in flight. In polling mode each enqueue waits a random
   part of the poll interval first, so enqueues do not line up with the worker's polls.
2. **enqueue -> remote running**: the simulator's stand-in ``devin-remote``, published as ``latest``; the
   figure is the ``at`` of the stand-in's first gateway connection. The first session downloads the
   binary (not counted); the rest run it from the cache. Cold: each session pins a freshly published
   stand-in variant (a new SHA), so the worker finds nothing in its cache, fetches the digest, downloads
   and verifies the binary before it starts it, as with a fresh cache directory (only the ``latest_``
   lookup, which a pinned SHA skips and a warm worker caches for 60 s, is left out).
3. **fleet**: N sessions over W workers (one slot each), all enqueued at once. The remote is a marker
   script: as soon as it has started, the benchmark marks the session ``terminated`` and tells the
   remote to exit 0 (as a real remote does when its session ends); the worker confirms the status and
   releases the claim. Sessions per second = N / (last release - first enqueue). Double serves come
   from the claim history (more than one ``claim`` of a session, or claims by more than one acceptor)
   and from the marker files (a remote started more than once).
4. **idle**: one worker (no metrics listener, as deployed by default) watching an empty outpost, once
   it has used no CPU for a second: VmRSS, and utime+stime over an idle interval.

Run: ``.venv/bin/python benchmarks/claim_latency.py [--quick] [--json FILE|-]``; ``--help`` for sizes.
The figures are measurements, not assertions: the exit code is 0 unless the benchmark itself broke.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts_sim.admin_client import SimAdmin, SimAdminError

from _harness import (
    BenchError,
    BenchSim,
    Worker,
    analyse_claims,
    bench_sim,
    cpu_seconds_of,
    end_marker_session,
    ms,
    publish_marker_remote,
    remote_starts,
    reporter,
    running_workers,
    summarize,
    wait_remote_start,
    wait_until,
    without_nan,
    write_json,
)

TARGET_CLAIM_P99 = 0.100
TARGET_IDLE_RSS_MIB = 40.0
SETTLE = 0.1  # between samples, once the previous session is released: the worker frees its slot
Out = Callable[[str], None]


@dataclass
class Enqueued:
    session_id: str
    sent_at: float  #: wall clock just before the enqueue request was sent
    round_trip: float


def timed_enqueue(sim: BenchSim, admin: SimAdmin, **options: Any) -> Enqueued:
    started = time.time()
    entry = admin.enqueue(sim.outpost_id, **options)
    return Enqueued(entry.session_id, started, time.time() - started)


# --- 1. enqueue -> claimed --------------------------------------------------------------------------


def claim_latency(
    root: Path, watch: bool, samples: int, poll_interval: float, rng: random.Random
) -> dict[str, Any]:
    mode = "sse" if watch else "poll"
    with bench_sim(root, f"claim-{mode}") as sim:
        runs = sim.root / "runs"
        publish_marker_remote(sim.admin, runs)
        args = ["--poll-interval-secs", f"{poll_interval:g}"]
        args.append("--watch" if watch else "--no-watch")
        with running_workers([Worker(sim, mode, *args)]):
            latencies, round_trips = [], []
            for index in range(samples + 1):  # the first warms the binary cache and is not counted
                if index and not watch:
                    time.sleep(rng.uniform(0, poll_interval))
                sent = timed_enqueue(sim, sim.admin)
                sid = sent.session_id
                pid = wait_remote_start(runs, sid, timeout=poll_interval * 4 + 60)
                claimed = sim.first(sid, "claim")
                if claimed is None:
                    raise BenchError(f"session {sid} runs but has no claim record")
                end_marker_session(sim.admin, runs, sid, pid)
                if index:
                    latencies.append(float(claimed["at"]) - sent.sent_at)
                    round_trips.append(sent.round_trip)
                sim.wait_record(sid, "release", timeout=poll_interval * 4 + 60)
                time.sleep(SETTLE)
    return {"mode": mode, "poll_interval_s": poll_interval, "latency": summarize(latencies),
            "enqueue_round_trip": summarize(round_trips)}  # fmt: skip


# --- 2. enqueue -> remote running -------------------------------------------------------------------


def serve_standin(sim: BenchSim, **options: Any) -> float:
    """One stand-in session from enqueue to its first gateway connection; ended and released after."""
    sent = timed_enqueue(sim, sim.admin, **options)
    connection = sim.admin.wait_connection(sent.session_id, timeout=120)
    sim.admin.end_session(sent.session_id, "terminated")
    sim.wait_record(sent.session_id, "release")
    time.sleep(SETTLE)
    return float(connection["at"]) - sent.sent_at


def remote_running(root: Path, samples: int, cold_samples: int) -> dict[str, Any]:
    with bench_sim(root, "running") as sim:
        sim.admin.publish_standin_variant("bench", python=sys.executable, latest=True)
        with running_workers([Worker(sim, "running")]):
            first = serve_standin(sim)
            warm = [serve_standin(sim) for dummy in range(samples)]
            cold = []
            for index in range(cold_samples):
                sha = sim.admin.publish_standin_variant(f"cold-{index}", python=sys.executable)
                cold.append(serve_standin(sim, remote_binary_sha=sha))
    return {"first_s": first, "warm": summarize(warm), "cold": summarize(cold)}


# --- 3. fleet throughput and double serves ----------------------------------------------------------


def fleet(root: Path, sessions: int, worker_count: int) -> dict[str, Any]:
    with bench_sim(root, "fleet") as sim:
        runs = sim.root / "runs"
        publish_marker_remote(sim.admin, runs)
        workers = [Worker(sim, f"w{index:03d}") for index in range(worker_count)]
        boot = time.monotonic()
        with running_workers(workers, ready_timeout=max(180.0, worker_count * 6.0)):
            boot_s = time.monotonic() - boot
            sim_pid = sim.proc.pid or 0
            cpu_before = (cpu_seconds_of(sim_pid), sum(w.cpu_seconds() for w in workers), time.process_time())
            enqueued: dict[str, float] = {}
            enqueue_window: list[float] = []

            def enqueue_all() -> None:
                with SimAdmin(sim.proc.url, sim.proc.admin_token) as admin:
                    enqueue_window.append(time.time())
                    while len(enqueued) < sessions:
                        sent = timed_enqueue(sim, admin)
                        enqueued[sent.session_id] = sent.sent_at
                    enqueue_window.append(time.time())

            feeder = threading.Thread(target=enqueue_all, name="enqueue", daemon=True)
            feeder.start()
            ended_at: dict[str, float] = {}
            deadline = time.monotonic() + max(300.0, sessions * 1.0)
            with SimAdmin(sim.proc.url, sim.proc.admin_token) as admin:
                while feeder.is_alive() or len(ended_at) < sessions:
                    for sid, pids in remote_starts(runs).items():
                        if sid not in ended_at:
                            ended_at[sid] = time.time()
                            end_marker_session(admin, runs, sid, pids[0])
                    if time.monotonic() > deadline:
                        raise BenchError(f"only {len(ended_at)} of {sessions} sessions started in time")
                    time.sleep(0.01)
            records = wait_until(
                lambda: released_all(sim, sessions),
                timeout=max(120.0, sessions * 0.5),
                interval=1.0,
                what=f"all {sessions} sessions to be released",
            )
            cpu_after = (cpu_seconds_of(sim_pid), sum(w.cpu_seconds() for w in workers), time.process_time())
            conflicts = sum(worker.counter("claim_conflicts_total") for worker in workers)
        starts = remote_starts(runs)
    found = analyse_claims(records, ended_at)
    wall = max(found.first_release_at.values()) - enqueue_window[0]
    per_worker = Counter(r["acceptor_id"] for r in records if r["action"] == "claim")
    cpu = [after - before for before, after in zip(cpu_before, cpu_after)]
    return {
        "sessions": sessions,
        "workers": worker_count,
        "workers_ready_s": boot_s,
        "wall_s": wall,
        "sessions_per_s": sessions / wall,
        "enqueue_per_s": sessions / (enqueue_window[1] - enqueue_window[0]),
        "claim_latency": summarize([found.first_claim_at[sid] - at for sid, at in enqueued.items()]),
        "overlapping_claims": found.overlapping,
        "reclaimed_live": found.reclaimed_live,
        "double_remote_starts": sum(1 for pids in starts.values() if len(pids) > 1),
        "reclaimed_after_end": found.reclaimed_after_end,
        "expired_claims": sum(1 for r in records if r["action"] == "expire"),
        "claim_conflicts_409": conflicts,
        "per_worker": f"{min(per_worker.values())}-{max(per_worker.values())}",
        "cpu_s": {"simulator": cpu[0], "workers": cpu[1], "benchmark": cpu[2]},
        "remote": "marker /bin/sh script (creates a file; exits 0 when told the session ended)",
    }


def released_all(sim: BenchSim, sessions: int) -> Optional[list[dict[str, Any]]]:
    records = sim.claim_records()
    released = {r["session_id"] for r in records if r["action"] == "release"}
    return records if len(released) >= sessions else None


# --- 4. idle footprint ------------------------------------------------------------------------------


def idle(root: Path, seconds: float) -> dict[str, Any]:
    with bench_sim(root, "idle") as sim:
        worker = Worker(sim, "idle", metrics=False)  # as deployed by default: no metrics listener
        with running_workers([worker]):  # returns once the worker used no CPU for a second
            cpu_before, wall_before = worker.cpu_seconds(), time.monotonic()
            time.sleep(seconds)
            cpu = worker.cpu_seconds() - cpu_before
            interval = time.monotonic() - wall_before
            rss = worker.rss_kib()
    return {"rss_mib": rss / 1024, "cpu_s": cpu, "interval_s": interval, "cpu_percent": 100 * cpu / interval}


# --- the report -------------------------------------------------------------------------------------


def verdict(met: Optional[bool]) -> str:
    return "n/a" if met is None else ("MET" if met else "MISSED")


def p50_p99(figures: dict[str, float]) -> str:
    return f"{ms(figures['p50'])} / {ms(figures['p99'])}"


def summary_rows(results: dict[str, Any]) -> list[tuple[str, str, str, Optional[bool]]]:
    rows: list[tuple[str, str, str, Optional[bool]]] = []
    sse, poll = results.get("claim_sse"), results.get("claim_poll")
    if sse:
        p99 = sse["latency"]["p99"]
        met = None if math.isnan(p99) else p99 <= TARGET_CLAIM_P99
        rows.append(("claim SSE p50 / p99", p50_p99(sse["latency"]), "p99 <= 100 ms", met))
    if poll:
        rows.append(("claim poll p50 / p99", p50_p99(poll["latency"]), "-", None))
    if sse and poll:
        ratio = poll["latency"]["p50"] / sse["latency"]["p50"]
        rows.append(("claim poll/SSE (p50)", f"x{ratio:.0f}", "-", None))
    if "running" in results:
        rows.append(("running warm p50 / p99", p50_p99(results["running"]["warm"]), "-", None))
        rows.append(("running cold p50 / p99", p50_p99(results["running"]["cold"]), "-", None))
    if "fleet" in results:
        fl = results["fleet"]
        doubles = fl["overlapping_claims"] + fl["reclaimed_live"] + fl["double_remote_starts"]
        label = f"fleet {fl['sessions']} x {fl['workers']} workers"
        rows.append((label, f"{fl['sessions_per_s']:.1f} sessions/s", "-", None))
        rows.append(("double serves", str(doubles), "0", doubles == 0))
        stale = fl["reclaimed_after_end"]  # docs/fleet-api.md §5: never claim a terminated/suspended row
        rows.append(("claims of ended sessions", str(stale), "0 (3.4)", stale == 0))
    if "idle" in results:
        rss = results["idle"]["rss_mib"]
        rows.append(("idle RSS", f"{rss:.1f} MiB", "<= 40 MiB", rss <= TARGET_IDLE_RSS_MIB))
        rows.append(("idle CPU", f"{results['idle']['cpu_percent']:.2f} % of a core", "-", None))
    return rows


def report_details(results: dict[str, Any], say: Out) -> None:
    for key in ("claim_sse", "claim_poll"):
        if key in results:
            part = results[key]
            lat, rtt = part["latency"], part["enqueue_round_trip"]
            interval = part["poll_interval_s"]
            say(f"enqueue -> claimed, {part['mode']}: {lat['n']} samples, poll interval {interval:g} s")
            say(f"  p50 {ms(lat['p50'])}  p99 {ms(lat['p99'])}  min {ms(lat['min'])}  max {ms(lat['max'])}")
            say(f"  (includes the enqueue request's round trip: p50 {ms(rtt['p50'])})")
    if "running" in results:
        run = results["running"]
        say("enqueue -> stand-in remote connected to the gateway:")
        say(f"  first session (downloads)   {ms(run['first_s'])}")
        for label in ("warm", "cold"):
            fig = run[label]
            say(f"  {label} cache, {fig['n']:3d} samples   p50 {ms(fig['p50'])}  p99 {ms(fig['p99'])}")
    if "fleet" in results:
        fl = results["fleet"]
        lat = fl["claim_latency"]
        say(f"fleet: {fl['sessions']} sessions over {fl['workers']} workers; remote: {fl['remote']}")
        say(f"  workers ready after {fl['workers_ready_s']:.1f} s; all served in {fl['wall_s']:.1f} s")
        rate, enqueues = fl["sessions_per_s"], fl["enqueue_per_s"]
        say(f"  {rate:.1f} sessions/s (the enqueues meanwhile completed at {enqueues:.0f}/s)")
        say(f"  enqueue -> claimed (waits for a free worker) p50 {ms(lat['p50'])}  p99 {ms(lat['p99'])}")
        say(f"  409s {fl['claim_conflicts_409']:.0f}; sessions per worker {fl['per_worker']}")
        say(f"  double serves: claims overlapping another acceptor's {fl['overlapping_claims']};")
        again, twice = fl["reclaimed_live"], fl["double_remote_starts"]
        say(f"    claimed again while live {again}; remote started twice {twice}")
        stale = fl["reclaimed_after_end"]
        say(f"  sessions claimed again after they were marked terminated (stale copies): {stale};")
        say(f"    expired claims {fl['expired_claims']}")
        cpu = fl["cpu_s"]
        say(f"  CPU used: simulator {cpu['simulator']:.1f} s, workers {cpu['workers']:.1f} s,")
        say(f"    this benchmark {cpu['benchmark']:.1f} s")
    if "idle" in results:
        part = results["idle"]
        say(f"idle worker: VmRSS {part['rss_mib']:.1f} MiB")
        cpu, interval = part["cpu_s"], part["interval_s"]
        say(f"  CPU {cpu:.3f} s over {interval:.1f} s ({part['cpu_percent']:.2f} % of a core)")


def report(results: dict[str, Any], say: Out) -> None:
    report_details(results, say)
    say("")
    say(f"{'figure':30s} {'measured':24s} {'target':14s} result")
    for name, value, target, met in summary_rows(results):
        say(f"{name:30s} {value:24s} {target:14s} {verdict(met)}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=100, help="SSE claim samples (default 100)")
    parser.add_argument("--poll-samples", type=int, default=12, help="polling claim samples (default 12)")
    parser.add_argument("--poll-interval-secs", type=float, default=5.0, help="polling mode interval (5)")
    parser.add_argument("--running-samples", type=int, default=30, help="warm-cache stand-in sessions (30)")
    parser.add_argument("--cold-samples", type=int, default=5, help="cold-cache stand-in sessions (5)")
    parser.add_argument("--sessions", type=int, default=1000, help="fleet sessions (default 1000)")
    parser.add_argument("--workers", type=int, default=50, help="fleet workers (default 50)")
    parser.add_argument("--idle-secs", type=float, default=10.0, help="idle CPU interval (default 10)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, under a minute")
    parser.add_argument("--skip", action="append", default=[], choices=["claim", "running", "fleet", "idle"])
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON ('-' = stdout)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the polling delays")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.poll_samples, args.running_samples, args.cold_samples = 10, 2, 5, 1
        args.sessions, args.workers, args.idle_secs = 60, 4, 3.0
    return args


def main() -> int:
    args = parse_args()
    say = reporter(args.json)

    results: dict[str, Any] = {"targets": {"claim_sse_p99_s": TARGET_CLAIM_P99, "double_serves": 0,
                                           "idle_rss_mib": TARGET_IDLE_RSS_MIB}}  # fmt: skip
    walls: dict[str, float] = {}
    rng = random.Random(args.seed)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="devin-bench-claims-") as tmpdir:
            root = Path(tmpdir)
            interval = args.poll_interval_secs
            parts: list[tuple[str, str, Callable[[], dict[str, Any]]]] = [
                ("claim", "claim_sse", lambda: claim_latency(root, True, args.samples, interval, rng)),
                ("claim", "claim_poll", lambda: claim_latency(root, False, args.poll_samples, interval, rng)),
                ("running", "running", lambda: remote_running(root, args.running_samples, args.cold_samples)),
                ("fleet", "fleet", lambda: fleet(root, args.sessions, args.workers)),
                ("idle", "idle", lambda: idle(root, args.idle_secs)),
            ]  # fmt: skip
            for group, key, run in parts:
                if group in args.skip:
                    continue
                part_started = time.monotonic()
                say(f"... {key}")
                results[key] = run()
                walls[key] = time.monotonic() - part_started
    except (BenchError, SimAdminError, OSError, RuntimeError) as exc:
        say(f"benchmark broke: {exc}")
        return 1
    results["wall_s"] = {**walls, "total": time.monotonic() - started}
    report(results, say)
    say("wall times: " + ", ".join(f"{key} {value:.1f} s" for key, value in results["wall_s"].items()))
    if args.json:
        write_json(without_nan(results), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
