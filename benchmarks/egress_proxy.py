"""The egress proxy (core/netpolicy/proxy.py): throughput, added connect latency and idle memory, each
beside a direct connection measured in the same run.

Everything runs on this machine's loopback, as three kinds of process, so that no two of them share an
interpreter (in production the proxy runs in the worker's process, the client in the session's namespace
and the upstream elsewhere):

* an **upstream** (this script, ``--role upstream``): two TCP listeners on 127.0.0.1, one thread per
  connection. The *bulk* listener sends ``--megabytes`` (100) MB from a 1 MiB buffer as soon as a
  connection is accepted, then closes; the *ping* listener answers the first bytes it receives with
  ``pong\\n`` and closes;
* the **proxy** (``--role proxy``): one :class:`EgressProxy` behind its doorway (core/netpolicy/doorway.py),
  in its own process with its own event loop; it hands the doorway's launcher end to the client once, as
  the worker hands it to a session's launcher, with a policy that allows ``127.0.0.1/32`` only (every
  connection is checked, peeked and counted as in production; the log level is WARNING, so nothing is
  logged for an allowed connection);
* the **client**: this process, blocking sockets. *Direct*: a TCP connection to the upstream. *Through the
  proxy*: a pair of Unix stream sockets, one end sent through the doorway (as the shim does for each
  connection), ``CONNECT 127.0.0.1:<port> HTTP/1.1`` on the other, the ``200`` read, then the same bytes as
  direct.

Figures:

1. **throughput**: ``--megabytes`` through one connection, from the bulk listener to the client (read into a
   1 MiB buffer), ``--bulk-runs`` (15) times per path, alternating; the median MB/s of each path (1 MB =
   10^6 bytes) and the ratio proxy / direct (target >= 80 %). The clock runs from the connect to the last
   byte, so the proxy's handshake is included (it is a few hundred microseconds of several seconds).
2. **connect latency**: ``--connections`` (1,000) short connections per path, alternating one direct and
   one through the proxy: the time from the connect to the first byte of the upstream's answer to
   ``ping\\n`` (through the proxy: connect, CONNECT, the 200, ``ping\\n`` through the peek, ``pong``);
   p50 and p95 per path, and the **added p50** (proxy p50 - direct p50; target <= 2 ms).
3. **idle memory per session**: a fresh process (``--role idle``) starts ``--idle-proxies`` (100)
   EgressProxy instances, each behind its own doorway, and reports its VmRSS growth divided by their number;
   then it opens one idle tunnel through each (a client connected to the upstream's ping listener, which
   waits for bytes that never come) and reports the further growth per tunnel.

Run: ``.venv/bin/python benchmarks/egress_proxy.py [--quick] [--json FILE|-]``; ``--help`` for sizes. The
figures are measurements, not assertions: the exit code is 0 unless the benchmark itself broke.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import gc
import json
import logging
import os
import platform
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from devin_outposts.core.netpolicy.doorway import Opener, connect_blocking
from devin_outposts.core.netpolicy.policy import Policy
from devin_outposts.core.netpolicy.proxy import EgressProxy

from _harness import BenchError, cpu_seconds_of, percentile, reporter, write_json

TARGET_THROUGHPUT_RATIO = 0.80
TARGET_ADDED_P50_S = 0.002
LOOPBACK = "127.0.0.1"
BUFFER = 1 << 20
POLICY = {"enabled": True, "allow": [{"ipv4": "127.0.0.1/32"}]}
Out = Callable[[str], None]


# --- the upstream (its own process) ----------------------------------------------------------------------


class _Bulk(socketserver.BaseRequestHandler):
    size = 0

    def handle(self) -> None:
        chunk = memoryview(bytes(BUFFER))
        left = self.size
        try:
            while left > 0:
                sent = self.request.send(chunk[: min(left, BUFFER)])
                left -= sent
        except OSError:
            pass


class _Ping(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        try:
            if self.request.recv(64):
                self.request.sendall(b"pong\n")
        except OSError:
            pass


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def run_upstream(megabytes: int) -> int:
    _Bulk.size = megabytes * 1_000_000
    servers = [_Server((LOOPBACK, 0), handler) for handler in (_Bulk, _Ping)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(
        json.dumps({"bulk": servers[0].server_address[1], "ping": servers[1].server_address[1]}), flush=True
    )
    sys.stdin.read()  # until the benchmark closes our stdin
    return 0


# --- the proxy (its own process) -------------------------------------------------------------------------


def run_proxy(handover: str) -> int:
    """One proxy; its doorway's launcher end goes to the benchmark through ``handover`` (a Unix socket the
    benchmark listens on), as the worker hands it to a session's launcher."""
    logging.basicConfig(level=logging.WARNING)

    async def serve() -> None:
        proxy = EgressProxy(Policy.from_spec(POLICY), session_id="bench", outpost_id="bench")
        launcher_end = await proxy.start()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(handover)
            conn.sendmsg(
                [b"d"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [launcher_end.fileno()]))]
            )
        launcher_end.close()
        print(json.dumps({"listening": "doorway"}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await proxy.close()
        print(json.dumps({"allowed": proxy.allowed, "denied": proxy.denied}), flush=True)

    asyncio.run(serve())
    return 0


# --- idle memory (its own process) -------------------------------------------------------------------------


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise BenchError("no VmRSS in /proc/self/status")


def run_idle(count: int, ping_port: int) -> int:
    async def measure() -> dict[str, Any]:
        warm = EgressProxy(Policy.from_spec(POLICY), session_id="warm", outpost_id="bench")
        warm_end = await warm.start()  # the first one loads what every later one shares
        await tunnel(warm_end, ping_port)
        gc.collect()
        before = rss_kib()
        proxies, ends = [], []
        for index in range(count):
            proxy = EgressProxy(Policy.from_spec(POLICY), session_id=f"s{index}", outpost_id="bench")
            ends.append(await proxy.start())
            proxies.append(proxy)
        gc.collect()
        with_proxies = rss_kib()
        tunnels = [await tunnel(end, ping_port) for end in ends]
        await asyncio.sleep(0.2)  # let every handler reach its idle wait
        gc.collect()
        with_tunnels = rss_kib()
        for writer in tunnels:
            writer.close()
        for proxy in [warm, *proxies]:
            await proxy.close()
        return {
            "proxies": count,
            "rss_before_kib": before,
            "per_proxy_kib": (with_proxies - before) / count,
            "per_idle_tunnel_kib": (with_tunnels - with_proxies) / count,
        }

    print(json.dumps(asyncio.run(measure())), flush=True)
    return 0


async def tunnel(launcher_end: socket.socket, port: int) -> asyncio.StreamWriter:
    reader, writer = await asyncio.open_unix_connection(sock=await Opener(launcher_end).open())
    writer.write(f"CONNECT {LOOPBACK}:{port} HTTP/1.1\r\n\r\n".encode())
    status = await reader.readuntil(b"\r\n\r\n")
    if not status.startswith(b"HTTP/1.1 200"):
        raise BenchError(f"the proxy answered {status!r}")
    return writer


# --- the client (this process) ---------------------------------------------------------------------------


class Role:
    """A child process of this script that prints one JSON line when ready."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise BenchError(f"{' '.join(args)} exited with {self.process.wait()} before it was ready")
        self.ready: dict[str, Any] = json.loads(line)

    def stop(self) -> Optional[dict[str, Any]]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        last = self.process.stdout.readline()
        self.process.wait(timeout=30)
        return json.loads(last) if last else None


def receive_doorway(handover: socket.socket) -> socket.socket:
    """The proxy's doorway end, sent by the proxy's process through ``handover``."""
    conn, dummy_address = handover.accept()
    with conn:
        dummy_data, ancillary, dummy_flags, dummy = conn.recvmsg(1, socket.CMSG_SPACE(4))
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:4])
    if not fds:
        raise BenchError("the proxy sent no doorway")
    return socket.socket(fileno=fds[0])


def open_path(path: str, doorway: socket.socket, port: int) -> socket.socket:
    """A connected socket to the upstream's ``port``: directly, or through the proxy (a connection sent
    through its doorway, as the shim does; CONNECT, 200)."""
    if path == "direct":
        return socket.create_connection((LOOPBACK, port))
    client = connect_blocking(doorway)
    client.sendall(f"CONNECT {LOOPBACK}:{port} HTTP/1.1\r\n\r\n".encode())
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = client.recv(1)  # byte by byte: not one byte of the tunnel is read here
        if not byte:
            raise BenchError(f"the proxy closed during the CONNECT (got {head!r})")
        head += byte
    if not head.startswith(b"HTTP/1.1 200"):
        raise BenchError(f"the proxy answered {head!r}")
    return client


def bulk_once(path: str, doorway: socket.socket, port: int, size: int) -> float:
    buffer = bytearray(BUFFER)
    started = time.perf_counter()
    with open_path(path, doorway, port) as client:
        received = 0
        while True:
            count = client.recv_into(buffer)
            if not count:
                break
            received += count
    elapsed = time.perf_counter() - started
    if received != size:
        raise BenchError(f"{path}: received {received} bytes of {size}")
    return elapsed


def ping_once(path: str, doorway: socket.socket, port: int) -> float:
    started = time.perf_counter()
    with open_path(path, doorway, port) as client:
        client.sendall(b"ping\n")
        if not client.recv(1):
            raise BenchError(f"{path}: no answer to ping")
        elapsed = time.perf_counter() - started
    return elapsed


def measure(args: argparse.Namespace, say: Out) -> dict[str, Any]:
    results: dict[str, Any] = {}
    size = args.megabytes * 1_000_000
    upstream = Role("--role", "upstream", "--megabytes", str(args.megabytes))
    try:
        with tempfile.TemporaryDirectory(prefix="devin-bench-egress-") as tmpdir:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as handover:
                handover.bind(f"{tmpdir}/handover.sock")
                handover.listen(1)
                proxy = Role("--role", "proxy", "--handover", f"{tmpdir}/handover.sock")
                doorway = receive_doorway(handover)
            try:
                bulk, ping = upstream.ready["bulk"], upstream.ready["ping"]
                say(f"... throughput: {args.megabytes} MB x {args.bulk_runs} per path")
                seconds: dict[str, list[float]] = {"direct": [], "proxy": []}
                proxy_cpu = 0.0
                for dummy_run in range(args.bulk_runs):
                    for path in ("direct", "proxy"):
                        cpu_before = cpu_seconds_of(proxy.process.pid)
                        seconds[path].append(bulk_once(path, doorway, bulk, size))
                        proxy_cpu += cpu_seconds_of(proxy.process.pid) - cpu_before
                results["throughput"] = {
                    path: {
                        "mb_per_s": [size / 1e6 / s for s in runs],
                        "median_mb_per_s": size / 1e6 / statistics.median(runs),
                    }
                    for path, runs in seconds.items()
                }
                results["throughput"]["proxy_cpu_share"] = proxy_cpu / sum(seconds["proxy"])
                say(f"... connect latency: {args.connections} connections per path")
                latency: dict[str, list[float]] = {"direct": [], "proxy": []}
                cpu_before = cpu_seconds_of(proxy.process.pid)
                for dummy_index in range(args.connections):
                    for path in ("direct", "proxy"):
                        latency[path].append(ping_once(path, doorway, ping))
                cpu_per_connection = (cpu_seconds_of(proxy.process.pid) - cpu_before) / args.connections
                results["latency"] = {
                    path: {"n": len(values), "p50": percentile(values, 0.5), "p95": percentile(values, 0.95),
                           "max": max(values)}
                    for path, values in latency.items()
                }  # fmt: skip
                results["latency"]["proxy_cpu_per_connection_s"] = cpu_per_connection
            finally:
                results["proxy_counts"] = proxy.stop()
        say(f"... idle memory: {args.idle_proxies} proxies")
        idle = subprocess.run(
            [sys.executable, __file__, "--role", "idle", "--idle-proxies", str(args.idle_proxies),
             "--ping-port", str(upstream.ready["ping"])],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        if idle.returncode != 0:
            raise BenchError(f"the idle-memory process failed: {idle.stderr.strip()}")
        results["idle"] = json.loads(idle.stdout.strip().splitlines()[-1])
    finally:
        upstream.stop()
    return results


# --- the report ------------------------------------------------------------------------------------------


def verdict(met: bool) -> str:
    return "MET" if met else "MISSED"


def report(results: dict[str, Any], say: Out) -> None:
    through, lat, idle = results["throughput"], results["latency"], results["idle"]
    ratio = through["proxy"]["median_mb_per_s"] / through["direct"]["median_mb_per_s"]
    added = lat["proxy"]["p50"] - lat["direct"]["p50"]
    results["ratio"], results["added_p50_s"] = ratio, added
    for path in ("direct", "proxy"):
        runs = ", ".join(f"{value:.0f}" for value in through[path]["mb_per_s"])
        say(f"throughput {path:6s} median {through[path]['median_mb_per_s']:7.0f} MB/s  (runs: {runs})")
    say(f"  the proxy's process used {through['proxy_cpu_share'] * 100:.0f} % of a core during its transfers")
    for path in ("direct", "proxy"):
        fig = lat[path]
        say(f"connect+first byte {path:6s} p50 {fig['p50'] * 1000:.3f} ms  p95 {fig['p95'] * 1000:.3f} ms"
            f"  max {fig['max'] * 1000:.3f} ms  ({fig['n']} connections)")  # fmt: skip
    say(f"  the proxy's process used {lat['proxy_cpu_per_connection_s'] * 1e6:.0f} us of CPU per connection")
    start_mib = idle["rss_before_kib"] / 1024
    say(f"idle: {idle['per_proxy_kib']:.1f} KiB per proxy, {idle['per_idle_tunnel_kib']:.1f} KiB per idle"
        f" tunnel ({idle['proxies']} of each; the process started at {start_mib:.1f} MiB)")  # fmt: skip
    counts = results.get("proxy_counts") or {}
    allowed, denied = counts.get("allowed", "?"), counts.get("denied", "?")
    say(f"the proxy counted {allowed} allowed and {denied} denied connections")
    say("")
    say(f"{'figure':34s} {'measured':22s} {'target':12s} result")
    rows = [
        (
            "throughput proxy / direct",
            f"{ratio * 100:.0f} %",
            ">= 80 %",
            verdict(ratio >= TARGET_THROUGHPUT_RATIO),
        ),
        (
            "connect latency added (p50)",
            f"{added * 1000:.3f} ms",
            "<= 2 ms",
            verdict(added <= TARGET_ADDED_P50_S),
        ),
        ("idle memory per session", f"{idle['per_proxy_kib']:.1f} KiB", "-", "n/a"),
    ]
    for name, value, target, met in rows:
        say(f"{name:34s} {value:22s} {target:12s} {met}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--megabytes", type=int, default=100, help="MB through one connection (100)")
    parser.add_argument("--bulk-runs", type=int, default=15, help="bulk transfers per path (15)")
    parser.add_argument("--connections", type=int, default=1000, help="short connections per path (1000)")
    parser.add_argument(
        "--idle-proxies", type=int, default=100, help="idle proxies for the memory figure (100)"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: small sizes, a few seconds")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON ('-' = stdout)")
    parser.add_argument("--role", choices=["upstream", "proxy", "idle"], help=argparse.SUPPRESS)
    parser.add_argument("--handover", help=argparse.SUPPRESS)
    parser.add_argument("--ping-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.megabytes, args.bulk_runs, args.connections, args.idle_proxies = 10, 2, 50, 10
    return args


def main() -> int:
    args = parse_args()
    if args.role == "upstream":
        return run_upstream(args.megabytes)
    if args.role == "proxy":
        return run_proxy(args.handover)
    if args.role == "idle":
        return run_idle(args.idle_proxies, args.ping_port)
    say = reporter(args.json)

    started = time.monotonic()
    load_before = os.getloadavg()[0]
    try:
        results = measure(args, say)
    except (BenchError, OSError, subprocess.SubprocessError, ValueError) as exc:
        say(f"benchmark broke: {exc}")
        return 1
    results["targets"] = {"throughput_ratio": TARGET_THROUGHPUT_RATIO, "added_p50_s": TARGET_ADDED_P50_S}
    report(results, say)
    results["wall_s"] = time.monotonic() - started
    results["load_average"] = {"before": load_before, "after": os.getloadavg()[0]}
    load_after, python = results["load_average"]["after"], platform.python_version()
    say(f"wall time: {results['wall_s']:.1f} s; load average (1 min) {load_before:.2f} before, "
        f"{load_after:.2f} after; {os.cpu_count()} CPUs, Python {python}")  # fmt: skip
    if args.json:
        write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
