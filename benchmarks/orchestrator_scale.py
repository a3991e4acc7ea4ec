"""The orchestrator at scale, per driver: ``--live`` sessions held live with renewals and churn, machine
status polled (``--machine-status poll``, the baseline) beside watched (``watch``), in the same run.

For each driver and each mode, everything runs as real processes on this machine: ``devin-outposts-sim
serve`` (a fresh SQLite file, one ``linux`` outpost, claims of ``--claim-ttl`` seconds (60), so every
session renews about every 40 s inside the window), an HTTP relay (``_faultproxy.py``, no faults) between
the orchestrator and the fleet API that counts every request by route, and ``devin-outposts orchestrate``
with production tuning except ``--boot-timeout 3600`` (a held session is never ``running`` in the queue, and
must not be given up for it) and ``--max-concurrent`` = the live count. What each machine runs holds until
stopped instead of a real worker (as ``orchestrator.py``'s run 2: 500 real workers do not fit this box), so
the figures are the orchestrator's and its platform's cost, not the workers':

* ``process``: the driver runs ``/bin/sh`` holding on ``sleep``;
* ``podman``: a container of the session image (``scripts/test-hosts/build-session-image.sh``) running
  ``sleep``, ``--network none``, each with its conmon: the machine's memory and pids bound how many
  (``--podman-live``, 100 by default; say what was reached);
* ``kubernetes``: the project's fake API server (``python/devin-outposts/tests/k8s_fake.py``) in this process,
  and a kubelet stand-in thread that marks each new Pod ``Running`` about a second after it is created and
  finishes deletions. It counts every request by verb.

The brain fills ``--live`` sessions, waits until every worker runs (the orchestrator's
``session_start_seconds`` count) and ``--settle`` seconds, then samples two windows of ``--window`` seconds:
a steady state (renewals only), then one in which it ends ``--churn`` sessions per second (``terminated``,
chosen at random) and enqueues as many new ones. Reported
for each mode, side by side: fleet API requests per second (all, renewals, and beyond renewals: everything
but the claim POSTs that were renewals), Kubernetes requests per second by verb, the orchestrator's CPU (% of
one core; with podman also the CPU of the ``podman`` commands it ran, from its reaped children's times) and
RSS, ``/healthz`` answer time p50/p99 (the event loop's lag), and how many sessions churned. Targets from
issue 27 at 500 live: Kubernetes <= 5 requests/s, fleet <= 5 requests/s beyond renewals, podman status
< 10 % of a core.

Run: ``.venv/bin/python benchmarks/orchestrator_scale.py [--drivers process,podman,kubernetes] [--live 500]
[--quick] [--json FILE|-]``. ``--quick``: 50 live, 20 podman, 20 s windows. Measurements, not assertions:
exit 0 unless the benchmark itself broke.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from devin_outposts_sim.admin_client import SimAdminError
from orchestrator import (
    REPO,
    Orchestrator,
    commit,
    fmt_ms,
    pid_of,
    pids_working_under,
    ratio,
    relay,
    running_orchestrator,
    sample_window,
    write_hold_worker,
)

from _harness import (
    CLOCK_TICKS,
    BenchError,
    BenchSim,
    bench_sim,
    in_work_dir,
    reporter,
    wait_until,
    write_json,
)

Out = Callable[[str], None]
TESTS = REPO / "python" / "devin-outposts" / "tests"
MODES = ("poll", "watch")
#: What a podman machine runs instead of the worker: the driver appends ``worker start --session=<id>``,
#: which ``sh -c`` takes as its positional parameters and ignores.
PODMAN_HOLD = ("/bin/sh", "-c", "exec sleep 2147483647", "hold")


class DriverOrchestrator(Orchestrator):
    """``orchestrate`` with another driver and ``--machine-status``."""

    def __init__(self, sim: BenchSim, api_url: str, driver: str, mode: str, *args: str) -> None:
        self.acceptor_id = f"bench-{driver}-{mode}-{os.urandom(3).hex()}"
        super().__init__(
            sim,
            f"orch-{driver}-{mode}",
            api_url,
            "--machine-status",
            mode,
            "--acceptor-id",
            self.acceptor_id,
            *args,
        )
        self.argv[self.argv.index("--driver") + 1] = driver

    def children_cpu_seconds(self) -> float:
        """CPU seconds of the orchestrator's children: those it reaped (``cutime + cstime``: its podman
        commands) and those still running (its ``podman events`` child). A difference of two readings is
        what its children used in between."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    child = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(child[1]) == self.pid:
                        total += (int(child[11]) + int(child[12])) / CLOCK_TICKS
        return total


# --- the platforms -------------------------------------------------------------------------------------


class Platform:
    """How one driver is set up, and what it counts besides the orchestrator."""

    name = ""

    def driver_args(self, sim: BenchSim) -> list[str]:
        return []

    def counts(self) -> dict[str, int]:
        """Requests to the platform's API so far, by verb (nothing for drivers without one)."""
        return {}

    def clean(self, acceptor_id: str) -> None:
        """Remove whatever the orchestrator of ``acceptor_id`` left (it detaches from its machines)."""
        return None

    def close(self) -> None:
        return None


class ProcessPlatform(Platform):
    name = "process"

    def driver_args(self, sim: BenchSim) -> list[str]:
        hold = write_hold_worker(sim.root / "hold-worker.sh", sim.root / "runs")
        return ["--driver-opt", f"worker_command={hold}"]


class PodmanPlatform(Platform):
    name = "podman"

    def __init__(self, image: str) -> None:
        self.image = image

    def driver_args(self, sim: BenchSim) -> list[str]:
        words = " ".join(f"'{word}'" for word in PODMAN_HOLD)
        return [
            "--driver-opt", f"image={self.image}",
            "--driver-opt", f"worker_command={words}",
            "--driver-opt", "network=none",
            "--driver-opt", "stop_grace=1",
        ]  # fmt: skip

    def clean(self, acceptor_id: str) -> None:
        label = f"label=outposts.devin.ai/acceptor-id={acceptor_id}"
        podman = shutil.which("podman") or "podman"
        for kind, listing in (("container", ["ps", "-aq"]), ("volume", ["volume", "ls", "-q"])):
            found = subprocess.run(
                [podman, *listing, "--filter", label], capture_output=True, text=True, check=False
            ).stdout.split()
            if found:
                remove = ["rm", "-f", "-t", "0"] if kind == "container" else ["volume", "rm", "-f"]
                subprocess.run([podman, *remove, *found], capture_output=True, check=False)


class KubernetesPlatform(Platform):
    """The fake API server in this process, and a kubelet stand-in that runs new Pods."""

    name = "kubernetes"
    NAMESPACE = "outposts"

    def __init__(self, root: Path) -> None:
        sys.path.insert(0, str(TESTS))
        from k8s_fake import run_fake_kube  # the tests' fake: not part of any distribution

        self._server = run_fake_kube()
        self.fake = self._server.__enter__()
        root.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = self.fake.kubeconfig(root / "kubeconfig", namespace=self.NAMESPACE)
        self._stop = threading.Event()
        self._kubelet = threading.Thread(target=self._run_pods, name="kubelet", daemon=True)
        self._kubelet.start()

    def driver_args(self, sim: BenchSim) -> list[str]:
        return [
            "--driver-opt", f"kubeconfig={self.kubeconfig}",
            "--driver-opt", f"namespace={self.NAMESPACE}",
            "--driver-opt", "image=registry.example/worker:1",
        ]  # fmt: skip

    def _run_pods(self) -> None:
        """Every 0.5 s: a Pod created more than a second ago and not yet running is started; deletions
        finish. (What a kubelet would report, without containers.)"""
        first_seen: dict[str, float] = {}
        while not self._stop.wait(0.5):
            with contextlib.suppress(Exception):
                for pod in self.fake.objects("Pod", self.NAMESPACE):
                    name = pod["metadata"]["name"]
                    phase = (pod.get("status") or {}).get("phase")
                    if phase in (None, "Pending"):
                        seen = first_seen.setdefault(name, time.monotonic())
                        if time.monotonic() - seen >= 1.0:
                            self.fake.set_pod_status(self.NAMESPACE, name, running_pod_status(pod))
                self.fake.finish_deletions()

    def counts(self) -> dict[str, int]:
        return request_counts(self.fake)

    def close(self) -> None:
        self._stop.set()
        self._kubelet.join(5)
        self._server.__exit__(None, None, None)


def running_pod_status(pod: dict[str, Any]) -> dict[str, Any]:
    containers = pod["spec"]["containers"]
    return {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {"name": c["name"], "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "now"}}}
            for c in containers
        ],
    }


def request_counts(fake: Any) -> dict[str, int]:
    """Requests the fake API server answered, by verb and resource (``get pods``, ``watch pods``...)."""
    counts: dict[str, int] = {}
    for request in list(fake.requests):
        key = f"{request.verb} {request.resource}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def session_image() -> str:
    """The session image the podman tests use (built and cached by the test hosts' script)."""
    script = REPO / "scripts" / "test-hosts" / "build-session-image.sh"
    done = subprocess.run([str(script)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise BenchError(f"building the session image failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


# --- the brain -------------------------------------------------------------------------------------------


class Churn:
    """Ends ``rate`` random live sessions per second and enqueues as many new ones, on a thread."""

    def __init__(self, sim: BenchSim, live: list[str], rate: float) -> None:
        self.sim = sim
        self.live = live
        self.rate = rate
        self.ended: list[str] = []
        self.enqueued: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def __enter__(self) -> Churn:
        if self.rate > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        credit = 0.0
        last = time.monotonic()
        while not self._stop.wait(0.2):
            now = time.monotonic()
            credit += (now - last) * self.rate
            last = now
            while credit >= 1 and self.live:
                credit -= 1
                sid = self.live.pop(random.randrange(len(self.live)))
                try:
                    self.sim.admin.end_session(sid, "terminated")
                    self.ended.append(sid)
                    new = self.sim.admin.enqueue(self.sim.outpost_id).session_id
                    self.enqueued.append(new)
                    self.live.append(new)
                except SimAdminError as exc:
                    self.errors.append(str(exc))


def started_workers(orch: Orchestrator) -> float:
    """Workers seen running so far (the count of the ``session_start_seconds`` histogram)."""
    return orch.metric("session_start_seconds_count")


def claim_actions(sim: BenchSim, since: float, until: float) -> dict[str, int]:
    """Claim history records by action (claim, renew, release...) stamped within [since, until)."""
    counts: dict[str, int] = {}
    for record in sim.claim_records():
        at = float(record.get("at") or record.get("created_at") or 0)
        if since <= at < until:
            counts[record["action"]] = counts.get(record["action"], 0) + 1
    return counts


def measure(
    sim: BenchSim,
    orch: DriverOrchestrator,
    proxy: Any,
    platform: Platform,
    sim_pid: int,
    sessions: list[str],
    churn_rate: float,
    seconds: float,
) -> dict[str, Any]:
    """One window of ``seconds``, ending and enqueueing ``churn_rate`` sessions per second meanwhile."""
    api0 = platform.counts()
    children0 = orch.children_cpu_seconds()
    wall0 = time.time()
    with Churn(sim, sessions, churn_rate) as churn:
        window = sample_window(orch, proxy, sim_pid, seconds)
    wall1 = time.time()
    api1 = platform.counts()
    window["children_cpu_pct"] = 100 * (orch.children_cpu_seconds() - children0) / window["window_s"]
    window["platform_per_s"] = {
        verb: round((count - api0.get(verb, 0)) / window["window_s"], 2)
        for verb, count in sorted(api1.items())
        if count - api0.get(verb, 0)
    }
    window["platform_requests_per_s"] = sum(window["platform_per_s"].values())
    actions = claim_actions(sim, wall0, wall1)
    window["claim_actions"] = actions
    renewals = actions.get("renew", 0) / window["window_s"]
    window["renewals_per_s"] = renewals
    window["beyond_renewals_per_s"] = window["requests_per_s"] - renewals
    window["churned"] = len(churn.ended)
    window["churn_errors"] = len(churn.errors)
    window["workers_started"] = started_workers(orch)
    return window


def run_mode(
    args: argparse.Namespace, root: Path, platform: Platform, mode: str, live: int, say: Out
) -> dict[str, Any]:
    with bench_sim(root, f"{platform.name}-{mode}", claim_ttl=args.claim_ttl) as sim, relay(sim) as proxy:
        orch = DriverOrchestrator(
            sim,
            proxy.url,
            platform.name,
            mode,
            "--max-concurrent", str(live + int(args.churn * 4) + 10),
            "--boot-timeout", "3600",
            *platform.driver_args(sim),
        )  # fmt: skip
        sim_pid = pid_of(sim)
        result: dict[str, Any] = {"driver": platform.name, "mode": mode, "live": live}
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(platform.clean, orch.acceptor_id)
            cleanup.enter_context(running_orchestrator(orch, lambda: pids_working_under(sim.root, [sim_pid])))
            sessions = [sim.admin.enqueue(sim.outpost_id).session_id for dummy in range(live)]
            began = time.monotonic()
            wait_until(
                lambda: started_workers(orch) >= live,
                timeout=args.timeout,
                interval=1.0,
                what=f"{live} {platform.name} workers to run",
            )
            result["fill_s"] = time.monotonic() - began
            filled = result["fill_s"]
            say(f"  {platform.name}/{mode}: {live} live after {filled:.1f} s; settling {args.settle:g} s")
            time.sleep(args.settle)
            result["steady"] = measure(sim, orch, proxy, platform, sim_pid, sessions, 0.0, args.window)
            result["window"] = measure(sim, orch, proxy, platform, sim_pid, sessions, args.churn, args.window)
        return result


# --- the report ------------------------------------------------------------------------------------------


#: The figures of each window: label, key, format.
ROWS = (
    ("fleet API requests/s", "requests_per_s", "{:12.2f}"),
    ("  of which claim renewals/s", "renewals_per_s", "{:12.2f}"),
    ("  beyond renewals/s", "beyond_renewals_per_s", "{:12.2f}"),
    ("platform API requests/s", "platform_requests_per_s", "{:12.2f}"),
    ("orchestrator CPU % of one core", "cpu_pct", "{:12.2f}"),
    ("its children's CPU % of one core (podman)", "children_cpu_pct", "{:12.2f}"),
    ("orchestrator RSS median (MiB)", "rss_mib", "{:12.1f}"),
    ("threads", "threads", "{:12.0f}"),
    ("simulator CPU %", "sim_cpu_pct", "{:12.2f}"),
)


def report(driver: str, runs: dict[str, dict[str, Any]], say: Out) -> None:
    if set(runs) != set(MODES):  # --modes named one: its figures alone, no baseline beside them
        report_one(driver, runs, say)
        return
    live = runs["watch"]["live"]
    for part, what in (("steady", "steady state, no churn"), ("window", "with churn")):
        poll, watch = runs["poll"][part], runs["watch"][part]
        say("")
        say(f"{driver}: {live} live sessions, {what} ({watch['churned']} sessions ended and as many enqueued "
            f"in {watch['window_s']:.0f} s with watch, {poll['churned']} with poll)")  # fmt: skip
        say(f"  {'':44s} {'watch':>12s} {'poll (baseline)':>16s} {'ratio':>8s}")
        for label, key, fmt in ROWS:
            a, b = fmt.format(watch[key]), fmt.format(poll[key])
            say(f"  {label:44s} {a} {b:>16s} {ratio(watch[key], poll[key]):>8s}")
        say(f"  /healthz answer time: watch {fmt_ms(watch['healthz_s'])}; poll {fmt_ms(poll['healthz_s'])}")
        say(f"  platform requests/s by verb: watch {watch['platform_per_s']}")
        say(f"                               poll {poll['platform_per_s']}")


def report_one(driver: str, runs: dict[str, dict[str, Any]], say: Out) -> None:
    """One mode's figures (``--modes watch`` or ``--modes poll``): no ratio, there is no baseline."""
    ((mode, run),) = runs.items()
    for part, what in (("steady", "steady state, no churn"), ("window", "with churn")):
        figures = run[part]
        say("")
        churn = f"{figures['churned']} sessions ended and as many enqueued in {figures['window_s']:.0f} s"
        say(f"{driver} --machine-status {mode}: {run['live']} live sessions, {what} ({churn})")
        for label, key, fmt in ROWS:
            say(f"  {label:44s} {fmt.format(figures[key])}")
        say(f"  /healthz answer time: {fmt_ms(figures['healthz_s'])}")
        say(f"  platform requests/s by verb: {figures['platform_per_s']}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--drivers", default="process,podman,kubernetes", help="which drivers, comma-separated (all three)")
    add("--live", type=int, default=500, help="sessions held live (500)")
    add("--modes", default="poll,watch", help="--machine-status modes, comma-separated (poll,watch: both, "
        "poll the baseline); one mode alone is reported without a baseline")  # fmt: skip
    add(
        "--podman-live",
        type=int,
        default=100,
        help="sessions held live on podman (100: containers cost memory)",
    )
    add("--churn", type=float, default=1.0, help="sessions ended and enqueued per second in the window (1)")
    add("--claim-ttl", type=float, default=60.0, help="the simulator's claim lifetime, seconds (60)")
    add("--window", type=float, default=60.0, help="seconds of each steady-state window (60)")
    add("--settle", type=float, default=10.0, help="seconds before each window (10)")
    add("--timeout", type=float, default=900.0, help="seconds a fill may take (900)")
    add("--quick", action="store_true", help="50 live, 20 on podman, 20 s windows (a validation run)")
    add("--keep", metavar="DIR", help="keep the simulators' and processes' files under DIR")
    add("--json", metavar="FILE", help="also write the figures as JSON ('-' = stdout)")
    args = parser.parse_args()
    if args.quick:
        args.live, args.podman_live, args.window, args.settle = 50, 20, 20.0, 5.0
    args.drivers = [d.strip() for d in args.drivers.split(",") if d.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or set(args.modes) - set(MODES):
        parser.error(f"--modes: one or both of {', '.join(MODES)}")
    unknown = set(args.drivers) - {"process", "podman", "kubernetes"}
    if unknown:
        parser.error(f"unknown driver(s): {', '.join(sorted(unknown))}")
    return args


@contextlib.contextmanager
def platform_for(driver: str, root: Path) -> Iterator[Platform]:
    platform: Platform
    if driver == "process":
        platform = ProcessPlatform()
    elif driver == "podman":
        platform = PodmanPlatform(session_image())
    else:
        platform = KubernetesPlatform(root)
    try:
        yield platform
    finally:
        platform.close()


def bench(args: argparse.Namespace, root: Path, say: Out) -> dict[str, Any]:
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": commit(),
        "cpus": os.cpu_count(),
        "load_at_start": os.getloadavg(),
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "keep")},
        "drivers": {},
    }
    for driver in args.drivers:
        live = args.podman_live if driver == "podman" else args.live
        runs: dict[str, dict[str, Any]] = {}
        for mode in [m for m in MODES if m in args.modes]:
            say(f"{driver} --machine-status {mode}: {live} live {time.strftime('%H:%M:%S')}")
            with platform_for(driver, root / f"{driver}-{mode}-platform") as platform:
                runs[mode] = run_mode(args, root, platform, mode, live, say)
        result["drivers"][driver] = runs
        report(driver, runs, say)
    result["load_at_end"] = os.getloadavg()
    return result


def main() -> int:
    args = parse_args()
    say = reporter(args.json)

    say(f"orchestrator scale benchmark {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, commit "
        f"{commit()}, {os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}: "
        f"{', '.join(args.drivers)}; {args.live} live ({args.podman_live} on podman), "
        f"churn {args.churn:g}/s, claim TTL {args.claim_ttl:g} s, {args.window:g} s windows")  # fmt: skip
    try:
        result = in_work_dir(args.keep, "devin-bench-scale-", lambda root: bench(args, root, say))
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
