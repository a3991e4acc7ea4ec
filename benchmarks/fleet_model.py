"""Fleet model: many workers in a few processes, the real claim code, the real client, a real simulator.

``claim_latency.py`` runs one ``devin-outposts worker start`` process per worker, which caps a 2-core
machine at about 50 workers. This model runs W :class:`~devin_outposts.worker.runner.Worker` objects
spread over ``--procs`` model processes (forked from this one; by default one per
:data:`WORKERS_PER_PROC` workers, at most one per CPU), each running its share on one event loop, so
that 10, 50, 200 and 1,000 workers can be measured, and the model's own CPU (reported per process) is
not what sets the pace at 1,000. Each worker is the real
code from end to end (``Worker``, ``ClaimLoop``, ``QueueFeed``, ``SessionServer`` and ``FleetClient``:
list, watch, claims, 409 handling, renewals, status checks, confirm reads, release), each with its own
acceptor id, data directory, working directory and HTTP connections, over real sockets to a
``devin-outposts-sim serve`` process with default settings (one fresh SQLite file per run). Only two
things are stood in for, because a process per session would be the whole cost at this scale:

* the process layer: ``devin_outposts.worker.session.RemoteProcess`` is replaced by an in-process
  stand-in with what ``SessionServer`` uses (``start()``, ``pid``, ``proc.wait()``, ``wait()``,
  ``returncode``, ``stop()``). Its "process" exits 0 when the driver ends the session, and "dies" of
  SIGTERM at once when the worker stops it;
* the binary store: ``resolve_sha``/``ensure`` return a fixed SHA and path without downloading.

Once every model process says its workers watch the queue, this (parent) process enqueues N sessions
through the simulator's admin API (back to back, as fast as the simulator takes them, or at
``--arrival-rate`` per second, or a size's own ``@RATE``; session ids and lengths are drawn from
``--seed`` so every run gets the same sessions). Every queue change goes to every worker's watch, so 1,000
workers fed back to back make the machine, not the workers, set the pace on 2 cores: the default
1,000-worker size is paced at 2 sessions per second, and the report gives each process's CPU share. A
session's length (uniform in ``--min-duration``..``--max-duration``) starts when its stand-in remote
starts; at its end the model process marks the session ``terminated`` through the admin API and then lets
the remote exit 0, as a real remote exits when its session ends. The model processes send the sessions
they served as they go, and their request counts, CPU seconds and the rest when told to stop; the parent
merges them and reads the claim history from the simulator.

Measured, per run, from the moment every worker is watching until every session has been released:

* **requests**: every HTTP request the workers send, counted by a wrapper around each client's transport
  and sorted by kind (list, watch, claim won, claim answered 409, renewal, release, get, other);
  "claim POSTs" counts every claim request the server may have seen (won, 409, renewals, and those
  whose answer was lost); a request whose connection never opened is counted apart (``*_unsent``);
* **queue wait**: from just before the enqueue request was sent to the session's first ``claim`` record
  in the simulator's claim history (p50/p90/p99/max);
* **sessions/s**: N / (last release - first enqueue);
* **double serves**: claims overlapping another acceptor's claim, a live session claimed again after a
  release, or a stand-in remote started twice for one session (claim history and stand-in starts);
  claims of sessions already marked ``terminated`` (a stale copy crossing the status change) are shown
  separately, as in ``claim_latency.py``;
* **lost**: sessions never served. A run that has not served every session ``--run-limit`` seconds
  after its last enqueue is cut short; its unserved sessions are then marked ``*`` (not necessarily
  lost: the fleet was too slow), and its queue-wait figures cover the served sessions only;
* CPU seconds of the simulator and of each model process over the measured run (also as a share of
  it), the 409s by fifth of the run (where the storms are) and by the rule that chose the row
  (oldest, matched, spare, head: ``ClaimChoice.why``), and warnings logged.

Each size runs twice when the worker has the ``claim_spread`` option (``WorkerConfig(claim_spread=...)``,
``--no-claim-spread``): claims spread over the oldest pending rows, and strict oldest-first as the
baseline of the same run, printed side by side with their ratios. Without the option only today's
code runs.

Run: ``.venv/bin/python benchmarks/fleet_model.py [--quick] [--sizes 10:200,1000:1000@2] [--procs P]
[--run-limit S] [--baseline-run-limit S] [--json FILE|-]``. ``--procs`` sets the number of model
processes; ``--baseline-run-limit`` cuts the strict baseline short sooner than ``--run-limit`` (strict
oldest-first at 1,000 workers can take far longer than spreading).
The figures are measurements, not assertions: the exit code is 0 unless the benchmark itself broke.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import multiprocessing
import os
import random
import resource
import signal
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, cast
from urllib.parse import unquote

import httpx

from devin_outposts.api.client import QUEUE_PATH, FleetClient
from devin_outposts.core.exits import ProgramExit
from devin_outposts.worker import session as session_module
from devin_outposts.worker.binary import BinaryStore
from devin_outposts.worker.options import WorkerConfig
from devin_outposts.worker.runner import Worker
from devin_outposts.worker.session import SERVED
from devin_outposts_sim.admin_client import SimAdmin, SimAdminError

from _harness import (
    BenchError,
    BenchSim,
    analyse_claims,
    bench_sim,
    cpu_seconds_of,
    reporter,
    summarize,
    without_nan,
    write_json,
)

Out = Callable[[str], None]
FIXED_SHA = "0123456789abcdef0123456789abcdef01234567"
#: Workers started at once: a thousand list-then-watch starts in one burst only measure the backlog.
START_BATCH = 50
#: The headline of issue 14 is checked at this size (workers, sessions).
HEADLINE = (50, 1000)
#: 1,000 workers get their sessions at 2 per second: back to back, the two model processes and the
#: simulator share 2 cores at 100 % and the figures describe the machine, not the workers.
DEFAULT_SIZES = "10:200,50:1000,200:1000,1000:1000@2"
#: Workers per model process when --procs is not given (one process per this many, at most the CPUs).
WORKERS_PER_PROC = 250
QUICK_SIZES = "10:40,50:100"


def spread_supported() -> bool:
    return any(f.name == "claim_spread" for f in dataclasses.fields(WorkerConfig))


# --- counting requests ------------------------------------------------------------------------------


def request_kind(request: httpx.Request) -> tuple[str, Optional[str]]:
    """The kind of a fleet API request and the session id it names (None for list/watch/outposts)."""
    path = request.url.path
    if path == QUEUE_PATH:
        return ("watch" if request.url.params.get("watch") == "true" else "list"), None
    if path.startswith(QUEUE_PATH + "/"):
        rest = path[len(QUEUE_PATH) + 1 :].split("/")
        sid = unquote(rest[0])
        if len(rest) == 2 and rest[1] in ("claim", "release"):
            return rest[1], sid
        if len(rest) == 1 and request.method == "GET":
            return "get", sid
    if "/outposts" in path:
        return "outposts", None
    return "other", None


class CountingTransport(httpx.AsyncBaseTransport):
    """The worker's own transport (what ``FleetClient`` would build), counting each request by kind.

    A claim is told from a renewal by this worker's view of what it holds: a won claim of a session it
    does not hold is a claim, a won claim of one it holds (until it releases it) is a renewal.
    """

    def __init__(self, verify: ssl.SSLContext) -> None:
        self.inner = httpx.AsyncHTTPTransport(verify=verify, trust_env=True)
        self.counts: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()  #: transport errors by exception type (not requests)
        self.held: set[str] = set()
        self.watching = False
        self.conflicts_at: list[float] = []  #: when (epoch) each claim got its 409

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        kind, sid = request_kind(request)
        try:
            response = await self.inner.handle_async_request(request)
        except httpx.TransportError as exc:
            # A connection that never opened carried no request: not a claim the server saw.
            unsent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
            self.counts[f"{kind}_unsent" if unsent else f"{kind}_failed"] += 1
            self.failures[f"{kind}: {type(exc).__name__}"] += 1
            raise
        status = response.status_code
        if kind == "claim" and sid is not None:
            renewal = sid in self.held
            if status == 409:
                kind = "renew_409" if renewal else "claim_409"
                self.conflicts_at.append(time.time())
                self.held.discard(sid)
            elif status < 300:
                kind = "renew" if renewal else "claim"
                self.held.add(sid)
        elif kind == "release" and sid is not None:
            self.held.discard(sid)
        elif kind == "watch" and status < 300:
            self.watching = True
        if status >= 500:
            self.counts["5xx"] += 1
        self.counts[kind] += 1
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


# --- the stand-ins ----------------------------------------------------------------------------------


class FixedBinaries:
    """What ``SessionServer`` uses of ``BinaryStore``: one SHA, one path, no download."""

    downloads = 0

    def __init__(self, path: Path) -> None:
        self.path = path

    async def resolve_sha(self, session_sha: Optional[str], fallback_sha: Optional[str]) -> tuple[str, str]:
        return FIXED_SHA, "latest"

    async def ensure(self, sha: str) -> Path:
        return self.path

    async def aclose(self) -> None:
        return None


class StandinProc:
    """The ``proc`` of a stand-in remote: ``wait()`` returns once the driver or the worker ends it."""

    def __init__(self) -> None:
        self.returncode: Optional[int] = None
        self._exited = asyncio.Event()

    def exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode


class StandinRemote:
    """Replaces ``RemoteProcess`` in ``devin_outposts.worker.session`` for the length of a run."""

    driver: ClassVar[Optional[Ender]] = None
    _next_pid: ClassVar[int] = 4_000_000  # above pid_max, so it can never name a real process

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.proc = StandinProc()
        StandinRemote._next_pid += 1
        self.pid = StandinRemote._next_pid

    @classmethod
    async def start(
        cls,
        binary: Path,
        *,
        cwd: Path,
        env: Mapping[str, str],
        state_dir: Path,
        session_id: str,
        wrap: Optional[Callable[[list[str]], list[str]]] = None,
    ) -> StandinRemote:
        remote = cls(session_id)
        if cls.driver is None:
            raise BenchError("a stand-in remote started outside a run")
        cls.driver.started(remote)
        return remote

    @property
    def returncode(self) -> Optional[int]:
        return self.proc.returncode

    def describe(self) -> str:
        return f"stand-in {self.pid}"

    async def wait_exit(self) -> int:
        return await self.proc.wait()

    async def wait(self) -> int:
        return await self.proc.wait()

    async def stop(self, grace: float) -> int:
        """The worker stops it (SIGTERM): a real marker remote dies at once."""
        if self.proc.returncode is None:
            if self.driver is not None:
                self.driver.stopped_by_worker += 1
            self.proc.exit(-signal.SIGTERM)  # what asyncio reports for a process killed by SIGTERM
        return await self.proc.wait()


@contextlib.contextmanager
def standin_process_layer(driver: Ender) -> Iterator[None]:
    saved = session_module.RemoteProcess
    session_module.RemoteProcess = StandinRemote  # type: ignore[misc,assignment]
    StandinRemote.driver = driver
    try:
        yield
    finally:
        session_module.RemoteProcess = saved  # type: ignore[misc]
        StandinRemote.driver = None


# --- the driver -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    """The sessions of a run: ids (random-looking, as real ones) and lengths, both drawn from the seed."""

    ids: list[str]
    durations: dict[str, float]

    @classmethod
    def draw(cls, sessions: int, seed: int, low: float, high: float) -> Plan:
        rng = random.Random(seed)
        ids = [f"devin-{rng.getrandbits(128):032x}" for dummy in range(sessions)]
        return cls(ids, {sid: rng.uniform(low, high) for sid in ids})

    @property
    def mean_duration(self) -> float:
        return sum(self.durations.values()) / max(len(self.durations), 1)


@dataclasses.dataclass(frozen=True)
class SimAddress:
    """What a model process needs of the simulator (plain values: it crosses a fork)."""

    url: str
    admin_token: str
    token: str
    outpost_id: str
    static_base_url: str
    pid: int

    @classmethod
    def of(cls, sim: BenchSim) -> SimAddress:
        return cls(sim.proc.url, sim.proc.admin_token, sim.token, sim.outpost_id,
                   sim.admin.static_base_url, sim.proc.pid or 0)  # fmt: skip

    def new_admin(self) -> SimAdmin:
        return SimAdmin(self.url, self.admin_token, timeout=60)


def enqueue_all(
    address: SimAddress, plan: Plan, rate: float = 0.0, idle: Callable[[float], None] = time.sleep
) -> tuple[dict[str, float], tuple[float, float]]:
    """The driver's sessions from one connection, back to back (``rate`` 0) or ``rate`` per second:
    when each request was sent, and the window. ``idle(seconds)`` passes the time before each enqueue
    (0 when back to back): the parent reads the model processes' pipes meanwhile (:meth:`Parts.pump_for`)."""
    sent_at: dict[str, float] = {}
    admin = address.new_admin()
    try:
        first = time.time()
        for number, sid in enumerate(plan.ids):
            idle(max(0.0, first + number / rate - time.time()) if rate > 0 else 0.0)
            sent = time.time()
            admin.enqueue(address.outpost_id, session_id=sid)
            sent_at[sid] = sent
        return sent_at, (first, time.time())
    finally:
        admin.close()


#: Tries of the admin call that ends a session before the model gives up on it (and says so).
TERMINATE_ATTEMPTS = 5


class Ender:
    """Ends each session when its length has passed since its remote started (in each model process).

    Admin calls are blocking (``SimAdmin``), so they run on a small thread pool, one ``SimAdmin`` per
    thread, off the event loop the workers run on.
    """

    def __init__(self, address: SimAddress, plan: Plan, loop: asyncio.AbstractEventLoop) -> None:
        self.address = address
        self.plan = plan
        self.loop = loop
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ender")
        self._local = threading.local()
        self._admins: list[SimAdmin] = []
        self._admins_lock = threading.Lock()
        self.starts: Counter[str] = Counter()
        self.ended_at: dict[str, float] = {}
        self.stopped_by_worker = 0
        self.errors: list[str] = []

    def admin(self) -> SimAdmin:
        admin: Optional[SimAdmin] = getattr(self._local, "admin", None)
        if admin is None:
            admin = self.address.new_admin()
            self._local.admin = admin
            with self._admins_lock:
                self._admins.append(admin)
        return admin

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for admin in self._admins:
            admin.close()

    def started(self, remote: StandinRemote) -> None:
        sid = remote.session_id
        self.starts[sid] += 1
        duration = self.plan.durations.get(sid, self.plan.mean_duration)
        self.loop.call_later(duration, self._end, remote)

    def _end(self, remote: StandinRemote) -> None:
        if remote.returncode is not None:
            return  # the worker stopped it first
        sid = remote.session_id
        if sid in self.ended_at:  # a second start of an ended session: it ends at once
            remote.proc.exit(0)
            return
        self.ended_at[sid] = time.time()
        future = self.loop.run_in_executor(self.pool, self._terminate, sid)
        future.add_done_callback(lambda f: remote.proc.exit(0))

    def _terminate(self, sid: str) -> None:
        """Mark the session ``terminated``, retried: if the remote exited 0 while its session is still
        live on the server, the worker would rightly start it again, and the model would count that as a
        double serve (it did once, at 1,000 workers, when the simulator refused one of these calls)."""
        for attempt in range(TERMINATE_ATTEMPTS):
            try:
                self.admin().set_status(sid, "terminated")
                return
            except SimAdminError as exc:
                if attempt == TERMINATE_ATTEMPTS - 1:
                    self.errors.append(f"set_status {sid}: {exc}")
                else:
                    time.sleep(0.5 * (attempt + 1))


# --- one model process ------------------------------------------------------------------------------


class CountingLog(logging.Handler):
    """Counts the workers' warnings and errors, and keeps the first few distinct ones."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()
        self.samples: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.levelname] += 1
        key = record.getMessage()[:160]
        if key in self.samples or len(self.samples) < 200:
            self.samples[key] = self.samples.get(key, 0) + 1


class ConflictRules(logging.Handler):
    """Counts the claims answered 409 by the rule that chose them (``ClaimChoice.why``: oldest, matched,
    spare, head), from the claim loop's debug line; only that logger is opened to debug."""

    LOGGER = "devin_outposts.core.claiming"
    MESSAGE = "session %s was claimed by another worker (chosen as %s)"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == self.MESSAGE and isinstance(record.args, tuple) and len(record.args) == 2:
            self.counts[str(record.args[1])] += 1

    def attach(self) -> None:
        logger = logging.getLogger(self.LOGGER)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)

    def detach(self) -> None:
        logging.getLogger(self.LOGGER).removeHandler(self)


#: --mode: which runs each size gets (hinted: spread, with --fleet-size W given to every worker).
MODES = {
    "both": ["spread", "strict"],
    "spread": ["spread"],
    "strict": ["strict"],
    "hinted": ["hinted", "spread"],
    "all": ["hinted", "spread", "strict"],
}


def worker_config(
    address: SimAddress, root: Path, index: int, spread: Optional[bool], fleet_size: Optional[int] = None
) -> WorkerConfig:
    home = root / f"w{index:04d}"
    options: dict[str, Any] = {
        "api_url": address.url,
        "token": address.token,
        "outpost": address.outpost_id,
        "acceptor_id": f"fleet-{index:04d}",
        "cache_dir": home / "data" / "cache",
        "workdir": home / "work",
        "static_base_url": address.static_base_url,
        "drain_timeout": 5.0,
    }
    if spread is not None:
        options["claim_spread"] = spread
    if fleet_size is not None:
        options["fleet_size"] = fleet_size
    return WorkerConfig(**options)


def counts_of(transports: Sequence[CountingTransport]) -> Counter[str]:
    total: Counter[str] = Counter()
    for transport in transports:
        total.update(transport.counts)
    return total


@dataclasses.dataclass(frozen=True)
class PartSpec:
    """One model process's share of the fleet: workers ``first`` .. ``first + count - 1``."""

    address: SimAddress
    root: Path
    first: int
    count: int
    plan: Plan
    spread: Optional[bool]
    #: The deployment's word on the fleet's size (``--fleet-size``), in the ``hinted`` runs.
    fleet_size: Optional[int] = None


class Parent:
    """The model process's line to the parent: messages over a pipe, read on the event loop."""

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self.arrived = asyncio.Event()
        loop.add_reader(conn.fileno(), self._readable)

    def _readable(self) -> None:
        while self.conn.poll():
            self.inbox.put_nowait(self.conn.recv())
            self.arrived.set()

    def send(self, *message: Any) -> None:
        self.conn.send(message)


async def run_part(spec: PartSpec, conn: Connection) -> None:
    """Run this process's workers: start them, say ready, serve from "go" to "stop", send the figures."""
    loop = asyncio.get_running_loop()
    parent = Parent(conn, loop)
    ender = Ender(spec.address, spec.plan, loop)
    shared_tls = httpx.create_ssl_context()  # one context for all: each one costs megabytes
    transports = [CountingTransport(shared_tls) for dummy in range(spec.count)]
    binary = spec.root / "devin-remote-standin"
    binary.write_text("#!/bin/sh\nexit 0\n")  # never run: the stand-in remote replaces the process
    fleet: list[Worker] = []
    for index, transport in enumerate(transports, start=spec.first):

        def factory(config: WorkerConfig, transport: CountingTransport = transport) -> FleetClient:
            return FleetClient(config.api_url, config.token, transport=transport)

        fleet.append(
            Worker(
                worker_config(spec.address, spec.root / "workers", index, spec.spread, spec.fleet_size),
                client_factory=factory,
                binaries=cast(BinaryStore, FixedBinaries(binary)),
            )
        )
    StandinRemote._next_pid = 4_000_000 + spec.first * 1_000  # above pid_max: never a real process
    tasks: list[asyncio.Task[int]] = []
    log_counter, conflict_rules = CountingLog(), ConflictRules()
    logging.getLogger().addHandler(log_counter)
    conflict_rules.attach()
    try:
        with standin_process_layer(ender):
            boot = time.monotonic()
            for start in range(0, len(fleet), START_BATCH):
                batch = fleet[start : start + START_BATCH]
                tasks.extend(asyncio.ensure_future(worker.run()) for worker in batch)
                await wait_for(
                    functools.partial(all_watching, fleet[: start + len(batch)], transports, tasks),
                    timeout=120 + spec.count * 0.5,
                    what=f"workers {spec.first + start}.. to watch the queue",
                )
            parent.send("ready", time.monotonic() - boot)
            await parent.inbox.get()  # "go": the parent enqueues now
            parent.arrived.clear()
            before, cpu_before = counts_of(transports), time.process_time()
            conflict_rules.counts.clear()  # the run's, not the start's
            reported: set[str] = set()
            while parent.inbox.empty():  # until "stop"
                check_alive(tasks)
                fresh = served_ids(fleet) - reported
                if fresh:
                    parent.send("served", sorted(fresh))
                    reported |= fresh
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(parent.arrived.wait(), 0.2)
            cpu_s, after = time.process_time() - cpu_before, counts_of(transports)
            for worker in fleet:
                worker.on_signal(signal.SIGTERM)
            codes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
            parent.send("result", {
                "requests": dict(after - before),
                "cpu_s": cpu_s,
                "served": sorted(served_ids(fleet)),
                "outcomes": dict(Counter(r.outcome for worker in fleet for r in worker.results)),
                "starts": dict(ender.starts),
                "ended_at": ender.ended_at,
                "stopped_by_worker": ender.stopped_by_worker,
                "driver_errors": ender.errors[:5],
                "worker_exit_codes": dict(Counter(str(code) for code in codes)),
                "warnings": dict(log_counter.counts),
                "warning_samples": dict(log_counter.samples),
                "failures": dict(sum((t.failures for t in transports), Counter())),
                "conflicts_at": [at for t in transports for at in t.conflicts_at],
                "conflicts_by_rule": dict(conflict_rules.counts),
                "per_worker": {w.config.acceptor_id: sum(1 for r in w.results if r.outcome == SERVED)
                               for w in fleet},
                "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            })  # fmt: skip
    finally:
        logging.getLogger().removeHandler(log_counter)
        conflict_rules.detach()
        for task in tasks:
            task.cancel()
        for transport in transports:
            await transport.aclose()
        ender.close()


def part_main(spec: PartSpec, conn: Connection) -> None:
    """The entry point of a model process (forked): its workers on one event loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    logging.basicConfig(level=logging.WARNING, handlers=[logging.NullHandler()])
    try:
        asyncio.run(run_part(spec, conn))
    except BaseException as exc:  # the parent reports it and stops the run
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def all_watching(
    fleet: Sequence[Worker], transports: Sequence[CountingTransport], tasks: Sequence[Any]
) -> bool:
    check_alive(tasks)
    return all(
        worker.queue is not None
        and worker.queue.feed is not None
        and worker.queue.feed.synced
        and transport.watching
        for worker, transport in zip(fleet, transports)
    )


def check_alive(tasks: Sequence[asyncio.Task[int]]) -> None:
    for task in tasks:
        if task.done():
            error = task.exception()
            if isinstance(error, ProgramExit):
                raise BenchError(f"a worker exited: {error}")
            raise BenchError(f"a worker stopped early: {error or task.result()!r}")


async def wait_for(predicate: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.1)


def served_ids(fleet: Sequence[Worker]) -> set[str]:
    return {r.session_id for worker in fleet for r in worker.results if r.outcome == SERVED}


# --- one run: the parent ----------------------------------------------------------------------------


def split(workers: int, procs: int) -> list[tuple[int, int]]:
    """(first, count) of each model process's workers, as even as can be."""
    procs = max(1, min(procs, workers))
    base, extra = divmod(workers, procs)
    parts, first = [], 0
    for number in range(procs):
        count = base + (1 if number < extra else 0)
        parts.append((first, count))
        first += count
    return parts


class Parts:
    """The model processes of one run, and what they say."""

    def __init__(self, specs: Sequence[PartSpec]) -> None:
        context = multiprocessing.get_context("fork")  # the workers' code is imported once, here
        self.conns: list[Connection] = []
        self.procs: list[BaseProcess] = []
        for spec in specs:
            mine, theirs = context.Pipe()
            proc = context.Process(target=part_main, args=(spec, theirs), name=f"fleet-{spec.first}")
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)
        self.served: set[str] = set()
        self.ready: list[float] = []
        self.results: list[dict[str, Any]] = []
        self.finished: list[Connection] = []

    def pump(self, timeout: float) -> None:
        """Read what has come in within ``timeout`` seconds."""
        for conn in wait([c for c in self.conns if c not in self.finished], timeout):
            assert isinstance(conn, Connection)
            try:
                message = conn.recv()
            except EOFError:
                number = self.conns.index(conn)
                raise BenchError(
                    f"model process {number} ended (exit {self.procs[number].exitcode})"
                ) from None
            kind = message[0]
            if kind == "ready":
                self.ready.append(message[1])
            elif kind == "served":
                self.served.update(message[1])
            elif kind == "result":
                self.results.append(message[1])
                self.finished.append(conn)  # it exits next: its end of the pipe closes
            elif kind == "error":
                raise BenchError(f"a model process broke: {message[1]}")

    def pump_for(self, seconds: float) -> None:
        """Read what comes in for ``seconds`` (at least once, even for 0).

        The parent must never stop reading for long: a model process sends what it served as it goes,
        and once a pipe's buffer (64 KiB) is full, its send blocks that process's event loop, and with it
        every worker in it. The enqueue once slept between sessions without reading: at 1,000 workers x
        1,000 sessions, the buffers filled about 320 s into the run, every worker stood still (no claim,
        no release) until the last enqueue, and the backlog then came as a storm of 409s.
        """
        deadline = time.monotonic() + seconds
        while True:
            self.pump(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                return

    def until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {timeout:g}s waiting for {what}")
            self.pump(0.2)

    def tell(self, *message: Any) -> None:
        for conn in self.conns:
            conn.send(message)

    def close(self) -> None:
        for proc in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self.conns:
            conn.close()


def run_fleet(
    sim: BenchSim,
    workers: int,
    plan: Plan,
    spread: Optional[bool],
    run_limit: float,
    procs: int,
    arrival_rate: float = 0.0,
    fleet_size: Optional[int] = None,
) -> dict[str, Any]:
    address = SimAddress.of(sim)
    specs = [
        PartSpec(address, sim.root, first, count, plan, spread, fleet_size)
        for first, count in split(workers, procs)
    ]
    boot = time.monotonic()
    parts = Parts(specs)
    try:
        parts.until(lambda: len(parts.ready) == len(specs), 180 + workers, "the workers to watch the queue")
        boot_s = time.monotonic() - boot
        parts.tell("go")
        cpu_before = (cpu_seconds_of(address.pid), time.process_time())
        measured_from = time.monotonic()  # the CPU shares are over the enqueue too (it is paced)
        sent_at, window = enqueue_all(address, plan, arrival_rate, parts.pump_for)
        deadline = time.monotonic() + run_limit
        while len(parts.served) < len(plan.ids) and time.monotonic() < deadline:
            parts.pump(0.2)
        cpu_after = (cpu_seconds_of(address.pid), time.process_time())
        run_s = time.monotonic() - measured_from
        timed_out = len(parts.served) < len(plan.ids)
        parts.tell("stop")
        parts.until(lambda: len(parts.results) == len(specs), 120, "the model processes' figures")
    finally:
        parts.close()
    records = sim.admin.claims(outpost_id=sim.outpost_id)
    merged = merge(parts.results)
    result = analyse(plan, sent_at, window, merged, records, workers, timed_out)
    result["arrival_rate"] = arrival_rate
    if arrival_rate > 0:  # the fleet cannot serve faster than the sessions arrive
        result["ideal_sessions_per_s"] = min(result["ideal_sessions_per_s"], arrival_rate)
    result.update(
        workers_ready_s=boot_s,
        procs=len(specs),
        run_s=run_s,
        cpu_s={"simulator": cpu_after[0] - cpu_before[0], "driver": cpu_after[1] - cpu_before[1],
               "model": sum(r["cpu_s"] for r in parts.results),
               "model_per_process": [r["cpu_s"] for r in parts.results]},
        worker_exit_codes=merged["worker_exit_codes"],
        warnings=merged["warnings"],
        warning_samples=sorted(merged["warning_samples"].items(), key=lambda kv: -kv[1])[:5],
        stopped_by_worker=merged["stopped_by_worker"],
        driver_errors=merged["driver_errors"][:5],
        failures=merged["failures"],
        enqueue_per_s=len(plan.ids) / max(window[1] - window[0], 1e-9),
        max_rss_mib=max(r["max_rss_mib"] for r in parts.results),
    )  # fmt: skip
    return result


def merge(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The model processes' figures as one fleet's."""
    merged: dict[str, Any] = {"served": set(), "ended_at": {}, "driver_errors": [], "stopped_by_worker": 0,
                              "per_worker": {}, "conflicts_at": []}  # fmt: skip
    counters = (
        "requests",
        "outcomes",
        "starts",
        "worker_exit_codes",
        "warnings",
        "warning_samples",
        "failures",
        "conflicts_by_rule",
    )
    for name in counters:
        merged[name] = Counter()
    for part in results:
        merged["served"].update(part["served"])
        merged["ended_at"].update(part["ended_at"])
        merged["driver_errors"].extend(part["driver_errors"])
        merged["stopped_by_worker"] += part["stopped_by_worker"]
        merged["per_worker"].update(part["per_worker"])
        merged["conflicts_at"].extend(part["conflicts_at"])
        for name in counters:
            merged[name].update(part[name])
    return merged


def analyse(
    plan: Plan,
    sent_at: dict[str, float],
    window: tuple[float, float],
    merged: dict[str, Any],
    records: list[dict[str, Any]],
    workers: int,
    timed_out: bool,
) -> dict[str, Any]:
    found = analyse_claims(records, merged["ended_at"])
    served_set: set[str] = merged["served"]
    requests: Counter[str] = merged["requests"]
    n = max(len(served_set), 1)
    waits = [found.first_claim_at[sid] - at for sid, at in sent_at.items() if sid in found.first_claim_at]
    releases = [found.first_release_at[sid] for sid in served_set if sid in found.first_release_at]
    wall = (max(releases) - window[0]) if releases else math.nan
    claim_posts = sum(requests[k] for k in ("claim", "claim_409", "renew", "renew_409", "claim_failed"))
    per_worker = Counter(r["acceptor_id"] for r in records if r["action"] == "claim")
    return {
        "workers": workers,
        "sessions": len(plan.ids),
        "served": len(served_set),
        "timed_out": timed_out,
        "lost": len(plan.ids) - len(served_set),
        "outcomes": dict(merged["outcomes"]),
        "wall_s": wall,
        "sessions_per_s": len(served_set) / wall if releases else math.nan,
        "ideal_sessions_per_s": workers / plan.mean_duration,
        "queue_wait": summarize(waits),
        "requests": dict(requests),
        "requests_per_session": sum(requests.values()) / n,
        "claim_posts_per_session": claim_posts / n,
        "conflicts_per_session": (requests["claim_409"] + requests["renew_409"]) / n,
        "overlapping_claims": found.overlapping,
        "reclaimed_live": found.reclaimed_live,
        "double_remote_starts": sum(1 for count in merged["starts"].values() if count > 1),
        "reclaimed_after_end": found.reclaimed_after_end,
        "expired_claims": sum(1 for r in records if r["action"] == "expire"),
        "sessions_per_worker": f"{min(per_worker.values(), default=0)}-{max(per_worker.values(), default=0)}",
        "mean_duration_s": plan.mean_duration,
        "conflicts_by_fifth": by_fifth(merged["conflicts_at"], window[0], window[0] + wall),
        "conflicts_by_rule": dict(sorted(merged["conflicts_by_rule"].items())),
    }


def by_fifth(times: Sequence[float], start: float, end: float) -> list[int]:
    """How many of ``times`` fell in each fifth of [start, end] (the last fifth takes what comes later)."""
    counts = [0] * 5
    span = end - start
    if not span > 0:
        return counts
    for at in times:
        counts[min(4, max(0, int(5 * (at - start) / span)))] += 1
    return counts


def lost_cell(part: Mapping[str, Any]) -> str:
    return f"{part['lost']}*" if part["timed_out"] else str(part["lost"])


def double_serves(part: Mapping[str, Any]) -> int:
    return int(part["overlapping_claims"] + part["reclaimed_live"] + part["double_remote_starts"])


# --- the report -------------------------------------------------------------------------------------

KIND_COLUMNS = ("list", "watch", "claim", "claim_409", "renew", "release", "get", "outposts", "other")


def fmt_s(seconds: float) -> str:
    return "n/a" if seconds is None or math.isnan(seconds) else f"{seconds:.2f}"


def ratio(new: float, base: float) -> str:
    if base is None or new is None or math.isnan(base) or math.isnan(new):
        return "n/a"
    if base == 0:
        return "=" if new == 0 else "inf"
    return f"x{new / base:.2f}"


def report(results: list[dict[str, Any]], say: Out) -> None:
    say("")
    say(f"{'W x N':>11} {'mode':7} {'sess/s':>7} {'ideal':>6} {'req/s.':>7} {'claim/s.':>8} {'409/s.':>7} "
        f"{'wait p50':>8} {'p90':>6} {'p99':>6} {'max':>6} {'double':>6} {'stale':>5} {'lost':>4} "
        f"{'sim CPU':>7} {'model CPU':>9}")  # fmt: skip
    for part in results:
        wait = part["queue_wait"]
        say(f"{part['workers']:>4} x {part['sessions']:<4} {part['mode']:7} {part['sessions_per_s']:7.1f} "
            f"{part['ideal_sessions_per_s']:6.1f} {part['requests_per_session']:7.2f} "
            f"{part['claim_posts_per_session']:8.2f} {part['conflicts_per_session']:7.2f} "
            f"{fmt_s(wait['p50']):>8} {fmt_s(wait['p90']):>6} {fmt_s(wait['p99']):>6} "
            f"{fmt_s(wait['max']):>6} "
            f"{double_serves(part):6d} {part['reclaimed_after_end']:5d} {lost_cell(part):>4} "
            f"{part['cpu_s']['simulator']:6.1f}s {part['cpu_s']['model']:8.1f}s")  # fmt: skip
    say("(per served session: req/s. = HTTP requests, claim/s. = claim POSTs incl. 409s, renewals and claims "
        "whose answer was lost (not those whose connection never opened), 409/s. = 409 answers; queue wait "
        "in seconds, enqueue -> first claim; stale = claims of sessions "
        "already marked terminated; lost * = unserved when the run was cut short)")  # fmt: skip
    say("")
    say("requests per served session, by kind:")
    say(f"{'W x N':>11} {'mode':7} " + " ".join(f"{k:>9}" for k in (*KIND_COLUMNS, "5xx", "failed")))
    for part in results:
        n = max(part["served"], 1)
        requests = part["requests"]
        failed = sum(count for kind, count in requests.items() if kind.endswith(("_failed", "_unsent")))
        values = [requests.get(k, 0) for k in (*KIND_COLUMNS, "5xx")] + [failed]
        cells = " ".join(f"{value / n:9.3f}" for value in values)
        say(f"{part['workers']:>4} x {part['sessions']:<4} {part['mode']:7} {cells}")
    pairs = paired(results)
    if pairs:
        say("")
        say("spread (or hinted) / strict oldest-first, same sizes, same sessions:")
        say(f"{'W x N':>11} {'mode':7} {'sess/s':>7} {'req/s.':>7} {'claim/s.':>8} {'409/s.':>7} "
            f"{'wait p50':>8} {'p99':>7} {'p99 diff':>8}")  # fmt: skip
        for spread, strict in pairs:
            diff = spread["queue_wait"]["p99"] - strict["queue_wait"]["p99"]
            say(f"{spread['workers']:>4} x {spread['sessions']:<4} {spread['mode']:7} "
                f"{ratio(spread['sessions_per_s'], strict['sessions_per_s']):>7} "
                f"{ratio(spread['requests_per_session'], strict['requests_per_session']):>7} "
                f"{ratio(spread['claim_posts_per_session'], strict['claim_posts_per_session']):>8} "
                f"{ratio(spread['conflicts_per_session'], strict['conflicts_per_session']):>7} "
                f"{ratio(spread['queue_wait']['p50'], strict['queue_wait']['p50']):>8} "
                f"{ratio(spread['queue_wait']['p99'], strict['queue_wait']['p99']):>7} "
                f"{diff:+7.2f}s")  # fmt: skip
    headline(results, say)
    say("")
    for part in results:
        notes = [f"workers ready in {part['workers_ready_s']:.1f}s",
                 f"enqueues {part['enqueue_per_s']:.0f}/s",
                 f"sessions per worker {part['sessions_per_worker']}",
                 f"expired claims {part['expired_claims']}",
                 f"409s by fifth of the run {part['conflicts_by_fifth']}",
                 f"claim 409s by the rule that chose the row {part['conflicts_by_rule']}",
                 f"remotes stopped by the worker {part['stopped_by_worker']}",
                 f"worker exits {part['worker_exit_codes']}",
                 f"peak RSS {part['max_rss_mib']:.0f} MiB (largest model process)",
                 model_cpu(part)]  # fmt: skip
        if part["warnings"]:
            notes.append(f"log {part['warnings']}")
        if part.get("failures"):
            notes.append(f"transport errors {part['failures']}")
        if part["timed_out"]:
            notes.append(f"CUT SHORT after --run-limit: {part['lost']} sessions unserved")
        say(f"{part['workers']:>4} x {part['sessions']:<4} {part['mode']:7} " + "; ".join(notes))
        for message, count in part["warning_samples"]:
            say(f"{'':21}{count:5d} x {message}")
        for error in part["driver_errors"]:
            say(f"{'':21}driver: {error}")


def model_cpu(part: Mapping[str, Any]) -> str:
    """The model processes' CPU over the measured run: near 100 % of a core means the model, not the
    workers' protocol, may be setting the pace."""
    run_s = max(part["run_s"], 1e-9)
    each = ", ".join(f"{cpu:.0f} s ({100 * cpu / run_s:.0f} %)" for cpu in part["cpu_s"]["model_per_process"])
    return (
        f"{part['procs']} model process(es), CPU over the {run_s:.0f} s run: {each}; "
        f"simulator {part['cpu_s']['simulator']:.0f} s ({100 * part['cpu_s']['simulator'] / run_s:.0f} %)"
    )


def paired(results: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Each spreading run (spread, hinted) with the strict oldest-first run of the same size."""
    by_size: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
    for part in results:
        by_size.setdefault((part["workers"], part["sessions"]), {})[part["mode"]] = part
    return [
        (modes[mode], modes["strict"])
        for modes in by_size.values()
        if "strict" in modes
        for mode in ("hinted", "spread")
        if mode in modes
    ]


def headline(results: list[dict[str, Any]], say: Out) -> None:
    """Issue 14's check at 50 workers x 1,000 sessions (printed, never asserted)."""
    size = {(p["workers"], p["sessions"], p["mode"]): p for p in results}
    spread = size.get((*HEADLINE, "spread")) or size.get((*HEADLINE, "today"))
    if spread is None:
        return
    strict = size.get((*HEADLINE, "strict"))
    say("")
    say(f"issue 14 at {HEADLINE[0]} workers x {HEADLINE[1]} sessions ({spread['mode']}):")
    rows: list[tuple[str, str, str, Optional[bool]]] = [
        ("claim POSTs per served session", f"{spread['claim_posts_per_session']:.2f}", "<= 2",
         spread["claim_posts_per_session"] <= 2),
        ("double serves", str(double_serves(spread)), "0", double_serves(spread) == 0),
        ("lost sessions", str(spread["lost"]), "0", spread["lost"] == 0),
    ]  # fmt: skip
    if strict is not None:
        diff = spread["queue_wait"]["p99"] - strict["queue_wait"]["p99"]
        bound = spread["mean_duration_s"]
        rows.append(("queue-wait p99 - strict's p99", f"{diff:+.2f} s", f"<= {bound:.2f} s (mean length)",
                     diff <= bound))  # fmt: skip
    for name, value, target, met in rows:
        say(f"  {name:32s} {value:>10s}   target {target:28s} {'MET' if met else 'MISSED'}")


# --- main -------------------------------------------------------------------------------------------


def parse_sizes(text: str) -> list[tuple[int, int, Optional[float]]]:
    """``WORKERS:SESSIONS[@RATE]``, comma-separated; RATE (sessions enqueued per second) overrides
    ``--arrival-rate`` for that size."""
    sizes: list[tuple[int, int, Optional[float]]] = []
    for item in text.split(","):
        size, at, rate_text = item.strip().partition("@")
        workers, sep, sessions = size.partition(":")
        rate: Optional[float] = None
        if at:
            try:
                rate = float(rate_text)
            except ValueError:
                rate = -1.0
        if not sep or not workers.isdigit() or not sessions.isdigit() or (rate is not None and rate <= 0):
            raise argparse.ArgumentTypeError(
                f"a size is WORKERS:SESSIONS or WORKERS:SESSIONS@RATE, got {item!r}"
            )
        sizes.append((int(workers), int(sessions), rate))
    return sizes


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=parse_sizes, default=None,
                        help=f"WORKERS:SESSIONS,... (default {DEFAULT_SIZES})")  # fmt: skip
    parser.add_argument("--min-duration", type=float, default=1.0, help="shortest session, seconds (1)")
    parser.add_argument("--max-duration", type=float, default=3.0, help="longest session, seconds (3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the session ids and lengths (1)")
    parser.add_argument("--mode", choices=tuple(MODES), default="both",
                        help="with the claim_spread option: spread and strict (both, the default), one "
                             "of them, hinted (spread, each worker told the fleet's size: "
                             "--fleet-size W) beside spread (hinted), or all three (all)")  # fmt: skip
    parser.add_argument("--run-limit", type=float, default=900.0,
                        help="seconds a run may take to serve its sessions before it is cut short "
                        "(900)")  # fmt: skip
    parser.add_argument("--baseline-run-limit", type=float, default=None,
                        help="--run-limit of the strict baseline (default: --run-limit)")  # fmt: skip
    parser.add_argument("--arrival-rate", type=float, default=0.0,
                        help="sessions enqueued per second (default 0: back to back, as fast as the "
                        "simulator takes them)")  # fmt: skip
    parser.add_argument("--procs", type=int, default=None,
                        help=f"model processes the workers are spread over (default: one per "
                        f"{WORKERS_PER_PROC} workers, at most the CPUs)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help=f"a smoke run: sizes {QUICK_SIZES}")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON ('-' = stdout)")
    args = parser.parse_args()
    if args.sizes is None:
        args.sizes = parse_sizes(QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if args.baseline_run_limit is None:
        args.baseline_run_limit = args.run_limit
    if args.arrival_rate < 0:
        parser.error("--arrival-rate must be 0 (back to back) or positive")
    if args.procs is not None and args.procs < 1:
        parser.error("--procs must be at least 1")
    if not 0 < args.min_duration <= args.max_duration:
        parser.error("--min-duration must be positive and at most --max-duration")
    return args


def raise_fd_limit(workers: int) -> None:
    """A worker holds a watch stream, a pooled connection and two lock files; the simulator (a child,
    which inherits the limit) one socket per connection."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if wanted < workers * 4 + 256:
        print(f"warning: RLIMIT_NOFILE {wanted} may be too low for {workers} workers", file=sys.stderr)


def procs_for(asked: Optional[int], workers: int) -> int:
    if asked is not None:
        return asked
    return max(1, min(os.cpu_count() or 1, math.ceil(workers / WORKERS_PER_PROC)))


def main() -> int:
    args = parse_args()
    say = reporter(args.json)

    raise_fd_limit(max(size[0] for size in args.sizes))
    logging.basicConfig(level=logging.WARNING, handlers=[logging.NullHandler()])  # counted, not printed
    if spread_supported():
        modes = MODES[args.mode]
    else:
        modes = ["today"]
        say("this worker has no claim_spread option: one run per size of today's claim code")
    arrivals = f"{args.arrival_rate:g}/s" if args.arrival_rate else "back to back"
    say(f"sessions last {args.min_duration:g}-{args.max_duration:g} s (uniform, seed {args.seed}), "
        f"enqueued {arrivals}; "
        "simulator with default settings, a fresh database per run")  # fmt: skip
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="devin-bench-fleet-") as tmpdir:
            root = Path(tmpdir)
            for workers, sessions, size_rate in args.sizes:
                rate = args.arrival_rate if size_rate is None else size_rate
                plan = Plan.draw(sessions, args.seed, args.min_duration, args.max_duration)
                for mode in modes:
                    name = f"{workers}x{sessions}-{mode}"
                    say(f"... {workers} workers x {sessions} sessions, {mode}")
                    spread = None if mode == "today" else mode != "strict"
                    limit = args.run_limit if mode != "strict" else args.baseline_run_limit
                    hint = workers if mode == "hinted" else None
                    with bench_sim(root, name) as sim:
                        procs = procs_for(args.procs, workers)
                        part = run_fleet(sim, workers, plan, spread, limit, procs, rate, hint)
                    part["mode"] = mode
                    results.append(part)
    except (BenchError, SimAdminError, OSError, RuntimeError) as exc:
        say(f"benchmark broke: {exc}")
        if results:
            report(results, say)
        return 1
    report(results, say)
    say(f"wall time {time.monotonic() - started:.0f} s")
    if args.json:
        write_json(without_nan({"runs": results}), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
