"""What every route of the simulator shares: the runtime (store, settings, notifiers) and request helpers.

The API routes (:mod:`~devin_outposts_sim.http.app`), the admin and brain routes, the gateway and the CLI
distribution all import this module, and :mod:`~devin_outposts_sim.http.app` imports them to build the app: so
routes never import the app, and there is no import circle.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Optional

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse

from devin_outposts_sim.http import validate
from devin_outposts_sim.http.config import SimConfig
from devin_outposts_sim.http.watch import ChangeFeed, Notifier
from devin_outposts_sim.state.store import Store

log = logging.getLogger(__name__)


@dataclass
class SimRuntime:
    """What the routes share: the store, the settings and (while serving) the watch notifier and the
    gateway's (woken by queue changes and by tool-call changes, for the gateway's and brain's long polls)."""

    store: Store
    config: SimConfig
    owns_store: bool = False
    notifier: Optional[Notifier] = None
    #: The queue changes, read and serialised once for every watch stream.
    feed: Optional[ChangeFeed] = None
    gateway: Optional[Notifier] = None
    #: Sweeps scheduled by :meth:`sweep_after`, cancelled at shutdown.
    timers: set[asyncio.Future[None]] = field(default_factory=set)
    #: ``tombstone_after`` as configured at start, which a reset restores.
    configured_tombstone_after: Optional[float] = None

    def __post_init__(self) -> None:
        self.configured_tombstone_after = self.config.tombstone_after
        self.set_tombstone_after(self.config.tombstone_after)

    def set_tombstone_after(self, seconds: Optional[float]) -> None:
        """Tombstone ended sessions ``seconds`` after their end from now on (None: never); it applies to
        sessions that have already ended too. Raises ``ValueError`` for anything else."""
        self.store.db.tombstone_after = seconds
        self.config.tombstone_after = self.store.db.tombstone_after

    def close_notifiers(self) -> None:
        """End every watch stream and long poll (server shutdown). Call from the loop's thread."""
        for notifier in (self.notifier, self.gateway):
            if notifier is not None:
                notifier.close()
        if self.feed is not None:
            self.feed.close()
        for timer in list(self.timers):
            timer.cancel()

    def sweep_after(self, delay: float) -> None:
        """Sweep (write due lagging statuses, expire due claims) ``delay`` seconds from now, so watchers
        hear of a change that falls due between two runs of the sweeper. Call from the loop's thread."""

        async def later() -> None:
            # A hair late: the due time is on the wall clock, asyncio sleeps on the monotonic one.
            await asyncio.sleep(delay + 0.01)
            try:
                await run_in_threadpool(self.store.queue.expire_claims)
            except Exception:
                log.exception("delayed sweep failed")

        timer = asyncio.ensure_future(later())
        self.timers.add(timer)
        timer.add_done_callback(self.timers.discard)


def runtime_of(request: Request) -> SimRuntime:
    runtime: SimRuntime = request.app.state.sim
    return runtime


def detail(status: int, message: Any, headers: Optional[dict[str, str]] = None) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status, headers=headers)


async def body_of(request: Request) -> dict[str, Any]:
    return validate.parse_json_object(await request.body())


def gateway_url(request: Request, config: SimConfig) -> str:
    if config.gateway_url:
        return config.gateway_url
    scheme = "wss" if request.url.scheme == "https" else "ws"
    return f"{scheme}://{request.url.netloc}/gateway"
