"""Retrying what may succeed later: backoff with jitter, and which fleet errors are worth a retry.

The fleet client already retries each request a few times (429, 5xx, refused connections). What is
still failing after that is handled here, one level up, where the worker knows what it was doing:

* :func:`is_transient` tells an outage (unreachable API, 5xx or 429 after the client's retries, a proxy's
  HTML page or other non-contract answer) from an answer that will not change (401/403, 404, 400/422);
* :func:`retry_transient` repeats an operation on transient errors with :class:`Backoff`, logging one
  warning line per failure (never a traceback), until it succeeds, fails for good, or the worker stops.

:class:`Backoff` is the fleet API's one backoff (:mod:`devin_outposts.api.backoff`), imported here so that
the worker's and the orchestrator's loops keep importing it from this module.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Callable, Optional, TypeVar

from devin_outposts.api.backoff import Backoff
from devin_outposts.api.errors import FleetConnectionError, FleetError, FleetProtocolError, FleetServerError

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["Backoff", "Stopped", "is_transient", "retry_transient"]


def is_transient(exc: FleetError) -> bool:
    """True for errors that an outage explains and that may pass: retry these, fail on the others."""
    if isinstance(exc, (FleetConnectionError, FleetServerError, FleetProtocolError)):
        return True
    return exc.status in (408, 425)


class Stopped(Exception):
    """The worker was asked to stop while an operation was waiting to be retried."""


async def retry_transient(
    operation: Callable[[], Awaitable[T]],
    *,
    backoff: Backoff,
    pause: Callable[[float], Awaitable[bool]],
    extra: Optional[dict[str, str]] = None,
) -> T:
    """Run ``operation`` until it succeeds; retry transient :class:`FleetError` after a backoff.

    ``pause(seconds)`` waits and returns False when the worker is stopping, which raises
    :class:`Stopped`. Any other error (and a non-transient :class:`FleetError`) propagates.
    """
    while True:
        try:
            return await operation()
        except FleetError as exc:
            if not is_transient(exc):
                raise
            delay = backoff.next_delay()
            log.warning("%s; retrying in %.1fs", exc, delay, extra=extra or {})
            if not await pause(delay):
                raise Stopped(str(exc)) from exc
