# Copyright (c) devin.outposts contributors
# MIT License (see https://opensource.org/licenses/MIT)
# SPDX-License-Identifier: MIT
"""The one decoder of a reply's ``Content-Encoding``, within bounds (issue 37, S6).

httpx, aiohttp before 3.13 and the modules' ``urllib`` each decompress whatever one network read brings in
one go, before any cap can look at it: 64 KiB of a gzip bomb became 64 MiB, and a fleet list that was
refused for its size still took a worker from 40 to 174 MiB. :class:`BodyDecoder` is given the raw bytes
of a body as they are read and hands back what they decode to in pieces of at most ``piece`` bytes (64 KiB),
each made only when the caller asks for the next one (``zlib``'s ``max_length``). A caller that counts the
pieces against its cap so stops at the cap plus one piece, whatever the ratio of the compression.

* The codings are the ones the clients ask for (:data:`ACCEPT_ENCODING`: ``gzip`` and ``deflate``, a
  zlib stream or a raw one, as servers send both) and ``identity``; a body in any other coding (``br``,
  ``zstd``, ``compress``), in more than :data:`MAX_CODINGS` codings, or whose compressed data is corrupt
  raises :class:`UndecodableBody`, one error the client turns into its own.
* What follows the end of a compressed stream is ignored, as httpx and urllib do.
* :attr:`BodyDecoder.read` and :attr:`BodyDecoder.decoded` count the bytes given and the bytes handed back,
  for a cap on either.

It imports only the standard library and nothing of ours: the collection ships a byte-identical copy as
``plugins/plugin_utils/_fleet_inflate.py`` for the event source ``devin.outposts.outpost_queue``, which
reads its bodies with aiohttp's own decompression turned off (docs/eda.md, "What the source shares").
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Optional, Protocol

#: The ``Accept-Encoding`` of every request whose reply goes through :class:`BodyDecoder`.
ACCEPT_ENCODING = "gzip, deflate"
#: The largest piece handed back at a time.
PIECE_BYTES = 1 << 16
#: At most this many codings, one over the other (``Content-Encoding: gzip, gzip``): each holds a window.
MAX_CODINGS = 2

_GZIP_WBITS = 16 + zlib.MAX_WBITS


class UndecodableBody(ValueError):
    """A body in a coding this decoder does not take, or whose compressed data is corrupt."""


class _Zlib(Protocol):
    """What is used of a ``zlib.decompressobj``."""

    @property
    def eof(self) -> bool:
        """The end of the compressed stream was reached."""

    @property
    def unconsumed_tail(self) -> bytes:
        """Input the last call did not get to, for want of room in its output."""

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        """At most ``max_length`` bytes of output; what was not consumed is in ``unconsumed_tail``."""

    def flush(self) -> bytes:
        """What is left."""


class _Inflater:
    """One coding's decompressor, pulled a piece at a time."""

    def __init__(self, coding: str, piece: int) -> None:
        self.coding = coding
        self.piece = piece
        self._zlib: Optional[_Zlib] = None

    def _start(self, first: bytes) -> _Zlib:
        if self.coding == "deflate" and first[0] & 0x0F != 8:
            # A raw deflate stream, without the zlib header: what many servers that say deflate send.
            return zlib.decompressobj(-zlib.MAX_WBITS)
        return zlib.decompressobj(_GZIP_WBITS if self.coding != "deflate" else zlib.MAX_WBITS)

    def feed(self, data: bytes) -> Iterator[bytes]:
        if not data:
            return
        if self._zlib is None:
            self._zlib = self._start(data)
        pending = data
        while not self._zlib.eof:
            try:
                out = self._zlib.decompress(pending, self.piece)
            except zlib.error as exc:
                raise UndecodableBody(f"the body's {self.coding} data is corrupt ({exc})") from None
            pending = self._zlib.unconsumed_tail
            if out:
                yield out
            if not pending and len(out) < self.piece:
                return  # all given is consumed and nothing is held back: a full piece may hide more

    def end(self) -> Iterator[bytes]:
        if self._zlib is None or self._zlib.eof:
            return
        try:
            tail = self._zlib.flush()  # little or nothing: feed() took every piece there was
        except zlib.error as exc:
            raise UndecodableBody(f"the body's {self.coding} data is corrupt ({exc})") from None
        for start in range(0, len(tail), self.piece):
            yield tail[start : start + self.piece]


def codings(content_encoding: Optional[str]) -> list[str]:
    """The codings of a ``Content-Encoding`` header, in the order they were applied, ``identity`` left out;
    :class:`UndecodableBody` for one this decoder does not take, or too many."""
    found = [name.strip().lower() for name in (content_encoding or "").split(",")]
    found = ["gzip" if name == "x-gzip" else name for name in found if name and name != "identity"]
    for name in found:
        if name not in ("gzip", "deflate"):
            accepted = ACCEPT_ENCODING
            raise UndecodableBody(f"the body's Content-Encoding {name[:40]!r} is not one of {accepted}")
    if len(found) > MAX_CODINGS:
        raise UndecodableBody(f"the body has {len(found)} content codings, more than {MAX_CODINGS}")
    return found


class BodyDecoder:
    """The decoded bytes of one body, from its raw bytes (see the module docstring).

    ``feed`` each raw chunk as it is read and take the pieces it yields, then take those of :meth:`end`
    once the body is over. Stop taking at any time (over a cap): nothing more is decompressed.
    """

    def __init__(self, content_encoding: Optional[str] = None, piece: int = PIECE_BYTES) -> None:
        self._stages = [_Inflater(name, piece) for name in reversed(codings(content_encoding))]
        #: Raw bytes given so far.
        self.read = 0
        #: Decoded bytes handed back so far.
        self.decoded = 0

    @property
    def identity(self) -> bool:
        """True when the body is not compressed: the pieces are the raw chunks themselves."""
        return not self._stages

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The pieces that ``data`` (the next raw bytes) decodes to, each at most ``piece`` bytes, or the
        raw chunk itself when the body is not compressed."""
        self.read += len(data)
        for piece in self._through(0, data):
            self.decoded += len(piece)
            yield piece

    def end(self) -> Iterator[bytes]:
        """The pieces still held once the raw body is over."""
        for index, stage in enumerate(self._stages):
            for tail in stage.end():
                for piece in self._through(index + 1, tail):
                    self.decoded += len(piece)
                    yield piece

    def _through(self, index: int, data: bytes) -> Iterator[bytes]:
        if index == len(self._stages):
            if data:
                yield data
            return
        for out in self._stages[index].feed(data):
            yield from self._through(index + 1, out)
