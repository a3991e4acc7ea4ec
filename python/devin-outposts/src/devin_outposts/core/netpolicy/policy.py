"""What a session's ``spec.network_policy`` allows: the one reading of the policy, for every place that runs a
session (the worker, each orchestrator driver, the egress proxy and ``devin-outposts network-policy check``).

The rules (docs/network-policy.md, "What a policy allows"):

* no policy, or ``enabled: false``: nothing is filtered (:attr:`Policy.enforced` is False);
* ``enabled: true``: everything is denied but what a rule allows, on any port (the contract names no ports);
* ``{"hostname": glob}``: case-insensitive, a trailing dot ignored. A leading ``*.`` matches one or more
  labels in front of the rest, never the apex (``*.example.com`` matches ``a.b.example.com``, not
  ``example.com``); any other ``*`` matches one or more characters inside one label, never a dot
  (``api-*.example.com``, ``*.eu-*.example.com``); a glob of ``*`` alone matches every name. Only ``*``
  is special. A hostname rule never matches an IP literal (a rule that spells one is ignored: write it as
  ipv4/ipv6);
* only a host name (labels of letters, digits, ``-`` and ``_``, at most 63 characters each and 253 in all)
  or an IP literal is ever allowed: anything else a client asks for is denied before any rule is read;
* ``{"ipv4": addr/CIDR}``, ``{"ipv6": addr/CIDR}``: the address actually connected to; a bare address is
  /32 or /128; host bits are ignored (``10.0.0.1/8`` is ``10.0.0.0/8``). An IPv4-mapped IPv6 address is
  judged as the IPv4 address it carries, and an ipv6 rule inside ``::ffff:0:0/96`` is read as the IPv4
  network it carries;
* the claim's gateway (host and port of ``gateway_url``) is always allowed, whatever the list says and
  whatever address it resolves to;
* a name allowed by a hostname rule may still only be reached at a public address: a loopback,
  link-local, private, shared (CGNAT), ULA, multicast, reserved or otherwise non-global address is
  refused unless an ipv4/ipv6 rule covers it (the rebinding guard). The list is this module's own
  (:data:`NOT_PUBLIC`, on top of :attr:`ipaddress.IPv4Address.is_global`), so that it does not change with
  the Python version; a 6to4 or NAT64 address is judged by the IPv4 address it carries too;
* a rule this reading cannot use (no key or two, an unknown key, an empty glob, a bad address) allows
  nothing; it is kept in :attr:`Policy.ignored` so that it is logged, and the other rules still apply.

Pure: no I/O, no resolution. The egress proxy resolves names itself and asks :meth:`Policy.check_address`
about the address it will connect to.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union
from urllib.parse import urlsplit

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

RULE_KEYS = ("hostname", "ipv4", "ipv6")
#: Never reached by a hostname rule without an ipv4/ipv6 rule, whatever :attr:`is_global` says in this
#: Python version (its list has changed between versions): this-network, private, shared (CGNAT),
#: loopback, link-local, IETF protocol assignments, benchmarking, multicast, reserved and broadcast;
#: unspecified, loopback, IPv4-compatible, local-use NAT64, ULA, link-local, site-local and multicast.
NOT_PUBLIC: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(network)
    for network in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
        "::/96", "::1/128", "64:ff9b:1::/48", "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_HOST_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_GLOB_LABEL = re.compile(r"[a-z0-9_*-]{1,63}")
GATEWAY_RULE = "the session's gateway"
DEFAULT_DENY = "default deny"
NOT_ENFORCED = "no policy enforced"
REBINDING_GUARD = "rebinding guard"


class PolicyError(ValueError):
    """A policy that is not a policy at all (not an object, ``allow`` not a list): nothing can be allowed."""


@dataclass(frozen=True)
class Decision:
    """One verdict: allowed or not, the rule that decided (as the policy wrote it) and why, in words."""

    allowed: bool
    rule: str
    reason: str

    def describe(self) -> str:
        return f"{'allowed' if self.allowed else 'denied'} by {self.rule}: {self.reason}"


@dataclass(frozen=True)
class HostnameRule:
    """One ``hostname`` glob, normalised (lower case, no trailing dot)."""

    glob: str

    @property
    def label(self) -> str:
        return f"hostname {self.glob}"

    def matches(self, name: str) -> bool:
        """Whether ``name`` (normalised, a valid host name) is one this glob allows."""
        if self.glob == "*":
            return True
        pattern, labels = self.glob.split("."), name.split(".")
        if pattern[0] == "*":
            # "*." then the rest: at least one label in front of labels that match the rest.
            rest = pattern[1:]
            return len(labels) > len(rest) and _labels_match(rest, labels[-len(rest) :])
        return _labels_match(pattern, labels)


@dataclass(frozen=True)
class NetworkRule:
    """One ``ipv4``/``ipv6`` rule as a network."""

    network: IPNetwork
    #: The rule as the policy wrote it (its key, then its value).
    label: str

    def covers(self, address: IPAddress) -> bool:
        return address.version == self.network.version and address in self.network


@dataclass(frozen=True)
class Policy:
    """A session's network policy, read once; ask it about names and addresses."""

    enforced: bool
    hostnames: tuple[HostnameRule, ...] = ()
    networks: tuple[NetworkRule, ...] = ()
    #: ``(host, port)`` of the claim's gateway, always allowed (None: the claim named none).
    gateway: Optional[tuple[str, int]] = None
    #: The rules that allow nothing, each with why (to be logged).
    ignored: tuple[str, ...] = field(default=())

    @classmethod
    def from_spec(cls, spec: Optional[Mapping[str, Any]], gateway_url: Optional[str] = None) -> Policy:
        """Read ``spec.network_policy`` (a dict as on the wire, or None) and the claim's ``gateway_url``.

        Raises :class:`PolicyError` when ``spec`` is not an object or its ``allow`` is not a list.
        """
        gateway = gateway_endpoint(gateway_url) if gateway_url else None
        if spec is None:
            return cls(enforced=False, gateway=gateway)
        if not isinstance(spec, Mapping):
            raise PolicyError(f"a network policy must be an object, not {type(spec).__name__}")
        if not spec.get("enabled"):
            return cls(enforced=False, gateway=gateway)
        rules = spec.get("allow")
        rules = [] if rules is None else rules
        if not isinstance(rules, list):
            raise PolicyError(f"a network policy's allow must be a list, not {type(rules).__name__}")
        hostnames, networks, ignored = _read_rules(rules)
        return cls(True, tuple(hostnames), tuple(networks), gateway, tuple(ignored))

    def check_name(self, host: str, port: int) -> Decision:
        """May a connection to ``host:port`` be attempted at all (before the proxy resolves anything)?

        ``host`` is a name or an IP literal (IPv6 with or without brackets).
        """
        if not self.enforced:
            return Decision(True, NOT_ENFORCED, "the session's policy is not enabled")
        name = normalise_host(host)
        if self._is_gateway(name, port):
            return Decision(True, GATEWAY_RULE, f"{name}:{port} is the claim's gateway")
        literal = ip_literal(name)
        if literal is not None:
            return self._check_literal(literal)
        if not is_host_name(name):
            return Decision(False, DEFAULT_DENY, f"{name!r} is neither a host name nor an IP address")
        for rule in self.hostnames:
            if rule.matches(name):
                return Decision(True, rule.label, f"{name} matches {rule.glob}")
        return Decision(False, DEFAULT_DENY, f"no rule allows {name}")

    def check_address(self, host: str, port: int, address: Union[str, IPAddress]) -> Decision:
        """May the proxy connect to ``address``, which it resolved for ``host`` (or ``host`` itself)?"""
        if not self.enforced:
            return Decision(True, NOT_ENFORCED, "the session's policy is not enabled")
        name = normalise_host(host)
        ip = _unmapped(ipaddress.ip_address(address) if isinstance(address, str) else address)
        if self._is_gateway(name, port):
            return Decision(True, GATEWAY_RULE, f"{name}:{port} is the claim's gateway ({ip})")
        by_name = self.check_name(name, port)
        if not by_name.allowed:
            return by_name
        covering = self._covering(ip)
        if covering is not None:
            return Decision(True, covering.label, f"{ip} is in {covering.network}")
        if ip_literal(name) is not None:
            return Decision(False, DEFAULT_DENY, f"no ipv{ip.version} rule covers {ip}")
        if not is_public(ip):
            return Decision(
                False,
                REBINDING_GUARD,
                f"{name} resolved to {ip}, not a public address, and no ipv{ip.version} rule covers it",
            )
        return Decision(True, by_name.rule, f"{by_name.reason}, at {ip}")

    def _check_literal(self, literal: IPAddress) -> Decision:
        covering = self._covering(literal)
        if covering is not None:
            return Decision(True, covering.label, f"{literal} is in {covering.network}")
        return Decision(False, DEFAULT_DENY, f"no ipv{literal.version} rule covers {literal}")

    def _covering(self, ip: IPAddress) -> Optional[NetworkRule]:
        return next((rule for rule in self.networks if rule.covers(ip)), None)

    def _is_gateway(self, name: str, port: int) -> bool:
        return self.gateway is not None and self.gateway == (name, port)


def gateway_endpoint(gateway_url: str) -> tuple[str, int]:
    """``(host, port)`` of a gateway URL (wss and https default to 443, ws and http to 80)."""
    parts = urlsplit(gateway_url)
    if not parts.hostname:
        raise PolicyError(f"the gateway URL {gateway_url!r} has no host")
    default = 80 if parts.scheme in ("ws", "http") else 443
    return normalise_host(parts.hostname), parts.port or default


def normalise_host(host: str) -> str:
    """Lower case, without a trailing dot or IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") else host


def ip_literal(host: str) -> Optional[IPAddress]:
    """The address ``host`` spells, if it is an IP literal (an IPv4-mapped IPv6 one as IPv4)."""
    try:
        return _unmapped(ipaddress.ip_address(normalise_host(host)))
    except ValueError:
        return None


def is_host_name(name: str) -> bool:
    """Whether ``name`` (normalised) is a DNS host name: labels of letters, digits, ``-`` and ``_``."""
    return len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def is_public(ip: IPAddress) -> bool:
    """Whether a name allowed by a hostname rule may be reached at ``ip`` without an ipv4/ipv6 rule (the
    rebinding guard): a global unicast address in none of :data:`NOT_PUBLIC`, nor a 6to4 or NAT64 address
    that carries such an IPv4 address."""
    ip = _unmapped(ip)
    if not ip.is_global or ip.is_multicast or any(ip in network for network in NOT_PUBLIC):
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        carried = ip.sixtofour
        if carried is None and ip in _NAT64:
            carried = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if carried is not None:
            return is_public(carried)
    return True


def _unmapped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _unmapped_network(network: IPNetwork) -> IPNetwork:
    """An IPv6 network inside ``::ffff:0:0/96`` as the IPv4 network it carries (addresses are judged so)."""
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        carried = network.network_address.ipv4_mapped
        if carried is not None:
            return ipaddress.IPv4Network((carried, network.prefixlen - 96))
    return network


def _labels_match(pattern: list[str], labels: list[str]) -> bool:
    """One pattern label per name label; ``*`` in a pattern label matches one or more characters, no dot."""
    if len(pattern) != len(labels):
        return False
    return all(_label_matches(p, label) for p, label in zip(pattern, labels))


def _label_matches(pattern: str, label: str) -> bool:
    if "*" not in pattern:
        return pattern == label
    return re.fullmatch("[^.]+".join(map(re.escape, re.split(r"\*+", pattern))), label) is not None


def _read_rules(rules: Iterable[Any]) -> tuple[list[HostnameRule], list[NetworkRule], list[str]]:
    hostnames: list[HostnameRule] = []
    networks: list[NetworkRule] = []
    ignored: list[str] = []
    for index, rule in enumerate(rules):
        problem = _rule_problem(rule)
        if problem:
            ignored.append(f"rule {index} ({rule!r}): {problem}")
            continue
        key, value = next((k, v) for k, v in rule.items() if v is not None)
        if key == "hostname":
            hostnames.append(HostnameRule(normalise_host(value)))
            continue
        try:
            network = ipaddress.ip_network(value.strip(), strict=False)
        except ValueError as exc:
            ignored.append(f"rule {index} ({rule!r}): {exc}")
            continue
        if f"ipv{network.version}" != key:
            ignored.append(f"rule {index} ({rule!r}): {value} is not an IPv{key[-1]} address")
            continue
        networks.append(NetworkRule(_unmapped_network(network), f"{key} {value.strip()}"))
    return hostnames, networks, ignored


def _rule_problem(rule: Any) -> Optional[str]:
    if not isinstance(rule, Mapping):
        return "a rule must be an object"
    present = {key: value for key, value in rule.items() if value is not None}
    unknown = sorted(set(present) - set(RULE_KEYS))
    if unknown:
        return f"unknown key(s) {', '.join(map(str, unknown))}: a rule this worker cannot read allows nothing"
    if len(present) != 1:
        return "a rule must have exactly one of hostname, ipv4, ipv6"
    value = next(iter(present.values()))
    if not isinstance(value, str) or not value.strip():
        return "the value must be a non-empty string"
    if "hostname" in present:
        glob = normalise_host(value)
        if ip_literal(glob) is not None:
            return f"{value!r} is an IP address, which a hostname rule never matches: write it as ipv4/ipv6"
        if len(glob) > 253 or not all(_GLOB_LABEL.fullmatch(label) for label in glob.split(".")):
            return f"{value!r} is not a hostname glob"
    return None
