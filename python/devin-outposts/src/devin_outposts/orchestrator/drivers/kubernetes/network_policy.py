"""A session's NetworkPolicy: the part of its ``spec.network_policy`` that the Kubernetes API can say.

The session is confined by the worker in its Pod, exactly as on a host (core/netpolicy: its own network
namespace whose only way out is the worker's egress proxy, which reads hostname rules). This object is a
second fence, around the whole Pod and enforced by the cluster's network plugin (if it enforces
NetworkPolicy at all), for what the worker itself connects to. A NetworkPolicy knows CIDRs and ports, never
host names, so it can only say (docs/orchestrator-kubernetes.md, "Network policy"):

* DNS, UDP and TCP port 53, to the cluster DNS (the ``network_policy_dns`` peer);
* each ipv4/ipv6 rule of the policy as an ``ipBlock``, TCP on any port (the sandbox drops UDP anyway);
* TCP on any port to every *public* address: ``0.0.0.0/0`` and ``::/0`` except the non-public ranges of the
  rebinding guard (:data:`~devin_outposts.core.netpolicy.policy.NOT_PUBLIC`, the one list). Hostname rules,
  the gateway and the binary downloads are names, reachable only there; which names is for the proxy to
  decide. So the Pod never reaches the cloud metadata address, the cluster's private ranges or other Pods
  unless an ip rule (or ``network_policy_cidrs``) allows them: NetworkPolicy rules add up.

A gateway given as an IP literal is allowed on its port whatever its address, as the policy always allows it.
Pure, no client library: :func:`~.render.render_session_manifests` shows it too.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from devin_outposts.core.netpolicy.policy import (
    NOT_PUBLIC,
    IPNetwork,
    Policy,
    PolicyError,
    gateway_endpoint,
    ip_literal,
)
from devin_outposts.orchestrator.drivers.base import (
    LABEL_MANAGED_BY,
    LABEL_SESSION,
    SessionSpec,
    WorkerLaunch,
    machine_name,
)
from devin_outposts.orchestrator.drivers.kubernetes.manifests import identity_annotations

NETWORK_POLICY_PREFIX = "outpost-egress"
#: The cluster DNS as most distributions label it (kube-dns and CoreDNS alike), in whatever namespace.
DEFAULT_DNS_PEER: Mapping[str, Any] = {
    "namespaceSelector": {},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
EVERYWHERE = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


def network_policy_name(session_id: str) -> str:
    return machine_name(NETWORK_POLICY_PREFIX, session_id)


def enforced_policy(network_policy: Optional[Mapping[str, Any]], gateway_url: str) -> Optional[Policy]:
    """The session's policy when it is enabled, else None (no NetworkPolicy).

    A policy that is not a policy at all is read as one that allows nothing: the worker refuses such a
    session, and the Pod is fenced meanwhile.
    """
    try:
        policy = Policy.from_spec(network_policy, gateway_url)
    except PolicyError:
        return Policy(enforced=True)
    return policy if policy.enforced else None


#: IPv6 prefixes that carry an IPv4 address, which the rebinding guard judges by that address: NAT64's
#: well-known prefix (the address in the last 32 bits) and 6to4 (in bits 16 to 47).
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
SIX_TO_FOUR = ipaddress.IPv6Network("2002::/16")


def carried(network: ipaddress.IPv4Network) -> list[ipaddress.IPv6Network]:
    """The IPv6 ranges whose addresses carry an address of ``network`` (NAT64 and 6to4)."""
    bits = int(network.network_address)
    return [
        ipaddress.IPv6Network((int(NAT64.network_address) | bits, 96 + network.prefixlen)),
        ipaddress.IPv6Network((int(SIX_TO_FOUR.network_address) | bits << 80, 16 + network.prefixlen)),
    ]


def public_peers(not_public: Iterable[IPNetwork] = NOT_PUBLIC) -> list[dict[str, Any]]:
    """``0.0.0.0/0`` and ``::/0``, each except the non-public ranges of its own family (an ``except``
    must lie inside its ``cidr``, so the families are apart); the IPv6 side also excepts the NAT64 and 6to4
    forms of the IPv4 ranges, as the rebinding guard judges them."""
    ranges: list[IPNetwork] = list(not_public)
    ranges += [six for net in list(ranges) if isinstance(net, ipaddress.IPv4Network) for six in carried(net)]
    return [
        {
            "ipBlock": {
                "cidr": str(everything),
                "except": [str(net) for net in ranges if net.version == everything.version],
            }
        }
        for everything in EVERYWHERE
    ]


def _gateway_literal(gateway_url: str) -> Optional[tuple[IPNetwork, int]]:
    """The gateway's address and port, when its URL names an address rather than a host."""
    try:
        host, port = gateway_endpoint(gateway_url)
    except PolicyError:
        return None
    address = ip_literal(host)
    return (ipaddress.ip_network(address), port) if address is not None else None


def render_network_policy(
    namespace: str,
    spec: SessionSpec,
    launch: WorkerLaunch,
    *,
    dns_peer: Optional[Mapping[str, Any]] = None,
    extra_cidrs: Iterable[IPNetwork] = (),
) -> Optional[dict[str, Any]]:
    """The session's NetworkPolicy, or None when its policy is not enabled (nothing to fence).

    ``dns_peer`` is the ``network_policy_dns`` option (default :data:`DEFAULT_DNS_PEER`); ``extra_cidrs``
    (the ``network_policy_cidrs`` option) are allowed like ip rules: for a gateway or a
    binary mirror at a private address, which a policy's hostname rules cannot reach past the fence.
    Its owner (the Pod) is added once the Pod exists, as the Secret's.
    """
    policy = enforced_policy(launch.network_policy, launch.gateway_url)
    if policy is None:
        return None
    tcp = [{"protocol": "TCP"}]
    egress: list[dict[str, Any]] = [
        {
            "to": [copy.deepcopy(dict(dns_peer or DEFAULT_DNS_PEER))],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        },
        {"to": public_peers(), "ports": tcp},
    ]
    allowed = [rule.network for rule in policy.networks] + list(extra_cidrs)
    if allowed:
        unique = list(dict.fromkeys(allowed))
        egress.append({"to": [{"ipBlock": {"cidr": str(net)}} for net in unique], "ports": tcp})
    gateway = _gateway_literal(launch.gateway_url)
    if gateway is not None:
        address, port = gateway
        egress.append(
            {"to": [{"ipBlock": {"cidr": str(address)}}], "ports": [{"protocol": "TCP", "port": port}]}
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(spec.session_id),
            "namespace": namespace,
            "labels": spec.labels(),
            "annotations": identity_annotations(spec),
        },
        "spec": {
            # The session's Pod and no other: the session label (which no overrides can set) of this
            # orchestrator's Pods (Cognition's operator labels its Pods with the same session label).
            "podSelector": {
                "matchLabels": {key: spec.labels()[key] for key in (LABEL_MANAGED_BY, LABEL_SESSION)}
            },
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }
