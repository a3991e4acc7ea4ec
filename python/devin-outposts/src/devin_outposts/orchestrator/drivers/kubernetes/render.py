"""One session's objects as the driver would make them: for the role, docs examples and tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from devin_outposts.orchestrator.drivers.base import SessionSpec, WorkerLaunch
from devin_outposts.orchestrator.drivers.kubernetes.manifests import (
    PodSettings,
    render_pod,
    render_pvc,
    render_secret,
)
from devin_outposts.orchestrator.drivers.kubernetes.network_policy import render_network_policy
from devin_outposts.orchestrator.drivers.kubernetes.options import KubernetesOptions, parse_options


def render_session_manifests(
    spec: SessionSpec,
    launch: WorkerLaunch,
    *,
    namespace: str = "default",
    settings: Optional[PodSettings] = None,
    options: Optional[Mapping[str, Any]] = None,
) -> list[dict[str, Any]]:
    """The Secret, the PVC (with ``state_volume``), the NetworkPolicy (when the session's network policy is
    enabled, ``launch.network_policy``) and the Pod the driver makes for one session, in that order.

    Give either ``settings`` or the driver's ``options`` mapping (checked as the driver checks them; the
    client-side options such as ``kubeconfig`` are accepted and ignored; with ``settings``, the
    NetworkPolicy's options are their defaults). The Secret holds ``launch.connect_token``: treat the
    result as secret.
    """
    if settings is None:
        parsed = parse_options(options or {})
        settings = parsed.pod
        namespace = parsed.namespace or namespace
    else:
        parsed = KubernetesOptions(pod=settings)  # the NetworkPolicy's options at their defaults
    objects = [render_secret(namespace, spec, launch.connect_token)]
    if settings.state_volume:
        objects.append(render_pvc(namespace, spec, settings))
    network_policy = render_network_policy(
        namespace,
        spec,
        launch,
        dns_peer=parsed.network_policy_dns,
        extra_cidrs=parsed.network_policy_cidrs,
    )
    if network_policy is not None:
        objects.append(network_policy)
    objects.append(render_pod(namespace, spec, launch, settings))
    return objects
