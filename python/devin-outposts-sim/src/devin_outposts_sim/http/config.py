"""The simulator's settings (one dataclass shared by the CLI, the in-process test server and the app)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

from devin_outposts_sim.state.db import DEFAULT_TOMBSTONE_AFTER, check_tombstone_after

DEFAULT_DB = "devin-outposts-sim.db"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787


@dataclass
class SimConfig:
    """How the simulated fleet API behaves. Durations are seconds and may be fractions (tests use 0.5)."""

    #: SQLite database file, or ``:memory:`` (state then dies with the process).
    db: str = DEFAULT_DB
    #: How long a claim (and each renewal) lasts: ``claim_deadline = now + claim_ttl``.
    claim_ttl: float = 300.0
    #: A watch stream ends after this long; clients reconnect with their last cursor.
    watch_max_duration: float = 300.0
    #: An idle watch stream sends a ``: keepalive`` comment this often.
    keepalive_interval: float = 15.0
    #: How often the background sweeper returns expired claims to the queue.
    sweep_interval: float = 1.0
    #: ``status.gateway_url`` of claim responses; None = ``ws(s)://<host:port the client used>/gateway``.
    gateway_url: Optional[str] = None
    #: When the brain ends a session, its remote is told at once and ``session_status`` is written this
    #: many seconds later (0: at once). The real status update can lag the remote's exit
    #: (docs/fleet-api.md §5), so clients re-read it; this lets tests exercise that path.
    status_lag: float = 0.0
    #: Seconds after a session's end (``suspended``/``terminated``) at which its queue row is tombstoned,
    #: as the upstream sweeper does (contract 3.4); None: never. ``PUT /_sim/config`` changes it while
    #: serving, and a reset restores this value.
    tombstone_after: Optional[float] = DEFAULT_TOMBSTONE_AFTER
    #: Bearer token of the ``/_sim`` admin API (required; the CLI generates one when none is given).
    admin_token: str = ""

    def validate(self) -> None:
        for name in ("claim_ttl", "watch_max_duration", "keepalive_interval", "sweep_interval"):
            value = float(getattr(self, name))
            if math.isnan(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds")
        lag = float(self.status_lag)
        if math.isnan(lag) or lag < 0 or math.isinf(lag):
            raise ValueError("status_lag must be zero or a positive number of seconds")
        self.tombstone_after = check_tombstone_after(self.tombstone_after)
        if not self.admin_token:
            raise ValueError("an admin token is required")

    def public(self) -> dict[str, Any]:
        """The settings without the admin token (what ``GET /_sim/config`` shows)."""
        data = asdict(self)
        data.pop("admin_token")
        return data
