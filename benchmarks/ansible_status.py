"""The ``ansible`` driver's status cost: its status source beside polling, in the same run.

The status source (``drivers/ansible/status.py``) reads every machine of the orchestrator with ONE ad-hoc
run (``systemctl show`` of all the session units of each host, the hosts in parallel) every
``status_interval`` (30 s by default). Polling (``--machine-status poll``, and what every session falls back
to while the source is out of sync) is one ad-hoc run per machine (``driver.status(machine)``) every
``--status-interval-secs`` (2 s). Both are measured here against real systemd units:

* the hosts are systemd-nspawn test hosts (``scripts/test-hosts/nspawn-host.sh``, the images of
  ``scripts/test-hosts/build-images.sh``; needs root), reached over ssh with the connection variables the
  example provision playbook reports (``docs/examples/orchestrator/provision-nspawn.yml``), as any remote host
  is;
* the workers are transient units named like the worker role's session units
  (``devin-outposts-session@<id>.service``: ``systemd-run -p RemainAfterExit=yes sleep``), and the driver's
  machine records name them, as ``provision`` would have written them.

For each size (``--sizes``: machines x hosts, the machines spread evenly over the hosts) this runs one
unmeasured source run (the ssh connections come up; ansible's ControlPersist keeps them between runs 30 s
apart, as in production), then ``--cycles`` source runs (``AnsibleStatusSource.read_all``, what the source
does every interval) and ``--poll-sample`` single reads (``driver.status``, one machine after another). For
each: wall time and CPU seconds of this process plus its reaped children (ansible-runner, ansible, ssh:
``getrusage``), medians. At steady state the source costs one run per interval, so ``cycle CPU /
status_interval``; polling costs N reads every 2 s, so ``N x CPU per read / 2 s`` (above 100 % of a core,
polling cannot keep up at all: the reads queue). Not counted: the ssh ControlPersist master (it detaches,
so it is never reaped here) and what ``sshd`` and ``systemctl`` cost on the hosts.

Run: ``.venv/bin/python benchmarks/ansible_status.py [--sizes 10x1,50x1,200x1,200x2,200x3] [--cycles 5]
[--poll-sample 5] [--quick] [--json FILE|-]``. ``--quick``: sizes 10x1 and 50x1, 3 cycles, 3 poll reads.
Measurements, not assertions: exit 0 unless the benchmark itself broke (no host, a unit not read running).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from devin_outposts.orchestrator.drivers.ansible import AnsibleDriver
from devin_outposts.orchestrator.drivers.ansible.options import OPTIONS
from devin_outposts.orchestrator.drivers.ansible.records import machine_of
from devin_outposts.orchestrator.drivers.ansible.status import AnsibleStatusSource
from devin_outposts.orchestrator.drivers.base import DriverContext, WorkerState
from devin_outposts.orchestrator.drivers.status_board import StatusBoard
from orchestrator import REPO, commit

from _harness import BenchError, reporter, write_json

Out = Callable[[str], None]
SCRIPTS = REPO / "scripts" / "test-hosts"
CACHE = Path(os.environ.get("DEVIN_OUTPOSTS_TEST_HOSTS", "/var/tmp/devin-outposts-test-hosts"))  # noqa: S108
SUITE = "bookworm"
ACCEPTOR = "bench-ansible"
OUTPOST = "bench-ansible-outpost"
#: The status source's default interval, and ``--status-interval-secs`` (polling): the steady-state rates.
SOURCE_INTERVAL = float(OPTIONS["status_interval"].default)
POLL_INTERVAL = 2.0


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and of its children reaped so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def parse_sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for item in text.split(","):
        machines, dummy, hosts = item.strip().partition("x")
        sizes.append((int(machines), int(hosts or 1)))
    if any(m < 1 or h < 1 or h > m for m, h in sizes):
        raise argparse.ArgumentTypeError(f"bad sizes {text!r}: MACHINESxHOSTS, at least one machine per host")
    return sizes


class Hosts:
    """Booted nspawn test hosts (``bench-ans-<i>``), each holding session units; stopped on close."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.env = {**os.environ, "DEVIN_OUTPOSTS_TEST_HOSTS_RUN": str(run_dir)}
        self.leaders: dict[str, str] = {}

    def _script(self, *args: str) -> str:
        argv = [str(SCRIPTS / "nspawn-host.sh"), *args]
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode:
            raise BenchError(f"nspawn-host.sh {' '.join(args)}: {done.stderr.strip()[-500:]}")
        return done.stdout.strip()

    def boot(self, name: str) -> None:
        self.leaders[name] = self._script("start", name, SUITE).splitlines()[-1]

    def add_units(self, name: str, session_ids: Sequence[str]) -> None:
        """One ``systemd-run`` per session unit, in one shell inside the host."""
        script = "; ".join(
            f"systemd-run --quiet --unit=devin-outposts-session@{sid}.service -p RemainAfterExit=yes "
            "/bin/sleep 2147483647"
            for sid in session_ids
        )
        argv = [str(shutil.which("nsenter")), "-t", self.leaders[name], "-a", "sh", "-ec", script]
        subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)

    def host_vars(self, name: str) -> dict[str, Any]:
        """What the example provision playbook reports for a host: ssh through its network namespace."""
        proxy = f"env DEVIN_OUTPOSTS_TEST_HOSTS_RUN={self.run_dir} {SCRIPTS}/nspawn-host.sh proxy {name}"
        return {
            "ansible_user": "root",
            "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(CACHE / "ssh" / "id_ed25519"),
            "ansible_ssh_common_args": f'-o ProxyCommand="{proxy}" -o StrictHostKeyChecking=no '
            "-o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes",
        }

    def close(self) -> None:
        """Stop every host at once (each stop may wait for its systemd to shut down)."""
        stops = {
            name: subprocess.Popen([str(SCRIPTS / "nspawn-host.sh"), "stop", name], env=self.env)
            for name in self.leaders
        }
        for name, stop in stops.items():
            if stop.wait(timeout=120):
                print(f"could not stop {name}: exit {stop.returncode}", file=sys.stderr)


@contextmanager
def booted(count: int, units_per_host: int, say: Out) -> Iterator[tuple[Hosts, dict[str, list[str]]]]:
    """``count`` hosts with ``units_per_host`` session units each: the hosts and each one's session ids."""
    if os.geteuid() != 0 or not (CACHE / f"rootfs-{SUITE}" / ".devin-outposts-rootfs").exists():
        raise BenchError("needs root and the test-host images (scripts/test-hosts/build-images.sh)")
    # Short: the hosts' relay sockets live under it, and a socket path has at most 107 bytes.
    hosts = Hosts(Path(tempfile.mkdtemp(prefix="do-", dir="/tmp")))
    try:
        sessions: dict[str, list[str]] = {}
        for index in range(1, count + 1):
            name = f"bench-ans-{index}"
            began = time.monotonic()
            hosts.boot(name)
            sessions[name] = [f"bench-{index}-{n}" for n in range(units_per_host)]
            hosts.add_units(name, sessions[name])
            say(f"  host {name}: up with {units_per_host} session units in {time.monotonic() - began:.1f} s")
        yield hosts, sessions
    finally:
        hosts.close()
        shutil.rmtree(hosts.run_dir, ignore_errors=True)


def make_driver(root: Path, hosts: Hosts, placed: dict[str, list[str]]) -> AnsibleDriver:
    """A driver whose records name ``placed`` (host -> session ids) as provision would have written them."""
    playbook = root / "unused.yml"  # neither provision nor teardown runs here
    driver = AnsibleDriver(
        DriverContext(state_dir=root / "state"), provision_playbook=playbook, teardown_playbook=playbook
    )
    for host, session_ids in placed.items():
        for sid in session_ids:
            driver.records.write(
                {
                    "name": f"machine-{sid}",
                    "session_id": sid,
                    "outpost_id": OUTPOST,
                    "acceptor_id": ACCEPTOR,
                    "created_at": time.time(),
                    "session": {},
                    "host": host,
                    "host_vars": hosts.host_vars(host),
                }
            )
    return driver


async def timed(action: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall seconds, CPU seconds (this process and reaped children) and the result of ``await action()``."""
    cpu0, wall0 = cpu_seconds(), time.monotonic()
    result = await action()
    return time.monotonic() - wall0, cpu_seconds() - cpu0, result


async def measure_size(
    driver: AnsibleDriver, machines: int, cycles: int, poll_sample: int, say: Out
) -> dict[str, Any]:
    source = AnsibleStatusSource(driver, ACCEPTOR, interval=SOURCE_INTERVAL)
    names = [str(r["name"]) for r in driver.records.of_acceptor(ACCEPTOR)]

    async def read_all() -> int:
        board = StatusBoard()
        await source.read_all(board)
        rows = [board.row(name) for name in names]
        return sum(1 for row in rows if row is not None and row.status.state is WorkerState.RUNNING)

    first_wall, first_cpu, running = await timed(read_all)  # connections come up: not a steady-state run
    if running != machines:
        raise BenchError(f"the source read {running} of {machines} units running")
    cycle_wall: list[float] = []
    cycle_cpu: list[float] = []
    for dummy in range(cycles):
        wall, cpu, running = await timed(read_all)
        if running != machines:
            raise BenchError(f"the source read {running} of {machines} units running")
        cycle_wall.append(wall)
        cycle_cpu.append(cpu)
    read_wall: list[float] = []
    read_cpu: list[float] = []
    for record in list(driver.records.of_acceptor(ACCEPTOR))[:poll_sample]:
        wall, cpu, status = await timed(functools.partial(driver.status, machine_of(record)))
        if status.state is not WorkerState.RUNNING:
            raise BenchError(f"a direct read of {record['name']} said {status}")
        read_wall.append(wall)
        read_cpu.append(cpu)
    watch_cpu = statistics.median(cycle_cpu)
    poll_cpu = statistics.median(read_cpu)
    figures: dict[str, Any] = {
        "machines": machines,
        "source": {
            "first_run_wall_s": first_wall,
            "first_run_cpu_s": first_cpu,
            "cycle_wall_s": statistics.median(cycle_wall),
            "cycle_cpu_s": watch_cpu,
            "cpu_ms_per_machine": 1000 * watch_cpu / machines,
            "core_percent": 100 * watch_cpu / SOURCE_INTERVAL,
            "interval_s": SOURCE_INTERVAL,
            "runs": source.runs,
        },
        "poll": {
            "read_wall_s": statistics.median(read_wall),
            "read_cpu_s": poll_cpu,
            "cycle_cpu_s": machines * poll_cpu,
            "cpu_ms_per_machine": 1000 * poll_cpu,
            "core_percent": 100 * machines * poll_cpu / POLL_INTERVAL,
            "interval_s": POLL_INTERVAL,
            "reads": len(read_cpu),
        },
    }
    say(
        f"    source: a run {figures['source']['cycle_wall_s']:.2f} s, {watch_cpu:.2f} CPU s (the first "
        f"{first_wall:.2f} s, {first_cpu:.2f} CPU s); poll: a read {figures['poll']['read_wall_s']:.2f} s, "
        f"{poll_cpu:.2f} CPU s"
    )
    return figures


def report(sizes: list[dict[str, Any]], say: Out) -> None:
    say("")
    say(
        f"ansible status at steady state: the source (one run per {SOURCE_INTERVAL:g} s) against polling "
        f"(one run per machine per {POLL_INTERVAL:g} s); medians"
    )
    header = (
        f"  {'machines x hosts':>16} {'source run s':>12} {'source CPU s':>12} {'ms/machine':>10} "
        f"{'% core':>7} | {'poll read s':>11} {'poll CPU s':>10} {'% core':>8} {'ratio':>8}"
    )
    say(header)
    for size in sizes:
        watch, poll = size["source"], size["poll"]
        ratio = poll["core_percent"] / watch["core_percent"] if watch["core_percent"] else math.inf
        say(
            f"  {size['machines']:>9} x {size['hosts']:<4} {watch['cycle_wall_s']:>12.2f} "
            f"{watch['cycle_cpu_s']:>12.2f} {watch['cpu_ms_per_machine']:>10.1f} "
            f"{watch['core_percent']:>7.2f} | {poll['read_wall_s']:>11.2f} {poll['read_cpu_s']:>10.2f} "
            f"{poll['core_percent']:>8.0f} x{ratio:>7.0f}"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--sizes", type=parse_sizes, default=parse_sizes("10x1,50x1,200x1,200x2,200x3"),
        help="MACHINESxHOSTS, comma-separated (10x1,50x1,200x1,200x2,200x3)")  # fmt: skip
    add("--cycles", type=int, default=5, help="measured source runs per size (5)")
    add("--poll-sample", type=int, default=5, help="direct reads per size, one after another (5)")
    add("--quick", action="store_true", help="sizes 10x1,50x1, 3 cycles, 3 reads (a validation run)")
    add("--json", metavar="FILE", help="also write the figures as JSON ('-' = stdout)")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.cycles, args.poll_sample = parse_sizes("10x1,50x1"), 3, 3
    return args


def bench(args: argparse.Namespace, say: Out) -> dict[str, Any]:
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": commit(),
        "cpus": os.cpu_count(),
        "load_at_start": os.getloadavg(),
        "args": {k: v for k, v in vars(args).items() if k != "json"},
        "sizes": [],
    }
    host_count = max(hosts for dummy, hosts in args.sizes)
    per_host = max(math.ceil(machines / hosts) for machines, hosts in args.sizes)
    with booted(host_count, per_host, say) as (hosts, sessions):
        for index, (machines, count) in enumerate(args.sizes):
            # The machines spread evenly over the first `count` hosts.
            placed = {
                name: sessions[name][: machines // count + (i < machines % count)]
                for i, name in enumerate(list(sessions)[:count])
            }
            say(f"  {machines} machines on {count} host(s) {time.strftime('%H:%M:%S')}")
            # The driver's state (records, run artifacts) goes with the hosts' run directory.
            driver = make_driver(hosts.run_dir / f"size-{index}", hosts, placed)
            figures = asyncio.run(measure_size(driver, machines, args.cycles, args.poll_sample, say))
            result["sizes"].append({**figures, "hosts": count})
    result["load_at_end"] = os.getloadavg()
    report(result["sizes"], say)
    return result


def main() -> int:
    args = parse_args()
    say = reporter(args.json)

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    sizes = ",".join(f"{m}x{h}" for m, h in args.sizes)
    now = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    say(
        f"ansible status benchmark {now}, commit {commit()}, {os.cpu_count()} CPUs, load {load}: sizes "
        f"{sizes}, {args.cycles} cycles, {args.poll_sample} poll reads"
    )
    try:
        result = bench(args, say)
    except (BenchError, OSError, subprocess.SubprocessError) as exc:
        say(f"benchmark broke: {exc}")
        return 1
    say(f"machine load at the end: {' '.join(f'{x:.2f}' for x in result['load_at_end'])}")
    if args.json:
        write_json(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
