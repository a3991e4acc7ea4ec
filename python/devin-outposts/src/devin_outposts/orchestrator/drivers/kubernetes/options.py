"""The ``kubernetes`` driver's options: one table (:data:`OPTIONS`), checked before any claim.

The rows say how each value is read (:class:`~..base.DriverOption`); the checks here are what a
Kubernetes object needs beyond its kind: a PodTemplateSpec's keys and restart policy, the override keys
and the identity labels they may not touch, an owner that outlives the orchestrator's Pod.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from devin_outposts.core.netpolicy.policy import IPNetwork
from devin_outposts.orchestrator.drivers.base import DriverOption, OptionKind, OptionProblem, OptionTable
from devin_outposts.orchestrator.drivers.kubernetes.manifests import (
    DEFAULT_CONTAINER,
    DEFAULT_WORKDIR,
    IDENTITY_LABELS,
    OVERRIDE_KEYS,
    OWNER_KEYS,
    PodSettings,
)
from devin_outposts.orchestrator.drivers.kubernetes.network_policy import DEFAULT_DNS_PEER

#: What a NetworkPolicyPeer may hold (the API checks their contents).
PEER_KEYS = ("podSelector", "namespaceSelector", "ipBlock")


def _template(template: Mapping[str, Any]) -> Mapping[str, Any]:
    unknown = set(template) - {"metadata", "spec"}
    if unknown:
        raise OptionProblem(f"is a PodTemplateSpec: unknown key {sorted(unknown)[0]}")
    spec = template.get("spec") or {}
    if not isinstance(spec, Mapping) or not isinstance(spec.get("containers") or [], list):
        raise OptionProblem(": spec.containers must be a list")
    if "restartPolicy" in spec and spec["restartPolicy"] != "OnFailure":
        # The orchestrator counts the Pod's own restarts (restarts_in_place); another policy breaks that.
        raise OptionProblem(": spec.restartPolicy must be OnFailure or unset")
    return template


def _overrides(overrides: Mapping[str, Any]) -> Mapping[str, Any]:
    for name in overrides:
        if name not in OVERRIDE_KEYS:
            raise OptionProblem(f": unknown key {name} (one of {', '.join(OVERRIDE_KEYS)})")
    for name in ("labels", "annotations", "resources"):
        if name in overrides and not isinstance(overrides[name], Mapping):
            raise OptionProblem(f".{name} must be a mapping")
    for name in ("command", "args"):
        if name in overrides and not (
            isinstance(overrides[name], list) and all(isinstance(x, str) for x in overrides[name])
        ):
            raise OptionProblem(f".{name} must be a list of strings")
    for label in overrides.get("labels") or {}:
        if label in IDENTITY_LABELS:
            # list_owned and the garbage collection find sessions' objects by these.
            raise OptionProblem(f".labels may not set {label}")
    return overrides


def _owner(owner: Mapping[str, Any]) -> Mapping[str, str]:
    for name in owner:
        if name not in OWNER_KEYS:
            raise OptionProblem(f": unknown key {name}")
    missing = [name for name in ("apiVersion", "kind", "name") if not owner.get(name)]
    if missing:
        raise OptionProblem(f"needs {missing[0]}")
    if owner.get("kind") == "Pod":
        # Session Pods must outlive the orchestrator's Pod (a restart adopts them).
        raise OptionProblem(": a Pod cannot own session objects; use its Deployment")
    return {name: str(owner[name]) for name in owner}


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise OptionProblem("must be an absolute path")
    return path


def _dns_peer(peer: Mapping[str, Any]) -> Mapping[str, Any]:
    unknown = sorted(set(peer) - set(PEER_KEYS))
    if unknown or not peer:
        what = f"unknown key {unknown[0]}" if unknown else "is empty"
        raise OptionProblem(f": {what} (a NetworkPolicyPeer: {', '.join(PEER_KEYS)})")
    for key, value in peer.items():
        if not isinstance(value, Mapping):
            raise OptionProblem(f".{key} must be a mapping")
    return peer


def _cidrs(values: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    networks = []
    for value in values:
        try:
            # As a policy's ip rules: a bare address is /32 or /128, host bits are ignored.
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise OptionProblem(f"has {value!r}, which is not an IPv4 or IPv6 address or CIDR") from None
    return tuple(networks)


OPTIONS = OptionTable(
    "kubernetes",
    DriverOption(
        "image",
        OptionKind.TEXT,
        "The session image: it must have `devin-outposts` on `PATH` (our worker), Python 3.9+, `git`.",
        default_doc="— (required unless the template's container has one)",
    ),
    DriverOption(
        "namespace",
        OptionKind.TEXT,
        "Where every session object goes (one namespace).",
        default_doc="the kubeconfig context's, in a cluster the Pod's own, else `default`",
    ),
    DriverOption(
        "kubeconfig",
        OptionKind.TEXT,
        "A kubeconfig file to use instead.",
        default_doc="in-cluster service account, then `$KUBECONFIG`, then `~/.kube/config`",
    ),
    DriverOption("context", OptionKind.TEXT, "A kubeconfig context.", default_doc="the current context"),
    DriverOption(
        "pod_template",
        OptionKind.MAPPING,
        "A PodTemplateSpec (`metadata`, `spec`): layer 1 of the Pod. `spec.restartPolicy` may only be "
        "`OnFailure`.",
        default={},
        parse=_template,
    ),
    DriverOption(
        "container_name",
        OptionKind.TEXT,
        "The container the driver owns in the Pod; it is added if the template has none of that name.",
        default=DEFAULT_CONTAINER,
    ),
    DriverOption(
        "overrides",
        OptionKind.MAPPING,
        "Layer 3, the final say: `image`, `command`, `args`, `labels`, `annotations`, `resources`. Labels "
        "and annotations are *added* to the driver's; the four identity labels cannot be overridden (the "
        "driver finds its objects by them).",
        default={},
        parse=_overrides,
    ),
    DriverOption(
        "workdir",
        OptionKind.TEXT,
        "The sessions' working directory (`DEVIN_WORKER_WORKDIR`).",
        default=DEFAULT_WORKDIR,
        parse=_absolute,
    ),
    DriverOption(
        "state_volume",
        OptionKind.FLAG,
        "Give every session a PVC mounted at `/var/lib/devin-worker`. **Required for the `snapshot` resume "
        "policy.**",
        default=False,
    ),
    DriverOption("volume_size", OptionKind.TEXT, "The PVC's storage request.", default="20Gi"),
    DriverOption(
        "storage_class", OptionKind.TEXT, "The PVC's `storageClassName`.", default_doc="the cluster default"
    ),
    DriverOption(
        "owner",
        OptionKind.MAPPING,
        "An owner reference for session Pods and PVCs: `{apiVersion, kind, name[, uid]}`, e.g. the "
        "orchestrator's Deployment. Without `uid`, an `apps/v1` `Deployment` is looked up by name at "
        "start-up. A `Pod` is refused (see [Owner references](#names-labels-and-owner-references)).",
        parse=_owner,
    ),
    DriverOption(
        "network_policy_dns",
        OptionKind.MAPPING,
        "For sessions whose network policy is enabled: the cluster DNS their NetworkPolicy lets the Pod ask "
        "(UDP and TCP 53), a NetworkPolicyPeer (`podSelector`, `namespaceSelector`, `ipBlock`), e.g. "
        "`{ipBlock: {cidr: 169.254.20.10/32}}` for NodeLocal DNSCache. See "
        "[Network policy](#network-policy).",
        default=DEFAULT_DNS_PEER,
        parse=_dns_peer,
    ),
    DriverOption(
        "network_policy_cidrs",
        OptionKind.NAMES,
        "CIDRs that every such NetworkPolicy also allows (TCP, any port), as if the policy had ip rules for "
        "them: a gateway, binary mirror or proxy at a private address, which hostname rules never reach "
        "past the NetworkPolicy.",
        default=(),
        parse=_cidrs,
    ),
    DriverOption(
        "leader_election",
        OptionKind.FLAG,
        "Take the Lease before acting; `false` returns no lock (single replica only).",
        default=True,
    ),
    DriverOption(
        "lease_name",
        OptionKind.TEXT,
        "The Lease's name.",
        default_doc="`devin-outposts-leader-<acceptor id>-<hash>`",
    ),
    DriverOption(
        "lease_duration",
        OptionKind.SECONDS,
        "Seconds a Lease lasts without renewal.",
        default=15.0,
        above=0,
    ),
    DriverOption(
        "lease_renew_interval",
        OptionKind.SECONDS,
        "Seconds between renewals (shorter than the duration).",
        default=5.0,
        above=0,
    ),
    DriverOption(
        "delete_timeout",
        OptionKind.SECONDS,
        "Seconds to wait for a replaced Pod (or a discarded PVC) to be gone.",
        default=120.0,
        above=0,
    ),
    DriverOption(
        "request_timeout",
        OptionKind.SECONDS,
        "Seconds per API request (connect: 10).",
        default=30.0,
        above=0,
    ),
)


@dataclass(frozen=True)
class KubernetesOptions:
    pod: PodSettings
    namespace: Optional[str] = None
    kubeconfig: Optional[str] = None
    context: Optional[str] = None
    leader_election: bool = True
    lease_name: Optional[str] = None
    lease_duration: float = 15.0
    lease_renew_interval: float = 5.0
    delete_timeout: float = 120.0
    request_timeout: float = 30.0
    network_policy_dns: Mapping[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_DNS_PEER))
    network_policy_cidrs: tuple[IPNetwork, ...] = ()


def parse_options(
    options: Mapping[str, Any], worker_command: tuple[str, ...] = ("devin-outposts",)
) -> KubernetesOptions:
    """The driver's options, read by :data:`OPTIONS` and checked together."""
    values = OPTIONS.read(options)
    pod = PodSettings(
        image=values["image"],
        container_name=values["container_name"],
        template=values["pod_template"],
        overrides=values["overrides"],
        workdir=values["workdir"],
        state_volume=values["state_volume"],
        volume_size=values["volume_size"],
        storage_class=values["storage_class"],
        owner=values["owner"],
        worker_command=worker_command,
    )
    if not pod.effective_image():
        raise OPTIONS.error("image", "is required (or the pod_template's container image)")
    parsed = KubernetesOptions(
        pod=pod,
        namespace=values["namespace"],
        kubeconfig=values["kubeconfig"],
        context=values["context"],
        leader_election=values["leader_election"],
        lease_name=values["lease_name"],
        lease_duration=values["lease_duration"],
        lease_renew_interval=values["lease_renew_interval"],
        delete_timeout=values["delete_timeout"],
        request_timeout=values["request_timeout"],
        network_policy_dns=values["network_policy_dns"],
        network_policy_cidrs=values["network_policy_cidrs"],
    )
    if parsed.lease_renew_interval >= parsed.lease_duration:
        raise OPTIONS.error("lease_renew_interval", "must be shorter than lease_duration")
    return parsed
