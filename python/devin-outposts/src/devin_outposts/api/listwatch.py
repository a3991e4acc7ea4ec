# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""List, then watch: the bookkeeping and the decisions of every loop that follows the session queue.

The fleet API asks a client that follows the queue to list it (page by page) and then watch it from the
list's final cursor (docs/fleet-api.md §4.1, §4.2). Two loops do: the worker's queue feed
(``devin_outposts/core/feed.py``) and the event source ``devin.outposts.outpost_queue``. This module holds
what they must agree on, written once and without any I/O: each loop sends its requests with its own
transport (httpx, aiohttp), tells these objects what came back, and does what they say next.

* :class:`Listing`, one list: pages are asked for until ``has_next_page`` is false, each from the cursor of
  the page before; rows are upserted by session id (a row on the border of two pages comes on both, and the
  later copy is the fresher); the final cursor is the last page's, else the one the list started from. A
  page that says another follows without a new cursor raises :class:`PagingStalled` (following it would ask
  for the same page forever).
* :class:`ListWatch`, the loop: list when the picture is not current (at the start, after a failure that
  puts it in doubt, and every ``resync_interval`` seconds when one is given), otherwise watch from the cursor
  of the last event handled (or of the last list). A stream the server ends cleanly (streams are bounded in
  time) is reopened at once; after :data:`QUICK_ENDS_BEFORE_PAUSE` clean ends in a row that came within
  :data:`QUICK_END` seconds and carried no event, each reconnect waits :data:`QUICK_END_PAUSE`, so a server
  that ends every stream at once cannot make a client spin. A failure waits the caller's backoff for the
  number of failures in a row; a stream that was healthy (it lived :data:`HEALTHY_STREAM` seconds or carried
  an event) before it broke starts that count afresh. After every failure but an outage
  (:func:`relist_after`) the queue is listed again before the next watch: a refused cursor (400/422), a
  malformed reply and any other unexpected answer put the picture in doubt, while an outage (a connection
  error, 429 or 5xx) leaves the cursor good.
* A stored cursor (the event source's ``cursor_file``) is resumed from: the first list only seeds the picture
  and the watch starts from the stored cursor, which replays every change made since
  (:meth:`ListWatch.listed` says whether the list's rows are news).

Which failures stop a loop for good (a refused token) stays each loop's own, as do its log lines. The loops'
cases are ``python/contract/listwatch.yaml``, run against both. This module imports only the standard
library and nothing of ours: the collection ships a byte-identical copy as
``plugins/plugin_utils/_fleet_listwatch.py`` for the event source (docs/eda.md, "What the source shares").
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from typing import Callable, Generic, Optional, TypeVar

#: A stream that lived this many seconds, or carried an event, was healthy: a failure after it starts the
#: backoff afresh (the Kubernetes operator's rule, docs/fleet-api.md §4.2).
HEALTHY_STREAM = 5.0
#: A clean end within this many seconds of a stream that carried no event is "quick"; after
#: QUICK_ENDS_BEFORE_PAUSE of them in a row, each reconnect waits QUICK_END_PAUSE seconds.
QUICK_END = 1.0
QUICK_ENDS_BEFORE_PAUSE = 3
QUICK_END_PAUSE = 1.0

Row = TypeVar("Row")


class PagingStalled(Exception):
    """A page said another follows but gave no new cursor. The message ends a sentence that starts with the
    operation: ``Could not list sessions: <message>``."""

    def __init__(self, cursor_key: str) -> None:
        super().__init__(f"the API reported another page but did not advance {cursor_key}")
        self.cursor_key = cursor_key


class Listing(Generic[Row]):
    """One list, page by page: ask for the next page from :attr:`cursor` while :meth:`add_page` says so."""

    def __init__(self, cursor: Optional[str] = None, cursor_key: str = "the cursor") -> None:
        #: Where the next page starts; once the last page came, where a watch starts.
        self.cursor = cursor
        self.cursor_key = cursor_key
        self._rows: dict[str, Row] = {}

    def add_page(self, rows: Iterable[tuple[str, Row]], cursor: Optional[str], has_next_page: bool) -> bool:
        """Upsert the page's ``(key, row)`` pairs; True when another page is to be asked for."""
        for key, row in rows:
            self._rows.pop(key, None)  # the later copy is the fresher: it goes where the server put it
            self._rows[key] = row
        if not has_next_page:
            self.cursor = cursor or self.cursor
            return False
        if not cursor or cursor == self.cursor:
            raise PagingStalled(self.cursor_key)
        self.cursor = cursor
        return True

    @property
    def rows(self) -> list[Row]:
        """Every row listed so far, each once, in the server's order."""
        return list(self._rows.values())


class Step(enum.Enum):
    """What a list-then-watch loop does next."""

    LIST = "list"
    WATCH = "watch"


def relist_after(status: Optional[int], malformed: bool = False) -> bool:
    """Whether a failed list or watch must be followed by a list before the next watch: after anything but
    an outage. A refused cursor (400 or 422: too old, or not one of the API's own) is listed past, and so is
    a 404, a redirect or any other answer the loop did not expect, and a reply that is not what the API
    sends (``malformed``, whatever its status); a connection error or timeout (``status`` None), 429 or 5xx
    leaves the cursor good."""
    if malformed:
        return True
    return status is not None and status != 429 and status < 500


class ListWatch:
    """The state of one list-then-watch loop between its requests.

    ``delay(n)`` is the caller's backoff: the wait after the *n*-th failure in a row (0 for the first).
    ``resync_interval``: list again when the last list is older than this, even if nothing failed (a safety
    net of the worker's). ``clock`` is monotonic seconds (a test gives its own).
    """

    def __init__(
        self,
        delay: Callable[[int], float],
        *,
        resync_interval: Optional[float] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.delay = delay
        self.resync_interval = resync_interval
        self.clock = clock
        #: Where the next watch starts: the cursor of the last event handled, else of the last list.
        self.cursor: Optional[str] = None
        #: A stored cursor to watch from after the next list (which then only seeds the picture).
        self.resume: Optional[str] = None
        #: The picture is not current: list before the next watch.
        self.need_list = True
        #: Failures in a row since the backoff last started afresh.
        self.attempt = 0
        #: Clean quick ends without an event in a row.
        self.quick_ends = 0
        #: Events handled so far.
        self.events = 0
        #: How long the last stream lived (None when the last step was not a watch).
        self.lived: Optional[float] = None
        self._listed_at: Optional[float] = None
        self._watch_started: Optional[float] = None
        self._events_before = 0

    def next_step(self) -> Step:
        stale = (
            self.resync_interval is not None
            and self._listed_at is not None
            and self.clock() - self._listed_at > self.resync_interval
        )
        return Step.LIST if self.need_list or stale else Step.WATCH

    def resync_in(self) -> Optional[float]:
        """Seconds until the periodic list is due (None: no ``resync_interval``, or nothing listed yet).

        A loop ends its stream itself at that moment rather than waiting for the server to end it: the server
        ends together the streams of clients that connected together, so lists made on each stream's end would
        come as one wave of a whole fleet's lists, each interval's jitter notwithstanding."""
        if self.resync_interval is None or self._listed_at is None:
            return None
        return max(0.0, self._listed_at + self.resync_interval - self.clock())

    def listed(self, cursor: Optional[str]) -> bool:
        """A list succeeded, with this final cursor. True when its rows are news (the caller's picture starts
        from them); False when it resumed a stored cursor, whose watch replays every change since."""
        self._listed_at = self.clock()
        self._watch_started = None
        self.need_list = False
        if self.resume is not None:
            self.cursor, self.resume = self.resume, None
            return False
        self.cursor = cursor
        return True

    def watching(self) -> None:
        """A watch is about to be opened from :attr:`cursor`."""
        self._watch_started = self.clock()
        self._events_before = self.events

    def event(self, cursor: Optional[str]) -> None:
        """An event was handled: the next watch resumes from its cursor (if it carried one)."""
        self.events += 1
        if cursor:
            self.cursor = cursor

    def ended(self) -> float:
        """The stream ended cleanly. Returns the seconds to wait before the next watch (0 or the pause)."""
        lived, carried = self._close()
        self.attempt = 0
        quick = lived is not None and lived < QUICK_END and not carried
        self.quick_ends = self.quick_ends + 1 if quick else 0
        return QUICK_END_PAUSE if self.quick_ends >= QUICK_ENDS_BEFORE_PAUSE else 0.0

    def failed(self, relist: bool) -> float:
        """A list or a watch failed (the caller decided it is worth retrying; :func:`relist_after` says
        ``relist``). Returns the seconds to wait before the next step."""
        lived, carried = self._close()
        if relist:
            self.need_list = True
        if carried or (lived is not None and lived >= HEALTHY_STREAM):
            self.attempt = 0
        self.quick_ends = 0
        wait = self.delay(self.attempt)
        self.attempt += 1
        return wait

    def polled(self) -> None:
        """A list stood in for the watch (polling) and succeeded: the backoff starts afresh."""
        self.attempt = 0

    def _close(self) -> tuple[Optional[float], bool]:
        """How long the stream that just closed lived and whether it carried an event (None, False: no
        stream was open, the step was a list)."""
        started, self._watch_started = self._watch_started, None
        self.lived = None if started is None else self.clock() - started
        return self.lived, started is not None and self.events > self._events_before
