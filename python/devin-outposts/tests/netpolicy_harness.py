"""What the session sandbox's tests run on the host side: fake upstreams on 127.0.0.1, and a test-only
CONNECT server behind a doorway standing in for the egress proxy. Both record what reaches them, and the
tests judge the sandbox by that (never by what the sandbox says it did).

The CONNECT server decides by its own table (``routes``: ``host:port`` → an upstream port on 127.0.0.1),
not by the policy module: it is the egress proxy's stand-in, and the sandbox's part is to deliver the right
``CONNECT`` lines to it and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from devin_outposts.core.netpolicy import doorway
from devin_outposts.core.netpolicy.probe import probe_host
from devin_outposts_sim.remote import tools

IN_CI = os.environ.get("CI", "") in ("true", "TRUE", "True", "1", "yes")
#: A TEST-NET-1 address (RFC 5737) nobody routes: inside a sandbox the redirect catches a connection to it
#: and the proxy judges it; nothing can answer from it.
TEST_NET = "192.0.2.1"
#: What a session runs to try each way out (standard library only).
SESSION_CLIENT = Path(__file__).resolve().parent / "netpolicy_session_client.py"
#: The policy of the end-to-end confinement tests: the host's loopback address, and ``localhost``, a name
#: the proxy resolves with its own resolver to that address (without the ipv4 rule the rebinding guard
#: refuses it).
LOOPBACK_POLICY: dict[str, Any] = {
    "enabled": True,
    "allow": [{"ipv4": "127.0.0.1/32"}, {"hostname": "localhost"}],
}


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
    """The egress proxy's stand-in, behind a doorway (core/netpolicy/doorway.py) as the real one is: every
    request head it gets is recorded; a ``CONNECT`` to a routed ``host:port`` gets ``200`` and a tunnel to
    the upstream, any other request ``403``. :attr:`launcher_end` is what the launcher inherits."""

    def __init__(self, routes: dict[str, int]) -> None:
        self.routes = routes
        self.requests: list[str] = []
        self._lock = threading.Lock()
        self._server, self.launcher_end = doorway.pair()
        self._server.setblocking(True)
        threading.Thread(target=self._serve, daemon=True).start()

    def connects(self) -> list[str]:
        """The request lines received, in order."""
        with self._lock:
            return list(self.requests)

    def _serve(self) -> None:
        while True:
            try:
                connections, ended = doorway.receive(self._server)
            except OSError:
                return
            for conn in connections:
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()
            if ended:
                return

    def _one(self, conn: socket.socket) -> None:
        conn.setblocking(True)
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
        self.launcher_end.close()


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
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"{tool} is not installed (Debian package {package})"
    return probe_host()


WHY_NOT = why_not()


def cannot_run(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the sandbox tests must run in CI)", pytrace=False)
    pytest.skip(reason)


def confinement_plan(allowed: Upstream, denied: Upstream) -> list[list[Any]]:
    """What a confined session tries (the session client's plan), for :data:`LOOPBACK_POLICY`: the allowed
    upstream by address and by name, the denied one, a denied name, a direct connection and UDP to TEST-NET,
    and DNS for the denied name."""
    return [
        ["proxy", "127.0.0.1", allowed.port],
        ["proxy", "localhost", allowed.port],
        ["proxy", "127.0.0.2", denied.port],
        ["proxy", "denied.example", 443],
        ["direct", TEST_NET, 80],
        ["udp", TEST_NET, 53],
        ["resolve", "denied.example"],
    ]


def client_calls_in_a_machine(plan: list[list[Any]], python: str = "python3") -> list[dict[str, Any]]:
    """The brain's tool calls that run the session client with ``plan`` where the session does not see this
    checkout (a container, a Pod, or a confined session, which sees neither /tmp nor the worker's
    directories): write it into the session's working directory, run it there with ``python``."""
    return [
        tools.write("netpolicy_client.py", SESSION_CLIENT.read_text()),
        tools.run([python, "netpolicy_client.py", json.dumps(plan)]),
    ]


def attempts_by_kind(output: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The session client's JSON lines in ``output``, by (kind, destination)."""
    lines = (json.loads(line) for line in output.splitlines() if line.startswith("{"))
    return {(r["attempt"][0], r["attempt"][1]): r for r in lines}


def assert_confined(output: str, allowed: Upstream, denied: Upstream) -> None:
    """What :func:`confinement_plan` must show from inside a confined session, and what the upstreams saw:
    the allowed one the two requests, the denied one nothing."""
    results = attempts_by_kind(output)
    for destination in ("127.0.0.1", "localhost"):
        assert results[("proxy", destination)]["status"] == 200, output
        assert results[("proxy", destination)]["reply"].startswith("allowed:GET /from-session"), output
    assert results[("proxy", "127.0.0.2")]["status"] == 403, output
    assert results[("proxy", "denied.example")]["status"] == 403, output
    # A plain HTTP client the redirect caught is answered as the explicit proxy answers (403, and why).
    direct = results[("direct", TEST_NET)]["reply"]
    assert direct.startswith("HTTP/1.1 403 Forbidden\r\n"), output
    assert f"X-Devin-Egress-Denied: default deny: no ipv4 rule covers {TEST_NET}\r\n" in direct, output
    assert "error" in results[("udp", TEST_NET)], output
    assert "error" in results[("resolve", "denied.example")], output
    assert [data.split(b"\r\n", 1)[0] for data in allowed.received] == [b"GET /from-session HTTP/1.1"] * 2
    assert denied.received == []


def listening(path: Path) -> socket.socket:
    """A Unix socket service at ``path`` that accepts nothing by itself: a test asks it whether anybody
    connected (``accept`` raises BlockingIOError while nobody did)."""
    service = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    service.bind(str(path))
    service.listen(4)
    service.setblocking(False)
    return service
