# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The events the event source ``devin.outposts.outpost_queue`` sends, and the picture of the queue they
come from.

Part of the source (``extensions/eda/plugins/event_source/outpost_queue.py``), which loads it by path
(docs/eda.md, "What the source shares"); standard library only. docs/eda.md, "Events", documents each field.

* :func:`change_event`: one queue change (``MODIFIED``, ``DELETED`` or ``LISTED``), the entry flattened;
* :class:`SentStates`: the last state sent per session, so that a repeated delivery (the watch delivers at
  least once) is not sent twice, while a real change back to an earlier state is;
* :class:`QueuePicture`: every entry of the followed outposts, kept from the list and the watch, and the
  ``queue_depth`` event of an outpost computed from it.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, Callable, Optional

#: The top-level key of every event this source sends.
EVENT_KEY = "outpost_queue"
#: Session statuses of rows that stay pending until the API sweeps them but will never be served.
ENDED = ("suspended", "terminated")
#: How many sessions' last sent states are remembered to drop repeated deliveries (at-least-once).
SEEN_MAX = 4096

Entry = dict[str, Any]


def section(entry: Optional[Entry], name: str) -> dict[str, Any]:
    """``entry[name]`` when it is an object, else an empty one (``metadata``, ``spec``, ``status``)."""
    value = entry.get(name) if entry is not None else None
    return value if isinstance(value, dict) else {}


def fingerprint(entry: Entry, deleted: bool) -> str:
    """One state of one row: a repeated delivery of the same state has the same fingerprint (the cursor is
    left out: a replay after a reconnect may carry another cursor for the same state)."""
    text = json.dumps([deleted, entry], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def change_event(kind: str, entry: Entry, cursor: Optional[str]) -> dict[str, Any]:
    """The event of one queue change (``kind``: MODIFIED, DELETED or LISTED)."""
    entry = dict(entry)
    status = dict(section(entry, "status"))
    for secret in ("connect_token",):  # only claim answers carry it; never pass one on
        status.pop(secret, None)
    entry["status"] = status
    meta, spec = section(entry, "metadata"), section(entry, "spec")
    return {
        EVENT_KEY: {
            "type": kind,
            "session_id": meta.get("session_id"),
            "outpost_id": meta.get("outpost_id") or meta.get("pool_id"),
            "created_at": meta.get("created_at"),
            "updated_at": meta.get("updated_at"),
            "kind": spec.get("kind"),
            "platform": spec.get("platform"),
            "remote_binary_sha": spec.get("remote_binary_sha"),
            "network_policy": spec.get("network_policy"),
            "phase": status.get("phase"),
            "session_status": status.get("session_status"),
            "acceptor_id": status.get("acceptor_id"),
            "claim_deadline": status.get("claim_deadline"),
            "cursor": cursor,
            "entry": entry,
        }
    }


class SentStates:
    """session id -> fingerprint of the last state sent (or filtered out), least recently changed first; at
    most SEEN_MAX sessions (the oldest are forgotten)."""

    def __init__(self, items: Iterable[tuple[str, str]] = ()) -> None:
        self._marks: OrderedDict[str, str] = OrderedDict()
        for session_id, mark in items:
            self.remember(session_id, mark)

    def repeats(self, session_id: str, mark: str) -> bool:
        """Whether ``mark`` is the state last sent for the session (a repeated delivery)."""
        return self._marks.get(session_id) == mark

    def items(self) -> list[tuple[str, str]]:
        return list(self._marks.items())

    def remember(self, session_id: str, mark: str) -> None:
        self._marks.pop(session_id, None)
        self._marks[session_id] = mark
        while len(self._marks) > SEEN_MAX:
            self._marks.popitem(last=False)


def waiting(entry: Entry) -> bool:
    """A session that waits to be claimed: pending, and not suspended or terminated."""
    status = section(entry, "status")
    return status.get("phase") == "pending" and status.get("session_status") not in ENDED


def claiming_order(entry: Entry) -> tuple[Any, Any]:
    """Workers claim the oldest first: by ``created_at``, then by session id."""
    meta = section(entry, "metadata")
    return (meta.get("created_at") or 0, meta.get("session_id"))


class QueuePicture:
    """The latest copy of every entry (every phase) of the followed outposts, from the list and then every
    watched change, and per outpost when it last had a session waiting (or when the source started)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.started = clock()
        #: session id -> the latest copy of its row.
        self.entries: dict[str, Entry] = {}
        #: outpost id -> when (clock) it last had a session waiting.
        self.busy_at: dict[str, float] = {}

    def replace(self, entries: Iterable[Entry]) -> None:
        """A new list: the picture starts again from its entries."""
        self.entries = {section(e, "metadata")["session_id"]: e for e in entries}
        self.mark_busy(self.entries.values())

    def change(self, entry: Entry, deleted: bool) -> None:
        """One watched change of an entry."""
        session_id = section(entry, "metadata")["session_id"]
        if deleted:
            self.entries.pop(session_id, None)
        else:
            self.entries[session_id] = entry
            self.mark_busy([entry])

    def mark_busy(self, entries: Iterable[Entry]) -> None:
        now = self.clock()
        for entry in entries:
            if waiting(entry):
                self.busy_at[section(entry, "metadata").get("outpost_id", "")] = now

    def depth(self, outpost_id: str, name: str) -> dict[str, Any]:
        """The ``queue_depth`` event of one outpost: how many sessions wait, how long the oldest has, how many
        are claimed, and how long none has waited."""
        now = self.clock()
        mine = [e for e in self.entries.values() if section(e, "metadata").get("outpost_id") == outpost_id]
        queued = sorted((e for e in mine if waiting(e)), key=claiming_order)
        claimed = [e for e in mine if section(e, "status").get("phase") == "claimed"]
        oldest = section(queued[0], "metadata") if queued else {}
        created = oldest.get("created_at")
        waited = round(max(0.0, now - float(created)), 1) if created is not None else 0.0
        busy = self.busy_at.get(outpost_id, self.started) if not queued else now
        return {
            EVENT_KEY: {
                "type": "queue_depth",
                "outpost_id": outpost_id,
                "outpost_name": name,
                "pending": len(queued),
                "claimed": len(claimed),
                "oldest_pending_session_id": oldest.get("session_id"),
                "oldest_wait_seconds": waited,
                "idle_seconds": round(max(0.0, now - busy), 1),
                "time": round(now, 3),
            }
        }
