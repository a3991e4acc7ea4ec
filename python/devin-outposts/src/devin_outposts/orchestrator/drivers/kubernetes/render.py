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
from devin_outposts.orchestrator.drivers.kubernetes.options import parse_options


def render_session_manifests(
    spec: SessionSpec,
    launch: WorkerLaunch,
    *,
    namespace: str = "default",
    settings: Optional[PodSettings] = None,
    options: Optional[Mapping[str, Any]] = None,
) -> list[dict[str, Any]]:
    """The Secret, the PVC (with ``state_volume``) and the Pod the driver makes for one session.

    Give either ``settings`` or the driver's ``options`` mapping (checked as the driver checks them; the
    client-side options such as ``kubeconfig`` are accepted and ignored). The Secret holds
    ``launch.connect_token``: treat the result as secret.
    """
    if settings is None:
        parsed = parse_options(options or {})
        settings = parsed.pod
        namespace = parsed.namespace or namespace
    objects = [render_secret(namespace, spec, launch.connect_token)]
    if settings.state_volume:
        objects.append(render_pvc(namespace, spec, settings))
    objects.append(render_pod(namespace, spec, launch, settings))
    return objects
