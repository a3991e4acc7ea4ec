"""The orchestrator's metrics: the names of Cognition's operator (prefix ``outposts_``), plus ours.

The operator's six (``sessions_claimed``, ``claim_conflicts``, ``active_workers``, ``workers_given_up``,
``reconciliations``, ``reconcile_failures``) keep their names and meaning, labelled ``pool_id`` (the
outpost), so a dashboard built for the operator reads ours too. ``start_failures`` is labelled with the
platform's reason as well (a short name from a small set: ``ErrImagePull``, ``boot-timeout``...). Each
outpost served has its own :class:`Metrics`, labelled ``outpost`` (as ``--outpost`` names it) from the
start and ``pool_id`` (its id) once resolved; :class:`OutpostsMetrics` renders them as one page, each
family once.
"""

from __future__ import annotations

from collections.abc import Sequence

from devin_outposts.core.metrics import LABELLED_COUNTERS as CORE_LABELLED_COUNTERS
from devin_outposts.core.metrics import Metrics

PREFIX = "outposts_"
COUNTERS = {
    "sessions_claimed": "Sessions claimed from the queue (restart adoptions included)",
    "claim_conflicts": "Claims answered 409 (another coordinator won)",
    "workers_given_up": "Sessions given up after the worker failed past the restart limit",
    "reconciliations": "Garbage-collection sweeps",
    "reconcile_failures": "Sweeps that failed (the driver or the fleet API)",
    "infrastructure_errors": "Machines that could not be made, started, snapshotted or torn down",
    "sessions_served": "Sessions that ended (suspended, terminated or gone) and were released",
    "sessions_failed": "Sessions that failed: given up, infrastructure errors, claims lost",
    "worker_restarts": "Worker restarts after an exit while the session was live",
    "renewals": "Successful claim renewals",
    "renewal_failures": "Claim renewals that failed and were retried",
    "watch_reconnects": "Queue watch reconnections",
    "api_errors": "Fleet API errors in the claim loop (retried with backoff)",
    "machines_collected": "Machines removed by the sweep (session gone, over, elsewhere, never booted)",
    "snapshots_collected": "Snapshots removed by the sweep (session terminated or gone, TTL passed)",
    "network_policy_refusals": "Sessions released because their machine could not enforce their policy",
    "driver_backoffs": "Pauses of new claims because the driver kept failing to start workers",
}
#: Counters with labels of their own: name -> (help, label names).
LABELLED_COUNTERS = {
    **CORE_LABELLED_COUNTERS,
    "start_failures": (
        "Sessions whose worker never started (provisioning failed, the platform's reason, the boot timeout)",
        ("reason",),
    ),
}
GAUGES = {
    "active_workers": "Sessions with a machine now",
    "max_concurrent": "Configured concurrent sessions",
    "draining": "1 after SIGTERM/SIGINT: no new claims",
    "driver_backoff_seconds": "Seconds of the current pause of new claims (0: claiming normally)",
}
START_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
HISTOGRAMS = {
    "session_start_seconds": ("Seconds from a session's enqueue to its worker running", START_BUCKETS),
}


def orchestrator_metrics() -> Metrics:
    return Metrics(
        prefix=PREFIX,
        counters=COUNTERS,
        gauges=GAUGES,
        histograms=HISTOGRAMS,
        labelled_counters=LABELLED_COUNTERS,
    )


def outpost_metrics(outpost: str) -> Metrics:
    """One outpost's metrics, labelled with the outpost as configured."""
    metrics = orchestrator_metrics()
    metrics.labels = {"outpost": outpost}
    return metrics


class OutpostsMetrics:
    """Several outposts' metrics on one ``/metrics`` page: each family's ``HELP`` and ``TYPE`` once, then
    every outpost's samples (the text format wants a family's samples together)."""

    def __init__(self, parts: Sequence[Metrics]) -> None:
        self.parts = list(parts)

    def render(self) -> str:
        families: dict[str, list[str]] = {}
        samples: dict[str, list[str]] = {}
        for part in self.parts:
            family = ""
            for line in part.render().splitlines():
                if line.startswith("# HELP "):
                    family = line.split(" ", 3)[2]
                    if family not in families:
                        families[family] = [line]
                        samples[family] = []
                elif line.startswith("# TYPE "):
                    if len(families[family]) == 1:
                        families[family].append(line)
                elif line:
                    samples[family].append(line)
        lines = [line for family, head in families.items() for line in (*head, *samples[family])]
        return "\n".join(lines) + "\n"
