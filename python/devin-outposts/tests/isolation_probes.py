"""Run inside a confined session (by the stand-in ``devin-remote``, as a brain's command): try every way out
of its sandbox that a test names, and print one JSON object per probe. Standard library only; it judges
nothing itself: the tests judge by what each probe got and by what the upstreams, services and files on the
host saw.

    python isolation_probes.py '[["proxy", "127.0.0.3", 8080], ["sockets", "127.0.0.3:8080"], ...]'

* ``proxy host port``: ``CONNECT host:port`` to the explicit proxy (``HTTPS_PROXY``), then a request;
* ``connect_trick name line``: one raw request ``line`` (``\\r\\n`` separated, sent as given) to the
  explicit proxy; its status line and what followed;
* ``direct host port``: a TCP connect (IPv4, IPv6 or an IPv4-mapped IPv6 address) and a request;
* ``udp host port``, ``resolve name``, ``icmp host``: a datagram, ``getaddrinfo``, a raw ICMP echo;
* ``namespace``: ``nft flush ruleset``, ``ip link add``, ``ip route add``, and joining init's namespaces;
* ``sockets target``: every Unix socket file the session can find (the whole file system but /proc, /sys
  and /dev), each asked ``CONNECT target``; which it could connect to, and which said 200;
* ``connect path...``: a connect to each Unix socket path;
* ``read path...`` / ``write path...``: open each to read / to append (and, for a directory, to make a file
  in it); what happened;
* ``environ marker...``: every ``/proc/<pid>/environ`` the session can read: which carry a marker (by its
  index: a marker may be a token);
* ``signal pid...``: ``kill(pid, 0)`` for each;
* ``identity``: the session's ids, ``HOME``, the processes it sees.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from typing import Any, Callable
from urllib.parse import urlsplit

TIMEOUT = 5.0
SKIPPED_TREES = ("/proc", "/sys", "/dev")
MAX_ENTRIES = 400_000


def _proxy_address() -> tuple[str, int]:
    proxy = urlsplit(os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or "")
    if not proxy.hostname or not proxy.port:
        raise OSError("no HTTPS_PROXY in the environment")
    return proxy.hostname, proxy.port


def _read_head(conn: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 65536:
        chunk = conn.recv(4096)
        if not chunk:
            break
        head += chunk
    return head


def _status(head: bytes) -> int:
    return int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") and head.count(b" ") >= 1 else 0


def proxy(host: str, port: int) -> dict[str, Any]:
    with socket.create_connection(_proxy_address(), timeout=TIMEOUT) as conn:
        conn.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        status = _status(_read_head(conn))
        reply = b""
        if status == 200:
            conn.sendall(f"GET /from-session HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            reply = _read_some(conn)
        return {"status": status, "reply": reply.decode("latin-1")}


def connect_trick(name: str, line: str) -> dict[str, Any]:
    with socket.create_connection(_proxy_address(), timeout=TIMEOUT) as conn:
        conn.sendall(line.encode("latin-1"))
        head = _read_head(conn)
        return {"name": name, "status": _status(head), "reply": (head + _read_some(conn)).decode("latin-1")}


def direct(host: str, port: int) -> dict[str, Any]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as conn:
        conn.settimeout(TIMEOUT)
        conn.connect((host, port))
        conn.sendall(b"GET /direct HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
        return {"reply": _read_some(conn).decode("latin-1")}


def udp(host: str, port: int) -> dict[str, Any]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"hello", (host, port))
    return {"sent": True}


def resolve(name: str) -> dict[str, Any]:
    return {"addresses": sorted({info[4][0] for info in socket.getaddrinfo(name, 443)})}


def icmp(host: str) -> dict[str, Any]:
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        sock.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", (host, 0))
    return {"sent": True}


def namespace() -> dict[str, Any]:
    outcome: dict[str, Any] = {}
    nft, ip = (shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin") or tool for tool in ("nft", "ip"))
    for name, argv in (
        ("nft_flush", [nft, "flush", "ruleset"]),
        ("ip_link_add", [ip, "link", "add", "escape0", "type", "dummy"]),
        ("ip_route_add", [ip, "route", "add", "192.0.2.0/24", "dev", "lo"]),
    ):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT, check=False)
            outcome[name] = done.returncode
        except OSError as exc:
            outcome[name] = f"{type(exc).__name__}"
    libc = ctypes.CDLL(None, use_errno=True)
    for kind in ("net", "mnt", "user", "pid"):
        try:
            fd = os.open(f"/proc/1/ns/{kind}", os.O_RDONLY)
        except OSError as exc:
            outcome[f"setns_{kind}"] = type(exc).__name__
            continue
        try:
            joined = libc.setns(fd, 0) == 0
            outcome[f"setns_{kind}"] = "joined" if joined else os.strerror(ctypes.get_errno())
        finally:
            os.close(fd)
    return outcome


def sockets(target: str) -> dict[str, Any]:
    found, connected, answered, seen = [], [], [], 0
    for top, dirs, files in os.walk("/", onerror=lambda error: None):
        if top.startswith(SKIPPED_TREES) and top != "/":
            dirs[:] = []
            continue
        seen += len(files)
        if seen > MAX_ENTRIES:
            break
        for name in files:
            path = os.path.join(top, name)
            try:
                if not stat.S_ISSOCK(os.lstat(path).st_mode):
                    continue
            except OSError:
                continue
            found.append(path)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                    conn.settimeout(2)
                    conn.connect(path)
                    connected.append(path)
                    conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
                    if _status(_read_head(conn)) == 200:
                        answered.append(path)
            except OSError:
                continue
    return {"found": found, "connected": connected, "answered": answered}


def connect(*paths: str) -> dict[str, Any]:
    outcome = {}
    for path in paths:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(2)
                conn.connect(path)
                outcome[path] = "connected"
        except OSError as exc:
            outcome[path] = type(exc).__name__
    return {"connect": outcome}


def read(*paths: str) -> dict[str, Any]:
    outcome = {}
    for path in paths:
        try:
            if os.path.isdir(path):
                outcome[path] = f"listed {len(os.listdir(path))}"
            else:
                with open(path, "rb") as handle:
                    outcome[path] = f"read {len(handle.read(4096))}"
        except OSError as exc:
            outcome[path] = type(exc).__name__
    return {"read": outcome}


def write(*paths: str) -> dict[str, Any]:
    outcome = {}
    for path in paths:
        try:
            if os.path.isdir(path):
                with open(os.path.join(path, "written-by-a-session"), "x") as handle:
                    handle.write("escape")
            else:
                with open(path, "a") as handle:
                    handle.write("\n# written by a session\n")
            outcome[path] = "written"
        except OSError as exc:
            outcome[path] = type(exc).__name__
    return {"write": outcome}


def environ(*markers: str) -> dict[str, Any]:
    readable, carrying = 0, []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        readable += 1
        carrying += [(int(entry), index) for index, marker in enumerate(markers) if marker.encode() in data]
    return {"readable": readable, "carrying": carrying}  # the markers' indexes: a marker may be a secret


def signal_(*pids: int) -> dict[str, Any]:
    outcome = {}
    for pid in pids:
        try:
            os.kill(pid, 0)
            outcome[str(pid)] = "signalled"
        except OSError as exc:
            outcome[str(pid)] = type(exc).__name__
    return {"signal": outcome}


def identity() -> dict[str, Any]:
    pids = sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit())
    return {"uid": os.getuid(), "gid": os.getgid(), "home": os.environ.get("HOME"), "pids": pids}


def _read_some(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except OSError:
        return b""


PROBES: dict[str, Callable[..., dict[str, Any]]] = {
    "proxy": proxy,
    "connect_trick": connect_trick,
    "direct": direct,
    "udp": udp,
    "resolve": resolve,
    "icmp": icmp,
    "namespace": namespace,
    "sockets": sockets,
    "connect": connect,
    "read": read,
    "write": write,
    "environ": environ,
    "signal": signal_,
    "identity": identity,
}


def main() -> int:
    for kind, *args in json.loads(sys.argv[1]):
        try:
            outcome = PROBES[kind](*args)
        except OSError as exc:
            outcome = {"error": f"{type(exc).__name__}: {exc}", "errno": exc.errno}
        print(json.dumps({"probe": [kind, *args], **outcome}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
