"""The session's network namespace, seen from inside: its addresses, its nftables table, setting them up and
checking that it has no way out (docs/network-policy.md, "How a session is confined").

The launcher (:mod:`.launcher`) runs this as root of a fresh user namespace that owns a fresh network
namespace and a mount namespace of its own (``unshare --user --map-root-user --net --mount``): it may
change these, and nothing else.

The layout, once set up:

* ``lo`` is the only link. It carries 127.0.0.0/8 and ::1, :data:`SOURCE_V4` and :data:`SOURCE_V6` (the
  addresses a connection to anywhere else leaves from: a default route needs a source address that is not
  host-scoped, or the kernel picks 0.0.0.0 and the redirected connection never completes), and each
  nameserver address of the host's ``/etc/resolv.conf`` (the session reads the same file; the stub DNS
  listens there);
* a default route over ``lo`` (IPv4, and IPv6 where the kernel has it), so that a ``connect()`` to any
  address reaches the nat hook instead of failing with ENETUNREACH;
* the table ``inet devin_outposts``: TCP to anything that is not an address of this namespace is redirected
  to the shim's transparent port (TCP to the gateway's port on loopback too, when the gateway is on the host's
  loopback: the session's own loopback is not the host's); everything else outbound to a non-local address
  (UDP, ICMP, raw, SCTP...) is dropped, so ``sendto`` fails with EPERM.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import shim
from .policy import IPAddress, ip_literal

assert sys.platform == "linux"  # network namespaces and nftables are Linux's (mypy skips the rest elsewhere)

#: The explicit proxy (``HTTPS_PROXY``): its bytes go to the egress proxy unparsed.
EXPLICIT_PORT = 3128
#: Where the nat table redirects every other TCP connection.
TRANSPARENT_PORT = 3129
DNS_PORT = 53
TABLE = "devin_outposts"
#: Where connections to other hosts leave from (RFC 2544 benchmarking range: never a real host's).
SOURCE_V4 = ipaddress.IPv4Address("198.18.0.1")
SOURCE_V6 = ipaddress.IPv6Address("fd64:6576:696e::1")
#: The stub DNS's fake addresses, one per allowed name (:class:`~.stubdns.FakeAddressBook`).
FAKE_POOL_V4 = ipaddress.IPv4Network("198.19.0.0/16")
FAKE_POOL_V6 = ipaddress.IPv6Network("fd64:6576:696e:5353::/64")
#: The stub DNS always answers here too (systemd-resolved's stub address, and the classic one).
ALWAYS_NAMESERVERS = (ipaddress.ip_address("127.0.0.53"), ipaddress.ip_address("127.0.0.1"))
#: Where the preflight's probes go: TEST-NET addresses, routed like any public address, owned by nobody.
CANARY_V4 = ipaddress.IPv4Address("192.0.2.1")
CANARY_V6 = ipaddress.IPv6Address("2001:db8::1")
CANARY_PORT = 9
RESOLV_CONF = Path("/etc/resolv.conf")
_SIOCGIFFLAGS = 0x8913


class SetupError(RuntimeError):
    """The namespace could not be set up (``ip`` or ``nft`` refused, or this is not a fresh namespace)."""


class MissingToolError(SetupError):
    """``ip`` (iproute2) or ``nft`` (nftables) is not installed."""


class NotIsolatedError(RuntimeError):
    """The preflight found a way out of the namespace; the session must not start."""


@dataclass(frozen=True)
class Layout:
    """What :func:`set_up` made: the addresses the stub DNS listens on, whether IPv6 works in here."""

    nameservers: tuple[IPAddress, ...]
    ipv6: bool
    #: ``(host, port)`` of a gateway on the host's loopback, reached through the redirect; None otherwise.
    loopback_gateway: Optional[tuple[str, int]] = None


def host_nameservers(resolv_conf: Path = RESOLV_CONF) -> list[IPAddress]:
    """The unscoped nameserver addresses of ``resolv.conf`` (a missing or unreadable file has none)."""
    try:
        lines = resolv_conf.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found: list[IPAddress] = []
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver" and "%" not in words[1]:
            try:
                address = ipaddress.ip_address(words[1])
            except ValueError:
                continue
            if address not in found:
                found.append(address)
    return found


def loopback_gateway(gateway: Optional[tuple[str, int]]) -> Optional[tuple[str, int]]:
    """The gateway when its host is on the host's loopback (``localhost``, 127.0.0.0/8, ::1), else None."""
    if gateway is None:
        return None
    host = gateway[0]
    literal = ip_literal(host)
    if host == "localhost" or host.endswith(".localhost") or (literal is not None and literal.is_loopback):
        return gateway
    return None


def ruleset(gateway_port: Optional[int]) -> str:
    """The nftables table of the namespace (``nft -f`` input). ``gateway_port``: redirect loopback TCP to
    that port too (the gateway lives on the host's loopback, see :func:`loopback_gateway`)."""
    gateway_rules = ""
    if gateway_port is not None:
        gateway_rules = (
            f"        ip daddr 127.0.0.0/8 tcp dport {gateway_port} redirect to :{TRANSPARENT_PORT}\n"
            f"        ip6 daddr ::1 tcp dport {gateway_port} redirect to :{TRANSPARENT_PORT}\n"
        )
    return (
        f"table inet {TABLE} {{\n"
        "    chain redirect_tcp {\n"
        "        type nat hook output priority -100; policy accept;\n"
        f"{gateway_rules}"
        "        fib daddr type local return\n"
        f"        meta l4proto tcp redirect to :{TRANSPARENT_PORT}\n"
        "    }\n"
        "    chain only_local {\n"
        "        type filter hook output priority 0; policy drop;\n"
        "        fib daddr type local accept\n"
        "    }\n"
        "}\n"
    )


def set_up(gateway: Optional[tuple[str, int]], resolv_conf: Path = RESOLV_CONF) -> Layout:
    """Set up the namespace this process is in; refuses (:class:`SetupError`) unless it is a fresh one.

    A fresh namespace has ``lo`` alone, down: the host's namespace never looks like that, so a launcher
    started without ``unshare`` cannot change the host's routes or firewall.
    """
    ip_tool, nft_tool = _tool("ip", "iproute2"), _tool("nft", "nftables")
    check_fresh()
    nameservers = [a for a in host_nameservers(resolv_conf) if not a.is_loopback]
    commands: list[list[str]] = [[ip_tool, "link", "set", "lo", "up"]]
    commands += [
        [ip_tool, "address", "add", f"{a}/{a.max_prefixlen}", "dev", "lo"]
        for a in nameservers
        if a.version == 4
    ]
    commands += [
        [ip_tool, "address", "add", f"{SOURCE_V4}/32", "dev", "lo"],
        [ip_tool, "route", "add", "default", "dev", "lo", "src", str(SOURCE_V4)],
    ]
    for command in commands:
        _run(command)
    ipv6 = _set_up_ipv6(ip_tool, [a for a in nameservers if a.version == 6])
    on_loopback = loopback_gateway(gateway)
    _run([nft_tool, "-f", "-"], stdin=ruleset(on_loopback[1] if on_loopback else None))
    listening = tuple(a for a in (*nameservers, *ALWAYS_NAMESERVERS) if a.version == 4 or ipv6)
    return Layout(tuple(dict.fromkeys(listening)), ipv6, on_loopback)


def check_fresh() -> None:
    """Refuse a namespace that is not fresh: any link but ``lo``, or ``lo`` already up."""
    names = link_names()
    if names != ["lo"]:
        raise SetupError(
            f"refusing to set up a network namespace with links {', '.join(names)}: not a fresh one"
        )
    if _lo_is_up():
        raise SetupError("refusing to set up a network namespace whose lo is up: not a fresh one")


def link_names() -> list[str]:
    return sorted(name for dummy_index, name in socket.if_nameindex())


def preflight(layout: Layout, transparent: Sequence[socket.socket]) -> None:
    """Before the session starts: only ``lo``, the table in place, and probes to a canary address that hit
    the drop (UDP) and the redirect (TCP, seen arriving on ``transparent``) instead of a route.

    Raises :class:`NotIsolatedError` with what was found.
    """
    names = link_names()
    if names != ["lo"]:
        raise NotIsolatedError(f"the namespace has links other than lo: {', '.join(names)}")
    listing = _run([_tool("nft", "nftables"), "list", "table", "inet", TABLE])
    for needed in (f"redirect to :{TRANSPARENT_PORT}", "policy drop"):
        if needed not in listing:
            raise NotIsolatedError(f"the nftables table {TABLE} has no {needed!r}")
    canaries: list[IPAddress] = [CANARY_V4, CANARY_V6] if layout.ipv6 else [CANARY_V4]
    for canary in canaries:
        _udp_is_dropped(canary)
        listener = next((s for s in transparent if s.family == _family(canary)), None)
        if listener is None:
            raise NotIsolatedError(f"no transparent listener for IPv{canary.version}")
        _tcp_is_redirected(canary, listener)


def _set_up_ipv6(ip_tool: str, nameservers: Iterable[IPAddress]) -> bool:
    """IPv6 where the kernel has it. Where it does not (``ipv6.disable=1``, ``disable_ipv6``), a
    session's IPv6 connects fail with ENETUNREACH and the table drops the rest: closed either way, so this
    is no error."""
    commands = [[ip_tool, "-6", "address", "add", f"{SOURCE_V6}/128", "dev", "lo", "nodad"]]
    commands += [[ip_tool, "-6", "address", "add", f"{a}/128", "dev", "lo", "nodad"] for a in nameservers]
    commands.append([ip_tool, "-6", "route", "add", "default", "dev", "lo", "src", str(SOURCE_V6)])
    try:
        for command in commands:
            _run(command)
    except SetupError:
        return False
    return True


def _udp_is_dropped(canary: IPAddress) -> None:
    with socket.socket(_family(canary), socket.SOCK_DGRAM) as probe:
        try:
            probe.sendto(b"devin-outposts preflight", (str(canary), CANARY_PORT))
        except PermissionError:
            return  # the drop rule
        except OSError as exc:
            raise NotIsolatedError(
                f"a UDP send to {canary} failed with {exc}, not the drop rule's EPERM"
            ) from exc
    raise NotIsolatedError(f"a UDP datagram to {canary} could be sent: nothing drops it")


def _tcp_is_redirected(canary: IPAddress, listener: socket.socket) -> None:
    with socket.socket(_family(canary), socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        error = probe.connect_ex((str(canary), CANARY_PORT))
        if error not in (0, errno.EINPROGRESS):
            name = errno.errorcode.get(error, str(error))
            raise NotIsolatedError(f"a TCP connect to {canary} failed with {name}, not the redirect")
        listener.settimeout(5)
        try:
            accepted, dummy_peer = listener.accept()
        except OSError as exc:
            raise NotIsolatedError(f"a TCP connect to {canary} did not reach the redirect ({exc})") from exc
        finally:
            listener.settimeout(None)
        with accepted:
            try:
                destination = shim.original_destination(accepted)
            except OSError as exc:
                raise NotIsolatedError(
                    f"the connection that arrived has no original destination ({exc})"
                ) from exc
    if destination != (canary, CANARY_PORT):
        where = f"{destination[0]}:{destination[1]}"
        raise NotIsolatedError(f"a TCP connect to {canary} arrived as one to {where}")


def _family(address: IPAddress) -> socket.AddressFamily:
    return socket.AF_INET6 if address.version == 6 else socket.AF_INET


def _tool(name: str, package: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin") / name, Path("/sbin") / name) if p.exists()), None
    )
    if found is None:
        raise MissingToolError(f"{name} is not installed (Debian package {package})")
    return found


def _run(command: list[str], stdin: Optional[str] = None) -> str:
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        said = " ".join((result.stderr or result.stdout).split())[:300]
        raise SetupError(f"{' '.join(command[:4])} failed ({result.returncode}): {said}")
    return result.stdout


def _lo_is_up() -> bool:
    """IFF_UP of this namespace's ``lo`` (SIOCGIFFLAGS: /sys/class/net shows the namespace /sys was mounted
    in, the host's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as handle:
        request = struct.pack("16sH14x", b"lo", 0)
        flags: int = struct.unpack_from("16sH", fcntl.ioctl(handle.fileno(), _SIOCGIFFLAGS, request))[1]
    return bool(flags & 1)
