# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The cursor file of the event source ``devin.outposts.outpost_queue`` (its option ``cursor_file``).

Part of the source (``extensions/eda/plugins/event_source/outpost_queue.py``), which loads it by path
(docs/eda.md, "What the source shares"); standard library only. The file keeps the cursor of the last event
sent and the last state sent per session, so that a restarted rulebook resumes where it stopped and sends
nothing twice. It is JSON, written atomically (a 0600 temporary file in the same folder, flushed to disk,
renamed over the old one), in a folder created with mode 0700; a file written for another API or outpost is
ignored with a warning.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from typing import Optional

#: The source's logger: these lines are the source's own (docs/eda.md quotes them).
log = logging.getLogger("devin.outposts.outpost_queue")

VERSION = 1
#: (session id, fingerprint of the last state sent), least recently changed first.
Seen = list[tuple[str, str]]


def load_state(path: Optional[str], api_url: str, outpost_id: Optional[str]) -> tuple[Optional[str], Seen]:
    """The stored cursor and the last state sent per session, or ``(None, [])`` when there are none for this
    API and outpost."""
    if not path or not os.path.exists(path):
        return None, []
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        log.warning("Ignoring the cursor file %s, which cannot be read: %s", path, exc)
        return None, []
    if not isinstance(data, dict) or data.get("version") != VERSION:
        log.warning("Ignoring the cursor file %s: not a cursor file of this source", path)
        return None, []
    if data.get("api_url") != api_url or data.get("outpost_id") != outpost_id:
        log.warning(
            "Ignoring the cursor file %s: it was written for %s, outpost %s",
            path,
            data.get("api_url"),
            data.get("outpost_id") or "(all)",
        )
        return None, []
    cursor = data.get("cursor")
    seen = [
        (str(item[0]), str(item[1]))
        for item in data.get("seen") or []
        if isinstance(item, list) and len(item) == 2
    ]
    return (cursor if isinstance(cursor, str) and cursor else None), seen


def save_state(
    path: str, api_url: str, outpost_id: Optional[str], cursor: Optional[str], seen: Sequence[tuple[str, str]]
) -> None:
    """Write the cursor file atomically (a 0600 temporary file in the same folder, fsynced, renamed)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    body = json.dumps(
        {
            "version": VERSION,
            "api_url": api_url,
            "outpost_id": outpost_id,
            "cursor": cursor,
            "seen": [list(item) for item in seen],
        }
    )
    fd, tmp = tempfile.mkstemp(prefix=".outpost_queue.", dir=folder)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
