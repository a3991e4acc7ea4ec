# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""devin.outposts.outpost_queue: an ansible-rulebook event source for a Devin Outposts session queue.

ansible-rulebook loads this file with ``runpy.run_path`` and calls ``main(queue, args)``. It runs outside
Ansible's collection loader, so it cannot import ``ansible_collections.devin.outposts.plugins.module_utils``
(nothing puts the collections path on ``sys.path``); the few constants it shares with
``plugins/module_utils/_fleet_api.py`` are repeated below, and ``tests/eda/test_outpost_queue.py`` fails when
the two drift apart. docs/eda.md is the user guide.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
import re
import ssl
import tempfile
import time
from collections import OrderedDict
from typing import Any, Optional

import aiohttp

DOCUMENTATION = r"""
---
short_description: Follow a Devin Outposts session queue and send an event per change.
description:
  - An ansible-rulebook event source that follows the session queue of the Devin Outposts fleet API the way
    the API asks clients to, list then watch (C(GET /opbeta/outposts/devins), then the same with
    C(watch=true) over server-sent events from the list's final cursor), and puts one event on the rulebook's
    queue per queue change.
  - It never returns on its own. A stream the server ends (streams last at most a few minutes) is reopened
    at once from the last cursor; an error (connection, HTTP 429 or 5xx) is retried after a random wait that
    starts at half of O(backoff_initial), doubles its ceiling after each further error, and never passes
    O(backoff_max) seconds. A token the API refuses (HTTP 401
    or 403) stops the source with an error, since retrying cannot fix it.
  - With O(cursor_file) the cursor of the last event is kept on disk (written atomically, mode 0600), so a
    restarted rulebook resumes where it stopped instead of starting from the current queue.
  - Every O(queue_depth_interval) seconds it also sends a C(queue_depth) event per outpost, saying how many
    sessions wait and how long the oldest has waited, for autoscaling rules.
  - Needs C(aiohttp), which ansible-rulebook itself depends on, so every decision environment has it.
options:
  api_url:
    description:
      - Base URL of the Devin API. Give the base only; C(/opbeta/outposts/...) is appended (a trailing
        C(/opbeta/outposts) is tolerated and removed).
      - If not set, the E(DEVIN_API_URL) environment variable is used, then C(https://api.devin.ai).
    type: str
    default: https://api.devin.ai
  token:
    description:
      - A v3 API token of a service user with the C(account.outposts.machine) scope (reading outposts and the
        queue), sent as a bearer token.
      - If not set, the E(DEVIN_OUTPOSTS_TOKEN) environment variable is used. One of the two is required.
      - The token is never logged and never part of an event or an error message.
    type: str
  validate_certs:
    description: Whether to verify the API's TLS certificate. Only set to V(false) against a test server.
    type: bool
    default: true
  ca_path:
    description: A PEM bundle of CA certificates to verify the API's certificate with.
    type: path
  timeout:
    description:
      - Seconds for each list request and for connecting a watch. A watch stream that stays silent (no event,
        no keepalive) for four times this long is reconnected.
    type: float
    default: 30
  outpost:
    description:
      - Follow only this outpost, given by name or by id (C(outpost_env-...)). A name is resolved to its id
        through the API when the source starts; an unknown outpost stops the source with an error.
      - Not set, every outpost of the account is followed.
    type: str
  phase:
    description:
      - Send change events only for entries in these phases (C(pending), C(claimed)). The source still follows
        every change (for the cursor and the queue_depth events); this only filters what it sends.
    type: list
    elements: str
  cursor_file:
    description:
      - A file that keeps the cursor of the last event sent (JSON, written atomically, mode 0600; its folder
        is created with mode 0700). At start, a stored cursor of the same API and outpost is resumed from,
        so no change made while the rulebook was down is lost; without one the source lists the queue first.
    type: path
  emit_listed:
    description:
      - When the source starts without a stored cursor (or the API rejected the stored one), send a C(LISTED)
        event for every entry the first list returns, so that sessions queued before the rulebook started are
        acted on too.
    type: bool
    default: true
  queue_depth_interval:
    description: Seconds between C(queue_depth) events (one per outpost). V(0) turns them off.
    type: float
    default: 60
  backoff_initial:
    description: First backoff after an error, in seconds; it doubles after each further error in a row.
    type: float
    default: 1
  backoff_max:
    description: The longest backoff, in seconds.
    type: float
    default: 60
"""

EXAMPLES = r"""
- name: Provision a machine for every queued session
  hosts: localhost
  sources:
    - devin.outposts.outpost_queue:
        outpost: gpu-h200
        phase: [pending]
        cursor_file: /var/lib/eda/gpu-h200.cursor
  rules:
    - name: A new session waits
      condition: >-
        event.outpost_queue.type in ["MODIFIED", "LISTED"]
        and event.outpost_queue.session_status == "pending"
      action:
        debug:
          msg: "session {{ event.outpost_queue.session_id }} waits on {{ event.outpost_queue.outpost_id }}"

- name: Autoscale on queue wait
  hosts: localhost
  sources:
    - devin.outposts.outpost_queue:
        outpost: gpu-h200
        queue_depth_interval: 30
  rules:
    - name: The oldest session waited more than two minutes
      condition: event.outpost_queue.type == "queue_depth" and event.outpost_queue.oldest_wait_seconds > 120
      action:
        debug:
          msg: "{{ event.outpost_queue.pending }} sessions wait"
"""

log = logging.getLogger("devin.outposts.outpost_queue")

# Shared with plugins/module_utils/_fleet_api.py (tests/eda checks that they agree).
DEFAULT_API_URL = "https://api.devin.ai"
DEFAULT_TIMEOUT = 30.0
OUTPOSTS_PATH = "/opbeta/outposts/outposts"
QUEUE_PATH = "/opbeta/outposts/devins"
PHASES = ("pending", "claimed")
OUTPOST_ID_PREFIX = "outpost_env-"
MAX_PAGE_SIZE = 200
OUTPOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}\Z")

#: The top-level key of every event this source sends.
EVENT_KEY = "outpost_queue"
#: Session statuses of rows that stay pending until the API sweeps them but will never be served.
ENDED = ("suspended", "terminated")
#: A stream that lived this long, or carried an event, was healthy: the next error starts the backoff afresh.
HEALTHY_STREAM = 5.0
#: Clean stream ends in a row without an event before reconnects are paced by one second.
QUICK_ENDS_BEFORE_PAUSE = 3
#: How many sessions' last sent states are remembered to drop repeated deliveries (at-least-once).
SEEN_MAX = 4096
#: One SSE line (one event) may be at most this long.
MAX_LINE = 1 << 20
CURSOR_FILE_VERSION = 1
OPTIONS = frozenset(
    (
        "api_url",
        "token",
        "validate_certs",
        "ca_path",
        "timeout",
        "outpost",
        "phase",
        "cursor_file",
        "emit_listed",
        "queue_depth_interval",
        "backoff_initial",
        "backoff_max",
    )
)


class OptionError(ValueError):
    """An option of the source is wrong; raised before anything is sent."""


class FleetError(Exception):
    """A failed request. ``retry`` is false for answers that retrying cannot change (401, 403, 404)."""

    def __init__(self, operation: str, detail: str, status: Optional[int] = None) -> None:
        prefix = f"{status} " if status is not None else ""
        super().__init__(f"Could not {operation}: {prefix}{detail}")
        self.status = status
        self.retry = status is None or status == 429 or status >= 500


class CursorRejected(FleetError):
    """The API refused the cursor (400/422): list again and watch from the new cursor."""


# --- options -----------------------------------------------------------------------------------------------


def _bool(args: dict[str, Any], name: str, default: bool) -> bool:
    value = args.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise OptionError(f"{name} must be true or false, got {value!r}")


def _number(args: dict[str, Any], name: str, default: float, minimum: float) -> float:
    value = args.get(name)
    if value is None:
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise OptionError(f"{name} must be a number, got {value!r}") from None
    if not number >= minimum or number == float("inf"):
        raise OptionError(f"{name} must be a number of at least {minimum:g}, got {value!r}")
    return number


def normalize_api_url(url: str) -> str:
    text = url.strip().rstrip("/")
    if not text.startswith(("http://", "https://")):
        raise OptionError(f"api_url must start with https:// or http://, got {url!r}")
    for suffix in ("/opbeta/outposts", "/opbeta"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return text


class Options:
    """The source's validated options (:func:`parse_options`)."""

    def __init__(self, args: dict[str, Any], environ: Optional[dict[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        unknown = sorted(k for k in args if k not in OPTIONS and not k.startswith("eda_"))
        if unknown:
            raise OptionError(
                f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(sorted(OPTIONS))}"
            )
        self.api_url = normalize_api_url(
            str(args.get("api_url") or env.get("DEVIN_API_URL") or DEFAULT_API_URL)
        )
        token = args.get("token") or env.get("DEVIN_OUTPOSTS_TOKEN") or ""
        if not isinstance(token, str) or not token.strip():
            raise OptionError(
                "no token: set the token option or the DEVIN_OUTPOSTS_TOKEN environment variable"
            )
        if any(c.isspace() for c in token.strip()) or not token.isprintable():
            raise OptionError("the token holds whitespace or control characters; check how it was pasted")
        self.token = token.strip()
        self.validate_certs = _bool(args, "validate_certs", True)
        self._ssl: Any = None
        self.ca_path: Optional[str] = None
        if args.get("ca_path"):
            self.ca_path = os.path.expanduser(str(args["ca_path"]))
            if not os.path.isfile(self.ca_path) or not os.access(self.ca_path, os.R_OK):
                raise OptionError(f"ca_path {self.ca_path} is not a readable file")
        self.timeout = _number(args, "timeout", DEFAULT_TIMEOUT, 0.1)
        self.outpost: Optional[str] = None
        if args.get("outpost") is not None:
            outpost = str(args["outpost"]).strip()
            if not outpost.startswith(OUTPOST_ID_PREFIX) and not OUTPOST_NAME.match(outpost):
                raise OptionError(
                    f"outpost must be an outpost id ({OUTPOST_ID_PREFIX}...) or a name of 1 to 63 letters, "
                    f"digits, '.', '_' or '-', got {args['outpost']!r}"
                )
            self.outpost = outpost
        phases = args.get("phase")
        if phases is None:
            self.phases: Optional[frozenset[str]] = None
        else:
            listed = [phases] if isinstance(phases, str) else phases
            if not isinstance(listed, (list, tuple)) or not listed:
                raise OptionError(
                    f"phase must be one of {', '.join(PHASES)} or a list of them, got {phases!r}"
                )
            bad = [p for p in listed if p not in PHASES]
            if bad:
                raise OptionError(f"phase must be one of {', '.join(PHASES)}, got {bad[0]!r}")
            self.phases = frozenset(listed)
        self.cursor_file = os.path.expanduser(str(args["cursor_file"])) if args.get("cursor_file") else None
        if self.cursor_file and os.path.isdir(self.cursor_file):
            raise OptionError(f"cursor_file {self.cursor_file} is a directory; name a file")
        self.emit_listed = _bool(args, "emit_listed", True)
        interval = _number(args, "queue_depth_interval", 60.0, 0.0)
        if 0 < interval < 1:
            raise OptionError(f"queue_depth_interval must be 0 (off) or at least 1 second, got {interval:g}")
        self.queue_depth_interval = interval
        self.backoff_initial = _number(args, "backoff_initial", 1.0, 0.01)
        self.backoff_max = _number(args, "backoff_max", 60.0, 0.01)
        if self.backoff_max < self.backoff_initial:
            raise OptionError(
                f"backoff_max ({self.backoff_max:g}) must not be smaller than "
                f"backoff_initial ({self.backoff_initial:g})"
            )

    def __repr__(self) -> str:  # never show the token
        return f"Options(api_url={self.api_url!r}, outpost={self.outpost!r}, phases={self.phases!r})"

    def ssl_context(self) -> Any:
        """What aiohttp's ``ssl`` argument takes: False (no verification) or a context, made once."""
        if not self.validate_certs:
            return False
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cafile=self.ca_path)
        return self._ssl


# --- the cursor file ---------------------------------------------------------------------------------------


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
    if not isinstance(data, dict) or data.get("version") != CURSOR_FILE_VERSION:
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
    return (cursor if isinstance(cursor, str) and cursor else None), seen[-SEEN_MAX:]


def save_state(path: str, api_url: str, outpost_id: Optional[str], cursor: Optional[str], seen: Seen) -> None:
    """Write the cursor file atomically (a 0600 temporary file in the same folder, fsynced, renamed)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o700, exist_ok=True)
    body = json.dumps(
        {
            "version": CURSOR_FILE_VERSION,
            "api_url": api_url,
            "outpost_id": outpost_id,
            "cursor": cursor,
            "seen": [list(item) for item in seen[-SEEN_MAX:]],
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


# --- events ------------------------------------------------------------------------------------------------


def fingerprint(entry: dict[str, Any], deleted: bool) -> str:
    """One state of one row: a repeated delivery of the same state has the same fingerprint (the cursor is
    left out: a replay after a reconnect may carry another cursor for the same state)."""
    text = json.dumps([deleted, entry], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _section(entry: dict[str, Any], name: str) -> dict[str, Any]:
    value = entry.get(name)
    return value if isinstance(value, dict) else {}


def change_event(kind: str, entry: dict[str, Any], cursor: Optional[str]) -> dict[str, Any]:
    """The event of one queue change (``kind``: MODIFIED, DELETED or LISTED)."""
    entry = dict(entry)
    status = dict(_section(entry, "status"))
    for secret in ("connect_token",):  # only claim answers carry it; never pass one on
        status.pop(secret, None)
    entry["status"] = status
    meta, spec = _section(entry, "metadata"), _section(entry, "spec")
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


# --- the source --------------------------------------------------------------------------------------------


class QueueSource:
    """List-then-watch with reconnects, the cursor file, and the queue_depth timer."""

    def __init__(self, options: Options, queue: Any, clock: Any = time.time) -> None:
        self.options = options
        self.queue = queue
        self.clock = clock
        self.outpost_id: Optional[str] = None
        #: outpost id -> name, of the outposts the queue_depth events are about.
        self.outposts: dict[str, str] = {}
        #: session id -> the latest copy of its row (every phase): the picture queue_depth is computed from.
        self.entries: dict[str, dict[str, Any]] = {}
        #: outpost id -> when (clock) it last had a session waiting, or when the source started.
        self.busy_at: dict[str, float] = {}
        self.started = clock()
        self.cursor: Optional[str] = None
        #: session id -> fingerprint of the last state sent (or filtered out), least recently changed first.
        self.seen: OrderedDict[str, str] = OrderedDict()
        self.need_list = True
        #: Watch events handled so far: a stream that carried one was healthy, even if it then broke.
        self.handled = 0
        self.http: Optional[aiohttp.ClientSession] = None

    # --- HTTP ---

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.options.token}", "Accept": "application/json"}

    def _redact(self, text: str) -> str:
        return text.replace(self.options.token, "***")

    async def _get_json(self, path: str, params: dict[str, Any], operation: str) -> Any:
        assert self.http is not None
        url = self.options.api_url + path
        query = {k: str(v) for k, v in params.items() if v is not None}
        try:
            async with self.http.get(
                url,
                params=query,
                headers=self._headers(),
                ssl=self.options.ssl_context(),
                timeout=aiohttp.ClientTimeout(total=self.options.timeout),
            ) as response:
                body = await response.content.read(8 << 20)
                if response.status >= 400:
                    raise self._error(operation, response.status, body, FleetError)
                return json.loads(body)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise FleetError(operation, self._redact(f"{type(exc).__name__}: {exc}")) from None

    def _error(self, operation: str, status: int, body: bytes, kind: type[FleetError]) -> FleetError:
        try:
            detail = json.loads(body).get("detail")
        except (ValueError, AttributeError):
            detail = None
        text = self._redact(str(detail if detail is not None else body[:200].decode("utf-8", "replace")))
        return kind(operation, text, status)

    async def resolve_outpost(self) -> None:
        """Turn the outpost option (a name or an id) into the id, through the outposts list."""
        outposts = await self.list_outposts()
        wanted = self.options.outpost
        if wanted is None:
            self.outposts = outposts
            return
        for oid, name in outposts.items():
            if wanted in (oid, name):
                self.outpost_id = oid
                self.outposts = {oid: name}
                return
        raise OptionError(f"outpost {wanted} is not among the account's {len(outposts)} outposts")

    async def list_outposts(self) -> dict[str, str]:
        found: dict[str, str] = {}
        after: Optional[str] = None
        while True:
            page = await self._get_json(
                OUTPOSTS_PATH, {"first": MAX_PAGE_SIZE, "after": after}, "list outposts"
            )
            for item in page.get("items") or []:
                found[_section(item, "metadata").get("outpost_id", "")] = _section(item, "spec").get(
                    "name", ""
                )
            if not page.get("has_next_page") or not page.get("end_cursor") or page.get("end_cursor") == after:
                return found
            after = page["end_cursor"]

    async def list_queue(self) -> tuple[list[dict[str, Any]], Optional[str]]:
        """Every entry (all phases), upserted by session id across pages, and the final cursor."""
        entries: dict[str, dict[str, Any]] = {}
        cursor: Optional[str] = None
        operation = f"list sessions{f' on outpost {self.outpost_id}' if self.outpost_id else ''}"
        while True:
            params = {"outpost": self.outpost_id, "first": MAX_PAGE_SIZE, "cursor": cursor}
            page = await self._get_json(QUEUE_PATH, params, operation)
            for item in page.get("items") or []:
                sid = str(_section(item, "metadata").get("session_id"))
                entries.pop(sid, None)
                entries[sid] = item
            nxt = page.get("cursor") or cursor
            if not page.get("has_next_page"):
                return list(entries.values()), nxt
            if nxt == cursor:
                raise FleetError(operation, "the API reported another page but did not advance the cursor")
            cursor = nxt

    async def watch(self) -> int:
        """One watch stream from the cursor; handles its events and returns how many it carried."""
        assert self.http is not None
        operation = f"watch sessions{f' on outpost {self.outpost_id}' if self.outpost_id else ''}"
        params = {"watch": "true", "outpost": self.outpost_id, "cursor": self.cursor}
        query = {k: v for k, v in params.items() if v is not None}
        headers = dict(self._headers(), Accept="text/event-stream")
        timeout = aiohttp.ClientTimeout(
            total=None, connect=self.options.timeout, sock_read=4 * self.options.timeout
        )
        count = 0
        try:
            async with self.http.get(
                self.options.api_url + QUEUE_PATH,
                params=query,
                headers=headers,
                ssl=self.options.ssl_context(),
                timeout=timeout,
            ) as response:
                if response.status >= 400:
                    # 400/422 to a watch: the API refuses the cursor (too old, or not one of its own).
                    kind = CursorRejected if response.status in (400, 422) else FleetError
                    raise self._error(operation, response.status, await response.content.read(1 << 16), kind)
                data: list[str] = []
                while True:
                    raw = await response.content.readline()
                    if not raw:
                        break
                    if len(raw) > MAX_LINE:
                        raise FleetError(operation, f"a watch line is longer than {MAX_LINE} bytes")
                    line = raw.decode("utf-8", "replace").rstrip("\r\n")
                    if line == "":
                        if data:
                            await self.handle("\n".join(data), operation)
                            count += 1
                            data = []
                    elif line.startswith("data:"):
                        value = line[5:]
                        data.append(value[1:] if value.startswith(" ") else value)
                    # comments (": keepalive") and other fields are skipped
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise FleetError(operation, self._redact(f"{type(exc).__name__}: {exc}")) from None
        return count

    # --- events ---

    async def handle(self, data: str, operation: str) -> None:
        try:
            event = json.loads(data)
            entry = event["object"]
            sid = entry["metadata"]["session_id"]
        except (ValueError, KeyError, TypeError):
            raise CursorRejected(operation, f"malformed watch event: {data[:200]!r}") from None
        self.handled += 1
        kind = str(event.get("type") or "MODIFIED")
        deleted = kind == "DELETED"
        if deleted:
            self.entries.pop(sid, None)
        else:
            self.entries[sid] = entry
            self._mark_busy([entry])
        await self.emit(kind, entry, deleted, event.get("cursor") or self.cursor)

    async def emit(self, kind: str, entry: dict[str, Any], deleted: bool, cursor: Optional[str]) -> None:
        """Send one change (unless it repeats a state already sent or the phase filter drops it), then
        store the cursor. A crash between the two repeats the event once: delivery is at least once."""
        sid = str(_section(entry, "metadata").get("session_id"))
        mark = fingerprint(entry, deleted)
        if self.seen.get(sid) != mark:
            phase = _section(entry, "status").get("phase")
            if self.options.phases is None or phase in self.options.phases:
                await self.queue.put(change_event(kind, entry, cursor))
            self.seen.pop(sid, None)
            self.seen[sid] = mark
            while len(self.seen) > SEEN_MAX:
                self.seen.popitem(last=False)
        if cursor is not None:
            self.cursor = cursor
        self.save()

    def save(self) -> None:
        if self.options.cursor_file:
            save_state(
                self.options.cursor_file,
                self.options.api_url,
                self.outpost_id,
                self.cursor,
                list(self.seen.items()),
            )

    async def relist(self, resume: Optional[str]) -> None:
        """List the queue (the picture). Without ``resume`` (a stored cursor), send LISTED events (unless
        emit_listed is off) and watch from the list's cursor; with it, watch from ``resume``: the watch
        replays every change since, so nothing made while the source was down is lost."""
        entries, cursor = await self.list_queue()
        self.entries = {_section(e, "metadata").get("session_id", ""): e for e in entries}
        self._mark_busy(entries)
        if resume is not None:
            self.cursor = resume
        else:
            for entry in entries:
                if self.options.emit_listed:
                    await self.emit("LISTED", entry, False, cursor)
            self.cursor = cursor if cursor is not None else self.cursor
            self.save()
        self.need_list = False

    # --- queue depth ---

    def _mark_busy(self, entries: Any) -> None:
        now = self.clock()
        for entry in entries:
            if self._waiting(entry):
                self.busy_at[_section(entry, "metadata").get("outpost_id", "")] = now

    @staticmethod
    def _waiting(entry: dict[str, Any]) -> bool:
        status = _section(entry, "status")
        return status.get("phase") == "pending" and status.get("session_status") not in ENDED

    def depth(self, outpost_id: str, name: str) -> dict[str, Any]:
        now = self.clock()
        mine = [e for e in self.entries.values() if _section(e, "metadata").get("outpost_id") == outpost_id]
        waiting = sorted(
            (e for e in mine if self._waiting(e)),
            key=lambda e: (
                _section(e, "metadata").get("created_at") or 0,
                _section(e, "metadata").get("session_id"),
            ),
        )
        claimed = [e for e in mine if _section(e, "status").get("phase") == "claimed"]
        oldest = waiting[0] if waiting else None
        created = _section(oldest, "metadata").get("created_at") if oldest else None
        busy = self.busy_at.get(outpost_id, self.started) if not waiting else now
        return {
            EVENT_KEY: {
                "type": "queue_depth",
                "outpost_id": outpost_id,
                "outpost_name": name,
                "pending": len(waiting),
                "claimed": len(claimed),
                "oldest_pending_session_id": _section(oldest, "metadata").get("session_id")
                if oldest
                else None,
                "oldest_wait_seconds": round(max(0.0, now - float(created)), 1)
                if created is not None
                else 0.0,
                "idle_seconds": round(max(0.0, now - busy), 1),
                "time": round(now, 3),
            }
        }

    async def depth_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.queue_depth_interval)
            if self.need_list:
                continue  # the picture is not current yet (the API is unreachable): say nothing rather than 0
            if self.outpost_id is None:
                try:
                    self.outposts = await self.list_outposts()
                except FleetError as exc:
                    log.warning("%s; queue_depth uses the outposts known so far", exc)
            self._mark_busy(self.entries.values())
            for oid, name in sorted(self.outposts.items()):
                await self.queue.put(self.depth(oid, name))

    # --- the loop ---

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=4)
        # read_bufsize: aiohttp refuses a line longer than twice this, so one event may be up to 1 MiB.
        async with aiohttp.ClientSession(
            connector=connector, trust_env=True, read_bufsize=MAX_LINE // 2
        ) as http:
            self.http = http
            await self._retrying(self.resolve_outpost)
            stored, seen = load_state(self.options.cursor_file, self.options.api_url, self.outpost_id)
            self.seen = OrderedDict(seen)
            if stored:
                log.info(
                    "Resuming the queue of %s from the stored cursor", self.outpost_id or "every outpost"
                )
            depth = None
            if self.options.queue_depth_interval > 0:
                depth = asyncio.ensure_future(self.depth_loop())
            try:
                await self.follow(stored)
            finally:
                if depth is not None:
                    depth.cancel()

    async def _retrying(self, step: Any) -> None:
        attempt = 0
        while True:
            try:
                await step()
                return
            except FleetError as exc:
                if not exc.retry:
                    raise
                delay = self.backoff(attempt)
                attempt += 1
                log.warning("%s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)

    def backoff(self, attempt: int) -> float:
        """Jittered exponential backoff: a random wait between half of ``backoff_initial`` and
        ``backoff_initial * 2**attempt``, capped at ``backoff_max``."""
        floor = self.options.backoff_initial / 2
        ceiling = min(self.options.backoff_max, self.options.backoff_initial * (2 ** min(attempt, 30)))
        return random.uniform(floor, max(ceiling, floor))  # noqa: S311 - spreading reconnects, not a secret

    async def follow(self, stored: Optional[str]) -> None:
        """List (to seed the picture, and for the first cursor), then watch, forever."""
        first = True
        attempt = 0
        quick_ends = 0
        while True:
            started = time.monotonic()
            handled = self.handled
            try:
                if self.need_list:
                    await self.relist(stored if first else None)
                    first = False
                started = time.monotonic()
                count = await self.watch()
                attempt = 0
                quick_ends = quick_ends + 1 if count == 0 and time.monotonic() - started < 1.0 else 0
                if quick_ends >= QUICK_ENDS_BEFORE_PAUSE:
                    await asyncio.sleep(1.0)
                continue  # a clean end: streams are bounded in time; reopen from the cursor at once
            except CursorRejected as exc:
                # Paced like an error: an API that keeps refusing must not be hammered with lists.
                delay = self.backoff(attempt)
                attempt += 1
                log.warning("%s; listing the queue again in %.1fs, then watching from its cursor", exc, delay)
                self.need_list = True
                first = False
                await asyncio.sleep(delay)
            except FleetError as exc:
                if not exc.retry:
                    raise
                if self.handled > handled or time.monotonic() - started >= HEALTHY_STREAM:
                    attempt = 0
                delay = self.backoff(attempt)
                attempt += 1
                log.warning("%s; reconnecting in %.1fs from the stored cursor", exc, delay)
                await asyncio.sleep(delay)


async def main(queue: Any, args: dict[str, Any]) -> None:
    """ansible-rulebook's entry point: follow the queue until cancelled (never returns on its own)."""
    options = Options(args)
    source = QueueSource(options, queue)
    await source.run()


if __name__ == "__main__":

    class PrintQueue:
        """Prints the events instead of handing them to a rulebook."""

        async def put(self, event: dict[str, Any]) -> None:
            print(json.dumps(event))

    logging.basicConfig(level=logging.INFO)
    asyncio.run(main(PrintQueue(), {}))
