"""Run as a confined session by test_netpolicy_sandbox.py: tries every way out and prints what happened, as
one JSON object on stdout. Standard library only (it runs under whichever python3 the test user can run).

Usage: python3 netpolicy_session_checks.py '<json: {"allowed": port, "denied": port, "gateway": port,
"host_udp": port}>'
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import ssl
import struct
import subprocess
import sys
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

PORTS = json.loads(sys.argv[1])
results: dict[str, Any] = {}
TIMEOUT = 20


def check(name: str, action: Callable[[], Any]) -> None:
    try:
        results[name] = action()
    except OSError as exc:
        results[name] = {"error": type(exc).__name__, "errno": exc.errno, "text": str(exc)}


def exchange(address: tuple[Any, ...], payload: bytes, family: int = socket.AF_INET) -> str:
    """Connect directly (no proxy), send ``payload``, return what comes back until the peer closes."""
    with socket.socket(family, socket.SOCK_STREAM) as conn:
        conn.settimeout(TIMEOUT)
        conn.connect(address)
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        return read_all(conn).decode("latin-1")


def read_all(conn: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def through_proxy(authority: str, payload: bytes) -> dict[str, str]:
    """What a client that honours HTTPS_PROXY does: CONNECT through it, then talk."""
    proxy = urlsplit(os.environ["HTTPS_PROXY"])
    with socket.create_connection((proxy.hostname, proxy.port or 3128), timeout=TIMEOUT) as conn:
        conn.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        status = head.split(b"\r\n", 1)[0].decode()
        if " 200 " not in status:
            return {"status": status, "reply": ""}
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        return {"status": status, "reply": read_all(conn).decode("latin-1")}


def client_hello(server_name: str) -> bytes:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with contextlib.suppress(ssl.SSLWantReadError):  # it waits for the server: the hello is written
        tls.do_handshake()
    return outgoing.read()


def nameserver() -> str:
    try:
        with open("/etc/resolv.conf") as handle:
            for line in handle:
                words = line.split()
                if len(words) >= 2 and words[0] == "nameserver" and "%" not in words[1]:
                    return words[1]
    except OSError:
        pass
    return "127.0.0.1"


def dns_query(name: str, qtype: int, server: Optional[str] = None, port: int = 53) -> dict[str, Any]:
    ident = random.randrange(65536)
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
    query = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", qtype, 1)
    server = server or nameserver()
    family = socket.AF_INET6 if ":" in server else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(TIMEOUT)
        sock.sendto(query, (server, port))
        reply = sock.recv(4096)
    rcode = struct.unpack_from("!H", reply, 2)[0] & 0xF
    answers = struct.unpack_from("!H", reply, 6)[0]
    address = None
    if answers:
        size = 4 if qtype == 1 else 16
        address = socket.inet_ntop(socket.AF_INET if qtype == 1 else socket.AF_INET6, reply[-size:])
    return {"rcode": rcode, "answers": answers, "address": address, "same_id": reply[:2] == query[:2]}


def udp_send(address: tuple[str, int]) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"leak?", address)
    return "sent"


def run(command: list[str]) -> dict[str, Any]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except FileNotFoundError as exc:
        return {"returncode": None, "stderr": str(exc)}
    return {"returncode": done.returncode, "stderr": done.stderr.strip()[-300:]}


def transparent_by_name() -> str:
    address = socket.getaddrinfo("allowed.test", PORTS["allowed"], socket.AF_INET, socket.SOCK_STREAM)[0][4]
    return exchange(address, b"transparent-hello")


def ipv6_fake() -> str:
    address = socket.getaddrinfo("allowed.test", PORTS["allowed"], socket.AF_INET6, socket.SOCK_STREAM)[0][4]
    return exchange(address, b"transparent-v6-hello", socket.AF_INET6)


def raw_socket() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        sock.sendto(b"\x08\0\xf7\xff\0\0\0\0", ("192.0.2.1", 0))
    return "sent"


allowed, denied, gateway = PORTS["allowed"], PORTS["denied"], PORTS["gateway"]
results["uid"], results["gid"] = os.getuid(), os.getgid()
results["proxy_env"] = {
    name: os.environ.get(name)
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "NO_PROXY", "no_proxy")
}
results["marker"] = os.environ.get("SANDBOX_TEST_MARKER")
results["links"] = sorted(name for dummy, name in socket.if_nameindex())
results["run"] = sorted(os.listdir("/run"))
results["home"] = os.environ.get("HOME")
check("explicit_allowed", lambda: through_proxy(f"allowed.test:{allowed}", b"explicit-hello"))
check("explicit_denied", lambda: through_proxy(f"denied.test:{denied}", b"explicit-denied"))
check("transparent_by_name", transparent_by_name)
check("transparent_sni", lambda: exchange(("192.0.2.10", allowed), client_hello("allowed.test")))
check(
    "transparent_http_host",
    lambda: exchange(
        ("192.0.2.10", allowed), b"GET / HTTP/1.1\r\nHost: allowed.test\r\nUser-Agent: t\r\n\r\n"
    ),
)
check("transparent_ip_literal", lambda: exchange(("192.0.2.10", allowed), b"SSH-2.0-test\r\n"))
check("gateway_direct", lambda: exchange(("127.0.0.1", gateway), b"gateway-hello"))
check("ipv6_fake", ipv6_fake)
check("getaddrinfo_denied", lambda: socket.getaddrinfo("denied.test", 80))
check("dns_allowed_a", lambda: dns_query("allowed.test", 1))
check("dns_allowed_aaaa", lambda: dns_query("allowed.test", 28))
check("dns_denied", lambda: dns_query("secret.denied.test", 1))
check("dns_to_host_port", lambda: udp_send(("127.0.0.1", PORTS["host_udp"])))
check("udp_out", lambda: udp_send(("192.0.2.1", 53)))
check("direct_to_host_loopback", lambda: exchange(("127.0.0.1", denied), b"direct-hello"))
check("raw_socket", raw_socket)
results["nft_flush"] = run(["nft", "flush", "ruleset"])
results["ip_route_add"] = run(["ip", "route", "add", "192.0.2.0/24", "dev", "lo"])
results["ip_link_add"] = run(["ip", "link", "add", "leak0", "type", "veth", "peer", "name", "leak1"])
check("udp_out_after", lambda: udp_send(("192.0.2.1", 53)))
check("transparent_after", transparent_by_name)
print(json.dumps(results))
