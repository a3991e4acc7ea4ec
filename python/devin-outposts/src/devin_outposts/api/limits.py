"""Size limits on what the fleet API and the binary distribution send back.

A server (or a proxy, or an attacker in the middle of a plain-HTTP setup) can answer with a body or an
SSE line of any size; read naively, a 200 MB answer costs the worker hundreds of MiB. Every read of a
reply therefore goes through these helpers, which stop at a limit and raise :class:`ResponseTooLarge`:

* :data:`MAX_BODY_BYTES` for a JSON reply (a full page of 200 queue entries is well under 1 MiB);
* :data:`MAX_SSE_LINE` for one line, and for one event, of the watch stream: everything read for the event
  being assembled counts, whatever it looks like (the reader is :mod:`.stream`'s, and raises its own
  :class:`~.stream.EventStreamTooLarge`);
* small files of the distribution (``latest_*``, ``*.sha256``) have their own limits in
  :mod:`devin_outposts.worker.binary`.

A compressed reply is capped before it is decompressed (issue 37, S6): the raw bytes go through
:class:`~.inflate.BodyDecoder`, never through httpx's own decoders, which inflate a whole network read at
once. Both the bytes read and the bytes they decode to count against the limit, as they come, so a gzip
bomb costs at most the limit plus one 64 KiB piece. Every request whose reply is read here sends
``Accept-Encoding:`` :data:`~.inflate.ACCEPT_ENCODING`, the codings the decoder takes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Optional

import httpx

from devin_outposts.api.inflate import ACCEPT_ENCODING, BodyDecoder, UndecodableBody
from devin_outposts.api.stream import MAX_EVENT_BYTES

__all__ = [
    "ACCEPT_ENCODING",
    "MAX_BODY_BYTES",
    "MAX_SSE_LINE",
    "ResponseTooLarge",
    "UndecodableBody",
    "declared_length",
    "decoded_chunks",
    "read_capped",
]

MAX_BODY_BYTES = 8 << 20
#: The cap on one line, and on one event, of the watch stream (:data:`.stream.MAX_EVENT_BYTES`).
MAX_SSE_LINE = MAX_EVENT_BYTES


class ResponseTooLarge(Exception):
    """A reply went past its size limit; the request fails instead of using unbounded memory."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the response is larger than {limit} bytes")
        self.limit = limit


def declared_length(response: httpx.Response) -> Optional[int]:
    """The reply's ``Content-Length`` (the length on the wire, compressed or not), if it gives one."""
    declared = response.headers.get("Content-Length", "").strip()
    return int(declared) if declared.isdigit() else None


async def decoded_chunks(response: httpx.Response, limit: Optional[int] = None) -> AsyncIterator[bytes]:
    """The decoded body of a streamed ``response``, in pieces of at most 64 KiB (an uncompressed body in the
    transport's own reads). With a ``limit``, :class:`ResponseTooLarge` as soon as the bytes read or the
    bytes decoded pass it, and at once when ``Content-Length`` does. :class:`UndecodableBody` for a coding
    the decoder does not take, or corrupt compressed data."""
    declared = declared_length(response)
    if limit is not None and declared is not None and declared > limit:
        raise ResponseTooLarge(limit)
    try:
        content = response.content  # read before it was handed over (an in-memory transport, in tests)
    except httpx.ResponseNotRead:
        pass
    else:
        if limit is not None and len(content) > limit:
            raise ResponseTooLarge(limit)
        yield content
        return
    decoder = BodyDecoder(response.headers.get("Content-Encoding"))
    async for raw in response.aiter_raw():
        if limit is not None and decoder.read + len(raw) > limit:
            raise ResponseTooLarge(limit)
        for piece in decoder.feed(raw):
            if limit is not None and decoder.decoded > limit:
                raise ResponseTooLarge(limit)
            yield piece
    for piece in decoder.end():
        if limit is not None and decoder.decoded > limit:
            raise ResponseTooLarge(limit)
        yield piece


async def read_capped(response: httpx.Response, limit: int) -> bytes:
    """The (decoded) body of a streamed ``response``, refusing more than ``limit`` bytes, read or decoded
    (:func:`decoded_chunks`)."""
    return b"".join([piece async for piece in decoded_chunks(response, limit)])
