"""What a session's ``spec.network_policy`` allows: the one reading of the policy, for every place that runs a
session (the worker, each orchestrator driver, the egress proxy and ``devin-outposts network-policy check``).

The rules (docs/network-policy.md, "What a policy allows"):

* no policy, or ``enabled: false``: nothing is filtered (:attr:`Policy.enforced` is False);
* ``enabled: true``: everything is denied but what a rule allows, on any port (the contract names no ports);
* ``{"hostname": glob}``: case-insensitive, a trailing dot ignored. A leading ``*.`` matches one or more
  labels in front of the rest, never the apex (``*.example.com`` matches ``a.b.example.com``, not
  ``example.com``); any other ``*`` matches one or more characters inside one label, never a dot; a glob of
  ``*`` alone matches every name. Only ``*`` is special. A hostname rule never matches an IP literal;
* ``{"ipv4": addr/CIDR}``, ``{"ipv6": addr/CIDR}``: the address actually connected to; a bare address is
  /32 or /128; host bits are ignored (``10.0.0.1/8`` is ``10.0.0.0/8``). An IPv4-mapped IPv6 address is
  judged as the IPv4 address it carries;
* the claim's gateway (host and port of ``gateway_url``) is always allowed, whatever the list says and
  whatever address it resolves to;
* a name allowed by a hostname rule may still only be reached at a public address: a loopback,
  link-local, private, shared (CGNAT), ULA, multicast or otherwise non-global address is refused unless an
  ipv4/ipv6 rule covers it (the rebinding guard);
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
        if self.glob == "*":
            return True
        if self.glob.startswith("*."):
            suffix = self.glob[2:]
            if not name.endswith("." + suffix):
                return False
            head = name[: -len(suffix) - 1]
            return bool(head) and all(head.split("."))
        return _labels_match(self.glob.split("."), name.split("."))


@dataclass(frozen=True)
class NetworkRule:
    """One ``ipv4``/``ipv6`` rule as a network."""

    network: IPNetwork
    written: str

    @property
    def label(self) -> str:
        return f"ipv{self.network.version} {self.written}"

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
        rules = spec.get("allow") or []
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
        if not ip.is_global or ip.is_multicast:
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


def _unmapped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _labels_match(pattern: list[str], labels: list[str]) -> bool:
    """One pattern label per name label; ``*`` in a pattern label matches one or more characters, no dot."""
    if len(pattern) != len(labels):
        return False
    return all(_label_matches(p, label) for p, label in zip(pattern, labels))


def _label_matches(pattern: str, label: str) -> bool:
    return re.fullmatch("[^.]+".join(map(re.escape, pattern.split("*"))), label) is not None


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
        networks.append(NetworkRule(network, value.strip()))
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
        if not glob or any(not label for label in glob.split(".")) or any(c.isspace() for c in glob):
            return f"{value!r} is not a hostname glob"
    return None
