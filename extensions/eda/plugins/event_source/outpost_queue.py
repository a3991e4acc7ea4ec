# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""devin.outposts.outpost_queue: an ansible-rulebook event source for a Devin Outposts session queue.

ansible-rulebook loads this file with ``runpy.run_path`` and calls ``main(queue, args)``. It runs outside
Ansible's collection loader, where ``import ansible_collections...`` fails, and in decision environments where
the worker package (``devin_outposts``) is not installed. It therefore loads the rest of itself from this
collection's own files, by path (:func:`_collection_module`), from ``plugins/plugin_utils/``:

* what it shares with the other clients of the fleet API, byte-identical copies of the worker package's
  ``devin_outposts/api/`` modules: the one reader of the watch stream (``_fleet_stream.py``), the one
  backoff (``_fleet_backoff.py``), the one list-then-watch bookkeeping (``_fleet_listwatch.py``: paging,
  when to list again, where to resume, when to wait) and the one decoder of compressed bodies
  (``_fleet_inflate.py``: aiohttp's own decompression is off, so a body is capped before it is inflated);
* its own parts: the options (``_outpost_queue_options.py``), the replies read within their caps and decoded
  (``_outpost_queue_replies.py``), the cursor file (``_outpost_queue_cursor.py``), and the events with the
  picture of the queue they come from (``_outpost_queue_events.py``).

This file holds what is left: the requests (aiohttp), the loop that follows the queue, and the queue_depth
timer. Its requests follow the same contract as the other two clients (``python/contract/cases.yaml``), and
its loop the same cases as the worker's (``python/contract/listwatch.yaml``), both run by
``tests/eda/test_outpost_queue_contract.py``. docs/eda.md is the user guide; its section "What the source
shares" says what was tried.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import random
import time
from collections.abc import Awaitable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Optional

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
  - Cancelled (ansible-rulebook stopping), it returns at once, whatever request is in flight.
  - A token the API refuses (HTTP 401 or 403) stops the source with an error, since retrying cannot fix it.
    So does a redirect (HTTP 3xx), which is never followed (the token would go wherever it points); it means
    that O(api_url) is not the API's base URL.
  - Needs the collection installed whole, as C(ansible-galaxy collection install) installs it. The source
    reads the watch stream, computes its waits and decides when to list again with the collection's
    C(plugins/plugin_utils/_fleet_stream.py), C(_fleet_backoff.py) and C(_fleet_listwatch.py), the same code
    as the worker's, and keeps its own parts in C(plugins/plugin_utils/_outpost_queue_*.py).
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
      - Seconds each list request may take in all, from connecting to the last byte of the answer, and the
        longest wait for the head of a watch's answer. An answer that drips a byte at a time is given up at
        this deadline like one that does not come.
      - A watch stream, meant to stay open, has no total deadline but an idle one. When it brings no event and
        no keepalive for four times this long, however many bytes come meanwhile, it is reconnected.
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


def _collection_module(name: str) -> ModuleType:
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


if TYPE_CHECKING:
    # mypy reads the same files from this repository (it runs from its root), so every name taken from them
    # keeps its type and the files are checked with this one; at run time they come from the collection.
    from plugins.plugin_utils import _fleet_backoff as _backoff
    from plugins.plugin_utils import _fleet_inflate as _inflate
    from plugins.plugin_utils import _fleet_listwatch as _listwatch
    from plugins.plugin_utils import _fleet_stream as _stream
    from plugins.plugin_utils import _outpost_queue_cursor as _cursor_file
    from plugins.plugin_utils import _outpost_queue_events as _events
    from plugins.plugin_utils import _outpost_queue_options as _options
    from plugins.plugin_utils import _outpost_queue_replies as _replies
else:
    _stream = _collection_module("_fleet_stream")
    _backoff = _collection_module("_fleet_backoff")
    _inflate = _collection_module("_fleet_inflate")
    _listwatch = _collection_module("_fleet_listwatch")
    _options = _collection_module("_outpost_queue_options")
    _replies = _collection_module("_outpost_queue_replies")
    _cursor_file = _collection_module("_outpost_queue_cursor")
    _events = _collection_module("_outpost_queue_events")

#: The fleet API's one SSE reader, one backoff and one list-then-watch (their cases: python/contract/).
EventStreamReader = _stream.EventStreamReader
EventStreamTooLarge = _stream.EventStreamTooLarge
backoff_delay = _backoff.backoff_delay
BodyDecoder = _inflate.BodyDecoder
Listing = _listwatch.Listing
ListWatch = _listwatch.ListWatch
#: The source's own names, where its users and its tests find them.
Options = _options.Options
OptionError = _options.OptionError
normalize_api_url = _options.normalize_api_url
PHASES = _options.PHASES
OUTPOST_ID_PREFIX = _options.OUTPOST_ID_PREFIX
OUTPOST_NAME = _options.OUTPOST_NAME
FleetError = _replies.FleetError
MalformedReply = _replies.MalformedReply
MAX_PAGE_SIZE = _replies.MAX_PAGE_SIZE

OUTPOSTS_PATH = "/opbeta/outposts/outposts"
QUEUE_PATH = "/opbeta/outposts/devins"
#: A list request is retried this often after a connection error, 429 or 5xx, waiting the one backoff from
#: REQUEST_BACKOFF_BASE to REQUEST_BACKOFF_MAX seconds, or what Retry-After says (at most 60 s), as the other
#: clients do (python/contract/cases.yaml); only then does the error reach the loop and its backoff.
REQUEST_RETRIES = 3
REQUEST_BACKOFF_BASE = 0.5
REQUEST_BACKOFF_MAX = 8.0

Entry = dict[str, Any]
Page = tuple[list[Any], Optional[str], bool]


class QueueSource:
    """The queue followed by list-then-watch (``_fleet_listwatch.ListWatch`` decides each step), with the
    cursor file and the queue_depth timer."""

    def __init__(
        self,
        options: _options.Options,
        queue: Any,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.options = options
        self.queue = queue
        #: How the source waits between attempts (a test gives its own, to see the waits asked for).
        self.sleep = sleep
        self.outpost_id: Optional[str] = None
        #: outpost id -> name, of the outposts the queue_depth events are about.
        self.outposts: dict[str, str] = {}
        #: Every entry of the followed outposts: what the queue_depth events are computed from.
        self.picture = _events.QueuePicture(clock)
        #: The last state sent per session (kept in the cursor file too).
        self.sent = _events.SentStates()
        #: When to list, where to watch from, how long to wait: the worker's rules, written once.
        self.listwatch = ListWatch(self.backoff)
        self.http: Optional[aiohttp.ClientSession] = None

    # --- HTTP ---

    def _headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.options.token}",
            "Accept": "application/json",
            "Accept-Encoding": _inflate.ACCEPT_ENCODING,  # what BodyDecoder decodes, within the caps
        }

    def _redact(self, text: str) -> str:
        return text.replace(self.options.token, "***")

    async def _answer_error(self, operation: str, response: aiohttp.ClientResponse) -> FleetError:
        return await _replies.answer_error(operation, response, FleetError, self._redact, BodyDecoder)

    async def _get_page(self, path: str, params: dict[str, Any], operation: str, cursor_key: str) -> Page:
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
            return _replies.decode_page(body, operation, cursor_key)

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
                    raise await self._answer_error(operation, response)
                return await _replies.read_body(response, operation, BodyDecoder)
        except aiohttp.ClientError as exc:
            raise FleetError(operation, self._redact(f"{type(exc).__name__}: {exc}")) from None
        except asyncio.TimeoutError:  # the request's total deadline: an answer too slow, maybe dripping
            raise FleetError(operation, f"no complete answer within {self.options.timeout:g}s") from None

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

    @staticmethod
    def _add_page(listing: Listing[Entry], items: list[Entry], key: str, page: Page, operation: str) -> bool:
        """The page's usable items into ``listing``, each by its ``metadata[key]`` (the one paging rule);
        True when another page is to be asked for."""
        try:
            return listing.add_page(((item["metadata"][key], item) for item in items), page[1], page[2])
        except _listwatch.PagingStalled as exc:
            raise FleetError(operation, str(exc)) from None

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

    async def list_outposts(self, page_size: int = MAX_PAGE_SIZE) -> dict[str, str]:
        """Every outpost of the account: id -> name."""
        _replies.check_page_size(page_size)
        listing: Listing[Entry] = Listing(cursor_key="end_cursor")
        operation = "list outposts"
        while True:
            params = {"first": page_size, "after": listing.cursor}
            page = await self._get_page(OUTPOSTS_PATH, params, operation, "end_cursor")
            usable = self._usable(page[0], operation, _replies.outpost_problem, ("outpost", "outposts"))
            if not self._add_page(listing, usable, "outpost_id", page, operation):
                rows = listing.rows
                return {o["metadata"]["outpost_id"]: _events.section(o, "spec").get("name", "") for o in rows}

    async def list_queue(self) -> tuple[list[Entry], Optional[str]]:
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
    ) -> tuple[list[Entry], Optional[str]]:
        """Every matching entry, upserted by session id across pages (a page boundary repeats rows), and the
        final cursor."""
        _replies.check_page_size(page_size)
        listing: Listing[Entry] = Listing(cursor)
        operation = f"list sessions{f' on outpost {outpost}' if outpost else ''}"
        while True:
            params = {"outpost": outpost, "phase": phase, "acceptor_id": acceptor_id, "first": page_size}
            params["cursor"] = listing.cursor
            page = await self._get_page(QUEUE_PATH, params, operation, "cursor")
            nouns = ("queue entry", "queue entries")
            usable = self._usable(page[0], operation, _replies.entry_problem, nouns)
            if not self._add_page(listing, usable, "session_id", page, operation):
                return listing.rows, listing.cursor

    async def watch(self) -> None:
        """One watch stream from the cursor, its events handled as they come, until the server ends it.

        The stream has no total deadline, as it is meant to stay open, but an idle one: no event and no
        keepalive for 4 x ``timeout`` fails it, however many bytes came meanwhile (a stream that drips a byte
        at a time never completes a line). Its head, and an error answer's body, get ``timeout`` in all, as a
        list does. The stream is read in a task of its own, the head awaited beside it (:meth:`_stream`)."""
        operation = f"watch sessions{f' on outpost {self.outpost_id}' if self.outpost_id else ''}"
        head = asyncio.Event()
        stream = asyncio.ensure_future(self._stream(operation, head))
        stream.add_done_callback(_replies.consume)
        try:
            arrived = asyncio.ensure_future(head.wait())
            try:
                done, dummy = await asyncio.wait(
                    {stream, arrived}, timeout=self.options.timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                arrived.cancel()
            if not done:
                raise FleetError(operation, f"no answer within {self.options.timeout:g}s")
            await asyncio.wait({stream})
        finally:
            stream.cancel()  # it ended, or the head came too late, or the source is being cancelled
        stream.result()

    async def _stream(self, operation: str, head: asyncio.Event) -> None:
        """The request of :meth:`watch`, in one task from the request to the end of the stream: the events a
        server sends just before it breaks the connection are read before the break is (aiohttp raises a
        broken connection's error before the data it buffered, so nothing may come between the head and the
        first read). ``head`` is set once the answer's head arrived."""
        assert self.http is not None
        query = _stream.watch_params(self.outpost_id, self.listwatch.cursor)
        headers = dict(self._headers(), Accept=_stream.EVENT_STREAM)
        limit, idle = self.options.timeout, 4 * self.options.timeout
        timeout = aiohttp.ClientTimeout(total=None, connect=limit, sock_read=idle)
        loop = asyncio.get_running_loop()
        try:
            async with self.http.get(
                self.options.api_url + QUEUE_PATH,
                params=query,
                headers=headers,
                ssl=self.options.ssl_context(),
                timeout=timeout,
                allow_redirects=False,
            ) as response:
                head.set()
                if response.status >= 300:
                    error = self._answer_error(operation, response)
                    raise await _replies.within(error, limit, operation, "no complete error answer")
                reader, comments, last = EventStreamReader(), 0, loop.time()
                decoder = BodyDecoder(response.headers.get("Content-Encoding"))
                while True:
                    chunk = await response.content.read(_replies.READ_SIZE)
                    if not chunk:
                        return  # an event the stream ended inside is dropped: the reconnect replays it
                    events = [event for piece in decoder.feed(chunk) for event in reader.feed(piece)]
                    if not events and reader.comments == comments and loop.time() - last > idle:
                        raise FleetError(operation, f"no event and no keepalive for {idle:g}s")
                    for event in events:
                        await self.handle(*_replies.decode_event(event.data, operation))
                    if events or reader.comments != comments:
                        comments, last = reader.comments, loop.time()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise FleetError(operation, self._redact(f"{type(exc).__name__}: {exc}")) from None
        except (EventStreamTooLarge, _inflate.UndecodableBody) as exc:
            raise MalformedReply(operation, str(exc)) from None

    # --- events ---

    async def handle(self, kind: str, entry: Entry, cursor: Optional[str]) -> None:
        """One decoded watch event (``decode_event``)."""
        deleted = kind == "DELETED"
        self.picture.change(entry, deleted)
        self.listwatch.event(cursor)
        await self.emit(kind, entry, deleted)

    async def emit(self, kind: str, entry: Entry, deleted: bool) -> None:
        """Send one change with the current cursor (unless it repeats a state already sent or the phase filter
        drops it), then store the cursor. A crash between the two repeats the event once: delivery is at least
        once."""
        sid = str(_events.section(entry, "metadata").get("session_id"))
        mark = _events.fingerprint(entry, deleted)
        if not self.sent.repeats(sid, mark):
            phase = _events.section(entry, "status").get("phase")
            if self.options.phases is None or phase in self.options.phases:
                await self.queue.put(_events.change_event(kind, entry, self.listwatch.cursor))
            self.sent.remember(sid, mark)
        self.save()

    def save(self) -> None:
        if self.options.cursor_file:
            _cursor_file.save_state(
                self.options.cursor_file,
                self.options.api_url,
                self.outpost_id,
                self.listwatch.cursor,
                self.sent.items(),
            )

    async def relist(self) -> None:
        """List the queue: the picture, and the cursor to watch from. Its entries are sent as LISTED (unless
        emit_listed is off), except when the list only seeds the picture for a stored cursor, whose watch
        replays every change made since, so nothing made while the source was down is lost."""
        entries, cursor = await self.list_queue()
        self.picture.replace(entries)
        if self.listwatch.listed(cursor):
            if self.options.emit_listed:
                for entry in entries:
                    await self.emit("LISTED", entry, False)
            self.save()

    # --- queue depth ---

    async def depth_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.queue_depth_interval)
            if self.listwatch.need_list:
                continue  # the picture is not current yet (the API is unreachable): say nothing rather than 0
            if self.outpost_id is None:
                try:
                    self.outposts = await self.list_outposts()
                except FleetError as exc:
                    log.warning("%s; queue_depth uses the outposts known so far", exc)
            self.picture.mark_busy(self.picture.entries.values())
            for oid, name in sorted(self.outposts.items()):
                await self.queue.put(self.picture.depth(oid, name))

    # --- the loop ---

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=4)
        # auto_decompress off: BodyDecoder inflates within the caps (aiohttp < 3.13.3 inflated a read whole)
        async with aiohttp.ClientSession(connector=connector, trust_env=True, auto_decompress=False) as http:
            self.http = http
            await self._retrying(self.resolve_outpost)
            options = self.options
            stored, seen = _cursor_file.load_state(options.cursor_file, options.api_url, self.outpost_id)
            self.sent = _events.SentStates(seen)
            if stored:
                log.info(
                    "Resuming the queue of %s from the stored cursor", self.outpost_id or "every outpost"
                )
            depth = None
            if options.queue_depth_interval > 0:
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
        return backoff_delay(attempt, self.options.backoff_initial, self.options.backoff_max, draw)

    async def follow(self, stored: Optional[str]) -> None:
        """List (to seed the picture, and for the first cursor), then watch, forever, each step as
        ``ListWatch`` decides: a stream the server ends is reopened at once from the last cursor; a failure
        waits :meth:`backoff`, and one that puts the picture in doubt (anything but an outage) lists again
        first. ``stored`` is the cursor file's cursor: the first list then only seeds the picture."""
        listwatch = self.listwatch
        listwatch.resume = stored
        while True:
            try:
                if listwatch.next_step() is _listwatch.Step.LIST:
                    await self.relist()
                listwatch.watching()
                await self.watch()
            except FleetError as exc:
                if not exc.retry:
                    raise
                delay = listwatch.failed(_listwatch.relist_after(exc.status, isinstance(exc, MalformedReply)))
                if listwatch.need_list:
                    line = "%s; listing the queue again in %.1fs, then watching from its cursor"
                else:
                    line = "%s; reconnecting in %.1fs from the stored cursor"
                log.warning(line, exc, delay)
            else:
                # Streams are bounded in time: reopen at once, unless they keep ending at once.
                delay = listwatch.ended()
            if delay > 0:
                await self.sleep(delay)


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
