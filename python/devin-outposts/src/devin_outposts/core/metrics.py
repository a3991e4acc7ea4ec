"""Metrics in the Prometheus text format, and ``/healthz``, on a tiny asyncio HTTP server.

The server runs on the program's own event loop, so an answer from ``/healthz`` also proves that the loop
is not blocked; the runner's health callback (:func:`devin_outposts.core.claiming.health`) adds whether
its queue feed and main loop are alive, as a :class:`Health` (or a :class:`HealthReport`, whose detail
the answer carries: the orchestrator's back-off says its driver, reason and until when). The worker's
names are prefixed ``devin_outposts_worker_`` (the orchestrator's table is its own); counters end in
``_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Callable, Optional, Protocol, Union

from devin_outposts.core.exits import ExitCode, ProgramExit

log = logging.getLogger(__name__)

PREFIX = "devin_outposts_worker_"
COUNTERS = {
    "sessions_claimed": "Sessions claimed from the queue (restart recoveries included)",
    "sessions_served": "Sessions that ended normally (suspended, terminated or gone) and were released",
    "sessions_failed": "Sessions given up: remote failed past the restart limit, binary refused, claim lost",
    "claim_conflicts": "Claims answered 409 (another worker won)",
    "renewals": "Successful claim renewals",
    "renewal_failures": "Claim renewals that failed and were retried",
    "watch_reconnects": "Queue watch reconnections",
    "remote_restarts": "devin-remote restarts after a non-zero exit",
    "binary_downloads": "devin-remote binaries downloaded and verified",
    "binary_verification_failures": "devin-remote binaries refused because their sha256 did not match",
    "api_errors": "Fleet API errors in the main loop (retried with backoff)",
    "network_policy_refusals": "Sessions released because their network policy could not be enforced here",
    "network_policy_unenforced": (
        "Sessions run unfiltered although their network policy is enabled (--network-policy ignore)"
    ),
}
#: Counters with labels of their own, on top of the process's: name -> (help, label names).
LABELLED_COUNTERS = {
    "egress_connections": (
        "Connections through the sessions' egress proxies, by outpost, session and the policy's verdict",
        ("outpost", "session", "verdict"),
    ),
}
GAUGES = {
    "active_sessions": "Sessions being served now",
    "max_sessions": "Configured concurrent session slots",
    "draining": "1 while the worker drains after SIGTERM/SIGINT",
}


class Health(str, enum.Enum):
    """What ``/healthz`` says (its ``status``): 200 while :attr:`healthy`, else 503."""

    __str__ = str.__str__

    OK = "ok"  # following the queue
    STARTING = "starting"  # not following it yet (outpost, recovery)
    DRAINING = "draining"  # stopping after a signal: no new claims
    UNAUTHORIZED = "unauthorized"  # the token was refused: the run ends
    FEED_STOPPED = "queue feed stopped"  # the queue feed died (it is being restarted)
    # Claims are held back: what runs the sessions keeps failing to start them (the orchestrator's
    # driver). Healthy: the process works as it should, and a liveness probe that restarted it would
    # only start the same failures afresh (docs/orchestrator.md, "Observability").
    BACKING_OFF = "backing off"

    @property
    def healthy(self) -> bool:
        return self not in (Health.UNAUTHORIZED, Health.FEED_STOPPED)


@dataclasses.dataclass(frozen=True)
class HealthReport:
    """A :class:`Health` and what explains it: ``/healthz`` answers ``{"status": state, **detail}``."""

    state: Health
    detail: Mapping[str, object] = dataclasses.field(default_factory=dict)

    @property
    def healthy(self) -> bool:
        return self.state.healthy


#: What the metrics server asks for ``/healthz``.
HealthCheck = Callable[[], Union[Health, HealthReport]]


class Renders(Protocol):
    """What ``/metrics`` serves: a :class:`Metrics`, or several rendered as one (the orchestrator's
    outposts)."""

    def render(self) -> str:
        """The Prometheus text."""


class MetricsAddrLike(Protocol):
    """HOST:PORT (the options' ``MetricsAddr``)."""

    @property
    def host(self) -> str:
        """The address to bind."""

    @property
    def port(self) -> int:
        """The port (0: any free one)."""


class VerdictLike(Protocol):
    """A network policy's decision (core/netpolicy/policy.py's ``Decision``), as far as it is counted."""

    @property
    def allowed(self) -> bool:
        """Whether the connection was allowed."""


class Histogram:
    """Cumulative buckets, a sum and a count: the Prometheus histogram."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1


class Metrics:
    """Counters, gauges and histograms of one process. The worker's names are the default; the
    orchestrator passes its own tables and prefix. A name outside the tables is counted but not shown."""

    def __init__(
        self,
        labels: Optional[dict[str, str]] = None,
        *,
        prefix: str = PREFIX,
        counters: Optional[Mapping[str, str]] = None,
        gauges: Optional[Mapping[str, str]] = None,
        histograms: Optional[Mapping[str, tuple[str, Sequence[float]]]] = None,
        labelled_counters: Optional[Mapping[str, tuple[str, Sequence[str]]]] = None,
    ) -> None:
        counters = COUNTERS if counters is None else counters
        labelled_counters = LABELLED_COUNTERS if labelled_counters is None else labelled_counters
        gauges = GAUGES if gauges is None else gauges
        self.prefix = prefix
        self.counter_help = dict(counters)
        self.gauge_help = dict(gauges)
        self.histogram_help = {name: spec[0] for name, spec in (histograms or {}).items()}
        self.counters = dict.fromkeys(counters, 0)
        self.gauges = dict.fromkeys(gauges, 0.0)
        self.histograms = {name: Histogram(spec[1]) for name, spec in (histograms or {}).items()}
        self.labelled_help = {name: spec[0] for name, spec in labelled_counters.items()}
        self.label_names = {name: tuple(spec[1]) for name, spec in labelled_counters.items()}
        #: name -> label values (in the order of its label names) -> count.
        self.labelled: dict[str, dict[tuple[str, ...], int]] = {name: {} for name in labelled_counters}
        self.labels = dict(labels or {})

    def inc(self, name: str, value: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + value

    def set(self, name: str, value: float) -> None:
        self.gauges[name] = value

    def observe(self, name: str, value: float) -> None:
        self.histograms[name].observe(value)

    def inc_labelled(self, name: str, values: Sequence[str], value: int = 1) -> None:
        """Count ``value`` on the series of ``name`` with these label ``values`` (in its names' order)."""
        series = self.labelled.setdefault(name, {})
        key = tuple(values)
        series[key] = series.get(key, 0) + value

    def count_egress(
        self, decision: VerdictLike, destination: object, session_id: str, outpost_id: str
    ) -> None:
        """An egress proxy's observer (core/netpolicy/proxy.py): count one connection by its verdict."""
        del destination  # not a label: one series per destination would grow without bound
        verdict = "allowed" if decision.allowed else "denied"
        self.inc_labelled("egress_connections", (outpost_id, session_id, verdict))

    def forget_egress(self, session_id: str) -> None:
        """Drop an ended session's egress series, so that a long-lived worker's /metrics stays bounded."""
        series = self.labelled.get("egress_connections", {})
        names = self.label_names.get("egress_connections", ())
        position = names.index("session") if "session" in names else -1
        for key in [key for key in series if position >= 0 and key[position] == session_id]:
            del series[key]

    def _label_text(self, extra: Optional[Mapping[str, str]] = None) -> str:
        """The process's labels, with ``extra`` (a series' own, which win over them) added."""
        labels = {**self.labels, **(extra or {})}
        if not labels:
            return ""
        body = ",".join(f'{key}="{_label_value(value)}"' for key, value in sorted(labels.items()))
        return "{" + body + "}"

    def _with_le(self, bound: str) -> str:
        """The label set plus a histogram bucket's ``le`` label."""
        body = self._label_text()[1:-1]
        extra = 'le="' + bound + '"'
        return "{" + (f"{body},{extra}" if body else extra) + "}"

    def render(self) -> str:
        labels = self._label_text()
        lines: list[str] = []
        for name, help_text in self.counter_help.items():
            full = f"{self.prefix}{name}_total"
            lines += [
                f"# HELP {full} {help_text}",
                f"# TYPE {full} counter",
                f"{full}{labels} {self.counters[name]}",
            ]
        for name, help_text in self.labelled_help.items():
            full = f"{self.prefix}{name}_total"
            lines += [f"# HELP {full} {help_text}", f"# TYPE {full} counter"]
            for values, count in sorted(self.labelled[name].items()):
                lines.append(f"{full}{self._label_text(dict(zip(self.label_names[name], values)))} {count}")
        for name, help_text in self.gauge_help.items():
            full = f"{self.prefix}{name}"
            lines += [
                f"# HELP {full} {help_text}",
                f"# TYPE {full} gauge",
                f"{full}{labels} {self.gauges[name]:g}",
            ]
        for name, help_text in self.histogram_help.items():
            full, histogram = f"{self.prefix}{name}", self.histograms[name]
            lines += [f"# HELP {full} {help_text}", f"# TYPE {full} histogram"]
            for bound, count in zip(histogram.buckets, histogram.counts):
                lines.append(f"{full}_bucket{self._with_le(f'{bound:g}')} {count}")
            lines += [
                f"{full}_bucket{self._with_le('+Inf')} {histogram.count}",
                f"{full}_sum{labels} {histogram.total:g}",
                f"{full}_count{labels} {histogram.count}",
            ]
        return "\n".join(lines) + "\n"


def _label_value(value: str) -> str:
    """A label value as the text format escapes it (backslash, double quote, newline)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MetricsServer:
    """``GET /metrics`` and ``GET /healthz`` (200 when ``health()`` is healthy, else 503)."""

    def __init__(self, metrics: Renders, health: HealthCheck, host: str, port: int) -> None:
        self.metrics = metrics
        self.health = health
        self.host = host
        self.port = port
        self._server: Optional[asyncio.AbstractServer] = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sockets = list(self._server.sockets or ())
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("serving /metrics and /healthz on %s:%d", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while True:  # skip the headers
                line = await asyncio.wait_for(reader.readline(), 5)
                if line in (b"\r\n", b"\n", b""):
                    break
            parts = request.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"method not allowed\n"
            elif path == "/metrics":
                status, ctype = "200 OK", "text/plain; version=0.0.4; charset=utf-8"
                body = self.metrics.render().encode()
            elif path in ("/healthz", "/health", "/livez"):
                report = self.health()
                if isinstance(report, Health):
                    report = HealthReport(report)
                status = "200 OK" if report.healthy else "503 Service Unavailable"
                answer = {"status": report.state.value, **report.detail}
                ctype, body = "application/json", json.dumps(answer).encode() + b"\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            writer.write(head + (body if parts[:1] != ["HEAD"] else b""))
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def serve_metrics(
    metrics: Renders, health: HealthCheck, addr: Optional[MetricsAddrLike]
) -> Optional[MetricsServer]:
    """Start ``/metrics`` and ``/healthz`` on ``addr`` (None: off); a port in use ends the process with
    exit code 2 and one line."""
    if addr is None:
        return None
    server = MetricsServer(metrics, health, addr.host, addr.port)
    try:
        await server.start()
    except OSError as exc:
        raise ProgramExit(ExitCode.USAGE, f"Could not serve metrics on {addr}: {exc}") from exc
    return server
