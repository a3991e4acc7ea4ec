"""Size limits on what the fleet API and the binary distribution send back.

A server (or a proxy, or an attacker in the middle of a plain-HTTP setup) can answer with a body or an
SSE line of any size; read naively, a 200 MB answer costs the worker hundreds of MiB. Every read of a
reply therefore goes through these helpers, which stop at a limit and raise :class:`ResponseTooLarge`:

* :data:`MAX_BODY_BYTES` for a JSON reply (a full page of 200 queue entries is well under 1 MiB);
* :data:`MAX_SSE_LINE` for one line, and for one event, of the watch stream: everything read for the event
  being assembled counts, whatever it looks like (:func:`sse_events`);
* small files of the distribution (``latest_*``, ``*.sha256``) have their own limits in
  :mod:`devin_outposts.worker.binary`.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import httpx

MAX_BODY_BYTES = 8 << 20
MAX_SSE_LINE = 1 << 20


class ResponseTooLarge(Exception):
    """A reply went past its size limit; the request fails instead of using unbounded memory."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the response is larger than {limit} bytes")
        self.limit = limit


async def read_capped(response: httpx.Response, limit: int) -> bytes:
    """The (decoded) body of a streamed ``response``, refusing more than ``limit`` bytes."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ResponseTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise ResponseTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def capped_lines(response: httpx.Response, limit: int) -> AsyncIterator[str]:
    """The lines of a streamed text ``response`` (``\\n``, ``\\r\\n`` or ``\\r`` ends a line, as SSE
    allows), refusing a line longer than ``limit`` characters before it is held in memory whole."""
    buffer = ""
    after_cr = False
    async for text in response.aiter_text():
        if after_cr and text.startswith("\n"):
            text = text[1:]  # the second half of a "\r\n" split across two chunks
        after_cr = False
        buffer += text
        start = 0
        while True:
            cut = _line_end(buffer, start)
            if cut < 0:
                break
            yield buffer[start:cut]
            if buffer[cut] == "\r":
                if cut + 1 == len(buffer):
                    after_cr = True
                elif buffer[cut + 1] == "\n":
                    cut += 1
            start = cut + 1
        buffer = buffer[start:]
        if len(buffer) > limit:
            raise ResponseTooLarge(limit)
    if buffer:
        yield buffer


def _line_end(text: str, start: int) -> int:
    newline = text.find("\n", start)
    carriage = text.find("\r", start)
    if carriage < 0:
        return newline
    if newline < 0:
        return carriage
    return min(newline, carriage)


async def sse_events(response: httpx.Response, limit: int) -> AsyncIterator[str]:
    """The ``data`` of each event of a streamed ``text/event-stream`` response, lines joined by ``\\n``.

    What counts toward ``limit`` is what is held, not what looks like content: every line read since the
    previous blank line (the event's ``data:`` lines, but also comments and other fields) counts its
    length plus one for its line end. An empty ``data:`` line adds nothing to the event's text yet still
    costs the reader something, so 60 million of them cannot grow it without bound; neither can comment
    lines that never reach a blank line. A line longer than ``limit`` fails before it is held whole
    (:func:`capped_lines`). A stream's keepalives (``: keepalive`` and a blank line) reset the count.
    """
    data = io.StringIO()
    has_data = False
    held = 0
    async for line in capped_lines(response, limit):
        if line == "":
            if has_data:
                yield data.getvalue()
                data = io.StringIO()
            has_data, held = False, 0
            continue
        held += len(line) + 1
        if held > limit:
            raise ResponseTooLarge(limit)
        if line.startswith(":"):
            continue  # a comment (keepalive)
        field, _sep, value = line.partition(":")
        if field == "data":
            if has_data:
                data.write("\n")
            data.write(value[1:] if value.startswith(" ") else value)
            has_data = True
    if has_data:  # a final event without its blank line
        yield data.getvalue()
