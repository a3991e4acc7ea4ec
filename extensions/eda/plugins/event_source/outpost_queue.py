# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""devin.outposts.outpost_queue: an ansible-rulebook event source for a Devin Outposts session queue.

ansible-rulebook loads this file with ``runpy.run_path`` and calls ``main(queue, args)``. It runs outside
Ansible's collection loader, where ``import ansible_collections...`` fails, and in decision environments where
the worker package (``devin_outposts``) is not installed. What it shares with the other clients of the fleet
API it therefore loads from this collection's own files, by path (:func:`_collection_module`): the one reader
of the watch stream (``plugins/plugin_utils/_fleet_stream.py``) and the one backoff
(``plugins/plugin_utils/_fleet_backoff.py``), byte-identical copies of the worker package's
``devin_outposts/api/stream.py`` and ``api/backoff.py``. Its requests follow the same contract as the other
two clients (``python/contract/cases.yaml``, run by ``tests/eda/test_contract.py``). docs/eda.md is the user
guide; its section "What the source shares" says what was tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import importlib.util
import json
import logging
import math
import os
import random
import re
import ssl
import tempfile
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, Callable, Optional

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
    at once from the last cursor. An error is logged in one line and retried after a random wait between
    half and all of a ceiling that starts at O(backoff_initial), doubles after each further error, and never
    passes O(backoff_max) seconds. After a connection error, HTTP 429 or 5xx the watch resumes from the last
    cursor. After any other answer (a 404, a cursor refused with 400 or 422), and after any reply that is not
    what the API sends (not JSON, larger than the caps, nested too deeply, of the wrong shape), the queue is
    listed again first. A malformed entry in a list is skipped with one log line.
  - Before that, a list request that met a connection error, HTTP 429 or 5xx is sent again up to three times,
    after a random wait between half and all of 0.5, 1 and 2 seconds, or after what the answer's
    C(Retry-After) asks (at most 60 seconds), as the collection's modules and the worker do.
  - A token the API refuses (HTTP 401 or 403) stops the source with an error, since retrying cannot fix it.
    So does a redirect (HTTP 3xx), which is never followed (the token would go wherever it points); it means
    that O(api_url) is not the API's base URL.
  - Needs the collection installed whole, as C(ansible-galaxy collection install) installs it. The source
    reads the watch stream and computes its waits with the collection's
    C(plugins/plugin_utils/_fleet_stream.py) and C(_fleet_backoff.py), the same code as the worker's.
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
    description:
      - The longest backoff, in seconds. The default is the worker's for its watch, so a recovered API is
        noticed within a few seconds; raise it only to spare an API that many sources follow.
    type: float
    default: 5
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


def _collection_module(name: str) -> Any:
    """``plugins/plugin_utils/<name>.py`` of the collection this file belongs to, loaded from its file.

    ansible-rulebook runs this file from the installed collection (``ansible_collections/devin/outposts/
    extensions/eda/plugins/event_source/``), so the module is four folders up and down again. It is loaded
    under a private name, without touching ``sys.path`` or ``sys.modules`` of the rulebook's process.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.normpath(os.path.join(here, *[os.pardir] * 4, "plugins", "plugin_utils", f"{name}.py"))
    spec = importlib.util.spec_from_file_location(f"devin_outposts_outpost_queue.{name}", path)
    if spec is None or spec.loader is None or not os.path.isfile(path):
        raise ImportError(
            f"devin.outposts.outpost_queue needs the devin.outposts collection installed whole: {path} is "
            "missing (run the source from the installed collection, not a copy of this one file)"
        )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_stream = _collection_module("_fleet_stream")
_backoff = _collection_module("_fleet_backoff")
#: The fleet API's one SSE reader and one backoff (their cases: python/contract/stream.yaml).
EventStreamReader = _stream.EventStreamReader
EventStreamTooLarge = _stream.EventStreamTooLarge
backoff_delay = _backoff.backoff_delay

# The values of plugins/module_utils/_fleet_api.py and of the worker: python/contract/cases.yaml pins them.
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
#: One reply to a list may be at most this long (a page of 200 entries is far smaller).
MAX_BODY = 8 << 20
#: Of an error answer, this much is read for its detail.
MAX_ERROR_BODY = 1 << 16
#: A reply nested deeper than this (objects and arrays) is refused; a queue entry is about 4 deep.
MAX_NESTING = 32
#: Bytes asked of the connection per read.
READ_SIZE = 1 << 16
#: The default of backoff_max: the worker's cap for watch reconnects (FEED_BACKOFF_CAP).
DEFAULT_BACKOFF_MAX = 5.0
#: A list request is retried this often after a connection error, 429 or 5xx, waiting the one backoff from
#: REQUEST_BACKOFF_BASE to REQUEST_BACKOFF_MAX seconds, or what Retry-After says (at most MAX_RETRY_AFTER), as
#: the other clients do (python/contract/cases.yaml); only then does the error reach the loop and its backoff.
REQUEST_RETRIES = 3
REQUEST_BACKOFF_BASE = 0.5
REQUEST_BACKOFF_MAX = 8.0
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 60.0
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
    """A failed request. ``retry`` is false only for a refused token (401, 403): retrying cannot change it.
    ``relist`` is true when the picture of the queue is in doubt, so it is listed again before the next watch:
    every answer but an outage's (a connection error, 429 or 5xx)."""

    def __init__(self, operation: str, detail: str, status: Optional[int] = None) -> None:
        prefix = f"{status} " if status is not None else ""
        super().__init__(f"Could not {operation}: {prefix}{detail}")
        self.status = status
        self.retry = status not in (401, 403)
        self.relist = status is not None and status != 429 and status < 500
        #: Seconds the answer's Retry-After asked for (429, 5xx), at most MAX_RETRY_AFTER; else None.
        self.retry_after: Optional[float] = None

    @property
    def outage(self) -> bool:
        """A connection error, 429 or 5xx: the request itself is worth repeating (REQUEST_RETRIES)."""
        return self.status in RETRY_STATUSES or (self.status is None and not isinstance(self, MalformedReply))


class Redirected(FleetError):
    """A 3xx answer: never followed (the token would go wherever it points) and never retried, since it
    means api_url is not the API's base URL, which waiting does not fix. It stops the source, as a refused
    token does."""

    def __init__(self, operation: str, location: str, status: int) -> None:
        super().__init__(operation, f"redirected to {location}; set api_url to the API's base URL", status)
        self.retry = False


class CursorRejected(FleetError):
    """The API refused the cursor (400/422): list again and watch from the new cursor."""


class MalformedReply(FleetError):
    """A reply that is not what the API sends: not JSON, over a size cap, nested too deeply, or of the wrong
    shape. Every reply is decoded through :func:`decode_json`, so this is the only error decoding raises."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(operation, f"malformed reply: {detail}")
        self.relist = True


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
        # Not set, it follows a larger backoff_initial up rather than refusing it.
        default_max = max(DEFAULT_BACKOFF_MAX, self.backoff_initial)
        self.backoff_max = _number(args, "backoff_max", default_max, 0.01)
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


# --- decoding replies --------------------------------------------------------------------------------------
#
# Every reply is data from the network. It is decoded here and nowhere else; what does not decode raises
# MalformedReply, with a detail that quotes nothing of the reply but its shape.


def _short(value: Any) -> str:
    """A value from the network, fit for a log line: its repr, cut short (so no control characters)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_json(data: bytes | str, operation: str) -> Any:
    """The one way a reply becomes data: JSON (UTF-8), no NaN or Infinity, at most MAX_NESTING deep."""
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise MalformedReply(operation, "nested too deeply") from None
    except ValueError as exc:  # not JSON, not UTF-8, an integer too long to convert
        raise MalformedReply(operation, f"not JSON ({type(exc).__name__}: {exc})") from None
    if _too_deep(value):
        raise MalformedReply(operation, f"nested more than {MAX_NESTING} levels deep")
    return value


def decode_page(data: bytes, operation: str, cursor_key: str) -> tuple[list[Any], Optional[str], bool]:
    """A page of a list: its items (not yet checked one by one), its cursor and whether another follows."""
    page = decode_json(data, operation)
    if not isinstance(page, dict):
        raise MalformedReply(operation, f"a page is not an object but {type(page).__name__}")
    items, cursor, more = page.get("items"), page.get(cursor_key), page.get("has_next_page")
    if items is not None and not isinstance(items, list):
        raise MalformedReply(operation, f"items is not a list but {type(items).__name__}")
    if cursor is not None and not isinstance(cursor, str):
        raise MalformedReply(operation, f"{cursor_key} is not a string but {type(cursor).__name__}")
    if more is not None and not isinstance(more, bool):
        raise MalformedReply(operation, f"has_next_page is not true or false but {_short(more)}")
    return items or [], cursor or None, bool(more)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def entry_problem(item: Any) -> Optional[str]:
    """Why ``item`` is not a queue entry this source can use (docs/fleet-api.md §3.1), or None."""
    if not isinstance(item, dict):
        return f"an entry is not an object but {type(item).__name__}"
    meta = item.get("metadata")
    if not isinstance(meta, dict):
        return f"an entry's metadata is not an object but {type(meta).__name__}"
    sid = meta.get("session_id")
    if not isinstance(sid, str) or not sid:
        return f"session_id {_short(sid)} is not a non-empty string"
    for section in ("spec", "status"):
        if item.get(section) is not None and not isinstance(item[section], dict):
            return f"session {_short(sid)}: {section} is not an object"
    if meta.get("outpost_id") is not None and not isinstance(meta["outpost_id"], str):
        return f"session {_short(sid)}: outpost_id {_short(meta['outpost_id'])} is not a string"
    for key in ("created_at", "updated_at"):
        if meta.get(key) is not None and not _finite(meta[key]):
            return f"session {_short(sid)}: {key} {_short(meta[key])} is not a finite number"
    return None


def outpost_problem(item: Any) -> Optional[str]:
    """Why ``item`` is not an outpost of the outposts list, or None."""
    if not isinstance(item, dict) or not isinstance(item.get("metadata"), dict):
        return "an outpost or its metadata is not an object"
    oid, name = item["metadata"].get("outpost_id"), _section(item, "spec").get("name", "")
    if not isinstance(oid, str) or not oid:
        return f"outpost_id {_short(oid)} is not a non-empty string"
    if not isinstance(name, str):
        return f"outpost {_short(oid)}: name {_short(name)} is not a string"
    return None


def decode_event(data: str, operation: str) -> tuple[str, dict[str, Any], Optional[str]]:
    """One watch event: its type, its entry and its cursor."""
    event = decode_json(data, operation)
    if not isinstance(event, dict):
        raise MalformedReply(operation, f"a watch event is not an object but {type(event).__name__}")
    kind, entry, cursor = event.get("type") or "MODIFIED", event.get("object"), event.get("cursor")
    problem = entry_problem(entry)
    if problem is not None or not isinstance(entry, dict):
        raise MalformedReply(operation, f"a watch event's entry: {problem}")
    if not isinstance(kind, str):
        raise MalformedReply(operation, f"a watch event's type {_short(kind)} is not a string")
    if cursor is not None and not isinstance(cursor, str):
        raise MalformedReply(operation, f"a watch event's cursor is not a string but {type(cursor).__name__}")
    return kind, entry, cursor or None


def _validation_error(item: Any) -> str:
    """One FastAPI validation error as ``loc.path: msg``."""
    if not isinstance(item, dict):
        return str(item)
    message = str(item.get("msg", json.dumps(item)))
    loc = item.get("loc")
    return ".".join(str(part) for part in loc) + ": " + message if isinstance(loc, list) and loc else message


def error_detail(body: bytes) -> str:
    """What an error answer says, printable and short, as the other clients say it: its ``detail`` (a list of
    validation errors as ``loc.path: msg; ...``, an object as JSON), else the start of its body."""
    try:
        reply = decode_json(body, "read an error answer")
        detail = reply.get("detail") if isinstance(reply, dict) else None
    except MalformedReply:
        detail = None
    if isinstance(detail, list):
        text = "; ".join(_validation_error(item) for item in detail)[:300]
    elif detail is not None:
        text = detail if isinstance(detail, str) else json.dumps(detail)[:300]
    else:
        text = body[:200].decode("utf-8", "replace").strip()
    return "".join(c if c.isprintable() else "?" for c in text[:300])


def retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), at most MAX_RETRY_AFTER,
    never below 0; None when there is none or it cannot be read."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    if math.isnan(seconds):
        return None
    return max(0.0, min(seconds, MAX_RETRY_AFTER))


def check_page_size(size: int) -> None:
    if not 1 <= size <= MAX_PAGE_SIZE:
        raise ValueError(f"page size must be between 1 and {MAX_PAGE_SIZE}, got {size}")


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

    def __init__(
        self,
        options: Options,
        queue: Any,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.options = options
        self.queue = queue
        self.clock = clock
        #: How the source waits between attempts (a test gives its own, to see the waits asked for).
        self.sleep = sleep
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

    async def _get_page(
        self, path: str, params: dict[str, Any], operation: str, cursor_key: str
    ) -> tuple[list[Any], Optional[str], bool]:
        """One page of a list, decoded. After a connection error, 429 or 5xx the request is sent again, up to
        REQUEST_RETRIES times, after the one backoff or what Retry-After asks, as every client of the API
        does."""
        attempt = 0
        while True:
            try:
                body = await self._get(path, params, operation)
            except FleetError as exc:
                if not exc.outage or attempt >= REQUEST_RETRIES:
                    raise
                delay = exc.retry_after
                if delay is None:
                    draw = random.random()  # noqa: S311 - spreading retries, not a secret
                    delay = backoff_delay(attempt, REQUEST_BACKOFF_BASE, REQUEST_BACKOFF_MAX, draw)
                attempt += 1
                log.debug("%s; sending it again in %.2fs", exc, delay)
                await self.sleep(delay)
                continue
            return decode_page(body, operation, cursor_key)

    async def _get(self, path: str, params: dict[str, Any], operation: str) -> bytes:
        """One GET of a list: the whole body (however many reads it takes, at most MAX_BODY)."""
        assert self.http is not None
        query = {k: str(v) for k, v in params.items() if v is not None}
        try:
            async with self.http.get(
                self.options.api_url + path,
                params=query,
                headers=self._headers(),
                ssl=self.options.ssl_context(),
                timeout=aiohttp.ClientTimeout(total=self.options.timeout),
                allow_redirects=False,
            ) as response:
                if response.status >= 300:
                    raise await self._error(operation, response, FleetError)
                return await self._read(response, operation)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise FleetError(operation, self._redact(f"{type(exc).__name__}: {exc}")) from None

    @staticmethod
    async def _read(response: aiohttp.ClientResponse, operation: str, limit: int = MAX_BODY) -> bytes:
        """The body to its end. ``read(n)`` returns what has arrived so far, so it is called until EOF."""
        body = bytearray()
        while True:
            chunk = await response.content.read(READ_SIZE)
            if not chunk:
                return bytes(body)
            body += chunk
            if len(body) > limit:
                raise MalformedReply(operation, f"the body is larger than {limit} bytes")

    async def _error(
        self, operation: str, response: aiohttp.ClientResponse, kind: type[FleetError]
    ) -> FleetError:
        """The error of an answer >= 300: a redirect (never followed), or one with the API's ``detail`` (or
        the body's start) in its message and what its Retry-After asks."""
        if response.status < 400:
            location = self._redact(response.headers.get("Location") or "another URL")
            return Redirected(operation, location, response.status)
        try:
            text = error_detail(await self._read(response, operation, MAX_ERROR_BODY))
        except MalformedReply:  # larger than MAX_ERROR_BODY
            text = ""
        error = kind(operation, self._redact(text or response.reason or ""), response.status)
        if response.status in RETRY_STATUSES:
            error.retry_after = retry_after(response.headers.get("Retry-After"))
        return error

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

    def _usable(
        self, items: list[Any], operation: str, check: Callable[[Any], Optional[str]], nouns: tuple[str, str]
    ) -> list[Any]:
        """The items that pass ``check``; the others are skipped with one log line for the page."""
        problems = [(item, check(item)) for item in items]
        skipped = [problem for dummy, problem in problems if problem is not None]
        if skipped:
            log.warning(
                "Skipped %d malformed %s in the reply to %s; the first: %s",
                len(skipped),
                nouns[len(skipped) != 1],
                operation,
                self._redact(skipped[0]),
            )
        return [item for item, problem in problems if problem is None]

    async def list_outposts(self, page_size: int = MAX_PAGE_SIZE) -> dict[str, str]:
        """Every outpost of the account: id -> name."""
        check_page_size(page_size)
        found: dict[str, str] = {}
        after: Optional[str] = None
        operation = "list outposts"
        while True:
            params = {"first": page_size, "after": after}
            items, end_cursor, more = await self._get_page(OUTPOSTS_PATH, params, operation, "end_cursor")
            for item in self._usable(items, operation, outpost_problem, ("outpost", "outposts")):
                found[item["metadata"]["outpost_id"]] = _section(item, "spec").get("name", "")
            if not more:
                return found
            if not end_cursor or end_cursor == after:
                raise FleetError(operation, "the API reported another page but did not advance end_cursor")
            after = end_cursor

    async def list_queue(self) -> tuple[list[dict[str, Any]], Optional[str]]:
        """Every entry of the followed outpost(s) in every phase, and the final cursor: the watch's start."""
        return await self.list_sessions(outpost=self.outpost_id)

    async def list_sessions(
        self,
        *,
        outpost: Optional[str] = None,
        phase: Optional[str] = None,
        acceptor_id: Optional[str] = None,
        page_size: int = MAX_PAGE_SIZE,
        cursor: Optional[str] = None,
    ) -> tuple[list[dict[str, Any]], Optional[str]]:
        """Every matching entry, upserted by session id across pages (a page boundary repeats rows), and the
        final cursor."""
        check_page_size(page_size)
        entries: dict[str, dict[str, Any]] = {}
        operation = f"list sessions{f' on outpost {outpost}' if outpost else ''}"
        while True:
            params = {"outpost": outpost, "phase": phase, "acceptor_id": acceptor_id, "first": page_size}
            params["cursor"] = cursor
            items, page_cursor, more = await self._get_page(QUEUE_PATH, params, operation, "cursor")
            for item in self._usable(items, operation, entry_problem, ("queue entry", "queue entries")):
                sid = item["metadata"]["session_id"]
                entries.pop(sid, None)
                entries[sid] = item
            nxt = page_cursor or cursor
            if not more:
                return list(entries.values()), nxt
            if nxt == cursor:
                raise FleetError(operation, "the API reported another page but did not advance the cursor")
            cursor = nxt

    async def watch(self) -> int:
        """One watch stream from the cursor; handles its events and returns how many it carried."""
        assert self.http is not None
        operation = f"watch sessions{f' on outpost {self.outpost_id}' if self.outpost_id else ''}"
        query = _stream.watch_params(self.outpost_id, self.cursor)
        headers = dict(self._headers(), Accept=_stream.EVENT_STREAM)
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
                allow_redirects=False,
            ) as response:
                if response.status >= 300:
                    # 400/422 to a watch: the API refuses the cursor (too old, or not one of its own).
                    kind = CursorRejected if response.status in (400, 422) else FleetError
                    raise await self._error(operation, response, kind)
                reader = EventStreamReader()
                while True:
                    chunk = await response.content.read(READ_SIZE)
                    if not chunk:
                        break  # an event the stream ended inside is dropped: the reconnect replays it
                    for event in reader.feed(chunk):
                        await self.handle(*decode_event(event.data, operation))
                        count += 1
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise FleetError(operation, self._redact(f"{type(exc).__name__}: {exc}")) from None
        except EventStreamTooLarge as exc:
            raise MalformedReply(operation, str(exc)) from None
        return count

    # --- events ---

    async def handle(self, kind: str, entry: dict[str, Any], cursor: Optional[str]) -> None:
        """One decoded watch event (:func:`decode_event`)."""
        self.handled += 1
        sid = entry["metadata"]["session_id"]
        deleted = kind == "DELETED"
        if deleted:
            self.entries.pop(sid, None)
        else:
            self.entries[sid] = entry
            self._mark_busy([entry])
        await self.emit(kind, entry, deleted, cursor or self.cursor)

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
        self.entries = {e["metadata"]["session_id"]: e for e in entries}
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
        async with aiohttp.ClientSession(connector=connector, trust_env=True) as http:
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
                depth.add_done_callback(_report_stop)
            try:
                await self.follow(stored)
            finally:
                if depth is not None:
                    depth.cancel()

    async def _retrying(self, step: Callable[[], Awaitable[None]]) -> None:
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
                await self.sleep(delay)

    def backoff(self, attempt: int) -> float:
        """The one backoff (``_fleet_backoff.py``): attempt *n* waits a random time between half of ``d`` and
        ``d``, where ``d = min(backoff_max, backoff_initial * 2**n)``."""
        draw = random.random()  # noqa: S311 - spreading reconnects, not a secret
        delay: float = backoff_delay(attempt, self.options.backoff_initial, self.options.backoff_max, draw)
        return delay

    async def follow(self, stored: Optional[str]) -> None:
        """List (to seed the picture, and for the first cursor), then watch, forever. A failure waits
        :meth:`backoff`; one that puts the picture in doubt (``FleetError.relist``) lists again first."""
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
            except FleetError as exc:
                if not exc.retry:
                    raise
                if exc.relist:
                    self.need_list = True
                elif self.handled > handled or time.monotonic() - started >= HEALTHY_STREAM:
                    attempt = 0  # a healthy stream broke: an outage starts the backoff afresh
                delay = self.backoff(attempt)
                attempt += 1
                if self.need_list:
                    log.warning(
                        "%s; listing the queue again in %.1fs, then watching from its cursor", exc, delay
                    )
                else:
                    log.warning("%s; reconnecting in %.1fs from the stored cursor", exc, delay)
                await self.sleep(delay)
                continue
            # A clean end: streams are bounded in time; reopen from the cursor at once.
            attempt = 0
            quick_ends = quick_ends + 1 if count == 0 and time.monotonic() - started < 1.0 else 0
            if quick_ends >= QUICK_ENDS_BEFORE_PAUSE:
                await self.sleep(1.0)


def _report_stop(task: asyncio.Future[None]) -> None:
    """The queue_depth loop ends only when cancelled; say so if it ever fails, rather than stop silently."""
    if not task.cancelled() and task.exception() is not None:
        log.error("queue_depth events stopped: %r", task.exception())


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
