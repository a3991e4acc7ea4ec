"""Benchmark the fleet API surface: module task time and simulator claim throughput.

Prints, in one run, each figure next to a baseline measured the same way in the same run:

* the median wall time of one ``devin.outposts.outpost`` task and one ``devin.outposts.outpost_info``
  task (each an ad-hoc ``ansible localhost -m ...`` run), against ``ansible.builtin.ping`` run the same
  way, so the Ansible start-up cost shows as the baseline and the module's own cost as the difference;
* the simulator's claim throughput with 50 concurrent claimers over 1,000 sessions (every claimer tries
  every session, in its own random order), against 50 concurrent readers of the same sessions, and the
  number of double claims (sessions more than one claimer won), counted both from the claimers' own
  200s and from the simulator's claim history. It must be 0.

Run: ``.venv/bin/python benchmarks/fleet_api.py [--runs 7] [--sessions 1000] [--claimers 50]``.
The simulator runs as its own process on a SQLite file, as users run it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

from devin_outposts_sim.testing import SimProcess

REPO = Path(__file__).resolve().parents[1]


def collections_path(tmp: Path) -> str:
    """An ANSIBLE_COLLECTIONS_PATH whose devin/outposts is this checkout."""
    root = tmp / "collections"
    (root / "ansible_collections" / "devin").mkdir(parents=True, exist_ok=True)
    link = root / "ansible_collections" / "devin" / "outposts"
    if not link.exists():
        link.symlink_to(REPO)
    return str(root)


def ansible_adhoc(module: str, args: str, env: dict[str, str]) -> float:
    ansible = str(Path(sys.executable).with_name("ansible"))
    argv = [ansible, "localhost", "-c", "local", "-i", "localhost,", "-m", module]
    if args:
        argv += ["-a", args]
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{module} failed:\n{result.stdout}\n{result.stderr}")
    return elapsed


def time_modules(sim: SimProcess, runs: int, tmp: Path) -> None:
    env = dict(os.environ)
    env.update(
        ANSIBLE_COLLECTIONS_PATH=collections_path(tmp),
        DEVIN_API_URL=sim.url,
        DEVIN_OUTPOSTS_TOKEN=sim.create_token("orchestrator"),
        ANSIBLE_PYTHON_INTERPRETER=sys.executable,
        ANSIBLE_LOCALHOST_WARNING="False",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
    )
    cases = [
        ("ansible.builtin.ping (baseline)", "ansible.builtin.ping", ""),
        ("devin.outposts.outpost", "devin.outposts.outpost", "name=bench platform=linux state=present"),
        ("devin.outposts.outpost_info", "devin.outposts.outpost_info", "name=bench"),
    ]
    ansible_adhoc(cases[1][1], cases[1][2], env)  # create once: the timed runs are the idempotent path
    medians: dict[str, float] = {}
    for label, module, args in cases:
        times = [ansible_adhoc(module, args, env) for dummy in range(runs)]
        medians[label] = statistics.median(times)
    base = medians[cases[0][0]]
    print(f"module task wall time, median of {runs} runs each:")
    for label, value in medians.items():
        extra = "" if value is base else f"  (+{value - base:.3f} s over baseline, x{value / base:.2f})"
        print(f"  {label:36s} {value:.3f} s{extra}")


async def hammer(
    url: str, token: str, session_ids: list[str], workers: int, claim: bool
) -> tuple[float, Counter[str], Counter[int]]:
    """Every worker tries every session once; returns (seconds, wins per session, status counts)."""
    wins: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)

    async def one(index: int) -> None:
        order = session_ids[:]
        random.Random(index).shuffle(order)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:
            for session_id in order:
                path = f"/opbeta/outposts/devins/{session_id}"
                if claim:
                    response = await http.post(f"{path}/claim", json={"acceptor_id": f"bench-{index}"})
                else:
                    response = await http.get(path)
                statuses[response.status_code] += 1
                if claim and response.status_code == 200:
                    wins[session_id] += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(workers)))
    return time.perf_counter() - started, wins, statuses


def claim_throughput(sim: SimProcess, sessions: int, claimers: int) -> int:
    outpost = sim.admin.create_outpost("bench-claims", "linux")
    session_ids = [sim.admin.enqueue(outpost.outpost_id).session_id for dummy in range(sessions)]
    token = sim.create_token("machine")
    read_s, dummy_wins, read_statuses = asyncio.run(hammer(sim.url, token, session_ids, claimers, False))
    claim_s, wins, claim_statuses = asyncio.run(hammer(sim.url, token, session_ids, claimers, True))
    attempts = sessions * claimers
    history = sim.admin.claims(outpost_id=outpost.outpost_id)
    claim_events = [r for r in history if r.get("event", r.get("action")) == "claim"]
    by_session = Counter(r["session_id"] for r in claim_events)
    doubles_client = sum(1 for count in wins.values() if count > 1)
    doubles_history = sum(1 for count in by_session.values() if count > 1)
    print(f"simulator throughput, {claimers} concurrent clients x {sessions} sessions ({attempts} requests):")
    print(f"  GET one entry (baseline)     {attempts / read_s:8.0f} req/s  {dict(read_statuses)}")
    print(
        f"  claim                        {attempts / claim_s:8.0f} req/s  {dict(claim_statuses)}"
        f"  (x{read_s / claim_s:.2f} of baseline)"
    )
    print(f"  sessions won                 {len(wins)} of {sessions}; {sessions / claim_s:.0f} won claims/s")
    print(f"  double claims                {doubles_client} (claimers' 200s), {doubles_history} (history)")
    return doubles_client + doubles_history + (sessions - len(wins))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--claimers", type=int, default=50)
    parser.add_argument("--skip-modules", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="devin-bench-") as tmpdir:
        tmp = Path(tmpdir)
        sim = SimProcess(tmp / "sim.db", workdir=tmp)
        sim.start()
        try:
            if not args.skip_modules:
                time_modules(sim, args.runs, tmp)
            problems = claim_throughput(sim, args.sessions, args.claimers)
        finally:
            sim.close()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
