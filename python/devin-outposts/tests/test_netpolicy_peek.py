"""The name a connection's first bytes ask for (core/netpolicy/peek.py): real ClientHellos made by this
Python's ssl module, fed whole and cut at every byte; HTTP heads; garbage."""

from __future__ import annotations

import random
import ssl
import struct
from typing import Optional

import pytest

from devin_outposts.core.netpolicy import peek
from devin_outposts.core.netpolicy.peek import MORE, PeekError


def client_hello(server_name: Optional[str]) -> bytes:
    """The first flight of a real TLS client (this Python's OpenSSL) for ``server_name`` (None: no SNI)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@pytest.mark.parametrize("name", ["api.example.com", "GitHub.COM", "a.b.c.d.example.org"])
def test_sni_of_a_real_client_hello(name: str) -> None:
    hello = client_hello(name)
    assert peek.looks_like_tls(hello)
    assert peek.tls_server_name(hello) == name.lower()
    assert peek.tls_server_name(hello + b"application data after it") == name.lower()


def test_client_hello_without_sni() -> None:
    hello = client_hello(None)
    assert peek.looks_like_tls(hello)
    assert peek.tls_server_name(hello) is None


@pytest.mark.parametrize("name", ["api.example.com", None])
def test_more_until_the_record_is_whole(name: Optional[str]) -> None:
    hello = client_hello(name)
    for cut in range(len(hello)):
        assert peek.tls_server_name(hello[:cut]) is MORE, f"cut at {cut} of {len(hello)}"
    assert peek.tls_server_name(hello) == name


def test_not_a_handshake_record() -> None:
    with pytest.raises(PeekError, match="not a TLS handshake"):
        peek.tls_server_name(b"\x17\x03\x03\x00\x05hello")


def test_a_record_longer_than_a_client_hello_may_be() -> None:
    with pytest.raises(PeekError, match="longer than a ClientHello"):
        peek.tls_server_name(b"\x16\x03\x01" + struct.pack("!H", peek.MAX_PEEK_BYTES))


def test_a_handshake_that_is_not_a_client_hello() -> None:
    with pytest.raises(PeekError, match="not a ClientHello"):
        peek.tls_server_name(b"\x16\x03\x01\x00\x04\x02\x00\x00\x00")


def test_a_client_hello_that_lies_about_its_lengths() -> None:
    hello = bytearray(client_hello("api.example.com"))
    # The handshake length (3 bytes after the record header and the type) claims more than the record holds.
    hello[6:9] = (0xFFFFFF).to_bytes(3, "big")
    with pytest.raises(PeekError):
        peek.tls_server_name(bytes(hello))


@pytest.mark.parametrize("seed", range(20))
def test_garbage_after_a_handshake_header_never_crashes(seed: int) -> None:
    """Random bodies: a name, None or a PeekError, never another exception."""
    rng = random.Random(seed)
    body = bytes(rng.randrange(256) for dummy in range(rng.randrange(1, 300)))
    data = b"\x16\x03\x01" + struct.pack("!H", len(body)) + body
    try:
        result = peek.tls_server_name(data)
    except PeekError:
        return
    assert result is None or isinstance(result, str)


def test_plain_bytes_do_not_look_like_tls() -> None:
    assert not peek.looks_like_tls(b"SSH-2.0-OpenSSH_9.2\r\n")
    assert not peek.looks_like_tls(b"GET / HTTP/1.1\r\n")


@pytest.mark.parametrize(
    ("head", "host"),
    [
        (b"GET / HTTP/1.1\r\nHost: Example.COM\r\n\r\n", "example.com"),
        (b"POST /x HTTP/1.1\r\nContent-Length: 0\r\nhost: example.com:8080\r\n\r\nbody", "example.com"),
        (b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n", "2001:db8::1"),
    ],
)
def test_http_host(head: bytes, host: str) -> None:
    assert peek.http_host(head) == host
    for cut in range(head.index(b"\r\n\r\n") + 3):
        assert peek.http_host(head[:cut]) is MORE


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: \r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example:http\r\n\r\n",
    ],
)
def test_http_head_without_one_good_host(head: bytes) -> None:
    with pytest.raises(PeekError):
        peek.http_host(head)


def test_http_head_too_long() -> None:
    with pytest.raises(PeekError, match="longer than"):
        peek.http_host(b"GET / HTTP/1.1\r\nX: " + b"a" * peek.MAX_PEEK_BYTES)


@pytest.mark.parametrize(
    ("text", "default", "expected"),
    [
        ("Example.com:8443", None, ("example.com", 8443)),
        ("example.com", 443, ("example.com", 443)),
        ("[2001:db8::1]:22", None, ("2001:db8::1", 22)),
        ("[2001:db8::1]", 443, ("2001:db8::1", 443)),
        ("2001:db8::1", 443, ("2001:db8::1", 443)),
    ],
)
def test_split_host_port(text: str, default: Optional[int], expected: tuple[str, Optional[int]]) -> None:
    assert peek.split_host_port(text, default) == expected


@pytest.mark.parametrize("text", ["example.com:0", "example.com:65536", "example.com:x", "[::1]:-1"])
def test_split_host_port_refuses_bad_ports(text: str) -> None:
    with pytest.raises(PeekError, match="is not a port"):
        peek.split_host_port(text)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", MORE),
        (b"\x16", peek.Opening.TLS),
        (b"G", MORE),
        (b"GET /x HTTP/1.", MORE),
        (b"GET /x HTTP/1.1\r\n", peek.Opening.HTTP),
        (b"CONNECT a.example:443 HTTP/1.0\n", peek.Opening.HTTP),
        (b"GET key\r\n", peek.Opening.RAW),  # Redis's inline command: capitals, but not an HTTP request line
        (b"SSH-2.0-OpenSSH_9.2\r\n", peek.Opening.RAW),
        (b"get / HTTP/1.1\r\n", peek.Opening.RAW),
        (b"\x00\x00\x00\x08\x04\xd2\x16\x2f", peek.Opening.RAW),  # PostgreSQL's SSLRequest
        (b"ABCDEFGHIJKLMNOPQ", peek.Opening.RAW),  # longer than any method
        (b"PUT " + b"a" * peek.MAX_PEEK_BYTES, peek.Opening.RAW),  # no line end within the peek
    ],
)
def test_opening(data: bytes, expected: object) -> None:
    assert peek.opening(data) is expected
