"""The name a connection asks for in its first bytes: the server name (SNI) of a TLS ClientHello, or the
``Host`` of a plain HTTP request (:func:`opening` tells which, if either, the bytes start). The egress
proxy checks it against the CONNECT host; the transparent redirect inside a session's namespace learns
from it which name a proxy-unaware client meant.

Only reads: nothing here answers the client or changes the bytes. A reader gets the bytes received so far
and says :data:`MORE` while it cannot tell yet.
"""

from __future__ import annotations

import enum
import re
import struct
from typing import Optional, Union

#: Not enough bytes yet to tell.
MORE = object()
#: The most a peek waits for: a ClientHello bigger than this (post-quantum key shares make them ~2 KiB, a
#: record is at most 16 KiB plus its header) or an HTTP head longer than this is refused.
MAX_PEEK_BYTES = 16384 + 5

_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME = 0
_HOST_NAME = 0


class PeekError(ValueError):
    """The first bytes are not what they must be (a broken ClientHello, an HTTP head without a Host)."""


Peeked = Union[Optional[str], object]


class Opening(enum.Enum):
    """What a connection's first bytes start: which reader can tell the name it asks for, if any."""

    TLS = "tls"  # a TLS handshake record: :func:`tls_server_name`
    HTTP = "http"  # an HTTP/1 request line: :func:`http_host`
    RAW = "raw"  # anything else (SSH, a database protocol...): no name in it


#: An HTTP/1 request line (RFC 9112: method SP request-target SP HTTP-version), CR optional.
_REQUEST_LINE = re.compile(rb"[A-Z]{1,16} [!-~]+ HTTP/1\.[01]\r?")
_UPPER = re.compile(rb"[A-Z]*")


def looks_like_tls(data: bytes) -> bool:
    """Whether a connection that sent ``data`` first (at least one byte) is starting a TLS handshake."""
    return data[:1] == bytes([_HANDSHAKE])


def opening(data: bytes) -> Union[Opening, object]:
    """What ``data``, a connection's first bytes, start (:class:`Opening`), or :data:`MORE` while that cannot
    be told yet. HTTP needs its whole first line, so that a raw protocol whose first word happens to be in
    capitals (an inline ``GET key`` of Redis) is not taken for HTTP."""
    if not data:
        return MORE
    if looks_like_tls(data):
        return Opening.TLS
    method = _UPPER.match(data)
    size = method.end() if method else 0
    if size == len(data):
        return MORE if size <= 16 else Opening.RAW
    if size == 0 or data[size : size + 1] != b" ":
        return Opening.RAW
    line_end = data.find(b"\n")
    if line_end < 0:
        return MORE if len(data) < MAX_PEEK_BYTES else Opening.RAW
    return Opening.HTTP if _REQUEST_LINE.fullmatch(data[:line_end]) else Opening.RAW


def tls_server_name(data: bytes) -> Peeked:
    """The SNI host name of the ClientHello at the start of ``data``, lower case; None when it sends none;
    :data:`MORE` while the record is incomplete. Raises :class:`PeekError` on anything but a ClientHello."""
    if len(data) < 5:
        return MORE
    content_type, _version, length = struct.unpack("!BHH", data[:5])
    if content_type != _HANDSHAKE:
        raise PeekError("not a TLS handshake record")
    if length > MAX_PEEK_BYTES - 5:
        raise PeekError(f"a TLS record of {length} bytes is longer than a ClientHello may be here")
    if len(data) < 5 + length:
        return MORE
    body = _Reader(data[5 : 5 + length])
    if body.byte() != _CLIENT_HELLO:
        raise PeekError("the first handshake message is not a ClientHello")
    hello_length = body.uint(3)
    if hello_length > body.left():
        # A ClientHello split over two records: rare (giant key shares); refuse rather than guess.
        raise PeekError("a ClientHello that does not fit in its first record")
    body.skip(2 + 32)  # legacy version, random
    body.skip(body.byte())  # session id
    body.skip(body.uint(2))  # cipher suites
    body.skip(body.byte())  # compression methods
    if body.left() == 0:
        return None  # no extensions at all
    extensions = _Reader(body.take(body.uint(2)))
    while extensions.left():
        kind, size = extensions.uint(2), extensions.uint(2)
        content = extensions.take(size)
        if kind == _SERVER_NAME:
            return _server_name(_Reader(content))
    return None


def http_host(data: bytes) -> Peeked:
    """The host (without a port) of the plain HTTP request head at the start of ``data``, lower case;
    :data:`MORE` until the head's blank line. Raises :class:`PeekError` when the head has no Host."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        if len(data) >= MAX_PEEK_BYTES:
            raise PeekError(f"an HTTP request head longer than {MAX_PEEK_BYTES} bytes")
        return MORE
    lines = data[:end].decode("latin-1").split("\r\n")
    hosts = [line.split(":", 1)[1].strip() for line in lines[1:] if line.lower().startswith("host:")]
    if len(hosts) != 1 or not hosts[0]:
        raise PeekError("an HTTP request must have exactly one Host header")
    return split_host_port(hosts[0])[0]


def split_host_port(text: str, default_port: Optional[int] = None) -> tuple[str, Optional[int]]:
    """``host[:port]`` or ``[v6]:port`` into the lower-case host and the port (``default_port`` if none).

    Raises :class:`PeekError` on a port that is not a number from 1 to 65535.
    """
    text = text.strip()
    if text.startswith("["):
        host, dummy, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""  # a name, or a bare IPv6 address
    if not port_text:
        return host.lower(), default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise PeekError(f"{port_text!r} is not a port")
    return host.lower(), int(port_text)


def _server_name(names: _Reader) -> Optional[str]:
    listed = _Reader(names.take(names.uint(2)))
    while listed.left():
        kind, name = listed.byte(), listed.take(listed.uint(2))
        if kind == _HOST_NAME:
            try:
                return name.decode("ascii").lower()
            except UnicodeDecodeError as exc:
                raise PeekError("an SNI host name that is not ASCII") from exc
    return None


class _Reader:
    """Reads a byte string front to back; running off its end is a :class:`PeekError`."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def left(self) -> int:
        return len(self.data) - self.at

    def take(self, count: int) -> bytes:
        if count > self.left():
            raise PeekError("a ClientHello field runs past its end")
        chunk = self.data[self.at : self.at + count]
        self.at += count
        return chunk

    def skip(self, count: int) -> None:
        self.take(count)

    def byte(self) -> int:
        return self.take(1)[0]

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")
