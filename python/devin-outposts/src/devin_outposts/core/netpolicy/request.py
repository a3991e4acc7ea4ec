"""What a client asks the egress proxy for: the reading of one request head (pure, no I/O).

Two forms are proxied: ``CONNECT host:port HTTP/1.x`` (a tunnel) and absolute-form plain HTTP
(``GET http://host[:port]/path HTTP/1.x``), which is sent on in origin-form, with ``Host`` set to the URL's
host, without the hop-by-hop and ``Proxy-*`` headers and with ``Connection: close`` (one request per
connection: :mod:`.http1` sends its body on and nothing after it, since a second request could name another
host). Anything else is a :class:`BadRequest` (400).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional
from urllib.parse import urlsplit

from devin_outposts.core.netpolicy import peek
from devin_outposts.core.netpolicy.policy import Decision, normalise_host

#: The longest request head (request line and headers) the proxy reads.
MAX_HEAD_BYTES = 16 * 1024
#: The rule a decision names when an absolute-form request's Host is not its URL's host.
REQUEST_HOST_RULE = "the request's host"
#: Headers never sent on: hop-by-hop, the proxy's own, and Host (set from the URL).
_DROPPED = frozenset(("connection", "keep-alive", "proxy-connection", "proxy-authorization", "host"))


class Destination(NamedTuple):
    """Where a client asked to go: a name or an IP literal (normalised), and a port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class BadRequest(ValueError):
    """A request head the proxy does not take (answered 400 with this message)."""


@dataclass(frozen=True)
class Request:
    """One request head, read."""

    destination: Destination
    #: True for CONNECT (a tunnel); False for absolute-form HTTP (:attr:`forwarded` is sent on).
    tunnel: bool
    #: The head to send upstream (absolute-form HTTP only).
    forwarded: bytes = b""
    #: Set when the head itself is refused (a Host header naming another host than the URL).
    refusal: Optional[Decision] = None


def parse_request(head: bytes) -> Request:
    """Read a request head (up to and including its blank line). Raises :class:`BadRequest`."""
    if len(head) > MAX_HEAD_BYTES:
        raise BadRequest(f"the request head is longer than {MAX_HEAD_BYTES} bytes")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = request_line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("the request line is not METHOD TARGET HTTP/1.x")
    method, target, dummy_version = parts
    if method == "CONNECT":
        return Request(_connect_destination(target), tunnel=True)
    destination, origin_form = _absolute_form(target)
    kept: list[str] = []
    refusal: Optional[Decision] = None
    for line in (line for line in header_lines if line):
        name, colon, value = line.partition(":")
        if not colon:
            raise BadRequest("a header line without a colon")
        lowered = name.strip().lower()
        if lowered == "host":
            refusal = refusal or _host_refusal(value, destination)
        if lowered not in _DROPPED:
            kept.append(line)
    host = f"[{destination.host}]" if ":" in destination.host else destination.host
    if destination.port != 80:
        host += f":{destination.port}"
    lines = [f"{method} {origin_form} HTTP/1.1", f"Host: {host}", *kept, "Connection: close", "", ""]
    return Request(destination, tunnel=False, forwarded="\r\n".join(lines).encode("latin-1"), refusal=refusal)


def printable(text: str) -> str:
    """``text`` on one line: control characters escaped (what a client sent must not forge a log line or
    a header)."""
    return "".join(char if char.isprintable() else f"\\x{ord(char):02x}" for char in text)


def _connect_destination(target: str) -> Destination:
    try:
        host, port = peek.split_host_port(target)
    except peek.PeekError as exc:
        raise BadRequest(f"CONNECT {printable(target)}: {exc}") from exc
    if not host or port is None:
        raise BadRequest(f"CONNECT {printable(target)}: the target must be host:port")
    return Destination(normalise_host(host), port)


def _absolute_form(target: str) -> tuple[Destination, str]:
    """An absolute-form ``http://`` target: where it goes, and the target in origin-form."""
    parts = urlsplit(target)
    if parts.scheme.lower() != "http" or not parts.netloc or "@" in parts.netloc:
        raise BadRequest("only CONNECT and absolute-form http:// requests are proxied")
    try:
        host, port = peek.split_host_port(parts.netloc, 80)
    except peek.PeekError as exc:
        raise BadRequest(f"{printable(target)}: {exc}") from exc
    origin_form = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(normalise_host(host), port or 80), origin_form


def _host_refusal(value: str, destination: Destination) -> Optional[Decision]:
    try:
        named = normalise_host(peek.split_host_port(value)[0])
    except peek.PeekError as exc:
        raise BadRequest(f"Host: {exc}") from exc
    if named == destination.host:
        return None
    reason = f"the Host header {printable(named)} is not the URL's host {destination.host}"
    return Decision(False, REQUEST_HOST_RULE, reason)
