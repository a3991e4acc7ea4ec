"""Run inside a session (by the stand-in ``devin-remote``, as a brain's command): try each way out that a
test names, and print one JSON object per attempt. Standard library only; it judges nothing itself.

    python netpolicy_session_client.py '[["proxy", "127.0.0.1", 8080], ["direct", "192.0.2.1", 80], ["udp",
    "192.0.2.1", 53], ["resolve", "denied.example"]]'

* ``proxy``: ``CONNECT host:port`` to the explicit proxy (``HTTPS_PROXY``'s host and port, whatever
  ``NO_PROXY`` says), then a plain HTTP request whose Host is ``host``; the proxy's status and the reply;
* ``direct``: a TCP connect to ``host:port``, a line, and what comes back;
* ``udp``: one datagram to ``host:port``;
* ``resolve``: ``getaddrinfo``.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from urllib.parse import urlsplit

TIMEOUT = 10.0


def through_proxy(host: str, port: int) -> dict[str, object]:
    proxy = urlsplit(os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or "")
    if not proxy.hostname or not proxy.port:
        return {"error": "no HTTPS_PROXY in the environment"}
    with socket.create_connection((proxy.hostname, proxy.port), timeout=TIMEOUT) as conn:
        conn.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
        reply = b""
        if status == 200:
            conn.sendall(f"GET /from-session HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            reply = _read_some(conn)
        return {"status": status, "reply": reply.decode("latin-1")}


def direct(host: str, port: int) -> dict[str, object]:
    with socket.create_connection((host, port), timeout=TIMEOUT) as conn:
        conn.sendall(b"GET /direct HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
        return {"reply": _read_some(conn).decode("latin-1")}


def udp(host: str, port: int) -> dict[str, object]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"hello", (host, port))
    return {"sent": True}


def resolve(host: str) -> dict[str, object]:
    return {"addresses": sorted({info[4][0] for info in socket.getaddrinfo(host, 443)})}


def _read_some(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except OSError:
        return b""


def main() -> int:
    attempts = {"proxy": through_proxy, "direct": direct, "udp": udp, "resolve": resolve}
    for kind, *args in json.loads(sys.argv[1]):
        try:
            outcome = attempts[kind](*args)
        except OSError as exc:
            outcome = {"error": f"{type(exc).__name__}: {exc}", "errno": exc.errno}
        print(json.dumps({"attempt": [kind, *args], **outcome}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
