# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The one backoff of every client of the fleet API: how long to wait before trying again.

Attempt *n* (0 for the first retry) waits a random time between ``d/2`` and ``d``, where
``d = min(cap, base * 2**n)``: the ceiling doubles after each failure in a row until it reaches the cap.

Why this formula ("equal jitter") and not a random time between 0 and ``d`` ("full jitter", which the
fleet client and the modules' client used before): every retry budget here is small (three retries of a
request) or paces a loop that must not spin (a watch that keeps failing). With full jitter all three
retries of a request can fall within a few milliseconds of each other and spend the whole budget on one
blip; with a floor of ``d/2`` they span at least 1.75 s (0.25 + 0.5 + 1 with the requests' base of
0.5 s), while the upper half still spreads a fleet's retries so that they do not arrive together.

Three places use it: the fleet client's request retries (:mod:`.client`), the retry loops of the worker
and the orchestrator, and the event source ``devin.outposts.outpost_queue``. The modules' client
(``plugins/module_utils/_fleet_api.py``, which runs on Python 3.6 and cannot import this) repeats the
formula in two lines; ``python/contract/stream.yaml`` holds cases that all of them run, so they cannot
drift apart.

This module imports only the standard library, and nothing of ours: the collection ships a byte-identical
copy as ``plugins/plugin_utils/_fleet_backoff.py`` for the event source, which runs where this package is
not installed (docs/eda.md, "What the source shares").
"""

from __future__ import annotations

import random
from typing import Callable

#: The ceiling stops doubling after this many attempts (``2**32`` times any sane base is past any cap);
#: without it a long outage would compute ever larger powers of two.
MAX_DOUBLINGS = 32


def backoff_delay(attempt: int, base: float, cap: float, draw: float) -> float:
    """The wait before retry ``attempt`` (0 for the first), for a random ``draw`` in ``[0, 1)``."""
    ceiling = min(cap, base * (2 ** min(max(attempt, 0), MAX_DOUBLINGS)))
    return float(ceiling / 2 + draw * ceiling / 2)


class Backoff:
    """The waits of one run of failures: :meth:`next_delay` for each failure, :meth:`reset` after a success.

    :meth:`connection_lived` resets it after a connection (a watch stream) that lived at least
    ``reset_after`` seconds: a healthy stream that broke starts the waits afresh.
    """

    def __init__(
        self,
        base: float = 1.0,
        cap: float = 60.0,
        reset_after: float = 5.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.base = base
        self.cap = max(cap, 0.0)
        self.reset_after = reset_after
        self.attempt = 0
        self._rng = rng

    def delay(self, attempt: int) -> float:
        """The wait before retry ``attempt`` with this backoff's base, cap and draws, for a caller that counts
        the attempts itself (a list-then-watch loop: ``api/listwatch.py``)."""
        return backoff_delay(attempt, self.base, self.cap, self._rng())

    def next_delay(self) -> float:
        delay = self.delay(self.attempt)
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0

    def connection_lived(self, seconds: float) -> bool:
        """Reset when the connection lived long enough; returns True when it did."""
        if seconds >= self.reset_after:
            self.reset()
            return True
        return False
