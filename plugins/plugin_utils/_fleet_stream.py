# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The one reader of the fleet API's watch stream (server-sent events, docs/fleet-api.md §4.2).

:class:`EventStreamReader` turns the bytes of a ``text/event-stream`` body into events, as they come: give
it each chunk the transport read (httpx, aiohttp or a test's list of byte strings) and it returns the
events the chunk completed. It owns what every client of the stream must get right, once:

* **framing** as the SSE rules say: a line ends at ``\\n``, ``\\r\\n`` or a lone ``\\r`` (a ``\\r\\n``
  split across two chunks included); ``data:`` lines are joined with ``\\n``; one space after the colon is
  dropped; a blank line ends the event; a line without a colon is a field with an empty value; ``event:``
  and ``id:`` are kept; a leading byte-order mark is skipped. An event whose blank line never came (the
  stream ended inside it) is dropped, never half delivered: the reconnect replays it from the cursor.
* **size caps** on what is held, whatever it looks like (issue 24): a line longer than ``max_line``
  bytes fails before it is held whole, and everything read since the last blank line (``data:`` lines,
  empty ones too, comments, other fields: each line's length plus one for its end) fails past
  ``max_event`` bytes, so 60 million empty ``data:`` lines cannot grow a reader;
* **keepalives**: a comment line (``: keepalive``) is counted (:attr:`EventStreamReader.comments`) and
  skipped; with its blank line it resets the count of what is held, so keepalives never add up. A silent
  stream is the transport's to notice (its read timeout); a keepalive is what keeps that timeout from
  firing;
* **resumption**: the fleet API puts the cursor of each event inside its JSON (``{"cursor": ...}``), so
  the caller resumes from the cursor of the last event it *handled*; :func:`watch_params` builds the
  request that does (an SSE ``id:`` field, which the API does not send, is kept as
  :attr:`EventStreamReader.last_event_id` all the same).

It never decodes JSON: that is each client's, with its own models. It imports only the standard library
and nothing of ours: the collection ships a byte-identical copy as ``plugins/plugin_utils/_fleet_stream.py``
for the event source ``devin.outposts.outpost_queue`` (docs/eda.md, "What the source shares"), and the
simulator's pytest plugin reads its streams with it too. ``python/contract/stream.yaml`` holds the cases
that every reader runs.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

#: The longest line, and the most bytes held for one event (every line since the last blank line).
MAX_LINE_BYTES = 1 << 20
MAX_EVENT_BYTES = 1 << 20
#: The ``Accept`` header of a watch request.
EVENT_STREAM = "text/event-stream"

_BOM = b"\xef\xbb\xbf"
_CR, _LF = 13, 10


class EventStreamTooLarge(Exception):
    """A line or an event of the stream went past its cap: the stream fails instead of using unbounded
    memory. ``part`` is ``"line"`` or ``"event"``."""

    def __init__(self, part: str, limit: int) -> None:
        super().__init__(f"a watch {part} is larger than {limit} bytes")
        self.part = part
        self.limit = limit


class ServerSentEvent(NamedTuple):
    """One event: its data (the ``data:`` lines joined by ``\\n``), its type and the last event id."""

    data: str
    event: str = "message"
    last_event_id: str = ""


def watch_params(outpost: Optional[str], cursor: Optional[str]) -> dict[str, str]:
    """The query of a watch request that resumes from ``cursor``: the cursor of the last event handled,
    else the final cursor of the list that came before the watch (list, then watch)."""
    params = {"watch": "true", "outpost": outpost, "cursor": cursor}
    return {key: value for key, value in params.items() if value is not None}


class EventStreamReader:
    """Server-sent events from the bytes of one stream, chunk by chunk (:meth:`feed`).

    ``on_comment`` is called with the text of each comment line (after the colon), for a caller that
    wants to see keepalives; the reader itself only counts them.
    """

    def __init__(
        self,
        max_line: int = MAX_LINE_BYTES,
        max_event: int = MAX_EVENT_BYTES,
        on_comment: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.max_line = max_line
        self.max_event = max_event
        self.on_comment = on_comment
        #: Comment lines read so far (keepalives).
        self.comments = 0
        #: The value of the last ``id:`` field (the SSE rules' "last event ID").
        self.last_event_id = ""
        self._partial = bytearray()  # the start of a line whose end has not come yet
        self._after_cr = False  # the last chunk ended with "\r": a "\n" that starts the next is its pair
        self._first_line = True
        self._data: list[str] = []
        self._has_data = False
        self._event_type = ""
        self._held = 0

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """The events that ``chunk`` completes, in order. Raises :class:`EventStreamTooLarge`."""
        events: list[ServerSentEvent] = []
        if not chunk:
            return events  # an empty read must not break a "\r\n" split across two chunks
        start = 1 if self._after_cr and chunk[:1] == b"\n" else 0
        self._after_cr = False
        size = len(chunk)
        # The next "\n" and "\r" at or after ``start``, each searched again only once passed, so a chunk of
        # many lines is scanned once, not once per line.
        next_lf = chunk.find(b"\n", start)
        next_cr = chunk.find(b"\r", start)
        while next_lf >= 0 or next_cr >= 0:
            end = next_lf if next_cr < 0 or 0 <= next_lf < next_cr else next_cr
            if self._partial:
                self._partial += chunk[start:end]
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = chunk[start:end]
            start = end + 1
            if chunk[end] == _CR:
                if start == size:
                    self._after_cr = True
                elif chunk[start] == _LF:
                    start += 1  # "\r\n" is one line end
            event = self._line(line)
            if event is not None:
                events.append(event)
            if next_lf < start:
                next_lf = chunk.find(b"\n", start)
            if next_cr < start:
                next_cr = chunk.find(b"\r", start)
        self._partial += chunk[start:]
        if len(self._partial) > self.max_line:
            raise EventStreamTooLarge("line", self.max_line)
        return events

    def _line(self, line: bytes) -> Optional[ServerSentEvent]:
        if len(line) > self.max_line:
            raise EventStreamTooLarge("line", self.max_line)
        if self._first_line:
            self._first_line = False
            if line.startswith(_BOM):
                line = line[len(_BOM) :]
        if not line:
            return self._dispatch()
        self._held += len(line) + 1
        if self._held > self.max_event:
            raise EventStreamTooLarge("event", self.max_event)
        text = line.decode("utf-8", "replace")
        if text.startswith(":"):
            self.comments += 1
            if self.on_comment is not None:
                self.on_comment(text[1:])
            return None
        field, colon, value = text.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True
        elif field == "event":
            self._event_type = value
        elif field == "id" and "\0" not in value:
            self.last_event_id = value
        # "retry:" and unknown fields are ignored: reconnects are paced by the client's backoff.
        return None

    def _dispatch(self) -> Optional[ServerSentEvent]:
        """A blank line: the event read since the previous one, if it had any ``data:`` line."""
        self._held = 0
        event = None
        if self._has_data:
            event = ServerSentEvent("\n".join(self._data), self._event_type or "message", self.last_event_id)
        self._data = []
        self._has_data = False
        self._event_type = ""
        return event
