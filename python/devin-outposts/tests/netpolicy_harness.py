"""What the session sandbox's tests run on the host side: fake upstreams on 127.0.0.1, and a test-only
CONNECT server on a Unix socket standing in for the egress proxy. Both record what reaches them, and the
tests judge the sandbox by that (never by what the sandbox says it did).

The CONNECT server decides by its own table (``routes``: ``host:port`` → an upstream port on 127.0.0.1),
not by the policy module: it is the egress proxy's stand-in, and the sandbox's part is to deliver the right
``CONNECT`` lines to it and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import threading
from pathlib import Path
from typing import Optional

import pytest

from devin_outposts.core.netpolicy.probe import probe_host

IN_CI = os.environ.get("CI", "") in ("true", "TRUE", "True", "1", "yes")
#: A TEST-NET-1 address (RFC 5737) nobody routes: inside a sandbox the redirect catches a connection to it
#: and the proxy judges it; nothing can answer from it.
TEST_NET = "192.0.2.1"
#: What a session runs to try each way out (standard library only).
SESSION_CLIENT = Path(__file__).resolve().parent / "netpolicy_session_client.py"


class Upstream:
    """A TCP server on ``host`` (127.0.0.1 by default) that records each connection's first bytes and answers
    ``<name>:`` and them."""

    def __init__(self, name: str, host: str = "127.0.0.1") -> None:
        self.name = name
        self.host = host
        self.received: list[bytes] = []
        self._lock = threading.Lock()
        self._server = socket.create_server((host, 0))
        self.port = self._server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, dummy_peer = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            with contextlib.suppress(OSError):
                data = conn.recv(65536)
                with self._lock:
                    self.received.append(data)
                conn.sendall(self.name.encode() + b":" + data)

    def close(self) -> None:
        self._server.close()


class ConnectServer:
    """The egress proxy's stand-in: every request head it gets is recorded; a ``CONNECT`` to a routed
    ``host:port`` gets ``200`` and a tunnel to the upstream, any other request ``403``."""

    def __init__(self, path: Path, routes: dict[str, int]) -> None:
        self.path = path
        self.routes = routes
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        os.chmod(path, 0o600)
        self._server.listen(64)
        threading.Thread(target=self._serve, daemon=True).start()

    def connects(self) -> list[str]:
        """The request lines received, in order."""
        with self._lock:
            return list(self.requests)

    def _serve(self) -> None:
        while True:
            try:
                conn, dummy_peer = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                head += chunk
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        with self._lock:
            self.requests.append(line)
        words = line.split()
        port = self.routes.get(words[1]) if len(words) == 3 and words[0] == "CONNECT" else None
        if port is None:
            with contextlib.suppress(OSError):
                conn.sendall(
                    b"HTTP/1.1 403 Forbidden\r\nX-Devin-Egress-Denied: test table: not routed\r\n"
                    b"Content-Length: 0\r\n\r\n"
                )
            conn.close()
            return
        rest = head.split(b"\r\n\r\n", 1)[1]
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=30)
        except OSError:
            conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            conn.close()
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if rest:
            upstream.sendall(rest)
        _tunnel(conn, upstream)

    def close(self) -> None:
        self._server.close()


def _tunnel(first: socket.socket, second: socket.socket) -> None:
    def copy(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                data = source.recv(65536)
                if not data:
                    break
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=copy, args=(second, first), daemon=True)
    other.start()
    copy(first, second)
    other.join(60)
    first.close()
    second.close()


class UDPListener:
    """A UDP socket on 127.0.0.1 that records every datagram (it must see none)."""

    def __init__(self) -> None:
        self.datagrams: list[bytes] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data, dummy_peer = self._sock.recvfrom(65536)
            except OSError:
                return
            self.datagrams.append(data)

    def close(self) -> None:
        self._sock.close()


def why_not() -> Optional[str]:
    """Why sessions cannot be confined here (None: they can): the prerequisites, then a trial run."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "the sandbox tests run as root (as CI does), and once as nobody"
    for tool, package in (("unshare", "util-linux"), ("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"{tool} is not installed (Debian package {package})"
    return probe_host()


WHY_NOT = why_not()


def cannot_run(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the sandbox tests must run in CI)", pytrace=False)
    pytest.skip(reason)
