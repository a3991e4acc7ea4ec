# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The replies of the fleet API as the event source ``devin.outposts.outpost_queue`` reads them: the errors
it raises, a body read within its cap, and the one decoding path of every reply.

Part of the source (``extensions/eda/plugins/event_source/outpost_queue.py``), which loads it by path
(docs/eda.md, "What the source shares"); standard library only. What it reads is given as a
:class:`Answer`, the few attributes of an aiohttp response the source uses, so this module needs no
transport. Every reply is data from the network: it is decoded here and nowhere else, and what does not
decode raises :class:`MalformedReply`, with a detail that quotes nothing of the reply but its shape.

A compressed body is capped before it is decompressed (issue 37, S6): the source turns aiohttp's own
decompression off (before aiohttp 3.13.3, which ansible-rulebook still accepts, it inflated each network read
whole) and :func:`read_body` reads the raw bytes through the worker's decoder (``_fleet_inflate.py``), which
the source passes in: both the bytes read and the bytes they decode to count against the cap.
:func:`within` bounds a read that has no deadline of aiohttp's (an error answer's body on the watch).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import time
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Callable, Optional, Protocol, TypeVar

#: The largest page size the API accepts (python/contract/cases.yaml pins it).
MAX_PAGE_SIZE = 200
#: One reply to a list may be at most this long (a page of 200 entries is far smaller).
MAX_BODY = 8 << 20
#: Of an error answer, this much is read for its detail.
MAX_ERROR_BODY = 1 << 16
#: A reply nested deeper than this (objects and arrays) is refused; a queue entry is about 4 deep.
MAX_NESTING = 32
#: Bytes asked of the connection per read.
READ_SIZE = 1 << 16
#: The answers after which a request is worth sending again (with a connection error).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: The longest wait a Retry-After may ask for.
MAX_RETRY_AFTER = 60.0

T = TypeVar("T")


class Body(Protocol):
    """The body of an answer, read piece by piece (aiohttp's ``response.content``)."""

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes, what has arrived so far; b"" at the end."""


class Decoder(Protocol):
    """A body's decoder (``_fleet_inflate.BodyDecoder``): the raw bytes in, the decoded ones out in pieces."""

    def feed(self, data: bytes) -> Iterable[bytes]:
        """The pieces the next raw bytes decode to."""

    def end(self) -> Iterable[bytes]:
        """The pieces still held at the end of the body."""


#: Makes the decoder of a body from its ``Content-Encoding``; raises ``ValueError`` for a coding it refuses.
Decoding = Callable[[Optional[str]], Decoder]


class Answer(Protocol):
    """What the source reads of an HTTP answer (an aiohttp ``ClientResponse``)."""

    @property
    def status(self) -> int:
        """The HTTP status."""

    @property
    def reason(self) -> Optional[str]:
        """The HTTP reason phrase."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The headers (any case)."""

    @property
    def content(self) -> Body:
        """The body."""


class FleetError(Exception):
    """A failed request. ``retry`` is false only for a refused token (401, 403): retrying cannot change it.
    Whether the queue is listed again before the next watch is the one list-then-watch rule's
    (``_fleet_listwatch.relist_after``: after every failure but an outage)."""

    def __init__(self, operation: str, detail: str, status: Optional[int] = None) -> None:
        prefix = f"{status} " if status is not None else ""
        super().__init__(f"Could not {operation}: {prefix}{detail}")
        self.status = status
        self.retry = status not in (401, 403)
        #: Seconds the answer's Retry-After asked for (429, 5xx), at most MAX_RETRY_AFTER; else None.
        self.retry_after: Optional[float] = None

    @property
    def outage(self) -> bool:
        """A connection error, 429 or 5xx: the request itself is worth repeating."""
        return self.status in RETRY_STATUSES or (self.status is None and not isinstance(self, MalformedReply))


class Redirected(FleetError):
    """A 3xx answer: never followed (the token would go wherever it points) and never retried, since it
    means api_url is not the API's base URL, which waiting does not fix. It stops the source, as a refused
    token does."""

    def __init__(self, operation: str, location: str, status: int) -> None:
        super().__init__(operation, f"redirected to {location}; set api_url to the API's base URL", status)
        self.retry = False


class MalformedReply(FleetError):
    """A reply that is not what the API sends: not JSON, over a size cap, nested too deeply, or of the wrong
    shape. Every reply is decoded through :func:`decode_json`, so this is the only error decoding raises."""

    def __init__(self, operation: str, detail: str) -> None:
        super().__init__(operation, f"malformed reply: {detail}")


# --- reading ---------------------------------------------------------------------------------------------


async def read_body(answer: Answer, operation: str, decoding: Decoding, limit: int = MAX_BODY) -> bytes:
    """The body to its end, decoded, at most ``limit`` bytes read and at most ``limit`` decoded. ``read(n)``
    returns what has arrived so far, so it is called until the end (a list of 100 sessions is several TLS
    records)."""
    too_large = MalformedReply(operation, f"the body is larger than {limit} bytes")
    data = bytearray()
    read = 0
    try:
        decoder = decoding(answer.headers.get("Content-Encoding"))
        while True:
            chunk = await answer.content.read(READ_SIZE)
            read += len(chunk)
            if read > limit:
                raise too_large
            for piece in decoder.feed(chunk) if chunk else decoder.end():
                data += piece
                if len(data) > limit:
                    raise too_large
            if not chunk:
                return bytes(data)
    except ValueError as exc:  # the decoder's UndecodableBody: a coding it refuses, corrupt data
        raise MalformedReply(operation, str(exc)) from None


async def within(step: Awaitable[T], seconds: float, operation: str, what: str) -> T:
    """``step`` within ``seconds`` in all, else a FleetError saying ``what`` came in time.

    Not ``asyncio.wait_for``: before Python 3.12 it returns the result, and swallows the cancellation, when
    the source is cancelled just as the step ends, and the source then went on, cancelled but not ending.
    ``asyncio.wait`` raises the cancellation."""
    task = asyncio.ensure_future(step)
    task.add_done_callback(consume)
    try:
        done, dummy = await asyncio.wait({task}, timeout=seconds)
    finally:
        task.cancel()  # no-op once it ended
    if not done:
        raise FleetError(operation, f"{what} within {seconds:g}s")
    return task.result()


def consume(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a task nobody awaits any more (the source was cancelled meanwhile), so that
    asyncio does not log "exception was never retrieved"."""
    if not task.cancelled():
        task.exception()


async def answer_error(
    operation: str, answer: Answer, kind: type[FleetError], redact: Callable[[str], str], decoding: Decoding
) -> FleetError:
    """The error of an answer >= 300: a redirect (never followed), or one with the API's ``detail`` (or the
    body's start) in its message and what its Retry-After asks. ``redact`` takes the token out of a text;
    ``decoding`` makes the body's decoder (:func:`read_body`)."""
    if answer.status < 400:
        location = redact(answer.headers.get("Location") or "another URL")
        return Redirected(operation, location, answer.status)
    try:
        text = error_detail(await read_body(answer, operation, decoding, MAX_ERROR_BODY))
    except MalformedReply:  # larger than MAX_ERROR_BODY, or in a coding the decoder refuses
        text = ""
    error = kind(operation, redact(text or answer.reason or ""), answer.status)
    if answer.status in RETRY_STATUSES:
        error.retry_after = retry_after(answer.headers.get("Retry-After"))
    return error


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


# --- decoding --------------------------------------------------------------------------------------------


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
    spec = item.get("spec")
    oid, name = item["metadata"].get("outpost_id"), spec.get("name", "") if isinstance(spec, dict) else ""
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
