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
"""

from __future__ import annotations

import httpx

from devin_outposts.api.stream import MAX_EVENT_BYTES

MAX_BODY_BYTES = 8 << 20
#: The cap on one line, and on one event, of the watch stream (:data:`.stream.MAX_EVENT_BYTES`).
MAX_SSE_LINE = MAX_EVENT_BYTES


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
