"""Benchmark the simulator itself: its ceiling under a claim storm, driven by a minimal claimer.

The worker benchmarks measure the worker against the simulator; their figures mean something only while
the simulator is not the bottleneck. This script measures the simulator alone, driven by the smallest
client that does the job (plain httpx and raw sockets, no worker code). One run:

1. **watch streams**: ``--streams`` idle SSE watch streams on the outpost stay open through every phase,
   as the streams of that many workers would. Each gets every change; raw sockets read them and only
   count the events.
2. **enqueue**: ``--sessions`` sessions enqueued through the admin API (the brain's side) by
   ``--enqueuers`` concurrent clients: enqueues per second.
3. **claim storm**: ``--claimers`` concurrent claimers each list the outpost's pending rows (``first=20``)
   and try them oldest first, skipping rows whose ``session_status`` is ``terminated`` (docs/fleet-api.md
   §5) or that a claimer has served; a 409 sends a claimer to the next row, and a claim answer that says
   ``terminated`` (the row was served after the list was read) is released at once. A won claim is served
   at once: the brain marks the session
   terminated (admin API) and the claimer releases it. Until every session is served: won claims per
   second, requests per second, 409s per session.
4. **list**: ``--listers`` concurrent clients read full pages (``first=100``) of the outpost's queue for
   ``--list-secs`` seconds: list requests per second.

The simulator's CPU time (utime + stime of its process, from ``/proc``) is read around each phase, once
the watch streams have caught up. "CPU per 1000 sessions" covers the enqueue and claim-storm phases. On a
2-core machine this client (httpx, in one process) can saturate its own core before the simulator does;
the "per sim CPU second" figures (work done per second of the simulator's own CPU time) are then the
simulator's ceiling on one core, whatever the client's speed.

Every run starts a fresh simulator (``devin-outposts-sim serve``, default settings except a watch
duration longer than a run) on a fresh SQLite file. ``--runs`` repeats; the figures are **medians** over
the runs. ``--baseline REV`` also runs the simulator from the package source of git revision ``REV``
(extracted with ``git archive`` into a temporary directory and put first on the server's
``PYTHONPATH``), alternating with this tree's runs, and prints both side by side.

Run: ``.venv/bin/python benchmarks/sim_ceiling.py [--runs 3] [--baseline REV] [--quick] [--json FILE|-]``.
The figures are measurements, not assertions: the exit code is 0 unless the benchmark itself broke.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import httpx

from devin_outposts_sim.admin_client import SimAdminError

from _harness import BenchError, BenchSim, bench_sim, cpu_seconds_of, reporter, write_json

REPO = Path(__file__).resolve().parents[1]
#: Where the Python source is, today (python/) and before the two distributions (the package in the role).
SOURCE_DIRS = ("python/devin-outposts/src", "python/devin-outposts-sim/src")
OLD_SOURCE_DIR = "roles/worker/files/devin-outposts/src"
#: For a revision from before devin-outposts-sim existed: ``python -m devin_outposts_sim`` runs its
#: ``devin-outposts sim`` command instead.
OLD_LAYOUT_SHIM = """import sys
from devin_outposts.cli import main
sys.exit(main(["sim", *sys.argv[1:]]))
"""
QUEUE = "/opbeta/outposts/devins"
ADMIN = "/_sim"
Out = Callable[[str], None]


class Phase:
    """Wall time, simulator CPU time and this process's CPU time over one phase."""

    def __init__(self, sim_pid: int) -> None:
        self.sim_pid = sim_pid
        self.wall = self.sim_cpu = self.client_cpu = 0.0

    def __enter__(self) -> Phase:
        self._wall, self._sim = time.monotonic(), cpu_seconds_of(self.sim_pid)
        self._client = time.process_time()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.wall = time.monotonic() - self._wall
        self.sim_cpu = cpu_seconds_of(self.sim_pid) - self._sim
        self.client_cpu = time.process_time() - self._client


# --- the idle watch streams -------------------------------------------------------------------------


class Streams:
    """``count`` SSE watch streams on raw sockets that count ``data:`` events and read nothing else."""

    PATTERN = b"data: "

    def __init__(self, url: str, token: str, outpost_id: str, count: int) -> None:
        self.host, port = url.split("://", 1)[1].split(":")
        self.port = int(port)
        self.token, self.outpost_id = token, outpost_id
        self.events = [0] * count
        self.ended = 0
        self._tasks: list[asyncio.Task[None]] = []

    async def _one(self, index: int) -> None:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(
            (
                f"GET {QUEUE}?watch=true&outpost={self.outpost_id} HTTP/1.1\r\n"
                f"Host: {self.host}:{self.port}\r\nAuthorization: Bearer {self.token}\r\n"
                "Accept: text/event-stream\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        tail = b""
        try:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    self.ended += 1
                    return
                data = tail + chunk
                # The tail is shorter than the pattern, so no event is counted twice.
                self.events[index] += data.count(self.PATTERN)
                tail = data[-(len(self.PATTERN) - 1) :]
        finally:
            writer.close()

    async def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._one(i)) for i in range(len(self.events))]
        await asyncio.sleep(0)

    async def settled(self, quiet: float = 0.5, timeout: float = 120.0) -> None:
        """Wait until no stream has received anything for ``quiet`` seconds (they have caught up)."""
        deadline = time.monotonic() + timeout
        before = sum(self.events)
        while time.monotonic() < deadline:
            await asyncio.sleep(quiet)
            now = sum(self.events)
            if now == before:
                return
            before = now
        raise BenchError("the watch streams never caught up")

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


# --- the phases ---------------------------------------------------------------------------------------


async def enqueue_all(sim: BenchSim, sessions: int, enqueuers: int) -> list[str]:
    ids: list[str] = []
    left = sessions
    headers = {"Authorization": f"Bearer {sim.proc.admin_token}"}

    async def one() -> None:
        nonlocal left
        async with httpx.AsyncClient(base_url=sim.proc.url, headers=headers, timeout=60) as http:
            while left > 0:
                left -= 1  # taken before the request, so the enqueuers never overshoot
                response = await http.post(f"{ADMIN}/sessions", json={"outpost_id": sim.outpost_id})
                if response.status_code != 201:
                    raise BenchError(f"enqueue answered {response.status_code}: {response.text}")
                ids.append(response.json()["metadata"]["session_id"])

    await asyncio.gather(*(one() for dummy in range(enqueuers)))
    return ids


async def claim_storm(sim: BenchSim, sessions: set[str], claimers: int) -> dict[str, int]:
    served: set[str] = set()
    counts = {"list": 0, "claim": 0, "conflict": 0, "status": 0, "release": 0, "stale": 0}
    api = {"Authorization": f"Bearer {sim.token}"}
    admin = {"Authorization": f"Bearer {sim.proc.admin_token}"}
    params: dict[str, Any] = {"outpost": sim.outpost_id, "phase": "pending", "first": 20}

    async def claimer(index: int) -> None:
        body = {"acceptor_id": f"bench-{index}"}
        async with httpx.AsyncClient(base_url=sim.proc.url, timeout=60) as http:
            while len(served) < len(sessions):
                listed = await http.get(QUEUE, params=params, headers=api)
                counts["list"] += 1
                rows = [
                    row["metadata"]["session_id"]
                    for row in listed.json()["items"]
                    if row["status"]["session_status"] != "terminated"
                    and row["metadata"]["session_id"] not in served
                ]
                if not rows:  # every unserved session is held by another claimer right now
                    await asyncio.sleep(0.01)
                    continue
                for sid in rows:
                    claimed = await http.post(f"{QUEUE}/{sid}/claim", json=body, headers=api)
                    counts["claim"] += 1
                    if claimed.status_code == 409:
                        counts["conflict"] += 1
                        continue
                    if claimed.status_code != 200:
                        raise BenchError(f"claim answered {claimed.status_code}: {claimed.text}")
                    if claimed.json()["status"]["session_status"] == "terminated":
                        # A stale row (served meanwhile): hand it back at once, as a worker does.
                        await http.post(f"{QUEUE}/{sid}/release", json=body, headers=api)
                        counts["stale"] += 1
                        counts["release"] += 1
                        continue
                    served.add(sid)
                    ended = await http.post(
                        f"{ADMIN}/sessions/{sid}/status", json={"session_status": "terminated"}, headers=admin
                    )
                    counts["status"] += 1
                    released = await http.post(f"{QUEUE}/{sid}/release", json=body, headers=api)
                    counts["release"] += 1
                    if ended.status_code != 200 or released.status_code != 200:
                        codes = f"status {ended.status_code}, release {released.status_code}"
                        raise BenchError(f"serving {sid}: {codes}")
                    break

    await asyncio.gather(*(claimer(i) for i in range(claimers)))
    if served != sessions:
        raise BenchError(f"served {len(served)} of {len(sessions)} sessions")
    return counts


async def list_storm(sim: BenchSim, listers: int, seconds: float) -> int:
    done = 0
    stop_at = time.monotonic() + seconds
    params = {"outpost": sim.outpost_id, "first": 100}

    async def lister() -> None:
        nonlocal done
        headers = {"Authorization": f"Bearer {sim.token}"}
        async with httpx.AsyncClient(base_url=sim.proc.url, headers=headers, timeout=60) as http:
            while time.monotonic() < stop_at:
                response = await http.get(QUEUE, params=params)
                if response.status_code != 200 or len(response.json()["items"]) != 100:
                    raise BenchError(f"list answered {response.status_code}")
                done += 1

    await asyncio.gather(*(lister() for dummy in range(listers)))
    return done


async def one_run(sim: BenchSim, args: argparse.Namespace) -> dict[str, Any]:
    pid = sim.proc.pid or 0
    streams = Streams(sim.proc.url, sim.token, sim.outpost_id, args.streams)
    await streams.start()
    try:
        await asyncio.sleep(0.5)  # the streams are open and idle
        with Phase(pid) as enqueue:
            ids = await enqueue_all(sim, args.sessions, args.enqueuers)
            await streams.settled()
        with Phase(pid) as storm:
            counts = await claim_storm(sim, set(ids), args.claimers)
            await streams.settled()
        with Phase(pid) as listing:
            lists = await list_storm(sim, args.listers, args.list_secs)
        events = sorted(streams.events)
        ended = streams.ended
    finally:
        await streams.close()
    n = args.sessions
    storm_requests = sum(counts[key] for key in ("list", "claim", "status", "release"))
    return {
        "enqueue_per_s": n / enqueue.wall,
        "claims_per_s": n / storm.wall,
        "storm_requests_per_s": storm_requests / storm.wall,
        "conflicts_per_session": counts["conflict"] / n,
        "stale_claims": counts["stale"],
        "requests_per_session": storm_requests / n,
        "lists_per_s": lists / listing.wall,
        "sim_cpu_per_1000_sessions_s": (enqueue.sim_cpu + storm.sim_cpu) * 1000 / n,
        # What one core of simulator would do if the client were not the limit: the work done per
        # second of the simulator's own CPU time.
        "enqueues_per_sim_cpu_s": n / max(enqueue.sim_cpu, 1e-9),
        "claims_per_sim_cpu_s": n / max(storm.sim_cpu, 1e-9),
        "storm_requests_per_sim_cpu_s": storm_requests / max(storm.sim_cpu, 1e-9),
        "lists_per_sim_cpu_s": lists / max(listing.sim_cpu, 1e-9),
        "sim_cpu_per_1000_lists_s": listing.sim_cpu * 1000 / max(lists, 1),
        "sim_cpu_share_storm": storm.sim_cpu / storm.wall,
        "client_cpu_share_storm": storm.client_cpu / storm.wall,
        "events_per_stream_min": events[0] if events else 0,
        "streams_ended": ended,
    }


# --- variants, runs and the report ----------------------------------------------------------------


def _git_archive(git: str, rev: str, paths: tuple[str, ...]) -> Optional[bytes]:
    archive = subprocess.run(
        [git, "-C", str(REPO), "archive", "--format=tar", rev, *paths], capture_output=True, check=False
    )
    return archive.stdout if archive.returncode == 0 else None


def extract_source(rev: str, into: Path) -> str:
    """The Python source of git revision ``rev``, extracted under ``into``; returns the ``PYTHONPATH`` that
    runs its simulator as ``python -m devin_outposts_sim`` (whichever layout the revision has)."""
    git = shutil.which("git")
    if git is None:
        raise BenchError("--baseline needs git on PATH")
    data = _git_archive(git, rev, SOURCE_DIRS)
    paths = list(SOURCE_DIRS)
    if data is None:  # before python/: one package, with the simulator inside and its own verb
        data = _git_archive(git, rev, (OLD_SOURCE_DIR,))
        paths = [OLD_SOURCE_DIR]
        if data is None:
            raise BenchError(f"git archive {rev}: neither {SOURCE_DIRS[0]} nor {OLD_SOURCE_DIR} is there")
        shim = into / "shim" / "devin_outposts_sim"
        shim.mkdir(parents=True)
        (shim / "__init__.py").write_text("")
        (shim / "__main__.py").write_text(OLD_LAYOUT_SHIM)
        paths.insert(0, "shim")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():  # our own repository's tree, but refuse anything odd anyway
            odd = member.name.startswith("/") or ".." in Path(member.name).parts
            if odd or member.issym() or member.islnk():
                raise BenchError(f"unexpected archive member {member.name}")
        tar.extractall(into)  # noqa: S202 - members checked above
    return os.pathsep.join(str(into / path) for path in paths)


FIGURES = [
    ("enqueue_per_s", "enqueues/s ({streams} idle streams)", "{:.0f}"),
    ("claims_per_s", "won claims/s ({claimers} claimers)", "{:.0f}"),
    ("storm_requests_per_s", "requests/s in the claim storm", "{:.0f}"),
    ("requests_per_session", "requests per served session", "{:.1f}"),
    ("conflicts_per_session", "409s per served session", "{:.1f}"),
    ("lists_per_s", "list requests/s (100 rows, {listers} listers)", "{:.0f}"),
    ("sim_cpu_per_1000_sessions_s", "sim CPU s per 1000 sessions", "{:.1f}"),
    ("enqueues_per_sim_cpu_s", "enqueues per sim CPU second", "{:.0f}"),
    ("claims_per_sim_cpu_s", "won claims per sim CPU second", "{:.1f}"),
    ("storm_requests_per_sim_cpu_s", "storm requests per sim CPU second", "{:.0f}"),
    ("lists_per_sim_cpu_s", "lists per sim CPU second", "{:.0f}"),
    ("sim_cpu_per_1000_lists_s", "sim CPU s per 1000 lists", "{:.2f}"),
    ("sim_cpu_share_storm", "sim CPU share in the storm", "{:.0%}"),
    ("client_cpu_share_storm", "client CPU share in the storm", "{:.0%}"),
    ("events_per_stream_min", "events on the slowest stream", "{:.0f}"),
]


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key, dummy, dummy_fmt in FIGURES}


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, say: Out) -> None:
    names = list(results)
    say(f"simulator ceiling: {args.sessions} sessions, medians of {args.runs} run(s) per column")
    say(f"{'figure':44s}" + "".join(f"{name:>22s}" for name in names))
    table = {name: medians(runs) for name, runs in results.items()}
    for key, label, fmt in FIGURES:
        text = label.format(streams=args.streams, claimers=args.claimers, listers=args.listers)
        say(f"{text:44s}" + "".join(f"{fmt.format(table[name][key]):>22s}" for name in names))
    if len(names) == 2:
        old, new = (table[name] for name in names)
        for key, label in (("enqueue_per_s", "enqueues/s"), ("claims_per_s", "claims/s"),
                           ("lists_per_s", "lists/s")):  # fmt: skip
            say(f"  {label}: x{new[key] / old[key]:.1f}")
        cpu = "sim_cpu_per_1000_sessions_s"
        say(f"  sim CPU per 1000 sessions: x{new[cpu] / old[cpu]:.2f}")
        for key, label in (("enqueues_per_sim_cpu_s", "enqueues"), ("claims_per_sim_cpu_s", "won claims"),
                           ("lists_per_sim_cpu_s", "lists")):  # fmt: skip
            say(f"  {label} per sim CPU second: x{new[key] / old[key]:.1f}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=1000, help="sessions per run (1000)")
    parser.add_argument("--streams", type=int, default=50, help="idle watch streams (50)")
    parser.add_argument("--enqueuers", type=int, default=4, help="concurrent enqueue clients (4)")
    parser.add_argument("--claimers", type=int, default=50, help="concurrent claimers (50)")
    parser.add_argument("--listers", type=int, default=8, help="concurrent listers (8)")
    parser.add_argument("--list-secs", type=float, default=10.0, help="length of the list phase (10)")
    parser.add_argument("--runs", type=int, default=3, help="runs per column; medians are printed (3)")
    parser.add_argument("--baseline", metavar="REV", help="also run the simulator of git revision REV")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, one run")
    parser.add_argument("--json", metavar="FILE", help="also write each run's figures as JSON ('-': stdout)")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.streams, args.claimers, args.listers = 100, 10, 10, 4
        args.list_secs, args.runs = 2.0, 1
    return args


def main() -> int:
    args = parse_args()
    say = reporter(args.json)

    results: dict[str, list[dict[str, Any]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="devin-bench-ceiling-") as tmpdir:
            root = Path(tmpdir)
            variants: list[tuple[str, Optional[dict[str, str]]]] = []
            if args.baseline:
                src = extract_source(args.baseline, root / "baseline")
                variants.append((f"baseline {args.baseline}", {"PYTHONPATH": src}))
            variants.append(("this tree", None))
            for run in range(args.runs):
                for name, env in variants:
                    label = f"{name} #{run + 1}"
                    say(f"... {label}")
                    slug = f"{'base' if env else 'tree'}-{run}"
                    options: dict[str, Any] = {"watch_max_duration": 3600.0, "env": env}
                    with bench_sim(root, slug, **options) as sim:
                        figures = asyncio.run(one_run(sim, args))
                    results.setdefault(name, []).append(figures)
                    say("    " + ", ".join(f"{key} {value:.4g}" for key, value in figures.items()))
    except (BenchError, SimAdminError, OSError, RuntimeError, httpx.HTTPError) as exc:
        say(f"benchmark broke: {exc}")
        return 1
    report(results, args, say)
    if args.json:
        write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
